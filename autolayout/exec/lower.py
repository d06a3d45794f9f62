"""Lower a named-dimension :class:`~autolayout.graph.Graph` to one ``jax.shard_map`` program.

Every op runs on the local slices of its tensors; every collective is explicit
and is the one :func:`autolayout.costmodel.predict.predict` lists for the op
(DESIGN §6). The per-kind local rules live in :mod:`autolayout.exec.local_ops`;
this module holds the program: how each tensor is split (the layout's
``PartitionSpec``, or a weight-update shard), the interpreter over the graph's
schedule, and scans as ``lax.scan``.

Value convention inside the program: ``env[name]`` is the *local* block of
tensor ``name`` in the tensor's own dim order, in its *form*: ``None`` (split
as the layout says) or the name of an update-sharded parameter, whose plan
(:func:`~autolayout.costmodel.predict.update_plan`) further splits the block
over the update axes ``U`` — along ``scatter_dim`` (minor to the layout's
axes), or, when no dim divides, as the flattened block padded to a multiple of
``|U|`` (seed 003 §4), kept ``(loop dims..., chunk)``. Each stored value's
varying-manual-axes set is made exactly the set of mesh axes that split it
(``lax.pcast(..., to="varying")`` adds missing ones; a value that varies over
an axis its layout replicates it on raises, which is how a missing collective
shows).
"""
from __future__ import annotations

import math
from typing import Any

from autolayout.core import Layout, Mesh
from autolayout.costmodel.predict import gradient_walk, opt_state_of, update_plan
from autolayout.exec.local_ops import LocalOps, LoweringError, _axis_name
from autolayout.graph import Graph, Loop, align

__all__ = ["ShardProgram", "LoweringError", "Sharder"]


