"""Pass 1 of the tracer: one rule per JAX primitive (see :mod:`autolayout.trace`)."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from autolayout._along import ALONG, _AlongRules
from autolayout._unsupported import Unsupported, unsupported
from autolayout._unify import TraceError, _binder, _Pending, _reshape_groups, _shapes, _Val
from autolayout.graph import index_out_of_range

ELEMENTWISE = frozenset("""
abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type
cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma
digamma log log1p logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem
round rsqrt select_n sign sin sinh sqrt square sub tan tanh xor
shift_left shift_right_logical shift_right_arithmetic population_count clz
""".split())
ALIASES = frozenset(["stop_gradient", "copy", "copy_p", "name", "optimization_barrier"])
REDUCE = {"reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod", "reduce_and": "and",
          "reduce_or": "or", "argmax": "argmax", "argmin": "argmin"}
CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
         "custom_vjp_call_jaxpr": "fun_jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr",
         "remat": "jaxpr"}
REMAT_CALLS = frozenset(["remat2", "checkpoint", "remat"])  # jax.checkpoint's primitive names
_NAN = float("nan")  # the one NaN a gather's fill_value attr holds, so that equal ops' attrs compare equal


class _Tracer(_AlongRules):
    """Interprets a jaxpr equation by equation into pending named ops."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[tuple] = []  # (whole slot, start, stop, piece slot): see relate_piece
        self.regroups: list[tuple] = []  # (merged slots, their merge's slot): see regroup

    def run(self, jaxpr: Any, consts: Sequence[Any], in_vals: Sequence[_Val], ctx: tuple) -> list:
        env: dict[Any, _Val] = {}
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = self.constant(c, ctx)
        for var, v in zip(jaxpr.invars, in_vals):
            env[var] = v
        outer, self.used = self.used, _used_vars(jaxpr)
        try:
            return self._run(jaxpr, env, ctx)
        finally:
            self.used = outer

    def _run(self, jaxpr: Any, env: dict, ctx: tuple) -> list:
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
        """Interpret one equation; an unsupported one is recorded (:attr:`problems`) and
        stands in as fresh values, so that one trace reports every unsupported construct."""
        try:
            return self.rule(eqn, ins, ctx)
        except Unsupported as e:
            self.problems.append(e.item)
        except TraceError:
            if not self.problems:  # a real error; after an unsupported one, maybe its echo
                raise
        return [self.new_val(v.aval.shape, plain_dtype(v.aval.dtype), ctx=ctx) for v in eqn.outvars]

    def rule(self, eqn: Any, ins: list[_Val], ctx: tuple) -> list[_Val]:
        prim = eqn.primitive.name
        params = dict(eqn.params)
        if any(plain_dtype(v.aval.dtype) is not v.aval.dtype for v in eqn.outvars) and prim not in CALLS:
            raise self.unsupported(eqn)  # typed PRNG keys made or split inside the step
        if prim in CALLS:
            sub = params[CALLS[prim]]
            if prim in REMAT_CALLS and ctx[0] is not None:
                next(i for i in self.loops if i["name"] == ctx[0])["recomputes"] = True
            self.sites.append(self.source(eqn))
            try:
                if hasattr(sub, "jaxpr"):
                    return self.run(sub.jaxpr, sub.consts, ins, ctx)
                return self.run(sub, (), ins, ctx)
            finally:
                self.sites.pop()
        if prim == "scan":
            return self.scan(eqn, ins, ctx)
        if prim in ALONG:
            return self.along_eqn(eqn, ins, ctx)
        if len(eqn.outvars) != 1:
            raise self.unsupported(eqn)
        aval = eqn.outvars[0].aval
        if prim in ELEMENTWISE or (prim == "bitcast_convert_type" and tuple(aval.shape) == ins[0].shape):
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
        if prim == "conv_general_dilated":
            return [self.conv(eqn, ins, aval, ctx)]
        if prim in ("scatter-add", "scatter_add"):
            return [self.scatter_add(eqn, ins, aval, ctx)]
        raise self.unsupported(eqn)

    def unsupported(self, eqn: Any, why: str | None = None) -> Unsupported:
        return unsupported(eqn.primitive.name, _shapes(eqn), self.source(eqn), why)

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
        self.regroup(p.groups)
        n_in = sum(1 for g in p.groups if len(g[0]) > 1)
        n_out = sum(1 for g in p.groups if len(g[1]) > 1)
        p.fn = "merge" if n_in and not n_out else "split" if n_out and not n_in else "reshape"
        self.add(p)
        return out

    def regroup(self, groups: list) -> None:
        """A split of a dim that an earlier reshape merged takes the merged dims back (a
        reshape's gradient is the inverse reshape: ViT's patch grid flattened forward, its
        gradient split back into the grid). Only a naming choice: slots join only where no
        tensor would hold two axes of one dim. A merge keeps its own dim (a split of heads
        merged again may be laid out apart from the dim split)."""
        uf = self.uf
        for gi, go in groups:
            if len(gi) > 1 and len(go) == 1:
                self.regroups.append((gi, go[0]))
            elif len(gi) == 1 and len(go) > 1:
                sizes = [uf.size[uf.find(s)] for s in go]
                for parts, merged in self.regroups:
                    if uf.find(merged) == uf.find(gi[0]) and sizes == [uf.size[uf.find(s)] for s in parts]:
                        for s, t in zip(go, parts):
                            if uf.can_union(s, t):
                                uf.union(s, t)
                        break

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
        """``take`` along one axis (embedding lookups, ``x[:, idx]``) and, with
        ``operand_batching_dims``, ``take_along_axis`` (cross-entropy's label pick): the
        output's dims are the index's dims plus the table's dims other than the indexed one;
        the batching dims are shared by table and index (attr ``batch``)."""
        tv, iv = ins
        dn = eqn.params["dimension_numbers"]
        ob, ib = tuple(dn.operand_batching_dims), tuple(dn.start_indices_batching_dims)
        sizes = eqn.params["slice_sizes"]
        axis, col = self._lookup_axis(eqn, tv.shape, iv.shape, dn.start_index_map, dn.collapsed_slice_dims,
                                      sizes, ob, gather=True)
        ok = (all(s == tv.shape[i] for i, s in enumerate(sizes)
                  if i not in dn.collapsed_slice_dims and i not in ob and i != axis)
              and all(sizes[i] == 1 for i in ob))
        if not ok:
            raise self.unsupported(eqn, "only lookups along one axis (jnp.take, x[:, idx], "
                                   "jnp.take_along_axis) are supported")
        ipos = [o for o in range(len(aval.shape)) if o not in dn.offset_dims]  # index dims -> output positions
        kept = [i for i in range(len(tv.shape)) if i not in dn.collapsed_slice_dims and i not in ob]
        pairs = [(o, a) for o, a in zip(sorted(dn.offset_dims), kept) if a != axis]  # an uncollapsed row: size 1
        offset, kept = [o for o, _ in pairs], [a for _, a in pairs]
        replay = _binder(eqn)
        if iv.shape[-1] > 1:  # (token, 0): the lookup's column alone (the others select whole slices)
            iv, replay = self._index_column(eqn, iv, col, ctx), _with_zero_columns(eqn, col)
        if tv.shape[axis] == 1:  # a size-1 axis: a view of the table (index 0), e.g. x[..., 0] of [..., 1]
            if tv.root is not None and self._index_is_zero(iv, eqn, gather=True):
                out = self.view(tv, aval, ctx)
                self.bind(tv, [(a, out.slots[o]) for a, o in zip(kept, offset)] +
                          [(b, out.slots[ipos[j]]) for b, j in zip(ob, ib)], eqn, ctx)
                return out
            raise self.unsupported(eqn, "a lookup along a size-1 axis with an index that is not the "
                                   "constant 0")
        table, idx = (self.node_of(v, ctx) if v.root is None else v for v in (tv, iv))
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        table = self.bind(table, [(a, out.slots[o]) for a, o in zip(kept, offset)] +
                          [(b, out.slots[ipos[j]]) for b, j in zip(ob, ib)], eqn, ctx)
        idx = self.bind(idx, [(a, out.slots[o]) for a, o in zip(range(len(idx.shape) - 1), ipos)], eqn, ctx)
        p = _Pending("gather", "take", "gather", out, [table, idx],
                     [self.node_of(table, ctx), self.node_of(idx, ctx)], replay,
                     ctx[0], ctx[1], self.source(eqn))
        bounds = self._bounds_attrs(eqn, aval)
        p.attrs_fn = lambda name: (("indexed", name(table.slots[axis])),) + _batch_attr(
            name, [table.slots[b] for b in ob]) + bounds
        self.add(p)
        return out

    def _lookup_axis(self, eqn: Any, shape: tuple, ishape: tuple, cols: Sequence[int], collapsed: Sequence[int],
                     sizes: Sequence[int], ob: tuple, *, gather: bool) -> tuple[int, int]:
        """The operand axis a gather (scatter) looks up along and its column of the index:
        the one column (``collapsed`` the axis), or, where the index has several columns
        (``eqx.nn.Embedding`` under ``jax.vmap`` indexes ``(token, 0)``), the one whose
        slice is a single row, every other column selecting a whole axis, which the mode
        clamps to start 0 whatever it holds (a gather's CLIP and PROMISE_IN_BOUNDS, a
        scatter's CLIP: ``graph.index_out_of_range``), so the op is that one-axis lookup."""
        from jax.lax import GatherScatterMode as M

        cols, collapsed = tuple(cols), tuple(collapsed)
        what = "gather" if gather else "scatter-add"
        if not ishape or ishape[-1] != len(cols):
            raise self.unsupported(eqn, f"a {what} whose index is not one vector per lookup")
        if len(cols) == 1 and collapsed == cols:
            return cols[0], 0
        look = [j for j, b in enumerate(cols) if b in collapsed or sizes[b] != shape[b]]
        b = cols[look[0]] if len(look) == 1 and len(cols) > 1 else None
        if b is None or sizes[b] != 1 or shape[b] == 1 or not set(collapsed) <= {b} or any(
                i in ob for i in cols):
            raise self.unsupported(eqn, f"only {what}s along one axis (jnp.take, x[:, idx], jnp.take_along_axis"
                                   f"{'' if gather else ', their gradients'}) are supported; this index has "
                                   f"{len(cols)} columns selecting along axes {cols} of {shape}")
        mode = M.from_any(eqn.params["mode"])
        if index_out_of_range("gather" if gather else "scatter", mode) != "clamp":
            raise self.unsupported(
                eqn, f"an embedding row lookup written with a per-element index (columns {cols}, e.g. "
                f"eqx.nn.Embedding under jax.vmap) in mode {mode.name}, where an index column other than the "
                f"row's need not be 0; write it as jnp.take(weight, ids, axis=0) or weight[ids]")
        return b, look[0]

    def _index_column(self, eqn: Any, iv: _Val, col: int, ctx: tuple) -> _Val:
        """Column ``col`` of a gather's (scatter's) index, ``idx[..., col:col+1]``, traced as
        the ``slice`` jax would have for it."""
        from jax import lax
        from jax._src import core

        aval = core.ShapedArray((*iv.shape[:-1], 1), np.dtype(iv.dtype))
        sl = eqn.replace(invars=[eqn.invars[1]], outvars=[core.Var(aval)], primitive=lax.slice_p,
                         params={"start_indices": (0,) * (len(iv.shape) - 1) + (col,),
                                 "limit_indices": (*iv.shape[:-1], col + 1), "strides": None})
        return self.along_eqn(sl, [iv], ctx)[0]

    def _bounds_attrs(self, eqn: Any, aval: Any) -> tuple:
        """The ``mode`` attr (jax's ``GatherScatterMode``: what an index outside the indexed
        dim does) and, for a gather that fills, ``fill_value`` (in the output's dtype)."""
        from jax.lax import GatherScatterMode

        mode = GatherScatterMode.from_any(eqn.params["mode"])
        if eqn.primitive.name != "gather" or mode != GatherScatterMode.FILL_OR_DROP:
            return (("mode", mode),)
        fill = eqn.params.get("fill_value")
        if fill is None:  # lax.gather resolves the default itself; a bare gather_p.bind may not
            raise self.unsupported(eqn, "a FILL_OR_DROP gather without a fill_value: pass one "
                                   "(jnp.take(x, i, mode='fill', fill_value=...)) or use mode='clip'")
        value = np.asarray(fill).astype(np.dtype(aval.dtype)).item()
        return (("mode", mode), ("fill_value", _NAN if value != value else value))

    def _index_is_zero(self, iv: _Val, eqn: Any, *, gather: bool) -> bool:
        """Whether a literal index selects element 0 of a size-1 axis: any index does where
        it is clamped (a gather's CLIP and PROMISE_IN_BOUNDS, XLA's clamped start indices;
        a scatter's CLIP); elsewhere an index other than 0 fills (FILL_OR_DROP gather) or
        is dropped (a scatter's FILL_OR_DROP and PROMISE_IN_BOUNDS: XLA skips
        out-of-bounds updates), so every index must be 0."""
        if iv.root is not None:
            return False
        clamped = index_out_of_range("gather" if gather else "scatter", eqn.params["mode"]) == "clamp"
        return clamped or bool(np.all(np.asarray(iv.literal) == 0))

    def scatter_add(self, eqn: Any, ins: list[_Val], aval: Any, ctx: tuple) -> _Val:
        """The transpose of :meth:`gather`: add the updates at the indexed positions of
        one axis (an embedding's gradient, ``take_along_axis``'s with batching dims)."""
        ov, iv, uv = ins
        dn = eqn.params["dimension_numbers"]
        ob, ib = tuple(dn.operand_batching_dims), tuple(dn.scatter_indices_batching_dims)
        window = sorted(dn.update_window_dims)
        ok = len(window) == len(aval.shape) - len(dn.inserted_window_dims) - len(ob)
        kept = [i for i in range(len(aval.shape)) if i not in dn.inserted_window_dims and i not in ob]
        sizes = [1 if i not in kept else uv.shape[window[kept.index(i)]] for i in range(len(aval.shape))] if ok else []
        if not ok:
            raise self.unsupported(eqn, "only scatter-adds along one axis (the gradient of jnp.take or "
                                   "jnp.take_along_axis) are supported")
        axis, col = self._lookup_axis(eqn, aval.shape, iv.shape, dn.scatter_dims_to_operand_dims,
                                      dn.inserted_window_dims, sizes, ob, gather=False)
        if any(sizes[i] != aval.shape[i] for i in kept if i != axis):
            raise self.unsupported(eqn, "only scatter-adds of whole rows along one axis (the gradient of "
                                   "jnp.take or jnp.take_along_axis) are supported")
        scat = [i for i in range(len(uv.shape)) if i not in window]  # update dims <- index dims
        pairs = [(w, a) for w, a in zip(window, kept) if a != axis]  # an uncollapsed row: size 1
        window, kept = [w for w, _ in pairs], [a for _, a in pairs]
        replay = _binder(eqn)
        if iv.shape[-1] > 1:
            iv, replay = self._index_column(eqn, iv, col, ctx), _with_zero_columns(eqn, col)
            ins = [ov, iv, uv]
        if aval.shape[axis] == 1:  # a size-1 axis: zeros plus the updates, a view of them
            zero = ov.root is None and not np.any(np.asarray(ov.literal))
            if zero and self._index_is_zero(iv, eqn, gather=False):
                out = self.view(uv, aval, ctx)
                if uv.root is not None:
                    self.bind(uv, [(w, out.slots[k]) for w, k in zip(window, kept)] +
                              [(scat[j], out.slots[b]) for b, j in zip(ob, ib)], eqn, ctx)
                return out
            raise self.unsupported(eqn, "a scatter-add along a size-1 axis other than the gradient of "
                                   "taking element 0")
        into_zeros = ins[0].root is None and not np.any(np.asarray(ins[0].literal))  # fusion.scatter_into_zeros
        operand, idx, upd = (self.node_of(v, ctx) if v.root is None else v for v in ins)
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        operand = self.bind(operand, [(i, out.slots[i]) for i in range(len(aval.shape))], eqn, ctx)
        upd = self.bind(upd, [(w, out.slots[k]) for w, k in zip(window, kept)] +
                        [(scat[j], out.slots[b]) for b, j in zip(ob, ib)], eqn, ctx)
        idx = self.bind(idx, [(a, upd.slots[s]) for a, s in zip(range(len(idx.shape) - 1), scat)], eqn, ctx)
        p = _Pending("scatter", "scatter-add", "scatter_add", out, [operand, idx, upd],
                     [self.node_of(v, ctx) for v in (operand, idx, upd)], replay,
                     ctx[0], ctx[1], self.source(eqn))
        bounds = self._bounds_attrs(eqn, aval)
        p.attrs_fn = lambda name: (("indexed", name(out.slots[axis])),) + _batch_attr(
            name, [out.slots[b] for b in ob]) + bounds + ((("into_zeros", True),) if into_zeros else ())
        self.add(p)
        return out

    def scan(self, eqn: Any, ins: list[_Val], ctx: tuple) -> list[_Val]:
        if ctx[0] is not None:
            raise self.unsupported(eqn, "nested scans are not supported; unroll the inner loop")
        p = eqn.params
        length = int(p["length"])
        nc, ncar = scan_split(eqn)
        name = f"loop{len(self.loops)}"
        body_ctx = (name, ctx[1] * length)
        consts, init, xs = ins[:nc], ins[nc:nc + ncar], ins[nc + ncar:]
        loop_slot = self.uf.new(length) if length > 1 else None
        if loop_slot is not None:
            self.loop_slots[loop_slot] = name
        info = dict(name=name, length=length, reverse=bool(p["reverse"]), slot=loop_slot,
                    carries=[], slices=[], stacks=[], results=[], recomputes=False)
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


