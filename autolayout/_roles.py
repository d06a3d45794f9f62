"""Parameter roles from pytree structure (see :func:`autolayout.trace` for the rules).

For each parameter leaf of the traced function's arguments the tracer records its
optimizer state, its updated value and its gradient (:class:`~autolayout.graph.ParamRole`):

* the parameter's *container* is the largest subtree of the arguments around it whose
  leaves are all parameters (``params`` of ``step(params, opt_state, batch)``,
  ``state.params`` of a ``TrainState``); ``rel`` is the parameter's path inside it;
* *optimizer state*: every subtree of the arguments other than the container with the
  container's tree structure (optax's ``ScaleByAdamState(mu=<params>, nu=<params>)``,
  ``MultiStepsState.acc_grads``, :func:`autolayout.train_step`'s ``{"mu": <params>, ...}``)
  contributes its leaf at ``rel`` if that leaf is an ``opt_state`` argument of the
  parameter's shape or of a factor of it (the shape with axes dropped: ``optax.adafactor``'s
  row and column moments ``v_row``, ``v_col``; not its one-element placeholders); a leaf
  that would pair with two parameters pairs with none;
* *update*: the output leaf at the parameter's own path (``(params, opt_state, loss)``
  returns the new parameters where the arguments held the old ones), else the leaf at
  ``rel`` of the one output subtree with the container's structure; it must have the
  parameter's shape and be computed (not the argument passed through);
* *gradient*: the backward pass is everything computed from an ``input`` argument (the
  batch). Of the tensors that every path from it into the update goes through
  (dominators), the gradient is the one nearest the update that neither depends on
  optimizer state nor is an element-wise map of a single backward-pass tensor with
  constants, the parameter or optimizer-side values (a learning-rate scaling, a
  decoupled weight decay, a sign flip). A transform that mixes several backward-pass
  tensors, as clip-by-global-norm does, ends the walk: its output is the gradient.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import networkx as nx

from autolayout.graph import Graph, ParamRole

_SOURCE = ("input", "param", "opt_state", "constant")


def param_roles(graph: Graph, args: Any, in_paths: Sequence[tuple], in_names: Sequence[str],
                in_roles: Sequence[str]) -> dict[str, ParamRole]:
    """``ParamRole`` of every parameter of ``graph`` (traced from ``fn(*args)``);
    ``in_paths[k]`` is the key path of the k-th argument leaf, named ``in_names[k]``."""
    import jax

    role_at = {tuple(p): r for p, r in zip(in_paths, in_roles)}
    name_at = {tuple(p): n for p, n in zip(in_paths, in_names)}
    arg_nodes = dict(_subtrees(tuple(args), ()))
    out_leaves = list(range(len(graph.outputs)))
    out_obj = jax.tree_util.tree_unflatten(graph.out_tree, out_leaves)
    out_nodes = dict(_subtrees(out_obj, ()))
    out_at = {p: i for p, i in out_nodes.items() if _is_leaf(i)}

    pairs: dict[str, list[tuple[str, str]]] = {}  # opt-state leaf -> [(param, ...)]
    found: dict[str, dict] = {}
    for path, name, role in zip(in_paths, in_names, in_roles):
        if role != "param":
            continue
        path = tuple(path)
        cpath = _container(path, role_at)
        rel = path[len(cpath):]
        tdef = _structure(arg_nodes[cpath])
        shape = tuple(arg_nodes[path].shape)
        info = found[name] = {"state": [], "update": None}
        for q, node in arg_nodes.items():
            if q == cpath or _structure(node) != tdef:
                continue
            leaf = q + rel
            if role_at.get(leaf) == "opt_state" and _pairs(tuple(arg_nodes[leaf].shape), shape):
                pairs.setdefault(name_at[leaf], []).append(name)
        own = _own_output_path(path, args, out_obj)
        info["update"] = _update(graph, name, shape, own, rel, tdef, out_at, out_nodes)
    for state, params in pairs.items():
        if len(params) == 1:
            found[params[0]]["state"].append(state)

    grads = _gradients(graph, {n: f["update"] for n, f in found.items() if f["update"]})
    return {n: ParamRole(n, grads.get(n), tuple(f["state"]), f["update"]) for n, f in found.items()}


def _pairs(state: tuple, param: tuple) -> bool:
    """Whether an optimizer-state leaf of shape ``state`` at a parameter's place can be its
    state: the parameter's shape, or a *factor* of it — the shape with some axes dropped
    (``optax.adafactor``'s row and column second moments ``v_row``, ``v_col``). One-element
    placeholders (adafactor's ``(1,)`` for the unfactored moments) are not state."""
    if state == param:
        return True
    if not state or len(state) >= len(param) or math.prod(state) <= 1:
        return False
    it = iter(param)
    return all(any(n == m for m in it) for n in state)  # a subsequence of the param's axes


def _structure(node: Any) -> tuple:
    """A subtree's shape for pairing: the key paths of its leaves. Unlike the treedef it
    ignores container types and metadata, so that an ``nnx.Param`` pairs with the
    ``OptVariable`` at its place in the optimizer state (both hold ``.value``)."""
    import jax

    if node is None or _is_leaf(node):
        return ("<leaf>",)
    return tuple(jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(node)[0])


def _own_output_path(path: tuple, args: Any, out: Any) -> tuple:
    """Where the parameter at argument path ``path`` sits in the output: the same path when
    the step returns a tuple like its arguments (``(params, opt_state, loss)``, ``(state,
    metrics)``); the path inside the argument when it returns that argument's type alone
    (``step(state, batch) -> state``)."""
    arg = args[path[0].idx] if path and hasattr(path[0], "idx") else None
    if arg is not None and not isinstance(out, (tuple, list)) and type(out) is type(arg):
        return path[1:]
    return path


def _is_leaf(x: Any) -> bool:
    import jax
    return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x)) and x is not None


