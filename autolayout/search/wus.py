"""Weight-update sharding (WUS) options per parameter, costed exactly like ``predict``.

For parameter ``p`` the decision is binary, per the issue: shard its update
over ``U`` = *all* the mesh axes its gradient is all-reduced over (in mesh
order), or not. Whether that is possible, and what it changes, depends on the
layout only through the dims ``D_p``: ``p``'s own dims plus the dims of the
reducing ops on its gradient path (``update_plan`` walks back from ``grad/p``
through elementwise ops, loop stacks/carries and reducing ops whose summed dims
are unsplit, stopping at reducing ops with split summed dims — the ones whose
all-reduce becomes a reduce-scatter). So for every valid assignment ``a`` of
``D_p`` this module asks ``costmodel.predict.update_plan`` itself whether
``U(a)`` is accepted, and if so records

* ``dtime`` — per-step time change, computed op by op as ``predict`` does:
  the gradient all-reduces become reduce-scatter (+ all-reduce over the other
  axes) via ``predict._to_reduce_scatter``, update ops run at ``1/|U|``
  compute, and the new parameter is all-gathered over ``U``;
* ``dbytes`` — per-tensor memory change (``bytes // |U| - bytes``) of the
  update temporaries and the optimizer state, the shrink ``predict`` applies.

In the CP-SAT model each option is a boolean ``w[p, a] <= y[D_p, a]``: the
solver may switch WUS on exactly when the layout restricted to ``D_p`` is
``a``. Objective and memory rows get ``dtime · w`` and ``dbytes · w``.
Parameters whose update plans share ops with another parameter's (never the
case for the zoo's optimizers) are left unsharded, since ``predict`` would
not treat their effects additively.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from autolayout.core import Layout, LayoutError
from autolayout.costmodel.predict import _to_reduce_scatter, gradient_walk, opt_state_of, update_plan
from autolayout.costmodel.rules import REDUCING, _collective
from autolayout.graph import Graph
from autolayout.search.tables import Tables, mesh_order

__all__ = ["WusOption", "WusParam", "wus_options"]


@dataclass
class WusOption:
    index: int  # assignment index in the group of WusParam.dims
    axes: tuple[str, ...]  # U, mesh order
    dtime: float  # seconds per step (negative = faster)
    dbytes: dict  # tensor name -> change of its local bytes (<= 0)


@dataclass
class WusParam:
    param: str
    dims: tuple[str, ...]  # D_p, canonical order
    options: list[WusOption]
    ops: set  # ops any of its plans touches (reduce ops and update region)


def _walk(graph: Graph, pname: str, axes_of: dict) -> tuple[list[str], set[str]]:
    """``update_plan``'s backward walk from ``grad/pname``: (reduce ops, visited ops)."""
    return gradient_walk(graph, pname, axes_of)


def _update_axes(tables: Tables, pname: str, axes_of: dict, reduce_ops: list[str] | None = None
                 ) -> tuple[str, ...]:
    """U: the axes the gradient of ``pname`` is all-reduced over (mesh order)."""
    graph = tables.graph
    if reduce_ops is None:
        reduce_ops, _ = _walk(graph, pname, axes_of)
    own = {a for d in graph.tensor(pname).dim_names for a in axes_of.get(d, ())}
    covered = {a for n in reduce_ops for d in graph.op(n).reduced_dims for a in axes_of.get(d.name, ())}
    return mesh_order(tables.mesh, covered - own)


