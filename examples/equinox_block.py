"""An equinox transformer block as equinox users write it, traced, searched and executed.

``eqx.nn.MultiheadAttention`` and an MLP of ``eqx.nn.Linear`` s, applied per example with
``jax.vmap`` (equinox's convention), trained with ``optax.adamw`` on the arrays of
``eqx.partition(model, eqx.is_array)``. Equinox has no axis metadata, so ``dims`` names the
parameters the usual way, as a pytree prefix: the model itself with strings at its leaves.

Run: ``JAX_NUM_CPU_DEVICES=8 python examples/equinox_block.py``
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import autolayout  # noqa: E402

BATCH, LENGTH, EMBED, HEADS, MLP = 8, 16, 32, 4, 64


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    norm2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.norm1, self.norm2 = eqx.nn.LayerNorm(EMBED), eqx.nn.LayerNorm(EMBED)
        self.attn = eqx.nn.MultiheadAttention(HEADS, EMBED, key=k1)
        self.up = eqx.nn.Linear(EMBED, MLP, key=k2)
        self.down = eqx.nn.Linear(MLP, EMBED, key=k3)

    def __call__(self, x):  # one example: [length, embed]
        h = jax.vmap(self.norm1)(x)
        x = x + self.attn(h, h, h)
        h = jax.vmap(self.norm2)(x)
        return x + jax.vmap(lambda t: self.down(jax.nn.gelu(self.up(t))))(h)


TX = optax.adamw(1e-3)
MODEL = Block(jax.random.key(0))
PARAMS, STATIC = eqx.partition(MODEL, eqx.is_array)


def train_step(params, opt_state, x, y):
    def loss_fn(p):
        return jnp.mean((jax.vmap(eqx.combine(p, STATIC))(x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = TX.update(grads, opt_state, params)
    return eqx.apply_updates(params, updates), opt_state, loss


def setup():
    params = PARAMS  # non-array fields are None (empty subtrees)
    x = jax.random.normal(jax.random.key(1), (BATCH, LENGTH, EMBED))
    y = jax.random.normal(jax.random.key(2), (BATCH, LENGTH, EMBED))
    return (params, TX.init(params), x, y)


def param_dims(params):
    """The model with each weight's dim names at its leaf (eqx.nn.Linear: [out, in])."""
    a = params.attn
    names = {id(a.query_proj.weight): "heads_kv embed", id(a.key_proj.weight): "heads_kv embed",
             id(a.value_proj.weight): "heads_kv embed", id(a.output_proj.weight): "embed heads_kv",
             id(params.up.weight): "mlp embed", id(params.up.bias): "mlp",
             id(params.down.weight): "embed mlp", id(params.down.bias): "embed"}
    return jax.tree.map(lambda leaf: names.get(id(leaf)), params)


def main() -> None:
    args = setup()
    graph = autolayout.trace(train_step, *args, dims=(param_dims(args[0]), None, "batch length embed",
                                                      "batch length embed"),
                             roles=("param", "opt_state", "input", "input"),
                             names={"d4": "heads"})  # made by the attention's reshape
    print(graph.summary())
    mesh = "data:2,model:4"
    whole = autolayout.predict(graph, mesh, "", hardware="tpu-v4").memory_bytes
    best = autolayout.search(graph, mesh, hardware="tpu-v4", memory_limit=whole / 2)
    print("searched layout:", best.layout)
    run = autolayout.execute(graph, mesh, best.layout, args=args, repeats=1)
    print(run.summary())


if __name__ == "__main__":
    main()
