"""Live sets per schedule point, from ``costmodel/memory.py``'s lifetimes.

``costmodel.memory.peak_memory`` returns ``max`` over schedule points of the
local bytes live there. For the search that maximum must be a set of *linear*
constraints (one per point: Σ live bytes ≤ limit), so this module lists each
point's live tensors instead of summing them. Points:

* a top-level unit ``i`` (op or whole scan) of ``graph._schedule()``: every
  top-level tensor with ``alloc <= i <= free`` (``lifetimes.lifetimes``: arguments
  live throughout, outputs from their producer to the end (one written into a donated
  argument's buffer takes none of its own), others to the last op that reads them; a scan's stacked outputs and final carries from the scan's start);
* inside a scan at unit ``i``: one point per body position ``j`` — the
  top-level live set of ``i`` plus the body tensors live at ``j`` (carried
  values and values used outside the body live for the whole iteration).

Beside the tensors, a point lists names of other buffers (``search/names.py``: a running op's
:func:`~autolayout.search.names.transient` bytes, a reduction's partial sums, the spans' buffers).
A point also lists the dot operand copies live there (:func:`copy`: ``copies.copy_spans``,
from the operand's producer to its dot) and the converted copies that later readers share
(:func:`gathered`: ``sharing.spans``, from where the schedule runs the conversion to the last
reader).

An op of ``phases.split_reductions`` gives two points, as ``predict`` counts it: the contraction's
(its output listed as :func:`result`, 0 bytes where the layout makes it write partial sums) and the
collective's (without the tensors it reads for the last time and the copies freed after it, with
its :func:`partial` sums), at the op, or right after the later unit where the order runs it
(``phases.collective_points``: that unit's last reads and the copies freed there gone). Where
the hardware combines the gradients' all-reduces, an op of ``gradients.deferred_reductions``
gives the contraction's point alone.

Where the step has outputs that XLA allocates for the whole call
(``outputs.whole_call_outputs``), a point's bytes are its live bytes plus
``outputs.unplaced_output_bytes`` of the outputs not yet written there (their allocations
less the live temporaries they can hold, a tensor only one it dies before the output is written:
``outputs.OutputWrites``, per order): :func:`peak_of`. That term is not linear in the
layout (which temporary fits which allocation depends on their local sizes), so the
search's rows are the live sums alone (:func:`live_peak_of`, a lower bound of it at every
point) and ``search/solver.py`` cuts off a layout that meets them but not :func:`peak_of`
(a no-good cut: exact, one layout at a time), and adds a linear relaxation of that point's
output allocations (``search.model.LayoutModel.add_output_row``).

Where the hardware combines the gradients' all-reduces, the point where a computation reduces
its gradients (``gradients.combined_point``: right after a unit, its last reads and the copies
freed there gone) lists the :func:`held` bytes of its gradient-reducing ops but the last
(``reductions.ReductionBytes.held``) and the last one's :func:`partial` sums (with their relayout copy;
``gradients.gradient_bytes``).
The point of an op whose all-reduce may end a combined one
(``costmodel.combine.combined_all_reduces``) lists a :func:`combined` name for each op that
may hold its partial sums there (``combine.held_pairs``; at an op of ``phases.split_reductions``,
on the collective's point alone: the results are written there); which do depends on the layout
(the combiner groups all-reduces of the same mesh axes), so a layout sizes them
(``search.warm.sizes_of``: the held bytes of the members of its groups, 0 for the rest) and,
like the output allocations, they count in :func:`peak_of` but not in the rows' live sums
(:func:`live_peak_of`): the solver cuts off a layout they put over the limit (a no-good cut).

A donated parameter XLA may copy (``costmodel.donations``) lists its :func:`param_copy` and its own
:func:`donor` buffer over their spans; which are copied depends on the whole layout, so
``search.warm.sizes_of`` sizes them and, like the :func:`combined` names, they count in
:func:`peak_of` but not in the rows' live sums.

Where a layout's order depends on how it reduces its gradients (``costmodel.order.memory_order``:
XLA:CPU's combined gradient all-reduce, or each gradient's reduce-scatter a node of its own),
:func:`live_points` lists the points of every order, each guarded by the orders that have it
(:class:`LivePoints`), and :func:`peak_of` counts those of the layout's own
(:meth:`LivePoints.order_of`); the search enforces a row under its orders' literal
(``search/orders.py``), and a floor over every layout takes the smallest order's (:func:`floor_of`).

``peak_memory(graph, mesh, axes_of, shrink)[0] == peak_of(points, sizes)[0]``
for every layout; ``tests/test_search.py`` checks this against the cost model.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

from autolayout.costmodel.combine import held_pairs
from autolayout.costmodel.gradients import (REDUCTIONS, combined_point, combined_reductions, deferred_reductions,
                                            gradient_reducers, gradient_reduction)
from autolayout.costmodel.phases import collective_points, collective_sequence, split_reductions
from autolayout.costmodel.donations import param_copy_spans

from autolayout.costmodel.lifetimes import lifetimes, schedule_points
from autolayout.costmodel.outputs import (OutputWrites, copies_as_one_buffer, output_writes, partial_buffers,
                                          step_arguments, unplaced_output_bytes, whole_call_outputs)
from autolayout.costmodel.sharing import replaced_by_copy
from autolayout.graph import Graph, Loop
from autolayout.search.names import (SPAN_KINDS, TRANSIENT_PARTS, combined, donor, donor_param, gathered, held,
                                     is_donor, is_layout_sized, is_param_copy, is_partial, is_transient, op_of,
                                     param_copy, partial, pending, relayout, result, transient, transient_part)

__all__ = ["LivePoints", "live_points", "peak_of", "total_at", "live_peak_of", "floor_of", "indices_of",
           "reduction_of"]

class LivePoints(list):
    """The live sets of :func:`live_points` (a list of name tuples), with the graph's outputs
    allocated for the whole call (``outputs``) and its arguments (``arguments``), which
    :func:`peak_of` needs. Where a layout's order depends on how it reduces its gradients
    (``costmodel.order.memory_order``), ``guards[i]`` says which layouts point ``i`` is one of:
    the set of the ways of reducing them (``gradients.REDUCTIONS``) whose orders have it, ``None``
    every order's (``graph``: the graph whose ``gradients.gradient_reducers`` decide,
    :meth:`order_of`)."""

    def __init__(self, points: Sequence[tuple[str, ...]], outputs: frozenset[str] = frozenset(),
                 arguments: frozenset[str] = frozenset(), guards: Sequence[frozenset[str] | None] | None = None,
                 graph: Graph | None = None, writes: Mapping[str | None, OutputWrites] | None = None) -> None:
        super().__init__(points)
        self.outputs = outputs
        self.arguments = arguments
        # per order (None: the one order), when each tensor dies and each output is written there (OutputWrites)
        self.writes = dict(writes or {})
        self.combined = any(is_layout_sized(n) for names in points for n in names)  # layout-sized names
        self.guards = tuple(guards) if guards is not None else (None,) * len(points)
        self.graph = graph
        self._split: list[tuple[tuple[str, ...], tuple[str, ...]]] | None = None

    @property
    def ordered(self) -> bool:
        """Whether some point belongs to some orders only."""
        return any(g is not None for g in self.guards)

    def order_of(self, size: Mapping[str, int]) -> str | None:
        """The order of the layout whose bytes are ``size`` (:func:`reduction_of`); None with
        one order."""
        return reduction_of(self.graph, size) if self.ordered else None

    def indices(self, order: str | None) -> list[int]:
        """The points of a layout of ``order`` (:meth:`order_of`; None: every point)."""
        if order is None:
            return list(range(len(self)))
        return [i for i, g in enumerate(self.guards) if g is None or order in g]

    def writes_of(self, size: Mapping[str, int]) -> OutputWrites | None:
        """The ``outputs.OutputWrites`` of the layout whose bytes are ``size``: of its order
        (:func:`reduction_of`) where the orders differ; None without outputs allocated for the
        whole call."""
        if len(self.writes) <= 1 or len({id(w) for w in self.writes.values()}) == 1:
            return next(iter(self.writes.values()), None)
        return self.writes[reduction_of(self.graph, size)]

    def split(self) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """Per point, ``(temporaries, outputs not yet written)``: its names that are neither
        arguments nor outputs, and the outputs it does not list (computed once)."""
        if self._split is None:
            skip = self.outputs | self.arguments
            outputs = sorted(self.outputs)
            self._split = []
            for names in self:  # a parameter's copy, live from the step's start, is in no allocation freed later
                here = set(names)
                temps = tuple(n for n in names if n not in skip and not is_param_copy(n) and not is_donor(n))
                self._split.append((temps,
                                    tuple(o for o in outputs if o not in here)))
        return self._split


def reduction_of(graph: Graph, size: Mapping[str, int]) -> str:
    """How the layout whose bytes are ``size`` (names of this module) reduces its parameter
    gradients: ``gradients.gradient_reduction`` of its ops' :func:`held` and :func:`partial`
    bytes, as ``predict`` tells from a plan (``costmodel.order.memory_order``)."""
    ops = [o for group in gradient_reducers(graph).values() for o in group]
    return gradient_reduction(graph, {o: size.get(held(o), 0) for o in ops}, {o: size.get(partial(o), 0) for o in ops})


def live_points(graph: Graph, *, early: bool, combines: bool = False, orders: Mapping[str, Graph] | None = None
                ) -> LivePoints:
    """Distinct live sets (tensor names in graph order, then the running op's
    :func:`transient`), one per schedule point, in schedule order; ``early``: the shared
    conversions' spans as a breadth-first schedule places them
    (``Hardware.breadth_first_schedule``, :func:`~autolayout.costmodel.sharing.spans`);
    ``combines``: ``Hardware.combines_gradient_reductions``, whose combined all-reduces add the
    :func:`combined` names (``costmodel.combine.held_pairs``). ``orders``: for each way a layout
    may reduce its gradients (``gradients.REDUCTIONS``), the graph in its order
    (``memory_order(..., reduction=...)``): where they are not all ``graph``, the points of
    every order, each guarded by the orders that have it (:class:`LivePoints`)."""
    if orders is None or all(g is graph for g in orders.values()):
        return _live_points(graph, early=early, combines=combines)
    if set(orders) != set(REDUCTIONS):
        raise ValueError(f"live_points: orders has {sorted(orders)}, not every one of {REDUCTIONS}")
    per = {g: _live_points(g, early=early, combines=combines) for g in dict.fromkeys(orders.values())}
    have: dict[tuple[str, ...], set[str]] = {}
    for r in REDUCTIONS:
        for p in per[orders[r]]:
            have.setdefault(p, set()).add(r)
    points = list(have)
    guards = [None if len(rs) == len(REDUCTIONS) else frozenset(rs) for rs in have.values()]
    first = per[orders[REDUCTIONS[0]]]
    return LivePoints(points, first.outputs, first.arguments, guards, graph,
                      {r: w for r in REDUCTIONS for w in per[orders[r]].writes.values()})


def _live_points(graph: Graph, *, early: bool, combines: bool) -> LivePoints:
    gradients = combined_reductions(graph) if combines else {}
    points_after = combined_point(graph) if combines else {}
    split = split_reductions(graph)
    moved = collective_points(graph)
    late: dict[tuple[str | None, int], list[tuple[str, tuple[str, ...]]]] = {}  # collectives run after a later unit
    for o, (loop, k, gone) in moved.items():
        late.setdefault((loop, k), []).append((o, gone))
    deferred = deferred_reductions(graph, combines)
    order_of_collectives = collective_sequence(graph)

    def sequence(o: str) -> tuple[str, ...]:  # the relayout copies before o's collective, the sums after
        before, after = order_of_collectives[o]
        return tuple(relayout(b) for b in before) + tuple(pending(a) for a in after)

    rank = {n: i for i, n in enumerate(graph.order)}
    waiting_at: dict[str, list[str]] = {}
    for m, o in held_pairs(graph) if combines else ():
        waiting_at.setdefault(o, []).append(combined(m, o))
    seen: set[tuple[str, ...]] = set()
    points: list[tuple[str, ...]] = []

    def add(names: list[str], op: str | None, waiting: tuple[str, ...] = (), copies: tuple[str, ...] = (),
            own: tuple[str, ...] | None = None, combining: bool = True) -> None:
        key = (tuple(sorted(names, key=rank.__getitem__)) + (own if own is not None else (transient(op),) if op else ())
               + tuple(held(o) for o in waiting) + copies + (tuple(waiting_at.get(op, ())) if combining else ()))
        if key not in seen:
            seen.add(key)
            points.append(key)

    named: dict[str | None, list[tuple[str, int, int]]] = {}  # per computation: (name, start, stop) of each span
    for kind in SPAN_KINDS:
        for loop, members in kind.names(graph, early).items():
            named.setdefault(loop, []).extend(members)

    for param, start, stop, written in param_copy_spans(graph):  # a donated parameter's copy, its own buffer
        named.setdefault(None, []).extend([(param_copy(param), start, stop), (donor(param), start, written)])

    def copies_at(loop: str | None, i: int, ending: bool = True) -> tuple[str, ...]:
        return tuple(n for n, start, stop in named.get(loop, ()) if start <= i <= stop and (ending or stop > i))

    for i, loop, j, op, live in schedule_points(graph):  # the points predict's peak walks
        top = copies_at(None, i)
        copies = top if loop is None or op is None else top + copies_at(loop, j)
        # the copies live once this op has run (those it reads last freed): a collective's point
        freed = copies_at(None, i, False) if loop is None else top + copies_at(loop, j, False)
        if op in deferred:  # reduced at the combined reduction: the contraction's phase alone
            add([n for n in live if n != op], op, (), copies, (result(op), transient(op)))
        elif op not in split:
            add(list(live), op, (), copies)
        else:
            # a split reduction (phases.split_reductions): the contraction's phase, its output as result(op),
            # then the collective's, without the op's last reads and the copies freed after it
            add([n for n in live if n != op], op, (), copies, (result(op), transient(op)), combining=False)
            if op not in moved:
                gone = set(split[op])
                add([n for n in live if n not in gone], op, (), freed, (partial(op),))
        for o, gone in late.get((loop, i if loop is None else j), ()) if op is not None else ():
            # the collective of a split reduction the order runs after this op (phases.collective_points),
            # in the sequence of those run there (phases.collective_sequence)
            add([n for n in live if n not in set(gone)], None, (), freed, (partial(o),) + sequence(o)
                + tuple(waiting_at.get(o, ())), combining=False)
        at = points_after.get(loop)
        if op is not None and at is not None and at[0] == (i if loop is None else j):
            # the combined gradient reduction, after this op: gradients.gradient_bytes
            ops = gradients[loop][1]
            gone = set(at[1])
            add([n for n in live if n not in gone], None, ops[:-1], freed, (partial(ops[-1]),), combining=False)
    at = points_after.get(None)
    units, alloc, free = lifetimes(graph)
    for (loop, i), group in late.items():
        if loop is None and isinstance(units[i], Loop):  # a collective run right after a scan
            for o, gone in group:
                live = [n for n in alloc if alloc[n] <= i <= free[n] and n not in set(gone)]
                add(live, None, (), copies_at(None, i, False), (partial(o),) + sequence(o)
                    + tuple(waiting_at.get(o, ())), combining=False)
    if at is not None and isinstance(units[at[0]], Loop):  # after a scan
        i, gone, ops = at[0], set(at[1]), gradients[None][1]
        live = [n for n in alloc if alloc[n] <= i <= free[n] and n not in gone]
        add(live, None, ops[:-1], copies_at(None, i, False), (partial(ops[-1]),), combining=False)
    outputs = whole_call_outputs(graph)
    return LivePoints(points, outputs, step_arguments(graph),
                      writes={None: output_writes(graph)} if outputs or param_copy_spans(graph) else None)


def peak_of(points: Sequence[Sequence[str]], size: Mapping[str, int]) -> tuple[int, int]:
    """``(peak bytes, index of the first point reaching it)`` for per-tensor ``size``: at each
    point its live bytes plus, where ``points`` are :class:`LivePoints` with outputs allocated
    for the whole call, ``outputs.unplaced_output_bytes`` of those not live there (not yet
    written), as ``predict`` counts them."""
    outputs = getattr(points, "outputs", frozenset())
    if not outputs and not getattr(points, "combined", False):
        return live_peak_of(points, size)
    best, at = -1, 0
    writes = points.writes_of(size) if isinstance(points, LivePoints) else None
    for i in indices_of(points, size):
        total = total_at(points, size, i, writes)
        if total > best:
            best, at = total, i
    return max(best, 0), at


def total_at(points: Sequence[Sequence[str]], size: Mapping[str, int], i: int,
             writes: OutputWrites | None = None) -> int:
    """The bytes :func:`peak_of` counts at point ``i``: its live bytes, plus the unplaced bytes
    of the outputs allocated for the whole call not yet written there (:class:`LivePoints`; a
    tensor goes into an output's allocation only where it dies before the output is written in
    the layout's order: ``writes``, else :meth:`LivePoints.writes_of`), less
    the temporaries the free buffers of copied parameters hold there (:func:`donor`)."""
    total = sum(size.get(n, 0) for n in points[i])
    # the buffers of the parameters XLA copies, free there (donor): they hold temporaries and add nothing
    mine = sorted((donor_param(n), b) for n in points[i]
                  if is_donor(n) and (b := size.get(param_copy(donor_param(n)), 0)))
    donors = [b for _, b in mine]
    if getattr(points, "outputs", frozenset()) or donors:
        temps, free = points.split()[i]
        free_bytes = [size.get(o, 0) for o in free]
        if any(free_bytes) or donors:
            if writes is None and isinstance(points, LivePoints):
                writes = points.writes_of(size)
            buffers = [(n, b) for n in temps for b in _buffers(n, size)]  # each buffer and the name it is of
            if writes is not None:  # a converted copy taking its value's place is one buffer with it
                buffers = copies_as_one_buffer(buffers, _replacing(writes.graph))
            reuse = writes.reuse([n for n, _ in buffers], free, [p for p, _ in mine]) if writes is not None else {}
            total += unplaced_output_bytes([b for _, b in buffers], free_bytes + donors, **reuse)
            total -= sum(donors)
    return total


@lru_cache(maxsize=64)
def _replacing(graph: Graph) -> Mapping[str, str]:
    """The :func:`gathered` names of the conversions whose copy takes its value's place
    (``sharing.replaced_by_copy``), each to that value (``outputs.copies_as_one_buffer``)."""
    return {gathered(prov, t): t for prov, t in replaced_by_copy(graph)}


def _buffers(name: str, size: Mapping[str, int]) -> list[int]:
    """The buffers a live name's bytes are: a :func:`transient`'s parts where ``size`` lists them
    (:func:`transient_part`), a :func:`partial`'s partial sums and, apart, their :func:`relayout`
    copy (``outputs.partial_buffers``), else its bytes as one.

    Raises:
        ValueError: the parts do not add up to the transient's bytes."""
    if is_partial(name):  # the partial sums and their relayout copy
        return [b for b in partial_buffers(size.get(name, 0), size.get(relayout(op_of(name)), 0)) if b]
    if not is_transient(name):
        return [size.get(name, 0)]
    op = op_of(name)
    names = [transient_part(op, k) for k in range(TRANSIENT_PARTS)]
    if not any(n in size for n in names):
        return [size.get(name, 0)]
    parts = [size.get(n, 0) for n in names]
    if sum(parts) != size.get(name, 0):
        raise ValueError(f"peak_of: the transient buffers of {op!r} {parts} do not add up to its transient "
                         f"bytes {size.get(name, 0)}")
    return [b for b in parts if b]


def live_peak_of(points: Sequence[Sequence[str]], size: Mapping[str, int]) -> tuple[int, int]:
    """``(peak bytes, index of the first point reaching it)`` of the live sums alone (the
    search's memory rows, without the :func:`combined` names a layout sizes; a lower bound of
    :func:`peak_of` at every point, and monotone in every tensor's bytes; over the points of the
    layout's order, :func:`indices_of`: a floor over every layout is :func:`floor_of`)."""
    best, at = -1, 0
    for i in indices_of(points, size):
        total = sum(size.get(n, 0) for n in points[i] if not is_layout_sized(n))
        if total > best:
            best, at = total, i
    return max(best, 0), at


def floor_of(points: Sequence[Sequence[str]], size: Mapping[str, int]) -> int:
    """A lower bound on the peak of every layout whose bytes are each at least ``size``'s: the
    live sums' peak (:func:`live_peak_of`), the smallest of the orders' where
    :class:`LivePoints` have several (``size`` does not say which order a layout takes)."""
    if not getattr(points, "ordered", False):
        return live_peak_of(points, size)[0]
    return min(max((sum(size.get(n, 0) for n in points[i] if not is_layout_sized(n)) for i in points.indices(order)),
                   default=0) for order in REDUCTIONS)


def indices_of(points: Sequence[Sequence[str]], size: Mapping[str, int]) -> Sequence[int]:
    """The points of the layout whose bytes are ``size`` (:meth:`LivePoints.order_of`)."""
    if getattr(points, "ordered", False):
        return points.indices(points.order_of(size))
    return range(len(points))
