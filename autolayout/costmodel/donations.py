"""Which donated parameters XLA copies before writing their update over them.

A step traced with ``donate_argnums`` writes each updated parameter into the buffer of the
parameter it replaces (``graph.donated``: output -> argument; ``alias`` in XLA's buffer
assignment). XLA's copy insertion may only do that where every reader of the old value runs
before the instruction that writes the new one; where a reader is not ordered before it (not an
ancestor of it in the dependency graph), it copies the parameter at the step's start and the
readers read the copy (openxla/xla ``xla/service/copy_insertion.cc``,
``AddCopiesForAliasedInputOutputs`` and the interference test of ``CopyInsertion``). The copy
is a temporary of the parameter's size, live from the step's start to the last of its readers
(the update, which reads it, included).

Probed in the optimized HLO of 61 executed donated layouts on 8 CPU devices
(``benchmarks/memory_vs_xla.py``: the ``--loss`` sample's 12, ``--storage``'s 30 donated rows,
the table's 19): a parameter aliased to an output is copied exactly when one of its readers is not
an ancestor of the instruction writing that output, 61 of 61. On the traced graph the same test
(:func:`copied_parameters`) takes, for each reader, the materialised op it is fused into
(``lifetimes.readers_of``), and the two ways the lowered program orders more than the graph:

* a parameter stored as a shard at ZeRO stage 3 is read by its all-gather alone; the gathered
  copy's readers read that, so the parameter is copied only where none of its readers is an
  ancestor of the update (XLA copies none in the sample's 21 stage-3 rows, where the readers'
  test names 8 for ``nnx_llama``; the zoo ``mlp`` with the linear loss, whose second weight is
  read only by the forward's output, copies it);
* where the step all-reduces the gradients of parameters stored whole, on a backend that combines
  those all-reduces into one (``Hardware.combines_gradient_reductions``, XLA:CPU), the update of
  each such parameter waits for every gradient the combined all-reduce reads, so the ancestors
  of those gradients' reducing ops are ordered before it too (XLA copies none of
  ``nnx_llama``'s 8 in ``batch:data,model``; the MSE ``mlp`` keeps one copy there, its first
  weight, read by the input gradient the step returns, which no gradient needs).

The reduce-scatters of ZeRO stages 1 and 2 are not combined, so there the graph's own ancestry
holds. XLA:GPU does not follow the rule (the 24 H200 steps of ``reports/gpu``: the counts agree
in 7; ``profiles.SRC_CPU_DONATED_COPIES``), so it applies where ``Hardware.copies_donated_parameters``
says so. ``predict`` (``costmodel/memory.py``) and the search's live sets (``search/liveness.py``)
both list :func:`param_copy_spans` and size them with :func:`copied_parameters` (one rule).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import networkx as nx

from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.lifetimes import lifetimes, readers_of
from autolayout.costmodel.regions import regions
from autolayout.costmodel.storage import gradient_walk
from autolayout.graph import Graph, Loop

__all__ = ["donated_readers", "param_copy_spans", "donor_writes", "copied_parameters"]


@lru_cache(maxsize=256)
def donated_readers(graph: Graph) -> Mapping[str, tuple[str, tuple[str, ...]]]:
    """Per donated parameter (``graph.donated``'s arguments that are parameters), ``(output,
    readers)``: the output written over it (an op's name is its output's: the op writing it) and
    the materialised ops that read the parameter besides it (``lifetimes.readers_of``: a fused
    reader taken as the op it is fused into)."""
    readers = readers_of(graph)
    out = {}
    for output, arg in getattr(graph, "donated", {}).items():
        if arg not in graph.param_roles:
            continue
        rs = tuple(r for r in readers.get(arg, ()) if r != output)
        if rs:
            out[arg] = (output, rs)
    return out


@lru_cache(maxsize=256)
def _ancestors(graph: Graph, name: str) -> frozenset[str]:
    """``name`` and every op it depends on (the graph's data flow, scan bodies included)."""
    return frozenset(nx.ancestors(graph.nx, name)) | {name}


@lru_cache(maxsize=256)
def param_copy_spans(graph: Graph) -> tuple[tuple[str, int, int, int], ...]:
    """``(parameter, start, stop, written)`` for each parameter of :func:`donated_readers`: the
    units of ``graph.schedule`` (top level; a scan is one unit) its copy would be live over, from
    the step's start to the last of its readers and its update, and the unit that writes the
    update over the parameter's buffer (``written``). Where XLA copies the parameter, its own
    buffer holds nothing from the copy to ``written``, and XLA puts temporaries there as in an
    output allocation not yet written (``outputs.output_placement``; measured: the optimized HLO
    of the zoo ``mlp`` step on 8 CPU devices, whose first weight gradient ``dot.1`` is in the
    second weight's parameter allocation, between ``copy.12`` and the update written over it)."""
    units, _, _ = lifetimes(graph)
    unit_of: dict[str, int] = {}
    for i, u in enumerate(units):
        for n in (u.body if isinstance(u, Loop) else (u,)):
            unit_of[n] = i
    return tuple((p, 0, max(unit_of[n] for n in (writer, *rs)), unit_of[writer])
                 for p, (writer, rs) in donated_readers(graph).items())


def donor_writes(graph: Graph) -> dict[str, tuple[int, str]]:
    """Per parameter of :func:`param_copy_spans`, ``(written, writer)``: the unit that writes its
    update over its own buffer and the op writing it (``outputs.output_placement`` puts a
    temporary into that buffer only where it dies before the write, as into an output's)."""
    writers = donated_readers(graph)
    return {p: (written, writers[p][0]) for p, _, _, written in param_copy_spans(graph)}


def copied_parameters(graph: Graph, axes_of: Mapping[str, tuple[str, ...]], stages: Mapping[str, int],
                      hardware: Hardware) -> frozenset[str]:
    """The donated parameters XLA copies under a layout (module docstring): ``axes_of`` the
    layout's axes per dim (``plan.resolve_layout``), ``stages`` each storage-sharded parameter's
    ZeRO stage (``Plan.shards``; absent: stored whole). None where ``hardware`` does not copy them
    by this rule (``Hardware.copies_donated_parameters``); its
    ``combines_gradient_reductions`` says whether gradient all-reduces are combined.

    Example::

        copied_parameters(models.mlp(64, 32, 128, loss="mse"), {}, {}, get_hardware("cpu"))  # v, w
    """
    if not (hardware.copies_donated_parameters and donated_readers(graph)):
        return frozenset()
    return _copied(graph, tuple(sorted((d, tuple(a)) for d, a in axes_of.items())), tuple(sorted(stages.items())),
                   hardware.combines_gradient_reductions)


@lru_cache(maxsize=1024)
def _copied(graph: Graph, axes: tuple, stage_items: tuple, combines: bool) -> frozenset[str]:
    """:func:`copied_parameters` of a layout's ``axes`` and ``stage_items`` (sorted items, so that
    the search's points of one layout share the walk of its gradients)."""
    axes_of, stages = dict(axes), dict(stage_items)
    found = donated_readers(graph)
    combined: set[str] = set()  # ops whose gradient all-reduce is the combined one
    reduced: dict[str, bool] = {}
    if combines:
        regs = regions(graph)
        for q in graph.param_roles:
            ops = gradient_walk(graph, q, axes_of, regs)[0] if not stages.get(q) else []
            reduced[q] = bool(ops)
            combined.update(ops)
    out = set()
    for p, (writer, rs) in found.items():
        before = set(_ancestors(graph, writer))
        if reduced.get(p):  # its update waits for the combined all-reduce of every whole gradient
            for o in combined:
                before |= _ancestors(graph, o)
        ordered = [r in before for r in rs]
        if (stages.get(p, 0) >= 3 and not any(ordered)) or (stages.get(p, 0) < 3 and not all(ordered)):
            out.add(p)
    return frozenset(out)
