"""Per-op cost rules: Table 1 of the Mesh-TensorFlow paper made quantitative.

For an op under a layout each dim's local size is its size divided by the
product of its mesh axes. Rules (paper §6, §6.1, §8):

* **einsum / reduce / gather / scatter** run on local slices; every input dim
  that is not in the output (summed, reduced, or the indexed vocabulary of a
  gather) and is split over mesh axes leaves a partial result, all-reduced over
  exactly those axes (Mesh-TensorFlow's partitioned allreduce). A gather over a
  split vocabulary is Mesh-TensorFlow's masked local lookup + allreduce; a
  scatter-add over split batch dims reduces them like an einsum.
* **elementwise** ops broadcast by name and need no communication.
* **reshape** (rename, split, merge, loop boundaries): per mesh axis, the dim
  that holds it before and after. Same dim, or the major dims of one
  split/merge group (shard boundaries coincide), is local; split -> unsplit is an
  all-gather; unsplit -> split a local slice; dim A -> dim B an all-to-all.
* No two dims of one einsum/reduce/gather/scatter may share a mesh axis (a local
  product of two partial sums is not a partial sum of the product).

Compute is a per-device roofline ``max(flops / (peak · efficiency), bytes / HBM
bandwidth)`` (Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4)); a
mesh axis no dim of the op uses duplicates its work along that axis (paper §8.4),
which the per-device figure shows directly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from autolayout.core import Dim, LayoutError, Mesh
from autolayout.costmodel.collectives import collective_time
from autolayout.costmodel.hardware import Hardware
from autolayout.graph import Op

AxesOf = Mapping[str, tuple[str, ...]]
REDUCING = ("einsum", "reduce", "gather", "scatter")


@dataclass(frozen=True)
class Collective:
    """One collective as XLA's HLO states it: ``bytes`` is the operand's bytes on one device."""

    kind: str  # "all-reduce" | "all-gather" | "reduce-scatter" | "all-to-all"
    bytes: int
    group_size: int
    mesh_axes: tuple[str, ...]
    op: str = ""
    count: int = 1  # executions per step (the op's multiplicity)
    time_s: float = 0.0  # one execution

    def __str__(self) -> str:
        times = f" x{self.count}" if self.count != 1 else ""
        return f"{self.kind}({self.bytes}B over {','.join(self.mesh_axes)}[{self.group_size}]){times}"


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


def local_dims(dims: Sequence[Dim], axes_of: AxesOf, mesh: Mesh) -> tuple[Dim, ...]:
    out = []
    for d in dims:
        n = math.prod(mesh.axis_size(a) for a in axes_of.get(d.name, ()))
        out.append(Dim(d.name, d.size // n))
    return tuple(out)


def _nbytes(dims: Sequence[Dim], itemsize: int) -> int:
    return math.prod(d.size for d in dims) * itemsize


def _itemsize(dtype: str) -> int:
    import numpy as np
    return np.dtype(dtype).itemsize


def local_flops(op: Op, axes_of: AxesOf, mesh: Mesh) -> int:
    """Flops of one execution on one device: :meth:`Op.flops` on the local slice sizes."""
    return op.flops({d.name: d.size for d in local_dims(op.dims, axes_of, mesh)})


def check_op(op: Op, axes_of: AxesOf) -> None:
    """Reject two dims of one reducing op on the same mesh axis, naming both."""
    if op.kind not in REDUCING:
        return
    owner: dict[str, str] = {}
    for d in op.dims:
        for a in axes_of.get(d.name, ()):
            if a in owner and owner[a] != d.name:
                raise LayoutError(
                    f"op {op.name!r} ({op.kind}.{op.fn}) has dims {owner[a]!r} and {d.name!r} both split "
                    f"over mesh axis {a!r}; its local results would not combine correctly. Split one of "
                    f"them over a different mesh axis (or leave it unsplit).")
            owner[a] = d.name


def _groups_for(axes: Sequence[str], mesh: Mesh, hw: Hardware) -> list:
    return [(mesh.axis_size(a), hw.link_for(a)) for a in axes]


def _collective(kind: str, nbytes: int, axes: Sequence[str], op: Op, mesh: Mesh,
                hw: Hardware) -> Collective:
    axes = tuple(a for a in mesh.axis_names if a in set(axes))  # mesh order, as XLA groups them
    n = math.prod(mesh.axis_size(a) for a in axes)
    t = collective_time(kind, nbytes, _groups_for(axes, mesh, hw))
    return Collective(kind, int(nbytes), n, axes, op.name, op.multiplicity, t)


def reshape_moves(groups: Sequence, sizes: Mapping[str, int], axes_in: AxesOf, axes_out: AxesOf,
                  mesh: Mesh) -> tuple[list[str], list[str]]:
    """Paper §6.1 per mesh axis, for split/merge/rename groups: ``(all_to_all, all_gather)``
    axes (mesh order). Each group is read as row-major digits (Mesh-TensorFlow's cumulative
    products): a mesh axis splitting dim ``d`` occupies the digit range ``[hi/n, hi)`` of its
    group. Same range before and after: local. Only before: all-gather. Only after: a local
    slice. Moved: all-to-all, unless its new range is still held by another mesh axis
    before (a multi-axis split whose axes swap), which no single all-to-all can do: then it
    is gathered and sliced. ``exec`` lowers reshapes by exactly this rule."""
    pos_in: dict[str, tuple] = {}
    pos_out: dict[str, tuple] = {}
    local_in: list[tuple] = []
    bounds: dict[int, set] = {}
    for gi, (gin, gout) in enumerate(groups):
        if not gin or not gout:
            continue  # a broadcast dim (created locally) or a loop slice (never split)
        b = bounds.setdefault(gi, set())
        for dims, axes, pos, local in ((gin, axes_in, pos_in, local_in), (gout, axes_out, pos_out, None)):
            hi = math.prod(sizes[d] for d in dims)
            for d in dims:
                rest = sizes[d]
                for a in axes.get(d, ()):
                    n = mesh.axis_size(a)
                    pos[a] = (gi, hi, hi // n)
                    b.update((hi, hi // n))
                    hi, rest = hi // n, rest // n
                if local is not None:
                    local.append((gi, hi, hi // rest))
                b.update((hi, hi // rest))
                hi //= rest

    def fines(rng: tuple) -> list[tuple]:
        gi, hi, lo = rng
        cuts = sorted((v for v in bounds[gi] if lo <= v <= hi), reverse=True)
        return [(gi, cuts[k], cuts[k + 1]) for k in range(len(cuts) - 1)]

    held_locally = {f for rng in local_in for f in fines(rng)}
    order = mesh.axis_names
    gather = [a for a in order if a in pos_in and a not in pos_out]
    alltoall = []
    for a in order:
        if a in pos_in and a in pos_out and pos_in[a] != pos_out[a]:
            if all(f in held_locally for f in fines(pos_out[a])):
                alltoall.append(a)
            else:
                gather.append(a)
    return alltoall, [a for a in order if a in gather]


def reshape_collectives(op: Op, axes_of: AxesOf, mesh: Mesh, hw: Hardware) -> list[Collective]:
    """Paper §6.1: all-gather, local slice or all-to-all per mesh axis (:func:`reshape_moves`)."""
    if not op.inputs:
        return []
    sizes = {d.name: d.size for d in op.dims}
    alltoall, gather = reshape_moves(op.attr("groups", ()), sizes, axes_of, axes_of, mesh)
    in_bytes = _nbytes(local_dims(op.input_shapes[0], axes_of, mesh), op.output.itemsize)
    out = []
    if alltoall:
        out.append(_collective("all-to-all", in_bytes, alltoall, op, mesh, hw))
    if gather:
        out.append(_collective("all-gather", in_bytes, gather, op, mesh, hw))
    return out


def op_cost(op: Op, axes_of: AxesOf, mesh: Mesh, hw: Hardware) -> OpCost:
    """Per-device cost of one execution of ``op`` when each dim ``d`` is split over
    ``axes_of[d]`` (missing = unsplit). Only the op's own dims are read, so the
    search can cost each signature class once per assignment."""
    check_op(op, axes_of)
    out_local = local_dims(op.output.shape, axes_of, mesh)
    if op.kind in ("input", "param", "opt_state", "constant"):
        return OpCost(op.name, out_local, 0, 0, 0.0, (), 0.0)
    flops = local_flops(op, axes_of, mesh)
    # HBM traffic: only tensors that are materialised (see graph._with_fusion) are read or
    # written; a fused elementwise chain touches HBM once at each end.
    hbm = op.hbm or (True,) * (len(op.inputs) + 1)
    nbytes = _nbytes(out_local, op.output.itemsize) if hbm[-1] else 0
    for shape, dtype, read in zip(op.input_shapes, op.input_dtypes or (op.output.dtype,) * len(op.inputs),
                                  hbm):
        if read:
            nbytes += _nbytes(local_dims(shape, axes_of, mesh), _itemsize(dtype))
    colls: list[Collective] = []
    if op.kind in REDUCING:
        out_names = set(op.output.dim_names)
        axes = [a for d in op.dims if d.name not in out_names for a in axes_of.get(d.name, ())]
        if axes:
            colls.append(_collective("all-reduce", _nbytes(out_local, op.output.itemsize), axes, op, mesh, hw))
            if op.kind == "reduce" and op.fn in ("argmax", "argmin"):
                # the winner's index needs the winning value first: pmax/pmin of the local
                # extremes (value dtype), then pmin of the candidates' global indices
                colls.append(_collective("all-reduce", _nbytes(out_local, _itemsize(op.input_dtypes[0])),
                                         axes, op, mesh, hw))
    elif op.kind == "reshape":
        colls.extend(reshape_collectives(op, axes_of, mesh, hw))
    if op.kind == "reshape" and not colls:
        nbytes = 0  # a local reshape or slice moves no data through HBM worth counting
    # Matmul speed follows the operand dtype (bf16 inputs accumulate in f32 on TPU/GPU).
    peak = hw.peak(op.input_dtypes[0] if op.kind == "einsum" and op.input_dtypes else op.output.dtype)
    peak *= hw.efficiency
    compute = max(flops / peak if peak else 0.0, nbytes / hw.hbm_bandwidth)
    return OpCost(op.name, out_local, flops, nbytes, compute, tuple(colls), sum(c.time_s for c in colls))
