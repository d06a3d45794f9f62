"""Execution backend: every valid layout computes the reference numbers with exactly the
predicted collectives (DESIGN §6)."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from autolayout import models
from autolayout.core import Layout, LayoutError, Mesh
from autolayout.costmodel.hardware import Hardware
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.predict import predict, resolve_layout
from autolayout.exec import (ArgumentError, Execution, LoweringError, NotEnoughDevicesError, calibrate,
                             execute, parse_collectives)
from autolayout.exec.hlo import diff_text
from autolayout.trace import named, trace

MESHES = ["all:8", "rows:2,cols:4", "rows:4,cols:2", "rows:2,cols:2,planes:2"]
FAST = {"xla_backend_optimization_level": 0}  # ~2x faster XLA CPU compiles; same numbers
TOL = 1e-4


@functools.lru_cache(maxsize=None)
def graph(name: str):
    if name == "mlp":
        return models.mlp(batch=16, d_io=8, d_hidden=16)
    if name == "moe":
        return models.moe(d_model=8, d_ff=16, experts=8, capacity=8, batch=8, length=8)
    if name == "transformer_lm":
        return models.transformer_lm(d_model=16, d_ff=32, heads=8, d_kv=8, n_layers=2, vocab=32,
                                     batch=8, length=8)
    raise KeyError(name)


def run(g, mesh, layout, **kw) -> Execution:
    kw.setdefault("repeats", 1)
    kw.setdefault("compiler_options", FAST)
    return execute(g, mesh, layout, **kw)


def check(ex: Execution) -> None:
    assert ex.max_abs_error <= TOL, f"{ex.summary()}"
    assert ex.collectives_match, f"{ex.summary()}\n{ex.collective_diff()}\nnotes: {ex.notes}"
    assert ex.collective_diff() == ""


@st.composite
def valid_layouts(draw, name: str, wus: bool = True):
    """A random mesh and a random layout ``predict`` accepts (rejection sampling): each mesh
    axis goes to a random dim (several axes may split one dim, in random major/minor
    order) or to none; sometimes storage sharding of random parameters at random ZeRO
    stages."""
    g = graph(name)
    mesh = Mesh(draw(st.sampled_from(MESHES)))
    rnd = draw(st.randoms(use_true_random=False))
    dims = sorted(d for d in g.dims if d not in g.loop_dims)
    params = sorted(t.name for t in g.params())
    for _ in range(100):
        rules: dict[str, list[str]] = {}
        for a in rnd.sample(mesh.axis_names, len(mesh.axis_names)):
            if rnd.random() < 0.85:
                rules.setdefault(rnd.choice(dims), []).append(a)
        upd = []
        if wus and rnd.random() < 0.5:
            for p in rnd.sample(params, rnd.randint(1, min(3, len(params)))):
                upd.append((p, rnd.sample(mesh.axis_names, rnd.randint(1, len(mesh.axis_names))),
                            rnd.choice([1, 2, 3])))
        layout = Layout(rules, upd)
        try:
            resolve_layout(g, mesh, layout)
            predict(g, mesh, layout, hardware="cpu")
        except LayoutError:
            continue
        return str(mesh), layout
    reject()  # no valid layout in 100 tries: discard the example (never fall back to the replicated one)


SLOW = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=10, **SLOW)
@given(valid_layouts("mlp"))
def test_mlp_random_layouts(case):
    mesh, layout = case
    check(run(graph("mlp"), mesh, layout))


@settings(max_examples=6, **SLOW)
@given(valid_layouts("moe"))
def test_moe_random_layouts(case):
    mesh, layout = case
    check(run(graph("moe"), mesh, layout))


@settings(max_examples=3, **SLOW)
@given(valid_layouts("transformer_lm"))
def test_transformer_random_layouts(case):
    mesh, layout = case
    check(run(graph("transformer_lm"), mesh, layout))


@pytest.mark.parametrize("name,mesh,layout", [
    # paper Table 1 / §8: data, model and mixed parallel; multi-axis dims
    ("mlp", "rows:2,cols:4", "batch:rows;hidden:cols"),
    ("mlp", "rows:2,cols:2,planes:2", "batch:rows,planes;hidden:cols"),
    # weight-update sharding: along a dim, and flattened + padded (seed 003 §4)
    ("mlp", "rows:2,cols:4", "batch:rows,cols|w:rows,cols;v:cols;bias:rows"),
    # expert parallelism: argmax over split experts (pmax + pmin)
    ("moe", "rows:2,cols:4", "batch:rows;experts:cols"),
    # attention memory length: the rename of k and v all-gathers / slices
    ("transformer_lm", "rows:2,cols:2,planes:2", "length:cols;length_1:rows;batch:planes"),
    # split vocabulary: masked gather + psum, masked scatter-add; WUS inside a scan
    ("transformer_lm", "rows:4,cols:2", "batch:rows;vocab:cols|layers/w1:rows;embed:rows"),
])
def test_known_layouts(name, mesh, layout):
    ex = run(graph(name), mesh, layout)
    check(ex)
    if name == "transformer_lm":  # scan bodies: predicted once per op (count 2), once in the HLO
        assert any(c.count == 2 for c in ex.predicted.collectives)


@pytest.mark.parametrize("name,mesh,layout", [
    ("transformer_lm", "rows:4,cols:2", "batch:rows;vocab:cols|*:rows@1"),
    ("transformer_lm", "rows:4,cols:2", "batch:rows;vocab:cols|*:rows@2"),
    ("transformer_lm", "rows:4,cols:2", "batch:rows;vocab:cols|*:rows@3"),
    ("transformer_lm", "rows:2,cols:2,planes:2", "batch:rows,planes;heads:cols|*:rows,planes@3"),
    ("mlp", "rows:2,cols:4", "batch:rows,cols|*:rows,cols@3"),
], ids=["zero1", "zero2", "zero3", "zero3-with-tensor-parallel", "zero3-mlp"])
def test_storage_stages_execute(name, mesh, layout):
    """Every ZeRO stage computes the reference numbers with the plan's collectives; at stage 3
    the layer weights are gathered inside the scan bodies (once per iteration)."""
    ex = run(graph(name), mesh, layout)
    check(ex)
    if layout.endswith("@3") and name == "transformer_lm":
        bodies = {c.computation for c in ex.compiled_collectives if c.kind == "all-gather"}
        assert any("body" in b or "while" in b for b in bodies), bodies
        assert any(c.kind == "all-gather" and c.count == 2 for c in ex.predicted.collectives)


def test_flattened_storage_shards_at_every_stage():
    """No dim of several parameters divides by 8: their shards are flattened and padded per
    layer, at each stage, and still compute the reference numbers."""
    g = models.transformer_lm(d_model=12, d_ff=24, heads=2, d_kv=6, n_layers=2, vocab=24, batch=8, length=8)
    for stage in (1, 3):
        check(run(g, "all:8", f"batch:all|*:all@{stage}"))


def test_flat_update_shards_are_padded():
    """No dim of ``bias``/``w`` divides by 8 locally: the update runs on flattened, padded
    shards; the reduce-scatter operand is the padded gradient."""
    g = models.mlp(batch=16, d_io=6, d_hidden=12)
    ex = run(g, "all:8", "batch:all|bias:all;w:all")
    check(ex)
    rs = [c for c in ex.compiled_collectives if c.kind == "reduce-scatter"]
    assert sorted(c.bytes for c in rs) == [16 * 4, 72 * 4]  # 12 -> 16 floats; 72 divides by 8


def test_flat_update_shards_of_stacked_parameters():
    """Stacked (scanned) parameters whose update shards are flattened: the gradient is
    reduce-scattered inside the loop, one layer at a time, so shards are padded per layer."""
    g = models.transformer_lm(d_model=12, d_ff=24, heads=2, d_kv=6, n_layers=2, vocab=24, batch=8, length=8)
    check(run(g, "all:8", "batch:all|layers/ln1_scale:all;layers/w1:all;ln_f_scale:all;embed:all"))


# ------------------------------------------------------------------ reshape lowering
@functools.lru_cache(maxsize=None)
def split_merge_graph():
    def f(x, w):
        y = named((x @ w).reshape(8, 4, 8), "batch heads kv")
        z = jnp.tanh(y) * 2.0
        return (z.reshape(8, 32) ** 2).sum(-1), z.sum(0)
    return trace(f, jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((8, 32), jnp.float32),
                 dims=("batch d", "d hk"), roles=("input", "param"))


@pytest.mark.parametrize("mesh,layout,kinds", [
    # split hk -> (heads, kv), then merge (heads, kv) -> d32
    ("rows:2,cols:4", "heads:cols;d32:cols", []),                   # slice; merge keeps the major axis
    ("rows:2,cols:4", "hk:cols;heads:cols", ["all-gather"]),        # split local; merge gathers
    ("rows:2,cols:4", "hk:rows;kv:rows", ["all-gather", "all-to-all"]),  # axis moves to the minor dim
    ("rows:2,cols:4", "hk:cols;kv:rows", ["all-gather", "all-gather"]),
    ("rows:2,cols:4", "heads:rows;kv:cols", ["all-gather"]),        # one gather over both axes
    ("rows:2,cols:2,planes:2", "hk:cols;kv:planes;d32:rows", ["all-gather", "all-gather"]),
])
def test_split_merge_reshapes(mesh, layout, kinds):
    ex = run(split_merge_graph(), mesh, layout)
    check(ex)
    assert sorted(c.kind for c in ex.compiled_collectives if c.kind != "all-reduce") == kinds


@pytest.mark.parametrize("layout,kinds", [
    # hk=32 split (cols, rows): digits cols [32,8), rows [8,4); heads=4 on cols is [32,8),
    # kv=8 on rows is [8,4): every axis stays -> the split is local; the merge to d32
    # (unsplit) gathers both axes in one all-gather
    ("hk:cols,rows;heads:cols;kv:rows", ["all-gather"]),
    # hk split (rows, cols): rows [32,16) stays on heads; cols moves from [16,4) to kv's
    # [8,2), whose upper part [8,4) rows-and-cols still hold: no single all-to-all can do it,
    # so cols is gathered and sliced; the merge then gathers rows and cols
    ("hk:rows,cols;heads:rows;kv:cols", ["all-gather", "all-gather"]),
], ids=["axes-stay", "axes-swap"])
def test_multi_axis_reshapes_match_the_cost_model(layout, kinds):
    """Cost model and lowering read split/merge groups by the same digit rule
    (``costmodel.placement.moves``, executed from the plan), so multi-axis reshapes match the HLO too."""
    ex = run(split_merge_graph(), "rows:2,cols:4", layout)
    check(ex)
    assert sorted(c.kind for c in ex.compiled_collectives if c.kind != "all-reduce") == kinds


def test_unsupported_reduction_is_rejected():
    g = trace(lambda x: jnp.prod(x, axis=1), jax.ShapeDtypeStruct((8, 8), jnp.float32), dims=("batch d",))
    with pytest.raises(LoweringError, match=r"reduce_prod over a dim split across mesh axes \['all'\]"):
        run(g, "all:8", "d:all")
    check(run(g, "all:8", "batch:all"))


# ----------------------------------------------------------------- the Execution
def test_execution_reports_everything():
    g = graph("mlp")
    ex = run(g, "rows:2,cols:4", "batch:rows;hidden:cols", repeats=3)
    check(ex)
    assert len(ex.step_times_s) == 3 and ex.step_time_s > 0 and ex.step_time_spread_s >= 0
    assert "all-reduce" in ex.hlo_text and ex.compiled_hlo_text
    assert ex.xla_flops > 0 and ex.xla_memory_bytes > 0
    assert {c.kind for c in ex.compiled_collectives} == {"all-reduce"}
    assert all(c.replica_groups for c in ex.compiled_collectives)
    assert list(ex.comparison.columns) == ["quantity", "predicted", "compiled", "measured", "ratio"]
    rows = dict(zip(ex.comparison.quantity, ex.comparison.predicted))
    assert rows["flops per device"] == ex.predicted.flops
    assert rows["step time s"] == ex.predicted.time_s
    # outputs have the traced function's structure and equal the reference
    new, gx, loss = ex.outputs
    assert set(new) == {"w", "bias", "v"} and gx.shape == (16, 8) and loss.shape == ()
    ref = g.evaluate(*models.example_args(g, 0))
    np.testing.assert_allclose(np.asarray(loss), np.asarray(ref[2]), rtol=1e-5)


@pytest.mark.parametrize("name, layout", [
    ("mlp", "batch:node,gpu"),                          # data-parallel gradient all-reduces
    ("transformer_lm", "batch:node;heads:gpu;d_ff:gpu"),  # a slow data axis, a fast model one
    ("transformer_lm", "batch:node,gpu|*:gpu@2"),       # ZeRO-2 inside the node, DP across
], ids=["mlp-dp", "transformer-dp-tp", "transformer-zero2-fast"])
def test_hierarchical_all_reduce_is_lowered_as_planned(name, layout):
    # "node" crosses a slow link: a summing all-reduce over node and gpu runs as
    # reduce-scatter over gpu -> all-reduce over node -> all-gather over gpu, in the plan
    # and in the compiled HLO; the numbers equal the reference
    from autolayout.costmodel.hardware import Link
    cpu = get_hardware("cpu")
    hw = cpu.with_axis_link("node", Link(cpu.link.bandwidth / 10, cpu.link.latency, description="slower"))
    g = graph(name)
    ex = run(g, "node:2,gpu:4", layout, hardware=hw)
    check(ex)
    kinds = {(c.kind, c.mesh_axes) for c in ex.predicted.collectives}
    assert ("all-reduce", ("node", "gpu")) not in kinds
    if "node,gpu" in layout.split("|")[0]:
        assert {("reduce-scatter", ("gpu",)), ("all-reduce", ("node",)), ("all-gather", ("gpu",))} <= kinds
    flat = run(g, "node:2,gpu:4", layout, hardware=get_hardware("cpu"))
    check(flat)
    np.testing.assert_allclose(np.asarray(jax.tree_util.tree_leaves(ex.outputs)[0]),
                               np.asarray(jax.tree_util.tree_leaves(flat.outputs)[0]), rtol=1e-5, atol=1e-6)


def test_explicit_args_and_jax_mesh():
    g = graph("mlp")
    args = models.example_args(g, seed=3)
    jmesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("rows", "cols"))
    ex = run(g, jmesh, "batch:rows;io:cols", args=args)
    check(ex)
    assert str(ex.mesh) == "rows:4,cols:2"
    np.testing.assert_allclose(np.asarray(ex.outputs[1]), np.asarray(g.evaluate(*args)[1]), atol=1e-5)


def test_gspmd_backend():
    g = graph("transformer_lm")
    ex = run(g, "rows:2,cols:4", "batch:rows;heads:cols;d_ff:cols", backend="gspmd")
    assert ex.backend == "gspmd" and ex.max_abs_error <= TOL
    assert ex.compiled_collectives and ex.step_time_s > 0
    # GSPMD's own: the program as written has none, the partitioned one has them
    assert list(parse_collectives(ex.hlo_text, 8, ex.mesh.axes)) == []
    assert ex.compiled_collectives == tuple(parse_collectives(ex.compiled_hlo_text, 8, ex.mesh.axes))


# --------------------------------------------------------------------- bad input
def test_too_few_devices():
    with pytest.raises(NotEnoughDevicesError,
                       match=r"needs 16 devices but only 8 .*JAX_NUM_CPU_DEVICES=16.*before importing jax"):
        execute(graph("mlp"), "rows:4,cols:4", "batch:rows")
    assert issubclass(NotEnoughDevicesError, ValueError)


def test_invalid_layout():
    with pytest.raises(LayoutError, match="tensor .* would have two dims, 'batch' and 'hidden'"):
        execute(graph("mlp"), "all:8", "batch:all;hidden:all")
    with pytest.raises(LayoutError, match="dim 'batch' .* has size 12, which is not divisible by 8"):
        execute(models.mlp(batch=12, d_io=8, d_hidden=16), "all:8", "batch:all")


def test_wrong_args():
    g = graph("mlp")
    params, batch = models.example_args(g)
    with pytest.raises(ArgumentError, match=r"missing \[\"\[1\]\['dy'\]\"\]|missing .*\[1\]\['dy'\]"):
        execute(g, "all:8", "batch:all", args=(params, {"x": batch["x"]}))
    bad = dict(params, w=jnp.zeros((3, 3)))
    with pytest.raises(ArgumentError, match=r"argument \[0\]\['w'\] has shape \(3, 3\), expected \(8, 16\) "
                                            r"\(io:8, hidden:16\)"):
        execute(g, "all:8", "batch:all", args=(bad, batch))
    ints = dict(batch, x=jnp.asarray(batch["x"]).astype(jnp.int32))
    with pytest.raises(ArgumentError, match=r"argument \[1\]\['x'\] has dtype int32 \(integer\), but the function "
                                            r"was traced with float32 \(float\); pass a float array"):
        execute(g, "all:8", "batch:all", args=(params, ints))


# ------------------------------------------------------------------- HLO parsing
HLO = """
HloModule m
%region_0.1 (a: f32[], b: f32[]) -> f32[] {
  ROOT %add = f32[] add(a, b)
}
%shared.2 (x: f32[4]) -> f32[4] {
  ROOT ar.9 = f32[4]{0} all-reduce(x), replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%region_0.1
}
ENTRY %main.9 (p: f32[8,16]) -> f32[8,16] {
  c1 = f32[4]{0} call(y), to_apply=%shared.2
  c2 = f32[4]{0} call(z), to_apply=%shared.2
  psum.5 = f32[1,16]{1,0} all-reduce(x.2), channel_id=1, replica_groups={{0,4},{1,5},{2,6},{3,7}}, use_global_device_ids=true, to_apply=region_0.1
  ag.1 = f32[8,16]{1,0} all-gather(x.2), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}
  rs.5 = f32[1,2]{1,0} reduce-scatter(x.3), channel_id=3, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={1}, to_apply=region_0.1
  a2a.5 = f32[1,4,16]{2,1,0} all-to-all(r.1), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={2}
  %all-reduce.73 = (f32[16]{0}, bf16[2,8]{1,0}) all-reduce(f32[16]{0} %a, bf16[2,8]{1,0} %b), channel_id=5, replica_groups={}, to_apply=%region_0.1
  ROOT add.1 = f32[8,16]{1,0} add(ag.1, ag.1)
}
"""


def test_parse_collectives():
    cs = parse_collectives(HLO, 8)
    assert [(c.kind, c.bytes, c.group_size) for c in cs] == [
        ("all-reduce", 16, 2), ("all-reduce", 16, 2),  # one computation, called twice
        ("all-reduce", 64, 2), ("all-gather", 64, 8), ("reduce-scatter", 32, 4),
        ("all-to-all", 256, 4), ("all-reduce", 96, 8)]
    assert cs[2].computation == "main.9" and cs[2].name == "psum.5"


@pytest.mark.parametrize("shape, expected", [
    ("f32[8,16]{1,0}", [("f32", "8,16", 512)]),
    ("(f32[16]{0}, bf16[2,8]{1,0})", [("f32", "16", 64), ("bf16", "2,8", 32)]),
    ("(s32[], pred[3], token[])", [("s32", "", 4), ("pred", "3", 3)]),  # a scalar; a token has no size
    ("(bf16[4096,8192]{1,0}, s8[33554432]{0})", [("bf16", "4096,8192", 67108864), ("s8", "33554432", 33554432)]),
], ids=["array", "tuple", "scalar-and-token", "cublas-workspace"])
def test_array_bytes_by_hand(shape, expected):
    from autolayout.exec.hlo import array_bytes

    assert array_bytes(shape) == expected


def test_parse_collectives_mesh_axes():
    """Replica groups list positions in the mesh's device array (row-major). On rows:2,cols:4:
    {{0,4},...} varies the row only; {{0,1},...} varies the column but holds 2 of its 4
    positions (not a whole axis: unknown); [2,4]<=[4,2]T(1,0) is iota(8) as [4,2] transposed,
    groups {0,2,4,6}: rows 0-1 x cols 0,2, again not whole axes; {} and [1,8]<=[8] span both."""
    cs = parse_collectives(HLO, 8, [("rows", 2), ("cols", 4)])
    assert [c.mesh_axes for c in cs] == [("?",), ("?",), ("rows",), ("rows", "cols"), ("?",), ("cols",),
                                         ("rows", "cols")]
    cs = parse_collectives(HLO, 8, [("a", 4), ("b", 2)])  # {0,1} spans b; {0,4} is not a sub-mesh
    assert [c.mesh_axes for c in cs][:3] == [("b",), ("b",), ("?",)]


def test_mesh_axes_must_match_not_only_sizes():
    """An all-reduce over 'cols' and one over 'planes' have the same kind, bytes and group size
    on rows:2,cols:2,planes:2; only the mesh axes tell them apart."""
    from autolayout.costmodel.rules import Collective
    from autolayout.exec.hlo import compare
    text = ("ENTRY %m (p: f32[4]) -> f32[4] {\n"
            "  ROOT ar = f32[4]{0} all-reduce(p), replica_groups={{0,2},{1,3},{4,6},{5,7}}, to_apply=%r\n}\n")
    mesh = [("rows", 2), ("cols", 2), ("planes", 2)]
    comp = parse_collectives(text, 8, mesh)
    assert comp[0].mesh_axes == ("cols",)
    assert compare([Collective("all-reduce", 16, 2, ("cols",))], comp, mesh)[0]
    assert not compare([Collective("all-reduce", 16, 2, ("planes",))], comp, mesh)[0]
    assert "over planes" in diff_text([Collective("all-reduce", 16, 2, ("planes",))], comp, mesh)


def test_non_power_of_two_axis_with_weight_update_sharding():
    """6 devices: no dim of w/bias/v divides by 6, so every update shard is flattened and
    padded; the compiled collectives (with their mesh axes) equal the plan's."""
    g = models.mlp(batch=12, d_io=8, d_hidden=16)
    ex = run(g, "all:6", "batch:all|w:all;bias:all;v:all")
    check(ex)
    assert sorted(c.kind for c in ex.compiled_collectives).count("reduce-scatter") == 3


