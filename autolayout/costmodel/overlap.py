"""Which collectives overlap compute, and the step time that follows.

The rule (one function pair, called by ``predict`` and by the search's tables):

* **Overlap domains.** Every op belongs to the body of its innermost scan (``op.loop``)
  or to the top level. A domain's time per step is

      ``T_d = C_d + E_d + max(0, O_d - C_d)``

  with ``C_d`` its compute, ``E_d`` its *exposed* collectives and ``O_d`` its
  *overlappable* collectives (all summed over the domain's iterations: every op of a
  scan body runs once per iteration, so the per-iteration ``max`` times the trip count
  is the ``max`` of the totals). A step's time is ``Σ_d T_d``.
* **Overlappable** collectives are those with independent work to hide behind, the
  ones XLA's latency-hiding scheduler issues asynchronously
  (``xla/service/latency_hiding_scheduler.cc``: async collective start/done pairs are
  scheduled apart so that independent compute runs between them; MaxText turns this
  on for FSDP on TPU with ``--xla_tpu_enable_async_collective_fusion=true
  --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true
  --xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true``,
  AI-Hypercomputer/maxtext ``end_to_end/tpu/*.sh``; Megatron-LM's
  ``--overlap-grad-reduce --overlap-param-gather`` do the same on GPUs). A collective
  moving a tensor of :func:`overlappable`:

  - the *weight side*: tensors computed from parameters, optimizer state and
    constants alone (a stored FSDP shard's all-gather before its use, a weight's
    cast or layer slice): they do not depend on the iteration's activations, so the
    gather of the next layer runs during this layer's compute (prefetch);
  - the *gradient side*: tensors with no dim outside the parameters' dims that no
    forward output (the loss) depends on — weight gradients, their partial sums, the
    optimizer's update: their reduction (data-parallel all-reduce, ZeRO
    reduce-scatter) is needed by no later op of the backward pass, so it runs behind
    the remaining backward compute.

* **Exposed**: every other collective — those on activations (the tensor-parallel
  all-reduce between two dependent matmuls, the sequence-parallel reduce-scatter and
  all-gather, all-to-alls, loss and softmax statistics) sit on the critical path: the
  next op needs their result and nothing else is left to run.

The model is an upper bound on overlap within a domain (all its compute can hide its
overlappable collectives); compute in one scan does not hide collectives of another.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from autolayout.graph import Graph

__all__ = ["overlappable", "forward_ops", "domain_of", "step_time"]

_CACHE: "weakref.WeakKeyDictionary[Graph, frozenset[str]]" = weakref.WeakKeyDictionary()
_FORWARD: "weakref.WeakKeyDictionary[Graph, frozenset[str]]" = weakref.WeakKeyDictionary()
_SOURCES = ("param", "opt_state", "constant")


def domain_of(op) -> str:
    """The overlap domain of ``op``: its innermost scan, ``""`` at the top level."""
    return op.loop or ""


def overlappable(graph: Graph, hardware: Any = None) -> frozenset[str]:
    """Tensors whose collectives may overlap compute (module docstring): the weight side
    and the gradient side of ``graph``; none on hardware without asynchronous
    collectives (``hardware.async_collectives`` false, e.g. XLA:CPU)."""
    if hardware is not None and not hardware.async_collectives:
        return frozenset()
    hit = _CACHE.get(graph)
    if hit is not None:
        return hit
    weight: set[str] = set()
    for name in graph.order:
        op = graph.op(name)
        if op.kind in _SOURCES or (op.kind != "input" and op.fn != "carry" and op.inputs
                                   and all(i in weight for i in op.inputs)):
            weight.add(name)  # (a carry is loop state: its next value is computed in the body)
    needed = forward_ops(graph)
    param_dims = {d for t in graph.params() for d in t.dim_names}
    grad = {t.name for t in graph.tensors()
            if t.name not in needed and graph.op(t.name).kind != "input"
            and set(t.dim_names) <= param_dims}
    out = frozenset(weight | grad)
    _CACHE[graph] = out
    return out


def forward_ops(graph: Graph) -> frozenset[str]:
    """The forward pass: every tensor a forward output depends on, through scan carries
    too. The forward outputs are the loss and metrics: the scalar outputs that no parameter
    gradient reaches (every such output when none is a scalar)."""
    hit = _FORWARD.get(graph)
    if hit is not None:
        return hit
    after_grad: set[str] = {r.grad for r in graph.param_roles.values() if r.grad}
    for name in graph.order:
        if any(i in after_grad for i in graph.op(name).inputs):
            after_grad.add(name)
    free = [o for o in graph.outputs if o.tensor and o.tensor not in after_grad]
    # the loss and metrics are the scalars among them (a step may also return an input's
    # gradient, as the paper's MLP layer does: backward work, not forward)
    forward_out = [o.tensor for o in free if not o.shape] or [o.tensor for o in free]
    next_of = {c: n for lp in graph.loops.values() for c, n in lp.carries}
    needed: set[str] = set()
    stack = list(forward_out)
    while stack:
        t = stack.pop()
        if t in needed:
            continue
        needed.add(t)
        stack.extend(graph.op(t).inputs)
        if t in next_of:
            stack.append(next_of[t])
    out = _FORWARD[graph] = frozenset(needed)
    return out


def step_time(compute_s: Mapping[str, float], exposed_s: Mapping[str, float],
              overlapped_s: Mapping[str, float]) -> float:
    """``Σ_d C_d + E_d + max(0, O_d - C_d)`` over the domains of the three maps.

    >>> step_time({"": 2.0, "fwd": 5.0}, {"": 1.0}, {"": 3.0, "fwd": 4.0})
    9.0
    """
    total = 0.0
    for d in _domains(compute_s, exposed_s, overlapped_s):
        c = compute_s.get(d, 0.0)
        total += c + exposed_s.get(d, 0.0) + max(0.0, overlapped_s.get(d, 0.0) - c)
    return total


def _domains(*maps: Iterable[str]) -> list[str]:
    return sorted({d for m in maps for d in m})
