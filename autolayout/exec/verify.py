"""Measure in the loop: run the ``k`` best predicted layouts here and keep the measured fastest.

:func:`verify` asks the search for the ``k`` best distinct layouts
(:func:`~autolayout.search.api.best_layouts`), runs each with
:func:`~autolayout.exec.execute` on the local devices, times them in rounds interleaved
across the layouts (load drift on a shared machine then hits all of them alike) and
returns the :class:`~autolayout.search.api.SearchResult` of the one with the smallest
median, with the whole table (:class:`~autolayout.search.api.Verified` rows: predicted
vs measured) in ``verified``. A layout whose run fails keeps its row, with the error; so does
one whose outputs differ from the unsharded step's, or whose compiled step takes more memory
per device than the search's limit by XLA's own figure (:func:`over_memory`): the memory
model's prediction can be under XLA's (DESIGN §11), and such a layout would not fit.

The predictions are for the devices that run the layouts: ``hardware`` defaults to their
built-in profile (by exact device kind; an unknown kind is an error naming it), as
:func:`~autolayout.exec.execute`'s does.

:func:`search` is the package's top-level ``autolayout.search``: the search layer's
:func:`autolayout.search.api.search`, plus ``verify=k``, which calls :func:`verify`. It
lives here, above the search layer, because running layouts needs this layer (the search
never imports it).
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Sequence

from autolayout.core import LayoutError, Mesh
from autolayout.costmodel.devices import hardware_for_device
from autolayout.costmodel.profiles import DEFAULT_HARDWARE, PROFILES, get_hardware
from autolayout.exec.runner import executed_hardware
from autolayout.graph import Graph
from autolayout.search import api
from autolayout.search.api import SearchResult, Verified

__all__ = ["VerifyError", "measure", "search", "verify", "other_hardware", "over_memory"]

# The failures of one layout's run that verify records in its row (and goes on with the
# others): bad or unsupported layouts (ValueError, NotImplementedError, LoweringError) and
# XLA's runtime errors (jaxlib's XlaRuntimeError is a RuntimeError, e.g. out of memory).
RUN_ERRORS = (ValueError, NotImplementedError, RuntimeError)


class VerifyError(ValueError):
    """Verification cannot run as asked (the profile is another machine's) or no layout ran."""


def _count(value: Any, name: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LayoutError(f"{name} must be a positive integer ({what}), got {value!r}")
    return value


def _devices(devices: Sequence[Any] | None) -> list:
    if devices is not None:
        return list(devices)
    import jax

    return list(jax.devices())


# The last unsharded reference measure computed (its graph, seed and compiler options, and
# outputs): a second call on the same graph (the demo's sections 5 and 6) does not run it again.
_LAST_REFERENCE: dict = {}


# A run whose outputs differ from the unsharded step by more than this (relative) computes
# something else and cannot win: the CLI's `execute --strict` default tolerance (cli.py), far
# above the float32 reordering error of a sharded reduction (1e-7..1e-6 in reports/validation).
OUTPUT_TOLERANCE = 1e-4


def measure(graph: Graph, mesh: Any, layouts: Sequence[Any], *, hardware: Any, repeats: int = 5,
            devices: Sequence[Any] | None = None, reference: bool = True, seed: int = 0,
            compiler_options: dict | None = None) -> list[Any]:
    """Run each of ``layouts`` with :func:`~autolayout.exec.execute` on the same arguments and
    time them in ``repeats`` interleaved rounds (one step of each layout per round).

    Returns, per layout, its :class:`~autolayout.exec.Execution` — its ``step_times_s``
    the rounds' times, ``step_time_s`` their median — or, when its run failed (see
    :data:`RUN_ERRORS`), a string ``"ExceptionType: message"``. With ``reference`` the
    unsharded step runs once, on the same arguments (drawn once from ``seed``), and every
    run's outputs are compared with it (``execute`` would compile it once per layout); the
    last such reference is kept for the next call on the same graph, seed and options.
    The arguments are drawn whole (unsharded), so one device must hold them, as the
    reference needs anyway; for models that do not fit, run ``execute(...,
    reference=False)`` per layout instead.
    """
    import jax

    from autolayout.exec.runner import _errors, _to_tensor, check_args, comparison_table, execute, make_args

    _count(repeats, "repeats", "timed rounds")
    mesh = Mesh.parse(mesh)
    devs = _devices(devices)[:mesh.size]
    args = make_args(graph, seed)  # unsharded: the same values for every layout (and the reference)
    ref = None
    if reference:
        key = (seed, repr(sorted((compiler_options or {}).items())))
        if _LAST_REFERENCE.get("graph") is graph and _LAST_REFERENCE.get("key") == key:
            ref = _LAST_REFERENCE["outputs"]
        else:
            squeezed = [_to_tensor(graph, n, leaf) for leaf, n in zip(check_args(graph, args), graph.input_names)]
            ref_args = jax.tree_util.tree_unflatten(graph.in_tree, squeezed)
            ref = jax.jit(graph.evaluate).lower(*ref_args).compile(compiler_options=compiler_options)(*ref_args)
            _LAST_REFERENCE.clear()
            _LAST_REFERENCE.update(graph=graph, key=key, outputs=ref)
    runs: list[Any] = []
    for lay in layouts:
        try:
            ex = execute(graph, mesh, lay, args=args, hardware=hardware, repeats=1, devices=devs, reference=False,
                         compiler_options=compiler_options)
            if ref is not None:
                abs_err, rel_err, notes = _errors(ex.outputs, ref)
                ex = dataclasses.replace(ex, reference=ref, max_abs_error=abs_err, max_rel_error=rel_err,
                                         notes=tuple(dict.fromkeys(notes + list(ex.notes))))
            runs.append(ex)
        except RUN_ERRORS as exc:
            runs.append(f"{type(exc).__name__}: {' '.join(str(exc).split())}")
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):  # interleaved: load drift on a shared machine hits every layout alike
        for i, ex in enumerate(runs):
            if not isinstance(ex, str):
                times[i] += ex.time_steps(1)
    out = []
    for ex, ts in zip(runs, times):
        if not isinstance(ex, str):  # the run's own (warm-up) timing is replaced by the rounds'
            ex = dataclasses.replace(ex, step_time_s=statistics.median(ts), step_times_s=tuple(ts),
                                     step_time_spread_s=max(ts) - min(ts))
            ex.comparison = comparison_table(ex)
        out.append(ex)
    return out


def verify(graph: Graph, mesh: Any, k: int, *, hardware: Any = None, memory_limit: float | str | None = None,
           shard_weight_update: bool = True, time_limit_s: float = 60, num_workers: int = 2, random_seed: int = 0,
           regions: bool = True, remat: str | None = None, repeats: int = 5, devices: Sequence[Any] | None = None,
           reference: bool = True, seed: int = 0, compiler_options: dict | None = None,
           distinct: str = "rules") -> SearchResult:
    """Search the ``k`` best layouts, run each here, return the measured fastest with the table.

    Args:
        graph, mesh: as for :func:`~autolayout.search.api.search` (a mesh is needed: the
            layouts run on it).
        k: how many of the best predicted layouts to run (fewer when fewer fit).
        hardware: the profile of the devices that run the layouts, for the search and the
            predictions; default their built-in profile (``UnknownDeviceError`` for an
            unknown device kind: pass one, e.g. from :func:`autolayout.calibrate`).
        memory_limit, shard_weight_update, time_limit_s, num_workers, random_seed, regions,
            remat: :func:`~autolayout.search.api.search`'s (``time_limit_s`` is the
            search's budget for all ``k``).
        repeats: timed rounds; each round times one step of every layout in turn, and a
            layout's ``measured_time_s`` is its median over the rounds.
        devices: the devices to run on (default ``jax.devices()``); ``reference``, ``seed``,
            ``compiler_options``: :func:`~autolayout.exec.execute`'s.
        distinct: :func:`~autolayout.search.api.best_layouts`'s; default ``"rules"``: the
            ``k`` layouts differ in their rules or remat policy (each with its fastest
            storage sharding), not only in storage choices that tie in time — runs of
            near-copies of one layout would measure noise.

    Returns:
        The :class:`SearchResult` of the layout with the smallest measured median, its
        ``verified`` the rows of all ``k`` in predicted order (each with its
        :class:`~autolayout.exec.Execution` in ``execution``), and a note saying which won.

    Raises:
        LayoutError: ``k`` or ``repeats`` is not a positive integer.
        SearchError: as the search (no layout fits ``memory_limit``, ...).
        VerifyError: none of the layouts ran (the message has each error).
    """
    _count(k, "k", "how many of the best layouts to run")
    _count(repeats, "repeats", "timed rounds")
    mesh = Mesh.parse(mesh)
    devs = _devices(devices)
    hw, attention_note = executed_hardware(get_hardware(hardware) if hardware is not None
                                           else hardware_for_device(devs[0]), graph)  # rank the programs that run
    best = api.best_layouts(graph, mesh, k, hardware=hw, memory_limit=memory_limit,
                            shard_weight_update=shard_weight_update, time_limit_s=time_limit_s,
                            num_workers=num_workers, random_seed=random_seed, regions=regions, remat=remat,
                            distinct=distinct)
    runs = measure(graph, mesh, [r.layout for r in best], hardware=hw, repeats=repeats, devices=devs,
                   reference=reference, seed=seed, compiler_options=compiler_options)
    limit = api.memory_limit_bytes(hw, memory_limit)
    rows = []
    for r, ex in zip(best, runs):
        if isinstance(ex, str):
            rows.append(Verified(r.layout, r.cost.time_s, float("nan"), r.cost.memory_bytes, error=ex))
        else:
            wrong = (f"OutputMismatch: max relative error {ex.max_rel_error:.3g} from the unsharded step, above "
                     f"{OUTPUT_TOLERANCE:g}" if ex.max_rel_error > OUTPUT_TOLERANCE else over_memory(ex, limit))
            rows.append(Verified(r.layout, r.cost.time_s, ex.step_time_s, r.cost.memory_bytes, ex.step_times_s,
                                 ex.max_rel_error, bool(ex.collectives_match), error=wrong, execution=ex,
                                 xla_memory_bytes=ex.xla_memory_bytes))
    ran = [i for i, row in enumerate(rows) if row.ok]
    if not ran:
        raise VerifyError(f"verify={k}: none of the {len(rows)} best layouts of graph {graph.name!r} on mesh "
                          f"{mesh} ran: " + "; ".join(f"#{i + 1} {str(row.layout) or '(replicated)'!r}: {row.error}"
                                                       for i, row in enumerate(rows)))
    win = min(ran, key=lambda i: rows[i].measured_time_s)  # min keeps the better predicted of equal times
    failed = len(rows) - len(ran)
    note = (f"verify={k}: measured on {len(devs[:mesh.size])} {devs[0].platform} devices ({repeats} interleaved "
            f"rounds), the fastest of the {len(rows)} best predicted layouts is #{win + 1}"
            + (f" ({rows[win].measured_time_s * 1e3:.3f} ms, vs {rows[0].measured_time_s * 1e3:.3f} ms for the "
               f"predicted best #1)" if win and rows[0].ok else "")
            + (f"; {failed} did not run or computed something else (see verified)" if failed else ""))
    # solve_time_s stays the search's (the last of the k came at its end); the runs are not in it
    return dataclasses.replace(best[win], verified=tuple(rows),
                               notes=best[win].notes + (note,) + ((attention_note,) if attention_note else ()),
                               solve_time_s=max(r.solve_time_s for r in best))


def over_memory(ex: Any, limit: float) -> str:
    """Why run ``ex`` (an :class:`~autolayout.exec.Execution`) cannot be chosen under memory limit
    ``limit`` (bytes per device), or ``""``: its compiled step takes more than ``limit`` per device
    by XLA's ``memory_analysis()`` (``Execution.xla_memory_bytes``), though the prediction it was
    searched by fit (the memory model under-predicted it)."""
    xla = ex.xla_memory_bytes
    if xla <= limit:
        return ""
    return (f"OverMemory: the compiled step takes {xla / 2 ** 20:.2f} MiB per device (XLA's memory_analysis), above "
            f"memory_limit {limit / 2 ** 20:.2f} MiB; predicted {ex.predicted_memory_bytes / 2 ** 20:.2f} MiB "
            f"(x{ex.memory_ratio:.2f}): give memory_limit that much headroom or pick another row")


_verify = verify  # search's keyword `verify` shadows the function inside it


def other_hardware(hardware: Any, local: Any) -> bool:
    """Whether profile ``hardware`` is the built-in profile of hardware other than ``local`` (the
    profile of the devices that would measure): its predictions could not be verified here."""
    return hardware.name in PROFILES and hardware.name != local.name


def search(graph: Graph, mesh: Any = None, *, num_devices: int | None = None, max_axes: int = 3,
           hardware: Any = DEFAULT_HARDWARE, memory_limit: float | str | None = None, shard_weight_update: bool = True,
           time_limit_s: float = 60, num_workers: int = 2, random_seed: int = 0, regions: bool = True,
           remat: str | None = None, verify: int | None = None, repeats: int = 5,
           devices: Sequence[Any] | None = None) -> SearchResult:
    """Find the layout (and weight-update sharding) minimising ``predict(...).time_s``;
    with ``verify=k``, run the ``k`` best here and return the measured fastest.

    Without ``verify`` this is :func:`autolayout.search.api.search` (see it for every
    argument, the result and the errors). With ``verify=k`` it is :func:`verify` on
    ``mesh`` (needed; not a mesh-shape search) with ``repeats`` timed rounds on
    ``devices``: the result's ``verified`` holds the ``k`` rows, predicted vs measured.
    ``hardware`` must then describe the devices that run the layouts: a built-in
    profile of other hardware (such as the default ``"tpu-v3"`` on CPUs) is a
    :class:`VerifyError` — pass the devices' profile, e.g. ``hardware="cpu"`` or one
    measured by :func:`autolayout.calibrate`.

    Example::

        r = autolayout.search(g, "rows:2,cols:4", hardware="cpu", verify=3)
        print(r.summary())    # the table: predicted vs measured, the winner marked
    """
    if verify is None:
        return api.search(graph, mesh, num_devices=num_devices, max_axes=max_axes, hardware=hardware,
                          memory_limit=memory_limit, shard_weight_update=shard_weight_update,
                          time_limit_s=time_limit_s, num_workers=num_workers, random_seed=random_seed,
                          regions=regions, remat=remat)
    k = _count(verify, "verify", "how many of the best layouts to run here")
    if mesh is None:
        raise LayoutError(f"verify={k} runs layouts on a mesh: give mesh= (e.g. 'rows:2,cols:4'); the mesh-shape "
                          "search (num_devices=) does not run them")
    if num_devices is not None and Mesh.parse(mesh).size != num_devices:
        raise LayoutError(f"mesh {Mesh.parse(mesh)} has {Mesh.parse(mesh).size} devices, "
                          f"not num_devices={num_devices}; give one of them")
    devs = _devices(devices)
    hw, local = get_hardware(hardware), hardware_for_device(devs[0])
    if other_hardware(hw, local):
        raise VerifyError(f"verify={k} runs the layouts on these {devs[0].platform} devices (built-in profile "
                          f"{local.name!r}), but hardware={hw.name!r} is the built-in profile of other hardware: the "
                          f"predictions would not be for the devices that measure them. Pass "
                          f"hardware={local.name!r} or a profile measured here (autolayout.calibrate(mesh)).")
    return _verify(graph, mesh, k, hardware=hw, memory_limit=memory_limit, shard_weight_update=shard_weight_update,
                   time_limit_s=time_limit_s, num_workers=num_workers, random_seed=random_seed, regions=regions,
                   remat=remat, repeats=repeats, devices=devs)