def plain_dtype(dtype: Any) -> Any:
    """``dtype``, or ``uint32`` standing in for an extended dtype (a typed PRNG key
    ``key<fry>``, which numpy cannot hold) so that the values reading it are reported as
    unsupported instead of failing."""
    import jax

    return np.dtype("uint32") if jax.dtypes.issubdtype(dtype, jax.dtypes.extended) else dtype


def _used_vars(jaxpr: Any) -> set:
    """The variables of ``jaxpr`` that an equation or the result reads."""
    from jax._src.core import Literal

    used = {v for e in jaxpr.eqns for v in e.invars if not isinstance(v, Literal)}
    return used | {v for v in jaxpr.outvars if not isinstance(v, Literal)}


def _with_zero_columns(eqn: Any, col: int) -> Any:
    """``eqn``'s gather (scatter) applied to an index holding column ``col`` only: the other
    columns put back as 0, the start every one of them is clamped to (see ``_lookup_axis``)."""
    prim, params = eqn.primitive, dict(eqn.params)
    k = eqn.invars[1].aval.shape[-1]

    def fn(*xs: Any) -> Any:
        import jax.numpy as jnp

        i = xs[1]
        cols = [i if j == col else jnp.zeros_like(i) for j in range(k)]
        return prim.bind(xs[0], jnp.concatenate(cols, axis=-1), *xs[2:], **params)
    return fn


