"""Calibration fits (autolayout.exec.calibrate): they recover known parameters from
synthetic samples made by independent hand formulas, and every failure raises a
CalibrationError saying what was measured and what to change (no silent fallback)."""
from __future__ import annotations

import importlib
import math
import re
import time

import numpy as np
import pytest

from autolayout import models
from autolayout.costmodel.collectives import collective_time
from autolayout.costmodel.hardware import IN_PROCESS, SWITCH, Hardware, Link
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.predict import predict
from autolayout.exec.calibrate import (CalibrationError, StepSample, fit_alpha_beta, fit_step_profile,
                                       nnls_relative, step_terms)

MESH = "rows:2,cols:4"
# the module (autolayout.exec re-exports its function calibrate under the same name)
calibrate_module = importlib.import_module("autolayout.exec.calibrate")


def hand_time(kind: str, v: float, n: int, alpha: float, bw: float) -> float:
    """Ring/pairwise formulas written out by hand (Thakur, Rabenseifner & Gropp 2005;
    nccl-tests PERFORMANCE.md): operand ``v`` bytes on one device, switch topology."""
    if kind == "all-reduce":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * v / bw
    if kind == "all-gather":  # v is the local shard; n*v gathered
        return (n - 1) * alpha + (n - 1) * v / bw
    return (n - 1) * alpha + (n - 1) / n * v / bw  # reduce-scatter, all-to-all (pairwise)


# ---------------------------------------------------------------------------- nnls
def test_nnls_relative_exact_and_constrained():
    a = np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 5.0]])
    x = np.array([0.5, 2.0])
    assert np.allclose(nnls_relative(a, a @ x), x)
    # times that fall as column 1 grows: the unconstrained fit would make its weight negative
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    t = np.array([3.0, 2.0, 1.0])
    x = nnls_relative(a, t)
    assert x[1] == 0.0 and x[0] > 0
    # one column, relative errors: minimise sum((x*1/t - 1)^2) -> x = sum(1/t) / sum(1/t^2) by hand
    inv = 1 / t
    assert math.isclose(x[0], inv.sum() / (inv ** 2).sum(), rel_tol=1e-9)


def test_nnls_relative_rejects_bad_input():
    with pytest.raises(ValueError, match="positive times"):
        nnls_relative(np.ones((2, 1)), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="matrix"):
        nnls_relative(np.ones((2, 1)), np.ones(3))


# ------------------------------------------------------------------- alpha / beta
@pytest.mark.parametrize("alpha,bw", [(20e-6, 2e9), (0.0, 5e8), (3e-6, 1e11)])
def test_fit_alpha_beta_recovers_hand_formula(alpha, bw):
    samples = [(kind, float(v), n, hand_time(kind, v, n, alpha, bw))
               for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
               for v in (4096, 65536, 1 << 20) for n in (2, 4)]
    a, b = fit_alpha_beta(samples)
    assert math.isclose(a, alpha, rel_tol=1e-6, abs_tol=1e-12) and math.isclose(b, bw, rel_tol=1e-6)


def test_fit_alpha_beta_without_samples_raises():
    with pytest.raises(CalibrationError, match="no usable sample"):
        fit_alpha_beta([])
    with pytest.raises(CalibrationError, match="no usable sample"):
        fit_alpha_beta([("all-reduce", 4096.0, 1, 1e-5)])  # group size 1 moves nothing


def test_fit_alpha_beta_times_that_do_not_grow_raise():
    # larger operands measured *faster*: no bandwidth can be read (noise)
    samples = [("all-reduce", 4096.0, 4, 3e-4), ("all-reduce", 1048576.0, 4, 1e-4),
               ("all-gather", 1024.0, 4, 3e-4), ("all-gather", 262144.0, 4, 1e-4)]
    with pytest.raises(CalibrationError, match=r"do not grow with the operand size.*sizes \[1024, 4096"):
        fit_alpha_beta(samples, what="mesh axis cols:4")


