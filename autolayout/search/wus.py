"""Storage-sharding options per parameter (ZeRO stages 1–3), costed by the same plan as ``predict``.

For parameter ``p`` the choice is one of: store it whole, or store its training
state split over axes ``U`` at a ZeRO stage (:mod:`autolayout.costmodel.storage`).
``U`` is taken from the mesh axes its gradient is all-reduced over (the axes
that split the batch, minus its own): all of them, and — when some of them use a
slower link than the others (a DCN or InfiniBand axis) — only the fast ones,
the gradient being all-reduced over the slow rest (FSDP inside a pod or node,
data parallelism across them). Whether an option is possible, and what it
changes, depends on the layout only through the dims ``D_p`` (:func:`option_dims`):
``p``'s own dims, the dims of the ops on its gradient path, and of every op that
reads a tensor the option may store differently. For every valid assignment ``a``
of ``D_p`` the plan itself (:func:`~autolayout.costmodel.storage.storage_shards`)
builds the shard, and this module records

* ``dtime`` and ``dover`` — per-step change of the two linear parts of the step time
  (:func:`~autolayout.costmodel.overlap.split`: compute + exposed collectives, and per
  overlap domain overlappable collectives − compute): the priced plans of every op the
  shard touches (:class:`~autolayout.costmodel.plan.Planner` with the shard, minus
  without), times their multiplicities — reduce-scatters, sharded update compute,
  all-gathers of the weights once per step or per use — exactly as ``predict``
  sums them;
* ``dbytes`` — per-tensor change of local bytes, and the change of the transient bytes
  of the ops it touches (:attr:`~autolayout.costmodel.reductions.ReductionBytes.transient`: gathered
  inputs, partial sums reduce-scattered; :func:`~autolayout.search.names.transient`) and
  of the copies they convert for later readers too (:func:`~autolayout.search.names.gathered`).

In the CP-SAT model each option is a boolean ``w[p, o] <= y[D_p, a(o)]``, at most
one per parameter: the solver may pick option ``o`` exactly when the layout
restricted to ``D_p`` is ``a(o)``. Objective and memory rows get ``dtime · w`` and
``dbytes · w``. Parameters whose options touch a common op (never the case for the
zoo's optimizers) are left whole, since ``predict`` would not add their effects.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from autolayout.core import STAGES, LayoutError
from autolayout.costmodel.memory import stored_itemsize
from autolayout.costmodel.phases import pending_bytes, phased_reductions
from autolayout.costmodel.sharing import replaced_by_copy
from autolayout.costmodel.plan import Planner
from autolayout.costmodel.recomputed import written
from autolayout.costmodel.sharing import shared_reads
from autolayout.costmodel.rules import price
from autolayout.costmodel.storage import StorageShard, gradient_walk, opt_state_of, storage_shard
from autolayout.graph import Graph
from autolayout.search.names import (gather_buffer, gathered, held as held_name, partial as partial_name,
                                     pending as pending_name, relayout as relayout_name, result as result_name,
                                     transient, transient_part)
from autolayout.costmodel.overlap import domain_of, split
from autolayout.search.tables import Tables, mesh_order

__all__ = ["WusOption", "WusParam", "wus_options", "option_dims", "touched"]


@dataclass
class WusOption:
    index: int  # assignment index in the group of WusParam.dims
    axes: tuple[str, ...]  # U, mesh order
    dtime: float  # seconds per step (negative = faster)
    dbytes: dict  # live-set name (a tensor, transient(op), relayout(op), pending(op), ...) -> change of its bytes
    stage: int = 1
    dover: dict = field(default_factory=dict)  # overlap domain -> change of (overlappable - compute)
    # names.transient_part(op, k) -> change of that buffer of the op's transient bytes (their sum
    # is dbytes[transient(op)]); sizes, not live-set names: search.warm.sizes_of applies them
    dparts: dict = field(default_factory=dict)


@dataclass
class WusParam:
    param: str
    dims: tuple[str, ...]  # D_p, canonical order
    options: list[WusOption]
    ops: set  # ops any of its options touches

    def at(self, index: int) -> list[int]:
        """Indices of the options for assignment ``index`` of :attr:`dims`."""
        by = self.__dict__.get("_by_index")
        if by is None:
            by = {}
            for j, o in enumerate(self.options):
                by.setdefault(o.index, []).append(j)
            self.__dict__["_by_index"] = by
        return by.get(index, [])


def reduced_axes(tables: Tables, pname: str, axes_of: dict, reduce_ops: list[str] | None = None
                 ) -> tuple[str, ...]:
    """The axes the gradient of ``pname`` is all-reduced over, minus its own (mesh order)."""
    graph = tables.graph
    if reduce_ops is None:
        reduce_ops, _ = gradient_walk(graph, pname, axes_of, tables.regions)
    own = {a for d in graph.tensor(pname).dim_names for a in axes_of.get(d, ())}
    covered = {a for n in reduce_ops for d in tables.views.compute(graph.op(n), [x.name for x in graph.op(n).reduced_dims])
               for a in axes_of.get(d, ())}
    return mesh_order(tables.mesh, covered - own)


def candidate_axes(tables: Tables, axes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``U`` candidates from the gradient's reduced axes: all of them, and the fast ones
    alone when some use a slower link (smaller bandwidth) than the fastest."""
    if not axes:
        return []
    bw = {a: tables.hw.link_for(a).bandwidth for a in axes}
    fast = tuple(a for a in axes if bw[a] >= max(bw.values()))
    return [axes] + ([fast] if fast != axes else [])