def _batch_attr(name: Any, slots: list) -> tuple:
    """The ``batch`` attr of a gather/scatter: names of the batching dims shared by the
    table (or scattered-into operand) and the index (size-1 ones have none)."""
    names = tuple(name(s) for s in slots if s is not None)
    return (("batch", names),) if names else ()


def scan_split(eqn: Any) -> tuple[int, int]:
    """``(consts, carries)``: how many of a ``scan`` equation's operands are loop constants and
    how many are carries (the rest are the scanned ``xs``).

    jax 0.10 states them as the ``num_consts`` and ``num_carry`` params; jax 0.11.2 (the
    NVIDIA image of benchmarks/gpu_validate.py) has no ``num_consts``. Without them the split
    is read off the shapes, which fix it: the operands are ``consts, carries, xs`` and the
    results ``carries, ys``; a const or carry has the same shape outside the body as inside,
    an ``x`` or ``y`` one more (leading) dim of the trip count. tests/test_trace.py checks the
    shape rule against jax 0.10's params."""
    p = eqn.params
    if "num_consts" in p and "num_carry" in p:
        return int(p["num_consts"]), int(p["num_carry"])
    body = p["jaxpr"].jaxpr
    length = int(p["length"])
    same_in = [tuple(o.aval.shape) == tuple(i.aval.shape) for o, i in zip(eqn.invars, body.invars)]
    same_out = [tuple(o.aval.shape) == tuple(i.aval.shape) for o, i in zip(eqn.outvars, body.outvars)]
    ncar = int(p["num_carry"]) if "num_carry" in p else sum(same_out)
    nxs = len(same_in) - sum(same_in)
    nc = len(eqn.invars) - ncar - nxs
    stacked = [tuple(o.aval.shape) == (length, *i.aval.shape) for o, i in zip(eqn.invars, body.invars)]
    if (len(body.invars) != len(eqn.invars) or nc < 0 or not all(same_in[:nc + ncar])
            or not all(stacked[nc + ncar:]) or not all(same_out[:ncar]) or any(same_out[ncar:])):
        raise ValueError(
            f"cannot tell a scan's constants, carries and scanned operands apart: its params are "
            f"{sorted(p)} (no num_consts/num_carry) and its operand shapes "
            f"{[tuple(v.aval.shape) for v in eqn.invars]} do not follow consts, carries, xs; "
            "this jax version's scan is not supported, report it with the jax version")
    return nc, ncar
