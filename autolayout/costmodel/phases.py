"""The two phases of a reduction of partial sums, and where the order runs its collective.

XLA runs a contraction (or reduction) whose output is partial as two instructions: the ``dot``
writes the partial sums while its inputs are live, then the collective (``all-reduce``,
``reduce-scatter``) writes the reduced result, and buffer assignment frees an input the dot read
for the last time before that result is allocated (:func:`split_reductions`; the memory model's
module docstring, :mod:`autolayout.costmodel.memory`). Both ``memory.peak_memory`` and the
search's live sets (``search/liveness.py``) count these phases from here (one rule).

The collective is an instruction of the schedule too. XLA:CPU's breadth-first scheduler
(``costmodel/order.py``) queues it when its dot leaves the queue, so it runs after the
instructions queued before it, and the dot's readers wait for it. Every op of
:func:`split_reductions` has its collective as a node of that order, whether or not a layout
reduces anything there (the search needs one order per case: a layout that reduces nothing
there has no collective, and its partial sums are 0 bytes, so the point counts nothing of its
own). Where the collective runs after a later unit (``Graph.collective_after``), the op's
collective phase is a point of its own right after that unit (:func:`collective_points`): that
unit's last reads and the copies freed there gone, the op's partial sums and its result live.
Measured on ``benchmarks/memory_vs_xla.py`` (DESIGN §11): with the rules of that commit, 65 of
76 chosen layouts, 63 of 72 and 130 of 144 drawn at random within 10% of XLA's
``memory_analysis()``, against 65, 60 and 124 with every collective at its op.
"""
from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType
from typing import Mapping

from autolayout.costmodel.gradients import combined_reductions, deferred_reductions
from autolayout.costmodel.lifetimes import freed_at, lifetimes
from autolayout.costmodel.outputs import partial_buffers
from autolayout.graph import Graph, Loop

__all__ = ["split_reductions", "phased_reductions", "collective_points", "collective_sequence", "pending_spans",
           "pending_bytes", "after_points", "after_bytes", "Phases"]


@lru_cache(maxsize=256)
def split_reductions(graph: Graph) -> Mapping[str, tuple[str, ...]]:
    """The ops whose reduction ``memory.peak_memory`` counts in a phase of its own, each with
    the tensors it reads for the last time (freed between its two phases).

    XLA runs a contraction (or reduction) whose output is partial as two instructions: the
    ``dot`` writes the partial sums into a buffer of their own while its inputs are live, then
    the collective (``all-reduce``, ``reduce-scatter``) writes the reduced result into another,
    and buffer assignment frees an input read for the last time by the dot before the
    collective's result is allocated (``HloLiveRange``: a value lives from its defining
    instruction to its last use). So the op holds ``inputs + partial sums`` and then
    ``partial sums + result``, never the three together. Listed: the reducing ops
    (``storage.REDUCING``'s einsums and reductions) whose output takes memory of its own and is
    not on a parameter's gradient path
    (:func:`~autolayout.costmodel.gradients.combined_reductions`: those keep their partial sums
    for the combined reduction where the backend has one, and their bytes change with the
    parameter's storage options) nor written over a donated argument. A step's output too: its
    whole-call allocation, written by the collective, can hold a temporary until then
    (``memory._output_peak``; ``tests/test_memory_phases.py``, DESIGN §11)."""
    donated = set(getattr(graph, "donated", {}))
    gradient = {o for _, ops in combined_reductions(graph).values() for o in ops}

    def listed(n: str) -> bool:
        op = graph.op(n)
        return (op.kind in ("einsum", "reduce") and op.materialised and n not in donated and n not in gradient
                and op.output.role not in ("input", "param", "opt_state"))

    units, alloc, _ = lifetimes(graph)
    out: dict[str, tuple[str, ...]] = {}
    for i, u in enumerate(units):
        if isinstance(u, Loop):
            for j, n in enumerate(u.body):
                if listed(n):
                    out[n] = freed_at(graph, u.name, j)
        elif listed(u) and u in alloc:
            out[u] = freed_at(graph, None, i)
    return MappingProxyType(out)


@lru_cache(maxsize=256)
def phased_reductions(graph: Graph, combines: bool) -> frozenset[str]:
    """The ops ``memory.peak_memory`` counts in phases, whose ``temps`` are their contraction's
    (``reductions.ReductionBytes.contraction``): those of :func:`split_reductions` and, where ``combines``
    (``Hardware.combines_gradient_reductions``), of ``gradients.deferred_reductions``."""
    return frozenset(split_reductions(graph)) | deferred_reductions(graph, combines)


