"""The order a backend's scheduler runs a step in, for the memory model's liveness walk.

The memory model (:mod:`autolayout.costmodel.memory`, :mod:`autolayout.costmodel.lifetimes`, the
search's live sets in ``search/liveness.py``) walks ``graph.schedule`` and each scan's ``body``.
A traced graph has them in the traced (jaxpr) order. :func:`memory_order` gives the graph that
walk reads on ``hardware``:

* hardware whose compiler schedules each computation breadth first
  (``Hardware.breadth_first_schedule``: XLA:CPU) gets :func:`breadth_first`, the graph in the
  order that scheduler computes;
* hardware whose compiler orders each computation with XLA's ``DefaultMemoryScheduler``
  (``Hardware.min_memory_schedule``: XLA:GPU, which runs it before its latency-hiding scheduler)
  gets :func:`min_memory`: the least live peak of a list, a DFS and a post-order schedule
  (:mod:`autolayout.costmodel.schedulers`; measured against the committed H200 programs: 14 -> 18
  of 24 steps within 10% of ``memory_analysis()``, ``profiles.SRC_GPU_SCHEDULE``);
* other hardware gets the graph itself. XLA:TPU's scheduler is not published (a latency-hiding
  scheduler under a memory limit); the traced order, a sequential program order, is the model's
  stand-in.

XLA:CPU picks ``BFSMemoryScheduler`` unless ``xla_cpu_enable_concurrency_optimized_scheduler`` is
off (openxla/xla ``xla/service/cpu/cpu_compiler.cc``, ``CreateHloSchedule``). That scheduler is
Kahn's algorithm with a first-in first-out queue (``xla/hlo/transforms/simplifiers/
hlo_memory_scheduler.cc``, ``BFSMemoryScheduler``): every instruction without operands is queued
in the computation's instruction order, and an instruction is queued when its last operand is
taken from the queue, so each runs as soon as its operands are ready, in the order they became
ready. What it orders are the computation's instructions after fusion: here the ops that write
their output to memory (``Op.materialised``), each with the element-wise producers fused into it
(which read their operands where it runs), and at the top level each scan as one ``while``.
The ready instructions an operand releases are queued in the order of its ``users()`` list, which
the model takes as the traced order. XLA's passes rewrite that list (a consumer fused or rewritten
is removed from it and its new instruction appended; the fusion pass visits consumers last first:
``xla/service/instruction_fusion.cc``, ``ReversePostOrderFusionQueue``, ``AddFusionInstruction``),
so where one value releases several instructions XLA may queue them otherwise. Measured
(``benchmarks/memory_vs_xla.py --predict``, 803 stored rows, session 20): the MLP's replicated step
with a regression loss runs the input gradient's dot before the weight gradient's (optimized HLO,
positions 15 and 16), the traced order the other way round; queueing every value's readers in
reverse traced order gives that step XLA's live peak exactly (0.875 -> 0.958 of
``memory_analysis()``) but puts 763 rows within 10% (769 in the traced order; the MoE training
steps, whose routing values XLA duplicates into each consumer fusion and whose operand copies are
instructions of their own: 8 leave the 10% band, 2 enter), reversing only the contractions among
them 766. Two rules from XLA's mechanism together (each alone loses rows: 766, 763) put 774 within
10%: a dot's transposing copy of an operand (``copies.copy_spans``' groups) as an instruction of
its own, queued when the operand leaves the queue and read by the group's dots, and each value's
readers queued in reverse post order of the graph (a depth-first walk from the outputs, operands in
order: ``HloComputation::MakeInstructionPostOrder``, the fusion queue's order). That gives the MoE
training step XLA's order and peak (1.124 -> 0.999; 12 of its rows enter the band, 7 leave) but
moves the median error from 2.0% to 2.4% (73 rows more than 3 points further from XLA, 22 closer):
while XLA makes a value's copies it holds the value and every copy made so far (it frees the value
after the last), which the model, holding the value and one copy fewer and having no point at a
copy, does not see, so those rows (NNX LLaMA, the top-2 MoE) fall under XLA's figure (the MoE step
with ``d_ff`` on ``model``: 0.999 -> 0.883; XLA's peak is at the last of four copies made after one
dot, of two values). Not kept; the next step is a point per copy instruction, in the order the
queue makes them after a unit (as ``phases.collective_sequence`` does for collectives), in
``memory.peak_memory`` and the search's live sets. A first try at those points in predict (top
level only, each copy's buffer from its instruction on) fixed that row (0.999) but put 736 rows
within 10%: the copies of element-wise values XLA recomputes in the copy's own fusion, those in
scan bodies and those of step arguments each need their instruction's place, measured case by case.

On hardware that combines the step's gradient all-reduces into one
(``Hardware.combines_gradient_reductions``: XLA:CPU's ``AllReduceCombiner``), that one
instruction reads every op that may reduce a gradient in its computation
(:func:`~autolayout.costmodel.gradients.gradient_reducers`) and is read by every op that reads
them, so the optimizer updates wait for the last gradient. It is queued when the last gradient
leaves the queue, so it runs after the instructions queued before that: the view records the unit
it runs right after (``Graph.combined_after``, per computation), where the memory model counts the
gradients' reduction (:mod:`autolayout.costmodel.gradients`). That instruction exists only where
the layout all-reduces some gradient (a data-parallel layout, not a model-parallel one, nor one
that reduce-scatters every gradient it reduces, ZeRO-2/3 over every axis it reduces on: the
combiner merges all-reduces only). Where the layout reduces none, each update is queued as soon
as its gradient is ready; where it reduce-scatters them, each gradient op's collective is a node
of the order as a split reduction's is (below), queued when the op leaves the queue and read by
its update. So a graph has three orders, ``memory_order(..., reduction=...)``
(``gradients.REDUCTIONS``): ``predict`` walks the one of the layout it prices
(``gradients.gradient_reduction``), and the search holds the points of all three, each row
enforced under a literal of the orders that have it (``search/orders.py``; exact). Measured with
the third, predict-only against the stored XLA figures of ``benchmarks/memory_vs_xla.py``'s
samples (DESIGN §11, session 17): the chosen table, three drawn samples, ``--storage``'s 90 rows, 58
more ZeRO-2/3 rows and ``--loss``'s 12 went from 557 to 560 of 595 within 10%. The collective of every op of
``phases.split_reductions`` (an all-reduce or reduce-scatter of a non-gradient contraction) is a
node of the order too, queued when its op leaves the queue and read by the op's readers, whether
or not a layout reduces there (one order for every layout; where none does, the node holds
nothing): the memory model counts the collective's phase where it runs
(``phases.collective_points``). Measured (``benchmarks/memory_vs_xla.py``, DESIGN §11; of 76
chosen layouts, 72 and 144 drawn at random), with the reduction-fusion rule of
``fusion.with_fusion``: collectives at their ops left 65, 60 and 124 within 10% of XLA's
``memory_analysis()``, the collective nodes 65, 63 and 130, and with the two orders 66, 66 and
132 (before the three changes: 68, 65 and 123, with 8 layouts under XLA's figure by more than
10%; now 4). Conversions that later readers share stay at their
op (``sharing.spans``). A rename of dims is an
instruction: where the layout moves data between the two names it is a collective, computed as
soon as its operand is; where it does not it is a ``bitcast`` with no buffer of its own
(``costmodel/bitcasts.py``: the operand's buffer is kept to the rename's last reader). With the
rules above, the bitcasts took the layouts within 10% of XLA from 66, 66 and 132 to 71, 66 and
134 (an earlier try, before the reduction-fusion rule and these orders, had lost 3 and 9 of the
drawn layouts).

Measured against XLA's ``memory_analysis()`` on 8 virtual CPU devices
(``benchmarks/memory_vs_xla.py``; DESIGN §11): the traced order left about a third of randomly
drawn layouts more than 10% off, two thirds of them under XLA's figure (values the breadth-first
schedule computes early and holds, such as a norm's normalised input or a backward dot that reads
only step arguments).
"""
from __future__ import annotations

