"""Pricing a plan: Table 1 of the Mesh-TensorFlow paper made quantitative.

Which collectives an op needs under a layout is decided once, by the plan
(:mod:`autolayout.costmodel.plan`: paper §6, §6.1, §8; weight-update shards,
seed 003). This module prices an :class:`~autolayout.costmodel.plan.OpPlan`:

* **compute**: a per-device roofline ``max(flops / (peak · efficiency), bytes /
  HBM bandwidth)`` (Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4))
  on the op's local sizes, plus ``Hardware.op_overhead_s`` for every executed op
  and, where ``Hardware.dot_operand_copies``, the operand copies of a contraction
  (:mod:`~autolayout.costmodel.dotcopy`) at HBM bandwidth; a value a reduction fusion
  shares that the layout has XLA recompute in its readers (``costmodel.recomputed.written``)
  writes nothing, so its bytes leave out the write (its readers still read about its bytes:
  its sources);
  a mesh axis no dim of the op uses duplicates its work along that axis (paper
  §8.4), which the per-device figure shows directly;
* **communication**: each collective step at :func:`~.collectives.collective_time`
  over the links of its mesh axes.

:func:`op_cost` is the per-op function the search tables evaluate for every
candidate assignment of an op's dims: the plan of the op under the layout's rules
alone, priced here — what ``predict`` sums for a layout without update shards.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

from autolayout.core import Dim, Mesh
from autolayout.costmodel.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, collective_time
from autolayout.costmodel.dotcopy import copy_bytes
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.reductions import half_gathers, operand_copy_bytes, reduction_bytes
from autolayout.costmodel.overlap import NO_OVERLAP, Overlap
from autolayout.costmodel.placement import Step
from autolayout.costmodel.plan import REDUCING, SOURCES, OpPlan, Planner, check_op
from autolayout.costmodel.recomputed import written
from autolayout.costmodel.regions import Regions
from autolayout.graph import Op

__all__ = ["Collective", "OpCost", "op_cost", "price", "phases", "collective", "check_op", "REDUCING"]

AxesOf = Mapping[str, tuple[str, ...]]
# ops no kernel runs for: the step's arguments and literal constants
NOT_EXECUTED = (*SOURCES, "constant")


@dataclass(frozen=True)
class Collective:
    """One collective as XLA's HLO states it: ``bytes`` is the operand's bytes on one device.

    ``count`` is the executions per step (the op's multiplicity), ``time_s`` one
    execution's time. Prints as ``all-reduce(1048576B over cols[4])``.
    """

    kind: str  # "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all"
    bytes: int
    group_size: int
    mesh_axes: tuple[str, ...]
    op: str = ""
    count: int = 1
    time_s: float = 0.0
    tensor: str = ""
    dim: str = ""
    overlapped: bool = False  # may run behind compute (:mod:`~autolayout.costmodel.overlap`)

    def __str__(self) -> str:
        times = f" x{self.count}" if self.count != 1 else ""
        return f"{self.kind}({self.bytes}B over {','.join(self.mesh_axes)}[{self.group_size}]){times}"

    __repr__ = __str__


@dataclass(frozen=True)
class OpCost:
    """Per-device cost of one execution of an op. ``comm_s`` is every collective's time,
    ``overlapped_s`` the part of it that may run behind compute (see
    :mod:`~autolayout.costmodel.overlap`; ``time_s`` is the op alone, without overlap)."""

    op: str
    local_shape: tuple[Dim, ...]
    flops: int
    bytes_accessed: int
    compute_s: float
    collectives: tuple[Collective, ...]
    comm_s: float
    overlapped_s: float = 0.0
    beside_s: float = 0.0  # the part of overlapped_s that hides only beside independent work
    transient_bytes: int = 0  # held only while the op runs (``reductions.ReductionBytes.transient``)
    held_bytes: int = 0  # held until the combined gradient reduction (``reductions.ReductionBytes.held``)
    # per operand, the bytes of the copy XLA:CPU makes of it for the dot (0: read in place;
    # :func:`~autolayout.costmodel.reductions.operand_copy_bytes`); () where hw.dot_operand_copies is off
    operand_copy_bytes: tuple[int, ...] = ()
    # per operand (``op.inputs``' order), the bytes of the copy the op converts for later readers
    # too, held from this op to the last of them (``OpPlan.span_bytes``, ``sharing.shared_reads``)
    span_bytes: tuple[int, ...] = ()
    # the part of transient_bytes the reduction of a partial output holds
    # (:attr:`~autolayout.costmodel.reductions.ReductionBytes.partial`)
    partial_bytes: int = 0
    # the part of transient_bytes the op holds while its contraction runs, without a reduce-scatter's
    # relayout copy (:attr:`~autolayout.costmodel.reductions.ReductionBytes.contraction`)
    contraction_bytes: int = 0
    # the part of transient_bytes and contraction_bytes that are inputs the plan converts for the
    # op (``OpPlan.temp_bytes``: gathered weights, resharded operands)
    converted_bytes: int = 0
    # the part of partial_bytes that is XLA:CPU's relayout copy before a reduce-scatter, a buffer of
    # its own (:attr:`~autolayout.costmodel.reductions.ReductionBytes.relayout`)
    relayout_bytes: int = 0
    # per operand held for later readers (span_bytes), the float32 buffer of its all-gather where the
    # backend gathers half-precision values in float32, live where the conversion runs
    # (:attr:`~autolayout.costmodel.reductions.HalfGathers.buffers`); () where there is none
    gather_buffer_bytes: tuple[int, ...] = ()

    def running_bytes(self, phased: bool) -> int:
        """The bytes the op holds where it runs: :attr:`transient_bytes`, or for an op the memory
        model counts in phases (``phased``: :func:`~autolayout.costmodel.phases.phased_reductions`,
        whose collective holds :attr:`partial_bytes`) :attr:`contraction_bytes`. ``predict``, the
        search's tables and its storage options' byte deltas all take this."""
        return self.contraction_bytes if phased else self.transient_bytes

    def running_parts(self, phased: bool) -> tuple[int, int, int]:
        """:meth:`running_bytes` as the buffers it is made of: the inputs converted for the op,
        its partial sums, and (where not ``phased``) XLA:CPU's relayout copy of them before a
        reduce-scatter (``reductions.ReductionBytes.transient``). They sum to
        :meth:`running_bytes`. XLA allocates each on its own, so an output allocation not yet
        written can hold one but not their sum (``outputs.unplaced_output_bytes``); converted
        inputs count as one buffer (a bound: an op converting several has several)."""
        partial = self.contraction_bytes - self.converted_bytes
        return (self.converted_bytes, partial, self.running_bytes(phased) - self.converted_bytes - partial)

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s


def collective(step: Step, op: str, count: int, mesh: Mesh, hw: Hardware,
               overlap: Overlap = NO_OVERLAP) -> Collective:
    """A plan step priced: ``collective_time`` over the links of its mesh axes; it may
    overlap compute when its tensor is in ``overlap`` (:func:`~.overlap.overlappable`)."""
    groups = [(mesh.axis_size(a), hw.link_for(a)) for a in step.axes]
    return Collective(step.kind, int(step.bytes), step.group_size, step.axes, op, count,
                      collective_time(step.kind, step.bytes, groups), step.tensor, step.dim,
                      step.tensor in overlap)


def phases(step: Step, mesh: Mesh, hw: Hardware, itemsize: int) -> tuple[Step, ...]:
    """A plan step as the collectives that run it on ``hw``: a summing all-reduce over mesh
    axes with different links becomes reduce-scatter over the fast axes → all-reduce over
    the slowest ones → all-gather over the fast axes (NCCL's and XLA multi-slice's
    hierarchical all-reduce; :func:`~.collectives.collective_time` prices the same
    phases), on the tensor flattened and padded to a multiple of the fast group (the
    padding is in ``pad_bytes``); every other step runs as it is. The cost model prices
    these collectives and the shard_map lowering executes them.

    >>> from autolayout.costmodel.profiles import SLOW_LINKS, get_hardware
    >>> hw = get_hardware("h100").with_axis_link("node", SLOW_LINKS["h100"])
    >>> mesh = Mesh.parse("node:2,gpu:4")
    >>> [str(s) for s in phases(Step("all-reduce", "g", ("node", "gpu"), 8, 40), mesh, hw, 4)]
    ['reduce-scatter(g: 48B over gpu[4])', 'all-reduce(g: 12B over node[2])', 'all-gather(g: 12B over gpu[4])']
    """
    axes = [a for a in step.axes if mesh.axis_size(a) > 1]
    if step.kind != ALL_REDUCE or step.reduce != "sum" or len(axes) < 2:
        return (step,)
    bw = {a: hw.link_for(a).bandwidth for a in axes}
    slowest = min(bw.values())
    fast = tuple(a for a in step.axes if a in bw and bw[a] > slowest)
    slow = tuple(a for a in step.axes if a in bw and bw[a] == slowest)
    if not fast:
        return (step,)
    n_fast = math.prod(mesh.axis_size(a) for a in fast)
    n_slow = math.prod(mesh.axis_size(a) for a in slow)
    elements = -(-step.bytes // itemsize)
    padded = -(-elements // n_fast) * n_fast * itemsize
    shard = padded // n_fast
    return (Step(REDUCE_SCATTER, step.tensor, fast, n_fast, padded, "", padded - step.bytes),
            Step(ALL_REDUCE, step.tensor, slow, n_slow, shard),
            Step(ALL_GATHER, step.tensor, fast, n_fast, shard))


def price(p: OpPlan, graph_op: Op, mesh: Mesh, hw: Hardware, overlap: Overlap = NO_OVERLAP) -> OpCost:
    """Per-device cost of one execution of the op planned as ``p``; ``overlap`` says which
    tensors' collectives may overlap compute (:func:`~.overlap.overlappable`)."""
    itemsize = graph_op.output.itemsize
    colls = tuple(collective(ph, p.op, p.count, mesh, hw, overlap)
                  for s in p.steps for ph in phases(s, mesh, hw, itemsize))
    peak = hw.peak(p.dtype) * hw.efficiency
    sizes = _sizes(graph_op)
    hbm_bytes = p.hbm_bytes
    if graph_op.reduction_shared and not written(p.out.local_elements(sizes, mesh), hw.ynn_reductions):
        hbm_bytes -= p.computed.local_elements(sizes, mesh) * itemsize  # recomputed by its readers, never written
    compute = max(p.flops / peak if peak else 0.0, hbm_bytes / hw.hbm_bandwidth)
    if graph_op.kind not in NOT_EXECUTED:  # launch/dispatch cost of an executed op (Hardware.op_overhead_s)
        compute += hw.op_overhead_s
    copies: tuple[int, ...] = ()
    if hw.dot_operand_copies and graph_op.kind == "einsum" and len(graph_op.inputs) == 2:
        local = {n: -(-size // math.prod(mesh.axis_size(a) for a in p.axes.get(n, ()))) for n, size in sizes.items()}
        compute += copy_bytes(graph_op, local) / hw.hbm_bandwidth  # a copy kernel of its own (memory-bound)
        copies = operand_copy_bytes(graph_op, local, hw)
    local = tuple(Dim(n, p.out.local_size(n, sizes[n], mesh)) for n in p.out.dims)
    hg = half_gathers(p, graph_op, mesh, hw)  # half-precision all-gathers run in float32 (XLA:CPU)
    if hg.extra or hg.buffers:
        p = dataclasses.replace(p, temp_bytes=p.temp_bytes + hg.extra, span_bytes=hg.span_bytes)
    rb = reduction_bytes(p, graph_op, mesh, hw)  # the inputs it converts, its partial sums and their copy
    return OpCost(p.op, local, p.flops, hbm_bytes, compute, colls, sum(c.time_s for c in colls),
                  sum(c.time_s for c in colls if c.overlapped),
                  sum(c.time_s for c in colls if c.overlapped and c.tensor in overlap.beside),
                  rb.transient, rb.held, copies,
                  tuple(p.span_bytes.get(i, 0) for i in graph_op.inputs) if p.span_bytes else (),
                  rb.partial, rb.contraction, rb.converted, rb.relayout,
                  tuple(hg.buffers.get(i, 0) for i in graph_op.inputs) if hg.buffers else ())


def _sizes(op: Op) -> dict[str, int]:
    return {d.name: d.size for d in op.dims}


def op_cost(op: Op, axes_of: AxesOf, mesh: Mesh, hw: Hardware, regions: Regions | None = None,
            overlap: Overlap = NO_OVERLAP, shared: tuple[str, ...] = (), provides: tuple[str, ...] = ()) -> OpCost:
    """Per-device cost of one execution of ``op`` when each dim ``d`` is split over
    ``axes_of[d]`` (missing = unsplit; ``d@norm`` where the norm region of ``regions`` has
    it) and every tensor is stored as those rules say. Only the op's own dims are read, so
    the search can cost each signature class once per assignment. ``shared``: the inputs it
    reads from an earlier op's conversion, ``provides``: those it converts for later readers
    too (``sharing.shared_reads`` of its graph)."""
    sharing = ({(op.name, t): "" for t in shared}, {(op.name, t) for t in provides})
    planner = Planner(_OpGraph(op), mesh, axes_of, regions=regions, sharing=sharing)
    return price(planner.op_plan(op), op, mesh, hw, overlap)


class _OpGraph:
    """The slice of a graph one op's plan reads under rules alone: its tensors' dims and the
    sizes of its dims (so the search can plan a signature class without the whole graph)."""

    loop_dims: frozenset = frozenset()

    def __init__(self, op: Op) -> None:
        self.dims = {d.name: d.size for d in op.dims}
        self._dims = {op.name: op.output.dim_names}
        self._items = {op.name: op.output.itemsize}
        for name, shape, dtype in zip(op.inputs, op.input_shapes, op.input_dtypes or
                                      (op.output.dtype,) * len(op.inputs)):
            self._dims[name] = tuple(d.name for d in shape)
            self._items[name] = _itemsize(dtype)

    def tensor(self, name: str) -> "_T":
        return _T(self._dims[name], self._items[name])


@dataclass(frozen=True)
class _T:
    dim_names: tuple[str, ...]
    itemsize: int


def _itemsize(dtype: str) -> int:
    import numpy as np
    return np.dtype(dtype).itemsize