def test_diff_is_readable():
    from autolayout.costmodel.rules import Collective
    pred = [Collective("all-reduce", 64, 2, ("rows",), op="dot_general_3")]
    comp = parse_collectives(HLO, 8)[2:4]
    text = diff_text(pred, comp)
    assert "- predicted only: 0" not in text
    assert "+ compiled only:  1 x all-gather 64B group 8" in text
    assert diff_text(pred, comp[:1]) == ""


# --------------------------------------------------------------------- calibration
def test_calibrate_quick(tmp_path):
    hw = calibrate("rows:2,cols:4", quick=True, repeats=3)
    assert hw.peak("float32") > 0 and hw.hbm_bandwidth > 0
    assert not hw.async_collectives  # XLA:CPU collectives do not overlap compute
    assert {a for a, _ in hw.axis_links} == {"rows", "cols"}
    for _, link in hw.axis_links:
        assert link.bandwidth > 0 and link.latency >= 0
    path = tmp_path / "cpu.json"
    hw.save(path)
    assert Hardware.load(path) == hw
    assert predict(graph("mlp"), "rows:2,cols:4", "batch:rows", hardware=hw).time_s > 0


def test_calibrate_one_device_keeps_the_links_of_a_profile():
    """One device (one GPU) has no axis to measure a link on: compute and memory are measured,
    the links are those of the devices' built-in profile (here ``cpu``) or of ``links_from``."""
    one = jax.devices()[:1]
    hw = calibrate("d:1", quick=True, repeats=3, devices=one)
    cpu = get_hardware("cpu")
    assert hw.peak("float32") > 0 and hw.hbm_bandwidth > 0
    assert hw.link == cpu.link and hw.axis_links == cpu.axis_links
    assert any("links not measured" in s and "'cpu'" in s for s in hw.sources)
    h200 = calibrate("d:1", quick=True, repeats=3, devices=one, links_from="h200")
    assert h200.link == get_hardware("h200").link


