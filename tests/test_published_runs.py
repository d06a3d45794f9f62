"""Published runs (autolayout.reporting.published_runs): consistent, cited, traceable.

The published figures are checked against each other with the publications' own formulas
(PaLM's and llm-foundry's MFU definitions, MaxText's TFLOP/s over the chip's peak), and the
zoo models against the published parameter counts; nothing is recomputed with the cost model.
"""
from __future__ import annotations

import dataclasses
import math

import pytest

from autolayout import get_hardware, models
from autolayout.core import Mesh
from autolayout.reporting.published_runs import RUNS, Cited, PublishedRun, run

NAMES = list(RUNS)


def cited_fields(r: PublishedRun) -> list[tuple[str, Cited]]:
    return [(f.name, getattr(r, f.name)) for f in dataclasses.fields(r) if isinstance(getattr(r, f.name), Cited)]


_GRAPHS: dict[str, object] = {}


def forward_graph(name: str):
    """The run's zoo model, forward only, traced from ShapeDtypeStructs (nothing allocated)."""
    if name not in _GRAPHS:
        r = RUNS[name]
        _GRAPHS[name] = getattr(models, r.model.fn)(**r.zoo_kwargs(), train=False)
    return _GRAPHS[name]


@pytest.mark.parametrize("name", NAMES)
def test_every_figure_has_a_source(name):
    r = RUNS[name]
    assert r.kind in ("published", "target")
    for field, c in cited_fields(r):
        assert c.source.strip(), f"{name}.{field} has no source"
    assert r.model.source.strip()
    if r.kind == "published":
        assert r.mfu is not None or r.tflops_per_device is not None or r.tokens_per_s is not None
    else:
        assert r.mfu is None and r.tokens_per_s is None and r.unsourced


@pytest.mark.parametrize("name", NAMES)
def test_mesh_parallelism_and_batch_agree_with_the_device_count(name):
    r = RUNS[name]
    mesh = Mesh.parse(r.mesh.value)
    assert mesh.size == r.devices.value
    if r.slow_axis is not None:
        assert r.slow_axis in mesh.axis_names
    if r.parallelism is not None:
        assert r.parallelism.devices == r.devices.value
    micro = r.microbatches.value if r.microbatches is not None else 1
    assert r.model.as_kwargs()["batch"] * micro == r.global_batch.value
    assert r.model.as_kwargs()["length"] == r.length.value
    get_hardware(r.hardware)  # a known profile


@pytest.mark.parametrize("name", NAMES)
def test_the_zoo_model_traces_with_the_published_shapes(name):
    r = RUNS[name]
    g = forward_graph(name)
    kw = r.model.as_kwargs()
    assert g.dims["d_model"] == kw["d_model"] and g.dims["layers"] == kw["n_layers"]
    assert g.dims["batch"] == kw["batch"] and g.dims["vocab"] == kw["vocab"]


def test_zoo_kwargs_carry_the_published_dtypes_and_remat():
    mpt = RUNS["mpt-70b-h100-64"].zoo_kwargs()
    assert (mpt["param_dtype"], mpt["compute_dtype"], mpt["remat"]) == ("float32", "bfloat16", True)
    assert "compute_dtype" not in RUNS["palm-540b-v4-6144"].zoo_kwargs()  # not published
    assert RUNS["mpt-70b-h100-64"].zoo_kwargs(remat=False)["remat"] is False


# --------------------------------------------------------------------------- parameter counts
def test_llama2_70b_runs_have_the_published_count():
    for name in ("nemo-llama2-70b-h100-64-fp8", "llama2-70b-h100-64-4m"):
        assert forward_graph(name).num_params() == RUNS[name].published_params.value


def test_mpt_count_differs_by_the_untied_output_layer_and_the_dense_biases():
    """The benchmark's MPT-70B (learned positions, biases in every dense layer, tied output)
    vs the zoo model (no dense biases, untied output layer): exactly those tensors."""
    r = RUNS["mpt-70b-h100-64"]
    kw = r.model.as_kwargs()
    d, f, L, v = kw["d_model"], kw["d_ff"], kw["n_layers"], kw["vocab"]
    dense_biases = L * (3 * d + d + f + d)  # qkv, out projection, ffn up, ffn down
    assert forward_graph(r.name).num_params() - r.published_params.value == v * d - dense_biases


