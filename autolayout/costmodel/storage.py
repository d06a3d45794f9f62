"""Storage sharding of parameters: ZeRO stages 1–3 as placements of their training state.

A parameter ``p`` may be *stored* split over mesh axes ``U`` that its dims leave
free and over which its gradient is summed (axes that split the batch): a
:class:`StorageShard`. Its stage decides which tensors live as shards:

* **stage 1** (seed 003; ZeRO-1): the optimizer state and the update are
  sharded. The gradient stays a full-size *partial sum* over ``U`` (each device
  holds its batch's contribution) until it is complete, and is reduce-scattered
  into the shard once per step (for stacked layers: once for the whole stack,
  after the backward scan); the updated weights are all-gathered once per step.
  Needs the gradient's path from its reducing ops to be linear in them (sums,
  stacking, scaling); otherwise use stage 2.
* **stage 2** (ZeRO-2): as stage 1, but each reducing op reduce-scatters its
  contribution at once (one layer at a time inside the backward scan), so the
  gradient is held sharded.
* **stage 3** (ZeRO-3, FSDP): as stage 2, and the weights themselves are stored
  sharded. A layer's weights are sliced from the sharded stack, cast on the shard
  (so they move at the compute dtype), and all-gathered by the op that uses them,
  one layer at a time inside the scan — in the forward pass and again in the
  backward pass (a stacked copy the forward saves for the backward is a shard
  too); the gathered copy is freed after its use. The updated weights stay
  sharded.

**Shards split a dim or a flattened block.** The shard splits the first non-loop
dim whose local size ``|U|`` divides, as a ``PartitionSpec`` would (what JAX and
MaxText do: the weights stay ordinary arrays); when none divides, the flattened
local block of the non-loop dims is padded to a multiple of ``|U|`` and sliced
(seed 003 §4 "data formatting", PyTorch FSDP's flat parameters), layer by layer.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from autolayout.core import Layout, LayoutError, Mesh
from autolayout.costmodel.placement import Placement
from autolayout.costmodel.regions import NORM, Regions, region_axes
from autolayout.graph import Graph

__all__ = ["StorageShard", "storage_shards", "storage_shard", "gradient_walk", "grad_of", "opt_state_of", "update_ops",
           "REDUCING", "BOUNDARY"]

REDUCING = ("einsum", "reduce", "gather", "scatter")
BOUNDARY = ("stack", "result", "carry")
# elementwise ops linear in one operand (the others scale it) and in all operands
_SCALING = ("mul", "div", "neg", "convert_element_type", "copy", "reduce_precision")
_SUMMING = ("add", "add_any", "sub")


# ------------------------------------------------------------------ parameter roles
def grad_of(graph: Graph, param: str) -> str | None:
    """``param``'s gradient tensor (``graph.param_roles``, found by the tracer), or None."""
    role = graph.param_roles.get(param)
    return role.grad if role is not None else None


def opt_state_of(graph: Graph, param: str) -> list[str]:
    """``param``'s optimizer-state tensors (``graph.param_roles``)."""
    role = graph.param_roles.get(param)
    return list(role.opt_state) if role is not None else []


def gradient_walk(graph: Graph, param: str, axes_of: Mapping[str, tuple[str, ...]],
                  regions: Regions | None = None) -> tuple[list[str], set[str]]:
    """Walk back from ``param``'s gradient through the ops that keep the parameter's dims
    (elementwise sums, loop stack/result/carry, reductions over unsplit dims) to the
    reducing ops whose split reduced dims all-reduce the gradient. Returns those ops and
    every tensor visited. An op in the norm region reads the rules as the region sees them."""
    grad = grad_of(graph, param)
    if grad is None:
        return [], set()
    norm = region_axes(axes_of, NORM) if regions is not None and regions.dims else axes_of
    loop = graph.loop_dims
    pdims = set(graph.tensor(param).dim_names) - loop
    stack, seen, reduce_ops = [grad], set(), []
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        op = graph.op(t)
        rules = norm if regions is not None and t in regions.ops else axes_of
        if op.kind in REDUCING and any(rules.get(d.name) for d in op.reduced_dims):
            reduce_ops.append(op.name)
            continue
        if op.kind in REDUCING or op.kind == "elementwise" or (op.kind == "reshape" and op.fn in BOUNDARY):
            stack.extend(i for i, shape in zip(op.inputs, op.input_shapes)
                         if {d.name for d in shape} - loop == pdims)
    return reduce_ops, seen


