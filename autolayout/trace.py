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
from typing import Any, Callable, Mapping, Sequence

from autolayout._build import _build
from autolayout._dims import DimsError, leaf_dims, leaf_role, unboxed_path
from autolayout._interpret import _Tracer, plain_dtype
from autolayout._roles import param_roles
from autolayout.core import LayoutError
from autolayout.mesh import check_name
from autolayout._unify import NAME_TAG, TraceError, _path_str, _Pending
from autolayout.graph import Graph

__all__ = ["trace", "named", "TraceError", "DimsError"]


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


def _check_dim_name(name: str, where: str) -> None:
    try:
        check_name(name, "dim name")
    except LayoutError as exc:
        raise TraceError(f"{where}: {exc} (those characters separate dims and mesh axes in layouts)") from exc


def trace(fn: Callable, *args: Any, dims: Any = None, roles: Any = None,
          name: str | None = None, donate_argnums: Sequence[int] = (), axis_metadata: bool = True,
          names: Mapping[str, str] | None = None) -> Graph:
    """Trace ``fn(*args)`` into a named-dimension :class:`Graph`.

    ``args`` may hold arrays or ``jax.ShapeDtypeStruct`` s (nothing is allocated).
    ``dims`` mirrors ``args`` (a prefix is fine; ``None`` = infer) with one name
    per axis: ``"batch length d_model"`` or ``("batch", "length", "d_model")``;
    ``"_"`` or ``None`` for one axis leaves it to inference.
    ``roles`` mirrors ``args`` likewise with ``"input" | "param" | "opt_state"``.

    **Pytree prefixes** (module :mod:`autolayout._dims`): ``dims`` and ``roles`` may be any
    prefix of the arguments' pytree — tuples, lists, dicts, dataclasses and ``TrainState`` s
    are followed by index, key or attribute (a dict may stand for an object:
    ``{"params": {"Dense_0": {"kernel": "embed mlp"}}}``, and the top level may be keyed by
    the function's parameter names: ``dims={"batch": "batch length"}``); a dict may leave
    entries out (they infer) but naming an entry the arguments lack is a :class:`DimsError`
    (a ``ValueError``) naming the path. A leaf's dims may also be a ``PartitionSpec`` of
    logical names (``nn.get_partition_spec(variables)``) or a names tuple for a boxed
    parameter (``nn.LogicallyPartitioned``, ``nnx.Param``).

    **Flax metadata** (``axis_metadata=True``): a leaf with no ``dims`` takes the logical axis
    names its Flax box carries — ``nn.with_logical_partitioning(init, ("embed", "mlp"))`` in
    linen, ``nnx.with_partitioning`` / ``out_sharding`` metadata in nnx — so an annotated model
    needs no ``dims``. Roles not given come from the library types: a ``TrainState``'s
    ``params`` are parameters and its ``opt_state`` optimizer state; ``nnx.Param`` s are
    parameters and nnx optimizer variables optimizer state.

    ``names`` renames dims of the traced graph (:meth:`Graph.rename`), e.g. the automatic
    ``d<size>`` names of axes nothing names: ``names={"d4": "heads"}``.
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
    with the parameter's shape, or a factor of it (the shape with axes dropped:
    ``optax.adafactor``'s ``v_row`` and ``v_col``); the update is the output leaf at the parameter's own path
    (``step(params, opt_state, batch) -> (params, opt_state, loss)``, or a ``TrainState``
    in and out), else at its place in the one output subtree of the container's
    structure; the gradient is, among the tensors every path from the backward pass (what
    is computed from ``"input"`` arguments) into the update goes through, the one nearest
    the update that neither reads optimizer state nor is an element-wise map of one
    backward-pass tensor alone (learning-rate scalings, weight decay and casts belong to
    the update; clip-by-global-norm's output, which mixes all gradients, is the gradient).
    Limits: optimizer state that does not mirror the params tree, or whose leaf there is
    neither the parameter's shape nor a factor of it (``optax.masked``'s placeholders,
    adafactor's one-element placeholders), is not paired; a state leaf that would
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
    for path, leaf in flat:  # jax.make_jaxpr's own message points at jax.jit's static_argnums
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")) and not isinstance(leaf, (bool, int, float, complex)):
            raise TraceError(
                f"argument {jax.tree_util.keystr(tuple(path))} is a {type(leaf).__qualname__}, not an array: "
                f"trace takes a step's array arguments, as jax.jit does. Pass the arrays only and close over the rest "
                f"(equinox: params, static = eqx.partition(model, eqx.is_array), and in the step "
                f"eqx.combine(params, static); Flax NNX: nnx.split(model))")
    closed = jax.make_jaxpr(fn)(*args)
    # Drop dead equations (e.g. the unused max-residuals of jax.nn.softmax's derivative):
    # jit removes them before they run, so the graph (and the cost model) must not count them.
    from jax._src.interpreters import partial_eval as pe
    live, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    closed = closed.replace(jaxpr=live)
    for tree, what in ((dims, "dims"), (roles, "roles")):
        if isinstance(tree, (list, tuple)) and len(tree) > len(args):  # one entry per argument
            raise DimsError(f"{what} has an entry [{len(args)}] that matches no argument: {len(tree)} entries "
                            f"for {len(args)} arguments; give {what} one entry per argument (or a prefix)")
    tr = _Tracer()
    in_vals, in_names, in_roles = [], [], []
    plain = [(_path_str(unboxed_path(p)[1:]) if len(p) > 1 else "") for p, _ in flat]
    counts: dict[str, int] = {}
    for s in plain:
        counts[s] = counts.get(s, 0) + 1
    prefixes: dict[tuple, int] = {}
    for p, _ in flat:
        for i in range(len(p) + 1):
            prefixes[tuple(p[:i])] = prefixes.get(tuple(p[:i]), 0) + 1
    for k, ((path, leaf), var) in enumerate(zip(flat, closed.jaxpr.invars)):
        top = arg_names[path[0].idx] if arg_names and path[0].idx < len(arg_names) else f"arg{path[0].idx}"
        short = plain[k]
        tname = short if short and counts[short] == 1 else "/".join(x for x in (top, short) if x)
        aval = var.aval
        where = f"argument {tname!r}" + (f" (at {top}{jax.tree_util.keystr(tuple(path[1:]))})" if len(path) > 1 else "")
        n_under = [prefixes[tuple(path[:i])] for i in range(len(path) + 1)]
        role = leaf_role(roles, args, path, n_under, arg_names, where) or "input"
        if role not in ("input", "param", "opt_state"):
            raise TraceError(f"argument {tname!r}: role {role!r} is not one of 'input', 'param', 'opt_state'")
        v = tr.new_val(aval.shape, plain_dtype(aval.dtype))  # a typed PRNG key: its uses are reported
        axis_names, source = leaf_dims(dims, args, path, n_under, tuple(aval.shape), arg_names, where,
                                  metadata=axis_metadata)
        for n, size, slot in zip(axis_names or (), aval.shape, v.slots):
            if n not in (None, "_"):
                _check_dim_name(n, f"dims of {where}")
            if n not in (None, "_") and slot is not None:  # "_" = infer, as in named()
                tr.name_slot(slot, n, f"{where} of shape {tuple(aval.shape)}"
                             + (f" (names from {source})" if source != "dims" else ""))
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
    g = Graph(g.ops(), input_names=g.input_names, in_tree=g.in_tree, outputs=g.outputs,
              out_tree=g.out_tree, loops=tuple(g.loops.values()), name=g.name,
              param_roles=roles_found, donated=_donations(g, flat, in_names, out_tree, donate_argnums),
              fn=fn, example_spec=spec, arg_dims=dims, arg_roles=roles)
    return g.rename(names) if names else g


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
