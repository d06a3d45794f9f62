"""Measure in the loop (issue 12.6): ``search(..., verify=k)`` runs the k best layouts here.

References: the k best layouts are held against an enumeration in test_search.py; here the
rows are held against ``predict`` (predicted time, memory), ``best_layouts`` (which layouts,
in which order), the unsharded ``jax.jit`` step (each run's outputs) and the measured
medians themselves (the winner is the measured fastest, never the slowest).
"""
from __future__ import annotations

import dataclasses
import math
import statistics

import jax
import pytest

import autolayout
from autolayout import models
from autolayout.core import LayoutError
from autolayout.costmodel.predict import predict
from autolayout.costmodel.profiles import get_hardware
from autolayout.exec.verify import VerifyError, verify
from autolayout.search.api import SearchResult, Verified, best_layouts

FAST = {"xla_backend_optimization_level": 0}  # ~2x faster XLA CPU compiles; same numbers (test_exec.py)
MESH = "rows:2,cols:4"
# rules only (no storage stages or region rules): the k best then differ in their splits
RULES = dict(shard_weight_update=False, regions=False, remat="none", memory_limit=math.inf)
_G: dict = {}


def small():
    if "g" not in _G:
        _G["g"] = models.mlp(batch=256, d_io=128, d_hidden=512)
    return _G["g"]


def test_verify_returns_the_measured_fastest_of_the_k_best(cpu_devices):
    g, k = small(), 3
    r = verify(g, MESH, k, hardware="cpu", repeats=4, devices=cpu_devices, compiler_options=FAST, **RULES)
    assert isinstance(r, SearchResult) and len(r.verified) == k
    want = best_layouts(g, MESH, k, hardware="cpu", distinct="rules", **RULES)
    assert [str(v.layout) for v in r.verified] == [str(w.layout) for w in want]  # predicted order
    for v in r.verified:
        assert isinstance(v, Verified) and v.ok and v.error == ""
        c = predict(g, MESH, v.layout, hardware="cpu")
        assert v.predicted_time_s == pytest.approx(c.time_s, rel=1e-12)
        assert v.memory_bytes == c.memory_bytes
        assert len(v.measured_times_s) == 4 and all(t > 0 for t in v.measured_times_s)
        assert v.measured_time_s == statistics.median(v.measured_times_s)
        assert v.max_rel_error < 1e-4 and v.collectives_match  # the run computes the unsharded step's numbers
        xla = v.execution.xla_memory  # the compiled step's memory_analysis()
        assert v.xla_memory_bytes == xla["argument"] + xla["output"] + xla["temp"] - xla["alias"] > 0
    measured = [v.measured_time_s for v in r.verified]
    won = [v for v in r.verified if v.layout == r.layout]
    assert len(won) == 1 and won[0].measured_time_s == min(measured)
    assert won[0].measured_time_s < max(measured) or len(set(measured)) == 1  # never the measured slowest
    assert r.cost.time_s == pytest.approx(predict(g, MESH, r.layout, hardware="cpu").time_s, rel=1e-12)
    assert any(n.startswith(f"verify={k}: measured on 8 cpu devices") for n in r.notes)
    text = r.summary()
    assert "predicted" in text and "measured" in text and "XLA memory" in text and text.count("\n*") == 1
    assert len([line for line in text.splitlines() if " ok" in line]) == k


def test_top_level_search_verify(cpu_devices):
    """``autolayout.search(..., verify=k)`` (the public name) with the devices' own profile."""
    g = small()
    r = autolayout.search(g, MESH, hardware="cpu", verify=2, repeats=2, **RULES)
    assert len(r.verified) == 2 and all(v.ok for v in r.verified)
    assert min(v.measured_time_s for v in r.verified) == next(v.measured_time_s for v in r.verified
                                                             if v.layout == r.layout)
    plain = autolayout.search(g, MESH, hardware="cpu", **RULES)  # without verify: the search alone
    assert plain.verified == () and str(plain.layout) == str(r.verified[0].layout)


def test_verify_ranks_the_programs_it_runs_with_attention_as_traced(cpu_devices):
    """A profile of these devices that prices fused attention (here the cpu one with it on): the
    k best are searched and predicted with it off, since the runs materialise the scores."""
    g = models.transformer_lm(d_model=16, d_ff=32, heads=4, d_kv=8, n_layers=1, vocab=32, batch=8, length=16)
    fused = get_hardware("cpu").replace(name="cpu-fused", fused_attention=True)
    r = verify(g, MESH, 2, hardware=fused, repeats=1, devices=cpu_devices, compiler_options=FAST,
               reference=False, **RULES)
    as_run = fused.replace(fused_attention=False)
    want = best_layouts(g, MESH, 2, hardware=as_run, distinct="rules", **RULES)
    assert [str(v.layout) for v in r.verified] == [str(w.layout) for w in want]
    for v in r.verified:
        assert v.predicted_time_s == pytest.approx(predict(g, MESH, v.layout, hardware=as_run).time_s, rel=1e-12)
        assert v.predicted_time_s != pytest.approx(predict(g, MESH, v.layout, hardware=fused).time_s, rel=1e-6)
    assert any("fused_attention off" in n for n in r.notes)