@lru_cache(maxsize=4096)
def _grad_path_cached(graph: Graph, reduce_ops: tuple[str, ...], seen: frozenset[str]) -> tuple[str, ...]:
    return tuple(_grad_path_of(graph, reduce_ops, seen))


def _grad_path(graph: Graph, reduce_ops: Sequence[str], seen: set[str]) -> list[str]:
    """Tensors between the reducing ops and the gradient (the gradient included), in graph
    order."""
    return list(_grad_path_cached(graph, tuple(sorted(reduce_ops)), frozenset(seen)))


def _grad_path_of(graph: Graph, reduce_ops: Sequence[str], seen: frozenset[str]) -> list[str]:
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
    return [t for t in graph.order if t in path]


# --------------------------------------------------------------------------- shards
@dataclass(frozen=True)
class StorageShard:
    """How one parameter's training state is stored split over ``axes`` (``U``) at ZeRO
    ``stage`` (see the module docstring). The sets name tensors (== the ops producing them):
    ``partial`` are stored as partial sums over ``U`` and ``partial_ops`` compute on them
    (stage 1); ``stored`` are stored as shards and ``computed`` compute on the shard;
    ``scatter_ops`` reduce-scatter partial sums into the shard."""

    param: str
    axes: tuple[str, ...]
    factor: int
    dim: str  # split dim, "" = flattened and padded
    stage: int
    reduce_ops: tuple[str, ...]
    scatter_ops: frozenset[str]
    partial: frozenset[str]
    partial_ops: frozenset[str]
    stored: frozenset[str]
    computed: frozenset[str]
    new_param: str
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


def storage_shards(graph: Graph, mesh: Mesh, layout: Layout, axes_of: Mapping[str, tuple[str, ...]],
                   regions: Regions | None = None) -> tuple[dict[str, StorageShard], list[str]]:
    """The :class:`StorageShard` of each parameter the layout's storage entries cover (not those
    an entry ``param:-`` keeps whole), and notes on parameters a ``*`` entry does not apply to
    (and why)."""
    out: dict[str, StorageShard] = {}
    notes: list[str] = []
    named = {k for k, _, _ in layout.storage if k != "*"}
    star = next(((a, s) for k, a, s in layout.storage if k == "*"), None)
    params = [t.name for t in graph.params()]
    for pname in [k for k, a, _ in layout.storage if k != "*" and a] + ([p for p in params if p not in named]
                                                                          if star else []):  # 'p:-': whole
        axes, stage = layout.storage_of(pname)
        explicit = pname in named
        shard = _shard(graph, mesh, layout, axes_of, pname, axes, stage, explicit, notes, regions)
        if shard is not None:
            out[pname] = shard
    if star:
        covered = [p for p in params if p not in named]
        _check_star_applies(layout, star, covered, [out[p] for p in covered if p in out], notes)
    return out, notes


