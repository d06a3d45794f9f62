"""Region rules (sequence parallelism) and rematerialisation: the search is exact over them
(held against an exhaustive enumeration), and every such layout executes under shard_map
with the reference numbers and the plan's collectives (issue 11)."""
from __future__ import annotations

import functools
import math
import re

import pytest

from autolayout import models
from autolayout.core import Layout, LayoutError
from autolayout.costmodel.predict import predict
from autolayout.exec import execute
from autolayout.remat import POLICIES, remat_pairs, rematerialize
from autolayout.search import SearchError, enumerate_layouts, search

FAST = {"xla_backend_optimization_level": 0}  # ~2x faster XLA CPU compiles; same numbers
TOL = 1e-4
SMALL = dict(d_model=16, d_ff=32, heads=4, d_kv=8, n_layers=2, vocab=32, batch=8, length=8)


@functools.lru_cache(maxsize=None)
def graph(remat: bool = False):
    return models.transformer_lm(**SMALL, remat=remat)


# ------------------------------------------------------------------ what remat applies to
def test_a_step_traced_with_checkpoint_offers_no_policy():
    """jax.checkpoint puts a remat call in the backward scan (the jaxpr's `remat2`): the traced
    graph already recomputes, so the search does not rematerialise it a second time."""
    plain, ckpt = graph(False), graph(True)
    assert [lp.recomputes for lp in plain.loops.values()] == [False, False]
    assert sorted(lp.recomputes for lp in ckpt.loops.values()) == [False, True]
    assert len(remat_pairs(plain)) == 1 and remat_pairs(ckpt) == []
    with pytest.raises(LayoutError, match="nothing to rematerialise"):
        rematerialize(ckpt, "full")


def _matmuls(g, loop=None):
    return [op for op in g.ops() if op.kind == "einsum" and len(op.inputs) == 2
            and (loop is None or op.loop == loop)]


def test_full_remat_recomputes_what_jax_checkpoint_recomputes():
    """The reference is jax itself: the step traced with ``jax.checkpoint`` runs, in its backward
    scan, the forward matmuls jax recomputes (7 of the layer's 8: the ffn-out product feeds only
    the residual add, whose gradient does not need it); the rewrite adds the same ones."""
    plain, ckpt = graph(False), graph(True)
    bwd = next(lp.name for lp in ckpt.loops.values() if lp.recomputes)
    bwd_plain = next(lp.name for lp in plain.loops.values() if lp.reverse)
    jax_recomputed = len(_matmuls(ckpt, bwd)) - len(_matmuls(plain, bwd_plain))
    ours = [op for op in _matmuls(rematerialize(plain, "full")) if op.name.startswith("remat/")]
    assert len(ours) == jax_recomputed == 7
    assert all(op.multiplicity == SMALL["n_layers"] for op in ours)


def test_dots_remat_recomputes_only_the_batched_contractions():
    """``dots`` saves the matmuls with weights (no batch dim: q, k, v, o, ffn in/out); by hand it
    recomputes the attention scores and the attention-weighted values (both batched over
    batch and heads), which the backward pass needs."""
    ours = [op for op in _matmuls(rematerialize(graph(False), "dots")) if op.name.startswith("remat/")]
    assert len(ours) == 2
    assert all({"batch", "heads"} <= set(op.output.dim_names) for op in ours)


# ------------------------------------------------------------------ exact over regions and remat
def _priced(g, mesh, hw):
    """``(time_s, memory_bytes, layout)`` of every layout with region rules under every remat
    policy, by exhaustive enumeration and predict (no storage sharding)."""
    out = []
    for lay in enumerate_layouts(g, mesh, regions=True):
        for policy in POLICIES:
            full = lay.with_remat("" if policy == "none" else policy)
            c = predict(g, mesh, full, hardware=hw)
            out.append((c.time_s, c.memory_bytes, full))
    return out


