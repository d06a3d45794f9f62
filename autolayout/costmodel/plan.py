"""One plan per op: where every tensor lives, what each op computes locally, what it sends.

``plan(graph, mesh, layout)`` is the single source of truth that the cost model
prices (:func:`~autolayout.costmodel.predict.predict`), the search tables price
per candidate assignment (:func:`~autolayout.costmodel.rules.op_cost`) and the
``jax.shard_map`` lowering executes (``exec/lower.py``). Nothing downstream
decides a collective on its own.

**Placements.** Every tensor is *stored* in a :class:`~.placement.Placement`:
by default each dim split as the layout's rule for it says (Mesh-TensorFlow's
global rules). Weight-update sharding (seed 003) stores a parameter's gradient
path, optimizer state and update temporaries as shards over extra axes ``U``
(:class:`UpdateShard`).

**Ops.** Each op *computes* in a placement of its own dims (the rules, or the
update shard for update ops). Per op kind (paper §6, Table 1):

* ``einsum`` / ``reduce`` / ``gather`` / ``scatter``: run on local slices; a
  reduced (summed, reduced, or the indexed vocabulary of a gather) dim split
  over mesh axes leaves a partial result over those axes, reduced into the
  output's stored placement by :func:`~.placement.reduction` (all-reduce, or
  reduce-scatter into an update shard). ``argmax``/``argmin`` over a split dim
  need two all-reduces (the winning value, then the smallest winning index).
  No two dims of one of these ops may share a mesh axis (:func:`check_op`).
* ``elementwise``: no communication; broadcast by name.
* ``reshape`` (rename, split, merge, loop boundaries): :func:`~.placement.moves`
  between the input's and the output's placements.
* an input stored in another placement than the op needs is converted first
  (:func:`~.placement.conversion`), e.g. an update shard read by an op that is
  not an update op is all-gathered.

Compute is a per-device roofline on the local sizes (``rules.price``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autolayout.core import Layout, LayoutError, Mesh
from autolayout.costmodel.placement import (ALL_REDUCE, Conversion, Moves, Placement, Step, conversion,
                                            mesh_order, move_steps, moves, reduction)
from autolayout.graph import Graph, Op, identity_groups

__all__ = ["Plan", "OpPlan", "UpdateShard", "Planner", "LoweringError", "plan", "resolve_layout", "check_op", "grad_of", "opt_state_of",
           "gradient_walk", "unsplittable", "REDUCING", "SOURCES"]

REDUCING = ("einsum", "reduce", "gather", "scatter")
SOURCES = ("input", "param", "opt_state")
BOUNDARY = ("stack", "result", "carry")


class LoweringError(LayoutError):
    """An op under a layout that no plan can express (the message says which and why)."""


# Reductions whose partial results over a split dim combine with one collective.
COMBINABLE = ("sum", "max", "min", "and", "or", "argmax", "argmin")


def unsplittable(op: Op) -> tuple[str, ...]:
    """Dims of ``op`` that no layout may split (the one rule the plan, the search space and
    the lowering share): the reduced dims of a reduction without a combining collective."""
    if op.kind == "reduce" and op.fn not in COMBINABLE:
        return tuple(d.name for d in op.reduced_dims)
    return ()


# ------------------------------------------------------------------ parameter roles
def grad_of(graph: Graph, param: str) -> str | None:
    """``param``'s gradient tensor (``graph.param_roles``, found by the tracer), or None."""
    role = graph.param_roles.get(param)
    return role.grad if role is not None else None


def opt_state_of(graph: Graph, param: str) -> list[str]:
    """``param``'s optimizer-state tensors (``graph.param_roles``)."""
    role = graph.param_roles.get(param)
    return list(role.opt_state) if role is not None else []


def check_op(op: Op, axes_of: Mapping[str, tuple[str, ...]]) -> None:
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


def gradient_walk(graph: Graph, param: str, axes_of: Mapping[str, tuple[str, ...]]) -> tuple[list[str], set[str]]:
    """Walk back from ``param``'s gradient through the ops that keep the parameter's dims
    (elementwise sums, loop stack/result/carry, reductions over unsplit dims) to the
    reducing ops whose split reduced dims all-reduce the gradient. Returns those ops and
    every tensor visited."""
    grad = grad_of(graph, param)
    if grad is None:
        return [], set()
    loop = graph.loop_dims
    pdims = set(graph.tensor(param).dim_names) - loop
    stack, seen, reduce_ops = [grad], set(), []
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        op = graph.op(t)
        if op.kind in REDUCING and any(axes_of.get(d.name) for d in op.reduced_dims):
            reduce_ops.append(op.name)
            continue
        if op.kind in REDUCING or op.kind == "elementwise" or (op.kind == "reshape" and op.fn in BOUNDARY):
            stack.extend(i for i, shape in zip(op.inputs, op.input_shapes)
                         if {d.name for d in shape} - loop == pdims)
    return reduce_ops, seen