def _check_star_applies(layout: Layout, star: tuple[tuple[str, ...], int], covered: Sequence[str],
                        shards: Sequence[StorageShard], notes: Sequence[str]) -> None:
    """A ``*`` storage entry must shard some parameter over each of its axes: one that shards
    none (the axis splits no dim any gradient is summed over) would change nothing while the
    layout reads as ZeRO over it, so it is an error, as a named parameter's entry is. ``covered``:
    the parameters the entry is for (those without their own entry); ``shards``: theirs."""
    axes, stage = star
    unused = [a for a in axes if not any(a in s.axes for s in shards)]
    if not unused:
        return
    entry = f"*:{','.join(axes)}" + (f"@{stage}" if stage != 1 else "")
    others = [a for a in axes if a not in unused]
    fix = (f"drop {','.join(unused)} from it ('*:{','.join(others)}" + (f"@{stage}" if stage != 1 else "") + "')"
           if others else "drop it")
    why = [n.removeprefix("'*' storage entry: ") for n in notes
           if n.startswith("'*' storage entry:") and "is not summed over" not in n]
    if not covered:
        raise LayoutError(f"layout {str(layout)!r}: the storage entry {entry!r} applies to no parameter: every "
                          "parameter has its own storage entry. Fix: drop the entry.")
    if sum("has no recorded gradient" in n for n in why) == len(covered):
        raise LayoutError(
            f"layout {str(layout)!r}: the storage entry {entry!r} shards no parameter: the graph records no "
            "gradient for any parameter (graph.param_roles), so there is no update to shard. Fix: trace a training "
            "step (autolayout.train_step or an optax update) whose new parameters are outputs, or drop the entry.")
    raise LayoutError(
        f"layout {str(layout)!r}: the storage entry {entry!r} shards no parameter over mesh axis "
        f"{','.join(unused)}: for every parameter the axis splits no dim its gradient is summed over (or splits "
        f"the parameter itself), so there is no all-reduce to turn into a reduce-scatter"
        + (f" ({'; '.join(why)})" if why else "")
        + f". Fix: split the batch over {unused[0]} (e.g. 'batch:{unused[0]}'), or {fix}.")


def storage_shard(graph: Graph, mesh: Mesh, axes_of: Mapping[str, tuple[str, ...]], pname: str,
                  axes: tuple[str, ...], stage: int, regions: Regions | None = None,
                  cache: dict | None = None) -> StorageShard:
    """The :class:`StorageShard` of ``pname`` stored over ``axes`` at ``stage`` under the rules
    ``axes_of`` (the entry ``pname:axes@stage`` of a layout). ``cache`` (a dict the caller
    keeps for one graph and mesh) holds the shard's sets by what they depend on, so the many
    layouts of a search that agree there share them.

    Raises:
        LayoutError: the shard does not apply under these rules (see :func:`storage_shards`).
    """
    return _shard(graph, mesh, None, axes_of, pname, tuple(axes), stage, True, [], regions, cache)