def _option(tables: Tables, pname: str, dims: tuple, index: int, plans: dict,
            states: list[str]) -> tuple[WusOption, set] | None:
    graph, mesh, hw = tables.graph, tables.mesh, tables.hw
    g = tables.group(dims)
    axes_of = g.axes_of(index)
    reduce_ops, _ = _walk(graph, pname, axes_of)
    U = _update_axes(tables, pname, axes_of, reduce_ops)
    if not U:
        return None
    # update_plan's answer depends on the layout only through U and the reduce ops
    # (its scatter_dim is informational); ask it once per distinct pair
    key = (U, tuple(sorted(reduce_ops)))
    if key not in plans:
        layout = Layout(sorted(axes_of.items()), {pname: U})
        try:
            plans[key] = update_plan(graph, mesh, layout, axes_of)[pname]
        except LayoutError:
            plans[key] = None
    plan = plans[key]
    if plan is None:
        return None
    dtime = 0.0
    for name in plan.reduce_ops:  # as predict: all-reduce -> reduce-scatter (+ all-reduce)
        op = graph.op(name)
        oc = tables.op_cost(op, dims, g.assignments[index])
        colls = [dataclasses.replace(c, op=op.name, count=op.multiplicity) for c in oc.collectives]
        new = _to_reduce_scatter(op, colls, plan, tables.fast_mesh, hw)
        dtime += (sum(c.time_s for c in new) - sum(c.time_s for c in colls)) * op.multiplicity
    for name in sorted(plan.region, key=tables.rank.__getitem__):  # sharded update ops
        op = graph.op(name)
        oc = tables.op_cost(op, dims, g.assignments[index])
        dtime += (oc.compute_s / plan.factor - oc.compute_s) * op.multiplicity
        if name == plan.new_param:
            nbytes = op.output.itemsize * -(-math.prod(d.size for d in oc.local_shape) // plan.factor)
            dtime += _collective("all-gather", nbytes, plan.axes, op, tables.fast_mesh, hw).time_s * op.multiplicity
    shrunk = [n for n in plan.region if n != plan.new_param]
    shrunk += states
    dbytes = {}
    for n in shrunk:
        t = graph.tensor(n)
        tg = tables.tensor_dims(t)
        i = tables.restrict(axes_of, tg)
        full, part = tables.tensor_bytes(t)[i], tables.tensor_bytes(t, plan.factor)[i]
        if part != full:
            dbytes[n] = int(part - full)
    ops = set(plan.reduce_ops) | set(plan.region)
    return WusOption(index, plan.axes, dtime, dbytes), ops


def wus_options(tables: Tables) -> tuple[list[WusParam], list[str]]:
    """WUS options of every parameter with a gradient; also notes on parameters left out."""
    graph = tables.graph
    out: list[WusParam] = []
    notes: list[str] = []
    for t in graph.params():
        if "grad/" + t.name not in graph:
            continue
        _, visited = _walk(graph, t.name, {})
        dims = set(t.dim_names)
        for n in visited:
            op = graph.op(n)
            if op.kind in REDUCING:
                dims |= {d.name for d in op.dims}
        dims = tables.space.order(dims)
        group = tables.group(dims)
        cache: dict = {}
        plans: dict = {}
        states = opt_state_of(graph, t.name)
        options, ops = [], set()
        for i, a in enumerate(group.assignments):
            key = tables.orbit_key(dims, a)
            if key not in cache:  # time and bytes are the same over an orbit (tables.py)
                cache[key] = _option(tables, t.name, dims, i, plans, states)
                if cache[key] is not None:
                    ops |= cache[key][1]
            res = cache[key]
            if res is None:
                continue
            if res[0].index == i:
                options.append(res[0])
            else:
                U = _update_axes(tables, t.name, group.axes_of(i))
                options.append(WusOption(i, U, res[0].dtime, res[0].dbytes))
        if options:
            out.append(WusParam(t.name, dims, options, ops))
    # parameters whose plans overlap are not additive in predict: leave them out
    clash = set()
    for i, p in enumerate(out):
        for q in out[i + 1:]:
            if p.ops & q.ops:
                clash |= {p.param, q.param}
    if clash:
        notes.append(f"weight-update sharding not considered for {sorted(clash)}: their update plans share ops")
        out = [p for p in out if p.param not in clash]
    return out, notes
