"""Fused attention (autolayout/costmodel/attention.py) against hand calculations, the unfused
graph's values and exhaustive enumeration of layouts."""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from autolayout import models
from autolayout.core import Layout
from autolayout.costmodel import plan, predict
from autolayout.costmodel.attention import attention_region, fuse_attention, kernel_graph
from autolayout.costmodel.profiles import PROFILES, get_hardware
from autolayout.costmodel.overlap import forward_ops
from autolayout.fusion import ON_CHIP
from autolayout.search import enumerate_layouts, search
from autolayout.trace import trace
from autolayout.train import label_grads

B, L, H, K, D = 4, 16, 2, 8, 16  # batch, length, heads, head dim, model dim
F32 = 4


def attention_step():
    """One SGD step of a single attention layer (no scan): loss = sum(attention(x) * dy)."""
    import jax.numpy as jnp

    def forward(p, x):
        q = jnp.einsum("bld,dhk->blhk", x, p["wq"])
        k = jnp.einsum("bld,dhk->blhk", x, p["wk"])
        v = jnp.einsum("bld,dhk->blhk", x, p["wv"])
        s = jnp.einsum("blhk,bmhk->bhlm", q, k)
        return jnp.einsum("bhlm,bmhk->blhk", jax.nn.softmax(s, axis=-1), v)

    def step(params, batch):
        loss, grads = jax.value_and_grad(lambda p: jnp.sum(forward(p, batch["x"]) * batch["dy"]))(params)
        grads = label_grads(grads)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss

    sds = jax.ShapeDtypeStruct
    params = {n: sds((D, H, K), np.float32) for n in ("wq", "wk", "wv")}
    batch = {"x": sds((B, L, D), np.float32), "dy": sds((B, L, H, K), np.float32)}
    dims = ({n: "d_model heads d_kv" for n in params}, {"x": "batch length d_model", "dy": "batch length heads d_kv"})
    return trace(step, params, batch, dims=dims, roles=("param", "input"), name="attention", donate_argnums=(0,))


def scores_of(g):
    """Ops whose output is score-shaped: [batch, heads, length, length_1] (by dims, not by the code under test)."""
    return {op.name for op in g.ops() if set(op.output.dim_names) == {"batch", "heads", "length", "length_1"}}


def contractions(g):
    return [op for op in g.ops() if op.kind == "einsum" and len(op.inputs) == 2]


def test_region_of_a_single_attention_layer_by_hand():
    g = attention_step()
    r = attention_region(g)
    score_mm = {op.name for op in contractions(g) if op.name in scores_of(g)}
    assert len(score_mm) == 2  # q·kᵀ and, in the backward, dO·vᵀ
    assert r.producers == score_mm
    # p·v forward; dV = pᵀ·dO, dQ = dS·k, dK = dSᵀ·q backward: the contractions reading a score
    readers = {op.name for op in contractions(g) if set(op.inputs) & scores_of(g)}
    assert len(readers) == 4 and r.consumers == readers
    assert r.scores <= scores_of(g) and not r.escaping
    # every score-shaped tensor of the step but none other is kept on chip once fused
    f = fuse_attention(g)
    assert {n for n in f.order if f.op(n).attr(ON_CHIP)} == scores_of(f)


def test_fused_attention_prices_flashattention_io_by_hand():
    """HBM bytes, memory and flops of the fused step on 2 devices (batch split), by hand."""
    g = attention_step()
    hw = get_hardware("tpu-v4")
    plain_hw = hw.replace(fused_attention=False)
    b = B // 2
    lay = "batch:x"
    fused, plain = predict(g, "x:2", lay, hardware=hw), predict(g, "x:2", lay, hardware=plain_hw)
    qk = 2 * b * H * L * L * K  # flops of one q·kᵀ per device
    # the backward recomputes q·kᵀ once: hardware flops, not model flops
    assert fused.hardware_flops - plain.hardware_flops == qk
    assert fused.model_flops == plain.model_flops
    f = kernel_graph(g, hw)
    fwd = forward_ops(f)
    qk_ops = [op for op in contractions(f) if op.name in scores_of(f) and
              {d.name for d in op.input_shapes[0]} == {"batch", "length", "heads", "d_kv"}
              and {d.name for d in op.input_shapes[1]} == {"batch", "length_1", "heads", "d_kv"}]
    # q·kᵀ forward, its recompute in the backward, and dO·vᵀ (operands of the same dims)
    assert len(qk_ops) == 3 and sum(op.name in fwd for op in qk_ops) == 1
    rows = fused.per_op.set_index("op")
    qkv = b * L * H * K * F32  # one of q, k, v, o on a device
    for op in qk_ops:  # reads its two operands, writes nothing (the scores stay on chip)
        assert rows.loc[op.name, "bytes"] == 2 * qkv
    pv = next(op for op in contractions(f) if op.name in fwd and set(op.inputs) & scores_of(f))
    assert rows.loc[pv.name, "bytes"] == 2 * qkv  # reads v, writes o
    plain_rows = plain.per_op.set_index("op")
    assert plain_rows.loc[pv.name, "bytes"] == 2 * qkv + b * H * L * L * F32  # reads the probabilities too
    # no score-sized tensor takes memory; every element-wise op on scores moves no HBM byte
    p = plan(f, "x:2", lay)
    assert all(p.local_bytes[n] == 0 for n in scores_of(f))
    stat = b * H * L * F32  # a softmax statistic [batch, heads, length] (max, sum): materialised
    for n in scores_of(f):
        op = f.op(n)
        if op.kind == "elementwise":  # reads only the statistics among its operands from HBM
            stats = sum(set(f.tensor(i).dim_names) == {"batch", "heads", "length"} and f.op(i).hbm[-1]
                        for i in op.inputs)  # (a statistic XLA fuses into its readers is not read)
            assert rows.loc[n, "bytes"] == stats * stat
    assert fused.memory_bytes < plain.memory_bytes
    assert fused.compute_s < plain.compute_s  # (this tiny step's time is its gradient all-reduce)


