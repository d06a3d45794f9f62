"""The three orders of a training step on XLA:CPU: with the gradients' combined all-reduce, which
the optimizer updates wait for, where the layout all-reduces some gradient; with each gradient's
reduce-scatter an instruction of its own where it reduce-scatters them only; and without either
where it reduces none (``costmodel.order.memory_order``); the search holds each layout to its own
order's points (``search.orders``, ``search.liveness.LivePoints``)."""
from __future__ import annotations

import pytest

from autolayout import models
from autolayout.core import Layout, Mesh
from autolayout.costmodel.gradients import (COMBINED, NONE, SCATTERED, combined_reductions, gradient_reducers,
                                            gradient_reduction)
from autolayout.costmodel.phases import collective_points, split_reductions
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


def _reduction(g, mesh, layout) -> str:
    """How ``layout`` reduces the gradients, from each op's priced held and partial bytes."""
    p = plan(g, mesh, Layout.coerce(layout))
    held, partials = {}, {}
    for op in g.ops():
        oc = price(p.ops[op.name], op, mesh, CPU)
        held[op.name], partials[op.name] = oc.held_bytes, oc.partial_bytes
    return gradient_reduction(g, held, partials)


def test_updates_wait_for_the_combined_reduction_only_in_the_reduced_order():
    """By hand, the mlp's step (grad/v, grad/w and the bias gradient's sum reduce_sum_0 are the
    ops that may reduce a gradient): with the combined reduction, every parameter update
    (out/0/*) runs after the last of them; without it, v's update is queued when grad/v leaves
    the queue and runs before the bias gradient's last sum (grad/bias) and the loss (out/2)."""
    g = _mlp()
    assert gradient_reducers(g) == {None: frozenset({"grad/v", "grad/w", "reduce_sum_0"})}
    reduced, unreduced = memory_order(g, CPU), memory_order(g, CPU, reduction=NONE)
    for view in (reduced, unreduced):
        assert sorted(view.schedule) == sorted(g.schedule)
    pos = {n: i for i, n in enumerate(reduced.schedule)}
    last_gradient = max(pos[o] for o in gradient_reducers(g)[None])
    assert all(pos[u] > last_gradient for u in ("out/0/v", "out/0/w", "out/0/bias"))
    pos = {n: i for i, n in enumerate(unreduced.schedule)}
    assert pos["out/0/v"] < pos["grad/bias"] and pos["out/0/v"] < pos["out/2"]
    assert unreduced.combined_after == {}


def test_each_gradient_reduce_scatter_is_a_node_of_the_scattered_order():
    """By hand, the mlp's step in the order of a layout that reduce-scatters its gradients: no
    combined reduction; each gradient op is a split reduction (its collective a phase of its own),
    whose collective runs after a later unit, and its parameter's update runs after that
    collective (the update reads the reduce-scattered gradient)."""
    g = _mlp()
    view = memory_order(g, CPU, reduction=SCATTERED)
    assert sorted(view.schedule) == sorted(g.schedule)
    assert combined_reductions(view) == {} and view.combined_after == {}
    grads = gradient_reducers(g)[None]
    assert grads <= set(split_reductions(view)) and not grads & set(split_reductions(g))
    pos = {n: i for i, n in enumerate(view.schedule)}
    moved = collective_points(view)
    for op, update in (("grad/v", "out/0/v"), ("grad/w", "out/0/w")):
        loop, at, _ = moved[op]
        assert loop is None and pos[op] < at < pos[update], (op, at, pos)
    with pytest.raises(ValueError, match="reduction 'reduced' is not one of"):
        memory_order(g, CPU, reduction="reduced")


@pytest.mark.parametrize("layout, reduction", [("batch:data", COMBINED), ("hidden:model", NONE),
                                               ("batch:data;hidden:model", COMBINED), ("io:model", NONE),
                                               ("batch:data|*:data@2", SCATTERED),
                                               ("batch:data,model|*:data,model@3", SCATTERED),
                                               ("batch:data,model|*:data@2", COMBINED)],
                         ids=["data", "hidden", "data+hidden", "io", "data-zero2", "both-zero3", "zero2-one-axis"])
def test_how_a_layout_reduces_its_gradients(layout, reduction):
    """By hand: the weight gradients contract the batch, so a split batch reduces them (all-reduced,
    or reduce-scattered where the gradients are stored sharded over every axis the batch is split
    over; over only one of two, the other axis is still all-reduced); a split hidden or io dim is
    a dim of the gradients themselves, reduced nowhere."""
    g, mesh = _mlp(), Mesh.parse("data:2,model:4")
    assert _reduction(g, mesh, layout) == reduction


def test_search_points_reproduce_predict_in_every_order():
    """The search's live points, guarded by order, give predict's peak for every layout of a
    sample of the enumeration (with each storage variant), and every order occurs."""
    g, mesh = _mlp(), Mesh.parse("rows:2,cols:4")
    tables = Tables(g, mesh, CPU)
    assert len({id(v) for v in tables.orders.values()}) == 3
    wus, _ = wus_options(tables)
    points = search_points(tables)
    assert isinstance(points, LivePoints) and points.ordered
    assert {frozenset({o}) for o in (COMBINED, SCATTERED, NONE)} <= set(points.guards)  # points of one order only
    orders = set()
    layouts = list(enumerate_layouts(g, mesh))
    for lay in layouts[:: max(1, len(layouts) // 12)] + [Layout.coerce("batch:rows,cols")]:
        for lw, point in storage_variants(tables, wus, lay):
            sizes = sizes_of(tables, wus, point)
            orders.add(points.order_of(sizes))
            assert points.order_of(sizes) == _reduction(g, mesh, lw), str(lw)
            assert peak_of(points, sizes)[0] == predict(g, mesh, lw, hardware=CPU).memory_bytes, str(lw)
    assert orders == {COMBINED, SCATTERED, NONE}


# 0.9: six layouts fit, the fastest of the enumeration among those that do not (0.8 left four once XLA's
# copies of the donated parameters were priced, costmodel/donations.py)
@pytest.mark.parametrize("limit_frac", [None, 0.9], ids=["unlimited", "limit"])
def test_search_on_cpu_returns_the_k_best_of_the_enumeration(limit_frac):
    """The search, exact for the cost model with each layout held to its own order's rows, returns
    the k fastest layouts that fit, as pricing every layout of the enumeration does."""
    check_k_best(_mlp(), "rows:2,cols:4", CPU, limit_frac, 5)
