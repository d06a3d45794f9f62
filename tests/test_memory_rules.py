"""The memory rules of XLA:CPU the cost model follows (costmodel/memory.py), each checked against an
independent reference: XLA's own ``memory_analysis()`` and optimized HLO of a small shard_map
program (the compiler property itself), a hand calculation of the model's figure, and the search's
live sets against ``predict`` on the profile that has the rules on.

* gradient reductions together (``Hardware.combines_gradient_reductions``): XLA:CPU combines
  independent all-reduces into one (``CpuAllReduceCombiner``, no byte threshold), so every
  gradient's partial sums are live at once;
* the reduce-scatter relayout copy (``Hardware.reduce_scatter_copies``): scattering a dim that is
  not the operand's most major one first copies the operand into that layout;
* dot operand copies (``Hardware.dot_operand_copies``): an operand the dot cannot read in place is
  copied, and the copy is live beside the original where the original outlives it
  (``copies.copy_transient_bytes``), from the operand's producer to the dot for a value computed in
  the step, one copy for the dots that read the same order (``copies.copy_spans``).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from autolayout import models, predict
from autolayout.core import Layout, Mesh
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.profiles import get_hardware, known_hardware
from autolayout.costmodel.gradients import SCATTERED, combined_reductions
from autolayout.costmodel.order import memory_order
from autolayout.costmodel.copies import copy_spans, copy_transient_bytes
from autolayout.costmodel.lifetimes import lifetimes
from autolayout.costmodel.plan import plan
from autolayout.costmodel.reductions import reduction_bytes
from autolayout.costmodel.rules import op_cost, price
from autolayout.search import enumerate_layouts
from autolayout.search.liveness import peak_of
from autolayout.search.names import is_copy, is_gathered, is_held
from autolayout.search.solver import search_points
from autolayout.search.warm import sizes_of
from autolayout.search.tables import Tables
from autolayout.search.wus import wus_options
from storage_variants import storage_variants

F32 = 4
IO, HIDDEN, BATCH = 128, 256, 64  # the mlp below: w [io, hidden], v [hidden, io], bias [hidden]
MESH = "data:2,model:4"
CPU = get_hardware("cpu")
NEITHER = CPU.replace(combines_gradient_reductions=False, reduce_scatter_copies=False)


def _xla(fn, *shapes):
    """(optimized HLO text, memory_analysis temp bytes) of ``fn`` under shard_map over 8 devices,
    every input split on its first dim."""
    mesh = jax.make_mesh((8,), ("d",))
    args = [jax.device_put(jnp.ones(s, jnp.float32), NamedSharding(mesh, P("d"))) for s in shapes]
    return jax.jit(fn(mesh)).lower(*args).compile()


def _mlp():
    return models.mlp(batch=BATCH, d_io=IO, d_hidden=HIDDEN)


# ----------------------------------------------------------------- XLA:CPU, the compiler property
def test_xla_cpu_combines_independent_all_reduces_so_both_partials_are_live():
    """Two independent psums of [128, 256] partial sums compile to one all-reduce of both, and the
    heap holds both partial sums (2 x 128 KiB); one psum alone holds one."""
    def step(n):
        def body(x, a, b):
            return tuple(jax.lax.psum(x.T @ w, "d") for w in (a, b)[:n])
        return lambda mesh: jax.shard_map(body, mesh=mesh, in_specs=(P("d"),) * 3, out_specs=(P(),) * n)

    two = _xla(step(2), (64, 128), (64, 256), (64, 256))
    ars = [line for line in two.as_text().splitlines() if " all-reduce(" in line]
    assert len(ars) == 1 and "all-reduce(%" in ars[0] and ars[0].count("f32[128,256]") == 2, ars
    assert two.memory_analysis().temp_size_in_bytes == 2 * 128 * 256 * F32
    one = _xla(step(1), (64, 128), (64, 256), (64, 256))
    assert one.memory_analysis().temp_size_in_bytes == 128 * 256 * F32


@pytest.mark.parametrize("dim", [0, 1])
def test_xla_cpu_reduce_scatter_of_a_minor_dim_copies_its_operand(dim):
    """psum_scatter of a [128, 256] partial sum: along dim 0 (most major) it is scattered in place
    of layout; along dim 1 XLA first copies it to layout {0,1}, a second full-size buffer."""
    def fn(mesh):
        def body(x, a):
            return jax.lax.psum_scatter(x.T @ a, "d", scatter_dimension=dim, tiled=True)
        return jax.shard_map(body, mesh=mesh, in_specs=(P("d"),) * 2, out_specs=P(*([None] * dim), "d"))

    c = _xla(fn, (64, 128), (64, 256))
    copies = [line for line in c.as_text().splitlines() if "{0,1} copy(" in line]
    assert bool(copies) == (dim == 1), copies
    assert c.memory_analysis().temp_size_in_bytes == (1 + dim) * 128 * 256 * F32


# ------------------------------------------------------------------ the model's figure by hand
COPY_B, COPY_E, COPY_D = 64, 4, 32  # h = tanh(x) [b, e, d] read by bed,edf->ebf: batch e not leading


def _copy_fn(outlives: bool):
    """h = tanh(x) [64, 4, 32] f32 (32 KiB) read by a dot that needs it as [e, b, d] (a copy);
    ``outlives``: h is read again after the dot, else the dot is its only reader."""
    def fn(x, w):
        h = jnp.tanh(x)
        y = jnp.einsum("bed,edf->ebf", h, w)
        return jnp.sum((h if outlives else x) * jnp.sum(y))
    return fn


def _copy_args():
    return jnp.ones((COPY_B, COPY_E, COPY_D), jnp.float32), jnp.ones((COPY_E, COPY_D, COPY_D), jnp.float32)


@pytest.mark.parametrize("outlives,temp", [(True, 2), (False, 1)])
def test_xla_cpu_dot_operand_copy_is_live_beside_an_original_that_outlives_the_dot(outlives, temp):
    """XLA:CPU copies h into [e, b, d] for the dot (transpose_copy_fusion); the temp heap holds the
    copy and h (2 x 32 KiB) where h is read after the dot, the copy alone where the dot is h's only
    reader (the copy takes h's place: XLA fuses tanh into it)."""
    c = jax.jit(_copy_fn(outlives)).lower(*_copy_args()).compile()
    assert "transpose_copy_fusion" in c.as_text() or " copy(" in c.as_text()
    assert c.memory_analysis().temp_size_in_bytes == temp * COPY_B * COPY_E * COPY_D * F32


@pytest.mark.parametrize("outlives", [True, False])
def test_dot_operand_copy_held_at_the_dot_by_hand(outlives):
    """The model's figure for the same functions: the dot holds the 32 KiB copy of h beside h where
    h outlives it, nothing where the copy takes h's place; w is read in place; off where
    ``dot_operand_copies`` is off."""
    from autolayout import trace
    g = trace(_copy_fn(outlives), *_copy_args())
    (dot,) = [op for op in g.ops() if op.kind == "einsum" and len(op.inputs) == 2]
    one = Mesh.parse("data:1")
    oc = op_cost(dot, {}, one, CPU)
    assert oc.operand_copy_bytes == (COPY_B * COPY_E * COPY_D * F32, 0)
    # h is computed in the step: its copy is live from h's producer to the dot (copy_spans), not
    # added at the dot; where the dot is h's only reader the copy takes h's place (no span)
    assert copy_transient_bytes(g, dot.name, oc.operand_copy_bytes) == 0
    at = g.schedule.index
    assert copy_spans(g) == ({None: ((dot.name, 0, at("tanh_0"), at(dot.name)),)} if outlives else {})
    assert op_cost(dot, {}, one, CPU.replace(dot_operand_copies=False)).operand_copy_bytes == ()
    with_copy = predict(g, "data:1", "", hardware=CPU).memory_bytes
    without = predict(g, "data:1", "", hardware=CPU.replace(dot_operand_copies=False)).memory_bytes
    if outlives:  # at the dot: x, h, its copy and y (32 KiB each), w (16 KiB) and the f32[] output's
        # allocation, not yet written there (XLA allocates it for the whole call: costmodel/outputs.py)
        assert with_copy == 4 * COPY_B * COPY_E * COPY_D * F32 + COPY_E * COPY_D * COPY_D * F32 + F32 > without
    else:
        assert with_copy == without


def _two_dots_fn(second: str):
    """h = tanh(x) [64, 4, 32] (32 KiB) read by the dot of ``_copy_fn`` (as [e, b, d]), by a second
    dot reading it in the ``"same"`` order ([e, b, d]) or in an ``"other"`` one ([b, d, e]), and
    once more after both."""
    def fn(x, w, v):
        h = jnp.tanh(x)
        y1 = jnp.einsum("bed,edf->ebf", h, w)
        y2 = (jnp.einsum("bed,edf->ebf", h, v) if second == "same" else
              jnp.einsum("bed,ef->bdf", h, v[:, 0, :]))
        return jnp.sum(h * (jnp.sum(y1) + jnp.sum(y2)))
    return fn


def _two_dots_args():
    return _copy_args() + (jnp.ones((COPY_E, COPY_D, COPY_D), jnp.float32),)


@pytest.mark.parametrize("second,copies", [("same", 1), ("other", 2)])
def test_xla_cpu_dots_reading_one_order_share_one_copy(second, copies):
    """XLA:CPU makes one copy of h for two dots that read it in the same order (CSE: one
    transpose_copy_fusion; temp: h and the copy, 2 x 32 KiB, + 4 B) and one per order otherwise
    (temp: h and two copies, 3 x 32 KiB, + the 512 B slice of v)."""
    c = jax.jit(_two_dots_fn(second)).lower(*_two_dots_args()).compile()
    fusions = [ln for ln in c.as_text().splitlines() if ln.lstrip().startswith("%transpose_copy_fusion")]
    assert len(fusions) == copies, fusions
    h = COPY_B * COPY_E * COPY_D * F32
    assert c.memory_analysis().temp_size_in_bytes == (1 + copies) * h + (4 if second == "same" else 512)


@pytest.mark.parametrize("second", ["same", "other"])
def test_dots_reading_one_order_share_one_copy_by_hand(second):
    """The model's copies for the same functions (copy_spans): one, from h's producer to the later
    of two dots reading the same order; one per dot for two orders, each to its own dot. Its peak,
    at the second dot: x, h, y1 (read after), y2 and the copies live there (32 KiB each; y2 is
    [b, d, f], 256 KiB, for the other order, beside v's 512 B slice) and w, v (16 KiB each)."""
    from autolayout import trace
    g = trace(_two_dots_fn(second), *_two_dots_args())
    at = g.schedule.index
    dots = [op.name for op in g.ops() if op.kind == "einsum" and len(op.inputs) == 2]
    h, wv = COPY_B * COPY_E * COPY_D * F32, 2 * COPY_E * COPY_D * COPY_D * F32
    peak = predict(g, "data:1", "", hardware=CPU).memory_bytes
    if second == "same":
        assert copy_spans(g) == {None: ((dots[1], 0, at("tanh_0"), at(dots[1])),)}
        assert peak == wv + 5 * h + 4  # x, h, y1, y2, the copy; the loss's 4 B output, allocated for the whole call
    else:
        assert copy_spans(g) == {None: tuple((d, 0, at("tanh_0"), at(d)) for d in dots)}
        assert peak == wv + 4 * h + 8 * h + COPY_E * COPY_D * F32 + 4  # x, h, y1, copy; y2; slice; the loss


def _scaled_fn(two: bool):
    """u = x @ m [64, 4, 32] (a contraction's result, 32 KiB), d = 2 u read by two dots: both as
    [e, b, d] (one copy), or one as [e, b, d] and one in place (``two`` orders)."""
    def fn(x, m, w, v):
        u = jnp.einsum("bed,dk->bek", x, m)
        d = u * 2.0
        y1 = jnp.einsum("bed,edf->ebf", d, w)
        y2 = jnp.einsum("bed,df->bef", d, v[0]) if two else jnp.einsum("bed,edf->ebf", d, v)
        return jnp.sum(y1) + jnp.sum(y2)
    return fn


def _scaled_args():
    return (jnp.ones((COPY_B, COPY_E, COPY_D), jnp.float32), jnp.ones((COPY_D, COPY_D), jnp.float32),
            jnp.ones((COPY_E, COPY_D, COPY_D), jnp.float32), jnp.ones((COPY_E, COPY_D, COPY_D), jnp.float32))


@pytest.mark.parametrize("two", [False, True])
def test_a_value_read_in_two_orders_keeps_its_operand(two):
    """XLA:CPU computes the copy of d with a second fusion of 2 u (transpose_copy_fusion reads u),
    so with two orders u, d and the copy are live at once (temp 3 x 32 KiB + v's 4 KiB slice);
    with one, d exists only as its copy (u and the copy: 2 x 32 KiB). The model: d takes over u's
    buffer (lifetimes.in_place_operand); with two orders it holds the copy from d's producer to its
    dot and one more buffer of the copy's bytes at d's producer (u, which the copy reads)."""
    c = jax.jit(_scaled_fn(two)).lower(*_scaled_args()).compile()
    h = COPY_B * COPY_E * COPY_D * F32
    assert c.memory_analysis().temp_size_in_bytes == (3 * h + COPY_D * COPY_D * F32 if two else 2 * h)
    from autolayout import trace
    g = trace(_scaled_fn(two), *_scaled_args())
    _, alloc, free = lifetimes(g)
    u, d = "dot_general_0", "mul_0"
    assert g.op(d).inputs == (u,)
    assert free[u] == alloc[u] == alloc[d] - 1  # d's buffer is u's
    dot = g.schedule.index("dot_general_1")
    assert copy_spans(g) == ({None: (("dot_general_1", 0, alloc[d], alloc[d]), ("dot_general_1", 0, alloc[d], dot))}
                             if two else {})


def test_gradient_reducing_ops_and_where_they_are_reduced_together():
    g = _mlp()
    at, ops = combined_reductions(g)[None]
    assert set(ops) == {"grad/w", "grad/v", "reduce_sum_0"}  # reduce_sum_0: bias's batch sum
    assert g.schedule[at] == "grad/w"  # the last of them in the schedule
    assert combined_reductions(models.mlp(batch=BATCH, d_io=IO, d_hidden=HIDDEN, train=False)) == {}


def test_data_parallel_peak_holds_every_gradient_twice_by_hand():
    """batch over all 8 devices: at the combined all-reduce every gradient is there as partial
    sums and as the reduced result (w, v: 128 KiB each, bias 1 KiB), beside the parameters. The
    bias's reduced result is the batch sum the all-reduce reduces (an activation): ``grad/bias``
    reads it only after the combined all-reduce (``costmodel.order``: the ops that read a gradient
    reduction wait for the one instruction that reduces them all)."""
    full = (2 * IO * HIDDEN + HIDDEN) * F32
    bias = HIDDEN * F32
    c = predict(_mlp(), MESH, "batch:data,model", hardware=CPU)
    assert c.memory["params"] == full
    assert c.memory["grads"] == full - bias
    assert c.memory["transient"] == full  # partial sums of all three, live together
    assert c.memory_bytes == 3 * full - bias + c.memory["activations"]
    one = predict(_mlp(), MESH, "batch:data,model", hardware=NEITHER)
    assert one.memory["transient"] == IO * HIDDEN * F32  # one gradient's partial sums at a time


def test_zero3_peak_adds_one_relayout_copy_by_hand():
    """ZeRO-3 over all 8 devices: the reduce-scatters of grad/w [hidden, io] (w is stored split
    on io) and grad/v [io, hidden] (v split on hidden) scatter a minor dim. No gradient is
    all-reduced, so each reduce-scatter is an instruction of XLA's first-in first-out order
    (costmodel.order, the scattered order), queued after its op: those of grad/v, the bias's sum
    and grad/w run after the ops queued before them, to the input gradient's dot out/1, which reads
    w all-gathered (sharing.shared_reads) and frees it, in that sequence. At grad/w's, the last,
    the model holds grad/v's relayout copy (copied, not yet reduce-scattered) and grad/w's partial
    sums with their copy: 3 x 128 KiB, as XLA's buffer assignment does (3 x 128 KiB live at its
    peak; tests/test_memory_xla.py's mlp-train ZeRO-3 row)."""
    view = memory_order(_mlp(), CPU, reduction=SCATTERED)
    assert {o: view.collective_after[o] for o in ("grad/v", "reduce_sum_0", "grad/w")} == dict.fromkeys(
        ("grad/v", "reduce_sum_0", "grad/w"), "out/1")
    c = predict(_mlp(), MESH, "batch:data,model|*:data,model@3", hardware=CPU)
    assert c.memory["transient"] == 3 * IO * HIDDEN * F32
    only_copy = predict(_mlp(), MESH, "batch:data,model|*:data,model@3",
                        hardware=NEITHER.replace(reduce_scatter_copies=True))
    # at grad/v: its partial sums and their copy beside w gathered; v's second reader, the input
    # gradient's dy @ v^T, reads only step arguments, so the breadth-first order (costmodel.order)
    # runs it at the step's start, and v's gathered copy is freed before grad/v
    assert only_copy.memory["transient"] == 3 * IO * HIDDEN * F32


def test_a_reduce_scatters_relayout_copy_is_held_with_its_collective_not_its_contraction():
    """grad/w [hidden, io] of the mlp's ZeRO-3 step, reduce-scattered over io (a minor dim) on all 8
    devices: its dot writes the full partial sums (128 KiB); the relayout copy (128 KiB more) is an
    instruction of its own after the dot (test_memory_phases.py's XLA check), so the op's
    contraction holds the partial sums alone, its collective both."""
    g, mesh = _mlp(), Mesh.parse(MESH)
    p = plan(g, mesh, Layout.parse("batch:data,model|*:data,model@3"))
    oc = price(p.ops["grad/w"], g.op("grad/w"), mesh, CPU)
    assert oc.partial_bytes == oc.transient_bytes == 2 * IO * HIDDEN * F32
    assert oc.contraction_bytes == IO * HIDDEN * F32
    off = price(p.ops["grad/w"], g.op("grad/w"), mesh, CPU.replace(reduce_scatter_copies=False))
    assert off.partial_bytes == off.contraction_bytes == IO * HIDDEN * F32
    # the parts of one evaluation (reductions.reduction_bytes): a reduce-scatter is no member of the
    # combined all-reduce, so nothing is held for it
    rb = reduction_bytes(p.ops["grad/w"], g.op("grad/w"), mesh, CPU)
    assert (rb.converted, rb.sums, rb.relayout, rb.held) == (0, IO * HIDDEN * F32, IO * HIDDEN * F32, 0)
    assert oc.held_bytes == rb.held
    # all-reduced (the gradient stored whole): the partial sums, without a copy, held for the combined
    # all-reduce, on a backend that combines the gradients' all-reduces only
    whole = plan(g, mesh, Layout.parse("batch:data,model"))
    rb = reduction_bytes(whole.ops["grad/w"], g.op("grad/w"), mesh, CPU)
    assert (rb.sums, rb.relayout, rb.held) == (IO * HIDDEN * F32, 0, IO * HIDDEN * F32)
    assert reduction_bytes(whole.ops["grad/w"], g.op("grad/w"), mesh,
                           CPU.replace(combines_gradient_reductions=False)).held == 0


def test_rules_are_off_on_accelerator_profiles_and_round_trip():
    for name in known_hardware():
        hw = get_hardware(name)
        assert (hw.combines_gradient_reductions == hw.reduce_scatter_copies == hw.breadth_first_schedule
                == (name == "cpu")), name
    back = Hardware.from_dict(CPU.to_dict())
    assert back.combines_gradient_reductions and back.reduce_scatter_copies and back.breadth_first_schedule


# ------------------------------------------------------------ the search prices it like predict
CASES = [("mlp", "rows:2,cols:4"), ("transformer", "rows:2,cols:2")]


def _graph(name):
    if name == "mlp":
        return models.mlp(batch=64, d_io=32, d_hidden=64)
    return models.transformer_lm(d_model=16, d_ff=32, heads=2, d_kv=8, n_layers=2, vocab=32, batch=4, length=8)


@pytest.mark.parametrize("name, mesh", CASES, ids=["-".join(c) for c in CASES])
def test_search_live_sets_reproduce_predict_memory_on_cpu(name, mesh):
    """The search's live sets (held bytes at the combined reduction included) sum to predict's
    peak on the cpu profile, for layouts of the enumeration and with storage sharded at each
    ZeRO stage (whose reduce-scatters take the relayout copy)."""
    g, mesh = _graph(name), Mesh.parse(mesh)
    tables = Tables(g, mesh, CPU)
    wus, _ = wus_options(tables)
    points = search_points(tables)
    assert any(is_held(n) for p in points for n in p)
    layouts = list(enumerate_layouts(g, mesh))
    checked = changed = copied = gathered = 0
    for lay in layouts[:: max(1, len(layouts) // 10)] + [Layout.coerce("batch:rows,cols")]:  # + data parallel
        for lw, point in storage_variants(tables, wus, lay):
            sizes = sizes_of(tables, wus, point)
            changed += any(sizes[n] for n in sizes if is_held(n))
            copied += any(sizes[n] for n in sizes if is_copy(n))
            gathered += any(sizes[n] for n in sizes if is_gathered(n))
            assert peak_of(points, sizes)[0] == predict(g, mesh, lw, hardware=CPU).memory_bytes, str(lw)
            checked += bool(point.wus)
    assert checked and changed  # held bytes are in play on some of the layouts compared
    # and all-gathers shared by a weight's forward and backward readers of one computation
    # (sharing.shared_reads): the mlp's v, the transformer's final norm scale and output projection
    assert gathered
    # dot operand copies live before their dot (copies.copy_spans) too, in the transformer's scans
    assert bool(copied) == (name == "transformer") == any(is_copy(n) for p in points for n in p)


# ------------------------------------------------------------------------- scan loop state
def test_scan_state_is_one_buffer_by_hand():
    """A scan's carry is one buffer (XLA's while aliases operand, body parameter, root and
    result): the final carry takes memory from its own unit after the loop, and an initial
    value the scan reads last is freed before the scan."""
    from autolayout.costmodel.lifetimes import lifetimes
    from autolayout.graph import Loop

    g = models.transformer_lm(d_model=16, d_ff=32, heads=2, d_kv=8, n_layers=2, vocab=32, batch=4, length=8,
                              train=False)
    units, alloc, free = lifetimes(g)
    (i, lp), = [(i, u) for i, u in enumerate(units) if isinstance(u, Loop)]
    (carry, _), = lp.carries
    (result, _), = lp.results
    init, = g.op(carry).inputs
    assert units[i + 1] == result and alloc[result] == i + 1
    assert free[init] == i - 1 and alloc[init] < i


def test_replicated_program_allocates_what_the_traced_function_does():
    """Layout unsplit: the shard_map program the layout lowers to needs exactly the memory XLA
    gives jax.jit of the traced function itself (a literal operand, here the -inf of a causal
    mask inside the layer scan, is broadcast in the program, not closed over as a full-size
    constant that XLA would keep for the whole loop)."""
    from autolayout import execute

    g = models.llama(d_model=32, heads=4, kv_heads=2, d_kv=8, d_ff=64, n_layers=2, vocab=64, batch=4, length=16,
                     train=False)
    args = models.example_args(g)
    fast = {"xla_backend_optimization_level": 0}
    ex = execute(g, MESH, "", args=args, repeats=1, reference=False, compiler_options=fast)
    ref = jax.jit(g.evaluate).lower(*args).compile(compiler_options=fast).memory_analysis()
    assert ex.xla_memory["temp"] == ref.temp_size_in_bytes
    assert ex.xla_memory["argument"] == ref.argument_size_in_bytes


def test_residual_stream_is_written_into_the_loop_state():
    """XLA writes a scan body's residual adds (element-wise ops chained in place over the carried
    value, ending in the next carry) into the loop state's buffer (one allocation and offset in its
    buffer assignment), so they take no memory of their own (lifetimes.loop_state_chain). Against
    XLA's peak of live bytes (benchmarks/xla_live.py, from the compiled program's buffer
    assignment) with its output allocations idle there (the logits' allocation, not yet written,
    which the model counts too: outputs.unplaced_output_bytes) on the transformer_lm forward scan:
    within 10% (1.045; 1.142 when each residual add counts a buffer of its own)."""
    import sys
    import tempfile
    from pathlib import Path

    from autolayout import execute
    from autolayout.costmodel.lifetimes import body_lifetimes
    from autolayout.graph import Loop

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from xla_live import live_peak

    g = models.transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=128, batch=8, length=32,
                              train=False)
    lp, = [u for u in g.schedule if isinstance(u, Loop)]
    (carry, next_value), = lp.carries
    # the residual stream: the next carry is (x + attention) + mlp, both adds element-wise in place
    residual, = [n for n in g.op(next_value).inputs if g.op(n).fn == "add"]
    assert carry in g.op(residual).inputs and g.op(next_value).fn == "add"
    order, last = body_lifetimes(g, lp)
    assert [n for n in lp.body if last[n] < order[n]] == [residual, next_value]  # no bytes of their own
    with tempfile.TemporaryDirectory() as dump:
        ex = execute(g, MESH, "batch:data;heads:model;d_ff:model", args=models.example_args(g), repeats=1,
                     reference=False, compiler_options={"xla_backend_optimization_level": 0, "xla_dump_to": dump,
                                                        "xla_dump_hlo_as_text": True})
        parts = live_peak(dump)
    live = parts["live_bytes"] + parts["idle_output_bytes"]
    assert abs(ex.predicted.memory_bytes / live - 1) <= 0.10, (ex.predicted.memory_bytes, parts)


def _scheduled_bodies(compiled_hlo: str) -> dict[str, list[str]]:
    """Each ``while`` body of an optimized HLO module: its instructions' texts, in schedule order
    (a scheduled module prints every computation in its sequence's order)."""
    import re

    names = re.findall(r"body=%([\w.\-]+)", compiled_hlo)
    out = {}
    for name in names:
        at = compiled_hlo.index(f"\n%{name} (")
        block = compiled_hlo[at + 1:compiled_hlo.index("\n}", at)]
        out[name] = [line.strip() for line in block.splitlines()[1:] if " = " in line]
    return out


def test_xla_cpu_gathers_a_layers_weights_at_its_body_start_as_the_model_holds_them():
    """XLA:CPU's breadth-first schedule runs the all-gathers of a ZeRO-3 layer's weight slices
    before any contraction of the scan body that reads them (its optimized HLO, in schedule
    order), and the model holds each gathered copy from the body's slice of the stacked weight
    (sharing._ready_at), not from the op that first reads it."""
    import re

    from autolayout.costmodel.sharing import shared_reads
    from autolayout.exec import execute

    g = models.transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=128, batch=8, length=32)
    layout = "batch:data,model|*:data,model@3"
    ex = execute(g, "data:2,model:4", layout, repeats=1, reference=False)
    bodies = _scheduled_bodies(ex.compiled_hlo_text)
    assert len(bodies) == 2  # the forward and the backward scans
    for name, body in bodies.items():
        defined = [line.split(" = ")[0].removeprefix("ROOT ").lstrip("%") for line in body]
        gathers = [i for i, line in enumerate(body) if " all-gather(" in line]
        reads = set(defined[i] for i in gathers)  # the gathered values and what is computed from them
        dots = []
        for i, line in enumerate(body):
            operands = set(re.findall(r"%([\w.\-]+)", line.split(" = ", 1)[1].split("metadata=")[0]))
            if i not in gathers and operands & reads:
                reads.add(defined[i])
                if " dot(" in line or "kind=kCustom" in line:
                    dots.append(i)
        assert len(gathers) >= 6 and dots, (name, len(gathers), len(dots))  # w1, w2, wq, wk, wv, wo
        assert max(gathers) < min(dots), (name, gathers, dots)  # all gathered before any reads one
    spans = shared_reads(g)[1]
    for lp in g.loops.values():
        first_dot = min(i for i, n in enumerate(lp.body) if g.op(n).kind == "einsum")
        weights = [(prov, t, start) for prov, t, start, _ in spans.get(lp.name, ())
                   if g.op(t).fn == "slice" and g.tensor(g.op(t).inputs[0]).role == "param"]
        assert len(weights) >= 6, (lp.name, weights)
        for prov, t, start in weights:
            assert start == lp.body.index(t) + 1 <= first_dot, (lp.name, prov, t, start, first_dot)


def test_xla_cpu_fuses_a_scan_slice_into_element_wise_readers_as_the_model_does():
    """In XLA:CPU's optimized HLO of a scanned training step, the ``dynamic-slice`` that reads one
    iteration of a stacked input is materialised (a fusion whose root is the dynamic-slice) only
    where a dot reads it, or fused with an expensive element-wise op (a divide) that XLA computes
    once, or read by a reduction's fusion (``kind=kCustom``, a YNNPACK fusion); elsewhere it is
    fused into its element-wise readers. The model's rule (``fusion.with_fusion``): a body's
    slice read only by element-wise ops is not materialised unless a reduction takes them in."""
    import re

    from autolayout.exec import execute

    g = models.transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=128, batch=8, length=32)
    ex = execute(g, "data:2,model:4", "batch:data,model", repeats=1, reference=False)
    bodies = _scheduled_bodies(ex.compiled_hlo_text)
    assert len(bodies) == 2
    for name, body in bodies.items():
        defs = {line.split(" = ")[0].removeprefix("ROOT ").lstrip("%"): line for line in body}
        sliced = [d for d in defs if d.startswith("dynamic-slice")]
        assert sliced, name
        for d in sliced:
            users = [defs[u] for u in defs if d in re.findall(r"%([\w.\-]+)", defs[u].split(" = ", 1)[1])]
            read_by_dot = any(" dot(" in u or "kind=kCustom" in u for u in users)
            assert read_by_dot or "divide" in d, (name, d, users)
    def sinks(n: str) -> set[str]:  # the materialised ops a fused value is computed in
        out: set[str] = set()
        for c in g.consumers(n):
            out |= {c} if g.op(c).materialised else sinks(c)
        return out

    from autolayout.fusion import reduction

    elementwise = [n for lp in g.loops.values() for n in lp.body
                   if g.op(n).fn == "slice" and all(g.op(c).kind == "elementwise" for c in g.consumers(n))]
    into_reduction = [n for n in elementwise if any(reduction(g.op(s)) for s in sinks(n))]
    fused = [n for n in elementwise if n not in into_reduction]
    assert fused and not any(g.op(n).materialised for n in fused), fused
    # a slice a reduction's fusion reads is written at its size (XLA:CPU's YNN fusions, kCustom
    # above, read a materialised dynamic-slice)
    assert into_reduction and all(g.op(n).materialised for n in into_reduction), into_reduction


