"""A reduction of partial sums in two phases (``phases.split_reductions``): XLA runs the contraction,
then the collective, and frees the contraction's last-read inputs between them, so the op holds
``inputs + partial sums`` and then ``partial sums + result``, never all three. Checked against XLA's
``memory_analysis()`` of the shard_map program (the compiler property), a hand calculation of the
model's figure, and the search's live sets against ``predict``.
"""
from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from autolayout import execute, models, predict, trace
from autolayout.core import Mesh
from autolayout.costmodel.attention import kernel_graph
from autolayout.costmodel.gradients import combined_reductions
from autolayout.costmodel.phases import split_reductions
from autolayout.costmodel.profiles import get_hardware
from autolayout.search import enumerate_layouts
from autolayout.search.liveness import peak_of
from autolayout.search.names import partial
from autolayout.search.solver import search_points
from autolayout.search.tables import Tables
from autolayout.search.warm import sizes_of
from autolayout.search.wus import wus_options
from storage_variants import storage_variants

F32 = 4
B, D, H = 64, 8 * 256, 128  # x [B, D] and w [D, H], the contraction dim D split 8 ways
X_LOCAL, W_LOCAL = B * D // 8 * F32, D // 8 * H * F32  # 64 KiB, 128 KiB
TANH, PARTIAL = B * D // 8 * F32, B * H * F32  # tanh(x) (the dot's last-read input), its partial sums
CPU = get_hardware("cpu")


def _fn(x, w):
    return jnp.sum(jnp.square(jnp.tanh(x) @ w))


def _args():
    return jnp.ones((B, D), jnp.float32), jnp.ones((D, H), jnp.float32)


def test_xla_cpu_frees_the_dots_last_read_input_before_its_all_reduce():
    """The shard_map program of the layout below: XLA's temp heap holds tanh(x) and the partial sums
    (the dot), then the partial sums and the all-reduced result, never the three together."""
    mesh = jax.make_mesh((8,), ("d",))

    def body(x, w):
        return jnp.sum(jnp.square(jax.lax.psum(jnp.tanh(x) @ w, "d")))

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "d"), P("d", None)), out_specs=P()))
    x, w = _args()
    c = f.lower(jax.device_put(x, NamedSharding(mesh, P(None, "d"))),
                jax.device_put(w, NamedSharding(mesh, P("d", None)))).compile()
    assert "all-reduce(" in c.as_text()
    result = PARTIAL  # the all-reduce's result: [B, H] like the partial sums
    assert c.memory_analysis().temp_size_in_bytes == max(TANH + PARTIAL, PARTIAL + result)
    assert c.memory_analysis().temp_size_in_bytes < TANH + PARTIAL + result


def test_xla_cpu_copies_a_reduce_scatter_operand_after_its_dot():
    """psum_scatter of tanh(x) @ w over its minor dim: XLA lays the partial sums out with the scattered
    dim most major by a copy, an instruction after the dot, so its temp heap holds tanh(x) and the
    partial sums (the dot), then the partial sums and their copy, then the copy and the result, never
    the dot's input beside the copy (reductions.ReductionBytes.contraction)."""
    mesh = jax.make_mesh((8,), ("d",))

    def body(x, w):
        return jnp.square(jax.lax.psum_scatter(jnp.tanh(x) @ w, "d", scatter_dimension=1, tiled=True))

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "d"), P("d", None)), out_specs=P(None, "d")))
    x, w = _args()
    c = f.lower(jax.device_put(x, NamedSharding(mesh, P(None, "d"))),
                jax.device_put(w, NamedSharding(mesh, P("d", None)))).compile()
    text = c.as_text()
    assert "reduce-scatter(" in text and f"f32[{B},{H}]{{0,1}} copy(" in text  # the relayout copy
    copy, result = PARTIAL, PARTIAL // 8
    temp = c.memory_analysis().temp_size_in_bytes
    assert temp == max(TANH + PARTIAL, PARTIAL + copy, copy + result) < TANH + PARTIAL + copy


def test_split_reduction_lists_intermediates_with_their_last_reads():
    g = trace(_fn, *_args())
    split = split_reductions(g)
    assert split["dot_general_0"] == ("tanh_0",)  # x and w are arguments, live throughout
    # the step's output too: its allocation is written by the collective; square_0 is fused into
    # the sum (fusion.with_fusion), so the sum frees the dot's output
    assert [n for n in split["out"] if g.op(n).materialised] == ["dot_general_0"]
    train = models.mlp(batch=64, d_io=128, d_hidden=256)
    gradient = {o for _, ops in combined_reductions(train).values() for o in ops}
    assert gradient and not gradient & set(split_reductions(train))


def test_split_reduction_peak_by_hand():
    """At the dot: the arguments (64 + 128 KiB), tanh(x) and the partial sums (the contraction's
    phase: the result is not allocated yet), and the scalar output's allocation (4 B, for the whole
    call); the collective's phase holds the partial sums and the result (less). Before the split the
    model held all three (32 KiB more)."""
    g = trace(_fn, *_args())
    c = predict(g, "d:8", "d2048:d", hardware=CPU)
    assert c.memory_bytes == X_LOCAL + W_LOCAL + TANH + PARTIAL + F32
    assert c.memory["transient"] == PARTIAL
    # unsharded contraction: nothing to reduce, the op's count as before (inputs and output)
    full = predict(g, "d:8", "", hardware=CPU)
    assert full.memory_bytes == 8 * (X_LOCAL + W_LOCAL) + 8 * TANH + B * H * F32 + F32