def touched(graph: Graph, sh: StorageShard) -> set[str]:
    """Ops whose plan a shard can change: those computing on it, on partial sums, or producing
    either, and every reader of a tensor stored as a shard or a partial sum."""
    ops = set(sh.computed) | set(sh.stored) | set(sh.scatter_ops) | set(sh.partial) | set(sh.partial_ops) | {
        sh.new_param}
    for t in set(sh.stored) | set(sh.partial):
        ops.update(graph.consumers(t))
    for lp in graph.loops.values():  # a carry moves its next value to where it lives
        ops.update(c for c, nxt in lp.carries if c in sh.stored or nxt in sh.stored)
    # an op reading an earlier op's conversion converts for itself while that op is on the shard
    on_shard = set(sh.computed) | set(sh.partial_ops)
    ops.update(o for (o, _), prov in shared_reads(graph)[0].items() if prov in on_shard)
    return {n for n in ops if graph.op(n).kind not in ("input", "param", "opt_state")}


def _static_key(tables: Tables, sh: StorageShard, op) -> tuple:
    """What an op's plan under a shard depends on besides the axes of its own dims: the shard's
    axes/dim/stage, and which of the shard's sets the op, its inputs (and a carry's next
    value) belong to."""
    graph = tables.graph
    sets = (sh.computed, sh.partial_ops, sh.scatter_ops, sh.stored, sh.partial)

    def member(t: str) -> tuple:
        return tuple(t in s for s in sets)

    extra = ()
    if op.fn == "carry":
        nxt = next((n for lp in graph.loops.values() for c, n in lp.carries if c == op.name), None)
        extra = member(nxt) if nxt else ()
    # the op's cost signature (kind, shapes, dtypes, fusion, regions, overlap) stands for the op:
    # ops alike under alike shards plan alike, so parameters share these deltas (wq, wk, wv)
    # an input read from an earlier op's conversion is shared only while that op is not on the shard
    sharing = shared_reads(graph)[0]
    provider = tuple(member(sharing[(op.name, i)]) if (op.name, i) in sharing else None for i in op.inputs)
    return (tables.cost_signature(op), op.loop is not None, sh.axes, sh.dim, sh.stage, member(op.name),
            tuple(member(i) for i in op.inputs), extra, provider)


