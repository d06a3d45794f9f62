"""A Flax nnx LLaMA-style block as nnx users write it, traced, searched and executed.

RMSNorm, rotary position embeddings (rotate-half), grouped-query attention (fewer key/value
heads, repeated with ``jnp.repeat``), a SwiGLU MLP; parameters declared with
``nnx.with_partitioning(init, names)`` so the tracer reads their dim names, trained with
``nnx.Optimizer(model, optax.adamw(...))`` in the functional style (``nnx.split`` /
``nnx.merge``). The head dims made by reshapes get real names with ``names=``.

Run: ``JAX_NUM_CPU_DEVICES=8 python examples/nnx_llama.py``
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import autolayout  # noqa: E402

BATCH, LENGTH, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP = 8, 16, 32, 4, 2, 8, 64
INIT = nnx.initializers.normal(0.02)


def dense(shape, names, rngs):
    return nnx.Param(nnx.with_partitioning(INIT, names)(rngs.params(), shape))


def rope(x):
    """Rotary embeddings, rotate-half form: x * cos + rotate_half(x) * sin."""
    half = HEAD_DIM // 2
    freq = 1.0 / (10000 ** (jnp.arange(half) / half))
    angles = jnp.arange(LENGTH)[:, None] * freq[None, :]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[None, :, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[None, :, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


class RMSNorm(nnx.Module):
    def __init__(self, rngs):
        self.scale = nnx.Param(nnx.with_partitioning(nnx.initializers.ones, ("embed",))(rngs.params(), (EMBED,)))

    def __call__(self, x):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * self.scale[...]


class LlamaBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.attn_norm, self.mlp_norm = RMSNorm(rngs), RMSNorm(rngs)
        self.wq = dense((EMBED, HEADS, HEAD_DIM), ("embed", "heads", "head_dim"), rngs)
        self.wk = dense((EMBED, KV_HEADS, HEAD_DIM), ("embed", "kv_heads", "head_dim"), rngs)
        self.wv = dense((EMBED, KV_HEADS, HEAD_DIM), ("embed", "kv_heads", "head_dim"), rngs)
        self.wo = dense((HEADS, HEAD_DIM, EMBED), ("heads", "head_dim", "embed"), rngs)
        self.w_gate = dense((EMBED, MLP), ("embed", "mlp"), rngs)
        self.w_up = dense((EMBED, MLP), ("embed", "mlp"), rngs)
        self.w_down = dense((MLP, EMBED), ("mlp", "embed"), rngs)

    def __call__(self, x):
        h = self.attn_norm(x)
        q = rope(jnp.einsum("bld,dhk->blhk", h, self.wq[...]))
        k = rope(jnp.einsum("bld,dhk->blhk", h, self.wk[...]))
        v = jnp.einsum("bld,dhk->blhk", h, self.wv[...])
        k = jnp.repeat(k, HEADS // KV_HEADS, axis=2)  # grouped-query attention
        v = jnp.repeat(v, HEADS // KV_HEADS, axis=2)
        s = jnp.einsum("bqhk,bmhk->bhqm", q, k) / jnp.sqrt(HEAD_DIM)
        mask = jnp.tril(jnp.ones((LENGTH, LENGTH), bool))
        p = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
        x = x + jnp.einsum("bhqm,bmhk,hkd->bqd", p, v, self.wo[...])
        h = self.mlp_norm(x)
        g = jax.nn.silu(h @ self.w_gate[...]) * (h @ self.w_up[...])
        return x + g @ self.w_down[...]


def setup():
    with nnx.use_eager_sharding(False):
        model = LlamaBlock(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    graphdef, params = nnx.split(model)
    opt_def, opt_state = nnx.split(optimizer)

    def train_step(params, opt_state, x, y):
        model, optimizer = nnx.merge(graphdef, params), nnx.merge(opt_def, opt_state)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return nnx.state(model), nnx.state(optimizer), loss

    x = jax.random.normal(jax.random.key(1), (BATCH, LENGTH, EMBED))
    y = jax.random.normal(jax.random.key(2), (BATCH, LENGTH, EMBED))
    return train_step, (params, opt_state, x, y)


def trace_block(train_step, args, donate_argnums=()):
    """The traced graph (``donate_argnums`` as for ``jax.jit``: ``(0, 1)`` donates the parameters and the
    optimizer state, as a training loop does)."""
    graph = autolayout.trace(train_step, *args, dims={"x": "batch length embed", "y": "batch length embed"},
                             donate_argnums=donate_argnums)
    # the attention's key length and the repeated (GQA) heads are made inside the model: name them
    auto = {d: n for d, n in (("length_1", "kv_length"),) if d in graph.dims}
    return graph.rename(auto) if auto else graph


def main() -> None:
    train_step, args = setup()
    graph = trace_block(train_step, args)
    print(graph.summary())
    mesh = "data:2,model:4"
    whole = autolayout.predict(graph, mesh, "", hardware="tpu-v4").memory_bytes
    best = autolayout.search(graph, mesh, hardware="tpu-v4", memory_limit=whole / 2)
    print("searched layout:", best.layout)
    run = autolayout.execute(graph, mesh, best.layout, args=args, repeats=1)
    print(run.summary())


if __name__ == "__main__":
    main()
