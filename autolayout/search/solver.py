"""Solving the layout model: warm start, lazy memory rows, tie-breaking, min-memory.

**Warm start.** A local search over the tables (``search.warm.greedy``: from the unsplit
layout and from the data-parallel one, repeatedly give one dim the axis subset
that lowers the predicted time most, evicting conflicting dims) gives a good
layout; its columns are put in the symmetry-breaking order, it takes the storage
options that lower the step time priced together (``warm.with_best_wus``), and it is
passed as a complete hint. Under a memory limit it is the fastest fitting layout the local
search finds (``warm.greedy``). If it fits the
memory limit its objective is an upper bound, and ``LayoutModel.prune`` fixes
every assignment that alone would exceed it.

**Memory, exactly.** ``predict``'s memory is a peak over schedule points
(liveness.py). The model starts without memory rows; after each solve the
solution's peak is computed point by point, and if it exceeds the limit the
row of the point reaching the peak is added and the model re-solved, until the
solution fits. Where the step has outputs XLA allocates for the whole call, a
point's peak adds the bytes of those not yet written beyond the temporaries they
can hold, which is not linear in the layout (liveness.py): a solution that meets
its rows' live sums but not that peak is cut off by itself (a no-good cut), and the
point it overflows gets a linear relaxation of the output allocations' bytes
(``LayoutModel.add_output_row``: temporaries go only into allocations the layout makes at
least their size), a true constraint that cuts off at once the layouts whose temporaries
are too large for those allocations. Without it a step that does not donate its state could
take one solve per layout: a Flax MLP-Mixer step under half its replicated memory found no
layout CP-SAT proved in 60 s (21 one-layout cuts in 30 s); with it, OPTIMAL in 35-60 s on the
tpu-v4 profile (tests/test_warm.py's step, 2 cores), still over a minute on the cpu profile.
Donated, the same searches are OPTIMAL in 8-16 s: a search that runs out of time after such
cuts says so (``_donation_note``).
Every row and cut is a true constraint, so the first fitting solution
of the time-optimal relaxation is optimal for the full problem. If the model
becomes infeasible, no layout fits: the smallest achievable peak is found by
minimising memory (same lazy rows, objective ``M >= every row``, and no-good
cuts for layouts whose rows hold them below their peak) and reported in a
:class:`SearchError`.

**Tie-breaking (determinism).** CP-SAT with several workers may return any of
several equal-cost optima. When the time solve is OPTIMAL, a second solve fixes
the objective at its optimum and minimises ``Σ_i 2^(n-1-i) b_i`` over the bits
``b`` = ``x[d, m]`` (dims in ``graph.dims`` order, axes in mesh order), then one
slot per parameter and storage stage (its ``w`` bits of that stage, parameters in
graph order, stage 3 before 2 before 1; at most one is on). Its optimum is unique
(for up to 62 slots): among the layouts of minimal (integer-scaled) time, the one
that leaves earlier dims unsplit / on later axes, and shards no parameter's storage
it need not, at the lowest stage that does as well. The same inputs
thus give the same layout.

**Time limit.** If the time solve stops at the time limit, the best layout found that
fits the memory limit is returned with status FEASIBLE and its gap: CP-SAT's solution
when it fits, else the warm start when it fits. A layout over the limit is never
returned: without a fitting one, :class:`SearchError` says the time ran out and what
was found.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from autolayout.core import Layout, Mesh
from autolayout.search.errors import Dominated, SearchError
from autolayout.costmodel.bitcasts import is_rename
from autolayout.costmodel.plan import SOURCES, compact_layout
from autolayout.graph import Graph
from autolayout.search.liveness import floor_of, indices_of, live_peak_of, live_points, peak_of, total_at
from autolayout.search.names import held, transient
from autolayout.search.orders import enforce
from autolayout.search.model import Decoded, LayoutModel, evaluate_time
from autolayout.search.tables import Tables, share_bytes
from autolayout.search.warm import greedy, sizes_of
from autolayout.search.wus import WusParam
from autolayout.units import fmt_bytes

__all__ = ["Dominated", "SearchError", "Solved", "exclude", "layout_of", "min_memory", "search_points", "solve", "solve_best"]


# memory rows added per overflowing solve besides the peak's (solve_best): measured on PaLM 540B
# (benchmarks/large_models.py), where the time-optimal layouts overflow at many points of the
# layer body at once
EXTRA_ROWS = 7


def layout_of(tables: Tables, point: Decoded) -> Layout:
    """The layout of a solution; storage entries as one ``*`` entry when every parameter has
    the same one."""
    params = [t.name for t in tables.graph.params()]
    entries = [(p, *point.wus[p]) for p in params if p in point.wus]
    if entries and len(entries) == len(params) and len({e[1:] for e in entries}) == 1:
        entries = [("*", *entries[0][1:])]
    return tables.space.layout_of(point.axes_of, entries)


@dataclass
class Solved:
    point: Decoded
    status: str  # OPTIMAL | FEASIBLE
    objective_s: float
    bound_s: float
    solve_time_s: float
    num_variables: int
    num_constraints: int
    memory_rows: int
    tolerance_s: float
    notes: list = field(default_factory=list)
    peak_bytes: int = 0
    end: str = ""  # solve_best's last point: why no next one came: "space" (none left that fits), "time", "cutoff"


NO_OTHER = "no other layout is left that fits memory_limit"  # solve_best: the space is exhausted

# While no layout that fits the memory limit is known, each CP-SAT call is capped at
# max(PROBE_S, PROBE_SHARE x the time limit), doubled while it finds no solution (a
# judgement: long enough for CP-SAT to find good incumbents on GPT-3-sized models, short
# enough to leave most of the budget for the pruned model).
PROBE_S = 5.0
PROBE_SHARE = 0.1


def _solver(seconds: float, workers: int, seed: int) -> cp_model.CpSolver:
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = max(seconds, 0.01)
    s.parameters.num_workers = workers
    s.parameters.random_seed = seed
    # the overlap slacks are maxima of linear rows over the one-hots (overlap.py), whose LP
    # relaxation CP-SAT's default level 1 leaves weak: PaLM 540B under its memory limit
    # (benchmarks/large_models.py) took 55 s of CP-SAT at level 1 and 37 s at level 2
    s.parameters.linearization_level = 2
    return s


def _bound(lm: LayoutModel, solver: cp_model.CpSolver, objective: float | None) -> float:
    """CP-SAT's best bound, or the model's trivial one (every block at its minimum) when it has none."""
    trivial = lm.lower_units()
    b = solver.BestObjectiveBound()
    if not math.isfinite(b) or (objective is None and b > trivial) or (objective is not None and b > objective):
        return trivial
    return max(b, trivial)


def _status(code: int, model: cp_model.CpModel | None = None) -> str:
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"internal: invalid CP-SAT model: {model.Validate() if model else ''}")
    return {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
            cp_model.INFEASIBLE: "INFEASIBLE"}.get(code, "UNKNOWN")


def solve(tables: Tables, wus: list[WusParam], memory_limit: float, *, time_limit_s: float = 60.0,
          workers: int = 2, seed: int = 0, upper_s: float | None = None) -> Solved:
    """Minimise predicted time subject to ``peak memory <= memory_limit`` (``inf``: no limit).

    The result always fits: when the time limit ends the search before CP-SAT's solution
    fits (or before it has one), the warm start is returned if it fits (status
    ``FEASIBLE``, with a note), and otherwise :class:`SearchError` says so and what was
    found.
    
    ``upper_s``: only layouts taking at most this long matter (a fitting layout that fast is
    known elsewhere, e.g. under another remat policy): the model is pruned with it and
    bounded by it, and :class:`Dominated` is raised when none of them fits — without
    minimising memory, which only an error message would need.
    """
    return solve_best(tables, wus, memory_limit, 1, time_limit_s=time_limit_s, workers=workers, seed=seed,
                      upper_s=upper_s)[0]


def exclude(lm: LayoutModel, point: Decoded, *, storage: bool = True) -> None:
    """Add the no-good cut that forbids exactly ``point``'s assignment: the clause "some
    ``x[d, m]`` or storage ``w[p, o]`` differs from ``point``'s value" (every other
    variable of the model — one-hots, overlap slacks — is a function of these). With
    ``storage=False`` only the ``x`` (the rules) count: every storage choice of ``point``'s
    rules is forbidden."""
    lits = [v.Not() if a in point.axes_of.get(d, ()) else v for (d, a), v in lm.x.items()]
    on = set(point.active)
    if storage:
        lits += [v.Not() if (k, j) in on else v for k, wk in enumerate(lm.w) for j, v in wk.items()]
    if not lits:
        lm.model.AddBoolOr([False])  # a space of one layout: nothing else is left
    else:
        lm.model.AddBoolOr(lits)


def solve_best(tables: Tables, wus: list[WusParam], memory_limit: float, k: int, *, time_limit_s: float = 60.0,
               workers: int = 2, seed: int = 0, distinct_storage: bool = True,
               stop_above_s: float = math.inf, upper_s: float | None = None) -> list[Solved]:
    """The ``k`` fastest distinct points that fit ``memory_limit``, fastest first.

    ``distinct_storage=False``: points with distinct rules (each with its best storage
    sharding), rather than distinct rules or storage. ``stop_above_s``: stop after the
    first point slower than this (every later one is slower still; ``end == "cutoff"``) —
    a caller that already knows ``k`` points this fast needs no more.

    After each solve a no-good cut (:func:`exclude`) forbids the point found and the model
    is solved again, so the ``i``-th solve's optimum is the ``i``-th best point (up to the
    permutations of interchangeable axes the model's symmetry breaking leaves out: those
    layouts cost the same). Memory rows added on the way stay (they are true constraints).

    Pruning (``LayoutModel.prune``) with a bound ``U`` removes only layouts whose objective
    exceeds ``U``, so a point found with objective ``<= U`` is the best of those left. When
    the ``i``-th solve finds one above ``U`` (the pruned-away layouts might be faster), that
    point is itself a sound bound for the ``i``-th best: the model is rebuilt (memory rows
    and cuts kept) and pruned with its objective, and solved again; when the pruned model has
    no layout left, it is rebuilt unpruned. The warm start gives the first ``U``, as in
    :func:`solve`.

    Fewer than ``k`` come back when fewer layouts fit, or when the time limit (shared by all
    solves) ends before the next one is found; the last point's ``notes`` and ``end`` then
    say which. The first point is :func:`solve`'s, with its guarantees.
    """
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    start = time.perf_counter()
    points = search_points(tables) if math.isfinite(memory_limit) else []
    limit = int(memory_limit) if math.isfinite(memory_limit) else 0

    def peak(point: Decoded) -> tuple[int, int]:
        return peak_of(points, sizes_of(tables, wus, point)) if points else (0, 0)

    out: list[Solved] = []

    def bounded(lm: LayoutModel) -> LayoutModel:
        """``lm`` with ``upper_s`` (see :func:`solve`) as a bound on its objective."""
        if upper_s is not None and lm.obj_vars:
            # every layout at most upper_s seconds has objective <= u (rounding: model.tolerance_s)
            u = int(math.ceil((upper_s - lm.constant_s) / lm.unit)) + lm.terms + 1
            if u < lm.lower_units():
                raise Dominated(f"no layout takes at most {upper_s:.6g} s per step (the cost model's lower bound "
                                "on the step time is above it)")
            lm.prune(u)
            lm.model.Add(lm.objective <= u)
        return lm

    def rebuild(prev: LayoutModel, upper: int | None) -> LayoutModel:
        """A fresh model with ``prev``'s memory and output rows and the layouts found so far excluded,
        pruned at ``upper`` units when given."""
        lm = bounded(LayoutModel(tables, wus))
        for names in prev.memory_rows:
            lm.add_memory_row(names, limit, prev.guards[names])
        for names, temps, free in prev.output_rows:
            lm.add_output_row(names, temps, free, limit, prev.guards[names])
        for sol in out:
            exclude(lm, sol.point, storage=distinct_storage)
        if upper is not None:
            lm.prune(upper)
        return lm

    if points and memory_floor(tables, wus, points) > limit:  # proven before any model is built
        state = {"bounded": upper_s is not None, "upper_s": upper_s}
        _none_fits(tables, wus, memory_limit, state, time_limit_s - (time.perf_counter() - start), workers, seed,
                   True)
    lm = bounded(LayoutModel(tables, wus))
    warm = greedy(tables, wus, points, limit)
    warm_fits = peak(warm)[0] <= limit or not points
    upper = lm.units(warm) if warm_fits else None
    if upper is not None:
        lm.prune(upper)  # the warm start satisfies every constraint: its objective bounds
    state = {"hint": warm, "fit_known": warm_fits, "solve_s": 0.0, "upper": upper, "bounded": upper_s is not None,
             "upper_s": upper_s}
    while len(out) < k:
        sol = _solve_next(tables, wus, lm, memory_limit, points, limit, peak, warm, warm_fits, state, start,
                          time_limit_s, workers, seed, first=not out)
        if sol == NO_OTHER and state["upper"] is not None:  # only the pruned model is exhausted
            lm = rebuild(lm, None)
            state["upper"] = None
            continue
        if isinstance(sol, str):  # no further point: why
            out[-1].notes.append(sol)
            out[-1].end = "space" if sol == NO_OTHER else "time"
            break
        units = lm.units(sol.point)
        if state["upper"] is not None and units > state["upper"]:  # see the docstring
            lm = rebuild(lm, units)
            state["upper"], state["hint"] = units, sol.point
            continue
        out.append(sol)
        if sol.status == "OPTIMAL" and sol.objective_s - sol.tolerance_s > stop_above_s and len(out) < k:
            sol.end = "cutoff"
            break
        if len(out) < k:
            exclude(lm, sol.point, storage=distinct_storage)
            state["hint"] = sol.point
    return out


def _solve_next(tables: Tables, wus: list[WusParam], lm: LayoutModel, memory_limit: float, points: list,
                limit: int, peak, warm: Decoded, warm_fits: bool, state: dict, start: float, time_limit_s: float,
                workers: int, seed: int, *, first: bool) -> Solved | str:
    """The best point of ``lm`` as it stands that fits, adding memory rows as needed.

    For the first point, a time-out or an infeasible model is handled as :func:`solve`
    documents; for later points (``first=False``) they end the list: the returned string
    says why.
    """
    nth = "next best layout"
    notes: list[str] = []
    hint = state["hint"]
    probe = max(PROBE_S, PROBE_SHARE * time_limit_s)
    while True:
        left = time_limit_s - (time.perf_counter() - start)
        if not first and left <= 0:
            return f"the time limit came before the search found the {nth}"
        lm.hint(hint)
        # Until a layout that fits is known, the model cannot be pruned and proving optimality
        # can take long: solve briefly, check the incumbent's memory, and either add the row it
        # violates or, once one fits, prune with its objective (a sound bound) and go on.
        solver = _solver(left if state["fit_known"] else min(left, probe), workers, seed)
        code = solver.Solve(lm.model)
        state["solve_s"] += solver.WallTime()
        status = _status(code, lm.model)
        if status == "OPTIMAL" and abs(lm.units(lm.decode(solver.BooleanValue)) - solver.ObjectiveValue()) > lm.terms:
            # CP-SAT's objective disagrees with the model's own value of the layout it returned:
            # solve again without its presolve (see model.RESOLUTION)
            solver = _solver(left, workers, seed)
            solver.parameters.cp_model_presolve = False
            code = solver.Solve(lm.model)
            state["solve_s"] += solver.WallTime()
            status = _status(code, lm.model)
        if status == "INFEASIBLE":
            return _none_fits(tables, wus, memory_limit, state, left, workers, seed, first)
        in_time = time.perf_counter() - start < time_limit_s
        if status == "UNKNOWN" and not state["fit_known"] and in_time:
            probe *= 2  # no incumbent within the probe: give CP-SAT longer
            continue
        if status == "UNKNOWN":  # the time limit came before CP-SAT had any solution
            if not first:
                return f"the time limit came before CP-SAT found the {nth}"
            bound = lm.seconds(_bound(lm, solver, None))
            return _warm_start(tables, wus, lm, warm, warm_fits, bound, memory_limit, peak, time_limit_s,
                               state["solve_s"], notes + ["the time limit came before CP-SAT found a solution"]
                               + _donation_note(tables, state))
        point = lm.decode(solver.BooleanValue)
        obj_units = solver.ObjectiveValue()
        bound = lm.seconds(_bound(lm, solver, obj_units))
        obj = lm.seconds(obj_units)
        # tie-break among equal-time optima (module docstring); not for a layout over the memory
        # limit: its rows are added and the model solved again, so its tie-break would be thrown away
        sizes = sizes_of(tables, wus, point) if points else {}
        if status == "OPTIMAL" and (not points or peak_of(points, sizes)[0] <= limit):
            lm.hint(point)
            m2, twin = lm.tie_break_model(int(round(obj_units)))
            left = time_limit_s - (time.perf_counter() - start)
            s2 = _solver(left, workers, seed)
            code2 = s2.Solve(m2)
            state["solve_s"] += s2.WallTime()
            if code2 == cp_model.MODEL_INVALID:
                raise RuntimeError(f"internal: CP-SAT rejects the tie-break model: {m2.Validate()[:300]}")
            if code2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                tied = lm.decode(lambda v: s2.BooleanValue(twin(v)))
                if tied != point:  # an equal-time twin: its memory is its own
                    point, sizes = tied, sizes_of(tables, wus, tied) if points else {}
        mem, at = peak_of(points, sizes) if points else (0, 0)
        if status == "FEASIBLE" and not state["fit_known"] and in_time:  # a probe's incumbent
            if mem <= limit:  # it fits: its objective bounds every optimum
                state["fit_known"] = True
                if state["upper"] is None:
                    state["upper"] = lm.units(point)
                    lm.prune(state["upper"])
            elif not _add_rows(lm, sizes, points, at, limit, point, state):
                return _none_fits(tables, wus, memory_limit, state, left, workers, seed, first)
            hint = point
            continue
        if mem <= limit or not points:
            if status == "FEASIBLE":
                notes.append(f"the time limit came before CP-SAT proved this layout optimal (its bound "
                             f"{bound:.4g} s, objective {obj:.4g} s)")
                notes += _donation_note(tables, state)
            break
        if time.perf_counter() - start >= time_limit_s:  # out of time with a layout over the limit
            over = (f"the time limit came while CP-SAT's best layout {str(layout_of(tables, point))!r} "
                    f"needed {mem} B per device, above memory_limit {limit} B")
            if not first:
                return f"the time limit came before the search found the {nth} that fits: {over}"
            return _warm_start(tables, wus, lm, warm, warm_fits, bound, memory_limit, peak, time_limit_s,
                               state["solve_s"], notes + [over] + _donation_note(tables, state))
        if not _add_rows(lm, sizes, points, at, limit, point, state):
            return _none_fits(tables, wus, memory_limit, state, left, workers, seed, first)
        hint = point
    nvar, ncons = lm.size()
    return Solved(point, status, obj, min(bound, obj), state["solve_s"], nvar, ncons, len(lm.memory_rows),
                  lm.tolerance_s(), notes, mem)


def _donation_note(tables: Tables, state: dict) -> list[str]:
    """Where the time ran out after layouts were cut off one at a time for the outputs XLA
    allocates for the whole call (a step that does not donate its state): what they cost and
    the fix (the module docstring's measurement: donated, the Mixer step's searches are OPTIMAL
    in 8-16 s, against 35 s to over two minutes without)."""
    n = state.get("output_cuts", 0)
    if not n:
        return []
    return [f"{n} layouts were cut off one at a time because graph {tables.graph.name!r} does not donate its "
            "state: XLA allocates its outputs (new parameters, optimizer state) beside its arguments for the "
            "whole call, which no linear memory row holds; trace the step with donate_argnums= the arguments "
            "holding the parameters and optimizer state, as a training loop jits it "
            "(jax.jit(step, donate_argnums=...)): the search is then linear and faster, and the step needs "
            "less memory"]


def _add_rows(lm: LayoutModel, sizes: dict[str, int], points: list, at: int, limit: int,
              point: Decoded, state: dict | None = None) -> bool:
    """Add the memory row of point ``at`` (where the layout ``point``, whose tensor bytes are
    ``sizes``, peaks, above ``limit``) and those of up to ``EXTRA_ROWS`` other points the layout
    overflows, the largest first: every row is a true constraint, and adding several per solve
    saves the re-solves that would find them one at a time. Where the layout meets every row's
    live sum but not ``peak_of`` (outputs allocated for the whole call: ``liveness`` module
    docstring), the no-good cut that forbids exactly it (:func:`exclude`) and, the first time a
    point is over for them, that point's relaxation of the output allocations
    (``LayoutModel.add_output_row``), which cuts off the layouts its neighbours share the
    excess with (``state["output_cuts"]`` counts the layouts cut off alone). False if the peak's
    row alone cannot be met (nothing fits)."""
    guards = getattr(points, "guards", None) or (None,) * len(points)  # the points' orders (search.orders)
    ok = lm.add_memory_row(points[at], limit, guards[at])
    have = set(lm.memory_rows)
    over = sorted(((sum(sizes.get(n, 0) for n in points[i]), i) for i in indices_of(points, sizes)
                   if points[i] not in have), reverse=True)
    for total, i in over[:EXTRA_ROWS]:
        if total <= limit:
            break
        lm.add_memory_row(points[i], limit, guards[i])
    if live_peak_of(points, sizes)[0] <= limit:  # no live sum cuts it off: the output allocations do
        exclude(lm, point)
        if state is not None and getattr(points, "outputs", frozenset()):
            state["output_cuts"] = state.get("output_cuts", 0) + 1
        if getattr(points, "outputs", frozenset()) and total_at(points, sizes, at) > limit and not any(
                r[0] == points[at] for r in lm.output_rows):  # the relaxation, once per point
            temps, free = points.split()[at]
            lm.add_output_row(points[at], temps, free, limit, guards[at])
    return ok


def search_points(tables: Tables) -> list:
    """The live points the search holds the layouts of ``tables`` to (``liveness.live_points`` of
    its graph on its hardware): those of every order where a layout's order depends on how it
    reduces its gradients (``search.orders``)."""
    return live_points(tables.graph, early=tables.hw.breadth_first_schedule,
                       combines=tables.hw.combines_gradient_reductions, orders=tables.orders)


def memory_floor(tables: Tables, wus: list[WusParam], points: list) -> int:
    """A lower bound on the peak memory of every layout: at each liveness point, the sum over
    its tensors (and running op) of their smallest bytes under any assignment, less the most
    any storage option of each parameter saves on them, but never below the tensor's share
    of the devices (:func:`~autolayout.search.tables.share_bytes`; 0 for transient and held
    bytes). When it exceeds the limit, nothing fits — proven without a CP-SAT solve.

    (A storage option's saving is measured from the tensor's bytes under the assignment it is
    applied to, which may be larger than its smallest; without the share as a floor, a
    parameter sharded from replicated could count below zero.)"""
    graph = tables.graph
    least: dict[str, int] = {}
    floor: dict[str, int] = {}
    for t in graph.tensors():
        least[t.name] = int(tables.stored_bytes(t)[1].min())
        floor[t.name] = share_bytes(t, graph, tables.mesh)
        if graph.op(t.name).kind not in SOURCES:
            least[transient(t.name)] = int(tables.transient_bytes(graph.op(t.name))[1].min())
            least[held(t.name)] = int(tables.held_bytes(graph.op(t.name))[1].min())
    saved: dict[str, int] = {}
    for p in wus:  # each parameter takes one option: its largest saving on each name
        saves: dict[str, int] = {}
        for o in p.options:
            for n, b in o.dbytes.items():
                saves[n] = min(saves.get(n, 0), b)
        for n, b in saves.items():
            saved[n] = saved.get(n, 0) + b
    for n, b in saved.items():
        least[n] = max(least.get(n, 0) + b, floor.get(n, 0))
    return floor_of(points, least)  # the live sums are monotone in every tensor's bytes


def share_floor(graph: Graph, mesh: Mesh, points: list) -> int:
    """A lower bound on the peak memory of every layout of ``graph`` on ``mesh`` that needs no
    cost tables: each live tensor at its share of the devices (``share_bytes``), transient
    and held bytes at 0. Cheap enough to rule out a whole search (e.g. a remat policy whose
    saved activations alone exceed the memory of every device). A rename counts 0: a layout can
    make it a bitcast of its operand (``costmodel.bitcasts``)."""
    size = {t.name: 0 if is_rename(graph.op(t.name)) else share_bytes(t, graph, mesh) for t in graph.tensors()}
    return floor_of(points, size)


def _none_fits(tables: Tables, wus: list[WusParam], memory_limit: float, state: dict, left: float,
               workers: int, seed: int, first: bool) -> str:
    """The model has no layout left that fits: for a later point of :func:`solve_best` the list
    ends (``NO_OTHER``); a model bounded by ``upper_s`` is :class:`Dominated`; otherwise
    :class:`SearchError` with the smallest peak memory (:func:`min_memory`)."""
    if not first:
        return NO_OTHER
    if state["bounded"]:
        fits = f"that fits memory_limit {int(memory_limit)} B " if math.isfinite(memory_limit) else ""
        raise Dominated(f"no layout {fits}takes at most {state['upper_s']:.6g} s per step")
    mem, point, proven = min_memory(tables, wus, time_limit_s=max(left, 5.0), workers=workers, seed=seed)
    lay = _shown(tables, point)
    raise SearchError(_memory_message(tables, memory_limit, mem, lay, proven), reason="memory", layout=lay,
                      memory_bytes=int(mem))


def _warm_start(tables: Tables, wus: list[WusParam], lm: LayoutModel, warm: Decoded, warm_fits: bool,
                bound_s: float, memory_limit: float, peak, time_limit_s: float, solve_s: float,
                notes: list[str]) -> Solved:
    """After a time-out without a fitting CP-SAT solution: the warm start if it fits, else an error."""
    lay = str(_shown(tables, warm)) or "(replicated)"
    if not warm_fits:
        raise SearchError(
            f"time_limit_s={time_limit_s:.3g} s ran out before the search found a layout of graph "
            f"{tables.graph.name!r} on mesh {tables.mesh} within memory_limit {int(memory_limit)} B per device: "
            f"{'; '.join(notes)}; the warm start {lay!r} needs {peak(warm)[0]} B. Raise time_limit_s "
            f"or memory_limit.", reason="time", bound_s=bound_s)
    obj = evaluate_time(tables, wus, warm)
    nvar, ncons = lm.size()
    notes = notes + [f"returned the warm start (local search) {lay!r}, which fits; it is not proven optimal"]
    return Solved(warm, "FEASIBLE", obj, min(bound_s, obj), solve_s, nvar, ncons, len(lm.memory_rows),
                  lm.tolerance_s(), notes, peak(warm)[0])


def min_memory(tables: Tables, wus: list[WusParam], *, time_limit_s: float = 60.0, workers: int = 2,
               seed: int = 0) -> tuple[int, Decoded, bool]:
    """``(peak, layout, proven)``: the smallest peak memory of any layout (lazy rows, see module
    docstring), a layout reaching it, and whether it is proven minimal (False when the time
    limit came first: then it is the smallest found)."""
    start = time.perf_counter()
    lm = LayoutModel(tables, wus, time_objective=False)
    points = search_points(tables)
    peak_var = lm.model.NewIntVar(0, 2 ** 61, "peak")
    lm.model.Minimize(peak_var)
    best: tuple[int, Decoded] | None = None
    proven = False
    # start from the point that peaks for the fully replicated layout and a greedy layout
    seeds = [Decoded({}, {}, []), greedy(tables, wus)]
    rows = set()
    for p in seeds:
        rows.add(peak_of(points, sizes_of(tables, wus, p))[1])
    guards = getattr(points, "guards", None) or (None,) * len(points)  # the points' orders (search.orders)
    for r in rows:
        vars_, coefs, const = lm.memory_expr(points[r])
        enforce(lm, lm.model.Add(cp_model.LinearExpr.WeightedSum(vars_, coefs) + const <= peak_var), guards[r])
    while True:
        left = time_limit_s - (time.perf_counter() - start)
        solver = _solver(left, workers, seed)
        code = solver.Solve(lm.model)
        if _status(code, lm.model) not in ("OPTIMAL", "FEASIBLE"):
            proven = best is not None and _status(code, lm.model) == "INFEASIBLE"  # every other layout cut off
            break
        point = lm.decode(solver.BooleanValue)
        peak, at = peak_of(points, sizes_of(tables, wus, point))
        if best is None or peak < best[0]:
            best = (peak, point)
        if best[0] <= solver.ObjectiveValue() and code == cp_model.OPTIMAL:
            proven = True
            break
        if code != cp_model.OPTIMAL or left <= 0:
            break
        if at in rows:  # its rows hold it below its peak_of: outputs allocated for the whole call
            exclude(lm, point)  # (liveness module docstring); its peak is in best already
            continue
        rows.add(at)
        vars_, coefs, const = lm.memory_expr(points[at])
        enforce(lm, lm.model.Add(cp_model.LinearExpr.WeightedSum(vars_, coefs) + const <= peak_var), guards[at])
    if best is None:
        p = seeds[1]
        best = (peak_of(points, sizes_of(tables, wus, p))[0], p)
    return best[0], best[1], proven


def _shown(tables: Tables, point: Decoded) -> Layout:
    """``point``'s layout as a message shows it: the storage entry most parameters share
    written once as ``*`` (``costmodel.plan.compact_layout``; it plans exactly as the layout)."""
    return compact_layout(tables.graph, tables.mesh, layout_of(tables, point))


def _memory_message(tables: Tables, limit: float, peak: int, layout: Layout, proven: bool = True) -> str:
    lay = str(layout) or "(replicated)"
    exact = f"{int(limit)} B"
    shown = exact if fmt_bytes(limit) == exact else f"{fmt_bytes(limit)} ({exact})"
    head = (f"memory_limit {shown} per device is below the smallest peak "
            f"memory any layout of graph {tables.graph.name!r} reaches on mesh {tables.mesh}")
    if proven:
        return (f"{head}: {fmt_bytes(peak)} ({peak} B), with layout {lay!r}. Raise memory_limit to at "
                f"least {peak} B, use more devices, or shrink the model or batch.")
    return (f"{head} (proven: no layout fits); the smallest found before the time limit is "
            f"{fmt_bytes(peak)} ({peak} B), with layout {lay!r} (not proven minimal). Raise memory_limit "
            f"(to at most {peak} B), use more devices, or shrink the model or batch.")
