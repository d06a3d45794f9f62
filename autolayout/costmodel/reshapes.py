"""The shape XLA computes each tensor of a step in: a named-dim graph has one shape per tensor,
XLA a contraction's result collapsed as its dot computes it, and the element-wise ops that
read such results computed in that collapsed shape or through a bitcast. Which one decides
whether a dot operand copy reads a value or recomputes it (:mod:`autolayout.costmodel.copies`)
and whether an element-wise op can write over its operand
(:func:`~autolayout.costmodel.lifetimes.in_place_operand`).
"""
from __future__ import annotations

from functools import lru_cache

from autolayout.costmodel.dotcopy import canonical_dims
from autolayout.graph import Graph

__all__ = ["hlo_groups"]


@lru_cache(maxsize=256)
def hlo_groups(graph: Graph, split: frozenset[str] = frozenset()) -> dict[str, tuple[tuple[str, ...], ...]]:
    """For every tensor, its dims (of size > 1) grouped as the array XLA computes it in, where the
    layout splits a dim that each contraction of ``split`` contracts.

    A contraction's output is ``dot_general``'s after ``DotDecomposer`` collapsed its operands
    (each batch dim, the lhs's free dims as one, the rhs's as one), reshaped to the graph's dims
    after it. XLA's ``ReshapeMover`` sinks such reshapes (and transposes) below element-wise ops,
    pass after pass: an op is computed in the collapsed grouping, in its operand's order, where
    every operand of its rank is such a reshape of one grouping with the op's dims, its other
    operands are scalars, and every reader of each reshaped operand is sunk too (a reshape is not
    duplicated: an operand with another reader, or that is a graph output or a loop's carried
    value, keeps every reader in its own dims). Anything else is computed in its own dims, one
    group per dim. Measured (XLA:CPU, jax 0.10.2, the optimized HLO of ``tests/test_copies.py``
    and ``tests/test_reshapes.py``):
    ``where(a > 0, c, 0)`` and ``a * c`` of two ``bld,df->blf`` dots are computed as ``[b*l, f]``;
    not with a bias ``[f]`` added to ``a``, nor with an argument ``[b, l, f]`` for ``c``, nor where
    ``a`` is also read by an op that does not sink in the same pass (``a * logistic(a) * c``).

    A contraction of ``split`` (:func:`~autolayout.costmodel.copies.splits_contraction`) writes
    partial sums that an all-reduce or reduce-scatter reads reshaped to the graph's dims, and
    ``ReshapeMover`` sinks no reshape past a collective: its result is computed in its own dims.
    Measured (XLA:CPU, jax 0.10.2, the MLP block of ``tests/test_copies.py`` under ``shard_map``
    with ``d`` split, and the transformer's ReLU backward under ``d_model:model``): the
    all-reduce's operand is ``bitcast(ynn_fusion)`` to ``[b, l, f]`` and the select reading both
    psums is a ``select_bitcast_fusion`` of 3-D operands."""
    full = {d.name: d.size for op in graph.ops() for d in op.dims}
    kept = {o.tensor for o in graph.outputs if o.tensor} | {n for lp in graph.loops.values() for _, n in lp.carries}
    own = {op.name: tuple((d.name,) for d in op.output.shape if full[d.name] > 1) for op in graph.ops()}
    sunk: dict[str, tuple[tuple[str, ...], ...]] = {}  # tensors XLA computes collapsed, as a reshape's operand
    for op in graph.ops():
        if op.kind == "einsum" and len(op.inputs) == 2 and op.name not in split:
            batch, lhs, _ = canonical_dims(op, 0, full)
            rhs = canonical_dims(op, 1, full)[1]
            groups = tuple((d,) for d in batch) + tuple(tuple(g) for g in (lhs, rhs) if g)
            if [g[0] for g in own[op.name]] == batch + lhs + rhs and groups != own[op.name]:
                sunk[op.name] = groups

    def candidate(op) -> tuple[tuple[str, ...], ...] | None:
        if op.kind != "elementwise" or op.name in sunk:
            return None
        ranks = [sum(full[d.name] > 1 for d in s) for s in op.input_shapes]
        dims = sorted(g[0] for g in own[op.name])
        groups = {sunk.get(i) if sorted(d.name for d in s if full[d.name] > 1) == dims else None
                  for i, s, r in zip(op.inputs, op.input_shapes, ranks) if r}
        if len(groups) != 1 or None in groups or any(r and r != len(dims) for r in ranks):
            return None
        return groups.pop()

    changed = True
    while changed:  # one ReshapeMover pass per round, to a fixed point
        cands = {op.name: g for op in graph.ops() if (g := candidate(op)) is not None}
        dropped = True
        while dropped:  # a reshape with a reader that does not sink stays where it is
            dropped = False
            for n in list(cands):
                if any(i in sunk and (i in kept or any(c not in cands for c in graph.consumers(i)))
                       for i in graph.op(n).inputs):
                    del cands[n]
                    dropped = True
        sunk.update(cands)
        changed = bool(cands)
    return {**own, **sunk}
