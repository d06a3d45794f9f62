"""The cost model against what one NVIDIA H200 measured (``reports/gpu``: the committed output of
``benchmarks/gpu_validate.py``, jax 0.11.2). The references are measurements, never the cost
model: step times, XLA:GPU's ``memory_analysis`` and the attention kernels' times. Runs without
a GPU: every prediction is made here, by tracing the same zoo models at the measured sizes.
"""
from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_report  # noqa: E402

GPU = ROOT / "reports" / "gpu"

# Steps whose predicted peak memory is off XLA:GPU's by more than 10%, each with the reason read
# from its compiled HLO (reports/gpu/hlo.zip, reports/gpu/findings.md): strict xfails.
MEMORY_OFF = {
    "gpt-tiny": "0.89 of XLA's live peak: a cuBLAS matmul's 32 MiB workspace (s8[33554432]) is live at it, and "
                "XLA computes the loss value last, in a softmax fusion reading the 64 MiB float32 logits, which so "
                "stay live through the backward scan, where the model's log-softmax is shared by the loss and its "
                "gradient and dead before it (findings.md)",
    "mlp-large": "0.80: XLA:GPU's multi-output fusion takes the bias add in beside the ReLU's backward select, so "
                 "the pre-activation is written apart from the forward matmul's result: four hidden-sized buffers "
                 "live at the fusion where the model holds three (the -mse step writes the add in a fusion of its "
                 "own, over that result, as the model does); and both matmuls reading the ReLU run on cuBLAS, each "
                 "after a copy of the ReLU of its own (fusion.19, fusion.20), buffers the model leaves out",
}


# The MLP and MoE steps again with a regression loss (gpu_validate.py --loss, measured_loss.jsonl):
# those off XLA:GPU's memory by more than 10%, with the reason read in buffers_loss.zip (strict xfails).
LOSS_MEMORY_OFF: dict[str, str] = {}


@lru_cache(maxsize=None)
def _measured() -> dict[str, dict]:
    return {r["name"]: r for r in gpu_report.load(str(GPU))[0] if "measured_s" in r}


@lru_cache(maxsize=None)
def _analysis() -> dict:
    return gpu_report.analyse(str(GPU))


def test_the_committed_measurements_are_whole():
    """18 steps measured, each with its times and XLA's memory figures, on an H200."""
    rows = _measured()
    assert len(rows) == 18 and set(MEMORY_OFF) <= set(rows)
    device = gpu_report.load(str(GPU))[1]
    assert device["device_kind"] == "NVIDIA H200" and device["profile"] == "h200"
    for r in rows.values():
        m = r["xla_memory"]
        assert r["xla_memory_bytes"] == m["argument"] + m["output"] + m["temp"] - m["alias"]
        assert len(r["step_times_s"]) == 10 and min(r["step_times_s"]) <= r["measured_s"] <= max(r["step_times_s"])


@pytest.mark.parametrize("name", sorted(_measured()))
def test_memory_within_ten_percent_of_xla_gpu(name, request):
    """Priced on the h200 profile with fused_attention off (XLA:GPU ran the attention as traced)."""
    if name in MEMORY_OFF:
        request.applymarker(pytest.mark.xfail(strict=True, reason=MEMORY_OFF[name]))
    r = next(r for r in _analysis()["rows"] if r["name"] == name)
    ratio = r["memory_bytes"] / r["xla_memory_bytes"]
    assert abs(ratio - 1) <= 0.10, f"{name}: predicted / XLA:GPU memory = {ratio:.3f}"


def test_refit_predicts_held_out_steps():
    """Issue 12's ranking targets on the held-out half of the H200 steps, after refitting the
    measured-ceilings profile's compute scale and per-op overhead on the other half: Spearman >=
    0.9, median |error| <= 20%. The datasheet profile ranks them too but is further off."""
    a = _analysis()
    held = a["stats"]["held-out"]
    assert held["refit"]["spearman"] >= 0.9 and held["refit"]["median_abs_error"] <= 0.20, held["refit"]
    assert held["sheet"]["spearman"] >= 0.9, held["sheet"]
    assert held["refit"]["median_abs_error"] < held["sheet"]["median_abs_error"]
    # the fit saw only the calibration half
    calib = [r["name"] for r in a["rows"] if r["half"] == "calibration"]
    assert len(calib) == 9 and a["fit"].samples == 9


