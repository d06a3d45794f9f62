"""The two orders of a step's schedule in the search: with or without the gradients' combined
reduction.

On XLA:CPU the step's gradient all-reduces are one instruction that the optimizer updates wait
for, but only where the layout reduces some gradient (``costmodel.order.memory_order``): a
data-parallel layout's updates run after the last gradient, a model-parallel one's as soon as
their gradient is ready. ``predict`` walks the order of the layout it prices; the search holds
the live points of both (``search.liveness.LivePoints``, each point guarded by its order) and a
literal of the CP-SAT model, :func:`reduced_literal`, true exactly where the layout reduces some
gradient: a row of one order's point is enforced only under its literal (:func:`enforce`), so
every layout is held to its own order's points and the search stays exact.

A gradient op reduces where it holds partial sums (``gradients.gradients_reduced``: its
:func:`~autolayout.search.liveness.held` or :func:`~autolayout.search.liveness.partial` bytes
above 0), a linear expression of the layout's choices (``LayoutModel.memory_expr``).
"""
from __future__ import annotations

from typing import Any

from ortools.sat.python import cp_model

from autolayout.costmodel.gradients import gradient_reducers
from autolayout.costmodel.phases import phased_reductions
from autolayout.search.liveness import held, partial

__all__ = ["reduced_literal", "enforce"]


def reduced_literal(lm: Any) -> Any:
    """The literal of ``lm`` (a ``search.model.LayoutModel``) that is true exactly where its
    layout reduces some parameter gradient (module docstring); made once per model."""
    if lm.reduced is not None:
        return lm.reduced
    m = lm.model
    graph = lm.tables.graph
    phased = phased_reductions(graph, lm.tables.hw.combines_gradient_reductions)
    lits = []
    for o in sorted(o for ops in gradient_reducers(graph).values() for o in ops):
        names = (held(o), partial(o)) if o in phased else (held(o),)
        vars_, coefs, const = lm.memory_expr(names)
        if not vars_:
            if const > 0:  # reduces under every layout
                lits.append(m.NewConstant(1))
            continue
        b = m.NewBoolVar(f"reduces {o}")
        total = cp_model.LinearExpr.WeightedSum(vars_, coefs) + const
        m.Add(total >= 1).OnlyEnforceIf(b)
        m.Add(total == 0).OnlyEnforceIf(b.Not())
        lits.append(b)
    r = m.NewBoolVar("reduces a gradient")
    if lits:
        m.AddMaxEquality(r, lits)
    else:
        m.Add(r == 0)
    lm.reduced = r
    return r


def enforce(lm: Any, constraint: Any, guard: bool | None) -> None:
    """Enforce ``constraint`` of ``lm``'s model for the layouts of one order only: those that
    reduce some gradient (``guard`` True), the others (False), or every layout (None)."""
    if guard is None:
        return
    r = reduced_literal(lm)
    constraint.OnlyEnforceIf(r if guard else r.Not())
