"""Do today's largest published configurations fit, and with which layout? (issues 10 and 11)

For each configuration (the cited data of ``autolayout.reporting.published_runs``), trace
the zoo model, search the layout at the device's memory on the published mesh (the slow
axis given its data-centre / InfiniBand link), and print: search status, wall time, the
layout, the predicted step time and MFU, and the predicted memory by category beside the
hand calculation of ``benchmarks/hand_memory.py`` for the strategy a person would write.

Run: ``PYTHONPATH=$PWD python benchmarks/large_models.py [name ...] [--layers N]``
(``--layers`` traces fewer layers, for a quick look; the search is depth-independent).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autolayout import models  # noqa: E402
from autolayout.costmodel import predict  # noqa: E402
from autolayout.costmodel.profiles import SLOW_LINKS, get_hardware  # noqa: E402
from autolayout.reporting.published_runs import RUNS  # noqa: E402
from autolayout.search import SearchError, search  # noqa: E402

GIB = 2**30

# configuration -> (mesh, a hand-written layout to compare with, overrides of the zoo kwargs)
CASES = {
    # issue 10: GPT-3 175B (bf16, per-layer remat) on 4096 TPU v4; by hand TP16 x FSDP256
    # with sequence parallelism (hand_memory: 3.7 GiB) or without (30.1 GiB)
    "gpt3-175b-v4-4096": ("x:16,y:16,z:16", "heads:x;d_ff:x;vocab:x;batch:y,z;length@norm:x|*:y,z@3", {}),
    # issue 11: GPT-3 traced without remat: the search must rematerialise
    "gpt3-175b-v4-4096/no-remat": ("x:16,y:16,z:16", "heads:x;d_ff:x;vocab:x;batch:y,z;length@norm:x|*:y,z@3;remat=full",
                                   {"remat": False}),
    # issue 10: MPT-70B on 64 H100 (nodes on InfiniBand), FSDP64 by hand
    "mpt-70b-h100-64": ("node:8,gpu:8", "batch:node,gpu|*:node,gpu@3", {}),
    # issue 10: LLaMA-2-70B at its published 4M-token batch on 64 H100
    "llama2-70b-h100-64-4m": ("node:8,gpu:8", "batch:node,gpu|*:node,gpu@3", {}),
    # issue 11: PaLM 540B on 6144 TPU v4, two pods over DCN
    # (vocab 256000 and length 2048 are not multiples of 12: vocab unsplit, and the norm
    # region splits d_model over the tensor axis instead, as MaxText's activation_embed rule)
    "palm-540b-v4-6144": ("dcn:2,x:12,y:16,z:16", "heads:x;d_ff:x;batch:dcn,y,z;d_model@norm:x|*:y,z@3;remat=full", {}),
}


def hardware(run):
    hw = get_hardware(run.hardware)
    if run.slow_axis:
        hw = hw.with_axis_link(run.slow_axis, SLOW_LINKS[hw.name])
    return hw


def fmt_mem(mem: dict) -> str:
    return ", ".join(f"{k} {v / GIB:.2f}" for k, v in mem.items())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=list(CASES))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args(argv)
    for name in args.names:
        base = name.split("/")[0]
        run = RUNS[base]
        mesh, hand_layout, over = CASES[name]
        kw = {**run.zoo_kwargs(), **over}
        if args.layers:
            kw["n_layers"] = args.layers
        t = time.perf_counter()
        g = getattr(models, run.model.fn)(**kw)
        trace_s = time.perf_counter() - t
        hw = hardware(run)
        print(f"\n== {name}: {run.model.fn}({', '.join(f'{k}={v}' for k, v in kw.items())})")
        print(f"   mesh {mesh} on {hw.name} ({hw.hbm_bytes / GIB:.1f} GiB per device); traced in {trace_s:.1f} s")
        try:
            hand = predict(g, mesh, hand_layout, hardware=hw)
            print(f"   by hand  {hand_layout}: {hand.time_s:.3f} s/step, MFU {hand.mfu:.1%}, "
                  f"{hand.memory_bytes / GIB:.2f} GiB ({fmt_mem(hand.memory)})")
        except Exception as e:  # a hand layout that does not apply is reported, not hidden
            print(f"   by hand  {hand_layout}: {type(e).__name__}: {e}")
        t = time.perf_counter()
        try:
            r = search(g, mesh, hardware=hw, time_limit_s=args.time_limit)
        except SearchError as e:
            print(f"   search: SearchError after {time.perf_counter() - t:.1f} s: {e}")
            continue
        c = r.cost
        print(f"   search {r.status} in {time.perf_counter() - t:.1f} s (CP-SAT {r.cp_sat_time_s:.1f} s), "
              f"gap {r.gap:.2%}")
        print(f"   layout   {r.layout}")
        print(f"   {c.time_s:.3f} s/step (compute {c.compute_s:.3f}, comm {c.comm_s:.3f}), MFU {c.mfu:.1%}; "
              f"{c.memory_bytes / GIB:.2f} GiB ({fmt_mem(c.memory)})")


if __name__ == "__main__":
    main()