def _shard(graph: Graph, mesh: Mesh, layout: Layout | None, axes_of: Mapping, pname: str, axes: tuple[str, ...],
           stage: int, explicit: bool, notes: list[str], regions: Regions | None = None,
           cache: dict | None = None) -> StorageShard | None:
    p = graph.tensor(pname)
    what = f"storage sharding of {pname!r} over {','.join(axes)} (stage {stage})"
    grad = grad_of(graph, pname)
    if grad is None:
        if explicit:
            raise LayoutError(
                f"{what}: the graph records no gradient for {pname!r} (graph.param_roles), so there is no "
                f"update to shard. Trace a training step (autolayout.train_step or an optax update) whose "
                f"new parameters are outputs.")
        notes.append(f"'*' storage entry: {pname!r} has no recorded gradient; left whole")
        return None
    reduce_ops, seen = gradient_walk(graph, pname, axes_of, regions)
    norm = region_axes(axes_of, NORM) if regions is not None and regions.dims else axes_of

    def rules(op_name: str) -> Mapping:
        return norm if regions is not None and op_name in regions.ops else axes_of

    covered = {a for name in reduce_ops for d in graph.op(name).reduced_dims for a in rules(name).get(d.name, ())}
    own = {a for d in p.dim_names for a in axes_of.get(d, ())}
    if not explicit:
        axes = tuple(a for a in axes if a in covered and a not in own)
        if not axes:
            notes.append(f"'*' storage entry: the gradient of {pname!r} is not summed over any of its axes; "
                         "left whole")
            return None
    missing = [a for a in axes if a not in covered]
    if missing:
        if layout is None:
            layout = Layout(sorted(axes_of.items()), [(pname, tuple(axes), stage)])
        raise LayoutError(
            f"{what}: its gradient is not all-reduced over {','.join(missing)} under layout {str(layout)!r} "
            f"(no dim the gradient sums over is split there), so there is nothing to reduce-scatter. Shard "
            f"it over an axis that splits the batch, or drop the '{pname}:{','.join(axes)}' entry.")
    factor = math.prod(mesh.axis_size(a) for a in axes)
    dim = ""
    for d in p.shape:
        local = d.size // math.prod(mesh.axis_size(a) for a in axes_of.get(d.name, ()))
        if d.name not in graph.loop_dims and local % factor == 0:
            dim = d.name
            break
    appl = tuple(r for r in reduce_ops if set(axes) <= {a for d in graph.op(r).reduced_dims
                                                        for a in rules(r).get(d.name, ())})
    # everything below but the divisibility check depends on the layout only through
    # (reduce_ops, appl, dim): the walk is the same whenever it stops at the same ops
    key = (pname, tuple(axes), stage, tuple(reduce_ops), appl, dim)
    hit = cache.get(key) if cache is not None else None
    if hit is None:
        try:
            hit = _shard_sets(graph, pname, tuple(axes), factor, dim, stage, tuple(reduce_ops), seen, appl, what)
        except LayoutError as e:
            hit = e
        if cache is not None:
            cache[key] = hit
    if isinstance(hit, LayoutError):
        raise hit
    shard = hit
    order = cache.get(("order", key)) if cache is not None else None
    if order is None:
        order = sorted(shard.stored, key=graph.order.index)
        if cache is not None:
            cache[("order", key)] = order
    for t in order:  # the shard must divide every tensor it holds
        tdims = graph.tensor(t).dim_names
        taxes = norm if regions is not None and t in regions.stored else axes_of
        if cache is None:
            ok = shard.placement(graph, tdims, taxes).divides(graph.dims, mesh)
        else:  # it depends on the axes of the tensor's dims only
            dkey = ("divides", key, t, tuple(taxes.get(d, ()) for d in tdims))
            ok = cache.get(dkey)
            if ok is None:
                ok = cache[dkey] = shard.placement(graph, tdims, taxes).divides(graph.dims, mesh)
        if not ok:
            if explicit:
                raise LayoutError(
                    f"{what}: tensor {t!r} {list(tdims)} would be split over more axes than its dim "
                    f"{dim!r} divides by (with the axes its layout already gives it). Shard over fewer axes "
                    f"or split {dim!r} less.")
            notes.append(f"'*' storage entry: the shard of {pname!r} does not divide {t!r}; left whole")
            return None
    return shard


