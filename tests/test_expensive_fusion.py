"""XLA does not duplicate an expensive element-wise producer into several fusions
(``InstructionFusion::ShouldFuse``: ``FusionWouldDuplicate`` and ``IsExpensive``): it computes it once,
into memory, where a cheap one is recomputed in each consumer. ``fusion.expensive`` and the fusion
marks (``Op.materialised``) follow it; checked against XLA's optimized HLO and by hand.
"""
from __future__ import annotations

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
