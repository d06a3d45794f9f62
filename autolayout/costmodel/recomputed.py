"""Values a reduction fusion shares, which XLA:CPU writes or recomputes depending on the layout.

``fusion.with_fusion`` writes a cheap element-wise value that a reduction fusion reads beside
another fusion (``Op.reduction_shared``): a YNNPACK reduction fusion takes in the element-wise
chain it reads but shares nothing. XLA:CPU makes a reduction a YNNPACK fusion only where it or
its operand has at least 4096 elements on a device (openxla/xla
``xla/backends/cpu/ynn_support.cc``, ``IsInstructionPreferredByYnn``;
``costmodel.broadcasts.YNN_MIN_ELEMENTS``), and only on XLA:CPU (``Hardware.ynn_reductions``).
Below that, or on other backends, the reduction is a loop fusion of XLA's own, which takes in a
value XLA may duplicate (``fusion.duplicable``) like any other fusion does: the value is
recomputed in each fusion that reads it and written nowhere (measured:
``tests/test_recomputed.py``, a layer norm's centred input at 4 x 16 x 32 and 8 x 16 x 32
elements, and the equinox block's ZeRO-3 layouts of ``benchmarks/memory_vs_xla.py``, whose
norms' centred inputs XLA recomputes at 2048 elements a device: 1.108 and 1.119 of XLA's figure
-> 1.016 and 1.015; over the benchmark, 71 / 69 / 135 -> 73 / 69 / 138 of its 76 chosen and
72 / 144 random layouts within 10%, none newly under).

Where it is recomputed, the fusions that read it read its sources instead (the materialised
tensors it is computed from, through fused element-wise ops), so each source's buffer lives to
the value's last reader. :func:`recomputed_spans` lists, per computation, where each source is
kept alive past its own last reader for a value; :func:`written` says whether a layout writes the
value itself. ``predict`` counts the value's bytes where it is written, and the source's bytes over
the span where it is recomputed; the search lists the spans as names sized by the layout
(``search.names.recomputed``, ``Tables.recomputed_bytes``): one rule.
"""
from __future__ import annotations

from functools import lru_cache

from autolayout.costmodel.broadcasts import ynn_reduction
from autolayout.costmodel.lifetimes import computations
from autolayout.costmodel.regions import regions
from autolayout.graph import Graph

__all__ = ["recomputed_spans", "written"]


def written(local_elements: int, ynn: bool) -> bool:
    """Whether XLA writes a value of ``Op.reduction_shared`` that has ``local_elements`` on a
    device: where its reduction is a YNNPACK fusion (``ynn``: ``Hardware.ynn_reductions``, and at
    least ``YNN_MIN_ELEMENTS``; the reduction reads the value at its own shape, the value's
    dims or more)."""
    return ynn_reduction(local_elements, ynn)


@lru_cache(maxsize=64)
def recomputed_spans(graph: Graph) -> dict[str | None, tuple[tuple[str, str, int, int], ...]]:
    """Per computation (``None``: the top level; a loop's name: its body), ``(source, value,
    start, stop)``: a value of ``Op.reduction_shared`` read after the last reader of a source it
    is computed from (a materialised tensor reached through its fused element-wise operands and
    other such values); ``start..stop`` are the positions (``lifetimes``' units at the top level,
    body positions in a body) where the source's buffer is live only because the value is
    recomputed from it. Of the values of one set of dims that keep a source, the one read last
    stands for them (a layout writes or recomputes them alike). Sources that live throughout
    (arguments, a loop body's values from outside it) are left out, as are a source with a dim
    the value lacks or stored in another region (``costmodel.regions``: so a layout's assignment
    of the value's dims sizes the source too) and a reshape (a rename's or a scan result's bytes
    are not its own tensor's alone: ``costmodel.bitcasts``, loop stacks)."""
    loop_of, lasts = computations(graph)

    def sources(name: str, acc: set[str]) -> set[str]:
        for i in graph.op(name).inputs:
            src = graph.op(i)
            if src.reduction_shared or not src.materialised:
                sources(i, acc)
            else:
                acc.add(i)
        return acc

    region = regions(graph).tensor_region
    best: dict[tuple[str, frozenset], tuple[int, str]] = {}  # (source, dims) -> (stop, value)
    for op in graph.ops():
        if not (op.reduction_shared and op.name in loop_of):
            continue
        loop = loop_of[op.name]
        last = lasts[loop]
        if op.name not in last:
            continue
        for s in sources(op.name, set()):
            if (loop_of.get(s, 0) != loop or s not in last or last[s] >= last[op.name]
                    or graph.op(s).kind == "reshape" or region(s) != region(op.name)
                    or not set(graph.op(s).output.dim_names) <= set(op.output.dim_names)):
                continue
            key = (s, frozenset(op.output.dim_names))
            if key not in best or best[key][0] < last[op.name]:
                best[key] = (last[op.name], op.name)
    out: dict[str | None, list] = {}
    for (s, _), (stop, v) in sorted(best.items(), key=lambda kv: (kv[0][0], kv[1])):
        loop = loop_of[s]
        out.setdefault(loop, []).append((s, v, lasts[loop][s] + 1, stop))
    return {k: tuple(v) for k, v in out.items()}
