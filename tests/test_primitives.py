"""JAX primitives beyond einsum/elementwise/reduce (issue 13): each traced, evaluated and
executed under ``jax.shard_map`` with a layout that splits a dim it touches.

References are independent of the code under test: values from ``jax.jit(fn)``, the
collectives from the compiled HLO (``ex.collectives_match``: the plan's steps equal the
HLO's) and, per case, the collective kinds worked out by hand in the case's comment.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from autolayout.exec import execute
from autolayout.trace import trace

FAST = {"xla_backend_optimization_level": 0}  # ~2x faster XLA CPU compiles; same numbers
TOL = 1e-4


@dataclass(frozen=True)
class Arg:
    """One argument: its shape, and for an integer argument the exclusive upper bound."""

    shape: tuple[int, ...]
    high: int | None = None

    def spec(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape, jnp.int32 if self.high else jnp.float32)

    def value(self, rng: np.random.Generator) -> Any:
        if self.high:
            return jnp.asarray(rng.integers(0, self.high, self.shape), jnp.int32)
        return jnp.asarray(rng.standard_normal(self.shape), jnp.float32)


@dataclass(frozen=True)
class Case:
    """A function, its arguments and dims, and layouts to run it under:
    ``(mesh, layout, compiled collective kinds, sorted)``."""

    id: str
    fn: Callable
    args: tuple[Arg, ...]
    dims: tuple[str, ...]
    runs: tuple[tuple[str, str, tuple[str, ...]], ...]


# --------------------------------------------------------------- the functions
def xent_step(w, x, labels):
    """optax's integer-label cross-entropy: a gather with batching dims and, in the
    gradient, a scatter-add with batching dims."""
    def loss(w):
        return optax.softmax_cross_entropy_with_integer_labels(x @ w, labels).mean()
    return jax.value_and_grad(loss)(w)


def take_along(x, idx, w):
    """``take_along_axis`` with a free index dim (k) and its gradient."""
    def loss(x):
        return jnp.sum(jnp.take_along_axis(x, idx, axis=1) * w)
    return jax.value_and_grad(loss)(x)


def take_own_positions(x, w):
    """The index runs along the indexed dim itself (as ``take_along_axis(x, argsort(x))``):
    the output has the indexed dim too, so the table is read whole along it; ``+ x`` names
    the gradient's dim ``n`` too, so the scatter-add's index and updates have the dim they
    scatter into and are read whole along it."""
    def loss(x):
        idx = jax.lax.stop_gradient(jnp.floor(jnp.abs(x) * 5).astype(jnp.int32) % x.shape[1])
        return jnp.sum(jnp.take_along_axis(x, idx, axis=1) * w)
    value, grad = jax.value_and_grad(loss)(x)
    return value, grad + x


def mean_pool_grad(w, x):
    """Issue 13's repro: the gradient of a mean over ``seq`` is a broadcast back over it
    feeding a contraction (a materialised broadcast: KeyError 'broadcast_0' once)."""
    return jax.grad(lambda w: jnp.sum((x @ w).mean(axis=1) ** 2))(w)


def gqa_repeat(q, k):
    """Grouped-query attention's ``jnp.repeat`` of the key heads: a broadcast and a merge."""
    def loss(q, k):
        return jnp.einsum("bqhd,bkhd->bhqk", q, jnp.repeat(k, 2, axis=2)).sum()
    return jax.value_and_grad(loss, argnums=(0, 1))(q, k)


def slice_pad(x):
    """``x[:, 1:]`` padded back to length, and ``x[:, 0]`` (a slice to size 1)."""
    return jnp.pad(x[:, 1:], ((0, 0), (0, 1), (0, 0))), x[:, 0] * 2.0


def rope_grad(x):
    """RoPE's rotate-half (``split`` + ``concatenate``), a class token prepended (a constant
    concatenated) and the gradient (the transposes: concatenations and slices)."""
    def loss(x):
        x1, x2 = jnp.split(x, 2, axis=-1)
        rot = jnp.concatenate([-x2, x1], axis=-1) * x
        tok = jnp.concatenate([jnp.ones((x.shape[0], 1, x.shape[2])), rot], axis=1)
        return jnp.sum(tok ** 2)
    return jax.value_and_grad(loss)(x)