def test_a_failed_run_keeps_its_row_with_the_error(cpu_devices, monkeypatch):
    from autolayout.exec import runner

    g, k = small(), 3
    first = best_layouts(g, MESH, k, hardware="cpu", distinct="rules", **RULES)[0].layout
    real = runner.execute

    def execute(graph, mesh, layout, **kw):
        if layout == first:
            raise ValueError("simulated lowering failure")
        return real(graph, mesh, layout, **kw)

    monkeypatch.setattr(runner, "execute", execute)
    r = verify(g, MESH, k, hardware="cpu", repeats=2, devices=cpu_devices, compiler_options=FAST, **RULES)
    assert len(r.verified) == k
    bad = r.verified[0]
    assert bad.layout == first and not bad.ok and bad.error == "ValueError: simulated lowering failure"
    assert math.isnan(bad.measured_time_s) and bad.execution is None
    assert r.layout != first and all(v.ok for v in r.verified[1:])
    assert any("1 did not run" in n for n in r.notes)
    assert "error: ValueError: simulated lowering failure" in r.summary()


def test_no_layout_ran_is_an_error(cpu_devices, monkeypatch):
    from autolayout.exec import runner

    def execute(graph, mesh, layout, **kw):
        raise NotImplementedError("simulated: op not supported")

    monkeypatch.setattr(runner, "execute", execute)
    with pytest.raises(VerifyError, match=r"verify=2: none of the 2 best layouts of graph .* ran: #1 .*"
                                          r"NotImplementedError: simulated: op not supported; #2"):
        verify(small(), MESH, 2, hardware="cpu", devices=cpu_devices, **RULES)


@pytest.mark.parametrize("k", [0, -2, 1.5, True, "3"], ids=repr)
def test_bad_verify_count(k):
    with pytest.raises(LayoutError, match=r"verify must be a positive integer \(how many of the best layouts to run "
                                          r"here\), got"):
        autolayout.search(small(), MESH, hardware="cpu", verify=k)
    with pytest.raises(LayoutError, match=r"k must be a positive integer"):
        verify(small(), MESH, k, hardware="cpu")


def test_verify_needs_a_mesh_and_the_devices_profile():
    with pytest.raises(LayoutError, match=r"verify=2 runs layouts on a mesh: give mesh="):
        autolayout.search(small(), num_devices=8, hardware="cpu", verify=2)
    with pytest.raises(VerifyError, match=r"hardware='tpu-v3' is the built-in profile of other hardware.*"
                                          r"Pass hardware='cpu'"):
        autolayout.search(small(), MESH, verify=2)  # the default target profile, on CPU devices
    with pytest.raises(LayoutError, match=r"repeats must be a positive integer"):
        verify(small(), MESH, 2, hardware="cpu", repeats=0)


def test_each_row_keeps_its_run_with_the_interleaved_timing(cpu_devices):
    r = verify(small(), MESH, 2, hardware="cpu", repeats=3, devices=cpu_devices, compiler_options=FAST, **RULES)
    for v in r.verified:
        ex = v.execution
        assert ex is not None and ex.layout == v.layout
        assert ex.step_times_s == v.measured_times_s and ex.step_time_s == v.measured_time_s
        row = ex.comparison.set_index("quantity").loc["step time s"]
        assert row["measured"] == v.measured_time_s


def test_verify_runs_layouts_with_different_rules_by_default(cpu_devices):
    """With storage sharding on, the k layouts run differ in their rules (not only in ZeRO stages)."""
    r = verify(small(), MESH, 3, hardware="cpu", repeats=1, devices=cpu_devices, compiler_options=FAST,
               memory_limit=math.inf, regions=False)
    rules = [str(type(v.layout)(v.layout.rules).canonical()) + v.layout.remat for v in r.verified]
    assert len(r.verified) == 3 and len(set(rules)) == 3
    assert any(v.layout.storage for v in r.verified)