@dataclass
class _ShardFacts:
    """Per shard (the cached object of ``storage_shard``): the ops it touches in rank order
    with their dims and static delta keys, and the stored tensors whose bytes it changes."""

    ops: list  # (name, op dims, static key, multiplicity, overlap domain)
    tensors: list  # (name, tensor dims)
    op_names: set


def _facts(tables: Tables, sh: StorageShard, dims: tuple[str, ...], pname: str) -> _ShardFacts:
    graph = tables.graph
    ops = touched(graph, sh)
    outside = {d for n in ops for d in tables.views.op(graph.op(n))} - set(dims) - graph.loop_dims
    if outside:  # option_dims covers every op a shard touches; a miss would price wrongly
        raise RuntimeError(f"internal: storage option of {pname!r} touches dims {sorted(outside)} "
                           f"outside its group {dims}")
    rows = []
    for name in sorted(ops, key=tables.rank.__getitem__):
        op = graph.op(name)
        rows.append((name, tuple(tables.views.op(op)), _static_key(tables, sh, op), op.multiplicity, domain_of(op)))
    tensors = []
    for n in sorted(sh.stored, key=tables.rank.__getitem__):
        op = graph.op(n)
        if not op.materialised:
            continue  # fused: takes no memory either way
        tensors.append((n, tables.tensor_dims(graph.tensor(n))))
    return _ShardFacts(rows, tensors, ops)


def _canonical(tables: Tables, key: tuple) -> tuple:
    """The smallest of ``key``'s images under the permutations of interchangeable axes (same
    size and link; tables.py prices an op alike under all of them): its own axes and the
    shard's axes ``U`` are permuted together."""
    perms = tables.__dict__.get("_axis_perms")
    if perms is None:
        classes = [c for c in tables.symmetric if len(c) > 1]
        perms = [{}]
        for c in classes:
            perms = [{**p, **dict(zip(c, q))} for p in perms for q in itertools.permutations(c)]
        tables.__dict__["_axis_perms"] = perms
    static, axes = key
    if len(perms) == 1:
        return ("canon", static, axes)
    names = tables.mesh.axis_names
    best = None
    for p in perms:
        u = tuple(a for a in names if a in {p.get(b, b) for b in static[2]})
        img = (u, tuple(tuple(p.get(a, a) for a in ax) for ax in axes))
        if best is None or img < best:
            best = img
    return ("canon", static[:2] + (best[0],) + static[3:], best[1])


@dataclass
class _ShardCache:
    """What the options of one parameter share across the assignments of its dims: its shards
    by what their sets depend on (``storage_shard(cache=)``), each shard's facts, and the
    change of each stored tensor's bytes, by shard and the axes of the tensor's dims. Keyed
    by ``id`` of a shard, which lives as long as ``sets`` does."""

    sets: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    tensor_bytes: dict = field(default_factory=dict)


