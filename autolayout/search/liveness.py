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
less the live temporaries they can hold): :func:`peak_of`. That term is not linear in the
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

Where a layout's order depends on whether it reduces a gradient (``costmodel.order.memory_order``:
XLA:CPU's combined gradient reduction), :func:`live_points` lists the points of both orders, each
guarded by its order (:class:`LivePoints`), and :func:`peak_of` counts those of the layout's own
(:meth:`LivePoints.order_of`); the search enforces a row under its order's literal
(``search/orders.py``), and a floor over every layout takes the smaller order's (:func:`floor_of`).

``peak_memory(graph, mesh, axes_of, shrink)[0] == peak_of(points, sizes)[0]``
for every layout; ``tests/test_search.py`` checks this against the cost model.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autolayout.costmodel.bitcasts import kept_spans
from autolayout.costmodel.broadcasts import broadcast_spans
from autolayout.costmodel.combine import held_pairs
from autolayout.costmodel.gradients import (combined_point, combined_reductions, deferred_reductions, gradient_reducers,
                                            gradients_reduced)
from autolayout.costmodel.phases import collective_points, split_reductions

from autolayout.costmodel.copies import copy_spans
from autolayout.costmodel.donations import param_copy_spans

from autolayout.costmodel.lifetimes import lifetimes, schedule_points
from autolayout.costmodel.outputs import partial_buffers, step_arguments, unplaced_output_bytes, whole_call_outputs
from autolayout.costmodel.recomputed import recomputed_spans
from autolayout.costmodel.sharing import spans as shared_spans
from autolayout.graph import Graph, Loop

__all__ = ["LivePoints", "live_points", "peak_of", "total_at", "live_peak_of", "floor_of", "indices_of",
           "reduces_gradient", "transient", "is_transient", "transient_part", "is_transient_part", "TRANSIENT_PARTS",
           "held", "is_held", "partial", "is_partial", "result", "is_result",
           "copy", "is_copy", "copy_operand", "gathered", "is_gathered", "gathered_tensor", "op_of", "combined",
           "is_combined", "kept", "is_kept", "kept_of", "broadcast", "is_broadcast", "broadcast_of", "recomputed",
           "is_recomputed", "recomputed_of", "SpanKind", "SPAN_KINDS", "span_kind", "param_copy", "is_param_copy",
           "donor", "is_donor", "is_layout_sized", "relayout"]

_TRANSIENT = "\x00transient:"
_TRANSIENT_PART = "\x00transient-part:"
_HELD = "\x00held:"
_COPY = "\x00copy:"
_GATHERED = "\x00gathered:"
_COMBINED = "\x00combined:"
_PARTIAL = "\x00partial:"
_RESULT = "\x00result:"
_KEPT = "\x00kept:"
_BROADCAST = "\x00broadcast:"
_RECOMPUTED = "\x00recomputed:"
_PARAM_COPY = "\x00param-copy:"
_DONOR = "\x00donor:"
_RELAYOUT = "\x00relayout:"


def transient(op: str) -> str:
    """The name under which a live set lists the transient bytes of ``op``
    (:attr:`~autolayout.costmodel.reductions.ReductionBytes.transient`: inputs gathered for it, partial
    sums being reduced), live only at the point where ``op`` runs."""
    return _TRANSIENT + op


def is_transient(name: str) -> bool:
    return name.startswith(_TRANSIENT)


TRANSIENT_PARTS = 4  # OpCost.running_parts and the operand copies at the dot


def is_transient_part(name: str) -> bool:
    return name.startswith(_TRANSIENT_PART)


def transient_part(op: str, k: int) -> str:
    """The name under which a layout's sizes (``search.warm.sizes_of``) list buffer ``k`` of
    :func:`transient` ``op`` (``Tables.transient_parts``): not a name of the live sets, whose
    sums take the whole; :func:`total_at` places each part in an output allocation on its own."""
    return f"{_TRANSIENT_PART}{k}:{op}"


def partial(op: str) -> str:
    """The name under which the live set of the collective's phase of a split reduction
    (``phases.split_reductions``) lists the partial sums ``op`` reduces there
    (``reductions.ReductionBytes.partial``; 0 where its layout reduces nothing)."""
    return _PARTIAL + op


