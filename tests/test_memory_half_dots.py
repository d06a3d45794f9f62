"""XLA:CPU runs half-precision dots in float32 (``Hardware.upcasts_half_dots``,
``costmodel.memory.stored_itemsize``): the compiler property against XLA's own optimized HLO and
``memory_analysis()``, the model's figure by hand, and the search's live sets against ``predict``
on a bf16 training step (examples/linen_bf16_mlp.py).
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest

from autolayout import predict, trace
from autolayout.core import Mesh
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.profiles import get_hardware, known_hardware
from autolayout.costmodel.memory import stored_itemsize
from autolayout.search import enumerate_layouts
from autolayout.search.liveness import peak_of
from autolayout.search.solver import search_points
from autolayout.search.warm import sizes_of
from autolayout.search.tables import Tables
from autolayout.search.wus import wus_options
from storage_variants import storage_variants

CPU = get_hardware("cpu")
M, K, N = 64, 128, 256


def _half_dot(x, w):
    return (x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16)).astype(jnp.float32) * 2


def test_xla_cpu_holds_the_operands_of_a_bf16_dot_in_float32():
    """``x.astype(bf16) @ w.astype(bf16)``: XLA:CPU's dot reads float32 converts and writes float32,
    so its heap holds both operands at 4 bytes an element (bf16 would be half that)."""
    c = jax.jit(_half_dot).lower(jnp.ones((M, K)), jnp.ones((K, N))).compile()
    entry = c.as_text()[c.as_text().index("ENTRY"):]
    assert "bf16" not in entry  # no buffer of the entry computation is bf16
    assert c.memory_analysis().temp_size_in_bytes == 4 * (M * K + K * N)


def test_half_dot_tensors_take_float32_on_cpu_only_by_hand():
    g = trace(_half_dot, jnp.ones((M, K)), jnp.ones((K, N)), dims=("m k", "k n"))
    converts = [t.name for t in g.tensors() if t.dtype == "bfloat16" and g.op(t.name).kind == "elementwise"]
    dot, = [t.name for t in g.tensors() if g.op(t.name).kind == "einsum"]
    assert len(converts) == 2 and g.tensor(dot).dtype == "bfloat16"
    for name in converts + [dot]:
        assert stored_itemsize(g, name, CPU) == 4
        assert stored_itemsize(g, name, get_hardware("tpu-v4")) == 2
    for t in g.tensors():  # arguments and the float32 output keep their own itemsize
        if t.name not in converts + [dot]:
            assert stored_itemsize(g, t.name, CPU) == t.itemsize
    mesh = "d:1"
    off = CPU.replace(upcasts_half_dots=False)
    # the peak is at the dot: both converted operands and its result live, each at 4 bytes instead of 2
    extra = 2 * (M * K + K * N + M * N)
    assert predict(g, mesh, "", hardware=CPU).memory_bytes - predict(g, mesh, "", hardware=off).memory_bytes == extra


def test_rule_is_on_for_cpu_only_and_round_trips():
    for name in known_hardware():
        assert get_hardware(name).upcasts_half_dots == (name == "cpu"), name
    assert Hardware.from_dict(CPU.to_dict()).upcasts_half_dots


def _bf16_mlp():
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "linen_bf16_mlp.py"
    spec = importlib.util.spec_from_file_location("example_linen_bf16_mlp_half", path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
    step, args = m.setup(embed=32, mlp=64, batch=16)
    return m.trace_mlp(step, args)


@pytest.mark.parametrize("mesh", ["rows:2,cols:4"])
def test_search_live_sets_reproduce_predict_memory_of_a_bf16_step_on_cpu(mesh):
    """The search's tensor bytes use the same float32 rule: its live sets sum to predict's peak on
    the cpu profile for layouts of the enumeration, storage sharded at each ZeRO stage too."""
    g, mesh = _bf16_mlp(), Mesh.parse(mesh)
    assert any(stored_itemsize(g, t.name, CPU) != t.itemsize for t in g.tensors())
    tables = Tables(g, mesh, CPU)
    wus, _ = wus_options(tables)
    points = search_points(tables)
    layouts = list(enumerate_layouts(g, mesh))
    checked = 0
    for lay in layouts[:: max(1, len(layouts) // 8)]:
        for lw, point in storage_variants(tables, wus, lay):
            assert peak_of(points, sizes_of(tables, wus, point))[0] == predict(g, mesh, lw, hardware=CPU).memory_bytes, \
                str(lw)
            checked += 1
    assert checked
