"""The papers' published figures and the models that reproduce them, as data.

* :func:`mlp_scaling` — Mesh-TensorFlow §8.6: predicted efficiency of the paper's MLP as
  the mesh grows, for the data-parallel, model-parallel, 2-D and 3-D layouts;
* :func:`paper_transformer` — Mesh-TensorFlow §9 / Table 2: the 4.9B-parameter decoder
  LM on a TPUv2 16x32 mesh (paper: 6 of 11.5 PFLOP/s);
* :func:`table2_models` — the parameter counts of Table 2's seven models;
* :func:`wus_transformer` — weight-update sharding (seed 003 §6): Transformer with Adam,
  data-parallel on TPUv3 (paper: 46.5 ms -> 25.6 ms on 2048 cores, ~9% on 32 cores).

``benchmarks/paper_anchors.py`` prints the same figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autolayout.reporting.fmt import fmt_bytes, fmt_time

__all__ = ["PAPER", "mlp_scaling", "paper_transformer", "table2_models", "wus_transformer",
           "update_time", "PaperLM", "WusCase"]

# Figures printed in the papers (seeds/000 Mesh-TensorFlow, seeds/003 weight-update sharding).
PAPER = {
    # §9: "maintaining computational efficiency of over 50% (6 PFLOP/s out of a maximum 11.5 PFLOP/s)"
    "mtf_lm_pflops": 6.0,
    "mtf_lm_peak_pflops": 11.5,
    "mtf_lm_params_b": 4.90,
    # Table 2: d_model 1024, d_k = d_v = 256; (d_ff, heads, parameters in billions)
    "mtf_table2": [(4096, 4, 0.14), (8192, 8, 0.22), (16384, 16, 0.37), (32768, 32, 0.67),
                   (65536, 64, 1.28), (131072, 128, 2.48), (262144, 256, 4.90)],
    # seed 003 §6.1: "For Transformer, the step time reduces from 46.5ms to 25.6ms" (2048 cores, batch 2048)
    "wus_large_ms": (46.5, 25.6),
    # seed 003 §6.1 at 32 cores (batch 512): "improvements in the range of 9% for language models like Transformer"
    "wus_small_gain": 0.09,
    # seed 003 §3: "Transformer training can spend more than 40% of the step time in weight update on 1024 TPUv3 chips"
    "wus_update_fraction": 0.40,
}

# The §9 model: Table 2's last row. Vocabulary 32768 (tensor2tensor's languagemodel_lm1b32k;
# the paper does not state it).
PAPER_LM_SIZES = dict(d_model=1024, d_ff=262144, heads=256, d_kv=256, n_layers=6, vocab=32768,
                      batch=256, length=256, param_dtype="bfloat16")
PAPER_LM_LAYOUT = "batch:rows;vocab:cols;d_ff:cols;heads:cols"
PAPER_LM_MESH = "rows:16,cols:32"


# ----------------------------------------------------------------------------- §8.6 scaling
def mlp_scaling(hardware: Any = "tpu-v3", ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32), b0: int = 8192,
                h0: int = 8192, io0: int = 2048, dtype: str = "bfloat16", cubes: tuple[int, ...] = (2, 4, 8)) -> Any:
    """Predicted efficiency (MFU) of the paper's MLP under growing meshes (paper §8.6).

    Data-parallel (``batch:all``), model-parallel (``hidden:all``) and 2-D
    (``batch:rows;hidden:cols`` on ``k x k``) run on ``n = k²`` devices with batch and
    hidden scaled linearly with ``k`` (``b0·k``, ``h0·k``): the paper's claim is that only
    the 2-D layout keeps its efficiency. The 3-D layout (``batch:rows;hidden:cols;io:planes``
    on ``k x k x k``, io also scaled with ``k``) is added for ``cubes``.
    """
    import pandas as pd

    from autolayout import models
    from autolayout.costmodel.predict import predict

    rows = []

    def add(family: str, k: int, mesh: str, layout: str, b: int, h: int, io: int) -> None:
        g = models.mlp(b, io, h, param_dtype=dtype)
        c = predict(g, mesh, layout, hardware=hardware)
        rows.append({"layout_family": family, "layout": layout or "(replicated)", "mesh": mesh,
                     "hardware": c.hardware.name,
                     "devices": math.prod(s for _, s in c.mesh.axes), "batch": b, "d_hidden": h, "d_io": io,
                     "efficiency": c.mfu, "time_ms": c.time_s * 1e3, "compute_ms": c.compute_s * 1e3,
                     "comm_ms": c.comm_s * 1e3, "memory_GiB": c.memory_bytes / 2**30, "fits": c.fits})

    for k in ks:
        n = k * k
        b, h = b0 * k, h0 * k
        one = n == 1
        add("data-parallel batch:all", k, f"all:{n}", "" if one else "batch:all", b, h, io0)
        add("model-parallel hidden:all", k, f"all:{n}", "" if one else "hidden:all", b, h, io0)
        add("2-D batch:rows;hidden:cols", k, "all:1" if one else f"rows:{k},cols:{k}",
            "" if one else "batch:rows;hidden:cols", b, h, io0)
    for k in cubes:
        add("3-D batch:rows;hidden:cols;io:planes", k, f"rows:{k},cols:{k},planes:{k}",
            "batch:rows;hidden:cols;io:planes", b0 * k, h0 * k, io0 * k)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------ §9
@dataclass
class PaperLM:
    graph: Any
    cost: Any
    hardware: Any
    layout: str
    mesh: str
    achieved_pflops: float  # predicted model flops per second
    peak_pflops: float      # devices x per-device peak (bfloat16)


def paper_transformer(hardware: Any = "tpu-v2", layout: str = PAPER_LM_LAYOUT, mesh: str = PAPER_LM_MESH,
                      graph: Any = None) -> PaperLM:
    """The §9 model on TPUv2 16x32 under the paper's layout: predicted step time and PFLOP/s."""
    from autolayout import models
    from autolayout.costmodel.profiles import get_hardware
    from autolayout.costmodel.predict import predict

    hw = get_hardware(hardware)
    g = graph if graph is not None else models.transformer_lm(**PAPER_LM_SIZES)
    c = predict(g, mesh, layout, hardware=hw)
    devices = c.mesh.size
    return PaperLM(g, c, hw, layout, mesh, g.flops() / c.time_s / 1e15, devices * hw.peak("bfloat16") / 1e15)


