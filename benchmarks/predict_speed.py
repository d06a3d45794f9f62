"""predict() speed on a GPT-3-shaped 96-layer training step (target: under 0.2 s).

predict costs each op once per (signature, local assignment), so its time depends
on the number of distinct ops, not on depth (layers come from a scan). The first
call in a process also pays for importing pandas (the per-op DataFrame); both
figures are printed. Run: python benchmarks/predict_speed.py
"""
from __future__ import annotations

import statistics
import time

from autolayout import models
from autolayout.costmodel import predict

GPT3 = dict(d_model=12288, d_ff=49152, heads=96, d_kv=128, vocab=50304, batch=1536, length=2048,
            param_dtype="bfloat16")
LAYOUTS = ["batch:rows,cols;d_ff:planes;heads:planes;vocab:planes",
           "batch:rows;d_ff:cols;heads:cols;vocab:cols;d_model:planes",
           "batch:rows;d_ff:cols,planes;heads:cols;vocab:cols;d_kv:planes"]


def main() -> None:
    for n_layers in (96, 2):
        t = time.perf_counter()
        g = models.transformer_lm(n_layers=n_layers, **GPT3)
        trace_s = time.perf_counter() - t
        print(f"GPT-3 shape, {n_layers} layers: {len(g)} ops, {len(g.signature_classes())} classes, "
              f"{g.num_params() / 1e9:.1f}B params, trace {trace_s:.2f} s")
        for lay in LAYOUTS:
            times = []
            for _ in range(5):
                t = time.perf_counter()
                c = predict(g, "rows:16,cols:16,planes:16", lay, hardware="tpu-v4")
                times.append(time.perf_counter() - t)
            print(f"  predict {lay:60s} first {times[0] * 1e3:6.1f} ms, median of rest "
                  f"{statistics.median(times[1:]) * 1e3:6.1f} ms -> step {c.time_s:.2f} s, MFU {c.mfu:.1%}, "
                  f"{c.memory_bytes / 2**30:.1f} GiB/device")


if __name__ == "__main__":
    main()
