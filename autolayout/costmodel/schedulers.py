"""XLA's memory-minimising schedulers, over one computation's instructions.

XLA:GPU orders every computation with ``DefaultMemoryScheduler`` before its latency-hiding
scheduler runs (openxla/xla ``xla/service/gpu/gpu_hlo_schedule.cc``,
``ScheduleGpuModuleWithMemoryScheduler``): it schedules the module three ways and keeps the one
whose peak of live bytes is least (``xla/hlo/transforms/simplifiers/hlo_memory_scheduler.cc``,
``DefaultMemoryScheduler::Run``, ties to the first of list, DFS, post order). The three, as
written there and here, each over a computation's instructions in their instruction order, each
with the instructions whose values it reads (``operands``) and the bytes it defines:

* :func:`list_schedule` (``ListScheduler``): greedy; of the ready instructions it takes the one
  of highest priority, ``(bytes freed - bytes defined, number of users)``, where an operand's
  buffer is freed if this is its last unscheduled use (a value live out of the computation has
  one more use, at its end); parameters and constants define and free nothing; an effective
  scalar comes first. Among equal priorities the one queued (or re-prioritised) last wins: the
  ready list is a ``std::multimap`` whose last element is taken.
* :func:`dfs_schedule` (``DFSMemoryScheduler``): a post order from the root that visits an
  instruction's operands by decreasing ``extra_users`` (its users less one, plus its operands'
  own, transitively, at most the number of instructions) and then decreasing ``total_sizes`` (its
  bytes plus its operands', likewise, at most the bytes of the instructions visited so far in post
  order), then by name.
* :func:`post_order_schedule` (``PostOrderScheduler``: ``MakeInstructionPostOrder``): a depth-first
  post order from the root, operands in order.

:mod:`autolayout.costmodel.order` builds the instructions from a graph and picks the least of
the three with the memory model's own lifetimes.
"""
from __future__ import annotations

from typing import Any, Collection, Hashable, Mapping, Sequence

__all__ = ["list_schedule", "dfs_schedule", "post_order_schedule"]


def list_schedule(nodes: Sequence[Hashable], operands: Mapping[Any, Sequence[Any]], defined: Mapping[Any, int], *,
                  live_out: Collection[Any] = (), ignored: Collection[Any] = (), scalars: Collection[Any] = (),
                  buffers: Mapping[Any, Collection[Any]] | None = None,
                  buffer_bytes: Mapping[Any, int] | None = None) -> list:
    """``nodes`` in the order of XLA's ``ListScheduler`` (module docstring).

    Args:
        nodes: the computation's instructions, in instruction order (which queues the first
            ready ones).
        operands: per node, the nodes it reads (others, outside the computation, are left out).
        defined: per node, the bytes of the values it defines.
        live_out: the values that outlive the computation (one more use at its end).
        ignored: parameters and constants: they define and free nothing in the priority.
        scalars: effective scalars, scheduled as soon as they are ready.
        buffers: per node, the values its operands hold, where a node's value is not simply its
            own (XLA's dataflow: a ``bitcast`` or ``get-tuple-element`` holds its operand's
            value, a tuple its elements'); default: each operand's own. Parameters' and
            constants' values are then left out by giving them no bytes.
        buffer_bytes: with ``buffers``, the bytes of each value.

    Returns:
        The schedule, a list of ``nodes``.

    Raises:
        ValueError: the operands make a cycle.

    >>> # ListScheduler's own example (its class comment): greedy defers B, whose output is bigger, to
    >>> # after F ("A D E F B C G" there; D and E tie, and the one queued last, E, goes first)
    >>> ops = {"A": [], "B": ["A"], "C": ["B"], "D": ["A"], "E": ["A"], "F": ["D", "E"], "G": ["C", "F"]}
    >>> "".join(list_schedule(list("ABCDEFG"), ops, {"A": 1, "B": 2, "C": 1, "D": 1, "E": 1, "F": 2, "G": 1},
    ...                       live_out={"G"}))
    'AEDFBCG'
    """
    reads = _unique_operands(nodes, operands)
    users: dict[Any, list] = {n: [] for n in nodes}
    for n in nodes:
        for d in reads[n]:
            users[d].append(n)
    ignored, scalars = set(ignored), set(scalars)
    if buffers is None:
        held = {n: [d for d in reads[n] if d not in ignored] for n in nodes}
        size: Mapping[Any, int] = defined
    else:
        held = {n: list(dict.fromkeys(buffers.get(n, ()))) for n in nodes}
        size = buffer_bytes or {}
    uses: dict[Any, int] = {}  # unscheduled uses of each value
    for n in nodes:
        for v in held[n]:
            uses[v] = uses.get(v, 0) + 1
    for v in live_out:
        uses[v] = uses.get(v, 0) + 1
    waiting = {n: len(reads[n]) for n in nodes}
    ready: dict[Any, tuple] = {}  # node -> (priority, when queued)
    clock = 0

    def priority(n: Any) -> tuple:
        if n in scalars:
            return (float("inf"), float("inf"))
        freed = sum(size.get(v, 0) for v in held[n] if uses[v] == 1)
        return (freed - (0 if n in ignored else defined.get(n, 0)), len(users[n]))

    def queue(n: Any) -> None:
        nonlocal clock
        clock += 1
        ready[n] = (priority(n), clock)

    for n in nodes:
        if not reads[n]:
            queue(n)
    out: list = []
    while ready:
        best = max(ready, key=ready.__getitem__)
        del ready[best]
        out.append(best)
        adjust = False
        for v in held[best]:
            uses[v] -= 1
            adjust |= uses[v] == 1
        for u in users[best]:
            waiting[u] -= 1
            if waiting[u] == 0:
                queue(u)
        if adjust:  # a value down to one use: the readers left may free it now
            for d in reads[best]:
                for u in users[d]:
                    if u in ready and priority(u) != ready[u][0]:
                        queue(u)
    if len(out) != len(nodes):
        raise ValueError(f"list_schedule: a cycle among {[n for n in nodes if waiting[n] > 0][:3]}")
    return out


