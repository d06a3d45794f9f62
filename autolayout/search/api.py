"""Public entry points: :func:`layout`, :func:`search`, :class:`SearchResult`."""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from autolayout.core import Layout, LayoutError, Mesh
from autolayout.costmodel.attention import kernel_graph
from autolayout.costmodel.gradients import REDUCTIONS
from autolayout.costmodel.order import memory_order
from autolayout.costmodel.profiles import DEFAULT_HARDWARE, get_hardware
from autolayout.costmodel.predict import Cost, predict
from autolayout.graph import Graph, require_graph
from autolayout.search.errors import Dominated, SearchError, SearchWarning
from autolayout.search.liveness import live_points
from autolayout.search.tables import Tables
from autolayout.search.wus import wus_options
from autolayout.remat import rematerialize, remat_pairs
from autolayout.units import SizeError, fmt_bytes, parse_bytes

__all__ = ["SearchResult", "SearchWarning", "Verified", "best_layouts", "layout", "memory_limit_bytes", "mesh_shapes",
           "search"]


@dataclass(frozen=True)
class Verified:
    """One of the ``k`` best predicted layouts, run on the local devices (``search(..., verify=k)``).

    ``predicted_time_s`` and ``memory_bytes`` are ``predict``'s for the profile the search
    used (that of the devices that ran it); ``measured_time_s`` is the median of
    ``measured_times_s``, timed in rounds interleaved across the ``k`` layouts (NaN when
    the run failed); ``error`` says why it failed (``""`` when it ran). ``max_rel_error``
    is the run's largest relative difference from the unsharded step (NaN without a
    reference run) and ``collectives_match`` whether the compiled collectives are the
    predicted ones. ``xla_memory_bytes`` is the compiled step's memory per device
    (``memory_analysis()``: argument + output + temp - alias; -1 when it did not run); a run
    above the search's memory limit there is an error row (``OverMemory``), never the winner:
    the prediction it was chosen by was under XLA's figure.
    """

    layout: Layout
    predicted_time_s: float
    measured_time_s: float
    memory_bytes: int
    measured_times_s: tuple[float, ...] = ()
    max_rel_error: float = float("nan")
    collectives_match: bool | None = None
    error: str = ""
    xla_memory_bytes: int = -1
    execution: Any = field(default=None, compare=False, repr=False)  # the run (an Execution), when it ran

    @property
    def ok(self) -> bool:
        """Whether the layout ran and was timed."""
        return not self.error


def verified_table(rows: tuple[Verified, ...], chosen: Layout | None = None) -> str:
    """The rows as a text table, predicted order, the ``chosen`` one marked ``*``."""
    def ms(t: float) -> str:
        return "-" if t != t else f"{t * 1e3:.3f} ms"

    def mib(b: int) -> str:
        return "-" if b < 0 else f"{b / 2 ** 20:.1f} MiB"

    head = ("", "#", "layout", "predicted", "measured", "memory/device", "XLA memory", "result")
    body = [("*" if chosen is not None and r.layout == chosen else "", str(i + 1), str(r.layout) or "(replicated)",
             ms(r.predicted_time_s), ms(r.measured_time_s), mib(r.memory_bytes), mib(r.xla_memory_bytes),
             "ok" if r.ok else "error: " + r.error)
            for i, r in enumerate(rows)]
    width = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    right = {1, 3, 4, 5, 6}

    def line(cells: tuple) -> str:
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, width))).rstrip()

    return "\n".join([line(head)] + [line(b) for b in body])


