"""Command line: ``autolayout demo | search | predict | execute | report | calibrate | table1 | hardware``.

Errors of autolayout (all ValueError subclasses, e.g. LayoutError) and bad arguments are
printed as one line ``autolayout: error: ...`` with exit code 2, never a traceback
(``--traceback`` shows it, for debugging). Output is a readable table; ``--json``
prints machine-readable JSON on stdout instead (progress goes to stderr).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from autolayout.costmodel.profiles import DEFAULT_HARDWARE
from autolayout.models import MODELS
from autolayout.reporting.model_spec import OneLineParser
from autolayout.reporting.paths import check_out_dir, check_out_file
from autolayout.version import __version__

PROG = "autolayout"


# ------------------------------------------------------------------------- arg types
def _arg_type(fn: Any, what: str) -> Any:
    def convert(text: str) -> Any:
        try:
            return fn(text)
        except (ValueError, TypeError, OSError) as exc:
            raise argparse.ArgumentTypeError(" ".join(str(exc).split()) or f"bad {what} {text!r}") from exc
    convert.__name__ = what
    return convert


def _mesh(text: str) -> Any:
    from autolayout.core import Mesh
    return Mesh.parse(text)


def _layout(text: str) -> Any:
    from autolayout.core import Layout
    return Layout.parse(text)


def _hardware(text: str) -> Any:
    from autolayout.costmodel.profiles import get_hardware
    try:
        return get_hardware(text)
    except OSError as exc:
        raise ValueError(f"cannot read hardware profile {text!r}: {exc.strerror or exc}") from exc


def _memory(text: str) -> float:
    from autolayout.reporting.fmt import parse_bytes
    return parse_bytes(text)


HARDWARE_HELP = f"target profile: a name (see 'autolayout hardware') or a JSON file (default {DEFAULT_HARDWARE})"
MESH = _arg_type(_mesh, "mesh")
LAYOUT = _arg_type(_layout, "layout")
HARDWARE = _arg_type(_hardware, "hardware")
MEMORY = _arg_type(_memory, "memory size")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


POSITIVE = _arg_type(_positive_int, "positive integer")


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"expected a count >= 0, got {text!r}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"expected a positive number of seconds, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"expected a number >= 0, got {text!r}")
    return value


COUNT = _arg_type(_count, "count")
SECONDS = _arg_type(_seconds, "seconds")
NONNEGATIVE = _arg_type(_fraction, "non-negative number")


class StrictError(ValueError):
    """``execute --strict`` found a collective mismatch or an error above ``--tolerance``."""


# --------------------------------------------------------------------------- helpers
def _emit(args: argparse.Namespace, data: Any, text: str) -> int:
    if getattr(args, "json", False):
        from autolayout.reporting.page import jsonable
        print(json.dumps(jsonable(data), indent=2))
    else:
        print(text)
    return 0


def _graph(args: argparse.Namespace) -> Any:
    """Trace MODEL with its options (``args.model_spec`` is set by :func:`main`)."""
    return args.model_spec.build()


def _cost_dict(cost: Any) -> dict:
    return {"layout": str(cost.layout), "mesh": str(cost.mesh), "hardware": cost.hardware.name,
            "time_s": cost.time_s, "compute_s": cost.compute_s, "comm_s": cost.comm_s,
            "exposed_comm_s": cost.exposed_comm_s, "overlapped_comm_s": cost.overlapped_comm_s, "flops": cost.flops,
            "comm_bytes": cost.comm_bytes, "memory_bytes": cost.memory_bytes, "memory": dict(cost.memory),
            "fits": bool(cost.fits), "mfu": cost.mfu, "hfu": cost.hfu, "model_flops": cost.model_flops,
            "peak_buffers": [{"name": b.name, "category": b.category, "bytes": b.bytes} for b in cost.peak_buffers],
            "collectives": [{"kind": c.kind, "bytes": c.bytes, "group_size": c.group_size,
                             "mesh_axes": list(c.mesh_axes), "op": c.op, "count": c.count, "time_s": c.time_s,
                             "overlapped": c.overlapped}
                            for c in cost.collectives]}


def _cost_rows(names: Sequence[str], costs: Sequence[Any]) -> str:
    from autolayout.reporting.fmt import fmt_bytes, fmt_time, short_layout, text_table

    rows = [(n, short_layout(c.layout, 56), fmt_time(c.compute_s), fmt_time(c.comm_s), fmt_time(c.exposed_comm_s),
             fmt_time(c.time_s), fmt_bytes(c.memory_bytes), "yes" if c.fits else "NO", f"{c.mfu:.1%}")
            for n, c in zip(names, costs)]
    return text_table(rows, ("name", "layout", "compute", "comm", "exposed comm", "time", "memory/device", "fits",
                             "MFU"), "<<>>>>>>>")


def _hardware_label(args: argparse.Namespace) -> str:
    """The profile's name, marked when it is the default (every output names its profile)."""
    hw = args.hardware
    return f"hardware {hw.name}" + (" (default; choose with --hardware)" if args.hardware_is_default else "")


