"""``autolayout.report(graph, mesh, layouts)``: layouts side by side, predicted and measured.

Writes a directory with a self-contained ``index.html`` (PNG charts embedded as
base64), ``report.md``, the PNGs, CSV tables and ``summary.json``:

* the layouts side by side: predicted compute, communication and total time, peak memory
  per device against the device's HBM; when executed, the measured step time, the error
  against the unsharded reference and whether the compiled collectives match the
  prediction;
* a stacked bar chart of compute vs communication per layout, and memory per device
  against the HBM line;
* the search's result (status, objective, bound, gap, solve time);
* predicted vs measured step time with its Spearman rank correlation (when executed):
  measurements on the local devices are ranked only against predictions priced for those
  devices; predictions for the target hardware sit beside them, labelled, never ranked
  against them;
* on request (``scaling=True``), the paper's §8.6 scaling chart of its MLP (not about
  ``graph``).

By default :func:`report` also runs the search (its layout is added as ``searched``) and
executes every layout on the local devices; ``search=False`` and ``execute=False`` turn
those off.

``autolayout.report`` is the function :func:`report` (this package stays importable as
``autolayout.report`` for its other names: ``from autolayout.report import Report``).
``python -m autolayout.report --all`` regenerates the committed reports under ``reports/``
(the same as ``autolayout report --all``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autolayout.costmodel.profiles import DEFAULT_HARDWARE
from autolayout.reporting.fmt import fmt_bytes, fmt_time, short_layout, spearman
from autolayout.reporting.page import Cell

__all__ = ["report", "Report", "LayoutResult", "collect", "write", "named_layouts"]


@dataclass
class LayoutResult:
    """One layout of a report: its prediction on the target hardware and, when run, its execution."""

    name: str
    layout: Any
    cost: Any = None        # costmodel.Cost on the report's hardware
    execution: Any = None   # exec.Execution on the local devices
    error: str = ""         # why it could not be predicted or executed

    @property
    def measured_s(self) -> float:
        return self.execution.step_time_s if self.execution is not None else math.nan

    @property
    def local_predicted_s(self) -> float:
        """Prediction for the devices it ran on (the execution's hardware profile)."""
        return self.execution.predicted.time_s if self.execution is not None else math.nan


@dataclass
class Report:
    """What :func:`report` found and where it wrote it (``path``)."""

    graph: Any
    mesh: Any
    hardware: Any
    results: list[LayoutResult]
    search: Any = None
    search_note: str = ""
    measure_hardware: Any = None
    execute_note: str = ""
    scaling: Any = None
    path: Path | None = None
    platform: str = ""
    title: str = ""
    intro: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def executed(self) -> list[LayoutResult]:
        return [r for r in self.results if r.execution is not None]

    @property
    def spearman(self) -> float:
        ex = self.executed
        return spearman([r.local_predicted_s for r in ex], [r.measured_s for r in ex])

    def table(self) -> Any:
        """The layouts side by side, raw numbers (a DataFrame)."""
        import pandas as pd

        rows = []
        for r in self.results:
            c = r.cost
            row = {"name": r.name, "layout": str(r.layout),
                   "compute_ms": c.compute_s * 1e3 if c else math.nan,
                   "comm_ms": c.comm_s * 1e3 if c else math.nan,
                   "time_ms": c.time_s * 1e3 if c else math.nan,
                   "memory_MiB": c.memory_bytes / 2**20 if c else math.nan,
                   "fits": bool(c.fits) if c else None}
            if self.executed:
                ex = r.execution
                row.update({
                    "local_predicted_ms": r.local_predicted_s * 1e3, "measured_ms": r.measured_s * 1e3,
                    "max_abs_error": ex.max_abs_error if ex else math.nan,
                    "collectives_match": bool(ex.collectives_match) if ex else None,
                    "compile_s": ex.compile_s if ex else math.nan})
            row["error"] = r.error
            rows.append(row)
        return pd.DataFrame(rows)

    def _repr_html_(self) -> str:
        where = f" written to <code>{self.path}</code>" if self.path else ""
        return f"<p>autolayout report{where}: {len(self.results)} layouts.</p>" + _display_table(self).to_html(index=False)

    def __repr__(self) -> str:
        return f"<Report {self.title!r}: {len(self.results)} layouts, path={str(self.path)!r}>"


# --------------------------------------------------------------------------- collect
def named_layouts(layouts: Any) -> list[tuple[str, Any]]:
    """``[(name, Layout)]`` from a layout, a list of layouts or ``(name, layout)`` pairs, or a
    mapping name -> layout."""
    from autolayout.core import Layout

    if layouts is None:
        return []
    if isinstance(layouts, (str, Layout)):
        layouts = [layouts]
    items = list(layouts.items()) if isinstance(layouts, Mapping) else list(layouts)
    out, seen = [], set()
    for item in items:
        # a 2-tuple whose first item is a string is (name, layout); wrap a layout written as
        # pairs in Layout(...) or write it as a string
        name, lay = item if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) else (None, item)
        lay = Layout.coerce(lay)
        name = name or short_layout(lay, 40)
        if name in seen:
            continue
        seen.add(name)
        out.append((name, lay))
    return out


