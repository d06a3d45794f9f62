"""``autolayout demo``: the pipeline end to end on a small transformer, one section at a time.

Each section is a function that takes the :class:`Demo` state, prints its part and
may add to the state; :data:`SECTIONS` lists them in order, so a new stage is one
function and one entry. Sizes are the zoo's defaults (``models.transformer_lm()``):
tracing, prediction and search take seconds; compiling and running layouts on 8 virtual
CPU devices takes most of the demo's time (``benchmarks/demo_time.py`` measures it;
``--no-execute`` skips it): the search runs its :data:`VERIFY_K` best predicted layouts
and keeps the measured fastest (``search(..., verify=k)``, section 5), and section 6 runs
the paper's named layouts beside it, reusing section 5's runs and unsharded reference.
With ``--hardware`` naming other hardware the search is for that target and nothing is
measured to choose between its layouts.

Two hardware profiles are kept apart: the *target* (``--hardware``, default the local
devices) that predictions and the search are for, and the *local* profile of the devices
the layouts run on here (measured by ``autolayout.calibrate`` on CPUs). Measurements are
ranked only against local predictions; target predictions are shown beside them.

The report goes to a fresh directory outside the repository (``fresh_report_dir``),
named in the demo's last line; ``autolayout report --all`` regenerates the committed
``reports/demo``.
"""
from __future__ import annotations

import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from autolayout.graph import Graph, SignatureClass
from autolayout.reporting.fmt import fmt_bytes, fmt_time, short_layout, spearman, text_table


def _zoo_sizes() -> dict[str, int]:
    """The built-in transformer's default sizes (``autolayout.models.transformer_lm()``)."""
    from autolayout.reporting.model_spec import ZOO_DEFAULTS
    return dict(ZOO_DEFAULTS["transformer_lm"])


SIZES = _zoo_sizes()
MESH = "rows:2,cols:4"
# The named layouts of the paper (§8, §9) on a 2-D mesh, beside the search's choice.
NAMED = [
    ("data-parallel", "batch:rows,cols"),
    ("model-parallel", "heads:cols;d_ff:cols;vocab:cols"),
    ("2-D (paper §9)", "batch:rows;heads:cols;d_ff:cols;vocab:cols"),
]
WIDTH = 78


def compile_cache_dir() -> str | None:
    """The directory of jax's persistent compilation cache when the user turned it on
    (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``), else ``None``. The demo never turns
    the cache on itself, and leaves jax's settings alone.

    Why not: on CPU devices an executable loaded from that cache is not always the one that
    was compiled (jax/jaxlib 0.10.2). The FSDP (``@3``) training step of the small
    transformer on 8 CPU devices, loaded back from the cache, returns different numbers
    from run to run — NaN in some runs, wrong finite values in others (max |error| 0.02 here,
    3.7e27 in another report), right in others — while the freshly compiled one matches
    ``jax.jit``; the two programs' HLO text is the same, so it is not
    a cache-key collision, and it happens without donated arguments too
    (``tests/test_compile_cache.py`` reproduces it). jax's cache was long TPU-only and
    CPU executables were not serialisable (jax-ml/jax#7536); XLA:CPU's loader of cached
    executables still has open bugs (jax-ml/jax#38445). The demo's answers must be
    right, so it compiles every program.
    """
    import os

    import jax

    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir or None


def fresh_report_dir() -> str:
    """A new, empty directory for the demo's report in the system's temp folder (never in
    the repository, so a first run leaves ``git status`` clean)."""
    return tempfile.mkdtemp(prefix="autolayout-demo-")


@dataclass
class Demo:
    """What the sections share: options, the traced graph, and anything later sections add."""

    sizes: dict[str, int]
    graph: Graph | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    mesh: str = MESH
    hardware: Any = None   # target profile of predictions and search; None: the local devices' profile
    local: Any = None      # profile of the local devices the layouts run on (set by section_calibrate)
    execute: bool = True
    repeats: int = 3
    progress: bool = True
    out: str | None = None  # report directory; None: no report
    calibrate: bool = True  # measure a profile on CPU devices rather than using the built-in one

    @property
    def other_target(self) -> bool:
        """Whether predictions are for hardware other than the local devices."""
        return self.local is not None and self.hardware is not None and self.hardware.name != self.local.name


