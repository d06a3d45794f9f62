"""Calibrated cost model vs measured step time on 8 virtual CPU devices.

Calibrates a Hardware profile on the mesh (or loads it from --profile), runs at
least 10 distinct layouts of the demo transformer (d_model 64, d_ff 256, heads 4,
d_kv 16, 2 layers, vocab 256, batch 16, length 32) with the shard_map backend,
and prints predicted vs measured step time per layout, the Spearman rank
correlation and the mean relative error. Target: rank correlation >= 0.8.

Run: python benchmarks/calibrate_validate.py [--quick] [--profile cpu.json] [--repeats 10]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402

from autolayout import models  # noqa: E402
from autolayout.costmodel.hardware import Hardware  # noqa: E402
from autolayout.exec import calibrate, execute  # noqa: E402

MESH = "rows:2,cols:4"
DEMO = dict(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=256, batch=16, length=32)
LAYOUTS = [
    "",                                             # replicated: every device runs everything
    "batch:rows,cols",                              # data parallel over 8
    "batch:rows;heads:cols;d_ff:cols",              # Mesh-TensorFlow data x model parallel
    "batch:cols;heads:rows;d_ff:rows;vocab:rows",
    "batch:rows;vocab:cols",
    "vocab:rows,cols",
    "batch:rows;d_model:cols",
    "length:rows;batch:cols",                       # sequence split: attention renames all-gather
    "batch:rows;d_kv:cols",
    "d_ff:rows,cols",
    "heads:cols;d_ff:cols;vocab:cols",              # model parallel only
    "batch:rows,cols|embed:rows,cols;softmax:rows,cols;layers/w1:rows,cols;layers/w2:rows,cols",
    "length_1:cols;batch:rows",
    "batch:cols;d_model:rows",
]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    def ranks(x: np.ndarray) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # average ranks of ties
            r[x == v] = r[x == v].mean()
        return r
    ra, rb = ranks(np.asarray(a)), ranks(np.asarray(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="quick calibration")
    ap.add_argument("--profile", help="load (if it exists) or save the calibrated profile here")
    ap.add_argument("--repeats", type=int, default=20, help="timed steps per layout (interleaved)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.profile and os.path.exists(args.profile):
        hw = Hardware.load(args.profile)
        print(f"loaded profile {args.profile}")
    else:
        hw = calibrate(MESH, quick=args.quick, save_to=args.profile)
        print(f"calibrated in {time.perf_counter() - t0:.1f} s" + (f", saved to {args.profile}" if args.profile else ""))
    print(f"  peak {hw.peak('float32') / 1e9:.2f} GFLOP/s/device, memory {hw.hbm_bandwidth / 1e9:.2f} GB/s/device, "
          + ", ".join(f"{a}: alpha {l.latency * 1e6:.0f} us B {l.bandwidth / 1e9:.2f} GB/s" for a, l in hw.axis_links))
    g = models.transformer_lm(**DEMO)
    runs = []
    for lay in LAYOUTS:  # compile and warm up every layout first ...
        runs.append(execute(g, MESH, lay, repeats=2, hardware=hw, reference=False))
    samples = {i: list(ex.step_times_s) for i, ex in enumerate(runs)}
    rounds = max(args.repeats // 2, 1)
    for _ in range(rounds):  # ... then time them round-robin: load drift hits all alike
        for i, ex in enumerate(runs):
            samples[i].extend(ex.time_steps(2))
    rows = []
    print(f"\n{'layout':72s} {'pred ms':>8s} {'comp':>6s} {'comm':>6s} {'meas ms':>8s} {'min ms':>7s} colls")
    for i, (lay, ex) in enumerate(zip(LAYOUTS, runs)):
        c = ex.predicted
        med, low = float(np.median(samples[i])), float(np.min(samples[i]))
        rows.append((lay, c.time_s, med, c.compute_s, c.comm_s, low))
        print(f"{lay or '(replicated)':72s} {c.time_s * 1e3:8.2f} {c.compute_s * 1e3:6.2f} {c.comm_s * 1e3:6.2f} "
              f"{med * 1e3:8.2f} {low * 1e3:7.2f} "
              f"{len(ex.compiled_collectives)}{'' if ex.collectives_match else ' MISMATCH'}", flush=True)
    pred = np.array([r[1] for r in rows])
    meas = np.array([r[2] for r in rows])
    low = np.array([r[5] for r in rows])
    rho = spearman(pred, meas)
    rel = float(np.mean(np.abs(pred - meas) / meas))
    print(f"\n{len(rows)} layouts, median of {len(samples[0])} interleaved steps: Spearman rank correlation "
          f"{rho:.3f} (target >= 0.8), mean relative error {rel:.1%}, total {time.perf_counter() - t0:.0f} s")
    print(f"with the fastest step instead of the median: Spearman {spearman(pred, low):.3f}, "
          f"mean relative error {float(np.mean(np.abs(pred - low) / low)):.1%}")
    ratio = meas / pred
    print(f"measured / predicted: median {np.median(ratio):.2f} (min {ratio.min():.2f}, max {ratio.max():.2f})")
    comp_share = float(np.mean([r[3] / r[1] for r in rows]))
    print(f"predicted compute share of step time: {comp_share:.1%} (rest: collectives)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
