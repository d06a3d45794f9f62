"""The ``gspmd`` backend: the graph's reference interpreter under ``jax.jit`` with sharding constraints.

Global arrays flow through the graph's positional replays (the
:class:`~autolayout.schedule.Reference` interpreter of :meth:`Graph.evaluate`, on
the same schedule walker; scans as ``lax.scan``) and every op output gets
``with_sharding_constraint(x, NamedSharding(mesh, spec))`` with the spec of the
placement the plan stores it in (a flattened update shard is constrained to its
layout's spec: a flattened shard is not a sharding of the tensor itself), so
XLA's SPMD partitioner chooses the collectives. Same computation, XLA's choice
of communication: the baseline the shard_map lowering is measured against.
"""
from __future__ import annotations

from typing import Any, Callable

from autolayout.costmodel.plan import Plan
from autolayout.exec.lower import partition_spec
from autolayout.schedule import Reference, run_schedule

__all__ = ["gspmd_body", "gspmd_spec"]


def gspmd_spec(plan: Plan, name: str) -> Any:
    """The PartitionSpec a tensor is constrained to: its placement's, or its layout's for a
    flattened update shard."""
    p = plan.placements[name]
    return partition_spec(p.base() if p.flat else p, plan.mesh)


class _Constrained(Reference):
    def __init__(self, plan: Plan, jmesh: Any) -> None:
        super().__init__(plan.graph)
        self.plan, self.jmesh = plan, jmesh

    def value(self, name: str, value: Any) -> Any:
        from jax import lax
        from jax.sharding import NamedSharding

        return lax.with_sharding_constraint(value, NamedSharding(self.jmesh, gspmd_spec(self.plan, name)))


def gspmd_body(plan: Plan, jmesh: Any, out_tensors: tuple[str, ...]) -> Callable[..., tuple]:
    """``f(*input tensors) -> output tensors`` (global arrays, graph dim order)."""
    interp = _Constrained(plan, jmesh)
    g = plan.graph

    def body(*leaves: Any) -> tuple:
        env: dict[str, Any] = {}
        for name, leaf in zip(g.input_names, leaves):
            interp.store(env, name, leaf)
        run_schedule(g, env, interp)
        return tuple(env[n] for n in out_tensors)

    return body
