"""The search's warm start and a layout's sizes: :func:`greedy`, a local search over the tables
(the module docstring of :mod:`autolayout.search.solver` says how the solver uses it), the
storage choices that go with a layout's axes (:func:`with_least_memory_wus`,
:func:`with_best_wus`), and :func:`sizes_of`, the local bytes of every name of the live sets
under a point, as ``predict`` counts them.
"""
from __future__ import annotations

from autolayout.costmodel.combine import combined_all_reduces, held_pairs
from autolayout.costmodel.donations import copied_parameters, donated_readers
from autolayout.costmodel.plan import SOURCES, plan
from autolayout.costmodel.phases import phased_reductions
from autolayout.search.liveness import indices_of, peak_of, reduction_of, total_at
from autolayout.search.names import (SPAN_KINDS, combined, held, param_copy, partial, relayout, result, transient,
                                     transient_part)
from autolayout.costmodel.overlap import step_time
from autolayout.search.model import Decoded, canonical_columns, evaluate_time, layout_terms
from autolayout.search.tables import Tables
from autolayout.search.wus import WusParam

__all__ = ["greedy", "sizes_of", "with_best_wus", "with_least_memory_wus"]


def sizes_of(tables: Tables, wus: list[WusParam], point: Decoded) -> dict[str, int]:
    """Local bytes of every tensor under ``point`` (with the WUS shrink), as ``predict`` counts them."""
    sizes = {}
    for t in tables.graph.tensors():
        dims, vec = tables.stored_bytes(t)
        sizes[t.name] = int(vec[tables.restrict(point.axes_of, dims)])
        if tables.graph.op(t.name).kind not in SOURCES:  # bytes the op holds while it runs
            dims, parts = tables.transient_parts(tables.graph.op(t.name))
            row = parts[tables.restrict(point.axes_of, dims)]
            sizes[transient(t.name)] = int(row.sum())
            for k, b in enumerate(row):  # the buffers it is made of (liveness.total_at places each)
                sizes[transient_part(t.name, k)] = int(b)
            dims, vec = tables.held_bytes(tables.graph.op(t.name))
            sizes[held(t.name)] = int(vec[tables.restrict(point.axes_of, dims)])
    for name in sorted(phased_reductions(tables.graph, tables.hw.combines_gradient_reductions)):  # their phases
        dims, part, res = tables.phase_bytes(tables.graph.op(name))
        k = tables.restrict(point.axes_of, dims)
        sizes[partial(name)], sizes[result(name)] = int(part[k]), int(res[k])
        sizes[relayout(name)] = int(tables.relayout_bytes(tables.graph.op(name))[1][k])  # a buffer of its own
    early = tables.hw.breadth_first_schedule
    for kind in SPAN_KINDS:  # buffers live over a span, in every order's graph
        for graph in dict.fromkeys(tables.orders.values()):
            for members in kind.spans(graph, early).values():
                for a, b, _, _ in members:
                    parts = kind.key(a, b)
                    dims, vec = kind.nbytes(tables, *parts)
                    sizes[kind.name(*parts)] = int(vec[tables.restrict(point.axes_of, dims)])
    for k, j in point.active:
        o = wus[k].options[j]
        for n, b in (*o.dbytes.items(), *o.dparts.items()):
            sizes[n] = sizes.get(n, 0) + b
    sizes.update(_combined_sizes(tables, point, tables.orders[reduction_of(tables.graph, sizes)], sizes))
    # the donated parameters XLA copies under this layout (costmodel.donations, as predict counts them)
    copied = copied_parameters(tables.graph, point.axes_of, {q: stage for q, (_, stage) in point.wus.items()},
                               tables.hw)
    for q in donated_readers(tables.graph):
        sizes[param_copy(q)] = sizes[q] if q in copied else 0
    return sizes


def _combined_sizes(tables: Tables, point: Decoded, graph, sizes: dict[str, int]) -> dict[str, int]:
    """The :func:`~autolayout.search.names.combined` names of ``point``'s layout: the held bytes
    of each member of a combined all-reduce at its last member
    (``costmodel.combine.combined_all_reduces`` of the layout's plan, as ``predict`` counts them;
    storage options do not change which ops all-reduce over which axes, but may make a member's
    held bytes 0: ``sizes``, the layout's with its storage options), in ``graph``, the order of
    the layout (``Tables.orders``: ``search.orders``). The members are cached per assignment and
    order."""
    if not (tables.hw.combines_gradient_reductions and held_pairs(graph)):
        return {}
    cache = tables.combined_sizes
    key = (tuple(sorted(point.axes_of.items())), id(graph))
    if key not in cache:
        p = plan(graph, tables.mesh, tables.space.layout_of(point.axes_of))
        cache[key] = tuple((m, ops[-1]) for groups in combined_all_reduces(graph, p.ops, tables.hw).values()
                           for _, ops in groups for m in ops[:-1])
    return {combined(m, last): sizes.get(held(m), 0) for m, last in cache[key]}


