"""The norm region: where a dim may be split differently from the contractions around it.

Megatron-LM's sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", §4.2.2) splits the sequence over the
tensor-parallel axis in the layer-norm / residual / dropout parts of a layer,
where the tensors are ``[batch, length, d_model]`` and the tensor-parallel axis
would otherwise replicate them. In Mesh-TensorFlow terms it is a rename: those
tensors get other rules. The region is found from the graph's structure:

* ``dims``: the dims of the scans' carries (the residual stream: ``batch``,
  ``length``, ``d_model`` for a transformer);
* ops *compute* in the region when they are element-wise ops or reductions (sums
  included) whose
  dims are all region dims, one of them a dim of the data (``batch``, ``length``:
  parameter updates stay out), and that connect, through such ops, to a scan's
  carry (layer norms, residual adds; their backward too), and loop boundaries
  (stack, slice, carry, result) of region tensors (saved activations stay split);
* a tensor is *stored* in the region of its readers when they all compute in one
  region, else in its producer's: a matmul whose output only feeds the residual
  add reduce-scatters into the region; a layer norm whose output only feeds the
  next matmuls is all-gathered once by the norm, not by each reader.

A layout gives a dim its region rule as ``dim@norm`` (:class:`~autolayout.core.Layout`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from autolayout.graph import Graph

__all__ = ["NORM", "Regions", "regions", "region_axes"]

NORM = "norm"
_BOUNDARY = ("stack", "slice", "carry", "result")


@dataclass(frozen=True)
class Regions:
    """The norm region of a graph: its ``dims``, the ops computing in it and the tensors
    stored in it (see the module docstring)."""

    dims: frozenset[str]
    ops: frozenset[str]
    stored: frozenset[str]

    def op_region(self, op: str) -> str:
        return NORM if op in self.ops else ""

    def tensor_region(self, tensor: str) -> str:
        return NORM if tensor in self.stored else ""

    def view(self, dims: Sequence[str], region: str) -> tuple[str, ...]:
        """``dims`` as named in ``region`` (``length@norm``); other dims keep their names."""
        if not region:
            return tuple(dims)
        return tuple(f"{d}@{region}" if d in self.dims else d for d in dims)


EMPTY = Regions(frozenset(), frozenset(), frozenset())


def regions(graph: Graph) -> Regions:
    """The norm region of ``graph`` (empty when it has no scan)."""
    return _regions(graph)


@lru_cache(maxsize=32)
def _regions(graph: Graph) -> Regions:
    loop = graph.loop_dims
    dims: set[str] = set()
    seeds: set[str] = set()
    for lp in graph.loops.values():
        for c, nxt in lp.carries:
            dims |= set(graph.tensor(c).dim_names) - loop
            seeds |= {c, nxt, graph.op(c).inputs[0]}
        seeds |= {r for r, _ in lp.results}
    if not dims:
        return EMPTY
    # the data's own dims (batch, length): a region op has one, so parameter updates
    # (element-wise on d_model-shaped tensors) stay out
    data = {d for t in graph.tensors() if t.role == "input" for d in t.dim_names}

    def member(name: str) -> bool:
        op = graph.op(name)
        names = {d.name for d in op.dims} - loop
        if op.kind in ("elementwise", "reduce") or (op.kind == "einsum" and len(op.inputs) == 1):
            return names <= dims and bool(names & data)
        return op.kind == "reshape" and op.fn in _BOUNDARY and names <= dims

    ops: set[str] = set()
    frontier = [s for s in seeds if member(s)]
    while frontier:
        t = frontier.pop()
        if t in ops:
            continue
        ops.add(t)
        op = graph.op(t)
        for n in (*op.inputs, *graph.consumers(t)):
            if n not in ops and member(n):
                frontier.append(n)
    stored: set[str] = set()
    for name in graph.order:
        op = graph.op(name)
        if op.kind in ("input", "param", "opt_state", "constant"):
            continue
        readers = graph.consumers(name)
        where = {c in ops for c in readers}
        inside = where.pop() if len(where) == 1 else name in ops
        if inside and set(op.output.dim_names) - loop <= dims:
            stored.add(name)
    return Regions(frozenset(dims), frozenset(ops), frozenset(stored))


def region_axes(axes_of: Mapping[str, tuple[str, ...]], region: str) -> dict[str, tuple[str, ...]]:
    """``axes_of`` as a region sees it: each dim's ``dim@region`` rule where it has one."""
    if not region:
        return dict(axes_of)
    out = {k: v for k, v in axes_of.items() if "@" not in k}
    suffix = "@" + region
    for k, v in axes_of.items():
        if k.endswith(suffix):
            out[k[: -len(suffix)]] = v
    return out
