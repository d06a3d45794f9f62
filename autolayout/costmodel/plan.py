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
(:class:`StorageShard`).

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
* ``along`` (slice, pad, concatenate, split, cumulative sums, sort, top_k, rev,
  dynamic slices and updates) and convolutions' spatial dims: computes with the dims it
  works along (attr ``whole``) unsplit: an input split along one is all-gathered first (the relayout a sliced split dim
  needs), and the output, computed whole along its new dim, is sliced locally into its
  stored placement.
* ``reshape`` (rename, split, merge, loop boundaries): :func:`~.placement.moves`
  between the input's and the output's placements.
* an input stored in another placement than the op needs is converted first
  (:func:`~.placement.conversion`), e.g. an update shard read by an op that is
  not an update op is all-gathered. Ops of one computation that read a tensor in
  the same placement share one conversion, made for the first of them and held
  until the last (:func:`shared_reads`: XLA's CSE of identical collectives).

Compute is a per-device roofline on the local sizes (``rules.price``).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autolayout.core import WHOLE, Layout, LayoutError, Mesh
from autolayout.costmodel.placement import (ALL_REDUCE, Conversion, Moves, Placement, Step, conversion,
                                            mesh_order, move_buffer_bytes, move_steps, moves, reduce_target,
                                            reduction)
from autolayout.costmodel.regions import EMPTY as EMPTY_REGIONS
from autolayout.costmodel.regions import NORM, Regions, region_axes, regions
from autolayout.costmodel.sharing import SOURCES, held_whole, shared_providers, shared_reads
from autolayout.costmodel.storage import (REDUCING, StorageShard, grad_of, gradient_walk, opt_state_of,
                                          storage_shards)
from autolayout.graph import Graph, Op
from autolayout.schedule import identity_groups

__all__ = ["Plan", "OpPlan", "Planner", "LoweringError", "plan", "compact_layout", "resolve_layout", "check_op",
           "grad_of", "opt_state_of", "gradient_walk", "unsplittable", "StorageShard", "REDUCING", "SOURCES"]


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
    # transient buffers while the op runs: inputs it gathered (e.g. FSDP weights), and a reshape's
    # all-gathered block before it slices it (:func:`~.placement.move_buffer_bytes`)
    temp_bytes: int = 0
    reduced: Placement | None = None  # where out_steps reduce to, when out_conversion then moves it
    # inputs read from another op's conversion (input -> that op; :func:`shared_reads`), and the
    # bytes of this op's conversions that later readers share (held from here to the last of them)
    shared: Mapping[str, str] = field(default_factory=dict)
    span_bytes: Mapping[str, int] = field(default_factory=dict)

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
                 shards: Mapping[str, StorageShard] | None = None, regions: Regions | None = None,
                 sharing: tuple[Mapping[tuple[str, str], str], set] | None = None) -> None:
        self.graph, self.mesh, self.axes_of = graph, mesh, axes_of
        self.regions = regions if regions is not None else EMPTY_REGIONS
        # the rules as the norm region sees them (dim@norm rules in place of the dims' own)
        self.norm_axes = region_axes(axes_of, NORM) if self.regions.dims else dict(axes_of)
        self.shards = dict(shards or {})
        self.sizes = graph.dims
        self._stored: dict[str, StorageShard] = {}
        self._computed: dict[str, StorageShard] = {}
        self._scatter: dict[str, StorageShard] = {}
        self._partial: dict[str, StorageShard] = {}
        self._partial_ops: dict[str, StorageShard] = {}
        for sh in self.shards.values():
            for field_, index in ((sh.stored, self._stored), (sh.computed, self._computed),
                                  (sh.scatter_ops, self._scatter), (sh.partial, self._partial),
                                  (sh.partial_ops, self._partial_ops)):
                for t in field_:
                    index[t] = sh
        self._cache: dict[str, Placement] = {}
        if sharing is None:  # (op, input) -> provider; the (provider, input) pairs (shared_reads)
            sharing = (shared_reads(graph)[0], shared_providers(graph))
        self._sharing, self._providing = sharing

    # -- placements -----------------------------------------------------------------
    def stored(self, name: str) -> Placement:
        """Where tensor ``name`` is stored."""
        hit = self._cache.get(name)
        if hit is None:
            dims = self.graph.tensor(name).dim_names
            sh = self._stored.get(name)
            axes = self.norm_axes if name in self.regions.stored else self.axes_of
            hit = sh.placement(self.graph, dims, axes) if sh else Placement.of(dims, axes)
            if name in self._partial:  # stage 1: a partial sum over the shard's axes until complete
                hit = hit.with_partial(mesh_order(self.mesh, self._partial[name].axes))
            self._cache[name] = hit
        return hit

    def local_bytes(self, name: str) -> int:
        """Bytes tensor ``name`` takes on one device. A stack of partial sums reduced once it is
        complete (stage 1) is counted at its full size: the scan fills that buffer layer by
        layer, and it lives through the whole loop."""
        t = self.graph.tensor(name)
        p = self.stored(name)
        if name in self._scatter and name in self._partial_ops and self.graph.op(name).fn == "stack":
            p = Placement.of(t.dim_names, self.norm_axes if name in self.regions.stored else self.axes_of)
        return p.local_elements(self.sizes, self.mesh) * t.itemsize

    def shard_of(self, op: str) -> StorageShard | None:
        """The update shard an op computes on, if any."""
        return self._computed.get(op)

    # -- ops ------------------------------------------------------------------------------
    def op_plan(self, op: Op) -> OpPlan:
        """The plan of one execution of ``op``."""
        g, mesh, sizes = self.graph, self.mesh, self.sizes
        out_stored = self.stored(op.name)
        sh = self._computed.get(op.name)
        rules = self.norm_axes if op.name in self.regions.ops else self.axes_of
        axes = dict(rules)
        flat = None
        if sh is not None:
            if sh.dim:
                axes[sh.dim] = axes.get(sh.dim, ()) + sh.axes
            else:
                flat = sh.placement(g, op.output.dim_names, rules)
        op_axes = {d.name: axes.get(d.name, ()) for d in op.dims}
        op_axes = {d: a for d, a in op_axes.items() if a}
        if op.kind in SOURCES:
            return self._plan(op, op_axes, None, {}, None, out_stored, out_stored, (), None, 0, 0, reads={})
        check_op(op, op_axes)
        if op.attr("whole"):  # along ops, convolutions: the dims they work along whole (gathered where split)
            op_axes = {d: a for d, a in op_axes.items() if d not in op.attr("whole", ())}
        itemsize = op.output.itemsize
        computed = flat if flat is not None else Placement.of(op.output.dim_names, op_axes)
        conversions: dict[str, Conversion] = {}
        reads: dict[str, Placement] = {}
        shared: dict[str, str] = {}
        mv: Moves | None = None
        move_list: tuple[Step, ...] = ()
        loop_back: Conversion | None = None
        partial_sh = self._partial_ops.get(op.name)
        carried = mesh_order(mesh, partial_sh.axes) if partial_sh else ()  # stage 1: partial sums pass through
        if op.kind == "constant":
            computed = out_stored
        elif op.kind == "reshape":
            src = op.inputs[0]
            have = self.stored(src)
            computed = out_stored
            if carried:
                computed = Placement.of(op.output.dim_names, rules).with_partial(carried)
            if op.fn in ("slice", "stack") or flat is not None:
                # (un)stacking moves no data between devices, nor does a loop boundary of
                # flattened shards (chunks are per layer): convert the input to where the
                # output is, then (un)stack or relabel locally
                need = self._boundary_need(op, sh, flat, computed, rules)
                self._convert(src, need.with_partial(have.partial) if carried else need, conversions, reads)
            else:
                need = have.base() if have.flat else have
                self._convert(src, need.with_partial(have.partial) if carried else need, conversions, reads)
                mv = moves(op.attr("groups", ()), sizes, _axes_map(need), _axes_map(computed), mesh)
                nbytes = need.local_elements(sizes, mesh) * g.tensor(src).itemsize
                move_list = tuple(move_steps(op.name, mv, nbytes, mesh))
            if op.fn == "carry":
                loop_back = self._loop_back(op, out_stored)
        else:
            partial = [a for d in op.reduced_dims for a in op_axes.get(d.name, ())] if op.kind in REDUCING else []
            if partial or carried:
                computed = computed.with_partial(mesh_order(mesh, [*partial, *carried]))
            target = reduce_target(computed, out_stored) if computed.partial else out_stored
            for name in dict.fromkeys(op.inputs):
                t = g.tensor(name)
                if op.kind == "scatter" and name == op.inputs[0]:
                    need = target.with_partial(())  # the base operand, added to the reduced updates
                elif flat is not None:
                    need = (sh.placement(g, t.dim_names, rules) if sh.applies(g, t.dim_names)
                            else Placement.of(t.dim_names, rules))  # broadcast into the shard locally
                else:
                    need = _read_need(op, name, t.dim_names, op_axes)
                if carried and self.stored(name).partial:
                    need = need.with_partial(self.stored(name).partial)
                self._convert(name, need, conversions, reads)
                if name in conversions and conversions[name].steps and self._shares(op, name, need, sh, flat, carried):
                    shared[name] = self._sharing[(op.name, name)]
                    del conversions[name]  # read from the provider's converted copy
        # output: reduce partial sums, or convert to where it is stored
        out_steps: tuple[Step, ...] = ()
        out_conv: Conversion | None = None
        reduced: Placement | None = None
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
                reduced = reduce_target(computed, out_stored)
                out_steps = tuple(reduction(op.name, computed, reduced, sizes, mesh, itemsize, fn))
                if _axes_map(reduced) != _axes_map(out_stored) or reduced.flat != out_stored.flat:
                    out_conv = conversion(op.name, reduced.with_partial(()), out_stored, sizes, mesh, itemsize)
                    if out_conv.identity:
                        out_conv = None
                else:
                    reduced = None
        elif op.kind not in ("reshape", "constant"):
            out_conv = conversion(op.name, computed, out_stored, sizes, mesh, itemsize)
            if out_conv.identity:
                out_conv = None
        moved = bool(move_list) or any(c.steps for c in conversions.values())
        flops, nbytes = self._work(op, op_axes, flat, reads, computed, out_stored, moved)
        spans = {name: c.dst.local_elements(sizes, mesh) * g.tensor(name).itemsize
                 for name, c in conversions.items()
                 if c.steps and (op.name, name) in self._providing and self._shareable(op.name, sh, flat, carried)}
        return self._plan(op, op_axes, flat, conversions, mv, computed, out_stored, out_steps, out_conv,
                          flops, nbytes, move_list, loop_back, reads, reduced, shared, spans)

    def _shareable(self, op: str, sh: StorageShard | None, flat: Placement | None, carried: tuple) -> bool:
        """Whether ``op`` reads its inputs in the layout's placements (:func:`shared_reads`): not
        computing on a storage shard, nor carrying a stage-1 partial sum."""
        return sh is None and flat is None and not carried and op not in self._partial_ops

    def _shares(self, op: Op, name: str, need: Placement, sh: StorageShard | None, flat: Placement | None,
                carried: tuple) -> bool:
        """Whether ``op`` reads ``name`` from an earlier op's conversion (:func:`shared_reads`): both
        read it in the layout's placements, and the provider needs the placement ``op`` does."""
        prov = self._sharing.get((op.name, name))
        if prov is None or not self._shareable(op.name, sh, flat, carried):
            return False
        if not self.shards:  # the rules alone: the same placement by shared_reads' grouping
            return True
        if prov in self._computed or prov in self._partial_ops:
            return False
        p = self.graph.op(prov)  # off the shard: its dims split as the rules say, less those held whole
        rules = self.norm_axes if prov in self.regions.ops else self.axes_of
        op_axes = {d.name: rules[d.name] for d in p.dims if rules.get(d.name) and d.name not in p.attr("whole", ())}
        return need == _read_need(p, name, self.graph.tensor(name).dim_names, op_axes)

    def _boundary_need(self, op: Op, sh: StorageShard | None, flat: Placement | None,
                       out: Placement, rules: Mapping[str, tuple[str, ...]]) -> Placement:
        """Where a loop boundary op needs its input: the output's placement carried over to
        the input's dims by the op's groups (the loop dim unsplit), or the flattened shard."""
        dims = self.graph.tensor(op.inputs[0]).dim_names
        if flat is not None:
            return sh.placement(self.graph, dims, rules)
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
        written, see fusion.with_fusion; a local reshape moves nothing worth counting)."""
        mesh, sizes = self.mesh, self.sizes
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
        nbytes = computed.local_elements(sizes, mesh) * op.output.itemsize if op.materialised else 0
        dtypes = op.input_dtypes or (op.output.dtype,) * len(op.inputs)
        for name, dtype, read in zip(op.inputs, dtypes, hbm):
            if read:
                p = reads.get(name) or self.stored(name)
                nbytes += p.local_elements(sizes, mesh) * _itemsize(dtype)
        return flops, nbytes

    def _plan(self, op: Op, op_axes: Mapping, flat: Placement | None, conversions: Mapping,
              mv: Moves | None, computed: Placement, out: Placement, out_steps: tuple, out_conv: Any,
              flops: int, nbytes: int, move_list: tuple = (), loop_back: Conversion | None = None,
              reads: Mapping[str, Placement] | None = None, reduced: Placement | None = None,
              shared: Mapping[str, str] | None = None, spans: Mapping[str, int] | None = None) -> OpPlan:
        # Matmul speed follows the operand dtype (bf16 inputs accumulate in f32 on TPU/GPU); with
        # mixed operands XLA converts to the wider one before the dot, so that one sets the rate.
        dtype = (max(op.input_dtypes, key=_itemsize) if op.kind == "einsum" and op.input_dtypes
                 else op.output.dtype)
        spans = dict(spans or {})  # converted copies held for later readers: spans of their own
        temp = sum(c.dst.local_elements(self.sizes, self.mesh) * self.graph.tensor(name).itemsize
                   for name, c in conversions.items() if c.steps and name not in spans)
        if mv is not None:  # a regrouping's all-gathered block before its slice (move_buffer_bytes)
            temp += move_buffer_bytes(mv, move_list)
        return OpPlan(op.name, op.kind, op.multiplicity, op_axes, flat, conversions, mv, computed, out,
                      tuple(out_steps), out_conv, int(flops), int(nbytes), dtype, tuple(move_list), loop_back,
                      dict(reads or {}), int(temp), reduced, dict(shared or {}), spans)


def _read_need(op: Op, name: str, dims: tuple[str, ...], op_axes: Mapping[str, tuple[str, ...]]) -> Placement:
    """Where ``op``, computing with its dims split over ``op_axes``, reads its input ``name`` (of
    ``dims``): split as the op's dims are, less a dim it holds whole (:func:`held_whole`)."""
    whole = held_whole(op, name)
    return Placement.of(dims, {d: a for d, a in op_axes.items() if d != whole})


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
    :class:`StorageShard`; ``local_bytes`` every tensor to its bytes on one device
    (0 for elementwise intermediates fused into their consumers); ``notes`` say where a
    ``*`` storage entry did not apply; ``axes_of`` the mesh axes each dim is split over
    (:func:`resolve_layout`'s, which the plan was made from).

    Example::

        p = plan(models.mlp(64, 32, 128), "rows:2,cols:4", "batch:rows;hidden:cols")
        [str(s) for s in p.steps()]   # every collective of the step, in order
    """

    graph: Graph = field(repr=False)
    mesh: Mesh
    layout: Layout
    placements: Mapping[str, Placement] = field(repr=False)
    ops: Mapping[str, OpPlan] = field(repr=False)
    shards: Mapping[str, StorageShard] = field(repr=False)
    local_bytes: Mapping[str, int] = field(repr=False)
    notes: tuple[str, ...] = ()
    axes_of: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def steps(self) -> list[tuple[str, Step]]:
        """``(op, step)`` for every collective, ops in graph order (each op's steps once; a
        scan body's op runs ``OpPlan.count`` times per step)."""
        return [(name, s) for name, p in self.ops.items() for s in p.steps]


def resolve_layout(graph: Graph, mesh: Any, layout: Any) -> tuple[Mesh, Layout, dict]:
    """Coerce and validate; returns ``(mesh, layout, axes_of)`` (``axes_of`` keyed by dim, and
    by ``dim@region`` for region rules)."""
    mesh = Mesh.parse(mesh)
    layout = Layout.coerce(layout)
    layout.validate(graph, mesh)
    for d in graph.loop_dims:
        if layout.axes_of(d):
            raise LayoutError(
                f"dim {d!r} indexes the iterations of a scan (stacked layers) and cannot be split over "
                f"{','.join(layout.axes_of(d))}: each device runs every iteration. Remove the rule "
                f"'{d}:{','.join(layout.axes_of(d))}'.")
    axes_of = {d: layout.axes_of(d) for d in graph.dims if layout.axes_of(d)}
    axes_of.update((k, a) for k, a in layout.rules if "@" in k)
    return mesh, layout, axes_of


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
    graph, mesh, layout, axes_of, regs, shards, notes = _stored(graph, mesh, layout)
    planner = Planner(graph, mesh, axes_of, shards, regs)
    ops = {op.name: planner.op_plan(op) for op in graph.ops()}
    placements = {name: planner.stored(name) for name in graph.order}
    local = {op.name: (planner.local_bytes(op.name) if op.materialised else 0) for op in graph.ops()}
    return Plan(graph, mesh, layout, placements, ops, planner.shards, local, tuple(notes), axes_of)


def _stored(graph: Graph, mesh: Any, layout: Any) -> tuple:
    """``(graph, mesh, layout, axes_of, regions, shards, notes)`` of :func:`plan`: the layout
    validated, the graph its ``remat=`` policy rewrites, its regions, and each parameter's
    :class:`~autolayout.costmodel.storage.StorageShard` with the notes on ``*`` entries."""
    mesh, layout, axes_of = resolve_layout(graph, mesh, layout)
    if layout.remat and layout.remat != "none":
        from autolayout.remat import rematerialize
        graph = rematerialize(graph, layout.remat)
    regs = regions(graph)
    unused = [k for k in axes_of if "@" in k and k.partition("@")[0] not in regs.dims]
    if unused:
        raise LayoutError(
            f"layout {str(layout)!r}: rule {unused[0]!r} names the norm region of dim {unused[0].split('@')[0]!r}, "
            f"but graph {graph.name!r} has no region with that dim (region dims: {sorted(regs.dims) or 'none'}: "
            "the dims of its scans' carries). Drop the rule.")
    shards, notes = storage_shards(graph, mesh, layout, axes_of, regs)
    return graph, mesh, layout, axes_of, regs, shards, notes


def compact_layout(graph: Graph, mesh: Any, layout: Any) -> Layout:
    """``layout`` written shorter: the storage entry most parameters share, once, as ``*``.

    A searched layout names each parameter's storage (``layers/w1:data@3;layers/w2:data@3;...``);
    ``*`` stands for every parameter not named otherwise (README, storage sharding), so the
    entry most of them share can be written once and the others after it, with ``param:-``
    for each parameter the layout leaves whole that the ``*`` entry would shard. That is
    checked, not assumed (``*`` takes only the axes each parameter allows): the shorter layout
    is returned only where every parameter's
    :class:`~autolayout.costmodel.storage.StorageShard` (what :func:`plan`, the search and the
    lowering use) is the layout's own; else the next most shared entry is tried, and where none
    gives a shorter layout the layout comes back as it is.

    Args:
        graph: a traced graph.
        mesh: anything :class:`~autolayout.core.Mesh` accepts.
        layout: anything :class:`~autolayout.core.Layout` accepts.

    Returns:
        A :class:`~autolayout.core.Layout` that plans exactly as ``layout`` does, its string no
        longer than ``layout``'s.

    Raises:
        LayoutError: ``layout`` is not valid for the graph on the mesh.

    Example:
        >>> compact_layout(g, "data:8", "batch:data|w1:data@3;w2:data@3")  # doctest: +SKIP
        Layout('batch:data|*:data@3;b1:-')
    """
    layout = Layout.coerce(layout)
    shards = _shards(graph, mesh, layout)  # validates it (resolve_layout)
    entries = layout.storage
    if any(key == "*" for key, _, _ in entries):
        return layout
    for (axes, stage), n in Counter((axes, stage) for _, axes, stage in entries).most_common():  # ties: first named
        if n < 2:  # one parameter's entry is clearer under its own name
            break
        kept = [e for e in entries if (e[1], e[2]) != (axes, stage)]
        short = Layout(layout.rules, [("*", axes, stage)] + kept, remat=layout.remat)
        whole = [p for p in _shards(graph, mesh, short) if p not in shards]  # the '*' entry shards them
        short = Layout(layout.rules, [("*", axes, stage)] + kept + [(p, WHOLE) for p in whole], remat=layout.remat)
        if len(str(short)) < len(str(layout)) and _shards(graph, mesh, short) == shards:
            return short
    return layout


def _shards(graph: Graph, mesh: Any, layout: Layout) -> dict[str, StorageShard]:
    """Each parameter's :class:`~autolayout.costmodel.storage.StorageShard` under ``layout``, as
    :func:`plan` finds them."""
    return _stored(graph, mesh, layout)[5]
