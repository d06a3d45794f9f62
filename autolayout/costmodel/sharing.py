"""Which ops of a computation share one conversion of a tensor, and over which span the
converted copy lives (:func:`shared_reads`): the rule the plan, its price, the lowering,
``predict``'s peak memory and the search's live sets all read.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from autolayout.costmodel.regions import regions
from autolayout.costmodel.storage import update_ops
from autolayout.graph import Graph, Loop, Op

__all__ = ["SOURCES", "held_whole", "shared_reads", "shared_providers", "spans", "gather_buffer_spans",
           "from_arguments", "replaced_by_copy"]

SOURCES = ("input", "param", "opt_state")


def held_whole(op: Op, name: str) -> str | None:
    """The indexed dim of a gather or scatter that its input ``name`` is read whole along
    (all-gathered where the layout splits it), or ``None``: a gather's table when the
    output has the indexed dim too (the index runs along it, e.g. ``take_along_axis(x,
    argsort(x))``), and a scatter's index and updates when they have it (every device
    needs every update into its block)."""
    if op.kind not in ("gather", "scatter"):
        return None
    v = op.attr("indexed")
    dims = {d.name for d in op.input_shapes[op.inputs.index(name)]}
    if op.kind == "gather" and name == op.inputs[0]:
        return v if v in op.output.dim_names else None
    return v if op.kind == "scatter" and name != op.inputs[0] and v in dims else None


@lru_cache(maxsize=256)
def shared_reads(graph: Graph) -> tuple[Mapping[tuple[str, str], str],
                                         Mapping[str | None, tuple[tuple[str, str, int, int], ...]]]:
    """Conversions shared by the ops that read one tensor: ``(sharing, spans)``.

    ``sharing[(op, tensor)]`` is the op whose conversion of ``tensor`` ``op`` reads instead of
    converting it itself; ``spans[computation]`` (``None``: the top level; a loop's name: its
    body) lists ``(provider, tensor, first position, last position)``: the provider's converted
    copy is live from the provider to the last op sharing it (positions as in
    ``lifetimes.lifetimes`` / ``lifetimes.body_lifetimes``). ``predict``'s peak memory and the
    search's live sets (``search/liveness.py``) both place these buffers from here.

    The rule, from XLA's optimized HLO: the lowering emits a collective per op that reads a
    tensor in another placement than it is stored in, and XLA's CSE merges identical collectives
    of one computation (same operand, same replica groups), leaving one, scheduled before the
    first reader, whose buffer lives to the last. Measured on 8 CPU devices (pre- and
    post-optimisation all-gathers): the forward's and the backward's all-gathers of a ZeRO-3
    weight outside a scan (equinox block 23 -> 16, the mlp 5 -> 3), and of a layer's weight slice
    read by the recomputed forward and the backward inside one scan body (Flax linen GPT 29 ->
    19); none is merged across computations (a scan's body and the top level, two loops). So
    the ops of one computation that read a tensor under the same rules (the same region, the
    same dim held whole) form a group; its first op in the traced order (``graph.order``, which the
    plan and the lowering follow whatever order the memory model walks: ``costmodel.order``)
    converts, the others read its copy, which lives from the first of them to run to the last.
    ``Planner`` checks at planning time that the placements are equal and that neither op
    computes on a storage shard (whose placement is the shard's); ops that may compute on a
    shard (:func:`~.storage.update_ops`) and loop boundaries (reshapes), the base operand of a
    scatter and sources never share. The span of a group is fixed by the graph (the search's
    live sets need it so); its bytes are the provider's converted copy (0 where nothing moves).

    A conversion of a value that is there for the whole computation (a step argument, a value
    from outside a scan's body, the body's slice of a stacked input) starts where XLA schedules
    it, at the start of the computation (:func:`_ready_at`), not at its first reader, and one of
    a top-level value computed from the step's arguments alone (a parameter's cast to bfloat16)
    right after that value: such a group, even of one op, has a span from there (in every order,
    so that the plan, which reads the traced graph's groups, and the memory model, which walks a
    backend's order, agree on which conversions are spans).
    """
    regs = regions(graph)
    skip = update_ops(graph)
    pos: dict[str | None, dict[str, int]] = {
        None: {u: i for i, u in enumerate(graph.schedule) if not isinstance(u, Loop)}}
    for lp in graph.loops.values():
        pos[lp.name] = {n: i for i, n in enumerate(lp.body)}
    groups: dict[tuple, list[str]] = {}
    for op in graph.ops():
        if op.kind in SOURCES or op.kind in ("constant", "reshape") or op.name in skip:
            continue
        own = {d.name for d in op.dims}
        for t in dict.fromkeys(op.inputs):
            if (op.kind == "scatter" and t == op.inputs[0]) or not graph.tensor(t).dim_names:
                continue
            whole = tuple(d for d in graph.tensor(t).dim_names if d in op.attr("whole", ()) or d not in own)
            key = (op.loop, t, regs.op_region(op.name), held_whole(op, t), whole)
            groups.setdefault(key, []).append(op.name)
    sharing: dict[tuple[str, str], str] = {}
    spans: dict[str | None, list] = {}
    rank = {n: i for i, n in enumerate(graph.order)}
    for (loop, t, *_), ops in groups.items():
        at = pos[loop]
        ops = sorted(ops, key=rank.__getitem__)  # the provider: the first in the traced order
        first = min(at[o] for o in ops)
        ready = _ready_at(graph, loop, t, at)
        start = first if ready is None else min(ready, first)
        if len(ops) < 2 and ready is None:
            continue  # one reader converting where it runs: the op's own transient bytes
        for o in ops[1:]:
            sharing[(o, t)] = ops[0]
        spans.setdefault(loop, []).append((ops[0], t, start, max(at[o] for o in ops)))
    return sharing, {k: tuple(v) for k, v in spans.items()}


def _ready_at(graph: Graph, loop: str | None, t: str, at: Mapping[str, int]) -> int | None:
    """Where in its computation (positions ``at``) a conversion of ``t`` is scheduled when ``t``
    is there for the whole computation: a step argument at the top level (position 0), a value
    from outside a scan's body (0) or the body's slice of a stacked input (right after the
    slice); None for a value the computation computes (converted where it is first read).

    XLA:CPU schedules each computation breadth first (``BFSMemoryScheduler``, openxla/xla
    ``xla/hlo/transforms/simplifiers/hlo_memory_scheduler.cc``, as ``CpuCompiler::CreateHloSchedule``
    picks it): an instruction runs as soon as its operands are ready, in the order they became
    ready, so the collectives that read only parameters, or a layer's weight slice, run first,
    before the compute that reads them. Measured in the optimised HLO of the ZeRO-3 layouts of
    ``benchmarks/memory_vs_xla.py`` (the mlp, ``transformer_lm`` and ``llama``, at the top level
    and in both scans' bodies): every all-gather of a weight runs at the start of its
    computation, and its buffer lives from there to its last reader. The original stays live
    through the computation either way, so the early copy adds its bytes over that span. A
    top-level value computed from the step's arguments alone (:func:`from_arguments`: a
    parameter's cast to bfloat16 in a mixed-precision step) is queued when its producer leaves
    the queue, so its all-gather runs right after it (the ZeRO-3 step of
    ``examples/linen_bf16_mlp.py``: both weights' all-gathers before the first dot), not where
    its first reader runs."""
    if loop is None:
        if graph.tensor(t).role in SOURCES:
            return 0
        return at[t] + 1 if t in at and t in from_arguments(graph) else None
    if t not in at:
        return 0
    op = graph.op(t)
    if op.kind == "reshape" and op.fn == "slice" and all(i not in at for i in op.inputs):
        return at[t] + 1
    return None


@lru_cache(maxsize=256)
def from_arguments(graph: Graph) -> frozenset[str]:
    """The top-level tensors computed from the step's arguments alone: each input of their
    producer an input, parameter or optimizer state or such a tensor (an op without inputs, a
    constant, excludes its readers). Their conversions run early (:func:`_ready_at`)."""
    out: set[str] = set()
    for name in graph.order:
        op = graph.op(name)
        if op.loop is None and op.kind not in SOURCES and op.inputs and all(
                graph.tensor(i).role in SOURCES or i in out for i in op.inputs):
            out.add(name)
    return frozenset(out)


@lru_cache(maxsize=256)
def shared_providers(graph: Graph) -> frozenset[tuple[str, str]]:
    """The ``(op, tensor)`` pairs of :func:`shared_reads` whose conversion later readers share."""
    return frozenset((prov, t) for group in shared_reads(graph)[1].values() for prov, t, _, _ in group)


@lru_cache(maxsize=512)
def spans(graph: Graph, early: bool) -> Mapping[str | None, tuple[tuple[str, str, int, int], ...]]:
    """The spans of :func:`shared_reads` as a backend schedules the conversions: ``early``
    (``Hardware.breadth_first_schedule``, XLA:CPU) as :func:`shared_reads` gives them; otherwise
    (a latency-hiding scheduler, XLA:TPU and XLA:GPU) a top-level conversion starts at its first
    reader, while a scan body's still start at the body's start (a layer's weights gathered
    before its first matmul). ``predict``'s peak memory and the search's live sets both read
    this."""
    out = dict(shared_reads(graph)[1])
    if not early and None in out:
        at = {u: i for i, u in enumerate(graph.schedule) if not isinstance(u, Loop)}
        out[None] = tuple((p, t, at[p], stop) for p, t, _, stop in out[None])
    return out


@lru_cache(maxsize=512)
def gather_buffer_spans(graph: Graph, early: bool) -> Mapping[str | None, tuple[tuple[str, str, int, int], ...]]:
    """For each span of :func:`spans`, ``(provider, tensor, start, start)``: where its conversion
    all-gathers a half-precision value in float32 (``reductions.half_gathers``), the collective's
    own buffer, live where the conversion runs until its convert (the next instructions of a
    breadth-first order; measured: ``all_gather_invariant.29``, positions 27-33 of the linen bf16
    MLP's ZeRO-3 step, freed at ``convert_bitcast_fusion.1``). ``predict``'s peak memory and the
    search's live sets both read this."""
    return {loop: tuple((p, t, start, start) for p, t, start, _ in group)
            for loop, group in spans(graph, early).items()}


@lru_cache(maxsize=256)
def replaced_by_copy(graph: Graph) -> frozenset[tuple[str, str]]:
    """The ``(provider, tensor)`` spans of :func:`shared_reads` whose converted copy takes the
    tensor's place: a top-level value the step computes (not an argument, not one of its
    outputs) that no op outside the group reads. Its last reader is then the conversion itself,
    so XLA frees it where the conversion runs (the ZeRO-3 step of ``examples/linen_bf16_mlp.py``:
    the cast shard of each weight, ``convert_bitcast_fusion.2``, is read by its all-gather alone
    and freed there), while the model's lifetime of the value, which does not depend on the
    layout, runs to the group's last reader: the span counts the copy less the value's bytes
    (``memory.peak_memory``; ``search.tables.Tables.gathered_bytes``), the value's own buffer
    standing in for that part of the copy."""
    sharing, spans_ = shared_reads(graph)
    outputs = {s.tensor for s in graph.outputs if s.tensor}
    group: dict[tuple[str, str], set[str]] = {}  # (provider, tensor) -> the ops of its group
    for (o, t), prov in sharing.items():
        group.setdefault((prov, t), {prov}).add(o)
    return frozenset((prov, t) for prov, t, _, _ in spans_.get(None, ())
                     if graph.tensor(t).role not in SOURCES and t not in outputs
                     and set(graph.consumers(t)) <= group.get((prov, t), {prov}))
