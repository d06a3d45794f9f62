"""Shared test cases for the model zoo: tiny sizes, cached graphs and reference runs.

XLA compilation dominates test time on CPU, so each zoo graph is traced, jitted
and run once per session and shared by test_trace, test_graph and test_models.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import jax
import numpy as np

from autolayout import models

# Tiny, CPU-friendly sizes; mostly distinct so that a dim mixed up with another shows.
SIZES: dict[str, dict[str, int]] = {
    "mlp": dict(batch=4, d_io=6, d_hidden=10),
    "transformer_lm": dict(d_model=8, d_ff=12, heads=2, d_kv=4, n_layers=3, vocab=11, batch=3, length=5),
    "moe": dict(d_model=8, d_ff=12, experts=4, capacity=3, batch=2, length=6),
    "llama": dict(d_model=12, heads=6, kv_heads=2, d_kv=10, d_ff=14, n_layers=3, vocab=11, batch=4,
                  length=7),
}

ADAM_MODELS = ("transformer_lm", "llama")  # trained with the zoo's Adam step (params, opt_state, batch)

CASES = [(model, train) for model in SIZES for train in (True, False)]
CASE_IDS = [f"{model}-{'train' if train else 'forward'}" for model, train in CASES]


@lru_cache(maxsize=None)
def graph(model: str, train: bool = True, **overrides: int) -> Any:
    """The zoo graph of ``model`` at the tiny test sizes (``overrides`` replace some)."""
    return models.MODELS[model](**{**SIZES[model], **overrides}, train=train)


@lru_cache(maxsize=None)
def jitted(model: str, train: bool = True) -> tuple[Any, Any]:
    """``(jit(graph.evaluate), jit(graph.fn))``: compiled once, reused with new values."""
    g = graph(model, train)
    return jax.jit(g.evaluate), jax.jit(g.fn)


@lru_cache(maxsize=None)
def run(model: str, train: bool = True) -> tuple[Any, Any, Any]:
    """``(args, graph.evaluate(*args), fn(*args))`` with :func:`models.example_args`."""
    g = graph(model, train)
    args = models.example_args(g)
    evaluate, fn = jitted(model, train)
    return args, evaluate(*args), fn(*args)


def assert_tree_close(actual: Any, expected: Any, rtol: float = 1e-5) -> None:
    """Same pytree structure, shapes and dtypes; values equal to float32 precision.

    ``atol`` is relative to the leaf's largest magnitude (1e-6 of it), so entries near
    zero — where ``rtol`` alone is meaningless — are held to the leaf's own scale.
    """
    a_leaves, a_tree = jax.tree_util.tree_flatten(actual)
    e_leaves, e_tree = jax.tree_util.tree_flatten(expected)
    assert a_tree == e_tree
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"leaf {k}: shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"leaf {k}: dtype {a.dtype} != {e.dtype}"
        scale = float(np.abs(e).max()) if e.size else 0.0
        np.testing.assert_allclose(a, e, rtol=rtol, atol=1e-6 * scale, err_msg=f"leaf {k}")


def count_leaves(tree: Any) -> int:
    return len(jax.tree_util.tree_leaves(tree))


def leaf_sizes(tree: Any) -> int:
    """Total number of elements of a pytree of arrays or ``ShapeDtypeStruct`` s."""
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


# --------------------------------------------------------------------------- a hand-written program
def kitchen_sink() -> tuple[Any, tuple, Any, Any]:
    """A small model touching every construct the tracer handles besides scan:
    embedding gather, ``jax.checkpoint``, ``custom_jvp``/``custom_vjp``, nested ``jit``,
    an ``iota`` causal mask with ``select_n``, ``integer_pow``, ``erf``/``tanh``/
    ``logistic``/``rsqrt``, ``reduce_max``/``reduce_min``, ``convert_element_type`` and
    ``stop_gradient``. Its gradient adds the embedding's scatter-add.

    Returns ``(loss, args, dims, roles)`` with ``loss(params, tokens) -> scalar``.
    """
    import jax.numpy as jnp
    from jax import lax

    @jax.custom_jvp
    def softplus(x: Any) -> Any:
        return jnp.log1p(jnp.exp(x))

    softplus.defjvp(lambda p, t: (softplus(p[0]), t[0] * jax.nn.sigmoid(p[0])))

    @jax.custom_vjp
    def doubled(x: Any) -> Any:
        return 2.0 * x

    doubled.defvjp(lambda x: (2.0 * x, None), lambda _, g: (2.0 * g,))

    @jax.jit
    def project(h: Any, w: Any) -> Any:
        return jnp.tanh(h @ w)

    def loss(params: dict, tokens: Any) -> Any:
        e = jnp.take(params["embed"], tokens, axis=0)
        h = jax.checkpoint(lambda a: jax.nn.gelu(a, approximate=False))(e)
        h = project(h, params["w"])
        n = tokens.shape[1]
        causal = jnp.arange(n)[:, None] >= jnp.arange(n)[None, :]
        s = jnp.where(causal, jnp.einsum("bld,bmd->blm", h, h), -1e9)
        p = jax.nn.sigmoid(s.max(-1)) + h.min(-1) ** 3 * 0.1
        r = lax.rsqrt(jnp.square(h).mean(-1) + 1.0)
        z = softplus(p) * doubled(r) + lax.stop_gradient(r) + 0.1 * lax.erf(p)
        return z.sum() + tokens.astype(jnp.float32).mean() * 0.01

    rng = np.random.default_rng(7)
    vocab, d, batch, length = 10, 6, 3, 5
    params = {"embed": jax.numpy.asarray(rng.standard_normal((vocab, d)), "float32"),
              "w": jax.numpy.asarray(rng.standard_normal((d, d)) / np.sqrt(d), "float32")}
    tokens = jax.numpy.asarray(rng.integers(0, vocab, (batch, length)), "int32")
    dims = ({"embed": "vocab d_model", "w": "d_model d_hidden"}, "batch length")
    return loss, (params, tokens), dims, ("param", "input")


def primitives(jaxpr: Any) -> set[str]:
    """Names of all primitives in ``jaxpr`` and its sub-jaxprs (any parameter that is one)."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    names |= primitives(sub)
    return names