@dataclass(frozen=True)
class SearchResult:
    """The best layout found and how sure the solver is about it.

    ``objective_s`` and ``bound_s`` are in seconds per step (the solver's integer
    objective converted back, see model.py); ``gap = (objective_s - bound_s) /
    objective_s`` (0 when OPTIMAL). ``cost`` is ``predict``'s result for
    ``layout`` — its ``time_s`` equals ``objective_s`` to within
    ``tolerance_s`` (the integer scaling). ``solve_time_s`` is the wall time
    of the whole call (tables, model, CP-SAT, validation); ``cp_sat_time_s``
    CP-SAT's share. With a mesh-shape search, ``meshes`` lists each mesh tried
    with its best predicted time (``None`` where no layout was found) and
    ``mesh_failures`` says why for those: ``"memory"`` (proven: nothing fits) or
    ``"time"`` (the time limit came first). ``status`` is ``OPTIMAL`` (proven
    fastest) or ``FEASIBLE`` (fits, not proven fastest: see ``gap`` and ``notes``);
    ``cost.memory_bytes`` never exceeds the memory limit. ``verified`` (from
    ``autolayout.search(..., verify=k)``) holds the ``k`` best predicted layouts as
    :class:`Verified` rows, predicted vs measured, in predicted order: ``layout`` is then
    the measured fastest of them (``summary()`` prints the table).
    """

    layout: Layout
    cost: Cost
    status: str
    objective_s: float
    bound_s: float
    gap: float
    solve_time_s: float
    num_variables: int
    num_constraints: int
    mesh: Mesh
    tolerance_s: float = 0.0
    cp_sat_time_s: float = 0.0
    memory_rows: int = 0
    meshes: tuple = ()
    mesh_failures: tuple = ()
    notes: tuple = field(default=())
    verified: tuple[Verified, ...] = ()

    def summary(self) -> str:
        lay = str(self.layout) or "(replicated)"
        text = (f"{self.status} on mesh {self.mesh}: {lay!r} — {self.cost.summary()}; "
                f"gap {self.gap:.2%}, {self.num_variables} variables, {self.num_constraints} constraints, "
                f"{self.solve_time_s:.3f} s")
        if self.verified:
            text += (f"\nverified: the measured fastest of the {len(self.verified)} best predicted layouts (*), "
                     f"on {self.cost.hardware.name}:\n" + verified_table(self.verified, self.layout))
        return text


def layout(graph: Graph, mesh: Any, *, hardware: Any = DEFAULT_HARDWARE, memory_limit: float | str | None = None,
           shard_weight_update: bool = True, time_limit_s: float = 60) -> Layout:
    """The layout of ``graph`` on ``mesh`` with the smallest predicted step time.

    :func:`search`'s layout alone. When the search stopped at its time limit (status
    ``FEASIBLE``: the layout fits but is not proven fastest) a :class:`SearchWarning`
    says so with the gap; call :func:`search` for the status, gap and notes.

    Example::

        g = autolayout.models.mlp(batch=1024, d_io=512, d_hidden=2048)
        autolayout.layout(g, "rows:4,cols:2")   # Layout('batch:rows;hidden:cols')
    """
    r = search(graph, mesh, hardware=hardware, memory_limit=memory_limit,
               shard_weight_update=shard_weight_update, time_limit_s=time_limit_s)
    if r.status != "OPTIMAL":
        warnings.warn(f"search status {r.status}: layout {str(r.layout) or '(replicated)'!r} fits but is not proven "
                      f"fastest (gap {r.gap:.1%} after time_limit_s={time_limit_s:g}); raise time_limit_s, or call "
                      f"autolayout.search for the status, gap and notes", SearchWarning, stacklevel=2)
    return r.layout