def _shard_sets(graph: Graph, pname: str, axes: tuple[str, ...], factor: int, dim: str, stage: int,
                reduce_ops: tuple[str, ...], seen: set[str], appl: tuple[str, ...], what: str) -> StorageShard:
    """The shard's tensor sets (see :class:`StorageShard`) from the layout-dependent facts
    :func:`_shard` derives: the reducing ops, those whose split covers ``axes``, the split dim."""
    grad = grad_of(graph, pname)
    states = opt_state_of(graph, pname)
    region, new_param = _update_region(graph, pname)
    if new_param is None:
        raise LayoutError(f"{what}: no updated parameter found downstream of its gradient {grad!r}; is this a "
                          "training step?")
    base = StorageShard(pname, axes, factor, dim, stage, reduce_ops, frozenset(), frozenset(),
                        frozenset(), frozenset(), frozenset(), new_param, tuple(states))
    path = _grad_path(graph, reduce_ops, seen)
    scatter: set[str] = set()
    partial: set[str] = set()
    partial_ops: set[str] = set()
    stored: set[str] = set()
    computed: set[str] = set()
    if stage == 1 and grad not in reduce_ops:
        bad = _nonlinear(graph, path, set(appl), grad)
        if bad:
            raise LayoutError(
                f"{what}: stage 1 keeps the gradient as a partial sum until it is complete, but op {bad!r} "
                f"on its path ({graph.op(bad).kind}.{graph.op(bad).fn}) is not linear in it. Use stage 2 "
                f"('{pname}:{','.join(axes)}@2'), which reduce-scatters each contribution at once.")
        partial |= set(appl)
        readers = {c for t in (*appl, *path) if t != grad for c in graph.consumers(t)}
        stray = sorted(readers - set(path), key=graph.order.index)
        if stray:
            raise LayoutError(
                f"{what}: stage 1 keeps the gradient as a partial sum until it is complete, but op "
                f"{stray[0]!r} reads it before then. Use stage 2 ('{pname}:{','.join(axes)}@2').")
        for t in path:
            if t == grad:
                scatter.add(t)
                stored.add(t)
                partial_ops.add(t)
            else:
                partial.add(t)
                partial_ops.add(t)
    else:
        for r in appl:
            if base.applies(graph, graph.op(r).output.dim_names):
                scatter.add(r)
                stored.add(r)
        for t in path:
            op = graph.op(t)
            if base.applies(graph, op.output.dim_names) and _shardable(op, dim):
                stored.add(t)
                computed.add(t)
    for t in region:
        if base.applies(graph, graph.op(t).output.dim_names) and _shardable(graph.op(t), dim):
            stored.add(t)
            computed.add(t)
    if dim:
        more_stored, more_computed = _shard_readers(graph, dim, stored | ({pname} if stage >= 3 else set()))
        stored |= more_stored
        computed |= more_computed
    if stage < 3:
        stored.discard(new_param)  # computed on the shard, stored whole: all-gathered after its op
    else:
        stored.add(pname)
        chain = _weight_chain(graph, pname)
        stored |= chain
        computed |= chain
    stored |= {t for t in states if base.applies(graph, graph.tensor(t).dim_names)}
    return StorageShard(pname, axes, factor, dim, stage, reduce_ops, frozenset(scatter),
                        frozenset(partial), frozenset(partial_ops), frozenset(stored), frozenset(computed),
                        new_param, tuple(states))


@lru_cache(maxsize=256)
def update_ops(graph: Graph) -> frozenset[str]:
    """The ops that a storage shard may compute on the shard, whatever the layout: every
    parameter's update ops (its update region) and its weight chain (:func:`_weight_chain`:
    at stage 3 its slices and casts stay sharded). Their reads of a tensor never take part in
    a conversion shared with other readers (``sharing.shared_reads``)."""
    out: set[str] = set()
    for t in graph.tensors():
        if t.role != "param":
            continue
        if grad_of(graph, t.name) is not None:
            out |= _update_region(graph, t.name)[0]
        out |= _weight_chain(graph, t.name)
    return frozenset(out)


@lru_cache(maxsize=1024)
def _update_region(graph: Graph, pname: str) -> tuple[frozenset[str], str | None]:
    """The update ops of ``pname`` (element-wise ops downstream of its gradient and optimizer
    state, within parameter-shaped tensors) and the updated parameter among them."""
    pdims = set(graph.tensor(pname).dim_names)
    frontier, region = [grad_of(graph, pname), *opt_state_of(graph, pname)], set()
    while frontier:
        t = frontier.pop()
        for c in graph.consumers(t):
            op = graph.op(c)
            if c not in region and op.kind == "elementwise" and op.loop is None and \
                    set(op.output.dim_names) <= pdims:
                region.add(c)
                frontier.append(c)
    news = [n for n in region if graph.tensor(n).role == "output" and set(graph.tensor(n).dim_names) == pdims]
    return frozenset(region), (sorted(news, key=graph.order.index)[-1] if news else None)


