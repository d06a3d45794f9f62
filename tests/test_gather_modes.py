"""Out-of-range ids in an embedding lookup: the sharded program does what jax's gather
mode does (clamp, fill, drop in the gradient's scatter-add) for every layout, including
a vocabulary split over a mesh axis, and its numbers equal ``jax.jit``'s."""
from __future__ import annotations

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.lax import GatherScatterMode as M

from autolayout.exec import LoweringError, execute
from autolayout.exec.local_ops import out_of_range
from autolayout.train import train_step
from autolayout.trace import trace

V, D, B, L = 32, 8, 8, 4
MESH = "data:2,model:4"
FAST = {"xla_backend_optimization_level": 0}  # as tests/test_exec.py: faster XLA CPU compiles, same numbers
LOOKUPS = {  # the gather's mode in the traced step (jax's jaxpr): see test_modes_are_recorded
    "index": lambda t, i: t[i],                                        # PROMISE_IN_BOUNDS (clamps)
    "take": lambda t, i: jnp.take(t, i, axis=0),                       # FILL_OR_DROP, NaN rows
    "take_fill": lambda t, i: jnp.take(t, i, axis=0, fill_value=-3.0),  # FILL_OR_DROP, -3 rows
    "take_clip": lambda t, i: jnp.take(t, i, axis=0, mode="clip"),     # CLIP
}
# (row, column) -> id: above V - 1, below -V (still negative after jnp's wrap of negatives), -1
BAD = {(0, 0): V + 3, (1, 1): -V - 8, (2, 2): -1, (5, 3): V}


@functools.lru_cache(maxsize=None)
def case(lookup: str):
    def loss(p, b):
        e = LOOKUPS[lookup](p["embed"], b["tok"])
        e = jnp.where(jnp.isnan(e), 0.5, e)  # keeps the loss finite, so each fill row's place counts
        return jnp.mean(jnp.tanh(e @ p["w"]) * jnp.arange(1.0, D + 1))

    step = train_step(loss, "sgd", 0.1)
    params = {"embed": jax.random.normal(jax.random.key(0), (V, D)),
              "w": jax.random.normal(jax.random.key(1), (D, D))}
    tok = jax.random.randint(jax.random.key(2), (B, L), 0, V, dtype=jnp.int32)
    g = trace(step, params, (), {"tok": tok},
              dims=({"embed": "vocab d_model", "w": "d_model d_h"}, None, {"tok": "batch length"}),
              roles=("param", "opt_state", "input"))
    return step, params, tok, g


def ids(which: str) -> jax.Array:
    tok = case("index")[2]
    if which == "out_of_range":
        for (r, c), v in BAD.items():
            tok = tok.at[r, c].set(v)
    return tok


@pytest.mark.parametrize("layout", ["", "batch:data", "vocab:model", "batch:data;vocab:model"])
@pytest.mark.parametrize("which", ["in_range", "out_of_range"])
@pytest.mark.parametrize("lookup", sorted(LOOKUPS))
def test_sharded_lookup_matches_jit(lookup, which, layout):
    step, params, _, g = case(lookup)
    ref = _executes_as_jit(g, layout, step, (params, (), {"tok": ids(which)}))
    assert np.isfinite(np.asarray(ref[2]))


def _executes_as_jit(g, layout, step, args):
    """``execute`` checks every output against the unsharded step (raises OutputMismatchError);
    and directly: the loss and the updated table equal jax.jit's, which is returned."""
    ref = jax.jit(step)(*args)
    ex = execute(g, MESH, layout, args=args, repeats=1, compiler_options=FAST)
    assert ex.max_abs_error <= 1e-5, ex.summary()
    np.testing.assert_allclose(np.asarray(ex.outputs[2]), np.asarray(ref[2]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ex.outputs[0]["embed"]), np.asarray(ref[0]["embed"]),
                               rtol=1e-5, atol=1e-6)
    return ref


def test_the_out_of_range_ids_change_the_numbers():
    """The cases above can fail: each mode's loss with the bad ids differs from the in-range
    loss and from the other modes' (clamp vs fill vs fill value), per jax.jit."""
    losses = {}
    for lookup in LOOKUPS:
        step, params, _, _ = case(lookup)
        losses[lookup] = float(jax.jit(step)(params, (), {"tok": ids("out_of_range")})[2])
        assert losses[lookup] != float(jax.jit(step)(params, (), {"tok": ids("in_range")})[2])
    assert len(set(losses.values())) == len(losses), losses


def test_modes_are_recorded():
    """The op keeps jax's mode: indexing's PROMISE_IN_BOUNDS, take's FILL_OR_DROP with its
    fill value (NaN by default), take(mode='clip')'s CLIP; the gradient's scatter-add the same."""
    want = {"index": (M.PROMISE_IN_BOUNDS, None), "take": (M.FILL_OR_DROP, "nan"),
            "take_fill": (M.FILL_OR_DROP, -3.0), "take_clip": (M.CLIP, None)}
    for lookup, (mode, fill) in want.items():
        g = case(lookup)[3]
        (gather,) = [op for op in g.ops() if op.kind == "gather"]
        (scatter,) = [op for op in g.ops() if op.kind == "scatter"]
        assert gather.attr("mode") == mode and scatter.attr("mode") == mode, lookup
        got = gather.attr("fill_value")
        assert (np.isnan(got) if fill == "nan" else got == fill), (lookup, got)
        assert scatter.attr("fill_value") is None
    # the semantics the lowering executes, as XLA runs each mode (see out_of_range)
    g = case("index")[3]
    gather, scatter = (next(op for op in g.ops() if op.kind == k) for k in ("gather", "scatter"))
    assert out_of_range(gather) == ("clamp", None) and out_of_range(scatter) == ("drop", None)