def _options(tables: Tables, pname: str, dims: tuple, index: int, shards: _ShardCache,
             deltas: dict) -> list[tuple[WusOption, set]]:
    """The storage options of ``pname`` when ``dims`` have assignment ``index``. ``shards``:
    the parameter's cache (:class:`_ShardCache`); ``deltas`` (shared by all parameters) the
    per-op changes by what those depend on."""
    graph, mesh, hw = tables.graph, tables.fast_mesh, tables.hw
    phased = phased_reductions(graph, hw.combines_gradient_reductions)
    replaced = replaced_by_copy(graph)
    g = tables.group(dims)
    axes_of = g.axes_of(index)
    base = tables.space.base
    regs = tables.regions
    reduce_ops, _ = gradient_walk(graph, pname, axes_of, regs)
    sets, facts, tbytes = shards.sets, shards.facts, shards.tensor_bytes
    out = []
    seen: dict[tuple, tuple] = {}
    for U in candidate_axes(tables, reduced_axes(tables, pname, axes_of, reduce_ops)):
        for stage in STAGES:
            try:
                sh = storage_shard(graph, mesh, axes_of, pname, U, stage, regs, cache=sets)
            except LayoutError:
                continue  # e.g. stage 1 on a gradient path that is not linear
            f = facts.get(id(sh))
            if f is None:
                f = facts[id(sh)] = _facts(tables, sh, dims, pname)
            sharded = None
            dtime = 0.0
            dbytes, dparts = {}, {}
            dover: dict[str, float] = {}
            for name, odims, static, mult, dom in f.ops:
                key = (static, tuple(axes_of.get(d, ()) for d in odims))
                hit = deltas.get(key)
                if hit is None:  # the same delta for axes permuted among interchangeable ones
                    canon = _canonical(tables, key)
                    hit = deltas.get(canon)
                    if hit is not None:
                        deltas[key] = hit
                if hit is None:  # the op's time with the shard minus under the rules alone
                    op = graph.op(name)
                    if sharded is None:
                        sharded = Planner(graph, mesh, axes_of, {pname: sh}, regs)
                    plan = sharded.op_plan(op)
                    priced = price(plan, op, mesh, hw, tables.overlap)
                    new = split(priced, op, tables.overlap)
                    rules_alone = tables.op_cost(op, dims, g.assignments[index])
                    old = split(rules_alone, op, tables.overlap)
                    # per row of the op's domain, by the row's suffix (ops alike in other domains share it)
                    n = len(domain_of(op))
                    terms = {k[n:]: new[1].get(k, 0.0) - old[1].get(k, 0.0) for k in new[1].keys() | old[1].keys()}
                    hit = deltas[key] = deltas[canon] = (
                        new[0] - old[0], {k: v for k, v in terms.items() if v},
                        {p: tuple(a - b for a, b in zip(priced.running_parts(p), rules_alone.running_parts(p)))
                         for p in (False, True)},
                        priced.held_bytes - rules_alone.held_bytes,
                        _span_delta(op.inputs, priced.span_bytes, rules_alone.span_bytes),
                        (priced.partial_bytes, rules_alone.partial_bytes),
                        priced.relayout_bytes - rules_alone.relayout_bytes,
                        _span_delta(op.inputs, priced.gather_buffer_bytes, rules_alone.gather_buffer_bytes))
                dtime += hit[0] * mult
                for suffix, v in hit[1].items():
                    dover[dom + suffix] = dover.get(dom + suffix, 0.0) + v * mult
                own = hit[2][name in phased]  # OpCost.running_parts: the change of each buffer
                if any(own):
                    dbytes[transient(name)] = sum(own)
                    for k, b in enumerate(own):
                        if b:
                            dparts[transient_part(name, k)] = b
                if hit[3]:
                    dbytes[held_name(name)] = hit[3]
                for k, b in hit[4]:  # by operand index: ops alike share the delta
                    dbytes[gathered(name, graph.op(name).inputs[k])] = b
                for k, b in hit[7]:  # the float32 all-gather buffers of those copies (reductions.half_gathers)
                    dbytes[gather_buffer(name, graph.op(name).inputs[k])] = b
                if name in phased and hit[6]:  # its relayout copy, placed apart (a live-set name too)
                    dbytes[relayout_name(name)] = hit[6]
                if name in phased and hit[5][0] != hit[5][1]:  # a split (or deferred) reduction's phases
                    dbytes[partial_name(name)] = hit[5][0] - hit[5][1]
                    if bool(hit[5][0]) != bool(hit[5][1]):  # the output: none while partial sums are written
                        res = graph.tensor(name)
                        b = int(tables.tensor_bytes(res)[tables.restrict(axes_of, tables.tensor_dims(res))])
                        dbytes[result_name(name)] = -b if hit[5][0] else b
            for n, tdims in f.tensors:
                key = (id(sh), n, tuple(axes_of.get(d, axes_of.get(base[d], ())) for d in tdims))
                diff = tbytes.get(key)
                if diff is None:
                    if sharded is None:
                        sharded = Planner(graph, mesh, axes_of, {pname: sh}, regs)
                    diff = tbytes[key] = _stored_delta(tables, sharded, n, axes_of)
                if diff:
                    dbytes[n] = diff
            for name, odims, static, mult, dom in f.ops:
                if name in phased:  # partial sums waiting for a later collective
                    _pending_delta(tables, graph.op(name), axes_of, dbytes)
                for t in dict.fromkeys(graph.op(name).inputs):  # a converted copy that takes its tensor's place
                    if (name, t) in replaced:
                        _replaced_delta(tables, graph.op(name), t, axes_of, dbytes)
            sig = (round(dtime, 15), tuple(sorted(dbytes.items())),
                   tuple(sorted((d, round(v, 15)) for d, v in dover.items())), tuple(sorted(dparts.items())))
            if sig in seen and seen[sig][0] == U:
                continue  # the same effect as a lower stage (e.g. no stacked gradient to defer)
            seen[sig] = (U, stage)
            out.append((WusOption(index, U, dtime, dbytes, stage, dover, dparts), f.op_names))
    return out


