"""Fused attention: the attention region of a graph priced as FlashAttention runs it.

A traced attention materialises its scores ``[batch, heads, length, length_1]``: XLA writes
the q·k product, the masked and exponentiated scores and the probabilities to HBM, saves some
of them for the backward pass and reads them back there. A fused kernel (FlashAttention, Dao
et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness",
Algorithms 1 and 2; the Pallas TPU kernels and cuDNN / FlashAttention-2 on GPUs,
:data:`~autolayout.costmodel.profiles.SRC_FUSED_ATTENTION`) tiles them in on-chip memory:

* no score-sized tensor is written to or read from HBM (the kernel reads q, k, v and writes
  the output and the softmax statistics);
* none is saved for the backward pass: the backward kernel recomputes ``q·kᵀ`` and the
  softmax from q, k and the saved statistics ``m`` and ``ℓ`` (Algorithm 2 saves both), so
  the backward does one more ``q·kᵀ`` contraction (hardware flops, not model flops).

:func:`fuse_attention` rewrites a traced graph that way — the one rule behind
``predict`` and the search (:func:`kernel_graph`, called by both on hardware with
``Hardware.fused_attention``), so that every later stage (remat policies, the plan,
liveness, the search's tables) prices the fused program without knowing about it:

1. **The region** (:func:`attention_region`), found from the graph's structure, not names.
   A *score producer* is a two-operand contraction of two activations (tensors computed from
   the step's inputs, not from parameters and constants alone) whose output keeps a dim of
   each operand that the other lacks (its *free* dims) — ``q[b,l,h,k]·k[b,m,h,k] ->
   s[b,h,l,m]`` (free ``l``, ``m``), and in the backward ``dO·vᵀ``. Element-wise ops with a
   score among their inputs and the same dims as it produce scores too (scale, mask,
   ``exp(s - max)``, the softmax gradient). A score is *in the region* when it reaches,
   through scores only, a *score consumer*: a two-operand contraction with another
   activation that sums over free dims of the score and no other (``p·v``, ``dS·k``,
   ``dSᵀ·q``, ``pᵀ·dO``). A matmul with a weight is never a producer, so an MLP
   (``relu(x·w1)·w2``) is not attention; weight gradients (``xᵀ·dh``, a mixture of experts'
   ``dhᵀ·expert_in``) sum over the batch and are no consumers. Reductions of scores (the softmax max and sum) are the kernel's statistics:
   they stay materialised (``[b, h, l]``).
2. **Recompute**: forward scores that the backward reads — saved residuals of a scan
   (:func:`~autolayout.remat.recompute_residuals`, which saves their non-score inputs: q,
   k and the statistics) or tensors read directly — are recomputed in the backward as
   clones ``flash/<tensor>`` of their producers.
3. **On chip**: the region's scores, and masks computed from constants alone (a kernel
   builds the causal mask from indices) read only by region ops, get the
   :data:`~autolayout.fusion.ON_CHIP` attr: no HBM bytes, no memory; their element-wise work
   is priced at compute speed.

The rewritten graph computes the same values (tests compare ``evaluate``), so the lowering
could run it; on CPU profiles the flag is off and nothing changes. The rewrite runs before a
remat policy (:func:`~autolayout.remat.rematerialize`), whose clones keep the attr: under
``remat=full`` the backward recomputes the forward kernel (q·kᵀ, for the output and the
statistics) and the backward kernel recomputes q·kᵀ again, as ``jax.checkpoint`` around a
FlashAttention kernel does: three q·kᵀ per layer and step.

Limits: a step *traced* with ``jax.checkpoint`` has its forward recompute and its backward
in one backward scan, where step 2 cannot tell them apart (both are outside the forward
pass): its scores are kept on chip but the backward kernel's own q·kᵀ is not added (one
q·kᵀ per layer fewer than FlashAttention); trace without it and use the layout's remat
policy instead (``benchmarks/published.py`` does). A collective on a score (a layout that
splits the head dim ``d_kv`` of q·kᵀ leaves partial scores) is priced as planned although a
kernel could not run it.
"""
from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any

from autolayout.costmodel.overlap import forward_ops
from autolayout.fusion import ON_CHIP
from autolayout.graph import Graph, Op, Replay
from autolayout.remat import recompute_residuals

__all__ = ["AttentionRegion", "attention_region", "fuse_attention", "kernel_graph", "PREFIX"]

PREFIX = "flash"  # clones of recomputed scores are named flash/<tensor>
_BOUNDARY = ("stack", "slice")
_FUSED: "weakref.WeakKeyDictionary[Graph, Graph]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class AttentionRegion:
    """The attention region of a graph (module docstring, step 1).

    ``producers``: contractions producing scores; ``consumers``: contractions reading them;
    ``scores``: score tensors in the region (producer outputs included); ``masks``: tensors
    computed from constants alone that only region ops read; ``on_chip``: the tensors a fused
    kernel keeps on chip (scores every reader of which is a region op, and the masks);
    ``escaping``: region scores some other op (or a graph output) reads, which stay in HBM."""

    producers: frozenset[str]
    consumers: frozenset[str]
    scores: frozenset[str]
    masks: frozenset[str]
    on_chip: frozenset[str]
    escaping: frozenset[str]