def search(graph: Graph, mesh: Any = None, *, num_devices: int | None = None, max_axes: int = 3,
           hardware: Any = DEFAULT_HARDWARE, memory_limit: float | str | None = None, shard_weight_update: bool = True,
           time_limit_s: float = 60, num_workers: int = 2, random_seed: int = 0, regions: bool = True,
           remat: str | None = None) -> SearchResult:
    """Find the layout (and weight-update sharding) minimising ``predict(...).time_s``.

    Args:
        graph: a traced graph (e.g. from :mod:`autolayout.models`).
        mesh: anything ``Mesh.parse`` accepts (``"rows:16,cols:32"``,
            ``{"rows": 16}``, ``[("rows", 16), ("cols", 32)]``, ``(16, 32)``).
            Omit it and give ``num_devices`` to search mesh shapes too.
        num_devices, max_axes: mesh-shape search over the factorisations of
            ``num_devices`` into 1..``max_axes`` axes of size > 1 (sizes
            non-increasing, axes named as ``Mesh`` names them: ``all``;
            ``rows, cols``; ``rows, cols, planes``). Ties keep the mesh with
            fewer axes.
        hardware: a profile name or :class:`~autolayout.costmodel.Hardware`.
        memory_limit: bytes per device (a number, or a size such as ``"16GiB"`` or
            ``"16GB"`` as the CLI reads it); default the profile's ``hbm_bytes``;
            ``math.inf`` (or ``"inf"``) for no limit.
        shard_weight_update: also decide storage sharding (ZeRO stage 1-3) per parameter.
        time_limit_s: CP-SAT time budget; on time-out the best layout found that
            fits ``memory_limit`` is returned with status ``FEASIBLE`` and its gap
            (and a note). A layout over ``memory_limit`` is never returned.
        regions: also decide region rules (``length@norm:x``, sequence parallelism).
        remat: rematerialisation policy of the step's scans (:mod:`autolayout.remat`):
            ``None`` chooses the fastest that fits among ``"none"``, ``"full"`` and
            ``"dots"`` (one exact solve each; only for a step traced without
            ``jax.checkpoint``), or a fixed policy.

    Raises:
        SearchError: (a ``LayoutError``/``ValueError``) if no layout fits in
            ``memory_limit`` (``reason == "memory"``; the message states the smallest
            achievable memory and a layout that reaches it), or if the time limit
            ran out before a layout that fits was found (``reason == "time"``; the
            message says what was found).
    """
    start = time.perf_counter()
    require_graph(graph, "search")
    hw = get_hardware(hardware)
    limit = memory_limit_bytes(hw, memory_limit)
    # a finite limit above the device's memory is allowed (planning for another part), and said
    above = ((f"memory_limit {limit / 2**30:.4g} GiB is above {hw.name}'s {hw.hbm_bytes / 2**30:.4g} GiB of memory "
              f"per device: the layout may not fit that device",) if math.isfinite(limit) and limit > hw.hbm_bytes
             else ())
    if mesh is None:
        if num_devices is None:
            raise LayoutError("search needs a mesh (e.g. 'rows:4,cols:2') or num_devices=N")
        r = _search_meshes(graph, num_devices, max_axes, hw, limit, shard_weight_update, time_limit_s,
                           num_workers, random_seed, start)
        return dataclasses.replace(r, notes=r.notes + above) if above else r
    if num_devices is not None and Mesh.parse(mesh).size != num_devices:
        raise LayoutError(f"mesh {Mesh.parse(mesh)} has {Mesh.parse(mesh).size} devices, "
                          f"not num_devices={num_devices}; give one of them")
    mesh = Mesh.parse(mesh)
    policies = _policies(graph, remat)
    results, errors, slower = [], [], []
    caches: dict = {}
    for i, policy in enumerate(policies):
        left = time_limit_s - (time.perf_counter() - start)
        upper = min((r.cost.time_s for r in results), default=None)
        try:
            results.append(_search_one(graph, mesh, hw, limit, policy, regions, shard_weight_update,
                                       _share(left, len(policies), i), num_workers, random_seed, start,
                                       upper, caches))
        except Dominated as e:
            why = " ".join(str(e).split()) or f"no layout that fits is faster than {upper:.6g} s"
            slower.append(f"remat={policy}: {why} (proven)")
        except SearchError as e:
            errors.append((f"remat={policy}", e))
    r = _best_of(results, errors, limit, start)
    return dataclasses.replace(r, notes=r.notes + tuple(slower) + above) if slower or above else r


def memory_limit_bytes(hw: Any, memory_limit: float | str | None) -> float:
    """``memory_limit`` (a number of bytes, a size such as ``"16GiB"``, or None) in bytes per
    device, as the search applies it: None is profile ``hw``'s memory (``hbm_bytes``).

    Raises:
        SearchError: ``memory_limit`` is not a positive size.
    """
    try:
        return float(hw.hbm_bytes if memory_limit is None else parse_bytes(memory_limit))
    except SizeError as exc:
        raise SearchError(f"memory_limit must be a positive number of bytes per device or a size such as "
                          f"'16GiB' or '16GB', got {memory_limit!r}") from exc


