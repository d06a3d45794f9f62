"""``predict(graph, mesh, layout, hardware)``: time and memory of one step under a layout."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from typing import Any, Iterable

from autolayout.core import Layout, Mesh
from autolayout.costmodel.attention import kernel_graph
from autolayout.costmodel.bitcasts import is_bitcast, is_rename, kept_spans
from autolayout.costmodel.broadcasts import broadcast_bytes, broadcast_spans
from autolayout.costmodel.recomputed import recomputed_spans, written
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.profiles import DEFAULT_HARDWARE, get_hardware
from autolayout.costmodel.memory import PeakBuffer, peak_memory, stored_bytes, stored_itemsize
from autolayout.costmodel.phases import phased_reductions
from autolayout.costmodel.order import memory_order
from autolayout.costmodel.gradients import COMBINED, gradient_reduction
from autolayout.costmodel.combine import combined_all_reduces
from autolayout.costmodel.copies import copy_transient_bytes, live_switched_copies, splits_contraction
from autolayout.costmodel.donations import copied_parameters
from autolayout.costmodel.overlap import forward_ops, overlappable, split, step_time
from autolayout.costmodel.plan import SOURCES, Plan, plan, resolve_layout
from autolayout.costmodel.rules import Collective, price
from autolayout.graph import Graph, require_graph

__all__ = ["Cost", "predict", "price_plan", "resolve_layout", "layouts_table", "model_flops"]


@dataclass(frozen=True)
class Cost:
    """Per-device predicted cost of one call of the graph (one training step).

    ``time_s = Σ_d C_d + E_d + max(0, O_d - C_d) + max(0, I_d - W_d)`` over the overlap
    domains ``d`` (each scan body and the top level; :mod:`~autolayout.costmodel.overlap`):
    ``compute_s`` is ``Σ C_d``, ``comm_s`` every collective's time, ``overlapped_comm_s``
    the part of it that may run behind compute (``O`` and ``I``), and ``exposed_comm_s = time_s - compute_s``
    what the step waits for. ``collectives`` lists each distinct collective with its
    ``count`` per step; ``comm_bytes`` sums operand bytes × count.

    ``model_flops`` counts the model's contractions once per step without recompute
    (for a training step three times the forward pass's, PaLM appendix B's convention
    behind 6·N·tokens); ``hardware_flops`` the contraction flops one device executes
    (recompute included), ``flops`` all its flops (element-wise ops too);
    :attr:`mfu` and :attr:`hfu` divide them by time × peak of the matmuls' dtype.

    ``memory_bytes`` is the peak of live bytes per device (``costmodel/memory.py``), ``memory``
    its breakdown by category, and ``peak_buffers`` the buffers live there, largest first
    (:class:`~autolayout.costmodel.memory.PeakBuffer`: tensors by name, the model's other buffers
    by kind; their bytes add up to ``memory_bytes`` and, per category, to ``memory``): what to
    shrink when a layout does not fit.
    """

    time_s: float
    compute_s: float
    comm_s: float
    flops: float
    comm_bytes: float
    memory_bytes: int
    memory: dict
    collectives: tuple[Collective, ...]
    fits: bool
    per_op: Any = field(repr=False, compare=False)
    mesh: Mesh | None = None
    layout: Layout | None = None
    hardware: Hardware | None = field(default=None, repr=False)
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    overlapped_comm_s: float = 0.0
    matmul_dtype: str = "float32"
    peak_buffers: tuple[PeakBuffer, ...] = field(default=(), repr=False, compare=False)

    @property
    def exposed_comm_s(self) -> float:
        """Communication the step waits for: ``time_s - compute_s``."""
        return self.time_s - self.compute_s

    @property
    def mfu(self) -> float:
        """Model flops utilisation: model flops (no recompute) / (time × devices × peak)."""
        if not self.time_s or self.hardware is None or self.mesh is None:
            return 0.0
        return self.model_flops / (self.time_s * self.mesh.size * self.peak_flops)

    @property
    def hfu(self) -> float:
        """Hardware flops utilisation: contraction flops one device executes (recompute
        included) / (time × peak)."""
        if not self.time_s or self.hardware is None:
            return 0.0
        return self.hardware_flops / (self.time_s * self.peak_flops)

    @property
    def peak_flops(self) -> float:
        """Peak FLOP/s of one device for the dtype most model flops run in."""
        return self.hardware.peak(self.matmul_dtype) if self.hardware else 0.0

    def summary(self) -> str:
        gib = 2 ** 30
        return (f"time {self.time_s * 1e3:.3f} ms (compute {self.compute_s * 1e3:.3f} ms, "
                f"comm {self.comm_s * 1e3:.3f} ms), memory {self.memory_bytes / gib:.3f} GiB/device"
                f"{'' if self.fits else ' (DOES NOT FIT)'}, {len(self.collectives)} collectives")


def predict(graph: Graph, mesh: Any, layout: Any = None, *, hardware: Any = DEFAULT_HARDWARE) -> Cost:
    """Predict per-device time and memory of one call of ``graph`` under ``layout``.

    Prices :func:`~autolayout.costmodel.plan.plan` of the graph as the hardware runs it
    (:func:`~autolayout.costmodel.attention.kernel_graph`: fused attention where
    ``hardware.fused_attention``): every op's local compute (roofline) and
    every collective step (:func:`~autolayout.costmodel.collectives.collective_time`), and
    the peak of the tensors' local bytes by liveness (:mod:`~autolayout.costmodel.memory`).

    ``hardware`` is a profile name, :class:`~autolayout.costmodel.hardware.Hardware` or
    JSON path; default :data:`~autolayout.costmodel.profiles.DEFAULT_HARDWARE` (``"tpu-v3"``).

    Example::

        g = autolayout.models.mlp(batch=1024, d_io=512, d_hidden=2048)
        c = predict(g, "rows:4,cols:2", "batch:rows;hidden:cols", hardware="tpu-v3")
        c.time_s, c.comm_bytes, c.memory["params"]
    """
    hw = get_hardware(hardware)
    return price_plan(plan(kernel_graph(require_graph(graph, "predict"), hw), mesh, layout), hw)


def price_plan(p: Plan, hardware: Any = DEFAULT_HARDWARE) -> Cost:
    """Price a :class:`~autolayout.costmodel.plan.Plan` on ``hardware`` (see :func:`predict`)."""
    import pandas as pd

    hw = get_hardware(hardware)
    graph, mesh = p.graph, p.mesh
    walk = memory_order(graph, hw)  # the order the memory model walks (XLA:CPU's breadth-first schedule)
    phased = phased_reductions(walk, hw.combines_gradient_reductions)
    overlap = overlappable(graph, hw)
    rows, colls = [], []
    temps: dict[str, int] = {}
    temp_parts: dict[str, tuple[int, ...]] = {}  # the buffers temps[op] is made of
    held: dict[str, int] = {}
    partials: dict[str, int] = {}  # the reductions' part of temps (phases.split_reductions)
    relayouts: dict[str, int] = {}  # their relayout copies, a buffer of their own (reductions.ReductionBytes.relayout)
    copies: dict[str, tuple[int, ...]] = {}
    gathered: dict[str, dict[str, int]] = {}  # conversions shared by later readers (sharing.shared_reads)
    buffers: dict[str, dict[str, int]] = {}  # their all-gathers' own buffers (reductions.half_gathers)
    renamed: dict[str, int] = {}  # renames: their collectives (bitcasts.is_bitcast)
    compute = comm = flops = comm_bytes = mm_flops = 0.0
    linear = overlapped = 0.0  # compute + exposed comm; comm that may run behind compute
    terms: dict[str, float] = {}  # overlap.split's terms, summed per key
    for op in graph.ops():
        oc = price(p.ops[op.name], op, mesh, hw, overlap)
        n = op.multiplicity
        extra = copy_transient_bytes(walk, op.name, oc.operand_copy_bytes)  # dot operand copies
        own = oc.running_bytes(op.name in phased)
        if own or extra:
            temps[op.name] = own + extra
            temp_parts[op.name] = oc.running_parts(op.name in phased) + (extra,)
        if oc.held_bytes:
            held[op.name] = oc.held_bytes
        if oc.partial_bytes:
            partials[op.name] = oc.partial_bytes
        if oc.relayout_bytes:
            relayouts[op.name] = oc.relayout_bytes
        if oc.operand_copy_bytes:
            copies[op.name] = oc.operand_copy_bytes
        if any(oc.span_bytes):
            gathered[op.name] = {t: b for t, b in zip(op.inputs, oc.span_bytes) if b}
        if any(oc.gather_buffer_bytes):  # float32 all-gather buffers of half-precision conversions
            buffers[op.name] = {t: b for t, b in zip(op.inputs, oc.gather_buffer_bytes) if b}
        if is_rename(op):
            renamed[op.name] = len(oc.collectives)
        lin, parts = split(oc, op, overlap)
        linear += lin * n
        for key, v in parts.items():
            terms[key] = terms.get(key, 0.0) + v * n
        overlapped += oc.overlapped_s * n
        compute += oc.compute_s * n
        comm += oc.comm_s * n
        flops += oc.flops * n
        if op.kind == "einsum" and len(op.inputs) >= 2:
            mm_flops += oc.flops * n
        comm_bytes += sum(c.bytes for c in oc.collectives) * n
        colls.extend(oc.collectives)
        if op.kind not in SOURCES:
            rows.append({
                "op": op.name, "kind": op.kind, "fn": op.fn, "loop": op.loop or "", "count": n,
                "local_shape": "[" + ", ".join(map(str, oc.local_shape)) + "]", "flops": oc.flops,
                "bytes": oc.bytes_accessed, "compute_s": oc.compute_s,
                "collectives": "; ".join(f"{c.kind} {c.bytes}B/{','.join(c.mesh_axes)}" for c in oc.collectives),
                "comm_s": oc.comm_s, "total_s": (oc.compute_s + oc.comm_s) * n})
    reduction = gradient_reduction(graph, held, partials)
    if reduction != COMBINED:  # no combined gradient reduction to wait for
        walk = memory_order(graph, hw, reduction=reduction)
    size = stored_bytes(graph, p.local_bytes, hw)
    bitcast = {n for n in renamed if is_bitcast(graph.op(n), graph.op(graph.op(n).inputs[0]), renamed[n],
                                                size[graph.op(n).inputs[0]], size[n])}
    kept = {src: size[src] for group in kept_spans(walk).values() for src, rs, _, _ in group if rs[0] in bitcast}
    size.update({n: 0 for n in bitcast})  # a bitcast shares its operand's buffer (costmodel/bitcasts.py)
    # a value a reduction fusion shares: written or recomputed by the layout (costmodel/recomputed.py)
    shared = {op.name: written(p.placements[op.name].local_elements(graph.dims, mesh), hw.ynn_reductions)
              for op in graph.ops() if op.reduction_shared}
    size.update({n: 0 for n, w in shared.items() if not w})
    recomputed = {(s, v): size[s] for group in recomputed_spans(walk).values() for s, v, _, _ in group
                  if not shared[v]}
    # a broadcast XLA writes, at its reader's shape (costmodel/broadcasts.py)
    broadcasts = {(v, r): broadcast_bytes(p.placements[r].local_elements(graph.dims, mesh),
                                          stored_itemsize(graph, r, hw), hw.ynn_reductions)
                  for group in broadcast_spans(walk).values() for v, r, _, _ in group}
    # a donated parameter XLA copies before writing its update over it (costmodel/donations.py)
    stages = {q: sh.stage for q, sh in p.shards.items()}
    param_copies = {q: size[q] for q in copied_parameters(walk, p.axes_of, stages, hw)}
    mem_total, breakdown, at_peak = peak_memory(walk, size, temps, held, copies,
                                     gathered, early=hw.breadth_first_schedule,
                                     groups=combined_all_reduces(walk, p.ops, hw), partials=partials,
                                     combines=hw.combines_gradient_reductions, kept=kept, broadcasts=broadcasts,
                                     recomputed=recomputed, temp_parts=temp_parts, param_copies=param_copies,
                                     relayouts=relayouts, gather_buffers=buffers,
                                     switched=live_switched_copies(
                                         walk, frozenset(op.name for op in graph.ops()
                                                         if splits_contraction(op, p.ops[op.name].axes)),
                                         lambda t: p.placements[t].local_elements(graph.dims, mesh), hw.ynn_reductions))
    per_op = pd.DataFrame(rows, columns=["op", "kind", "fn", "loop", "count", "local_shape", "flops",
                                         "bytes", "compute_s", "collectives", "comm_s", "total_s"])
    time_s = step_time(linear, terms)
    model, dtype = model_flops(graph)
    return Cost(time_s=time_s, compute_s=compute, comm_s=comm, flops=flops, comm_bytes=comm_bytes,
                memory_bytes=mem_total, memory=breakdown, collectives=tuple(colls),
                fits=mem_total <= hw.hbm_bytes, per_op=per_op, mesh=mesh, layout=p.layout, hardware=hw,
                model_flops=model, hardware_flops=mm_flops, overlapped_comm_s=overlapped,
                matmul_dtype=dtype, peak_buffers=at_peak)


def model_flops(graph: Graph) -> tuple[float, str]:
    """``(model flops per call, dtype most of them run in)``: the contractions of the
    forward pass (the ops the graph's forward outputs depend on), times three for a
    training step (each forward matmul has two backward ones: PaLM, Chowdhery et al.
    2022, appendix B, "6N + 12LHQT" per token), so recomputation never counts. A graph
    without parameter gradients counts its contractions as they are."""
    fwd = forward_ops(graph)
    train = any(r.grad for r in graph.param_roles.values())
    by_dtype: dict[str, float] = {}
    for op in graph.ops():
        if op.kind == "einsum" and len(op.inputs) >= 2 and (op.name in fwd or not train):
            dt = max(op.input_dtypes, key=lambda d: np.dtype(d).itemsize) if op.input_dtypes else op.output.dtype
            by_dtype[dt] = by_dtype.get(dt, 0.0) + op.flops() * op.multiplicity
    total = sum(by_dtype.values()) * (3 if train else 1)
    return total, (max(by_dtype, key=by_dtype.__getitem__) if by_dtype else "float32")


def layouts_table(graph: Graph, mesh: Any, layouts: Iterable[Any], *, hardware: Any = DEFAULT_HARDWARE) -> Any:
    """A DataFrame comparing named layouts: time, compute, comm, memory per device."""
    import pandas as pd

    rows = []
    for lay in layouts:
        name, lay = (lay if isinstance(lay, tuple) else (str(Layout.coerce(lay)) or "(replicated)", lay))
        c = predict(graph, mesh, lay, hardware=hardware)
        rows.append({"layout": name, "time_ms": c.time_s * 1e3, "compute_ms": c.compute_s * 1e3,
                     "comm_ms": c.comm_s * 1e3, "comm_MB": c.comm_bytes / 1e6,
                     "memory_MiB": c.memory_bytes / 2 ** 20, "fits": c.fits})
    return pd.DataFrame(rows)
