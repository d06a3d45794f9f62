"""Lifetimes of a step's tensors in the graph's schedule (the traced order, or the order
``costmodel.order.memory_order`` gives the graph for a backend), as XLA's buffer assignment has them
(the rules are listed in :mod:`autolayout.costmodel.memory`'s docstring): :func:`lifetimes` for
the top level, :func:`body_lifetimes` for a scan's body, the element-wise ops that write their
result over an operand (:func:`in_place_operand`) and the residual chain written into a loop's
state (:func:`loop_state_chain`). ``memory.peak_memory``, the dot operand copies
(:mod:`autolayout.costmodel.copies`) and the search's live sets (``search/liveness.py``) all
read them.
"""
from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType
from typing import Mapping

from autolayout.costmodel.reshapes import hlo_groups
from autolayout.fusion import duplicable, expensive, reduction
from autolayout.graph import Graph, Loop

__all__ = ["lifetimes", "body_lifetimes", "computations", "freed_at", "last_read_at", "schedule_points",
           "readers_of", "in_place_operand", "loop_state_chain", "gemm_prologues"]


def lifetimes(graph: Graph) -> tuple[list, dict[str, int], dict[str, int]]:
    """Schedule units and, for every top-level tensor that takes memory of its own, the
    units it is allocated and last live at (scan bodies are handled by
    :func:`body_lifetimes`). Arguments span the whole step, outputs from their producer (module
    docstring); an output that reuses a donated argument's buffer is left out."""
    units = graph.schedule
    unit_of: dict[str, int] = {}
    for i, u in enumerate(units):
        if isinstance(u, Loop):
            for n in u.body:
                unit_of[n] = i
        else:
            unit_of[u] = i
    # a scan's stacked outputs exist from their zero fill: at the step's start in XLA:CPU's
    # breadth-first order, where XLA:GPU's memory scheduler places it in its order (order.min_memory:
    # the view's stack_fills), else at the scan (memory module docstring); a final carry is the loop
    # state, which the body counts while it runs (its carried values), so it takes memory from its
    # own unit
    early = _breadth_first_view(graph)
    fills = getattr(graph, "stack_fills", None) or {}  # where a memory scheduler runs a stack's fill
    for i, u in enumerate(units):
        if isinstance(u, Loop):
            for n in u.stacks:
                unit_of[n] = 0 if early else fills.get(n, min(unit_of[n], i))
    end = len(units)
    outputs = {s.tensor for s in graph.outputs if s.tensor}
    body_of = {n for lp in graph.loops.values() for n in lp.body}
    reusing = set(getattr(graph, "donated", {}))  # outputs written into a donated argument's buffer
    readers = readers_of(graph)
    alloc: dict[str, int] = {}
    free: dict[str, int] = {}
    for t in graph.tensors():
        if t.name in body_of or t.name in reusing:
            continue
        if t.role in ("input", "param", "opt_state"):
            alloc[t.name], free[t.name] = 0, end
            continue
        alloc[t.name] = unit_of[t.name]
        free[t.name] = end if t.name in outputs else max((unit_of[c] for c in readers[t.name]), default=alloc[t.name])
    if _memory_scheduler_view(graph):  # computed inside each contraction reading it: no buffer
        for n in gemm_prologues(graph):
            if n in alloc:
                free[n] = alloc[n] - 1
    for i, u in enumerate(units):
        if not isinstance(u, Loop):
            src = in_place_operand(graph, u, readers)
            if src in free and free[src] == unit_of[u] and alloc[src] < unit_of[u]:
                free[src] = unit_of[u] - 1  # its buffer becomes u's
            continue
        for c, _ in u.carries:  # an initial value read last by its loop becomes the loop state
            for src in graph.op(c).inputs:
                if src in free and free[src] == i and alloc[src] < i and src not in outputs:
                    free[src] = i - 1
    return units, alloc, free


@lru_cache(maxsize=64)
def computations(graph: Graph) -> tuple[Mapping[str, str | None], Mapping[str | None, Mapping[str, int]]]:
    """``(loop_of, last)``: the computation each op runs in (``None``: the top level, for each
    unit of the schedule that is not a scan; a scan's name for each op of its body), and per
    computation the last position each tensor is live at (:func:`lifetimes`' ``free`` at the top
    level, :func:`body_lifetimes`' ``last`` in a body). The spans that keep a buffer alive past
    its own last reader (``bitcasts.kept_spans``, ``recomputed.recomputed_spans``) read both."""
    units, _, free = lifetimes(graph)
    loop_of: dict[str, str | None] = {u: None for u in units if not isinstance(u, Loop)}
    last: dict[str | None, Mapping[str, int]] = {None: free}
    for lp in graph.loops.values():
        order, body_last = body_lifetimes(graph, lp)
        loop_of.update({n: lp.name for n in order})
        last[lp.name] = body_last
    return MappingProxyType(loop_of), MappingProxyType(last)