def is_partial(name: str) -> bool:
    return name.startswith(_PARTIAL)


def relayout(op: str) -> str:
    """The size key (not a live-set name) of the part of :func:`partial` ``op`` that is its
    relayout copy (``reductions.ReductionBytes.relayout``), which :func:`total_at` places apart."""
    return _RELAYOUT + op


def result(op: str) -> str:
    """The name under which the live set of the contraction's phase of a split reduction lists
    ``op``'s output in place of the tensor: its bytes where the layout reduces nothing, 0 where
    the op writes partial sums (the reduced result is not allocated yet)."""
    return _RESULT + op


def is_result(name: str) -> bool:
    return name.startswith(_RESULT)


def held(op: str) -> str:
    """The name under which a live set lists the bytes gradient-reducing ``op`` holds until its
    computation's combined reduction (:attr:`~autolayout.costmodel.reductions.ReductionBytes.held`)."""
    return _HELD + op


def is_held(name: str) -> bool:
    return name.startswith(_HELD)


def copy(op: str, k: int) -> str:
    """The name under which a live set lists the copy contraction ``op`` reads of its operand
    ``k`` (:func:`~autolayout.costmodel.copies.copy_spans`), live from the operand's producer to
    ``op``."""
    return f"{_COPY}{k}:{op}"


def is_copy(name: str) -> bool:
    return name.startswith(_COPY)


def copy_operand(name: str) -> int:
    """The operand index of a :func:`copy` name."""
    return int(name[len(_COPY):].split(":", 1)[0])


def gathered(op: str, tensor: str) -> str:
    """The name under which a live set lists the copy of ``tensor`` that ``op`` converts for
    later readers too, or early (``OpCost.span_bytes``; ``sharing.shared_reads``), live from where
    XLA schedules the conversion to the last of them."""
    return f"{_GATHERED}{op}\x00{tensor}"


def is_gathered(name: str) -> bool:
    return name.startswith(_GATHERED)


def gathered_tensor(name: str) -> str:
    """The tensor of a :func:`gathered` name."""
    return name[len(_GATHERED):].split("\x00", 1)[1]


def _parts(prefix: str, name: str) -> tuple[str, str]:
    """The two names a name of ``prefix`` (:func:`kept`, :func:`broadcast`) was made of."""
    first, second = name[len(prefix):].split("\x00", 1)
    return first, second


def kept(src: str, rename: str) -> str:
    """The name under which a live set lists ``src``'s buffer kept alive for its renames past its
    own last reader, where the layout makes them bitcasts (``costmodel.bitcasts.kept_spans``;
    ``rename``: the first of them, whose layout decides)."""
    return f"{_KEPT}{src}\x00{rename}"


def is_kept(name: str) -> bool:
    return name.startswith(_KEPT)


def kept_of(name: str) -> tuple[str, str]:
    """``(src, rename)`` of a :func:`kept` name."""
    return _parts(_KEPT, name)


def broadcast(value: str, reader: str) -> str:
    """The name under which a live set lists the broadcast of ``value`` XLA writes to memory, at
    the shape of its element-wise ``reader`` (``costmodel.broadcasts.broadcast_spans``)."""
    return f"{_BROADCAST}{value}\x00{reader}"


def is_broadcast(name: str) -> bool:
    return name.startswith(_BROADCAST)


def broadcast_of(name: str) -> tuple[str, str]:
    """``(value, reader)`` of a :func:`broadcast` name."""
    return _parts(_BROADCAST, name)


def recomputed(source: str, value: str) -> str:
    """The name under which a live set lists ``source``'s buffer kept alive past its own last
    reader where the layout recomputes ``value`` from it (``costmodel.recomputed``)."""
    return f"{_RECOMPUTED}{source}\x00{value}"


def is_recomputed(name: str) -> bool:
    return name.startswith(_RECOMPUTED)


def recomputed_of(name: str) -> tuple[str, str]:
    """``(source, value)`` of a :func:`recomputed` name."""
    return _parts(_RECOMPUTED, name)


