"""Our shard_map lowering vs XLA's GSPMD partitioner, same layouts, same run.

For each layout of the demo transformer (d_model 64, d_ff 256, heads 4, d_kv 16,
2 layers, vocab 256, batch 16, length 32) on 8 virtual CPU devices, runs
``execute(..., backend="shard_map")`` and ``execute(..., backend="gspmd")`` and
prints both median step times (timed interleaved), their ratio (ours / GSPMD; < 1 means ours is
faster), the number of collectives each program has after optimisation, and
whether both match the unsharded reference.

Run: python benchmarks/exec_vs_gspmd.py [--repeats 10]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from autolayout import models  # noqa: E402
from autolayout.exec import execute  # noqa: E402

MESH = "rows:2,cols:4"
DEMO = dict(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=256, batch=16, length=32)
LAYOUTS = [
    "batch:rows,cols",
    "batch:rows;heads:cols;d_ff:cols",
    "batch:cols;heads:rows;d_ff:rows;vocab:rows",
    "batch:rows;vocab:cols",
    "length:rows;batch:cols",
    "batch:rows;d_model:cols",
    "heads:cols;d_ff:cols;vocab:cols",
    "batch:rows,cols|embed:rows,cols;softmax:rows,cols;layers/w1:rows,cols;layers/w2:rows,cols",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    g = models.transformer_lm(**DEMO)
    t0 = time.perf_counter()
    pairs = [(execute(g, MESH, lay, repeats=2), execute(g, MESH, lay, repeats=2, backend="gspmd"))
             for lay in LAYOUTS]
    times = {(i, b): [] for i in range(len(pairs)) for b in (0, 1)}
    for _ in range(args.repeats):  # interleaved, so load drift hits both backends alike
        for i, pair in enumerate(pairs):
            for b, ex in enumerate(pair):
                times[i, b].extend(ex.time_steps(1))
    ratios = []
    print(f"{'layout':60s} {'ours ms':>8s} {'gspmd ms':>8s} {'ratio':>6s} {'colls ours/gspmd':>17s} errors")
    for i, (lay, (ours, theirs)) in enumerate(zip(LAYOUTS, pairs)):
        a, b = statistics.median(times[i, 0]), statistics.median(times[i, 1])
        ratios.append(a / b)
        name = lay if len(lay) <= 60 else lay[:57] + "..."
        print(f"{name:60s} {a * 1e3:8.2f} {b * 1e3:8.2f} {a / b:6.2f} "
              f"{len(ours.optimized_collectives):>8d}/{len(theirs.optimized_collectives):<8d} "
              f"{ours.max_abs_error:.1e}/{theirs.max_abs_error:.1e}", flush=True)
    print(f"\nmedian ratio ours/GSPMD {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}) over {len(ratios)} layouts, "
          f"{args.repeats} interleaved steps each, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
