"""transformer_lm(parallel_layers=True): PaLM's parallel attention and MLP (Chowdhery et al.
2022, §2) traced, searched, executed on 8 CPU devices against jax.jit, and what the cost
model makes of its tensor-parallel all-reduces (counted by hand)."""
from __future__ import annotations

import math

import pytest

from autolayout import models
from autolayout.core import Layout
from autolayout.costmodel import predict
from autolayout.exec import execute
from autolayout.search import search

SIZES = dict(d_model=16, d_ff=32, heads=8, d_kv=8, n_layers=2, vocab=32, batch=8, length=8)
FAST = {"xla_backend_optimization_level": 0}


def graph(parallel: bool):
    return models.transformer_lm(**SIZES, parallel_layers=parallel)


def test_parallel_layers_have_one_layer_norm():
    seq, par = graph(False), graph(True)
    names = {t.name for t in par.params()}
    assert "layers/ln1_scale" in names and "layers/ln2_scale" not in names
    # one layer norm's scale and bias fewer per layer, by hand
    assert seq.num_params() - par.num_params() == SIZES["n_layers"] * 2 * SIZES["d_model"]
    # the same matmuls: same model flops
    assert predict(seq, "x:1", None).model_flops == predict(par, "x:1", None).model_flops


@pytest.mark.parametrize("mesh,layout", [
    ("rows:4,cols:2", "batch:rows;heads:cols;d_ff:cols"),           # Megatron tensor parallelism
    ("rows:4,cols:2", Layout("batch:rows;heads:cols;d_ff:cols").with_remat("full")),
    ("rows:2,cols:4", "batch:rows,cols|*:rows,cols@3"),               # FSDP
])
def test_parallel_layers_execute_like_jit_with_the_predicted_collectives(mesh, layout):
    ex = execute(graph(True), mesh, layout, repeats=1, compiler_options=FAST)
    assert ex.max_abs_error <= 1e-4, ex.summary()
    assert ex.collectives_match, f"{ex.summary()}\n{ex.collective_diff()}"


def test_parallel_layers_search():
    g = graph(True)
    r = search(g, "rows:4,cols:2", hardware="tpu-v4", memory_limit=math.inf, time_limit_s=120)
    assert r.status == "OPTIMAL"
    assert r.cost.time_s == pytest.approx(predict(g, "rows:4,cols:2", r.layout, hardware="tpu-v4").time_s,
                                          rel=1e-12)


def tp_all_reduces(g, remat):
    lay = Layout("batch:rows;heads:cols;d_ff:cols").with_remat(remat)
    c = predict(g, "rows:4,cols:2", lay, hardware="tpu-v4")
    return sorted(col.op for col in c.collectives if col.kind == "all-reduce" and col.mesh_axes == ("cols",))


@pytest.mark.parametrize("remat", ["", "full"])
def test_tensor_parallel_all_reduces_per_layer_by_hand(remat):
    """Per layer, each contraction over a split dim reduces its output: forward the attention
    output (over heads) and the MLP output (over d_ff); backward the input gradients through
    wq, wk, wv (over heads) and w1 (over d_ff): 6 for both. Full remat adds the recomputed
    attention output for sequential layers (the second layer norm reads x + attention) but
    nothing for parallel ones (the backward reads neither branch's output). The sum of the
    two branches before one all-reduce (Megatron, PaLM) is not modelled: each contraction
    reduces its own output."""
    seq, par = tp_all_reduces(graph(False), remat), tp_all_reduces(graph(True), remat)
    assert len(seq) == (7 if remat == "full" else 6)
    assert len(par) == 6
    assert not [op for op in par if op.startswith("remat/")]
