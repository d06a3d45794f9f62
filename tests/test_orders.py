"""The two orders of a training step on XLA:CPU: with the gradients' combined reduction, which
the optimizer updates wait for, where the layout reduces some gradient, and without it where it
reduces none (``costmodel.order.memory_order``); the search holds each layout to its own order's
points (``search.orders``, ``search.liveness.LivePoints``)."""
from __future__ import annotations

import pytest

from autolayout import models
from autolayout.core import Layout, Mesh
from autolayout.costmodel.gradients import gradient_reducers, gradients_reduced
from autolayout.costmodel.order import memory_order
from autolayout.costmodel.plan import plan
from autolayout.costmodel.predict import predict
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.rules import price
from autolayout.search import enumerate_layouts
from autolayout.search.liveness import LivePoints, peak_of
from autolayout.search.solver import search_points
from autolayout.search.tables import Tables
from autolayout.search.warm import sizes_of
from autolayout.search.wus import wus_options
from storage_variants import storage_variants
from test_search import check_k_best

CPU = get_hardware("cpu")


def _mlp():
    return models.mlp(batch=64, d_io=32, d_hidden=64)


def _reduces(g, mesh, layout) -> bool:
    """Whether ``layout`` reduces a gradient, from each op's priced held and partial bytes."""
    p = plan(g, mesh, Layout.coerce(layout))
    held, partials = {}, {}
    for op in g.ops():
        oc = price(p.ops[op.name], op, mesh, CPU)
        held[op.name], partials[op.name] = oc.held_bytes, oc.partial_bytes
    return gradients_reduced(g, held, partials)


def test_updates_wait_for_the_combined_reduction_only_in_the_reduced_order():
    """By hand, the mlp's step (grad/v, grad/w and the bias gradient's sum reduce_sum_0 are the
    ops that may reduce a gradient): with the combined reduction, every parameter update
    (out/0/*) runs after the last of them; without it, v's update is queued when grad/v leaves
    the queue and runs before the bias gradient's last sum (grad/bias) and the loss (out/2)."""
    g = _mlp()
    assert gradient_reducers(g) == {None: frozenset({"grad/v", "grad/w", "reduce_sum_0"})}
    reduced, unreduced = memory_order(g, CPU), memory_order(g, CPU, gradients_reduced=False)
    for view in (reduced, unreduced):
        assert sorted(view.schedule) == sorted(g.schedule)
    pos = {n: i for i, n in enumerate(reduced.schedule)}
    last_gradient = max(pos[o] for o in gradient_reducers(g)[None])
    assert all(pos[u] > last_gradient for u in ("out/0/v", "out/0/w", "out/0/bias"))
    pos = {n: i for i, n in enumerate(unreduced.schedule)}
    assert pos["out/0/v"] < pos["grad/bias"] and pos["out/0/v"] < pos["out/2"]
    assert unreduced.combined_after == {}


@pytest.mark.parametrize("layout, reduces", [("batch:data", True), ("hidden:model", False),
                                             ("batch:data;hidden:model", True), ("io:model", False)],
                         ids=["data", "hidden", "data+hidden", "io"])
def test_a_layout_reduces_a_gradient_where_a_contracted_dim_of_a_gradient_op_is_split(layout, reduces):
    """By hand: the weight gradients contract the batch, so a split batch reduces them; a split
    hidden or io dim is a dim of the gradients themselves, reduced nowhere."""
    g, mesh = _mlp(), Mesh.parse("data:2,model:4")
    assert _reduces(g, mesh, layout) is reduces


def test_search_points_reproduce_predict_in_both_orders():
    """The search's live points, guarded by order, give predict's peak for every layout of a
    sample of the enumeration (with each storage variant), and both orders occur."""
    g, mesh = _mlp(), Mesh.parse("rows:2,cols:4")
    tables = Tables(g, mesh, CPU)
    assert tables.unreduced is not tables.graph
    wus, _ = wus_options(tables)
    points = search_points(tables)
    assert isinstance(points, LivePoints) and points.two_orders
    assert {True, False} <= set(points.guards)  # points of one order only, on each side
    orders = set()
    layouts = list(enumerate_layouts(g, mesh))
    for lay in layouts[:: max(1, len(layouts) // 12)] + [Layout.coerce("batch:rows,cols")]:
        for lw, point in storage_variants(tables, wus, lay):
            sizes = sizes_of(tables, wus, point)
            orders.add(points.order_of(sizes))
            assert points.order_of(sizes) is _reduces(g, mesh, lw), str(lw)
            assert peak_of(points, sizes)[0] == predict(g, mesh, lw, hardware=CPU).memory_bytes, str(lw)
    assert orders == {True, False}


# 0.9: six layouts fit, the fastest of the enumeration among those that do not (0.8 left four once XLA's
# copies of the donated parameters were priced, costmodel/donations.py)
@pytest.mark.parametrize("limit_frac", [None, 0.9], ids=["unlimited", "limit"])
def test_search_on_cpu_returns_the_k_best_of_the_enumeration(limit_frac):
    """The search, exact for the cost model with each layout held to its own order's rows, returns
    the k fastest layouts that fit, as pricing every layout of the enumeration does."""
    check_k_best(_mlp(), "rows:2,cols:4", CPU, limit_frac, 5)
