"""Named-dimension graph IR: one node per op, each op producing one named tensor.

The graph is a :class:`networkx.DiGraph` (``graph.nx``) whose nodes are op names
(== the name of the tensor the op produces) and whose edges go producer ->
consumer with the operand positions in ``edge["pos"]``. Every op keeps two
views of itself:

* its *named* semantics (``kind``, ``fn``, named input and output shapes,
  ``attrs``) — what the cost model, the search and the sharded executor use;
* a positional *replay* (:class:`Replay`): the JAX primitive and parameters it
  came from, so :meth:`Graph.evaluate` reproduces the traced function exactly.

Scans become :class:`Loop` s: the body is traced once, its ops carry
``multiplicity`` (the scan length) and ``loop`` (the loop's name). Boundary ops
are ``reshape`` ops with ``fn`` in ``carry`` (loop-carried value, input: the
initial value), ``slice`` (one iteration's slice of a stacked input), ``stack``
(stacked per-iteration outputs, outside the body) and ``result`` (a final carry,
outside the body). The dim that indexes iterations is in ``graph.loop_dims`` and
is never split.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import networkx as nx
import numpy as np

from autolayout.core import Dim, Shape

ROLES = ("input", "param", "opt_state", "activation", "output")
SOURCE_KINDS = ("input", "param", "opt_state", "constant")
KINDS = SOURCE_KINDS + ("einsum", "elementwise", "reduce", "reshape", "gather", "scatter")


@dataclass(frozen=True)
class Tensor:
    """A named tensor: ``Tensor("h", (batch:8, hidden:32), "float32", "activation")``."""

    name: str
    shape: Shape
    dtype: str
    role: str

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.shape)

    @property
    def size(self) -> int:
        return math.prod(d.size for d in self.shape)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        """Global (unsharded) bytes."""
        return self.size * self.itemsize

    def __str__(self) -> str:
        return f"{self.name}[{', '.join(map(str, self.shape))}]:{self.dtype}"


@dataclass(frozen=True)
class Replay:
    """How to re-run an op positionally, as the jaxpr did.

    ``operands[i]`` is either ``("tensor", name, dims, shape)`` — a graph tensor to be
    aligned by name to ``dims`` (``None`` marks a size-1 axis) and broadcast to
    ``shape`` — or ``("literal", value)``. ``fn`` is called with the positional
    operands and returns one array whose non-size-1 axes are the op's output
    dims, in order.
    """

    fn: Callable[..., Any]
    operands: tuple[tuple, ...]


@dataclass(frozen=True, eq=False)
class Op:
    """One op of the closed set in :data:`KINDS`, producing tensor ``output``.

    ``attrs`` is a hashable tuple of ``(key, value)`` pairs that, with the kind,
    fn and named shapes, defines what the op computes (its signature). For
    ``reshape`` ops ``attrs`` holds ``("groups", ((in_dims, out_dims), ...))``:
    input and output dim names grouped so that each group's sizes multiply to
    the same number (a kept dim is the group ``((d,), (d,))``; a rename
    ``((length,), (length_1,))``; a split ``((hk,), (heads, d_kv))``; the loop
    ``slice`` drops ``((layers,), ())`` and ``stack`` adds ``((), (layers,))``).
    """

    name: str
    kind: str
    fn: str
    inputs: tuple[str, ...]
    input_shapes: tuple[Shape, ...]
    output: Tensor
    multiplicity: int = 1
    loop: str | None = None
    attrs: tuple = ()
    source: str = ""
    replay: Replay | None = field(default=None, repr=False)
    input_dtypes: tuple[str, ...] = ()
    # Loop fusion (XLA fuses chains of elementwise ops): whether each input is read from
    # HBM and whether the output is written there. Set by Graph from the consumers.
    hbm: tuple[bool, ...] = ()

    @property
    def dims(self) -> tuple[Dim, ...]:
        """Union of input and output dims, in first-seen order."""
        seen: dict[str, Dim] = {}
        for shape in (*self.input_shapes, self.output.shape):
            for d in shape:
                seen.setdefault(d.name, d)
        return tuple(seen.values())

    @property
    def reduced_dims(self) -> tuple[Dim, ...]:
        """Dims of the inputs that are not in the output (summed or reduced out)."""
        out = set(self.output.dim_names)
        return tuple(d for d in self.dims if d.name not in out)

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def flops(self, sizes: Mapping[str, int] | None = None) -> int:
        """Flops of one execution, per the table in DESIGN §2: global by default, or with
        each dim's size taken from ``sizes`` (the cost model passes local slice sizes)."""
        n = {d.name: d.size for d in self.dims}
        n.update(sizes or {})

        def prod(shape: Sequence[Dim]) -> int:
            return math.prod(n[d.name] for d in shape)

        if self.kind == "einsum":
            total = prod(self.dims)
            return 2 * total if len(self.inputs) >= 2 else total
        if self.kind in ("elementwise", "gather"):
            return prod(self.output.shape)
        if self.kind == "reduce":
            return max((prod(s) for s in self.input_shapes), default=0)
        if self.kind == "scatter":
            return prod(self.input_shapes[-1])
        return 0

    def signature(self) -> tuple:
        """What makes two ops interchangeable for cost and layout purposes."""
        return (
            self.kind,
            self.fn,
            self.attrs,
            tuple((tuple((d.name, d.size) for d in s)) for s in self.input_shapes),
            self.input_dtypes,
            self.hbm,
            tuple((d.name, d.size) for d in self.output.shape),
            self.output.dtype,
        )

    def __str__(self) -> str:
        ins = ", ".join(self.inputs)
        times = f" x{self.multiplicity}" if self.multiplicity != 1 else ""
        return f"{self.output} = {self.kind}.{self.fn}({ins}){times}"


