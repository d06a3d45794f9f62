"""Peak per-device memory by liveness over the traced schedule.

Every materialised tensor counts at its local (sharded) size; elementwise
intermediates fused into their consumers (``Op.hbm``) take none. Arguments (inputs, parameters,
optimizer state) are live for the whole step, as the caller holds them, except
donated ones (``graph.donated``, as ``jax.jit(donate_argnums=...)``), freed at
their last read because an output reuses the buffer; outputs
from their producer to the end; every other tensor from its producer to its last
consumer. A scan is one step of the schedule: its stacked outputs are live
throughout it, and its body adds the peak of one iteration's own tensors (an
iteration's temporaries are freed before the next). The breakdown is taken at
the peak: ``params``, ``opt_state``, ``grads`` (the parameters' gradients) and
``activations`` (everything else: inputs, saved activations, temporaries), and
``transient``: buffers an op holds only while it runs — inputs the plan gathers for
it (an FSDP layer's weights), freed after; the categories come from
``graph.param_roles``.
"""
from __future__ import annotations

from typing import Mapping

from autolayout.costmodel.plan import grad_of
from autolayout.graph import Graph, Loop


def _categories(graph: Graph) -> dict[str, str]:
    grads = {g for g in (grad_of(graph, t.name) for t in graph.params()) if g}
    out = {}
    for t in graph.tensors():
        out[t.name] = ("params" if t.role == "param" else "opt_state" if t.role == "opt_state"
                       else "grads" if t.name in grads else "activations")
    return out


def lifetimes(graph: Graph) -> tuple[list, dict[str, int], dict[str, int]]:
    """Schedule units and, for every top-level tensor, the units it is allocated and
    last live at (scan bodies are handled by :func:`body_lifetimes`)."""
    units = graph.schedule
    unit_of: dict[str, int] = {}
    for i, u in enumerate(units):
        if isinstance(u, Loop):
            for n in u.body:
                unit_of[n] = i
        else:
            unit_of[u] = i
    # stacked outputs and final carries exist while their loop runs
    for i, u in enumerate(units):
        if isinstance(u, Loop):
            for n in (*u.stacks, *(r for r, _ in u.results)):
                unit_of[n] = min(unit_of[n], i)
    end = len(units)
    outputs = {s.tensor for s in graph.outputs if s.tensor}
    body_of = {n for lp in graph.loops.values() for n in lp.body}
    donors = set(getattr(graph, "donated", {}).values())
    alloc: dict[str, int] = {}
    free: dict[str, int] = {}
    for t in graph.tensors():
        if t.name in body_of:
            continue
        users = [unit_of[c] for c in graph.consumers(t.name)]
        if t.role in ("input", "param", "opt_state"):
            alloc[t.name] = 0
            # a donated argument's buffer is reused by an output after its last read
            free[t.name] = max(users, default=0) if t.name in donors else end
            continue
        alloc[t.name] = unit_of[t.name]
        free[t.name] = end if t.name in outputs else max(users, default=alloc[t.name])
    return units, alloc, free


def body_lifetimes(graph: Graph, lp: Loop) -> tuple[dict[str, int], dict[str, int]]:
    """Position in the body and last live position of each body tensor (carried values
    and values read outside the body live for the whole iteration)."""
    order = {n: i for i, n in enumerate(lp.body)}
    end = len(lp.body)
    carried = {c for c, _ in lp.carries} | {n for _, n in lp.carries}
    last = {}
    for n in lp.body:
        users = [order[c] for c in graph.consumers(n) if c in order]
        outside = any(c not in order for c in graph.consumers(n))
        last[n] = end if (n in carried or outside) else max(users, default=order[n])
    return order, last


def peak_memory(graph: Graph, size: Mapping[str, int], temps: Mapping[str, int] | None = None
                ) -> tuple[int, dict]:
    """``(peak bytes, breakdown at the peak)`` given every tensor's local bytes ``size``
    (a plan's ``local_bytes``: 0 for elementwise intermediates fused into their consumers)
    and the transient bytes ``temps[op]`` an op holds while it runs (inputs it gathered)."""
    temps = temps or {}
    units, alloc, free = lifetimes(graph)
    end = len(units)
    # sweep: +size at allocation, -size after the last use
    delta = [0] * (end + 2)
    for n in alloc:
        delta[alloc[n]] += size[n]
        delta[free[n] + 1] -= size[n]
    best, best_at, running = -1, 0, 0
    bodies = {}
    for i, u in enumerate(units):
        running += delta[i]
        total = running
        if isinstance(u, Loop):
            bodies[i] = _body_peak(graph, u, size, temps)
            total += bodies[i][0]
        else:
            total += temps.get(u, 0)
        if total > best:
            best, best_at = total, i
    live = [n for n in alloc if alloc[n] <= best_at <= free[n]]
    breakdown = {"params": 0, "grads": 0, "opt_state": 0, "activations": 0, "transient": 0}
    category = _categories(graph)
    body_live, body_op = bodies.get(best_at, (0, [], None))[1:]
    for n in live + list(body_live):
        breakdown[category[n]] += size[n]
    unit = units[best_at] if units else None
    breakdown["transient"] = temps.get(body_op if isinstance(unit, Loop) else unit, 0)
    return max(best, 0), breakdown


def _body_peak(graph: Graph, lp: Loop, size: Mapping[str, int], temps: Mapping[str, int]
               ) -> tuple[int, list, str | None]:
    """Peak of one iteration's own tensors (carried values live for the whole iteration),
    with the transient bytes of the op running there; the live tensors and that op."""
    order, last = body_lifetimes(graph, lp)
    end = len(lp.body)
    delta = [0] * (end + 2)
    for n in lp.body:
        delta[order[n]] += size[n]
        delta[last[n] + 1] -= size[n]
    best, best_at, running = 0, 0, 0
    for i in range(end):
        running += delta[i]
        if running + temps.get(lp.body[i], 0) > best:
            best, best_at = running + temps.get(lp.body[i], 0), i
    return best, [n for n in lp.body if order[n] <= best_at <= last[n]], (lp.body[best_at] if end else None)
