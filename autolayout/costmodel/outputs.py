"""Outputs allocated for the whole call: how much of their allocations XLA leaves idle at a point.

XLA allocates a step's outputs for the whole call and reuses an output's allocation for
temporaries that die before the output is written, where they fit (openxla/xla
``xla/service/buffer_assignment.cc``, :func:`output_placement`). ``costmodel/memory.py``
(``predict``'s peak) and ``search/liveness.py`` (the search's) both add
:func:`unplaced_output_bytes` at every point of the schedule (one rule).
"""
from __future__ import annotations

from bisect import bisect_left
from functools import lru_cache
from typing import Callable, Mapping, Sequence

from autolayout.costmodel.donations import donor_writes
from autolayout.costmodel.lifetimes import lifetimes, readers_of
from autolayout.graph import Graph, Loop

__all__ = ["step_arguments", "whole_call_outputs", "output_placement", "OutputWrites", "output_writes",
           "unplaced_output_bytes", "partial_buffers", "copies_as_one_buffer"]


# the unit of an allocation nothing is written into before the step ends (output_placement's ``written``)
_NEVER = 1 << 62


def step_arguments(graph: Graph) -> frozenset[str]:
    """The step's arguments (inputs, parameters, optimizer state): the caller's buffers, never
    temporaries an output allocation could hold."""
    return frozenset(t.name for t in graph.tensors() if t.role in ("input", "param", "opt_state"))


def whole_call_outputs(graph: Graph) -> frozenset[str]:
    """The step's outputs that XLA allocates for the whole call (:func:`output_placement`): every
    output tensor that is not an argument passed through and does not reuse a donated
    argument's buffer (``graph.donated``: XLA writes it over that argument, ``alias``)."""
    args = step_arguments(graph)
    reusing = set(getattr(graph, "donated", {}))
    return frozenset(s.tensor for s in graph.outputs if s.tensor and s.tensor not in args | reusing)


def output_placement(temps: Sequence[int], free_outputs: Sequence[int], *, lasts: Sequence[int] | None = None,
                     written: Sequence[int] | None = None, shares: Callable[[int, int], bool] | None = None,
                     names: Sequence[str] | None = None) -> tuple[int | None, ...]:
    """Where XLA can hold each temporary live at one point (their bytes ``temps``) among the output
    allocations not yet written there (their bytes ``free_outputs``): the index of the allocation
    in ``free_outputs``, or None (the temp heap). One each, largest first, each into the smallest
    free allocation at least its size that it dies before.

    XLA allocates every output of the step (:func:`whole_call_outputs`) for the whole call and
    reuses an output's allocation for temporaries that die before the output is written:
    ``BufferAssigner::AssignBuffersForComputations`` sorts the buffers largest first and
    ``AssignSingleHloBuffer`` puts each into "the smallest buffer which can be reused"
    (``MaybeAssignBuffer``: the allocation at least the buffer's size, with nothing already
    assigned to it live at the same time: an output's allocation holds the output from its write
    to the end), before deferring it to the temp heap (openxla/xla
    ``xla/service/buffer_assignment.cc``). Such an allocation holds each buffer at offset 0, so at
    any point it holds at most one live temporary, of at most its size; the rest of the live
    temporaries are in the temp heap. Taken point by point, as the most XLA can reuse there: XLA
    places each buffer once for its whole life, which may hold less (a lower bound on XLA's
    figure, given the model's buffers). Placing the model's buffers so, once each, largest first
    (then the one live first) into the smallest allocation free for the whole of its life, was
    measured against the 803 stored rows of ``benchmarks/memory_vs_xla.py --predict`` (session 20):
    761 within 10% against 769 point by point (the MLP's replicated step 1.047 -> 1.142 of
    ``memory_analysis()``): the model's buffers are not XLA's (a contraction's result is one buffer
    in its phase and another after it), so the placement stays point by point. Measured again on
    1069 rows (session 30, XLA's buffer order and interference over every buffer of the model's
    points, DESIGN §11): 1024 within 10% against 1030 (334 of the 478 rows it moves closer), the
    misses over XLA's figure where the model's buffers are not XLA's (a split contraction's three,
    element-wise chains XLA writes over a dot's buffer in place).

    ``lasts[k]``: the unit temporary ``k`` is last read at (-1: a buffer dead after the point, a
    running op's); ``written[a]``: the unit allocation ``a``'s output is written at. A temporary
    goes only into an allocation written after it dies, or written by an element-wise op that
    reads it there for the last time (``shares(k, a)``: XLA writes such an op over its operand,
    ``HloDataflowAnalysis::CanShareOperandBufferWithUser``, as ``lifetimes.in_place_operand``).
    Without ``lasts`` or ``written`` every temporary may go into every allocation. The outputs
    written after a temporary dies are fewer the later it dies, so of temporaries of equal size
    the one read last goes first (then by ``names``), and of allocations of equal size the one
    written first is taken: the placement does not depend on the order either is listed in
    (``predict`` and the search list them differently)."""
    def may(k: int, a: int) -> bool:
        if lasts is None or written is None or lasts[k] < written[a]:
            return True
        return lasts[k] == written[a] and shares is not None and shares(k, a)

    when = written if written is not None else [0] * len(free_outputs)
    free = sorted((b, when[a], a) for a, b in enumerate(free_outputs) if b > 0)
    placed: list[int | None] = [None] * len(temps)
    key = (lambda k: (-temps[k], -(lasts[k] if lasts is not None else 0), names[k] if names is not None else ""))
    for k in sorted(range(len(temps)), key=key):
        if temps[k] <= 0 or not free:
            continue
        at = bisect_left(free, (temps[k],))  # the smallest free allocation at least its size
        while at < len(free) and not may(k, free[at][2]):
            at += 1  # the next it may go into
        if at < len(free):
            placed[k] = free.pop(at)[2]
    return tuple(placed)