# ---------------------------------------------------------------- timing noise
def test_per_iter_lost_in_noise_raises():
    """A loop whose longer runs are not slower (here: the short run is the slow one, as noise
    can make it): the slope is noise. Deterministic: the short run sleeps 10x longer."""
    def flat(x, k):
        time.sleep(0.02 if k == 1 else 0.002)
        return x
    with pytest.raises(CalibrationError, match=r"a 64x64 float32 matmul.*lost in timing noise.*repeats="):
        calibrate_module._per_iter(flat, 0, 1, 2, 1, "a 64x64 float32 matmul")


def test_host_memory_unreadable_raises(monkeypatch):
    class Dev:
        platform = "cpu"

        def memory_stats(self):
            return None

    class JMesh:
        devices = np.array([Dev()] * 8)

    def broken(name):
        raise ValueError(f"unknown {name}")
    monkeypatch.setattr(calibrate_module.os, "sysconf", broken)
    with pytest.raises(CalibrationError, match="memory_bytes="):
        calibrate_module._host_memory_per_device(JMesh())


# ------------------------------------------------------------------- step refit
def _cpu_like() -> Hardware:
    return get_hardware("cpu").replace(link=Link(1e9, 30e-6, SWITCH), axis_links=())


def test_fit_step_profile_recovers_a_known_profile():
    """Step times made by a known profile (compute 1.4x slower, other links, a per-op
    overhead) are fitted back to it: the four numbers are the constants chosen here."""
    base = _cpu_like()
    c, alpha, bw, overhead = 1.4, 80e-6, 3e8, 15e-6
    truth = base.replace(peak_flops={k: v / c for k, v in base.peak_flops}, hbm_bandwidth=base.hbm_bandwidth / c,
                         link=Link(bw, alpha, SWITCH), op_overhead_s=overhead)
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    t = models.transformer_lm(d_model=16, d_ff=32, heads=4, d_kv=8, n_layers=1, vocab=32, batch=8, length=8)
    samples = [StepSample(gr, MESH, lay, predict(gr, MESH, lay, hardware=truth).time_s)
               for gr, lays in ((g, ["", "batch:rows,cols", "hidden:cols;batch:rows", "io:rows,cols"]),
                                (t, ["batch:rows,cols", "heads:cols;batch:rows", "vocab:rows,cols"]))
               for lay in lays]
    fit = fit_step_profile(base, samples)
    assert math.isclose(fit.compute_scale, c, rel_tol=1e-6)
    assert math.isclose(fit.link.latency, alpha, rel_tol=1e-6)
    assert math.isclose(fit.link.bandwidth, bw, rel_tol=1e-6)
    assert math.isclose(fit.op_overhead_s, overhead, rel_tol=1e-6)
    assert fit.median_abs_rel_error < 1e-9 and fit.samples == len(samples)
    assert math.isclose(fit.hardware.peak("float32"), base.peak("float32") / c, rel_tol=1e-9)
    assert not fit.hardware.async_collectives
    assert any("refitted to 7 measured steps" in s for s in fit.hardware.sources)


def test_fit_step_profile_on_one_device_fits_compute_and_overhead_only():
    """Steps on one device (no collective: benchmarks/gpu_validate.py on one GPU) made by a
    known profile are fitted back to its compute scale and per-op overhead, on a profile that
    overlaps collectives (the GPU ones); its links are kept, not fitted."""
    base = get_hardware("h200").replace(fused_attention=False)
    c, overhead = 1.3, 7e-6
    truth = base.replace(peak_flops={k: v / c for k, v in base.peak_flops}, hbm_bandwidth=base.hbm_bandwidth / c,
                         op_overhead_s=overhead)
    graphs = [models.mlp(batch=64, d_io=32, d_hidden=128), models.mlp(batch=4096, d_io=1024, d_hidden=4096),
              models.transformer_lm(d_model=16, d_ff=32, heads=4, d_kv=8, n_layers=1, vocab=32, batch=8, length=8),
              models.transformer_lm(d_model=256, d_ff=1024, heads=4, d_kv=64, n_layers=2, vocab=512, batch=8,
                                    length=128)]
    samples = [StepSample(g, "d:1", None, predict(g, "d:1", None, hardware=truth).time_s) for g in graphs]
    fit = fit_step_profile(base, samples)
    assert math.isclose(fit.compute_scale, c, rel_tol=1e-6)
    assert math.isclose(fit.op_overhead_s, overhead, rel_tol=1e-6)
    assert fit.link == base.link and fit.hardware.async_collectives and fit.hardware.axis_links == base.axis_links
    assert math.isclose(fit.hardware.peak("bfloat16"), base.peak("bfloat16") / c, rel_tol=1e-9)
    assert any("without collectives" in s for s in fit.hardware.sources)