def _execution_devices(mesh: Any) -> list:
    from autolayout.reporting.devices import devices_for

    devices, note = devices_for(mesh.size)
    if devices is None:
        raise ValueError(f"--mesh {mesh}: {note}, or give a smaller --mesh")
    if note:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    return devices


# -------------------------------------------------------------------------- commands
def _run_demo(args: argparse.Namespace) -> int:
    import importlib

    if args.out is not None and not args.no_report:
        check_out_dir(args.out)
    demo = importlib.import_module("autolayout.demo")  # through sys.modules, so tests can stand one in
    result = demo.run(out=None if args.no_report else args.out, report=not args.no_report, execute=not args.no_execute,
                      hardware=args.hardware, repeats=args.repeats, progress=not args.quiet,
                      calibrate=not args.no_calibrate)
    return result if isinstance(result, int) else 0


def _run_predict(args: argparse.Namespace) -> int:
    from autolayout.costmodel.predict import predict
    from autolayout.reporting.fmt import fmt_bytes, text_table

    g = _graph(args)
    layouts = args.layout or [_layout("")]
    costs = [predict(g, args.mesh, lay, hardware=args.hardware) for lay in layouts]
    names = [f"#{i + 1}" for i in range(len(costs))]
    text = [f"{g.name} on {args.mesh} ({_hardware_label(args)}), per device per step:", _cost_rows(names, costs)]
    if args.per_op:
        for name, c in zip(names, costs):
            top = c.per_op.sort_values("total_s", ascending=False).head(args.per_op)
            rows = [(r.op, r.kind, r.count, f"{r.total_s * 1e3:.4g}", r.collectives) for r in top.itertuples()]
            text += ["", f"{name}: slowest ops", text_table(rows, ("op", "kind", "count", "total ms", "collectives"),
                                                            "<<>><")]
    for name, c in zip(names, costs) if args.peak else ():
        rows = [(b.name, b.category, fmt_bytes(b.bytes)) for b in c.peak_buffers[:args.peak]]
        text += ["", f"{name}: largest buffers live at the memory peak ({fmt_bytes(c.memory_bytes)} in all, "
                     f"{len(c.peak_buffers)} buffers)", text_table(rows, ("buffer", "category", "bytes"), "<<>")]
    data = [_cost_dict(c) for c in costs]
    return _emit(args, data if len(data) > 1 else data[0], "\n".join(text))