@lru_cache(maxsize=256)
def collective_points(graph: Graph) -> Mapping[str, tuple[str | None, int, tuple[str, ...]]]:
    """The ops of :func:`split_reductions` whose collective the order runs after a later unit
    (``Graph.collective_after``: ``costmodel.order.breadth_first``; none in another order):
    ``op -> (computation, position of that unit, the tensors it reads for the last time)``
    (``None``: the top level, a scan's name: its body; a unit that is a scan frees at its end
    the top-level tensors it reads last). The op's collective phase counts right after that unit
    (module docstring)."""
    moved = getattr(graph, "collective_after", None) or {}
    split = split_reductions(graph)
    out: dict[str, tuple[str | None, int, tuple[str, ...]]] = {}
    if not moved:
        return MappingProxyType(out)
    units, _, _ = lifetimes(graph)
    top = {(u.name if isinstance(u, Loop) else u): i for i, u in enumerate(units)}
    for op, unit in moved.items():
        if op not in split:
            continue
        loop = graph.op(op).loop
        k = top[unit] if loop is None else graph.loops[loop].body.index(unit)
        out[op] = (loop, k, freed_at(graph, loop, k))
    return MappingProxyType(out)


@lru_cache(maxsize=256)
def pending_spans(graph: Graph) -> Mapping[str | None, tuple[tuple[str, str, int, int], ...]]:
    """Per computation, ``(op, op, start, stop)`` for each op of :func:`collective_points`: its
    partial sums, written where it runs, wait for its collective from the next position to the
    unit that collective runs after (``stop``), where the collective's point counts them
    (:func:`after_points`); the bytes are :func:`pending_bytes`. ``memory.peak_memory`` and the
    search's live sets (``search.names.SPAN_KINDS``) both count these spans (one rule)."""
    out: dict[str | None, list] = {}
    units, _, _ = lifetimes(graph)
    top = {(u.name if isinstance(u, Loop) else u): i for i, u in enumerate(units)}
    for op, (loop, at, _) in collective_points(graph).items():
        k = top[op] if loop is None else graph.loops[loop].body.index(op)
        out.setdefault(loop, []).append((op, op, k + 1, at))
    return MappingProxyType({loop: tuple(group) for loop, group in out.items()})


def pending_bytes(partial: int, relayout: int, result: int) -> int:
    """The bytes an op of :func:`pending_spans` adds while its partial sums wait for their
    collective: the partial sums (``partial``, ``reductions.ReductionBytes.partial``, less their
    relayout copy ``relayout``, written by the collective's own instruction) beside its output's
    ``result`` bytes, which the memory model counts from the op on (a reduce-scatter's result is
    smaller than the sums; an all-reduce's the same size: nothing to add)."""
    return max(int(partial) - int(relayout) - int(result), 0)


def after_points(graph: Graph, partials: Mapping[str, int], held_at, combined: Mapping | None = None,
                 relayouts: Mapping[str, int] | None = None, pending: Mapping[str, int] | None = None
                 ) -> dict[str | None, list[tuple[int, tuple[str, ...], list[tuple[str, int]]]]]:
    """Per computation, the points right after a unit: ``(position, tensors freed there,
    buffers live there as (kind, bytes))``: the collective phase of each op of
    :func:`collective_points` (its partial sums, ``"transient"``, and ``held_at(computation,
    op)``, the held bytes of the other members of a combined all-reduce it ends), and
    ``combined``'s points (``{computation: (position, freed, [held bytes])}``: the gradients'
    combined reduction, ``gradients.combined_point``, ``gradients.gradient_bytes``). ``relayouts[op]``:
    the part of ``partials[op]`` that is its relayout copy, a buffer of its own
    (``outputs.partial_buffers``). Collectives run after the same unit are a sequence, in the
    order's (:func:`collective_sequence`): at each, the relayout copies of those before it are
    live (copied, not yet reduce-scattered) and the partial sums of those after it still wait
    (``pending[op]``, :func:`pending_bytes`)."""
    out: dict[str | None, list] = {}
    relayouts, pending = relayouts or {}, pending or {}
    for loop, (at, gone, bs) in (combined or {}).items():
        out.setdefault(loop, []).append((at, tuple(gone), [("held", b) for b in bs]))
    for op, (loop, at, gone) in collective_points(graph).items():
        own = partial_buffers(partials.get(op, 0), relayouts.get(op, 0))  # its relayout copy apart
        before, later = collective_sequence(graph)[op]
        others = [("transient", b) for o in before if (b := relayouts.get(o, 0))]
        others += [("partial", b) for o in later if (b := pending.get(o, 0))]
        out.setdefault(loop, []).append((at, gone, [("transient", b) for b in own] + others
                                         + list(held_at(loop, op))))
    return out