def test_op_overhead_is_priced_once_per_executed_op():
    """``op_overhead_s`` adds to the step once per executed op: the MLP's ops counted by hand
    from its graph (every op but inputs, parameters, optimizer state and constants)."""
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    executed = sum(op.multiplicity for op in g.ops() if op.kind not in ("input", "param", "opt_state", "constant"))
    hw = _cpu_like()
    for lay in ("", "batch:rows,cols", "hidden:cols"):
        base = predict(g, MESH, lay, hardware=hw)
        more = predict(g, MESH, lay, hardware=hw.replace(op_overhead_s=1e-3))
        assert math.isclose(more.time_s - base.time_s, executed * 1e-3, rel_tol=1e-9)
        assert math.isclose(more.comm_s, base.comm_s)
    with pytest.raises(ValueError, match="op_overhead_s must be a finite number >= 0"):
        hw.replace(op_overhead_s=-1e-6)


def test_fit_step_profile_failures_raise():
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    with pytest.raises(CalibrationError, match="at least 4 needed"):
        fit_step_profile(_cpu_like(), [StepSample(g, MESH, "", 1e-3)])
    bad = [StepSample(g, MESH, lay, 1e-3) for lay in ("", "batch:rows", "batch:cols", "hidden:cols")]
    with pytest.raises(CalibrationError, match="async_collectives=True"):
        fit_step_profile(_cpu_like().replace(async_collectives=True), bad)
    zero = bad[:3] + [StepSample(g, MESH, "io:rows", 0.0)]
    with pytest.raises(CalibrationError, match="not positive"):
        fit_step_profile(_cpu_like(), zero)
    # times that follow the number of collective steps alone (a latency-only machine, no
    # compute time): neither a compute nor a bandwidth term can be read from them
    latency_only = get_hardware("cpu").replace(peak_flops={"float32": 1e30}, hbm_bandwidth=1e30,
                                               link=Link(float("inf"), 50e-6, SWITCH), axis_links=())
    flat = [StepSample(g, MESH, lay, predict(g, MESH, lay, hardware=latency_only).time_s)
            for lay in ("batch:rows", "batch:cols", "batch:rows,cols", "hidden:cols", "io:rows")]
    with pytest.raises(CalibrationError, match="no (compute|bandwidth) term"):
        fit_step_profile(_cpu_like(), flat)


# ------------------------------------------------------------- reporting wrapper
def test_calibrated_raises_after_implausible_attempts(monkeypatch):
    from autolayout import exec as exec_pkg
    from autolayout.reporting.devices import calibrated

    absurd = get_hardware("cpu").replace(peak_flops={"float32": 1e15})
    calls = []

    def fake(mesh, **kw):
        calls.append(mesh)
        return absurd
    monkeypatch.setattr(exec_pkg, "calibrate", fake)

    class Dev:
        platform = "cpu"
    with pytest.raises(CalibrationError, match=r"failed 2 time\(s\): implausible 1e\+06 GFLOP/s.*quieter machine"):
        calibrated(MESH, [Dev()] * 8, attempts=2)
    assert len(calls) == 2


