"""Rematerialisation as a rewrite of a traced graph (a priced choice, not a retrace).

A training step traced without ``jax.checkpoint`` runs its layers in a forward
scan that *saves* per-layer residuals (stack ops) for the backward scan, which
slices them. :func:`rematerialize` rewrites such a graph for a remat policy, the
way ``jax.checkpoint`` with that policy would have traced it:

* ``"full"`` (``jax.checkpoint`` without a policy; MaxText ``remat_policy: full``):
  the forward scan saves only each layer's input (its carries); the backward
  scan recomputes the layer's forward ops from it before using them.
* ``"dots"`` (``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``;
  MaxText ``minimal``): the forward scan also saves the outputs of the matmuls
  with weights (two-operand einsums with no dim shared by both operands and the
  output); everything else is recomputed.
* ``"none"``: the graph as traced (every residual saved).

The rewritten graph computes the same numbers (recomputation is exact) from the
same arguments and has the same outputs. Its extra ops are ordinary ops of the
backward scan (``remat/<op>``), so the cost model prices the recompute flops and
collectives, liveness counts what is saved (``saved/<tensor>`` stacks) and what a
backward iteration holds transiently, the search compares policies, and the
shard_map lowering executes the recomputation — one plan for all of it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from autolayout.core import LayoutError
from autolayout.graph import Graph, Loop, Op, Replay, Tensor

__all__ = ["POLICIES", "rematerialize", "remat_pairs", "recompute_residuals"]

POLICIES = ("none", "full", "dots")


def remat_pairs(graph: Graph) -> list[tuple[Loop, Loop, list[str]]]:
    """``(forward loop, backward loop, residual stacks)`` for each forward scan whose saved
    residuals a backward scan slices (the loops a remat policy applies to). A backward scan
    traced from ``jax.checkpoint`` already recomputes (:attr:`Loop.recomputes`): none."""
    out = []
    for fwd in graph.loops.values():
        if fwd.dim is None:
            continue
        for bwd in graph.loops.values():
            if bwd is fwd or bwd.dim != fwd.dim or bwd.recomputes:
                continue
            slices_of = {graph.op(s).inputs[0] for s in bwd.slices}
            residual = [s for s in fwd.stacks if s in slices_of and all(
                graph.op(c).fn == "slice" and graph.op(c).loop == bwd.name for c in graph.consumers(s))]
            if residual:
                out.append((fwd, bwd, residual))
    return out


def _dots(graph: Graph, names: Sequence[str]) -> set[str]:
    """Matmuls with weights: two-operand einsums without a dim both operands and the output
    share (no batch dims, as ``dots_with_no_batch_dims_saveable``)."""
    out = set()
    for n in names:
        op = graph.op(n)
        if op.kind == "einsum" and len(op.inputs) == 2:
            a, b = (set(s_.name for s_ in shape) for shape in op.input_shapes)
            if not (a & b & set(op.output.dim_names)):
                out.add(n)
    return out


def rematerialize(graph: Graph, policy: str) -> Graph:
    """``graph`` rewritten for remat ``policy`` (see the module docstring).

    Args:
        graph: a traced training step.
        policy: ``"none"``, ``"full"`` or ``"dots"``.

    Returns:
        The rewritten graph (``graph`` itself for ``"none"``).

    Raises:
        LayoutError: unknown policy, or the graph has no forward scan whose residuals a
            backward scan reads (e.g. it was traced with ``jax.checkpoint`` already).
    """
    if policy not in POLICIES:
        raise LayoutError(f"unknown remat policy {policy!r}; choose one of {POLICIES}")
    if policy == "none":
        return graph
    pairs = remat_pairs(graph)
    if not pairs:
        raise LayoutError(
            f"remat={policy!r}: graph {graph.name!r} has no forward scan whose saved residuals a backward "
            "scan reads (a forward pass, or a step traced with jax.checkpoint already); nothing to "
            "rematerialise")
    ops = {op.name: op for op in graph.ops()}
    order = list(graph.order)
    loops = dict(graph.loops)
    for fwd, bwd, residual in pairs:
        saved = {c for c, _ in fwd.carries}  # a layer's inputs are always saved (jax.checkpoint)
        if policy == "dots":
            saved |= _dots(graph, fwd.body)
        _rewrite(graph, ops, order, loops, fwd.name, bwd.name, residual, saved, "remat")
    return _rebuilt(graph, ops, order, loops, f"{graph.name}[remat={policy}]")


def recompute_residuals(graph: Graph, recompute: Collection[str], *, prefix: str) -> Graph:
    """``graph`` with the forward-scan tensors ``recompute`` no longer saved for the backward
    scan: each backward scan that slices one of them recomputes it from the tensors it is
    computed from, which are saved instead (stacked, or the residual stacks already there);
    what the step computes is unchanged. The mechanics of :func:`rematerialize` with every
    body tensor not in ``recompute`` saved (fused attention's recompute of its scores,
    :mod:`autolayout.costmodel.attention`); the clones are named ``<prefix>/<tensor>``.
    ``graph`` itself when no residual of a forward scan is in ``recompute``."""
    ops = {op.name: op for op in graph.ops()}
    order = list(graph.order)
    loops = dict(graph.loops)
    changed = False
    for fwd, bwd, residual in remat_pairs(graph):
        mine = [s for s in residual if graph.op(s).inputs[0] in recompute]
        if mine:
            changed = True
            _rewrite(graph, ops, order, loops, fwd.name, bwd.name, mine, set(fwd.body) - set(recompute), prefix)
    return _rebuilt(graph, ops, order, loops, f"{graph.name}[{prefix}]") if changed else graph


def _rebuilt(graph: Graph, ops: dict, order: list, loops: dict, name: str) -> Graph:
    keep = [n for n in order if n in ops]
    return Graph([ops[n] for n in keep], input_names=graph.input_names, in_tree=graph.in_tree,
                 outputs=graph.outputs, out_tree=graph.out_tree, loops=list(loops.values()),
                 name=name, param_roles=graph.param_roles, donated=graph.donated,
                 fn=graph.fn, example_spec=graph.example_spec, arg_dims=graph.arg_dims,
                 arg_roles=graph.arg_roles)


def _rewrite(graph: Graph, ops: dict, order: list, loops: dict, fname: str, bname: str,
             residual: list[str], saved: set[str], prefix: str) -> None:
    fwd, bwd = loops[fname], loops[bname]
    body = set(fwd.body)
    saved_name = "saved" if prefix == "remat" else f"{prefix}/saved"
    source = {s: graph.op(s).inputs[0] for s in residual}
    dropped = [s for s in residual if source[s] not in saved]
    if not dropped:
        return
    # the forward ops the backward scan must recompute: producers of the dropped residuals
    # inside the forward body, up to saved tensors and the forward's slices of stacked inputs
    need: set[str] = set()
    stack = [source[s] for s in dropped]
    while stack:
        t = stack.pop()
        if t in need or t not in body or t in saved or graph.op(t).fn == "slice":
            continue
        need.add(t)
        stack.extend(graph.op(t).inputs)
    inputs_of_need = {i for t in need for i in graph.op(t).inputs if i in body and i not in need}
    stack_of = {graph.op(s).inputs[0]: s for s in fwd.stacks}
    bslice_of = {graph.op(s).inputs[0]: s for s in bwd.slices}
    mapping: dict[str, str] = {}
    new_fwd_stacks, new_bwd_slices, new_body = [], [], []
    for t in sorted(inputs_of_need, key=order.index):
        op = graph.op(t)
        if op.fn == "slice" and op.loop == fname:  # re-slice the same stacked input in the backward scan
            mapping[t] = _slice(ops, f"{prefix}/{t}", op.inputs[0], op.output, op.attrs, bwd)
            new_bwd_slices.append(mapping[t])
            continue
        # a saved tensor: stacked by the forward scan (reuse a residual stack) and sliced back
        st = stack_of.get(t)
        if st is None:
            st = _stack(ops, f"{saved_name}/{t}", op.output, fwd)
            new_fwd_stacks.append(st)
        sl = bslice_of.get(st)
        if sl is None or sl not in ops:
            sl = _slice(ops, f"{saved_name}/{t}/slice", st, op.output,
                        (("groups", ((( fwd.dim,), ()),) + tuple(((d,), (d,)) for d in op.output.dim_names)),), bwd)
            new_bwd_slices.append(sl)
        mapping[t] = sl
    for t in sorted(need, key=order.index):
        op = graph.op(t)
        name = f"{prefix}/{t}"
        mapping[t] = name
        out = dataclasses.replace(op.output, name=name, role="activation")
        replay = op.replay
        if replay is not None:
            replay = Replay(replay.fn, tuple(("tensor", mapping.get(o[1], o[1]), *o[2:]) if o[0] == "tensor" else o
                                             for o in replay.operands))
        ops[name] = dataclasses.replace(op, name=name, inputs=tuple(mapping.get(i, i) for i in op.inputs),
                                        output=out, multiplicity=bwd.length, loop=bname, replay=replay, hbm=())
        new_body.append(name)
    # the backward scan reads the recomputed values instead of the dropped residuals
    dead = set()
    for s in dropped:
        for sl in graph.consumers(s):
            dead.add(sl)
            for c in graph.consumers(sl):
                _redirect(ops, c, sl, mapping[source[s]])
        dead.add(s)
    for n in dead:
        ops.pop(n, None)
    # new ops: stacks right after the forward body, slices and clones at the backward body's start
    at = max(order.index(n) for n in fwd.body) + 1
    order[at:at] = new_fwd_stacks
    first = min(order.index(n) for n in bwd.body)
    order[first:first] = new_bwd_slices + new_body
    loops[fname] = dataclasses.replace(fwd, stacks=tuple(s for s in fwd.stacks if s not in dead) + tuple(new_fwd_stacks))
    loops[bname] = dataclasses.replace(
        bwd, slices=tuple(s for s in bwd.slices if s not in dead) + tuple(new_bwd_slices),
        body=tuple(new_bwd_slices) + tuple(new_body) + tuple(n for n in bwd.body if n not in dead))


def _redirect(ops: dict, consumer: str, old: str, new: str) -> None:
    op = ops[consumer]
    replay = op.replay
    if replay is not None:
        replay = Replay(replay.fn, tuple(("tensor", new, *o[2:]) if o[0] == "tensor" and o[1] == old else o
                                         for o in replay.operands))
    ops[consumer] = dataclasses.replace(op, inputs=tuple(new if i == old else i for i in op.inputs), replay=replay)


def _slice(ops: dict, name: str, src: str, like: Tensor, attrs: tuple, bwd: Loop) -> str:
    """A backward-scan slice of stacked ``src`` with the per-layer tensor ``like``'s dims."""
    src_t = ops[src].output
    ops[name] = Op(name=name, kind="reshape", fn="slice", inputs=(src,), input_shapes=(src_t.shape,),
                   output=dataclasses.replace(like, name=name, role="activation"), multiplicity=bwd.length,
                   loop=bwd.name, attrs=attrs, input_dtypes=(src_t.dtype,))
    return name


def _stack(ops: dict, name: str, t: Tensor, fwd: Loop) -> str:
    """A forward-scan stack of per-layer tensor ``t`` (the loop dim in front)."""
    from autolayout.core import Dim

    shape = (Dim(fwd.dim, fwd.length), *t.shape)
    groups = (((), (fwd.dim,)),) + tuple(((d.name,), (d.name,)) for d in t.shape)
    ops[name] = Op(name=name, kind="reshape", fn="stack", inputs=(t.name,), input_shapes=(t.shape,),
                   output=Tensor(name, shape, t.dtype, "activation"), multiplicity=1, loop=None,
                   attrs=(("groups", groups),), input_dtypes=(t.dtype,))
    return name