def freed_at(graph: Graph, loop: str | None, i: int) -> tuple[str, ...]:
    """The tensors the unit at position ``i`` of a computation (``loop``: ``None`` for the top
    level, a scan's name for its body) reads for the last time, freed once it has run: allocated
    before ``i``, last live there and last read there (that computation's own lifetimes,
    :func:`lifetimes` or :func:`body_lifetimes`, and last readers, :func:`last_read_at`; the one
    place that picks them, for ``phases.split_reductions``, ``phases.collective_points`` and
    ``gradients.combined_point``). A tensor whose buffer the next unit takes over (an element-wise
    op writing over it, :func:`in_place_operand`, or a loop whose state it becomes) ends one unit
    before that reader but is not freed: its bytes live on as the taker's, so the unit before does
    not free them."""
    return _freed(graph, loop).get(i, ())


@lru_cache(maxsize=256)
def _freed(graph: Graph, loop: str | None) -> Mapping[int, tuple[str, ...]]:
    """:func:`freed_at` for every position of one computation at once."""
    if loop is None:
        _, alloc, free = lifetimes(graph)
    else:
        alloc, free = body_lifetimes(graph, graph.loops[loop])
    read = last_read_at(graph, loop)
    out: dict[int, list[str]] = {}
    for m in alloc:  # last live and last read at free[m], allocated before it
        if alloc[m] < free[m] and read.get(m) == free[m]:
            out.setdefault(free[m], []).append(m)
    return MappingProxyType({i: tuple(ms) for i, ms in out.items()})


@lru_cache(maxsize=256)
def last_read_at(graph: Graph, loop: str | None = None) -> Mapping[str, int]:
    """The position of each tensor's last reader: in the top-level schedule (a scan's body op at
    its scan's unit), or, for ``loop``, in that scan's body (readers outside it left out)."""
    readers = readers_of(graph)
    if loop is None:
        pos = {}
        for i, u in enumerate(graph.schedule):
            for n in (u.body if isinstance(u, Loop) else (u,)):
                pos[n] = i
    else:
        pos = {n: j for j, n in enumerate(graph.loops[loop].body)}
    out = {}
    for name, rs in readers.items():
        at = [pos[r] for r in rs if r in pos]
        if at:
            out[name] = max(at)
    return MappingProxyType(out)


@lru_cache(maxsize=64)
def schedule_points(graph: Graph) -> tuple[tuple[int, str | None, int, str | None, tuple[str, ...]], ...]:
    """The points of the schedule at which peak memory is taken, in order, each
    ``(unit, loop, position, op, live)``: a top-level op at unit ``i`` is ``(i, None, i, op,
    live)``; a scan at unit ``i`` gives one point per position ``j`` of its body, ``(i, loop,
    j, body op, live)`` (one ``(i, loop, 0, None, live)`` if its body is empty); ``live``: the
    tensors live there (:func:`lifetimes` at ``i``, plus :func:`body_lifetimes` at ``j``).
    ``memory.peak_memory`` (where outputs are allocated for the whole call) and the search's
    live sets (``search/liveness.py``) both walk these (one enumeration)."""
    units, alloc, free = lifetimes(graph)
    out: list[tuple[int, str | None, int, str | None, tuple[str, ...]]] = []
    for i, u in enumerate(units):
        live = tuple(n for n in alloc if alloc[n] <= i <= free[n])
        if not isinstance(u, Loop):
            out.append((i, None, i, u, live))
            continue
        if not u.body:
            out.append((i, u.name, 0, None, live))
            continue
        order, last = body_lifetimes(graph, u)
        for j, op in enumerate(u.body):
            out.append((i, u.name, j, op, live + tuple(n for n in u.body if order[n] <= j <= last[n])))
    return tuple(out)


def _breadth_first_view(graph: Graph) -> bool:
    """Whether ``graph`` is a view in XLA:CPU's breadth-first order (``order.breadth_first``)."""
    return getattr(graph, "breadth_first_of", None) is not None