# ------------------------------------------------------------- weight-update shards
@dataclass(frozen=True)
class UpdateShard:
    """Weight-update sharding of one parameter (seed 003): its gradient is reduce-scattered
    over ``axes`` (``U``), its optimizer state and update run on a ``1/factor`` shard, and the
    updated parameter is all-gathered. The shard splits dim ``dim`` (``U`` minor to the axes
    the layout gives it) or, when no dim's local size divides, the flattened block of the
    non-loop dims, padded (``dim == ""``, seed 003 §4)."""

    param: str
    axes: tuple[str, ...]
    factor: int
    dim: str
    reduce_ops: tuple[str, ...]  # reducing ops on the gradient path
    scatter_ops: frozenset[str]  # those whose reduction reduce-scatters into the shard
    stored: frozenset[str]  # tensors stored as shards
    computed: frozenset[str]  # ops computing on the shard
    new_param: str  # the updated parameter: computed on the shard, stored whole (all-gathered)
    opt_state: tuple[str, ...]

    def applies(self, graph: Graph, dims: Sequence[str]) -> bool:
        """Whether a tensor with ``dims`` can be held as this shard."""
        if self.dim:
            return self.dim in dims
        pdims = [d for d in graph.tensor(self.param).dim_names if d not in graph.loop_dims]
        return set(pdims) <= set(dims)

    def placement(self, graph: Graph, dims: Sequence[str], axes_of: Mapping[str, tuple[str, ...]]) -> Placement:
        """The shard placement of a tensor with ``dims`` (which :meth:`applies`)."""
        if self.dim:
            p = Placement.of(dims, axes_of)
            return p.replace_axes(self.dim, p.axes_of(self.dim) + self.axes)
        # flattened in one order for every tensor of the shard (elementwise update ops combine
        # their chunks): loop dims kept in front, then the parameter's dims in its order
        kept = tuple(d for d in dims if d in graph.loop_dims)
        pdims = [d for d in graph.tensor(self.param).dim_names if d in dims and d not in kept]
        order = kept + tuple(pdims) + tuple(d for d in dims if d not in kept and d not in pdims)
        p = Placement.of(order, axes_of)
        return Placement(p.dims, p.axes, self.axes, kept)


def update_shards(graph: Graph, mesh: Mesh, layout: Layout, axes_of: Mapping[str, tuple[str, ...]]
                  ) -> dict[str, UpdateShard]:
    """The :class:`UpdateShard` of each parameter ``layout.update_sharding`` names."""
    out: dict[str, UpdateShard] = {}
    for pname, axes in layout.update_sharding:
        p = graph.tensor(pname)
        grad = grad_of(graph, pname)
        if grad is None:
            raise LayoutError(
                f"weight-update sharding of {pname!r} over {','.join(axes)}: the graph records no gradient "
                f"for {pname!r} (graph.param_roles), so there is no update to shard. Trace a training step "
                f"(autolayout.train_step or an optax update) whose new parameters are outputs.")
        factor = math.prod(mesh.axis_size(a) for a in axes)
        # The shard splits one dim: the first (non-loop) dim whose local size the update axes
        # divide; otherwise, as seed 003 §4 ("data formatting"), the flattened local block.
        dim = ""
        for d in p.shape:
            local = d.size // math.prod(mesh.axis_size(a) for a in axes_of.get(d.name, ()))
            if d.name not in graph.loop_dims and local % factor == 0:
                dim = d.name
                break
        reduce_ops, seen = gradient_walk(graph, pname, axes_of)
        covered = {a for name in reduce_ops for d in graph.op(name).reduced_dims for a in axes_of.get(d.name, ())}
        missing = [a for a in axes if a not in covered]
        if missing:
            raise LayoutError(
                f"weight-update sharding of {pname!r} over {','.join(axes)}: its gradient is not "
                f"all-reduced over {','.join(missing)} under layout {str(layout)!r} (no dim the gradient "
                f"sums over is split there), so there is nothing to reduce-scatter. Shard its update "
                f"over an axis that splits the batch, or drop the '{pname}:{','.join(axes)}' entry.")
        pdims = set(p.dim_names)
        states = opt_state_of(graph, pname)
        # update region: elementwise ops downstream of the gradient and of the parameter's
        # optimizer state, staying within parameter-shaped tensors
        frontier, region = [grad, *states], set()
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
                              f"of its gradient {grad!r}; is this a training step?")
        new_param = sorted(news, key=graph.order.index)[-1]
        shard = UpdateShard(pname, tuple(axes), factor, dim, tuple(reduce_ops), frozenset(), frozenset(),
                            frozenset(), new_param, tuple(states))
        scatter, stored, computed = set(), set(), set()
        for r in reduce_ops:
            op = graph.op(r)
            raxes = {a for d in op.reduced_dims for a in axes_of.get(d.name, ())}
            if set(axes) <= raxes and shard.applies(graph, op.output.dim_names):
                scatter.add(r)
                stored.add(r)
        for t in (*_grad_path(graph, reduce_ops, seen), *region):
            op = graph.op(t)
            shardable = bool(dim) or op.kind == "elementwise" or (
                op.kind == "einsum" and len(op.inputs) == 1 and not op.reduced_dims) or (
                op.kind == "reshape" and op.fn in BOUNDARY)
            if shard.applies(graph, op.output.dim_names) and shardable:
                stored.add(t)
                computed.add(t)
        stored.discard(new_param)  # computed on the shard, stored whole: all-gathered after its op
        stored |= {t for t in states if shard.applies(graph, graph.tensor(t).dim_names)}
        out[pname] = UpdateShard(pname, tuple(axes), factor, dim, tuple(reduce_ops), frozenset(scatter),
                                 frozenset(stored), frozenset(computed), new_param, tuple(states))
    return out


