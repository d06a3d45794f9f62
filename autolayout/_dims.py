"""Dim names and roles of the traced function's argument leaves, from user pytrees and
from the axis metadata Flax attaches to parameters.

``dims`` and ``roles`` (arguments of :func:`autolayout.trace`) mirror the arguments as
any *prefix* of their pytree: a string or ``None`` covers a whole subtree; containers
(tuples, lists, dicts, dataclasses, ``TrainState`` s, ``nnx.State`` s) are followed by
key, index or attribute name; a dict may stand for an object (``{"params": ...}`` for a
``TrainState``'s attributes) and the top level may be keyed by the function's parameter
names. One leaf's dims are ``"batch length embed"``, a tuple of names (``None`` or
``"_"`` = infer), a ``PartitionSpec`` of logical names (``nn.get_partition_spec`` of
logically partitioned params) or a Flax box carrying names. A tuple of names also
covers a leaf wrapped in a box (``nn.LogicallyPartitioned``, ``nnx.Param``), whose value
sits one key further down.

Without ``dims`` for a leaf, its names come from its Flax metadata when it has some:
``nn.with_logical_partitioning(init, ("embed", "mlp"))`` in linen
(``LogicallyPartitioned.names``) and ``nnx.with_partitioning`` / ``nnx.Param(...,
out_sharding=...)`` in nnx (the variable's ``out_sharding``, formerly ``sharding``
metadata). Linen's plain ``nn.Partitioned`` names *mesh axes*, not dims, and is not read.

Roles not given come from library types: leaves under a Flax ``TrainState``'s ``params``
are ``"param"`` and under its ``opt_state`` ``"opt_state"``; an ``nnx.Param`` is a
``"param"`` and an nnx optimizer variable (``OptVariable``, ``OptState``) ``"opt_state"``.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from autolayout._unify import TraceError

__all__ = ["DimsError", "leaf_dims", "leaf_role", "unboxed_path"]


class DimsError(TraceError):
    """``dims`` or ``roles`` do not fit the arguments' pytree (names the path and the fix)."""


_NAME = re.compile(r"[^\s,]+")
_MISSING = object()
# nnx variable metadata keys holding a variable's (logical) axis names, newest first
# (flax 0.12: ``out_sharding``; earlier ``sharding_names`` and ``sharding``).
_NNX_KEYS = ("out_sharding", "sharding_names", "sharding")


def _keystr(path: Sequence[Any]) -> str:
    import jax

    return jax.tree_util.keystr(tuple(path)) if path else "(the whole argument)"


def _is_names(x: Any) -> bool:
    """A tuple of one leaf's axis names (not a tuple of per-leaf strings)."""
    from jax.sharding import PartitionSpec

    if isinstance(x, PartitionSpec):
        return True
    return isinstance(x, (tuple, list)) and all(
        n is None or (isinstance(n, str) and _NAME.fullmatch(n)) for n in x)


def _child(node: Any, key: Any) -> Any:
    """``node``'s child at one jax key (``_MISSING`` if it has none)."""
    from collections.abc import Mapping, Sequence as Seq

    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            k = getattr(key, attr)
            break
    else:
        return _MISSING
    if isinstance(node, Mapping):
        if k in node:
            return node[k]
        return node.get(str(k), _MISSING)
    if isinstance(node, Seq) and not isinstance(node, str):
        return node[k] if isinstance(k, int) and -len(node) <= k < len(node) else _MISSING
    if isinstance(k, str):
        if k == "value" and callable(getattr(node, "get_value", None)):
            return node.get_value()  # nnx variables (``.value`` is deprecated there)
        return getattr(node, k, _MISSING)
    try:
        return node[k]
    except (TypeError, KeyError, IndexError):
        return _MISSING