@pytest.mark.parametrize("hw", ["tpu-v4", "h100"])
def test_search_is_exact_with_regions_and_remat(hw):
    g, mesh = graph(False), "all:2"
    priced = _priced(g, mesh, hw)
    mems = sorted({m for _, m, _ in priced})
    # no limit; a limit only a third of the layouts meet (remat and SP decide what fits)
    for limit in (math.inf, mems[len(mems) // 3]):
        want = min((t, str(lay)) for t, m, lay in priced if m <= limit)
        r = search(g, mesh, hardware=hw, memory_limit=limit, shard_weight_update=False)
        assert r.status == "OPTIMAL"
        assert r.cost.memory_bytes <= limit
        assert r.cost.time_s == pytest.approx(want[0], rel=1e-9, abs=r.tolerance_s), (str(r.layout), want[1])
    with pytest.raises(SearchError, match="below the smallest peak memory") as err:
        search(g, mesh, hardware=hw, memory_limit=mems[0] - 1, shard_weight_update=False)
    # the error carries the least peak over every policy's layouts (the enumeration's), and a layout at it
    assert err.value.memory_bytes == mems[0]
    assert predict(g, mesh, err.value.layout, hardware=hw).memory_bytes == mems[0]


def test_a_policy_whose_activations_cannot_fit_is_ruled_out_before_its_tables(monkeypatch):
    """Under a limit that full remat meets and no remat cannot (every layout saves more
    activations than that, by the exhaustive enumeration), the search proves 'none' out from
    each tensor's share of the devices alone: no cost tables are built for it, the note says
    why, and the result is the enumeration's best."""
    from autolayout.search import api
    g, mesh, hw = graph(False), "all:2", "tpu-v4"
    priced = _priced(g, mesh, hw)
    fits = sorted(m for _, m, lay in priced if lay.remat == "full")
    never = min(m for _, m, lay in priced if not lay.remat)  # the smallest peak without remat
    limit = (fits[0] + never) // 2
    assert fits[0] <= limit < never
    built = []
    real = api.Tables
    monkeypatch.setattr(api, "Tables", lambda g, *a, **k: built.append(g.name) or real(g, *a, **k))
    r = search(g, mesh, hardware=hw, memory_limit=limit, shard_weight_update=False)
    want = min((t, str(lay)) for t, m, lay in priced if m <= limit)
    assert r.status == "OPTIMAL"
    assert r.cost.time_s == pytest.approx(want[0], rel=1e-9, abs=r.tolerance_s), (str(r.layout), want[1])
    assert any(re.match(r"remat=none: no layout fits: at least \d+ B per device .*\(proven\)", n) for n in r.notes), r.notes
    assert built and all("remat=" in name for name in built), built


def test_a_policy_proven_no_faster_has_a_note_that_says_why():
    """Each way the solver proves a remat policy out (its step-time bound is above the best time
    so far; no layout under that time fits) says so: the search's note is never empty."""
    import time

    from autolayout.costmodel.profiles import get_hardware
    from autolayout.search import api
    from autolayout.search.errors import Dominated
    from autolayout.core import Mesh

    g, mesh, hw = graph(False), Mesh.parse("all:2"), get_hardware("tpu-v4")
    priced = _priced(g, "all:2", "tpu-v4")
    fastest = min(t for t, _, _ in priced)
    never = min(m for _, m, lay in priced if not lay.remat)  # the smallest peak without remat
    cases = [(math.inf, fastest / 2, r"no layout takes at most [\d.e-]+ s per step \(the cost model's lower bound"),
             (never - 1, 1.0, r"no layout (fits: at least \d+ B per device|that fits memory_limit \d+ B takes at "
                              r"most 1 s per step)")]
    for limit, upper_s, message in cases:
        with pytest.raises(Dominated, match=message):
            api._search_one(g, mesh, hw, limit, "none", False, False, 60.0, 1, 0, time.perf_counter(), upper_s)


def test_the_search_note_of_a_dominated_policy_is_never_empty(monkeypatch):
    """A Dominated raised without a message still gives a note that says what was proven
    (it read 'remat=none:  (proven)')."""
    from autolayout.search import api
    from autolayout.search.errors import Dominated

    real = api._search_one

    def one(graph_, mesh, hw, limit, policy, *args, **kwargs):
        if policy == "none":
            raise Dominated()
        return real(graph_, mesh, hw, limit, policy, *args, **kwargs)

    monkeypatch.setattr(api, "_search_one", one)
    r = search(graph(False), "all:2", hardware="tpu-v4", shard_weight_update=False)
    note = next(n for n in r.notes if n.startswith("remat=none:"))
    assert re.fullmatch(r"remat=none: no layout that fits is faster than [\d.e-]+ s \(proven\)", note), note


# ------------------------------------------------------------------ execution
@pytest.mark.parametrize("layout", [
    "batch:rows;heads:cols;d_ff:cols;length@norm:cols",  # Megatron-SP
    "batch:rows;heads:cols;d_ff:cols;length@norm:cols|*:rows@3;remat=full",  # SP + FSDP + full remat
    "batch:rows;heads:cols;d_ff:cols|remat=dots",
    "batch:rows,cols|*:rows,cols@3;remat=full",
], ids=["sp", "sp-zero3-full", "tp-dots", "fsdp-full"])
def test_region_and_remat_layouts_execute(layout):
    ex = execute(graph(False), "rows:2,cols:4", layout, repeats=1, compiler_options=FAST)
    assert ex.max_abs_error <= TOL, ex.summary()
    assert ex.collectives_match, f"{ex.summary()}\n{ex.collective_diff()}"
    kinds = {c.kind for c in ex.predicted.collectives}
    if "length@norm" in layout:
        # Megatron-SP: the matmul's all-reduce over cols becomes a reduce-scatter into the
        # norm region, and an all-gather feeds the next matmul
        assert {"reduce-scatter", "all-gather"} <= kinds, kinds
    if "remat=" in layout:
        # recomputation executes the forward matmuls again: more flops than without remat
        base = predict(graph(False), "rows:2,cols:4", Layout(layout).with_remat(""), hardware="cpu")
        assert ex.predicted.hardware_flops > base.hardware_flops
        assert ex.predicted.model_flops == base.model_flops