def test_top_level_gathers_start_at_the_step_start_only_on_a_breadth_first_schedule():
    """By hand, the mlp's ZeRO-3 step: w and v are parameters, each all-gathered once for its
    readers. On the cpu profile (breadth first, XLA:CPU's optimized HLO runs both all-gathers
    first) their copies are held from the step's start; on an accelerator profile (a
    latency-hiding scheduler) from their first readers. A scan body's start is the same on both."""
    from autolayout.costmodel.sharing import shared_reads, spans

    g = models.mlp(batch=BATCH, d_io=IO, d_hidden=HIDDEN)
    units = list(g.schedule)
    early, late = spans(g, True)[None], spans(g, False)[None]
    for t in ("w", "v"):
        first = min(i for i, u in enumerate(units) if isinstance(u, str) and t in g.op(u).inputs)
        (e,), (lt,) = [s for s in early if s[1] == t], [s for s in late if s[1] == t]
        assert e[2] == 0 and lt[2] == first == units.index(lt[0]) > 0, (t, e, lt)
        assert e[3] == lt[3]
    lm = models.transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=128, batch=8, length=32)
    for loop in lm.loops:
        assert spans(lm, True)[loop] == spans(lm, False)[loop] == shared_reads(lm)[1][loop]


RENAME_LAYOUTS = {  # layout: (the gathered block a rename of the keys' or values' length holds, its output's bytes)
    "length:model;length_1:data": (65536, 32768),  # gathered over model, sliced over data
    "length:data;length_1:model": (65536, 16384),  # gathered over data, sliced over model
    "length:model": (0, 65536),  # gathered, not sliced: the gathered block is the output
    "length_1:model": (0, 16384),  # sliced locally, nothing gathered
}


