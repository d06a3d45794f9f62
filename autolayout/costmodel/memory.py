"""Peak per-device memory by liveness over the schedule, as XLA allocates it.

The schedule is ``graph.schedule`` and each scan's ``body`` of the graph it is given: the
traced order, or on XLA:CPU the order of its breadth-first scheduler
(:func:`~autolayout.costmodel.order.memory_order`, which ``predict`` and the search both walk).

Every materialised tensor counts at its local (sharded) size; elementwise
intermediates fused into their consumers (``Op.hbm``) take none. Lifetimes follow
XLA's buffer assignment, whose ``memory_analysis()`` reports argument + output +
temp - alias bytes (``Execution.xla_memory_bytes``; ``benchmarks/memory_vs_xla.py``
holds the two side by side):

* arguments (inputs, parameters, optimizer state) are live for the whole step: the
  caller owns their buffers;
* outputs from their producer to the end; and before it, their allocations. XLA allocates
  the result buffers for the whole call and puts earlier temporaries into them (its buffer
  assignment takes buffers largest first and puts each temporary into the smallest output
  allocation at least its size holding nothing live at the same time; the rest share the temp
  heap; XLA's buffer-assignment dumps, ``--xla_dump_to``). At every point the model counts the
  outputs not yet written at their full size less the live temporaries they can hold there, one
  each, largest first into the smallest that fits and that it dies before (a temporary read by
  the op writing the output, or later, stays out of its allocation unless that op is element-wise
  and writes over it: ``benchmarks/memory_vs_xla.py --predict``'s 803 stored rows, 765 -> 769
  within 10%; the MoE forward's combine weights, read by the dot writing its output, 0.875 ->
  1.000) (``costmodel/outputs.py``:
  ``output_placement``, ``unplaced_output_bytes``): nothing where the temporaries fill them (activations no larger
  than the outputs: data-parallel layouts), the idle allocations where activations are larger
  (a step that does not donate its updated parameters and optimizer state, replicated or
  model-parallel). Point by point, that is the most XLA can reuse there (a lower bound on its
  figure, given the model's buffers): ``benchmarks/memory_vs_xla.py`` 60 -> 67 of 76 layouts
  within 10%, none leaving. It is not linear in the layout (which temporary fits which output
  depends on their local sizes): the search's rows hold the live sums and its solver cuts off a
  layout that meets them but not this (``search/liveness.py``, ``search/solver.py``).
  An output that reuses a donated argument's buffer (``graph.donated``, as
  ``jax.jit(donate_argnums=...)``) takes no bytes of its own: XLA counts that buffer once (``alias``).
  A donated parameter XLA copies (:mod:`~autolayout.costmodel.donations`) has the copy live from
  the step's start to its last reader, and its own buffer holds temporaries until the update, as
  an output allocation not yet written does, for temporaries that die before the update (a
  ``"donor"`` of :func:`_output_peak`);
* every other tensor lives from its producer to the last op that reads it from memory
  (a consumer fused into its own consumers, ``Op.hbm``, reads nothing itself: the op its
  value is fused into does), except that an element-wise op writes its result over an
  operand of the same shape and dtype read for the last time there (XLA shares the
  buffer: ``HloDataflowAnalysis::CanShareOperandBufferWithUser``, element-wise users; the same
  dims in another order where dots alone read the result, ``lifetimes._same_buffer``;
  :func:`~autolayout.costmodel.lifetimes.in_place_operand`; where contractions read that result in two orders on a backend
  that copies dot operands, the operand stays live beside it where the copy recomputes the result
  from it: :func:`~autolayout.costmodel.copies.copy_spans`).

A scan is one step of the schedule: its body adds the peak of one iteration's own tensors (an
iteration's temporaries are freed before the next). Its stacked outputs are loop state that
``jax.lax.scan`` initialises with a broadcast of a zero constant, live from that fill to their
last reader. XLA:CPU's breadth-first scheduler queues the fill right after the constant, which
has no operands: at the step's start, so a remat step whose peak is its loss, between the scans,
holds the backward's gradient stacks there (``tests/test_order.py``: 0.89 -> 0.97 of
``memory_analysis()``). In the traced order a stack exists from its scan. In XLA:GPU's memory
scheduler's order (``order.min_memory``) each fill is an instruction of its own that the
scheduler places (``Graph.stack_fills`` of the view): its list scheduler runs the backward scan's
fills before the forward scan where they define less than what is ready there (gpt-350m-remat
fills all five so, llama-1b-remat four of six: ``reports/gpu/hlo.zip``; the model 0.880 -> 0.983
and 0.922 -> 0.984 of ``memory_analysis()``), its DFS right before the scan. Its
carried values are the loop state, one buffer that XLA's ``while`` shares between its operand,
the body's parameter and root and its result
(``HloDataflowAnalysis``: a while's output aliases its operand; copy insertion adds a
copy only where a value is still needed after): the body counts it while the loop runs,
the final carry (the scan's result) takes memory only from its own unit after the loop,
and an initial value that the scan reads last becomes the loop state (it is freed before
the scan, as an element-wise op's operand is). Inside the body, element-wise ops chained in
place over the carried value (a residual stream) write into the loop state's buffer too and
take none of their own (:func:`~autolayout.costmodel.lifetimes.loop_state_chain`). While an op runs
it also holds ``reductions.ReductionBytes.transient``, and a contraction on a backend that copies dot
operands (``Hardware.dot_operand_copies``: XLA:CPU) the copies of its operands whose originals
outlive it: from the operand's producer to the dot for a value computed in the step, from the
step's start for an argument (:func:`~autolayout.costmodel.copies.copy_spans`), at the dot for
a value fused into it (:func:`~autolayout.costmodel.copies.copy_transient_bytes`).

A contraction (or reduction) whose output is partial runs as two instructions, the dot writing
the partial sums while its inputs are live, then the collective writing the reduced result, and
buffer assignment frees an input the dot read for the last time before that result is allocated:
an op of :func:`~autolayout.costmodel.phases.split_reductions` counts the larger of
``inputs + partial sums`` and ``partial sums
+ result`` (``tests/test_memory_phases.py``: XLA:CPU's temp heap of ``psum(tanh(x) @ w)``),
the collective's phase where the order runs it: at the op, or right after a later unit
(:mod:`~autolayout.costmodel.phases`, ``phases.collective_points``). A
reduce-scatter's relayout copy is an instruction of its own between the two, so the contraction's
phase holds ``reductions.ReductionBytes.contraction`` and the collective's the copy too
(``reductions.ReductionBytes.partial``).

On a backend that reduces a step's parameter gradients together
(``Hardware.combines_gradient_reductions``: XLA:CPU), every op that may reduce a parameter's
gradient counts its contraction's phase alone where it runs, and the reduction is a point of its
own, where XLA's scheduler runs it (:mod:`autolayout.costmodel.gradients`). The combiner merges other
all-reduces that do not depend on one another too (a split ``d_model``'s q, k and v
projections): which do depends on the layout, and ``peak_memory``'s ``groups``
(:func:`~autolayout.costmodel.combine.combined_all_reduces`) hold their partial sums the same
way (the members' results are written at the last's collective phase where it is an op of
:func:`~autolayout.costmodel.phases.split_reductions`: ``tests/test_memory_phases.py``). The
breakdown is taken at the peak: ``params``, ``opt_state``, ``grads`` (the parameters'
gradients) and ``activations`` (everything else: inputs, saved activations,
temporaries, outputs that are not parameters or optimizer state), and ``transient``
(held bytes included); the categories come from ``graph.param_roles``.

Every tensor counts at :func:`stored_itemsize` bytes an element: its dtype's, except that a
backend that runs half-precision dots in float32 (``Hardware.upcasts_half_dots``: XLA:CPU) holds
the bfloat16 operands of a contraction and an einsum's result in float32 buffers.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Mapping

from autolayout.costmodel.bitcasts import kept_spans
from autolayout.costmodel.broadcasts import broadcast_spans
from autolayout.costmodel.donations import param_copy_spans
from autolayout.costmodel.copies import copy_span_bytes
from autolayout.costmodel.gradients import combined_point, combined_reductions, deferred_reductions, gradient_bytes
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.lifetimes import body_lifetimes, lifetimes, schedule_points
from autolayout.costmodel.outputs import (copies_as_one_buffer, output_placement, output_writes, partial_buffers,
                                          step_arguments, unplaced_output_bytes, whole_call_outputs)
from autolayout.costmodel.phases import pending_bytes, pending_spans, Phases, after_bytes, after_points
from autolayout.costmodel.plan import grad_of
from autolayout.costmodel.recomputed import recomputed_spans
from autolayout.costmodel.reductions import FLOAT32_BYTES, HALF, upcasts
from autolayout.costmodel.sharing import gather_buffer_spans, replaced_by_copy, spans as shared_spans
from autolayout.graph import Graph, Loop, Op

__all__ = ["PeakBuffer", "peak_memory", "stored_itemsize", "stored_bytes"]


@dataclasses.dataclass(frozen=True)
class PeakBuffer:
    """One buffer live at the predicted peak (``Cost.peak_buffers``): a tensor by its graph name, or
    a buffer the model adds by its kind in angle brackets (``<copy>``: a dot operand's copy,
    ``<param-copy>``: XLA's copy of a donated parameter, ``<transient>``: what the running op holds,
    ``<held>``: partial sums waiting for a combined all-reduce, ``<unwritten OUTPUT>``: an output's
    allocation, for the whole call, less the temporaries it holds there; ``<temporaries in donated
    buffers>``, negative: the bytes temporaries take in donated arguments' buffers, which hold
    them). ``category``: the breakdown's (``Cost.memory``); per category the bytes add up to it."""

    name: str
    category: str
    bytes: int

    def __repr__(self) -> str:
        return f"{self.name}:{self.bytes}B"


