"""A top-2 mixture of experts as JAX users write it, traced, searched and executed.

Routing by ``lax.top_k`` over the router logits, a dense combine (softmax weights times a
one-hot of the chosen experts), experts as batched einsums, trained with ``optax.adamw``.
The two chosen experts get their own dim, named ``top`` after tracing (``names=``).

Run: ``JAX_NUM_CPU_DEVICES=8 python examples/top2_moe.py``
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import autolayout  # noqa: E402

DIMS = ({"router": "embed experts", "w_in": "experts embed mlp", "w_out": "experts mlp embed"}, None,
        "batch embed", "batch embed")
ROLES = ("param", "opt_state", "input", "input")


def setup(experts: int = 4, embed: int = 16, mlp: int = 32, batch: int = 16):
    """``(train_step, (params, opt_state, x, targets))`` at these sizes."""
    def moe(p, x):
        w, idx = jax.lax.top_k(x @ p["router"], 2)
        combine = jnp.einsum("bk,bke->be", jax.nn.softmax(w, axis=-1), jax.nn.one_hot(idx, experts))
        h = jax.nn.gelu(jnp.einsum("bd,edf->bef", x, p["w_in"]))
        return jnp.einsum("be,bed->bd", combine, jnp.einsum("bef,efd->bed", h, p["w_out"]))

    tx = optax.adamw(1e-3)

    def train_step(params, opt_state, x, t):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((moe(p, x) - t) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    shapes = {"router": (embed, experts), "w_in": (experts, embed, mlp), "w_out": (experts, mlp, embed)}
    params = {k: jax.random.normal(jax.random.key(i), s) * 0.2 for i, (k, s) in enumerate(shapes.items())}
    args = (params, tx.init(params), jax.random.normal(jax.random.key(7), (batch, embed)),
            jax.random.normal(jax.random.key(8), (batch, embed)))
    return train_step, args


def trace_moe(train_step, args, donate_argnums=()):
    """The traced graph, with the top-2 dim named ``top`` (``donate_argnums`` as for ``jax.jit``)."""
    return autolayout.trace(train_step, *args, dims=DIMS, roles=ROLES, names={"d2": "top"},
                            donate_argnums=donate_argnums)


def main() -> None:
    step, args = setup()
    g = trace_moe(step, args)
    r = autolayout.search(g, "data:2,model:4", hardware="cpu")
    print(r.layout, r.status)
    ex = autolayout.execute(g, "data:2,model:4", r.layout, args=args)
    print(ex.summary())


if __name__ == "__main__":
    main()
