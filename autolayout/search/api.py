"""Public entry points: :func:`layout`, :func:`search`, :class:`SearchResult`."""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

from autolayout.core import Layout, LayoutError, Mesh
from autolayout.costmodel.hardware import get_hardware
from autolayout.costmodel.predict import Cost, predict
from autolayout.graph import Graph
from autolayout.search.model import Decoded
from autolayout.search.solver import SearchError, solve
from autolayout.search.tables import Tables
from autolayout.search.wus import wus_options
from autolayout.remat import rematerialize, remat_pairs

__all__ = ["SearchResult", "layout", "search", "mesh_shapes"]


@dataclass(frozen=True)
class SearchResult:
    """The best layout found and how sure the solver is about it.

    ``objective`` and ``bound`` are in seconds per step (the solver's integer
    objective converted back, see model.py); ``gap = (objective - bound) /
    objective`` (0 when OPTIMAL). ``cost`` is ``predict``'s result for
    ``layout`` — its ``time_s`` equals ``objective`` to within
    ``tolerance_s`` (the integer scaling). ``solve_time_s`` is the wall time
    of the whole call (tables, model, CP-SAT, validation); ``cp_sat_time_s``
    CP-SAT's share. With a mesh-shape search, ``meshes`` lists each mesh tried
    with its best predicted time (``None`` where nothing fits).
    """

    layout: Layout
    cost: Cost
    status: str
    objective: float
    bound: float
    gap: float
    solve_time_s: float
    num_variables: int
    num_constraints: int
    mesh: Mesh
    tolerance_s: float = 0.0
    cp_sat_time_s: float = 0.0
    memory_rows: int = 0
    meshes: tuple = ()
    notes: tuple = field(default=())

    def summary(self) -> str:
        lay = str(self.layout) or "(replicated)"
        return (f"{self.status} on mesh {self.mesh}: {lay!r} — {self.cost.summary()}; "
                f"gap {self.gap:.2%}, {self.num_variables} variables, {self.num_constraints} constraints, "
                f"{self.solve_time_s:.3f} s")


def _layout_of(tables: Tables, point: Decoded) -> Layout:
    """The layout of a solution; storage entries as one ``*`` entry when every parameter has
    the same one."""
    params = [t.name for t in tables.graph.params()]
    entries = [(p, *point.wus[p]) for p in params if p in point.wus]
    if entries and len(entries) == len(params) and len({e[1:] for e in entries}) == 1:
        entries = [("*", *entries[0][1:])]
    return tables.space.layout_of(point.axes_of, entries)


def layout(graph: Graph, mesh_shape: Any, *, hardware: Any = "tpu-v3", memory_limit: float | None = None,
           shard_weight_update: bool = True, time_limit_s: float = 60) -> Layout:
    """The layout of ``graph`` on ``mesh_shape`` with the smallest predicted step time.

    Example::

        g = autolayout.models.mlp(batch=1024, d_io=512, d_hidden=2048)
        autolayout.search.layout(g, "rows:4,cols:2")   # Layout('batch:rows;hidden:cols')
    """
    return search(graph, mesh_shape, hardware=hardware, memory_limit=memory_limit,
                  shard_weight_update=shard_weight_update, time_limit_s=time_limit_s).layout