def _categories(graph: Graph) -> dict[str, str]:
    grads = {g for g in (grad_of(graph, t.name) for t in graph.params()) if g}
    out = {}
    for t in graph.tensors():
        out[t.name] = ("params" if t.role == "param" else "opt_state" if t.role == "opt_state"
                       else "grads" if t.name in grads else "activations")
    return out


def stored_itemsize(graph: Graph, name: str, hardware: Hardware) -> int:
    """Bytes per element that tensor ``name`` takes in memory on ``hardware``: its dtype's,
    except that where ``hardware.upcasts_half_dots`` (XLA:CPU) a half-precision tensor that a
    contraction (an einsum of two operands) reads or that an einsum writes is held in float32:
    the backend runs the op in float32 on float32 converts of its operands (the convert is
    fused into the operand's producer, so the float32 buffer takes the half tensor's place) and
    writes a float32 result that a convert rounds back to the half dtype in its consumers
    (:data:`~autolayout.costmodel.hardware.SRC_CPU_HALF_DOTS`). Arguments and outputs of the
    step keep their dtype: the caller's buffers are what they are.

    ``predict`` (:func:`stored_bytes`) and the search's memory rows
    (``search.tables.Tables.tensor_bytes``) both size tensors with this (one rule)."""
    t = graph.tensor(name)
    return FLOAT32_BYTES if hardware.upcasts_half_dots and name in _half_dot_tensors(graph) else t.itemsize


