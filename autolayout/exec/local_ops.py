"""Local (per-device) semantics of each op kind inside the shard_map program.

A mixin of :class:`autolayout.exec.lower.ShardProgram`. Nothing here decides a
collective: every collective is a step of the op's plan
(:mod:`autolayout.costmodel.plan`), executed as the plan says.

* **einsum / elementwise / reduce**: the op's positional replay (``prim.bind``
  with the traced params) on local operands (replay shapes are global; local
  ones are derived from the operand's dim names and the op's compute axes);
  elementwise update ops on flattened shards bind their primitive on the shards.
* **argmax / argmin** over a split dim: local extreme and local index, ``pmax``
  (``pmin``) of the values, then ``pmin`` of the global indices of the winners
  (first occurrence wins, as in ``jnp.argmax``): the plan's two all-reduces.
* **gather** (``take``) over a split vocabulary: Mesh-TensorFlow's masked local
  lookup (index minus this device's vocabulary offset from ``lax.axis_index``);
  **scatter-add**: local masked scatter; both leave partial sums the plan reduces.
* **constants**: ``iota`` locally offset by the device's position, ``fill``
  locally, ``value`` sliced locally.
* **regrouping** (reshape, conversions): the plan's :class:`~autolayout.costmodel.placement.Moves`:
  one ``all_to_all`` over all moved axes, then one ``all_gather`` over all
  gathered axes, then local slices, reading each axis's digit position from the
  plan.
* **reductions**: the plan's steps: ``psum_scatter`` (along a dim, or of the
  flattened padded block) then ``psum``/``pmax``/``pmin``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from autolayout.costmodel.placement import ALL_REDUCE, REDUCE_SCATTER, Conversion, Moves, Placement
from autolayout.costmodel.plan import LoweringError
from autolayout.costmodel.rules import phases
from autolayout.graph import index_out_of_range
from autolayout.schedule import align




def out_of_range(op: Any) -> tuple[str, Any]:
    """What a gather or scatter op does with an index outside its indexed dim
    (:func:`~autolayout.graph.index_out_of_range` of its ``mode`` attr): ``("clamp", None)``,
    ``("fill", value)`` (a gather's out-of-range rows: its ``fill_value``) or ``("drop", None)``
    (a scatter's out-of-range updates).

    Raises:
        LoweringError: the op has no ``mode`` attr (a graph not made by the tracer).
    """
    mode = op.attr("mode")
    if mode is None:
        raise LoweringError(f"{op.kind} op {op.name!r} has no 'mode' attr (what an out-of-range index "
                            "does); trace the step again with autolayout.trace to record it")
    effect = index_out_of_range(op.kind, mode)
    return effect, (op.attr("fill_value") if effect == "fill" else None)


def axis_name(axes: tuple[str, ...]) -> Any:
    return axes[0] if len(axes) == 1 else tuple(axes)


def vma(x: Any) -> frozenset:
    """The manual mesh axes ``x`` varies over inside a shard_map."""
    import jax

    mat = getattr(jax.typeof(x), "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(jax.typeof(x), "vma", ()))


def same_vma(args: list) -> list:
    """Operands of a directly bound primitive must vary over the same manual axes
    (``jnp`` functions insert this ``pcast`` themselves; ``prim.bind`` does not)."""
    import jax.numpy as jnp
    from jax import lax

    arrays = [a if not isinstance(a, np.ndarray) else None for a in args]
    union = frozenset().union(*(vma(a) for a in arrays if a is not None))
    if not union:
        return args
    out = []
    for a in args:
        a = jnp.asarray(a)
        missing = tuple(sorted(union - vma(a)))
        out.append(lax.pcast(a, missing, to="varying") if missing else a)
    return out


class LocalOps:
    """Per-kind local rules; needs ``g``, ``mesh`` and ``nsplit`` from the program, and
    ``hw`` (the hardware whose links decide hierarchical all-reduces; ``None``: none)."""

    hw: Any = None

    # ------------------------------------------------------------ helpers
    def mesh_order(self, axes: Any) -> tuple[str, ...]:
        axes = set(axes)
        return tuple(a for a in self.mesh.axis_names if a in axes)

    def axis_offset(self, axes: tuple[str, ...], local: int) -> Any:
        from jax import lax
        return lax.axis_index(axis_name(axes)) * local

    def slice_block(self, x: Any, pos: int, axes: tuple[str, ...]) -> Any:
        """This device's block of ``x`` along axis ``pos`` split over ``axes`` (major first)."""
        from jax import lax

        if not axes:
            return x
        size = x.shape[pos] // self.nsplit(axes)
        return lax.dynamic_slice_in_dim(x, self.axis_offset(axes, size), size, axis=pos)

    def lsize(self, dim: str, axes: Any) -> int:
        """Local size of ``dim`` when split over ``axes[dim]``."""
        return self.g.dims[dim] // self.nsplit(axes.get(dim, ()))

    def _operand(self, ins: dict, spec: tuple, axes: Any) -> Any:
        """A replay operand ``("tensor", name, names, shape)`` as a local positional array."""
        import jax.numpy as jnp

        _, name, names, _shape = spec
        y = align(ins[name], self.g.tensor(name).dim_names, names)
        lshape = tuple(self.lsize(n, axes) if n else 1 for n in names)
        return jnp.broadcast_to(y, lshape) if tuple(y.shape) != lshape else y

    # ------------------------------------------------- einsum / elementwise
    def replay(self, op: Any, ins: dict, axes: Any) -> Any:
        """The op's traced primitive on local operands; returns the local (partial) output."""
        import jax.numpy as jnp

        if op.replay is None:
            raise LoweringError(f"op {op.name!r} ({op.kind}.{op.fn}) has no replay to lower")
        args = []
        for spec in op.replay.operands:
            if spec[0] == "literal":
                args.append(self._literal(op, spec[1], axes))
            else:
                args.append(self._operand(ins, spec, axes))
        out = op.replay.fn(*same_vma(args))
        return jnp.reshape(out, tuple(self.lsize(d, axes) for d in op.output.dim_names))

    def _literal(self, op: Any, lit: Any, axes: Any) -> Any:
        """A uniform literal of the op's global positional shape, at the local shape."""
        lit = np.asarray(lit)
        if lit.ndim == 0:
            return lit
        uniform = lit.size <= 1 or all(s == 0 for s in lit.strides) or bool((lit == lit.flat[0]).all())
        if not uniform:
            raise LoweringError(f"op {op.name!r}: a non-uniform literal operand cannot be sliced locally")
        names = iter(op.output.dim_names)
        local = tuple(1 if s == 1 else self.lsize(next(names), axes) for s in lit.shape)
        # broadcast in the program (as the traced function did), not a concrete array: a
        # concrete one inside a scan body is a loop constant XLA keeps for the whole loop
        import jax.numpy as jnp
        return jnp.broadcast_to(jnp.asarray(lit.reshape(-1)[0], dtype=lit.dtype), local)

    def flat_replay(self, op: Any, ins: dict, flat: Placement) -> Any:
        """An elementwise op on flattened update shards: its primitive bound on the shards
        (operands with fewer dims were broadcast into the shard by :meth:`to_flat`)."""
        shape = flat.local_shape(self.g.dims, self.mesh)
        if op.kind != "elementwise":  # a one-input einsum without reduced dims: a transpose
            return ins[op.inputs[0]]
        args = []
        for spec in op.replay.operands:
            if spec[0] == "literal":
                lit = np.asarray(spec[1])
                args.append(lit if lit.ndim == 0 else np.broadcast_to(lit.reshape(-1)[:1].reshape(()), shape))
            else:
                args.append(ins[spec[1]])
        return op.replay.fn(*same_vma(args)).reshape(shape)

    def arg_reduce(self, op: Any, ins: dict, axes: Any) -> Any:
        """argmax/argmin: local winner, then pmax/pmin of values and pmin of global indices."""
        import jax.numpy as jnp
        from jax import lax

        (name,) = op.inputs
        x, dims = ins[name], self.g.tensor(name).dim_names
        red = [d.name for d in op.reduced_dims]
        if len(red) != 1:
            raise LoweringError(f"op {op.name!r}: {op.fn} over {red}; expected one reduced dim")
        pos = dims.index(red[0])
        is_max = op.fn == "argmax"
        dtype = np.dtype(op.output.dtype)
        idx = (jnp.argmax if is_max else jnp.argmin)(x, axis=pos).astype(dtype)
        split = axes.get(red[0], ())
        if split:
            val = (jnp.max if is_max else jnp.min)(x, axis=pos)
            best = (lax.pmax if is_max else lax.pmin)(val, axis_name(self.mesh_order(split)))
            cand = jnp.where(val == best, idx + self.axis_offset(split, x.shape[pos]).astype(dtype),
                             np.iinfo(dtype).max)
            idx = lax.pmin(cand, axis_name(self.mesh_order(split)))
        kept = [d for d in dims if d != red[0]]
        return align(idx, kept, op.output.dim_names)

    # ------------------------------------------------------ gather/scatter
    def _local_index(self, idx: Any, op: Any, vdim: str, split: tuple[str, ...]) -> tuple[Any, Any, Any, int]:
        """Indices into this device's block of ``vdim`` (split over ``split``), whether each
        is in the block, whether each global index is out of range (``None`` where the op
        clamps it, see :func:`out_of_range`), and the block size. A clamped index is
        clamped globally, into ``[0, n)``, before it is localised: the one device holding
        row ``n - 1`` (or ``0``) reads it, as jax's unsharded op does."""
        import jax.numpy as jnp

        n = self.g.dims[vdim]
        nl = n // self.nsplit(split)
        outside = None
        if out_of_range(op)[0] == "clamp":
            idx = jnp.clip(idx, 0, n - 1)
        else:
            outside = (idx < 0) | (idx >= n)
        local = idx - self.axis_offset(split, nl).astype(idx.dtype) if split else idx
        return local, (local >= 0) & (local < nl), outside, nl

    def _read_operand(self, ins: dict, spec: tuple, p: Any) -> tuple[Any, list[str]]:
        """A replay operand aligned to its own non-size-1 names at the local shape of the
        placement the plan reads it in (broadcast locally)."""
        import jax.numpy as jnp

        _, name, names, _shape = spec
        want = [n for n in names if n]
        y = align(ins[name], self.g.tensor(name).dim_names, want)
        read = p.reads[name]
        lshape = tuple(self.g.dims[n] // self.nsplit(read.axes_of(n)) for n in want)
        return (jnp.broadcast_to(y, lshape) if tuple(y.shape) != lshape else y), want

    @staticmethod
    def _batched(fn: Any, n: int) -> Any:
        """``fn`` mapped over ``n`` leading axes shared by all its arguments (batching dims)."""
        import jax

        for _ in range(n):
            fn = jax.vmap(fn)
        return fn

    def gather(self, op: Any, ins: dict, p: Any) -> Any:
        """Masked local lookup along the indexed dim, mapped over the batching dims; the
        partial sums over a split indexed dim are the plan's to reduce (a table whose
        indexed dim the output also has was read unsplit there, as the plan says)."""
        import jax.numpy as jnp

        vdim, batch = op.attr("indexed"), list(op.attr("batch", ()))
        t_spec, i_spec = op.replay.operands
        table, tnames = self._read_operand(ins, t_spec, p)
        idx, inames = self._read_operand(ins, i_spec, p)
        rest = [d for d in tnames if d != vdim and d not in batch]
        free = [d for d in inames if d not in batch]
        table = align(table, tnames, batch + [vdim] + rest)
        idx = align(idx, inames, batch + free)
        split = p.reads[op.inputs[0]].axes_of(vdim)
        local, valid, outside, _ = self._local_index(idx, op, vdim, split)
        out = self._batched(lambda t, i: jnp.take(t, i, axis=0, mode="clip"), len(batch))(
            table, jnp.where(valid, local, 0))
        out_dims = batch + free + rest
        out = jnp.where(align(valid, batch + free, out_dims), out, jnp.zeros((), out.dtype))
        if outside is not None:  # fill: on one device where the vocabulary is split (partial sums)
            fill = jnp.asarray(out_of_range(op)[1], out.dtype)
            if split:
                fill = jnp.where(self.axis_offset(split, 1) == 0, fill, jnp.zeros((), out.dtype))
            out = jnp.where(align(outside, batch + free, out_dims), fill, out)
        return align(out, out_dims, op.output.dim_names)

    def scatter(self, op: Any, ins: dict, p: Any) -> Any:
        """Masked local scatter-add of the updates, mapped over the batching dims (partial
        sums over the index's other dims are the plan's to reduce)."""
        import jax.numpy as jnp

        vdim, batch = op.attr("indexed"), list(op.attr("batch", ()))
        _, i_spec, u_spec = op.replay.operands
        out_dims = op.output.dim_names
        idx, inames = self._read_operand(ins, i_spec, p)
        upd, unames = self._read_operand(ins, u_spec, p)
        free = [d for d in inames if d not in batch]
        rest = [d for d in out_dims if d != vdim and d not in batch]
        lsize = {d: self.g.dims[d] // self.nsplit(p.axes.get(d, ())) for d in out_dims}
        lsize.update((d, n) for d, n in zip(inames, idx.shape))
        upd = jnp.broadcast_to(align(upd, unames, batch + free + rest),
                               tuple(lsize[d] for d in batch + free + rest))
        idx = align(idx, inames, batch + free)
        local, valid, _, nl = self._local_index(idx, op, vdim, p.axes.get(vdim, ()))
        local = jnp.where(valid, local, nl)  # outside this block (or dropped): index nl, dropped
        z = jnp.zeros((*(lsize[d] for d in batch), nl, *(lsize[d] for d in rest)), np.dtype(op.output.dtype))
        z = self._batched(lambda z, i, u: z.at[i].add(u.astype(z.dtype), mode="drop"), len(batch))(z, local, upd)
        return align(z, (*batch, vdim, *rest), out_dims)

    # ---------------------------------------------------------- constants
    def constant(self, op: Any, axes: Any) -> Any:
        import jax
        import jax.numpy as jnp
        from jax import lax

        dims = op.output.dim_names
        shape = tuple(self.lsize(d, axes) for d in dims)
        dtype = np.dtype(op.output.dtype)
        if op.fn == "iota":
            eqns = jax.make_jaxpr(op.replay.fn)().jaxpr.eqns
            if len(eqns) == 1 and eqns[0].primitive.name == "iota":
                p = eqns[0].params
                names = iter(dims)
                pos_names = [None if s == 1 else next(names) for s in p["shape"]]
                local = tuple(1 if n is None else self.lsize(n, axes) for n in pos_names)
                x = lax.broadcasted_iota(p["dtype"], local, p["dimension"])
                d = pos_names[p["dimension"]]
                if d is not None and axes.get(d):
                    x = x + self.axis_offset(axes[d], local[p["dimension"]]).astype(x.dtype)
                return jnp.reshape(x, shape)
        value = np.asarray(op.replay.fn())
        if op.fn == "fill" and (value.size <= 1 or all(s == 0 for s in value.strides)):
            return jnp.full(shape, value.reshape(-1)[0] if value.size else 0, dtype)
        x = jnp.asarray(value.reshape(tuple(self.g.dims[d] for d in dims)), dtype)
        for pos, d in enumerate(dims):
            x = self.slice_block(x, pos, axes.get(d, ()))
        return x

    # ------------------------------------------------------- reductions
    def reduce_steps(self, x: Any, dims: tuple, steps: tuple, computed: Placement, stored: Placement) -> Any:
        """Apply the plan's reduction steps to a local partial result ``x`` (axes ``dims``)."""
        from jax import lax

        for s in steps:
            if s.kind == REDUCE_SCATTER:
                if stored.flat:
                    x = self.flatten_pad(x, dims, stored)
                    x = lax.psum_scatter(x, axis_name(stored.flat), scatter_dimension=x.ndim - 1, tiled=True)
                else:  # the new axes of the dim, in the stored placement's major-to-minor order
                    extra = tuple(a for a in stored.axes_of(s.dim) if a in s.axes)
                    x = lax.psum_scatter(x, axis_name(extra), scatter_dimension=dims.index(s.dim), tiled=True)
            elif s.kind == ALL_REDUCE:
                name = axis_name(s.axes)
                parts = phases(s, self.mesh, self.hw, np.dtype(x.dtype).itemsize) if self.hw else (s,)
                if len(parts) > 1:
                    x = self.hierarchical_psum(x, parts)
                elif s.reduce == "sum":
                    x = lax.psum(x, name)
                elif s.reduce in ("max", "min"):
                    x = (lax.pmax if s.reduce == "max" else lax.pmin)(x, name)
                elif s.reduce in ("and", "or"):
                    y = x.astype(np.uint8)
                    x = (lax.pmin if s.reduce == "and" else lax.pmax)(y, name).astype(x.dtype)
                else:
                    raise LoweringError(f"internal: no all-reduce for reduction {s.reduce!r}")
            else:
                raise LoweringError(f"internal: {s.kind} is not a reduction step")
        return x

    def hierarchical_psum(self, x: Any, parts: tuple) -> Any:
        """``psum`` as :func:`~autolayout.costmodel.rules.phases` runs it: the flattened,
        padded tensor reduce-scattered over the fast axes, all-reduced over the slow ones,
        all-gathered back over the fast axes; the padding cut."""
        import jax.numpy as jnp
        from jax import lax

        rs, ar, ag = parts
        shape, n = x.shape, int(np.prod(x.shape))
        flat = x.reshape(-1)
        pad = -n % rs.group_size
        if pad:
            flat = jnp.concatenate([flat, jnp.zeros((pad,), flat.dtype)])
        flat = lax.psum_scatter(flat, axis_name(rs.axes), scatter_dimension=0, tiled=True)
        flat = lax.psum(flat, axis_name(ar.axes))
        flat = lax.all_gather(flat, axis_name(ag.axes), axis=0, tiled=True, to="invarying")
        return flat[:n].reshape(shape)

    # --------------------------------------------------- flattened shards
    def flatten_pad(self, x: Any, dims: tuple, p: Placement) -> Any:
        """A full local block (axes ``dims``, missing ones broadcast) -> ``(kept..., chunk * F)``:
        aligned to ``p.dims`` (the flattening order), flattened and padded (seed 003 §4)."""
        import jax.numpy as jnp

        sizes, mesh = self.g.dims, self.mesh
        base = p.base()
        want = tuple(base.local_size(d, sizes[d], mesh) for d in p.dims)
        x = jnp.broadcast_to(align(x, dims, p.dims), want)
        k = len(p.kept)
        n = p.flat_elements(sizes, mesh)
        x = jnp.reshape(x, (*x.shape[:k], n))
        pad = p.chunk(sizes, mesh) * self.nsplit(p.flat) - n
        return jnp.pad(x, [(0, 0)] * k + [(0, pad)]) if pad else x

    def to_flat(self, x: Any, dims: tuple, p: Placement) -> Any:
        """A full local block -> this device's flattened shard (a local slice)."""
        x = self.flatten_pad(x, dims, p)
        return self.slice_block(x, x.ndim - 1, p.flat)

    def from_flat(self, x: Any, p: Placement, dims: tuple) -> Any:
        """This device's flattened shard -> the full local block with axes ``dims``
        (``all_gather`` over ``p.flat``, padding cut)."""
        import jax.numpy as jnp
        from jax import lax

        sizes, mesh = self.g.dims, self.mesh
        x = lax.all_gather(x, axis_name(p.flat), axis=x.ndim - 1, tiled=True, to="invarying")
        base = p.base()
        k = len(p.kept)
        x = jnp.reshape(x[..., : p.flat_elements(sizes, mesh)],
                        (*x.shape[:k], *(base.local_size(d, sizes[d], mesh) for d in p.dims[k:])))
        return align(x, p.dims, dims)

    # ------------------------------------------------------------ conversions
    def convert(self, x: Any, conv: Conversion, dims: tuple, name: str) -> Any:
        """Execute a planned conversion of tensor ``name`` (axes ``dims`` when not flattened)."""
        if conv.unflatten:
            x = self.from_flat(x, conv.src, dims)
        if conv.moves is not None:
            x = self.regroup(x, dims, conv.moves, dims, name)
        if conv.flatten:
            x = self.to_flat(x, dims, conv.dst)
        return x

    # ------------------------------------------------------------ regrouping
    def regroup(self, x: Any, in_dims: tuple, mv: Moves, out_dims: tuple, name: str) -> Any:
        """Move local block ``x`` (axes ``in_dims``) to the placement of ``out_dims`` as the
        plan's :class:`Moves` say (see the module doc)."""
        import jax.numpy as jnp
        from jax import lax

        def size(key: tuple) -> int:
            return key[1] // key[2]

        cur: list[tuple] = []
        for d in in_dims:
            cur.extend(mv.fines(mv.local_in[d]))
        x = jnp.reshape(x, tuple(size(k) for k in cur))

        def bring(keys: list[tuple], x: Any) -> Any:
            """Transpose ``keys`` (in order) to the end of the local array."""
            rest = [k for k in cur if k not in keys]
            perm = [cur.index(k) for k in rest + keys]
            cur[:] = rest + keys
            return jnp.transpose(x, perm) if perm != list(range(len(perm))) else x

        if mv.all_to_all:
            targets = [k for a in mv.all_to_all for k in mv.fines(mv.pos_out[a])]
            x = bring(targets, x)
            n = self.nsplit(mv.all_to_all)
            x = jnp.reshape(x, (1, *x.shape[: len(cur) - len(targets)], n))
            x = lax.all_to_all(x, axis_name(mv.all_to_all), x.ndim - 1, 0, tiled=True)
            cur[:] = [k for k in cur if k not in targets]
            srcs = [k for a in mv.all_to_all for k in mv.fines(mv.pos_in[a])]
            x = jnp.reshape(x, tuple(size(k) for k in srcs + cur))
            cur[:] = srcs + cur
        if mv.all_gather:
            x = lax.all_gather(x, axis_name(mv.all_gather), axis=0, tiled=False, to="invarying")
            srcs = [k for a in mv.all_gather for k in mv.fines(mv.pos_in[a])]
            x = jnp.reshape(x, tuple(size(k) for k in srcs + cur))
            cur[:] = srcs + cur
        for a in mv.slices:
            keys = mv.fines(mv.pos_out[a])
            if not all(k in cur for k in keys):
                raise LoweringError(f"internal: regrouping {name!r} cannot slice axis {a!r}")
            x = bring(keys, x)
            x = jnp.reshape(x, (*x.shape[: len(cur) - len(keys)], math.prod(size(k) for k in keys)))
            x = self.slice_block(x, x.ndim - 1, (a,))[..., 0]
            cur[:] = cur[: len(cur) - len(keys)]
        kept = [d for d in out_dims if d not in mv.new_dims]
        order = [k for d in kept for k in mv.fines(mv.local_out[d])]
        if sorted(order) != sorted(cur):
            raise LoweringError(f"internal: regrouping {name!r} left digits {cur}, expected {order}")
        x = bring(order, x)
        x = jnp.reshape(x, tuple(size(mv.local_out[d]) for d in kept))
        if mv.new_dims:
            x = align(x, kept, out_dims)
            x = jnp.broadcast_to(x, tuple(mv.new_dims[d] if d in mv.new_dims else x.shape[i]
                                          for i, d in enumerate(out_dims)))
        return x