def collect(graph: Any, mesh: Any, layouts: Any = (), *, hardware: Any = DEFAULT_HARDWARE, execute: bool = True,
            search: bool = True, measure_hardware: Any = None, scaling: bool = False, repeats: int = 3,
            progress: bool = True, time_limit_s: float = 60, memory_limit: float | str | None = None,
            devices: Sequence[Any] | None = None) -> Report:
    """Predict, search and execute; everything :func:`write` needs (no files written)."""
    from autolayout.core import Mesh
    from autolayout.costmodel.profiles import get_hardware
    from autolayout.costmodel.predict import predict
    from autolayout.graph import require_graph
    from autolayout.reporting.progress import Progress

    require_graph(graph, "report")
    hw = get_hardware(hardware)
    mesh = Mesh.parse(mesh)
    rep = Report(graph=graph, mesh=mesh, hardware=hw, results=[])
    pairs = named_layouts(layouts)
    if search:
        from autolayout.search.api import search as run_search

        try:
            rep.search = run_search(graph, mesh, hardware=hw, memory_limit=memory_limit,
                                    time_limit_s=time_limit_s)
        except ValueError as exc:
            rep.search_note = f"search found no layout: {' '.join(str(exc).split())}"
        if rep.search is not None:
            found = rep.search.layout
            same = [i for i, (_, lay) in enumerate(pairs) if lay.canonical() == found.canonical()]
            if same:
                name, lay = pairs[same[0]]
                pairs[same[0]] = (f"{name} (searched)", lay)
            else:
                pairs.insert(0, ("searched", found))
    for name, lay in pairs:
        res = LayoutResult(name, lay)
        try:
            res.cost = predict(graph, mesh, lay, hardware=hw)
        except ValueError as exc:
            res.error = " ".join(str(exc).split())
        rep.results.append(res)
    if execute:
        _execute_all(rep, measure_hardware, repeats, progress, devices, Progress)
    if scaling:
        from autolayout.reporting.paper import mlp_scaling
        rep.scaling = mlp_scaling(hw)
    return rep


def _execute_all(rep: Report, measure_hardware: Any, repeats: int, progress: bool, devices: Any,
                 Progress: Any) -> None:
    from autolayout.exec.runner import execute as run
    from autolayout.reporting.devices import devices_for

    if devices is None:
        devices, note = devices_for(rep.mesh.size)
        if devices is None:
            rep.execute_note = note
            return
        if note:
            rep.notes.append(note)
    rep.platform = str(getattr(devices[0], "platform", "")).upper() if devices else ""
    rep.measure_hardware = _measure_hardware(rep, measure_hardware, devices)
    todo = [r for r in rep.results if r.cost is not None]
    with Progress(len(todo), "executing", enabled=progress) as bar:
        for r in todo:
            bar.start(r.name)
            try:
                r.execution = run(rep.graph, rep.mesh, r.layout, hardware=rep.measure_hardware,
                                  repeats=repeats, devices=devices)
                note = f"{r.execution.step_time_s * 1e3:.1f} ms, collectives " + \
                       ("match" if r.execution.collectives_match else "MISMATCH")
            except (ValueError, NotImplementedError) as exc:
                r.error = "execution failed: " + " ".join(str(exc).split())
                note = "failed"
            bar.advance(note)