def _grad_path(graph: Graph, reduce_ops: Sequence[str], seen: set[str]) -> set[str]:
    """Tensors between the reducing ops and the gradient (of the backward walk), which run
    on the update shard."""
    down = set(reduce_ops)
    path: set[str] = set()
    carry_next = {c: n for lp in graph.loops.values() for c, n in lp.carries}
    changed = True
    while changed:
        changed = False
        for t in graph.order:
            if t in seen and t not in down and t not in path:
                op = graph.op(t)
                if any(i in down or i in path for i in op.inputs) or (op.fn == "carry" and carry_next.get(t) in path):
                    path.add(t)
                    changed = True
    return path


# ----------------------------------------------------------------------- op plans
@dataclass(frozen=True)
class OpPlan:
    """What one execution of an op does on one device.

    ``axes`` maps each dim of the op to the mesh axes it is split over while the op
    computes; ``flat`` is set when the op computes on flattened update shards
    (elementwise update ops). ``conversions`` moves inputs from their stored placement to
    the one the op reads (only inputs that need it); ``moves`` is a reshape's regrouping;
    ``computed`` is the output as computed (possibly partial) and ``out`` as stored, with
    ``out_steps`` (reduction) or ``out_conversion`` between them. ``flops`` and
    ``hbm_bytes`` are local, for one execution; ``dtype`` selects the peak rate.
    """

    op: str
    kind: str
    count: int
    axes: Mapping[str, tuple[str, ...]]
    flat: Placement | None
    conversions: Mapping[str, Conversion]
    moves: Moves | None
    computed: Placement
    out: Placement
    out_steps: tuple[Step, ...]
    out_conversion: Conversion | None
    flops: int
    hbm_bytes: int
    dtype: str
    move_steps: tuple[Step, ...] = ()
    loop_back: Conversion | None = None
    reads: Mapping[str, Placement] = field(default_factory=dict)

    @property
    def steps(self) -> tuple[Step, ...]:
        """Every collective, in execution order: input conversions, the op's own moves, the
        output's reduction or conversion (and, for a loop carry, moving the next iteration's
        value to where the carry lives)."""
        pre = tuple(s for c in self.conversions.values() for s in c.steps)
        post = self.out_conversion.steps if self.out_conversion is not None else ()
        back = self.loop_back.steps if self.loop_back is not None else ()
        return pre + self.move_steps + self.out_steps + post + back

    def local_size(self, dim: str, size: int, mesh: Mesh) -> int:
        return size // math.prod(mesh.axis_size(a) for a in self.axes.get(dim, ()))


