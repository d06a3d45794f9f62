"""Local (per-device) semantics of each op kind inside the shard_map program.

A mixin of :class:`autolayout.exec.lower.ShardProgram`; every method works on
local blocks and emits exactly the collectives of the cost model's rules
(:mod:`autolayout.costmodel.rules`):

* **einsum / elementwise / reduce**: the op's positional replay (``prim.bind``
  with the traced params) on local operands (replay shapes are global; local
  ones are derived from the operand's dim names), then for einsum ``psum`` and
  for reduce ``pmax``/``pmin`` over the mesh axes of the reduced split dims.
* **argmax / argmin** over a split dim: local extreme and local index, ``pmax``
  (``pmin``) of the values, then ``pmin`` of the global indices of the winners
  (first occurrence wins, as in ``jnp.argmax``): two all-reduces.
* **gather** (``take``) over a split vocabulary: Mesh-TensorFlow's masked local
  lookup (index minus this device's vocabulary offset from ``lax.axis_index``)
  and ``psum``; **scatter-add**: local masked scatter, ``psum`` over reduced axes.
* **constants**: ``iota`` locally offset by the device's position, ``fill``
  locally, ``value`` sliced locally.
* **reshape** (rename, split, merge): per mesh axis, compare where the axis sits
  in the row-major digits of each split/merge group before and after (the
  cumulative products of Mesh-TensorFlow): same place = local reshape; only
  before = all-gather; only after = local slice; moved = all-to-all. One
  ``all_to_all`` over all moved axes, then one ``all_gather`` over all gathered
  axes, then local slices — so each kind is one collective, as predicted. An
  axis whose new place is still held by another axis (multi-axis splits) cannot
  move by one all-to-all: it is gathered and sliced (noted in ``notes``).
* **weight-update sharding** (:class:`~autolayout.exec.lower.Sharder`): the
  gradient's all-reduce becomes ``psum_scatter`` over the update axes (along the
  plan's ``scatter_dim``, or of the flattened, padded block) + ``psum`` over the
  rest; the update runs on the shard; the new parameter is ``all_gather``-ed.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from autolayout.graph import align


class LoweringError(ValueError):
    """An op or layout the shard_map lowering cannot express (the message says which)."""


def _axis_name(axes: tuple[str, ...]) -> Any:
    return axes[0] if len(axes) == 1 else tuple(axes)


def _vma(x: Any) -> frozenset:
    import jax

    mat = getattr(jax.typeof(x), "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(jax.typeof(x), "vma", ()))


def _same_vma(args: list) -> list:
    """Operands of a directly bound primitive must vary over the same manual axes
    (``jnp`` functions insert this ``pcast`` themselves; ``prim.bind`` does not)."""
    import jax.numpy as jnp
    from jax import lax

    arrays = [a if not isinstance(a, np.ndarray) else None for a in args]
    union = frozenset().union(*(_vma(a) for a in arrays if a is not None))
    if not union:
        return args
    out = []
    for a in args:
        a = jnp.asarray(a)
        missing = tuple(sorted(union - _vma(a)))
        out.append(lax.pcast(a, missing, to="varying") if missing else a)
    return out


class LocalOps:
    """Per-kind local rules; needs ``g``, ``mesh``, ``plans``, ``rs_ops``, ``form``,
    ``dims_of``, ``dim_axes``, ``lsize``, ``nsplit``, ``notes`` from the program."""

    # ------------------------------------------------------------ helpers
    def mesh_order(self, axes: Any) -> tuple[str, ...]:
        axes = set(axes)
        return tuple(a for a in self.mesh.axis_names if a in axes)

    def axis_offset(self, axes: tuple[str, ...], local: int) -> Any:
        from jax import lax
        return lax.axis_index(_axis_name(axes)) * local

    def slice_block(self, x: Any, pos: int, axes: tuple[str, ...]) -> Any:
        """This device's block of ``x`` along axis ``pos`` split over ``axes`` (major first)."""
        from jax import lax

        if not axes:
            return x
        size = x.shape[pos] // self.nsplit(axes)
        return lax.dynamic_slice_in_dim(x, self.axis_offset(axes, size), size, axis=pos)

    def op_shape(self, op: Any, form: str | None) -> tuple[int, ...]:
        return tuple(self.lsize(d, form) for d in op.output.dim_names)

    def _operand(self, ins: dict, spec: tuple, form: str | None) -> Any:
        """A replay operand ``("tensor", name, names, shape)`` as a local positional array."""
        import jax.numpy as jnp

        _, name, names, _shape = spec
        y = align(ins[name], self.dims_of(name), names)
        lshape = tuple(self.lsize(n, form) if n else 1 for n in names)
        return jnp.broadcast_to(y, lshape) if tuple(y.shape) != lshape else y

    def _named_operand(self, ins: dict, spec: tuple, form: str | None) -> tuple[Any, list[str]]:
        """A replay operand aligned to its own non-size-1 names (broadcast locally)."""
        import jax.numpy as jnp

        _, name, names, _shape = spec
        want = [n for n in names if n]
        y = align(ins[name], self.dims_of(name), want)
        lshape = tuple(self.lsize(n, form) for n in want)
        return (jnp.broadcast_to(y, lshape) if tuple(y.shape) != lshape else y), want

    # ------------------------------------------------- einsum / elementwise
    def replay(self, op: Any, ins: dict, form: str | None) -> Any:
        """The op's traced primitive on local operands; returns the local (partial) output."""
        import jax.numpy as jnp

        if op.replay is None:
            raise LoweringError(f"op {op.name!r} ({op.kind}.{op.fn}) has no replay to lower")
        args = []
        for spec in op.replay.operands:
            if spec[0] == "literal":
                args.append(self._literal(op, spec[1], form))
            else:
                args.append(self._operand(ins, spec, form))
        out = op.replay.fn(*_same_vma(args))
        return jnp.reshape(out, self.op_shape(op, form))

    def _literal(self, op: Any, lit: Any, form: str | None) -> Any:
        """A uniform literal of the op's global positional shape, at the local shape."""
        lit = np.asarray(lit)
        if lit.ndim == 0:
            return lit
        uniform = lit.size <= 1 or all(s == 0 for s in lit.strides) or bool((lit == lit.flat[0]).all())
        if not uniform:
            raise LoweringError(f"op {op.name!r}: a non-uniform literal operand cannot be sliced locally")
        names = iter(op.output.dim_names)
        local = tuple(1 if s == 1 else self.lsize(next(names), form) for s in lit.shape)
        return np.broadcast_to(lit.reshape(-1)[:1].reshape(()), local)

    def reduced_axes(self, op: Any) -> tuple[str, ...]:
        """Mesh axes of the op's reduced split dims (the all-reduce group of predict)."""
        return self.mesh_order(a for d in op.reduced_dims for a in self.axes_of.get(d.name, ()))

    def reduce_partial(self, op: Any, x: Any) -> Any:
        """Combine partial results over the reduced split axes (or reduce-scatter them)."""
        from jax import lax

        axes = self.reduced_axes(op)
        if not axes:
            return x
        if op.name in self.rs_ops:
            sh = self.sharders[self.rs_ops[op.name]]
            rest = tuple(a for a in axes if a not in sh.axes)
            return sh.reduce_scatter(x, op.output.dim_names, rest)
        if op.kind in ("einsum", "gather", "scatter"):
            return lax.psum(x, _axis_name(axes))
        fn = op.fn
        if fn in ("max", "min"):
            return (lax.pmax if fn == "max" else lax.pmin)(x, _axis_name(axes))
        if fn in ("and", "or"):
            import jax.numpy as jnp
            y = x.astype(jnp.uint8)
            y = (lax.pmin if fn == "and" else lax.pmax)(y, _axis_name(axes))
            return y.astype(x.dtype)
        raise LoweringError(
            f"op {op.name!r}: reduce_{fn} over a dim split across mesh axes {list(axes)} has no "
            f"single-collective lowering (only sum, max, min, and, or, argmax, argmin do); leave "
            f"{[d.name for d in op.reduced_dims]} unsplit")

    def arg_reduce(self, op: Any, ins: dict, form: str | None) -> Any:
        """argmax/argmin: local winner, then pmax/pmin of values and pmin of global indices."""
        import jax.numpy as jnp
        from jax import lax

        (name,) = op.inputs
        x, dims = ins[name], self.dims_of(name)
        red = [d.name for d in op.reduced_dims]
        if len(red) != 1:
            raise LoweringError(f"op {op.name!r}: {op.fn} over {red}; expected one reduced dim")
        pos = dims.index(red[0])
        is_max = op.fn == "argmax"
        dtype = np.dtype(op.output.dtype)
        idx = (jnp.argmax if is_max else jnp.argmin)(x, axis=pos).astype(dtype)
        axes = self.dim_axes(red[0], form)
        if axes:
            val = (jnp.max if is_max else jnp.min)(x, axis=pos)
            best = (lax.pmax if is_max else lax.pmin)(val, _axis_name(self.mesh_order(axes)))
            cand = jnp.where(val == best, idx + self.axis_offset(axes, x.shape[pos]).astype(dtype),
                             np.iinfo(dtype).max)
            idx = lax.pmin(cand, _axis_name(self.mesh_order(axes)))
        kept = [d for d in dims if d != red[0]]
        return align(idx, kept, op.output.dim_names)

    # ------------------------------------------------------ gather/scatter
    def _local_index(self, idx: Any, vdim: str, form: str | None) -> tuple[Any, Any, int]:
        """Indices into this device's vocabulary block, a validity mask, and the block size."""
        import jax.numpy as jnp

        nl = self.lsize(vdim, form)
        axes = self.dim_axes(vdim, form)
        if not axes:
            return idx, None, nl
        local = idx - self.axis_offset(axes, nl).astype(idx.dtype)
        valid = (local >= 0) & (local < nl)
        return local, valid, nl

    def gather(self, op: Any, ins: dict, form: str | None) -> Any:
        import jax.numpy as jnp

        vdim = op.attr("indexed")
        t_spec, i_spec = op.replay.operands
        table, tnames = self._named_operand(ins, t_spec, form)
        idx, inames = self._named_operand(ins, i_spec, form)
        vpos = tnames.index(vdim)
        local, valid, _ = self._local_index(idx, vdim, form)
        if valid is not None:
            local = jnp.where(valid, local, 0)
        out = jnp.take(table, local, axis=vpos, mode="clip")
        out_dims = tnames[:vpos] + inames + tnames[vpos + 1:]
        if valid is not None:
            out = jnp.where(align(valid, inames, out_dims), out, jnp.zeros((), out.dtype))
        out = align(out, out_dims, op.output.dim_names)
        return self.reduce_partial(op, out)

    def scatter(self, op: Any, ins: dict, form: str | None) -> Any:
        import jax.numpy as jnp

        vdim = op.attr("indexed")
        o_spec, i_spec, u_spec = op.replay.operands
        out_dims = op.output.dim_names
        idx, inames = self._named_operand(ins, i_spec, form)
        upd, unames = self._named_operand(ins, u_spec, form)
        rest = [d for d in out_dims if d != vdim]
        upd = jnp.broadcast_to(align(upd, unames, inames + rest),
                               tuple(self.lsize(d, form) for d in inames + rest))
        local, valid, nl = self._local_index(idx, vdim, form)
        if valid is not None:
            local = jnp.where(valid, local, nl)  # out of bounds: dropped
        z = jnp.zeros((nl, *(self.lsize(d, form) for d in rest)), np.dtype(op.output.dtype))
        z = z.at[local].add(upd.astype(z.dtype), mode="drop")
        x = self.reduce_partial(op, align(z, (vdim, *rest), out_dims))
        base, bnames = self._named_operand(ins, o_spec, form)
        base = align(base, bnames, out_dims)
        if op.name in self.rs_ops:
            base = self.sharders[self.rs_ops[op.name]].to_shard(base, out_dims)
        return base + x

    # ---------------------------------------------------------- constants
    def constant(self, op: Any, form: str | None) -> Any:
        import jax
        import jax.numpy as jnp
        from jax import lax

        shape = self.op_shape(op, form)
        dims = op.output.dim_names
        dtype = np.dtype(op.output.dtype)
        if op.fn == "iota":
            eqns = jax.make_jaxpr(op.replay.fn)().jaxpr.eqns
            if len(eqns) == 1 and eqns[0].primitive.name == "iota":
                p = eqns[0].params
                names = iter(dims)
                pos_names = [None if s == 1 else next(names) for s in p["shape"]]
                local = tuple(1 if n is None else self.lsize(n, form) for n in pos_names)
                x = lax.broadcasted_iota(p["dtype"], local, p["dimension"])
                d = pos_names[p["dimension"]]
                if d is not None and self.dim_axes(d, form):
                    x = x + self.axis_offset(self.dim_axes(d, form), local[p["dimension"]]).astype(x.dtype)
                return jnp.reshape(x, shape)
        value = np.asarray(op.replay.fn())
        if op.fn == "fill" and (value.size <= 1 or all(s == 0 for s in value.strides)):
            return jnp.full(shape, value.reshape(-1)[0] if value.size else 0, dtype)
        x = jnp.asarray(value.reshape(tuple(self.g.dims[d] for d in dims)), dtype)
        for pos, d in enumerate(dims):
            x = self.slice_block(x, pos, self.dim_axes(d, form))
        return x

    # ------------------------------------------------------------ reshape
    def reshape(self, op: Any, x: Any, form: str | None) -> Any:
        groups = op.attr("groups")
        if groups is None:
            raise LoweringError(f"reshape {op.name!r} has no 'groups' attr")
        return self.regroup(x, self.dims_of(op.inputs[0]), form, groups, op.output.dim_names,
                            self.form.get(op.name), op.name)

    def _digits(self, dims: tuple, form: str | None) -> list[tuple]:
        """Row-major digits of a group: ``(kind, key, size, hi, lo)``, major first, where the
        digit spans positions ``[lo, hi)`` of the group's cumulative products."""
        out, hi = [], math.prod(self.g.dims[d] for d in dims)
        for d in dims:
            for a in self.dim_axes(d, form):
                n = self.mesh.axis_size(a)
                out.append(("mesh", a, n, hi, hi // n))
                hi //= n
            n = self.lsize(d, form)
            out.append(("local", d, n, hi, hi // n))
            hi //= n
        return out

    def regroup(self, x: Any, in_dims: tuple, in_form: str | None, groups: tuple, out_dims: tuple,
                out_form: str | None, name: str) -> Any:
        """Move local block ``x`` (axes ``in_dims``) to the layout of ``out_dims`` (see module doc)."""
        import jax.numpy as jnp
        from jax import lax

        pos_in: dict[str, tuple] = {}
        pos_out: dict[str, tuple] = {}
        local_in: dict[str, tuple] = {}
        local_out: dict[str, tuple] = {}
        bounds: dict[int, set] = {}
        new_dims = []
        for gi, (gin, gout) in enumerate(groups):
            if not gin:
                new_dims.extend(gout)  # a broadcast dim: created locally at the end
                continue
            if not gout:
                raise LoweringError(f"reshape {name!r} drops dims {gin}; only loop slices may")
            b = bounds.setdefault(gi, set())
            for digits, pos, loc in ((self._digits(gin, in_form), pos_in, local_in),
                                     (self._digits(gout, out_form), pos_out, local_out)):
                for kind, key, _n, hi, lo in digits:
                    b.update((hi, lo))
                    (pos if kind == "mesh" else loc)[key] = (gi, hi, lo)
        fine = {gi: sorted(b, reverse=True) for gi, b in bounds.items()}

        def fines(rng: tuple) -> list[tuple]:
            gi, hi, lo = rng
            bs = [v for v in fine[gi] if lo <= v <= hi]
            return [(gi, bs[k], bs[k + 1]) for k in range(len(bs) - 1)]

        def size(key: tuple) -> int:
            return key[1] // key[2]

        cur: list[tuple] = []
        for d in in_dims:
            cur.extend(fines(local_in[d]))
        x = jnp.reshape(x, tuple(size(k) for k in cur))

        free = {a for a in pos_in if pos_out.get(a) == pos_in[a]}
        gather = [a for a in pos_in if a not in pos_out]
        slices = [a for a in pos_out if a not in pos_in]
        moved = [a for a in pos_in if a in pos_out and a not in free]
        a2a = []
        for a in self.mesh_order(moved):
            target = fines(pos_out[a])
            if all(k in cur for k in target):
                a2a.append(a)
            else:  # its target place is held by another mesh axis: gather, then slice
                gather.append(a)
                slices.append(a)
                self.notes.append(f"reshape {name!r}: mesh axis {a!r} moves onto a place another axis "
                                  "holds; lowered as all-gather + local slice, not all-to-all")

        def bring(keys: list[tuple], x: Any) -> Any:
            """Transpose ``keys`` (in order) to the end of the local array."""
            rest = [k for k in cur if k not in keys]
            perm = [cur.index(k) for k in rest + keys]
            cur[:] = rest + keys
            return jnp.transpose(x, perm) if perm != list(range(len(perm))) else x

        if a2a:
            targets = [k for a in a2a for k in fines(pos_out[a])]
            x = bring(targets, x)
            n = self.nsplit(tuple(a2a))
            x = jnp.reshape(x, (1, *x.shape[: len(cur) - len(targets)], n))
            x = lax.all_to_all(x, _axis_name(tuple(a2a)), x.ndim - 1, 0, tiled=True)
            cur[:] = [k for k in cur if k not in targets]
            srcs = [k for a in a2a for k in fines(pos_in[a])]
            x = jnp.reshape(x, tuple(size(k) for k in srcs + cur))
            cur[:] = srcs + cur
        gather = list(self.mesh_order(gather))
        if gather:
            x = lax.all_gather(x, _axis_name(tuple(gather)), axis=0, tiled=False, to="invarying")
            srcs = [k for a in gather for k in fines(pos_in[a])]
            x = jnp.reshape(x, tuple(size(k) for k in srcs + cur))
            cur[:] = srcs + cur
        for a in self.mesh_order(slices):
            if a not in pos_in or a in gather:
                keys = fines(pos_out[a])
                if not all(k in cur for k in keys):
                    raise LoweringError(f"internal: reshape {name!r} cannot slice axis {a!r}")
                x = bring(keys, x)
                x = jnp.reshape(x, (*x.shape[: len(cur) - len(keys)], math.prod(size(k) for k in keys)))
                x = self.slice_block(x, x.ndim - 1, (a,))[..., 0]
                cur[:] = cur[: len(cur) - len(keys)]
        order = [k for d in out_dims if d not in new_dims for k in fines(local_out[d])]
        if sorted(order) != sorted(cur):
            raise LoweringError(f"internal: reshape {name!r} left digits {cur}, expected {order}")
        x = bring(order, x)
        kept = [d for d in out_dims if d not in new_dims]
        x = jnp.reshape(x, tuple(self.lsize(d, out_form) for d in kept))
        if new_dims:
            x = align(x, kept, out_dims)
            x = jnp.broadcast_to(x, tuple(self.lsize(d, out_form) for d in out_dims))
        return x
