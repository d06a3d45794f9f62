"""All-reduces that XLA combines into one: the partial sums they hold until it runs.

XLA:CPU runs ``AllReduceCombiner`` with no byte threshold (``CpuAllReduceCombiner(kCombineBytes =
std::numeric_limits<int64_t>::max(), kCombineCount = 256)``, openxla/xla
``xla/service/cpu/cpu_compiler.cc``). Its grouping (``CombineInstructionsByKey``,
``xla/service/collective_combiner_utils.h``) walks a computation's instructions in post order
and takes the all-reduces of one key (reduction, replica groups) until one is reachable from
an all-reduce already taken; those are combined into one all-reduce, and it starts again
from the first all-reduce left. Every member's unreduced partial sums are then live until the
combined all-reduce runs, after the last member's contraction, and their reduced results are
written there.

``costmodel/memory.py`` already holds a step's parameter gradients that way
(:func:`~autolayout.costmodel.gradients.combined_reductions`, a group fixed by the graph). This
module groups the other all-reduces, which depend on the layout: the q, k and v projections of
a layer whose ``d_model`` is split (three partial sums over the same axes, none an ancestor of
another: XLA reduces them with one all-reduce, measured in the optimized HLO of
``benchmarks/memory_vs_xla.py``'s ``transformer_lm-forward d_model:model;d_ff:data``, whose peak
holds the three partial sums and the three reduced results), or the forward output and the
input gradient of a loss linear in the output.

The model keeps the traced order, in which a member's readers may run before the last
member; XLA's program cannot (the readers wait for the combined all-reduce), and the order it
picks instead depends on the layout. Only a member whose every reader runs after the last
member holds its partial sums there (:func:`combined_all_reduces`): where the traced order is an
order of XLA's program. The groups are taken in the traced order, which stands for XLA's post
order. ``predict`` (``memory.peak_memory``'s ``groups``) and the search (``search.liveness``'s
``combined`` names, one per pair of :func:`held_pairs`, sized by ``search.warm.sizes_of``) both
use this one function.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

from autolayout.costmodel.gradients import combined_reductions
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.placement import ALL_REDUCE
from autolayout.costmodel.plan import OpPlan
from autolayout.graph import Graph, Loop

__all__ = ["combined_all_reduces", "held_pairs"]

Groups = Mapping[str | None, tuple[tuple[int, tuple[str, ...]], ...]]


def _computations(graph: Graph) -> list[tuple[str | None, list[str]]]:
    """Each computation's ops in schedule order: the top level (``None``) and each scan body."""
    top = [u for u in graph.schedule if not isinstance(u, Loop)]
    return [(None, top)] + [(lp.name, list(lp.body)) for lp in graph.loops.values()]


@lru_cache(maxsize=64)
def _statics(graph: Graph) -> tuple[dict, dict, frozenset]:
    """``(positions, readers, gradient ops)``: each op's position in its computation
    (top-level positions are those of ``graph.schedule``, as ``memory`` counts them), each
    op's readers, and the ops the gradient group of ``gradients.combined_reductions`` holds."""
    pos: dict[str, tuple[str | None, int]] = {}
    for i, u in enumerate(graph.schedule):
        if not isinstance(u, Loop):
            pos[u] = (None, i)
    for lp in graph.loops.values():
        for j, n in enumerate(lp.body):
            pos[n] = (lp.name, j)
    readers = {op.name: tuple(graph.nx.successors(op.name)) for op in graph.ops()}
    grads = frozenset(o for _, ops in combined_reductions(graph).values() for o in ops)
    return pos, readers, grads


def _may_wait(graph: Graph, m: str, o: str) -> bool:
    """Whether ``m``'s partial sums can wait for an all-reduce combined with ``o``'s, ``o``
    later in the same computation: ``o`` is not reachable from ``m`` and every reader of ``m``
    runs after ``o``."""
    pos, readers, _ = _statics(graph)
    (loop, i), (loop_o, j) = pos[m], pos[o]
    if loop != loop_o or i >= j or o in _descendants(graph, m):
        return False
    return all(pos.get(r, (loop, j + 1))[0] != loop or pos[r][1] > j for r in readers[m])


@lru_cache(maxsize=4096)
def _descendants(graph: Graph, name: str) -> frozenset[str]:
    import networkx as nx

    return frozenset(nx.descendants(graph.nx, name))


def _candidates(graph: Graph, ops: list[str], grads: frozenset) -> list[str]:
    """The ops of a computation (``ops``, in order) whose output the combiner may merge: its
    contractions and reductions outside the gradient group ``grads``."""
    return [o for o in ops if graph.op(o).kind in ("einsum", "reduce") and o not in grads]


@lru_cache(maxsize=64)
def held_pairs(graph: Graph) -> tuple[tuple[str, str], ...]:
    """Every ``(member, last)`` pair of ops that :func:`combined_all_reduces` can group under some
    layout, ``member`` holding its partial sums at ``last``: contractions and reductions of one
    computation, outside the gradient group, ``last`` not reachable from ``member`` and every
    reader of ``member`` after ``last``. The search lists one name per pair at ``last``'s point
    (``search.names.combined``); a layout sizes it (``search.warm.sizes_of``)."""
    _, _, grads = _statics(graph)
    out = []
    for _, ops in _computations(graph):
        cands = _candidates(graph, ops, grads)
        for k, o in enumerate(cands):
            out.extend((m, o) for m in cands[:k] if _may_wait(graph, m, o))
    return tuple(out)


def _all_reduce_key(p: OpPlan) -> tuple | None:
    """The combiner's key of the op planned as ``p`` (its reduction and mesh axes), or None
    where its output is not all-reduced (nothing partial; a reduce-scatter; a conversion after)."""
    if not (p.computed.partial and p.out_steps) or p.out_conversion is not None:
        return None
    if any(s.kind != ALL_REDUCE for s in p.out_steps):
        return None
    return tuple((tuple(s.axes), s.reduce) for s in p.out_steps)


def combined_all_reduces(graph: Graph, plans: Mapping[str, OpPlan], hardware: Hardware) -> Groups:
    """Per computation (``None``: the top level; a loop's name: its body), the combined
    all-reduces whose members hold their partial sums until the last runs: ``(position of the
    last member, (held members..., last member))`` (module docstring). Empty where
    ``hardware.combines_gradient_reductions`` is False (XLA:CPU's combiner; TPU and GPU
    profiles overlap their collectives instead)."""
    if not hardware.combines_gradient_reductions:
        return {}
    pos, _, grads = _statics(graph)
    out: dict[str | None, list[tuple[int, tuple[str, ...]]]] = {}
    for loop, ops in _computations(graph):
        by_key: dict[tuple, list[str]] = {}
        for o in _candidates(graph, ops, grads):
            key = _all_reduce_key(plans[o])
            if key is not None:
                by_key.setdefault(key, []).append(o)
        for seq in by_key.values():
            run: list[str] = []
            for o in seq + [None]:
                if o is not None and not any(o in _descendants(graph, m) for m in run):
                    run.append(o)
                    continue
                held = tuple(m for m in run[:-1] if _may_wait(graph, m, run[-1])) if run else ()
                if held:
                    out.setdefault(loop, []).append((pos[run[-1]][1], (*held, run[-1])))
                run = [o] if o is not None else []
    return {k: tuple(sorted(v)) for k, v in out.items()}