def header(title: str) -> None:
    print()
    print(f"== {title} ".ljust(WIDTH, "="))


def table(rows: list[tuple], head: tuple, align: str) -> None:
    """Print ``rows`` under ``head``; ``align`` has one ``<`` or ``>`` per column."""
    print(text_table(rows, head, align))


# --------------------------------------------------------------------------- sections
def section_trace(demo: Demo) -> None:
    """Trace one Adam training step of the built-in transformer (nothing is allocated)."""
    from autolayout import models

    header("1. Trace: a plain JAX training step -> named-dimension graph")
    args = ", ".join(f"{k}={v}" for k, v in demo.sizes.items())
    t0 = time.perf_counter()
    demo.graph = models.transformer_lm(**demo.sizes)
    print(f"  models.transformer_lm({'' if demo.sizes == SIZES else args})"
          + (f"    # the zoo's default sizes: {args}" if demo.sizes == SIZES else ""))
    print(f"  traced in {time.perf_counter() - t0:.2f} s (jax.ShapeDtypeStruct arguments, Adam)")
    print()
    for line in demo.graph.summary().splitlines():
        print("  " + line)


def section_signatures(demo: Demo) -> None:
    """Signature classes by kind: what the cost model and the search work on."""
    g = demo.graph
    header("2. Signature classes: identical ops (repeated layers) share a class")
    classes = g.signature_classes()
    by_kind: dict[str, list[SignatureClass]] = defaultdict(list)
    for c in classes:
        by_kind[c.kind].append(c)
    ops = Counter(op.kind for op in g.ops())
    rows = []
    for kind in sorted(by_kind, key=lambda k: -ops[k]):
        cs = by_kind[kind]
        flops = sum(g.op(c.ops[0]).flops() * c.count for c in cs if _contraction(g, c))
        rows.append((kind, ops[kind], len(cs), sum(c.count for c in cs), f"{flops:.3g}" if flops else ""))
    rows.append(("total", len(g), len(classes), sum(c.count for c in classes), f"{g.flops():.3g}"))
    table(rows, ("kind", "ops", "classes", "executions/step", "model flops"), "<>>>>")
    print()
    print("  heaviest contractions (flops per step):")
    top = sorted((c for c in classes if _contraction(g, c)),
                 key=lambda c: -g.op(c.ops[0]).flops() * c.count)[:5]
    table([(_einsum_text(g, c), c.count, f"{g.op(c.ops[0]).flops() * c.count:.3g}") for c in top],
          ("einsum", "count", "flops"), "<>>")


def _contraction(g: Graph, c: SignatureClass) -> bool:
    """Einsums of two or more inputs: what model flops (``Graph.flops``) count."""
    return c.kind == "einsum" and len(g.op(c.ops[0]).inputs) >= 2


def _einsum_text(g: Graph, c: SignatureClass) -> str:
    op = g.op(c.ops[0])
    shape = lambda s: "[" + ",".join(d.name for d in s) + "]"  # noqa: E731
    return ", ".join(shape(s) for s in op.input_shapes) + " -> " + shape(op.output.shape)


