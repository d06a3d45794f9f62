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
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from autolayout.core import Dim
from autolayout.graph import Graph, Loop, Op, OutputSpec, Replay, Tensor

__all__ = ["trace", "named", "TraceError"]


class TraceError(ValueError):
    """A JAX program the tracer cannot turn into named-dimension ops."""


NAME_TAG = "autolayout|"


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
    tag = NAME_TAG + "|".join(f"{k}={v}" for k, v in (("name", name), ("dims", dims)) if v)
    return checkpoint_name(x, tag)


ELEMENTWISE = frozenset("""
abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type
cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma
digamma log log1p logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem
round rsqrt select_n sign sin sinh sqrt square sub tan tanh xor
""".split())
ALIASES = frozenset(["stop_gradient", "copy", "copy_p", "name", "optimization_barrier"])
REDUCE = {"reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod", "reduce_and": "and",
          "reduce_or": "or", "argmax": "argmax", "argmin": "argmin"}
CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
         "custom_vjp_call_jaxpr": "fun_jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr",
         "remat": "jaxpr"}


# ---------------------------------------------------------------------------
# pass 1: values, slots, union-find
# ---------------------------------------------------------------------------
@dataclass(eq=False)
class _Val:
    """A jaxpr value: positional shape plus one slot per non-size-1 axis."""

    id: int
    shape: tuple[int, ...]
    dtype: str
    slots: list  # slot id or None (size-1 axis)
    root: "_Val | None"  # the node value this one views (self for nodes); None for literals
    literal: Any = None  # scalar value for uniform literals
    loop: str | None = None
    mult: int = 1
    node: "_Pending | None" = None  # producing op (for node values)
    materialized: "_Val | None" = None  # cached broadcast/constant node
    label: str | None = None  # user-given tensor name (checkpoint_name)


@dataclass(eq=False)
class _Pending:
    kind: str
    fn: str
    prim: str
    out: _Val
    operands: list  # list of _Val (views, positional)
    named_inputs: list  # list of _Val roots (graph inputs of the op)
    replay: Callable | None
    loop: str | None
    mult: int
    source: str
    role: str = "activation"
    path_name: str | None = None
    groups: list | None = None  # reshape slot groups
    attrs_fn: Callable | None = None


class _UnionFind:
    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.members: list[set[int]] = []
        self.user: list[str | None] = []

    def new(self, size: int) -> int:
        self.parent.append(len(self.parent))
        self.size.append(size)
        self.members.append(set())
        self.user.append(None)
        return len(self.parent) - 1

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def can_union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        if self.user[ra] and self.user[rb] and self.user[ra] != self.user[rb]:
            return False
        return not (self.members[ra] & self.members[rb])

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] != self.size[rb]:
            raise TraceError(f"internal: unifying axes of sizes {self.size[ra]} and {self.size[rb]}")
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra] |= self.members[rb]
        self.user[ra] = self.user[ra] or self.user[rb]


def _source(eqn: Any) -> str:
    """The user's source line of ``eqn``: the innermost frame outside jax and this module
    (so an error at :func:`named` points at the caller, not at ``named`` itself)."""
    try:
        from jax._src import source_info_util

        for frame in source_info_util.user_frames(eqn.source_info.traceback):
            if frame.file_name != __file__:
                col = f":{frame.start_column}" if frame.start_column else ""
                return f"{frame.file_name}:{frame.start_line}{col} ({frame.function_name})"
    except Exception:  # source info is a convenience, never a reason to fail
        pass
    return ""


def _shapes(eqn: Any) -> str:
    return ", ".join(str(getattr(v, "aval", v)) for v in eqn.invars)