def test_split_reduction_matches_xla_memory_analysis():
    g = trace(_fn, *_args())
    ex = execute(g, "d:8", "d2048:d", args=_args(), repeats=1, reference=False)
    xla = ex.xla_memory
    assert ex.predicted.memory_bytes == xla["argument"] + xla["output"] + xla["temp"] - xla["alias"]


H_OUT = 128  # the output's local bytes equal tanh(x)'s: [B, H_OUT] and [B, D_OUT / 8]
D_OUT = 8 * H_OUT
OUT = B * H_OUT * F32  # tanh(x), the partial sums and the result: 32 KiB each


def _out_fn(x, w):
    return jnp.tanh(x) @ w


def _out_args():
    return jnp.ones((B, D_OUT), jnp.float32), jnp.ones((D_OUT, H_OUT), jnp.float32)


def test_xla_cpu_holds_a_temporary_in_the_reduced_outputs_allocation_until_the_collective():
    """The step's output is the reduced result: XLA allocates it for the whole call and, before the
    all-reduce writes it, holds tanh(x) there (the contraction's phase: tanh(x) + partial sums); the
    temp heap holds the partial sums alone. So the output counts in two phases like an intermediate:
    argument + output + temp = x + w + 2 * OUT, not x + w + 3 * OUT (tanh(x), partial sums and result
    together, the model's figure before: 196608 bytes)."""
    g = trace(_out_fn, *_out_args())
    assert split_reductions(g) == {"out": ("tanh_0",)}
    ex = execute(g, "d:8", "d1024:d", args=_out_args(), repeats=1, reference=False)
    xla = ex.xla_memory
    x_local, w_local = B * D_OUT // 8 * F32, D_OUT // 8 * H_OUT * F32
    assert (xla["output"], xla["temp"]) == (OUT, OUT)
    assert xla["argument"] + xla["output"] + xla["temp"] - xla["alias"] == x_local + w_local + 2 * OUT
    assert ex.predicted.memory_bytes == x_local + w_local + 2 * OUT


def _combined_fn(x, w1, w2):
    return jnp.sum(jnp.sin(x @ w1) * jnp.sin(jnp.tanh(x) @ w2))


def test_combined_all_reduce_writes_its_members_results_at_its_collective():
    """Two independent partial contractions, x @ w1 and tanh(x) @ w2: XLA:CPU combines their
    all-reduces into one after the second dot (costmodel/combine.py). While that dot runs, its
    input tanh(x) (the larger, read last there) and both partial sums are live; the two reduced
    results are written only at the combined all-reduce, after tanh(x) is freed. So the second
    dot's contraction phase holds x, w1, w2, tanh(x) and two partial sums, not the first result
    as well (the model's figure before: 32 KiB more)."""
    d = 8 * 512
    args = (jnp.ones((B, d), jnp.float32), jnp.ones((d, H), jnp.float32), jnp.ones((d, H), jnp.float32))
    g = trace(_combined_fn, *args)
    assert split_reductions(g)["dot_general_1"] == ("tanh_0",)
    ex = execute(g, "d:8", "d4096:d", args=args, repeats=1, reference=False)
    x_local, w_local, tanh, part = B * d // 8 * F32, d // 8 * H * F32, B * d // 8 * F32, B * H * F32
    xla = ex.xla_memory
    assert ex.compiled_hlo_text.count(" all-reduce(") == 1  # one, combined
    assert tanh + 2 * part <= xla["temp"] < tanh + 3 * part  # buffer-assignment alignment aside
    assert ex.predicted.memory_bytes == x_local + 2 * w_local + tanh + 2 * part + F32  # + the loss's allocation


CASES = [("moe", "rows:2,cols:4", "cpu"), ("transformer", "rows:2,cols:2", "cpu"),
         ("transformer", "rows:2,cols:2", "tpu-v4"), ("moe", "rows:2,cols:2", "tpu-v4")]


def _graph(name):
    if name == "moe":
        return models.moe(batch=8, length=32, d_model=64, d_ff=128, experts=8, capacity=8, train=False)
    return models.transformer_lm(batch=8, length=16, d_model=64, d_ff=128, heads=4, d_kv=16, n_layers=2,
                                 vocab=128)


@pytest.mark.parametrize("name,mesh,hw", CASES, ids=["-".join(c) for c in CASES])
def test_search_live_sets_reproduce_predict_with_split_reductions(name, mesh, hw):
    """The search's live sets (each split reduction's two phases: ``names.result`` in the
    contraction's, ``names.partial`` in the collective's) give ``predict``'s figure for random
    layouts, with every storage option of their parameters."""
    hw, mesh = get_hardware(hw), Mesh.parse(mesh)
    g = kernel_graph(_graph(name), hw)
    assert split_reductions(g)
    tables = Tables(g, mesh, hw)
    wus, _ = wus_options(tables)
    points = search_points(tables)
    layouts = list(enumerate_layouts(g, mesh))
    split = 0
    for lay in random.Random(0).sample(layouts, min(8, len(layouts))):
        for lw, point in storage_variants(tables, wus, lay):
            sizes = sizes_of(tables, wus, point)
            assert peak_of(points, sizes)[0] == predict(g, mesh, lw, hardware=hw).memory_bytes, str(lw)
            split += any(sizes[partial(n)] for n in split_reductions(g))
    assert split  # some layout reduces partial sums at a split op
