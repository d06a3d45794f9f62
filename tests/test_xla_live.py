"""benchmarks/xla_live.py: XLA's peak of live bytes from its buffer-assignment dumps, against
hand calculations for two small programs (and memory_analysis, which it must split exactly)."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from xla_live import live_peak, live_values, main, packed_heap  # noqa: E402

KIB16 = 64 * 64 * 4  # one f32[64,64]


def _compile(fn, tmp_path):
    c = jax.jit(fn).lower(jnp.ones((64, 64), jnp.float32)).compile(
        compiler_options={"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True})
    m = c.memory_analysis()
    return live_peak(tmp_path), m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes


def test_chain_of_two_matmuls_is_live_whole(tmp_path):
    # (x @ x) @ x: at the second matmul the argument, the first product (temp) and the output
    # are live: 3 x 16 KiB, all of XLA's figure
    got, total = _compile(lambda x: (x @ x) @ x, tmp_path)
    assert got["live_bytes"] == 3 * KIB16 == total
    assert got["idle_output_bytes"] == 0 and got["heap_gap_bytes"] == 0


def test_output_allocation_idle_at_the_peak(tmp_path):
    # a = x @ x; b = a @ a; out = tanh(b[:, :32]) + 1: at b's matmul x, a and b are live (3 x 16 KiB);
    # the 8 KiB output allocation (counted by memory_analysis for the whole call) holds nothing then:
    # neither 16 KiB temporary fits in it
    def f(x):
        a = x @ x
        b = a @ a
        return jnp.tanh(b[:, :32]) + 1.0

    got, total = _compile(f, tmp_path)
    assert got["live_bytes"] == 3 * KIB16
    assert got["idle_output_bytes"] == KIB16 // 2
    assert got["live_bytes"] + got["idle_output_bytes"] + got["heap_gap_bytes"] == total


def test_needs_exactly_one_program(tmp_path):
    with pytest.raises(ValueError, match="expected one program"):
        live_peak(tmp_path)


def test_values_live_at_the_peak_are_the_two_products(tmp_path):
    # (x @ x) @ x: at the second matmul the first product (temp) and the output are live beside the
    # argument, 16 KiB each; with the argument's 16 KiB they are the whole live peak
    got, _ = _compile(lambda x: (x @ x) @ x, tmp_path)
    found = live_values(tmp_path)
    assert [v["bytes"] for v in found] == [KIB16, KIB16]
    assert KIB16 + sum(v["bytes"] for v in found) == got["live_bytes"]
    assert all(v["start"] <= got["at"] <= v["stop"] for v in found)
    assert live_values(tmp_path, at=0) == []  # at the first position only the argument is live


def test_the_command_names_the_folder_without_a_dump(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(tmp_path) in err and "xla_dump_to" in err


def test_packing_a_heap_without_fragmentation_gives_xlas_size(tmp_path):
    # (x @ x) @ x: the first product is the heap's one buffer
    got, _ = _compile(lambda x: (x @ x) @ x, tmp_path)
    packed = packed_heap(tmp_path)
    assert packed["packed_bytes"] == packed["heap_bytes"] == packed["live_bytes"]
    assert got["heap_gap_bytes"] == 0


@pytest.mark.parametrize("model, layout", [
    ("llama-forward", "vocab:data;d_ff:data,model;pair_out:data"),  # 28% of the heap fragmentation
    ("moe-forward", "d_ff:model;length:data"),  # 18%; XLA's order there is its clock's, not positions'
], ids=["llama-forward", "moe-forward"])
def test_packing_reproduces_xlas_fragmented_heap(model, layout, tmp_path):
    # forward passes of benchmarks/memory_vs_xla.py whose temp heaps XLA packs with holes (its own
    # dumps: heap_gap_bytes); packing the same buffers by best fit from their live ranges gives
    # XLA's size, not the live peak
    import memory_vs_xla as bench

    from autolayout import execute

    g, args = bench.CASES[model][0]()
    execute(g, bench.MESH, layout, args=args, repeats=1, reference=False,
            compiler_options={**bench.FAST, "xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True})
    gap = live_peak(tmp_path)["heap_gap_bytes"]
    packed = packed_heap(tmp_path)
    assert gap > packed["heap_bytes"] * 0.15
    assert packed["heap_bytes"] - packed["live_bytes"] > packed["heap_bytes"] * 0.15
    assert abs(packed["packed_bytes"] - packed["heap_bytes"]) <= packed["heap_bytes"] // 1000


def test_packing_needs_a_dump(tmp_path):
    with pytest.raises(ValueError, match="expected one program"):
        packed_heap(tmp_path)