@lru_cache(maxsize=256)
def _half_dot_tensors(graph: Graph) -> frozenset[str]:
    """The half-precision tensors, neither arguments nor outputs, that a contraction reads or
    an einsum writes (:func:`stored_itemsize`)."""
    outputs = {s.tensor for s in graph.outputs if s.tensor}
    out = set()
    for t in graph.tensors():
        if t.dtype not in HALF or t.role in ("input", "param", "opt_state") or t.name in outputs:
            continue
        read = any(upcasts(graph.op(c)) for c in graph.consumers(t.name) if len(graph.op(c).inputs) >= 2)
        if read or upcasts(graph.op(t.name)):
            out.add(t.name)
    return frozenset(out)


def stored_bytes(graph: Graph, local_bytes: Mapping[str, int], hardware: Hardware) -> dict[str, int]:
    """Every tensor's bytes in memory on ``hardware``, from a plan's ``local_bytes`` (at each
    tensor's dtype) and :func:`stored_itemsize`."""
    out = {}
    for n, b in local_bytes.items():
        t = graph.tensor(n)
        out[n] = b if not b else b * stored_itemsize(graph, n, hardware) // t.itemsize
    return out


def peak_memory(graph: Graph, size: Mapping[str, int], temps: Mapping[str, int] | None = None,
                held: Mapping[str, int] | None = None,
                copies: Mapping[str, tuple[int, ...]] | None = None,
                gathered: Mapping[str, Mapping[str, int]] | None = None, *, early: bool,
                groups: Mapping[str | None, tuple] | None = None,
                partials: Mapping[str, int] | None = None, combines: bool = False,
                kept: Mapping[str, int] | None = None, broadcasts: Mapping[tuple[str, str], int] | None = None,
                recomputed: Mapping[tuple[str, str], int] | None = None,
                temp_parts: Mapping[str, tuple[int, ...]] | None = None,
                param_copies: Mapping[str, int] | None = None,
                relayouts: Mapping[str, int] | None = None,
                gather_buffers: Mapping[str, Mapping[str, int]] | None = None,
                switched: frozenset[tuple[str, int]] = frozenset()) -> tuple[int, dict, tuple[PeakBuffer, ...]]:
    """``(peak bytes, breakdown at the peak, the buffers live there)`` (:class:`PeakBuffer`, largest
    first; their bytes add up to the peak) given every tensor's local bytes ``size``
    (a plan's ``local_bytes``: 0 for elementwise intermediates fused into their consumers),
    the transient bytes ``temps[op]`` an op holds while it runs (inputs it gathered), the
    bytes ``held[op]`` a gradient-reducing op holds until its computation's combined
    reduction (``reductions.ReductionBytes.held``; :mod:`~autolayout.costmodel.gradients`) and the operand copies
    ``copies[op]`` of a contraction (``reductions.operand_copy_bytes``), live from the operand's
    producer to the op where :func:`~autolayout.costmodel.copies.copy_spans` says so (counted as ``activations``),
    and the converted copies ``gathered[op][tensor]`` an op makes for later readers too, or early
    (``OpCost.span_bytes``), live from where the schedule runs the conversion to the last of them
    (:func:`~autolayout.costmodel.sharing.spans`; ``early``: ``Hardware.breadth_first_schedule``,
    a top-level value there throughout converted at the step's start; counted as ``transient``),
    and ``groups``, the other combined all-reduces
    (:func:`~autolayout.costmodel.combine.combined_all_reduces`: per computation, ``(position,
    ops)``), whose ops hold ``held[op]`` there too. ``partials[op]``: the bytes its reduction
    holds (``reductions.ReductionBytes.partial``); an op of
    :func:`~autolayout.costmodel.phases.split_reductions` with some (whose ``temps`` are
    its contraction's, ``reductions.ReductionBytes.contraction``, as for ``gradients.deferred_reductions``'s)
    counts the larger of its two phases, ``live - output + temps`` (the contraction writes its
    partial sums; the result is not allocated yet) and ``live - last reads - conversions and
    copies freed there + partials`` (the collective); ``combines``
    (``Hardware.combines_gradient_reductions``): an op of ``gradients.deferred_reductions`` counts
    the contraction's phase alone, and the combined reduction counts where it runs, right after
    a unit (``gradients.combined_point``: that unit's last reads and the conversions and copies
    freed there gone, ``gradients.gradient_bytes`` held). ``kept[tensor]``: the bytes of a renamed
    tensor whose renames are bitcasts (``costmodel.bitcasts``), live past its own last reader to
    theirs (``bitcasts.kept_spans``, counted as ``activations``). ``broadcasts[value, reader]``: the
    bytes of the broadcast of a value XLA writes to memory (``broadcasts.broadcast_spans``, as
    ``activations``). ``recomputed[source, value]``: the bytes of a source kept alive past its own
    last reader because ``value`` is recomputed from it (``recomputed.recomputed_spans``, as
    ``activations``; 0 where the layout writes the value). ``temp_parts[op]``: the buffers
    ``temps[op]`` is made of (``OpCost.running_parts`` and the operand copies at the dot), each
    placed on its own in an output allocation not yet written (:func:`_output_peak`).
    ``param_copies[param]``: the bytes of XLA's copy of a donated parameter
    (``donations.param_copy_spans``, counted as ``params``; absent where it is updated in place).
    ``relayouts[op]``: the relayout copy in ``partials[op]`` (``reductions.ReductionBytes.relayout``), placed apart.
    ``gather_buffers[op][tensor]``: the float32 buffer of the all-gather of a converted copy of
    ``gathered`` (``reductions.half_gathers``), live where the conversion runs. A copy that takes
    its tensor's place (``sharing.replaced_by_copy``) counts less the tensor's bytes. ``switched``: the
    copies of ``copies.switched_copies`` live at their values' producers under the layout
    (``copies.live_switched_copies``)."""
    temps = temps or {}
    held = held or {}
    phases = Phases(graph, size, partials or {}, deferred_reductions(graph, combines))
    replaced = replaced_by_copy(graph)
    gathered = {prov: {t: (max(b - size.get(t, 0), 0) if (prov, t) in replaced else b)
                       for t, b in copies_of.items()} for prov, copies_of in (gathered or {}).items()}
    spans = _spans(graph, copies or {}, gathered, early, kept or {}, broadcasts or {}, recomputed or {},
                   param_copies or {}, gather_buffers or {}, switched)
    pending = {}  # partial sums waiting for a later collective (phases.pending_spans)
    for loop, group in pending_spans(graph).items():
        for op, _, start, stop in group:
            b = pending[op] = pending_bytes((partials or {}).get(op, 0), (relayouts or {}).get(op, 0), size.get(op, 0))
            if b:
                spans.setdefault(loop, []).append((start, stop, b, "partial"))
    combined: dict[str | None, tuple] = {k: tuple(gs) for k, gs in (groups or {}).items()}
    points = combined_point(graph) if combines else {}  # the gradients' combined reduction, after a unit
    units, alloc, free = lifetimes(graph)

    def held_at(loop: str | None, op: str) -> list[tuple[str, int]]:  # a moved collective's combined group
        seq = units if loop is None else graph.loops[loop].body
        return _held_at(combined.get(loop, ()), seq, seq.index(op), held)

    # points right after a unit: the gradients' combined reduction, the collectives the order runs late
    relayouts = relayouts or {}
    after = after_points(graph, partials or {}, held_at,
                         {loop: (*points[loop], gradient_bytes(ops, held, partials or {}, relayouts))
                          for loop, (_, ops) in combined_reductions(graph).items() if loop in points}, relayouts,
                         pending)
    whole = _output_peak(graph, size, temps, held, units, alloc, free, spans, combined,
                         phases, after, temp_parts or {}, relayouts)  # outputs allocated for the whole call
    if whole is not None:
        return whole
    waiting = _waiting(combined.get(None, ()), units, held)
    end = len(units)
    # sweep: +size at allocation, -size after the last use
    delta = [0] * (end + 2)
    for n in alloc:
        delta[alloc[n]] += size[n]
        delta[free[n] + 1] -= size[n]
    for (start, stop, b, _) in spans.get(None, ()):
        delta[start] += b
        delta[stop + 1] -= b
    best, best_at, running = -1, 0, 0
    runs, bodies = [], {}
    peak_after = None  # (freed, buffers) where the peak is a point right after unit best_at (after_points)
    for i, u in enumerate(units):
        running += delta[i]
        runs.append(running)
        total = running
        if isinstance(u, Loop):
            bodies[i] = _body_peak(graph, u, size, temps, _waiting(combined.get(u.name, ()), u.body, held),
                                   spans.get(u.name, ()), phases, after.get(u.name, ()))
            total += bodies[i][0]
        else:
            total += temps.get(u, 0) + waiting.get(i, 0)
            if phases.listed(u):
                total = max(phases.totals(u, total, running, waiting.get(i, 0), spans.get(None, ()), i))
        if total > best:
            best, best_at, peak_after = total, i, None
        for at, gone, bufs in after.get(None, ()):
            if at == i:
                there = after_bytes(running, size, gone, spans.get(None, ()), i) + sum(b for _, b in bufs)
                if there > best:
                    best, best_at, peak_after = there, i, (gone, bufs)
    live = [n for n in alloc if alloc[n] <= best_at <= free[n]]
    category = _categories(graph)
    unit = units[best_at] if units else None
    if peak_after is not None:  # a point right after unit best_at (after_points)
        gone = set(peak_after[0])
        live, body_live, transient = [n for n in live if n not in gone], [], sum(b for _, b in peak_after[1])
        here = _copies_at(spans.get(None, ()), best_at, False)
    elif isinstance(unit, Loop):
        body_live, body_op, body_at, transient, body_freed = bodies[best_at][1:]
        here = _copies_at(spans.get(None, ()), best_at) + _copies_at(spans.get(unit.name, ()), body_at,
                                                                     not body_freed)
    else:
        body_live, ending = [], True
        transient = temps.get(unit, 0) + waiting.get(best_at, 0)
        if phases.listed(unit):
            live, transient, ending = phases.at_peak(unit, live, transient, runs[best_at], waiting.get(best_at, 0),
                                                     spans.get(None, ()), best_at)
        here = _copies_at(spans.get(None, ()), best_at, ending)
    bufs = [PeakBuffer(n, category[n], size[n]) for n in live + list(body_live)]
    bufs += [_span_buffer(what, b) for what, b in here] + [PeakBuffer("<transient>", "transient", transient)]
    return _peak_result(best, bufs)