def test_palm_llama_variant_is_palm_plus_its_untied_head():
    r = RUNS["palm-540b-v4-6144"]
    (variant,) = r.variants
    kw = variant.as_kwargs()
    g = models.llama(**kw, train=False)
    # Table 1 rounds to 10M; the second RMSNorm per layer (PaLM's parallel layers share one)
    # and rounding leave < 0.002 %
    assert g.num_params() - kw["d_model"] * kw["vocab"] == pytest.approx(r.published_params.value, rel=2e-5)


@pytest.mark.parametrize(("name", "rel"), [("mtf-4.9b-tpuv2-512", 2e-3), ("gpt3-175b-v4-4096", 2e-3)])
def test_reconstructed_models_match_the_rounded_published_count(name, rel):
    """Mesh-TF's layers/vocabulary and GPT-3's padded vocabulary are reconstructions: the
    count agrees with the published one to its rounding (4.90B, 175.0B)."""
    assert forward_graph(name).num_params() == pytest.approx(RUNS[name].published_params.value, rel=rel)


# --------------------------------------------------------------------------- utilisation
@pytest.mark.parametrize("name", ["maxtext-32b-v5p-128", "maxtext-128b-v5p-256"])
def test_maxtext_mfu_is_its_tflops_over_the_v5p_peak(name):
    r = RUNS[name]
    peak = get_hardware(r.hardware).peak("bfloat16")  # 459 TFLOP/s per chip (cloud docs)
    # the README rounds TFLOP/s to an integer: +-0.5 TFLOP/s
    assert r.tflops_per_device.value * 1e12 / peak == pytest.approx(r.mfu.value, abs=0.5e12 / peak)


def test_palm_mfu_follows_from_its_throughput():
    """PaLM Appendix B: model FLOPs per token 6N + 12·L·H·Q·T (attention), over 6144 chips
    at TPU v4's 275 TFLOP/s bf16 peak."""
    r = RUNS["palm-540b-v4-6144"]
    L, H, Q, T = 118, 48, 256, r.length.value
    per_token = 6 * r.published_params.value + 12 * L * H * Q * T
    peak = get_hardware(r.hardware).peak("bfloat16")
    assert r.tokens_per_s.value * per_token / (r.devices.value * peak) == pytest.approx(r.mfu.value, abs=2e-3)


@pytest.mark.parametrize("name", ["mpt-70b-h100-64", "mpt-30b-h100-8"])
def test_mpt_mfu_follows_from_its_throughput(name):
    """llm-foundry's definition (benchmarking README): (3 · 2N·s + 3 · L·2·2·d·s²) FLOPs per
    sequence at the measured sequences/s over its GPUs at the H100 bf16 dense peak."""
    r = RUNS[name]
    kw = r.model.as_kwargs()
    s, n = r.length.value, r.published_params.value
    per_seq = 3 * 2 * n * s + 3 * kw["n_layers"] * 2 * 2 * kw["d_model"] * s * s
    peak = get_hardware(r.hardware).peak("bfloat16")
    mfu = per_seq * r.tokens_per_s.value / s / (r.devices.value * peak)
    assert mfu == pytest.approx(r.mfu.value, abs=1e-3)
    assert mfu * 4 / 3 == pytest.approx(r.hfu.value, abs=1e-3)  # HFU adds the recomputed forward


def test_mesh_tensorflow_peak_is_512_tpuv2_cores():
    per_core = 11.5e15 / 512  # §9: a maximum of 11.5 PFLOP/s on 512 cores
    assert per_core == pytest.approx(get_hardware("tpu-v2").peak("bfloat16"), rel=0.01)
    assert RUNS["mtf-4.9b-tpuv2-512"].mfu.value == pytest.approx(6 / 11.5)


def test_unknown_run_names_the_known_ones():
    with pytest.raises(KeyError, match="no published run 'gpt-5'; known: mtf-4.9b-tpuv2-512"):
        run("gpt-5")
    assert run("palm-540b-v4-6144").parallelism.tensor == 12
    assert math.isclose(RUNS["palm-540b-v4-6144"].hfu.value, 0.578)
