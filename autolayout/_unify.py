"""Pass 1 core of the tracer: values, slots, union-find and the cannot-link rule.

Every axis of every jaxpr value gets a slot; slots merge by union-find as
equations relate axes. Two axes of one tensor may never share a class (paper
§4): :meth:`_Core.bind` refuses such a merge and inserts a ``rename`` on the
operand instead. See :mod:`autolayout.trace` for the whole design.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np


class TraceError(ValueError):
    """A JAX program the tracer cannot turn into named-dimension ops."""


NAME_TAG = "autolayout|"


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


# autolayout's own tracing modules (named() lives in trace.py): never the user's line
_OWN_FILES = {os.path.join(os.path.dirname(os.path.abspath(__file__)), f)
              for f in ("trace.py", "_unify.py", "_interpret.py", "_along.py", "_unsupported.py", "_build.py", "train.py")}


def _source(eqn: Any) -> str:
    """The user's source line of ``eqn``: the innermost frame outside jax and this module
    (so an error at :func:`named` points at the caller, not at ``named`` itself)."""
    try:
        from jax._src import source_info_util

        for frame in source_info_util.user_frames(eqn.source_info.traceback):
            if frame.file_name not in _OWN_FILES:
                col = f":{frame.start_column}" if frame.start_column else ""
                return f"{frame.file_name}:{frame.start_line}{col} ({frame.function_name})"
    except Exception:  # source info is a convenience, never a reason to fail
        pass
    return ""


def _shapes(eqn: Any) -> str:
    return ", ".join(str(getattr(v, "aval", v)) for v in eqn.invars)


class _Core:
    """Values and unification; :class:`autolayout._interpret._Tracer` adds the primitives."""

    def __init__(self) -> None:
        self.uf = _UnionFind()
        self.ids = itertools.count()
        self.pending: list[_Pending] = []
        self.loops: list[dict] = []
        self.rename_origin: dict[int, int] = {}  # renamed slot -> slot it was renamed from
        self.loop_slots: dict[int, str] = {}
        self.by_name: dict[str, int] = {}
        self.problems: list = []  # unsupported constructs met (autolayout._unsupported.Item)
        self.used: set = set()  # variables of the jaxpr being interpreted that are read
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
