"""What an op holds in memory while it runs, beside the tensors: the inputs its plan converts for
it, the partial sums of its reduction and XLA:CPU's relayout copy of them, and the copies XLA:CPU
makes of a contraction's operands. ``rules.price`` fills an ``OpCost`` from these (one evaluation
of the rule per op, :func:`reduction_bytes`), and ``costmodel/memory.py``'s peak and the search's
memory rows read them from there.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from autolayout.core import Mesh
from autolayout.costmodel.dotcopy import operand_copy_elements
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.placement import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from autolayout.costmodel.plan import OpPlan
from autolayout.graph import Op

__all__ = ["ReductionBytes", "reduction_bytes", "HalfGathers", "half_gathers", "operand_copy_bytes", "upcasts", "HALF",
           "FLOAT32_BYTES"]

HALF = ("bfloat16", "float16")  # the half-precision dtypes (numpy names)
FLOAT32_BYTES = 4  # np.dtype("float32").itemsize


def upcasts(op: Op) -> bool:
    """Whether ``op`` is an einsum that a backend with ``Hardware.upcasts_half_dots`` runs in
    float32 on half-precision operands (``memory.stored_itemsize``)."""
    return op.kind == "einsum" and (op.output.dtype in HALF or any(d in HALF for d in op.input_dtypes))


@dataclasses.dataclass(frozen=True)
class ReductionBytes:
    """The bytes an op planned as ``p`` holds for its inputs and its reduction, from one
    evaluation of the rule (:func:`reduction_bytes`): ``converted`` (``p.temp_bytes``: the inputs
    the plan converts for it, an FSDP layer's gathered weights, a resharded operand), ``sums``
    (the full-size partial sums of its output beside the reduced result: 0 where nothing is
    reduced, or an all-reduce runs in place, ``hardware.all_reduce_in_place``) and ``relayout``
    (XLA:CPU's relayout copy of them before a reduce-scatter), whether ``hardware``
    ``combines`` the gradients' reductions, and whether the op ``all_reduced`` its partial sums
    (some step of its output's conversion an all-reduce: a member of a combined one). ``rules.price`` fills ``OpCost``'s
    ``transient_bytes``, ``contraction_bytes``, ``partial_bytes``, ``relayout_bytes`` and
    ``held_bytes`` from its parts; ``predict`` and the search's memory rows both read them there
    (one rule)."""

    converted: int
    sums: int
    relayout: int
    combines: bool
    all_reduced: bool = False

    @property
    def transient(self) -> int:
        """Bytes the op holds only while it runs: the inputs the plan converts for it, freed
        after, and the unreduced partial sums of its output while their collective runs (a
        reduce-scatter, or a reduction that ends sliced, writes a new, smaller buffer, so the
        full-size partial one is live beside it; an all-reduce does too unless the backend runs
        it in place), with their relayout copy (:attr:`relayout`)."""
        return self.converted + self.sums + self.relayout

    @property
    def contraction(self) -> int:
        """The part of :attr:`transient` the op holds while its contraction runs: the inputs the
        plan converts for it and the partial sums it writes, not the relayout copy a
        reduce-scatter reads (an instruction of its own after the dot, run with the collective:
        XLA:CPU's optimized HLO, ``wrapped_copy`` between the ``dot`` and the ``reduce-scatter``).
        An op of :func:`~autolayout.costmodel.phases.split_reductions` or
        ``gradients.deferred_reductions`` counts this in its contraction's phase and the copy with
        its collective (:attr:`partial`)."""
        return self.converted + self.sums

    @property
    def partial(self) -> int:
        """The part of :attr:`transient` that the reduction of the op's partial output holds: the
        full-size partial sums beside the reduced result, and their relayout copy. Where
        :func:`~autolayout.costmodel.phases.split_reductions` lists the op,
        :func:`~autolayout.costmodel.memory.peak_memory` counts these in the reduction's own phase,
        after the contraction has freed its inputs."""
        return self.sums + self.relayout

    @property
    def held(self) -> int:
        """Bytes that stay live until the step reduces its gradients together, when the op is one
        of :func:`~autolayout.costmodel.gradients.combined_reductions` and the backend
        ``combines`` them (:mod:`~autolayout.costmodel.gradients`): the unreduced partial sums, as
        :attr:`transient` counts them while their collective runs, where it all-reduces them
        (``all_reduced``; XLA:CPU's combiner merges all-reduces, not reduce-scatters, which run
        apart: ``costmodel.order``). 0 for a reduce-scatter, and on other hardware. Whether some
        gradient op's are above 0 picks the step's order (``gradients.gradient_reduction``)."""
        return self.sums if self.combines and self.all_reduced else 0


def reduction_bytes(p: OpPlan, op: Op, mesh: Mesh, hardware: Hardware) -> ReductionBytes:
    """:class:`ReductionBytes` of the op planned as ``p`` on ``hardware``: the partial sums and
    their relayout copy computed once, for ``rules.price`` to fill an ``OpCost`` from."""
    sums = _partial_bytes(p, op, mesh, hardware)
    return ReductionBytes(int(p.temp_bytes), int(sums), _relayout(p, op, mesh, hardware, sums),
                          hardware.combines_gradient_reductions,
                          bool(p.computed.partial) and any(s.kind == ALL_REDUCE for s in p.out_steps))


def _relayout(p: OpPlan, op: Op, mesh: Mesh, hardware: Hardware, sums: int) -> int:
    """The relayout copy of the partial sums ``sums`` (:func:`_partial_bytes`) before a
    reduce-scatter, where ``hardware.reduce_scatter_copies`` (XLA:CPU; else 0): a buffer of its
    own, placed apart (``outputs.partial_buffers``; the zoo mlp's ZeRO-1 step: ``dot_general.22``
    in a copied weight's buffer, ``wrapped_copy.1`` beside it). XLA copies the partial sums when
    a reduce-scatter splits a dim that is not the most major of the op's output (its first dim of
    local size > 1, in the op's output order: a contraction's as ``dot_general`` gives it,
    ``costmodel/dotcopy.py``). A reduce-scatter hands each device one contiguous block of its
    operand, so XLA lays the operand out with the scattered dim most major and copies it into that
    layout first (measured in XLA:CPU's optimized HLO: a ``copy`` to layout ``{0,1}`` of the
    ``[io, hidden]`` gradient before the reduce-scatter of its ``hidden`` dim;
    ``tests/test_memory_rules.py``)."""
    if sums and hardware.reduce_scatter_copies:
        sizes = {d.name: d.size for d in op.dims}
        lead = [d for d in p.computed.dims if p.computed.local_size(d, sizes[d], mesh) > 1][:1]
        if any(s.kind == REDUCE_SCATTER and s.dim and [s.dim] != lead for s in p.out_steps):
            return int(sums)
    return 0


@dataclasses.dataclass(frozen=True)
class HalfGathers:
    """What the all-gathers of an op's half-precision inputs hold on a backend that runs them in
    float32 (:func:`half_gathers`): ``span_bytes``, the plan's ``span_bytes`` with the converted
    copies it holds for later readers at their size; ``extra``, the bytes the op holds while it
    runs beyond the plan's ``temp_bytes`` for the conversions it holds itself; ``buffers``, per
    input held for later readers, the float32 all-gather buffer, live where the conversion runs
    (``sharing.spans``' start) until its convert."""

    span_bytes: Mapping[str, int]
    extra: int
    buffers: Mapping[str, int]


def half_gathers(p: OpPlan, op: Op, mesh: Mesh, hardware: Hardware) -> HalfGathers:
    """:class:`HalfGathers` of the op planned as ``p``: where ``hardware.upcasts_half_collectives``
    (XLA:CPU: ``profiles.SRC_CPU_HALF_COLLECTIVES``), each input of a half-precision dtype that
    ``p`` converts with an all-gather is gathered in float32, a convert before the collective and
    one back after: the gathered buffer is float32 (twice a bfloat16 copy) and lives until that
    convert, and the converted copy is float32 where the op is a contraction that
    ``hardware.upcasts_half_dots`` runs in float32 (the convert back and the dot's convert to
    float32 are one fusion: ``convert_bitcast_fusion.1``, f32, read by both dots of the measured
    step), else of the input's dtype. Elsewhere the plan's bytes as they are.

    Example::

        half_gathers(plan(g, mesh, "batch:data|*:data@3").ops["dot_general_1"], g.op("dot_general_1"),
                     mesh, get_hardware("cpu"))   # examples/linen_bf16_mlp.py's second dot
    """
    span, extra, buffers = dict(p.span_bytes), 0, {}
    if not hardware.upcasts_half_collectives:
        return HalfGathers(span, 0, buffers)
    dtypes = dict(zip(op.inputs, op.input_dtypes or ()))
    sizes = {d.name: d.size for shape in (op.dims, *op.input_shapes) for d in shape}
    wide = hardware.upcasts_half_dots and upcasts(op)
    for name, c in p.conversions.items():
        if dtypes.get(name) not in HALF or not any(s.kind == ALL_GATHER for s in c.steps):
            continue
        elements = c.dst.local_elements(sizes, mesh)
        half = elements * np.dtype(dtypes[name]).itemsize  # what the plan counts, at the input's dtype
        converted = elements * FLOAT32_BYTES if wide else half
        if name in span:
            span[name] = converted
            buffers[name] = elements * FLOAT32_BYTES
        else:  # at the op: the float32 gathered buffer and the converted copy, live together at its convert
            extra += elements * FLOAT32_BYTES + converted - half
    return HalfGathers(span, int(extra), buffers)


def operand_copy_bytes(op: Op, local: Mapping[str, int], hardware: Hardware) -> tuple[int, ...]:
    """Per operand of contraction ``op``, the bytes of the copy XLA:CPU makes of it for its dot
    (:func:`~autolayout.costmodel.dotcopy.copied_operands`; 0 where read in place), ``local``
    giving each dim's size on one device: the operand's local elements at its dtype, in float32
    where ``hardware.upcasts_half_dots`` runs the op in float32 (the convert is fused into the
    copy, :func:`~autolayout.costmodel.memory.stored_itemsize`)."""
    dtypes = op.input_dtypes or (op.output.dtype,) * len(op.inputs)
    wide = hardware.upcasts_half_dots and upcasts(op)
    return tuple(n * (FLOAT32_BYTES if wide else np.dtype(dt).itemsize)
                 for n, dt in zip(operand_copy_elements(op, local), dtypes))


def _partial_bytes(p: OpPlan, op: Op, mesh: Mesh, hardware: Hardware) -> int:
    """The second buffer the reduction of ``p``'s partial output needs: the full-size partial
    sums beside the reduced result (0: nothing to reduce, or an all-reduce run in place)."""
    if not (p.computed.partial and p.out_steps):
        return 0
    if (hardware.all_reduce_in_place and p.out_conversion is None
            and all(s.kind == ALL_REDUCE for s in p.out_steps)):
        return 0
    sizes = {d.name: d.size for d in op.dims}
    itemsize = FLOAT32_BYTES if hardware.upcasts_half_dots and upcasts(op) else op.output.itemsize
    return int(p.computed.local_elements(sizes, mesh) * itemsize)