def _share(left: float, n: int, i: int) -> float:
    """Time budget of the ``i``-th of ``n`` remat policies with ``left`` seconds left: the first
    (``full``, unbounded) gets 60% when others follow, since the later ones are bounded by its
    time and usually end quickly; the rest share what is left equally."""
    share = 0.6 * left if i == 0 and n > 1 else left / (n - i)
    return max(share, 0.05)


def _policies(graph: Graph, remat: str | None) -> list[str]:
    """The remat policies to search (see :func:`search`)."""
    if remat is None:
        # "full" first: it fits whenever anything does, and search() bounds the later
        # policies' models by the best time so far (solver.Dominated: proven no faster)
        return ["full", "dots", "none"] if remat_pairs(graph) else ["none"]
    return [remat or "none"]


def _best_of(results: list[SearchResult], errors: list[tuple[str, SearchError]], limit: float,
             start: float, meshes: tuple = (), mesh_failures: tuple = ()) -> SearchResult:
    """The fastest of several searches (remat policies, mesh shapes), honestly labelled.

    It is ``OPTIMAL`` only when every search was (a search that proved that nothing fits
    counts as done); a search that ran out of time makes it ``FEASIBLE``, with the bound
    the smallest of all bounds (0 when a timed-out search had none) and a note.
    """
    if not results:
        if len(errors) == 1:
            raise errors[0][1]
        reason = "time" if any(e.reason == "time" for _, e in errors) else "memory"
        # where every search found its smallest peak, the least of them is the request's
        least = (min((e for _, e in errors), key=lambda e: e.memory_bytes)
                 if all(e.layout is not None for _, e in errors) else None)
        raise SearchError(" | ".join(f"{what}: {e}" for what, e in errors), reason=reason,
                          layout=least.layout if least else None, memory_bytes=least.memory_bytes if least else None)
    # equal times: the first result, but a layout without remat before one with it
    best = min(results, key=lambda r: (r.cost.time_s, bool(r.layout.remat)))
    for r in results:
        if r.cost.memory_bytes > limit:
            raise RuntimeError(f"internal: search returned layout {str(r.layout)!r} with {r.cost.memory_bytes} B "
                               f"per device, above memory_limit {limit:.6g} B")
    timed_out = [(what, e) for what, e in errors if e.reason == "time"]
    bounds = [r.bound_s for r in results] + [e.bound_s if e.bound_s is not None else 0.0 for _, e in timed_out]
    bound = min(min(bounds), best.objective_s)
    optimal = not timed_out and all(r.status == "OPTIMAL" for r in results)
    gap = 0.0 if optimal else max((best.objective_s - bound) / best.objective_s, 0.0) if best.objective_s > 0 else 0.0
    notes = list(best.notes) + [f"{what}: {' '.join(str(e).split())}" for what, e in timed_out]
    return dataclasses.replace(best, status="OPTIMAL" if optimal else "FEASIBLE", bound_s=bound, gap=gap,
                               solve_time_s=time.perf_counter() - start, notes=tuple(notes), meshes=meshes,
                               mesh_failures=mesh_failures)


def _search_one(graph: Graph, mesh: Mesh, hw: Any, limit: float, policy: str, regions: bool, shard: bool,
                time_limit_s: float, num_workers: int, random_seed: int, start: float,
                upper_s: float | None = None, caches: dict | None = None) -> SearchResult:
    """The exact search for one remat policy (``upper_s``: see ``solver.solve``)."""
    return _search_best(graph, mesh, hw, limit, policy, regions, shard, time_limit_s, num_workers, random_seed,
                        start, 1, upper_s=upper_s, caches=caches)[0][0]


