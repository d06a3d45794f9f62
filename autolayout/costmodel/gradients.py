"""Where a step reduces its parameter gradients, for the memory model.

Every op that may reduce a parameter's gradient (:func:`gradient_reducers`: the first reducing op
on each path back from it; whether one does depends on the layout) writes its unreduced partial
sums where it runs. On a backend that reduces them together (``Hardware.combines_gradient_reductions``:
XLA:CPU) the reduction comes later:

* their all-reduces are combined into one instruction (XLA:CPU's ``CpuAllReduceCombiner`` with no
  byte threshold, ``kCombineBytes = std::numeric_limits<int64_t>::max()``, openxla/xla
  ``xla/service/cpu/cpu_compiler.cc``; ``AllReduceCombiner`` merges only all-reduces that do not
  depend on one another, which a step's gradients never do), which reads every gradient;
* their reduce-scatters are not combined, but each, with its relayout copy
  (``reductions.ReductionBytes.partial``), is an instruction queued after its dot, and XLA:CPU's first-in
  first-out scheduler (``costmodel/order.py``) runs it after the instructions queued before it:
  measured in the optimized HLO of ``benchmarks/memory_vs_xla.py``'s ZeRO-3 ``mlp`` step, whose
  two relayout copies and three reduce-scatters run after the last gradient dot *and* after the
  input gradient's dot queued before it (the last reader of an all-gathered weight, freed there).

Where the layout all-reduces some gradient (:func:`gradient_reduction`), the model has one
reduction per computation (:func:`combined_reductions`), a node of the breadth-first order that
waits for every gradient-reducing op (``costmodel.order``); a reduce-scattering op is no member of
it (``reductions.ReductionBytes.held`` 0): its partial sums count at its own position alone, its
result from there (an approximation where a layout mixes the two, which XLA runs as a combined
all-reduce and separate reduce-scatters). Where the layout reduce-scatters every gradient it
reduces, the order has no such reduction (``Graph.scattered``: :func:`combined_reductions` has
none) and each gradient op is a split reduction whose collective is a node of its own
(``phases.split_reductions``, ``phases.collective_sequence``: the relayout copies of those run
after one unit first). The combined reduction runs
right after the unit the order runs before it (``Graph.combined_after``, set by
``order.breadth_first``; after the last gradient op in an order that has none): the point of
:func:`combined_point`, where that unit's last reads are freed and every op's partial sums are
live (:func:`gradient_bytes`: its held bytes, ``reductions.ReductionBytes.held``, the last op's with its
relayout copy, ``reductions.ReductionBytes.partial``: XLA copies one gradient at a time). Where it runs, each op
counts its contraction's phase alone (:func:`deferred_reductions`). ``memory.peak_memory`` and the
search's live sets (``search/liveness.py``) both take these points (one rule). Before the
reduction was placed where the order runs it (it was counted at the last gradient op, with the
ops queued before it still to run) the ZeRO-3 ``mlp`` step was 1.31x XLA's peak; 1.02 after.
"""
from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType
from typing import Mapping

from autolayout.costmodel.lifetimes import freed_at
from autolayout.costmodel.outputs import partial_buffers
from autolayout.costmodel.storage import gradient_walk
from autolayout.graph import Graph, Loop

__all__ = ["gradient_reducers", "gradient_reduction", "COMBINED", "SCATTERED", "NONE", "REDUCTIONS",
           "combined_reductions", "combined_point", "gradient_bytes",
           "deferred_reductions"]


class _EveryDimSplit(dict):
    """``axes_of`` with every dim split: :func:`~autolayout.costmodel.storage.gradient_walk`
    then stops at the first reducing op on each path back from a gradient, whatever the
    layout."""

    def get(self, key, default=None):  # noqa: ANN001, ANN201 (a Mapping's get)
        return ("*",)


@lru_cache(maxsize=256)
def gradient_reducers(graph: Graph) -> Mapping[str | None, frozenset[str]]:
    """Per computation (``None``: the top level; a loop's name: its body), the ops that may reduce
    a parameter's gradient: the first reducing op on each path back from it
    (:func:`~autolayout.costmodel.storage.gradient_walk`, every dim taken as split); whether one
    does depends on the layout. The schedule does not enter (:func:`combined_reductions` adds where
    they are reduced)."""
    body_loop = {n: lp.name for lp in graph.loops.values() for n in lp.body}
    found: dict[str | None, set[str]] = {}
    for param in graph.param_roles:
        ops, _ = gradient_walk(graph, param, _EveryDimSplit())
        for o in ops:
            found.setdefault(body_loop.get(o), set()).add(o)
    return MappingProxyType({k: frozenset(v) for k, v in found.items()})


