"""benchmarks/published.py's efficiency calibration on a publication's one-node run: the
efficiency found makes the predicted step take the time the publication measured (its
tokens/s, never the cost model), and nothing else does."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import published as bench  # noqa: E402

from autolayout import models  # noqa: E402
from autolayout.costmodel import predict  # noqa: E402
from autolayout.reporting.published_runs import RUNS  # noqa: E402


def _tokens_per_s(run, efficiency: float) -> float:
    g = getattr(models, run.model.fn)(**run.zoo_kwargs(remat=bench.TRACE_REMAT))
    hw = bench.hardware(run).replace(efficiency=efficiency)
    kw = run.model.as_kwargs()
    return kw["batch"] * kw["length"] / predict(g, run.mesh.value, bench.PUBLISHED_LAYOUT[run.name], hardware=hw).time_s


def test_calibrated_efficiency_reproduces_the_published_throughput():
    run = RUNS[bench.CALIBRATE["mpt-70b-h100-64"]]
    assert run.slow_axis is None  # one node: no collective crosses InfiniBand
    eff, step_s = bench.calibrate_efficiency(run)
    kw = run.model.as_kwargs()
    assert kw["batch"] * kw["length"] / step_s == pytest.approx(16022, rel=2e-3)  # llm-foundry's table, T/s
    # bracketed: slower below, faster above (the bisection's tolerance is 1e-4)
    assert _tokens_per_s(run, eff - 0.01) < run.tokens_per_s.value < _tokens_per_s(run, eff + 0.01)
    assert 0 < eff < 0.75  # below the profile's judged 0.75: the framework reaches less per GPU


def test_calibration_needs_a_published_throughput_and_layout():
    with pytest.raises(ValueError, match="'megatron-gpt3-175b-h100-96' needs a published tokens/s and a layout"):
        bench.calibrate_efficiency(RUNS["megatron-gpt3-175b-h100-96"])
