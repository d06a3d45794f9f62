"""Outputs allocated for the whole call: how much of their allocations XLA leaves idle at a point.

XLA allocates a step's outputs for the whole call and reuses an output's allocation for
temporaries that die before the output is written, where they fit (openxla/xla
``xla/service/buffer_assignment.cc``, :func:`output_placement`). ``costmodel/memory.py``
(``predict``'s peak) and ``search/liveness.py`` (the search's) both add
:func:`unplaced_output_bytes` at every point of the schedule (one rule).
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from autolayout.graph import Graph

__all__ = ["step_arguments", "whole_call_outputs", "output_placement", "unplaced_output_bytes", "partial_buffers"]


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


def output_placement(temps: Sequence[int], free_outputs: Sequence[int]) -> tuple[int | None, ...]:
    """Where XLA can hold each temporary live at one point (their bytes ``temps``) among the output
    allocations not yet written there (their bytes ``free_outputs``): the index of the allocation
    in ``free_outputs``, or None (the temp heap). One each, largest first, each into the smallest
    free allocation at least its size.

    XLA allocates every output of the step (:func:`whole_call_outputs`) for the whole call and
    reuses an output's allocation for temporaries that die before the output is written:
    ``BufferAssigner::AssignBuffersForComputations`` sorts the buffers largest first and
    ``AssignSingleHloBuffer`` puts each into "the smallest buffer which can be reused"
    (``MaybeAssignBuffer``: the allocation at least the buffer's size, with nothing already
    assigned to it live at the same time), before deferring it to the temp heap
    (openxla/xla ``xla/service/buffer_assignment.cc``). Such an allocation holds each buffer at
    offset 0, so at any point it holds at most one live temporary, of at most its size; the
    rest of the live temporaries are in the temp heap. Largest first into the smallest that
    fits is XLA's order, and holds the most bytes of any such placement (whether a temporary
    fits an allocation is nested by size). Taken point by point, as the most XLA can reuse
    there: XLA places each buffer once for its whole life, which may hold less (a lower bound
    on XLA's figure, given the model's buffers)."""
    free = sorted((b, k) for k, b in enumerate(free_outputs) if b > 0)
    placed: list[int | None] = [None] * len(temps)
    for k in sorted(range(len(temps)), key=lambda k: -temps[k]):
        if temps[k] <= 0 or not free:
            continue
        at = bisect_left(free, (temps[k], -1))  # the smallest free allocation at least its size
        if at < len(free):
            placed[k] = free.pop(at)[1]
    return tuple(placed)


def unplaced_output_bytes(temps: Sequence[int], free_outputs: Sequence[int]) -> int:
    """The bytes the output allocations not yet written (``free_outputs``) add to a point's peak
    beyond what liveness counts there (the live ``temps``): their size less the temporaries they
    hold (:func:`output_placement`). ``predict`` (:func:`peak_memory`) and the search
    (``search.liveness.peak_of``) both add this at every point (one rule)."""
    placed = output_placement(temps, free_outputs)
    return int(sum(free_outputs) - sum(t for t, p in zip(temps, placed) if p is not None))


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
