"""Lower a named-dimension :class:`~autolayout.graph.Graph` to one ``jax.shard_map`` program.

The program executes a :class:`~autolayout.costmodel.plan.Plan` — the same plan
``predict`` prices — and decides nothing itself: every op reads its inputs in
the placement the plan says (executing the planned conversions), computes on
local blocks (:mod:`autolayout.exec.local_ops`), and reduces or converts its
output into the placement the plan stores it in. Scans run as ``lax.scan`` via
the graph's one schedule walker (:func:`autolayout.schedule.run_schedule`).

Value convention inside the program: ``env[name]`` is the *local* block of
tensor ``name`` in its stored placement: the tensor's dims in its own order,
each at its local size, or, for a flattened update shard, ``(kept loop dims...,
chunk)``. Each stored value's varying-manual-axes set is made exactly the set of
mesh axes that split it (``lax.pcast(..., to="varying")`` adds missing ones; a
value that varies over an axis its placement replicates it on raises, which is
how a collective missing from the plan would show).
"""
from __future__ import annotations

import math
from typing import Any

from autolayout.core import Mesh
from autolayout.costmodel.placement import Placement
from autolayout.costmodel.plan import Plan
from autolayout.exec.local_ops import LocalOps, LoweringError, vma
from autolayout.graph import Loop, Op
from autolayout.schedule import Interpreter, rename_align

__all__ = ["ShardProgram", "LoweringError", "partition_spec"]


def partition_spec(p: Placement, mesh: Mesh) -> Any:
    """The ``PartitionSpec`` of a placement as the step exchanges it: per dim its axes, or,
    for a flattened shard, ``(None per kept dim, every splitting axis in mesh order)``."""
    from jax.sharding import PartitionSpec

    if p.flat:
        split = set(p.split_axes())
        axes = tuple(a for a in mesh.axis_names if a in split)
        return PartitionSpec(*([None] * len(p.kept)), axes or None)
    return PartitionSpec(*(None if not ax else ax[0] if len(ax) == 1 else ax for ax in p.axes))