@pytest.mark.parametrize("name", ["attention", "transformer_lm", "llama"])
def test_fused_graph_computes_the_same_step(name):
    """The rewrite recomputes instead of saving: same outputs as the traced step."""
    g = {"attention": attention_step,
         "transformer_lm": lambda: models.transformer_lm(n_layers=2, batch=4, length=16),
         "llama": lambda: models.llama(n_layers=2, batch=4, length=16)}[name]()
    f = fuse_attention(g)
    assert f is not g and len(attention_region(f).producers) == len(attention_region(g).producers) + 1
    args = models.example_args(g) if name != "attention" else _attention_args()
    want, got = jax.tree_util.tree_leaves(g.evaluate(*args)), jax.tree_util.tree_leaves(f.evaluate(*args))
    for w, x in zip(want, got):
        np.testing.assert_allclose(np.asarray(x), np.asarray(w), rtol=1e-5, atol=1e-6)


def _attention_args():
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal((D, H, K)).astype(np.float32) / 4 for n in ("wq", "wk", "wv")}
    return params, {"x": rng.standard_normal((B, L, D)).astype(np.float32),
                    "dy": rng.standard_normal((B, L, H, K)).astype(np.float32)}


def test_scan_saves_no_score_and_recomputes_once_per_layer():
    g = models.transformer_lm(n_layers=3, batch=4, length=16)
    f = fuse_attention(g)
    stacked = [n for n in g.order if g.op(n).fn == "stack" and {"length", "length_1"} <= set(g.tensor(n).dim_names)]
    assert stacked  # the traced step saves scores for the backward scan ...
    assert not [n for n in f.order if f.op(n).fn == "stack" and {"length", "length_1"} <= set(f.tensor(n).dim_names)]
    hw = get_hardware("tpu-v4")
    for remat, extra in (("", 1), ("full", 1), ("dots", 1)):  # one more q·kᵀ per layer under every policy
        lay = Layout("batch:x").with_remat(remat)
        a = predict(g, "x:2", lay, hardware=hw)
        b = predict(g, "x:2", lay, hardware=hw.replace(fused_attention=False))
        d = g.dims
        assert a.hardware_flops - b.hardware_flops == extra * 3 * 2 * d["batch"] // 2 * d["heads"] * 16 * 16 * d["d_kv"]


def test_no_region_without_attention():
    for g in (models.mlp(batch=16, d_io=8, d_hidden=32), models.moe()):
        assert not attention_region(g).scores
        assert fuse_attention(g) is g


def test_profiles_and_cpu_unchanged():
    assert [n for n, hw in PROFILES.items() if hw.fused_attention] == ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e",
                                                                         "h100", "h200"]
    g = models.transformer_lm(n_layers=2, batch=4, length=16)
    assert kernel_graph(g, get_hardware("cpu")) is g
    hw = get_hardware("h100")
    assert get_hardware("h100").from_dict(hw.to_dict()).fused_attention


def test_search_prices_fused_attention_as_predict_does_by_enumeration():
    """The search's optimum on a fused-attention profile is the fastest of every layout by predict."""
    g = models.transformer_lm(d_model=32, d_ff=64, heads=2, d_kv=8, n_layers=2, vocab=32, batch=8, length=16)
    mesh, hw = "rows:2,cols:2", "h100"
    r = search(g, mesh, hardware=hw, memory_limit=math.inf, shard_weight_update=False, remat="none", regions=False)
    best = min(predict(g, mesh, lay, hardware=hw).time_s for lay in enumerate_layouts(g, mesh))
    assert r.cost.time_s == pytest.approx(best, rel=1e-9, abs=r.tolerance_s)
    assert r.cost.time_s == pytest.approx(predict(g, mesh, r.layout, hardware=hw).time_s, rel=1e-12)
