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
import functools
import math
import types
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import networkx as nx
import numpy as np

from autolayout.core import Dim, Shape
from autolayout.fusion import with_fusion
from autolayout.schedule import Reference, align, run_schedule, squeeze_to

ROLES = ("input", "param", "opt_state", "activation", "output")
SOURCE_KINDS = ("input", "param", "opt_state", "constant")
KINDS = SOURCE_KINDS + ("einsum", "elementwise", "reduce", "reshape", "gather", "scatter", "along")


@dataclass(frozen=True)
class Tensor:
    """A named tensor: ``Tensor("h", (batch:8, hidden:32), "float32", "activation")``."""

    name: str
    shape: Shape
    dtype: str
    role: str

    @functools.cached_property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.shape)

    @property
    def size(self) -> int:
        return math.prod(d.size for d in self.shape)

    @functools.cached_property
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
    ``gather``/``scatter`` ops hold ``("indexed", dim)``, ``("batch", dims)`` (batching
    dims, if any), ``("mode", jax.lax.GatherScatterMode)`` (what an out-of-range index
    does: :func:`index_out_of_range`) and, for a FILL_OR_DROP
    gather, ``("fill_value", v)`` in the output's dtype.
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
    # Whether the output is written only because a reduction fusion shares it with another
    # fusion (fusion.with_fusion): where the layout leaves that reduction to XLA's own loop
    # fusions, it is recomputed in each instead (costmodel/recomputed.py). Set by Graph.
    reduction_shared: bool = False

    @property
    def materialised(self) -> bool:
        """Whether the output takes memory: not an elementwise intermediate fused into its
        consumers (``hbm``'s last entry says whether the output is written to HBM; no entries:
        every operand and the output are in memory)."""
        return not self.hbm or self.hbm[-1]

    @functools.cached_property
    def dims(self) -> tuple[Dim, ...]:
        """Union of input and output dims, in first-seen order."""
        seen: dict[str, Dim] = {}
        for shape in (*self.input_shapes, self.output.shape):
            for d in shape:
                seen.setdefault(d.name, d)
        return tuple(seen.values())

    @functools.cached_property
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

        if self.kind == "einsum" and self.fn == "conv":  # each output element: a window of MACs
            return 2 * prod(self.output.shape) * math.prod(n[d] for d in self.attr("window", ()))
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
            self.reduction_shared,
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
    # the body runs a jax.checkpoint (remat) call: the step was traced with remat, so this
    # scan already recomputes its forward ops (autolayout.remat offers no policy for it)
    recomputes: bool = False


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
class ParamRole:
    """What a training step does with one parameter, found by the tracer from the pytree
    structure of the traced function's arguments and outputs (never from tensor names).

    ``param``: the parameter tensor (role ``"param"``). ``grad``: its gradient — the
    tensor every path from the backward pass into the update goes through, the one
    nearest the update that is not an element-wise map of it alone (see
    :func:`autolayout.trace`). ``opt_state``: its optimizer-state tensors (leaves of the
    optimizer state that mirror the parameter's position in the parameter tree).
    ``update``: the updated parameter, an output tensor. ``None`` / ``()`` where the step
    has none (a forward pass, a frozen parameter)::

        ParamRole(param='w', grad='grad/w', opt_state=('mu/w', 'nu/w'), update='out/0/w')
    """

    param: str
    grad: str | None
    opt_state: tuple[str, ...]
    update: str | None

    def __repr__(self) -> str:
        return (f"ParamRole({self.param!r}, grad={self.grad!r}, opt_state={self.opt_state!r}, "
                f"update={self.update!r})")


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

    Besides the ops, a traced graph records where it came from (all constructor
    arguments, read-only afterwards): ``fn`` (the traced function), ``example_spec``
    (its arguments as ``jax.ShapeDtypeStruct`` s), ``arg_dims`` and ``arg_roles`` (the
    ``dims`` and ``roles`` given to :func:`~autolayout.trace`), ``donated`` (output tensor
    -> the donated input tensor whose buffer it reuses) and ``param_roles`` (parameter
    tensor -> :class:`ParamRole`; every parameter has one).

    Example::

        g = autolayout.models.mlp(batch=8, d_io=16, d_hidden=32)
        g.dims            # {'batch': 8, 'io': 16, 'hidden': 32}
        g.flops()         # exact model flops of one training step
        g.evaluate(*args) # unsharded reference run
        g.param_roles["w"].grad  # 'grad/w'
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
        param_roles: Mapping[str, ParamRole] | None = None,
        donated: Mapping[str, str] | None = None,
        fn: Callable | None = None,
        example_spec: Any = None,
        arg_dims: Any = None,
        arg_roles: Any = None,
    ) -> None:
        self.name = name
        self.nx = nx.DiGraph()
        self._ops: dict[str, Op] = {}
        ops = with_fusion(ops, {s.tensor for s in outputs if s.tensor})
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
        self._consumers: dict[str, tuple[str, ...]] = {}
        self._params: tuple[Tensor, ...] | None = None
        self.input_names = tuple(input_names)
        self.in_tree = in_tree
        self.outputs = tuple(outputs)
        self.out_tree = out_tree
        self.loops: dict[str, Loop] = {lp.name: lp for lp in loops}
        self.fn = fn
        self.example_spec = example_spec
        self.arg_dims = arg_dims
        self.arg_roles = arg_roles
        # output tensor -> donated input tensor whose buffer it reuses
        self.donated: Mapping[str, str] = types.MappingProxyType(self._check_donated(donated or {}))
        self.param_roles: Mapping[str, ParamRole] = types.MappingProxyType(
            self._check_roles(param_roles or {}))
        self.loop_dims: frozenset[str] = frozenset(lp.dim for lp in loops if lp.dim)
        dims: dict[str, int] = {}
        for op in ops:
            for d in op.output.shape:
                if dims.setdefault(d.name, d.size) != d.size:
                    raise ValueError(
                        f"dim {d.name!r} has two sizes: {dims[d.name]} and {d.size} (tensor {op.name!r})")
        self.dims: dict[str, int] = dims

    def _check_donated(self, donated: Mapping[str, str]) -> dict[str, str]:
        for out, src in donated.items():
            for t in (out, src):
                if t not in self._ops:
                    raise ValueError(f"donated: graph has no tensor {t!r}")
            if self._ops[src].output.role not in ("input", "param", "opt_state"):
                raise ValueError(f"donated: {out!r} reuses {src!r}, which is not an argument")
        return dict(donated)

    def _check_roles(self, roles: Mapping[str, ParamRole]) -> dict[str, ParamRole]:
        """Every parameter gets a role (an empty one if none was given); every tensor a
        role names exists and has the right kind."""
        out = {}
        for t in self.params():
            r = roles.get(t.name, ParamRole(t.name, None, (), None))
            if not isinstance(r, ParamRole) or r.param != t.name:
                raise ValueError(f"param_roles[{t.name!r}] must be a ParamRole of {t.name!r}, got {r!r}")
            for what, n in (("grad", r.grad), ("update", r.update), *(("opt_state", o) for o in r.opt_state)):
                if n is not None and n not in self._ops:
                    raise ValueError(f"param_roles[{t.name!r}].{what}: graph has no tensor {n!r}")
            if any(self._ops[o].output.role != "opt_state" for o in r.opt_state):
                raise ValueError(f"param_roles[{t.name!r}].opt_state {r.opt_state} holds a tensor "
                                 f"whose role is not 'opt_state'")
            out[t.name] = r
        extra = sorted(set(roles) - set(out))
        if extra:
            raise ValueError(f"param_roles names {extra}, which are not parameters of the graph")
        return out

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
        hit = self._consumers.get(name)
        if hit is None:
            hit = self._consumers[name] = tuple(self.nx.successors(name))
        return list(hit)

    def params(self) -> list[Tensor]:
        if self._params is None:
            self._params = tuple(t for t in self.tensors() if t.role == "param")
        return list(self._params)

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

    def rename(self, names: Mapping[str, str]) -> "Graph":
        """A copy of this graph with dims renamed by ``names`` (old -> new), e.g. the automatic
        names the tracer gives axes no argument names (``d4``, ``d2_1``: heads made by a
        reshape inside library code) so that layouts read with real names::

            g = g.rename({"d4": "heads", "d16": "d_kv"})
            autolayout.search(g, "x:2,y:4").layout   # 'batch:x;heads:y' instead of '...;d4:y'

        Everything that names a dim follows: tensor shapes, reshape groups and other op
        attributes, replays, output specs, loop dims. Raises ``ValueError`` naming the dim
        for an old name the graph lacks, a new name that is not a valid dim name, or one
        that another dim keeps or two dims would share (a rename never merges dims).
        """
        from autolayout.mesh import check_name, closest

        names = dict(names)
        unknown = [d for d in names if d not in self.dims]
        if unknown:
            raise ValueError(f"rename: graph {self.name!r} has no dim {unknown[0]!r}; its dims are "
                             f"{sorted(self.dims)}." + closest(unknown[0], self.dims))
        new_of = {d: names.get(d, d) for d in self.dims}
        for old, new in names.items():
            check_name(new, f"rename: new name of dim {old!r}")
        seen: dict[str, str] = {}
        for old, new in new_of.items():
            if new in seen:
                a, b = seen[new], old
                kept = a if a not in names else b if b not in names else None
                why = (f"dim {kept!r} keeps that name" if kept is not None
                       else f"dims {a!r} and {b!r} would both get it")
                fix = f"rename {kept!r} too" if kept is not None else "give them different names"
                raise ValueError(f"rename: {new!r} is taken ({why}); a rename never merges dims. "
                                 f"Fix: choose another name, or {fix}.")
            seen[new] = old
        if all(o == n for o, n in new_of.items()):
            return self

        def shape(sh: Shape) -> Shape:
            return tuple(Dim(new_of[d.name], d.size) for d in sh)

        def attr(v: Any) -> Any:
            if isinstance(v, str):
                return new_of.get(v, v)
            if isinstance(v, tuple):
                return tuple(attr(x) for x in v)
            return v

        def replay(r: Replay | None) -> Replay | None:
            if r is None:
                return None
            ops = tuple(("tensor", o[1], tuple(None if d is None else new_of[d] for d in o[2]), *o[3:])
                        if o[0] == "tensor" else o for o in r.operands)
            return dataclasses.replace(r, operands=ops)

        ops = [dataclasses.replace(
            op, input_shapes=tuple(shape(s) for s in op.input_shapes),
            output=dataclasses.replace(op.output, shape=shape(op.output.shape)),
            attrs=tuple((k, attr(v)) for k, v in op.attrs), replay=replay(op.replay)) for op in self.ops()]
        outputs = [dataclasses.replace(o, dims=tuple(None if d is None else new_of[d] for d in o.dims))
                   for o in self.outputs]
        loops = [dataclasses.replace(lp, dim=new_of.get(lp.dim, lp.dim)) for lp in self.loops.values()]
        return Graph(ops, input_names=self.input_names, in_tree=self.in_tree, outputs=outputs,
                     out_tree=self.out_tree, loops=loops, name=self.name, param_roles=self.param_roles,
                     donated=self.donated, fn=self.fn, example_spec=self.example_spec,
                     arg_dims=self.arg_dims, arg_roles=self.arg_roles)

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

    # ---- schedule and reference interpreter ----------------------------
    @property
    def schedule(self) -> tuple:
        """Top-level ops (names) and whole loops (:class:`Loop`), in an order that respects
        data flow and otherwise follows the traced order (the order every interpreter and the
        memory liveness walk)."""
        if getattr(self, "_sched", None) is None:
            self._sched = tuple(self._compute_schedule())
        return self._sched

    def with_schedule(self, units: Sequence[Any]) -> "Graph":
        """This graph, everything shared, with its :attr:`schedule` in another order that respects
        data flow: ``units`` are its top-level op names and :class:`Loop` s (bodies reordered too,
        possibly). ``costmodel.order`` builds the order a backend runs. Raises ValueError otherwise."""
        key = lambda us: sorted(u.name if isinstance(u, Loop) else u for u in us)  # noqa: E731
        loops = {u.name: u for u in units if isinstance(u, Loop)}
        if key(units) != key(self.schedule) or any(sorted(lp.body) != sorted(self.loops[n].body)
                                                   for n, lp in loops.items()):
            raise ValueError(f"with_schedule: units must be graph {self.name!r}'s schedule units (and each loop's "
                             "body its ops), in another order")
        view = object.__new__(Graph)
        view.__dict__.update(self.__dict__)
        view._sched, view.loops = tuple(units), loops
        return view

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
            env[name] = squeeze_to(self.tensor(name), leaf)
        run_schedule(self, env, Reference(self))
        outs = [self.output_value(spec, env[spec.tensor] if spec.tensor else None) for spec in self.outputs]
        return jax.tree_util.tree_unflatten(self.out_tree, outs)

    def output_value(self, spec: OutputSpec, value: Any) -> Any:
        """One leaf of the traced function's output from its graph tensor's (global) value."""
        import jax.numpy as jnp

        if spec.tensor is None:
            return jnp.broadcast_to(jnp.asarray(spec.literal, dtype=spec.dtype), spec.shape)
        y = align(value, self.tensor(spec.tensor).dim_names, spec.dims)
        return jnp.broadcast_to(y, spec.shape).astype(spec.dtype)

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


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