def test_fit_step_profile_scales_dot_operand_copies_with_compute():
    """On a profile that prices XLA:CPU's dot operand copies (at HBM bandwidth, part of the
    compute), step times made by a known profile (compute 1.6x slower, other link and
    overhead) are fitted back to the constants chosen here, copies included, and the
    fitted profile keeps pricing them."""
    base = _cpu_like().replace(dot_operand_copies=True)
    c, alpha, bw, overhead = 1.6, 50e-6, 4e8, 9e-6
    truth = base.replace(peak_flops={k: v / c for k, v in base.peak_flops}, hbm_bandwidth=base.hbm_bandwidth / c,
                         link=Link(bw, alpha, SWITCH), op_overhead_s=overhead)
    g = models.moe()
    lays = ["", "d_ff:cols", "experts:rows;d_ff:cols", "d_model:rows,cols", "batch:rows;capacity:cols",
            "length:cols;capacity:rows"]
    samples = [StepSample(g, MESH, lay, predict(g, MESH, lay, hardware=truth).time_s) for lay in lays]
    assert predict(g, MESH, "d_ff:cols", hardware=base).compute_s > \
        predict(g, MESH, "d_ff:cols", hardware=base.replace(dot_operand_copies=False)).compute_s
    fit = fit_step_profile(base, samples)
    assert math.isclose(fit.compute_scale, c, rel_tol=1e-6)
    assert math.isclose(fit.link.bandwidth, bw, rel_tol=1e-6)
    assert math.isclose(fit.op_overhead_s, overhead, rel_tol=1e-6)
    assert fit.hardware.dot_operand_copies and fit.median_abs_rel_error < 1e-9


# ------------------------------------------------- in-process links (XLA:CPU devices)
ROUNDS = {2: 1, 3: 2, 4: 2, 8: 3}  # ceil(log2 n), written out


def hand_in_process(kind: str, v: float, n: int, alpha: float, bw: float) -> float:
    """One rendezvous of ``n`` threads: ``ceil(log2 n)`` alpha whatever the kind, the bytes as
    the ring formulas of :func:`hand_time`."""
    return ROUNDS[n] * alpha + hand_time(kind, v, n, 0.0, bw)


def test_in_process_collective_time_by_hand():
    """Latency once per collective, the same for every kind (an all-reduce is one rendezvous,
    not twice a reduce-scatter's ring steps); over two axes one rendezvous of all devices."""
    link = Link(1e9, 1e-5, IN_PROCESS)
    for kind in ("all-reduce", "reduce-scatter", "all-gather", "all-to-all"):
        for n in (2, 3, 4, 8):
            assert math.isclose(collective_time(kind, 0.0, [(n, link)]), ROUNDS[n] * 1e-5, rel_tol=1e-12)
            assert math.isclose(collective_time(kind, 4e6, [(n, link)]), hand_in_process(kind, 4e6, n, 1e-5, 1e9),
                                rel_tol=1e-12)
    # all-reduce over rows:2 x cols:4: one rendezvous of 8 (3 rounds), the bytes of a flat ring of 8
    assert math.isclose(collective_time("all-reduce", 8e6, [(2, link), (4, link)]),
                        3e-5 + 2 * 7 / 8 * 8e6 / 1e9, rel_tol=1e-12)
    # the ring model of the same link charges an all-reduce twice a reduce-scatter's steps
    ring = Link(1e9, 1e-5, SWITCH)
    assert collective_time("all-reduce", 0.0, [(4, ring)]) == pytest.approx(2 * collective_time(
        "reduce-scatter", 0.0, [(4, ring)]))


@pytest.mark.parametrize("alpha,bw", [(40e-6, 4e8), (5e-6, 2e9)])
def test_fit_alpha_beta_in_process_recovers_hand_formula(alpha, bw):
    samples = [(kind, float(v), n, hand_in_process(kind, v, n, alpha, bw))
               for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
               for v in (4096, 65536, 1 << 20) for n in (2, 4, 8)]
    a, b = fit_alpha_beta(samples, topology=IN_PROCESS)
    assert math.isclose(a, alpha, rel_tol=1e-6) and math.isclose(b, bw, rel_tol=1e-6)
    # the same samples read with the ring model's steps fit worse: the latency is not the ring's
    switch_alpha, _ = fit_alpha_beta(samples, topology=SWITCH)
    assert not math.isclose(switch_alpha, alpha, rel_tol=0.05)