@dataclass(frozen=True)
class Loop:
    """A scan: ``length`` iterations of ``body`` (op names in execution order)."""

    name: str
    length: int
    reverse: bool
    dim: str | None  # the dim indexing iterations (None when length == 1)
    body: tuple[str, ...]
    carries: tuple[tuple[str, str], ...]  # (carry op in body, next-value tensor in body)
    slices: tuple[str, ...]  # slice ops in body (input: the stacked tensor outside)
    stacks: tuple[str, ...]  # stack ops outside (input: the per-iteration tensor)
    results: tuple[tuple[str, str], ...]  # (result op outside, carry op it finalises)


@dataclass(frozen=True)
class SignatureClass:
    """Ops with identical signatures; ``count`` = executions per step (multiplicities summed)."""

    signature: tuple
    ops: tuple[str, ...]
    count: int

    @property
    def kind(self) -> str:
        return self.signature[0]


@dataclass(frozen=True)
class OutputSpec:
    """How a graph tensor maps back to one leaf of the traced function's output."""

    tensor: str | None  # None for a literal output
    dims: tuple[str | None, ...]  # positional dims (None = size-1 axis)
    shape: tuple[int, ...]
    dtype: str
    literal: Any = None


class Graph:
    """A traced program as named-dimension ops.

    Example::

        g = autolayout.models.mlp(batch=8, d_io=16, d_hidden=32)
        g.dims            # {'batch': 8, 'io': 16, 'hidden': 32}
        g.flops()         # exact model flops of one training step
        g.evaluate(*args) # unsharded reference run
    """

    def __init__(
        self,
        ops: Sequence[Op],
        *,
        input_names: Sequence[str],
        in_tree: Any,
        outputs: Sequence[OutputSpec],
        out_tree: Any,
        loops: Sequence[Loop] = (),
        name: str = "graph",
    ) -> None:
        self.name = name
        self.nx = nx.DiGraph()
        self._ops: dict[str, Op] = {}
        ops = _with_fusion(ops, {s.tensor for s in outputs if s.tensor})
        for op in ops:
            if op.name in self._ops:
                raise ValueError(f"duplicate op name {op.name!r}")
            if op.kind not in KINDS:
                raise ValueError(f"op {op.name!r} has unknown kind {op.kind!r}; kinds are {KINDS}")
            self._ops[op.name] = op
            self.nx.add_node(op.name, op=op)
        for op in ops:
            for pos, src in enumerate(op.inputs):
                if src not in self._ops:
                    raise ValueError(f"op {op.name!r} reads unknown tensor {src!r}")
                if self.nx.has_edge(src, op.name):
                    self.nx.edges[src, op.name]["pos"] += (pos,)
                else:
                    self.nx.add_edge(src, op.name, pos=(pos,))
        self.order: tuple[str, ...] = tuple(op.name for op in ops)
        self.input_names = tuple(input_names)
        self.in_tree = in_tree
        self.outputs = tuple(outputs)
        self.out_tree = out_tree
        self.loops: dict[str, Loop] = {lp.name: lp for lp in loops}
        # output tensor -> donated input tensor whose buffer it reuses (set by trace)
        self.donated: dict[str, str] = {}
        self.loop_dims: frozenset[str] = frozenset(lp.dim for lp in loops if lp.dim)
        dims: dict[str, int] = {}
        for op in ops:
            for d in op.output.shape:
                if dims.setdefault(d.name, d.size) != d.size:
                    raise ValueError(
                        f"dim {d.name!r} has two sizes: {dims[d.name]} and {d.size} (tensor {op.name!r})")
        self.dims: dict[str, int] = dims

    # ---- lookup -----------------------------------------------------------
    def ops(self) -> list[Op]:
        """All ops in traced (execution) order."""
        return [self._ops[n] for n in self.order]

    def op(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            raise KeyError(f"graph has no tensor {name!r}") from None

    def tensor(self, name: str) -> Tensor:
        return self.op(name).output

    def tensors(self) -> Iterator[Tensor]:
        return (self._ops[n].output for n in self.order)

    def consumers(self, name: str) -> list[str]:
        return list(self.nx.successors(name))

    def params(self) -> list[Tensor]:
        return [t for t in self.tensors() if t.role == "param"]

    def dim(self, name: str) -> Dim:
        return Dim(name, self.dims[name])

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    # ---- exact counts -----------------------------------------------------
    def num_params(self) -> int:
        return sum(t.size for t in self.params())

    def flops(self) -> int:
        """Model flops of one call: 2 per multiply-add of every contraction einsum."""
        return sum(op.flops() * op.multiplicity for op in self.ops()
                   if op.kind == "einsum" and len(op.inputs) >= 2)

    def signature_classes(self) -> list[SignatureClass]:
        """Ops grouped by :meth:`Op.signature`, in order of first appearance."""
        groups: dict[tuple, list[Op]] = defaultdict(list)
        for op in self.ops():
            groups[op.signature()].append(op)
        return [SignatureClass(sig, tuple(o.name for o in members),
                               sum(o.multiplicity for o in members))
                for sig, members in groups.items()]

    def summary(self) -> str:
        """Human-readable digest: ops by kind, dims, params, flops."""
        kinds = Counter(op.kind for op in self.ops())
        lines = [f"Graph {self.name!r}: {len(self)} ops, "
                 f"{len(self.signature_classes())} signature classes, {len(self.loops)} loops"]
        lines.append("  ops by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
        lines.append("  dims: " + ", ".join(f"{n}:{s}" for n, s in self.dims.items()))
        if self.loop_dims:
            lines.append("  loop dims (never split): " + ", ".join(sorted(self.loop_dims)))
        lines.append(f"  parameters: {self.num_params():,} ({_human(self.num_params())})")
        lines.append(f"  flops per call: {self.flops():.4g}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self)} ops, dims {self.dims}>"

    # ---- reference interpreter -------------------------------------------
    def evaluate(self, *args: Any) -> Any:
        """Run the graph unsharded, op by op, and return the traced function's outputs.

        ``args`` have the structure of the traced function's arguments.
        """
        import jax

        leaves, tree = jax.tree_util.tree_flatten(args)
        if tree != self.in_tree:
            raise ValueError(f"evaluate: arguments have structure {tree}, expected {self.in_tree}")
        env: dict[str, Any] = {}
        for name, leaf in zip(self.input_names, leaves):
            env[name] = _squeeze_to(self.tensor(name), leaf)
        for unit in self._schedule():
            if isinstance(unit, Loop):
                self._run_loop(unit, env)
            elif unit not in env:
                env[unit] = self._run_op(self._ops[unit], env)
        outs = [self._output(spec, env) for spec in self.outputs]
        return jax.tree_util.tree_unflatten(self.out_tree, outs)

    def _dims_of(self, name: str) -> tuple[str, ...]:
        return self._ops[name].output.dim_names

    def _conform(self, x: Any, src: str, dst: str) -> Any:
        """Value of tensor ``src`` re-ordered to tensor ``dst``'s dim order."""
        return align(x, self._dims_of(src), self._dims_of(dst))

    def _run_op(self, op: Op, env: dict[str, Any]) -> Any:
        import jax.numpy as jnp

        if op.replay is None:
            raise ValueError(f"op {op.name!r} ({op.kind}.{op.fn}) has no replay and cannot be evaluated")
        args = []
        for spec in op.replay.operands:
            if spec[0] == "literal":
                args.append(spec[1])
                continue
            _, name, want, shape = spec
            y = align(env[name], self._dims_of(name), want)
            args.append(jnp.broadcast_to(y, shape) if tuple(y.shape) != tuple(shape) else y)
        return _squeeze_to(op.output, op.replay.fn(*args))

    def _output(self, spec: OutputSpec, env: dict[str, Any]) -> Any:
        import jax.numpy as jnp

        if spec.tensor is None:
            return jnp.broadcast_to(jnp.asarray(spec.literal, dtype=spec.dtype), spec.shape)
        y = align(env[spec.tensor], self._dims_of(spec.tensor), spec.dims)
        return jnp.broadcast_to(y, spec.shape).astype(spec.dtype)

    def _schedule(self) -> list:
        """Top-level ops and whole loops, in an order that respects data flow."""
        if getattr(self, "_sched", None) is None:
            self._sched = self._compute_schedule()
        return self._sched

    def _compute_schedule(self) -> list:
        group = {}
        for lp in self.loops.values():
            for n in lp.body:
                group[n] = lp.name
        cond = nx.DiGraph()
        for n in self.order:
            cond.add_node(group.get(n, n))
        for a, b in self.nx.edges:
            ga, gb = group.get(a, a), group.get(b, b)
            if ga != gb:
                cond.add_edge(ga, gb)
        rank = {n: i for i, n in enumerate(self.order)}
        first = {}
        for n in self.order:
            first.setdefault(group.get(n, n), rank[n])
        units = nx.lexicographical_topological_sort(cond, key=lambda u: first[u])
        return [self.loops[u] if u in self.loops else u for u in units]

    def _run_loop(self, lp: Loop, env: dict[str, Any]) -> None:
        import jax.numpy as jnp

        state = {c: self._conform(env[self._ops[c].inputs[0]], self._ops[c].inputs[0], c)
                 for c, _ in lp.carries}
        stacks = [self._ops[s] for s in lp.stacks]
        per_iter: dict[str, list] = {s.name: [None] * lp.length for s in stacks}
        skip = {c for c, _ in lp.carries} | set(lp.slices)
        steps = range(lp.length - 1, -1, -1) if lp.reverse else range(lp.length)
        for i in steps:
            local = dict(env)
            local.update(state)
            for s in lp.slices:
                src = self._ops[s].inputs[0]
                have = self._dims_of(src)
                x = env[src]
                if lp.dim is not None:
                    x = jnp.take(x, i, axis=have.index(lp.dim))
                    have = tuple(h for h in have if h != lp.dim)
                local[s] = align(x, have, self._dims_of(s))
            for n in lp.body:
                if n not in skip:
                    local[n] = self._run_op(self._ops[n], local)
            state = {c: self._conform(local[nxt], nxt, c) for c, nxt in lp.carries}
            for s in stacks:
                per_iter[s.name][i] = local[s.inputs[0]]
        for res, carry in lp.results:
            env[res] = self._conform(state[carry], carry, res)
        for s in stacks:
            src = s.inputs[0]
            if lp.dim is None:
                env[s.name] = self._conform(per_iter[s.name][0], src, s.name)
            else:
                x = jnp.stack(per_iter[s.name])
                env[s.name] = align(x, (lp.dim, *self._dims_of(src)), self._dims_of(s.name))


def _with_fusion(ops: Sequence[Op], outputs: set) -> list[Op]:
    """Mark which tensors live in HBM. An elementwise op's output stays in registers/VMEM
    (is fused into its consumers, as XLA's loop fusion does) when every consumer is an
    elementwise op of the same loop and it is not a graph output; everything else is
    materialised."""
    users: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        for i in op.inputs:
            users[i].append(op)
    by_name = {op.name: op for op in ops}

    def materialized(name: str) -> bool:
        op = by_name[name]
        if op.kind != "elementwise" or name in outputs:
            return True
        us = users.get(name, [])
        return not us or any(u.kind != "elementwise" or u.loop != op.loop for u in us)

    mat = {op.name: materialized(op.name) for op in ops}
    return [dataclasses.replace(op, hbm=tuple(mat[i] for i in op.inputs) + (mat[op.name],)) for op in ops]


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def align(x: Any, have: Sequence[str], want: Sequence[str | None]) -> Any:
    """Transpose ``x`` (axes named ``have``) to ``want`` order, inserting size-1 axes for
    ``None`` entries and for names ``x`` lacks (named broadcasting)."""
    import jax.numpy as jnp

    have = list(have)
    present = [w for w in want if w is not None and w in have]
    missing = [h for h in have if h not in present]
    if missing:
        raise ValueError(f"cannot align axes {have} to {list(want)}: {missing} would be dropped")
    if len(set(present)) != len(present):
        raise ValueError(f"cannot align: repeated names in {list(want)}")
    x = jnp.transpose(x, [have.index(w) for w in present]) if present != have else x
    shape, it = [], iter(x.shape)
    for w in want:
        shape.append(next(it) if (w is not None and w in have) else 1)
    return jnp.reshape(x, shape)


def _squeeze_to(t: Tensor, x: Any) -> Any:
    import jax.numpy as jnp

    want = tuple(d.size for d in t.shape)
    if tuple(x.shape) != want:
        x = jnp.reshape(x, want)
    return x
