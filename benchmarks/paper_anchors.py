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

Run: python benchmarks/paper_anchors.py
"""
from __future__ import annotations

import time

from autolayout import models
from autolayout.costmodel import get_hardware, predict


def paper_lm() -> None:
    t = time.perf_counter()
    g = models.transformer_lm(d_model=1024, d_ff=262144, heads=256, d_kv=256, n_layers=6, vocab=32768,
                              batch=256, length=256, dtype="bfloat16")
    trace_s = time.perf_counter() - t
    hw = get_hardware("tpu-v2")
    layout = "batch:rows;vocab:cols;d_ff:cols;heads:cols"
    t = time.perf_counter()
    c = predict(g, "rows:16,cols:32", layout, hw)
    pred_s = time.perf_counter() - t
    peak = 512 * hw.peak("bfloat16")
    print("(a) Mesh-TensorFlow §9, Table 2 last row on TPUv2 16x32")
    print(f"    parameters {g.num_params() / 1e9:.2f}B (paper 4.90B), model flops/step {g.flops():.3e}")
    print(f"    layout {layout}")
    print(f"    predicted step {c.time_s * 1e3:.1f} ms = compute {c.compute_s * 1e3:.1f} + comm {c.comm_s * 1e3:.1f} ms;"
          f" memory {c.memory_bytes / 2**30:.2f} GiB/core of {hw.hbm_bytes / 2**30:.0f}")
    print(f"    predicted {g.flops() / c.time_s / 1e15:.2f} of {peak / 1e15:.2f} PFLOP/s = MFU {c.mfu:.1%}"
          f"   (paper measured 6 of 11.5 PFLOP/s = 52%)")
    top = c.per_op.sort_values("total_s", ascending=False).head(6)
    print("    largest contributors:")
    for r in top.itertuples():
        print(f"      {r.op:24s} {r.kind:11s} x{r.count:<3d} {r.total_s * 1e3:8.2f} ms  {r.collectives}")
    print(f"    (trace {trace_s:.2f} s, predict {pred_s:.3f} s)")


def wus_transformer() -> None:
    g = models.transformer_lm(d_model=1024, d_ff=4096, heads=16, d_kv=64, n_layers=12, vocab=33708,
                              batch=2048, length=64, dtype="float32")
    hw = get_hardware("tpu-v3")
    mesh = "rows:32,cols:64"
    base = "batch:rows,cols"
    params = [t.name for t in g.params()]
    wus = base + "|" + ";".join(f"{p}:rows,cols" for p in params if _ok(g, mesh, base, p))
    c0 = predict(g, mesh, base, hw)
    c1 = predict(g, mesh, wus, hw)
    upd0 = _update_time(c0, g)
    upd1 = _update_time(c1, g)
    print("(b) Weight-update sharding (seed 003): Transformer, Adam, data-parallel on 2048 TPUv3 cores")
    print(f"    parameters {g.num_params() / 1e6:.0f}M; per-core batch {2048 // 2048} sequence of 64 tokens")
    for name, c, upd in (("without", c0, upd0), ("with", c1, upd1)):
        print(f"    {name:7s} WUS: step {c.time_s * 1e3:6.1f} ms (compute {c.compute_s * 1e3:.1f}, comm "
              f"{c.comm_s * 1e3:.1f}; of which weight update {upd * 1e3:.1f} ms), memory "
              f"{c.memory_bytes / 2**30:.2f} GiB (opt state {c.memory['opt_state'] / 2**30:.2f} GiB)")
    print(f"    predicted speed-up {c0.time_s / c1.time_s:.2f}x   (paper: 46.5 ms -> 25.6 ms, 1.82x)")


def _ok(g, mesh, base, p) -> bool:
    try:
        predict(g, mesh, f"{base}|{p}:rows,cols", "tpu-v3")
        return True
    except ValueError:
        return False


def _update_time(c, g) -> float:
    """Time of the optimizer update: elementwise ops outside the loops on parameter-shaped
    tensors downstream of a gradient."""
    grads = {t.name for t in g.tensors() if t.name.startswith("grad/")}
    region, frontier = set(), list(grads)
    while frontier:
        t = frontier.pop()
        for u in g.consumers(t):
            if u not in region and g.op(u).kind == "elementwise" and g.op(u).loop is None:
                region.add(u)
                frontier.append(u)
    df = c.per_op
    return float(df[df.op.isin(region)].total_s.sum())


if __name__ == "__main__":
    paper_lm()
    print()
    wus_transformer()
