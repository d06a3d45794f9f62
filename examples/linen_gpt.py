"""A Flax linen GPT as linen users write it, traced, searched, executed and exported.

The model: token and position embeddings, blocks of ``nn.MultiHeadDotProductAttention``
(causal) and an MLP stacked with ``nn.scan(nn.remat(Block))``, trained with
``optax.chain(clip_by_global_norm, adamw)`` and ``optax.softmax_cross_entropy_with_integer_labels``
in a ``TrainState``. Parameters carry logical axis names
(``nn.with_logical_partitioning``), so ``trace`` needs dims only for the batch; the
TrainState says which leaves are parameters and optimizer state.

Run: ``JAX_NUM_CPU_DEVICES=8 python examples/linen_gpt.py``
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

VOCAB, LENGTH, EMBED, HEADS, MLP, LAYERS, BATCH = 64, 16, 32, 4, 64, 2, 8
LP = nn.with_logical_partitioning
INIT = nn.initializers.normal(0.02)


class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        h = nn.LayerNorm(use_bias=False, scale_init=LP(nn.initializers.ones, ("embed",)))(x)
        h = nn.MultiHeadDotProductAttention(
            num_heads=HEADS, use_bias=False,
            kernel_init=LP(INIT, ("embed", "heads", "kv")),
            out_kernel_init=LP(INIT, ("heads", "kv", "embed")))(h, mask=nn.make_causal_mask(h[..., 0]))
        x = x + h
        h = nn.LayerNorm(use_bias=False, scale_init=LP(nn.initializers.ones, ("embed",)))(x)
        h = nn.Dense(MLP, use_bias=False, kernel_init=LP(INIT, ("embed", "mlp")))(h)
        h = nn.Dense(EMBED, use_bias=False, kernel_init=LP(INIT, ("mlp", "embed")))(nn.gelu(h))
        return x + h, None


class GPT(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        emb = nn.Embed(VOCAB, EMBED, embedding_init=LP(INIT, ("vocab", "embed")))
        pos = self.param("pos", LP(INIT, ("length", "embed")), (LENGTH, EMBED))
        x = emb(tokens) + pos
        blocks = nn.scan(nn.remat(Block), variable_axes={"params": 0}, split_rngs={"params": True},
                         length=LAYERS, metadata_params={nn.PARTITION_NAME: "layers"})
        x, _ = blocks()(x, None)
        x = nn.LayerNorm(use_bias=False, scale_init=LP(nn.initializers.ones, ("embed",)))(x)
        return emb.attend(x)


def make_state(model: GPT) -> train_state.TrainState:
    tokens = jnp.zeros((BATCH, LENGTH), jnp.int32)
    variables = model.init(jax.random.key(0), tokens)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.1))
    return train_state.TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)


def train_step(state, tokens, targets):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def batch():
    tokens = jax.random.randint(jax.random.key(1), (BATCH, LENGTH), 0, VOCAB)
    return tokens, jnp.roll(tokens, -1, axis=1)


def main() -> None:
    state = make_state(GPT())
    tokens, targets = batch()
    graph = autolayout.trace(train_step, state, tokens, targets,
                             dims={"tokens": "batch length", "targets": "batch length"})
    print(graph.summary())
    mesh = "data:2,model:4"
    # At these toy sizes replicating everything is fastest; ask for half its memory per device
    # and the search has to split the model (tensor parallelism, storage/FSDP shards).
    whole = autolayout.predict(graph, mesh, "", hardware="tpu-v4").memory_bytes
    best = autolayout.search(graph, mesh, hardware="tpu-v4", memory_limit=whole / 2)
    print(f"searched layout at {whole / 2:.0f} B per device:", best.layout)
    run = autolayout.execute(graph, mesh, best.layout, args=(state, tokens, targets), repeats=1)
    print(run.summary())
    from autolayout.export import logical_axis_rules, partition_specs
    print("logical_axis_rules:", list(logical_axis_rules(graph, mesh, best.layout)))
    print("param specs:", jax.tree.leaves(partition_specs(graph, mesh, best.layout)[0].params,
                                           is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[:3])


if __name__ == "__main__":
    main()