def section_calibrate(demo: Demo) -> None:
    """The local devices and their profile (measured on CPUs), and the target profile."""
    from autolayout.core import Mesh
    import jax

    from autolayout.costmodel.devices import hardware_for_device
    from autolayout.costmodel.profiles import get_hardware
    from autolayout.reporting.devices import devices_for

    mesh = Mesh.parse(demo.mesh)
    devices, note = devices_for(mesh.size)
    demo.extras["devices"], demo.extras["devices_note"] = devices, note
    header("3. Calibrate: a hardware profile for the cost model")
    if demo.hardware is not None:
        demo.hardware = get_hardware(demo.hardware)
        print(f"  target: the built-in {demo.hardware.name} profile (--hardware): predictions and the search are "
              "for it")
    builtin = hardware_for_device((devices or jax.devices())[0])
    if not demo.execute and demo.hardware is not None:
        return  # nothing runs here: no local profile needed
    if not demo.calibrate or devices is None or builtin.name != "cpu":
        demo.local = builtin
        print(f"  local devices: the built-in {builtin.name} profile")
    else:
        try:
            from autolayout.reporting.devices import calibrated
            t0 = time.perf_counter()
            hw, why = calibrated(mesh, devices, quick=True)
        except (ImportError, NotImplementedError, ValueError) as exc:
            hw, why = builtin, f"calibration unavailable ({type(exc).__name__}: {exc}); using the built-in cpu placeholder"
        demo.local = hw
        if why:
            print(f"  {why}")
        else:
            print(f"  local devices: measured on {len(devices)} {devices[0].platform.upper()} devices in "
                  f"{time.perf_counter() - t0:.1f} s (autolayout.calibrate, quick): all devices at once, so each "
                  "gets its share of the cores")
            rows = [("matmul", f"{hw.peak('float32') / 1e9:.3g} GFLOP/s per device"),
                    ("memory bandwidth", f"{hw.hbm_bandwidth / 1e9:.3g} GB/s per device")]
            rows += [(f"axis {a}", f"{l.bandwidth / 1e9:.3g} GB/s, latency {l.latency * 1e6:.3g} us per step")
                     for a, l in hw.axis_links]
            table(rows, ("", "measured"), "<<")
    if demo.hardware is None:
        demo.hardware = demo.local
    elif demo.other_target:
        print(f"  predictions below are for {demo.hardware.name}; the layouts then run here and are checked "
              f"against {demo.local.name} predictions, not against {demo.hardware.name}'s")


def section_predict(demo: Demo) -> None:
    """Predict the named layouts (and the replicated one) on the mesh: no device needed."""
    from autolayout.core import Mesh
    from autolayout.costmodel.predict import predict

    mesh = Mesh.parse(demo.mesh)
    hw = demo.hardware
    header(f"4. Predict: per device per step on {mesh} ({hw.name})")
    layouts = [("replicated", "")] + NAMED
    costs = {name: predict(demo.graph, mesh, lay, hardware=hw) for name, lay in layouts}
    demo.extras["costs"] = costs
    rows = [(name, short_layout(c.layout, 44), fmt_time(c.compute_s), fmt_time(c.comm_s), fmt_time(c.time_s),
             fmt_bytes(c.memory_bytes), len(c.collectives)) for name, c in costs.items()]
    table(rows, ("layout", "rules", "compute", "comm", "time", "memory", "collectives"), "<<>>>>>")
    print("\n  (no device is needed to predict: `autolayout predict transformer_lm --hardware tpu-v4 ...`)")


VERIFY_K = 3  # layouts the search hands to the measurement (section 5); each is compiled and run once


