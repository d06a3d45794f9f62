"""Trace a GPT-3-sized training step abstractly and show that graph size is independent of depth.

GPT-3 175B shape (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads
of 128, context 2048, batch 3.2M tokens ~ 1536 x 2048; d_ff = 4 d_model), with the
vocabulary padded to 50304. Arguments are ``jax.ShapeDtypeStruct`` s: nothing is
allocated, so this runs on a laptop. Then the same model with 2 layers: the op count
and signature classes are identical, only multiplicities (and so flops) change.

Run: ``python benchmarks/trace_gpt3.py``  (target: under 5 s per trace).
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

GPT3 = dict(d_model=12288, d_ff=49152, heads=96, d_kv=128, vocab=50304, batch=1536, length=2048)


def trace_once(n_layers: int) -> tuple[object, float]:
    from autolayout import models

    t0 = time.perf_counter()
    graph = models.transformer_lm(**GPT3, n_layers=n_layers)
    return graph, time.perf_counter() - t0


def report(graph: object, seconds: float, n_layers: int) -> dict:
    kinds = Counter(op.kind for op in graph.ops())
    tokens = GPT3["batch"] * GPT3["length"]
    row = dict(n_layers=n_layers, seconds=seconds, ops=len(graph),
               classes=len(graph.signature_classes()), params=graph.num_params(), flops=graph.flops())
    print(f"n_layers={n_layers}: traced in {seconds:.2f} s")
    print(f"  ops {row['ops']} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})")
    print(f"  signature classes {row['classes']}")
    print(f"  parameters {row['params']:,} ({row['params'] / 1e9:.1f}B)")
    # 6 flops per matmul weight per token (forward 2, backward 4) — the embedding and
    # position tables (a gather and an add) and the layer-norm scales and biases
    # (elementwise) excepted — plus attention's q·k and p·v: 2 · 2·length·heads·d_kv
    # per token per layer forward, times 3 with the backward pass.
    d, v, n = GPT3["d_model"], GPT3["vocab"], GPT3["length"]
    matmul_params = row["params"] - v * d - n * d - (4 * n_layers + 2) * d
    analytic = 6 * matmul_params * tokens + 12 * n_layers * n * GPT3["heads"] * GPT3["d_kv"] * tokens
    print(f"  flops per step {row['flops']:.4g} (analytic 6·N_matmul·tokens + attention = {analytic:.4g}, "
          f"{'equal' if analytic == row['flops'] else 'DIFFERENT'})")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[96, 2])
    args = parser.parse_args()
    import jax  # noqa: F401  (import outside the timed region)

    rows = [report(*trace_once(n), n) for n in args.layers]
    if len({(r["ops"], r["classes"]) for r in rows}) == 1:
        print(f"op count and signature classes are independent of n_layers "
              f"({', '.join(str(r['n_layers']) for r in rows)})")
    else:
        print("WARNING: op count depends on n_layers")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
