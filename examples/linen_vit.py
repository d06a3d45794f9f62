"""A Vision Transformer in Flax linen, traced, searched and executed.

The model: patch embedding by ``nn.Conv`` with stride = patch size, a learned class token
concatenated in front of the patches, a learned position embedding, pre-LayerNorm
encoder blocks (``nn.MultiHeadDotProductAttention`` and an MLP) and a classification head
on the class token; trained with ``optax.adam`` and
``optax.softmax_cross_entropy_with_integer_labels`` in a ``TrainState``.

Parameters carry logical axis names (``nn.with_logical_partitioning``); the images'
dims are named ``batch height width channels``. The conv's patch grid (``grid_h grid_w``),
the patches it flattens to and the keys' side of self-attention get names with ``names=``.

Run: ``JAX_NUM_CPU_DEVICES=8 python examples/linen_vit.py``
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax.training import train_state  # noqa: E402

import autolayout  # noqa: E402

IMAGE, PATCH, CHANNELS, EMBED, HEADS, MLP, LAYERS, CLASSES, BATCH = 16, 4, 3, 32, 4, 64, 2, 10, 8
GRID = IMAGE // PATCH
LP = nn.with_logical_partitioning
INIT = nn.initializers.normal(0.02)


def layer_norm():
    return nn.LayerNorm(scale_init=LP(nn.initializers.ones, ("embed",)), bias_init=LP(nn.initializers.zeros, ("embed",)))


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = layer_norm()(x)
        x = x + nn.MultiHeadDotProductAttention(
            num_heads=HEADS, kernel_init=LP(INIT, ("embed", "heads", "kv")),
            bias_init=LP(nn.initializers.zeros, ("heads", "kv")),
            out_kernel_init=LP(INIT, ("heads", "kv", "embed")),
            out_bias_init=LP(nn.initializers.zeros, ("embed",)))(h, h)
        h = layer_norm()(x)
        h = nn.Dense(MLP, kernel_init=LP(INIT, ("embed", "mlp")), bias_init=LP(nn.initializers.zeros, ("mlp",)))(h)
        return x + nn.Dense(EMBED, kernel_init=LP(INIT, ("mlp", "embed")),
                            bias_init=LP(nn.initializers.zeros, ("embed",)))(nn.gelu(h))


class ViT(nn.Module):
    @nn.compact
    def __call__(self, images):
        x = nn.Conv(EMBED, (PATCH, PATCH), strides=(PATCH, PATCH), padding="VALID",
                    kernel_init=LP(INIT, ("patch_h", "patch_w", "channels", "embed")),
                    bias_init=LP(nn.initializers.zeros, ("embed",)))(images)
        x = x.reshape(x.shape[0], GRID * GRID, EMBED)
        cls = self.param("cls", LP(nn.initializers.zeros, ("embed",)), (EMBED,))
        x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, EMBED)), x], axis=1)
        x = x + self.param("pos", LP(INIT, ("tokens", "embed")), (GRID * GRID + 1, EMBED))
        for _ in range(LAYERS):
            x = Block()(x)
        x = layer_norm()(x[:, 0])
        return nn.Dense(CLASSES, kernel_init=LP(nn.initializers.zeros, ("embed", "classes")),
                        bias_init=LP(nn.initializers.zeros, ("classes",)))(x)


def make_state(model: ViT) -> train_state.TrainState:
    images, _ = batch()
    variables = model.init(jax.random.key(0), images)
    return train_state.TrainState.create(apply_fn=model.apply, params=variables["params"], tx=optax.adam(1e-3))


def train_step(state, images, labels):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def batch():
    images = jax.random.normal(jax.random.key(1), (BATCH, IMAGE, IMAGE, CHANNELS))
    return images, jax.random.randint(jax.random.key(2), (BATCH,), 0, CLASSES)


DIMS = {"images": "batch height width channels", "labels": "batch"}
# dims no argument names: the conv's patch grid, the patches it flattens to (the tokens
# after the class token), and the keys' side of self-attention (the tracer's rename)
NAMES = {"d4": "grid_h", "d4_1": "grid_w", "d16": "patches", "tokens_1": "keys"}


def trace_step(state, images, labels) -> autolayout.Graph:
    return autolayout.trace(train_step, state, images, labels, dims=DIMS, names=NAMES)


def main() -> None:
    state = make_state(ViT())
    images, labels = batch()
    graph = trace_step(state, images, labels)
    print(graph.summary())
    mesh = "data:2,model:4"
    whole = autolayout.predict(graph, mesh, "", hardware="tpu-v4").memory_bytes
    best = autolayout.search(graph, mesh, hardware="tpu-v4", memory_limit=whole / 2)
    print(f"searched layout at {whole / 2:.0f} B per device:", best.layout)
    run = autolayout.execute(graph, mesh, best.layout, args=(state, images, labels), repeats=1)
    print(run.summary())


if __name__ == "__main__":
    main()