def test_execute_prices_attention_as_the_program_runs_it():
    """The lowering runs a traced attention as written (scores materialised): on a profile that
    prices a fused kernel (h100), the run's prediction is the materialised one, and says so;
    a model without attention gets no such note."""
    g = graph("transformer_lm")
    h100 = get_hardware("h100")
    ex = execute(g, "rows:2,cols:4", "batch:rows;heads:cols", hardware="h100", reference=False, repeats=1,
                 compiler_options=FAST)
    materialised = predict(g, "rows:2,cols:4", "batch:rows;heads:cols", hardware=h100.replace(fused_attention=False))
    fused = predict(g, "rows:2,cols:4", "batch:rows;heads:cols", hardware=h100)
    assert ex.predicted.time_s == pytest.approx(materialised.time_s, rel=1e-12)
    assert ex.predicted.memory_bytes == materialised.memory_bytes
    assert fused.time_s < materialised.time_s
    assert any("fused_attention off" in n for n in ex.notes)
    mlp = execute(graph("mlp"), "rows:2,cols:4", "batch:rows", hardware="h100", reference=False, repeats=1,
                  compiler_options=FAST)
    assert not any("fused_attention" in n for n in mlp.notes)


# ------------------------------------------------------------- NaN-aware checks
def test_output_check_is_nan_aware():
    """``max(0.0, nan)`` is 0.0 in Python: a NaN must not pass as error 0."""
    from autolayout.exec.runner import OutputMismatchError, _errors

    ref = {"loss": np.float32(1.5), "y": np.arange(6, dtype=np.float32).reshape(2, 3)}
    bad = {"loss": np.float32(1.5), "y": np.where(np.arange(6).reshape(2, 3) == 4, np.nan, ref["y"])}
    with pytest.raises(OutputMismatchError, match=r"output \['y'\]: 1 of 6 values are NaN or infinite in only "
                                                  r"one .*\(first at index \(1, 1\): sharded nan, reference 4\.0"):
        _errors(bad, ref)
    with pytest.raises(OutputMismatchError, match=r"output \['loss'\]: 1 of 1 values"):
        _errors({"loss": np.float32(np.inf), "y": ref["y"]}, ref)
    assert issubclass(OutputMismatchError, ValueError)
    # NaN in both at the same place: reported, the other values still compared
    both = {"loss": np.float32(np.nan), "y": ref["y"] + np.float32(0.25)}
    abs_err, rel_err, notes = _errors(both, {"loss": np.float32(np.nan), "y": ref["y"]})
    assert abs_err == 0.25 and rel_err == pytest.approx(0.25 / 5)
    assert notes == ["output ['loss']: 1 NaN and 0 infinite values of 1 are the same in the sharded run and the "
                     "unsharded reference (the traced function itself produces them); the errors compare the "
                     "other values only"]


