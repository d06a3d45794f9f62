"""The orders of a step's schedule in the search: how a layout reduces its gradients.

On XLA:CPU the step's gradient all-reduces are one instruction that the optimizer updates wait
for, but only where the layout all-reduces some gradient (``costmodel.order.memory_order``): a
data-parallel layout's updates run after the last gradient. Where it reduce-scatters them only
(a ZeRO-2/3 layout over every axis it reduces on), XLA:CPU's combiner leaves each reduce-scatter
an instruction of its own, queued after its gradient's op; and where it reduces none (a
model-parallel layout), each update runs as soon as its gradient is ready. So a step has an
order per way of reducing the gradients (``gradients.REDUCTIONS``: ``"combined"``,
``"scattered"``, ``"none"``). ``predict`` walks the order of the layout it prices; the search
holds the live points of every order (``search.liveness.LivePoints``, each point guarded by the
orders that have it) and literals of the CP-SAT model, one per order, exactly one true: that of
the layout's own order (:func:`order_literals`). A row of a point that some orders lack is
enforced only under the literal of the orders that have it (:func:`enforce`), so every layout is
held to its own order's points and the search stays exact.

Which order a layout takes is ``gradients.gradient_reduction`` of its gradient ops' bytes: some
op's :func:`~autolayout.search.names.held` bytes (``reductions.ReductionBytes.held``: partial
sums waiting for an all-reduce) above 0: combined; else some op's
:func:`~autolayout.search.names.partial` bytes above 0: scattered; else none. Both are linear
expressions of the layout's choices (``LayoutModel.memory_expr``; storage options change them by
their deltas).
"""
from __future__ import annotations

from typing import Any

from ortools.sat.python import cp_model

from autolayout.costmodel.gradients import COMBINED, NONE, REDUCTIONS, SCATTERED, gradient_reducers
from autolayout.costmodel.phases import phased_reductions
from autolayout.search.names import held, partial

__all__ = ["order_literals", "order_literal", "enforce"]


def _any_positive(lm: Any, names_of, label: str) -> Any:
    """A literal of ``lm``'s model true exactly where, for some gradient op ``o``, the bytes of
    ``names_of(o)`` are above 0 (a ``cp_model`` constant where the layout decides nothing)."""
    m = lm.model
    lits = []
    for o in sorted(o for ops in gradient_reducers(lm.tables.graph).values() for o in ops):
        names = names_of(o)
        if not names:
            continue
        vars_, coefs, const = lm.memory_expr(names)
        if not vars_:
            if const > 0:  # under every layout
                lits.append(m.NewConstant(1))
            continue
        b = m.NewBoolVar(f"{label} {o}")
        total = cp_model.LinearExpr.WeightedSum(vars_, coefs) + const
        m.Add(total >= 1).OnlyEnforceIf(b)
        m.Add(total == 0).OnlyEnforceIf(b.Not())
        lits.append(b)
    r = m.NewBoolVar(label)
    if lits:
        m.AddMaxEquality(r, lits)
    else:
        m.Add(r == 0)
    return r


def order_literals(lm: Any) -> dict[str, Any]:
    """The literals of ``lm`` (a ``search.model.LayoutModel``), one per way of reducing the
    gradients (``gradients.REDUCTIONS``), true exactly for the layout's own (module docstring);
    made once per model."""
    if lm.order_literals is not None:
        return lm.order_literals
    m = lm.model
    phased = phased_reductions(lm.tables.graph, lm.tables.hw.combines_gradient_reductions)
    combined = _any_positive(lm, lambda o: (held(o),), "all-reduces a gradient")
    reduces = _any_positive(lm, lambda o: (held(o), partial(o)) if o in phased else (held(o),),
                            "reduces a gradient")
    m.AddImplication(combined, reduces)
    scattered = m.NewBoolVar("reduce-scatters its gradients only")
    m.AddBoolAnd([reduces, combined.Not()]).OnlyEnforceIf(scattered)
    m.AddBoolOr([reduces.Not(), combined]).OnlyEnforceIf(scattered.Not())
    lm.order_literals = {COMBINED: combined, SCATTERED: scattered, NONE: reduces.Not()}
    return lm.order_literals


def order_literal(lm: Any, guard: frozenset[str]) -> Any:
    """A literal of ``lm``'s model true exactly where the layout's order is one of ``guard``
    (a point's orders, ``liveness.LivePoints.guards``); made once per set."""
    lits = order_literals(lm)
    if len(guard) == 1:
        return lits[next(iter(guard))]
    hit = lm.guard_literals.get(guard)
    if hit is None:
        hit = lm.guard_literals[guard] = lm.model.NewBoolVar("order in " + ",".join(sorted(guard)))
        lm.model.AddMaxEquality(hit, [lits[r] for r in REDUCTIONS if r in guard])
    return hit


def enforce(lm: Any, constraint: Any, guard: frozenset[str] | None) -> None:
    """Enforce ``constraint`` of ``lm``'s model for the layouts of some orders only (``guard``,
    a set of ``gradients.REDUCTIONS``), or every layout (None)."""
    if guard is None:
        return
    constraint.OnlyEnforceIf(order_literal(lm, guard))