class Sharder:
    """How one weight-update-sharding plan splits parameter-shaped local blocks over ``U``."""

    def __init__(self, prog: "ShardProgram", plan: Any) -> None:
        g = prog.g
        self.prog, self.plan = prog, plan
        self.axes = tuple(plan.axes)
        self.f = plan.factor
        self.dim = plan.scatter_dim  # "" = flattened and padded
        pdims = g.tensor(plan.param).dim_names
        self.loop = tuple(d for d in pdims if d in g.loop_dims)
        self.rest = tuple(d for d in pdims if d not in g.loop_dims)
        self.n = math.prod(prog.lsize(d) for d in self.rest)  # flattened local size
        self.chunk = -(-self.n // self.f)

    def applies(self, dims: tuple) -> bool:
        return (self.dim in dims) if self.dim else set(self.rest) <= set(dims)

    def local_shape(self, dims: tuple) -> tuple[int, ...]:
        p = self.prog
        if self.dim:
            return tuple(p.lsize(d) // (self.f if d == self.dim else 1) for d in dims)
        return tuple(p.lsize(d) for d in self.loop if d in dims) + (self.chunk,)

    def _flat(self, x: Any, dims: tuple) -> Any:
        """Full local block -> ``(loop..., n padded to chunk * f)`` in the parameter's dim order."""
        import jax.numpy as jnp

        p = self.prog
        loop = [d for d in self.loop if d in dims]
        want = (*loop, *self.rest)
        x = jnp.broadcast_to(align(x, dims, want), tuple(p.lsize(d) for d in want))
        x = jnp.reshape(x, (*x.shape[: len(loop)], self.n))
        pad = self.chunk * self.f - self.n
        return jnp.pad(x, [(0, 0)] * len(loop) + [(0, pad)]) if pad else x

    def to_shard(self, x: Any, dims: tuple) -> Any:
        """Full local block -> this device's update shard (a local slice, no communication)."""
        if self.dim:
            return self.prog.slice_block(x, dims.index(self.dim), self.axes)
        x = self._flat(x, dims)
        return self.prog.slice_block(x, x.ndim - 1, self.axes)

    def reduce_scatter(self, x: Any, dims: tuple, rest: tuple[str, ...]) -> Any:
        """Partial sums (full local block) -> summed update shard: ``psum_scatter`` over U."""
        from jax import lax

        if self.dim:
            x = lax.psum_scatter(x, _axis_name(self.axes), scatter_dimension=dims.index(self.dim), tiled=True)
        else:
            x = self._flat(x, dims)
            x = lax.psum_scatter(x, _axis_name(self.axes), scatter_dimension=x.ndim - 1, tiled=True)
        return lax.psum(x, _axis_name(rest)) if rest else x

    def gather(self, x: Any, dims: tuple) -> Any:
        """Update shard -> full local block: ``all_gather`` over U."""
        import jax.numpy as jnp
        from jax import lax

        p = self.prog
        if self.dim:
            return lax.all_gather(x, _axis_name(self.axes), axis=dims.index(self.dim), tiled=True,
                                  to="invarying")
        x = lax.all_gather(x, _axis_name(self.axes), axis=x.ndim - 1, tiled=True, to="invarying")
        loop = [d for d in self.loop if d in dims]
        x = jnp.reshape(x[..., : self.n], (*x.shape[: len(loop)], *(p.lsize(d) for d in self.rest)))
        return align(x, (*loop, *self.rest), dims)


class ShardProgram(LocalOps):
    """The shard_map body for ``graph`` under ``layout`` on ``mesh`` (an autolayout Mesh).

    ``in_specs`` / ``out_specs`` are the PartitionSpecs of the graph's input tensors
    (``graph.input_names`` order) and of :attr:`out_tensors` *as the step exchanges
    them*; tensors in a flattened update-shard form (:attr:`flat_io`) need
    :meth:`to_step` / :meth:`from_step` (separate shard_maps, outside the step).
    """

    def __init__(self, graph: Graph, mesh: Mesh, layout: Layout, axes_of: dict) -> None:
        self.g = graph
        self.mesh = mesh
        self.layout = layout
        self.axes_of = dict(axes_of)
        self.plans = update_plan(graph, mesh, layout, self.axes_of)
        self.sharders = {p: Sharder(self, plan) for p, plan in self.plans.items()}
        self.notes: list[str] = []  # deviations from the predicted collectives, if any
        self.form: dict[str, str | None] = {}  # stored form of each tensor
        self.op_form: dict[str, str | None] = {}  # form an op computes in
        self.rs_ops: dict[str, str] = {}  # op -> param whose gradient it reduce-scatters
        self._assign_forms()
        self.out_tensors = tuple(dict.fromkeys(s.tensor for s in graph.outputs if s.tensor is not None))
        self.in_specs = tuple(self.spec(n) for n in graph.input_names)
        self.out_specs = tuple(self.spec(n) for n in self.out_tensors)
        self.flat_io = {n for n in (*graph.input_names, *self.out_tensors)
                        if self.form.get(n) and not self.sharders[self.form[n]].dim}

    # ------------------------------------------------------------------ shapes
    def dims_of(self, name: str) -> tuple[str, ...]:
        return self.g.tensor(name).dim_names

    def dim_axes(self, dim: str, form: str | None = None) -> tuple[str, ...]:
        """Mesh axes splitting ``dim`` in ``form`` (major first)."""
        axes = self.axes_of.get(dim, ())
        if form is not None and dim == self.plans[form].scatter_dim:
            axes = axes + tuple(self.plans[form].axes)
        return axes

    def tensor_axes(self, name: str) -> set[str]:
        form = self.form.get(name)
        axes = {a for d in self.dims_of(name) for a in self.axes_of.get(d, ())}
        return axes | set(self.plans[form].axes) if form else axes

    def nsplit(self, axes: tuple[str, ...]) -> int:
        return math.prod(self.mesh.axis_size(a) for a in axes)

    def lsize(self, dim: str, form: str | None = None) -> int:
        return self.g.dims[dim] // self.nsplit(self.dim_axes(dim, form))

    def local_shape(self, name: str) -> tuple[int, ...]:
        form = self.form.get(name)
        dims = self.dims_of(name)
        return self.sharders[form].local_shape(dims) if form else tuple(self.lsize(d) for d in dims)

    def spec(self, name: str, form: Any = "stored") -> Any:
        from jax.sharding import PartitionSpec

        form = self.form.get(name) if form == "stored" else form
        dims = self.dims_of(name)
        if form and not self.sharders[form].dim:  # flat shards: (loop dims, all varying axes)
            sh = self.sharders[form]
            axes = tuple(a for a in self.mesh.axis_names if a in self.tensor_axes(name))
            return PartitionSpec(*([None] * len([d for d in sh.loop if d in dims])), axes or None)
        entries = []
        for d in dims:
            axes = self.dim_axes(d, form)
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        return PartitionSpec(*entries)

    # ------------------------------------------------------------ WUS forms
    def _assign_forms(self) -> None:
        g = self.g
        for pname, plan in self.plans.items():
            sh = self.sharders[pname]
            pdims = set(g.tensor(pname).dim_names)
            for r in plan.reduce_ops:
                op = g.op(r)
                axes = {a for d in op.reduced_dims for a in self.axes_of.get(d.name, ())}
                if set(plan.axes) <= axes and sh.applies(op.output.dim_names):
                    self.rs_ops[r] = pname
                    self.form[r] = pname
            for t in (*self._grad_path(plan, pdims), *plan.region):
                op = g.op(t)
                flat_ok = sh.dim or op.kind == "elementwise" or (
                    op.kind == "einsum" and len(op.inputs) == 1 and not op.reduced_dims) or (
                    op.kind == "reshape" and op.fn in ("stack", "result", "carry"))
                if sh.applies(op.output.dim_names) and flat_ok:
                    self.form[t] = self.op_form[t] = pname
            self.form[plan.new_param] = None  # all-gathered over the update axes after its op
            for t in opt_state_of(g, pname):
                if sh.applies(self.dims_of(t)):
                    self.form[t] = pname

    def _grad_path(self, plan: Any, pdims: set) -> set[str]:
        """Tensors between the plan's reducing ops and its gradient (the walk of
        :func:`~autolayout.costmodel.predict.update_plan`), run on the update shard."""
        g = self.g
        _, seen = gradient_walk(g, plan.param, self.axes_of)
        down = set(plan.reduce_ops)
        path: set[str] = set()
        carry_next = {c: n for lp in g.loops.values() for c, n in lp.carries}
        changed = True
        while changed:
            changed = False
            for t in g.order:
                if t in seen and t not in down and t not in path:
                    feeds = any(i in down or i in path for i in g.op(t).inputs)
                    if feeds or (g.op(t).fn == "carry" and carry_next.get(t) in path):
                        path.add(t)
                        changed = True
        return path

    # ---------------------------------------------------------------- values
    def canon(self, x: Any, name: str) -> Any:
        """Make ``x``'s varying axes exactly the mesh axes splitting tensor ``name``."""
        from jax import lax

        from autolayout.exec.local_ops import _vma

        want = self.tensor_axes(name)
        have = set(_vma(x))
        extra = have - want
        if extra:
            raise LoweringError(
                f"internal: tensor {name!r} varies over mesh axes {sorted(extra)} but its layout "
                f"replicates it there; a collective is missing in the lowering of its op")
        missing = tuple(a for a in self.mesh.axis_names if a in want - have)
        return lax.pcast(x, missing, to="varying") if missing else x

    def convert(self, x: Any, name: str, want: str | None, consumer: str,
                have: Any = "stored") -> Any:
        """Tensor ``name``'s value ``x`` (in form ``have``) in form ``want``."""
        have = self.form.get(name) if have == "stored" else have
        if have == want:
            return x
        dims = self.dims_of(name)
        if have is not None:  # shard -> full: all-gather over the update axes (not predicted)
            x = self.sharders[have].gather(x, dims)
            self.notes.append(f"all-gather of update-sharded {name!r} for {consumer!r} (not in the cost model)")
        if want is not None and self.sharders[want].applies(dims):
            x = self.sharders[want].to_shard(x, dims)
        return x

    def store(self, env: dict, name: str, x: Any) -> None:
        shape = self.local_shape(name)
        if tuple(x.shape) != shape:
            raise LoweringError(f"internal: op {name!r} produced local shape {tuple(x.shape)}, "
                                f"expected {shape}")
        env[name] = self.canon(x, name)

    # ------------------------------------------------------------- program
    def body(self, *leaves: Any) -> tuple:
        """The shard_map body: local input blocks in, local output blocks out."""
        env: dict[str, Any] = {}
        for name, leaf in zip(self.g.input_names, leaves):
            env[name] = self.canon(leaf, name)
        for unit in self.g._schedule():
            if isinstance(unit, Loop):
                self.run_loop(unit, env)
            elif unit not in env:
                self.run_op(self.g.op(unit), env)
        return tuple(env[n] for n in self.out_tensors)

    def run_op(self, op: Any, env: dict) -> None:
        form = self.op_form.get(op.name)
        if op.kind == "constant":
            x = self.constant(op, form)
        elif op.kind in ("input", "param", "opt_state"):
            raise LoweringError(f"internal: source {op.name!r} missing from the inputs")
        else:
            in_form = None if op.name in self.rs_ops else form
            ins = {i: self.convert(env[i], i, in_form, op.name) for i in dict.fromkeys(op.inputs)}
            if form is not None and not self.sharders[form].dim:
                x = self.flat_replay(op, ins, form)
            elif op.kind == "reshape":
                x = self.reshape(op, ins[op.inputs[0]], form)
            elif op.kind == "gather":
                x = self.gather(op, ins, form)
            elif op.kind == "scatter":
                x = self.scatter(op, ins, form)
            elif op.kind == "reduce" and op.fn in ("argmax", "argmin"):
                x = self.arg_reduce(op, ins, form)
            else:
                x = self.replay(op, ins, form)
                if op.kind in ("einsum", "reduce"):
                    x = self.reduce_partial(op, x)
        plan = self.plans.get(form) if form is not None else None
        if plan is not None and op.name == plan.new_param:  # all-gather the updated shards (seed 003)
            x = self.sharders[form].gather(x, self.dims_of(op.name))
        self.store(env, op.name, x)

    def flat_replay(self, op: Any, ins: dict, form: str) -> Any:
        """An op on flattened update shards: elementwise ops bind their primitive on the
        shards (all in the parameter's order); one-input einsums without reduced dims
        (transposes, size-1 sums) are the identity there."""
        import numpy as np

        from autolayout.exec.local_ops import _same_vma

        shape = self.sharders[form].local_shape(op.output.dim_names)
        if op.kind == "einsum":
            return ins[op.inputs[0]]
        args = []
        for spec in op.replay.operands:
            if spec[0] == "literal":
                lit = np.asarray(spec[1])
                args.append(lit if lit.ndim == 0 else np.broadcast_to(lit.reshape(-1)[:1].reshape(()), shape))
            else:
                v = ins[spec[1]]
                if self.form.get(spec[1]) != form and not self.sharders[form].applies(self.dims_of(spec[1])):
                    if v.ndim:  # a tensor of fewer dims: broadcast it over the parameter first
                        v = self.sharders[form].to_shard(v, self.dims_of(spec[1]))
                args.append(v)
        return op.replay.fn(*_same_vma(args)).reshape(shape)

    # ---------------------------------------------------------------- loops
    def boundary(self, x: Any, have: tuple, src: str, dst: str, src_form: Any = "stored") -> Any:
        """Value ``x`` of ``src`` (axes named ``have``) as loop-boundary tensor ``dst``: the
        same dims up to order, or renamed dims (lowered like a rename reshape)."""
        from autolayout.trace import _identity_groups

        form = self.form.get(dst)
        x = self.convert(x, src, form, dst, have=src_form)
        if form is not None and not self.sharders[form].dim:
            return x  # flattened shards are in the parameter's order already
        want = self.dims_of(dst)
        if set(have) == set(want):
            return align(x, have, want)
        shape = tuple(self.g.dim(d) for d in have)
        groups = _identity_groups(shape, self.g.tensor(dst).shape)
        return self.regroup(x, have, form, groups, want, form, dst)

    def run_loop(self, lp: Loop, env: dict) -> None:
        import jax.numpy as jnp
        from jax import lax

        g = self.g
        skip = {c for c, _ in lp.carries} | set(lp.slices)
        init = []
        for c, _ in lp.carries:
            src = g.op(c).inputs[0]
            init.append(self.canon(self.boundary(env[src], self.dims_of(src), src, c), c))
        xs = []
        for s in lp.slices:
            src = g.op(s).inputs[0]
            x = self.convert(env[src], src, self.form.get(s), s)
            if lp.dim is not None:
                flat = self.form.get(s) and not self.sharders[self.form[s]].dim
                x = jnp.moveaxis(x, 0 if flat else self.dims_of(src).index(lp.dim), 0)
            xs.append(x)
        stacks = [g.op(s) for s in lp.stacks]

        def step(carry: tuple, sliced: tuple) -> tuple:
            local = dict(env)
            for (c, _), v in zip(lp.carries, carry):
                local[c] = v
            for s, v in zip(lp.slices, sliced):
                src = g.op(s).inputs[0]
                have = tuple(d for d in self.dims_of(src) if d != lp.dim)
                local[s] = self.canon(self.boundary(v, have, s, s, src_form=self.form.get(s)), s)
            for n in lp.body:
                if n not in skip:
                    self.run_op(g.op(n), local)
            new = tuple(self.canon(self.boundary(local[nxt], self.dims_of(nxt), nxt, c), c)
                        for c, nxt in lp.carries)
            ys = tuple(self.convert(local[s.inputs[0]], s.inputs[0], self.form.get(s.name), s.name)
                       for s in stacks)
            return new, ys

        if lp.dim is None:  # a scan of length 1: run the body once
            final, ys = step(tuple(init), tuple(xs))
            ys = tuple(y[None] for y in ys)
        else:
            final, ys = lax.scan(step, tuple(init), tuple(xs), length=lp.length, reverse=lp.reverse)
        carries = [c for c, _ in lp.carries]
        for res, carry in lp.results:
            self.store(env, res, self.boundary(final[carries.index(carry)], self.dims_of(carry), carry, res))
        for s, y in zip(stacks, ys):
            form = self.form.get(s.name)
            if lp.dim is None:
                y = y[0]
            if not (form and not self.sharders[form].dim):
                have = ((lp.dim,) if lp.dim else ()) + self.dims_of(s.inputs[0])
                y = align(y, have, self.dims_of(s.name))
            self.store(env, s.name, y)

    # ----------------------------------------------- step interface (flat WUS)
    def to_step(self, name: str) -> Any:
        """Local function: layout block of input ``name`` -> its flattened update shard."""
        return lambda x: self.sharders[self.form[name]].to_shard(x, self.dims_of(name))

    def from_step(self, name: str) -> Any:
        """Local function: flattened update shard of output ``name`` -> its layout block."""
        return lambda x: self.sharders[self.form[name]].gather(x, self.dims_of(name))
