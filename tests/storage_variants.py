"""Shared by the tests that hold the search's memory rows against ``predict``
(tests/test_search.py, tests/test_memory_rules.py): a layout with each parameter's storage
sharded as far as each ZeRO stage allows, as the search's decoded point and as a ``Layout``."""
from __future__ import annotations

from autolayout.core import Layout
from autolayout.search.model import Decoded


def storage_variants(tables, wus, lay: Layout) -> list[tuple[Layout, Decoded]]:
    """``(layout, point)``: ``lay`` itself, then for each stage 1, 2, 3 at which some parameter's
    storage can be sharded under ``lay``, every such parameter sharded (its first option)."""
    axes_of = dict(lay.rules)
    out = [(lay, Decoded(axes_of, {}, []))]
    for stage in (1, 2, 3):
        active, upd = [], {}
        for k, p in enumerate(wus):
            i = tables.restrict(axes_of, p.dims)
            for j, o in enumerate(p.options):
                if o.index == i and o.stage == stage and p.param not in upd:
                    active.append((k, j))
                    upd[p.param] = (o.axes, o.stage)
        if upd:
            out.append((Layout(lay.rules, [(p, *e) for p, e in sorted(upd.items())]), Decoded(axes_of, upd, active)))
    return out


def search_peaks(graph, mesh, hw, layouts, *, remat: str = "none", flag=None) -> tuple[set, list]:
    """Hold the search's memory to ``predict``: for each of ``layouts`` and each of its
    :func:`storage_variants`, the peak of the live points of the tables the search builds for
    ``graph`` (its fused attention and ``remat`` policy, as ``search.api`` does) under that point
    is ``predict``'s for the layout. Returns ``(seen, points)``: ``seen`` holds, per variant,
    whether some name ``flag`` picks (a kind of live-set name) takes bytes there."""
    from autolayout.costmodel.attention import kernel_graph
    from autolayout.costmodel.predict import predict
    from autolayout.remat import rematerialize
    from autolayout.search.liveness import peak_of
    from autolayout.search.solver import search_points
    from autolayout.search.tables import Tables
    from autolayout.search.warm import sizes_of
    from autolayout.search.wus import wus_options

    tables = Tables(rematerialize(kernel_graph(graph, hw), remat), mesh, hw)
    wus, _ = wus_options(tables)
    points = search_points(tables)
    seen = set()
    for lay in layouts:
        for lw, point in storage_variants(tables, wus, Layout(lay.rules, [])):
            sizes = sizes_of(tables, wus, point)
            if flag is not None:
                seen.add(any(sizes[n] for n in sizes if flag(n)))
            lw = lw.with_remat(remat if remat != "none" else "")
            assert peak_of(points, sizes)[0] == predict(graph, mesh, lw, hardware=hw).memory_bytes, str(lw)
    return seen, points