class ShardProgram(Interpreter, LocalOps):
    """The shard_map body executing ``plan`` (see the module docstring).

    ``in_specs`` / ``out_specs`` are the PartitionSpecs of the graph's input tensors
    (``graph.input_names`` order) and of :attr:`out_tensors` *as the step exchanges
    them*; tensors stored as flattened shards (:attr:`flat_io`) need :meth:`to_step` /
    :meth:`from_step` (separate shard_maps, outside the step).
    """

    def __init__(self, plan: Plan, hardware: Any = None) -> None:
        super().__init__(plan.graph)
        self.plan = plan
        self.hw = hardware  # its links split all-reduces hierarchically (rules.phases)
        self.mesh = plan.mesh
        self.out_tensors = tuple(dict.fromkeys(s.tensor for s in self.g.outputs if s.tensor is not None))
        self.in_specs = tuple(self.spec(n) for n in self.g.input_names)
        self.out_specs = tuple(self.spec(n) for n in self.out_tensors)
        self.flat_io = {n for n in (*self.g.input_names, *self.out_tensors) if plan.placements[n].flat}
        self._converted: dict[tuple[str, str], Any] = {}  # (op, input) -> its converted copy, for sharers

    # ------------------------------------------------------------------ shapes
    def nsplit(self, axes: tuple[str, ...]) -> int:
        return math.prod(self.mesh.axis_size(a) for a in axes)

    def placement(self, name: str) -> Placement:
        return self.plan.placements[name]

    def spec(self, name: str, *, layout: bool = False) -> Any:
        """PartitionSpec of tensor ``name`` as stored (``layout=True``: its layout's rules, the
        form a flattened shard takes outside the step)."""
        p = self.placement(name)
        return partition_spec(p.base() if layout else p, self.mesh)

    # ---------------------------------------------------------------- values
    def canon(self, x: Any, name: str) -> Any:
        """Make ``x``'s varying axes exactly the mesh axes splitting tensor ``name``."""
        from jax import lax

        p = self.placement(name)
        want = set(p.split_axes()) | set(p.partial)  # a partial sum varies over its partial axes
        have = set(vma(x))
        extra = have - want
        if extra:
            raise LoweringError(
                f"internal: tensor {name!r} varies over mesh axes {sorted(extra)} but its placement "
                f"replicates it there; a collective is missing from the plan of its op")
        missing = tuple(a for a in self.mesh.axis_names if a in want - have)
        return lax.pcast(x, missing, to="varying") if missing else x

    def value(self, name: str, x: Any) -> Any:
        shape = self.placement(name).local_shape(self.g.dims, self.mesh)
        if tuple(x.shape) != shape:
            raise LoweringError(f"internal: op {name!r} produced local shape {tuple(x.shape)}, "
                                f"expected {shape}")
        return self.canon(x, name)

    def _read(self, name: str, x: Any, p: Any) -> Any:
        conv = p.conversions.get(name)
        return self.convert(x, conv, self.g.tensor(name).dim_names, name) if conv is not None else x

    # ------------------------------------------------------------- program
    def body(self, *leaves: Any) -> tuple:
        """The shard_map body: local input blocks in, local output blocks out."""
        from autolayout.schedule import run_schedule

        env: dict[str, Any] = {}
        for name, leaf in zip(self.g.input_names, leaves):
            env[name] = self.canon(leaf, name)
        run_schedule(self.g, env, self)
        return tuple(env[n] for n in self.out_tensors)

    def op(self, op: Op, env: dict) -> Any:
        p = self.plan.ops[op.name]
        if op.kind in ("input", "param", "opt_state"):
            raise LoweringError(f"internal: source {op.name!r} missing from the inputs")
        if op.kind == "constant":
            return self.constant(op, _axes(p.out))
        ins = {}
        for i in dict.fromkeys(op.inputs):
            if i in p.shared:  # the conversion an earlier reader made (sharing.shared_reads)
                key = (p.shared[i], i)
                if key not in self._converted:
                    raise LoweringError(
                        f"internal: op {op.name!r} reads {i!r} from the converted copy of op {p.shared[i]!r}, "
                        f"which the plan does not hold (OpPlan.span_bytes of {p.shared[i]!r}: "
                        f"{dict(self.plan.ops[p.shared[i]].span_bytes)}); sharing.shared_reads and the planner's "
                        "sharing check disagree")
                ins[i] = self._converted[key]
                continue
            ins[i] = self._read(i, env[i], p)
            if i in p.span_bytes:
                self._converted[(op.name, i)] = ins[i]
        dims = op.output.dim_names
        if p.flat is not None:
            for i in ins:  # operands with fewer dims are broadcast into the shard, locally
                if not p.reads[i].flat and self.g.tensor(i).dim_names:
                    ins[i] = self.to_flat(ins[i], self.g.tensor(i).dim_names, p.flat)
            x = self.flat_replay(op, ins, p.flat)
        elif op.kind == "reshape":
            x = self.regroup(ins[op.inputs[0]], self.g.tensor(op.inputs[0]).dim_names, p.moves, dims, op.name)
        elif op.kind == "gather":
            x = self.gather(op, ins, p)
        elif op.kind == "scatter":
            x = self.scatter(op, ins, p)
        elif op.kind == "reduce" and op.fn in ("argmax", "argmin"):
            return self.arg_reduce(op, ins, p.axes)  # its two all-reduces are inside
        else:
            x = self.replay(op, ins, p.axes)
        if p.out_steps:
            x = self.reduce_steps(x, dims, p.out_steps, p.computed, p.reduced or p.out)
        if op.kind == "scatter":
            x = ins[op.inputs[0]] + x
        if p.out_conversion is not None:
            x = self.convert(x, p.out_conversion, dims, op.name)
        return x

    # ---------------------------------------------------------------- loops
    def boundary(self, op: Op, value: Any, have: tuple[str, ...]) -> Any:
        p = self.plan.ops[op.name]
        if op.fn == "slice":  # the stacked input was converted before unstacking
            return value if p.flat is not None else rename_align(self.g, value, have, op.name)
        src = op.inputs[0]
        x = self._read(src, value, p)
        if p.flat is not None:
            return x  # flattened chunks are per layer: nothing moves
        return self._finish(self.regroup(x, have, p.moves, op.output.dim_names, op.name), op, p)

    def carry_back(self, op: Op, value: Any, nxt: str) -> Any:
        p = self.plan.ops[op.name]
        if p.flat is not None:
            return value
        if p.loop_back is not None:
            return self.regroup(value, self.g.tensor(nxt).dim_names, p.loop_back.moves, op.output.dim_names,
                                op.name)
        return rename_align(self.g, value, self.g.tensor(nxt).dim_names, op.name)

    def unstack(self, op: Op, value: Any, lp: Loop) -> tuple[Any, tuple[str, ...]]:
        import jax.numpy as jnp

        p = self.plan.ops[op.name]
        src = op.inputs[0]
        x = self._read(src, value, p)
        if p.flat is not None:
            return x, ()  # (kept loop dims..., chunk): the loop dim leads
        have = self.g.tensor(src).dim_names
        if lp.dim is None:
            return x, have
        return jnp.moveaxis(x, have.index(lp.dim), 0), tuple(d for d in have if d != lp.dim)

    def stack_item(self, op: Op, value: Any) -> Any:
        return self._read(op.inputs[0], value, self.plan.ops[op.name])

    def stacked(self, op: Op, value: Any, lp: Loop) -> Any:
        p = self.plan.ops[op.name]
        if p.flat is not None:
            return value
        have = ((lp.dim,) if lp.dim else ()) + self.g.tensor(op.inputs[0]).dim_names
        return self._finish(rename_align(self.g, value, have, op.name), op, p)

    def _finish(self, x: Any, op: Op, p: Any) -> Any:
        """A loop boundary's value reduced into where it is stored (stage 1: the complete
        gradient of a stack of partial sums is reduce-scattered once)."""
        if p.out_steps:
            x = self.reduce_steps(x, op.output.dim_names, p.out_steps, p.computed, p.reduced or p.out)
        if p.out_conversion is not None:
            x = self.convert(x, p.out_conversion, op.output.dim_names, op.name)
        return x

    # ----------------------------------------------- step interface (flat shards)
    def to_step(self, name: str) -> Any:
        """Local function: layout block of input ``name`` -> its flattened shard."""
        p = self.placement(name)
        return lambda x: self.to_flat(x, self.g.tensor(name).dim_names, p)

    def from_step(self, name: str) -> Any:
        """Local function: flattened shard of output ``name`` -> its layout block."""
        p = self.placement(name)
        return lambda x: self.from_flat(x, p, self.g.tensor(name).dim_names)


def _axes(p: Placement) -> dict[str, tuple[str, ...]]:
    return {d: ax for d, ax in zip(p.dims, p.axes) if ax}