def test_attention_regimes_priced_within_thirty_percent():
    """Forward + backward attention measured compiled by XLA (scores materialised) and by cuDNN's
    fused kernel (kernels.json): the model prices each regime from first principles within 30%
    (fused 0.70-1.27x, materialised 0.95-1.16x when measured), and the fused one 5x+ faster."""
    rows = _analysis()["attention"]
    assert len(rows) == 3
    for r in rows:
        assert 0.7 <= r["materialised_pred_s"] / r["xla_s"] <= 1.3, r
        assert 0.7 <= r["fused_pred_s"] / r["cudnn_s"] <= 1.3, r
        assert r["materialised_pred_s"] / r["fused_pred_s"] >= 5 and r["xla_s"] / r["cudnn_s"] >= 5


def test_replay_over_xla_gpu_schedule_is_its_memory_analysis():
    """benchmarks/xla_schedule_live.py's replay of the moe step's compiled HLO (XLA:GPU's schedule,
    the model's buffer rules) is XLA's ``memory_analysis()`` to 0.1%, where the model's traced order
    is 1.19 of it: the moe step's miss is the order. The replay refuses a program with loops."""
    import zipfile

    from xla_schedule_live import replay_peak

    m = _measured()["moe"]["xla_memory"]
    with zipfile.ZipFile(GPU / "hlo.zip") as z:
        peak, _ = replay_peak(z.read("moe.compiled.txt").decode())
        with pytest.raises(ValueError, match="while loops"):
            replay_peak(z.read("gpt-tiny.compiled.txt").decode())
    assert abs(peak / (m["argument"] + m["output"] + m["temp"] - m["alias"]) - 1) < 0.001


def test_xla_gpu_live_split_adds_up_to_memory_analysis(tmp_path):
    """``xla_live.live_peak`` of each step's buffer-assignment dump (``buffers.zip``, XLA:GPU's own
    files) splits XLA's ``memory_analysis`` exactly: live peak + output bytes idle at it + the temp
    heap's fragmentation = argument + output + temp - alias, for all 24 steps (the 6 with a regression
    loss too); ``live.jsonl`` holds
    those splits. The reference is XLA's figure, read on the GPU; the split is computed here."""
    import json
    import zipfile

    from xla_live import live_peak

    stored, measured = {}, dict(_measured())
    for suffix in ("", "_loss"):
        with open(GPU / f"live{suffix}.jsonl") as f:
            stored.update({v["name"]: v for v in map(json.loads, f)})
        with zipfile.ZipFile(GPU / f"buffers{suffix}.zip") as z:
            z.extractall(tmp_path)
    measured.update({r["name"]: r for r in _analysis()["loss_rows"]})
    assert set(stored) == set(measured) and len(measured) == 24
    for name, r in measured.items():
        split = live_peak(tmp_path / name)
        assert {k: v for k, v in split.items() if k != "module"} == {k: v for k, v in stored[name].items()
                                                                      if k != "name"}, name
        assert split["live_bytes"] + split["idle_output_bytes"] + split["heap_gap_bytes"] == r["xla_memory_bytes"]


@pytest.mark.parametrize("name", sorted(n for n, _, _ in gpu_report.gpu_validate_loss_configs()))
def test_regression_loss_memory_within_ten_percent_of_xla_gpu(name, request):
    """The MLP and MoE steps with ``loss="mse"`` (a loss gradient that needs the forward), priced on
    the h200 profile against XLA:GPU's ``memory_analysis`` read on the H200 (``measured_loss.jsonl``)."""
    if name in LOSS_MEMORY_OFF:
        request.applymarker(pytest.mark.xfail(strict=True, reason=LOSS_MEMORY_OFF[name]))
    r = next(r for r in _analysis()["loss_rows"] if r["name"] == name)
    assert r["kwargs"]["loss"] == "mse"
    ratio = r["memory_bytes"] / r["xla_memory_bytes"]
    assert abs(ratio - 1) <= 0.10, f"{name}: predicted / XLA:GPU memory = {ratio:.3f}"
