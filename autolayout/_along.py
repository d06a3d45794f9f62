"""Pass 1 rules for ops *along* an axis (see :mod:`autolayout.trace`): slices, pads,
concatenations, splits, cumulative reductions, sorts, ``top_k``, dynamic slices and
updates, and convolutions' spatial windows.

Each such op works along one or more positional axes that must be whole on a device
(a slice needs both ends of its window, a cumulative sum every earlier element). They
become ops of kind ``along`` whose attr ``whole`` names those dims (input and output
side); every other axis is kept, one dim in and out, and computes split as the layout
says. The plan (:mod:`autolayout.costmodel.plan`) reads the inputs with the ``whole``
dims unsplit — an all-gather where the layout splits them: the relayout a split dim
that is sliced needs — and slices the output locally into its stored placement.
Operations with several outputs (``split``, ``sort``, ``top_k``) become one op per
used output, each replaying the primitive and keeping its output.
"""
from __future__ import annotations

from typing import Any, Callable

from autolayout._unify import _binder, _Core, _Pending, _Val

CUMULATIVE = frozenset(["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"])
ALONG = frozenset(["slice", "pad", "concatenate", "split", "sort", "top_k", "dynamic_slice",
                   "dynamic_update_slice", "rev"]) | CUMULATIVE


class _AlongRules(_Core):
    """The ``along`` primitives of :class:`autolayout._interpret._Tracer`."""

    def along_eqn(self, eqn: Any, ins: list[_Val], ctx: tuple) -> list[_Val]:
        prim, params = eqn.primitive.name, eqn.params
        x = ins[0]
        rank = len(x.shape)
        every = [(a, a) for a in range(rank)]
        outs = [v.aval for v in eqn.outvars]
        if prim == "slice":
            strides = params["strides"] or (1,) * rank
            win = [a for a in range(rank) if (params["start_indices"][a], params["limit_indices"][a],
                                              strides[a]) != (0, x.shape[a], 1)]
            if not win:
                return [self.alias(eqn, x, outs[0], ctx)]
            fn = _slicer({a: (params["start_indices"][a], params["limit_indices"][a], strides[a]) for a in win})
            out = self.along(eqn, [x], outs[0], ctx, "slice", [_keep(rank, win)], [(0, a) for a in win], fn)
            if len(win) == 1 and strides[win[0]] == 1:
                a = win[0]
                self.relate_piece(x.slots[a], params["start_indices"][a], params["limit_indices"][a], out.slots[a])
            return [out]
        if prim == "pad":
            win = [a for a in range(rank) if tuple(params["padding_config"][a]) != (0, 0, 0)]
            if not win:
                return [self.alias(eqn, x, outs[0], ctx)]
            out = self.along(eqn, ins, outs[0], ctx, "pad", [_keep(rank, win), []], [(0, a) for a in win],
                             _binder(eqn))
            lo, hi, interior = params["padding_config"][win[0]]
            if len(win) == 1 and interior == 0 and lo >= 0 and hi >= 0:  # the inverse of a slice
                self.relate_piece(out.slots[win[0]], lo, lo + x.shape[win[0]], x.slots[win[0]])
            return [out]
        if prim == "concatenate":
            d = params["dimension"]
            out = self.along(eqn, ins, outs[0], ctx, "concatenate", [_keep(rank, [d])] * len(ins),
                             [(i, d) for i in range(len(ins))], _binder(eqn))
            start = 0
            for v in ins:
                self.relate_piece(out.slots[d], start, start + v.shape[d], v.slots[d])
                start += v.shape[d]
            return [out]
        if prim == "split":
            axis, res, start = params["axis"], [], 0
            for var, size in zip(eqn.outvars, params["sizes"]):
                fn = _slicer({axis: (start, start + int(size), 1)})
                out = (self.along(eqn, [x], var.aval, ctx, "split", [_keep(rank, [axis])], [(0, axis)], fn)
                       if var in self.used else None)
                if out is not None:
                    self.relate_piece(x.slots[axis], start, start + int(size), out.slots[axis])
                start += int(size)
                res.append(out)
            return res
        if prim == "rev":
            return [self.along(eqn, [x], outs[0], ctx, "rev", [every], [(0, a) for a in params["dimensions"]],
                               _binder(eqn))]
        if prim in CUMULATIVE:
            return [self.along(eqn, [x], outs[0], ctx, prim, [every], [(0, params["axis"])], _binder(eqn))]
        if prim == "sort":
            d = params["dimension"]
            return [self.along(eqn, ins, var.aval, ctx, "sort", [every] * len(ins), [(0, d)], _picker(eqn, i))
                    if var in self.used else None for i, var in enumerate(eqn.outvars)]
        if prim == "top_k":
            axis = params.get("axis", rank - 1)
            vals = [None, None]
            for i, var in enumerate(eqn.outvars):
                vals[i] = self.along(eqn, [x], var.aval, ctx, "top_k", [_keep(rank, [axis])], [(0, axis)],
                                     _picker(eqn, i))
            # values and indices share their k dim (and every kept dim)
            self.bind(vals[1], [(a, vals[0].slots[a]) for a in range(rank)], eqn, ctx)
            return vals
        if prim == "dynamic_slice":
            sizes = params["slice_sizes"]
            win = [a for a in range(rank) if sizes[a] != x.shape[a]]
            if not win:
                return [self.alias(eqn, x, outs[0], ctx)]
            fn = _dynamic_slicer(win, {a: int(sizes[a]) for a in win})
            return [self.along(eqn, ins, outs[0], ctx, "dynamic_slice", [_keep(rank, win)] + [[]] * rank,
                               [(0, a) for a in win], fn)]
        if prim == "dynamic_update_slice":
            upd = ins[1]
            win = [a for a in range(rank) if upd.shape[a] != x.shape[a]]
            fn = _dynamic_updater(win)
            return [self.along(eqn, ins, outs[0], ctx, "dynamic_update_slice", [every, _keep(rank, win)] +
                               [[]] * rank, [(0, a) for a in win] + [(1, a) for a in win], fn)]
        raise AssertionError(prim)

    def relate_piece(self, whole: int | None, start: int, stop: int, piece: int | None) -> None:
        """Record that dim slot ``piece`` is ``whole[start:stop]`` and give it the dim of the
        same piece of the same dim met before: a concatenation's operands and the slices
        of its gradient (``concatenate``'s transpose), a slice and the pad of its gradient,
        so that the forward and backward passes name the piece once. Only a naming choice:
        two slots join only where no tensor would hold two axes of one dim."""
        if whole is None or piece is None:
            return
        uf = self.uf
        for w, a, b, p in self.pieces:
            if (a, b) == (start, stop) and uf.find(w) == uf.find(whole) and uf.can_union(p, piece) and (
                    uf.size[uf.find(p)] == uf.size[uf.find(piece)]):
                uf.union(p, piece)
                return
        self.pieces.append((whole, start, stop, piece))

    def conv(self, eqn: Any, ins: list[_Val], aval: Any, ctx: tuple) -> _Val:
        """``conv_general_dilated`` as a contraction (kind ``einsum``, fn ``conv``): the lhs
        batch dim is the output's, the rhs output-feature dim the output's feature dim, the
        lhs feature dim contracts with the rhs input-feature dim (split: partial sums the
        plan all-reduces); the spatial dims of all three are held whole (attr ``whole``:
        split, they are all-gathered: no halo exchange)."""
        params = eqn.params
        if params["feature_group_count"] != 1 or params["batch_group_count"] != 1:
            raise self.unsupported(eqn, "grouped (e.g. depthwise) convolutions have no named-dimension rule")
        lhs, rhs = (self.node_of(v, ctx) if v.root is None else v for v in ins)
        lb, lf, *ls = params["dimension_numbers"].lhs_spec
        ro, ri, *rs = params["dimension_numbers"].rhs_spec
        ob, of, *os_ = params["dimension_numbers"].out_spec
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        lhs = self.bind(lhs, [(lb, out.slots[ob])], eqn, ctx)
        rhs = self.bind(rhs, [(ro, out.slots[of]), (ri, lhs.slots[lf])], eqn, ctx)
        whole = [lhs.slots[a] for a in ls] + [rhs.slots[a] for a in rs] + [out.slots[a] for a in os_]
        window = [rhs.slots[ri]] + [rhs.slots[a] for a in rs]
        p = _Pending("einsum", "conv", "conv_general_dilated", out, [lhs, rhs],
                     [self.node_of(lhs, ctx), self.node_of(rhs, ctx)], _binder(eqn), ctx[0], ctx[1],
                     self.source(eqn))
        p.attrs_fn = lambda name: (("whole", _names(name, whole)), ("window", tuple(name(s) for s in window
                                                                                 if s is not None)))
        self.add(p)
        return out

    def alias(self, eqn: Any, x: _Val, aval: Any, ctx: tuple) -> _Val:
        """An identity slice/pad: a view of its operand."""
        out = self.view(x, aval, ctx)
        self.bind(x, [(a, out.slots[a]) for a in range(len(x.shape))], eqn, ctx)
        return out

    def along(self, eqn: Any, ins: list[_Val], aval: Any, ctx: tuple, fn: str, kept: list,
              whole: list[tuple[int, int]], replay: Callable) -> _Val:
        """One ``along`` op: operand ``i``'s axes ``kept[i]`` ``(axis, output axis)`` unify
        with the output's; ``whole`` lists ``(operand, axis)`` held whole (``-1``: the
        output's own axis), besides every output axis no operand axis is kept into."""
        out = self.new_val(aval.shape, aval.dtype, ctx=ctx)
        operands, named = [], []
        for v, pairs in zip(ins, kept):
            if v.root is None and v.shape:
                v = self.node_of(v, ctx)  # a non-scalar literal operand: a constant tensor
            if v.root is not None:
                v = self.bind(v, [(a, out.slots[o]) for a, o in pairs], eqn, ctx)
                node = self.node_of(v, ctx)
                if node not in named:
                    named.append(node)
            operands.append(v)
        targets = {o for pairs in kept for _, o in pairs}
        slots = [operands[i].slots[a] if i >= 0 else out.slots[a] for i, a in whole]
        slots += [out.slots[o] for o in range(len(aval.shape)) if o not in targets]
        p = _Pending("along", fn, eqn.primitive.name, out, operands, named, replay, ctx[0], ctx[1],
                     self.source(eqn))
        p.attrs_fn = lambda name: (("whole", _names(name, slots)),)
        self.add(p)
        return out