def section_search(demo: Demo) -> None:
    """Find the fastest layouts under the cost model with CP-SAT, run the best few here and
    keep the measured fastest (``search(..., verify=k)``)."""
    devices = demo.extras.get("devices")
    measure = demo.execute and devices is not None and demo.local is not None and not demo.other_target
    header("5. Search: the fastest layouts under the cost model (CP-SAT), measured here"
           if measure else "5. Search: the fastest layout under the cost model (CP-SAT)")
    try:
        from autolayout.search.api import search
    except ImportError as exc:
        print(f"  search unavailable in this installation: {exc}")
        return
    if measure:
        from autolayout.exec.verify import verify
        r = verify(demo.graph, demo.mesh, VERIFY_K, hardware=demo.hardware, repeats=demo.repeats, devices=devices)
    else:
        r = search(demo.graph, demo.mesh, hardware=demo.hardware)
    demo.extras["search"] = r
    print(f"  {r.status} in {r.solve_time_s:.2f} s ({r.num_variables} variables, {r.num_constraints} constraints), "
          f"gap {r.gap:.1%}")
    if r.verified:
        print(f"  the {len(r.verified)} best predicted layouts, each run on {len(devices)} {devices[0].platform.upper()} "
              f"devices ({demo.repeats} rounds, one step of each per round; median):")
        from autolayout.core import Layout
        rows = [("*" if v.layout == r.layout else "", i + 1, short_layout(Layout(v.layout.rules), 44),
                 getattr(v.layout, "remat", "") or "none", fmt_time(v.predicted_time_s),
                 fmt_time(v.measured_time_s) if v.ok else "-", fmt_bytes(v.memory_bytes),
                 fmt_bytes(v.xla_memory_bytes) if v.xla_memory_bytes >= 0 else "-", "ok" if v.ok else v.error[:40])
                for i, v in enumerate(r.verified)]
        table(rows, ("", "#", "rules (+ storage sharding)", "remat", "predicted", "measured", "memory", "XLA memory",
                     "run"), "<><<>>>><")
        win = next(i for i, v in enumerate(r.verified) if v.layout == r.layout) + 1
        print(f"  chosen: #{win}, the measured fastest (*)" + (" — also the predicted fastest" if win == 1 else ""))
    elif demo.execute and demo.other_target:
        print(f"  (the search is for {demo.hardware.name}, not these devices: its layouts are not measured here "
              "to choose between them)")
    print(f"  layout: {short_layout(r.layout, 120)}")
    best_named = min(((n, c) for n, c in demo.extras["costs"].items()), key=lambda nc: nc[1].time_s)
    print(f"  predicted {fmt_time(r.cost.time_s)} per step (compute {fmt_time(r.cost.compute_s)}, comm "
          f"{fmt_time(r.cost.comm_s)}), memory {fmt_bytes(r.cost.memory_bytes)}/device on {demo.hardware.name}")
    if r.cost.time_s < best_named[1].time_s:
        from autolayout.reporting.describe import why_faster
        for line in _wrap("why: " + why_faster("searched", r.cost, best_named[0], best_named[1]).replace("`", "")):
            print("  " + line)
    stages = Counter(stage for _, _, stage in getattr(r.layout, "storage", ()))
    what = {1: "update a shard (weight-update sharding, seed 003: reduce-scatter the gradient, update 1/N, "
               "all-gather)",
            2: "also keep their gradients sharded (ZeRO-2)", 3: "are stored sharded and gathered per use (ZeRO-3)"}
    for stage, n in sorted(stages.items()):
        print(f"  storage sharding: {n} {'entry' if n == 1 else 'entries'} {what.get(stage, f'at stage {stage}')}")


def _measured(demo: Demo, lay: Any) -> Any:
    """The run of ``lay`` made by the search's measurement (section 5), if there is one."""
    r = demo.extras.get("search")
    for v in getattr(r, "verified", ()):
        if v.execution is not None and v.layout.canonical() == lay.canonical():
            return v.execution
    return None


def _layouts_to_run(demo: Demo) -> list[tuple[str, Any]]:
    from autolayout.core import Layout

    out = list(NAMED)
    r = demo.extras.get("search")
    if r is not None:
        same = [i for i, (_, lay) in enumerate(out) if Layout(lay).canonical() == r.layout.canonical()]
        if same:
            out[same[0]] = (out[same[0]][0] + " (searched)", out[same[0]][1])
        else:
            out.insert(0, ("searched", r.layout))
    return [(name, Layout.coerce(lay)) for name, lay in out]


