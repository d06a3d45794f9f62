"""Values a reduction fusion shares (``Op.reduction_shared``, ``costmodel.recomputed``): XLA:CPU
writes one where the reduction is a YNNPACK fusion (at least 4096 elements on a device) and
recomputes it in each fusion below that. The reference is XLA's optimized HLO (the buffers of
the value's shape in its entry computation) and, for the search, ``predict``."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from autolayout import trace
from autolayout.core import Layout, Mesh
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.recomputed import recomputed_spans, written
from autolayout.costmodel.order import memory_order
from autolayout.fusion import duplicable, reduction
from autolayout.search import enumerate_layouts
from autolayout.search.names import is_recomputed
from storage_variants import search_peaks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from xla_cpu_reductions import computations, xla_buffers  # noqa: E402

CPU = get_hardware("cpu")
L, D = 16, 32


def _centred(x, w):
    """A norm's centred input ``c``, read by its variance's reduction and by the scaled output."""
    c = x - jnp.mean(x, -1, keepdims=True)
    return jnp.sum(c * c, -1), c * w


def _kept(x, w0, w):
    """``c`` is computed from a dot's output ``h`` and read last after its reduction, so where
    XLA recomputes it, ``h`` lives to ``c``'s last reader."""
    h = x @ w0
    c = h - jnp.mean(h, -1, keepdims=True)
    v = jnp.sum(c * c, -1)
    return (c * jax.lax.rsqrt(v + 1e-6)[..., None]) @ w


@pytest.mark.parametrize("batch", [8, 4], ids=["4096_elements", "2048_elements"])
def test_the_shared_value_is_written_where_its_reduction_is_a_ynn_fusion(batch):
    """At 8 x 16 x 32 = 4096 elements XLA:CPU writes the centred input that the YNNPACK
    reduction and the output's fusion share; at 2048 it writes only the output (the reduction is
    a loop fusion that recomputes ``c``). The model: the graph's other buffers of that shape plus
    ``c`` where :func:`written` says so."""
    x, w = jnp.ones((batch, L, D)), jnp.ones((D,))
    xla = xla_buffers(jax.jit(_centred).lower(x, w).compile().as_text(), f"f32[{batch},{L},{D}]")
    graph = trace(_centred, x, w, dims=("b l d", "d"))
    shared = [op.name for op in graph.ops() if op.reduction_shared]
    assert len(shared) == 1
    n = batch * L * D
    others = [op.name for op in graph.ops() if op.materialised and not op.reduction_shared
              and op.kind != "input" and tuple(d.size for d in op.output.shape) == (batch, L, D)]
    assert len(others) + written(n, CPU.ynn_reductions) == len(xla), (xla, others, shared)
    assert written(n, CPU.ynn_reductions) is (batch == 8)


def _scan_norm(xs, w):
    """A scan body whose slice of the stacked ``xs`` is read by a reduction (the mean) and by an
    element-wise chain (the centred, scaled value added to the carry)."""
    def body(h, x):
        return h + (x - jnp.mean(x, -1, keepdims=True)) * w, None
    return jax.lax.scan(body, jnp.zeros(xs.shape[1:]), xs)[0]


def _while_body_slices(text: str, shape: str) -> list[str]:
    """The instructions of the ``while`` body of optimized HLO ``text`` that write a buffer of
    ``shape`` holding a dynamic slice (a ``dynamic-slice``, or a fusion whose computation only
    slices): XLA's materialised slices of a stacked input."""
    comps, body = computations(text)
    out = []
    for line in comps[body].splitlines():
        m = re.match(r"\s*(?:ROOT )?%(\S+) = (\S+?)(?:\{[\d,]*\})? ([\w-]+)\(.*?(?:calls=%([\w.\-]+))?", line)
        if not m or m.group(2) != shape:
            continue
        if m.group(3) == "dynamic-slice":
            out.append(m.group(1))
        elif m.group(3) == "fusion":
            called = re.search(r"calls=%([\w.\-]+)", line).group(1)
            ops = re.findall(r"= \S+ ([\w-]+)\(", comps[called])
            if set(ops) <= {"parameter", "dynamic-slice", "bitcast", "constant"} and "dynamic-slice" in ops:
                out.append(m.group(1))
    return out


