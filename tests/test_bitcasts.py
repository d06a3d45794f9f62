"""Renames of dims that move nothing are bitcasts (``costmodel.bitcasts``): no buffer of their
own, their operand's buffer kept alive to their last reader; ``predict`` and the search count
them alike. XLA's figure for the layouts this changed is in ``tests/test_memory_xla.py``."""
from __future__ import annotations

import pytest

from autolayout import models
from autolayout.core import Layout, Mesh
from autolayout.costmodel.bitcasts import is_bitcast, is_rename, kept_spans
from autolayout.costmodel.plan import plan
from autolayout.costmodel.predict import predict
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.rules import price
from autolayout.search import enumerate_layouts
from autolayout.search.liveness import peak_of
from autolayout.search.names import is_kept
from autolayout.search.solver import search_points
from autolayout.search.tables import Tables
from autolayout.search.warm import sizes_of
from autolayout.search.wus import wus_options
from storage_variants import storage_variants

CPU = get_hardware("cpu")
MESH = Mesh.parse("data:2,model:4")


def _lm():
    return models.transformer_lm(d_model=16, d_ff=32, heads=2, d_kv=8, n_layers=2, vocab=32, batch=4, length=8)


def _bitcasts(g, layout) -> set[str]:
    p = plan(g, MESH, Layout.coerce(layout))
    out = set()
    for op in g.ops():
        if is_rename(op):
            src = op.inputs[0]
            oc = price(p.ops[op.name], op, MESH, CPU)
            if is_bitcast(op, g.op(src), len(oc.collectives), p.local_bytes[src], p.local_bytes[op.name]):
                out.add(op.name)
    return out


RENAMES = {f"rename_{k}" for k in (0, 1, 6, 7, 8, 10, 11)}  # of values computed in the step


@pytest.mark.parametrize("layout, expected", [
    ("batch:data", RENAMES), ("batch:data;d_ff:model", RENAMES),
    ("batch:data;length:model", set()), ("batch:data;length_1:model", set()),
    ("length:data;length_1:model", set()),
], ids=["data", "tensor_parallel", "length_only", "length_1_only", "both_apart"])
def test_a_rename_is_a_bitcast_where_both_names_have_the_same_axes(layout, expected):
    """By hand, the transformer's renames length <-> length_1: where neither name is split (a
    tensor with both may not split them over one axis) the rename moves nothing; where one is
    split and the other not, or both over different axes, it is a collective. A rename of a scan
    body's slice of a stacked input (rename_2 ... 5, rename_9) is never one: XLA reads the slice
    with a dynamic-slice fusion of its own."""
    g = _lm()
    assert {op.name for op in g.ops() if is_rename(op)} == {f"rename_{k}" for k in range(12)}
    assert _bitcasts(g, layout) == expected


def test_search_points_reproduce_predict_where_renames_are_bitcasts():
    """The search's kept names (a renamed operand's buffer held to the renames' last reader, sized
    by the layout) and its renames' bytes (0 where a bitcast) give predict's peak for layouts with
    and without bitcasts."""
    g = _lm()
    tables = Tables(g, MESH, CPU)
    wus, _ = wus_options(tables)
    points = search_points(tables)
    assert any(kept_spans(tables.graph).values()) and any(is_kept(n) for p in points for n in p)
    seen = set()
    layouts = list(enumerate_layouts(g, MESH))
    for lay in layouts[:: max(1, len(layouts) // 12)] + [Layout.coerce(s) for s in (
            "batch:data", "batch:data;length:model", "length:data;length_1:model")]:
        for lw, point in storage_variants(tables, wus, lay):
            sizes = sizes_of(tables, wus, point)
            seen.add(any(sizes[n] for n in sizes if is_kept(n)))
            assert peak_of(points, sizes)[0] == predict(g, MESH, lw, hardware=CPU).memory_bytes, str(lw)
    assert seen == {True, False}