def _lm_forward():
    return models.transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=128, batch=8,
                                 length=32, train=False)


def _forward_renames(g):
    """The forward scan's renames of the keys' and values' ``length`` (of two contractions)."""
    (body,) = [lp.body for lp in g.loops.values()]
    return [n for n in body if g.op(n).fn == "rename" and g.op(g.op(n).inputs[0]).kind == "einsum"]


def _rename_transients(g, layout: str) -> list[int]:
    p = plan(g, Mesh.parse(MESH), Layout.coerce(layout))
    return [price(p.ops[n], g.op(n), Mesh.parse(MESH), CPU).transient_bytes for n in _forward_renames(g)]


@pytest.mark.parametrize("layout", list(RENAME_LAYOUTS), ids=[lay.replace(";", "+") for lay in RENAME_LAYOUTS])
def test_a_rename_between_mesh_axes_holds_its_gathered_block_by_hand(layout):
    """By hand, the zoo transformer's forward scan (batch 8, length 32, heads 4, d_kv 16, float32)
    on ``data:2,model:4``: a rename of the keys' or values' ``length`` to ``length_1`` that moves
    the dim from one mesh axis to another all-gathers the local block over the old axis and keeps
    its slice for the new one (``placement.move_buffer_bytes``): while it runs it holds the
    gathered block, the whole length (``8 * 32 * 4 * 16 * 4`` bytes), beside its output
    (``length_1`` split over the new axis); where it only gathers or only slices it holds nothing
    but its output."""
    g = _lm_forward()
    held, out = RENAME_LAYOUTS[layout]
    assert len(_forward_renames(g)) == 2
    assert _rename_transients(g, layout) == [held, held]
    p = plan(g, Mesh.parse(MESH), Layout.coerce(layout))
    assert [p.local_bytes[n] for n in _forward_renames(g)] == [out, out]


def test_xla_cpu_all_gathers_a_renamed_block_before_slicing_it():
    """XLA:CPU's optimized HLO of the zoo transformer's forward pass under
    ``length:model;length_1:data``: the scan body all-gathers the keys and the values over
    ``model`` to the whole length (``f32[4,8,8,4,16]``, 64 KiB, twice the renamed tensor, which
    is split over ``data``): the block the model's renames hold while they run
    (``placement.move_buffer_bytes``). The peak is within 10% of ``memory_analysis()``
    (``tests/test_memory_xla.py``)."""
    import re

    from autolayout.exec import execute

    g = _lm_forward()
    layout = "length:model;length_1:data"
    ex = execute(g, MESH, layout, repeats=1, reference=False)
    (body,) = _scheduled_bodies(ex.compiled_hlo_text).values()
    gathered = [4 * math.prod(int(x) for x in m.group(1).split(","))
                for line in body if (m := re.search(r"= f32\[([\d,]+)\]\S* all-gather\(", line))]
    assert sorted(gathered) == sorted(_rename_transients(g, layout)) == [65536, 65536]
    kinds = {(c.kind, c.mesh_axes) for c in ex.predicted.collectives if c.op in _forward_renames(g)}
    assert kinds == {("all-gather", ("model",))}