def _follow(tree: Any, args: Any, path: Sequence[Any], n_under: Sequence[int], arg_names: Sequence[str],
            what: str, where: str) -> Any:
    """The entry of ``tree`` (a prefix of the arguments' pytree ``args``) for the leaf at
    ``path``; ``n_under[i]`` is how many argument leaves share ``path[:i]``. A dict may
    leave entries out (they are ``None``); an entry the arguments do not have is an error."""
    from collections.abc import Mapping

    node, arg = tree, args
    for i, key in enumerate(path):
        if node is None or isinstance(node, str) or _box_names(node) is not None:
            return node
        if i > 0 and _is_names(node) and n_under[i] == 1 and not _is_seq_key(key):
            return node  # names of a leaf wrapped in a box (its value is one key down)
        if isinstance(node, Mapping):
            if i == 0 and node and set(node) <= set(arg_names):
                keys = list(arg_names)  # top level keyed by the function's parameter names
                child = node.get(arg_names[key.idx]) if key.idx < len(arg_names) else None
            else:
                keys = _child_keys(arg)
                child = _child(node, key)
                child = None if child is _MISSING else child
            extra = [k for k in node if k not in keys and str(k) not in map(str, keys)]
            if extra:
                import difflib
                close = difflib.get_close_matches(str(extra[0]), [str(k) for k in keys], n=1)
                raise DimsError(
                    f"{what} for {where}: the {what} tree names {extra[0]!r} at {_keystr(path[:i])}, which "
                    f"the arguments do not have there (they have {keys})."
                    + (f" Did you mean {close[0]!r}?" if close else "")
                    + f" Fix: give {what} the structure of the arguments (a prefix of it is fine).")
        else:
            child = _child(node, key)
        if child is _MISSING:
            raise DimsError(
                f"{what} for {where}: the {what} tree has no entry for {_keystr(path[i:i + 1])} at "
                f"{_keystr(path[:i])} (it holds {type(node).__name__} {_short(node)}). Fix: give {what} the "
                f"structure of the arguments (any prefix of it: a string or None covers a whole subtree), "
                f"e.g. None for this part.")
        node, arg = child, _child(arg, key)
    return node


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) < 80 else text[:77] + "..."


def _child_keys(node: Any) -> list:
    """The keys (dict keys, indices, attribute names) of ``node``'s pytree children."""
    import jax

    if node is _MISSING or node is None:
        return []
    children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    out = []
    for path, _ in children:
        k = path[0] if path else None
        out.append(next((getattr(k, a) for a in ("key", "idx", "name") if hasattr(k, a)), k))
    return out


def _is_seq_key(key: Any) -> bool:
    from jax.tree_util import SequenceKey

    return isinstance(key, SequenceKey)


def _box_names(node: Any) -> tuple | None:
    """Axis names carried by a Flax box: linen ``LogicallyPartitioned.names`` or an nnx
    variable's sharding metadata; ``None`` for anything else (plain ``nn.Partitioned``
    holds mesh axes, not names)."""
    mod = type(node).__module__ or ""
    if not mod.startswith("flax"):
        return None
    from flax.core import meta

    if isinstance(node, meta.Partitioned):
        cls = type(node)
        logical = any(c.__name__ == "LogicallyPartitioned" for c in cls.__mro__)
        return tuple(node.names) if logical else None
    get = getattr(node, "get_metadata", None)
    if callable(get):
        md = get()
        for k in _NNX_KEYS:
            names = md.get(k) if isinstance(md, dict) else None
            if names is not None:
                return tuple(names)
    return None


def _metadata(args: Any, path: Sequence[Any]) -> tuple[tuple | None, str]:
    """Names from the Flax box around the leaf at ``path`` (``args`` is the arguments tuple)."""
    node = args
    for i, key in enumerate(path):
        names = _box_names(node)
        if names is not None and len(path) - i == 1:
            return names, f"the Flax axis metadata ({type(node).__name__}) at {_keystr(path[:i])}"
        node = _child(node, key)
        if node is _MISSING:
            return None, ""
    return None, ""