def _search_best(graph: Graph, mesh: Mesh, hw: Any, limit: float, policy: str, regions: bool, shard: bool,
                 time_limit_s: float, num_workers: int, random_seed: int, start: float,
                 k: int, distinct: str = "layout", stop_above_s: float = math.inf,
                 upper_s: float | None = None, caches: dict | None = None) -> tuple[list[SearchResult], bool]:
    """The ``k`` best layouts for one remat policy, and whether that list is complete (every
    solve proven optimal, and ``k`` of them or no other layout fits). ``caches``: kept by the
    caller across the remat policies of one graph, mesh and hardware (op costs and storage
    deltas are keyed by what they depend on, so the policies' graphs share them)."""
    # the solver (and ortools with it) is imported on the first search, which keeps
    # `import autolayout` cheap; it is a lower module of this package, not a cycle
    from autolayout.search.solver import layout_of, share_floor, solve_best

    g = rematerialize(kernel_graph(graph, hw), policy)  # as predict prices it (fused attention, remat)
    if upper_s is not None and math.isfinite(limit):
        # a faster layout is only wanted if it fits: when even each tensor's share of the
        # devices does not fit (e.g. no remat, every layer's activations saved), no cost
        # tables or storage options are needed to know that
        # late spans are subsets of early ones: a floor for either schedule
        walk = memory_order(g, hw)
        floor = share_floor(walk, mesh, live_points(walk, early=False,
                                                    orders={r: memory_order(g, hw, reduction=r) for r in REDUCTIONS}))
        if floor > limit:
            raise Dominated(f"no layout fits: at least {floor} B per device (each tensor's share of the "
                            f"{mesh.size} devices, at the peak), above memory_limit {int(limit)} B")
    caches = {} if caches is None else caches
    tables = Tables(g, mesh, hw, regions=regions, op_costs=caches.setdefault("op_costs", {}))
    wus, notes = wus_options(tables, caches.setdefault("wus_deltas", {})) if shard else ([], [])
    remat = policy if policy != "none" else ""  # the layouts' remat entry
    try:
        sols = solve_best(tables, wus, limit, k, time_limit_s=time_limit_s, workers=num_workers, seed=random_seed,
                          distinct_storage=distinct == "layout", stop_above_s=stop_above_s, upper_s=upper_s)
    except SearchError as e:
        if e.layout is None:
            raise
        raise _with_peak_buffers(e, graph, mesh, hw, e.layout.with_remat(remat)) from e
    out, seen = [], set()
    for sol in sols:
        lay = layout_of(tables, sol.point).with_remat(remat)
        if str(lay) in seen:
            raise RuntimeError(f"internal: the search returned layout {str(lay)!r} twice; the no-good cuts of "
                               f"search/solver.py no longer separate distinct layouts")
        seen.add(str(lay))
        cost = predict(graph, mesh, lay, hardware=hw)
        if math.isfinite(limit) and cost.memory_bytes != sol.peak_bytes:
            raise RuntimeError(f"internal: search memory {sol.peak_bytes} B != predict {cost.memory_bytes} B for "
                               f"layout {str(lay)!r}; search/liveness.py no longer mirrors costmodel/memory.py")
        if abs(cost.time_s - sol.objective_s) > sol.tolerance_s + 1e-9 * cost.time_s:
            raise RuntimeError(f"internal: search objective {sol.objective_s!r} s != predict {cost.time_s!r} s for "
                               f"layout {str(lay)!r}; search/tables.py or wus.py no longer mirror predict")
        gap = (sol.objective_s - sol.bound_s) / sol.objective_s if sol.objective_s > 0 else 0.0
        if sol.status == "OPTIMAL":
            gap = 0.0
        out.append(SearchResult(layout=lay, cost=cost, status=sol.status, objective_s=sol.objective_s,
                                bound_s=sol.bound_s, gap=max(gap, 0.0), solve_time_s=time.perf_counter() - start,
                                num_variables=sol.num_variables, num_constraints=sol.num_constraints, mesh=mesh,
                                tolerance_s=sol.tolerance_s, cp_sat_time_s=sol.solve_time_s,
                                memory_rows=sol.memory_rows, notes=tuple(notes + sol.notes)))
    complete = all(r.status == "OPTIMAL" for r in out) and (len(out) == k or sols[-1].end in ("space", "cutoff"))
    return out, complete