def test_lowering_without_a_mode_names_the_op():
    g = case("take_clip")[3]
    gather = next(op for op in g.ops() if op.kind == "gather")
    bare = dataclasses.replace(gather, attrs=tuple((k, v) for k, v in gather.attrs if k != "mode"))
    with pytest.raises(LoweringError, match=f"gather op '{gather.name}' has no 'mode' attr.*trace the step again"):
        out_of_range(bare)


# ---------------------------------------------------------------- per-element index
# eqx.nn.Embedding applied per token under jax.vmap gathers with a 2-column index
# (token, 0) (mode CLIP; its gradient a scatter-add of the same form): a one-axis lookup.
EQX_LOOKUPS = {
    "eqx_embedding": lambda t, i: jax.vmap(jax.vmap(eqx.nn.Embedding(weight=t)))(i),
    "vmap_index": lambda t, i: jax.vmap(jax.vmap(lambda j: t[j]))(i),
    "vmap_dynamic_slice": lambda t, i: jax.vmap(jax.vmap(lambda j: jax.lax.dynamic_slice_in_dim(t, j, 1)[0]))(i),
}


@functools.lru_cache(maxsize=None)
def eqx_case(lookup: str):
    def loss(p, b):
        e = EQX_LOOKUPS[lookup](p["embed"], b["tok"])
        return jnp.mean(jnp.tanh(e @ p["w"]) * jnp.arange(1.0, D + 1))

    step = train_step(loss, "sgd", 0.1)
    params = case("index")[1]
    args = (params, (), {"tok": ids("out_of_range")})
    g = trace(step, *args, dims=({"embed": "vocab d_model", "w": "d_model d_h"}, None, {"tok": "batch length"}),
              roles=("param", "opt_state", "input"))
    return step, args, g


@pytest.mark.parametrize("lookup", sorted(EQX_LOOKUPS))
def test_per_element_index_is_a_one_axis_lookup(lookup):
    step, args, g = eqx_case(lookup)
    jaxpr = jax.make_jaxpr(step)(*args)
    (gather,) = [e for e in jaxpr.eqns if e.primitive.name == "gather"]
    assert gather.invars[1].aval.shape == (B, L, 2) and gather.params["mode"] == M.CLIP  # the pattern itself
    ops = {op.kind: op for op in g.ops()}
    assert ops["gather"].attr("indexed") == "vocab" and ops["scatter"].attr("indexed") == "vocab"
    assert g.tensor(ops["gather"].inputs[1]).dim_names == ("batch", "length")  # the token column alone
    ref = jax.jit(step)(*args)
    np.testing.assert_allclose(np.asarray(g.evaluate(*args)[2]), np.asarray(ref[2]), rtol=1e-6)  # the replays


@pytest.mark.parametrize("layout", ["", "batch:data", "vocab:model", "batch:data;vocab:model", "d_model:model"])
def test_per_element_index_executes_as_jit(layout):
    step, args, g = eqx_case("eqx_embedding")
    _executes_as_jit(g, layout, step, args)


def test_per_element_index_that_may_fill_names_the_rewrite():
    """In FILL_OR_DROP mode the second column decides whether a row fills, so it is not a
    one-axis lookup unless it is 0: rejected with the rewrite."""
    from autolayout import TraceError

    def f(t, i):
        idx = jnp.stack([i, jnp.zeros_like(i)], axis=-1)
        dn = jax.lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1))
        return jax.lax.gather(t, idx, dn, (1, D), mode="fill").sum()

    with pytest.raises(TraceError, match=r"(?s)gather.*embedding row lookup written with a per-element index.*"
                                         r"FILL_OR_DROP.*jnp\.take\(weight, ids, axis=0\) or weight\[ids\]"):
        trace(f, case("index")[1]["embed"], jnp.arange(B, dtype=jnp.int32), dims=("vocab d_model", "batch"))


@pytest.mark.parametrize("layout", ["", "batch:data;vocab:model", "vocab:data,model"])
def test_take_along_axis_out_of_range_labels(layout):
    """Cross-entropy's label pick (a gather with batching dims, FILL_OR_DROP: NaN for a label
    outside the vocabulary) and its gradient (dropped) over a split vocabulary, as jax.jit."""
    def step(w, x, labels):
        def loss(w):
            logits = x @ w
            pick = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)
            return -jnp.mean(jnp.where(jnp.isnan(pick), 0.25, pick))
        l, gw = jax.value_and_grad(loss)(w)
        return l, w - 0.1 * gw

    w = jax.random.normal(jax.random.key(3), (D, V))
    x = jax.random.normal(jax.random.key(4), (B, D))
    labels = jnp.array([1, V + 2, 5, -V - 1, 30, -1, V, 0], jnp.int32)  # jnp wraps -1 (-> V - 1) only
    args = (w, x, labels)
    g = trace(step, *args, dims=("d_model vocab", "batch d_model", "batch"))
    ref = jax.jit(step)(*args)
    ex = execute(g, MESH, layout, args=args, repeats=1, compiler_options=FAST)
    assert ex.max_abs_error <= 1e-5, ex.summary()
    np.testing.assert_allclose(np.asarray(ex.outputs[0]), np.asarray(ref[0]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ex.outputs[1]), np.asarray(ref[1]), rtol=1e-5, atol=1e-6)