def _span_buffer(what: str, b: int) -> PeakBuffer:
    """The :class:`PeakBuffer` of a :func:`_spans` buffer or a running op's, by its kind."""
    return PeakBuffer(f"<{what}>", _SPAN_CATEGORY.get(what, "transient"), b)


def _peak_result(total: int, bufs: list[PeakBuffer]) -> tuple[int, dict, tuple[PeakBuffer, ...]]:
    """:func:`peak_memory`'s ``(peak, breakdown, buffers)`` from the buffers live at the peak: the
    breakdown is their bytes per category; the buffers without empty ones, largest first (then by name)."""
    breakdown = {"params": 0, "grads": 0, "opt_state": 0, "activations": 0, "transient": 0}
    for b in bufs:
        breakdown[b.category] += b.bytes
    return max(total, 0), breakdown, tuple(sorted((b for b in bufs if b.bytes), key=lambda b: (-b.bytes, b.name)))


def _waiting(groups, units, held: Mapping[str, int]) -> dict[int, int]:
    """``{position: bytes}``: the held bytes of a computation's combined reductions' ops, live
    at the position of each (the op running there counts its own in its transient bytes)."""
    out: dict[int, int] = {}
    for at, ops in groups:
        out[at] = out.get(at, 0) + sum(held.get(o, 0) for o in ops if o != units[at])
    return out