def _run_search(args: argparse.Namespace) -> int:
    from autolayout.costmodel.plan import compact_layout
    from autolayout.exec.verify import search
    from autolayout.reporting.fmt import fmt_bytes, fmt_time, text_table

    if args.mesh is None and args.num_devices is None:
        raise ValueError("search needs --mesh (e.g. rows:4,cols:2) or --num-devices N")
    if args.mesh is not None and args.num_devices is not None:
        raise ValueError(f"give --mesh or --num-devices, not both: --mesh {args.mesh} searches layouts on that mesh, "
                         f"--num-devices {args.num_devices} searches mesh shapes of that many devices too")
    devices, label = None, _hardware_label(args)
    if args.verify is not None:
        if args.mesh is None:
            raise ValueError(f"--verify {args.verify} runs layouts on a mesh: give --mesh (e.g. rows:2,cols:4) "
                             "instead of --num-devices")
        from autolayout.costmodel.devices import hardware_for_device
        from autolayout.exec.verify import other_hardware
        devices = _execution_devices(args.mesh)
        local = hardware_for_device(devices[0])
        if args.hardware_is_default:  # predictions for the devices that measure them
            args.hardware = local
            label = f"hardware {args.hardware.name}: the local devices' profile (--verify; choose with --hardware)"
        elif other_hardware(args.hardware, local):
            raise ValueError(f"--verify {args.verify} runs the layouts on these {devices[0].platform} devices (built-in "
                             f"profile {local.name}), but --hardware {args.hardware.name} is the built-in profile of "
                             f"other hardware: the predictions would not be for the devices that measure them. Give "
                             f"--hardware {local.name}, a profile measured here (autolayout calibrate --out "
                             "profile.json; --hardware profile.json), or no --hardware")
    g = _graph(args)
    r = search(g, args.mesh, num_devices=args.num_devices, max_axes=args.max_axes, hardware=args.hardware,
               memory_limit=args.memory_limit, shard_weight_update=not args.no_weight_update_sharding,
               time_limit_s=args.time_limit, verify=args.verify, repeats=args.repeats, devices=devices)
    c = r.cost
    limit = args.memory_limit if args.memory_limit is not None else args.hardware.hbm_bytes
    limit_text = (f"{fmt_bytes(limit)} (--memory-limit)" if args.memory_limit is not None
                  else f"{fmt_bytes(limit)} (HBM of {args.hardware.name})")
    what = (f"measured fastest of the {len(r.verified)} best predicted layouts" if r.verified else "best layout")
    short = compact_layout(g, r.mesh, r.layout)  # '*' for the storage entry most parameters share
    lines = [f"{g.name}: {what} on mesh {r.mesh} ({label})", "",
             f"  {str(short) or '(replicated)'}", "",
             text_table([("status", r.status + ("" if r.status == "OPTIMAL" else " (fits; not proven fastest)")),
                         ("step time", fmt_time(c.time_s)),
                         ("  compute", fmt_time(c.compute_s)), ("  communication", fmt_time(c.comm_s)),
                         ("  exposed communication", fmt_time(c.exposed_comm_s)),
                         ("memory / device", f"{fmt_bytes(c.memory_bytes)} of {limit_text}"),
                         ("MFU", f"{c.mfu:.1%}"), ("HFU", f"{c.hfu:.1%}"), ("bound", fmt_time(r.bound_s)), ("gap", f"{r.gap:.2%}"),
                         ("solve time", f"{r.solve_time_s:.2f} s"),
                         ("variables / constraints", f"{r.num_variables} / {r.num_constraints}")],
                        ("", ""), "<>")]
    why = {"memory": "does not fit", "time": "time limit: no fitting layout found"}
    failed = {str(m): reason for m, reason in r.mesh_failures}
    if r.meshes:
        lines += ["", "  meshes tried:", text_table(
            [(str(m), fmt_time(t) if t is not None else why[failed[str(m)]]) for m, t in r.meshes],
            ("mesh", "best time"))]
    if r.verified:
        rows = [("*" if v.layout == r.layout else "", i + 1, str(compact_layout(g, r.mesh, v.layout)) or "(replicated)",
                 fmt_time(v.predicted_time_s), fmt_time(v.measured_time_s) if v.ok else "-",
                 fmt_bytes(v.memory_bytes), fmt_bytes(v.xla_memory_bytes) if v.xla_memory_bytes >= 0 else "-",
                 "ok" if v.ok else "error: " + v.error)
                for i, v in enumerate(r.verified)]
        win = next(i for i, v in enumerate(r.verified) if v.layout == r.layout)
        lines += ["", f"  verified: the {len(r.verified)} best predicted layouts run on {len(devices)} "
                      f"{devices[0].platform} devices, median of {args.repeats} interleaved rounds:",
                  text_table(rows, ("", "#", "layout", "predicted", "measured", "memory/device", "XLA memory", "result"),
                             "<><>>>><"),
                  "", f"  winner: #{win + 1} (the measured fastest; * above)"]
    if r.notes:
        lines += ["", "  notes:", *(f"  - {n}" for n in r.notes)]
    data = {"layout": str(r.layout), "compact_layout": str(short), "mesh": str(r.mesh), "status": r.status,
            "objective_s": r.objective_s, "bound_s": r.bound_s, "gap": r.gap, "solve_time_s": r.solve_time_s, "num_variables": r.num_variables,
            "num_constraints": r.num_constraints, "memory_limit_bytes": limit, "hardware": args.hardware.name,
            "cost": _cost_dict(c), "notes": list(r.notes),
            "meshes": [{"mesh": str(m), "time_s": t, "failure": failed.get(str(m))} for m, t in r.meshes],
            "verified": [{"layout": str(v.layout), "predicted_time_s": v.predicted_time_s,
                          "measured_time_s": v.measured_time_s, "measured_times_s": list(v.measured_times_s),
                          "memory_bytes": v.memory_bytes, "xla_memory_bytes": v.xla_memory_bytes,
                          "max_rel_error": v.max_rel_error,
                          "collectives_match": v.collectives_match, "ok": v.ok, "error": v.error,
                          "chosen": v.layout == r.layout} for v in r.verified]}
    return _emit(args, data, "\n".join(lines))


