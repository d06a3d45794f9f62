"""Running a graph's schedule: :class:`Interpreter`'s per-op hooks and :func:`run_schedule`,
the one walker that :meth:`~autolayout.graph.Graph.evaluate` (:class:`Reference`), the GSPMD
backend and the shard_map lowering share; and the named-axis helpers they use (:func:`align`,
:func:`rename_align`, :func:`identity_groups`). Graphs, ops and loops are
:mod:`autolayout.graph`'s (this module sits below it and takes them as arguments).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from autolayout.core import Dim

__all__ = ["Interpreter", "Reference", "run_schedule", "align", "rename_align", "identity_groups", "squeeze_to"]


class Interpreter:
    """The per-op hooks of :func:`run_schedule`, the one walker over a graph's schedule that
    :meth:`Graph.evaluate`, the GSPMD backend and the shard_map lowering share.

    Values live in ``env`` by tensor name. :meth:`op` computes an op's value from ``env``;
    :meth:`boundary` applies a loop-boundary op (``carry``, ``slice``, ``result``: a
    regrouping of its input, possibly renaming dims) to a value whose axes are named
    ``have``; :meth:`unstack` and :meth:`stacked` move the iteration axis of a scan's
    sliced inputs and stacked outputs; :meth:`scan` runs the body.
    """

    def __init__(self, graph: Any) -> None:
        self.g = graph

    def op(self, op: Any, env: dict[str, Any]) -> Any:
        raise NotImplementedError

    def boundary(self, op: Any, value: Any, have: tuple[str, ...]) -> Any:
        raise NotImplementedError

    def carry_back(self, op: Any, value: Any, nxt: str) -> Any:
        """The value of tensor ``nxt`` at the end of an iteration as carry op ``op``'s value."""
        return self.boundary(op, value, self.g.tensor(nxt).dim_names)

    def unstack(self, op: Any, value: Any, lp: Any) -> tuple[Any, tuple[str, ...]]:
        """The stacked input of slice op ``op`` with the iteration axis first (as is for a
        scan of length 1), and the names of the axes one iteration's slice has."""
        import jax.numpy as jnp

        have = self.g.tensor(op.inputs[0]).dim_names
        if lp.dim is None:
            return value, have
        return jnp.moveaxis(value, have.index(lp.dim), 0), tuple(d for d in have if d != lp.dim)

    def stack_item(self, op: Any, value: Any) -> Any:
        """One iteration's value of the input of stack op ``op``, as it is stacked."""
        return value

    def stacked(self, op: Any, value: Any, lp: Any) -> Any:
        """The stacked outputs (iteration axis first) as stack op ``op``'s value."""
        have = ((lp.dim,) if lp.dim else ()) + self.g.tensor(op.inputs[0]).dim_names
        return align(value, have, self.g.tensor(op.name).dim_names)

    def scan(self, step: Callable, init: tuple, xs: tuple, lp: Any) -> tuple:
        from jax import lax

        return lax.scan(step, init, xs, length=lp.length, reverse=lp.reverse)

    def value(self, name: str, value: Any) -> Any:
        """``value`` as tensor ``name`` is held in ``env`` (hook for checks)."""
        return value

    def store(self, env: dict[str, Any], name: str, value: Any) -> None:
        env[name] = self.value(name, value)


def run_schedule(graph: Any, env: dict[str, Any], interp: Interpreter) -> None:
    """Run every op of ``graph`` not yet in ``env`` with ``interp``'s hooks, scans as
    ``lax.scan`` (a scan of length 1 runs its body once)."""
    for unit in graph.schedule:
        if not isinstance(unit, str):  # a Loop (graph.Loop); ops are scheduled by name
            _run_loop(graph, unit, env, interp)
        elif unit not in env:
            interp.store(env, unit, interp.op(graph.op(unit), env))


def _run_loop(g: Any, lp: Any, env: dict[str, Any], interp: Interpreter) -> None:
    skip = {c for c, _ in lp.carries} | set(lp.slices)
    init = []
    for c, _ in lp.carries:
        src = g.op(c).inputs[0]
        init.append(interp.value(c, interp.boundary(g.op(c), env[src], g.tensor(src).dim_names)))
    xs, have_of = [], {}
    for s in lp.slices:
        op = g.op(s)
        x, have_of[s] = interp.unstack(op, env[op.inputs[0]], lp)
        xs.append(x)
    stacks = [g.op(s) for s in lp.stacks]

    def step(carry: tuple, sliced: tuple) -> tuple:
        local = dict(env)
        for (c, _), v in zip(lp.carries, carry):
            local[c] = v
        for s, v in zip(lp.slices, sliced):
            interp.store(local, s, interp.boundary(g.op(s), v, have_of[s]))
        for n in lp.body:
            if n not in skip:
                interp.store(local, n, interp.op(g.op(n), local))
        new = tuple(interp.value(c, interp.carry_back(g.op(c), local[nxt], nxt)) for c, nxt in lp.carries)
        return new, tuple(interp.stack_item(s, local[s.inputs[0]]) for s in stacks)

    if lp.dim is None:  # one iteration, nothing stacked
        final, ys = step(tuple(init), tuple(xs))
    else:
        final, ys = interp.scan(step, tuple(init), tuple(xs), lp)
    carries = [c for c, _ in lp.carries]
    for res, carry in lp.results:
        interp.store(env, res, interp.boundary(g.op(res), final[carries.index(carry)], g.tensor(carry).dim_names))
    for s, y in zip(stacks, ys):
        interp.store(env, s.name, interp.stacked(s, y, lp))


class Reference(Interpreter):
    """Global (unsharded) values: each op's positional replay, as the jaxpr ran it."""

    def op(self, op: Any, env: dict[str, Any]) -> Any:
        import jax.numpy as jnp

        if op.replay is None:
            raise ValueError(f"op {op.name!r} ({op.kind}.{op.fn}) has no replay and cannot be evaluated")
        args = []
        for spec in op.replay.operands:
            if spec[0] == "literal":
                args.append(spec[1])
                continue
            _, name, want, shape = spec
            y = align(env[name], self.g.tensor(name).dim_names, want)
            args.append(jnp.broadcast_to(y, shape) if tuple(y.shape) != tuple(shape) else y)
        return squeeze_to(op.output, op.replay.fn(*args))

    def boundary(self, op: Any, value: Any, have: tuple[str, ...]) -> Any:
        return rename_align(self.g, value, have, op.name)


def rename_align(graph: Any, value: Any, have: Sequence[str], dst: str) -> Any:
    """``value`` (axes named ``have``) in tensor ``dst``'s dim order, pairing renamed dims
    by size as the tracer's loop boundaries do (:func:`identity_groups`)."""
    want = graph.tensor(dst).dim_names
    have = tuple(have)
    if set(have) != set(want):
        groups = identity_groups(tuple(graph.dim(d) for d in have), graph.tensor(dst).shape)
        rename = {gi[0]: go[0] for gi, go in groups if gi and go}
        have = tuple(rename[d] for d in have)
    return align(value, have, want)


def identity_groups(src: Sequence[Dim], dst: Sequence[Dim]) -> tuple:
    """Reshape groups of an op that keeps a shape up to names: kept dims pair up, renamed
    ones (same size) too; an unmatched input dim is dropped, an unmatched output dim created."""
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


def squeeze_to(t: Any, x: Any) -> Any:
    """``x`` reshaped to tensor ``t``'s shape (a traced leaf's size-1 axes dropped or added)."""
    import jax.numpy as jnp

    want = tuple(d.size for d in t.shape)
    if tuple(x.shape) != want:
        x = jnp.reshape(x, want)
    return x