def _shardable(op, dim: str) -> bool:
    """Whether an op can compute on the shard: any op when the shard splits a dim; on
    flattened chunks only elementwise ops, transposes and loop boundaries."""
    return bool(dim) or op.kind == "elementwise" or (
        op.kind == "einsum" and len(op.inputs) == 1 and not op.reduced_dims) or (
        op.kind == "reshape" and op.fn in BOUNDARY + ("slice",))


def _nonlinear(graph: Graph, path: Sequence[str], partial_in: set[str], grad: str) -> str | None:
    """The first op on the gradient path that is not linear in its partial-sum inputs."""
    partial = set(partial_in)
    for t in path:
        op = graph.op(t)
        ins = [i for i in op.inputs if i in partial]
        ok = (op.kind == "reshape" and op.fn in BOUNDARY + ("slice",)) or (
            op.kind == "einsum" and len(ins) == 1) or (
            op.kind == "elementwise" and (op.fn in _SUMMING and len(ins) == len(set(op.inputs))
                                          or op.fn in _SCALING and len(ins) == 1
                                          and (op.fn != "div" or op.inputs[0] in partial)))
        if not ok or not ins:
            return t
        partial.add(t)
    return None


def _shard_readers(graph: Graph, dim: str, stored: set[str]) -> tuple[set[str], set[str]]:
    """Ops outside loops that read the shard and compute on it instead of gathering it:
    element-wise maps of stored tensors (and scalars) that keep the shard's ``dim``, and sums
    over ``dim`` of those. Clip-by-global-norm's squared norm of a sharded gradient is one:
    the squares and their local sum are computed on the shard, and the sum is all-reduced over
    the shard's axes (and the layout's) as every reduction over a split dim is (costmodel.plan)."""
    more_stored: set[str] = set()
    more_computed: set[str] = set()
    frontier = sorted(stored, key=graph.order.index)
    while frontier:
        t = frontier.pop()
        for c in graph.consumers(t):
            op = graph.op(c)
            if c in stored or c in more_stored or c in more_computed or op.loop is not None:
                continue
            tensors = [i for i in op.inputs if graph.tensor(i).dim_names]
            if not all(i in stored or i in more_stored for i in tensors):
                continue
            if op.kind == "elementwise" and dim in op.output.dim_names and all(
                    set(graph.tensor(i).dim_names) == set(op.output.dim_names) for i in tensors):
                more_stored.add(c)
                more_computed.add(c)
                frontier.append(c)
            elif dim not in op.output.dim_names and len(set(op.inputs)) == 1 and (
                    (op.kind == "reduce" and op.fn == "sum") or (op.kind == "einsum" and op.fn == "sum")):
                more_computed.add(c)
    return more_stored, more_computed


@lru_cache(maxsize=1024)
def _weight_chain(graph: Graph, pname: str) -> frozenset[str]:
    """Stage 3: the tensors that hold (a layer of) the parameter and stay sharded: its loop
    slices, casts and other one-input elementwise ops of them, stacked copies of those saved
    for the backward scan, and their slices in turn. The ops reading them gather."""
    out: set[str] = set()
    frontier = [pname]
    while frontier:
        t = frontier.pop()
        for c in graph.consumers(t):
            op = graph.op(c)
            tensors = [i for i in op.inputs if graph.op(i).kind not in ("constant",)]
            keep = (op.kind == "reshape" and op.fn in ("slice", "stack")) or (
                op.kind == "elementwise" and len(set(tensors)) == 1 and op.fn in _SCALING
                and len(op.output.dim_names) == len(graph.tensor(t).dim_names))
            if keep and c not in out and graph.tensor(c).role != "output":
                out.add(c)
                frontier.append(c)
    return frozenset(out)