def _run_execute(args: argparse.Namespace) -> int:
    from autolayout.exec import execute
    from autolayout.reporting.fmt import text_table

    g = _graph(args)
    devices = _execution_devices(args.mesh)
    ex = execute(g, args.mesh, args.layout, repeats=args.repeats, hardware=args.hardware, backend=args.backend,
                 seed=args.seed, devices=devices)
    rows = [(r.quantity, f"{r.predicted:.4g}", "" if math.isnan(r.compiled) else f"{r.compiled:.4g}",
             "" if math.isnan(r.measured) else f"{r.measured:.4g}", "" if math.isnan(r.ratio) else f"{r.ratio:.3g}")
            for r in ex.comparison.itertuples()]
    ok = ex.collectives_match and not (ex.max_rel_error > args.tolerance)
    lines = [f"{g.name} on {ex.mesh} layout {str(ex.layout) or '(replicated)'} [{ex.backend}, "
             f"{ex.predicted.hardware.name} profile]",
             f"  max abs error vs unsharded reference: {ex.max_abs_error:.3g} (relative {ex.max_rel_error:.3g})",
             f"  collectives: {'match' if ex.collectives_match else 'MISMATCH'} "
             f"({len(ex.compiled_collectives)} compiled)",
             f"  step time: {ex.step_time_s * 1e3:.3f} ms measured (median of {args.repeats}), "
             f"{ex.predicted.time_s * 1e3:.3f} ms predicted; compile {ex.compile_s:.1f} s", "",
             text_table(rows, ("quantity", "predicted", "compiled", "measured", "ratio"), "<>>>>")]
    if not ex.collectives_match:
        lines += ["", ex.collective_diff()]
    if ex.notes:
        lines += ["", "notes:", *(f"  - {n}" for n in ex.notes)]
    data = {"graph": g.name, "mesh": str(ex.mesh), "layout": str(ex.layout), "backend": ex.backend,
            "max_abs_error": ex.max_abs_error, "max_rel_error": ex.max_rel_error, "step_time_s": ex.step_time_s,
            "step_times_s": list(ex.step_times_s), "compile_s": ex.compile_s,
            "collectives_match": bool(ex.collectives_match), "predicted": _cost_dict(ex.predicted),
            "compiled_collectives": [str(c) for c in ex.compiled_collectives],
            "comparison": ex.comparison.to_dict(orient="records"), "notes": list(ex.notes), "ok": bool(ok)}
    _emit(args, data, "\n".join(lines))
    if args.strict and not ok:
        why = [] if ex.collectives_match else ["the compiled collectives differ from the predicted ones (see above)"]
        if not ex.max_rel_error <= args.tolerance:
            why.append(f"max relative error {ex.max_rel_error:.3g} is above --tolerance {args.tolerance:g}")
        raise StrictError(f"--strict: {'; '.join(why)}; investigate, or raise --tolerance / drop --strict")
    return 0


