"""``reports/gpu/README.md`` from what ``benchmarks/gpu_validate.py`` measured on one GPU.

Everything here runs without a GPU: the measured step times, XLA memory figures and kernel
timings come from ``measured.jsonl`` and ``kernels.json``; every prediction is made again here
by tracing the same zoo models (and ``gpu_validate.attention_step``) and pricing them with

* **datasheet**: the device's built-in profile (``h200``: 989 TFLOP/s bf16 at efficiency 0.75,
  4.8 TB/s), ``fused_attention`` off because XLA compiles the traced attention as written;
* **ceilings**: the same with the measured ceilings as peaks (best matmul rate per dtype, best
  stream bandwidth) and efficiency 1;
* **refit**: ``fit_step_profile`` of the ceilings profile on the calibration half of the steps
  (compute scale and per-op overhead: two numbers for all models), judged on the held-out half.

Run: PYTHONPATH=$PWD python benchmarks/gpu_report.py [--dir reports/gpu]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys

SEED = 0  # the calibration / held-out split of the steps


def _jsonl(d: str, name: str) -> list[dict]:
    """The rows of the optional JSON-lines file ``name`` in the folder ``d``; none where a run did not
    write it (``live*.jsonl`` without ``--dumps``, ``*_loss.jsonl`` without ``--loss``)."""
    path = os.path.join(d, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load(d: str) -> tuple[list[dict], dict, dict]:
    """``(measured rows, device.json, kernels.json)`` of the folder ``d``."""
    with open(os.path.join(d, "measured.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(d, "device.json")) as f:
        device = json.load(f)
    with open(os.path.join(d, "kernels.json")) as f:
        kernels = json.load(f)
    return rows, device, kernels


def gpu_validate_loss_configs() -> list:
    """``gpu_validate.LOSS_CONFIGS``: the steps ``--loss`` measures (``measured_loss.jsonl``)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_validate

    return gpu_validate.LOSS_CONFIGS


def profiles(device: dict, kernels: dict) -> tuple:
    """``(datasheet, ceilings)`` profiles of the measured device."""
    from autolayout.costmodel.profiles import get_hardware

    sheet = get_hardware(device["profile"]).replace(fused_attention=False)
    bf16, f32 = kernels["matmul_bfloat16_flops"], kernels["matmul_float32_flops"]
    peaks = {**dict(sheet.peak_flops), "bfloat16": bf16, "float16": bf16, "float32": f32, "tensorfloat32": f32}
    ceil = sheet.replace(name=sheet.name + "-ceilings", peak_flops=peaks, hbm_bandwidth=kernels["stream_bytes_per_s"],
                         efficiency=1.0)
    return sheet, ceil


def _err(p: float, m: float) -> float:
    return p / m - 1.0


