"""Pricing a plan: Table 1 of the Mesh-TensorFlow paper made quantitative.

Which collectives an op needs under a layout is decided once, by the plan
(:mod:`autolayout.costmodel.plan`: paper §6, §6.1, §8; weight-update shards,
seed 003). This module prices an :class:`~autolayout.costmodel.plan.OpPlan`:

* **compute**: a per-device roofline ``max(flops / (peak · efficiency), bytes /
  HBM bandwidth)`` (Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4))
  on the op's local sizes; a mesh axis no dim of the op uses duplicates its work
  along that axis (paper §8.4), which the per-device figure shows directly;
* **communication**: each collective step at :func:`~.collectives.collective_time`
  over the links of its mesh axes.

:func:`op_cost` is the per-op function the search tables evaluate for every
candidate assignment of an op's dims: the plan of the op under the layout's rules
alone, priced here — what ``predict`` sums for a layout without update shards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from autolayout.core import Dim, Mesh
from autolayout.costmodel.collectives import collective_time
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.placement import Step
from autolayout.costmodel.plan import REDUCING, OpPlan, Planner, check_op
from autolayout.costmodel.regions import Regions
from autolayout.graph import Op

__all__ = ["Collective", "OpCost", "op_cost", "price", "collective", "check_op", "REDUCING"]

AxesOf = Mapping[str, tuple[str, ...]]


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

    def __str__(self) -> str:
        times = f" x{self.count}" if self.count != 1 else ""
        return f"{self.kind}({self.bytes}B over {','.join(self.mesh_axes)}[{self.group_size}]){times}"

    __repr__ = __str__


@dataclass(frozen=True)
class OpCost:
    """Per-device cost of one execution of an op."""

    op: str
    local_shape: tuple[Dim, ...]
    flops: int
    bytes_accessed: int
    compute_s: float
    collectives: tuple[Collective, ...]
    comm_s: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s


def collective(step: Step, op: str, count: int, mesh: Mesh, hw: Hardware) -> Collective:
    """A plan step priced: ``collective_time`` over the links of its mesh axes."""
    groups = [(mesh.axis_size(a), hw.link_for(a)) for a in step.axes]
    return Collective(step.kind, int(step.bytes), step.group_size, step.axes, op, count,
                      collective_time(step.kind, step.bytes, groups), step.tensor, step.dim)


def price(p: OpPlan, graph_op: Op, mesh: Mesh, hw: Hardware) -> OpCost:
    """Per-device cost of one execution of the op planned as ``p``."""
    colls = tuple(collective(s, p.op, p.count, mesh, hw) for s in p.steps)
    peak = hw.peak(p.dtype) * hw.efficiency
    compute = max(p.flops / peak if peak else 0.0, p.hbm_bytes / hw.hbm_bandwidth)
    sizes = _sizes(graph_op)
    local = tuple(Dim(n, p.out.local_size(n, sizes[n], mesh)) for n in p.out.dims)
    return OpCost(p.op, local, p.flops, p.hbm_bytes, compute, colls, sum(c.time_s for c in colls))


def _sizes(op: Op) -> dict[str, int]:
    return {d.name: d.size for d in op.dims}


def op_cost(op: Op, axes_of: AxesOf, mesh: Mesh, hw: Hardware, regions: Regions | None = None) -> OpCost:
    """Per-device cost of one execution of ``op`` when each dim ``d`` is split over
    ``axes_of[d]`` (missing = unsplit; ``d@norm`` where the norm region of ``regions`` has
    it) and every tensor is stored as those rules say. Only the op's own dims are read, so
    the search can cost each signature class once per assignment."""
    planner = Planner(_OpGraph(op), mesh, axes_of, regions=regions)
    return price(planner.op_plan(op), op, mesh, hw)


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
