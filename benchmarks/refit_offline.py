"""Try a cost-model variant against the committed validation measurements, without re-timing.

``reports/validation/layouts.csv`` holds every layout's measured step time (fit half and
held-out half) and ``report.md`` the micro-benchmarked profile. This script rebuilds that
profile, refits the four step terms (:func:`autolayout.exec.calibrate.step_terms`,
:func:`~autolayout.exec.calibrate.nnls_relative`) on the fit half exactly as
``fit_step_profile`` does, with the compute column replaced by a variant's, and prints
held-out Spearman and median |error| per model. ``baseline`` prices no dot operand
copies (the cost model before ``Hardware.dot_operand_copies``); the row of the profile the
report was made with (``baseline`` for reports before it, ``Hardware.dot_operand_copies``
since) reproduces the report's summary, which checks the harness. Variants:

* ``size-dependent efficiency``: each contraction at the rate ``calibrate`` measured for
  the square matmul of its size (equivalent edge ``(flops / 2) ** (1/3)``, log-linear
  between the measured edges 64..512, clamped at the ends) instead of ``peak * efficiency``;
* ``operand transposes``: a heuristic for the copies XLA:CPU makes around a dot whose
  batch dims are not the leading dims of an operand (or whose free/contracting dims are
  not contiguous): read + write of that operand's local bytes at the stream bandwidth,
  added to compute (``operand transposes``), or as a fifth fitted term with its own
  rate (``transposes, own rate``: a strided copy is slower than a stream);
* ``Hardware.dot_operand_copies``: the cost model's own pricing of those copies
  (:mod:`autolayout.costmodel.dotcopy`), which must agree with ``operand transposes``.

Run: python benchmarks/refit_offline.py [--dir reports/validation]
"""
from __future__ import annotations

import argparse
import math
import os
import re

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from autolayout import models  # noqa: E402
from autolayout.core import Layout, Mesh  # noqa: E402
from autolayout.costmodel.hardware import SWITCH, Hardware, Link  # noqa: E402
from autolayout.costmodel.plan import plan  # noqa: E402
from autolayout.costmodel.predict import predict  # noqa: E402
from autolayout.exec.calibrate import StepSample, nnls_relative, step_terms  # noqa: E402
from autolayout.reporting.fmt import spearman  # noqa: E402
from autolayout.reporting.measured import VALIDATION_MESH, VALIDATION_MODELS  # noqa: E402


def micro_profile(report_md: str) -> tuple[Hardware, dict[int, float]]:
    """The micro-benchmarked profile as calibrate() built it, from the notes in report.md."""
    rates = {int(n): float(r) * 1e9 for n, r in re.findall(r"matmul (\d+): ([\d.]+) GFLOP/s", report_md)}
    stream = re.search(r"stream \d+ MiB: ([\d.]+) GB/s", report_md)
    if not rates or stream is None:
        raise SystemExit("report.md has no 'matmul N: X GFLOP/s' / 'stream: Y GB/s' calibration notes")
    best = max(rates.values())
    hw = Hardware(name="micro", peak_flops={"float32": best, "bfloat16": best}, hbm_bytes=2**33,
                  hbm_bandwidth=float(stream.group(1)) * 1e9, link=Link(1e9, 1e-5, SWITCH),
                  efficiency=float(np.median(list(rates.values()))) / best, async_collectives=False)
    return hw, rates


def _contractions(graph):
    return [op for op in graph.ops() if op.kind == "einsum" and len(op.inputs) >= 2]


def size_dependent_compute(graph, layout, hw: Hardware, rates: dict[int, float]) -> float:
    edges = np.log(sorted(rates))
    vals = np.array([rates[n] for n in sorted(rates)])
    lat = hw.replace(link=Link(float("inf"), 1.0, SWITCH), op_overhead_s=0.0)
    p = predict(graph, VALIDATION_MESH, layout, hardware=lat)
    total = p.compute_s
    for row in p.per_op.itertuples():
        if graph.op(row.op) in _contractions(graph) and row.flops > 0:
            rate = np.interp(math.log((row.flops / 2) ** (1 / 3)), edges, vals)
            total += (max(row.flops / rate, row.bytes / hw.hbm_bandwidth) - row.compute_s) * row.count
    return total


