"""``predict(graph, mesh, layout, hardware)``: time and memory of one step under a layout."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from autolayout.core import Layout, LayoutError, Mesh
from autolayout.costmodel.hardware import Hardware, get_hardware
from autolayout.costmodel.memory import peak_memory
from autolayout.costmodel.rules import REDUCING, Collective, OpCost, _collective, op_cost
from autolayout.graph import Graph, Op

__all__ = ["Cost", "predict", "resolve_layout", "update_plan"]


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


def resolve_layout(graph: Graph, mesh: Any, layout: Any) -> tuple[Mesh, Layout, dict]:
    """Coerce and validate; returns ``(mesh, layout, axes_of)``."""
    mesh = Mesh.parse(mesh)
    layout = Layout.coerce(layout)
    layout.validate(graph, mesh)
    for d in graph.loop_dims:
        if layout.axes_of(d):
            raise LayoutError(
                f"dim {d!r} indexes the iterations of a scan (stacked layers) and cannot be split over "
                f"{','.join(layout.axes_of(d))}: each device runs every iteration. Remove the rule "
                f"'{d}:{','.join(layout.axes_of(d))}'.")
    return mesh, layout, {d: layout.axes_of(d) for d in graph.dims if layout.axes_of(d)}


@dataclass
class _UpdatePlan:
    param: str
    axes: tuple[str, ...]
    factor: int
    reduce_ops: list = field(default_factory=list)  # ops whose gradient all-reduce becomes RS (+AR)
    region: set = field(default_factory=set)  # update ops, sharded
    new_param: str = ""
    scatter_dim: str = ""  # parameter dim the update is sharded along ("" = flattened, padded)


def opt_state_of(graph: Graph, param: str) -> list[str]:
    """Optimizer-state tensors of ``param``: same dims, named ``<slot>/<param>`` (e.g.
    ``mu/layers/wq`` for ``layers/wq``, as :func:`autolayout.train_step` lays them out)."""
    p = graph.tensor(param)
    return [t.name for t in graph.tensors() if t.role == "opt_state" and "/" in t.name
            and t.name.split("/", 1)[1] == param and set(t.dim_names) == set(p.dim_names)]


def gradient_walk(graph: Graph, param: str, axes_of: dict) -> tuple[list[str], set[str]]:
    """Walk back from ``grad/<param>`` through the ops that keep the parameter's dims
    (elementwise sums, loop stack/result/carry, reductions over unsplit dims) to the
    reducing ops whose split reduced dims all-reduce the gradient. Returns those ops and
    every tensor visited. The one walk the cost model, the search and the lowering share."""
    loop = graph.loop_dims
    pdims = set(graph.tensor(param).dim_names) - loop
    stack, seen, reduce_ops = ["grad/" + param], set(), []
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        op = graph.op(t)
        if op.kind in REDUCING and any(axes_of.get(d.name) for d in op.reduced_dims):
            reduce_ops.append(op.name)
            continue
        if op.kind in REDUCING or op.kind == "elementwise" or (
                op.kind == "reshape" and op.fn in ("stack", "result", "carry")):
            stack.extend(i for i, shape in zip(op.inputs, op.input_shapes)
                         if {d.name for d in shape} - loop == pdims)
    return reduce_ops, seen


def update_plan(graph: Graph, mesh: Mesh, layout: Layout, axes_of: dict) -> dict[str, _UpdatePlan]:
    """Find, for each update-sharded parameter, its gradient all-reduce(s), the update
    ops and the updated parameter (seed 003: reduce-scatter -> sharded update -> all-gather)."""
    plans = {}
    for pname, axes in layout.update_sharding:
        p = graph.tensor(pname)
        grad = "grad/" + pname
        if grad not in graph:
            raise LayoutError(
                f"weight-update sharding of {pname!r} over {','.join(axes)}: the graph has no gradient "
                f"tensor {grad!r}. Build the step with autolayout.train_step (which names gradients), "
                f"or name it with autolayout.named(g, name={grad!r}).")
        pdims = set(p.dim_names)
        plan = _UpdatePlan(pname, tuple(axes), math.prod(mesh.axis_size(a) for a in axes))
        # Reduce-scatter splits the gradient along one dim: the first (non-loop) dim whose
        # local size the update axes divide; otherwise, as seed 003 §4 ("data formatting"),
        # the flattened local gradient, padded to a multiple of |U| (scatter_dim "").
        for d in p.shape:
            local = d.size // math.prod(mesh.axis_size(a) for a in axes_of.get(d.name, ()))
            if d.name not in graph.loop_dims and local % plan.factor == 0:
                plan.scatter_dim = d.name
                break
        plan.reduce_ops, _ = gradient_walk(graph, pname, axes_of)
        covered = set()
        for name in plan.reduce_ops:
            op = graph.op(name)
            covered |= {a for d in op.reduced_dims for a in axes_of.get(d.name, ())}
        missing = [a for a in axes if a not in covered]
        if missing:
            raise LayoutError(
                f"weight-update sharding of {pname!r} over {','.join(axes)}: its gradient is not "
                f"all-reduced over {','.join(missing)} under layout {str(layout)!r} (no dim the gradient "
                f"sums over is split there), so there is nothing to reduce-scatter. Shard its update "
                f"over an axis that splits the batch, or drop the '{pname}:{','.join(axes)}' entry.")
        # update region: elementwise ops downstream of the gradient and of the parameter's
        # optimizer state, staying within parameter-shaped tensors
        starts = [grad] + opt_state_of(graph, pname)
        frontier, region = list(starts), set()
        while frontier:
            t = frontier.pop()
            for c in graph.consumers(t):
                op = graph.op(c)
                if c not in region and op.kind == "elementwise" and op.loop is None and \
                        set(op.output.dim_names) <= pdims:
                    region.add(c)
                    frontier.append(c)
        news = [n for n in region if graph.tensor(n).role == "output" and set(graph.tensor(n).dim_names) == pdims]
        if not news:
            raise LayoutError(f"weight-update sharding of {pname!r}: no updated parameter found downstream "
                              f"of {grad!r}; is this a training step?")
        plan.new_param = sorted(news, key=graph.order.index)[-1]
        plan.region = region
        plans[pname] = plan
    return plans


def predict(graph: Graph, mesh: Any, layout: Any = None, hardware: Any = "tpu-v3") -> Cost:
    """Predict per-device time and memory of one call of ``graph`` under ``layout``.

    Example::

        g = autolayout.models.mlp(batch=1024, d_io=512, d_hidden=2048)
        c = predict(g, "rows:4,cols:2", "batch:rows;hidden:cols", "tpu-v3")
        c.time_s, c.comm_bytes, c.memory["params"]
    """
    import pandas as pd

    hw = get_hardware(hardware)
    mesh, layout, axes_of = resolve_layout(graph, mesh, layout)
    plans = update_plan(graph, mesh, layout, axes_of)
    rs_ops = {name: plan for plan in plans.values() for name in plan.reduce_ops}
    shard_of = {name: plan for plan in plans.values() for name in plan.region}
    cache: dict[tuple, OpCost] = {}
    rows, colls = [], []
    compute = comm = flops = comm_bytes = 0.0
    for op in graph.ops():
        key = (op.signature(), tuple(axes_of.get(d.name, ()) for d in op.dims))
        oc = cache.get(key)
        if oc is None:
            oc = cache[key] = op_cost(op, axes_of, mesh, hw)
        op_colls = [dataclasses.replace(c, op=op.name, count=op.multiplicity) for c in oc.collectives]
        op_flops, op_compute = oc.flops, oc.compute_s
        if op.name in rs_ops:
            op_colls = _to_reduce_scatter(op, op_colls, rs_ops[op.name], mesh, hw)
        if op.name in shard_of:
            plan = shard_of[op.name]
            op_flops, op_compute = op_flops / plan.factor, op_compute / plan.factor
            if op.name == plan.new_param:
                # shards are padded per scan iteration: the gradient was reduce-scattered
                # inside the loop, one layer at a time
                per_iter = math.prod(d.size for d in oc.local_shape if d.name not in graph.loop_dims)
                iters = math.prod(d.size for d in oc.local_shape if d.name in graph.loop_dims)
                nbytes = graph.tensor(op.name).itemsize * iters * -(-per_iter // plan.factor)
                op_colls.append(dataclasses.replace(
                    _collective("all-gather", nbytes, plan.axes, op, mesh, hw), count=op.multiplicity))
        op_comm = sum(c.time_s for c in op_colls)
        compute += op_compute * op.multiplicity
        comm += op_comm * op.multiplicity
        flops += op_flops * op.multiplicity
        comm_bytes += sum(c.bytes for c in op_colls) * op.multiplicity
        colls.extend(op_colls)
        if op.kind not in ("input", "param", "opt_state"):
            rows.append({
                "op": op.name, "kind": op.kind, "fn": op.fn, "loop": op.loop or "", "count": op.multiplicity,
                "local_shape": "[" + ", ".join(map(str, oc.local_shape)) + "]", "flops": op_flops,
                "bytes": oc.bytes_accessed, "compute_s": op_compute,
                "collectives": "; ".join(f"{c.kind} {c.bytes}B/{','.join(c.mesh_axes)}" for c in op_colls),
                "comm_s": op_comm, "total_s": (op_compute + op_comm) * op.multiplicity})
    shrink = {}
    for plan in plans.values():
        for name in plan.region:
            if name != plan.new_param:
                shrink[name] = plan.factor
        for name in opt_state_of(graph, plan.param):
            shrink[name] = plan.factor
    mem_total, breakdown = peak_memory(graph, mesh, axes_of, shrink)
    per_op = pd.DataFrame(rows, columns=["op", "kind", "fn", "loop", "count", "local_shape", "flops",
                                         "bytes", "compute_s", "collectives", "comm_s", "total_s"])
    return Cost(time_s=compute + comm, compute_s=compute, comm_s=comm, flops=flops, comm_bytes=comm_bytes,
                memory_bytes=mem_total, memory=breakdown, collectives=tuple(colls),
                fits=mem_total <= hw.hbm_bytes, per_op=per_op, mesh=mesh, layout=layout, hardware=hw,
                model_flops=float(graph.flops()))


def _to_reduce_scatter(op: Op, colls: list[Collective], plan: _UpdatePlan, mesh: Mesh,
                       hw: Hardware) -> list[Collective]:
    """All-reduce over A -> reduce-scatter over the update axes U, then all-reduce over
    A - U on the 1/|U| shard (seed 003, Fig. 3)."""
    out = []
    for c in colls:
        if c.kind != "all-reduce" or not set(plan.axes) <= set(c.mesh_axes):
            out.append(c)
            continue
        # the operand is the local gradient padded to a multiple of |U| elements (seed 003 §4;
        # no padding when scatter_dim divides)
        item = op.output.itemsize
        shard = -(-(c.bytes // item) // plan.factor) * item
        out.append(dataclasses.replace(
            _collective("reduce-scatter", shard * plan.factor, plan.axes, op, mesh, hw), count=c.count))
        rest = [a for a in c.mesh_axes if a not in plan.axes]
        if rest:
            out.append(dataclasses.replace(
                _collective("all-reduce", shard, rest, op, mesh, hw), count=c.count))
    return out


def layouts_table(graph: Graph, mesh: Any, layouts: Iterable[Any], hardware: Any = "tpu-v3") -> Any:
    """A DataFrame comparing named layouts: time, compute, comm, memory per device."""
    import pandas as pd

    rows = []
    for lay in layouts:
        name, lay = (lay if isinstance(lay, tuple) else (str(Layout.coerce(lay)) or "(replicated)", lay))
        c = predict(graph, mesh, lay, hardware)
        rows.append({"layout": name, "time_ms": c.time_s * 1e3, "compute_ms": c.compute_s * 1e3,
                     "comm_ms": c.comm_s * 1e3, "comm_MB": c.comm_bytes / 1e6,
                     "memory_MiB": c.memory_bytes / 2 ** 20, "fits": c.fits})
    return pd.DataFrame(rows)