def _subtrees(node: Any, path: tuple) -> Iterable[tuple[tuple, Any]]:
    """Every subtree of ``node`` (itself included) with its key path."""
    import jax

    yield path, node
    if node is None or _is_leaf(node):
        return
    children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    for key, child in children:
        yield from _subtrees(child, path + tuple(key))


def _container(path: tuple, role_at: dict) -> tuple:
    """The shortest prefix of ``path`` under which every argument leaf is a parameter."""
    for k in range(len(path) + 1):
        prefix = path[:k]
        if all(r == "param" for p, r in role_at.items() if p[:k] == prefix):
            return prefix
    return path


def _update(graph: Graph, name: str, shape: tuple, path: tuple, rel: tuple, tdef: Any,
            out_at: dict, out_nodes: dict) -> str | None:
    """The output tensor holding ``name``'s new value (see the module docstring)."""
    def usable(i: int | None) -> str | None:
        if i is None:
            return None
        spec = graph.outputs[i]
        t = spec.tensor
        if t is None or t == name or graph.op(t).kind in _SOURCE or tuple(spec.shape) != shape:
            return None
        return t

    same = usable(out_at.get(path))
    if same is not None:
        return same
    mirrors = [q for q, node in out_nodes.items() if node is not None and _structure(node) == tdef]
    if len(mirrors) == 1:
        return usable(out_at.get(mirrors[0] + rel))
    return None


def _reach(graph: Graph, sources: Iterable[str]) -> set[str]:
    """``sources`` and every tensor computed from them."""
    seen, stack = set(), list(sources)
    while stack:
        t = stack.pop()
        if t not in seen:
            seen.add(t)
            stack.extend(graph.consumers(t))
    return seen


def _gradients(graph: Graph, updates: dict[str, str]) -> dict[str, str]:
    """Parameter -> gradient tensor, by dominators of each update over the backward pass."""
    inputs = [t.name for t in graph.tensors() if t.role == "input"]
    backward = _reach(graph, inputs)
    if not backward or not updates:
        return {}
    state_side = _reach(graph, [t.name for t in graph.tensors() if t.role == "opt_state"])
    h = nx.DiGraph(graph.nx.subgraph(backward))
    root = object()
    h.add_edges_from((root, t) for t in inputs)
    idom = nx.immediate_dominators(h, root)

    def element_map(t: str) -> bool:
        """``t`` is an element-wise map of one backward-pass tensor (a rename, a scaling)."""
        op = graph.op(t)
        if op.kind == "reshape" and op.fn == "rename":
            return True
        if op.kind != "elementwise":
            return False
        if len({i for i in op.inputs if i in backward}) != 1:
            return False
        literal = op.replay is not None and any(o[0] == "literal" for o in op.replay.operands)
        return literal or any(i not in backward for i in op.inputs)

    grads = {}
    for param, upd in updates.items():
        if upd not in idom:
            continue
        t = idom[upd]
        while t is not root and graph.tensor(t).role != "input":
            if t not in state_side and not element_map(t):
                grads[param] = t
                break
            t = idom[t]
    return grads