@lru_cache(maxsize=256)
def collective_sequence(graph: Graph) -> Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """For each op of :func:`collective_points`, ``(before, after)``: the other ops whose
    collectives run right after the same unit, before it and after it in the order.

    XLA:CPU's breadth-first order queues a reduce-scatter's relayout copy (a ``wrapped_copy``
    fusion) when its op leaves the queue and the reduce-scatter when the copy does, so the copies
    of the ops queued together run first, then their reduce-scatters (optimized HLO of the zoo
    mlp's ZeRO-1 step, ``benchmarks/memory_vs_xla.py``: ``wrapped_copy.1``, ``wrapped_copy``, then
    ``reduce_scatter.23``, ``.22``; each copy frees its partial sums). At each op's collective the
    copies of those before it are live and the partial sums of those after it wait."""
    groups: dict[tuple, list[str]] = {}
    for op, (loop, at, _) in collective_points(graph).items():  # in the order's sequence
        groups.setdefault((loop, at), []).append(op)
    out = {}
    for ops in groups.values():
        for k, op in enumerate(ops):
            out[op] = (tuple(ops[:k]), tuple(ops[k + 1:]))
    return MappingProxyType(out)


class Phases:
    """The two phases of the ops of :func:`split_reductions` (``memory.peak_memory``): the
    contraction (``live - output + temps``: the partial sums are written, the result not yet
    allocated) and the collective (``live - the op's last reads - the conversions and copies
    freed after it + partials``), counted at the op, or where the order runs the collective
    after a later unit (:func:`collective_points`, :func:`after_points`)."""

    def __init__(self, graph: Graph, size: Mapping[str, int], partials: Mapping[str, int],
                 deferred: frozenset[str] = frozenset()) -> None:
        self.split, self.deferred = split_reductions(graph), deferred
        self.moved = collective_points(graph)
        self.size, self.partials = size, partials

    def listed(self, op) -> bool:
        """Whether ``op`` is counted in two phases (:func:`split_reductions`; where its layout
        reduces nothing, the contraction's phase is the op's whole count and the other one less)
        or in the contraction's alone (``gradients.deferred_reductions``)."""
        return op in self.split or op in self.deferred

    def result(self, op: str) -> int:
        """Bytes of ``op``'s output in its contraction's phase: none while it writes partial sums."""
        return 0 if self.partials.get(op, 0) else self.size.get(op, 0)

    def totals(self, op: str, total: int, running: int, waiting: int, spans, i: int) -> tuple[int, int]:
        """``(contraction, collective)`` bytes at ``op``'s position ``i``, where one phase
        counts ``total`` (``running`` live bytes, spans included, + the op's temps +
        ``waiting`` held bytes)."""
        contraction = total - self.size.get(op, 0) + self.result(op)
        if op not in self.split:  # deferred: reduced at the combined reduction
            return contraction, contraction
        contraction -= waiting  # the results of an all-reduce combined with this op's are written at its collective
        if op in self.moved:  # the collective runs later: its phase is a point of its own (after_points)
            return contraction, contraction
        return contraction, after_bytes(running, self.size, self.split[op], spans, i) + self.partials.get(op, 0) + waiting

    def at_peak(self, op: str, live: list, transient: int, running: int, waiting: int, spans, i: int
                ) -> tuple[list, int, bool]:
        """``(live tensors, transient bytes, whether spans ending at i are live)`` at the peak."""
        contraction, collective = self.totals(op, running + transient, running, waiting, spans, i)
        if contraction >= collective:
            return [n for n in live if n != op or self.result(op)], transient - (waiting if op in self.split else 0), True
        gone = set(self.split[op])
        return [n for n in live if n not in gone], self.partials.get(op, 0) + waiting, False


def after_bytes(running: int, size: Mapping[str, int], gone, spans, i: int) -> int:
    """The bytes live once the unit at position ``i`` has run, where ``running`` were live while it
    ran: less the tensors ``gone`` it read for the last time and the buffers of ``spans`` (copies,
    conversions; ``memory._spans``) whose last reader it is. A split reduction's collective and
    the combined gradient reduction count from there."""
    return running - sum(size.get(n, 0) for n in gone) - sum(b for _, stop, b, _ in spans if stop == i)
