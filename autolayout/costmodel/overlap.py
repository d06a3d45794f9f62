"""Which collectives overlap compute, and the step time that follows.

The rule (one function pair, called by ``predict`` and by the search's tables):

* **Overlap domains.** Every op belongs to the body of its innermost scan (``op.loop``)
  or to the top level. A domain's time per step is

      ``T_d = C_d + E_d + max(0, O_d + I_d - C_d, I_d - W_d)``

  with ``C_d`` its compute, ``E_d`` its *exposed* collectives, ``O_d`` its *pooled*
  overlappable collectives (weight and gradient side, below), ``I_d`` its collectives
  overlappable only beside *independent work* and ``W_d`` the compute of that work
  (all summed over the domain's iterations: every op of a scan body runs once per
  iteration, so the per-iteration ``max`` times the trip count is the ``max`` of the
  totals). The ``max`` is what the most overlap leaves exposed: compute hides at most
  ``C_d`` in all and the independent work at most ``W_d`` of ``I_d``, so the hidden
  time is ``min(O_d + min(I_d, W_d), C_d)``. A step's time is ``Σ_d T_d``;
  :func:`split` gives each op's share of the linear part and of the two rows of the
  ``max`` (keys ``d`` and ``d + BESIDE``), which the search's integer model bounds with
  one slack per domain, at least each of its rows (search/model.py).
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

  - *independent work*: any other contraction or reduction output (a partial sum the
    layout may leave to an all-reduce or reduce-scatter) with a matmul in its domain that neither
    depends on it nor is depended on by it (no path either way in one iteration of
    the domain's dataflow). The collective's start is issued when the tensor is
    computed and its done waits until a reader needs it; the scheduler runs the
    independent matmul in between. The standard case is the backward pass: a
    tensor-parallel layer's input gradient ``dX = dY·Wᵀ`` is all-reduced while the
    weight gradient ``dW = Xᵀ·dY`` is computed, which reads neither ``dX`` nor its
    sum (Megatron-LM issues exactly this asynchronous all-reduce,
    ``megatron/core/tensor_parallel/layers.py``
    ``LinearWithGradAccumulationAndAsyncCommunication``: "Asynchronous all-reduce
    ... scheduled before the weight gradient computation"; XLA's latency-hiding
    scheduler finds it from the dataflow alone). Also the two branches of a parallel
    layer (PaLM §2: the attention branch's all-reduce beside the MLP's matmuls), and
    the loss's reduction, which the backward pass does not read (its seed is 1).
    These hide behind the independent matmuls only (``W_d``: every matmul of the
    domain independent of at least one such tensor), not behind the domain's whole
    compute: the forward matmuls that produce a tensor cannot hide its reduction.

* **Exposed**: every other collective — those on activations with no independent
  matmul beside them (the forward tensor-parallel all-reduce between two dependent
  matmuls, the sequence-parallel reduce-scatter and all-gather around them, softmax
  statistics) sit on the critical path: the next op needs their result and nothing
  else is left to run.

The model is an upper bound on overlap within a domain: all its compute can hide the
pooled collectives, all its independent matmuls the others (one matmul counts for every
tensor it is independent of); compute in one scan does not hide collectives of another.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autolayout.graph import Graph

__all__ = ["Overlap", "BESIDE", "overlappable", "forward_ops", "domain_of", "domain_of_row", "split", "step_time"]

BESIDE = "|beside"  # suffix of a domain's key for the collectives beside independent work


@dataclass(frozen=True)
class Overlap:
    """Which collectives of a graph may run behind which compute (module docstring):
    ``pooled`` tensors behind any compute of their domain, ``beside`` tensors behind the
    ``work`` ops (independent matmuls) of their domain. ``tensor in overlap`` says
    whether a tensor's collectives may overlap at all."""

    pooled: frozenset[str] = frozenset()
    beside: frozenset[str] = frozenset()
    work: frozenset[str] = frozenset()

    def __contains__(self, tensor: object) -> bool:
        return tensor in self.pooled or tensor in self.beside

    def flags(self, op) -> tuple:
        """What about ``op`` decides how its cost splits (:func:`split`): for its output and
        each input whether it is pooled or beside, and whether ``op`` is independent work."""
        return (tuple((t in self.pooled, t in self.beside) for t in (op.name, *op.inputs)),
                op.name in self.work)


NO_OVERLAP = Overlap()