def _body_peak(graph: Graph, lp: Loop, size: Mapping[str, int], temps: Mapping[str, int],
               waiting: Mapping[int, int], spans=(), phases: Phases | None = None, after=()
               ) -> tuple[int, list, str | None, int, int, bool]:
    """Peak of one iteration's own tensors (carried values live for the whole iteration),
    with the transient bytes of the op running there (and the ``waiting`` held bytes of the
    body's combined reduction, and the operand copies ``spans`` of :func:`copy_span_bytes`; an op
    of ``phases`` in its larger phase); the live tensors, that op, its position, the transient
    bytes there and whether the peak is a collective's phase (spans ending there freed)."""
    order, last = body_lifetimes(graph, lp)
    end = len(lp.body)
    delta = [0] * (end + 2)
    for n in lp.body:
        delta[order[n]] += size[n]
        delta[last[n] + 1] -= size[n]
    for start, stop, b, _ in spans:
        delta[start] += b
        delta[stop + 1] -= b
    best, best_at, running, peak_after = 0, 0, 0, None
    runs = []
    for i in range(end):
        running += delta[i]
        runs.append(running)
        op = lp.body[i]
        total = running + temps.get(op, 0) + waiting.get(i, 0)
        if phases is not None and phases.listed(op):
            total = max(phases.totals(op, total, running, waiting.get(i, 0), spans, i))
        if total > best:
            best, best_at, peak_after = total, i, None
        for at, gone, bufs in after:  # points right after op i (phases.after_points)
            if at == i:
                there = after_bytes(running, size, gone, spans, i) + sum(b for _, b in bufs)
                if there > best:
                    best, best_at, peak_after = there, i, (gone, bufs)
    if not end:
        return best, [], None, 0, 0, False
    op = lp.body[best_at]
    live = [n for n in lp.body if order[n] <= best_at <= last[n]]
    if peak_after is not None:
        gone = set(peak_after[0])
        return best, [n for n in live if n not in gone], None, best_at, sum(b for _, b in peak_after[1]), True
    transient = temps.get(op, 0) + waiting.get(best_at, 0)
    ending = True
    if phases is not None and phases.listed(op):
        live, transient, ending = phases.at_peak(op, live, transient, runs[best_at], waiting.get(best_at, 0), spans,
                                                 best_at)
    return best, live, op, best_at, transient, not ending