PEAK_BUFFERS_SHOWN = 3  # how many of the smallest peak's largest buffers a "does not fit" error names


def _with_peak_buffers(e: SearchError, graph: Graph, mesh: Mesh, hw: Any, lay: Layout) -> SearchError:
    """``e`` (no layout fits: the smallest peak memory, reached by ``lay``) with the largest
    buffers live at that peak (``predict``'s ``Cost.peak_buffers``), so that the user sees what to
    shrink, shard or rematerialise.

    Raises:
        RuntimeError: ``predict`` prices ``lay`` at another peak than the search found (the
            search's live sets, search/liveness.py, no longer mirror costmodel/memory.py)."""
    cost = predict(graph, mesh, lay, hardware=hw)
    if cost.memory_bytes != e.memory_bytes:
        raise RuntimeError(f"internal: search's smallest peak memory {e.memory_bytes} B != predict "
                           f"{cost.memory_bytes} B for layout {str(lay)!r}; search/liveness.py no longer "
                           f"mirrors costmodel/memory.py")
    parts = ", ".join(f"{k} {fmt_bytes(b)}" for k, b in sorted(cost.memory.items(), key=lambda kv: -kv[1]) if b)
    top = ", ".join(f"{b.name} ({b.category}) {fmt_bytes(b.bytes)}" for b in cost.peak_buffers[:PEAK_BUFFERS_SHOWN])
    more = len(cost.peak_buffers) - PEAK_BUFFERS_SHOWN
    rest = f" and {more} more" if more > 0 else ""
    return SearchError(f"{e} At that peak, per device: {parts}; the largest buffers {top}{rest} (`autolayout "
                       f"predict` with that layout and --peak N lists them).", reason=e.reason, bound_s=e.bound_s,
                       layout=lay, memory_bytes=e.memory_bytes)


def best_layouts(graph: Graph, mesh: Any, k: int, *, hardware: Any = DEFAULT_HARDWARE,
                 memory_limit: float | str | None = None, shard_weight_update: bool = True,
                 time_limit_s: float = 60, num_workers: int = 2, random_seed: int = 0, regions: bool = True,
                 remat: str | None = None, distinct: str = "layout") -> list[SearchResult]:
    """The ``k`` layouts of ``graph`` on ``mesh`` with the smallest predicted step times, fastest first.

    :func:`search` for the best, then again with each layout found forbidden (a no-good
    cut on its split and storage choices, search/solver.py), so the ``i``-th is the
    ``i``-th fastest distinct layout that fits ``memory_limit`` — different rules,
    storage sharding, region rules or remat policy. Layouts that differ only by a
    permutation of interchangeable mesh axes (same size and link: they cost the same)
    count once. Each is a :class:`SearchResult` whose ``cost`` is ``predict``'s; its
    ``status`` is ``OPTIMAL`` when its rank is proven. Fewer than ``k`` come back when
    fewer layouts fit, or when ``time_limit_s`` (shared by all solves) runs out first;
    the last result's ``notes`` say which, and a time-out makes every result
    ``FEASIBLE`` (the ranking is then not proven). The other arguments are :func:`search`'s.

    ``distinct="rules"`` counts layouts as distinct only when their rules (splits, region
    rules) or remat policy differ, each with its fastest storage sharding: storage choices
    that tie in time (ZeRO stages of small parameters, often) then do not fill the list
    with near-copies of one layout.

    Example::

        top = autolayout.search.api.best_layouts(g, "rows:4,cols:2", 3)
        [(str(r.layout), r.cost.time_s) for r in top]

    Raises:
        SearchError: as :func:`search` (no layout fits, or none was found in time).
        LayoutError: ``k`` is not a positive integer.
    """
    start = time.perf_counter()
    require_graph(graph, "best_layouts")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise LayoutError(f"k must be a positive integer (how many layouts), got {k!r}")
    if distinct not in ("layout", "rules"):
        raise LayoutError(f"distinct must be 'layout' (rules or storage differ) or 'rules', got {distinct!r}")
    hw = get_hardware(hardware)
    limit = memory_limit_bytes(hw, memory_limit)
    mesh = Mesh.parse(mesh)
    policies = _policies(graph, remat)
    found, errors, incomplete = [], [], []
    caches: dict = {}
    for i, policy in enumerate(policies):
        left = time_limit_s - (time.perf_counter() - start)
        try:
            # a policy's layouts slower than the k-th found so far cannot enter the k best
            kth = sorted(r.cost.time_s for r in found)[k - 1] if len(found) >= k else math.inf
            rs, complete = _search_best(graph, mesh, hw, limit, policy, regions, shard_weight_update,
                                        _share(left, len(policies), i), num_workers, random_seed, start, k,
                                        distinct, kth, upper_s=kth if math.isfinite(kth) else None,
                                        caches=caches)
        except Dominated:
            continue  # proven: no layout of this policy that fits is as fast as the k-th found
        except SearchError as e:
            errors.append((f"remat={policy}", e))
            if e.reason == "time":
                incomplete.append(f"remat={policy}: {' '.join(str(e).split())}")
            continue
        found += rs
        if not complete:
            incomplete.append(f"remat={policy}: the time limit ended the search before its {k} best were proven")
    if not found:
        _best_of([], errors, limit, start)  # raises the errors, as search does
    found.sort(key=lambda r: (r.cost.time_s, bool(r.layout.remat)))  # equal times: without remat first
    top = found[:k]
    for r in top:
        if r.cost.memory_bytes > limit:
            raise RuntimeError(f"internal: search returned layout {str(r.layout)!r} with {r.cost.memory_bytes} B "
                               f"per device, above memory_limit {limit:.6g} B")
    if incomplete:
        top = [dataclasses.replace(r, status="FEASIBLE", notes=r.notes + tuple(incomplete)) for r in top]
    return top