def _names(name: Callable, slots: list) -> tuple:
    return tuple(dict.fromkeys(name(s) for s in slots if s is not None))


def _keep(rank: int, window: list[int]) -> list[tuple[int, int]]:
    return [(a, a) for a in range(rank) if a not in window]


def _slicer(window: dict) -> Callable:
    """Slice ``start:limit:stride`` along the window axes only (other axes as they are, so
    the same function runs on global and on local blocks)."""
    def fn(x: Any) -> Any:
        from jax import lax
        for a, (start, limit, stride) in window.items():
            x = lax.slice_in_dim(x, int(start), int(limit), int(stride), axis=a)
        return x
    return fn


def _picker(eqn: Any, i: int) -> Callable:
    """Output ``i`` of a several-output primitive, replayed."""
    prim, params = eqn.primitive, dict(eqn.params)
    return lambda *xs: prim.bind(*xs, **params)[i]


def _dynamic_slicer(window: list[int], sizes: dict) -> Callable:
    def fn(x: Any, *starts: Any) -> Any:
        from jax import lax
        st = [starts[a] if a in sizes else 0 for a in range(x.ndim)]
        return lax.dynamic_slice(x, st, [sizes.get(a, x.shape[a]) for a in range(x.ndim)])
    return fn


def _dynamic_updater(window: list[int]) -> Callable:
    def fn(x: Any, upd: Any, *starts: Any) -> Any:
        from jax import lax
        return lax.dynamic_update_slice(x, upd.astype(x.dtype),
                                        [starts[a] if a in window else 0 for a in range(x.ndim)])
    return fn