def _reads_a_reduction(graph: Graph, op) -> bool:
    """Whether element-wise ``op`` is computed from a reduction's result through element-wise ops
    alone (a norm's output, read through its row statistics: XLA:GPU computes it in the fusion of
    its reductions, which no GEMM takes in)."""
    stack, seen = list(op.inputs), set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        src = graph.op(n)
        if reduction(src):
            return True
        if src.kind == "elementwise":
            stack.extend(src.inputs)
    return False


def _memory_scheduler_view(graph: Graph) -> bool:
    """Whether ``graph`` is a view in XLA:GPU's memory scheduler's order (``order.min_memory``)."""
    return getattr(graph, "min_memory_of", None) is not None


@lru_cache(maxsize=64)
def gemm_prologues(graph: Graph) -> frozenset[str]:
    """The element-wise ops XLA:GPU computes inside each contraction that reads them, never
    written: a cheap (not :func:`~autolayout.fusion.expensive`), duplicable
    (:func:`~autolayout.fusion.duplicable`) materialised op, not a graph output, every consumer of
    which is a contraction of its computation (a ReLU read by the forward matmul and the weight
    gradient). XLA:GPU fuses such a producer into the Triton GEMM fusion of each dot reading it
    (a GEMM prologue), which recomputes it from the op's sources, so those live to its last
    reader; where the autotuner runs a dot on cuBLAS instead, a loop fusion of its own computes it
    right before the call, a buffer live at that call only, which this leaves out (which dots go to
    cuBLAS is the autotuner's choice). Measured in ``reports/gpu``'s compiled HLO
    (``tests/test_lifetimes.py``): every fusion computing the ReLU of the MLP and MoE steps is a
    Triton GEMM fusion (mlp-small's ``gemm_fusion_dot_general.7`` reads the bias add) or a loop
    fusion read by one cuBLAS call (``fusion.16``, ``fusion.55``). Not a dtype conversion, which
    XLA:GPU writes once (``wrapped_convert`` of a weight, read by a cuBLAS call and a Triton GEMM),
    nor an op computed from a reduction's result through element-wise ops (a norm's output, which
    it computes in its reductions' fusion: gpt-tiny's ``fusion.316``, read by two matmuls). Applied
    on XLA:GPU's view only (:func:`readers_of`, :func:`lifetimes`, :func:`body_lifetimes`,
    ``order.min_memory``'s instructions): XLA:CPU writes the ReLU for its dots (``broadcast_maximum_fusion``)."""
    outputs = {s.tensor for s in graph.outputs if s.tensor}
    out = set()
    for op in graph.ops():
        if (op.kind != "elementwise" or not op.materialised or op.name in outputs or expensive(op)
                or not duplicable(op) or op.fn == "convert_element_type" or _reads_a_reduction(graph, op)):
            continue
        users = [graph.op(c) for c in graph.consumers(op.name)]
        if users and all(u.kind == "einsum" and len(u.inputs) == 2 and u.loop == op.loop for u in users):
            out.add(op.name)
    return frozenset(out)


def readers_of(graph: Graph) -> dict[str, tuple[str, ...]]:
    """For every tensor, the ops that read it from memory: its consumers, a fused
    consumer (an element-wise op whose output ``Op.hbm`` keeps out of memory) replaced by
    the ops it is fused into. A scan's slice of a stacked input that a reduction reads
    (``Op.reduction_shared``: XLA:CPU writes it for a YNNPACK reduction, which does not take
    the ``dynamic-slice`` in) is read from memory by its reductions only: XLA's other fusions
    take the ``dynamic-slice`` in and read the stacked input, so the slice's buffer is free after
    its last reduction (``tests/test_recomputed.py``, against the optimized HLO)."""
    out: dict[str, tuple[str, ...]] = {}
    prologues = gemm_prologues(graph) if _memory_scheduler_view(graph) else frozenset()

    def of(name: str) -> tuple[str, ...]:
        hit = out.get(name)
        if hit is None:
            acc: list[str] = []
            for c in graph.consumers(name):
                op = graph.op(c)
                if not op.materialised or c in prologues:
                    acc.extend(of(c))
                else:
                    acc.append(c)
            hit = out[name] = tuple(dict.fromkeys(acc))
        return hit

    for name in graph.order:
        of(name)
    for name in graph.order:  # a scan's slice written for its reductions: the others slice the stack (docstring)
        op = graph.op(name)
        if op.kind == "reshape" and op.reduction_shared:
            out[name] = tuple(r for r in out[name] if reduction(graph.op(r)))
    return out


