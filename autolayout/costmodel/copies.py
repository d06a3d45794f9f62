"""XLA:CPU's dot operand copies in peak memory: where a contraction's copy of an operand it
cannot read in place (:mod:`autolayout.costmodel.dotcopy`; its bytes are
``reductions.operand_copy_bytes``) is live. :func:`copy_spans` places the copies of values computed
in the step, from the value's producer to their dots, and of the step's arguments from its
start, for ``memory.peak_memory`` and the search's live sets (``search/liveness.py``);
:func:`copy_transient_bytes` charges the others while their dot runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Mapping

from autolayout.costmodel.broadcasts import ynn_reduction
from autolayout.costmodel.dotcopy import accepted_orders, canonical_dims
from autolayout.costmodel.lifetimes import body_lifetimes, in_place_operand, lifetimes, readers_of
from autolayout.costmodel.reshapes import hlo_groups
from autolayout.costmodel.sharing import shared_reads
from autolayout.fusion import duplicable, reduction
from autolayout.graph import Graph, Loop, Op

__all__ = ["copy_spans", "switched_copies", "CopySwitch", "copy_switch", "switched_on", "live_switched_copies",
           "splits_contraction", "copy_span_bytes", "copy_transient_bytes"]


def copy_transient_bytes(graph: Graph, name: str, copies: tuple[int, ...]) -> int:
    """The bytes of operand copies (:func:`operand_copy_bytes`, ``copies``) that contraction
    ``name`` holds while it runs beside its operands' originals.

    Only the copies of operands that :func:`copy_spans` does not place (a value it does not
    materialise, read by a dot it fuses). Where the dot is the original's last reader
    (:func:`lifetimes`, :func:`body_lifetimes`), the copy takes the original's place at the dot
    and adds nothing there; where the original outlives the dot the copy is live beside it while
    the dot runs. Values computed in the step have their copies placed by :func:`copy_spans`, from
    their producer to their dots, and arguments (and values from outside a loop body) from the
    computation's start."""
    if not copies or not any(copies):
        return 0
    outlives = _copy_outlives(graph).get(name, ())
    early = _copy_groups(graph)[0]
    return int(sum(b for k, (b, live) in enumerate(zip(copies, outlives)) if live and (name, k) not in early))


@lru_cache(maxsize=256)
def _copy_outlives(graph: Graph) -> dict[str, tuple[bool, ...]]:
    """For every contraction of two operands, per operand: whether its original is live after
    the op runs (:func:`copy_transient_bytes`)."""
    units, alloc, free = lifetimes(graph)
    unit_of = {u: i for i, u in enumerate(units) if not isinstance(u, Loop)}
    out: dict[str, tuple[bool, ...]] = {}
    for lp in graph.loops.values():
        i = next(k for k, u in enumerate(units) if isinstance(u, Loop) and u.name == lp.name)
        order, last = body_lifetimes(graph, lp)
        for n in lp.body:
            op = graph.op(n)
            if op.kind == "einsum" and len(op.inputs) == 2:
                out[n] = tuple((last[t] > order[n]) if t in order else (t in free and free[t] >= i)
                               for t in op.inputs)
    for n, i in unit_of.items():
        op = graph.op(n)
        if op.kind == "einsum" and len(op.inputs) == 2:
            out[n] = tuple(t in free and free[t] > i for t in op.inputs)
    return out