class Planner:
    """Stored placements and per-op plans of ``graph`` on ``mesh`` under the rules ``axes_of``
    and the weight-update shards ``shards``. The search builds one per candidate assignment
    (no shards: the layout's rules alone) and prices :meth:`op_plan`, as ``predict`` does."""

    def __init__(self, graph: Graph, mesh: Mesh, axes_of: Mapping[str, tuple[str, ...]],
                 shards: Mapping[str, UpdateShard] | None = None) -> None:
        self.graph, self.mesh, self.axes_of = graph, mesh, axes_of
        self.shards = dict(shards or {})
        self.sizes = graph.dims
        self._stored: dict[str, UpdateShard] = {}
        self._computed: dict[str, UpdateShard] = {}
        self._scatter: dict[str, UpdateShard] = {}
        for sh in self.shards.values():
            for t in sh.stored:
                self._stored[t] = sh
            for t in sh.computed:
                self._computed[t] = sh
            for t in sh.scatter_ops:
                self._scatter[t] = sh
        self._cache: dict[str, Placement] = {}

    # -- placements -----------------------------------------------------------------
    def stored(self, name: str) -> Placement:
        """Where tensor ``name`` is stored."""
        hit = self._cache.get(name)
        if hit is None:
            dims = self.graph.tensor(name).dim_names
            sh = self._stored.get(name)
            hit = sh.placement(self.graph, dims, self.axes_of) if sh else Placement.of(dims, self.axes_of)
            self._cache[name] = hit
        return hit

    def local_bytes(self, name: str) -> int:
        t = self.graph.tensor(name)
        return self.stored(name).local_elements(self.sizes, self.mesh) * t.itemsize

    def shard_of(self, op: str) -> UpdateShard | None:
        """The update shard an op computes on, if any."""
        return self._computed.get(op)

    # -- ops ------------------------------------------------------------------------------
    def op_plan(self, op: Op) -> OpPlan:
        """The plan of one execution of ``op``."""
        g, mesh, sizes = self.graph, self.mesh, self.sizes
        out_stored = self.stored(op.name)
        sh = self._computed.get(op.name)
        axes = dict(self.axes_of)
        flat = None
        if sh is not None:
            if sh.dim:
                axes[sh.dim] = axes.get(sh.dim, ()) + sh.axes
            else:
                flat = sh.placement(g, op.output.dim_names, self.axes_of)
        op_axes = {d.name: axes.get(d.name, ()) for d in op.dims}
        op_axes = {d: a for d, a in op_axes.items() if a}
        if op.kind in SOURCES:
            return self._plan(op, op_axes, None, {}, None, out_stored, out_stored, (), None, 0, 0, reads={})
        check_op(op, op_axes)
        itemsize = op.output.itemsize
        computed = flat if flat is not None else Placement.of(op.output.dim_names, op_axes)
        conversions: dict[str, Conversion] = {}
        reads: dict[str, Placement] = {}
        mv: Moves | None = None
        move_list: tuple[Step, ...] = ()
        loop_back: Conversion | None = None
        if op.kind == "constant":
            computed = out_stored
        elif op.kind == "reshape":
            src = op.inputs[0]
            have = self.stored(src)
            computed = out_stored
            if op.fn in ("slice", "stack") or flat is not None:
                # (un)stacking moves no data between devices, nor does a loop boundary of
                # flattened shards (chunks are per layer): convert the input to where the
                # output is, then (un)stack or relabel locally
                self._convert(src, self._boundary_need(op, sh, flat, out_stored), conversions, reads)
            else:
                need = have.base() if have.flat else have
                self._convert(src, need, conversions, reads)
                mv = moves(op.attr("groups", ()), sizes, _axes_map(need), _axes_map(computed), mesh)
                nbytes = need.local_elements(sizes, mesh) * g.tensor(src).itemsize
                move_list = tuple(move_steps(op.name, mv, nbytes, mesh))
            if op.fn == "carry":
                loop_back = self._loop_back(op, out_stored)
        else:
            for name in dict.fromkeys(op.inputs):
                t = g.tensor(name)
                if op.kind == "scatter" and name == op.inputs[0]:
                    need = out_stored.base() if not out_stored.flat else out_stored  # the base operand
                elif flat is not None:
                    need = (sh.placement(g, t.dim_names, self.axes_of) if sh.applies(g, t.dim_names)
                            else Placement.of(t.dim_names, self.axes_of))  # broadcast into the shard locally
                else:
                    need = Placement.of(t.dim_names, op_axes)
                self._convert(name, need, conversions, reads)
            if op.kind in REDUCING:
                partial = mesh_order(mesh, [a for d in op.reduced_dims for a in op_axes.get(d.name, ())])
                computed = computed.with_partial(partial)
        # output: reduce partial sums, or convert to where it is stored
        out_steps: tuple[Step, ...] = ()
        out_conv: Conversion | None = None
        if computed.partial:
            fn = {"max": "max", "min": "min", "argmax": "max", "argmin": "min", "and": "and",
                  "or": "or"}.get(op.fn, "sum") if op.kind == "reduce" else "sum"
            if unsplittable(op):
                names = [d.name for d in op.reduced_dims]
                raise LoweringError(
                    f"op {op.name!r}: reduce_{op.fn} over a dim split across mesh axes "
                    f"{list(computed.partial)} has no single-collective lowering (only "
                    f"{', '.join(COMBINABLE)} do); leave {names} unsplit")
            if op.fn in ("argmax", "argmin") and op.kind == "reduce":
                # the winner's index needs the winning value first: pmax/pmin of the local extremes
                # (value dtype), then pmin of the candidates' global indices
                n = computed.local_elements(sizes, mesh)
                grp = math.prod(mesh.axis_size(a) for a in computed.partial)
                out_steps = (Step(ALL_REDUCE, op.name, computed.partial, grp,
                                  n * _itemsize(op.input_dtypes[0]), "", 0, fn),
                             Step(ALL_REDUCE, op.name, computed.partial, grp, n * itemsize, "", 0, "min"))
            else:
                out_steps = tuple(reduction(op.name, computed, out_stored, sizes, mesh, itemsize, fn))
        elif op.kind not in ("reshape", "constant"):
            out_conv = conversion(op.name, computed, out_stored, sizes, mesh, itemsize)
            if out_conv.identity:
                out_conv = None
        moved = bool(move_list) or any(c.steps for c in conversions.values())
        flops, nbytes = self._work(op, op_axes, flat, reads, computed, out_stored, moved)
        return self._plan(op, op_axes, flat, conversions, mv, computed, out_stored, out_steps, out_conv,
                          flops, nbytes, move_list, loop_back, reads)

    def _boundary_need(self, op: Op, sh: UpdateShard | None, flat: Placement | None,
                       out: Placement) -> Placement:
        """Where a loop boundary op needs its input: the output's placement carried over to
        the input's dims by the op's groups (the loop dim unsplit), or the flattened shard."""
        dims = self.graph.tensor(op.inputs[0]).dim_names
        if flat is not None:
            return sh.placement(self.graph, dims, self.axes_of)
        pair = {gi[0]: go[0] for gi, go in op.attr("groups", ()) if len(gi) == 1 and len(go) == 1}
        return Placement(dims, tuple(out.axes_of(pair[d]) if d in pair else () for d in dims))

    def _loop_back(self, op: Op, out: Placement) -> Conversion | None:
        """A carry's next value (end of an iteration) moved to where the carry lives."""
        g = self.graph
        lp = next((lp for lp in getattr(g, "loops", {}).values() if op.name in dict(lp.carries)), None)
        if lp is None:  # planning one op alone (the search's tables): the tracer gives a carry's
            return None  # next value the carry's dims, so under the rules alone nothing moves
        nxt = dict(lp.carries)[op.name]
        have = self.stored(nxt)
        if have.flat or out.flat:
            if have != Placement(have.dims, have.axes, out.flat, have.kept) or have.flat != out.flat:
                raise LayoutError(f"internal: carry {op.name!r} changes its flattened placement inside "
                                  f"loop {lp.name!r} ({have} -> {out})")
            return None
        groups = identity_groups(g.tensor(nxt).shape, g.tensor(op.name).shape)
        mv = moves(groups, self.sizes, _axes_map(have), _axes_map(out), self.mesh)
        if mv.pos_in == mv.pos_out and not mv.slices:
            return None
        nbytes = have.local_elements(self.sizes, self.mesh) * g.tensor(nxt).itemsize
        return Conversion(have, out, tuple(move_steps(nxt, mv, nbytes, self.mesh)), mv, False, False)

    def _convert(self, name: str, need: Placement, conversions: dict, reads: dict) -> None:
        conv = conversion(name, self.stored(name), need, self.sizes, self.mesh, self.graph.tensor(name).itemsize)
        if not conv.identity:
            conversions[name] = conv
        reads[name] = need

    def _work(self, op: Op, op_axes: Mapping, flat: Placement | None, reads: Mapping[str, Placement],
              computed: Placement, out_stored: Placement, moved: bool) -> tuple[int, int]:
        """Local flops and HBM bytes of one execution (only materialised tensors are read or
        written, see graph._with_fusion; a local reshape moves nothing worth counting)."""
        g, mesh, sizes = self.graph, self.mesh, self.sizes
        if flat is not None:
            n = flat.local_elements(sizes, mesh)
            flops = n if op.kind == "elementwise" else 0
        else:
            local = {d.name: d.size // math.prod(mesh.axis_size(a) for a in op_axes.get(d.name, ()))
                     for d in op.dims}
            flops = op.flops(local)
        if op.kind == "reshape" and not moved:
            return flops, 0
        hbm = op.hbm or (True,) * (len(op.inputs) + 1)
        nbytes = computed.local_elements(sizes, mesh) * op.output.itemsize if hbm[-1] else 0
        dtypes = op.input_dtypes or (op.output.dtype,) * len(op.inputs)
        for name, dtype, read in zip(op.inputs, dtypes, hbm):
            if read:
                p = reads.get(name) or self.stored(name)
                nbytes += p.local_elements(sizes, mesh) * _itemsize(dtype)
        return flops, nbytes

    def _plan(self, op: Op, op_axes: Mapping, flat: Placement | None, conversions: Mapping,
              mv: Moves | None, computed: Placement, out: Placement, out_steps: tuple, out_conv: Any,
              flops: int, nbytes: int, move_list: tuple = (), loop_back: Conversion | None = None,
              reads: Mapping[str, Placement] | None = None) -> OpPlan:
        # Matmul speed follows the operand dtype (bf16 inputs accumulate in f32 on TPU/GPU).
        dtype = op.input_dtypes[0] if op.kind == "einsum" and op.input_dtypes else op.output.dtype
        return OpPlan(op.name, op.kind, op.multiplicity, op_axes, flat, conversions, mv, computed, out,
                      tuple(out_steps), out_conv, int(flops), int(nbytes), dtype, tuple(move_list), loop_back,
                      dict(reads or {}))