COMBINED, SCATTERED, NONE = "combined", "scattered", "none"
REDUCTIONS = (COMBINED, SCATTERED, NONE)  # how a layout reduces its parameter gradients (gradient_reduction)


def gradient_reduction(graph: Graph, held: Mapping[str, int], partials: Mapping[str, int]) -> str:
    """How a layout reduces its parameter gradients, from the bytes of the ops of
    :func:`gradient_reducers` (``held``: ``reductions.ReductionBytes.held``, ``partials``:
    ``reductions.ReductionBytes.partial``, per op): ``"combined"`` where some op holds partial
    sums for an all-reduce (its held bytes; XLA:CPU's step then has one combined all-reduce the
    optimizer updates wait for), ``"scattered"`` where some op reduces its partial sums but none
    all-reduces (reduce-scatters only, which XLA:CPU does not combine: each is an instruction of
    the order), else ``"none"``. The order the memory model walks is the one of this
    (``costmodel.order.memory_order``)."""
    ops = [o for group in gradient_reducers(graph).values() for o in group]
    if any(held.get(o, 0) for o in ops):
        return COMBINED
    return SCATTERED if any(partials.get(o, 0) for o in ops) else NONE


@lru_cache(maxsize=256)
def combined_reductions(graph: Graph) -> dict[str | None, tuple[int, tuple[str, ...]]]:
    """Where the step reduces its parameter gradients together (module docstring), per
    computation (``None``: the top level; a loop's name: its body, once per iteration):
    ``(position, ops)``, the ops of :func:`gradient_reducers` in schedule order (whether one
    reduces depends on the layout: ``reductions.ReductionBytes.held`` is 0 where it does not) and the
    position of the unit the reduction runs right after (a unit of ``graph.schedule``, or a
    position in the loop's body): ``graph.combined_after``'s where the order sets it
    (``order.breadth_first``), else the last op's."""
    if getattr(graph, "scattered", False):  # each gradient op's collective a node of the order
        return {}
    unit_of = {(u.name if isinstance(u, Loop) else u): i for i, u in enumerate(graph.schedule)}
    after = getattr(graph, "combined_after", {})
    out = {}
    for loop, ops in gradient_reducers(graph).items():
        pos = unit_of if loop is None else {n: i for i, n in enumerate(graph.loops[loop].body)}
        ops = sorted(set(ops), key=pos.__getitem__)
        out[loop] = (pos[after[loop]] if loop in after else pos[ops[-1]], tuple(ops))
    return out


@lru_cache(maxsize=256)
def combined_point(graph: Graph) -> dict[str | None, tuple[int, tuple[str, ...]]]:
    """Per computation of :func:`combined_reductions`, ``(position, freed)``: the reduction runs
    right after the unit at ``position``, which has freed the tensors it read for the last time
    (``freed``: ``lifetimes.freed_at``, as ``phases.split_reductions`` lists an op's)."""
    return {loop: (at, freed_at(graph, loop, at)) for loop, (at, _) in combined_reductions(graph).items()}


def gradient_bytes(ops: tuple[str, ...], held: Mapping[str, int], partials: Mapping[str, int],
                   relayouts: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """The buffers the combined reduction of ``ops`` (:func:`combined_reductions`) holds where it
    runs: the held partial sums ``held[op]`` of each op but the last (``reductions.ReductionBytes.held``), the
    last op's ``partials[op]`` with their relayout copy (``reductions.ReductionBytes.partial``: XLA copies one
    gradient at a time), that copy a buffer of its own (``relayouts[op]``, ``reductions.ReductionBytes.relayout``;
    ``outputs.partial_buffers``)."""
    last = partial_buffers(partials.get(ops[-1], 0), (relayouts or {}).get(ops[-1], 0))
    return tuple(held.get(o, 0) for o in ops[:-1]) + last


@lru_cache(maxsize=256)
def deferred_reductions(graph: Graph, combines: bool) -> frozenset[str]:
    """The ops of :func:`combined_reductions` where ``combines``
    (``Hardware.combines_gradient_reductions``; none elsewhere, where each op reduces its own).
    Each writes its partial sums where it runs, and its reduced result is allocated at the
    combined reduction. So ``memory.peak_memory`` counts it at its own position without its
    output (the contraction's phase of ``phases.split_reductions``, ``inputs + partial sums``);
    from there to the reduction its output's bytes stand for the partial sums. In the traced order
    the gradient contractions run late, near the reduction; in a breadth-first order one runs as
    soon as its operands are ready, beside the forward's activations (measured: the zoo moe's
    data-parallel step, ``tests/test_memory_xla.py``)."""
    if not combines:
        return frozenset()
    return frozenset(o for _, ops in combined_reductions(graph).values() for o in ops)