def unplaced_output_bytes(temps: Sequence[int], free_outputs: Sequence[int], *, lasts: Sequence[int] | None = None,
                          written: Sequence[int] | None = None, shares: Callable[[int, int], bool] | None = None,
                          names: Sequence[str] | None = None) -> int:
    """The bytes the output allocations not yet written (``free_outputs``) add to a point's peak
    beyond what liveness counts there (the live ``temps``): their size less the temporaries they
    hold (:func:`output_placement`, whose keywords these are). ``predict`` (:func:`peak_memory`)
    and the search (``search.liveness.peak_of``) both add this at every point (one rule)."""
    placed = output_placement(temps, free_outputs, lasts=lasts, written=written, shares=shares, names=names)
    return int(sum(free_outputs) - sum(t for t, p in zip(temps, placed) if p is not None))


class OutputWrites:
    """In one order of a graph, what :func:`output_placement` needs to tell whether a live tensor
    may go into an output's allocation or a copied parameter's own buffer: the unit each top-level
    tensor is last read at (``lifetimes.lifetimes``; a scan body's tensors, at their scan's unit),
    the unit each output is written at, each copied parameter's update over its own buffer
    (``donations.donor_writes``), and who reads each tensor. ``predict`` (``memory._output_peak``)
    and the search (``search.liveness.total_at``) both place with :meth:`reuse` (one rule)."""

    def __init__(self, graph: Graph) -> None:
        units, alloc, free = lifetimes(graph)
        self.graph = graph
        self.last = dict(free)
        for i, u in enumerate(units):
            if isinstance(u, Loop):
                self.last.update((n, i) for n in u.body)
        self.written = {o: alloc[o] for o in whole_call_outputs(graph) if o in alloc}
        self.donors = donor_writes(graph)
        self.readers = readers_of(graph)

    def reuse(self, temps: Sequence[str], free: Sequence[str], donors: Sequence[str]) -> dict:
        """:func:`output_placement`'s keywords for the buffers of live names ``temps`` (one entry
        per buffer) and the allocations of outputs ``free`` then the own buffers of copied parameters
        ``donors``: a name that is no tensor (a running op's buffer, a span's) dies after the point
        (-1). A temporary read last where its allocation is written goes in only where the writer is
        an element-wise op that reads it from memory (XLA writes it over the temporary's buffer)."""
        writers = list(free) + [self.donors[p][1] for p in donors]

        def shares(k: int, a: int) -> bool:
            return writers[a] in self.readers.get(temps[k], ()) and self.graph.op(writers[a]).kind == "elementwise"

        return dict(lasts=[self.last.get(n, -1) for n in temps],
                    written=[self.written.get(o, _NEVER) for o in free] + [self.donors[p][0] for p in donors],
                    shares=shares, names=[n if n in self.last else "" for n in temps])


@lru_cache(maxsize=64)
def output_writes(graph: Graph) -> OutputWrites:
    """:class:`OutputWrites` of ``graph`` (in the order it is given), built once."""
    return OutputWrites(graph)


def partial_buffers(partial: int, relayout: int) -> tuple[int, ...]:
    """The buffers a reduction's ``partial`` bytes (``reductions.ReductionBytes.partial``) are, each placed on
    its own: the partial sums, and apart from them their relayout copy (``relayout``,
    ``reductions.ReductionBytes.relayout``: written by an instruction of its own), where there is one.

    Raises:
        ValueError: ``relayout`` is more than ``partial``."""
    if relayout > partial:
        raise ValueError(f"partial_buffers: the relayout copy ({relayout} B) is larger than the partial sums "
                         f"and their copy together ({partial} B)")
    return (partial - relayout, relayout) if relayout else (partial,)


def copies_as_one_buffer(buffers: Sequence[tuple[str, int]], replacing: Mapping[str, str]) -> list[tuple[str, int]]:
    """The live buffers of a point (``(name, bytes)``) as XLA allocates them, where a converted copy
    takes its value's place (``sharing.replaced_by_copy``): the model counts such a copy as the
    value's bytes (its lifetime standing in) plus a span of the rest (``replacing[span name]``: the
    value it replaces), where XLA writes the converted copy as one buffer (the linen bf16 MLP's
    ZeRO-3 step: ``convert_bitcast_fusion.1``, one float32 128 KiB buffer read by the dots, which
    fits none of the 64 KiB output allocations). Where both are live (the span with bytes: a layout
    that converts nothing has none) the two entries become one, under the span's name, so an
    output allocation holds the whole copy or none of it. ``predict``
    (``memory._output_peak``) and the search (``search.liveness.total_at``) both place with this.

    Measured (``benchmarks/memory_vs_xla.py --predict``, 803 stored rows): the linen bf16 MLP's
    non-donated stage-3 rows 0.892-0.945 -> 0.999-1.000 of ``memory_analysis()`` (XLA's peak is
    at the step's start, three float32 128 KiB buffers live and every output allocation idle,
    where the model had put the two halves of a copy in two of them); 771 -> 773 within 10%,
    no other row moving."""
    if not replacing:  # the common case, on the search's hot path: no conversion takes a value's place
        return list(buffers)
    live, spans = {n for n, _ in buffers}, {n for n, b in buffers if b > 0}  # a span of no bytes: nothing moves
    merged = {value: name for name, value in replacing.items() if name in spans and value in live}
    if not merged:
        return list(buffers)
    value_bytes = {n: b for n, b in buffers if n in merged}
    out = []
    for n, b in buffers:
        if n in merged:
            continue  # the value's bytes go with its copy's span
        value = replacing.get(n)
        out.append((n, b + value_bytes[value]) if merged.get(value) == n else (n, b))
    return out
