"""The hand memory calculation (benchmarks/hand_memory.py) against the papers' closed forms.

benchmarks/hand_memory.py is the independent reference the storage/SP/remat benchmarks
compare autolayout's predictions with; here its tensor-by-tensor counts are checked
against Korthikanti et al. 2022's equations and ZeRO's formula, its parameter counts
against the traced zoo graphs, and its figures against the issues' quoted targets.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import hand_memory as hm  # noqa: E402

from autolayout import models  # noqa: E402
from autolayout.reporting.published_runs import RUNS  # noqa: E402

GIB = 2**30
GPT3 = hm.Arch.from_zoo("transformer_lm", RUNS["gpt3-175b-v4-4096"].model.as_kwargs())


@pytest.mark.parametrize("name", list(RUNS))
def test_parameter_count_by_hand_equals_the_traced_graph(name):
    r = RUNS[name]
    for model in (r.model, *r.variants):
        g = getattr(models, model.fn)(**model.as_kwargs(), train=False)
        assert hm.count_params(hm.Arch.from_zoo(model.fn, model.as_kwargs())) == g.num_params()


@pytest.mark.parametrize("t", [1, 2, 8, 16])
@pytest.mark.parametrize("b", [1, 3])
def test_layer_activations_reproduce_korthikanti_equations(t, b):
    """Korthikanti et al. 2022 §4: per layer, 16-bit activations with dropout:
    eq. (1) sbh(34 + 5as/h) (t = 1), eq. (2) sbh(10 + 24/t + 5as/(ht)), eq. (4) with
    sequence parallelism sbh/t (34 + 5as/h)."""
    s, h, a = 2048, GPT3.d_model, GPT3.heads
    sbh = s * b * h
    tp = hm.layer_activation_bytes(GPT3, b, s, t, sp=False, dropout=True)
    sp = hm.layer_activation_bytes(GPT3, b, s, t, sp=True, dropout=True)
    assert tp == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert sp == pytest.approx(sbh / t * (34 + 5 * a * s / h), rel=1e-12)


def test_flash_attention_and_no_dropout_drop_the_score_and_mask_terms():
    s, b, h = 2048, 2, GPT3.d_model
    sbh = s * b * h
    assert hm.layer_activation_bytes(GPT3, b, s, flash=True) == 32 * sbh  # 34 - two 1-byte masks
    assert hm.layer_activation_bytes(GPT3, b, s, flash=True, dropout=True) == 34 * sbh


def test_persistent_state_is_zero_stage_3():
    """ZeRO (Rajbhandari et al. 2020) §5.3: (2 + 2 + K)Ψ / N_d with K = 12 — the zoo's
    float32 weights, gradients and two Adam moments are the same 16 bytes per parameter."""
    m = hm.hand_memory(hm.STRATEGIES[0])
    psi = hm.count_params(GPT3)
    assert m.persistent == pytest.approx((2 + 2 + 12) * psi / 4096, rel=1e-9)


def strategy(name: str) -> hm.Strategy:
    (st,) = [s for s in hm.STRATEGIES if s.name == name]
    return st


def test_gpt3_tp16_saved_layer_inputs_are_issue_11s_27_gib():
    m = hm.hand_memory(strategy("GPT-3 175B  TP16 x FSDP256"))
    assert m.saved / GIB == pytest.approx(27, rel=0.01)  # 6 x 2048 x 12288 x 2 B x 96 layers
    sp = hm.hand_memory(strategy("GPT-3 175B  TP16 x FSDP256 + SP"))
    assert sp.saved * 16 == m.saved


def test_gpt3_tp8_fsdp512_peak_is_near_issue_10s_18_gib():
    m = hm.hand_memory(strategy("GPT-3 175B  TP8 x FSDP512"))
    assert m.peak / GIB == pytest.approx(18, rel=0.1)


def test_llama2_70b_at_4m_tokens_needs_gradient_accumulation():
    """1024 x 4096 tokens of layer inputs over 64 GPUs are 80 GiB per GPU however they are
    split; 16 micro-batches bring them to 5 GiB."""
    one_step = [hm.hand_memory(strategy(n)) for n in ("LLaMA-2-70B  FSDP64, one step",
                                                      "LLaMA-2-70B  TP8 x FSDP8 + SP, one step")]
    assert {m.saved for m in one_step} == {1024 * 4096 * 8192 * 2 * 80 // 64}
    assert all(m.peak > m.hbm for m in one_step)
    micro = hm.hand_memory(strategy("LLaMA-2-70B  FSDP64, 16 microbatches"))
    assert micro.saved * 16 == one_step[0].saved and micro.peak < micro.hbm


def test_a_strategy_on_the_wrong_number_of_devices_is_an_error():
    st = replace(hm.STRATEGIES[0], tensor=4)
    with pytest.raises(ValueError, match=r"4 x 512 x 1 = 2048 devices, the run has 4096"):
        hm.hand_memory(st)


def test_the_script_prints_a_row_per_strategy(capsys):
    hm.main()
    out = capsys.readouterr().out
    assert all(st.name in out for st in hm.STRATEGIES)