def dfs_schedule(nodes: Sequence[Hashable], operands: Mapping[Any, Sequence[Any]], defined: Mapping[Any, int], *,
                 roots: Sequence[Any], ignored: Collection[Any] = (), names: Mapping[Any, str] | None = None) -> list:
    """``nodes`` in the order of XLA's ``DFSMemoryScheduler`` (module docstring): a post order
    from ``roots`` (the root instruction, or the operands of a root tuple: they are visited as any
    instruction's operands are) whose operands are visited by decreasing
    extra users, then decreasing total sizes, then name (``names``, else ``str``); nodes no root
    reaches follow in their order. ``ignored`` (parameters, constants) count neither.

    >>> ops = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}
    >>> dfs_schedule(list("abcd"), ops, {"a": 1, "b": 1, "c": 4, "d": 1}, roots=["d"])  # c's subtree is larger
    ['a', 'c', 'b', 'd']
    """
    reads = _unique_operands(nodes, operands)
    name = (lambda n: names[n]) if names is not None else str
    ignored = set(ignored)
    users = {n: 0 for n in nodes}
    for n in nodes:
        for d in reads[n]:
            users[d] += 1
    extra: dict[Any, int] = {}
    total: dict[Any, int] = {}
    cumulative = 0  # XLA caps the transitive sums (they count shared operands once per path) at these
    for n in _post_order(nodes, reads, roots):
        if n in ignored:
            extra[n] = total[n] = 0
            continue
        cumulative += defined.get(n, 0)
        extra[n] = min(max(users[n] - 1, 0) + sum(extra[d] for d in reads[n]), len(nodes))
        total[n] = min(defined.get(n, 0) + sum(total[d] for d in reads[n]), cumulative)
    first = {n: (-extra[n], -total[n], name(n)) for n in nodes}
    roots = sorted(dict.fromkeys(r for r in roots if r in first), key=first.__getitem__)  # the root tuple's operands
    return _post_order(nodes, {n: sorted(reads[n], key=first.__getitem__) for n in nodes}, roots)


def post_order_schedule(nodes: Sequence[Hashable], operands: Mapping[Any, Sequence[Any]], *,
                        roots: Sequence[Any]) -> list:
    """``nodes`` in a depth-first post order from ``roots``, each node's operands in order
    (``HloComputation::MakeInstructionPostOrder``); nodes no root reaches follow in their order.

    >>> post_order_schedule(list("abcd"), {"a": [], "b": ["a"], "c": [], "d": ["c", "b"]}, roots=["d"])
    ['c', 'a', 'b', 'd']
    """
    return _post_order(nodes, _unique_operands(nodes, operands), roots)


def _unique_operands(nodes: Sequence[Any], operands: Mapping[Any, Sequence[Any]]) -> dict[Any, list]:
    present = set(nodes)
    return {n: [d for d in dict.fromkeys(operands.get(n, ())) if d in present and d != n] for n in nodes}


def _post_order(nodes: Sequence[Any], reads: Mapping[Any, Sequence[Any]], roots: Sequence[Any]) -> list:
    seen: set = set()
    out: list = []
    for root in list(roots) + list(nodes):
        if root in seen:
            continue
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if expanded:
                if n not in seen:
                    seen.add(n)
                    out.append(n)
                continue
            if n in seen:
                continue
            stack.append((n, True))
            stack.extend((d, False) for d in reversed(reads[n]) if d not in seen)
    return out