def analyse(d: str) -> dict:
    import autolayout
    from autolayout.exec.calibrate import StepSample, fit_step_profile
    from autolayout.reporting.fmt import spearman

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_validate

    rows, device, kernels = load(d)
    failed = [r for r in rows if "measured_s" not in r]  # a step that did not run: listed in the report
    rows = [r for r in rows if "measured_s" in r]
    sheet, ceil = profiles(device, kernels)
    names = sorted(r["name"] for r in rows)
    random.Random(SEED).shuffle(names)
    calib = set(names[: len(names) // 2])
    graphs = {r["name"]: autolayout.models.MODELS[r["model"]](**r["kwargs"]) for r in rows}
    fit = fit_step_profile(ceil, [StepSample(graphs[r["name"]], "d:1", None, r["measured_s"])
                                  for r in rows if r["name"] in calib])
    for r in rows:
        g = graphs[r["name"]]
        r["half"] = "calibration" if r["name"] in calib else "held-out"
        for key, hw in (("sheet", sheet), ("ceil", ceil), ("refit", fit.hardware)):
            c = autolayout.predict(g, "d:1", None, hardware=hw)
            r[f"{key}_s"] = c.time_s
            if key == "sheet":  # the profile's memory rules (the refits change rates, not memory)
                r["memory_bytes"] = c.memory_bytes
    stats = {}
    for half in ("held-out", "calibration"):
        sub = [r for r in rows if r["half"] == half]
        m = [r["measured_s"] for r in sub]
        stats[half] = {key: dict(spearman=spearman([r[f"{key}_s"] for r in sub], m),
                                 median_abs_error=statistics.median(abs(_err(r[f"{key}_s"], r["measured_s"]))
                                                                    for r in sub))
                       for key in ("sheet", "ceil", "refit")}
    attn = []
    import jax
    import jax.numpy as jnp
    for k in kernels.get("attention", []):
        shape = tuple(k["shape"])
        x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
        g = autolayout.trace(gpu_validate.attention_step, x, x, x, x, dims=("batch length heads d_kv",) * 4)
        row = dict(k)
        for key, hw in (("materialised", ceil), ("fused", ceil.replace(fused_attention=True))):
            row[f"{key}_pred_s"] = autolayout.predict(g, "d:1", None, hardware=hw).time_s
        attn.append(row)
    # XLA:GPU's live peak per step, where the run collected dumps (gpu_validate.py --dumps)
    live = {v["name"]: v for v in _jsonl(d, "live.jsonl") if "live_bytes" in v}
    loss_live = {v["name"]: v for v in _jsonl(d, "live_loss.jsonl") if "live_bytes" in v}
    # the MLP and MoE steps with a regression loss (gpu_validate.py --loss): memory only
    loss_rows = [r for r in _jsonl(d, "measured_loss.jsonl") if "measured_s" in r]
    for r in loss_rows:
        g = autolayout.models.MODELS[r["model"]](**r["kwargs"])
        r["memory_bytes"] = autolayout.predict(g, "d:1", None, hardware=sheet).memory_bytes
        r["live_bytes"] = loss_live.get(r["name"], {}).get("live_bytes")
    return dict(rows=rows, failed=failed, device=device, kernels=kernels, fit=fit, stats=stats, attention=attn,
                sheet=sheet, ceil=ceil, live=live, loss_rows=loss_rows)


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def render(a: dict) -> str:
    dev, k, fit, st = a["device"], a["kernels"], a["fit"], a["stats"]
    sheet = a["sheet"]
    cold = dev["first_run_cold"]
    out = ["# The cost model against measured steps on one NVIDIA H200", "",
           f"Measured by `benchmarks/gpu_validate.py` on one {dev['device_kind']} (jax {dev['jax']}, "
           f"{dev['time'][:10]}; {dev['profile_note']}); this page by `PYTHONPATH=$PWD python benchmarks/gpu_report.py`, which prices "
           "every step again here from the committed measurements (`measured.jsonl`, `kernels.json`, "
           "`device.json`). One device: no collective, so this checks the compute and memory side of the "
           "model (roofline per op, fusion, remat, attention, the peak memory), not the links.", "",
           "## Ceilings", "",
           "Each the median of 5 slopes of 12 against 2 back-to-back calls (dispatch cancels), random data, "
           "after 2 s of large matmuls (an idle H200 reads 345 MHz SM clock; a cold measurement, the first of "
           f"the day's first run at {cold['time'][11:16]}, gave {cold['matmul_bfloat16_flops'] / 1e12:.0f} TFLOP/s bf16 "
           f"at 8192 and {cold['stream_bytes_per_s'] / 1e12:.2f} TB/s stream: `device.json`).", "",
           "| kernel | " + " | ".join(str(n) for n in (1024, 2048, 4096, 8192, 16384)) + " | datasheet |",
           "|---|" + "---|" * 6]
    for dtype, peak in (("bfloat16", sheet.peak("bfloat16")), ("float32", sheet.peak("float32"))):
        out.append(f"| {dtype} matmul n³, TFLOP/s | " + " | ".join(
            f"{k[f'matmul_{dtype}_{n}_flops'] / 1e12:.0f}" for n in (1024, 2048, 4096, 8192, 16384))
            + f" | {peak / 1e12:.0f} |")
    out += ["", "| stream `y = a x + b`, TB/s (read + write) | 64 MiB | 1 GiB | 4 GiB | datasheet |",
            "|---|---|---|---|---|"]
    for dtype in ("float32", "bfloat16"):
        out.append(f"| {dtype} | " + " | ".join(f"{k[f'stream_{dtype}_{m}MiB_bytes_per_s'] / 1e12:.2f}"
                                                for m in (64, 1024, 4096)) + f" | {sheet.hbm_bandwidth / 1e12:.1f} |")
    best = k["matmul_bfloat16_flops"] / sheet.peak("bfloat16")
    out += ["", f"The best bf16 matmul reaches {best:.0%} of the datasheet peak and the best float32 "
            f"(TF32, JAX's default precision on Hopper) {k['matmul_float32_flops'] / sheet.peak('float32'):.0%}; "
            f"the profile's judged efficiency is {sheet.efficiency:g}. The stream reaches "
            f"{k['stream_bytes_per_s'] / sheet.hbm_bandwidth:.0%} of the datasheet bandwidth in float32 and "
            f"{k['stream_bfloat16_4096MiB_bytes_per_s'] / sheet.hbm_bandwidth:.0%} in bfloat16.", ""]
    out += ["## Attention: XLA's materialised scores against cuDNN's fused kernel", "",
            "`gpu_validate.attention_step`: causal softmax attention as the zoo writes it, forward and backward "
            "(`jax.vjp`), bf16, compiled by XLA as written and with `jax.nn.dot_product_attention("
            "implementation=\"cudnn\")`; the outputs agree (norms of the four results to 4 digits: "
            "`kernels.json`). Predicted on the ceilings profile with `fused_attention` off (scores in HBM) and "
            "on (`costmodel/attention.py`: FlashAttention's IO).", "",
            "| batch, length, heads, d_kv | XLA ms | predicted materialised ms | ratio | cuDNN ms | "
            "predicted fused ms | ratio | measured speed-up |", "|---|---|---|---|---|---|---|---|"]
    for r in a["attention"]:
        if "cudnn_s" not in r:
            out.append(f"| {r['shape']} | {_ms(r['xla_s'])} | {_ms(r['materialised_pred_s'])} | "
                       f"{r['materialised_pred_s'] / r['xla_s']:.2f} | {r.get('cudnn_error', '–')} | | | |")
            continue
        out.append(f"| {', '.join(map(str, r['shape']))} | {_ms(r['xla_s'])} | {_ms(r['materialised_pred_s'])} | "
                   f"{r['materialised_pred_s'] / r['xla_s']:.2f} | {_ms(r['cudnn_s'])} | {_ms(r['fused_pred_s'])} | "
                   f"{r['fused_pred_s'] / r['cudnn_s']:.2f} | {r['xla_s'] / r['cudnn_s']:.1f}× |")
    out += ["", "## Training steps", "",
            f"{len(a['rows'])} zoo training steps (Adam; float32 parameters, bf16 compute unless named f32), one "
            "device, each the median of 10 timed steps after a warm-up (the spread, max - min, is in "
            "`measured.jsonl`: under 2% but for the sub-3 ms steps). The split into a calibration and a "
            f"held-out half is random (seed {SEED}). *Refit*: `fit_step_profile` of the ceilings profile on the "
            f"calibration half: compute ×{fit.compute_scale:.3f}, {fit.op_overhead_s * 1e6:.2f} µs per executed "
            "op (the graph's ops, each once per loop iteration: a proxy for XLA's kernel launches).", "",
            "| step | half | measured ms | datasheet ms | ceilings ms | refit ms | refit error | "
            "memory predicted / XLA GiB | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    gib = 2 ** 30
    for r in sorted(a["rows"], key=lambda r: (r["half"], r["name"])):
        ratio = r["memory_bytes"] / r["xla_memory_bytes"]
        out.append(f"| {r['name']} | {r['half']} | {_ms(r['measured_s'])} | {_ms(r['sheet_s'])} | "
                   f"{_ms(r['ceil_s'])} | {_ms(r['refit_s'])} | {_err(r['refit_s'], r['measured_s']):+.0%} | "
                   f"{r['memory_bytes'] / gib:.2f} / {r['xla_memory_bytes'] / gib:.2f} | {ratio:.3f} |")
    out += ["", "| profile | held-out Spearman | held-out median abs error | calibration Spearman | "
            "calibration median abs error |", "|---|---|---|---|---|"]
    for key, label in (("sheet", "datasheet (judged efficiency)"), ("ceil", "measured ceilings"),
                       ("refit", "refit on the calibration half")):
        h, c = st["held-out"][key], st["calibration"][key]
        out.append(f"| {label} | {h['spearman']:.2f} | {h['median_abs_error']:.0%} | {c['spearman']:.2f} | "
                   f"{c['median_abs_error']:.0%} |")
    within = sum(abs(r["memory_bytes"] / r["xla_memory_bytes"] - 1) <= 0.10 for r in a["rows"])
    out += ["", f"Memory: {within} of {len(a['rows'])} steps within 10% of XLA:GPU's `memory_analysis` "
            "(argument + output + temp - alias), priced with the h200 profile's memory rules.", ""]
    live = a["live"]
    if live:
        near = sum(abs(r["memory_bytes"] / live[r["name"]]["live_bytes"] - 1) <= 0.10
                   for r in a["rows"] if r["name"] in live)
        out += ["XLA:GPU's figure split (`live.jsonl`, `buffers.zip`: the buffer assignment and live ranges "
                "`--dumps` collects, read by `benchmarks/xla_live.py`): its *live* peak is the most bytes in use "
                "at once in the compiled schedule; the rest of `memory_analysis` is output allocations idle at "
                "that peak and the temp heap's fragmentation. The model predicts liveness, so *predicted / "
                f"live* isolates its rules from XLA's packing: {near} of {len(live)} within 10%.", "",
                "| step | predicted / XLA live | XLA live / memory_analysis | idle outputs MiB | heap gap MiB |",
                "|---|---|---|---|---|"]
        for r in sorted(a["rows"], key=lambda r: r["name"]):
            v = live.get(r["name"])
            if v:
                out.append(f"| {r['name']} | {r['memory_bytes'] / v['live_bytes']:.3f} | "
                           f"{v['live_bytes'] / r['xla_memory_bytes']:.3f} | {v['idle_output_bytes'] / 2**20:.1f} | "
                           f"{v['heap_gap_bytes'] / 2**20:.1f} |")
        out.append("")
    if a["loss_rows"]:
        linear = {r["name"]: r for r in a["rows"]}
        within = sum(abs(r["memory_bytes"] / r["xla_memory_bytes"] - 1) <= 0.10 for r in a["loss_rows"])
        out += ["## Memory with a regression loss", "",
                "The zoo's MLP and MoE steps take the loss's gradient as an input (`sum(y * dy)`, the paper's "
                "Table 1 accounting), so XLA may run the backward's input-gradient matmuls before the forward. "
                "The same steps with `loss=\"mse\"` (`sum((y - dy)**2) / 2`, a gradient that needs the forward, "
                "as in a real step), measured by `gpu_validate.py --loss` (`measured_loss.jsonl`, "
                f"`hlo_loss.zip`, `buffers_loss.zip`, `live_loss.jsonl`): {within} of {len(a['loss_rows'])} "
                "within 10% of XLA:GPU's `memory_analysis`.", "",
                "| step | measured ms | memory predicted / XLA GiB | ratio | predicted / XLA live | "
                "the linear-loss step's ratio |", "|---|---|---|---|---|---|"]
        for r in a["loss_rows"]:
            twin = linear.get(r["name"].removesuffix("-mse"))
            out.append(f"| {r['name']} | {_ms(r['measured_s'])} | {r['memory_bytes'] / gib:.2f} / "
                       f"{r['xla_memory_bytes'] / gib:.2f} | {r['memory_bytes'] / r['xla_memory_bytes']:.3f} | "
                       + (f"{r['memory_bytes'] / r['live_bytes']:.3f} | " if r["live_bytes"] else "- | ")
                       + (f"{twin['memory_bytes'] / twin['xla_memory_bytes']:.3f} |" if twin else "- |"))
        out.append("")
    out += [f"Did not run: {r['name']} ({r['error']})" for r in a["failed"]] + ([""] if a["failed"] else [])
    return "\n".join(out) + "\n"


def write_report(d: str, notes: str = "") -> str:
    text = render(analyse(d)) + notes
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="reports/gpu", help="folder with measured.jsonl, device.json, kernels.json")
    args = ap.parse_args(argv)
    notes_path = os.path.join(args.dir, "findings.md")
    notes = open(notes_path).read() if os.path.exists(notes_path) else ""
    print(write_report(args.dir, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
