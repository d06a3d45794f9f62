"""The ``gspmd`` backend: the graph's interpreter under ``jax.jit`` with sharding constraints.

Global arrays flow through the graph's positional replays (as
:meth:`~autolayout.graph.Graph.evaluate` runs them; scans as ``lax.scan``) and
every op output gets ``with_sharding_constraint(x, NamedSharding(mesh, spec))``
with the spec the layout gives it (including weight-update-sharded tensors), so
XLA's SPMD partitioner chooses the collectives. Same computation, XLA's choice
of communication: the baseline the shard_map lowering is measured against.
"""
from __future__ import annotations

from typing import Any, Callable

from autolayout.graph import Loop, align

__all__ = ["gspmd_body", "gspmd_spec"]


def gspmd_spec(prog: Any, name: str) -> Any:
    """The NamedSharding spec of a tensor: its form's spec, or the layout's for flattened
    update shards (not a sharding of the tensor itself)."""
    form = prog.form.get(name)
    if form and not prog.sharders[form].dim:
        return prog.spec(name, form=None)
    return prog.spec(name)


def gspmd_body(prog: Any, jmesh: Any) -> Callable[..., tuple]:
    """``f(*input tensors) -> output tensors`` (global arrays, graph dim order)."""
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding

    g = prog.g

    def constrain(x: Any, name: str) -> Any:
        return lax.with_sharding_constraint(x, NamedSharding(jmesh, gspmd_spec(prog, name)))

    def run_op(op: Any, env: dict) -> None:
        env[op.name] = constrain(g._run_op(op, env), op.name)

    def conform(x: Any, src: str, dst: str, have: tuple | None = None) -> Any:
        from autolayout.trace import _identity_groups

        have = g.tensor(src).dim_names if have is None else have
        want = g.tensor(dst).dim_names
        if set(have) != set(want):  # a renaming boundary: dims pair up by size, as in the IR
            groups = _identity_groups(tuple(g.dim(d) for d in have), g.tensor(dst).shape)
            rename = {gi[0]: go[0] for gi, go in groups if gi and go}
            have = tuple(rename[d] for d in have)
        return align(x, have, want)

    def run_loop(lp: Loop, env: dict) -> None:
        skip = {c for c, _ in lp.carries} | set(lp.slices)
        init = tuple(constrain(conform(env[g.op(c).inputs[0]], g.op(c).inputs[0], c), c)
                     for c, _ in lp.carries)
        xs = []
        for s in lp.slices:
            src = g.op(s).inputs[0]
            x = env[src]
            if lp.dim is not None:
                x = jnp.moveaxis(x, g.tensor(src).dim_names.index(lp.dim), 0)
            xs.append(x)
        stacks = [g.op(s) for s in lp.stacks]

        def step(carry: tuple, sliced: tuple) -> tuple:
            local = dict(env)
            for (c, _), v in zip(lp.carries, carry):
                local[c] = v
            for s, v in zip(lp.slices, sliced):
                src = g.op(s).inputs[0]
                have = tuple(d for d in g.tensor(src).dim_names if d != lp.dim)
                local[s] = constrain(conform(v, src, s, have), s)
            for n in lp.body:
                if n not in skip:
                    run_op(g.op(n), local)
            new = tuple(constrain(conform(local[nxt], nxt, c), c) for c, nxt in lp.carries)
            return new, tuple(local[s.inputs[0]] for s in stacks)

        if lp.dim is None:
            final, ys = step(init, tuple(xs))
            ys = tuple(y[None] for y in ys)
        else:
            final, ys = lax.scan(step, init, tuple(xs), length=lp.length, reverse=lp.reverse)
        carries = [c for c, _ in lp.carries]
        for res, carry in lp.results:
            env[res] = constrain(conform(final[carries.index(carry)], carry, res), res)
        for s, y in zip(stacks, ys):
            src = s.inputs[0]
            have = (lp.dim or "__iter__", *g.tensor(src).dim_names)
            if lp.dim is None:
                y, have = y[0], have[1:]
            env[s.name] = constrain(align(y, have, g.tensor(s.name).dim_names), s.name)

    def body(*leaves: Any) -> tuple:
        env: dict[str, Any] = {}
        for name, leaf in zip(g.input_names, leaves):
            env[name] = constrain(leaf, name)
        for unit in g._schedule():
            if isinstance(unit, Loop):
                run_loop(unit, env)
            elif unit not in env:
                run_op(g.op(unit), env)
        return tuple(env[n] for n in prog.out_tensors)

    return body