def section_execute(demo: Demo) -> None:
    """Run each layout as one jax.shard_map program on the devices and check it."""
    from autolayout.report import LayoutResult
    from autolayout.reporting.progress import Progress

    devices = demo.extras.get("devices")
    header(f"6. Execute: each layout as one shard_map program on {demo.mesh}")
    if not demo.execute:
        print("  skipped (--no-execute)")
        return
    if devices is None:
        print(f"  skipped: {demo.extras.get('devices_note')}")
        return
    try:
        from autolayout.exec.verify import measure
    except ImportError as exc:
        print(f"  execution unavailable in this installation: {exc}")
        return
    if demo.extras.get("devices_note"):
        print(f"  note: {demo.extras['devices_note']}")
    from autolayout.costmodel.predict import predict
    todo = _layouts_to_run(demo)
    print(f"  {len(todo)} layouts on {len(devices)} {devices[0].platform.upper()} devices: compile, run once, "
          f"time {demo.repeats} rounds (one step of each per round), compare with the unsharded reference")
    cache = compile_cache_dir()
    if cache and devices[0].platform == "cpu":
        print(f"  warning: jax's persistent compilation cache is on ({cache}); programs loaded from it on "
              "CPU devices can compute wrong numbers (autolayout.demo.compile_cache_dir): the output check "
              "below catches them")
    results = [LayoutResult(name, lay, cost=predict(demo.graph, demo.mesh, lay, hardware=demo.hardware))
               for name, lay in todo]
    t0 = time.perf_counter()
    for res in results:
        res.execution = _measured(demo, res.layout)  # run in section 5: not compiled again
    again = [res for res in results if res.execution is None]
    if len(again) < len(results):
        print(f"  ({len(results) - len(again)} of them already ran in section 5: their runs are reused)")
    with Progress(1, "executing", enabled=demo.progress and bool(again)) as bar:
        bar.start(", ".join(res.name for res in again))
        runs = measure(demo.graph, demo.mesh, [res.layout for res in again], hardware=demo.local,
                       repeats=demo.repeats, devices=devices) if again else []
        for res, run in zip(again, runs):
            if isinstance(run, str):
                res.error = "execution failed: " + run
            else:
                res.execution = run
        bar.advance(f"{len(again)} layouts")
    demo.extras["results"] = results
    print(f"  done in {time.perf_counter() - t0:.1f} s")


def section_validate(demo: Demo) -> None:
    """Predicted vs measured, outputs vs reference, predicted vs compiled collectives."""
    results = demo.extras.get("results")
    if not results:
        return
    local = demo.local.name
    header("7. Validate: predicted vs measured here (per device, one training step)")
    rows = []
    for r in results:
        ex = r.execution
        target = (fmt_time(r.cost.time_s),) if demo.other_target else ()
        if ex is None:
            rows.append((r.name, *target, "", "", "", "", r.error[:40]))
            continue
        p = ex.predicted
        rows.append((r.name, *target, f"{fmt_time(p.compute_s)} + {fmt_time(p.comm_s)}", fmt_time(p.time_s),
                     fmt_time(ex.step_time_s), f"{ex.max_abs_error:.1e}",
                     f"{'match' if ex.collectives_match else 'MISMATCH'} ({len(ex.compiled_collectives)})"))
    head = ("layout", *((f"{demo.hardware.name} pred.",) if demo.other_target else ()),
            "compute + comm", f"predicted ({local})", "measured", "max err", "collectives")
    table(rows, head, "<" + ">" * (len(head) - 2) + "<")
    ran = [r for r in results if r.execution is not None]
    rho = spearman([r.execution.predicted.time_s for r in ran], [r.execution.step_time_s for r in ran])
    matched = sum(bool(r.execution.collectives_match) for r in ran)
    print()
    if demo.other_target:
        print(f"  ({demo.hardware.name} pred.: the prediction for the target, another machine; shown beside, "
              "never ranked against these measurements)")
    worst = max((r.execution.max_rel_error for r in ran), default=float("nan"))
    err = max((r.execution.max_abs_error for r in ran), default=float("nan"))
    verdict = "every layout computes the same numbers as the unsharded step" if worst <= 1e-4 else \
        "SOME LAYOUTS DIFFER from the unsharded step"
    print(f"  outputs: {verdict} (max abs error {err:.1e}, relative {worst:.1e})")
    print(f"  collectives: {matched} of {len(ran)} compiled programs have exactly the predicted "
          "all-reduces/all-gathers/... (kind, bytes, group)")
    print(f"  ranking: Spearman rho(predicted for these devices, measured) = "
          f"{'n/a' if rho != rho else f'{rho:.2f}'} over {len(ran)} layouts")
    if demo.local.name.startswith("calibrated") or demo.local.name == "cpu":
        print(f"  (8 virtual devices share this machine's cores: the times check the pipeline and the "
              f"{local} profile, not an accelerator's speed)")
    for r in ran:
        if not r.execution.collectives_match:
            print(f"\n  {r.name}: predicted vs compiled collectives differ:")
            for line in r.execution.collective_diff().splitlines():
                print("    " + line)


