"""Paper anchors for the cost model (printed figures, not asserted).

(a) Mesh-TensorFlow paper §9 / Table 2 last row: decoder-only LM, d_model 1024,
    d_kv 256, heads 256, d_ff 262144, 6 layers (4.9B parameters), batch 256 x 256
    tokens, on a TPUv2 16x32 mesh (512 cores) with the §9 layout
    batch:rows;vocab:cols;d_ff:cols;heads:cols. The paper measured 6 of 11.5
    PFLOP/s (52%). Vocabulary: 32768 (the lm1b 32k subword vocabulary of
    tensor2tensor's languagemodel_lm1b32k; the paper does not state it).
(b) Weight-update sharding paper (seed 003) §5: Transformer (MLPerf-0.6, Adam,
    batch 2048) data-parallel on 2048 TPUv3 cores: 46.5 ms -> 25.6 ms with
    weight-update sharding. Model: Transformer-big sizes (d_model 1024, d_ff 4096,
    16 heads of 64), 12 layers as a decoder-only stand-in for 6+6
    encoder-decoder layers, vocab 33708 (MLPerf's shared subword vocabulary),
    sequence length 64 (assumption), on a 32x64 core mesh with the batch split
    over both axes.

The models and the papers' figures live in :mod:`autolayout.reporting.paper`; the
committed reports ``reports/paper_transformer`` and ``reports/weight_update_sharding``
(``autolayout report --all``) show the same numbers with charts.

Run: python benchmarks/paper_anchors.py
"""
from __future__ import annotations

import time

from autolayout.reporting.paper import PAPER, paper_transformer, wus_transformer


def paper_lm() -> None:
    t = time.perf_counter()
    lm = paper_transformer()
    g, c, hw = lm.graph, lm.cost, lm.hardware
    print("(a) Mesh-TensorFlow §9, Table 2 last row on TPUv2 16x32")
    print(f"    parameters {g.num_params() / 1e9:.2f}B (paper {PAPER['mtf_lm_params_b']:.2f}B), "
          f"model flops/step {g.flops():.3e}")
    print(f"    layout {lm.layout}")
    print(f"    predicted step {c.time_s * 1e3:.1f} ms = compute {c.compute_s * 1e3:.1f} + comm {c.comm_s * 1e3:.1f} ms;"
          f" memory {c.memory_bytes / 2**30:.2f} GiB/core of {hw.hbm_bytes / 2**30:.0f}")
    print(f"    predicted {lm.achieved_pflops:.2f} of {lm.peak_pflops:.2f} PFLOP/s = MFU {c.mfu:.1%}"
          f"   (paper measured {PAPER['mtf_lm_pflops']:g} of {PAPER['mtf_lm_peak_pflops']:g} PFLOP/s = "
          f"{PAPER['mtf_lm_pflops'] / PAPER['mtf_lm_peak_pflops']:.0%})")
    top = c.per_op.sort_values("total_s", ascending=False).head(6)
    print("    largest contributors:")
    for r in top.itertuples():
        print(f"      {r.op:24s} {r.kind:11s} x{r.count:<3d} {r.total_s * 1e3:8.2f} ms  {r.collectives}")
    print(f"    (trace and predict {time.perf_counter() - t:.2f} s)")


def wus() -> None:
    case = wus_transformer(2048, 2048, "rows:32,cols:64")
    p0, p1 = PAPER["wus_large_ms"]
    print("(b) Weight-update sharding (seed 003): Transformer, Adam, data-parallel on 2048 TPUv3 cores")
    print(f"    parameters {case.graph.num_params() / 1e6:.0f}M; per-core batch 1 sequence of 64 tokens")
    for name, c, upd in (("without", case.base, case.update_base_s), ("with", case.wus, case.update_wus_s)):
        print(f"    {name:7s} WUS: step {c.time_s * 1e3:6.1f} ms (compute {c.compute_s * 1e3:.1f}, comm "
              f"{c.comm_s * 1e3:.1f}; of which weight update {upd * 1e3:.1f} ms), memory "
              f"{c.memory_bytes / 2**30:.2f} GiB (opt state {c.memory['opt_state'] / 2**30:.2f} GiB)")
    print(f"    predicted speed-up {case.base.time_s / case.wus.time_s:.2f}x   "
          f"(paper: {p0} ms -> {p1} ms, {p0 / p1:.2f}x)")


if __name__ == "__main__":
    paper_lm()
    print()
    wus()