def _measure_hardware(rep: Report, measure_hardware: Any, devices: list) -> Any:
    from autolayout.costmodel.devices import hardware_for_device
    from autolayout.costmodel.profiles import get_hardware

    if measure_hardware is None:
        return hardware_for_device(devices[0])
    if isinstance(measure_hardware, str) and measure_hardware == "calibrate":
        try:
            from autolayout.reporting.devices import calibrated
            hw, why = calibrated(rep.mesh, devices, quick=True)
            if why:
                rep.notes.append(why)
            return hw
        except (ImportError, NotImplementedError, TypeError) as exc:
            rep.notes.append(f"calibration unavailable ({type(exc).__name__}: {exc}); "
                             "using the built-in profile of these devices")
            return hardware_for_device(devices[0])
    return get_hardware(measure_hardware)


# ----------------------------------------------------------------------------- write
LAYOUT_CHARS = 34  # a layout longer than this is abbreviated in tables (full text: tooltip + footnote)


def layout_cell(layout: Any, limit: int = LAYOUT_CHARS) -> Cell:
    """A layout for a table cell: abbreviated to ``limit`` characters, the full string as tooltip."""
    full = str(layout) or "(replicated)"
    return Cell(short_layout(layout, limit), full)


def layout_footnote(named: list[tuple[str, Any]], limit: int = LAYOUT_CHARS) -> str:
    """``Full layouts: `a` = `...`; ...`` for the layouts a table abbreviated ("" if none)."""
    long = [(n, str(lay)) for n, lay in named if len(str(lay) or "(replicated)") > limit
            or short_layout(lay, 10**6) != (str(lay) or "(replicated)")]
    if not long:
        return ""
    return "Full layouts (abbreviated above): " + "; ".join(f"{n} = `{lay}`" for n, lay in long) + "."


def _local_differs(rep: Report) -> bool:
    return bool(rep.executed) and rep.measure_hardware is not None and rep.measure_hardware.name != rep.hardware.name


def _display_table(rep: Report) -> Any:
    """The layouts table as a reader sees it: units in the headers, layouts abbreviated.

    Predictions on the report's hardware come first; when the layouts ran on local devices
    of another kind, the local prediction and the measurement follow under their own
    labels (they are compared with each other, not with the target's numbers).
    """
    import pandas as pd

    rows = []
    hbm = rep.hardware.hbm_bytes
    target = rep.hardware.name
    local = _local_differs(rep)
    for r in rep.results:
        c, ex = r.cost, r.execution
        row = {"layout": r.name, "rules": layout_cell(r.layout)}
        pre = f"{target}: " if local else ""
        if c is not None:
            row.update({f"{pre}compute": fmt_time(c.compute_s), f"{pre}comm.": fmt_time(c.comm_s),
                        f"{pre}step time": fmt_time(c.time_s),
                        f"{pre}memory / device": fmt_bytes(c.memory_bytes) + ("" if c.fits else " (over HBM)"),
                        "% of HBM": f"{c.memory_bytes / hbm:.1%}"})
        else:
            row.update({f"{pre}compute": "", f"{pre}comm.": "", f"{pre}step time": "", f"{pre}memory / device": "",
                        "% of HBM": ""})
        if rep.executed:
            here = f"here ({rep.measure_hardware.name}): " if local else ""
            if local:
                row[f"{here}predicted"] = fmt_time(r.local_predicted_s) if ex else ""
            row[f"{here}measured" if local else "measured here"] = fmt_time(r.measured_s) if ex else ""
            row.update({"max |error|": f"{ex.max_abs_error:.2g}" if ex else "",
                        "collectives": ("match" if ex.collectives_match else "MISMATCH") if ex else ""})
        row["note"] = r.error
        rows.append(row)
    df = pd.DataFrame(rows)
    if not any(df["note"]):
        df = df.drop(columns="note")
    return df


def _noise_note(executed: list[LayoutResult]) -> str:
    """How much the timed runs of one layout differ: differences below that are noise."""
    spreads = [r.execution.step_time_spread_s / r.execution.step_time_s for r in executed
               if r.execution.step_time_s > 0 and len(r.execution.step_times_s) > 1]
    if not spreads:
        return ""
    return (f" The timed runs of one layout differ by up to {max(spreads):.0%} of its median (slowest minus "
            "fastest): measured differences smaller than that are noise, and so is the order they give.")


