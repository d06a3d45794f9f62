"""Measured ranking: calibrated cost model vs measured step time on 8 virtual CPU devices.

Runs :func:`autolayout.reporting.measured.validation_report` (the committed
``reports/validation`` page): a profile measured by ``autolayout.calibrate``; 14 random
layouts of each of four models (mlp, transformer_lm, moe, llama at CPU-friendly sizes),
split at random into a half that refits the profile (compute scale, latency,
bandwidth, per-op overhead: four numbers for all models) and a held-out half; the
layout the search
picks per model with the refitted profile, and the one ``search(..., verify=3)`` picks (the
measured fastest of the 3 best predicted); every layout timed in random order with
interleaved repeats. Prints, per model, Spearman rank correlation and median |error|
on the held-out layouts and how much slower the searched (and verified) layout ran than the
fastest.

Targets (8 CPU devices): Spearman >= 0.9 per model, median |error| <= 20%, searched
layout within 10% of the fastest measured and never the slowest. The gap is re-timed: the
searched (and verified) layout and its model's fastest run again together, 4x the rounds,
since the fastest of 14 noisy medians is biased low (it won partly by luck). About 6 minutes on 2
loaded cores.

``--collectives`` instead measures what one collective costs on XLA:CPU's in-process
devices, per kind and group size (the source of ``costmodel.collectives.latency_steps``):
programs of 1 and 5 independent collectives of 1 KiB per device, timed interleaved; the
per-collective time is the slope, less that of the same programs without collectives.

Run: python benchmarks/calibrate_validate.py [--out reports/validation] [--layouts 14] [--rounds 15] [--verify 3]
     python benchmarks/calibrate_validate.py --collectives [--rounds 200]
"""
from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from autolayout.reporting.measured import (LAYOUTS_PER_MODEL, ROUNDS, SEED, TARGETS, VERIFY,  # noqa: E402
                                           validation_report)

COLLECTIVE_KINDS = ("all-reduce", "reduce-scatter", "all-gather")
# meshes whose axes give groups of 2, 4 and 8 devices (and 8 over two axes)
COLLECTIVE_MESHES = (((2, 4), ("rows", "cols")), ((8,), ("all",)))


def collective_latency(rounds: int, elements: int = 256, k: int = 5) -> list[tuple[str, str, int, float]]:
    """``(kind, axes, group size, seconds per collective)`` for every kind over every axis (and
    all axes) of :data:`COLLECTIVE_MESHES`: ``(t(k collectives) - t(1)) / (k - 1)`` less the same
    slope without collectives, each program timed ``rounds`` times in random interleaved order."""
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    def program(mesh, kind, axes, count):
        n = math.prod(mesh.shape[a] for a in axes)

        def body(*xs):
            outs = []
            for x in xs:
                x = x[0] * 1.0001  # a local op first, so that no collective reads a parameter directly
                if kind == "all-reduce":
                    y = lax.pcast(lax.psum(x, axes), axes, to="varying")
                elif kind == "reduce-scatter":
                    y = lax.psum_scatter(x, axes, tiled=True)
                elif kind == "all-gather":
                    y = lax.all_gather(x[:elements // n], axes, tiled=True)
                else:
                    y = x
                outs.append(y[None])
            return tuple(outs)

        spec = P(tuple(mesh.axis_names))
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec,) * count, out_specs=(spec,) * count))
        xs = [jax.device_put(jnp.full((8, elements), i + 1.0, jnp.float32), NamedSharding(mesh, spec))
              for i in range(count)]
        jax.block_until_ready(f(*xs))
        return f, xs

    cases = {}
    for shape, names in COLLECTIVE_MESHES:
        mesh = jax.make_mesh(shape, names)
        groups = [(a,) for a in names] + ([tuple(names)] if len(names) > 1 else [])
        for count in (1, k):
            cases[(names, "none", (), count)] = program(mesh, "none", (), count)
            for kind in COLLECTIVE_KINDS:
                for axes in groups:
                    cases[(names, kind, axes, count)] = program(mesh, kind, axes, count)
    times = {c: [] for c in cases}
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(cases)
        rng.shuffle(order)
        for c in order:
            f, xs = cases[c]
            t = time.perf_counter()
            jax.block_until_ready(f(*xs))
            times[c].append(time.perf_counter() - t)
    med = {c: statistics.median(ts) for c, ts in times.items()}
    out = []
    for shape, names in COLLECTIVE_MESHES:
        base = med[(names, "none", (), k)] - med[(names, "none", (), 1)]
        for (mnames, kind, axes, count) in cases:
            if mnames == names and kind != "none" and count == k:
                per = (med[(names, kind, axes, k)] - med[(names, kind, axes, 1)] - base) / (k - 1)
                out.append((kind, ",".join(axes), math.prod(dict(zip(names, shape))[a] for a in axes), per))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/autolayout-validation", help="report directory "
                    "(reports/validation regenerates the committed one)")
    ap.add_argument("--layouts", type=int, default=LAYOUTS_PER_MODEL, help="random layouts per model")
    ap.add_argument("--rounds", type=int, default=None, help=f"interleaved timed steps per layout (default {ROUNDS}; "
                    "200 with --collectives)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--verify", type=int, default=VERIFY, help="k of search(..., verify=k), 0 to skip it")
    ap.add_argument("--collectives", action="store_true", help="measure one collective's time per kind and "
                    "group size instead")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.collectives:
        rows = collective_latency(args.rounds or 200)
        print(f"{'kind':16s} {'axes':10s} {'n':>3s} {'per collective':>15s} {'/ log2(n)':>10s}")
        for kind, axes, n, t in sorted(rows, key=lambda r: (r[2], r[0], r[1])):
            print(f"{kind:16s} {axes:10s} {n:3d} {t * 1e6:12.1f} us {t * 1e6 / math.log2(n):7.1f} us")
        print(f"({time.perf_counter() - t0:.0f} s)")
        return
    page = validation_report(args.out, layouts_per_model=args.layouts, rounds=args.rounds or ROUNDS, seed=args.seed,
                             verify_k=args.verify)
    s = page.summary
    print(f"\n{'model':16s} {'Spearman':>9s} {'(micro)':>8s} {'med |err|':>10s} {'(micro)':>8s} {'searched vs fastest':>20s}"
          f" {'(final round)':>14s} {'verify=' + str(args.verify) + ' vs fastest':>20s}")
    for m in s["spearman"]:
        gap, vgap = s["searched_gap"].get(m), s["verified_gap"].get(m)
        final = s["searched_gap_final_round"].get(m)
        print(f"{m:16s} {s['spearman'][m]:9.2f} {s['spearman_micro'][m]:8.2f} {s['median_abs_error'][m]:10.0%} "
              f"{s['median_abs_error_micro'][m]:8.0%} {'' if gap is None else f'{gap:+.0%}':>20s}"
              f" {'' if final is None else f'{final:+.0%}':>14s}"
              f" {'' if vgap is None or vgap != vgap else f'{vgap:+.0%}':>20s}")
    print(f"targets {TARGETS}: met {s['targets_met']}")
    print(f"refit ({s['topology']} links): compute x{s['compute_scale']:.3f}, latency {s['latency_s'] * 1e6:.1f} us/step, "
          f"bandwidth {s['bandwidth'] / 1e9:.3f} GB/s, {s['op_overhead_s'] * 1e6:.1f} us per executed op; "
          f"{s['layouts']} layouts, collectives match "
          f"{s['collectives_match']}; wrote {args.out} in {time.perf_counter() - t0:.0f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