def copy_spans(graph: Graph) -> dict[str | None, tuple[tuple[str, int, int, int], ...]]:
    """Per computation (``None``: the top level; a loop's name: its body), the dot operand copies
    that take memory of their own before their dot: ``(op, operand index, first position, last
    position)``, each holding the bytes of ``op``'s copy of that operand
    (:func:`operand_copy_bytes`: 0 where the layout lets the dot read it in place), positions
    as in :func:`lifetimes` / :func:`body_lifetimes`. ``peak_memory`` and the search's live sets
    (``search/liveness.py``) both place copies with this (one rule).

    The rule, from XLA:CPU's optimized HLO and buffer assignment (``benchmarks/xla_live.py``:
    ``equinox_block-donated`` ZeRO-3, ``top2_moe-donated`` ZeRO-3, ``nnx_llama-donated``,
    ``linen_gpt-donated``; ``tests/test_memory_rules.py``): ``DotDecomposer`` puts a transpose
    before a dot whose operand is not in an order it reads in place
    (:func:`~autolayout.costmodel.dotcopy.accepted_orders`); layout assignment makes it a
    ``copy``, which the fusion passes fuse with the operand's producer (a duplicate of an
    element-wise producing fusion, reading the producer's operands: ``copy_bitcast_fusion``,
    ``transpose_copy_fusion``), and the scheduler puts it right after the producer; CSE leaves
    one copy for the dots that read the same order; each buffer lives to its last reader. So
    for a materialised value produced in the same computation (not an argument of the step, nor
    a value from outside a loop body), its readers are grouped by the order they read it in:
    contractions whose accepted orders meet share a buffer; every other reader (and the caller,
    for an output) reads the original, in its own order. The model's lifetime of the value
    (producer to last reader) is the buffer of the group read last; each other group adds a
    buffer from the producer to its last reader, of the bytes of its dot's copy, or, for the
    original's group, of the copy the last group reads (0 where the layout lets that dot read
    the value in place). Both are linear in the layout: a copy's bytes depend only on its
    operand's dims. The grouping is by the orders of the dims at full size (a layout that
    leaves a dim of size 1 on a device may let a dot read in place: its copy's bytes are then
    0). Where contractions read an element-wise value in two orders and the value takes over an
    operand's buffer (:func:`in_place_operand`), its copy is computed from that operand by a
    second fusion, so the operand is still live where the value is produced: one more buffer of
    the copy's bytes there (the operand has the value's shape and dtype). That holds where XLA
    recomputes the value in the copy's fusion; where it writes the value once and the copy reads
    it (:func:`_copy_reads_value`: a value it may not duplicate that a dot reads with no bitcast
    between them, as a rematerialised layer's ReLU backward select of two recomputed
    contractions), the copy is a fusion of its own after the value's producer, so every copy of
    the value is placed from the op after that producer, and no operand is held for it
    (``tests/test_copies.py``, against the optimized HLO and ``memory_analysis()``). Which of the
    two XLA does can depend on the layout: a contraction whose contracted dim the layout splits
    is not collapsed past its collective (:func:`~autolayout.costmodel.reshapes.hlo_groups`'
    ``split``), so a value sunk into the dots' collapsed shape without the split is computed
    through a bitcast with it, and recomputed in its copy. Where that is so, the copies are
    placed here from the op after the producer, and the producer's own position is
    :func:`switched_copies`' (live there under the layouts :func:`switched_on` says).

    A value there for the whole computation (a step argument at the top level; in a loop body, a
    value from outside it) has its copies made at the computation's start: the copy's fusion
    reads nothing the computation computes, and XLA:CPU's breadth-first scheduler (the only
    backend that copies dot operands; ``sharing._ready_at``) runs such an instruction first. Its
    dots are grouped first by the conversion they read (``sharing.shared_reads``: the readers of
    one all-gather read one converted value; a dot reading it unconverted reads the original),
    then by order as above; each group of dots none of which reads the value in its own order has
    one copy (CSE), live from position 0 to the group's last dot. Measured: the attention weights
    of ``examples/nnx_llama.py`` (``[heads, d_kv, embed]`` read as ``[embed, heads * d_kv]``), whose
    ``copy_bitcast_fusion`` of the parameter runs at positions 36-42 of 192 and lives to the
    backward's dot (``tests/test_copies.py``)."""
    return _copy_groups(graph)[1]