def _output_peak(graph: Graph, size: Mapping[str, int], temps: Mapping[str, int], held: Mapping[str, int],
                 units, alloc: Mapping[str, int], free: Mapping[str, int],
                 spans: Mapping[str | None, list], combined: Mapping, phases: Phases,
                 after: Mapping, temp_parts: Mapping[str, tuple[int, ...]],
                 relayouts: Mapping[str, int]) -> tuple[int, dict, tuple[PeakBuffer, ...]] | None:
    """:func:`peak_memory` where the step has outputs allocated for the whole call
    (``outputs.whole_call_outputs``): at every point (a top-level unit, or a position in a scan's
    body), the bytes live there (as the sweep counts them: tensors, the running op's transient
    bytes, held bytes waiting for their combined reduction, the operand copies ``spans`` of
    :func:`copy_span_bytes` live there) plus ``outputs.unplaced_output_bytes`` of
    the outputs not yet written there (``combined``: the combined all-reduces' groups; ``after``:
    the points right after a unit, ``phases.after_points``), an op of
    ``phases`` in each of its two phases. The points are those of ``search.liveness.live_points``.
    A running op's transient bytes are the buffers of ``temp_parts[op]``, placed one by one.
    A copied parameter's own buffer (``("donor", parameter)``, :func:`_spans`) holds temporaries
    as an output allocation not yet written does (``outputs.OutputWrites``) and adds nothing.
    None without either."""
    outs = whole_call_outputs(graph)
    written = {o: alloc[o] for o in outs if o in alloc and size.get(o, 0) > 0}
    if not written and not any(isinstance(what, tuple) for group in spans.values() for *_, what in group):
        return None
    args = step_arguments(graph)
    writes = output_writes(graph)
    best: tuple | None = None  # (total, names, extras, free outputs, temporaries, free donated buffers, reuse)

    def point(i: int, names: list, extras: list[tuple[str, int]], unwritten: str | None = None) -> None:
        nonlocal best
        free_outs = [o for o, at in written.items() if at > i or o == unwritten]
        mine = sorted((what[1], b) for what, b in extras if isinstance(what, tuple))  # by parameter, as the search
        free_donors = [b for _, b in mine]
        extras = [(what, b) for what, b in extras if not isinstance(what, tuple)]
        # the temporaries there (a parameter's copy is live from the step's start: in no allocation freed later)
        tensors = [n for n in names if n not in args and n not in outs]
        others = [(what, b) for what, b in extras if what != "param-copy"]  # a running op's buffers, spans': no tensor
        keys = [f"\0{k}" for k in range(len(others))]  # no tensor's name
        placed = copies_as_one_buffer([(n, size[n]) for n in tensors] + [(k, b) for k, (_, b) in zip(keys, others)],
                                      {k: what[len(_REPLACING):] for k, (what, _) in zip(keys, others)
                                       if what.startswith(_REPLACING)})
        buffers = [b for _, b in placed]
        spanned = set(keys)
        reuse = writes.reuse([n if n not in spanned else "" for n, _ in placed], free_outs, [p for p, _ in mine])
        total = (sum(size[n] for n in names) + sum(b for _, b in extras)
                 + unplaced_output_bytes(buffers, [size[o] for o in free_outs] + free_donors, **reuse)
                 - sum(free_donors))
        if best is None or total > best[0]:
            best = (total, names, extras, free_outs, buffers, free_donors, reuse)

    def running(op: str | None) -> list[tuple[str, int]]:  # the op's transient bytes, buffer by buffer
        parts = temp_parts.get(op)
        if parts is None:
            return [("transient", temps.get(op, 0))]
        if sum(parts) != temps.get(op, 0):
            raise ValueError(f"peak_memory: the transient buffers of {op!r} {parts} do not add up to its "
                             f"transient bytes {temps.get(op, 0)}")
        return [("transient", b) for b in parts if b]

    for i, loop, j, op, live in schedule_points(graph):
        top = _copies_at(spans.get(None, ()), i)
        if loop is not None and op is None:  # an empty body
            point(i, list(live), top)
            continue
        body = () if loop is None else graph.loops[loop].body
        held_here = _held_at(combined.get(loop, ()), units if loop is None else body, i if loop is None else j, held)
        own = () if loop is None else _copies_at(spans.get(loop, ()), j)
        if phases.listed(op):  # the contraction's phase: its output as a temporary, an output's allocation unwritten
            point(i, [n for n in live if n != op], [("result:" + op, phases.result(op))] + running(op)
                  + ([] if op in phases.split else held_here) + top + list(own), op)
        else:
            point(i, list(live), running(op) + held_here + top + list(own))
        if op in phases.split and op not in phases.moved:  # the collective's phase of a split reduction (Phases)
            gone = set(phases.split[op])
            if loop is None:
                top = _copies_at(spans.get(None, ()), i, False)
            else:
                own = _copies_at(spans.get(loop, ()), j, False)
            point(i, [n for n in live if n not in gone],
                  [("transient", b) for b in partial_buffers(phases.partials.get(op, 0), relayouts.get(op, 0))]
                  + held_here + top
                  + list(own))
        for at, gone, bufs in after.get(loop, ()):  # points right after this op (phases.after_points)
            if at == (i if loop is None else j):
                top = _copies_at(spans.get(None, ()), i, loop is not None)
                own = () if loop is None else _copies_at(spans.get(loop, ()), j, False)
                point(i, [n for n in live if n not in set(gone)], list(bufs) + top + list(own))
    for i, gone, bufs in after.get(None, ()):
        if isinstance(units[i], Loop):  # right after a scan
            point(i, [n for n in alloc if alloc[n] <= i <= free[n] and n not in set(gone)],
                  list(bufs) + _copies_at(spans.get(None, ()), i, False))
    total, names, extras, free_outs, buffers, free_donors, reuse = best
    category = _categories(graph)
    bufs = [PeakBuffer(n, category[n], size[n]) for n in names]
    for what, b in extras:  # an op's result as a temporary (a phase of phases.Phases) by its op's name
        op = what.removeprefix("result:")
        bufs.append(PeakBuffer(op, category[op], b) if what.startswith("result:") else _span_buffer(what, b))
    # each output allocation not yet written counts what the temporaries it holds leave of it (a donor: less)
    left = [size[o] for o in free_outs] + list(free_donors)
    for b, k in zip(buffers, output_placement(buffers, left, **reuse)):
        if k is not None:
            left[k] -= b
    bufs += [PeakBuffer(f"<unwritten {o}>", category[o], b) for o, b in zip(free_outs, left)]
    bufs.append(PeakBuffer("<temporaries in donated buffers>", "params",
                           sum(left[len(free_outs):]) - sum(free_donors)))
    return _peak_result(total, bufs)


