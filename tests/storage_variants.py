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