def in_place_operand(graph: Graph, name: str, readers: Mapping[str, tuple[str, ...]]) -> str | None:
    """The operand whose buffer element-wise op ``name`` may write its result into: a
    materialised tensor it reads (directly or through fused element-wise ops) with the same
    dims and dtype, not an argument or output (XLA never overwrites those unless donated), in
    the output's order or in another one XLA computes the op in (:func:`_same_buffer`).
    Whether that read is the operand's last is the caller's check.

    Two rules of XLA:CPU, applied in its order (the breadth-first view). Not a scan body's slice
    of a stacked input: an element-wise fusion takes the ``dynamic-slice`` in and reads the
    stacked input (:func:`~autolayout.fusion.with_fusion`), not the slice's buffer, which XLA
    writes only for other readers such as a dot (``dynamic-slice_bitcast_fusion``), so the op
    cannot write over it (``remat=dots``'s ReLU backward select of the saved pre-activation's
    mask: ``select_bitcast_fusion`` reads the loop state, at an offset of its own;
    ``tests/test_reshapes.py``).

    And not an operand XLA computes in another shape than the op
    (:func:`~autolayout.costmodel.reshapes.hlo_groups`: a contraction's collapsed
    result the op reads through a bitcast): the op's fusion reads that operand through a bitcast,
    which is not an element-wise use of it, so XLA shares no buffer
    (``HloDataflowAnalysis::CanShareOperandBufferWithUser``; the SwiGLU product
    ``silu(gate) * up`` of two dots is a ``multiply_bitcast_fusion`` with a buffer of its own;
    ``tests/test_reshapes.py``, against ``memory_analysis()``). Neither is applied on other orders
    (applied to XLA:GPU's, the first moves no step of ``reports/gpu`` and the second one, llama-1b,
    0.960 -> 0.965; the TPU anchors measure no memory).

    One rule of XLA:GPU, applied in its memory scheduler's order (``order.min_memory``'s view):
    not where a reduction reads the op. XLA:GPU's multi-output fusion takes an element-wise
    producer into the reduction reading it and writes the producer's value as a second output of
    that ``kInput`` fusion (the ReLU's backward select with the bias gradient's sum over the batch:
    ``input_reduce_select_fusion``); the operand's uses in the fusion then reach the reduce, which
    is not element-wise, so XLA shares no buffer (``CanShareOperandBufferWithUser``: a loop or
    input fusion shares an operand only where ``AreTransitiveUsesElementwiseOrTuple``). Measured in
    the H200 buffer assignments of ``reports/gpu``: the select and the gradient it reads last are
    both live at the fusion, at offsets of their own (``tests/test_lifetimes.py``); the four
    large-MLP steps go from 0.72-0.91 to 0.84-1.00 of ``memory_analysis``. XLA:CPU runs such a
    reduce as a YNNPACK fusion, which takes no ``select`` in (``costmodel/recomputed.py``), and
    writes the select over the gradient."""
    op = graph.op(name)
    if op.kind != "elementwise" or not op.materialised:
        return None
    if _memory_scheduler_view(graph) and (any(reduction(graph.op(r)) for r in readers[name])
                                          or name in gemm_prologues(graph)):
        return None  # written apart by XLA:GPU's multi-output fusion with the reduction, or not at all
    outputs = {s.tensor for s in graph.outputs if s.tensor}
    seen: set[str] = set()
    sources: list[str] = []  # the materialised tensors the op reads
    stack = list(op.inputs)
    while stack:
        n = stack.pop(0)
        if n in seen:
            continue
        seen.add(n)
        src = graph.op(n)
        if not src.materialised and src.kind == "elementwise":
            stack.extend(src.inputs)  # fused into this op: read its operands
            continue
        sources.append(n)
    cpu = _breadth_first_view(graph)  # XLA:CPU's order: the two rules measured there (docstring)
    groups = hlo_groups(graph) if cpu else None
    for n in sources:
        t = graph.tensor(n)
        sliced = graph.op(n).kind == "reshape" and graph.op(n).fn == "slice"
        if cpu and (sliced or set(groups[n]) != set(groups[name])):
            continue  # a scan's slice (the fusion reads the stacked input), or read through a bitcast
        if (t.role not in ("input", "param", "opt_state") and n not in outputs and name in readers[n]
                and t.dtype == op.output.dtype and _same_buffer(graph, n, name, sources, readers)):
            return n
    return None