def search(graph: Graph, mesh_shape: Any = None, *, num_devices: int | None = None, max_axes: int = 3,
           hardware: Any = "tpu-v3", memory_limit: float | None = None, shard_weight_update: bool = True,
           time_limit_s: float = 60, num_workers: int = 2, random_seed: int = 0, regions: bool = True,
           remat: str | None = None) -> SearchResult:
    """Find the layout (and weight-update sharding) minimising ``predict(...).time_s``.

    Args:
        graph: a traced graph (e.g. from :mod:`autolayout.models`).
        mesh_shape: anything ``Mesh.parse`` accepts (``"rows:16,cols:32"``,
            ``{"rows": 16}``, ``[("rows", 16), ("cols", 32)]``, ``(16, 32)``).
            Omit it and give ``num_devices`` to search mesh shapes too.
        num_devices, max_axes: mesh-shape search over the factorisations of
            ``num_devices`` into 1..``max_axes`` axes of size > 1 (sizes
            non-increasing, axes named as ``Mesh`` names them: ``all``;
            ``rows, cols``; ``rows, cols, planes``). Ties keep the mesh with
            fewer axes.
        hardware: a profile name or :class:`~autolayout.costmodel.Hardware`.
        memory_limit: bytes per device; default the profile's ``hbm_bytes``;
            ``math.inf`` for no limit.
        shard_weight_update: also decide storage sharding (ZeRO stage 1-3) per parameter.
        time_limit_s: CP-SAT time budget; on time-out the best layout found is
            returned with status ``FEASIBLE`` and its gap.
        regions: also decide region rules (``length@norm:x``, sequence parallelism).
        remat: rematerialisation policy of the step's scans (:mod:`autolayout.remat`):
            ``None`` chooses the fastest that fits among ``"none"``, ``"full"`` and
            ``"dots"`` (one exact solve each; only for a step traced without
            ``jax.checkpoint``), or a fixed policy.

    Raises:
        SearchError: (a ``LayoutError``/``ValueError``) if no layout fits in
            ``memory_limit``; the message states the smallest achievable memory
            and a layout that reaches it.
    """
    start = time.perf_counter()
    hw = get_hardware(hardware)
    limit = float(hw.hbm_bytes if memory_limit is None else memory_limit)
    if not limit > 0:
        raise SearchError(f"memory_limit must be a positive number of bytes per device, got {memory_limit!r}")
    if mesh_shape is None:
        if num_devices is None:
            raise LayoutError("search needs a mesh_shape (e.g. 'rows:4,cols:2') or num_devices=N")
        return _search_meshes(graph, num_devices, max_axes, hw, limit, shard_weight_update, time_limit_s,
                              num_workers, random_seed, start)
    if num_devices is not None and Mesh.parse(mesh_shape).size != num_devices:
        raise LayoutError(f"mesh {Mesh.parse(mesh_shape)} has {Mesh.parse(mesh_shape).size} devices, "
                          f"not num_devices={num_devices}; give one of them")
    mesh = Mesh.parse(mesh_shape)
    if remat is None:
        policies = ["none", "full", "dots"] if remat_pairs(graph) else ["none"]
    else:
        policies = [remat or "none"]
    best, errors = None, []
    for i, policy in enumerate(policies):
        left = time_limit_s - (time.perf_counter() - start)
        try:
            r = _search_one(graph, mesh, hw, limit, policy, regions, shard_weight_update,
                            max(left / (len(policies) - i), 0.05), num_workers, random_seed, start)
        except SearchError as e:
            errors.append((policy, e))
            continue
        if best is None or r.cost.time_s < best.cost.time_s * (1 - 1e-12):
            best = r
    if best is None:
        if len(errors) == 1:
            raise errors[0][1]
        raise SearchError(" | ".join(f"remat={p}: {e}" for p, e in errors))
    return dataclasses.replace(best, solve_time_s=time.perf_counter() - start)


def _search_one(graph: Graph, mesh: Mesh, hw: Any, limit: float, policy: str, regions: bool, shard: bool,
                time_limit_s: float, num_workers: int, random_seed: int, start: float) -> SearchResult:
    """The exact search for one remat policy."""
    g = rematerialize(graph, policy)
    tables = Tables(g, mesh, hw, regions=regions)
    wus, notes = wus_options(tables) if shard else ([], [])
    sol = solve(tables, wus, limit, time_limit_s=time_limit_s, workers=num_workers, seed=random_seed)
    lay = _layout_of(tables, sol.point).with_remat(policy if policy != "none" else "")
    cost = predict(graph, mesh, lay, hw)
    if math.isfinite(limit) and cost.memory_bytes != sol.peak_bytes:
        raise RuntimeError(f"internal: search memory {sol.peak_bytes} B != predict {cost.memory_bytes} B for "
                           f"layout {str(lay)!r}; search/liveness.py no longer mirrors costmodel/memory.py")
    if abs(cost.time_s - sol.objective_s) > sol.tolerance_s + 1e-9 * cost.time_s:
        raise RuntimeError(f"internal: search objective {sol.objective_s!r} s != predict {cost.time_s!r} s for "
                           f"layout {str(lay)!r}; search/tables.py or wus.py no longer mirror predict")
    gap = (sol.objective_s - sol.bound_s) / sol.objective_s if sol.objective_s > 0 else 0.0
    if sol.status == "OPTIMAL":
        gap = 0.0
    return SearchResult(layout=lay, cost=cost, status=sol.status, objective=sol.objective_s, bound=sol.bound_s,
                        gap=max(gap, 0.0), solve_time_s=time.perf_counter() - start,
                        num_variables=sol.num_variables, num_constraints=sol.num_constraints, mesh=mesh,
                        tolerance_s=sol.tolerance_s, cp_sat_time_s=sol.solve_time_s,
                        memory_rows=sol.memory_rows, notes=tuple(notes + sol.notes))


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
    best, tried, errors = None, [], []
    for i, mesh in enumerate(meshes):
        left = time_limit_s - (time.perf_counter() - start)
        share = max(left / (len(meshes) - i), 0.05)
        try:
            r = search(graph, mesh, hardware=hw, memory_limit=limit, shard_weight_update=wus,
                       time_limit_s=share, num_workers=workers, random_seed=seed)
        except SearchError as e:
            tried.append((mesh, None))
            errors.append(str(e))
            continue
        tried.append((mesh, r.cost.time_s))
        if best is None or r.cost.time_s < best.cost.time_s * (1 - 1e-12):
            best = r
    if best is None:
        raise SearchError(f"no mesh shape of {num_devices} devices fits memory_limit {limit:.6g} B: "
                          + " | ".join(errors))
    import dataclasses
    return dataclasses.replace(best, solve_time_s=time.perf_counter() - start, meshes=tuple(tried))