def _ranked(rep: Report) -> list[LayoutResult]:
    return sorted((r for r in rep.results if r.cost is not None), key=lambda r: r.cost.time_s)


def default_intro(rep: Report) -> str:
    """One paragraph: what the report shows and which layout to use and why, from its numbers."""
    from autolayout.reporting.describe import why_faster

    g, ranked = rep.graph, _ranked(rep)
    parts = [f"This report compares {len(rep.results)} layouts of `{g.name}` ({g.num_params():,} parameters, "
             f"{g.flops():.3g} model FLOPs per step) on mesh `{rep.mesh}` ({rep.mesh.size} devices), predicted "
             f"per device for `{rep.hardware.name}` ({fmt_bytes(rep.hardware.hbm_bytes)} of HBM)."]
    fits = [r for r in ranked if r.cost.fits]
    if len(fits) >= 2:
        parts.append("Fastest that fits: " + why_faster(fits[0].name, fits[0].cost, fits[1].name, fits[1].cost))
    elif fits:
        parts.append(f"Only `{fits[0].name}` fits in HBM ({fmt_time(fits[0].cost.time_s)} per step).")
    elif ranked:
        parts.append(f"No layout fits in HBM; the smallest needs "
                     f"{fmt_bytes(min(r.cost.memory_bytes for r in ranked))} per device.")
    if rep.search is not None:
        s = rep.search
        parts.append(f"The CP-SAT search returned {s.status} (gap {s.gap:.1%}) in {s.solve_time_s:.2f} s"
                     + (": no layout is predicted faster than `searched`." if s.status == "OPTIMAL" else "."))
    ex = rep.executed
    if ex:
        matched = sum(bool(r.execution.collectives_match) for r in ex)
        err = max(r.execution.max_abs_error for r in ex)
        rho = rep.spearman
        local = rep.measure_hardware.name
        parts.append(
            f"Executed on {rep.mesh.size} local {rep.platform} devices, the outputs differ from the unsharded "
            f"reference by at most {err:.2g} (absolute) and the compiled collectives matched the predicted "
            f"ones for {matched} of {len(ex)} layouts; measured step times rank against predictions priced for "
            f"these devices (`{local}` profile) with Spearman rho = {'n/a' if rho != rho else f'{rho:.2f}'}"
            + (f" — the `{rep.hardware.name}` predictions are a different machine's and are not ranked against "
               "these measurements." if _local_differs(rep) else "."))
    return " ".join(parts)