@dataclass(frozen=True)
class SpanKind:
    """A kind of buffer that lives over a span of schedule positions, beside the tensors: one
    row of :data:`SPAN_KINDS`, which the live sets (:func:`live_points`), a layout's sizes
    (``search.warm.sizes_of``) and the memory rows (``LayoutModel.memory_expr``) all read, as
    ``costmodel.memory._spans`` does for ``predict``.

    ``spans(graph, early)``: per computation, ``(a, b, start, stop)`` (the cost model's own
    function); ``key(a, b)``: the two parts a live-set name is made of; ``name(x, y)``: that
    name; ``parts(name)``: its ``(x, y)``; ``nbytes(tables, x, y)``: ``(dims, bytes per
    assignment of dims)`` from ``search.tables.Tables``; ``prefix``: what its names start with."""

    spans: Callable[[Graph, bool], Mapping[str | None, tuple]]
    key: Callable[[Any, Any], tuple]
    name: Callable[[Any, Any], str]
    parts: Callable[[str], tuple]
    nbytes: Callable[[Any, Any, Any], tuple]
    prefix: str

    def names(self, graph: Graph, early: bool) -> dict[str | None, list[tuple[str, int, int]]]:
        """Per computation, ``(name, start, stop)`` of each span of ``graph``."""
        out: dict[str | None, list[tuple[str, int, int]]] = {}
        for loop, members in self.spans(graph, early).items():
            out.setdefault(loop, []).extend((self.name(*self.key(a, b)), start, stop) for a, b, start, stop in members)
        return out


SPAN_KINDS: tuple[SpanKind, ...] = (
    # a dot operand copy, live from the operand's producer to its dot
    SpanKind(lambda g, early: copy_spans(g), lambda op, k: (op, k), copy,
             lambda n: (op_of(n), copy_operand(n)), lambda t, op, k: t.copy_bytes(t.graph.op(op), k), _COPY),
    # a conversion later readers share, live from where it runs to the last of them
    SpanKind(shared_spans, lambda op, tensor: (op, tensor), gathered, lambda n: (op_of(n), gathered_tensor(n)),
             lambda t, op, tensor: t.gathered_bytes(t.graph.op(op), tensor), _GATHERED),
    # an operand kept alive by renames that are bitcasts (the first rename's layout decides)
    SpanKind(lambda g, early: kept_spans(g), lambda src, renames: (src, renames[0]), kept, lambda n: kept_of(n),
             lambda t, src, rename: t.kept_bytes(src, rename), _KEPT),
    # a broadcast XLA writes, at its reader's shape
    SpanKind(lambda g, early: broadcast_spans(g), lambda value, reader: (value, reader), broadcast,
             lambda n: broadcast_of(n), lambda t, value, reader: t.broadcast_bytes(reader), _BROADCAST),
    # a source kept alive for a value the layout recomputes from it
    SpanKind(lambda g, early: recomputed_spans(g), lambda source, value: (source, value), recomputed,
             lambda n: recomputed_of(n), lambda t, source, value: t.recomputed_bytes(source, value), _RECOMPUTED),
)


def span_kind(name: str) -> SpanKind | None:
    """The :data:`SPAN_KINDS` row whose live-set names ``name`` is one of, else None."""
    return next((k for k in SPAN_KINDS if name.startswith(k.prefix)), None)


def param_copy(param: str) -> str:
    """The name of XLA's copy of a donated ``param`` in the live sets from the step's start to its
    last reader (``costmodel.donations``; 0 bytes where the layout updates it in place)."""
    return _PARAM_COPY + param


def is_param_copy(name: str) -> bool:
    return name.startswith(_PARAM_COPY)


def donor(param: str) -> str:
    """The name of a donated ``param``'s own buffer in the live sets before its update is written:
    where XLA copies it (:func:`param_copy` sized), it holds temporaries as an output allocation
    not yet written does (:func:`total_at`) and adds no bytes."""
    return _DONOR + param


def is_donor(name: str) -> bool:
    return name.startswith(_DONOR)


def is_layout_sized(name: str) -> bool:
    """Whether a live-set name's bytes depend on the whole layout (:func:`combined`,
    :func:`param_copy`, :func:`donor`): the memory rows leave them out (:func:`live_peak_of`); the
    solver cuts off a layout they put over the limit (a no-good cut)."""
    return is_combined(name) or is_param_copy(name) or is_donor(name)