def kernel_graph(graph: Graph, hardware: Any) -> Graph:
    """``graph`` as ``hardware`` runs it: :func:`fuse_attention` where
    ``hardware.fused_attention``, else ``graph`` itself. ``predict`` and the search both call
    this before planning (one rule)."""
    return fuse_attention(graph) if getattr(hardware, "fused_attention", False) else graph


def fuse_attention(graph: Graph) -> Graph:
    """``graph`` rewritten for a fused attention kernel (module docstring): scores recomputed
    in the backward instead of saved, and kept on chip. ``graph`` itself when it has no
    attention region, or was rewritten already."""
    hit = _FUSED.get(graph)
    if hit is not None:
        return hit
    if any(op.attr(ON_CHIP) for op in graph.ops()):
        return graph
    region = attention_region(graph)
    if not region.scores:
        _FUSED[graph] = graph
        return graph
    out = graph
    train = any(r.grad for r in graph.param_roles.values())
    if train:
        fwd = forward_ops(graph)
        forward_scores = {s for s in region.scores if s in fwd}
        out = recompute_residuals(out, forward_scores, prefix=PREFIX)
        out = _recompute_direct(out, forward_scores, forward_ops(out))
        region = attention_region(out)
    ops = [dataclasses.replace(op, attrs=op.attrs + ((ON_CHIP, True),)) if op.name in region.on_chip else op
           for op in out.ops()]
    fused = Graph(ops, input_names=out.input_names, in_tree=out.in_tree, outputs=out.outputs,
                  out_tree=out.out_tree, loops=list(out.loops.values()), name=f"{graph.name}[{PREFIX}]",
                  param_roles=out.param_roles, donated=out.donated, fn=out.fn, example_spec=out.example_spec,
                  arg_dims=out.arg_dims, arg_roles=out.arg_roles)
    _FUSED[graph] = fused
    return fused


def attention_region(graph: Graph) -> AttentionRegion:
    """The attention region of ``graph`` (module docstring, step 1)."""
    weight, const = _weight_side(graph)
    producers: set[str] = set()
    free: dict[str, set[str]] = {}  # score -> its dims that came from one operand of its producer only
    for name in graph.order:
        op = graph.op(name)
        from_score = [i for i in op.inputs if i in free]
        if not from_score and _is_producer(op, weight):
            producers.add(name)
            a, b = _dims(op, 0), _dims(op, 1)
            free[name] = (a ^ b) & set(op.output.dim_names)
        elif from_score and op.kind == "reshape" and op.fn in _BOUNDARY:
            free[name] = set(free[from_score[0]])  # a saved score and its slice in the backward scan
        elif op.kind == "elementwise" and any(set(graph.tensor(i).dim_names) == set(op.output.dim_names)
                                              for i in from_score):
            free[name] = set().union(*(free[i] for i in from_score))
    scores = set(free)
    # keep the scores that reach a consumer through scores ...
    consumers: set[str] = set()
    kept: set[str] = set()
    for name in reversed(graph.order):
        if name not in scores:
            continue
        for c in graph.consumers(name):
            if _is_consumer(graph.op(c), name, free[name], graph, weight):
                consumers.add(c)
                kept.add(name)
            elif c in kept:
                kept.add(name)
    # ... and those computed from kept scores that only statistics and kept scores read
    # (the softmax gradient's sum(P * dP))
    grew = True
    while grew:
        grew = False
        for name in scores - kept:
            readers = graph.consumers(name)
            if (any(i in kept for i in graph.op(name).inputs) and readers
                    and all(c in kept or _is_statistic(graph.op(c)) for c in readers)):
                kept.add(name)
                grew = True
    scores = kept
    consumers = {c for c in consumers if any(i in scores for i in graph.op(c).inputs)}
    producers &= scores
    outputs = {s.tensor for s in graph.outputs if s.tensor}
    member = scores | consumers

    def region_op(c: str) -> bool:
        return c in member or _is_statistic(graph.op(c))

    masks: set[str] = set()
    for name in graph.order:
        if name in const and name not in outputs and graph.op(name).kind == "elementwise":
            readers = graph.consumers(name)
            if readers and all(c in scores and graph.op(c).kind == "elementwise" for c in readers):
                masks.add(name)
    escaping = {s for s in scores if s in outputs or not all(region_op(c) for c in graph.consumers(s))}
    # loop boundaries of scores (saved residuals) are not kernel tensors: fuse_attention removes them
    inside = {s for s in scores - escaping if graph.op(s).kind != "reshape"}
    return AttentionRegion(frozenset(producers), frozenset(consumers), frozenset(scores), frozenset(masks),
                           frozenset(inside | masks), frozenset(escaping))