def cumulative(x):
    return (jnp.cumsum(x, axis=1), jnp.cumprod(x, axis=1), jax.lax.cummax(x, axis=1),
            jax.lax.cumlogsumexp(x, axis=1, reverse=True))


def sorting(x):
    values, indices = jax.lax.top_k(x, 3)
    return values, indices, jnp.sort(x, axis=-1), jnp.argsort(x, axis=-1), jnp.sort(x, axis=1)


def dynamic(x, i, u):
    return (jax.lax.dynamic_slice_in_dim(x, i, 3, axis=1) * 2.0,
            jax.lax.dynamic_update_slice_in_dim(x, u, i, axis=1))


def conv_step(x, k):
    """A 3x3 'SAME' convolution and both gradients (convolutions and a ``rev``)."""
    def loss(x, k):
        y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.sum(y ** 2)
    return jax.value_and_grad(loss, argnums=(0, 1))(x, k)


def patch_embed(x, k):
    """ViT's patch embedding: a convolution with stride = kernel size."""
    def loss(x, k):
        y = jax.lax.conv_general_dilated(x, k, (4, 4), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.sum(jnp.tanh(y))
    return jax.value_and_grad(loss, argnums=(0, 1))(x, k)


CASES = [
    Case("mean_pool_grad", mean_pool_grad, (Arg((8, 16)), Arg((4, 8, 8))),
         ("embed mlp", "batch seq embed"), (
             # seq split: the mean over seq all-reduces; the broadcast back over seq is a
             # local slice; the weight gradient contracts seq: all-reduce
             ("all:8", "seq:all", ("all-reduce",) * 2),
             ("rows:2,cols:4", "batch:rows;mlp:cols", ("all-reduce",)),  # the gradient sums batch
         )),
    Case("gqa_repeat", gqa_repeat, (Arg((2, 4, 4, 8)), Arg((2, 4, 2, 8))),
         ("batch q heads d", "batch k kvh d"), (
             # heads split: the repeat's merge (kvh, copy) -> heads slices locally; the loss
             # sums heads (all-reduce); the gradient's split heads -> (kvh, copy) all-gathers
             ("rows:2,cols:4", "heads:cols", ("all-gather", "all-reduce")),
         )),
    Case("slice_pad", slice_pad, (Arg((4, 8, 16)),), ("batch seq d",), (
        # seq split: both slices read x whole along seq (one all-gather they share,
        # sharing.shared_reads: XLA's CSE leaves one of the two); the pad's input (a new dim of
        # 7) is unsplit, its output sliced locally into seq's split
        ("all:8", "seq:all", ("all-gather",)),
        ("rows:2,cols:4", "batch:rows;d:cols", ()),  # kept dims split: nothing moves
    )),
    Case("rope_grad", rope_grad, (Arg((4, 8, 16)),), ("batch seq d",), (
        # d split: the two halves of the forward split read x gathered along d (one all-gather
        # they share, sharing.shared_reads); the gradient's halves are sliced from the d-split
        # gradient of the product: one more; the loss sums over d: one all-reduce
        ("all:8", "d:all", ("all-gather",) * 2 + ("all-reduce",)),
        # batch and seq split: prepending the class token along seq gathers the product
        # along seq; the new length dim (9) is unsplit, so the loss's sum all-reduces over
        # batch's rows only; the gradient's slice back to seq is a local slice
        ("rows:2,cols:4", "batch:rows;seq:cols", ("all-gather", "all-reduce")),
    )),
    Case("cumulative", cumulative, (Arg((8, 8, 4)),), ("batch seq d",), (
        ("all:8", "seq:all", ("all-gather",)),  # along a split dim: x gathered once for the four ops
        ("all:8", "batch:all", ()),                   # along an unsplit dim: local
    )),
    Case("sorting", sorting, (Arg((8, 4, 8)),), ("batch seq n",), (
        ("all:8", "batch:all", ()),
        # n split: top_k's values and indices, sort and argsort read x gathered once; argsort
        # gathers its iota too (the sorted keys are unused: no op); the sort along seq is local
        ("all:8", "n:all", ("all-gather",) * 2),
    )),
    Case("conv", conv_step, (Arg((8, 8, 8, 4)), Arg((3, 3, 4, 8))), ("batch h w cin", "kh kw cin cout"), (
        # batch split: the loss and the kernel gradient (contracting batch) all-reduce
        ("all:8", "batch:all", ("all-reduce",) * 2),
        # + cout split: the loss all-reduces over both axes; the input gradient contracts cout
        ("rows:2,cols:4", "batch:rows;cout:cols", ("all-reduce",) * 3),
        # a spatial dim split: the forward convolution and the kernel gradient read x whole
        # along h (no halo exchange: one all-gather they share); the outputs' spatial dims are
        # their own
        ("all:8", "h:all", ("all-gather",)),
    )),
    Case("patch_embed", patch_embed, (Arg((8, 8, 8, 3)), Arg((4, 4, 3, 16))), ("batch h w c", "ph pw c d"), (
        ("all:8", "batch:all", ("all-reduce",) * 2),
        # d split: the loss sums d; the input gradient contracts d
        ("all:8", "d:all", ("all-reduce",) * 2),
    )),
    Case("dynamic", dynamic, (Arg((4, 8, 16)), Arg((), high=6), Arg((4, 2, 16))),
         ("batch seq d", "", "batch k d"), (
             # seq split: the dynamic slice and the update read x whole along seq (one all-gather)
             ("all:8", "seq:all", ("all-gather",)),
             ("rows:2,cols:4", "batch:rows;d:cols", ()),
         )),
    Case("xent", xent_step, (Arg((8, 16)), Arg((4, 2, 8)), Arg((4, 2), high=16)),
         ("embed vocab", "batch seq embed", "batch seq"), (
             # vocab split: the softmax's max and sum and the label pick (a masked local
             # gather) each all-reduce over the vocab axis; the gradient needs nothing more
             ("all:8", "vocab:all", ("all-reduce",) * 3),
             # batch split: the mean over batch and the weight gradient (contracting batch)
             ("rows:2,cols:4", "batch:rows;vocab:cols", ("all-reduce",) * 5),
         )),
    Case("take_along_axis", take_along, (Arg((4, 8, 2)), Arg((4, 2, 2), high=8), Arg((4, 2, 2))),
         ("batch n e", "batch k e", "batch k e"), (
             # the indexed dim n split: masked local gather + all-reduce; the loss sums
             # batch/k/e (none split); the scatter-add gradient lands in n's local block
             ("all:8", "n:all", ("all-reduce",)),
             # batch split: a batching dim, local; the loss sum over batch all-reduces
             ("rows:2,cols:4", "batch:cols;e:rows", ("all-reduce",)),
         )),
    Case("take_own_positions", take_own_positions, (Arg((4, 8)), Arg((4, 8))),
         ("batch n", "batch n"), (
             # n split: the gather reads the table whole along n (all-gather), the scatter-add
             # reads the index and updates whole along n (two all-gathers); the loss sum
             # over n all-reduces
             ("all:8", "n:all", ("all-gather", "all-gather", "all-gather", "all-reduce")),
         )),
]


@functools.lru_cache(maxsize=None)
def graph(case_id: str):
    c = CASE[case_id]
    return trace(c.fn, *(a.spec() for a in c.args), dims=c.dims)


CASE = {c.id: c for c in CASES}


def args_of(c: Case, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return tuple(a.value(rng) for a in c.args)


def max_err(a: Any, b: Any) -> float:
    """The largest error relative to ``1 + |reference|`` (float32 sums in another order)."""
    return max(float(jnp.max(jnp.abs(jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32)) /
                             (1 + jnp.abs(jnp.asarray(y, jnp.float32)))))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_evaluate_matches_jit(case):
    args = args_of(case)
    assert max_err(graph(case.id).evaluate(*args), jax.jit(case.fn)(*args)) <= TOL


RUNS = [pytest.param(c, mesh, layout, kinds, id=f"{c.id}-{layout}") for c in CASES
        for mesh, layout, kinds in c.runs]


@pytest.mark.parametrize("case,mesh,layout,kinds", RUNS)
def test_shard_map_matches_jit_and_hlo(case, mesh, layout, kinds):
    args = args_of(case)
    ex = execute(graph(case.id), mesh, layout, args=args, repeats=1, compiler_options=FAST)
    assert max_err(ex.outputs, jax.jit(case.fn)(*args)) <= TOL, ex.summary()
    assert ex.collectives_match, f"{ex.summary()}\n{ex.collective_diff()}"
    assert ex.collective_diff() == ""
    assert tuple(sorted(c.kind for c in ex.compiled_collectives)) == kinds
    # XLA's optimisation finds no identical all-gathers left to merge (sharing.shared_reads made each once)
    gathers = [sum(c.kind == "all-gather" for c in cs) for cs in (ex.compiled_collectives, ex.optimized_collectives)]
    assert gathers[0] == gathers[1], gathers


def test_gather_ops_record_batching_dims():
    g = graph("xent")
    (gather,) = [op for op in g.ops() if op.kind == "gather"]
    (scatter,) = [op for op in g.ops() if op.kind == "scatter"]
    for op in (gather, scatter):
        assert op.attr("indexed") == "vocab"
        assert set(op.attr("batch")) == {"batch", "seq"}


def _three_problems(x, n):
    y = jax.lax.fori_loop(0, n, lambda i, c: c * 2.0, x)           # while: data-dependent trip count
    z = jax.lax.cond(x.sum() > 0, jnp.sin, jnp.cos, y)              # cond
    return z.at[0].set(1.0), jnp.linalg.cholesky(x @ x.T)           # scatter; cholesky


def test_every_unsupported_construct_is_reported_at_once():
    """One error lists all four, each with its primitive, this file's source line, the reason
    and the rewrite (the line numbers come from the source, not from the tracer)."""
    import inspect
    import re

    from autolayout import TraceError

    lines, first = inspect.getsourcelines(_three_problems)
    line_of = {key: first + i for i, text in enumerate(lines) for key in ("fori_loop", "cond", "set", "cholesky")
               if key in text}
    with pytest.raises(TraceError) as err:
        trace(_three_problems, jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32))
    msg = str(err.value)
    assert msg.startswith("4 unsupported constructs in '_three_problems'"), msg
    for prim, key, rewrite in [("while", "fori_loop", "fori_loop` with Python-int bounds"),
                               ("cond", "cond", "jnp.where"), ("scatter", "set", "one_hot"),
                               ("cholesky", "cholesky", "outside the traced function")]:
        assert re.search(rf"`{prim}` with inputs \(.*\) at .*test_primitives\.py:{line_of[key]}\b.*Rewrite: .*"
                         rf"{re.escape(rewrite)}", msg), (prim, msg)
    assert "several outputs" not in msg


def test_conv_flops_are_the_window_macs():
    """Each of the three convolutions (forward, input and kernel gradients) does, per output
    element, one MAC per element of its window: 2 · N·H·W·Cout · 3·3·Cin each (hand count)."""
    assert graph("conv").flops() == 3 * 2 * (8 * 8 * 8 * 8) * (3 * 3 * 4)
    # stride 4, 4x4 patches: forward (8·2·2·16 outputs) · (4·4·3 window); kernel gradient
    # (4·4·3·16) · (8·2·2); input gradient, an lhs-dilated convolution whose window counts the
    # inserted zeros as XLA's does: (8·8·8·3) · (16·4·4)
    assert graph("patch_embed").flops() == 2 * (8 * 2 * 2 * 16 * 48 + 768 * 32 + 1536 * 256)