def combined(member: str, last: str) -> str:
    """The name under which the live set of ``last``'s point lists the partial sums ``member``
    holds there when a layout combines their all-reduces (``costmodel.combine``)."""
    return f"{_COMBINED}{member}\x00{last}"


def is_combined(name: str) -> bool:
    return name.startswith(_COMBINED)


def op_of(name: str) -> str:
    """The op of a :func:`transient`, :func:`held`, :func:`partial`, :func:`result`, :func:`copy` or
    :func:`gathered` name."""
    if is_copy(name):
        return name[len(_COPY):].split(":", 1)[1]
    if is_gathered(name):
        return name[len(_GATHERED):].split("\x00", 1)[0]
    for prefix in (_HELD, _PARTIAL, _RESULT, _TRANSIENT):
        if name.startswith(prefix):
            return name[len(prefix):]
    raise ValueError(f"op_of: {name!r} is not a name of an op's bytes")


class LivePoints(list):
    """The live sets of :func:`live_points` (a list of name tuples), with the graph's outputs
    allocated for the whole call (``outputs``) and its arguments (``arguments``), which
    :func:`peak_of` needs. Where a layout's order depends on whether it reduces a gradient
    (``costmodel.order.memory_order``), ``guards[i]`` says which layouts point ``i`` is one of:
    ``True`` those that reduce some gradient, ``False`` the others, ``None`` both (``graph``:
    the graph whose ``gradients.gradient_reducers`` decide, :meth:`order_of`)."""

    def __init__(self, points: Sequence[tuple[str, ...]], outputs: frozenset[str] = frozenset(),
                 arguments: frozenset[str] = frozenset(), guards: Sequence[bool | None] | None = None,
                 graph: Graph | None = None) -> None:
        super().__init__(points)
        self.outputs = outputs
        self.arguments = arguments
        self.combined = any(is_layout_sized(n) for names in points for n in names)  # layout-sized names
        self.guards = tuple(guards) if guards is not None else (None,) * len(points)
        self.graph = graph
        self._split: list[tuple[tuple[str, ...], tuple[str, ...]]] | None = None

    @property
    def two_orders(self) -> bool:
        """Whether some point belongs to one of the two orders only."""
        return any(g is not None for g in self.guards)

    def order_of(self, size: Mapping[str, int]) -> bool | None:
        """The order of the layout whose bytes are ``size`` (:func:`reduces_gradient`); None with
        one order."""
        return reduces_gradient(self.graph, size) if self.two_orders else None

    def indices(self, order: bool | None) -> list[int]:
        """The points of a layout of ``order`` (:meth:`order_of`; None: every point)."""
        if order is None:
            return list(range(len(self)))
        return [i for i, g in enumerate(self.guards) if g is None or g == order]

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


def reduces_gradient(graph: Graph, size: Mapping[str, int]) -> bool:
    """Whether the layout whose bytes are ``size`` (names of this module) reduces some parameter
    gradient: ``gradients.gradients_reduced`` of its ops' :func:`held` and :func:`partial` bytes,
    as ``predict`` tells from a plan (``costmodel.order.memory_order``)."""
    ops = [o for group in gradient_reducers(graph).values() for o in group]
    return gradients_reduced(graph, {o: size.get(held(o), 0) for o in ops}, {o: size.get(partial(o), 0) for o in ops})


def live_points(graph: Graph, *, early: bool, combines: bool = False, unreduced: Graph | None = None
                ) -> LivePoints:
    """Distinct live sets (tensor names in graph order, then the running op's
    :func:`transient`), one per schedule point, in schedule order; ``early``: the shared
    conversions' spans as a breadth-first schedule places them
    (``Hardware.breadth_first_schedule``, :func:`~autolayout.costmodel.sharing.spans`);
    ``combines``: ``Hardware.combines_gradient_reductions``, whose combined all-reduces add the
    :func:`combined` names (``costmodel.combine.held_pairs``). ``unreduced``: the graph in the
    order of a layout that reduces no gradient (``memory_order(..., gradients_reduced=False)``),
    where it is not ``graph``: the points of both, each guarded by its order
    (:class:`LivePoints`)."""
    if unreduced is None or unreduced is graph:
        return _live_points(graph, early=early, combines=combines)
    reduced, other = (_live_points(g, early=early, combines=combines) for g in (graph, unreduced))
    mine, theirs = set(reduced), set(other)
    points = [p for p in reduced] + [p for p in other if p not in mine]
    guards = [None if p in theirs else True for p in reduced] + [False for p in other if p not in mine]
    return LivePoints(points, reduced.outputs, reduced.arguments, guards, graph)


