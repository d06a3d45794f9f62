"""XLA:CPU runs half-precision dots in float32 (``Hardware.upcasts_half_dots``,
``costmodel.memory.stored_itemsize``) and half-precision all-gathers too
(``Hardware.upcasts_half_collectives``, ``costmodel.reductions.half_gathers``): the compiler
properties against XLA's own optimized HLO and ``memory_analysis()``, the model's figures by hand,
and the search's live sets against ``predict`` on a bf16 training step (examples/linen_bf16_mlp.py).
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
from autolayout.costmodel.sharing import from_arguments, replaced_by_copy
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
        assert get_hardware(name).upcasts_half_collectives == (name == "cpu"), name
    assert Hardware.from_dict(CPU.to_dict()).upcasts_half_dots
    assert Hardware.from_dict(CPU.to_dict()).upcasts_half_collectives


def _gathered_half_dot(x, w):
    """A ZeRO-3-style step: w stored split over d, cast to bf16 and all-gathered for the dot of x's rows."""
    def body(x, w):
        wg = jax.lax.all_gather(w.astype(jnp.bfloat16), "d", axis=0, tiled=True)
        return (x.astype(jnp.bfloat16) @ wg).astype(jnp.float32)
    mesh = jax.sharding.Mesh(jax.devices()[:8], ("d",))
    P = jax.sharding.PartitionSpec
    return jax.shard_map(body, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"))(x, w)


def test_xla_cpu_all_gathers_a_bf16_value_in_float32():
    """The property ``upcasts_half_collectives`` encodes, read off XLA:CPU's HLO: the all-gather of a
    bf16 weight before optimization gathers float32 after it (a convert on each side)."""
    args = jnp.ones((M, K)), jnp.ones((K, N))
    lowered = jax.jit(_gathered_half_dot).lower(*args)
    before = lowered.as_text(dialect="hlo")
    after = lowered.compile().as_text()
    gather = lambda text: [line for line in text.splitlines() if " all-gather(" in line]
    assert gather(before) and all("bf16[" in line.split("=")[1].split("all-gather")[0] for line in gather(before))
    assert gather(after) and all("f32[" in line.split("=")[1].split("all-gather")[0] for line in gather(after))


def test_half_gathers_by_hand():
    """examples/linen_bf16_mlp.py's ZeRO-3 step over 8 devices: the second dense layer's kernel
    (mlp 64 x embed 32, float32, stored split 8 ways) is cast to bf16 and all-gathered for the
    forward's dot and the input gradient's, which share the copy (sharing.shared_reads). On the cpu
    profile the all-gather runs in float32: the shared copy is float32 (the dot's convert and the
    convert back are one), 64 x 32 x 4 B, and the collective's own float32 buffer as much; on a TPU
    the copy is bf16 and there is no such buffer. The cast's own shard is freed at its all-gather."""
    from autolayout.costmodel.plan import plan
    from autolayout.costmodel.rules import price

    g, mesh = _bf16_mlp(), Mesh.parse("d:8")
    p = plan(g, mesh, "batch:d|*:d@3")
    dot = next(o for o in g.ops() if o.kind == "einsum" and any(
        g.op(i).inputs == ("params/Dense_1/kernel",) for i in o.inputs))
    cast = next(i for i in dot.inputs if g.op(i).inputs == ("params/Dense_1/kernel",))
    k = dot.inputs.index(cast)
    oc = price(p.ops[dot.name], dot, mesh, CPU)
    assert oc.span_bytes[k] == 64 * 32 * 4 and oc.gather_buffer_bytes[k] == 64 * 32 * 4
    # the cast is computed from the parameter alone and read by the two dots through their shared
    # conversion only: its all-gather is its last reader (sharing.replaced_by_copy)
    assert (dot.name, cast) in replaced_by_copy(g) and cast in from_arguments(g)
    tpu = price(p.ops[dot.name], dot, mesh, get_hardware("tpu-v4"))
    assert tpu.span_bytes[k] == 64 * 32 * 2 and not any(tpu.gather_buffer_bytes)


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
