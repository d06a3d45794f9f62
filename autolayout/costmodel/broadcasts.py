"""Broadcasts XLA:CPU writes to memory: a value's broadcast that a YNNPACK reduction reads.

The graph has no broadcast ops: an element-wise op reads a value of fewer dims (a norm's scale
or its ``rsqrt``) and broadcasts it implicitly. XLA has a ``broadcast`` instruction there. Its
own loop fusions take it in, but XLA:CPU runs a reduction as a YNNPACK fusion where it or an
operand has at least 4096 elements (openxla/xla ``xla/backends/cpu/ynn_support.cc``,
``IsInstructionPreferredByYnn``), and there the broadcast of a value feeding the element-wise
chain of one or more such reductions is a fusion of its own (``wrapped_broadcast``,
``bitcast_broadcast_fusion``), written at the broadcast's shape. The breadth-first schedule
computes it as soon as the value is ready and holds it to the last reduction that reads it
(linen_gpt's layer norm backward with ``length_1`` split: four 16 KiB broadcasts held over 19-110
schedule positions at XLA's peak; ``tests/test_broadcasts.py``: a norm's backward writes the
broadcast of its ``rsqrt`` at 8 x 16 x 32 elements, nothing at 4 x 16 x 32).

:func:`broadcast_spans` lists them per computation (layout-independent positions);
:func:`broadcast_bytes` sizes one from its reader's local elements (0 below the threshold, a
loop fusion). ``memory.peak_memory`` counts each as ``activations``; the search lists them as
names sized by the layout (``search.names.broadcast``, ``Tables.broadcast_bytes``), one rule.
Measured (``benchmarks/memory_vs_xla.py``, DESIGN §11): 71 / 66 / 134 -> 71 / 69 / 135 of 76 /
72 / 144 layouts within 10% of XLA, and under XLA's figure by more than 10% 0 / 4 / 2 -> 0 / 1 / 0.
"""
from __future__ import annotations

from functools import lru_cache

from autolayout.costmodel.lifetimes import body_lifetimes, lifetimes
from autolayout.fusion import reduction
from autolayout.graph import Graph, Loop

__all__ = ["broadcast_spans", "broadcast_bytes", "ynn_reduction", "YNN_MIN_ELEMENTS"]


@lru_cache(maxsize=64)
def broadcast_spans(graph: Graph) -> dict[str | None, tuple[tuple[str, str, int, int], ...]]:
    """Per computation (``None``: the top level; a loop's name: its body), ``(value, reader,
    start, stop)``: a materialised ``value`` read by element-wise ops of more dims that are fused
    into reductions (``fusion.reduction``), grouped by those dims (one broadcast each; ``reader``:
    the first of them), live from the value's position to the last of those reductions
    (positions as in ``lifetimes.lifetimes`` / ``lifetimes.body_lifetimes``). Readers and value
    in one computation. Whether XLA writes it depends on the layout (:func:`broadcast_bytes`)."""
    units, alloc, _ = lifetimes(graph)
    where: dict[str, tuple[str | None, int]] = {}
    for i, u in enumerate(units):
        if not isinstance(u, Loop):
            where[u] = (None, i)
    for n, i in alloc.items():
        where.setdefault(n, (None, i))
    for lp in graph.loops.values():
        order, _ = body_lifetimes(graph, lp)
        for n in lp.body:
            where[n] = (lp.name, order.get(n, lp.body.index(n)))
    sinks: dict[str, frozenset[str]] = {}

    def sink(name: str) -> frozenset[str]:
        hit = sinks.get(name)
        if hit is None:
            op = graph.op(name)
            hit = (frozenset({name}) if op.materialised
                   else frozenset().union(*(sink(c) for c in graph.consumers(name) if graph.op(c).loop == op.loop)))
            sinks[name] = hit
        return hit

    out: dict[str | None, list] = {}
    for v in graph.order:
        op = graph.op(v)
        if not op.materialised or v not in where:
            continue
        dims = frozenset(op.output.dim_names)
        if not dims:  # a scalar: YNNPACK broadcasts it in the fusion (tests/test_memory_rules.py's dot copy)
            continue
        groups: dict[frozenset, list[str]] = {}
        for c in graph.consumers(v):
            e = graph.op(c)
            if (e.kind == "elementwise" and not e.materialised and e.loop == op.loop
                    and dims < frozenset(e.output.dim_names)):
                groups.setdefault(frozenset(e.output.dim_names), []).append(c)
        for readers in groups.values():
            into = [f for f in frozenset().union(*(sink(r) for r in readers)) if reduction(graph.op(f))]
            loop, start = where[v]
            stops = [where[f][1] for f in into if f in where and where[f][0] == loop]
            if stops and max(stops) > start:
                out.setdefault(loop, []).append((v, readers[0], start, max(stops)))
    return {k: tuple(v) for k, v in out.items()}


# XLA:CPU takes an instruction to YNNPACK only if it or an operand has at least this many
# elements (openxla/xla xla/backends/cpu/ynn_support.cc, IsInstructionPreferredByYnn,
# kMinElements); below it a reduction is one of XLA's own loop fusions, which takes the
# broadcast in
YNN_MIN_ELEMENTS = 4096


def ynn_reduction(local_elements: int, ynn: bool) -> bool:
    """Whether a reduction that reads ``local_elements`` on a device is a YNNPACK fusion: on
    hardware that makes them (``ynn``: ``Hardware.ynn_reductions``), at least
    :data:`YNN_MIN_ELEMENTS`. The one rule :func:`broadcast_bytes` and
    ``costmodel.recomputed.written`` apply."""
    return ynn and local_elements >= YNN_MIN_ELEMENTS


def broadcast_bytes(local_elements: int, itemsize: int, ynn: bool) -> int:
    """The bytes of a broadcast of :func:`broadcast_spans` whose reader has ``local_elements``
    on a device: the reader's bytes where its reduction is a YNN fusion (:func:`ynn_reduction`),
    else 0."""
    return local_elements * itemsize if ynn_reduction(local_elements, ynn) else 0
