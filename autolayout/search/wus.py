"""Weight-update sharding (WUS) options per parameter, costed by the same plan as ``predict``.

For parameter ``p`` the decision is binary: shard its update over ``U`` = *all*
the mesh axes its gradient is all-reduced over (in mesh order), or not. Whether
that is possible, and what it changes, depends on the layout only through the
dims ``D_p``: ``p``'s own dims, the dims of the reducing ops on its gradient
path, and of every op that reads a tensor the shard may hold
(:func:`~autolayout.costmodel.plan.gradient_walk` walks back from the gradient
through elementwise ops, loop stacks/carries and reducing ops whose summed dims
are unsplit). For every valid assignment ``a`` of ``D_p`` this module asks the
plan itself (:func:`~autolayout.costmodel.plan.update_shards`) whether ``U(a)``
is accepted, and if so records

* ``dtime`` — per-step time change: the priced plans of every op the shard
  touches (:class:`~autolayout.costmodel.plan.Planner` with the shard, minus
  without), times their multiplicities — reduce-scatters, sharded update
  compute, the all-gather of the new parameter, exactly as ``predict`` sums them;
* ``dbytes`` — per-tensor change of local bytes of the tensors stored as shards.

In the CP-SAT model each option is a boolean ``w[p, a] <= y[D_p, a]``: the
solver may switch WUS on exactly when the layout restricted to ``D_p`` is
``a``. Objective and memory rows get ``dtime · w`` and ``dbytes · w``.
Parameters whose shards touch a common op (never the case for the zoo's
optimizers) are left unsharded, since ``predict`` would not treat their effects
additively.
"""
from __future__ import annotations

from dataclasses import dataclass

from autolayout.core import Layout, LayoutError
from autolayout.costmodel.plan import REDUCING, Planner, UpdateShard, gradient_walk, opt_state_of, update_shards
from autolayout.costmodel.rules import price
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
    ops: set  # ops any of its options touches


def _update_axes(tables: Tables, pname: str, axes_of: dict, reduce_ops: list[str] | None = None
                 ) -> tuple[str, ...]:
    """U: the axes the gradient of ``pname`` is all-reduced over (mesh order)."""
    graph = tables.graph
    if reduce_ops is None:
        reduce_ops, _ = gradient_walk(graph, pname, axes_of)
    own = {a for d in graph.tensor(pname).dim_names for a in axes_of.get(d, ())}
    covered = {a for n in reduce_ops for d in graph.op(n).reduced_dims for a in axes_of.get(d.name, ())}
    return mesh_order(tables.mesh, covered - own)


def touched(graph: Graph, sh: UpdateShard) -> set[str]:
    """Ops whose plan a shard can change: those computing on it or producing a shard, and
    every reader of a tensor stored as a shard."""
    ops = set(sh.computed) | set(sh.stored) | set(sh.scatter_ops) | {sh.new_param}
    for t in sh.stored:
        ops.update(graph.consumers(t))
    for lp in graph.loops.values():  # a carry moves its next value to where it lives
        ops.update(c for c, nxt in lp.carries if c in sh.stored or nxt in sh.stored)
    return {n for n in ops if graph.op(n).kind not in ("input", "param", "opt_state")}


def _option(tables: Tables, pname: str, dims: tuple, index: int, shards: dict) -> tuple[WusOption, set] | None:
    graph, mesh, hw = tables.graph, tables.fast_mesh, tables.hw
    g = tables.group(dims)
    axes_of = g.axes_of(index)
    reduce_ops, _ = gradient_walk(graph, pname, axes_of)
    U = _update_axes(tables, pname, axes_of, reduce_ops)
    if not U:
        return None
    layout = Layout(sorted(axes_of.items()), {pname: U})
    key = (tuple(sorted(axes_of.items())), U)
    if key not in shards:
        try:
            shards[key] = update_shards(graph, mesh, layout, axes_of)[pname]
        except LayoutError:
            shards[key] = None
    sh = shards[key]
    if sh is None:
        return None
    ops = touched(graph, sh)
    outside = {d.name for n in ops for d in graph.op(n).dims} - set(dims) - graph.loop_dims
    if outside:  # D_p (wus_options) covers every op a shard touches; a miss would price wrongly
        raise RuntimeError(f"internal: weight-update option of {pname!r} touches dims {sorted(outside)} "
                           f"outside its group {dims}")
    base, sharded = Planner(graph, mesh, axes_of), Planner(graph, mesh, axes_of, {pname: sh})
    dtime = 0.0
    for name in sorted(ops, key=tables.rank.__getitem__):
        op = graph.op(name)
        dtime += (price(sharded.op_plan(op), op, mesh, hw).time_s
                  - price(base.op_plan(op), op, mesh, hw).time_s) * op.multiplicity
    dbytes = {}
    for n in sh.stored:
        op = graph.op(n)
        if op.hbm and not op.hbm[-1]:
            continue  # fused: takes no memory either way
        diff = sharded.local_bytes(n) - base.local_bytes(n)
        if diff:
            dbytes[n] = int(diff)
    return WusOption(index, sh.axes, dtime, dbytes), ops


def option_dims(tables: Tables, pname: str) -> tuple[str, ...]:
    """``D_p``: every dim the options of ``pname`` can depend on (see the module docstring)."""
    graph = tables.graph
    _, visited = gradient_walk(graph, pname, {})
    dims = set(graph.tensor(pname).dim_names)
    held = set(visited) | set(opt_state_of(graph, pname))
    frontier = list(held)
    while frontier:  # the update region: elementwise ops downstream, within the param's dims
        t = frontier.pop()
        for c in graph.consumers(t):
            op = graph.op(c)
            if c not in held and op.kind == "elementwise" and set(op.output.dim_names) <= dims:
                held.add(c)
                frontier.append(c)
    for n in held:
        op = graph.op(n)
        if op.kind in REDUCING or op.kind == "reshape":
            dims |= {d.name for d in op.dims}
        for c in graph.consumers(n):
            dims |= {d.name for d in graph.op(c).dims}
    return tables.space.order(dims)


def wus_options(tables: Tables) -> tuple[list[WusParam], list[str]]:
    """WUS options of every parameter with a gradient; also notes on parameters left out."""
    graph = tables.graph
    out: list[WusParam] = []
    notes: list[str] = []
    for t in graph.params():
        if not gradient_walk(graph, t.name, {})[1]:
            continue  # no recorded gradient: nothing to shard
        dims = option_dims(tables, t.name)
        group = tables.group(dims)
        cache: dict = {}
        shards: dict = {}
        options, ops = [], set()
        for i, a in enumerate(group.assignments):
            key = tables.orbit_key(dims, a)
            if key not in cache:  # time and bytes are the same over an orbit (tables.py)
                cache[key] = _option(tables, t.name, dims, i, shards)
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
    # parameters whose shards touch a common op are not additive in predict: leave them out
    clash = set()
    for i, p in enumerate(out):
        for q in out[i + 1:]:
            if p.ops & q.ops:
                clash |= {p.param, q.param}
    if clash:
        notes.append(f"weight-update sharding not considered for {sorted(clash)}: their update shards "
                     "touch common ops")
        out = [p for p in out if p.param not in clash]
    return out, notes