def greedy(tables: Tables, wus: list[WusParam], points: list | None = None, limit: int = 0) -> Decoded:
    """Warm start by local search over the tables (see module docstring).

    Moves: give one dim any allowed axis subset, evicting conflicting dims from
    those axes. Best improvement first, from two starts (unsplit; every axis on
    the first dim of the largest tensor input's dims that divides, i.e. data
    parallel when that dim is the batch), until no move improves. The result is
    put in canonical column order and takes the WUS options that save time. With the
    liveness ``points`` of a memory ``limit``, a result over the limit is then moved, one
    dim at a time, to the layout closest to fitting (each parameter stored in its smallest
    option) until one fits; from the fastest fitting one of that and the layouts the time
    descents passed, a time descent among fitting layouts gives the result (the memory descent
    minimises bytes over the limit, not time). If none fits, the time start is returned.
    """
    space = tables.space

    def cost(axes_of: dict) -> float:
        return evaluate_time(tables, wus, with_best_wus(tables, wus, axes_of))

    virtual = {space.base[v]: v for v in space.dims if space.base[v] != v}

    def moves(axes_of: dict):
        for d in space.dims:
            for combo in space.subsets[d]:
                if combo == axes_of.get(d, ()):
                    continue
                cand = {k: v for k, v in axes_of.items() if k != d}
                for o in space.conflicts[d]:
                    if o in cand and set(cand[o]) & set(combo):
                        kept = tuple(a for a in cand[o] if a not in combo)
                        if kept in space.subsets[o]:
                            cand[o] = kept
                        else:
                            cand.pop(o)
                    if o in cand and not cand[o]:
                        cand.pop(o)
                if combo:
                    cand[d] = combo
                v = virtual.get(d)
                if v is not None and not set(combo) <= set(cand.get(v, ())):
                    grown = space.mesh_order(set(cand.get(v, ())) | set(combo))
                    if grown not in space.subsets[v]:
                        continue
                    cand[v] = grown  # the region keeps its base dim's axes
                if consistent(cand):
                    yield cand

    def consistent(axes_of: dict) -> bool:
        """A region dim keeps its base dim's axes, and evictions kept every tensor legal."""
        for b, v in virtual.items():
            if not set(axes_of.get(b, ())) <= set(axes_of.get(v, ())):
                return False
        for grp in space.groups:
            used = [a for d in grp for a in axes_of.get(d, ())]
            if len(used) != len(set(used)):
                return False
        return True

    path: list[dict] = []  # every layout the descents stood on, a fitting fallback (below)

    def descend(axes_of: dict) -> tuple[float, dict]:
        best = cost(axes_of)
        path.append(axes_of)
        while True:
            move, move_t = None, best
            for cand in moves(axes_of):
                t = cost(cand)
                if t < move_t * (1 - 1e-12):
                    move, move_t = cand, t
            if move is None:
                return best, axes_of
            axes_of, best = move, move_t
            path.append(axes_of)

    starts = [{}]
    inputs = [t for t in tables.graph.tensors() if t.role == "input"]
    if inputs:
        big = max(inputs, key=lambda t: t.size)
        for d in big.dim_names:
            full = tuple(space.axes)
            if d in space.subsets and full in space.subsets[d]:
                start = {d: full}
                if d in virtual and full in space.subsets[virtual[d]]:
                    start[virtual[d]] = full  # the region keeps the batch's axes
                if consistent(start):
                    starts.append(start)
                break
    best_t, best = min((descend(s) for s in starts), key=lambda r: r[0])
    warm = with_best_wus(tables, wus, canonical_columns(tables, best))
    if not points or peak_of(points, sizes_of(tables, wus, warm))[0] <= limit:
        return warm

    # over the memory limit: descend on (bytes over the limit, time) with each parameter's
    # smallest storage option, until a layout fits (a hint CP-SAT starts from, and a bound)
    def over(axes_of: dict) -> tuple[int, float]:
        pt = with_least_memory_wus(tables, wus, axes_of)
        return max(peak_of(points, sizes_of(tables, wus, pt))[0] - limit, 0), evaluate_time(tables, wus, pt)

    axes_of, score = best, over(best)
    while score[0] > 0:
        move, move_s = None, score
        for cand in moves(axes_of):
            sc = over(cand)
            if sc < move_s:
                move, move_s = cand, sc
        if move is None:
            break  # no single move brings it closer to fitting: CP-SAT searches from the time start
        axes_of, score = move, move_s
    # the fastest fitting layout among the memory descent's end and the layouts the time descents
    # passed (their starts, such as data parallelism, included), each with its time's or its
    # smallest storage options: the memory descent minimises bytes over the limit, not time, and
    # can end slower than a fitting layout passed on the way
    hot: list[int] = []  # points where layouts tried so far peaked over the limit

    def fits(pt: Decoded) -> bool:
        sizes = sizes_of(tables, wus, pt)
        # a layout over the limit is usually over it where another one was: those points first
        mine = set(indices_of(points, sizes))  # the points of the layout's order
        if any(total_at(points, sizes, i) > limit for i in hot if i in mine):
            return False
        peak, at = peak_of(points, sizes)
        if peak > limit:
            hot.append(at)
        return peak <= limit

    def fitting_point(a: dict, below: float = float("inf")) -> Decoded | None:
        """``a`` (in canonical column order) with its time's storage options, else its smallest
        ones: the first that fits and is faster than ``below``."""
        a = canonical_columns(tables, a)
        for f in (with_best_wus, with_least_memory_wus):
            pt = f(tables, wus, a)
            if evaluate_time(tables, wus, pt) < below and fits(pt):
                return pt
        return None

    fitting = []
    for a in ([axes_of] if score[0] <= 0 else []) + path:
        pt = fitting_point(a)
        if pt is not None:
            fitting.append((evaluate_time(tables, wus, pt), len(fitting), pt))
    if not fitting:
        return warm
    # then descend on time among the fitting layouts: from the fastest so far, move to the
    # fastest faster candidate that fits (candidates tried fastest first), until none does
    now_t, _, now = min(fitting)
    while True:
        faster = sorted((t, k, cand) for k, cand in enumerate(moves(now.axes_of))
                        if (t := cost(cand)) < now_t * (1 - 1e-12))
        found = next((pt for _, _, cand in faster if (pt := fitting_point(cand, now_t * (1 - 1e-12))) is not None),
                     None)
        if found is None:
            return now
        now, now_t = found, evaluate_time(tables, wus, found)