_CACHE: "weakref.WeakKeyDictionary[Graph, Overlap]" = weakref.WeakKeyDictionary()
_FORWARD: "weakref.WeakKeyDictionary[Graph, frozenset[str]]" = weakref.WeakKeyDictionary()
_SOURCES = ("param", "opt_state", "constant")
# ops whose output is a sum a layout may leave partial (a contraction or reduction over a
# split dim): the all-reduces and reduce-scatters the overlap rule is about. Element-wise
# tensors (a ReLU mask computed in the forward, read in the backward) are independent of
# much of the step too, but carry no reduction: they would only inflate ``W_d``.
_REDUCING = ("einsum", "reduce")


def domain_of(op) -> str:
    """The overlap domain of ``op``: its innermost scan, ``""`` at the top level."""
    return op.loop or ""


def overlappable(graph: Graph, hardware: Any = None) -> Overlap:
    """Which collectives of ``graph`` may overlap compute (module docstring): the weight
    side and the gradient side pooled, tensors with independent work beside it; none on
    hardware without asynchronous collectives (``hardware.async_collectives`` false, e.g.
    XLA:CPU)."""
    if hardware is not None and not hardware.async_collectives:
        return NO_OVERLAP
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
    pooled = weight | grad
    beside, work = _beside_independent_matmul(graph, weight, pooled)
    out = _CACHE[graph] = Overlap(frozenset(pooled), frozenset(beside), frozenset(work))
    return out


def _beside_independent_matmul(graph: Graph, weight: set[str], pooled: set[str]) -> tuple[set[str], set[str]]:
    """Contraction and reduction outputs with a matmul in their overlap domain that is
    neither their ancestor nor their descendant within one iteration (module docstring,
    *independent work*), other than the
    ``pooled`` ones, and the matmuls independent of at least one of them. Paths are
    followed through op inputs only: a scan carry starts its iteration's dataflow, so no
    path runs from one iteration into the next. Matmuls of the weight side do not count
    (they are the parameters' own preparation, not work that waits for activations)."""
    order = graph.order
    index = {name: i for i, name in enumerate(order)}
    above = [0] * len(order)  # bitsets over ``order``: each tensor's ancestors
    matmuls: dict[str, int] = {}
    for i, name in enumerate(order):
        op = graph.op(name)
        bits = 0
        for inp in op.inputs:
            j = index[inp]
            bits |= above[j] | (1 << j)
        above[i] = bits
        if op.kind == "einsum" and len(op.inputs) >= 2 and name not in weight:
            d = domain_of(op)
            matmuls[d] = matmuls.get(d, 0) | (1 << i)
    below = [0] * len(order)  # and its descendants
    for i in range(len(order) - 1, -1, -1):
        for inp in graph.op(order[i]).inputs:
            below[index[inp]] |= below[i] | (1 << i)
    out, free = set(), 0
    for i, name in enumerate(order):
        op = graph.op(name)
        mm = matmuls.get(domain_of(op), 0)
        beside = mm & ~(above[i] | below[i] | (1 << i)) if op.kind in _REDUCING and name not in pooled else 0
        if beside:
            out.add(name)
            free |= beside
    return out, {order[i] for i in range(len(order)) if free >> i & 1}


def split(oc: Any, op: Any, overlap: Overlap) -> tuple[float, dict[str, float]]:
    """One execution of ``op`` (its :class:`~autolayout.costmodel.rules.OpCost` ``oc``) as
    the parts of :func:`step_time`: ``(compute + exposed comm, {row: term})`` with the term
    ``overlappable comm - compute`` in row ``d`` (the op's domain) and, where the op has
    collectives beside independent work or is such work, ``beside comm - work compute``
    in row ``d + BESIDE``."""
    d = domain_of(op)
    terms = {d: oc.overlapped_s - oc.compute_s}
    work = oc.compute_s if op.name in overlap.work else 0.0
    if oc.beside_s or work:
        terms[d + BESIDE] = oc.beside_s - work
    return oc.compute_s + oc.comm_s - oc.overlapped_s, terms


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


def domain_of_row(row: str) -> str:
    """The overlap domain whose slack bounds ``row`` (a key of :func:`split`'s terms)."""
    return row[:-len(BESIDE)] if row.endswith(BESIDE) else row


def step_time(linear_s: float, terms_s: Mapping[str, float]) -> float:
    """The step time from the sums of :func:`split`'s parts over all ops (times their
    counts): ``linear_s`` plus, per domain, the largest of 0 and its rows' terms, i.e.
    ``Σ_d C_d + E_d + max(0, O_d + I_d - C_d, I_d - W_d)``.

    >>> step_time(2.0 + 1.0 + 5.0, {"": 3.0 - 2.0, "fwd": 4.0 - 5.0, "fwd" + BESIDE: 0.5})
    9.5
    """
    worst: dict[str, float] = {}
    for row, v in terms_s.items():
        d = domain_of_row(row)
        worst[d] = max(worst.get(d, 0.0), v)
    return linear_s + sum(worst.values())