def _hlo_rendezvous_rounds(hlo_text: str) -> int:
    """Sum over the collectives of an HLO module (one per buffer, as XLA:CPU runs them) of
    ceil(log2 group size), read off ``replica_groups={{...},...}`` by hand."""
    total = 0
    for line in hlo_text.splitlines():
        m = re.search(r"\b(all-reduce|reduce-scatter|all-gather|all-to-all)\(.*replica_groups=\{\{([\d,]+)\}", line)
        if m:
            total += ROUNDS[len(m.group(2).split(","))]
    return total


def test_in_process_latency_counts_the_compiled_collectives():
    """On a latency-only in-process profile the predicted communication time of the MLP is
    alpha x the rendezvous rounds of the compiled program's collectives (XLA's HLO read by
    hand): the weight-update-sharded layout, whose reduce-scatter + all-gather pairs replace
    all-reduces, pays one more rendezvous per sharded parameter (the ring model priced them
    equal). The step refit's latency column is the same count."""
    from autolayout.exec import execute

    alpha = 1e-5
    hw = get_hardware("cpu").replace(link=Link(float("inf"), alpha, IN_PROCESS), axis_links=())
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    plain, wus = "hidden:cols;batch:rows", "hidden:cols;batch:rows|bias:rows@2;v:rows;w:rows"
    rounds = {}
    for lay in (plain, wus):
        ex = execute(g, MESH, lay, hardware=hw, repeats=1, reference=False,
                     compiler_options={"xla_backend_optimization_level": 0})
        rounds[lay] = _hlo_rendezvous_rounds(ex.hlo_text)
        assert math.isclose(predict(g, MESH, lay, hardware=hw).comm_s, alpha * rounds[lay], rel_tol=1e-9)
        assert math.isclose(step_terms(hw, [StepSample(g, MESH, lay, 1.0)])[0, 1], rounds[lay], rel_tol=1e-9)
    # the mlp's three parameters each trade one all-reduce over rows:2 for a reduce-scatter and an all-gather
    assert rounds[wus] - rounds[plain] == 3
    ring = hw.replace(link=Link(float("inf"), alpha, SWITCH))
    assert math.isclose(predict(g, MESH, wus, hardware=ring).comm_s, predict(g, MESH, plain, hardware=ring).comm_s)


def test_fit_step_profile_keeps_in_process_links():
    """Step times made by a known in-process profile are fitted back to it, and the fitted
    profile keeps the topology (its latency steps are rendezvous rounds)."""
    base = _cpu_like().replace(link=Link(1e9, 30e-6, IN_PROCESS))
    c, alpha, bw, overhead = 1.3, 70e-6, 3e8, 8e-6
    truth = base.replace(peak_flops={k: v / c for k, v in base.peak_flops}, hbm_bandwidth=base.hbm_bandwidth / c,
                         link=Link(bw, alpha, IN_PROCESS), op_overhead_s=overhead)
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    lays = ["", "batch:rows,cols", "hidden:cols;batch:rows", "io:rows,cols", "hidden:cols;batch:rows|*:rows",
            "batch:cols|*:cols"]
    fit = fit_step_profile(base, [StepSample(g, MESH, lay, predict(g, MESH, lay, hardware=truth).time_s)
                                  for lay in lays])
    assert fit.link.topology == IN_PROCESS and fit.hardware.link.topology == IN_PROCESS
    assert math.isclose(fit.compute_scale, c, rel_tol=1e-6) and math.isclose(fit.link.latency, alpha, rel_tol=1e-6)
    assert math.isclose(fit.link.bandwidth, bw, rel_tol=1e-6) and math.isclose(fit.op_overhead_s, overhead,
                                                                                rel_tol=1e-6)
