"""XLA does not duplicate an expensive element-wise producer into several fusions
(``InstructionFusion::ShouldFuse``: ``FusionWouldDuplicate`` and ``IsExpensive``): it computes it once,
into memory, where a cheap one is recomputed in each consumer. ``fusion.expensive`` and the fusion
marks (``Op.materialised``) follow it; checked against XLA's optimized HLO and by hand. A cheap one of
dtype bfloat16 XLA:CPU computes once too, and the marks say so (``fusion.UNDUPLICATED_DTYPES``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from autolayout import trace

FNS = {"exp": (jnp.exp, "exponential("), "tanh": (jnp.tanh, "tanh("), "neg": (jnp.negative, "negate("),
       "div_by_tensor": (lambda x: x / (x + 2.0), "divide(")}
EXPENSIVE = {"exp": True, "tanh": True, "neg": False, "div_by_tensor": True}


def _two_fusions(fn):
    """``y = fn(x)`` read by two element-wise ops, each feeding its own dot: ``y`` is fused into two
    fusions unless it is materialised."""
    def f(x, w, v):
        y = fn(x)
        return (y + 1) @ w, (y * 2) @ v
    return f


ARGS = (jnp.ones((64, 128)), jnp.ones((128, 32)), jnp.ones((128, 32)))


@pytest.mark.parametrize("name", list(FNS))
def test_xla_computes_an_expensive_producer_once_and_duplicates_a_cheap_one(name):
    fn, opcode = FNS[name]
    text = jax.jit(_two_fusions(fn)).lower(*ARGS).compile().as_text()
    assert text.count(opcode) == (1 if EXPENSIVE[name] else 2)


@pytest.mark.parametrize("name", list(FNS))
def test_graph_materialises_an_expensive_producer_of_two_fusions(name):
    fn, _ = FNS[name]
    g = trace(_two_fusions(fn), *ARGS, dims=("b k", "k n", "k n"))
    y, = [op for op in g.ops() if op.kind == "elementwise" and op.inputs and op.inputs[0] == "x"
          and op.output.shape == g.tensor("x").shape and len(g.consumers(op.name)) == 2]
    assert y.materialised == EXPENSIVE[name]


def test_expensive_producer_of_one_fusion_stays_fused_by_hand():
    """``exp(x)`` read twice inside one fusion (``e * e + e``) is not duplicated: it stays fused."""
    g = trace(lambda x, w: _one(x) @ w, *ARGS[:2], dims=("b k", "k n"))
    e, = [op for op in g.ops() if op.fn == "exp"]
    assert not e.materialised


def _one(x):
    e = jnp.exp(x)
    return e * e + e


# a cheap element-wise op (negation) read by two fusions, in each dtype: XLA duplicates it into both
# unless its dtype is bfloat16 (fusion.UNDUPLICATED_DTYPES)
DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_xla_computes_a_cheap_bfloat16_producer_of_two_fusions_once(dtype):
    args = tuple(a.astype(DTYPES[dtype]) for a in ARGS)
    text = jax.jit(_two_fusions(jnp.negative)).lower(*args).compile().as_text()
    assert text.count("negate(") == (1 if dtype == "bfloat16" else 2)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_graph_materialises_a_cheap_bfloat16_producer_of_two_fusions(dtype):
    args = tuple(a.astype(DTYPES[dtype]) for a in ARGS)
    g = trace(_two_fusions(jnp.negative), *args, dims=("b k", "k n", "k n"))
    y, = [op for op in g.ops() if op.fn == "neg"]
    assert y.materialised == (dtype == "bfloat16")


def test_cheap_bfloat16_producer_of_one_fusion_stays_fused_by_hand():
    """``-x`` in bfloat16 read twice inside one fusion (``y * y + y``) is computed there: fused."""
    def f(x, w):
        y = -x
        return (y * y + y) @ w
    g = trace(f, *(a.astype(jnp.bfloat16) for a in ARGS[:2]), dims=("b k", "k n"))
    y, = [op for op in g.ops() if op.fn == "neg"]
    assert not y.materialised


def test_search_holds_a_written_bfloat16_producer_as_predict_does():
    """The search's live sets size the bf16 bias add XLA writes once (read by the ReLU and its backward
    select) as ``predict`` does, for every layout of the bf16 MLP on the benchmark's mesh, with and without
    its parameters' storage sharded (``storage_variants.search_peaks``; on XLA:CPU, which also holds the
    dots' bf16 operands in float32)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import memory_vs_xla as bench
    from storage_variants import search_peaks

    from autolayout.core import Mesh
    from autolayout.costmodel.profiles import get_hardware
    from autolayout.search import enumerate_layouts

    g, _ = bench.linen_bf16_mlp()
    add, = [op for op in g.ops() if op.fn == "add" and op.inputs[0].startswith("dot_general")
            and len(g.consumers(op.name)) == 2]
    assert add.materialised and add.output.dtype == "bfloat16"
    mesh = Mesh.parse(bench.MESH)
    search_peaks(g, mesh, get_hardware("cpu"), list(enumerate_layouts(g, mesh)))