class _Tracer:
    def __init__(self) -> None:
        self.uf = _UnionFind()
        self.ids = itertools.count()
        self.pending: list[_Pending] = []
        self.loops: list[dict] = []
        self.rename_origin: dict[int, int] = {}  # renamed slot -> slot it was renamed from
        self.loop_slots: dict[int, str] = {}
        self.by_name: dict[str, int] = {}
        self.sites: list[str] = []  # source lines of the enclosing calls (jit, custom_jvp, ...)

    def source(self, eqn: Any) -> str:
        """``eqn``'s user source line, else that of the innermost enclosing call: the
        equations inside library functions such as ``jnp.cumsum`` have no user frame."""
        return _source(eqn) or next((s for s in reversed(self.sites) if s), "")

    # ---- values -----------------------------------------------------------
    def new_val(self, shape: Sequence[int], dtype: Any, *, root: "_Val | None | str" = "self",
                literal: Any = None, ctx: tuple = (None, 1)) -> _Val:
        shape = tuple(int(s) for s in shape)
        slots = [self.uf.new(s) if s != 1 else None for s in shape]
        v = _Val(next(self.ids), shape, np.dtype(dtype).name, slots, None, literal, ctx[0], ctx[1])
        v.root = v if root == "self" else root
        for s in slots:
            if s is not None:
                self.uf.members[s].add(v.id)
        return v

    def literal(self, value: Any, shape: Sequence[int], dtype: Any, ctx: tuple) -> _Val:
        return self.new_val(shape, dtype, root=None, literal=np.asarray(value, dtype=dtype), ctx=ctx)

    def bind(self, val: _Val, pairs: Sequence[tuple[int, int]], eqn: Any, ctx: tuple) -> _Val:
        """Unify ``val``'s axes with target slots; on a cannot-link conflict, return a
        renamed copy of ``val`` whose conflicting axes take fresh names."""
        pairs = [(ax, t) for ax, t in pairs if val.slots[ax] is not None and t is not None]
        for ax, t in pairs:
            a, b = self.uf.user[self.uf.find(val.slots[ax])], self.uf.user[self.uf.find(t)]
            if a and b and a != b:
                # DESIGN §3.3: two user names meeting is the user's mistake, not a rename
                raise TraceError(
                    f"`{eqn.primitive}` at {_source(eqn) or 'unknown source'} relates the axis you "
                    f"named {a!r} to the axis you named {b!r} (inputs {_shapes(eqn)}): one dim cannot "
                    f"have two names. Fix: call both {a!r} (or both {b!r}) in `dims` / autolayout.named.")
        if all(self.uf.can_union(val.slots[ax], t) for ax, t in pairs):
            for ax, t in pairs:
                if not self.uf.can_union(val.slots[ax], t):
                    break
                self.uf.union(val.slots[ax], t)
            else:
                return val
        # Rename: a fresh value whose axes unify with the targets, and with val's own
        # axes wherever that does not break the cannot-link rule.
        src = self.node_of(val, ctx, elementwise=True)
        r = self.new_val(val.shape, val.dtype, ctx=ctx)
        for ax, t in pairs:
            if not self.uf.can_union(r.slots[ax], t):
                raise TraceError(
                    f"cannot give distinct names to the axes of {val.shape} in `{eqn.primitive}` "
                    f"({self.source(eqn)}): an axis would need the name of another axis of the same tensor")
            self.uf.union(r.slots[ax], t)
        for ax, s in enumerate(val.slots):
            if s is None:
                continue
            if self.uf.can_union(r.slots[ax], s):
                self.uf.union(r.slots[ax], s)
            else:
                self.rename_origin[r.slots[ax]] = s
        self.add(_Pending("reshape", "rename", "rename", r, [val], [src],
                          _identity, ctx[0], ctx[1], self.source(eqn)))
        r.node = self.pending[-1]
        return r

    def simulate(self, first: list, val: _Val, pairs: list) -> int:
        """How many of ``val``'s axes a :meth:`bind` of ``pairs`` (axis, target slot)
        after ``first``'s unions would rename — without changing anything."""
        uf, parent, members, user = self.uf, {}, {}, {}

        def find(a: int) -> int:
            a = uf.find(a) if a >= 0 else a
            while a in parent:
                a = parent[a]
            return a

        def union(a: int | None, b: int | None) -> bool:
            if a is None or b is None:
                return True
            ra, rb = find(a), find(b)
            if ra == rb:
                return True
            ma = members.get(ra) if ra < 0 or ra in members else uf.members[ra]
            mb = members.get(rb) if rb < 0 or rb in members else uf.members[rb]
            ua = user.get(ra, uf.user[ra] if ra >= 0 else None)
            ub = user.get(rb, uf.user[rb] if rb >= 0 else None)
            if (ua and ub and ua != ub) or (ma & mb):
                return False
            parent[rb] = ra
            members[ra] = ma | mb
            user[ra] = ua or ub
            return True

        for a, b in first:
            union(a, b)
        pairs = [(ax, t) for ax, t in pairs if val.slots[ax] is not None and t is not None]
        snapshot = (dict(parent), dict(members), dict(user))
        if all(union(val.slots[ax], t) for ax, t in pairs):
            return 0
        parent, members, user = (dict(x) for x in snapshot)
        fresh = {ax: -(i + 1) for i, ax in enumerate(range(len(val.slots)))}
        for ax, f in fresh.items():
            members[f] = {-1}
        for ax, t in pairs:
            union(fresh[ax], t)
        return sum(1 for ax, s in enumerate(val.slots) if s is not None and not union(fresh[ax], s))

    def add(self, p: _Pending) -> None:
        self.pending.append(p)
        p.out.node = p

    def node_of(self, val: _Val, ctx: tuple, *, elementwise: bool = False) -> _Val:
        """The graph node holding ``val``'s data; materialises broadcasts and literals
        unless the consumer is elementwise (which broadcasts by name)."""
        if val.root is None:  # literal
            if val.materialized is None:
                c = self.new_val(val.shape, val.dtype, ctx=(val.loop, val.mult))
                for a, b in zip(c.slots, val.slots):
                    if a is not None:
                        self.uf.union(a, b)
                lit, shape, dtype = val.literal, val.shape, val.dtype
                self.add(_Pending("constant", "fill", "fill", c, [], [],
                                  lambda: np.broadcast_to(np.asarray(lit, dtype), shape),
                                  val.loop, val.mult, ""))
                val.materialized = c
            return val.materialized
        root = val.root
        if elementwise:
            return root
        if self.names_of(val) == self.names_of(root):
            return root
        if val.materialized is None:
            c = self.new_val(val.shape, val.dtype, ctx=(val.loop, val.mult))
            for a, b in zip(c.slots, val.slots):
                if a is not None:
                    self.uf.union(a, b)
            self.add(_Pending("einsum", "broadcast", "broadcast", c, [val], [root],
                              _identity, val.loop, val.mult, ""))
            val.materialized = c
        return val.materialized

    def names_of(self, val: _Val) -> frozenset:
        return frozenset(self.uf.find(s) for s in val.slots if s is not None)

    # ---- interpretation ---------------------------------------------------
    def run(self, jaxpr: Any, consts: Sequence[Any], in_vals: Sequence[_Val], ctx: tuple) -> list:
        env: dict[Any, _Val] = {}
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = self.constant(c, ctx)
        for var, v in zip(jaxpr.invars, in_vals):
            env[var] = v
        for eqn in jaxpr.eqns:
            ins = [self.read(env, x, ctx) for x in eqn.invars]
            outs = self.eqn(eqn, ins, ctx)
            for var, v in zip(eqn.outvars, outs):
                env[var] = v
        return [self.read(env, x, ctx) for x in jaxpr.outvars]

    def read(self, env: dict, x: Any, ctx: tuple) -> _Val:
        from jax._src.core import Literal
        if isinstance(x, Literal):
            aval = x.aval
            return self.literal(np.asarray(x.val), aval.shape, aval.dtype, ctx)
        return env[x]

    def constant(self, value: Any, ctx: tuple) -> _Val:
        arr = np.asarray(value)
        if arr.size and np.all(arr == arr.flat[0]) and arr.ndim == 0:
            return self.literal(arr, arr.shape, arr.dtype, ctx)
        v = self.new_val(arr.shape, arr.dtype, ctx=ctx)
        self.add(_Pending("constant", "value", "const", v, [], [], lambda: arr, ctx[0], ctx[1], ""))
        return v

    def eqn(self, eqn: Any, ins: list[_Val], ctx: tuple) -> list[_Val]:
        prim = eqn.primitive.name
        params = dict(eqn.params)
        if prim in CALLS:
            sub = params[CALLS[prim]]
            self.sites.append(self.source(eqn))
            try:
                if hasattr(sub, "jaxpr"):
                    return self.run(sub.jaxpr, sub.consts, ins, ctx)
                return self.run(sub, (), ins, ctx)
            finally:
                self.sites.pop()
        if prim == "scan":
            return self.scan(eqn, ins, ctx)
        if len(eqn.outvars) != 1:
            raise self.unsupported(eqn, "it has several outputs")
        aval = eqn.outvars[0].aval
        if prim in ELEMENTWISE:
            return [self.elementwise(eqn, ins, aval, ctx)]
        if prim in ALIASES:
            if prim == "name":
                self.apply_name(ins[0], params["name"], eqn)
            return [ins[0]]
        if prim == "transpose":
            out = self.view(ins[0], aval, ctx)
            self.bind(ins[0], [(p, out.slots[i]) for i, p in enumerate(params["permutation"])], eqn, ctx)
            return [out]
        if prim in ("squeeze", "expand_dims", "reshape"):
            return [self.reshape(eqn, ins[0], aval, ctx)]
        if prim == "broadcast_in_dim":
            out = self.view(ins[0], aval, ctx)
            self.bind(ins[0], [(i, out.slots[d]) for i, d in enumerate(params["broadcast_dimensions"])],
                      eqn, ctx)
            return [out]
        if prim == "dot_general":
            return [self.dot_general(eqn, ins, aval, ctx)]
        if prim == "reduce_sum" or prim in REDUCE:
            return [self.reduce(eqn, ins[0], aval, ctx)]
        if prim == "iota":
            out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
            self.add(_Pending("constant", "iota", "iota", out, [], [], _binder(eqn), ctx[0], ctx[1],
                              self.source(eqn)))
            return [out]
        if prim == "gather":
            return [self.gather(eqn, ins, aval, ctx)]
        if prim in ("scatter-add", "scatter_add"):
            return [self.scatter_add(eqn, ins, aval, ctx)]
        raise self.unsupported(eqn, "autolayout has no named-dimension rule for it")

    def name_slot(self, slot: int, name: str, where: str) -> None:
        """Give a slot's class a user name; the same name anywhere is the same dim."""
        r = self.uf.find(slot)
        if self.uf.user[r] and self.uf.user[r] != name:
            raise TraceError(f"{where}: axis already named {self.uf.user[r]!r} cannot also be named "
                             f"{name!r}; one axis has one name")
        other = self.by_name.get(name)
        if other is not None and self.uf.find(other) != r:
            if self.uf.size[self.uf.find(other)] != self.uf.size[r]:
                raise TraceError(f"{where}: dim {name!r} has size {self.uf.size[self.uf.find(other)]} "
                                 f"elsewhere but {self.uf.size[r]} here; one name, one size")
            if not self.uf.can_union(other, slot):
                raise TraceError(f"{where}: naming this axis {name!r} would give one tensor two axes "
                                 f"named {name!r} (Mesh-TensorFlow §4); choose another name, e.g. "
                                 f"{name + '_1'!r}")
            self.uf.union(other, slot)
        self.uf.user[self.uf.find(slot)] = name
        self.by_name.setdefault(name, slot)

    def apply_name(self, val: _Val, tag: str, eqn: Any) -> None:
        if not tag.startswith(NAME_TAG):
            if val.root is not None:
                val.root.label = tag
            return
        fields = dict(f.split("=", 1) for f in tag[len(NAME_TAG):].split("|") if "=" in f)
        if fields.get("name") and val.root is not None:
            val.root.label = fields["name"]
        if fields.get("dims"):
            names = fields["dims"].split()
            if len(names) != len(val.shape):
                raise TraceError(f"autolayout.named at {self.source(eqn)}: {len(names)} names {names} for a "
                                 f"value of shape {val.shape}; give one name per axis")
            for s, n in zip(val.slots, names):
                if s is not None and n not in ("_", "None"):
                    self.name_slot(s, n, f"autolayout.named at {self.source(eqn)}")

    def unsupported(self, eqn: Any, why: str) -> TraceError:
        return TraceError(
            f"unsupported primitive `{eqn.primitive.name}` with inputs ({_shapes(eqn)}) at "
            f"{self.source(eqn) or 'unknown source'}: {why}. Rewrite this step with einsum, elementwise, "
            f"reduction, reshape, gather or scan operations, or wrap it outside the traced function.")

    def view(self, val: _Val, aval: Any, ctx: tuple) -> _Val:
        """A value that views ``val``'s data with another positional shape (alias/broadcast)."""
        if val.root is None:
            return self.literal(val.literal, aval.shape, aval.dtype, ctx)
        out = self.new_val(aval.shape, aval.dtype, root=val.root, ctx=ctx)
        return out

    def elementwise(self, eqn: Any, ins: list[_Val], aval: Any, ctx: tuple) -> _Val:
        if all(v.root is None for v in ins):
            value = eqn.primitive.bind(*[np.asarray(v.literal) for v in ins], **eqn.params)
            return self.literal(np.asarray(value), aval.shape, aval.dtype, ctx)
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        operands = []
        for v in ins:
            if v.root is not None and len(v.shape) == len(aval.shape):
                v = self.bind(v, [(i, out.slots[i]) for i in range(len(v.shape))], eqn, ctx)
            operands.append(v)
        named = []
        for v in operands:
            if v.root is not None and v.root not in named:
                named.append(v.root)
        self.add(_Pending("elementwise", eqn.primitive.name, eqn.primitive.name, out, operands,
                          named, _binder(eqn), ctx[0], ctx[1], self.source(eqn)))
        return out

    def reshape(self, eqn: Any, x: _Val, aval: Any, ctx: tuple) -> _Val:
        groups = _reshape_groups(x.shape, tuple(aval.shape))
        if groups is None:
            raise self.unsupported(eqn, f"reshape {x.shape} -> {tuple(aval.shape)} mixes axes")
        simple = all(len([a for a in gi if x.shape[a] != 1]) <= 1 and
                     len([b for b in go if aval.shape[b] != 1]) <= 1 for gi, go in groups)
        if simple:
            out = self.view(x, aval, ctx)
            pairs = []
            for gi, go in groups:
                a = [i for i in gi if x.shape[i] != 1]
                b = [j for j in go if aval.shape[j] != 1]
                if a and b:
                    pairs.append((a[0], out.slots[b[0]]))
            self.bind(x, pairs, eqn, ctx)
            return out
        src = self.node_of(x, ctx)
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        pairs = []
        for gi, go in groups:
            a = [i for i in gi if x.shape[i] != 1]
            b = [j for j in go if aval.shape[j] != 1]
            if len(a) == 1 and len(b) == 1:
                pairs.append((a[0], out.slots[b[0]]))
        self.bind(x, pairs, eqn, ctx)
        p = _Pending("reshape", "reshape", "reshape", out, [x], [src], _binder(eqn), ctx[0], ctx[1],
                     self.source(eqn))
        p.groups = [([x.slots[i] for i in gi if x.slots[i] is not None],
                     [out.slots[j] for j in go if out.slots[j] is not None]) for gi, go in groups]
        n_in = sum(1 for g in p.groups if len(g[0]) > 1)
        n_out = sum(1 for g in p.groups if len(g[1]) > 1)
        p.fn = "merge" if n_in and not n_out else "split" if n_out and not n_in else "reshape"
        self.add(p)
        return out

    def dot_general(self, eqn: Any, ins: list[_Val], aval: Any, ctx: tuple) -> _Val:
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs, rhs = (self.node_of(v, ctx) if v.root is None else v for v in ins)
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        lfree = [i for i in range(len(lhs.shape)) if i not in lc and i not in lb]
        rfree = [i for i in range(len(rhs.shape)) if i not in rc and i not in rb]
        nb = len(lb)
        lout = [(a, out.slots[k]) for k, a in enumerate(lb)] + \
            [(a, out.slots[nb + k]) for k, a in enumerate(lfree)]
        rout = [(a, out.slots[k]) for k, a in enumerate(rb)] + \
            [(a, out.slots[nb + len(lfree) + k]) for k, a in enumerate(rfree)]
        # Bind the larger operand first so that a cannot-link conflict renames the
        # smaller one (attention renames k and v, not the scores).
        contract = list(zip(lc, rc))
        pl = [(lhs.slots[a], t) for a, t in lout]
        pr = [(rhs.slots[a], t) for a, t in rout]
        ren_r = self.simulate(pl, rhs, rout + [(b, lhs.slots[a]) for a, b in contract])
        ren_l = self.simulate(pr, lhs, lout + [(a, rhs.slots[b]) for a, b in contract])
        if (ren_l, -math.prod(lhs.shape)) < (ren_r, -math.prod(rhs.shape)):
            rhs = self.bind(rhs, rout, eqn, ctx)
            lhs = self.bind(lhs, lout + [(a, rhs.slots[b]) for a, b in zip(lc, rc)], eqn, ctx)
        else:
            lhs = self.bind(lhs, lout, eqn, ctx)
            rhs = self.bind(rhs, rout + [(b, lhs.slots[a]) for a, b in zip(lc, rc)], eqn, ctx)
        named = [self.node_of(lhs, ctx), self.node_of(rhs, ctx)]
        self.add(_Pending("einsum", "dot", "dot_general", out, [lhs, rhs], named, _binder(eqn),
                          ctx[0], ctx[1], self.source(eqn)))
        return out

    def reduce(self, eqn: Any, x: _Val, aval: Any, ctx: tuple) -> _Val:
        axes = eqn.params["axes"]
        prim = eqn.primitive.name
        if x.root is None:
            x = self.node_of(x, ctx)
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        kept = [i for i in range(len(x.shape)) if i not in axes]
        x = self.bind(x, [(a, out.slots[k]) for k, a in enumerate(kept)], eqn, ctx)
        kind, fn = ("einsum", "sum") if prim == "reduce_sum" else ("reduce", REDUCE[prim])
        self.add(_Pending(kind, fn, prim, out, [x], [self.node_of(x, ctx)], _binder(eqn),
                          ctx[0], ctx[1], self.source(eqn)))
        return out

    def gather(self, eqn: Any, ins: list[_Val], aval: Any, ctx: tuple) -> _Val:
        table, idx = (self.node_of(v, ctx) if v.root is None else v for v in ins)
        dn = eqn.params["dimension_numbers"]
        ok = (len(dn.start_index_map) == 1 and tuple(dn.collapsed_slice_dims) == tuple(dn.start_index_map)
              and not dn.operand_batching_dims and idx.shape and idx.shape[-1] == 1
              and all(s == table.shape[i] for i, s in enumerate(eqn.params["slice_sizes"])
                      if i not in dn.collapsed_slice_dims))
        if not ok or table.root is None or idx.root is None:
            raise self.unsupported(eqn, "only embedding-style lookups (take along one axis) are supported")
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        axis = dn.collapsed_slice_dims[0]
        offset = sorted(dn.offset_dims)
        kept = [i for i in range(len(table.shape)) if i != axis]
        table = self.bind(table, [(a, out.slots[o]) for a, o in zip(kept, offset)], eqn, ctx)
        batch_pos = [i for i in range(len(aval.shape)) if i not in offset]
        idx = self.bind(idx, [(a, out.slots[o]) for a, o in zip(range(len(idx.shape) - 1), batch_pos)],
                        eqn, ctx)
        p = _Pending("gather", "take", "gather", out, [table, idx],
                     [self.node_of(table, ctx), self.node_of(idx, ctx)], _binder(eqn),
                     ctx[0], ctx[1], self.source(eqn))
        p.attrs_fn = lambda name: (("indexed", name(table.slots[axis])),)
        self.add(p)
        return out

    def scatter_add(self, eqn: Any, ins: list[_Val], aval: Any, ctx: tuple) -> _Val:
        operand, idx, upd = (self.node_of(v, ctx) if v.root is None else v for v in ins)
        dn = eqn.params["dimension_numbers"]
        ok = (len(dn.scatter_dims_to_operand_dims) == 1
              and tuple(dn.inserted_window_dims) == tuple(dn.scatter_dims_to_operand_dims)
              and not dn.operand_batching_dims and idx.shape and idx.shape[-1] == 1
              and operand.root is not None and idx.root is not None and upd.root is not None)
        if not ok:
            raise self.unsupported(eqn, "only embedding-gradient scatter-adds are supported")
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        operand = self.bind(operand, [(i, out.slots[i]) for i in range(len(aval.shape))], eqn, ctx)
        axis = dn.inserted_window_dims[0]
        window = sorted(dn.update_window_dims)
        kept = [i for i in range(len(aval.shape)) if i != axis]
        upd = self.bind(upd, [(w, out.slots[k]) for w, k in zip(window, kept)], eqn, ctx)
        scat = [i for i in range(len(upd.shape)) if i not in window]
        idx = self.bind(idx, [(a, upd.slots[s]) for a, s in zip(range(len(idx.shape) - 1), scat)], eqn, ctx)
        p = _Pending("scatter", "scatter-add", "scatter_add", out, [operand, idx, upd],
                     [self.node_of(v, ctx) for v in (operand, idx, upd)], _binder(eqn),
                     ctx[0], ctx[1], self.source(eqn))
        p.attrs_fn = lambda name: (("indexed", name(out.slots[axis])),)
        self.add(p)
        return out

    def scan(self, eqn: Any, ins: list[_Val], ctx: tuple) -> list[_Val]:
        if ctx[0] is not None:
            raise self.unsupported(eqn, "nested scans are not supported; unroll the inner loop")
        p = eqn.params
        length, nc, ncar = int(p["length"]), p["num_consts"], p["num_carry"]
        name = f"loop{len(self.loops)}"
        body_ctx = (name, ctx[1] * length)
        consts, init, xs = ins[:nc], ins[nc:nc + ncar], ins[nc + ncar:]
        loop_slot = self.uf.new(length) if length > 1 else None
        if loop_slot is not None:
            self.loop_slots[loop_slot] = name
        info = dict(name=name, length=length, reverse=bool(p["reverse"]), slot=loop_slot,
                    carries=[], slices=[], stacks=[], results=[])
        self.loops.append(info)
        carries = []
        for v in init:
            src = self.node_of(v, ctx)
            c = self.new_val(v.shape, v.dtype, ctx=body_ctx)
            self.bind(v, [(i, c.slots[i]) for i in range(len(v.shape))], eqn, ctx)
            self.add(_Pending("reshape", "carry", "carry", c, [v], [src], None, name, body_ctx[1],
                              self.source(eqn)))
            carries.append(c)
        slices = []
        for v in xs:
            src = self.node_of(v, ctx)
            s = self.new_val(v.shape[1:], v.dtype, ctx=body_ctx)
            pairs = [(i + 1, s.slots[i]) for i in range(len(s.shape))]
            if loop_slot is not None:
                pairs.append((0, loop_slot))
            self.bind(v, pairs, eqn, ctx)
            self.add(_Pending("reshape", "slice", "slice", s, [v], [src], None, name, body_ctx[1],
                              self.source(eqn)))
            info["slices"].append(s)
            slices.append(s)
        body = p["jaxpr"]
        outs = self.run(body.jaxpr, body.consts, [*consts, *carries, *slices], body_ctx)
        results = []
        for c, nxt in zip(carries, outs[:ncar]):
            if nxt.root is not c:
                # the next value must carry the carry's names: rename it where it cannot
                # (e.g. ``h @ w`` with a square ``w`` gives h's axis the other name of w)
                nxt = self.bind(nxt, [(i, c.slots[i]) for i in range(len(c.shape))], eqn, body_ctx)
            nxt_node = self.node_of(nxt, body_ctx)
            info["carries"].append((c, nxt_node))
            r = self.new_val(c.shape, c.dtype, ctx=ctx)
            self.bind(c, [(i, r.slots[i]) for i in range(len(c.shape))], eqn, ctx)
            self.add(_Pending("reshape", "result", "result", r, [nxt], [nxt_node], None, ctx[0], ctx[1],
                              self.source(eqn)))
            info["results"].append((r, c))
            results.append(r)
        stacks = []
        for y, var in zip(outs[ncar:], eqn.outvars[ncar:]):
            shape = tuple(var.aval.shape)
            y_node = self.node_of(y, body_ctx)
            st = self.new_val(shape, var.aval.dtype, ctx=ctx)
            pairs = [(i, st.slots[i + 1]) for i in range(len(y.shape))]
            self.bind(y, pairs, eqn, body_ctx)
            if loop_slot is not None:
                self.uf.union(st.slots[0], loop_slot)
            self.add(_Pending("reshape", "stack", "stack", st, [y], [y_node], None, ctx[0], ctx[1],
                              self.source(eqn)))
            info["stacks"].append(st)
            stacks.append(st)
        return [*results, *stacks]


