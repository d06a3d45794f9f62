"""Trace a plain JAX function into a named-dimension :class:`~autolayout.graph.Graph`.

Two passes over ``jax.make_jaxpr``'s output (DESIGN §3):

1. *Interpret*: every axis of every value gets a slot; slots are merged by
   union-find as equations relate axes (elementwise positions, ``dot_general``
   batch/contracting pairs, kept axes of reductions and broadcasts, permuted
   axes of transposes, single-axis groups of reshapes, scan carries and slices).
   Two axes of one tensor may never share a class (paper §4): a merge that
   would break this is refused and a ``reshape`` (rename) op is inserted on the
   operand instead — how Mesh-TensorFlow models attention's memory length.
   Calls (``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat2``) are
   inlined; ``scan`` bodies are interpreted once and carry a multiplicity.
2. *Build*: classes get names (the user's, a ``_1`` suffix for renames, else a
   deterministic ``d<size>`` name) and pending equations become :class:`Op` s.

Transposes, size-1 squeezes and broadcasts feeding elementwise ops are aliases,
not ops: named tensors have no axis order that matters, and elementwise ops
broadcast by name. A broadcast feeding anything else becomes a one-input
``einsum`` (fn ``broadcast``).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

from autolayout._build import _build
from autolayout._interpret import _Tracer
from autolayout._roles import param_roles
from autolayout.core import LayoutError, _check_name
from autolayout._unify import NAME_TAG, TraceError, _path_str, _Pending
from autolayout.graph import Graph

__all__ = ["trace", "named", "TraceError"]


def named(x: Any, dims: str | Sequence[str] | None = None, *, name: str | None = None) -> Any:
    """Name a value's axes (and/or the tensor) inside a function to be traced.

    An identity at run time (it is ``jax.ad_checkpoint.checkpoint_name`` with a
    tag the tracer reads). Use it for axes that no argument has, e.g. an MoE
    expert's capacity; ``"_"`` leaves an axis to inference.

    Example::

        slot = named(jax.nn.one_hot(pos, capacity), "batch length experts capacity")
        h = named(jax.nn.relu(x @ w), name="h")
    """
    from jax.ad_checkpoint import checkpoint_name

    if dims is not None and not isinstance(dims, str):
        dims = " ".join(d if d is not None else "_" for d in dims)
    for d in (dims or "").split():
        if d != "_":
            _check_dim_name(d, f"named(..., {dims!r})")
    tag = NAME_TAG + "|".join(f"{k}={v}" for k, v in (("name", name), ("dims", dims)) if v)
    return checkpoint_name(x, tag)


def _lookup(tree: Any, path: Sequence[Any], what: str = "dims") -> Any:
    """Follow a jax key path into a user pytree that may stop early (a prefix).

    Raises :class:`TraceError` naming ``what`` and the argument path when the tree has
    no entry there (it does not mirror ``args``)."""
    from jax.tree_util import DictKey, GetAttrKey, SequenceKey, keystr

    node = tree
    for i, key in enumerate(path):
        if node is None or isinstance(node, str):
            return node
        try:
            if isinstance(key, DictKey):
                node = node[key.key]
            elif isinstance(key, SequenceKey):
                node = node[key.idx]
            elif isinstance(key, GetAttrKey):
                node = getattr(node, key.name)
            else:
                node = node[getattr(key, "key", getattr(key, "idx", key))]
        except (KeyError, IndexError, AttributeError, TypeError) as exc:
            raise TraceError(
                f"{what} does not mirror args: no entry for argument {keystr(tuple(path[:i + 1]))} "
                f"(in {type(node).__name__} {_short(node)}); give {what} the structure of args, or a prefix "
                f"of it, or None for an argument to infer") from exc
    return node


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_mirror(tree: Any, args: Any, what: str) -> None:
    """Every entry of the user pytree ``tree`` (``dims``/``roles``) names an argument: an
    entry that matches no part of ``args`` is an error, not ignored. (Walks both side by
    side; ``None``/a string/a tuple of names ends the walk: it covers the whole subtree.)"""
    from collections.abc import Mapping

    def bad(path: str) -> TraceError:
        return TraceError(f"{what} has an entry {path} that matches no argument; "
                          f"give {what} the structure of args (or a prefix of it)")

    def walk(node: Any, arg: Any, path: str) -> None:
        if node is None or isinstance(node, str) or (path and _is_names(node)):
            return
        if isinstance(node, Mapping):
            for k, v in node.items():
                if not isinstance(arg, Mapping) or k not in arg:
                    raise bad(f"{path}[{k!r}]")
                walk(v, arg[k], f"{path}[{k!r}]")
        elif isinstance(node, tuple) and hasattr(node, "_fields"):  # a namedtuple: jax keys its fields
            for k, v in zip(node._fields, node):
                if not hasattr(arg, k):
                    raise bad(f"{path}.{k}")
                walk(v, getattr(arg, k), f"{path}.{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                if not isinstance(arg, (list, tuple)) or i >= len(arg):
                    raise bad(f"{path}[{i}]")
                walk(v, arg[i], f"{path}[{i}]")

    walk(tree, args, "")


def _check_dim_name(name: str, where: str) -> None:
    try:
        _check_name(name, "dim name")
    except LayoutError as exc:
        raise TraceError(f"{where}: {exc} (those characters separate dims and mesh axes in layouts)") from exc


def _is_names(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(n, str) or n is None for n in x)


def trace(fn: Callable, *args: Any, dims: Any = None, roles: Any = None,
          name: str | None = None, donate_argnums: Sequence[int] = ()) -> Graph:
    """Trace ``fn(*args)`` into a named-dimension :class:`Graph`.

    ``args`` may hold arrays or ``jax.ShapeDtypeStruct`` s (nothing is allocated).
    ``dims`` mirrors ``args`` (a prefix is fine; ``None`` = infer) with one name
    per axis: ``"batch length d_model"`` or ``("batch", "length", "d_model")``;
    ``"_"`` or ``None`` for one axis leaves it to inference.
    ``roles`` mirrors ``args`` likewise with ``"input" | "param" | "opt_state"``.
    ``donate_argnums`` (as for ``jax.jit``): arguments whose buffers the outputs reuse —
    an output leaf at the same position and path as a leaf of a donated argument (e.g.
    the new ``params`` of ``(params, opt_state, batch) -> (params, opt_state, loss)``)
    takes that input's memory once the input is last read (``graph.donated``).

    **Parameter roles** (``graph.param_roles``) come from the pytree structure, never from
    tensor names: for each ``"param"`` leaf its optimizer state, its updated value and its
    gradient. The rule (module :mod:`autolayout._roles`): the parameter's *container* is
    the largest argument subtree holding only parameters; optimizer-state leaves are those
    at the parameter's place in any other argument subtree of the container's structure
    (optax states mirror the params tree: ``ScaleByAdamState(mu=<params>, nu=<params>)``)
    with the parameter's shape; the update is the output leaf at the parameter's own path
    (``step(params, opt_state, batch) -> (params, opt_state, loss)``, or a ``TrainState``
    in and out), else at its place in the one output subtree of the container's
    structure; the gradient is, among the tensors every path from the backward pass (what
    is computed from ``"input"`` arguments) into the update goes through, the one nearest
    the update that neither reads optimizer state nor is an element-wise map of one
    backward-pass tensor alone (learning-rate scalings, weight decay and casts belong to
    the update; clip-by-global-norm's output, which mixes all gradients, is the gradient).
    Limits: optimizer state that does not mirror the params tree (factored states of
    another shape, ``optax.masked``'s placeholders) is not paired; a state leaf that would
    pair with two parameters (separate same-shape parameter arguments) pairs with none; a
    step whose loss reads no ``"input"`` argument finds no gradients; an output order that
    leaves several output subtrees shaped like the params (``(loss, params, adam_state)``)
    finds no update. Whatever is not found is ``None`` (or ``()``), visible in
    ``graph.param_roles``.

    Example::

        g = trace(lambda x, w: jnp.tanh(x @ w),
                  jax.ShapeDtypeStruct((8, 16), jnp.float32),
                  jax.ShapeDtypeStruct((16, 32), jnp.float32),
                  dims=("batch io", "io hidden"), roles=("input", "param"))
        g.dims  # {'batch': 8, 'io': 16, 'hidden': 32}
    """
    import jax

    flat, in_tree = jax.tree_util.tree_flatten_with_path(args)
    try:
        arg_names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        arg_names = []
    closed = jax.make_jaxpr(fn)(*args)
    # Drop dead equations (e.g. the unused max-residuals of jax.nn.softmax's derivative):
    # jit removes them before they run, so the graph (and the cost model) must not count them.
    from jax._src.interpreters import partial_eval as pe
    live, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    closed = closed.replace(jaxpr=live)
    for tree, what in ((dims, "dims"), (roles, "roles")):
        if tree is not None:
            _check_mirror(tree, args, what)
    tr = _Tracer()
    in_vals, in_names, in_roles = [], [], []
    plain = [(_path_str(p[1:]) if len(p) > 1 else "") for p, _ in flat]
    counts: dict[str, int] = {}
    for s in plain:
        counts[s] = counts.get(s, 0) + 1
    for k, ((path, leaf), var) in enumerate(zip(flat, closed.jaxpr.invars)):
        top = arg_names[path[0].idx] if arg_names and path[0].idx < len(arg_names) else f"arg{path[0].idx}"
        short = plain[k]
        tname = short if short and counts[short] == 1 else "/".join(x for x in (top, short) if x)
        role = _lookup(roles, path, "roles") if roles is not None else None
        role = role or "input"
        if role not in ("input", "param", "opt_state"):
            raise TraceError(f"argument {tname!r}: role {role!r} is not one of 'input', 'param', 'opt_state'")
        aval = var.aval
        v = tr.new_val(aval.shape, aval.dtype)
        names = _lookup(dims, path) if dims is not None else None
        if names is not None:
            if isinstance(names, str):
                names = tuple(names.replace(",", " ").split())
            if len(names) != len(aval.shape):
                raise TraceError(
                    f"argument {tname!r} has shape {tuple(aval.shape)} ({len(aval.shape)} axes) but dims "
                    f"gives {len(names)} names {names}: give one name per axis, e.g. "
                    f"{' '.join(f'd{i}' for i in range(len(aval.shape)))!r}")
            for n, size, slot in zip(names, aval.shape, v.slots):
                if n not in (None, "_"):
                    _check_dim_name(n, f"dims of argument {tname!r}")
                if n not in (None, "_") and slot is not None:  # "_" = infer, as in named()
                    tr.name_slot(slot, n, f"argument {tname!r} of shape {tuple(aval.shape)}")
        tr.add(_Pending(role, role, role, v, [], [], None, None, 1, "", role=role, path_name=tname))
        in_vals.append(v)
        in_names.append(tname)
        in_roles.append(role)
    outs = tr.run(closed.jaxpr, closed.consts, in_vals, (None, 1))
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))
    g = _build(tr, in_vals, in_names, outs, closed.jaxpr.outvars, in_tree_of(args), out_tree,
               name or getattr(fn, "__name__", "graph"))
    spec = jax.eval_shape(lambda *a: a, *args)
    roles_found = param_roles(g, spec, [p for p, _ in flat], in_names, in_roles)
    return Graph(g.ops(), input_names=g.input_names, in_tree=g.in_tree, outputs=g.outputs,
                 out_tree=g.out_tree, loops=tuple(g.loops.values()), name=g.name,
                 param_roles=roles_found, donated=_donations(g, flat, in_names, out_tree, donate_argnums),
                 fn=fn, example_spec=spec, arg_dims=dims, arg_roles=roles)


def _donations(g: Graph, flat: list, in_names: list, out_tree: Any, donate: Sequence[int]) -> dict:
    """Output tensor -> the donated input tensor whose buffer it reuses (same position,
    path, shape and dtype)."""
    import jax

    if not donate:
        return {}
    by_path = {}
    for (path, _), name in zip(flat, in_names):
        if path and getattr(path[0], "idx", None) in set(donate):
            by_path[tuple(str(k) for k in path)] = name
    out_paths = jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(out_tree, list(range(out_tree.num_leaves))))[0]
    donated = {}
    for (path, _), spec in zip(out_paths, g.outputs):
        src = by_path.get(tuple(str(k) for k in path))
        if src is None or spec.tensor is None or spec.tensor in donated or spec.tensor == src:
            continue
        a, b = g.tensor(spec.tensor), g.tensor(src)
        if set(a.dim_names) == set(b.dim_names) and a.dtype == b.dtype and g.op(spec.tensor).kind not in (
                "input", "param", "opt_state"):
            donated[spec.tensor] = src
    return donated


def in_tree_of(args: Any) -> Any:
    import jax
    return jax.tree_util.tree_structure(args)
