"""The shape XLA:CPU computes an element-wise op of contraction results in
(costmodel/reshapes.py) and what it decides: whether the op writes over an operand
(lifetimes.in_place_operand). Checked against ``memory_analysis()`` and the optimized HLO of the
programs the model traces.

Each program computes ``a`` and ``c``, two ``bld,df->blf`` contractions XLA runs as ``[b*l, d] x
[d, f]``, an element-wise ``v`` of them, and one ``blf,df->bld`` contraction of ``v``. Where
``ReshapeMover`` sinks the results' reshapes below ``v``, ``v`` is computed as ``[b*l, f]`` and written
over ``a`` or ``c``; where it cannot, ``v``'s fusion reads them through bitcasts and writes a buffer
of its own.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from autolayout import predict, trace
from autolayout.costmodel.lifetimes import in_place_operand, readers_of
from autolayout.costmodel.order import memory_order
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.reshapes import hlo_groups

B, L, D, F = 4, 64, 64, 128
CPU = get_hardware("cpu")

VALUES = {  # name: (v of a, c; whether XLA computes v as [b*l, f] and writes it over an operand)
    "product": (lambda a, c: a * c, True),
    "select": (lambda a, c: jnp.where(a > 0, c, 0.0), True),
    "relu-of-transposed": (lambda a, c: jnp.maximum(jnp.swapaxes(a, 0, 1), 0.0).swapaxes(0, 1) * c, True),
    "swiglu": (lambda a, c: a * jax.nn.sigmoid(a) * c, False),  # a is read by the logistic and the product
    "biased": (lambda a, c: (a + jnp.arange(F, dtype=jnp.float32)) * c, False),  # the [f] operand blocks the sink
}


def _fn(value):
    def fn(x, w1, w2, w3):
        a = jnp.einsum("bld,df->blf", x, w1)
        c = jnp.einsum("bld,df->blf", x, w2)
        return jnp.einsum("blf,df->bld", value(a, c), w3)
    return fn


def _args():
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    return tuple(jax.random.normal(k, s, jnp.float32) for k, s in zip(ks, [(B, L, D), (D, F), (D, F), (D, F)]))


@pytest.mark.parametrize("name", list(VALUES), ids=list(VALUES))
def test_xla_cpu_computes_v_collapsed_only_where_the_reshapes_sink(name):
    """The optimized HLO: v's fusion writes ``[b*l, f]`` from 2-D operands (no bitcast in its name)
    or is a ``*_bitcast_fusion`` reading them through bitcasts; its temp is two ``[b*l, f]``
    buffers (v over an operand) or three."""
    value, collapsed = VALUES[name]
    compiled = jax.jit(_fn(value)).lower(*_args()).compile()
    entry = compiled.as_text()[compiled.as_text().index("ENTRY"):]
    reader = re.search(r"%ynn_fusion\S* = f32\[256,64\]\S* fusion\(%(\S+), %w3", entry)
    assert reader, entry
    assert ("bitcast" not in reader.group(1)) == collapsed, entry
    buffer = B * L * F * 4
    assert compiled.memory_analysis().temp_size_in_bytes // buffer == (2 if collapsed else 3)


@pytest.mark.parametrize("name", list(VALUES), ids=list(VALUES))
def test_model_writes_v_over_an_operand_only_where_xla_computes_it_collapsed(name):
    """The model on XLA:CPU's order: v's grouping is the contractions' (``(b, l), (f)``) where the
    reshapes sink, else one group per dim, and v takes an operand's buffer only in the first case;
    its peak is XLA's figure, to the 16 bytes XLA counts beyond it."""
    value, collapsed = VALUES[name]
    args = _args()
    g = trace(_fn(value), *args)
    view = memory_order(g, CPU)
    v = g.op("out").inputs[0]
    groups = hlo_groups(view)
    assert (set(groups[v]) == set(groups["dot_general_0"])) == collapsed, groups[v]
    assert (in_place_operand(view, v, readers_of(view)) is not None) == collapsed
    m = jax.jit(_fn(value), keep_unused=True).lower(*args).compile().memory_analysis()
    xla = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    assert 0 <= xla - predict(g, "data:1", "", hardware=CPU).memory_bytes <= 16


def _scan_fn(xs, w, w2):
    """A scan whose body reads its slice x of xs in a contraction (XLA writes the slice for it) and
    in an element-wise ``m = 3 x``, whose last reader is a second contraction."""
    def body(c, x):
        return c + x @ w + (x * 3.0) @ w2, None
    out, _ = jax.lax.scan(body, jnp.zeros((256, 128)), xs)
    return out


def test_an_element_wise_op_does_not_write_over_a_scan_slice():
    """The optimized HLO: the slice is written for the dot (``dynamic-slice_bitcast_fusion``) and
    ``m``'s fusion reads the stacked input, not that buffer, so it cannot write over it; the model
    (on XLA:CPU's order) writes ``m`` over no operand, and its peak is XLA's figure to the 68 bytes
    of the loop's counters XLA counts beyond it."""
    args = (jnp.ones((4, 256, 128)), jnp.ones((128, 128)), jnp.ones((128, 128)))
    compiled = jax.jit(_scan_fn, keep_unused=True).lower(*args).compile()
    text = compiled.as_text()
    mul = re.search(r"%broadcast_multiply_fusion\S* = f32\[256,128\]\S* fusion\(([^)]*)\)", text)
    assert mul and "dynamic-slice" not in mul.group(1) and re.search(r"%dynamic-slice_bitcast_fusion\S* = ", text)
    g = trace(_scan_fn, *args)
    view = memory_order(g, CPU)
    (lp,) = view.loops.values()
    (m,) = [n for n in lp.body if view.op(n).fn == "mul"]
    assert view.op(view.op(m).inputs[0]).fn == "slice"
    assert in_place_operand(view, m, readers_of(view)) is None
    ma = compiled.memory_analysis()
    xla = ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes - ma.alias_size_in_bytes
    assert 0 <= xla - predict(g, "data:1", "", hardware=CPU).memory_bytes <= 68