def _copies_at(spans, i: int, ending: bool = True) -> list[tuple[str, int]]:
    """The buffers of :func:`_spans` live at position ``i`` (``(kind, bytes)``, one buffer each);
    without those whose last reader runs there unless ``ending`` (a split reduction's collective
    phase, :class:`~autolayout.costmodel.phases.Phases`)."""
    return [(what, b) for start, stop, b, what in spans if start <= i <= stop and (ending or stop > i)]


def _spans(graph: Graph, copies: Mapping[str, tuple[int, ...]], gathered: Mapping[str, Mapping[str, int]],
           early: bool, kept: Mapping[str, int], broadcasts: Mapping[tuple[str, str], int],
           recomputed: Mapping[tuple[str, str], int], param_copies: Mapping[str, int],
           gather_buffers: Mapping[str, Mapping[str, int]],
           switched: frozenset[tuple[str, int]]) -> dict[str | None, list[tuple[int, int, int, str]]]:
    """Per computation, the buffers live over a span of positions ``(start, stop, bytes, kind)``:
    the dot operand copies of :func:`~autolayout.costmodel.copies.copy_span_bytes` (``"copy"``; those
    of ``copies.switched_copies`` that ``switched`` holds),
    the conversions shared by later readers (``sharing.shared_reads``, ``"gathered"``, and their
    all-gathers' float32 buffers where the conversion runs, ``sharing.gather_buffer_spans``), operands
    kept for renames that are bitcasts and sources kept for recomputed values
    (``bitcasts.kept_spans``, ``recomputed.recomputed_spans``, ``"kept"``) and broadcasts XLA
    writes (``broadcasts.broadcast_spans``, ``"broadcast"``), and XLA's copies of donated parameters
    with their own buffers until the update (``donations.param_copy_spans``, ``"param-copy"``,
    ``("donor", parameter)``); of the last four, those the layout gives bytes."""
    out = {k: [(*v, "copy") for v in vs] for k, vs in copy_span_bytes(graph, copies, switched).items()}
    replaced = replaced_by_copy(graph)
    for loop, group in shared_spans(graph, early).items():
        for prov, t, start, stop in group:
            b = gathered.get(prov, {}).get(t, 0)
            if b:  # a copy taking its value's place: one buffer with the value (outputs.copies_as_one_buffer)
                kind = _REPLACING + t if (prov, t) in replaced else "gathered"
                out.setdefault(loop, []).append((start, stop, b, kind))
    for loop, group in gather_buffer_spans(graph, early).items():
        for prov, t, start, stop in group:
            b = gather_buffers.get(prov, {}).get(t, 0)
            if b:
                out.setdefault(loop, []).append((start, stop, b, "gathered"))
    for loop, group in kept_spans(graph).items() if kept else ():
        for src, _, start, stop in group:
            if kept.get(src, 0):
                out.setdefault(loop, []).append((start, stop, kept[src], "kept"))
    for loop, group in broadcast_spans(graph).items() if broadcasts else ():
        for value, reader, start, stop in group:
            if broadcasts.get((value, reader), 0):
                out.setdefault(loop, []).append((start, stop, broadcasts[value, reader], "broadcast"))
    for loop, group in recomputed_spans(graph).items() if recomputed else ():
        for source, value, start, stop in group:
            if recomputed.get((source, value), 0):
                out.setdefault(loop, []).append((start, stop, recomputed[source, value], "kept"))
    for param, start, stop, written in param_copy_spans(graph) if param_copies else ():
        if param_copies.get(param, 0):
            out.setdefault(None, []).extend([(start, stop, param_copies[param], "param-copy"),
                                             (start, written, param_copies[param], ("donor", param))])
    return out


# the kind of a :func:`_spans` conversion whose copy takes the place of the value named after it
_REPLACING = "gathered:"
# the breakdown category of each kind of :func:`_spans` buffer (others: ``transient``)
_SPAN_CATEGORY = {"copy": "activations", "kept": "activations", "broadcast": "activations", "param-copy": "params"}


def _held_at(groups, units, i: int, held: Mapping[str, int]) -> list[tuple[str, int]]:
    """The held bytes of a computation's ops waiting at position ``i`` for a combined reduction
    there, one buffer each (:func:`_waiting` sums them)."""
    return [("held", held.get(o, 0)) for at, ops in groups if at == i for o in ops if o != units[i]]