def test_measure_compares_every_run_with_one_reference(cpu_devices):
    """measure's error figures equal execute's own (its reference run per layout), and its
    timing is the interleaved rounds'."""
    from autolayout.exec import execute
    from autolayout.exec.runner import make_args
    from autolayout.exec.verify import measure

    g = small()
    layouts = ["batch:rows;hidden:cols", "hidden:rows,cols"]
    runs = measure(g, MESH, layouts, hardware="cpu", repeats=3, devices=cpu_devices, compiler_options=FAST)
    for lay, ex in zip(layouts, runs):
        own = execute(g, MESH, lay, args=make_args(g, 0), hardware="cpu", repeats=1, devices=cpu_devices,
                      compiler_options=FAST)
        assert ex.max_abs_error == own.max_abs_error and ex.max_rel_error == own.max_rel_error
        assert len(ex.step_times_s) == 3 and ex.step_time_s == statistics.median(ex.step_times_s)
        assert ex.collectives_match


def test_a_run_with_wrong_outputs_cannot_win(cpu_devices, monkeypatch):
    """A layout whose program computes something else (e.g. an executable XLA:CPU reloaded
    wrongly from a persistent cache) is kept as an error row, never chosen as the fastest."""
    from autolayout.exec import runner

    g, k = small(), 3
    first = best_layouts(g, MESH, k, hardware="cpu", distinct="rules", **RULES)[0].layout
    real = runner.execute

    def execute(graph, mesh, layout, **kw):
        ex = real(graph, mesh, layout, **kw)
        if layout == first:  # the same run, its outputs off by 1%
            ex = dataclasses.replace(ex, outputs=jax.tree_util.tree_map(lambda x: x * 1.01, ex.outputs))
        return ex

    monkeypatch.setattr(runner, "execute", execute)
    r = verify(g, MESH, k, hardware="cpu", repeats=2, devices=cpu_devices, compiler_options=FAST, **RULES)
    bad = r.verified[0]
    assert bad.layout == first and not bad.ok and bad.error.startswith("OutputMismatch: max relative error")
    assert bad.max_rel_error == pytest.approx(0.01, rel=1e-3)
    assert r.layout != first and all(v.ok for v in r.verified[1:])


def test_a_run_over_the_memory_limit_when_compiled_cannot_win(cpu_devices, monkeypatch):
    """A layout whose compiled step takes more memory per device than the limit by XLA's own
    memory_analysis() (the memory model under-predicted it) is kept as an error row, never chosen.
    Here XLA's figure for the first layout is raised above a 1 GiB limit that every prediction fits."""
    from autolayout.exec import runner

    g, k = small(), 3
    rules = {**RULES, "memory_limit": "1GiB"}
    first = best_layouts(g, MESH, k, hardware="cpu", distinct="rules", **rules)[0].layout
    real = runner.execute

    def execute(graph, mesh, layout, **kw):
        ex = real(graph, mesh, layout, **kw)
        if layout == first:  # the same run, XLA's temp heap 1 GiB larger
            ex = dataclasses.replace(ex, xla_memory={**ex.xla_memory, "temp": ex.xla_memory["temp"] + 2 ** 30})
        return ex

    monkeypatch.setattr(runner, "execute", execute)
    r = verify(g, MESH, k, hardware="cpu", repeats=2, devices=cpu_devices, compiler_options=FAST, **rules)
    bad = r.verified[0]
    assert bad.layout == first and not bad.ok and bad.xla_memory_bytes > 2 ** 30
    assert bad.xla_memory_bytes == bad.execution.xla_memory_bytes  # the raised figure, as the row reports it
    assert bad.error.startswith(f"OverMemory: the compiled step takes {bad.xla_memory_bytes / 2 ** 20:.2f} MiB per "
                                "device (XLA's memory_analysis), above memory_limit 1024.00 MiB")
    assert r.layout != first and all(v.ok and v.xla_memory_bytes <= 2 ** 30 for v in r.verified[1:])


def test_over_memory_is_said_only_above_xlas_figure(cpu_devices):
    """:func:`over_memory` against a run's own memory_analysis(): nothing at XLA's figure, the
    figures and the fix one byte below it."""
    from autolayout.exec import execute
    from autolayout.exec.verify import over_memory

    ex = execute(small(), MESH, "batch:rows,cols", repeats=1, reference=False, compiler_options=FAST)
    xla = ex.xla_memory["argument"] + ex.xla_memory["output"] + ex.xla_memory["temp"] - ex.xla_memory["alias"]
    assert over_memory(ex, xla) == ""
    said = over_memory(ex, xla - 1)
    assert said.startswith(f"OverMemory: the compiled step takes {xla / 2 ** 20:.2f} MiB per device")
    assert f"predicted {ex.predicted.memory_bytes / 2 ** 20:.2f} MiB" in said and "headroom" in said
