"""Broadcasts XLA:CPU writes to memory (``costmodel.broadcasts``): a value's broadcast that an
element-wise op fused into a YNNPACK reduction reads, written where the reduction has at least
4096 elements on a device. The reference is XLA's optimized HLO (the large buffers of its entry
computation) and ``memory_analysis``, never the cost model."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from autolayout import trace
from autolayout.core import Layout, Mesh
from autolayout.costmodel.broadcasts import YNN_MIN_ELEMENTS, broadcast_bytes, broadcast_spans
from autolayout.costmodel.order import memory_order
from autolayout.costmodel.profiles import get_hardware
from autolayout.search import enumerate_layouts
from autolayout.search.names import is_broadcast
from storage_variants import search_peaks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from xla_cpu_reductions import xla_buffers  # noqa: E402

CPU = get_hardware("cpu")
L, D = 16, 32


def _norm_grads(x, g):
    """A norm's backward: rsqrt of the rows read by the scale gradient's and the row sum's
    element-wise inputs, each fused into its reduction."""
    r = jax.lax.rsqrt(jnp.mean(x * x, -1) + 1e-6)
    return jnp.sum(g * x * r[..., None], (0, 1)), jnp.sum(g * r[..., None], -1)


def _xla_large_buffers(fn, *args) -> list[str]:
    shape = "f32[" + ",".join(map(str, args[0].shape)) + "]"
    return xla_buffers(jax.jit(fn).lower(*args).compile().as_text(), shape)


@pytest.mark.parametrize("batch", [8, 4], ids=["4096_elements", "2048_elements"])
def test_the_broadcast_is_written_where_its_reduction_is_a_ynn_fusion(batch):
    """At 8 x 16 x 32 = 4096 elements XLA:CPU writes the broadcast of the rows' rsqrt
    (``wrapped_broadcast``) that both reductions read; at 2048 its reductions are loop fusions
    that take the broadcast in, and it writes nothing of that shape. The model: one broadcast
    span, at the reader's bytes above the threshold and 0 below, and no other buffer of that
    shape."""
    x, g = jnp.ones((batch, L, D)), jnp.ones((batch, L, D))
    xla = _xla_large_buffers(_norm_grads, x, g)
    graph = trace(_norm_grads, x, g, dims=("b l d", "b l d"))
    spans = [s for group in broadcast_spans(memory_order(graph, CPU)).values() for s in group]
    assert len(spans) == 1
    written = [s for s in spans if broadcast_bytes(batch * L * D, 4, CPU.ynn_reductions)]
    large = [op.name for op in graph.ops() if op.materialised and op.kind != "input"
             and tuple(d.size for d in op.output.shape) == (batch, L, D)]
    assert len(written) + len(large) == len(xla), (xla, written, large)
    assert (batch * L * D >= YNN_MIN_ELEMENTS) == bool(written)


def test_search_points_reproduce_predict_with_broadcasts():
    """The search's broadcast names, sized by the layout (0 where the reader's local elements
    fall below the threshold), give predict's peak for every layout of the enumeration."""
    x, g = jnp.ones((8, L, D)), jnp.ones((8, L, D))
    graph = trace(_norm_grads, x, g, dims=("b l d", "b l d"))
    mesh = Mesh.parse("rows:2,cols:4")
    layouts = list(enumerate_layouts(graph, mesh)) + [Layout.coerce("")]
    seen, points = search_peaks(graph, mesh, CPU, layouts, flag=is_broadcast)
    assert any(is_broadcast(n) for p in points for n in p)
    assert seen == {True, False}
