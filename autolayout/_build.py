"""Pass 2 of the tracer: name the dim classes and turn pending equations into ops."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from autolayout._dims import unboxed_path
from autolayout._unify import _path_str, _Pending, _Val
from autolayout.core import Dim
from autolayout.graph import Graph, Loop, Op, OutputSpec, Replay, Tensor
from autolayout.schedule import identity_groups

def _build(tr: Any, in_vals: list, in_names: list, outs: list, outvars: list, in_tree: Any,
           out_tree: Any, gname: str) -> Graph:
    import jax

    if tr.problems:
        from autolayout._unsupported import report
        raise report(tr.problems, gname)
    uf = tr.uf
    _merge_renames(tr)
    cls_name: dict[int, str] = {}
    taken = {uf.user[uf.find(s)] for s in range(len(uf.parent)) if uf.user[uf.find(s)]}

    def fresh(base: str) -> str:
        if base not in taken:
            taken.add(base)
            return base
        for k in itertools.count(1):
            cand = f"{base}_{k}"
            if cand not in taken:
                taken.add(cand)
                return cand
        raise AssertionError

    def renamed(base: str) -> str:
        """A rename of dim ``base``: ``base_1``, else ``base_2``, ... (never ``base_1_1``)."""
        for k in itertools.count(1):
            if f"{base}_{k}" not in taken:
                return fresh(f"{base}_{k}")
        raise AssertionError

    naming: set[int] = set()  # classes whose name is being derived (renames can form cycles)

    def name(slot: int) -> str:
        r = uf.find(slot)
        if r in cls_name:
            return cls_name[r]
        if uf.user[r]:
            cls_name[r] = uf.user[r]
        else:
            naming.add(r)
            origin = next((o for s, o in tr.rename_origin.items()
                           if uf.find(s) == r and uf.find(o) not in naming), None)
            partner = next((uf.user[uf.find(s)] for s, o in tr.rename_origin.items()
                            if uf.find(o) == r and uf.user[uf.find(s)]), None)
            loop = next((lp for s, lp in tr.loop_slots.items() if uf.find(s) == r), None)
            if origin is not None:
                cls_name[r] = renamed(name(origin))
            elif partner is not None:
                cls_name[r] = renamed(partner)
            elif loop is not None:
                cls_name[r] = fresh("layers")
            else:
                cls_name[r] = fresh(f"d{uf.size[r]}")
            naming.discard(r)
        return cls_name[r]

    def names(v: _Val) -> tuple:
        return tuple(name(s) if s is not None else None for s in v.slots)

    def shape(v: _Val) -> tuple:
        return tuple(Dim(name(s), uf.size[uf.find(s)]) for s in v.slots if s is not None)

    # tensor names: inputs by path, checkpoint_name labels, outputs by position, else prim_N
    tname: dict[int, str] = {}
    used: set[str] = set()
    for v, n in zip(in_vals, in_names):
        tname[v.id] = n
        used.add(n)
    out_paths = [_path_str(unboxed_path(p)) for p, _ in jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(out_tree, list(range(out_tree.num_leaves))))[0]]
    out_role: set[int] = set()
    for v, path in zip(outs, out_paths):
        if v.root is not None and v.root.id not in tname:
            n = f"out/{path}" if path else "out"
            if n not in used:
                tname[v.root.id] = n
                used.add(n)
            out_role.add(v.root.id)
    counters: dict[str, int] = {}
    for p in tr.pending:
        v = p.out
        if v.id in tname:
            continue
        base = v.label or p.prim
        if v.label and base not in used:
            n = base
        else:
            while True:
                k = counters.get(base, 0)
                counters[base] = k + 1
                n = f"{base}_{k}"
                if n not in used:
                    break
        tname[v.id] = n
        used.add(n)

    ops: list[Op] = []
    by_val: dict[int, Op] = {}
    for p in tr.pending:
        v = p.out
        role = p.role if p.kind in ("input", "param", "opt_state") else (
            "output" if v.id in out_role else "activation")
        out_t = Tensor(tname[v.id], shape(v), v.dtype, role)
        inputs = tuple(tname[r.id] for r in p.named_inputs)
        attrs: tuple = ()
        if p.groups is not None:
            attrs = (("groups", tuple((tuple(name(s) for s in gi), tuple(name(s) for s in go))
                                      for gi, go in p.groups)),)
        elif p.kind == "reshape" and p.fn in ("rename", "carry", "slice", "stack", "result"):
            src = p.named_inputs[0]
            attrs = (("groups", identity_groups(shape(src), out_t.shape)),)
        if p.attrs_fn is not None:
            attrs = attrs + p.attrs_fn(name)
        replay = None
        if p.replay is not None:
            operands = []
            for o in p.operands:
                if o.root is None:
                    operands.append(("literal", np.broadcast_to(np.asarray(o.literal, o.dtype), o.shape)))
                else:
                    root = o.root if p.kind == "elementwise" else _node_for(o, p)
                    operands.append(("tensor", tname[root.id], names(o), o.shape))
            replay = Replay(p.replay, tuple(operands))
        op = Op(name=out_t.name, kind=p.kind, fn=p.fn, inputs=inputs,
                input_shapes=tuple(shape(r) for r in p.named_inputs), output=out_t,
                multiplicity=p.mult, loop=p.loop, attrs=attrs, source=p.source, replay=replay,
                input_dtypes=tuple(r.dtype for r in p.named_inputs))
        ops.append(op)
        by_val[v.id] = op

    loops = []
    for info in tr.loops:
        lname = info["name"]
        body = tuple(o.name for o in ops if o.loop == lname)
        loops.append(Loop(
            name=lname, length=info["length"], reverse=info["reverse"],
            dim=name(info["slot"]) if info["slot"] is not None else None, body=body,
            carries=tuple((tname[c.id], tname[n.id]) for c, n in info["carries"]),
            slices=tuple(tname[s.id] for s in info["slices"]),
            stacks=tuple(tname[s.id] for s in info["stacks"]),
            results=tuple((tname[r.id], tname[c.id]) for r, c in info["results"]),
            recomputes=info["recomputes"]))

    specs = []
    for v, var in zip(outs, outvars):
        aval = var.aval
        if v.root is None:
            specs.append(OutputSpec(None, (), tuple(aval.shape), dtype_name(aval.dtype),
                                    np.asarray(v.literal)))
        else:
            specs.append(OutputSpec(tname[v.root.id], names(v), tuple(aval.shape),
                                    dtype_name(aval.dtype)))
    return Graph(ops, input_names=[tname[v.id] for v in in_vals], in_tree=in_tree, outputs=specs,
                 out_tree=out_tree, loops=loops, name=gname)


def _merge_renames(tr: Any) -> None:
    """One dim for the renames of one dim: the renamed axes (e.g. attention's key length,
    renamed in every unrolled layer) whose origins are one class join one class wherever
    no tensor would hold two axes of it, so that a layout names them once (as when the
    layers are scanned)."""
    uf = tr.uf
    first: dict[int, list[int]] = {}
    for s, o in tr.rename_origin.items():
        group = first.setdefault(uf.find(o), [])
        for t in group:
            if uf.find(t) != uf.find(s) and uf.can_union(t, s) and not uf.user[uf.find(s)]:
                uf.union(t, s)
                break
        else:
            group.append(s)


def _node_for(o: _Val, p: _Pending) -> _Val:
    """The named input that a non-elementwise op reads for positional operand ``o``: the
    materialised broadcast (or constant) of ``o`` when the op reads that, else ``o``'s root.
    The broadcast op itself reads the root (its own output is not its operand)."""
    named = [r for r in p.named_inputs]
    if o.materialized is not None and o.materialized is not p.out and any(r is o.materialized for r in named):
        return o.materialized
    if o.root is None:
        raise AssertionError("literal operand of a non-elementwise op was not materialised")
    return o.root


def dtype_name(dtype: Any) -> str:
    """numpy's name of ``dtype`` (``float32``), or jax's for an extended dtype numpy cannot
    hold (a typed PRNG key passed through the step: ``key<fry>``)."""
    import jax

    return str(dtype) if jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else np.dtype(dtype).name