def _as_names(entry: Any, shape: tuple, where: str, source: str) -> tuple | None:
    """One leaf's dims entry as a tuple of names (``None`` entries infer), or ``None``."""
    if entry is None:
        return None
    boxed = _box_names(entry)
    if boxed is not None:
        entry = boxed
    if isinstance(entry, str):
        names = tuple(entry.replace(",", " ").split())
    elif _is_names(entry):
        names = tuple(entry)
    else:
        raise DimsError(
            f"{where}: {source} gives {entry!r} ({type(entry).__name__}) for one array of shape {shape}; "
            f"give one name per axis, e.g. {' '.join(f'd{i}' for i in range(len(shape)))!r} or a tuple of "
            f"names (None to infer an axis), or None for the whole leaf")
    if len(names) != len(shape):
        raise DimsError(
            f"{where} has shape {shape} ({len(shape)} axes) but {source} gives {len(names)} names "
            f"{names}: give one name per axis, e.g. {' '.join(f'd{i}' for i in range(len(shape)))!r}")
    return names


def leaf_dims(dims: Any, args: tuple, path: Sequence[Any], n_under: Sequence[int], shape: tuple,
              arg_names: Sequence[str], where: str, *, metadata: bool = True) -> tuple[tuple | None, str]:
    """The dim names of the argument leaf at ``path`` (``None`` per axis = infer) and where
    they came from, or ``(None, "")`` when nothing names it."""
    if dims is not None:
        entry = _follow(dims, args, path, n_under, arg_names, "dims", where)
        names = _as_names(entry, shape, where, "dims")
        if names is not None:
            return names, "dims"
    if metadata:
        names, source = _metadata(args, path)
        if names is not None:
            if not all(n is None or isinstance(n, str) for n in names):
                raise DimsError(
                    f"{where}: {source} is {names}, which holds mesh-axis tuples, not one axis name per "
                    f"dim. Fix: pass dims for this argument (they take precedence), or "
                    f"trace(..., axis_metadata=False)")
            return _as_names(names, shape, where, source), source
    return None, ""


def leaf_role(roles: Any, args: tuple, path: Sequence[Any], n_under: Sequence[int],
              arg_names: Sequence[str], where: str) -> str | None:
    """The role of the argument leaf at ``path``: from ``roles`` if it names one, else from
    the library types around the leaf (see the module docstring), else ``None``."""
    if roles is not None:
        entry = _follow(roles, args, path, n_under, arg_names, "roles", where)
        if entry is not None:
            if not isinstance(entry, str):
                raise DimsError(f"roles for {where}: {entry!r} is not a role; use 'input', 'param' or "
                                f"'opt_state' (a prefix of the arguments' pytree)")
            return entry
    return _library_role(args, path)


def _library_role(args: Any, path: Sequence[Any]) -> str | None:
    node = args
    for key in path:
        # the Flax classes among the node's type and its bases: a user's subclass of
        # TrainState (adding batch_stats or a dropout key) is a TrainState
        names = {c.__name__ for c in type(node).__mro__ if (c.__module__ or "").startswith("flax")}
        if names:
            if "TrainState" in names:
                k = getattr(key, "name", None)
                if k == "params":
                    return "param"
                if k == "opt_state":
                    return "opt_state"
            if "OptVariable" in names or "OptState" in names:
                return "opt_state"
            if "Param" in names and "Variable" in names:
                return "param"
        node = _child(node, key)
        if node is _MISSING:
            return None
    return None


def unboxed_path(path: Sequence[Any]) -> tuple:
    """A leaf's key path without the ``.value`` of a Flax box (``nn.LogicallyPartitioned``,
    ``nnx.Param``), so that ``params['w'].value`` is the tensor ``params/w``."""
    from jax.tree_util import GetAttrKey

    path = tuple(path)
    return path[:-1] if len(path) > 1 and isinstance(path[-1], GetAttrKey) and path[-1].name == "value" else path