def _live_points(graph: Graph, *, early: bool, combines: bool) -> LivePoints:
    gradients = combined_reductions(graph) if combines else {}
    points_after = combined_point(graph) if combines else {}
    split = split_reductions(graph)
    moved = collective_points(graph)
    late: dict[tuple[str | None, int], list[tuple[str, tuple[str, ...]]]] = {}  # collectives run after a later unit
    for o, (loop, k, gone) in moved.items():
        late.setdefault((loop, k), []).append((o, gone))
    deferred = deferred_reductions(graph, combines)
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
            # the collective of a split reduction the order runs after this op (phases.collective_points)
            add([n for n in live if n not in set(gone)], None, (), freed, (partial(o),) + tuple(waiting_at.get(o, ())),
                combining=False)
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
                add(live, None, (), copies_at(None, i, False), (partial(o),) + tuple(waiting_at.get(o, ())),
                    combining=False)
    if at is not None and isinstance(units[at[0]], Loop):  # after a scan
        i, gone, ops = at[0], set(at[1]), gradients[None][1]
        live = [n for n in alloc if alloc[n] <= i <= free[n] and n not in gone]
        add(live, None, ops[:-1], copies_at(None, i, False), (partial(ops[-1]),), combining=False)
    return LivePoints(points, whole_call_outputs(graph), step_arguments(graph))


def peak_of(points: Sequence[Sequence[str]], size: Mapping[str, int]) -> tuple[int, int]:
    """``(peak bytes, index of the first point reaching it)`` for per-tensor ``size``: at each
    point its live bytes plus, where ``points`` are :class:`LivePoints` with outputs allocated
    for the whole call, ``outputs.unplaced_output_bytes`` of those not live there (not yet
    written), as ``predict`` counts them."""
    outputs = getattr(points, "outputs", frozenset())
    if not outputs and not getattr(points, "combined", False):
        return live_peak_of(points, size)
    best, at = -1, 0
    for i in indices_of(points, size):
        total = total_at(points, size, i)
        if total > best:
            best, at = total, i
    return max(best, 0), at


def total_at(points: Sequence[Sequence[str]], size: Mapping[str, int], i: int) -> int:
    """The bytes :func:`peak_of` counts at point ``i``: its live bytes, plus the unplaced bytes
    of the outputs allocated for the whole call not yet written there (:class:`LivePoints`), less
    the temporaries the free buffers of copied parameters hold there (:func:`donor`)."""
    total = sum(size.get(n, 0) for n in points[i])
    # the buffers of the parameters XLA copies, free there (donor): they hold temporaries and add nothing
    donors = [b for n in points[i] if is_donor(n) and (b := size.get(param_copy(n[len(_DONOR):]), 0))]
    if getattr(points, "outputs", frozenset()) or donors:
        temps, free = points.split()[i]
        free_bytes = [size.get(o, 0) for o in free]
        if any(free_bytes) or donors:
            total += unplaced_output_bytes([b for n in temps for b in _buffers(n, size)], free_bytes + donors)
            total -= sum(donors)
    return total


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
    live sums' peak (:func:`live_peak_of`), the smaller of the two orders' where
    :class:`LivePoints` have two (``size`` does not say which order a layout takes)."""
    if not getattr(points, "two_orders", False):
        return live_peak_of(points, size)[0]
    return min(max((sum(size.get(n, 0) for n in points[i] if not is_layout_sized(n)) for i in points.indices(order)),
                   default=0) for order in (True, False))


def indices_of(points: Sequence[Sequence[str]], size: Mapping[str, int]) -> Sequence[int]:
    """The points of the layout whose bytes are ``size`` (:meth:`LivePoints.order_of`)."""
    if getattr(points, "two_orders", False):
        return points.indices(points.order_of(size))
    return range(len(points))
