"""``predict(graph, mesh, layout, hardware)``: time and memory of one step under a layout."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from autolayout.core import Layout, Mesh
from autolayout.costmodel.hardware import DEFAULT_HARDWARE, Hardware, get_hardware
from autolayout.costmodel.memory import peak_memory
from autolayout.costmodel.plan import SOURCES, Plan, plan, resolve_layout
from autolayout.costmodel.rules import Collective, price
from autolayout.graph import Graph, require_graph

__all__ = ["Cost", "predict", "price_plan", "resolve_layout", "layouts_table"]


@dataclass(frozen=True)
class Cost:
    """Per-device predicted cost of one call of the graph (one training step).

    ``time_s = compute_s + comm_s`` (no overlap of compute and communication is
    assumed: the conservative schedule XLA uses when collectives depend on the
    op before them). ``collectives`` lists each distinct collective with its
    ``count`` per step; ``comm_bytes`` sums operand bytes × count.
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

    @property
    def mfu(self) -> float:
        """Model flops utilisation: the graph's model flops over (time × devices × peak)."""
        if not self.time_s or self.hardware is None or self.mesh is None:
            return 0.0
        return self.model_flops / (self.time_s * self.mesh.size * self._peak)

    @property
    def _peak(self) -> float:
        return self.hardware.peak("bfloat16") if self.hardware else 0.0

    def summary(self) -> str:
        gib = 2 ** 30
        return (f"time {self.time_s * 1e3:.3f} ms (compute {self.compute_s * 1e3:.3f} ms, "
                f"comm {self.comm_s * 1e3:.3f} ms), memory {self.memory_bytes / gib:.3f} GiB/device"
                f"{'' if self.fits else ' (DOES NOT FIT)'}, {len(self.collectives)} collectives")


def predict(graph: Graph, mesh: Any, layout: Any = None, *, hardware: Any = DEFAULT_HARDWARE) -> Cost:
    """Predict per-device time and memory of one call of ``graph`` under ``layout``.

    Prices :func:`~autolayout.costmodel.plan.plan`: every op's local compute (roofline) and
    every collective step (:func:`~autolayout.costmodel.collectives.collective_time`), and
    the peak of the tensors' local bytes by liveness (:mod:`~autolayout.costmodel.memory`).

    ``hardware`` is a profile name, :class:`~autolayout.costmodel.hardware.Hardware` or
    JSON path; default :data:`~autolayout.costmodel.hardware.DEFAULT_HARDWARE` (``"tpu-v3"``).

    Example::

        g = autolayout.models.mlp(batch=1024, d_io=512, d_hidden=2048)
        c = predict(g, "rows:4,cols:2", "batch:rows;hidden:cols", hardware="tpu-v3")
        c.time_s, c.comm_bytes, c.memory["params"]
    """
    return price_plan(plan(require_graph(graph, "predict"), mesh, layout), hardware)


def price_plan(p: Plan, hardware: Any = DEFAULT_HARDWARE) -> Cost:
    """Price a :class:`~autolayout.costmodel.plan.Plan` on ``hardware`` (see :func:`predict`)."""
    import pandas as pd

    hw = get_hardware(hardware)
    graph, mesh = p.graph, p.mesh
    rows, colls = [], []
    compute = comm = flops = comm_bytes = 0.0
    for op in graph.ops():
        oc = price(p.ops[op.name], op, mesh, hw)
        n = op.multiplicity
        compute += oc.compute_s * n
        comm += oc.comm_s * n
        flops += oc.flops * n
        comm_bytes += sum(c.bytes for c in oc.collectives) * n
        colls.extend(oc.collectives)
        if op.kind not in SOURCES:
            rows.append({
                "op": op.name, "kind": op.kind, "fn": op.fn, "loop": op.loop or "", "count": n,
                "local_shape": "[" + ", ".join(map(str, oc.local_shape)) + "]", "flops": oc.flops,
                "bytes": oc.bytes_accessed, "compute_s": oc.compute_s,
                "collectives": "; ".join(f"{c.kind} {c.bytes}B/{','.join(c.mesh_axes)}" for c in oc.collectives),
                "comm_s": oc.comm_s, "total_s": (oc.compute_s + oc.comm_s) * n})
    mem_total, breakdown = peak_memory(graph, p.local_bytes, {n: o.temp_bytes for n, o in p.ops.items() if o.temp_bytes})
    per_op = pd.DataFrame(rows, columns=["op", "kind", "fn", "loop", "count", "local_shape", "flops",
                                         "bytes", "compute_s", "collectives", "comm_s", "total_s"])
    return Cost(time_s=compute + comm, compute_s=compute, comm_s=comm, flops=flops, comm_bytes=comm_bytes,
                memory_bytes=mem_total, memory=breakdown, collectives=tuple(colls),
                fits=mem_total <= hw.hbm_bytes, per_op=per_op, mesh=mesh, layout=p.layout, hardware=hw,
                model_flops=float(graph.flops()))


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
