"""Element-wise identities (``fusion.identity``): XLA's AlgebraicSimplifier replaces ``A * 1`` and
``A + 0`` by ``A``, so such an op takes no buffer and its readers read its operand, even where a
dot reads it (where an element-wise op would otherwise be materialised). Checked against XLA's
optimized HLO and ``memory_analysis()``, and by hand.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from autolayout import execute, trace
from autolayout.fusion import identity

B, K, N = 64, 8, 4096  # dy [B, N] is 1 MiB; x [B, K] and the result [K, N] are small
F32 = 4

FNS = {
    "times_one": (lambda dy: dy * 1.0, True),
    "one_times": (lambda dy: 1.0 * dy, True),
    "plus_zero": (lambda dy: dy + 0.0, True),
    "times_two": (lambda dy: dy * 2.0, False),
    "plus_one": (lambda dy: dy + 1.0, False),
    "times_ones_row": (lambda dy: dy * jnp.ones((N,)), True),
    "times_ones_but_one": (lambda dy: dy * np.r_[0.5, np.ones(N - 1)].astype(np.float32), False),
}


def _step(fn):
    def f(x, dy):
        return x.T @ fn(dy)
    return f


ARGS = (jnp.ones((B, K), jnp.float32), jnp.ones((B, N), jnp.float32))


@pytest.mark.parametrize("name", list(FNS))
def test_identity_is_the_element_wise_op_xla_removes(name):
    fn, removed = FNS[name]
    text = jax.jit(_step(fn)).lower(*ARGS).compile().as_text()
    xla_removed = "multiply(" not in text and " add(" not in text
    assert xla_removed == removed
    g = trace(_step(fn), *ARGS)
    op, = [o for o in g.ops() if o.kind == "elementwise"]
    assert identity(op) == removed
    assert op.materialised == (not removed)  # read by a dot: materialised unless XLA removes it


def test_identity_read_by_a_dot_takes_no_memory_as_in_xla():
    """``x.T @ (dy * 1.0)``: XLA's dot reads ``dy`` itself (no temp); the model's peak is the
    arguments and the output, not a third 1 MiB buffer for ``dy * 1.0`` (2230272 bytes before)."""
    g = trace(_step(FNS["times_one"][0]), *ARGS)
    ex = execute(g, "d:8", "", args=ARGS, repeats=1, reference=False)
    xla = ex.xla_memory
    assert xla["temp"] == 0
    assert ex.predicted.memory_bytes == (B * K + B * N + K * N) * F32
    assert ex.predicted.memory_bytes == xla["argument"] + xla["output"] + xla["temp"] - xla["alias"]


def test_identity_of_a_huge_abstract_step_compares_the_literal_not_its_broadcast():
    """The cotangent ``dy * 1`` of a loss ``sum(y * dy)`` whose one is broadcast to a 2^37-element
    shape (an abstract GPT-3-sized activation): the rule reads the literal's one value; comparing
    the broadcast view would need a 128 GiB boolean array."""
    m, n = 1 << 19, 1 << 18

    def grad_w(w, x, dy):
        return jax.grad(lambda w: jnp.sum((x @ w) * dy))(w)

    g = trace(grad_w, jax.ShapeDtypeStruct((K, n), jnp.float32), jax.ShapeDtypeStruct((m, K), jnp.float32),
              jax.ShapeDtypeStruct((m, n), jnp.float32))
    ident = [o for o in g.ops() if identity(o)]
    assert [o.inputs for o in ident] == [("dy",)] and not ident[0].materialised


def _xent_grad_dot(x, w1, labels, w2):
    """optax's integer-label cross-entropy of ``tanh(x @ w1)``, its gradient read by a dot: the
    gradient of ``take_along_axis`` is a scatter-add into zeros, added to the softmax term."""
    import optax

    loss = lambda logits: optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum()  # noqa: E731
    return jax.grad(loss)(jnp.tanh(x @ w1)) @ w2


def test_a_scatter_add_into_zeros_is_computed_in_place_in_its_addition():
    """XLA's AlgebraicSimplifier rewrites ``A + scatter(0, I, U)`` as ``scatter(A, I, U)``: the
    optimized HLO's scatter reads the softmax term (so it runs after the forward pass, not at the
    start where its indices are ready) and no zeros of the logits' shape are written. The model
    fuses the scatter and its zeros into the addition (``fusion.scatter_into_zeros``): its peak is
    XLA's ``memory_analysis()`` (it had held the scatter's result and its zeros from the start:
    1.35 of it)."""
    from autolayout import predict
    from autolayout.costmodel.profiles import get_hardware
    from autolayout.fusion import scatter_into_zeros

    args = (jnp.ones((B, 32)), jnp.ones((32, 512)), jnp.zeros((B,), jnp.int32), jnp.ones((512, 16)))
    compiled = jax.jit(_xent_grad_dot).lower(*args).compile()
    entry = compiled.as_text().split("\nENTRY", 1)[1]
    (scatter,) = [line for line in entry.splitlines() if "scatter" in line.split("=", 1)[0]]
    operand = scatter.split("fusion(%", 1)[1].split(",", 1)[0]
    (producer,) = [line for line in entry.splitlines() if line.lstrip().startswith(f"%{operand} =")]
    assert "multiply" in operand and f"f32[{B},512]" in producer, (scatter, producer)  # the softmax term
    g = trace(_xent_grad_dot, *args, dims=("b d", "d v", "b", "v e"))
    (op,) = [op for op in g.ops() if op.kind == "scatter"]
    assert op.attr("into_zeros") and not op.materialised and not g.op(op.inputs[0]).materialised
    assert scatter_into_zeros(op, [g.op(c) for c in g.consumers(op.name)], set())
    m = compiled.memory_analysis()
    xla = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    assert abs(predict(g, "d:1", "", hardware=get_hardware("cpu")).memory_bytes / xla - 1) <= 0.02