def _run_report(args: argparse.Namespace) -> int:
    if args.out is not None:
        check_out_dir(args.out)
    if args.all:
        from autolayout.reporting import committed
        committed.generate_all(args.out or "reports", only=args.only, progress=not args.quiet)
        return 0
    if args.model is None or args.mesh is None:
        raise ValueError("report needs MODEL and --mesh (or --all to regenerate the committed reports)")
    from autolayout.report import report

    from autolayout.costmodel.predict import predict

    g = _graph(args)
    for lay in args.layouts or []:  # an illegal layout is an error here, not a note buried in the page
        try:
            predict(g, args.mesh, lay, hardware=args.hardware)
        except ValueError as exc:
            raise ValueError(f"--layouts {str(lay) or '(replicated)'!r} is illegal on --mesh {args.mesh}: "
                             f"{' '.join(str(exc).split())}") from exc
    out = args.out or f"reports/{g.name}"
    rep = report(g, args.mesh, args.layouts or [], hardware=args.hardware, execute=not args.no_execute,
                 search=not args.no_search, out=out, title=args.title, scaling=args.scaling,
                 measure_hardware=args.measure_hardware, repeats=args.repeats, progress=not args.quiet)
    data = {"path": str(rep.path), "index": str(rep.path / "index.html"),
            "layouts": rep.table().to_dict(orient="records"), "spearman": rep.spearman if rep.executed else None}
    return _emit(args, data, f"predicted on {_hardware_label(args)}\n\n{rep.intro}\n\n"
                             f"wrote {rep.path / 'index.html'} and {rep.path / 'report.md'}")


def _run_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autolayout.exec import calibrate

    if args.out:
        check_out_file(args.out)
    devices = _execution_devices(args.mesh)
    try:
        hw = calibrate(args.mesh, quick=args.quick, devices=devices)
    except NotImplementedError as exc:
        raise ValueError("calibration is not available in this installation (autolayout.exec.calibrate "
                         "is not implemented)") from exc
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        hw.save(args.out)
    return _emit(args, hw.to_dict(), _hardware_text(hw) + (f"\n\nwrote {args.out}; use it with --hardware {args.out}"
                                                           if args.out else ""))


def _hardware_text(hw: Any) -> str:
    from autolayout.reporting.fmt import fmt_bytes, text_table

    rows = [("peak bf16 / f32", f"{hw.peak('bfloat16') / 1e12:.4g} / {hw.peak('float32') / 1e12:.4g} TFLOP/s"),
            ("efficiency", f"{hw.efficiency:.2f}"), ("HBM", fmt_bytes(hw.hbm_bytes)),
            ("HBM bandwidth", f"{hw.hbm_bandwidth / 1e9:.4g} GB/s"),
            ("link (every axis)", f"{hw.link.bandwidth / 1e9:.4g} GB/s, {hw.link.latency * 1e6:.3g} us, {hw.link.topology}")]
    rows += [(f"link on axis {a}", f"{l.bandwidth / 1e9:.4g} GB/s, {l.latency * 1e6:.3g} us, {l.topology}")
             for a, l in hw.axis_links]
    return f"{hw.name}: {hw.description}\n\n" + text_table(rows, ("", ""), "<<")


def _run_hardware(args: argparse.Namespace) -> int:
    from autolayout.costmodel.profiles import PROFILES
    from autolayout.reporting.fmt import fmt_bytes, text_table

    if args.name is not None:
        return _emit(args, args.name.to_dict(), _hardware_text(args.name))
    rows = [(hw.name + (" (default)" if hw.name == DEFAULT_HARDWARE else ""), f"{hw.peak('bfloat16') / 1e12:.4g}", fmt_bytes(hw.hbm_bytes), f"{hw.hbm_bandwidth / 1e9:.4g}",
             f"{hw.link.bandwidth / 1e9:.4g}", f"{hw.link.latency * 1e6:.3g}") for hw in PROFILES.values()]
    text = text_table(rows, ("profile", "bf16 TFLOP/s", "HBM", "HBM GB/s", "link GB/s", "latency us"))
    return _emit(args, {n: hw.to_dict() for n, hw in PROFILES.items()}, text)


