"""A T5-style encoder-decoder in Flax linen, traced, searched and executed.

The model: shared token embedding (tied with the output projection, scaled as in T5),
a bucketed relative-position bias per attention stack, pre-RMS-norm blocks; the encoder
has bidirectional self-attention, the decoder causal self-attention and cross-attention
over the encoder output. Trained with ``optax.adamw`` and
``optax.softmax_cross_entropy_with_integer_labels`` in a ``TrainState``.

Cross-attention relates two different lengths: the decoder's (queries) and the
encoder's (keys and values). The batch dims name them ``dec_length`` and ``enc_length``
and the parameters carry logical axis names (``nn.with_logical_partitioning``), so the
traced graph reads like the model: cross-attention weights are ``[batch heads dec_length
enc_length]``. Self-attention relates a length to itself; the tracer gives the keys' side
its own dim (``enc_length_1``, as Mesh-TensorFlow names attention's memory length), which
``names=`` calls ``enc_keys`` (and ``dec_keys``).

Run: ``JAX_NUM_CPU_DEVICES=8 python examples/linen_t5.py``
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax.training import train_state  # noqa: E402

import autolayout  # noqa: E402

VOCAB, EMBED, HEADS, KV, MLP, LAYERS, BUCKETS = 64, 32, 4, 8, 64, 2, 8
BATCH, ENC_LEN, DEC_LEN = 8, 16, 8
LP = nn.with_logical_partitioning
INIT = nn.initializers.normal(0.02)


def relative_buckets(q_len: int, k_len: int, bidirectional: bool) -> np.ndarray:
    """T5's bucketed relative positions ``[q_len, k_len]`` (exact below half the buckets,
    log-spaced above), computed with numpy: a constant of the step, as in T5X."""
    rel = np.arange(k_len)[None, :] - np.arange(q_len)[:, None]
    n, out = BUCKETS, np.zeros((q_len, k_len), np.int32)
    if bidirectional:
        n //= 2
        out += (rel > 0) * n
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = n // 2
    big = exact + (np.log(np.maximum(rel, 1) / exact) / np.log(4 * q_len / exact) * (n - exact)).astype(np.int32)
    return out + np.where(rel < exact, rel, np.minimum(big, n - 1))


class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", LP(nn.initializers.ones, ("embed",)), (x.shape[-1],))
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


class Attention(nn.Module):
    @nn.compact
    def __call__(self, x, kv, bias, mask=None):
        dense = lambda name: nn.DenseGeneral((HEADS, KV), use_bias=False, name=name,  # noqa: E731
                                             kernel_init=LP(INIT, ("embed", "heads", "kv")))
        q, k, v = dense("query")(x), dense("key")(kv), dense("value")(kv)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) + bias
        if mask is not None:
            logits = jnp.where(mask, logits, -1e9)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)
        return nn.DenseGeneral(EMBED, axis=(-2, -1), use_bias=False, name="out",
                               kernel_init=LP(INIT, ("heads", "kv", "embed")))(out)


class MLPBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(MLP, use_bias=False, kernel_init=LP(INIT, ("embed", "mlp")))(x)
        return nn.Dense(EMBED, use_bias=False, kernel_init=LP(INIT, ("mlp", "embed")))(nn.relu(h))


class RelativeBias(nn.Module):
    bidirectional: bool

    @nn.compact
    def __call__(self, q_len, k_len):
        table = self.param("rel_embedding", LP(INIT, ("buckets", "heads")), (BUCKETS, HEADS))
        return jnp.transpose(table[relative_buckets(q_len, k_len, self.bidirectional)], (2, 0, 1))


class T5(nn.Module):
    layers: int = LAYERS  # per stack

    @nn.compact
    def __call__(self, enc_tokens, dec_tokens):
        emb = nn.Embed(VOCAB, EMBED, embedding_init=LP(nn.initializers.normal(1.0), ("vocab", "embed")))
        x = emb(enc_tokens)
        bias = RelativeBias(True, name="enc_bias")(ENC_LEN, ENC_LEN)
        for i in range(self.layers):
            h = RMSNorm(name=f"enc_{i}_ln_attn")(x)
            x = x + Attention(name=f"enc_{i}_attn")(h, h, bias)
            x = x + MLPBlock(name=f"enc_{i}_mlp")(RMSNorm(name=f"enc_{i}_ln_mlp")(x))
        enc = RMSNorm(name="enc_ln")(x)

        y = emb(dec_tokens)
        bias = RelativeBias(False, name="dec_bias")(DEC_LEN, DEC_LEN)
        causal = jnp.tril(jnp.ones((DEC_LEN, DEC_LEN), bool))
        for i in range(self.layers):
            h = RMSNorm(name=f"dec_{i}_ln_self")(y)
            y = y + Attention(name=f"dec_{i}_self")(h, h, bias, causal)
            y = y + Attention(name=f"dec_{i}_cross")(RMSNorm(name=f"dec_{i}_ln_cross")(y), enc, 0.0)
            y = y + MLPBlock(name=f"dec_{i}_mlp")(RMSNorm(name=f"dec_{i}_ln_mlp")(y))
        y = RMSNorm(name="dec_ln")(y)
        return emb.attend(y * EMBED ** -0.5)  # tied embeddings, rescaled as in T5


def make_state(model: T5) -> train_state.TrainState:
    enc, dec, _ = batch()
    variables = model.init(jax.random.key(0), enc, dec)
    return train_state.TrainState.create(apply_fn=model.apply, params=variables["params"],
                                         tx=optax.adamw(1e-3, weight_decay=0.01))


def train_step(state, enc_tokens, dec_tokens, targets):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, enc_tokens, dec_tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def batch():
    enc = jax.random.randint(jax.random.key(1), (BATCH, ENC_LEN), 0, VOCAB)
    targets = jax.random.randint(jax.random.key(2), (BATCH, DEC_LEN), 0, VOCAB)
    dec = jnp.concatenate([jnp.zeros((BATCH, 1), targets.dtype), targets[:, :-1]], axis=1)  # teacher forcing
    return enc, dec, targets


DIMS = {"enc_tokens": "batch enc_length", "dec_tokens": "batch dec_length", "targets": "batch dec_length"}
# the keys' side of self-attention (the tracer's ``_1`` dims)
KEYS = {"enc_length_1": "enc_keys", "dec_length_1": "dec_keys"}


def trace_step(state, enc, dec, targets) -> autolayout.Graph:
    return autolayout.trace(train_step, state, enc, dec, targets, dims=DIMS, names=KEYS)


def main() -> None:
    state = make_state(T5())
    enc, dec, targets = batch()
    graph = trace_step(state, enc, dec, targets)
    print(graph.summary())
    mesh = "data:2,model:4"
    whole = autolayout.predict(graph, mesh, "", hardware="tpu-v4").memory_bytes
    best = autolayout.search(graph, mesh, hardware="tpu-v4", memory_limit=whole / 2)
    print(f"searched layout at {whole / 2:.0f} B per device:", best.layout)
    run = autolayout.execute(graph, mesh, best.layout, args=(state, enc, dec, targets), repeats=1)
    print(run.summary())


if __name__ == "__main__":
    main()
