"""Which tensors XLA keeps out of memory: the loop fusion rule the graph marks on every op
(``Op.hbm``), the element-wise ops XLA counts expensive, and the on-chip attr of a fused
kernel's internal tensors. :class:`~autolayout.graph.Graph` applies :func:`with_fusion` to its
ops when it is built; the cost model reads the result (``Op.materialised``).
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["ON_CHIP", "EXPENSIVE_ELEMENTWISE", "UNDUPLICATED_DTYPES", "expensive", "identity", "duplicable",
           "scatter_into_zeros", "topological", "with_fusion"]


# Op attr marking a tensor a fused kernel keeps on chip (never written to HBM), whatever its
# consumers: set by autolayout.costmodel.attention for the score tensors of fused attention.
ON_CHIP = "on_chip"


# the element-wise ops of XLA's InstructionFusion::IsExpensive (openxla/xla
# xla/service/instruction_fusion.cc) by the tracer's names (autolayout/_interpret.py)
EXPENSIVE_ELEMENTWISE = frozenset({
    "exp", "expm1", "log", "log1p", "logistic", "tanh", "rsqrt", "sqrt", "cbrt", "pow", "erf", "div", "atan2",
    "acos", "asin", "acosh", "asinh", "atanh", "cosh", "rem"})


def expensive(op: Any) -> bool:
    """Whether XLA counts elementwise ``op`` expensive (``InstructionFusion::IsExpensive``):
    transcendental functions and float divisions, except a division by a constant, which XLA's
    algebraic simplifier turns into a multiplication by its reciprocal (a divisor that is not a
    graph tensor is a literal)."""
    if op.fn not in EXPENSIVE_ELEMENTWISE or "float" not in op.output.dtype:
        return False
    return op.fn != "div" or len(op.inputs) >= 2


def identity(op: Any) -> bool:
    """Whether element-wise ``op`` is its one tensor operand unchanged: a multiplication by a
    literal one or an addition of a literal zero, of the output's shape and dtype. XLA's
    ``AlgebraicSimplifier`` replaces such an op by its operand (``A*1 => A``, ``A+0 => A``,
    openxla/xla ``xla/hlo/transforms/simplifiers/algebraic_simplifier.cc``), so it takes no
    buffer and its readers read the operand (a loss ``sum(y * dy)``'s cotangent ``dy * 1``;
    ``tests/test_fusion.py``: the optimized HLO's dot reads the parameter)."""
    if op.kind != "elementwise" or op.fn not in ("mul", "add") or op.replay is None or len(op.inputs) != 1:
        return False
    lits = [o[1] for o in op.replay.operands if o[0] == "literal"]
    tens = [o for o in op.replay.operands if o[0] == "tensor"]
    if len(lits) != 1 or len(tens) != 1 or op.input_shapes[0] != op.output.shape:
        return False
    if op.input_dtypes and op.input_dtypes[0] != op.output.dtype:
        return False
    value = np.asarray(lits[0])  # a scalar broadcast to the op's shape: compare its one element, not the view
    value = value[tuple(0 if stride == 0 else slice(None) for stride in value.strides)]
    return bool(np.all(value == (1 if op.fn == "mul" else 0)))


def duplicable(op: Any) -> bool:
    """Whether XLA may duplicate element-wise ``op`` into several fusions whatever its consumers
    (``InstructionFusion::ComputeGloballyUnfusible``, openxla/xla
    ``xla/service/instruction_fusion.cc``): it is effectively at most unary (at most one operand
    of the output's true rank, the number of its dims of size > 1; a value of fewer dims is read
    through a broadcast, which does not count), or its distinct operands have no more elements
    than its output, so a copy of it in each fusion reads no more than the fusions would read of
    its output. Any other op is duplicated only where every consumer can fuse it."""
    rank = sum(d.size > 1 for d in op.output.shape)
    full = [i for i, s in zip(op.inputs, op.input_shapes) if sum(d.size > 1 for d in s) >= rank]
    if len(set(full)) <= 1:
        return True
    sizes = {i: math.prod(d.size for d in s) for i, s in zip(op.inputs, op.input_shapes)}
    return sum(sizes.values()) <= math.prod(d.size for d in op.output.shape)


# the dtypes (numpy names) of the cheap element-wise ops XLA computes once, into memory, where several
# fusions read them, not duplicated into each (:func:`with_fusion`; float16 is duplicated, like float32)
UNDUPLICATED_DTYPES = ("bfloat16",)


def topological(ops: Sequence[Any], by_name: Mapping[str, Any]) -> list[Any]:
    """``ops`` with every op after its inputs' producers (their order kept where it already is
    one; a rewritten graph, such as a fused attention kernel's, may list a producer late)."""
    out: list[Any] = []
    done: set[str] = set()
    for root in ops:
        stack = [(root, False)]
        while stack:
            op, expanded = stack.pop()
            if op.name in done:
                continue
            if expanded:
                done.add(op.name)
                out.append(op)
                continue
            stack.append((op, True))
            stack.extend((by_name[i], False) for i in reversed(op.inputs) if i in by_name and i not in done)
    return out


def reduction(op: Any) -> bool:
    """Whether ``op`` is a reduction XLA fuses its element-wise producers into (a reduce, or an
    einsum of one operand, which lowers to one)."""
    return op.kind == "reduce" or (op.kind == "einsum" and len(op.inputs) == 1)


def scatter_into_zeros(op: Any, users: Sequence[Any], outputs: set) -> bool:
    """Whether ``op`` is a scatter-add into zeros (``Op.attr("into_zeros")``, set by the tracer)
    whose one reader is an addition of its shape in its loop, and not a graph output: XLA's
    ``AlgebraicSimplifier`` rewrites ``A + scatter(0, I, U)`` as ``scatter(A, I, U)``, written in
    place over ``A`` (optax's integer-label cross-entropy gradient: ``take_along_axis``'s
    transpose added to the softmax term is one ``wrapped_scatter`` reading the softmax term;
    ``tests/test_fusion.py``, against the optimized HLO), so the scatter and its zeros take no
    buffer: the addition's is the one written."""
    if not (op.kind == "scatter" and op.attr("into_zeros") and op.name not in outputs and len(users) == 1):
        return False
    (u,) = users
    return (u.kind == "elementwise" and u.fn in ("add", "add_any") and u.loop == op.loop
            and u.output.dim_names == op.output.dim_names)


def with_fusion(ops: Sequence[Any], outputs: set) -> list[Any]:
    """Mark which tensors live in HBM. An elementwise op's output stays in registers/VMEM
    (is fused into its consumers, as XLA's loop fusion does) when every consumer is an
    elementwise op of the same loop and it is not a graph output (an :func:`identity` is never
    materialised, whatever its consumers: XLA reads its operand instead), unless it is
    :func:`expensive` and would be fused into more than one materialised op: XLA does not
    duplicate an expensive producer into several fusions (openxla/xla
    ``xla/service/instruction_fusion.cc``, ``InstructionFusion::ShouldFuse``: a fusion that
    ``FusionWouldDuplicate`` an ``is_expensive`` producer is refused), so it computes it once,
    into memory, where a cheap one is recomputed in each (``tests/test_expensive_fusion.py``,
    against the optimized HLO). A scan body's slice of a stacked input (``reshape.slice``) is
    fused the same way: XLA reads it with a ``dynamic-slice`` inside the ``while`` body and fuses
    that into the loop fusions of its element-wise consumers (measured in XLA:CPU's optimized HLO
    of ``transformer_lm``'s and ``llama``'s training steps: ``subtract_dynamic-slice_fusion``,
    ``multiply_reduce_fusion`` reading the stacked buffer at the iteration's index), and
    materialises it (``dynamic-slice_bitcast_fusion``) only for other consumers, such as a dot.

    A :func:`reduction` fuses its element-wise producers too: XLA:CPU (jax 0.10.2) runs a reduce
    as a YNNPACK custom fusion (``ynn_fusion``, ``kind=kCustom``) that takes in the element-wise
    chain it reads, broadcasts included, so ``sum(x * 2 + 1)`` writes no temporary. A value such
    a fusion reads and another fusion reads too is computed once, into memory (the others
    recompute nothing), and a scan's slice a reduction reads is written at the slice's size
    (a ``dynamic-slice`` is not taken in). Measured by ``benchmarks/xla_cpu_reductions.py``
    (the optimized HLO's large buffers of 11 small programs: this rule agrees on 8, the rule
    without reductions on 3) and ``tests/test_xla_cpu_reductions.py``.
    That holds where the reduction is a YNNPACK fusion, which takes in the chain it reads but
    shares no value with another fusion. XLA:CPU makes one only where the reduction or its operand
    has at least 4096 elements on a device (``costmodel.broadcasts.YNN_MIN_ELEMENTS``); below, it
    is one of XLA's loop fusions, into which a cheap value that XLA may duplicate
    (:func:`duplicable`) is fused like into any other, and a scan's slice is read in place (the
    ``dynamic-slice`` taken in: ``dynamic-slice_reduce_fusion``), so nothing is written. Such a
    value or slice is marked ``Op.reduction_shared``; the layout decides
    (``costmodel/recomputed.py``; the slice: ``tests/test_recomputed.py``, against the while
    body of the optimized HLO at 4096 and 2048 elements).
    A cheap element-wise op of dtype bfloat16 (:data:`UNDUPLICATED_DTYPES`) is not duplicated
    either: where it would be fused into more than one materialised op, XLA computes it once, into
    memory, in bfloat16 (measured in the optimized HLO of XLA:CPU, jax 0.10.2: ``y = -x`` read by
    two fusions that each feed a dot is one ``negate_convert_fusion`` writing ``bf16``, where in
    float16 and float32 each fusion recomputes it; a bias add after a bfloat16 dot, read by a ReLU
    and by its backward select, is one ``add_convert_fusion``: ``tests/test_expensive_fusion.py``;
    XLA:GPU's optimized HLO of the bfloat16 ``mlp-small`` of ``reports/gpu`` writes that add,
    ``loop_add_fusion``, for its three readers too).
    A scatter-add into zeros that one addition reads is computed in that addition, with its
    zeros (:func:`scatter_into_zeros`). A tensor whose op has the :data:`ON_CHIP` attr stays on
    chip too (a fused kernel's internal tensor) unless it is a graph output; everything else is
    materialised."""
    users: dict[str, list[Any]] = defaultdict(list)
    for op in ops:
        for i in op.inputs:
            users[i].append(op)
    by_name = {op.name: op for op in ops}

    def materialized(name: str) -> bool:
        op = by_name[name]
        if name in outputs:
            return True
        if op.attr(ON_CHIP):
            return False
        if op.name in into_adds or (op.fn == "fill" and users.get(name) and all(
                u.name in into_adds and u.inputs[0] == name for u in users[name])):
            return False  # a scatter-add into zeros computed in place in its addition, and its zeros
        if op.kind != "elementwise" and not (op.kind == "reshape" and op.fn == "slice"):
            return True
        if name in identities:
            return False
        us = users.get(name, [])
        return not us or any(not (u.kind == "elementwise" or reduction(u)) or u.loop != op.loop for u in us)

    identities = {op.name for op in ops if identity(op)}
    into_adds = {op.name for op in ops if scatter_into_zeros(op, users.get(op.name, []), outputs)}
    mat: dict[str, bool] = {}
    shared: set[str] = set()  # written only for a reduction fusion: Op.reduction_shared
    sinks: dict[str, frozenset] = {}  # the materialised ops a fused value is computed in
    for op in reversed(topological(ops, by_name)):  # consumers first
        m = materialized(op.name)
        if not m:
            into = frozenset().union(*(({u.name} if mat[u.name] else sinks[u.name]) for u in users[op.name]))
            # XLA does not duplicate an expensive producer into several fusions
            # (InstructionFusion::ShouldFuse: FusionWouldDuplicate && is_expensive), nor a value
            # a reduction fusion reads beside another fusion: it is computed once, into memory;
            # a slice a reduction reads is written at its size (docstring)
            reduced = any(reduction(by_name[u]) for u in into)
            # nor a cheap bfloat16 one: written once, whatever reads it (docstring)
            written_once = len(into) > 1 and op.kind == "elementwise" and op.output.dtype in UNDUPLICATED_DTYPES
            m = not op.attr(ON_CHIP) and ((len(into) > 1 and (expensive(op) or reduced or written_once))
                                          or (reduced and op.kind == "reshape"))
            if m and not written_once and ((op.kind == "elementwise" and not expensive(op) and duplicable(op))
                                           or op.kind == "reshape"):
                shared.add(op.name)  # for the reduction only: recomputed (a slice read in place) below YNN's size
            sinks[op.name] = into
        mat[op.name] = m
    def read(name: str) -> bool:  # an identity's reader reads its operand from memory
        while name in identities:
            name = by_name[name].inputs[0]
        return mat[name]

    return [dataclasses.replace(op, hbm=tuple(read(i) for i in op.inputs) + (mat[op.name],),
                                reduction_shared=op.name in shared) for op in ops]