def _run_table1(args: argparse.Namespace) -> int:
    from autolayout.reporting.table1 import indivisible, table1
    from autolayout.reporting.fmt import text_table

    option = {"b": "--batch", "d_io": "--d-io", "d_h": "--d-hidden", "n": "--n", "r": "--r", "c": "--c", "p": "--p"}
    given = {"b": args.batch, "d_io": args.d_io, "d_h": args.d_hidden, "n": args.n, "r": args.r, "c": args.c,
             "p": args.p}
    for size, count, layout in indivisible(*given.values())[:1]:
        raise ValueError(f"{option[count]} {given[count]} does not divide {option[size]} {given[size]}, which "
                         f"Table 1's layout {layout!r} splits over it: give {option[count]} a value that divides "
                         f"{given[size]}, or {option[size]} a multiple of {given[count]}")
    df = table1(args.batch, args.d_io, args.d_hidden, n=args.n, r=args.r, c=args.c, p=args.p, hardware=args.hardware)
    rows = [(r.layout, r.mesh, f"{r.comp_flops:.4g}", f"{r.comp_ratio:.3g}", f"{r.allreduced_values:.4g}",
             f"{r.paper_text:.4g}", f"{r.param_values:.4g}", f"{r.paper_memory:.4g}", f"{r.time_ms:.4g}")
            for r in df.itertuples()]
    text = (f"Mesh-TensorFlow Table 1 (b={args.batch}, d_io={args.d_io}, d_h={args.d_hidden}; {_hardware_label(args)})\n"
            + text_table(rows, ("layout", "mesh", "flops/dev", "/paper", "allreduced", "paper §8", "params/dev",
                                "paper mem", "time ms"), "<<>>>>>>>"))
    return _emit(args, df.to_dict(orient="records"), text)


# ---------------------------------------------------------------------------- parser
MODEL_HELP = (f"a zoo model ({', '.join(MODELS)}) with its sizes as options, a JSON/YAML config file, "
              "or package.module:function returning a traced Graph")


def _model_epilog(examples: str) -> str:
    from autolayout import models
    from autolayout.reporting.model_spec import ZOO_DEFAULTS, model_options_help

    lines = ["examples:", *(f"  {e}" for e in examples.strip().splitlines()), "",
             "model options (defaults shown; any keyword parameter of the model function):"]
    for name, fn in models.MODELS.items():
        lines.append(f"  {name}: {model_options_help(fn, ZOO_DEFAULTS.get(name))}")
    lines += ["", 'config file: {"model": "transformer_lm", "sizes": {"d_model": 512, "heads": 8}}']
    return "\n".join(lines)