def test_execute_reports_nan_in_both():
    g = trace(lambda x, w: jnp.log(named(x @ w, "batch hidden")).sum(-1),
              jax.ShapeDtypeStruct((8, 4), jnp.float32), jax.ShapeDtypeStruct((4, 8), jnp.float32),
              dims=("batch io", "io hidden"), roles=("input", "param"))
    x = jnp.ones((8, 4)).at[3].set(-1.0)  # row 3 of x @ w is negative: log gives NaN there, in both runs
    ex = run(g, "all:8", "batch:all", args=(x, jnp.ones((4, 8))))
    assert np.isnan(np.asarray(ex.outputs)[3]) and np.isfinite(np.delete(np.asarray(ex.outputs), 3)).all()
    assert ex.max_abs_error <= TOL
    assert any("1 NaN and 0 infinite values of 8 are the same" in n for n in ex.notes), ex.notes


@pytest.mark.parametrize("mesh, layout", [("all:8", "batch:all"), ("rows:2,cols:4", "batch:rows;hidden:cols")],
                         ids=["data-parallel", "2-D"])
def test_flops_and_memory_compared_with_xla(mesh, layout):
    """README: FLOPs and memory are compared with XLA's cost_analysis() and memory_analysis().

    A loop-free MLP whose time is in its matmuls: XLA counts them as we do (2 flops per
    multiply-add), so per-device flops agree within 3%; XLA's memory (arguments, outputs and
    scratch, aliased buffers once) is the same order as the predicted peak.
    """
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    ex = run(g, mesh, layout)
    rows = ex.comparison.set_index("quantity")
    assert rows.loc["flops per device", "compiled"] == ex.xla_flops > 0
    assert ex.xla_flops == pytest.approx(ex.predicted.flops, rel=0.03)
    assert rows.loc["memory bytes per device", "compiled"] == ex.xla_memory_bytes > 0
    assert 0.5 < ex.xla_memory_bytes / ex.predicted.memory_bytes < 2