def section_report(demo: Demo) -> None:
    """Write the same results as an HTML + Markdown report."""
    if not demo.out:
        return
    from autolayout.core import Mesh
    from autolayout.report import LayoutResult, Report, write

    header("8. Report")
    results = demo.extras.get("results")
    if not results:  # not executed: predictions only
        from autolayout.costmodel.predict import predict
        results = [LayoutResult(n, lay, cost=predict(demo.graph, demo.mesh, lay, hardware=demo.hardware))
                   for n, lay in _layouts_to_run(demo)]
    devices = demo.extras.get("devices") or []
    rep = Report(graph=demo.graph, mesh=Mesh.parse(demo.mesh), hardware=demo.hardware, results=results,
                 search=demo.extras.get("search"), measure_hardware=demo.local,
                 platform=devices[0].platform.upper() if devices else "")
    write(rep, demo.out, title="autolayout demo: a small transformer on a 2x4 mesh", command="autolayout demo")
    demo.extras["report"] = rep.path / "index.html"
    print(f"  wrote {rep.path / 'index.html'} (self-contained), {rep.path / 'report.md'}, PNG charts and CSV tables")


SECTIONS: list[Callable[[Demo], None]] = [section_trace, section_signatures, section_calibrate, section_predict,
                                          section_search, section_execute, section_validate, section_report]


def run(sizes: dict[str, int] | None = None, *, out: str | None = None, report: bool = False, execute: bool = True,
        hardware: Any = None, repeats: int = 3, progress: bool = True, mesh: str = MESH,
        calibrate: bool = True) -> int:
    """Run every section in order; returns the exit code (0).

    Args:
        sizes: ``transformer_lm`` sizes (default: the zoo's defaults, :data:`SIZES`).
        out: write the report there.
        report: write a report even without ``out``: to a :func:`fresh_report_dir` (what
            ``autolayout demo`` does). With neither, no report is written.
        execute: ``False`` stops after the search (nothing is compiled or run).
        hardware: the target profile to predict and search for (default: the local
            devices' profile); the layouts still run, and are checked, on the local devices.
        calibrate: measure the local CPU devices' profile (``autolayout.calibrate``) rather
            than use the built-in ``cpu`` placeholder.

    The last line printed says where the report is.
    """
    t0 = time.perf_counter()
    if out is None and report:
        out = fresh_report_dir()
    demo = Demo(dict(sizes or SIZES), mesh=mesh, hardware=hardware, execute=execute, repeats=repeats,
                progress=progress, out=out, calibrate=calibrate)
    print("autolayout demo: how should each tensor dimension be split across a mesh?")
    for section in SECTIONS:
        section(demo)
    print()
    where = demo.extras.get("report")
    print(f"demo finished in {time.perf_counter() - t0:.1f} s; "
          + (f"report: {where} (open it in a browser)" if where else "no report written"))
    return 0


def _wrap(text: str, width: int = WIDTH - 2) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width, subsequent_indent="  ")


if __name__ == "__main__":
    raise SystemExit(run(report=True))