def _sub(sub: Any, name: str, help: str, examples: str, model: bool = False) -> argparse.ArgumentParser:
    epilog = _model_epilog(examples) if model else "examples:\n" + "\n".join(
        f"  {e}" for e in examples.strip().splitlines())
    p = sub.add_parser(name, help=help, description=help, epilog=epilog, allow_abbrev=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(takes_model_options=model)
    if model:
        p.add_argument("model", metavar="MODEL", help=MODEL_HELP, **({"nargs": "?"} if name == "report" else {}))
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Choose how to split every named tensor dimension across a processor mesh.",
        epilog="examples:\n  autolayout demo\n  autolayout search transformer_lm --d-model 512 --mesh rows:4,cols:2\n"
               "  autolayout predict mlp --mesh rows:2,cols:4 --layout 'batch:rows;hidden:cols'\n"
               "  autolayout COMMAND --help")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--traceback", action="store_true", help="show the full traceback on errors (for debugging)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = _sub(sub, "demo", "run the end-to-end demo: trace, predict, search, execute on 8 devices, report",
             "autolayout demo\nautolayout demo --no-execute\nautolayout demo --hardware tpu-v4 --out /tmp/demo")
    p.add_argument("--out", default=None,
                   help="report directory (default: a new autolayout-demo-* directory in the system's temp folder)")
    p.add_argument("--no-report", action="store_true", help="do not write the report")
    p.add_argument("--no-execute", action="store_true", help="predict and search only")
    p.add_argument("--hardware", type=HARDWARE, default=None,
                   help="target profile to predict and search for, shown beside the local measurements "
                        "(default: the local devices' profile)")
    p.add_argument("--no-calibrate", action="store_true",
                   help="use the built-in profile of the local devices instead of measuring one")
    p.add_argument("--repeats", type=POSITIVE, default=3, help="timed runs per layout (default 3)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_demo)

    p = _sub(sub, "predict", "predict time and memory per device of layouts (no devices needed)",
             "autolayout predict mlp --mesh rows:2,cols:4 --layout 'batch:rows;hidden:cols'\n"
             "autolayout predict transformer_lm --d-model 512 --mesh rows:16,cols:32 --hardware tpu-v2 \\\n"
             "    --layout 'batch:rows;vocab:cols;d_ff:cols;heads:cols' --layout 'batch:rows,cols' --json", model=True)
    p.add_argument("--mesh", type=MESH, required=True, help="e.g. rows:4,cols:2")
    p.add_argument("--layout", type=LAYOUT, action="append", help="layout, e.g. 'batch:rows;hidden:cols' (repeatable)")
    p.add_argument("--hardware", type=HARDWARE, default=_hardware(DEFAULT_HARDWARE), help=HARDWARE_HELP)
    p.add_argument("--per-op", type=COUNT, default=0, metavar="N", help="also list the N slowest ops")
    p.add_argument("--peak", type=COUNT, default=0, metavar="N",
                   help="also list the N largest buffers live at the predicted memory peak")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_predict)

    p = _sub(sub, "search", "find the fastest layout under the cost model (CP-SAT, exact)",
             "autolayout search transformer_lm --mesh rows:4,cols:2 --hardware tpu-v4\n"
             "autolayout search mlp --batch 4096 --num-devices 8 --memory-limit 16GiB --json\n"
             "autolayout search mlp --batch 4096 --mesh rows:2,cols:4 --verify 3", model=True)
    p.add_argument("--mesh", type=MESH, default=None, help="e.g. rows:4,cols:2")
    p.add_argument("--num-devices", type=POSITIVE, default=None, help="search mesh shapes of N devices too")
    p.add_argument("--max-axes", type=POSITIVE, default=3, help="most mesh axes with --num-devices (default 3)")
    p.add_argument("--hardware", type=HARDWARE, default=_hardware(DEFAULT_HARDWARE), help=HARDWARE_HELP)
    p.add_argument("--memory-limit", type=MEMORY, default=None,
                   help="bytes per device, e.g. 16GiB or 16GB (default: the --hardware profile's HBM)")
    p.add_argument("--no-weight-update-sharding", action="store_true", help="do not shard weight updates")
    p.add_argument("--time-limit", type=SECONDS, default=60, help="solver time limit in seconds (default 60)")
    p.add_argument("--verify", type=POSITIVE, default=None, metavar="K",
                   help="run the K best predicted layouts on the local devices and return the measured fastest "
                        "(predictions for the local devices' profile unless --hardware is given)")
    p.add_argument("--repeats", type=POSITIVE, default=5, help="timed rounds per layout with --verify (default 5)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_search)

    p = _sub(sub, "execute", "run a layout on the local devices and compare with the prediction",
             "autolayout execute mlp --batch 256 --mesh rows:2,cols:4 --layout 'batch:rows;hidden:cols'\n"
             "autolayout execute transformer_lm --mesh rows:2,cols:4 --layout 'batch:rows,cols' --json", model=True)
    p.add_argument("--mesh", type=MESH, required=True, help="e.g. rows:2,cols:4 (at most the local device count)")
    p.add_argument("--layout", type=LAYOUT, default=_layout(""), help="layout (default: replicated)")
    p.add_argument("--hardware", type=HARDWARE, default=None, help="profile for the prediction (default: local devices')")
    p.add_argument("--backend", choices=("shard_map", "gspmd"), default="shard_map")
    p.add_argument("--repeats", type=POSITIVE, default=5, help="timed runs (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random arguments")
    p.add_argument("--strict", action="store_true",
                   help="exit 2 with an error unless collectives match and outputs agree")
    p.add_argument("--tolerance", type=NONNEGATIVE, default=1e-4, help="relative error allowed with --strict")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_execute)

    p = _sub(sub, "report", "write an HTML + Markdown report comparing layouts (or --all: the committed reports)",
             "autolayout report transformer_lm --mesh rows:2,cols:4 --layouts 'batch:rows,cols' \\\n"
             "    'batch:rows;heads:cols;d_ff:cols;vocab:cols' --out reports/transformer\n"
             "autolayout report --all          # regenerate reports/ (a few minutes)", model=True)
    p.add_argument("--all", action="store_true", help="regenerate every committed report under --out (default reports)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", help="with --all: only these reports")
    p.add_argument("--mesh", type=MESH, default=None, help="e.g. rows:2,cols:4")
    p.add_argument("--layouts", type=LAYOUT, nargs="+", default=None, metavar="LAYOUT", help="layouts to compare")
    p.add_argument("--out", default=None, help="output directory (default reports/<graph name>)")
    p.add_argument("--hardware", type=HARDWARE, default=_hardware(DEFAULT_HARDWARE), help=HARDWARE_HELP)
    p.add_argument("--measure-hardware", default=None, metavar="PROFILE",
                   help="profile pricing the executed runs: a name, JSON, or 'calibrate' (default: local devices')")
    p.add_argument("--title", default=None, help="report title")
    p.add_argument("--no-execute", action="store_true", help="do not run the layouts")
    p.add_argument("--no-search", action="store_true", help="do not run the search")
    p.add_argument("--scaling", action="store_true", help="add the paper's §8.6 MLP scaling chart (not about MODEL)")
    p.add_argument("--no-scaling", action="store_false", dest="scaling", help=argparse.SUPPRESS)  # the default
    p.add_argument("--repeats", type=POSITIVE, default=3, help="timed runs per layout (default 3)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_report)

    p = _sub(sub, "calibrate", "measure a hardware profile of the local devices (JSON for --hardware)",
             "autolayout calibrate --mesh rows:2,cols:4 --out profile.json\n"
             "autolayout predict mlp --mesh rows:2,cols:4 --layout batch:rows --hardware profile.json")
    p.add_argument("--mesh", type=MESH, default=_mesh("rows:2,cols:4"),
                   help="mesh to measure on (default rows:2,cols:4; d:1 on one GPU: its links are then the "
                        "built-in profile's)")
    p.add_argument("--out", default=None, help="write the profile as JSON here")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (seconds)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_calibrate)

    p = _sub(sub, "table1", "the Mesh-TensorFlow paper's Table 1 beside our predictions",
             "autolayout table1\nautolayout table1 --batch 512 --d-io 256 --d-hidden 1024 --json")
    p.add_argument("--batch", type=POSITIVE, default=1024)
    p.add_argument("--d-io", type=POSITIVE, default=1024)
    p.add_argument("--d-hidden", type=POSITIVE, default=4096)
    p.add_argument("--n", type=POSITIVE, default=8, help="devices of the 1-D mesh")
    p.add_argument("--r", type=POSITIVE, default=4, help="rows of the 2-D/3-D mesh")
    p.add_argument("--c", type=POSITIVE, default=2, help="cols of the 2-D/3-D mesh")
    p.add_argument("--p", type=POSITIVE, default=2, help="planes of the 3-D mesh")
    p.add_argument("--hardware", type=HARDWARE, default=_hardware(DEFAULT_HARDWARE), help=HARDWARE_HELP)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_table1)

    p = _sub(sub, "hardware", "list the built-in hardware profiles, or show one",
             "autolayout hardware\nautolayout hardware tpu-v4 --json")
    p.add_argument("name", nargs="?", type=HARDWARE, default=None, metavar="PROFILE")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run_hardware)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``autolayout`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]  # noqa: SLF001
    if extra and not args.takes_model_options:
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    args.hardware_is_default = not any(a == "--hardware" or a.startswith("--hardware=") for a in argv)
    try:
        if args.command in ("demo", "execute", "calibrate", "report") or getattr(args, "verify", None):
            # before jax starts: 8 virtual CPU devices, unless the user chose (JAX_NUM_CPU_DEVICES).
            # Never more behind the user's back: a mesh larger than the devices is an error
            # that says how to get more.
            from autolayout.reporting.devices import ensure_cpu_devices
            ensure_cpu_devices()
        if args.takes_model_options and getattr(args, "model", None) is not None:
            from autolayout.reporting.model_spec import apply_options, resolve_model
            args.model_spec = apply_options(resolve_model(args.model), extra, prog=sub.prog)
        elif extra:
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
        return args.func(args)
    except (ValueError, ImportError, NotImplementedError, OSError) as exc:
        if args.traceback:
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