def _identity(x: Any) -> Any:
    return x


def _binder(eqn: Any) -> Callable:
    prim, params = eqn.primitive, dict(eqn.params)
    return lambda *xs: prim.bind(*xs, **params)


def _reshape_groups(a: tuple, b: tuple) -> list | None:
    """Split two shapes into consecutive groups with equal products (size-1 axes attach
    to a neighbouring group)."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        gi, gj = [], []
        pa = pb = 1
        if i < len(a):
            gi.append(i); pa *= a[i]; i += 1
        if j < len(b):
            gj.append(j); pb *= b[j]; j += 1
        while pa != pb:
            if pa < pb and i < len(a):
                gi.append(i); pa *= a[i]; i += 1
            elif pb < pa and j < len(b):
                gj.append(j); pb *= b[j]; j += 1
            else:
                return None
        while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
            gi.append(i); i += 1
        while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
            gj.append(j); j += 1
        groups.append((gi, gj))
    return groups


# ---------------------------------------------------------------------------
# pass 2: names and ops
# ---------------------------------------------------------------------------
def _lookup(tree: Any, path: Sequence[Any]) -> Any:
    """Follow a jax key path into a user pytree that may stop early (a prefix)."""
    from jax.tree_util import DictKey, GetAttrKey, SequenceKey

    node = tree
    for key in path:
        if node is None or isinstance(node, str):
            return node
        if isinstance(key, DictKey):
            node = node[key.key]
        elif isinstance(key, SequenceKey):
            node = node[key.idx]
        elif isinstance(key, GetAttrKey):
            node = getattr(node, key.name)
        else:
            node = node[getattr(key, "key", getattr(key, "idx", key))]
    return node


def _is_names(x: Any) -> bool:
    return isinstance(x, tuple) and all(isinstance(n, str) or n is None for n in x)


def _path_str(path: Sequence[Any]) -> str:
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


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
        role = _lookup(roles, path) if roles is not None else None
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
    g.donated = _donations(g, flat, in_names, out_tree, donate_argnums)
    return g


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


def _build(tr: _Tracer, in_vals: list, in_names: list, outs: list, outvars: list, in_tree: Any,
           out_tree: Any, gname: str) -> Graph:
    import jax

    uf = tr.uf
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
                cls_name[r] = fresh(name(origin) + "_1")
            elif partner is not None:
                cls_name[r] = fresh(partner + "_1")
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
    out_paths = [_path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(
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
        elif p.fn in ("rename", "carry", "slice", "stack", "result"):
            src = p.named_inputs[0]
            attrs = (("groups", _identity_groups(shape(src), out_t.shape)),)
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
            results=tuple((tname[r.id], tname[c.id]) for r, c in info["results"])))

    specs = []
    for v, var in zip(outs, outvars):
        aval = var.aval
        if v.root is None:
            specs.append(OutputSpec(None, (), tuple(aval.shape), np.dtype(aval.dtype).name,
                                    np.asarray(v.literal)))
        else:
            specs.append(OutputSpec(tname[v.root.id], names(v), tuple(aval.shape),
                                    np.dtype(aval.dtype).name))
    return Graph(ops, input_names=[tname[v.id] for v in in_vals], in_tree=in_tree, outputs=specs,
                 out_tree=out_tree, loops=loops, name=gname)


def _node_for(o: _Val, p: _Pending) -> _Val:
    """The named input that a non-elementwise op reads for positional operand ``o``."""
    if o.materialized is not None:
        return o.materialized
    if o.root is None:
        raise AssertionError("literal operand of a non-elementwise op was not materialised")
    return o.root


def _identity_groups(src: tuple, dst: tuple) -> tuple:
    """Groups for ops that keep shape up to names: kept dims pair up, renamed ones too."""
    dst_names = [d.name for d in dst]
    src_names = [d.name for d in src]
    groups = []
    rest_src = [d for d in src_names if d not in dst_names]
    rest_dst = [d for d in dst_names if d not in src_names]
    for d in src_names:
        if d in dst_names:
            groups.append(((d,), (d,)))
    sizes = {d.name: d.size for d in (*src, *dst)}
    for a in rest_src:
        match = next((b for b in rest_dst if sizes[b] == sizes[a]), None)
        if match is not None:
            rest_dst.remove(match)
            groups.append(((a,), (match,)))
        else:
            groups.append(((a,), ()))
    for b in rest_dst:
        groups.append(((), (b,)))
    return tuple(groups)