@pytest.mark.parametrize("batch", [8, 4], ids=["4096_elements", "2048_elements"])
def test_a_scan_slice_a_reduction_reads_is_written_where_the_reduction_is_a_ynn_fusion(batch):
    """XLA:CPU writes a scan body's slice of a stacked input that a YNNPACK reduction reads (a
    ``dynamic-slice`` is not taken into it: 8 x 16 x 32 = 4096 elements) and fuses the
    ``dynamic-slice`` into the loop fusions of a smaller one (2048), writing no slice; the model
    marks the slice ``Op.reduction_shared`` and writes it where :func:`written` says so."""
    xs, w = jnp.ones((3, batch, L, D)), jnp.ones((D,))
    xla = _while_body_slices(jax.jit(_scan_norm).lower(xs, w).compile().as_text(), f"f32[1,{batch},{L},{D}]")
    graph = trace(_scan_norm, xs, w, dims=("layers b l d", "d"))
    (op,) = [op for op in graph.ops() if op.kind == "reshape" and op.fn == "slice" and op.loop]
    assert op.reduction_shared and op.materialised
    assert len(xla) == int(written(batch * L * D, CPU.ynn_reductions)), xla
    assert written(batch * L * D, CPU.ynn_reductions) is (batch == 8)


def test_a_written_scan_slice_is_read_only_by_its_reductions():
    """Where XLA:CPU writes the slice (4096 elements), only the YNNPACK reduction reads that
    buffer; the element-wise fusion that also reads the slice takes the ``dynamic-slice`` in and
    reads the stacked input, so the buffer is free after the reduction. The model's readers of
    the slice (``lifetimes.readers_of``, which its lifetime and the breadth-first order follow)
    are the reduction alone."""
    from autolayout.costmodel.lifetimes import readers_of

    xs, w = jnp.ones((3, 8, L, D)), jnp.ones((D,))
    text = jax.jit(_scan_norm).lower(xs, w).compile().as_text()
    comps, body = computations(text)
    (sliced,) = _while_body_slices(text, f"f32[1,8,{L},{D}]")
    users = [line for line in comps[body].splitlines() if re.search(rf"\(.*%{re.escape(sliced)}[,)]", line)]
    assert users and all("kind=kCustom" in u and "__ynn_fusion" in u for u in users), users
    graph = trace(_scan_norm, xs, w, dims=("layers b l d", "d"))
    (op,) = [op for op in graph.ops() if op.kind == "reshape" and op.fn == "slice" and op.loop]
    readers = readers_of(graph)[op.name]
    assert len(readers) == len(users) and all(reduction(graph.op(r)) for r in readers), readers
    assert any(op.name in graph.op(c).inputs for c in graph.consumers(op.name) if graph.op(c).kind == "elementwise")


@pytest.mark.parametrize(("fn", "shapes", "want"), [
    (lambda x, m: x - m, ((8, 16, 32), (8, 16, 1)), True),   # a row statistic: read through a broadcast
    (lambda x, y: x + y, ((8, 16, 32), (8, 16, 32)), False),  # two full operands: twice the output's reads
    (lambda x, s: x * s, ((8, 16, 32), (32,)), True),
], ids=["centred", "residual_add", "scaled"])
def test_duplicable_follows_xla_global_rule(fn, shapes, want):
    """``InstructionFusion::ComputeGloballyUnfusible``: an op with at most one operand of the
    output's true rank, or whose operands have no more elements than its output, may be
    duplicated into several fusions (counted here by hand for each op)."""
    args = [jnp.ones(s) for s in shapes]
    graph = trace(fn, *args)
    (op,) = [op for op in graph.ops() if op.kind == "elementwise"]
    assert duplicable(op) is want