import dataclasses
from collections import deque
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.lifetimes import body_lifetimes, gemm_prologues, lifetimes, readers_of
from autolayout.costmodel.memory import stored_itemsize
from autolayout.costmodel.schedulers import dfs_schedule, list_schedule, post_order_schedule
from autolayout.costmodel.phases import split_reductions
from autolayout.costmodel.gradients import COMBINED, REDUCTIONS, SCATTERED, gradient_reducers
from autolayout.graph import Graph, Loop

__all__ = ["memory_order", "breadth_first", "fifo_order", "min_memory", "MEMORY_SCHEDULERS"]

_SYNC = object()  # the combined gradient all-reduce: a node of the order, not an op


@dataclasses.dataclass(frozen=True)
class _Collective:
    """The collective of a split reduction (``phases.split_reductions``): a node of the order,
    queued when its op leaves the queue, and read by the op's readers."""

    op: str


def memory_order(graph: Graph, hardware: Hardware, *, reduction: str = COMBINED) -> Graph:
    """The graph whose schedule the memory model walks on ``hardware`` (module docstring):
    :func:`min_memory` where ``hardware.min_memory_schedule`` (one order whatever ``reduction``),
    :func:`breadth_first` where ``hardware.breadth_first_schedule``, else ``graph``. There the
    collective of every op of ``phases.split_reductions`` is a node of the order; where
    ``hardware.combines_gradient_reductions``, how the layout reduces its gradients
    (``reduction``, :data:`~autolayout.costmodel.gradients.REDUCTIONS`: ``predict`` tells from
    the plan, ``gradients.gradient_reduction``; the search holds the order of each and literals
    choosing between them, ``search/orders.py``) adds the gradients' combined all-reduce
    (``"combined"``: some gradient is all-reduced) or each gradient op's collective as a node of
    its own (``"scattered"``: they are reduce-scattered only, which XLA:CPU's combiner leaves
    apart). ``predict`` (``price_plan``) and the search (``search.tables.Tables``) both call this
    (one rule).

    Raises:
        ValueError: ``reduction`` is not one of ``REDUCTIONS``."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"memory_order: reduction {reduction!r} is not one of {REDUCTIONS}")
    if hardware.min_memory_schedule:
        return min_memory(graph, hardware)
    if not hardware.breadth_first_schedule:
        return graph
    split = frozenset(split_reductions(graph))
    if hardware.combines_gradient_reductions and reduction == SCATTERED:
        grads = frozenset(o for ops in gradient_reducers(graph).values() for o in ops)
        return breadth_first(graph, collectives=split | grads, scattered=True)
    return breadth_first(graph, combined=hardware.combines_gradient_reductions and reduction == COMBINED,
                         collectives=split)


def breadth_first(graph: Graph, combined: bool = False, collectives: frozenset[str] = frozenset(),
                  scattered: bool = False) -> Graph:
    """``graph`` with its schedule and its scans' bodies in the order of XLA's
    ``BFSMemoryScheduler`` (module docstring); ``combined``: the gradients' all-reduces run as one
    instruction, right after the unit ``combined_after[computation]`` of the view (``None``: the
    top level; a scan's name: its body); ``collectives``: ops whose collective is an instruction
    of its own, queued when the op leaves the queue and read by the op's readers, run right after
    the unit ``collective_after[op]`` of the view (listed where that is not the op itself);
    ``scattered``: ``collectives`` holds the gradient ops, whose reductions the memory model then
    counts as those of ``phases.split_reductions`` (``Graph.scattered`` of the view;
    ``gradients.combined_reductions`` has none). A graph this returned comes back as it is."""
    if getattr(graph, "breadth_first_of", None) is not None:
        return graph
    return _breadth_first(graph, combined, frozenset(collectives), scattered)


@lru_cache(maxsize=64)
def _breadth_first(graph: Graph, combined: bool, collectives: frozenset[str], scattered: bool) -> Graph:
    reducers = gradient_reducers(graph) if combined else {}
    bodies, top = _instructions(graph)
    after: dict[str | None, str] = {}  # per computation, the unit the combined reduction runs after
    moved: dict[str, str] = {}  # the collectives that run after a unit other than their op's
    orders: dict[str | None, list] = {}
    for name, (nodes, deps) in [*bodies.items(), (None, top)]:
        orders[name], before, later = _fifo_split(nodes, deps, reducers.get(name, frozenset()), collectives)
        if before is not None:
            after[name] = before
        moved.update(later)
    view = _ordered_view(graph, orders)
    view.breadth_first_of = graph
    view.combined_after = MappingProxyType(after)
    view.collective_after = MappingProxyType(moved)
    view.scattered = scattered
    return view


def _instructions(graph: Graph, fused: frozenset = frozenset()
                  ) -> tuple[dict[str, tuple[list, dict]], tuple[list, dict]]:
    """The instructions a scheduler orders, per computation: ``({loop: (nodes, deps)}, (nodes,
    deps))``, each scan's body and the top level. A body's are its materialised ops (each with the
    element-wise producers fused into it, which read their operands where it runs: their sources,
    :func:`_sources`), each depending on those it reads in the body; the top level's are its
    materialised ops and each scan as one (a ``while``, named as the loop), which reads what its
    body reads from outside it. In the traced order of each computation. ``fused``: materialised
    ops taken into their readers all the same (``lifetimes.gemm_prologues`` on XLA:GPU)."""
    sources = _sources(graph, fused)
    bodies = {}
    for lp in graph.loops.values():
        body = set(lp.body)
        nodes = [n for n in lp.body if graph.op(n).materialised and n not in fused]
        bodies[lp.name] = nodes, {n: [s for s in sources[n] if s in body] for n in nodes}
    unit = {n: lp.name for lp in graph.loops.values() for n in lp.body}
    keys = [u.name if isinstance(u, Loop) else u for u in graph.schedule]
    nodes = [k for k in keys if k in graph.loops or (graph.op(k).materialised and k not in fused)]
    deps = {}
    for k in nodes:
        reads = (s for n in (graph.loops[k].body if k in graph.loops else (k,)) for s in sources[n])
        deps[k] = [unit.get(s, s) for s in reads if unit.get(s, s) != k]
    return bodies, (nodes, deps)


def _ordered_view(graph: Graph, orders: Mapping[str | None, Sequence[str]]) -> Graph:
    """``graph`` with each computation's instructions in ``orders`` (a loop's name: its body's;
    ``None``: the top level's, :func:`_instructions`), the ops fused into them placed right before
    the first that reads them (:func:`_with_fused`)."""
    readers = readers_of(graph)  # a fused op's readers: the materialised ops it is fused into
    loops = {lp.name: dataclasses.replace(lp, body=_with_fused(orders[lp.name], lp.body, readers))
             for lp in graph.loops.values()}
    unit = {n: lp.name for lp in graph.loops.values() for n in lp.body}
    keys = [u.name if isinstance(u, Loop) else u for u in graph.schedule]
    units = _with_fused(orders[None], keys, {n: [unit.get(r, r) for r in readers[n]] for n in keys if n not in loops})
    return graph.with_schedule([loops[u] if u in loops else u for u in units])


def fifo_order(nodes: Sequence[Any], deps: Mapping[Any, Iterable[Any]], combined: Iterable[Any] = ()) -> list:
    """``nodes`` in the order of Kahn's algorithm with a first-in first-out queue (XLA's
    ``BFSMemoryScheduler``): nodes without dependencies queued in the order given, each other
    node queued when the last of ``deps[node]`` (those among ``nodes``) leaves the queue.
    ``combined``: nodes read together by one more instruction (the combined all-reduce), which
    waits for all of them and which every node that reads one of them waits for."""
    return _fifo_split(nodes, deps, combined)[0]


def _fifo_split(nodes: Sequence[Any], deps: Mapping[Any, Iterable[Any]], combined: Iterable[Any],
                collectives: frozenset = frozenset()) -> tuple[list, Any, dict]:
    """``(order, before, moved)``: :func:`fifo_order`, the node the combined instruction runs
    right after in it (``None`` where there is no such instruction), and for each node of
    ``collectives`` whose collective instruction runs after another node, that node."""
    order, before, moved, prev = [], None, {}, None
    for x in _fifo(nodes, deps, combined, collectives):
        if isinstance(x, _Collective):
            if prev != x.op:
                moved[x.op] = prev
        elif x is _SYNC:
            before = prev
        else:
            order.append(x)
            prev = x
    return order, before, moved


def _fifo(nodes: Sequence[Any], deps: Mapping[Any, Iterable[Any]], combined: Iterable[Any],
          collectives: frozenset = frozenset()) -> list:
    """:func:`fifo_order`, with the combined instruction in it (``_SYNC``) where there is one and
    the collective of each node of ``collectives`` (:class:`_Collective`)."""
    present, combined = set(nodes), set(combined)
    group = [n for n in nodes if n in combined]
    wait: dict[Any, list] = {}
    for n in nodes:
        ds = [d for d in dict.fromkeys(deps.get(n, ())) if d in present and d != n]
        if group and n not in group and any(d in group for d in ds):
            ds = [d for d in ds if d not in group] + [_SYNC]
        wait[n] = [_Collective(d) if d in collectives else d for d in ds]
    order_in = list(nodes)
    if group:
        wait[_SYNC] = group
        order_in.append(_SYNC)
    for n in nodes:
        if n in collectives:
            wait[_Collective(n)] = [n]
            order_in.append(_Collective(n))
    users: dict[Any, list] = {n: [] for n in order_in}
    count = {}
    for n in order_in:
        count[n] = len(wait[n])
        for d in wait[n]:
            users[d].append(n)
    queue = deque(n for n in order_in if count[n] == 0)
    out = []
    while queue:
        n = queue.popleft()
        out.append(n)
        for u in users[n]:
            count[u] -= 1
            if count[u] == 0:
                queue.append(u)
    if len(out) != len(order_in):
        stuck = [n for n in order_in if count[n] > 0][:3]
        raise ValueError(f"fifo_order: a cycle among {stuck}")
    return out


def _sources(graph: Graph, fused: frozenset = frozenset()) -> dict[str, list[str]]:
    """For every op, the materialised tensors its fusion reads: its operands, an element-wise
    operand fused into it (``Op.materialised`` False, or in ``fused``) replaced by that operand's
    own sources."""
    out: dict[str, list[str]] = {}

    def of(name: str) -> list[str]:
        hit = out.get(name)
        if hit is None:
            acc: list[str] = []
            for src in graph.op(name).inputs:
                acc.extend(of(src) if not graph.op(src).materialised or src in fused else (src,))
            hit = out[name] = list(dict.fromkeys(acc))
        return hit

    for name in graph.order:
        of(name)
    return out


def _with_fused(order: Sequence[str], every: Sequence[str], fused_into: Mapping[str, Sequence[str]]) -> tuple:
    """``order`` (the materialised ops) with the others of ``every`` (fused element-wise ops, in
    ``every``'s order) placed right before the first op they are fused into (``fused_into``: the
    ops that read them from memory, ``lifetimes.readers_of``; at the end if none is in ``order``)."""
    pos = {n: i for i, n in enumerate(order)}
    before: dict[int, list[str]] = {}
    for n in every:
        if n not in pos:
            at = min((pos[r] for r in fused_into.get(n, ()) if r in pos), default=len(order))
            before.setdefault(at, []).append(n)
    out: list[str] = []
    for i, n in enumerate(order):
        out.extend(before.get(i, ()))
        out.append(n)
    out.extend(before.get(len(order), ()))
    return tuple(out)


MEMORY_SCHEDULERS = ("list", "dfs", "post-order")  # DefaultMemoryScheduler's, in its order of preference


def min_memory(graph: Graph, hardware: Hardware) -> Graph:
    """``graph`` in the order of XLA's ``DefaultMemoryScheduler`` (XLA:GPU,
    ``Hardware.min_memory_schedule``): every computation (the top level, each scan's body) ordered
    by each of :data:`MEMORY_SCHEDULERS` (:mod:`autolayout.costmodel.schedulers`) over its
    materialised ops (each with the element-wise producers fused into it, as :func:`breadth_first`
    takes them) and, at the top level, each scan as one ``while`` that reads a zero fill of each of
    its stacked outputs, an instruction of its own defining the stack (jax's scan lowering
    broadcasts a zero into each before the loop; the view's ``stack_fills`` holds the unit each
    fill runs right before, where :func:`~autolayout.costmodel.lifetimes.lifetimes` allocates the
    stack), and of the three the one whose
    peak of live bytes (:func:`~autolayout.costmodel.lifetimes.lifetimes` and
    :func:`~autolayout.costmodel.lifetimes.body_lifetimes`, a body's peak added at its scan) is
    least, ties to the first (``DefaultMemoryScheduler::Run``). The view records the one it keeps
    (``min_memory_scheduler``) and each one's peak (``min_memory_peaks``). Sizes are the tensors'
    global bytes as ``hardware`` stores them
    (:func:`~autolayout.costmodel.memory.stored_itemsize`), so the order is the same for every
    layout: the search walks the one ``predict`` does (XLA schedules each compiled program at its
    own sizes; the two agree on one device). A view this returned comes back as it is."""
    if getattr(graph, "min_memory_of", None) is not None:
        return graph
    return _min_memory(graph, hardware)


_PARAMETERS = ("input", "param", "opt_state", "constant")  # ListScheduler::IgnoreInstruction's
_FILL = "\0fill:"  # a scan's stacked output's zero fill, an instruction of the schedulers (no op's name)


@lru_cache(maxsize=64)
def _min_memory(graph: Graph, hardware: Hardware) -> Graph:
    readers = readers_of(graph)
    size = {t.name: t.size * stored_itemsize(graph, t.name, hardware) if graph.op(t.name).materialised else 0
            for t in graph.tensors()}
    bodies, (top, reads) = _instructions(graph, gemm_prologues(graph))  # prologues: in their GEMMs
    # per computation: (nodes, deps, bytes defined, values live out, root's operands, carried values)
    computations: dict[str | None, tuple] = {}
    for name, (nodes, deps) in bodies.items():
        lp = graph.loops[name]
        roots = [nxt for _, nxt in lp.carries] + [graph.op(s).inputs[0] for s in lp.stacks if graph.op(s).inputs]
        body = set(lp.body)
        live = set(roots) | {n for n in nodes if any(r not in body for r in readers[n])}
        computations[name] = nodes, deps, {n: size[n] for n in nodes}, live, roots, {c for c, _ in lp.carries}
    nodes, deps, defined = [], {}, {}
    for k in top:
        lp = graph.loops.get(k)
        deps[k] = list(reads[k])
        if lp is not None:  # each stacked output's zero fill is an instruction of its own, read by the loop
            for st in lp.stacks:
                nodes.append(_FILL + st)
                deps[_FILL + st], defined[_FILL + st] = [], size[st]
                deps[k].append(_FILL + st)
        nodes.append(k)
        defined[k] = sum(size[r] for r, _ in lp.results) if lp else size[k]
    unit = {n: lp.name for lp in graph.loops.values() for n in lp.body}
    roots = list(dict.fromkeys(unit.get(s.tensor, s.tensor) for s in graph.outputs if s.tensor))
    computations[None] = nodes, deps, defined, set(roots), roots, frozenset()
    best, peaks = None, {}
    for algo in MEMORY_SCHEDULERS:
        orders = {name: _schedule(algo, graph, *c) for name, c in computations.items()}
        fills_at, pending = {}, []
        for k in orders[None]:  # a fill runs right before the next instruction: the stack exists from there
            if k.startswith(_FILL):
                pending.append(k[len(_FILL):])
            elif pending:
                fills_at.update({st: k for st in pending})
                pending = []
        orders[None] = [k for k in orders[None] if not k.startswith(_FILL)]
        view = _ordered_view(graph, orders)
        at = {u.name if isinstance(u, Loop) else u: i for i, u in enumerate(view.schedule)}
        view.stack_fills = MappingProxyType({st: at[k] for st, k in fills_at.items()})
        view.min_memory_of = graph  # a view of XLA:GPU's order: lifetimes' GPU rules apply to it
        peak = peaks[algo] = _live_peak(view, size)
        if best is None or peak < best[0]:
            best = (peak, algo, view)
    _, algo, view = best
    view.min_memory_scheduler = algo
    view.min_memory_peaks = MappingProxyType(peaks)
    return view


def _schedule(algo: str, graph: Graph, nodes: list, deps: Mapping, defined: Mapping[str, int], live: set,
              roots: list, carried: Iterable[str]) -> list:
    """One computation's instructions ``nodes`` (op names, or scans' names at the top level) in
    the order of scheduler ``algo``: sources (:data:`_PARAMETERS`) and a body's carried values (the loop
    state, read from the body's parameter) are parameters, whose bytes the heuristics ignore."""
    ops = [n for n in nodes if n not in graph.loops and not n.startswith(_FILL)]
    ignored = set(carried) | {n for n in ops if graph.op(n).kind in _PARAMETERS}
    if algo == "list":
        scalars = {n for n in ops if not any(d.size > 1 for d in graph.op(n).output.shape)}
        return list_schedule(nodes, deps, defined, live_out=live, ignored=ignored, scalars=scalars)
    if algo == "dfs":
        return dfs_schedule(nodes, deps, defined, roots=roots, ignored=ignored)
    return post_order_schedule(nodes, deps, roots=roots)


def _live_peak(view: Graph, size: Mapping[str, int]) -> int:
    """The most bytes of tensors live at once in ``view``'s order: :func:`lifetimes` at the top
    level, a scan's body peak (:func:`body_lifetimes`) added at its unit (what
    ``DefaultMemoryScheduler`` compares: live bytes, not the heap's packing)."""
    units, alloc, free = lifetimes(view)
    delta = [0] * (len(units) + 2)
    for n, a in alloc.items():
        delta[a] += size.get(n, 0)
        delta[free[n] + 1] -= size.get(n, 0)
    peak = running = 0
    for i, u in enumerate(units):
        running += delta[i]
        extra = 0
        if isinstance(u, Loop):
            order, last = body_lifetimes(view, u)
            body = [0] * (len(u.body) + 2)
            for n, j in order.items():
                body[j] += size.get(n, 0)
                body[last[n] + 1] -= size.get(n, 0)
            acc = 0
            for j in range(len(u.body)):
                acc += body[j]
                extra = max(extra, acc)
        peak = max(peak, running + extra)
    return peak
