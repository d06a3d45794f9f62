"""Combined all-reduces (costmodel/combine.py): which ops XLA:CPU's AllReduceCombiner merges and
hold their partial sums until it runs, and the search's memory under them.

References: the grouping is checked against ops picked out of the graph by hand (the q, k, v
projections read the layer's wq, wk, wv slices); XLA's combining of independent psums is
measured in tests/test_memory_rules.py (one all-reduce, both partial sums in the heap); the
predicted peak against XLA's memory_analysis in tests/test_memory_xla.py's table (the
transformer forward rows with d_model split); the search against an exhaustive enumeration
priced by ``predict``.
"""
from __future__ import annotations

import math

import pytest

from autolayout import models, predict, search
from autolayout.core import Layout, Mesh
from autolayout.costmodel.combine import combined_all_reduces, held_pairs
from autolayout.costmodel.placement import ALL_REDUCE
from autolayout.costmodel.plan import plan
from autolayout.costmodel.profiles import get_hardware
from autolayout.search import enumerate_layouts
from autolayout.search.liveness import peak_of
from autolayout.search.names import is_combined
from autolayout.search.solver import search_points
from autolayout.search.tables import Tables
from autolayout.search.warm import sizes_of
from autolayout.search.wus import wus_options
from storage_variants import storage_variants

MESH = "data:2,model:4"
CPU = get_hardware("cpu")


def _lm_forward():
    return models.transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=128, batch=8, length=32,
                                 train=False)


def _projections(g) -> tuple[str, ...]:
    """The body's q, k and v projections, by hand: the einsums reading a slice of layers/wq, wk, wv."""
    body = next(iter(g.loops.values())).body
    reads = {n: {i for i in g.op(n).inputs} for n in body}
    sliced = {n: g.op(n).inputs[0] for n in body if g.op(n).kind == "reshape" and g.op(n).fn == "slice"}
    return tuple(n for n in body if g.op(n).kind == "einsum"
                 and any(sliced.get(i) in ("layers/wq", "layers/wk", "layers/wv") for i in reads[n]))


def test_q_k_v_projections_of_a_split_d_model_are_one_combined_all_reduce():
    g = _lm_forward()
    qkv = _projections(g)
    assert len(qkv) == 3
    p = plan(g, MESH, "d_model:model;d_ff:data")
    for n in qkv:  # each is a partial sum over model, all-reduced on its own in the plan
        assert [(s.kind, tuple(s.axes)) for s in p.ops[n].out_steps] == [(ALL_REDUCE, ("model",))]
    loop, body = next(iter(g.loops.items()))
    assert combined_all_reduces(g, p.ops, CPU) == {loop: ((body.body.index(qkv[-1]), qkv),)}


@pytest.mark.parametrize("layout", ["", "batch:data,model", "heads:model;d_ff:model;batch:data"],
                         ids=["replicated", "data-parallel", "megatron"])
def test_nothing_is_combined_where_no_two_independent_ops_all_reduce(layout):
    g = _lm_forward()  # Megatron's attention and MLP all-reduces each feed the next: reachable
    assert combined_all_reduces(g, plan(g, MESH, layout).ops, CPU) == {}


def test_only_cpu_profiles_combine():
    g = _lm_forward()
    p = plan(g, MESH, "d_model:model;d_ff:data")
    assert combined_all_reduces(g, p.ops, get_hardware("tpu-v4")) == {}
    assert combined_all_reduces(g, p.ops, get_hardware("h100")) == {}


def test_a_member_read_before_the_last_holds_nothing():
    """The mlp's forward output and input gradient both all-reduce over model under hidden:model
    and neither depends on the other (its loss is linear in the output), but the loss reads the
    output before the input gradient's contraction runs: the traced order is not an order of
    XLA's combined program, so no partial sums are held for it."""
    import networkx as nx

    g = models.mlp(batch=64, d_io=128, d_hidden=256, train=True)
    y = next(op.name for op in g.ops() if op.kind == "einsum" and set(op.inputs) == {"h", "v"})
    dx = next(op.name for op in g.ops() if op.kind == "einsum" and "w" in op.inputs
              and [d.name for d in op.output.shape] == ["batch", "io"])
    p = plan(g, MESH, "hidden:model")
    for n in (y, dx):
        assert [(s.kind, tuple(s.axes)) for s in p.ops[n].out_steps] == [(ALL_REDUCE, ("model",))]
    assert not nx.has_path(g.nx, y, dx) and not nx.has_path(g.nx, dx, y)
    order = list(g.schedule)
    assert any(order.index(r) < order.index(dx) for r in g.nx.successors(y))  # the loss reads y first
    assert (y, dx) not in held_pairs(g)
    assert combined_all_reduces(g, p.ops, CPU) == {}


def test_search_live_sets_reproduce_predict_memory_with_combined_all_reduces():
    g, mesh = _lm_forward(), Mesh.parse(MESH)
    tables = Tables(g, mesh, CPU)
    wus, _ = wus_options(tables)
    points = search_points(tables)
    assert points.combined
    layouts = list(enumerate_layouts(g, mesh))
    held = 0
    for lay in layouts[:: max(1, len(layouts) // 24)] + [Layout("d_model:model;d_ff:data")]:
        for lw, point in storage_variants(tables, wus, lay):
            sizes = sizes_of(tables, wus, point)
            held += any(b for n, b in sizes.items() if is_combined(n))
            assert peak_of(points, sizes)[0] == predict(g, mesh, lw, hardware=CPU).memory_bytes, str(lw)
    assert held  # some layout held partial sums for a combined all-reduce


def test_search_under_a_memory_limit_equals_exhaustive_minimum_on_cpu():
    """Limits just under the peaks of layouts that combine all-reduces: the search's layout fits
    (``predict``) and is as fast as the fastest enumerated layout that fits."""
    g = _lm_forward()
    priced = []
    for lay in enumerate_layouts(g, MESH):
        c = predict(g, MESH, lay, hardware=CPU)
        priced.append((c.time_s, c.memory_bytes, lay))
    grouped = sorted(c for c in priced if combined_all_reduces(g, plan(g, MESH, c[2]).ops, CPU))
    assert grouped
    for _, mem, _ in grouped[:2]:
        limit = mem - 1
        best = min(t for t, m, _ in priced if m <= limit)
        r = search(g, MESH, hardware=CPU, memory_limit=limit, shard_weight_update=False, regions=False)
        assert r.status == "OPTIMAL"
        assert r.cost.memory_bytes <= limit
        assert math.isclose(r.cost.time_s, best, rel_tol=1e-9), (str(r.layout), r.cost.time_s, best)