def _weight_side(graph: Graph) -> tuple[set[str], set[str]]:
    """``(weight side, constants)``: tensors computed from parameters, optimizer state and
    constants alone (no step input: not activations), and those from constants alone."""
    weight: set[str] = set()
    const: set[str] = set()
    for name in graph.order:
        op = graph.op(name)
        if op.kind == "input" or op.fn == "carry":  # a carry is loop state: computed in the body
            continue
        if op.kind in ("param", "opt_state"):
            weight.add(name)
        elif op.kind == "constant" or (op.inputs and all(i in const for i in op.inputs)):
            weight.add(name)
            const.add(name)
        elif op.inputs and all(i in weight for i in op.inputs):
            weight.add(name)
    return weight, const


def _dims(op: Op, i: int) -> set[str]:
    return {d.name for d in op.input_shapes[i]}


def _is_producer(op: Op, weight: set[str]) -> bool:
    """A contraction of two activations keeping a dim of each that the other lacks."""
    if op.kind != "einsum" or op.fn == "conv" or len(op.inputs) != 2 or any(i in weight for i in op.inputs):
        return False
    a, b, out = _dims(op, 0), _dims(op, 1), set(op.output.dim_names)
    return bool((a - b) & out) and bool((b - a) & out)


def _is_consumer(op: Op, score: str, free: set[str], graph: Graph, weight: set[str]) -> bool:
    """A contraction of ``score`` with another activation summing over some of the score's
    ``free`` dims (``m`` of ``p·v``, ``l`` of ``pᵀ·dO``) and over none of its other dims (the
    batch and heads its producer's operands share: a weight gradient such as a mixture of
    experts' ``dhᵀ·expert_in`` sums over the batch)."""
    if op.kind != "einsum" or op.fn == "conv" or len(op.inputs) != 2 or score not in op.inputs:
        return False
    other = op.inputs[1 - op.inputs.index(score)]
    if other in weight or other == score:
        return False
    summed = set(graph.tensor(score).dim_names) - set(op.output.dim_names)
    return bool(summed) and summed <= free


def _is_statistic(op: Op) -> bool:
    """A reduction (the softmax's max and sum): the kernel's statistics, materialised."""
    return op.kind == "reduce" or (op.kind == "einsum" and len(op.inputs) == 1)


def _recompute_direct(graph: Graph, scores: set[str], fwd: frozenset[str]) -> Graph:
    """Backward ops that read a forward score directly (no scan residual between them, both
    in the same loop or both at the top level) read a clone ``flash/<score>`` of its
    producers instead, inserted before the first of them."""
    reads = [(c, i) for c in graph.order if c not in fwd for i in graph.op(c).inputs
             if i in scores and i in fwd and graph.op(i).loop == graph.op(c).loop]
    if not reads:
        return graph
    ops = {op.name: op for op in graph.ops()}
    need: set[str] = set()
    stack = [i for _, i in reads]
    while stack:
        t = stack.pop()
        if t in need or t not in scores or t not in fwd:
            continue
        need.add(t)
        stack.extend(graph.op(t).inputs)
    mapping = {t: f"{PREFIX}/{t}" for t in need}
    clones = []
    for t in sorted(need, key=graph.order.index):
        op = graph.op(t)
        clones.append(dataclasses.replace(op, name=mapping[t], inputs=tuple(mapping.get(i, i) for i in op.inputs),
                                          output=dataclasses.replace(op.output, name=mapping[t], role="activation"),
                                          replay=_remap(op.replay, mapping), hbm=()))
    readers = {c for c, _ in reads}
    for c in readers:
        op = ops[c]
        ops[c] = dataclasses.replace(op, inputs=tuple(mapping.get(i, i) if i in need else i for i in op.inputs),
                                     replay=_remap(op.replay, mapping))
    first = min(graph.order.index(c) for c in readers)
    order = list(graph.order)
    new = [ops[n] for n in order[:first]] + clones + [ops[n] for n in order[first:]]
    loops = []
    for lp in graph.loops.values():
        mine = [cl.name for cl in clones if cl.loop == lp.name]
        if not mine:
            loops.append(lp)
            continue
        body = list(lp.body)
        at = min(body.index(c) for c in readers if c in body)
        loops.append(dataclasses.replace(lp, body=tuple(body[:at] + mine + body[at:])))
    return Graph(new, input_names=graph.input_names, in_tree=graph.in_tree, outputs=graph.outputs,
                 out_tree=graph.out_tree, loops=loops, name=graph.name, param_roles=graph.param_roles,
                 donated=graph.donated, fn=graph.fn, example_spec=graph.example_spec, arg_dims=graph.arg_dims,
                 arg_roles=graph.arg_roles)


def _remap(replay: Replay | None, mapping: dict[str, str]) -> Replay | None:
    if replay is None:
        return None
    return Replay(replay.fn, tuple(("tensor", mapping.get(o[1], o[1]), *o[2:]) if o[0] == "tensor" else o
                                   for o in replay.operands))