def test_search_points_reproduce_predict_with_recomputed_sources():
    """The search's recomputed names (a source kept alive for a value the layout recomputes),
    sized by the layout, give predict's peak for every layout of the enumeration, among them
    layouts that write the value (4096 local elements) and layouts that recompute it (2048)."""
    x, w0, w = jnp.ones((16, L, D)), jnp.ones((D, D)), jnp.ones((D, D))
    graph = trace(_kept, x, w0, w, dims=("b l d", "d e", "e f"))
    spans = [s for group in recomputed_spans(memory_order(graph, CPU)).values() for s in group]
    assert spans and all(graph.op(v).reduction_shared for _, v, _, _ in spans)
    mesh = Mesh.parse("rows:2,cols:4")
    layouts = list(enumerate_layouts(graph, mesh)) + [Layout.coerce("")]
    seen, points = search_peaks(graph, mesh, CPU, layouts, flag=is_recomputed)
    assert any(is_recomputed(n) for p in points for n in p)
    assert seen == {True, False}


@pytest.mark.parametrize(("hardware", "remat"), [("cpu", "none"), ("tpu-v5p", "none"), ("tpu-v5p", "full")])
def test_search_points_reproduce_predict_on_a_llama(hardware, remat):
    """On a llama training step in bfloat16 (attention renames, RMS norms; with full remat, its
    recomputed forward too), under layouts drawn at random with and without storage sharding:
    the search's sizes give predict's peak. On a TPU profile (no YNNPACK) every value a reduction
    fusion shares is recomputed, so every recomputed span is live (with full remat, a source that
    is a rename, or a scan's result, once set the search and predict apart)."""
    import random

    from autolayout import models
    from autolayout.search.space import draw_layouts

    graph = models.llama(d_model=32, heads=4, kv_heads=4, d_kv=8, d_ff=64, n_layers=2, vocab=64, batch=8,
                         length=16, train=True, param_dtype="float32", compute_dtype="bfloat16")
    mesh = Mesh.parse("data:2,model:4")
    layouts = draw_layouts(graph, mesh, 8, random.Random(0), shard_every=2, stage=3)
    _, points = search_peaks(graph, mesh, get_hardware(hardware), layouts, remat=remat)
    assert any(is_recomputed(n) for p in points for n in p)


@pytest.mark.parametrize("hardware", ["cpu", "tpu-v5p"])
def test_search_points_reproduce_predict_where_a_storage_shard_shrinks_a_scan_slice(hardware):
    """The Flax GPT (``examples/linen_gpt.py``) under ``vocab:data;batch:model``, each storage
    variant of it: a stacked parameter stored sharded shrinks its scan slices, some of them read by
    reductions (``Op.reduction_shared``, written or not by the layout); the shard's change of such a
    slice's bytes counts only where the layout writes it, as ``predict`` counts it (the search
    had added the shard's -96 bytes to a slice it does not write; on a TPU none is written)."""
    import memory_vs_xla as bench

    graph, _ = bench.CASES["linen_gpt"][0]()
    assert any(op.reduction_shared and op.kind == "reshape" for op in graph.ops())
    search_peaks(graph, Mesh.parse(bench.MESH), get_hardware(hardware), [Layout.coerce("vocab:data;batch:model")])


def test_search_points_reproduce_predict_on_mpt_70b_zero3():
    """MPT-70B as llm-foundry trains it on 64 H100 (``reporting.published_runs``: FULL_SHARD,
    activation checkpointing): the norm region's values are recomputed from sources stored outside
    the region (a matmul's output), which a layout may split differently; such a source keeps no
    span, and the search's peak is predict's for each storage variant of the published layout
    (before, the search had sized the source by the value's region dims: 57.4 GB against 43.7)."""
    from autolayout import models
    from autolayout.reporting.published_runs import RUNS

    run = RUNS["mpt-70b-h100-64"]
    graph = getattr(models, run.model.fn)(**run.zoo_kwargs(remat=False))
    search_peaks(graph, Mesh.parse("node:8,gpu:8"), get_hardware("h100"), [Layout.coerce("batch:node,gpu")],
                 remat="full")
