"""Cost tables of the search: time per (dim group, assignment), bytes per tensor, symmetry.

Every number here comes from the cost model itself (``costmodel.rules.op_cost``
and a plan's ``local_bytes`` and ``OpCost.transient_bytes``), evaluated on the restriction of a
layout to the dims an op reads — which is all ``op_cost`` reads.

**Dim groups.** The DESIGN's one-hot ``y[c, a]`` per signature class ``c`` is
kept per *dim group* instead: all classes whose (non-loop) dims are the same
set ``D`` share one one-hot over the valid assignments ``a`` of ``D``, with
coefficient ``Σ_{c: dims(c) = D} k_c · time(c, a)``. Since ``y[D, ·]`` is
determined by the ``x[d, m]`` of ``D`` (the linking constraints), merging the
classes is exact and shrinks the model: GPT-3's 264 classes have 26 dim sets
(and model.py folds groups further into the maximal ones).

**Symmetry.** Mesh axes with the same size and the same link
(``hardware.link_for``) are interchangeable: permuting them maps layouts to
layouts of identical time and memory (collectives over several axes phase
through identical ``(size, link)`` groups whatever the order). Costs are
therefore computed once per orbit (:meth:`Tables.orbit_key`), and the model
orders the columns ``x[·, m]`` of interchangeable axes lexicographically.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from autolayout.core import Mesh
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.memory import stored_itemsize
from autolayout.costmodel.phases import pending_bytes, phased_reductions
from autolayout.costmodel.bitcasts import is_bitcast, is_rename
from autolayout.costmodel.broadcasts import broadcast_bytes
from autolayout.costmodel.recomputed import written
from autolayout.costmodel.copies import copy_switch, copy_transient_bytes, splits_contraction, switched_on
from autolayout.costmodel.gradients import COMBINED, REDUCTIONS
from autolayout.costmodel.order import memory_order
from autolayout.costmodel.overlap import domain_of, overlappable, split
from autolayout.costmodel.placement import Placement
from autolayout.costmodel.sharing import replaced_by_copy, shared_providers, shared_reads
from autolayout.costmodel.rules import OpCost, op_cost
from autolayout.graph import Graph, Op, Tensor
from autolayout.search.names import TRANSIENT_PARTS
from autolayout.search.space import Assignment, Space

__all__ = ["Group", "Tables", "share_bytes"]


def share_bytes(t: Tensor, graph: Graph, mesh: Mesh) -> int:
    """A lower bound on the local bytes of ``t`` under every layout and storage sharding: a
    device holds at least ``1/N`` of a materialised tensor's elements (the shards of ``N``
    devices cover it), 0 for a fused intermediate and for a value a reduction fusion shares, which
    a layout may have XLA recompute (``costmodel.recomputed``)."""
    op = graph.op(t.name)
    return -(-t.size // mesh.size) * t.itemsize if op.materialised and not op.reduction_shared else 0


@dataclass
class Group:
    """The one-hot over the valid assignments of one set of dims."""

    dims: tuple[str, ...]
    assignments: list[Assignment]
    index: dict[Assignment, int]
    time: np.ndarray  # seconds per step, Σ_c k_c · (compute + exposed comm), per assignment
    classes: list = field(default_factory=list)  # (representative op, count)
    # per overlap domain: Σ_c k_c · (overlappable comm - compute), per assignment
    over: dict = field(default_factory=dict)

    def axes_of(self, i: int) -> dict[str, tuple[str, ...]]:
        return {d: ax for d, ax in zip(self.dims, self.assignments[i]) if ax}


class _FastMesh(Mesh):
    """The same mesh with a dict lookup for ``axis_size`` (``op_cost`` calls it a lot)."""

    def __init__(self, axes) -> None:
        super().__init__(axes)
        object.__setattr__(self, "_size", dict(self.axes))

    def axis_size(self, name: str) -> int:
        size = self._size.get(name)
        return size if size is not None else super().axis_size(name)


class Tables:
    """Costs of ``graph`` on ``mesh`` under ``hw``, per dim group and assignment."""

    def __init__(self, graph: Graph, mesh: Mesh, hw: Hardware, *, regions: bool = True,
                 op_costs: dict | None = None) -> None:
        """``op_costs``: a dict to keep ``op_cost`` results in, by the op's cost signature and
        the orbit of its assignment; pass the same one to the tables of several remat policies
        of one step on one mesh and hardware to share them. ``graph`` is kept as ``hw``'s
        memory model walks it (``costmodel.order.memory_order``, as ``predict`` prices it), in the
        order of a layout that all-reduces some gradient; ``orders`` maps each way a layout may reduce
        its gradients (``gradients.REDUCTIONS``) to its order's graph (``search.orders``)."""
        self.graph, self.mesh, self.hw = memory_order(graph, hw), mesh, hw
        # the order of each way of reducing the gradients (search.orders); self.graph where the same
        self.orders = {r: self.graph if r == COMBINED else memory_order(graph, hw, reduction=r) for r in REDUCTIONS}
        self.combined_sizes: dict = {}  # search.warm.sizes_of's combined all-reduces, per assignment
        self.fast_mesh = _FastMesh(mesh.axes)
        self.space = Space(graph, mesh, regions=regions)
        self.views = self.space.views
        self.regions = self.views.regions
        # interchangeable axes: same size, same link
        buckets: dict[tuple, list[str]] = defaultdict(list)
        for a in self.space.axes:
            buckets[(mesh.axis_size(a), hw.link_for(a))].append(a)
        self.symmetric: list[tuple[str, ...]] = [tuple(v) for v in buckets.values()]
        self._op_cache: dict[tuple, OpCost] = {} if op_costs is None else op_costs
        self._sig: dict[str, tuple] = {}
        self._tdims: dict[str, tuple[str, ...]] = {}
        self.rank = {n: i for i, n in enumerate(graph.order)}
        self.overlap = overlappable(graph, hw)
        self.op_cost_calls = 0
        self.groups: dict[tuple[str, ...], Group] = {}
        self._tensor_bytes: dict[tuple, np.ndarray] = {}
        self._transient: dict[str, np.ndarray] = {}
        self._transient_sum: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
        self._phases: dict[str, tuple[np.ndarray, ...]] = {}  # partial, result, relayout, output bytes
        self._pending: dict[str, np.ndarray] = {}  # phases.pending_bytes
        self._gathered: dict[tuple[str, str, bool], np.ndarray] = {}
        self._gather_buffers: dict[tuple[str, str], np.ndarray] = {}  # reductions.half_gathers
        self._bitcasts: dict[str, np.ndarray] = {}
        self._stored: dict = {}  # stored_bytes, kept_bytes and recomputed_bytes: by tensor or (tensor, reader)
        self._copies: dict[tuple[str, int], np.ndarray] = {}
        self._switched: dict[tuple[str, int], tuple[tuple[str, ...], np.ndarray]] = {}
        self._held: dict[str, np.ndarray] = {}
        classes: dict[tuple, list] = {}
        for c in graph.signature_classes():  # split by how each op sees the regions
            for name in c.ops:
                op = graph.op(name)
                key = (c.signature, self.views.op(op), self.regions.op_region(name),
                       self.regions.tensor_region(name), tuple(self.regions.tensor_region(i) for i in op.inputs),
                       domain_of(op), self.overlap.flags(op), self._roles(op))
                if key in classes:
                    classes[key][1] += op.multiplicity
                else:
                    classes[key] = [op, op.multiplicity]
        for op, count in classes.values():
            g = self.group(self.space.order(self.views.op(op)))
            g.classes.append((op, count))
        for g in self.groups.values():
            if g.classes:
                keys = [self.orbit_key(g.dims, a) for a in g.assignments]
                g.time = np.zeros(len(keys))
                for op, k in g.classes:
                    sig = self._signature(op)
                    seen: dict[tuple, tuple[float, dict[str, float]]] = {}
                    for i, (key, a) in enumerate(zip(keys, g.assignments)):
                        t = seen.get(key)
                        if t is None:
                            oc = self._cost(op, sig, key, g.dims, a)
                            t = seen[key] = split(oc, op, self.overlap)
                        g.time[i] += k * t[0]
                        for dom, v in t[1].items():
                            g.over.setdefault(dom, np.zeros(len(keys)))[i] += k * v

    # -- groups -----------------------------------------------------------------------
    def group(self, dims: tuple[str, ...]) -> Group:
        """The group of ``dims`` (canonical order), created on first use."""
        g = self.groups.get(dims)
        if g is None:
            assigns = self.space.assignments(dims)
            g = Group(dims, assigns, {a: i for i, a in enumerate(assigns)}, np.zeros(len(assigns)))
            self.groups[dims] = g
        return g

    def orbit_key(self, dims: tuple[str, ...], a: Assignment) -> tuple:
        """Equal for assignments that differ by a permutation of interchangeable axes."""
        return tuple(tuple(sorted(tuple(i for i, ax in enumerate(a) if m in ax) for m in sym))
                     for sym in self.symmetric)

    def cost_signature(self, op: Op) -> tuple:
        """What an op's priced plan depends on besides its dims' axes: equal for ops that cost
        the same under the same assignment (op signature, regions, overlap)."""
        return self._signature(op)[0]

    def _signature(self, op: Op) -> tuple:
        hit = self._sig.get(op.name)
        if hit is None:
            view = self.space.order(self.views.op(op))
            regs = (self.regions.op_region(op.name), self.regions.tensor_region(op.name),
                    tuple(self.regions.tensor_region(i) for i in op.inputs))
            hit = self._sig[op.name] = ((op.signature(), view, regs, self.overlap.flags(op), self._roles(op)), view)
        return hit

    def _roles(self, op: Op) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The operands ``op`` reads from an earlier op's conversion, and those it converts for
        later readers too (``sharing.shared_reads``), by index: ops alike otherwise cost alike only
        when these are alike too."""
        sharing, providing = shared_reads(self.graph)[0], shared_providers(self.graph)
        return (tuple(k for k, t in enumerate(op.inputs) if (op.name, t) in sharing),
                tuple(k for k, t in enumerate(op.inputs) if (op.name, t) in providing))

    def _cost(self, op: Op, sig: tuple, key: tuple, dims: tuple[str, ...], a: Assignment) -> OpCost:
        hit = self._op_cache.get((sig[0], key))
        if hit is None:
            self.op_cost_calls += 1
            shared, provides = self._roles(op)
            hit = self._op_cache[sig[0], key] = op_cost(op, {d: ax for d, ax in zip(dims, a) if ax},
                                                        self.fast_mesh, self.hw, self.regions, self.overlap,
                                                        tuple(op.inputs[k] for k in shared),
                                                        tuple(op.inputs[k] for k in provides))
        return hit

    def op_cost(self, op: Op, dims: tuple[str, ...], a: Assignment) -> OpCost:
        """``rules.op_cost`` of ``op`` under assignment ``a`` of ``dims`` (⊇ the op's dims), cached per orbit."""
        sig = self._signature(op)
        mine = sig[1]
        sub = tuple(ax for d, ax in zip(dims, a) if d in mine) if mine != dims else a
        return self._cost(op, sig, self.orbit_key(mine, sub), mine, sub)

    # -- memory -------------------------------------------------------------------------
    def tensor_dims(self, t: Tensor) -> tuple[str, ...]:
        """The search dims of tensor ``t`` as stored (canonical order)."""
        hit = self._tdims.get(t.name)
        if hit is None:
            hit = self._tdims[t.name] = self.space.order(self.views.tensor(t.name))
        return hit

    def tensor_bytes(self, t: Tensor) -> np.ndarray:
        """Local bytes ``t`` takes in memory under the layout's rules (as a plan's
        ``local_bytes`` counts them, at :func:`~autolayout.costmodel.memory.stored_itemsize`
        bytes per element, as ``predict`` does) for each assignment of its group; 0 if it is
        an elementwise intermediate fused into its consumers."""
        dims = self.tensor_dims(t)
        stored = self.graph.op(t.name).materialised
        itemsize = stored_itemsize(self.graph, t.name, self.hw)
        key = (dims, tuple((d.name, d.size) for d in t.shape), itemsize, stored)
        hit = self._tensor_bytes.get(key)
        if hit is None:
            hit = self._tensor_bytes[key] = self._local_elements(t) * itemsize if stored else np.zeros(
                len(self.group(dims).assignments), dtype=np.int64)
        return hit

    def _local_elements(self, t: Tensor) -> np.ndarray:
        """The elements of ``t`` on one device for each assignment of its group."""
        dims = self.tensor_dims(t)
        g = self.group(dims)
        base = self.space.base
        return np.array([Placement.of(t.dim_names, {base[d]: ax for d, ax in g.axes_of(i).items()})
                         .local_elements(self.graph.dims, self.fast_mesh) for i in range(len(g.assignments))],
                        dtype=np.int64)

    def transient_bytes(self, op: Op) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the bytes ``op`` holds only while it runs under the layout's rules
        (``OpCost.running_bytes``: :attr:`~autolayout.costmodel.reductions.ReductionBytes.transient`, or the
        contraction's bytes for an op counted in phases; and the operand copies of a
        contraction, :func:`~autolayout.costmodel.copies.copy_transient_bytes`, as ``predict``
        counts them) for each assignment of the group of its dims."""
        hit = self._transient_sum.get(op.name)
        if hit is None:
            dims, parts = self.transient_parts(op)
            hit = self._transient_sum[op.name] = (dims, parts.sum(axis=1))
        return hit

    def transient_parts(self, op: Op) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: :meth:`transient_bytes` as the buffers it is made of, one row per
        assignment of the group of its dims: ``OpCost.running_parts`` and the operand copies at
        the dot, as ``predict`` places them in output allocations (``memory._output_peak``)."""
        dims = self.space.order(self.views.op(op))
        hit = self._transient.get(op.name)
        if hit is None:
            g = self.group(dims)
            costs = [self.op_cost(op, dims, a) for a in g.assignments]
            phased = op.name in phased_reductions(self.graph, self.hw.combines_gradient_reductions)
            hit = self._transient[op.name] = np.array(
                [oc.running_parts(phased) + (copy_transient_bytes(self.graph, op.name, oc.operand_copy_bytes),)
                 for oc in costs], dtype=np.int64).reshape(len(costs), TRANSIENT_PARTS)
        return dims, hit

    def phase_bytes(self, op: Op) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        """``(dims, partial, result)`` of a split reduction (``phases.split_reductions``), for
        each assignment of the group of its dims, as ``predict`` counts them: the bytes of the
        partial sums its collective's phase holds (``OpCost.partial_bytes``: 0 where nothing is
        reduced) and those of its output in its contraction's phase (0 while it writes partial
        sums, else the output's :meth:`tensor_bytes`)."""
        dims = self.space.order(self.views.op(op))
        hit = self._phases.get(op.name)
        if hit is None:
            g = self.group(dims)
            t = self.graph.tensor(op.name)
            out_dims, out_bytes = self.tensor_dims(t), self.tensor_bytes(t)
            costs = [self.op_cost(op, dims, a) for a in g.assignments]
            partial = np.array([oc.partial_bytes for oc in costs], dtype=np.int64)
            output = out_bytes[[self.restrict(g.axes_of(i), out_dims) for i in range(len(g.assignments))]]
            result = np.where(partial > 0, 0, output)
            relayout = np.array([oc.relayout_bytes for oc in costs], dtype=np.int64)
            hit = self._phases[op.name] = (partial, result, relayout, output)
        return (dims, *hit[:2])

    def pending_bytes(self, op: Op) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: what a split reduction's partial sums add while they wait for a
        later collective (``phases.pending_bytes`` of its :meth:`phase_bytes`, relayout copy and
        output bytes, as ``predict`` counts them), for each assignment of the group of its dims."""
        dims = self.space.order(self.views.op(op))
        hit = self._pending.get(op.name)
        if hit is None:
            self.phase_bytes(op)  # computed with the partial sums, from the same costs
            partial, _, relayout, output = self._phases[op.name]
            hit = self._pending[op.name] = np.array([pending_bytes(*row) for row in zip(partial, relayout, output)],
                                                    dtype=np.int64)
        return dims, hit

    def relayout_bytes(self, op: Op) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the part of a split reduction's partial bytes (:meth:`phase_bytes`)
        that is its relayout copy, a buffer of its own (``OpCost.relayout_bytes``, 0 where there is
        none), for each assignment of the group of its dims."""
        dims = self.space.order(self.views.op(op))
        self.phase_bytes(op)  # computed with the partial bytes, from the same costs
        return dims, self._phases[op.name][2]

    def copy_bytes(self, op: Op, k: int) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the bytes of the copy contraction ``op`` makes of its operand ``k``
        (``OpCost.operand_copy_bytes[k]``: :func:`~autolayout.costmodel.reductions.operand_copy_bytes`,
        0 where read in place; live from the operand's producer on where
        :func:`~autolayout.costmodel.copies.copy_spans` says so, as ``predict`` counts it) for each
        assignment of the group of its dims."""
        dims = self.space.order(self.views.op(op))
        hit = self._copies.get((op.name, k))
        if hit is None:
            g = self.group(dims)
            hit = self._copies[(op.name, k)] = np.array(
                [(self.op_cost(op, dims, a).operand_copy_bytes or (0,) * (k + 1))[k] for a in g.assignments],
                dtype=np.int64)
        return dims, hit

    def switched_copy_bytes(self, op: Op, k: int) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: :meth:`copy_bytes` where the layout puts that copy at its value's
        producer too (:func:`~autolayout.costmodel.copies.switched_on` of its
        :func:`~autolayout.costmodel.copies.copy_switch`, as ``predict`` counts it), else 0, for
        each assignment of the group of the op's dims, the value's and those of the contractions
        that switch it."""
        hit = self._switched.get((op.name, k))
        if hit is None:
            sw = copy_switch(self.graph, op.name, k)
            contractions = [(c, tuple(zip(c.dims, self.views.compute(c))))  # (op, its (dim, search dim)s)
                            for c in (self.graph.op(n) for n in sorted(sw.switches))]
            value = self.graph.tensor(sw.value)
            own, copy = self.copy_bytes(op, k)
            vdims, elements = self.tensor_dims(value), self._local_elements(value)
            dims = self.space.order(tuple(dict.fromkeys(
                [*own, *vdims, *(v for _, pairs in contractions for _, v in pairs)])))
            g = self.group(dims)
            rows = []
            for i in range(len(g.assignments)):
                axes = g.axes_of(i)
                split = [c.name for c, pairs in contractions
                         if splits_contraction(c, {d.name: axes.get(v, ()) for d, v in pairs})]
                on = switched_on(sw, split, int(elements[self.restrict(axes, vdims)]), self.hw.ynn_reductions)
                rows.append(copy[self.restrict(axes, own)] if on else 0)
            hit = self._switched[(op.name, k)] = (dims, np.array(rows, dtype=np.int64))
        return hit

    def gathered_bytes(self, op: Op, tensor: str, *, raw: bool = False) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the bytes of the copy of ``tensor`` that ``op`` converts for later
        readers too, or early (``OpCost.span_bytes``: live over the span ``sharing.shared_reads``
        gives, as ``predict`` counts it), less ``tensor``'s own bytes where the copy takes its
        place (``sharing.replaced_by_copy``; not where ``raw``), for each assignment of the group
        of its dims."""
        dims = self.space.order(self.views.op(op))
        hit = self._gathered.get((op.name, tensor, raw))
        if hit is None:
            g = self.group(dims)
            k = op.inputs.index(tensor)
            hit = np.array([(self.op_cost(op, dims, a).span_bytes or (0,) * (k + 1))[k] for a in g.assignments],
                           dtype=np.int64)
            if not raw and (op.name, tensor) in replaced_by_copy(self.graph):
                hit = np.maximum(hit - self._regroup(self.graph.tensor(tensor), dims, stored=True), 0)
            self._gathered[(op.name, tensor, raw)] = hit
        return dims, hit

    def gather_buffer_bytes(self, op: Op, tensor: str) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the float32 buffer of the all-gather of :meth:`gathered_bytes`' copy,
        where the backend gathers a half-precision value in float32 (``OpCost.gather_buffer_bytes``,
        ``reductions.half_gathers``; 0 elsewhere), for each assignment of the group of its dims."""
        dims = self.space.order(self.views.op(op))
        hit = self._gather_buffers.get((op.name, tensor))
        if hit is None:
            g = self.group(dims)
            k = op.inputs.index(tensor)
            hit = self._gather_buffers[(op.name, tensor)] = np.array(
                [(self.op_cost(op, dims, a).gather_buffer_bytes or (0,) * (k + 1))[k] for a in g.assignments],
                dtype=np.int64)
        return dims, hit

    def stored_bytes(self, t: Tensor) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the bytes ``t`` takes of its own, as ``predict`` counts them: its
        :meth:`tensor_bytes`, except a rename's, which takes none where the layout makes it a
        bitcast of its operand (``costmodel.bitcasts.is_bitcast``; then over the dims of the
        rename, for each assignment of their group), and a value a reduction fusion shares, which
        takes none where the layout has XLA recompute it (``costmodel.recomputed.written``)."""
        op = self.graph.op(t.name)
        if not (op.reduction_shared or (is_rename(op) and op.materialised)):
            return self.tensor_dims(t), self.tensor_bytes(t)
        hit = self._stored.get(t.name)
        if hit is None:
            if op.reduction_shared:  # written or recomputed by the layout (costmodel.recomputed)
                hit = self.tensor_dims(t), np.where(self._written(t), self.tensor_bytes(t), 0)
            else:
                dims, cast = self._bitcast(op)
                hit = dims, np.where(cast, 0, self._regroup(t, dims))
            self._stored[t.name] = hit
        return hit

    def kept_bytes(self, src: str, rename: str) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the bytes of ``src`` kept alive for its renames past its own last
        reader (``costmodel.bitcasts.kept_spans``): its :meth:`tensor_bytes` where the layout
        makes ``rename`` (the first of them) a bitcast, else 0, for each assignment of the group
        of the rename's dims."""
        hit = self._stored.get(("kept", src, rename))
        if hit is None:
            dims, cast = self._bitcast(self.graph.op(rename))
            own = self._regroup(self.graph.tensor(src), dims)
            hit = self._stored["kept", src, rename] = dims, np.where(cast, own, 0)
        return hit

    def recomputed_bytes(self, source: str, value: str) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the bytes of ``source`` kept alive past its own last reader where the
        layout has XLA recompute ``value`` from it (``costmodel.recomputed.recomputed_spans``): its
        :meth:`stored_bytes` where ``value`` is not written, else 0, for each assignment of the
        group of ``value``'s dims (which hold the source's: it is read element-wise)."""
        hit = self._stored.get(("recomputed", source, value))
        if hit is None:
            t = self.graph.tensor(value)
            dims = self.tensor_dims(t)
            hit = self._stored["recomputed", source, value] = dims, np.where(
                self._written(t), 0, self._regroup(self.graph.tensor(source), dims, stored=True))
        return hit

    def _regroup(self, t: Tensor, dims: tuple[str, ...], stored: bool = False) -> np.ndarray:
        """``t``'s :meth:`tensor_bytes` (its :meth:`stored_bytes` where ``stored``) for each
        assignment of the group of ``dims``, which hold ``t``'s own (a rename's, a value read
        element-wise from ``t``)."""
        tdims, own = self.stored_bytes(t) if stored else (self.tensor_dims(t), self.tensor_bytes(t))
        g = self.group(dims)
        return own[[self.restrict(g.axes_of(i), tdims) for i in range(len(g.assignments))]]

    def _written(self, t: Tensor) -> np.ndarray:
        """Whether XLA writes ``t``, a value a reduction fusion shares, for each assignment of its
        dims' group (``costmodel.recomputed.written``)."""
        return np.array([written(int(n), self.hw.ynn_reductions) for n in self._local_elements(t)], dtype=bool)

    def broadcast_bytes(self, reader: str) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the bytes of a broadcast XLA writes at the shape of its element-wise
        ``reader`` (``costmodel.broadcasts``): the reader's tensor as if it were stored, for each
        assignment of its group."""
        t = self.graph.tensor(reader)
        key = ("broadcast", reader)
        hit = self._tensor_bytes.get(key)
        if hit is None:
            itemsize = stored_itemsize(self.graph, reader, self.hw)
            hit = self._tensor_bytes[key] = np.array(
                [broadcast_bytes(int(n), itemsize, self.hw.ynn_reductions) for n in self._local_elements(t)],
                dtype=np.int64)
        return self.tensor_dims(t), hit

    def _bitcast(self, op: Op) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bitcast)``: whether rename ``op`` is a bitcast (``bitcasts.is_bitcast``) for
        each assignment of the group of its dims."""
        dims = self.space.order(self.views.op(op))
        hit = self._bitcasts.get(op.name)
        if hit is None:
            g = self.group(dims)
            src, out = self.graph.tensor(op.inputs[0]), self.graph.tensor(op.name)
            sd, od = self.tensor_dims(src), self.tensor_dims(out)
            sb, ob = self.tensor_bytes(src), self.tensor_bytes(out)
            hit = self._bitcasts[op.name] = np.array(
                [is_bitcast(op, self.graph.op(op.inputs[0]), len(self.op_cost(op, dims, a).collectives),
                            int(sb[self.restrict(g.axes_of(i), sd)]), int(ob[self.restrict(g.axes_of(i), od)]))
                 for i, a in enumerate(g.assignments)], dtype=bool)
        return dims, hit

    def held_bytes(self, op: Op) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, bytes)``: the bytes ``op`` holds until its computation's combined gradient
        reduction (``OpCost.held_bytes``: :attr:`~autolayout.costmodel.reductions.ReductionBytes.held`, as
        ``predict`` counts them) for each assignment of the group of its dims."""
        return self._per_assignment(op, "held_bytes", self._held)

    def _per_assignment(self, op: Op, field: str, cache: dict) -> tuple[tuple[str, ...], np.ndarray]:
        """``(dims, values)``: ``op_cost(op, ...).<field>`` for each assignment of the group of
        ``op``'s dims, kept in ``cache`` by op name."""
        dims = self.space.order(self.views.op(op))
        hit = cache.get(op.name)
        if hit is None:
            g = self.group(dims)
            hit = cache[op.name] = np.array([getattr(self.op_cost(op, dims, a), field) for a in g.assignments],
                                            dtype=np.int64)
        return dims, hit

    def restrict(self, axes_of: dict[str, tuple[str, ...]], dims: tuple[str, ...]) -> int:
        """Index in ``dims``' group of the restriction of a full ``axes_of`` (a region dim
        without an entry has its base dim's axes, as a layout without its region rule)."""
        base = self.space.base
        return self.group(dims).index[tuple(axes_of.get(d, axes_of.get(base[d], ())) for d in dims)]


def mesh_order(mesh: Mesh, axes) -> tuple[str, ...]:
    s = set(axes)
    return tuple(a for a in mesh.axis_names if a in s)


def prod_axes(mesh: Mesh, axes) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)