def copied_operands(op, local: dict[str, int]) -> list[int]:
    """Indices of the operands XLA:CPU copies (transposes) before the dot, as its optimized
    HLO shows for the MoE einsums (``benchmarks/einsum_layout.py``): the dot runs as
    ``[batch, M, K] x [batch, K, N]``, so an operand is read in place only when its batch
    dims lead (in the dot's order) and the rest is ``free + contracting`` (lhs) or
    ``contracting + free`` (rhs), with the contracting dims in the lhs's order; the two
    groups may also be swapped where each is a single dim (a layout-only transpose). Dims
    of local size 1 are ignored. The dot's output is ``batch + lhs free + rhs free``, which
    is how the graph records it, so its order gives the batch and free dims."""
    shapes = [[d.name for d in s if local[d.name] > 1] for s in op.input_shapes]
    out = [d.name for d in op.output.shape if local[d.name] > 1]
    batch = [d for d in out if d in shapes[0] and d in shapes[1]]
    free = [[d for d in out if d in s and d not in batch] for s in shapes]
    contract = [d for d in shapes[0] if d in shapes[1] and d not in out]
    copied = []
    for i, s in enumerate(shapes):
        canon = free[i] + contract if i == 0 else contract + free[i]
        swapped = contract + free[i] if i == 0 else free[i] + contract
        single = len(free[i]) <= 1 and len(contract) <= 1
        if not (s[:len(batch)] == batch and (s[len(batch):] == canon or (single and s[len(batch):] == swapped))):
            copied.append(i)
    return copied


def transposed_bytes(graph, layout) -> int:
    mesh, p = Mesh.parse(VALIDATION_MESH), plan(graph, VALIDATION_MESH, layout)
    total = 0
    for op in _contractions(graph):
        if len(op.inputs) != 2:
            continue
        local = {d.name: d.size // math.prod(mesh.axis_size(a) for a in p.ops[op.name].axes.get(d.name, ()))
                 for d in op.dims}
        for i in copied_operands(op, local):
            # read + write, float32 (the validation models' dtype)
            total += 2 * math.prod(local[d.name] for d in op.input_shapes[i]) * 4 * op.multiplicity
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="reports/validation")
    args = ap.parse_args()
    df = pd.read_csv(os.path.join(args.dir, "layouts.csv"))
    hw, rates = micro_profile(open(os.path.join(args.dir, "report.md")).read())
    graphs = {n: getattr(models, n)(**kw) for n, kw in VALIDATION_MODELS.items()}
    lays = [Layout(r) if isinstance(r, str) else Layout("") for r in df.rules]
    gs = [graphs[m] for m in df.model]
    a = step_terms(hw, [StepSample(g, VALIDATION_MESH, lay, 1.0) for g, lay in zip(gs, lays)])
    fit = (df.half == "fit").to_numpy()
    copies = np.array([transposed_bytes(g, lay) for g, lay in zip(gs, lays)], float)
    variants = {
        "baseline": a,
        "size-dependent efficiency": np.c_[[size_dependent_compute(g, lay, hw, rates) for g, lay in zip(gs, lays)],
                                           a[:, 1:]],
        "operand transposes": np.c_[a[:, 0] + copies / hw.hbm_bandwidth, a[:, 1:]],
        "transposes, own rate": np.c_[a, copies / hw.hbm_bandwidth],
        "Hardware.dot_operand_copies": step_terms(hw.replace(dot_operand_copies=True),
                                                  [StepSample(g, VALIDATION_MESH, lay, 1.0) for g, lay in zip(gs, lays)]),
    }
    for name, cols in variants.items():
        x = nnls_relative(cols[fit], df.fit_measured_ms.to_numpy()[fit] / 1e3)
        pred = cols @ x * 1e3
        line = [f"{name:26s}"]
        for m in VALIDATION_MODELS:
            h = (df.model == m).to_numpy() & ~fit
            meas = df.measured_ms.to_numpy()[h]
            line.append(f"{m} {spearman(pd.Series(pred[h]), pd.Series(meas)):.2f}/"
                        f"{np.median(np.abs(pred[h] - meas) / meas):.0%}")
        print("  ".join(line) + f"   fit x = {', '.join(f'{v:.3g}' for v in x)}", flush=True)


if __name__ == "__main__":
    main()