class NotAGraphError(ValueError):
    """A pipeline function got something else than a traced :class:`Graph` as ``graph``."""


def require_graph(graph: Any, where: str) -> Graph:
    """``graph`` itself if it is a :class:`Graph`, else :class:`NotAGraphError` naming the argument."""
    if not isinstance(graph, Graph):
        raise NotAGraphError(
            f"{where}: argument 'graph' must be a traced autolayout Graph (from autolayout.trace(fn, *args, "
            f"dims=...) or a model of autolayout.models), got {type(graph).__name__} {str(graph)[:60]!r}")
    return graph


def index_out_of_range(kind: str, mode: Any) -> str:
    """What a ``gather`` or ``scatter`` op with jax's ``GatherScatterMode`` ``mode`` does with
    an index outside its indexed dim, as the compiled op does: ``"clamp"``, ``"fill"`` (a
    gather's row) or ``"drop"`` (a scatter's update); the tracer and the lowering both ask.

    Sources: XLA's operation semantics (openxla.org/xla/operation_semantics): Gather clamps
    start indices into the operand, Scatter skips an out-of-bounds update; jax lowers a
    gather's FILL_OR_DROP as a PROMISE_IN_BOUNDS gather masked with ``fill_value``
    (``lax.slicing._gather_fill``) and a scatter's CLIP by clamping the indices first
    (``lax.slicing._clamp_scatter_indices``). So PROMISE_IN_BOUNDS clamps a gather's index
    but drops a scatter's update (its gradient), exactly as ``jax.jit``.
    """
    from jax.lax import GatherScatterMode as M

    mode = M.from_any(mode)
    if kind == "gather":
        return "fill" if mode == M.FILL_OR_DROP else "clamp"
    return "clamp" if mode == M.CLIP else "drop"