def _pending_delta(tables: Tables, op, axes_of: dict, dbytes: dict) -> None:
    """Add to ``dbytes`` the change of split reduction ``op``'s ``phases.pending_bytes`` under a
    storage option whose other changes ``dbytes`` holds (its partial sums, relayout copy and
    output bytes), from its bytes under ``axes_of`` alone (``Tables.pending_bytes``)."""
    dims, vec = tables.pending_bytes(op)
    k = tables.restrict(axes_of, dims)
    _, part, _ = tables.phase_bytes(op)
    relay = tables.relayout_bytes(op)[1][k]
    t = tables.graph.tensor(op.name)
    res = int(tables.tensor_bytes(t)[tables.restrict(axes_of, tables.tensor_dims(t))])
    new = pending_bytes(int(part[k]) + dbytes.get(partial_name(op.name), 0),
                        int(relay) + dbytes.get(relayout_name(op.name), 0), res + dbytes.get(op.name, 0))
    if new != int(vec[k]):
        dbytes[pending_name(op.name)] = new - int(vec[k])


def _replaced_delta(tables: Tables, op, t: str, axes_of: dict, dbytes: dict) -> None:
    """Set ``dbytes[gathered(op, t)]`` to the change of ``Tables.gathered_bytes`` of a copy that
    takes ``t``'s place (``sharing.replaced_by_copy``: the copy less ``t``'s bytes) under a storage
    option whose changes of the copy and of ``t``'s bytes ``dbytes`` holds, from its bytes under
    ``axes_of`` alone."""
    dims, raw = tables.gathered_bytes(op, t, raw=True)
    k = tables.restrict(axes_of, dims)
    tensor = tables.graph.tensor(t)
    tdims, own = tables.stored_bytes(tensor)
    old_t = int(own[tables.restrict(axes_of, tdims)])
    name = gathered(op.name, t)
    old = max(int(raw[k]) - old_t, 0)
    new = max(int(raw[k]) + dbytes.get(name, 0) - old_t - dbytes.get(t, 0), 0)
    if new != old:
        dbytes[name] = new - old
    else:
        dbytes.pop(name, None)