def switched_copies(graph: Graph) -> dict[str | None, tuple[tuple[str, int, int, int], ...]]:
    """Per computation, the dot operand copies :func:`copy_spans` leaves out at one position (the
    value's producer's), as ``(op, operand index, position, position)``: live there exactly under
    the layouts :func:`switched_on` says for ``copy_switch(graph, op, k)``, which recompute the
    value in the copy's fusion (:func:`copy_spans`). ``peak_memory`` and the search's live sets
    both read this (one rule)."""
    return _copy_groups(graph)[2]


def splits_contraction(op: Op, axes: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether a layout that computes ``op`` with ``axes`` (its mesh axes per dim, by graph dim
    name, as ``OpPlan.axes``) splits a dim that contraction ``op`` contracts: its result is then
    partial sums that a collective reduces (``plan``'s ``out_steps``), which XLA reads as the
    dot's output reshaped back to the graph's dims (:func:`~autolayout.costmodel.reshapes.hlo_groups`)."""
    return op.kind == "einsum" and len(op.inputs) == 2 and any(axes.get(d.name) for d in op.reduced_dims)


@dataclass(frozen=True)
class CopySwitch:
    """What decides whether a copy of :func:`switched_copies` is live at its value's producer
    (:func:`switched_on`): ``value``, the element-wise value it copies; ``switches``, the
    contractions whose split alone changes whether XLA writes the value once and the copy reads
    it (:func:`_copy_reads_value` under ``hlo_groups``' split, one contraction at a time: where
    the layout splits several, as where it splits one of them, since ``ReshapeMover`` leaves
    uncollapsed every value any of them leaves uncollapsed); ``reads_unsplit``, whether it does
    with none split; ``reduced``, whether a reduction reads the value (``fusion.reduction``,
    from memory: ``lifetimes.readers_of``) that XLA may not duplicate (``fusion.duplicable``)."""

    value: str
    switches: frozenset[str]
    reads_unsplit: bool
    reduced: bool

    @property
    def layout_decides(self) -> bool:
        """Whether some layout reads the value and another recomputes it (else ``reads_unsplit``
        holds under every layout)."""
        return bool(self.switches) or (self.reduced and not self.reads_unsplit)


def copy_switch(graph: Graph, op: str, k: int) -> CopySwitch:
    """The :class:`CopySwitch` of the copy contraction ``op`` makes of its operand ``k``."""
    return _switch_of(graph, graph.op(op).inputs[k])


def switched_on(switch: CopySwitch, split, local_elements: int, ynn: bool) -> bool:
    """Whether a copy of :func:`switched_copies` is live at its value's producer under a layout
    that splits the contractions ``split`` (:func:`splits_contraction`) and gives the value
    ``local_elements`` on a device, on hardware making YNNPACK reductions (``ynn``:
    ``Hardware.ynn_reductions``). It is not where XLA writes the value once and the copy reads it:
    where :func:`_copy_reads_value` holds under the split, or where a reduction reads the value and
    is a YNNPACK fusion (``broadcasts.ynn_reduction``), which takes in no value XLA may not
    duplicate: XLA then writes it, and its other readers, the copy among them, read it
    (``InstructionFusion``'s globally unfusible producers: a producer whose operands outweigh it is
    duplicated into none of its users unless into all. Measured in XLA:CPU's optimized HLO and
    ``memory_analysis()``, jax 0.10.2: the programs of ``tests/test_copies.py`` with a
    ``v.sum((0, 1))`` output added, and the equinox block's MLP backward, whose ``dh`` the bias
    gradient's ``ynn_fusion`` reads, as its transposing copy does)."""
    reads = bool(switch.switches & frozenset(split)) != switch.reads_unsplit
    return not (reads or (switch.reduced and ynn_reduction(local_elements, ynn)))


@lru_cache(maxsize=256)
def _collapsed(graph: Graph) -> dict[str, dict[str, tuple[tuple[str, ...], ...]]]:
    """Per contraction whose result :func:`~autolayout.costmodel.reshapes.hlo_groups` collapses,
    the tensors whose groups change where the layout splits it (it among them), with those groups."""
    base = hlo_groups(graph)
    out = {}
    for op in graph.ops():
        if op.kind == "einsum" and len(op.inputs) == 2 and any(len(g) > 1 for g in base.get(op.name, ())):
            alone = hlo_groups.__wrapped__(graph, frozenset([op.name]))  # kept here, not in hlo_groups' cache
            out[op.name] = {t: g for t, g in alone.items() if g != base[t]}
    return out


@lru_cache(maxsize=4096)
def _switch_of(graph: Graph, t: str) -> CopySwitch:
    """The :class:`CopySwitch` of element-wise value ``t``."""
    full = graph.dims
    own = tuple(d.name for d in graph.tensor(t).shape if full[d.name] > 1)
    loop = graph.op(t).loop
    readers = [c for c in readers_of(graph)[t] if graph.op(c).loop == loop]
    reads = [_read(graph.op(c), t, 0, own, full) for c in readers]
    reads_unsplit = _copy_reads_value(graph, t, own, reads, full, hlo_groups(graph))
    switches = frozenset(c for c, changed in _collapsed(graph).items() if t in changed and _copy_reads_value(
        graph, t, own, reads, full, changed) != reads_unsplit)
    reduced = not duplicable(graph.op(t)) and any(reduction(graph.op(c)) for c in readers)
    return CopySwitch(t, switches, reads_unsplit, reduced)


@lru_cache(maxsize=256)
def _copy_groups(graph: Graph) -> tuple[frozenset, dict[str | None, tuple[tuple[str, int, int, int], ...]],
                                        dict[str | None, tuple[tuple[str, int, int, int], ...]]]:
    """``(operands whose copies copy_spans places, copy_spans, switched_copies)`` (:func:`copy_spans`)."""
    units, alloc, free = lifetimes(graph)
    readers = readers_of(graph)
    outputs = {o.tensor for o in graph.outputs if o.tensor}
    full = {d.name: d.size for op in graph.ops() for d in op.dims}
    placed: set[tuple[str, int]] = set()
    out: dict[str | None, list] = {}
    switched: dict[str | None, list] = {}  # switched_copies

    def place(loop: str | None, t: str, born: int, dies: int, pos: Mapping[str, int],
              gone: Mapping[str, int]) -> None:
        producer = graph.op(t)
        if producer.output.role in ("input", "param", "opt_state") or not producer.materialised:
            return
        own = tuple(d.name for d in producer.output.shape if full[d.name] > 1)
        # (position, op, operand index, the orders it reads in place); a reader outside the computation at its end
        reads = [_read(graph.op(c), t, pos[c], own, full) if c in pos else (dies, None, None, frozenset([own]))
                 for c in readers[t]]
        if not any(r[1] for r in reads):
            return
        if t in outputs:
            reads.append((dies, None, None, frozenset([own])))  # the caller's buffer: its own order
        groups = _order_groups(reads)  # reads that share a buffer: the original, or one copy
        placed.update((r[1], r[2]) for r in reads if r[1] is not None)
        if len(groups) == 1:
            return
        ends = [max(g, key=lambda r: r[0]) for g in groups]
        owner = max(range(len(groups)), key=lambda i: ends[i][0])
        spans = out.setdefault(loop, [])
        src = in_place_operand(graph, t, readers)
        copying = [e for e, g in zip(ends, groups) if e[1] is not None and not any(own in r[3] for r in g)]
        # the copies read t, written once: each is a fusion of its own after t's producer
        # (:func:`_copy_reads_value`); else each recomputes t, from t's producer on. Where the
        # layout decides which (_switch_of), t's producer's position is switched_copies'
        sw = _switch_of(graph, t) if producer.kind == "elementwise" else None
        switches = sw is not None and sw.layout_decides
        start = born + 1 if sw is not None and (sw.reads_unsplit or switches) else born
        at_born = switched.setdefault(loop, []) if switches else spans
        if src in gone and gone[src] == born - 1 and copying and (start == born or switches):
            # the copy is a second fusion reading src: src outlives t's producer, beside t and the copy
            at_born.append((copying[0][1], copying[0][2], born, born))
        for i, g in enumerate(groups):
            if i == owner:
                continue
            in_place = any(own in r[3] for r in g)  # its buffer is the original: the owner's is a copy
            by = ends[owner] if in_place else ends[i]
            if by[1] is not None:
                spans.append((by[1], by[2], start, ends[i][0]))
                if switches:
                    at_born.append((by[1], by[2], born, born))

    sharing = shared_reads(graph)[0]

    def place_whole(loop: str | None, t: str, pos: Mapping[str, int]) -> None:
        # t is there for the whole computation: a copy per conversion and order, from its start (copy_spans)
        own = tuple(d.name for d in graph.tensor(t).shape if full[d.name] > 1)
        by_conversion: dict[str, list] = {}  # provider -> its group's reads (sharing.shared_reads)
        for c in readers.get(t, ()):
            if c in pos:
                by_conversion.setdefault(sharing.get((c, t), c), []).append(_read(graph.op(c), t, pos[c], own, full))
        for reads in by_conversion.values():
            for g in _order_groups(reads):
                if any(own in r[3] for r in g):
                    continue  # the reads of the original (or of its conversion) in place
                placed.update((r[1], r[2]) for r in g)
                end = max(g, key=lambda r: r[0])
                out.setdefault(loop, []).append((end[1], end[2], 0, end[0]))

    for lp in graph.loops.values():
        order, last = body_lifetimes(graph, lp)
        for n in lp.body:
            place(lp.name, n, order[n], last[n], order, last)
        outside = {t for n in lp.body for t in graph.op(n).inputs if t not in order}
        for t in sorted(outside):
            place_whole(lp.name, t, order)
    top = {u: i for i, u in enumerate(units) if not isinstance(u, Loop)}
    for n in alloc:
        place(None, n, alloc[n], free[n], top, free)
    for t in sorted(t.name for t in graph.tensors() if t.role in ("input", "param", "opt_state")):
        place_whole(None, t, top)
    return frozenset(placed), {k: tuple(v) for k, v in out.items()}, {k: tuple(v) for k, v in switched.items()}


def _read(op, t: str, at: int, own: tuple[str, ...], full: Mapping[str, int]) -> tuple:
    """How ``op``, at position ``at``, reads ``t`` (whose dims of size > 1 are ``own``, in order):
    ``(at, op, operand index, the orders it reads in place)`` for a contraction of two operands
    reading it once (:func:`~autolayout.costmodel.dotcopy.accepted_orders`), else
    ``(at, None, None, {own})``: any other reader reads the original, in its own order."""
    ks = [k for k, x in enumerate(op.inputs) if x == t]
    if op.kind == "einsum" and len(op.inputs) == 2 and len(ks) == 1:
        return at, op.name, ks[0], accepted_orders(op, ks[0], full)
    return at, None, None, frozenset([own])


def _order_groups(reads: list) -> list[list]:
    """Reads ``(position, op, operand index, orders read in place)`` grouped by the buffer they read,
    in the order they run: a read joins the first group holding a read whose orders meet its own
    (one copy, or the original, for the dots that read one order: XLA's CSE)."""
    groups: list[list] = []
    for r in sorted(reads, key=lambda r: r[0]):
        hit = next((g for g in groups if any(r[3] & x[3] for x in g)), None)
        if hit is None:
            groups.append([r])
        else:
            hit.append(r)
    return groups


def _copy_reads_value(graph: Graph, t: str, own: tuple[str, ...], reads: list, full: Mapping[str, int],
                      groups_of: Mapping[str, tuple]) -> bool:
    """Whether XLA:CPU writes element-wise ``t`` once, from its own fusion, and computes its dot
    operand copy from it (:func:`copy_spans`), rather than recomputing ``t`` in the copy's fusion
    from ``t``'s operands. It does where ``t`` is one XLA may not duplicate
    (:func:`~autolayout.fusion.duplicable`: it reads several operands of its size) and a
    contraction reading ``t`` in place reads the very array XLA computes ``t`` as, with no bitcast
    between them (its dims grouped as XLA computes it,
    :func:`~autolayout.costmodel.reshapes.hlo_groups`, are the groups the dot's canonical form
    reads: ``DotDecomposer``'s batch dims, free dims as one, contracting dims as one): that dot
    cannot fuse ``t``, so ``InstructionFusion`` does not duplicate it into the copy either. A
    reader through a bitcast is a loop fusion (``select_bitcast_fusion``), as the copy is
    (``copy_bitcast_fusion``), and XLA recomputes ``t`` in each (measured in XLA:CPU's optimized
    HLO, jax 0.10.2: ``tests/test_copies.py``). ``groups_of``: ``hlo_groups`` under the layout's
    split contractions."""
    if duplicable(graph.op(t)):
        return False
    groups = groups_of.get(t)
    return any(c is not None and own in orders and groups in _dot_operand_groups(graph.op(c), k, full)
               for _, c, k, orders in reads)


def _dot_operand_groups(op, k: int, full: Mapping[str, int]) -> set[tuple[tuple[str, ...], ...]]:
    """The groupings of operand ``k``'s dims (of size > 1) that contraction ``op``'s canonical form
    reads without a reshape (:func:`~autolayout.costmodel.dotcopy.canonical_dims`): each batch dim
    alone, then the free and the contracting dims as one group each, in either order where each is
    one dim (:func:`~autolayout.costmodel.dotcopy.accepted_orders`)."""
    batch, free, contract = canonical_dims(op, k, full)
    pair = [tuple(g) for g in ((free, contract) if k == 0 else (contract, free)) if g]
    single = [(d,) for d in batch]
    found = {tuple(single + pair)}
    if len(free) <= 1 and len(contract) <= 1:
        found.add(tuple(single + pair[::-1]))
    return found


def live_switched_copies(graph: Graph, split: frozenset[str], local_elements: Callable[[str], int],
                         ynn: bool) -> frozenset[tuple[str, int]]:
    """The ``(op, operand index)`` of the :func:`switched_copies` live at their values' producers
    under a layout that splits the contractions ``split`` and gives each value
    ``local_elements(value)`` on a device (:func:`switched_on`), for ``copy_span_bytes``."""
    out = set()
    for spans in switched_copies(graph).values():
        for n, k, _, _ in spans:
            sw = copy_switch(graph, n, k)
            if switched_on(sw, split, local_elements(sw.value), ynn):
                out.add((n, k))
    return frozenset(out)


def copy_span_bytes(graph: Graph, copies: Mapping[str, tuple[int, ...]],
                    switched: frozenset[tuple[str, int]] = frozenset()) -> dict[str | None, list]:
    """:func:`copy_spans` with the bytes of each copy (``copies[op][k]``), as ``(start, stop, bytes)``,
    and those of :func:`switched_copies` that ``switched`` holds (:func:`live_switched_copies`)."""
    out: dict[str | None, list] = {}
    always = copy_spans(graph)
    on = {loop: tuple(s for s in spans if (s[0], s[1]) in switched) for loop, spans in switched_copies(graph).items()}
    for loop in dict.fromkeys([*always, *on]):
        for n, k, start, stop in always.get(loop, ()) + on.get(loop, ()):
            b = copies.get(n, ())
            if len(b) > k and b[k]:
                out.setdefault(loop, []).append((start, stop, b[k]))
    return out