def _axes_map(p: Placement) -> dict[str, tuple[str, ...]]:
    return {d: ax for d, ax in zip(p.dims, p.axes) if ax}


def _itemsize(dtype: str) -> int:
    import numpy as np
    return np.dtype(dtype).itemsize


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Plan:
    """The plan of one call of ``graph`` under ``layout`` on ``mesh``.

    ``placements`` maps every tensor to where it is stored; ``ops`` every op (graph order)
    to its :class:`OpPlan`; ``shards`` each weight-update-sharded parameter to its
    :class:`UpdateShard`; ``local_bytes`` every tensor to its bytes on one device
    (0 for elementwise intermediates fused into their consumers).

    Example::

        p = plan(models.mlp(64, 32, 128), "rows:2,cols:4", "batch:rows;hidden:cols")
        [str(s) for s in p.steps()]   # every collective of the step, in order
    """

    graph: Graph = field(repr=False)
    mesh: Mesh
    layout: Layout
    placements: Mapping[str, Placement] = field(repr=False)
    ops: Mapping[str, OpPlan] = field(repr=False)
    shards: Mapping[str, UpdateShard] = field(repr=False)
    local_bytes: Mapping[str, int] = field(repr=False)

    def steps(self) -> list[tuple[str, Step]]:
        """``(op, step)`` for every collective, ops in graph order (each op's steps once; a
        scan body's op runs ``OpPlan.count`` times per step)."""
        return [(name, s) for name, p in self.ops.items() for s in p.steps]


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


def plan(graph: Graph, mesh: Any, layout: Any = None) -> Plan:
    """Plan one call of ``graph`` under ``layout`` on ``mesh``.

    Args:
        graph: a traced graph.
        mesh: anything :class:`~autolayout.core.Mesh` accepts.
        layout: anything :class:`~autolayout.core.Layout` accepts (``None``: replicated).

    Returns:
        A :class:`Plan`.

    Raises:
        LayoutError: the layout is not valid for the graph on the mesh.
    """
    mesh, layout, axes_of = resolve_layout(graph, mesh, layout)
    planner = Planner(graph, mesh, axes_of, update_shards(graph, mesh, layout, axes_of))
    ops = {op.name: planner.op_plan(op) for op in graph.ops()}
    placements = {name: planner.stored(name) for name in graph.order}
    local = {op.name: (planner.local_bytes(op.name) if not op.hbm or op.hbm[-1] else 0) for op in graph.ops()}
    return Plan(graph, mesh, layout, placements, ops, planner.shards, local)