def _same_buffer(graph: Graph, src: str, name: str, sources: list[str], readers: Mapping[str, tuple[str, ...]]
                 ) -> bool:
    """Whether element-wise ``name`` can write over its operand ``src``: the same dims in the same
    order, or in another order where every op reading ``name`` is a contraction and every other
    operand of the same dims is in ``src``'s order. XLA's layout assignment then computes the op
    in its operands' layout and leaves the transpose to the dots reading it (dot dimension
    numbers), so the buffer is shared (XLA:CPU's optimized HLO of the zoo moe: the expert ReLU,
    ``max`` of the transposed ``w1`` contraction, is ``broadcast_maximum_fusion`` in ``dot``'s
    order, in place); where operands disagree one is transposed in the op, a copy fusion with a
    buffer of its own (the ReLU's backward mask of two contractions in different orders), and an
    op read by other ops keeps its order (llama's causal-mask ``select`` of the transposed scores,
    read by the softmax's reductions)."""
    shape, out = graph.tensor(src).shape, graph.op(name).output.shape
    if tuple(shape) == tuple(out):
        return True
    dims = sorted(shape, key=str)
    if dims != sorted(out, key=str) or not readers.get(name):
        return False
    if any(graph.op(u).kind != "einsum" for u in readers[name]):
        return False
    return all(tuple(graph.tensor(m).shape) == tuple(shape) for m in sources
               if m != src and sorted(graph.tensor(m).shape, key=str) == dims)


def body_lifetimes(graph: Graph, lp: Loop) -> tuple[dict[str, int], dict[str, int]]:
    """Position in the body and last live position of each body tensor (carried values
    and values read outside the body live for the whole iteration; element-wise ops write
    over an operand read for the last time, as at the top level). In XLA:CPU's breadth-first
    order (``graph`` a view of ``costmodel.order.breadth_first``) a value the scan stacks
    (``Loop.stacks``) is written into its stack by a ``dynamic-update-slice`` queued as soon as
    the value is ready, so its own buffer lives to its last reader in the body; in a sequential
    order the body's outputs are written at its end (``tests/test_order.py``, against the while
    body of the optimized HLO and its ``memory_analysis()``)."""
    order = {n: i for i, n in enumerate(lp.body)}
    end = len(lp.body)
    carried = {c for c, _ in lp.carries} | {n for _, n in lp.carries}
    readers = readers_of(graph)
    stacks = set(lp.stacks) if _breadth_first_view(graph) else set()
    last = {}
    for n in lp.body:
        users = [order[c] for c in readers[n] if c in order]
        outside = any(c not in order and c not in stacks for c in readers[n])
        last[n] = end if (n in carried or outside) else max(users, default=order[n])
    if _memory_scheduler_view(graph):  # computed inside each contraction reading it (gemm_prologues)
        for n in gemm_prologues(graph):
            if n in order and n not in carried:
                last[n] = order[n] - 1
    for n in lp.body:
        src = in_place_operand(graph, n, readers)
        if src in order and last[src] == order[n] and order[src] < order[n]:
            last[src] = order[n] - 1
    for c, _ in lp.carries:
        for n in loop_state_chain(graph, lp, c, readers):
            last[n] = order[n] - 1  # written into the loop state's buffer, which the carry counts
    return order, last


def loop_state_chain(graph: Graph, lp: Loop, carry: str,
                     readers: Mapping[str, tuple[str, ...]] | None = None) -> list[str]:
    """The body's values that XLA writes into the buffer of the loop state ``carry``: an
    element-wise op that reads the carried value for the last time writes its result over it
    (:func:`in_place_operand`, as anywhere else), and so on down the chain, typically to the
    next carried value (a residual stream: ``x + attn`` then ``+ mlp``). The carry counts that
    buffer for the whole iteration (the loop state is one buffer: module docstring), so these
    values take none of their own. Measured in XLA:CPU's buffer assignment of the
    ``transformer_lm`` forward scan: the loop state, both residual adds and the initial value
    share one allocation and offset (``wide.param{1}``, ``wrapped_add.1``, ``wrapped_add.2``;
    ``benchmarks/xla_live.py``). A value also read outside the body other than by the scan's
    result (stacked for the backward pass) ends the chain."""
    readers = readers_of(graph) if readers is None else readers
    order = {n: i for i, n in enumerate(lp.body)}
    finals = {r for r, _ in lp.results}  # the scan's result reads the loop state after the loop
    chain: list[str] = []
    cur = carry
    while True:
        users = [order[r] for r in readers[cur] if r in order]
        if not users:
            return chain
        nxt = lp.body[max(users)]
        if (in_place_operand(graph, nxt, readers) != cur or order[nxt] <= order[cur]
                or any(r not in order and r not in finals for r in readers[nxt])):
            return chain
        chain.append(nxt)
        cur = nxt
