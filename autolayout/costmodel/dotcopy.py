"""The operand copies XLA:CPU makes around a contraction, which a named-dim graph cannot see.

The graph is order-free: a transpose is a view, and an einsum's operands are priced as
read in place. XLA:CPU runs every ``dot_general`` as ``[batch, M, K] x [batch, K, N]``
(openxla/xla ``xla/service/dot_decomposer.cc`` canonicalises each operand to batch dims,
then free dims, then contracting dims, with transposes; the dot emitter takes a
2-D operand either way round). An operand whose dims are already in that order (or,
with a single free and a single contracting dim, in the swapped order: a layout-only
transpose) is read in place; any other is first copied into that order, a memory-bound
kernel that reads and writes the operand once. On the MoE model's expert einsums
(``becd,edf->becf``: batch dim ``e`` not leading) that copy costs as much as the matmul
itself (``benchmarks/einsum_layout.py``); the rule below matches XLA's optimized HLO of
every contraction of the ``moe`` and ``transformer_lm`` models (``tests/test_costmodel.py``).

:func:`~autolayout.costmodel.rules.price` adds ``copy_bytes / hbm_bandwidth`` to the
compute of a contraction on a profile with ``Hardware.dot_operand_copies`` (calibrated
CPU profiles); the datasheet profiles keep it off.
"""
from __future__ import annotations

import math
from typing import Mapping

from autolayout.graph import Op

__all__ = ["copied_operands", "canonical_dims", "accepted_orders", "copy_bytes", "operand_copy_elements"]


def copied_operands(op: Op, local: Mapping[str, int]) -> tuple[int, ...]:
    """Indices of the two operands of contraction ``op`` that XLA:CPU copies before the dot.

    ``local`` gives each dim's size on one device; dims of size 1 take no place in the
    order and are ignored. The graph records the dot's output as XLA's ``dot_general``
    gives it, ``batch + lhs free + rhs free``, so its order names the batch dims in the
    dot's order; the contracting dims are in the lhs's order (the rhs must match it).
    An operand is read in place when, after its leading batch dims, it is ``free +
    contracting`` (lhs) or ``contracting + free`` (rhs), or the two swapped where each is
    a single dim.

    Raises:
        ValueError: ``op`` is not a contraction of two operands.
    """
    if op.kind != "einsum" or len(op.inputs) != 2:
        raise ValueError(f"copied_operands: {op.name!r} is a {op.kind} of {len(op.inputs)} input(s), not a "
                         "contraction of two operands")
    return tuple(i for i, s in enumerate(op.input_shapes)
                 if tuple(d.name for d in s if local[d.name] > 1) not in accepted_orders(op, i, local))


def canonical_dims(op: Op, i: int, sizes: Mapping[str, int]) -> tuple[list[str], list[str], list[str]]:
    """``(batch, free, contracting)``: the dims of size > 1 (``sizes``) of operand ``i`` of
    contraction ``op`` in the three groups of XLA's canonical dot (``DotDecomposer``), batch and
    free dims in the output's order, contracting dims in the lhs's."""
    shapes = [[d.name for d in s if sizes[d.name] > 1] for s in op.input_shapes]
    out = [d.name for d in op.output.shape if sizes[d.name] > 1]
    batch = [d for d in out if d in shapes[0] and d in shapes[1]]
    contract = [d for d in shapes[0] if d in shapes[1] and d not in out]
    free = [d for d in out if d in shapes[i] and d not in batch]
    return batch, free, contract


def accepted_orders(op: Op, i: int, local: Mapping[str, int]) -> frozenset[tuple[str, ...]]:
    """The orders of the dims of size > 1 (``local``) of operand ``i`` of contraction ``op`` that
    XLA:CPU's dot reads in place (:func:`copied_operands`): batch dims in the output's order,
    then ``free + contracting`` (lhs) or ``contracting + free`` (rhs), or the two swapped where
    each is a single dim. An operand in any other order is copied into the first of them."""
    batch, free, contract = canonical_dims(op, i, local)
    canonical = free + contract if i == 0 else contract + free
    swapped = contract + free if i == 0 else free + contract
    orders = {tuple(batch + canonical)}
    if len(free) <= 1 and len(contract) <= 1:
        orders.add(tuple(batch + swapped))
    return frozenset(orders)


def copy_bytes(op: Op, local: Mapping[str, int]) -> int:
    """Bytes one device reads and writes copying the operands :func:`copied_operands` names
    (each read once and written once, at its dtype)."""
    dtypes = op.input_dtypes or (op.output.dtype,) * len(op.inputs)
    return sum(2 * math.prod(local[d.name] for d in op.input_shapes[i]) * _itemsize(dtypes[i])
               for i in copied_operands(op, local))


def operand_copy_elements(op: Op, local: Mapping[str, int]) -> tuple[int, ...]:
    """Per operand of contraction ``op``, the elements of the copy XLA:CPU makes of it on one
    device (0: read in place, :func:`copied_operands`). Whether an operand is copied depends only
    on the local sizes of that operand's own dims, so the copy's size is a function of the
    operand's layout (the search's memory rows stay linear in the op's dims' assignment)."""
    copied = copied_operands(op, local)
    return tuple(math.prod(local[d.name] for d in s) if i in copied else 0
                 for i, s in enumerate(op.input_shapes))


def _itemsize(dtype: str) -> int:
    import numpy as np
    return np.dtype(dtype).itemsize
