"""Outputs allocated for the whole call (costmodel/outputs.py: whole_call_outputs, output_placement): XLA
allocates a step's outputs for the whole call and holds a temporary that dies before an output is
written in that output's allocation where it fits (at most its size), the rest in the temp heap.
Checked against XLA:CPU's memory_analysis of hand-built jitted functions and by hand."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from autolayout import predict, trace
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.outputs import (copies_as_one_buffer, output_placement, partial_buffers,
                                          unplaced_output_bytes, whole_call_outputs)
from autolayout.costmodel.order import memory_order
from autolayout.search.liveness import live_peak_of, live_points, peak_of

CPU = get_hardware("cpu")
F32 = 4
KIB = 1024


@pytest.mark.parametrize("buffers, replacing, expected", [
    ([("cast", 64 * KIB), ("span", 64 * KIB), ("x", 16 * KIB)], {"span": "cast"},
     [("span", 128 * KIB), ("x", 16 * KIB)]),
    ([("cast", 64 * KIB), ("span", 0)], {"span": "cast"}, [("cast", 64 * KIB), ("span", 0)]),
    ([("span", 64 * KIB), ("x", 16 * KIB)], {"span": "cast"}, [("span", 64 * KIB), ("x", 16 * KIB)]),
    ([("cast", 64 * KIB), ("x", 16 * KIB)], {"span": "cast"}, [("cast", 64 * KIB), ("x", 16 * KIB)]),
], ids=["copy-and-value", "nothing-converted", "value-dead", "copy-not-live"])
def test_a_copy_taking_its_values_place_is_one_buffer_by_hand(buffers, replacing, expected):
    """By hand (outputs.copies_as_one_buffer): the model counts a converted copy that takes its
    value's place (sharing.replaced_by_copy) as the value's bytes plus a span of the rest; where
    both are live, with bytes in the span, they are one buffer under the span's name. The halves
    of a 128 KiB copy fit two 64 KiB output allocations, the whole copy none (the linen bf16 MLP's
    ZeRO-3 step, whose 64 KiB allocations XLA leaves idle at its peak: tests/test_memory_xla.py)."""
    assert copies_as_one_buffer(buffers, replacing) == expected
    if len(expected) < len(buffers):
        free = [64 * KIB, 64 * KIB]
        assert unplaced_output_bytes([b for _, b in buffers], free) == 0
        assert unplaced_output_bytes([b for _, b in expected], free) == 128 * KIB - 16 * KIB


def test_output_placement_by_hand():
    """Largest temporary first, each into the smallest free output allocation at least its size,
    one temporary per allocation; the rest stay in the temp heap."""
    # 48 -> the 64 allocation (the 100 one is left for nothing larger), 30 -> 32, 20 -> 100, 200 fits none
    assert output_placement([20, 48, 200, 30], [100, 64, 32]) == (0, 1, None, 2)
    assert unplaced_output_bytes([20, 48, 200, 30], [100, 64, 32]) == 100 + 64 + 32 - (20 + 48 + 30)
    assert output_placement([10, 10], [16]) == (0, None)  # one live temporary per allocation
    assert unplaced_output_bytes([], [16, 8]) == 24  # nothing to hold: both allocations idle
    assert unplaced_output_bytes([5, 0], []) == 0  # every output written: liveness alone


def test_output_placement_only_where_the_temporary_dies_before_the_write():
    """By hand: a temporary goes into an output's allocation only if it dies before the output is
    written (``lasts`` < ``written``), or at the write where that output is an element-wise op that
    reads it (``shares``); ties are broken so that listing order does not matter."""
    # the 64-byte temporary is read at unit 7, the 64-byte output written at 5: it stays in the heap
    assert output_placement([64], [64], lasts=[7], written=[5]) == (None,)
    assert output_placement([64], [64], lasts=[4], written=[5]) == (0,)
    # read at the write: only where the writer is element-wise and reads it (XLA writes over it)
    assert output_placement([64], [64], lasts=[5], written=[5]) == (None,)
    assert output_placement([64], [64], lasts=[5], written=[5], shares=lambda k, a: True) == (0,)
    # a running op's buffer (-1) and a copied parameter's own buffer (written never) fit anywhere
    assert unplaced_output_bytes([64, 32], [64, 32], lasts=[-1, 9], written=[3, 1 << 62]) == 0
    # equal sizes: the temporary read last goes first, into the allocation written first that it dies
    # before, whichever order either is listed in (predict and the search list them differently)
    for temps_first in (True, False):
        lasts = [2, 6] if temps_first else [6, 2]
        for written in ([3, 8], [8, 3]):
            placed = output_placement([16, 16], [16, 16], lasts=lasts, written=written)
            assert None not in placed, (lasts, written)  # 6 -> the one written at 8, 2 -> at 3
            assert written[placed[lasts.index(6)]] == 8


def _cumsum_step(x, w):
    """h = x @ w and its cumsum (two temporaries, h dead once the cumsum is written) reduced to a
    scalar that scales x: the output (x's shape) is written last, after both have died."""
    return x * jnp.sum(jnp.cumsum(x @ w, axis=1))


def _cumsum_search():
    """``(graph, mesh, hardware, search tables, live points)`` of a 1024x1024 cumsum step on a
    2x2 mesh: its output (x's shape) allocated for the whole call."""
    from autolayout.core import Mesh
    from autolayout.search.tables import Tables

    xs = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
    ws = jax.ShapeDtypeStruct((1024, 256), jnp.float32)
    g = trace(_cumsum_step, xs, ws, dims=("a b", "b c"))
    mesh, hw = Mesh.parse("rows:2,cols:2"), get_hardware("tpu-v3")
    return g, mesh, hw, Tables(g, mesh, hw, regions=False), live_points(
        g, early=hw.breadth_first_schedule, combines=hw.combines_gradient_reductions)


def test_a_relayout_copy_is_a_buffer_apart_from_the_partial_sums_it_copies():
    """By hand: a reduce-scatter's partial sums and XLA:CPU's relayout copy of them are two buffers
    (``reductions.ReductionBytes.relayout``), each placed on its own: two 128-byte allocations hold both, where
    their 256-byte sum fits neither."""
    assert partial_buffers(256, 128) == (128, 128)
    assert partial_buffers(128, 0) == (128,)
    assert unplaced_output_bytes(list(partial_buffers(256, 128)), [128, 128]) == 0
    assert unplaced_output_bytes([256], [128, 128]) == 256
    with pytest.raises(ValueError, match=r"relayout copy \(300 B\) is larger than .* \(256 B\)"):
        partial_buffers(256, 300)


@pytest.mark.parametrize("n", [256, 64])
def test_temporaries_held_in_the_output_allocation_where_they_fit(n):
    """x f32[128,128] (64 KiB, also the output's size), w f32[128,n]; h and its cumsum f32[128,n].
    n=256: h and the cumsum (128 KiB each) fit no output allocation: XLA's temp heap holds both
    beside the output's allocation, argument 192 + output 64 + temp 256 KiB; the model's figure is
    the same (liveness alone, the output counted once written, would say 448 KiB). n=64: XLA puts h
    (32 KiB) in the output's allocation (its buffer-assignment dump: the dot's ynn_fusion at offset 0
    of the output allocation) and the cumsum in the temp heap (32 KiB, and 2 KiB of the cumsum's
    partial sums the model does not see): the model holds one 32 KiB temporary beside the output,
    192 KiB, within 2% of XLA's figure (liveness alone: 160 KiB; the output counted for the whole
    call with no temporary in it: 224 KiB)."""
    xs = jax.ShapeDtypeStruct((128, 128), jnp.float32)
    ws = jax.ShapeDtypeStruct((128, n), jnp.float32)
    m = jax.jit(_cumsum_step).lower(xs, ws).compile().memory_analysis()
    h = 128 * n * F32
    assert m.argument_size_in_bytes == 64 * KIB + h and m.output_size_in_bytes == 64 * KIB
    xla = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    g = trace(_cumsum_step, xs, ws, dims=("a b", "b c"))
    assert whole_call_outputs(g) == frozenset({g.outputs[0].tensor})
    got = predict(g, "data:1", "", hardware=CPU).memory_bytes
    if n == 256:
        assert m.temp_size_in_bytes == 2 * h  # neither temporary fits the 64 KiB output allocation
        assert got == xla == 64 * KIB + h + 64 * KIB + 2 * h
    else:
        assert h <= m.temp_size_in_bytes < 2 * h  # one of the two is held in the output's allocation
        assert got == 64 * KIB + h + 64 * KIB + h == 192 * KIB
        assert abs(got / xla - 1) < 0.02
    # the search's points give the same figure; their live sums alone (its linear rows) give liveness
    sizes = {t.name: t.size * F32 for t in g.tensors() if g.op(t.name).materialised}
    points = live_points(memory_order(g, CPU), early=CPU.breadth_first_schedule, combines=CPU.combines_gradient_reductions)
    assert peak_of(points, sizes)[0] == got
    # (n=64: at the end, x, w, the output and the f32[] sum that scales it)
    assert live_peak_of(points, sizes)[0] == (64 * KIB + h + 2 * h if n == 256 else 160 * KIB + F32)


def test_search_meets_the_limit_with_outputs_allocated_for_the_whole_call():
    """The search's linear rows hold live sums only; a layout that meets them but whose output
    allocations put it over the limit is cut off by itself (search/solver.py), so the search still
    returns the fastest layout whose predicted memory fits, as enumerating every layout finds it."""
    from autolayout.search import enumerate_layouts, search
    from autolayout.search.model import Decoded
    from autolayout.search.warm import sizes_of

    g, mesh, hw, tables, points = _cumsum_search()
    rows = []  # (time, predicted memory, live sums alone, layout)
    for lay in enumerate_layouts(g, mesh):
        c = predict(g, mesh, lay, hardware=hw)
        sizes = sizes_of(tables, [], Decoded(dict(lay.rules), {}, []))
        assert peak_of(points, sizes)[0] == c.memory_bytes, str(lay)
        rows.append((c.time_s, c.memory_bytes, live_peak_of(points, sizes)[0], str(lay)))
    rows.sort()
    limit = rows[0][1] - 1  # the fastest layout does not fit
    fits = [r for r in rows if r[1] <= limit]
    # some layout faster than the answer meets every live sum: only its output allocations rule it out
    assert any(r[2] <= limit < r[1] and r[0] < fits[0][0] for r in rows)
    r = search(g, mesh, hardware=hw, memory_limit=limit, shard_weight_update=False, regions=False, remat="none")
    assert r.cost.memory_bytes <= limit
    assert r.cost.time_s == pytest.approx(fits[0][0], rel=1e-9)


def _feasible(lm, axes_of) -> bool:
    """Whether ``lm`` admits the layout ``axes_of`` (every ``x[d, m]`` fixed to it)."""
    from ortools.sat.python import cp_model

    for (d, a), v in lm.x.items():
        lm.model.Add(v == int(a in axes_of.get(d, ())))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    return solver.Solve(lm.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


def test_output_row_admits_every_layout_within_its_limit():
    """The search's relaxation of the output allocations (``LayoutModel.add_output_row``) is a
    true constraint: for every layout of the step and every point where its output is not yet
    written, the row at that layout's exact bytes there (``total_at``: live bytes plus the output
    allocation less what ``outputs.output_placement`` puts in it, checked against ``predict``
    above) admits the layout, as the model without the row does (symmetry breaking may exclude a
    layout either way). And it says more than the live bytes: at a limit that the live bytes
    meet and the exact figure does not, it cuts off some layouts by itself."""
    from autolayout.search import enumerate_layouts
    from autolayout.search.liveness import total_at
    from autolayout.search.model import Decoded, LayoutModel
    from autolayout.search.warm import sizes_of

    g, mesh, hw, tables, points = _cumsum_search()
    checked = placed = cut = 0
    for lay in enumerate_layouts(g, mesh):
        axes_of = dict(lay.rules)
        sizes = sizes_of(tables, [], Decoded(axes_of, {}, []))
        if not _feasible(LayoutModel(tables, []), axes_of):
            continue  # left out by symmetry breaking
        for i, (temps, free) in enumerate(points.split()):
            if not any(sizes.get(o, 0) for o in free):
                continue
            exact = total_at(points, sizes, i)
            lm = LayoutModel(tables, [])
            lm.add_output_row(points[i], temps, free, exact)
            assert _feasible(lm, axes_of), (str(lay), i, exact)
            checked += 1
            live = sum(sizes.get(n, 0) for n in points[i])
            placed += exact < live + sum(sizes.get(o, 0) for o in free)
            lm = LayoutModel(tables, [])
            lm.add_output_row(points[i], temps, free, live)
            cut += not _feasible(lm, axes_of)
    assert checked > 20 and placed > 0 and cut > 0  # some temporaries fit the output allocation


def test_transient_buffers_are_placed_apart():
    """The Flax top-2 MoE step with optax adamw (examples/top2_moe.py, as benchmarks/memory_vs_xla.py
    builds it), not donating its state, under ``embed:data;batch:model``: at the model's peak a dot runs
    while the new weights' and optimizer moments' output allocations are not yet written, and the
    copy its contraction ``dot_general_2`` makes of the weight ``w_in`` is live from the step's start
    (``copies.copy_spans``). XLA allocates each buffer on its own and puts every temporary of this
    step in an output allocation (its temp heap is under 2 KiB), so its ``memory_analysis`` is the
    arguments and outputs; the prediction is within 1% of it. The search's peak for the layout and
    every storage variant of it is ``predict``'s (the parts of a running op's transient bytes are
    sizes of their own, ``names.transient_part``, and the copy a span: ``names.copy``). Counting
    the copy with ``dot_general_2``'s other transient bytes as one buffer there, as the model did
    when it counted an argument's copy at its dot, puts the peak over XLA's by more than 10%."""
    import sys
    from pathlib import Path

    from autolayout.core import Layout, Mesh
    from autolayout.exec import execute
    from autolayout.search.names import copy, is_transient_part, transient
    from autolayout.search.solver import search_points
    from autolayout.search.tables import Tables
    from autolayout.search.warm import sizes_of
    from autolayout.search.wus import wus_options
    from storage_variants import search_peaks, storage_variants

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import memory_vs_xla as bench

    g, args = bench.CASES["top2_moe"][0]()
    layout, mesh = Layout.parse("embed:data;batch:model"), Mesh.parse(bench.MESH)
    ex = execute(g, mesh, layout, args=args, repeats=1, reference=False, compiler_options=bench.FAST)
    xla = ex.xla_memory
    assert xla["temp"] < 2 * KIB and xla["alias"] == 0
    total = xla["argument"] + xla["output"] + xla["temp"]
    assert abs(ex.predicted.memory_bytes / total - 1) < 0.01, (ex.predicted.memory_bytes, xla)
    search_peaks(g, mesh, CPU, [layout])
    tables = Tables(g, mesh, CPU)
    wus, _ = wus_options(tables)
    (_, point), = [(lw, pt) for lw, pt in storage_variants(tables, wus, layout) if str(lw) == str(layout)]
    sizes = sizes_of(tables, wus, point)
    points = search_points(tables)
    assert copy("dot_general_2", 1) in points[0] and sizes[copy("dot_general_2", 1)] > 0
    # the copy at its dot, with the dot's other transient bytes, as one buffer (each op's transient as one)
    whole = {n: b for n, b in sizes.items() if not is_transient_part(n) and n != copy("dot_general_2", 1)}
    whole[transient("dot_general_2")] += sizes[copy("dot_general_2", 1)]
    assert peak_of(points, whole)[0] / total > 1.10
