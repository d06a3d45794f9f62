"""The names of the search's live sets (``search/liveness.py``) beside the tensors: a running
op's transient bytes and their parts, a split reduction's partial sums, result, relayout copy and
pending sums, a gradient op's held bytes, the buffers that live over a span of schedule positions
(:data:`SPAN_KINDS`: dot operand copies, and those the layout puts at their value's producer,
shared conversions, kept operands, broadcasts, recomputed
sources, pending partial sums), the members of a combined all-reduce and XLA's copies of donated
parameters. Each is a string that no tensor name can be (it starts with a NUL), made and read
only by these functions; ``search.warm.sizes_of`` sizes them for a layout and
``search.model.LayoutModel.memory_expr`` makes them linear in its choices.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autolayout.costmodel.bitcasts import kept_spans
from autolayout.costmodel.broadcasts import broadcast_spans
from autolayout.costmodel.copies import copy_spans, switched_copies
from autolayout.costmodel.phases import pending_spans
from autolayout.costmodel.recomputed import recomputed_spans
from autolayout.costmodel.sharing import gather_buffer_spans, spans as shared_spans
from autolayout.graph import Graph

__all__ = ["transient", "is_transient", "transient_part", "is_transient_part", "TRANSIENT_PARTS", "held",
           "is_held", "partial", "is_partial", "result", "is_result", "relayout", "is_relayout", "pending",
           "copy", "is_copy", "copy_operand", "switched_copy", "gathered", "is_gathered", "gathered_tensor",
           "gather_buffer", "op_of",
           "combined", "is_combined", "kept", "is_kept", "kept_of", "broadcast", "is_broadcast",
           "broadcast_of", "recomputed", "is_recomputed", "recomputed_of", "SpanKind", "SPAN_KINDS",
           "span_kind", "param_copy", "is_param_copy", "donor", "is_donor", "donor_param", "is_layout_sized"]


_TRANSIENT = "\x00transient:"
_TRANSIENT_PART = "\x00transient-part:"
_HELD = "\x00held:"
_COPY = "\x00copy:"
_SWITCHED = "\x00switched-copy:"
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
_PENDING = "\x00pending:"
_GATHER_BUFFER = "\x00gather-buffer:"


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
    """The size key of the part of :func:`partial` ``op`` that is its relayout copy
    (``reductions.ReductionBytes.relayout``), which :func:`total_at` places apart; a live-set name
    too, at a later collective of the same unit (``phases.collective_sequence``: copied, not yet
    reduce-scattered)."""
    return _RELAYOUT + op


def is_relayout(name: str) -> bool:
    return name.startswith(_RELAYOUT)


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


def switched_copy(op: str, k: int) -> str:
    """The name under which a live set lists the copy of :func:`copy` ``(op, k)`` at its value's
    producer, where the layout decides whether XLA computes it there
    (:func:`~autolayout.costmodel.copies.switched_copies`: 0 bytes under the layouts that do not)."""
    return f"{_SWITCHED}{k}:{op}"


def is_copy(name: str) -> bool:
    return name.startswith(_COPY)


def copy_operand(name: str) -> int:
    """The operand index of a :func:`copy` name."""
    return _op_operand(_COPY, name)[1]


def _op_operand(prefix: str, name: str) -> tuple[str, int]:
    """``(op, operand index)`` of a :func:`copy` or :func:`switched_copy` name (``prefix``: its kind's)."""
    k, op = name[len(prefix):].split(":", 1)
    return op, int(k)


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


def gather_buffer(op: str, tensor: str) -> str:
    """The name under which a live set lists the float32 buffer of the all-gather of the copy
    :func:`gathered` names, where the conversion runs (``sharing.gather_buffer_spans``;
    ``reductions.half_gathers``: 0 bytes but for a half-precision value gathered in float32)."""
    return f"{_GATHER_BUFFER}{op}\x00{tensor}"


def pending(op: str) -> str:
    """The name under which a live set lists the partial sums of split reduction ``op`` waiting
    for its collective run after a later unit (``phases.pending_spans``, sized by
    ``phases.pending_bytes``)."""
    return _PENDING + op


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
             lambda n: _op_operand(_COPY, n), lambda t, op, k: t.copy_bytes(t.graph.op(op), k), _COPY),
    # that copy at its value's producer, where the layout's split contractions decide it is there
    SpanKind(lambda g, early: switched_copies(g), lambda op, k: (op, k), switched_copy,
             lambda n: _op_operand(_SWITCHED, n), lambda t, op, k: t.switched_copy_bytes(t.graph.op(op), k),
             _SWITCHED),
    # a conversion later readers share, live from where it runs to the last of them
    SpanKind(shared_spans, lambda op, tensor: (op, tensor), gathered, lambda n: (op_of(n), gathered_tensor(n)),
             lambda t, op, tensor: t.gathered_bytes(t.graph.op(op), tensor), _GATHERED),
    # that conversion's all-gather buffer, where it runs (a half-precision value gathered in float32)
    SpanKind(gather_buffer_spans, lambda op, tensor: (op, tensor), gather_buffer,
             lambda n: _parts(_GATHER_BUFFER, n), lambda t, op, tensor: t.gather_buffer_bytes(t.graph.op(op), tensor),
             _GATHER_BUFFER),
    # an operand kept alive by renames that are bitcasts (the first rename's layout decides)
    SpanKind(lambda g, early: kept_spans(g), lambda src, renames: (src, renames[0]), kept, lambda n: kept_of(n),
             lambda t, src, rename: t.kept_bytes(src, rename), _KEPT),
    # a broadcast XLA writes, at its reader's shape
    SpanKind(lambda g, early: broadcast_spans(g), lambda value, reader: (value, reader), broadcast,
             lambda n: broadcast_of(n), lambda t, value, reader: t.broadcast_bytes(reader), _BROADCAST),
    # a split reduction's partial sums waiting for its collective, run after a later unit
    SpanKind(lambda g, early: pending_spans(g), lambda op, _: (op,), pending, lambda n: (n[len(_PENDING):],),
             lambda t, op: t.pending_bytes(t.graph.op(op)), _PENDING),
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


def donor_param(name: str) -> str:
    """The parameter of a :func:`donor` name."""
    return name[len(_DONOR):]


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
    """The op of a :func:`transient`, :func:`held`, :func:`partial`, :func:`result`,
    :func:`relayout`, :func:`copy` or :func:`gathered` name."""
    if is_copy(name):
        return _op_operand(_COPY, name)[0]
    if is_gathered(name):
        return name[len(_GATHERED):].split("\x00", 1)[0]
    for prefix in (_HELD, _PARTIAL, _RESULT, _TRANSIENT, _RELAYOUT):
        if name.startswith(prefix):
            return name[len(prefix):]
    raise ValueError(f"op_of: {name!r} is not a name of an op's bytes")