def mesh_shapes(num_devices: int, max_axes: int = 3) -> list[Mesh]:
    """Factorisations of ``num_devices`` into 1..``max_axes`` axes of size > 1, sizes non-increasing.

    >>> [str(m) for m in mesh_shapes(8)]
    ['all:8', 'rows:4,cols:2', 'rows:2,cols:2,planes:2']
    """
    if int(num_devices) != num_devices or num_devices < 1:
        raise LayoutError(f"num_devices must be a positive integer, got {num_devices!r}")
    if num_devices == 1:
        return [Mesh((1,))]
    out = []

    def rec(n: int, most: int, acc: list[int]) -> None:
        if n == 1:
            out.append(Mesh(tuple(acc)))
            return
        if len(acc) == max_axes:
            return
        for f in range(min(n, most), 1, -1):
            if n % f == 0:
                rec(n // f, f, acc + [f])

    rec(int(num_devices), int(num_devices), [])
    return sorted(out, key=lambda m: (len(m), [-s for _, s in m]))


def _search_meshes(graph, num_devices, max_axes, hw, limit, wus, time_limit_s, workers, seed, start):
    meshes = mesh_shapes(num_devices, max_axes)
    results, tried, errors, failures = [], [], [], []
    for i, mesh in enumerate(meshes):
        left = time_limit_s - (time.perf_counter() - start)
        share = max(left / (len(meshes) - i), 0.05)
        try:
            r = search(graph, mesh, hardware=hw, memory_limit=limit, shard_weight_update=wus,
                       time_limit_s=share, num_workers=workers, random_seed=seed)
        except SearchError as e:
            tried.append((mesh, None))
            errors.append((f"mesh {mesh}", e))
            failures.append((mesh, e.reason))
            continue
        tried.append((mesh, r.cost.time_s))
        results.append(r)
    if not results:
        what = ("fits memory_limit" if all(e.reason == "memory" for _, e in errors)
                else "has a layout found within the time limit that fits memory_limit")
        raise SearchError(f"no mesh shape of {num_devices} devices {what} {limit:.6g} B: "
                          + " | ".join(f"{m}: {e}" for m, e in errors),
                          reason="memory" if what.startswith("fits") else "time")
    return _best_of(results, errors, limit, start, meshes=tuple(tried), mesh_failures=tuple(failures))
