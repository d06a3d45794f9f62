"""A mixed-precision Flax linen MLP as users write it: float32 master weights, bf16 compute.

``nn.Dense(dtype=bfloat16, param_dtype=float32)`` with logically named weights
(``nn.with_logical_partitioning``), a ``flax.training.train_state.TrainState`` with
``optax.adamw``, a mean-squared-error step. One function at any size, used by
``tests/test_libraries.py`` and ``benchmarks/memory_vs_xla.py``.

Run: ``JAX_NUM_CPU_DEVICES=8 python examples/linen_bf16_mlp.py``
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

DIMS = {"x": "batch embed", "y": "batch embed"}


class MLP(nn.Module):
    """``embed -> mlp (relu) -> embed``, bf16 compute on float32 parameters."""

    embed: int
    mlp: int

    @nn.compact
    def __call__(self, x):
        def dense(n, names):
            lp = nn.with_logical_partitioning
            return nn.Dense(n, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                            kernel_init=lp(nn.initializers.lecun_normal(), names),
                            bias_init=lp(nn.initializers.zeros, names[1:]))

        return dense(self.embed, ("mlp", "embed"))(nn.relu(dense(self.mlp, ("embed", "mlp"))(x)))


def setup(embed: int = 32, mlp: int = 64, batch: int = 16):
    """``(train_step, (state, x, y))`` at these sizes."""
    model = MLP(embed=embed, mlp=mlp)
    x, y = jax.random.normal(jax.random.key(3), (batch, embed)), jax.random.normal(jax.random.key(4), (batch, embed))
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(0), x)["params"],
                                          tx=optax.adamw(1e-3))

    def train_step(state, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((state.apply_fn({"params": p}, x).astype(jnp.float32) - y) ** 2))(state.params)
        return state.apply_gradients(grads=grads), loss

    return train_step, (state, x, y)


def trace_mlp(train_step, args, donate_argnums=()):
    """The traced graph (``donate_argnums`` as for ``jax.jit``: ``(0,)`` donates the state)."""
    return autolayout.trace(train_step, *args, dims=DIMS, donate_argnums=donate_argnums)


def main() -> None:
    step, args = setup()
    g = trace_mlp(step, args)
    print(g.summary())
    ex = autolayout.execute(g, "data:2,model:4", "batch:data;mlp:model|*:data@3", args=args)
    print(ex.summary())


if __name__ == "__main__":
    main()