def build_page(rep: Report, title: str | None = None, intro: str | None = None, command: str = "") -> Any:
    """The report as a :class:`~autolayout.reporting.page.Page` (not yet written)."""
    from autolayout.reporting import plots
    from autolayout.reporting.page import Page

    rep.title = title or f"Layouts of {rep.graph.name} on {rep.mesh}"
    rep.intro = intro or default_intro(rep)
    page = Page(rep.title, rep.intro, command=command)
    ok = [r for r in rep.results if r.cost is not None]

    page.heading("Layouts side by side")
    local = _local_differs(rep)
    page.paragraph(f"Predicted per device and per training step on `{rep.hardware.name}`: compute, communication "
                   f"(comm.), step time and peak memory (HBM {fmt_bytes(rep.hardware.hbm_bytes)})"
                   + ((". The columns marked *here* come from running each layout with `autolayout.execute` on the "
                       f"{rep.mesh.size} local {rep.platform} devices: the prediction for these devices "
                       f"(`{rep.measure_hardware.name}` profile) and the measured median step time. They are a "
                       f"different machine from `{rep.hardware.name}`: compare *here* columns with each other.")
                      if local else
                      (". *Measured here* is the median step time of each layout run with `autolayout.execute` on "
                       f"the {rep.mesh.size} local {rep.platform} devices." if rep.executed else ".")))
    page.table(rep.table(), "layouts", "Layouts", display=_display_table(rep))
    foot = layout_footnote([(r.name, r.layout) for r in rep.results])
    if foot:
        page.note(foot)
    for note in rep.notes + [n for n in (rep.execute_note, rep.search_note) if n]:
        page.paragraph("Note: " + note)
    if ok:
        names = [r.name for r in ok]
        page.image(plots.time_bars(names, [r.cost.compute_s for r in ok], [r.cost.comm_s for r in ok],
                                   title=f"Predicted step time on {rep.hardware.name}"),
                   "time", "Predicted time per step: compute (blue) and communication (orange) per layout.")
        page.image(plots.memory_bars(names, [r.cost.memory_bytes for r in ok], rep.hardware.hbm_bytes,
                                     [r.cost.memory for r in ok], title=f"Peak memory per device on {rep.hardware.name}"),
                   "memory", "Predicted peak memory per device by kind, against the device's HBM (dashed line).")

    page.heading("Search")
    if rep.search is not None:
        s = rep.search
        import pandas as pd
        df = pd.DataFrame([{"status": s.status, "layout": str(s.layout), "objective_ms": s.objective_s * 1e3,
                            "bound_ms": s.bound_s * 1e3, "gap": s.gap, "solve_time_s": s.solve_time_s,
                            "variables": s.num_variables, "constraints": s.num_constraints}])
        disp = pd.DataFrame([{"status": s.status, "layout": layout_cell(s.layout),
                              "objective": fmt_time(s.objective_s), "bound": fmt_time(s.bound_s),
                              "gap": f"{s.gap:.2%}", "solve time": f"{s.solve_time_s:.2f} s",
                              "variables": s.num_variables, "constraints": s.num_constraints}])
        page.paragraph("The CP-SAT model is exact with respect to the cost model: its objective is the predicted "
                       "step time of the layout it returns; the bound proves no layout is faster than "
                       "bound (gap = (objective - bound) / objective).")
        page.table(df, "search", "Search result", display=disp)
        if s.status != "OPTIMAL":
            page.paragraph(f"Status {s.status}: the searched layout fits the memory limit but is not proven "
                           f"fastest (gap {s.gap:.1%}); a longer time limit may find a faster one.")
        for note in s.notes:
            page.paragraph("Search note: " + " ".join(str(note).split()))
        page.paragraph("The searched layout in full:")
        page.code(str(s.layout) or "(replicated)")
    else:
        page.paragraph(rep.search_note or "The search was not run (search=False).")

    ex = rep.executed
    if ex:
        page.heading("Predicted vs measured on the local devices")
        rho = rep.spearman
        local_hw = rep.measure_hardware.name
        page.paragraph(
            f"Each point is one layout run on the {rep.mesh.size} local {rep.platform} devices: the step time "
            f"predicted for these devices (`{local_hw}` profile) against the median measured step time. What "
            f"matters for choosing layouts is the order: Spearman rank correlation rho = "
            f"{'n/a (fewer than 3 layouts)' if rho != rho else f'{rho:.2f}'}."
            + (f" The `{rep.hardware.name}` predictions of the table above are for another machine and are not "
               "part of this comparison." if local else "")
            + _noise_note(ex)
            + (" On virtual CPU devices that share a few cores, absolute times validate the pipeline and a "
               "calibrated CPU profile, not an accelerator's speed." if rep.platform == "CPU" else ""))
        page.image(plots.scatter([r.local_predicted_s for r in ex], [r.measured_s for r in ex],
                                 [r.name for r in ex], rho, title=f"Here: {local_hw} prediction vs measured",
                                 xlabel=f"predicted for these devices ({local_hw})"),
                   "predicted_vs_measured",
                   "Predicted (local profile) vs measured step time per layout (log-log; dotted line: equal).")
        bad = [r for r in ex if not r.execution.collectives_match]
        for r in bad:
            page.paragraph(f"Collectives of {r.name} differ from the prediction:")
            page.code(r.execution.collective_diff())

    if rep.scaling is not None:
        from autolayout.reporting.paper import scaling_display

        page.heading("Scaling (paper §8.6)")
        page.paragraph(
            f"The paper's MLP under growing meshes, predicted on `{rep.scaling.hardware.iloc[0]}`: n = k² devices "
            "with batch and "
            "hidden scaled linearly with k. Data- and model-parallel layouts lose efficiency as n grows (their "
            "communication/computation ratio is n/b and n/d_h); the 2-D layout batch:rows;hidden:cols keeps it "
            "(c/d_h + r/b stays constant) — processors grow quadratically while batch and hidden grow linearly. "
            "The 3-D layout on k³ devices scales batch, hidden and io linearly.")
        page.image(plots.scaling_lines(rep.scaling, f"Predicted efficiency on {rep.scaling.hardware.iloc[0]} "
                                                    "(paper §8.6)"),
                   "scaling", "Predicted model-FLOPs utilisation vs devices (hollow: does not fit in HBM).")
        page.table(rep.scaling, "scaling", "Scaling data", display=scaling_display(rep.scaling))

    page.summary = {
        "title": rep.title, "graph": rep.graph.name, "mesh": str(rep.mesh), "hardware": rep.hardware.name,
        "layouts": {r.name: {"layout": str(r.layout), "time_s": r.cost.time_s if r.cost else None,
                             "memory_bytes": r.cost.memory_bytes if r.cost else None,
                             "measured_s": r.measured_s if r.execution else None,
                             "collectives_match": bool(r.execution.collectives_match) if r.execution else None,
                             "error": r.error} for r in rep.results},
        "search": ({"status": rep.search.status, "layout": str(rep.search.layout), "gap": rep.search.gap,
                    "solve_time_s": rep.search.solve_time_s} if rep.search is not None else None),
        "spearman": rep.spearman if ex else None,
    }
    return page