def scaling_display(df: Any) -> Any:
    """The §8.6 scaling table (:func:`mlp_scaling`) as a reader sees it."""
    import pandas as pd

    return pd.DataFrame({
        "layout": df.layout_family.str.split(" ").str[0], "mesh": df.mesh, "devices": df.devices,
        "batch": df.batch, "d_hidden": df.d_hidden, "d_io": df.d_io,
        "efficiency (% of peak)": [f"{e:.1%}" for e in df.efficiency],
        "step time": [fmt_time(t / 1e3) for t in df.time_ms], "memory / device": [fmt_bytes(m * 2**30) for m in df.memory_GiB],
        "fits in HBM": df.fits})


def table2_models() -> Any:
    """Table 2's models (d_model 1024, d_kv 256, 6 layers): our parameter count beside the paper's."""
    import pandas as pd

    from autolayout import models

    rows = []
    for d_ff, heads, paper_b in PAPER["mtf_table2"]:
        sizes = dict(PAPER_LM_SIZES, d_ff=d_ff, heads=heads)
        g = models.transformer_lm(**sizes)
        ours = g.num_params() / 1e9
        rows.append({"d_ff": d_ff, "heads": heads, "params_B": ours, "paper_params_B": paper_b,
                     "rel_diff": ours / paper_b - 1, "graph": g})
    return pd.DataFrame(rows)


# -------------------------------------------------------------------------- seed 003 (WUS)
@dataclass
class WusCase:
    name: str
    cores: int
    batch: int
    mesh: str
    graph: Any
    base: Any          # Cost without weight-update sharding
    wus: Any           # Cost with every parameter's update sharded over the batch axes
    update_base_s: float
    update_wus_s: float
    wus_layout: Any


def wus_transformer(cores: int = 2048, batch: int = 2048, mesh: str = "rows:32,cols:64", hardware: Any = "tpu-v3",
                    n_layers: int = 12, length: int = 64, graph: Any = None) -> WusCase:
    """Seed 003's Transformer (MLPerf-0.6, Adam) data-parallel on TPUv3, with and without WUS.

    Transformer-big sizes (d_model 1024, d_ff 4096, 16 heads of 64), ``n_layers`` decoder
    layers standing in for 6+6 encoder-decoder layers, vocab 33708 (MLPerf's shared
    subword vocabulary), sequence length ``length`` (an assumption: the paper does not
    give it), batch split over every mesh axis.
    """
    from autolayout import models
    from autolayout.core import Layout, Mesh
    from autolayout.costmodel.predict import predict

    m = Mesh.parse(mesh)
    if m.size != cores:
        raise ValueError(f"mesh {m} has {m.size} devices, not {cores}")
    g = graph if graph is not None else models.transformer_lm(
        d_model=1024, d_ff=4096, heads=16, d_kv=64, n_layers=n_layers, vocab=33708, batch=batch,
        length=length, param_dtype="float32")
    axes = ",".join(m.axis_names)
    base = Layout(f"batch:{axes}")
    lay = base
    for p in g.params():
        cand = lay.with_update_sharding(p.name, m.axis_names)
        try:
            predict(g, m, cand, hardware=hardware)
        except ValueError:
            continue  # no gradient all-reduce over these axes for this parameter
        lay = cand
    c0, c1 = predict(g, m, base, hardware=hardware), predict(g, m, lay, hardware=hardware)
    return WusCase(f"{cores} cores, batch {batch}", cores, batch, str(m), g, c0, c1,
                   update_time(c0, g), update_time(c1, g), lay)


def update_time(cost: Any, graph: Any) -> float:
    """Predicted time of the optimizer update: elementwise ops outside loops downstream of a
    gradient (``graph.param_roles``), plus the collectives on them."""
    grads = {r.grad for r in graph.param_roles.values() if r.grad}
    region, frontier = set(), list(grads)
    while frontier:
        t = frontier.pop()
        for u in graph.consumers(t):
            if u not in region and graph.op(u).kind == "elementwise" and graph.op(u).loop is None:
                region.add(u)
                frontier.append(u)
    df = cost.per_op
    return float(df[df.op.isin(region)].total_s.sum())
