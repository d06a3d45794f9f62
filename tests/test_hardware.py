"""Hardware profiles: cited numbers, dtype fallbacks, per-axis links, JSON, lookup."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autolayout.costmodel.hardware import Hardware, Link, normalize_dtype

from autolayout.costmodel.profiles import PROFILES, SLOW_LINKS, get_hardware, known_hardware

GiB = 2**30

# name, bf16 FLOP/s, HBM bytes, HBM bytes/s, default-link bytes/s -- the public
# figures restated by hand (sources in hardware.py), per JAX device.
CITED = [
    # 180 TFLOP/s per 4-chip board, 2 cores/chip; 8 GiB and 600/2 GB/s per core;
    # 496 Gbit/s one-way per link, x2 directions, shared by 2 cores.
    ("tpu-v2", 22.5e12, 8 * GiB, 300e9, 62e9),
    # 123 TFLOP/s and 32 GiB / 900 GB/s per chip, 2 cores; 340 TB/s / 1024 chips / 4 links one-way.
    ("tpu-v3", 61.5e12, 16 * GiB, 450e9, 340e12 / 1024 / 4),
    ("tpu-v4", 275e12, 32 * GiB, 1200e9, 2 * 45e9),
    ("tpu-v5e", 197e12, 16e9, 819e9, 2 * 50e9),
    ("tpu-v5p", 459e12, 95 * GiB, 2765e9, 2 * 100e9),
    ("tpu-v6e", 918e12, 32e9, 1638e9, 2 * 100e9),
    ("h100", 989.4e12, 80e9, 3.35e12, 450e9),
    ("h200", 989.4e12, 141e9, 4.8e12, 450e9),
]


@pytest.mark.parametrize(("name", "bf16", "hbm", "hbm_bw", "link_bw"), CITED, ids=[c[0] for c in CITED])
def test_profile_matches_cited_figures(name, bf16, hbm, hbm_bw, link_bw):
    hw = get_hardware(name)
    assert hw.peak("bfloat16") == pytest.approx(bf16)
    assert hw.hbm_bytes == pytest.approx(hbm)
    assert hw.hbm_bandwidth == pytest.approx(hbm_bw)
    assert hw.link.bandwidth == pytest.approx(link_bw)
    assert hw.sources, "every profile cites its sources"
    assert 0 < hw.efficiency <= 1


def test_design_profiles_all_present():
    for name in ["tpu-v2", "tpu-v3", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "h100", "h200", "cpu"]:
        assert name in PROFILES
    assert known_hardware() == list(PROFILES)


def test_tpu_v2_paper_mesh_counts_cores():
    # Mesh-TensorFlow's 16x32 TPUv2 mesh: 512 cores = 256 chips = 64 boards of 180 TFLOP/s.
    hw = get_hardware("tpu-v2")
    assert 512 * hw.peak("bfloat16") == pytest.approx(64 * 180e12)
    assert 512 * hw.hbm_bytes == 4 * 2**40  # 8 GiB per core -> 4 TiB


def test_tpu_v3_link_derivation_reproduces_newer_generations():
    # The v3 per-link figure is derived from "all-reduce bandwidth per pod" / chips / links.
    # The same derivation must give scaling-book's one-way figures for v4, v5e, v6e.
    assert 1.1e15 / 4096 / 6 == pytest.approx(get_hardware("tpu-v4").link.bandwidth / 2, rel=0.01)
    assert 51.2e12 / 256 / 4 == pytest.approx(get_hardware("tpu-v5e").link.bandwidth / 2)
    assert 102.4e12 / 256 / 4 == pytest.approx(get_hardware("tpu-v6e").link.bandwidth / 2)


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("tpu-v5e", "float32", 197e12),  # default precision: one bf16 pass
        ("tpu-v5e", "float32_highest", 197e12 / 6),
        ("tpu-v5e", "float16", 197e12),  # no fp16 entry -> the other 16-bit float
        ("tpu-v5e", "complex64", 197e12),  # unknown -> float32 figure
        ("tpu-v5e", "int8", 393e12),
        ("tpu-v5p", "float8_e4m3fn", 459e12),
        ("h100", "float32", 494.7e12),  # TF32 tensor cores, JAX default on Hopper
        ("h100", "float32_highest", 66.9e12),
        ("h100", "tf32", 494.7e12),
        ("h100", "BF16", 989.4e12),
        ("h100", "float64", 66.9e12),
        ("cpu", "bfloat16", 8e10),
    ],
    ids=lambda v: str(v),
)
def test_peak_dtype_lookup_and_fallback(name, dtype, expected):
    assert get_hardware(name).peak(dtype) == pytest.approx(expected)


def test_peak_accepts_dtype_objects():
    hw = get_hardware("tpu-v4")
    assert hw.peak(np.dtype("float32")) == hw.peak("float32")
    import jax.numpy as jnp
    assert hw.peak(jnp.bfloat16) == 275e12
    assert hw.peak(jnp.dtype(jnp.bfloat16)) == 275e12


@pytest.mark.parametrize(
    ("raw", "canon"),
    [("bf16", "bfloat16"), ("FP32", "float32"), (" half ", "float16"), ("float8_e5m2", "float8"), ("int8", "int8")],
    ids=lambda v: str(v),
)
def test_normalize_dtype(raw, canon):
    assert normalize_dtype(raw) == canon


def test_axis_override_used_by_link_for():
    base = get_hardware("tpu-v5p")
    dcn = SLOW_LINKS["tpu-v5p"]
    hw = base.with_axis_link("data", dcn)
    assert hw.link_for("data") is dcn
    assert hw.link_for("model") is base.link
    assert base.link_for("data") is base.link, "with_axis_link must not mutate the original"
    slower = Link(1e9, 1e-5)
    hw2 = hw.with_axis_link("data", slower)
    assert hw2.link_for("data") is slower
    assert [a for a, _ in hw2.axis_links] == ["data"], "a second override replaces the first"


@pytest.mark.parametrize("name", list(SLOW_LINKS), ids=list(SLOW_LINKS))
def test_slow_links_are_slower_than_default(name):
    assert SLOW_LINKS[name].bandwidth < get_hardware(name).link.bandwidth


def test_gpu_inter_node_link_is_one_ndr_nic_per_gpu():
    assert SLOW_LINKS["h100"].bandwidth == 400e9 / 8  # 400 Gb/s InfiniBand NDR
    assert get_hardware("h100").link.topology == "switch"


def test_replace_returns_new_profile():
    hw = get_hardware("h100")
    tuned = hw.replace(efficiency=0.6, name="h100-tuned")
    assert (tuned.efficiency, tuned.name) == (0.6, "h100-tuned")
    assert hw.efficiency == 0.75


@pytest.mark.parametrize("name", list(PROFILES), ids=list(PROFILES))
def test_json_round_trip(name, tmp_path: Path):
    hw = PROFILES[name].with_axis_link("dcn", SLOW_LINKS[name])
    path = tmp_path / f"{name}.json"
    hw.save(path)
    assert json.loads(path.read_text())["name"] == name
    assert Hardware.load(path) == hw
    assert Hardware.from_dict(hw.to_dict()) == hw
    assert get_hardware(str(path)) == hw
    assert get_hardware(path) == hw


def test_from_dict_rejects_unknown_field():
    d = get_hardware("tpu-v4").to_dict()
    d["flops"] = 1
    with pytest.raises(ValueError, match="flops"):
        Hardware.from_dict(d)


def test_one_scheduler_per_profile():
    with pytest.raises(ValueError, match="'h100': breadth_first_schedule .* and min_memory_schedule .* set at most one"):
        get_hardware("h100").replace(breadth_first_schedule=True)
    assert get_hardware("h100").min_memory_schedule and get_hardware("h200").min_memory_schedule
    assert not get_hardware("tpu-v5p").min_memory_schedule and not get_hardware("cpu").min_memory_schedule


@pytest.mark.parametrize(
    ("spelling", "name"),
    [("tpu-v5e", "tpu-v5e"), ("TPU_V5E", "tpu-v5e"), ("v5e", "tpu-v5e"), ("tpu_v4", "tpu-v4"), ("H100", "h100")],
    ids=lambda v: str(v),
)
def test_get_hardware_spellings(spelling, name):
    assert get_hardware(spelling) is PROFILES[name]


def test_get_hardware_passes_hardware_through():
    hw = get_hardware("cpu").replace(name="mine")
    assert get_hardware(hw) is hw


def test_unknown_profile_lists_known_names_and_suggests():
    with pytest.raises(ValueError, match=r"Known profiles: tpu-v2, tpu-v3, .*h100, h200, cpu") as info:
        get_hardware("H10")
    assert "Did you mean 'h100'?" in str(info.value)
    with pytest.raises(ValueError, match="tpu-v6e"):
        get_hardware("a100")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(peak_flops={"bfloat16": 1e12}), "float32"),
        (dict(efficiency=1.5), "efficiency"),
        (dict(hbm_bytes=0), "hbm"),
        (dict(peak_flops={"float32": -1.0}), "must be > 0"),
    ],
    ids=["no-float32", "efficiency>1", "zero-hbm", "negative-peak"],
)
def test_hardware_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_hardware("cpu").replace(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [(dict(bandwidth=0, latency=0), "bandwidth"), (dict(bandwidth=1, latency=-1), "latency"),
     (dict(bandwidth=1, latency=0, topology="mesh"), "topology")],
    ids=["zero-bw", "negative-latency", "bad-topology"],
)
def test_link_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Link(**kwargs)


@given(
    bw=st.floats(1e3, 1e13),
    lat=st.floats(0, 1e-3),
    topology=st.sampled_from(["ring", "switch"]),
)
def test_link_dict_round_trip_property(bw, lat, topology):
    link = Link(bw, lat, topology)
    assert Link.from_dict(json.loads(json.dumps(link.to_dict()))) == link


# -------------------------------------------------- detection and profile files (issue 14)
class _Device:
    def __init__(self, kind: str) -> None:
        self.device_kind = kind


@pytest.mark.parametrize("kind, name", [
    # kinds as jax/_src/pallas/mosaic/tpu_info.py (jax 0.10.2) names them
    ("TPU v2", "tpu-v2"), ("TPU v3", "tpu-v3"), ("TPU v4", "tpu-v4"),
    ("TPU v5 lite", "tpu-v5e"), ("TPU v5e", "tpu-v5e"),
    ("TPU v5", "tpu-v5p"), ("TPU v5p", "tpu-v5p"),  # "TPU v5" is v5p, not v5e
    ("TPU v6 lite", "tpu-v6e"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("cpu", "cpu"),
], ids=lambda x: x if " " not in x else None)
def test_device_kind_maps_exactly(kind, name):
    from autolayout.costmodel.devices import hardware_for_device
    assert hardware_for_device(_Device(kind)).name == name


@pytest.mark.parametrize("kind", ["TPU v4 lite", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "TPU v7", "", "gpu"])
def test_unknown_device_kind_is_an_error(kind):
    from autolayout.costmodel.devices import UnknownDeviceError, hardware_for_device
    with pytest.raises(UnknownDeviceError, match=rf"no built-in hardware profile for device kind {kind!r}.*"
                                                 r"pass hardware= .*autolayout calibrate --out profile.json"):
        hardware_for_device(_Device(kind))
    assert issubclass(UnknownDeviceError, ValueError)


def test_one_detection_table():
    """The device-kind table lives in costmodel.devices only (the runner calls it)."""
    import inspect

    from autolayout.exec import runner
    src = inspect.getsource(runner)
    assert "hardware_for_device" in src and '"v5"' not in src and "'v5'" not in src


@pytest.mark.parametrize("content, match", [
    ("{not json", r"hardware profile '.*bad.json' is not valid JSON: Expecting property name .* line 1 column 2"),
    ('{"name": "x", "peak_flops": {"float32": 1e12}, "hbm_bytes": 1e9, "hbm_bandwidth": 1e11}',
     r"hardware profile '.*bad.json': missing required field\(s\) \['link'\]"),
    ('{"name": "x", "peak_flops": {"float32": 1e12}, "hbm_bytes": 1e9, "hbm_bandwidth": 1e11, "link": {"latency": 1}}',
     r"'.*bad.json': link needs \['bandwidth', 'latency'\]"),
    ('{"name": "x", "peak_flops": {"float32": 1e12}, "hbm_bytes": 1e9, "hbm_bandwidth": 1e11, "link": 5}',
     r"'.*bad.json': link must be an object"),
    ("[1, 2]", r"'.*bad.json': a hardware profile is a JSON object, got list"),
], ids=["not-json", "no-link", "link-without-bandwidth", "link-not-object", "list"])
def test_bad_profile_files_name_the_file(content, match, tmp_path):
    from autolayout.costmodel.hardware import HardwareFileError
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(HardwareFileError, match=match):
        get_hardware(str(path))
    assert issubclass(HardwareFileError, ValueError)