def write(rep: Report, out: str | Path, title: str | None = None, intro: str | None = None,
          command: str = "") -> Report:
    """Write ``rep`` under ``out``; returns it with ``path`` set."""
    page = build_page(rep, title, intro, command)
    rep.path = page.write(out)
    return rep


def report(graph: Any, mesh: Any, layouts: Any = (), *, hardware: Any = DEFAULT_HARDWARE, execute: bool = True,
           search: bool = True, out: str | Path = "reports/report", title: str | None = None,
           intro: str | None = None, measure_hardware: Any = None, scaling: bool = False, repeats: int = 3,
           progress: bool = True, time_limit_s: float = 60, memory_limit: float | str | None = None) -> Report:
    """Compare ``layouts`` of ``graph`` on ``mesh`` and write a report directory ``out``.

    Args:
        graph: a traced graph (``autolayout.trace`` or :mod:`autolayout.models`).
        mesh: anything :class:`~autolayout.core.Mesh` accepts (``"rows:2,cols:4"``).
        layouts: a layout, a list of layouts (strings or :class:`~autolayout.core.Layout`),
            ``(name, layout)`` pairs or a mapping name -> layout.
        hardware: the profile predictions are priced on (name, Hardware or JSON path);
            default :data:`~autolayout.costmodel.profiles.DEFAULT_HARDWARE` (``"tpu-v3"``).
        execute: also run each layout on the local devices (``autolayout.execute``: compile,
            run, compare outputs and collectives, time it) — the slow part; skipped with a
            note when the mesh has more devices than jax has. ``False``: predictions only.
        search: also run ``autolayout.search`` and add its layout (``"searched"``, or
            ``"<name> (searched)"`` when it is one of ``layouts``).
        out: the directory to write (``index.html``, ``report.md``, PNGs, CSVs).
        title, intro: override the title and the opening paragraph (computed by default).
        measure_hardware: the profile that prices the executed runs: default the built-in
            profile of the local devices; ``"calibrate"`` measures one with
            ``autolayout.calibrate``; or a name, Hardware or JSON path.
        scaling: add the paper's §8.6 scaling chart of its MLP (predicted on ``hardware``;
            not about ``graph``, so off by default).

    Example::

        g = autolayout.models.mlp(batch=1024, d_io=256, d_hidden=1024)
        r = autolayout.report(g, "rows:2,cols:4", ["batch:rows,cols", "batch:rows;hidden:cols"],
                              out="reports/mlp")
        r.path / "index.html"
    """
    rep = collect(graph, mesh, layouts, hardware=hardware, execute=execute, search=search,
                  measure_hardware=measure_hardware, scaling=scaling, repeats=repeats, progress=progress,
                  time_limit_s=time_limit_s, memory_limit=memory_limit)
    return write(rep, out, title, intro)