def with_least_memory_wus(tables: Tables, wus: list[WusParam], axes_of: dict) -> Decoded:
    """``axes_of`` with, per parameter, the storage option that shrinks its tensors the most
    (fewest bytes summed over them; then the faster), if any shrinks them."""
    active, upd = [], {}
    for k, p in enumerate(wus):
        i = tables.restrict(axes_of, p.dims)
        best = min(((sum(p.options[j].dbytes.values()), p.options[j].dtime, j) for j in p.at(i)), default=None)
        if best is not None and best[0] < 0:
            o = p.options[best[2]]
            active.append((k, best[2]))
            upd[p.param] = (o.axes, o.stage)
    return Decoded(axes_of, upd, active)


def with_best_wus(tables: Tables, wus: list[WusParam], axes_of: dict) -> Decoded:
    """``axes_of`` with storage options that lower the step time: parameters in the order of
    what their best option saves alone, each taking the option that lowers the step time most
    given those taken before it (if any does). An option's time is not additive: it also moves
    collectives into an overlap domain (``dover``), where together they can exceed the compute
    that hides them (:func:`~autolayout.costmodel.overlap.step_time`), so each is priced with the
    others taken; the result is never slower than taking none."""
    total, over = layout_terms(tables, axes_of)

    def with_option(o) -> tuple[float, dict[str, float]]:
        moved = dict(over)
        for d, v in o.dover.items():
            moved[d] = moved.get(d, 0.0) + v
        return total + o.dtime, moved

    alone = []
    now = step_time(total, over)
    for k, p in enumerate(wus):
        js = p.at(tables.restrict(axes_of, p.dims))
        if js:
            alone.append((min(step_time(*with_option(p.options[j])) for j in js), k, js))
    active, upd = [], {}
    for _, k, js in sorted(alone):
        t, j = min((step_time(*with_option(wus[k].options[j])), j) for j in js)
        if t < now:
            total, over = with_option(wus[k].options[j])
            now = t
            o = wus[k].options[j]
            active.append((k, j))
            upd[wus[k].param] = (o.axes, o.stage)
    active.sort()
    return Decoded(axes_of, upd, active)
