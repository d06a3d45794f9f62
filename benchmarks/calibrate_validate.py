"""Measured ranking: calibrated cost model vs measured step time on 8 virtual CPU devices.

Runs :func:`autolayout.reporting.measured.validation_report` (the committed
``reports/validation`` page): a profile measured by ``autolayout.calibrate``; 14 random
layouts of each of four models (mlp, transformer_lm, moe, llama at CPU-friendly sizes),
split at random into a half that refits the profile (compute scale, latency,
bandwidth, per-op overhead: four numbers for all models) and a held-out half; the layout the search
picks per model with the refitted profile; every layout timed in random order with
interleaved repeats. Prints, per model, Spearman rank correlation and median |error|
on the held-out layouts and how much slower the searched layout ran than the fastest.

Targets (8 CPU devices): Spearman >= 0.9 per model, median |error| <= 20%, searched
layout within 10% of the fastest measured. About 5 minutes on 2 loaded cores.

Run: python benchmarks/calibrate_validate.py [--out reports/validation] [--layouts 14] [--rounds 15]
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

from autolayout.reporting.measured import LAYOUTS_PER_MODEL, ROUNDS, SEED, TARGETS, validation_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/autolayout-validation", help="report directory "
                    "(reports/validation regenerates the committed one)")
    ap.add_argument("--layouts", type=int, default=LAYOUTS_PER_MODEL, help="random layouts per model")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved timed steps per layout")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    t0 = time.perf_counter()
    page = validation_report(args.out, layouts_per_model=args.layouts, rounds=args.rounds, seed=args.seed)
    s = page.summary
    print(f"\n{'model':16s} {'Spearman':>9s} {'(micro)':>8s} {'med |err|':>10s} {'(micro)':>8s} {'searched vs fastest':>20s}")
    for m in s["spearman"]:
        gap = s["searched_gap"].get(m)
        print(f"{m:16s} {s['spearman'][m]:9.2f} {s['spearman_micro'][m]:8.2f} {s['median_abs_error'][m]:10.0%} "
              f"{s['median_abs_error_micro'][m]:8.0%} {'' if gap is None else f'{gap:+.0%}':>20s}")
    print(f"targets {TARGETS}: met {s['targets_met']}")
    print(f"refit: compute x{s['compute_scale']:.3f}, latency {s['latency_s'] * 1e6:.1f} us/step, "
          f"bandwidth {s['bandwidth'] / 1e9:.3f} GB/s, {s['op_overhead_s'] * 1e6:.1f} us per executed op; {s['layouts']} layouts, collectives match "
          f"{s['collectives_match']}; wrote {args.out} in {time.perf_counter() - t0:.0f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