def _span_delta(inputs: tuple[str, ...], new: tuple[int, ...], old: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Per operand index, the change of an op's bytes per operand (``OpCost.span_bytes``, the
    copies it converts for later readers too, or ``OpCost.gather_buffer_bytes``) with the shard
    (``new``) from the rules alone (``old``)."""
    new, old = new or (0,) * len(inputs), old or (0,) * len(inputs)
    return tuple((k, n - o) for k, (n, o) in enumerate(zip(new, old)) if n != o)


def _stored_delta(tables: Tables, sharded: Planner, name: str, axes_of: dict) -> int:
    """The change of stored tensor ``name``'s bytes with a storage shard (``sharded``) from the
    rules alone, as ``predict`` counts them: a value a reduction fusion shares (a scan's slice of a
    sharded stacked parameter among them) takes bytes only where its layout has XLA write it
    (``costmodel.recomputed.written``, of its placement with the shard and under the rules)."""
    graph, t = tables.graph, tables.graph.tensor(name)
    own = sharded.local_bytes(name) * stored_itemsize(graph, name, tables.hw) // t.itemsize
    if graph.op(name).reduction_shared:
        if not written(sharded.stored(name).local_elements(sharded.sizes, sharded.mesh), tables.hw.ynn_reductions):
            own = 0
        dims, rules = tables.stored_bytes(t)
    else:
        dims, rules = tables.tensor_dims(t), tables.tensor_bytes(t)
    return int(own - rules[tables.restrict(axes_of, dims)])


def option_dims(tables: Tables, pname: str) -> tuple[str, ...]:
    """``D_p``: every dim the options of ``pname`` can depend on (see the module docstring):
    dims of the gradient path, the update region, and every op reading the parameter, its
    per-layer slices (and casts), their saved stacks, or any of those tensors."""
    graph = tables.graph
    _, visited = gradient_walk(graph, pname, {})
    pdims = set(graph.tensor(pname).dim_names)
    dims = set(pdims)
    held = set(visited) | set(opt_state_of(graph, pname)) | {pname}
    frontier = list(held)
    while frontier:  # the update region and the weight's slices, casts and stacks
        t = frontier.pop()
        for c in graph.consumers(t):
            op = graph.op(c)
            grow = (op.kind == "elementwise" and set(op.output.dim_names) <= pdims) or (
                op.kind == "reshape" and op.fn in ("slice", "stack") and t != c)
            if c not in held and grow:
                held.add(c)
                frontier.append(c)
    views = tables.views
    for n in held:
        op = graph.op(n)
        dims |= set(views.op(op))
        for c in graph.consumers(n):
            dims |= set(views.op(graph.op(c)))
    return tables.space.order(dims)


def wus_options(tables: Tables, deltas: dict | None = None) -> tuple[list[WusParam], list[str]]:
    """Storage options of every parameter with a gradient; also notes on parameters left out.

    ``deltas``: a dict to keep the per-op changes in, shared by all parameters and, when the
    caller passes the same one, by the graphs of several remat policies of one step on one
    mesh and hardware (its keys hold everything a change depends on: :func:`_static_key`)."""
    graph = tables.graph
    out: list[WusParam] = []
    notes: list[str] = []
    deltas = {} if deltas is None else deltas
    for t in graph.params():
        if not gradient_walk(graph, t.name, {})[1]:
            continue  # no recorded gradient: nothing to shard
        dims = option_dims(tables, t.name)
        group = tables.group(dims)
        cache: dict = {}
        shards = _ShardCache()
        options, ops = [], set()
        for i, a in enumerate(group.assignments):
            key = tables.orbit_key(dims, a)
            if key not in cache:  # time and bytes are the same over an orbit (tables.py)
                cache[key] = _options(tables, t.name, dims, i, shards, deltas)
                for _, o in cache[key]:
                    ops |= o
            res = cache[key]
            if not res:
                continue
            if res[0][0].index == i:
                options.extend(o for o, _ in res)
                continue
            # the same options for the permuted axes: map U through the assignment's axes
            cands = candidate_axes(tables, reduced_axes(tables, t.name, group.axes_of(i)))
            first = candidate_axes(tables, reduced_axes(tables, t.name, group.axes_of(res[0][0].index)))
            for o, _ in res:
                U = cands[first.index(o.axes)]
                options.append(WusOption(i, U, o.dtime, o.dbytes, o.stage, o.dover, o.dparts))
        if options:
            out.append(WusParam(t.name, dims, options, ops))
    # parameters whose options touch a common op are not additive in predict: leave them out
    clash = set()
    for i, p in enumerate(out):
        for q in out[i + 1:]:
            if p.ops & q.ops:
                clash |= {p.param, q.param}
    if clash:
        notes.append(f"storage sharding not considered for {sorted(clash)}: their options touch common ops")
        out = [p for p in out if p.param not in clash]
    return out, notes
