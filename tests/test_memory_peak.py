"""What is live at the predicted memory peak (``Cost.peak_buffers``, ``memory.PeakBuffer``):
against a hand count of the replicated MLP forward pass, against the values XLA's buffer
assignment holds at its own peak (``benchmarks/xla_live.py``), and the breakdown it adds up to."""
from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import memory_vs_xla as bench  # noqa: E402
from xla_live import live_values  # noqa: E402

from autolayout import execute, models, predict  # noqa: E402

MESH = "data:2,model:4"
F32 = 4
B, IO, HID = 64, 128, 256  # the MLP: y = relu(x @ w + bias) @ v


def _mlp(train: bool = False):
    return models.mlp(batch=B, d_io=IO, d_hidden=HID, train=train)


def test_replicated_forward_by_hand():
    # At the second matmul: the arguments (x [b, io], w [io, hid], bias [hid], v [hid, io]) for the
    # whole call, the ReLU's input written by the first dot (the bias add and ReLU run in place over
    # it, so the buffer is the dot's), and the output's allocation (XLA allocates it for the whole
    # call; the second dot writes it)
    c = predict(_mlp(), MESH, "", hardware="cpu")
    want = {"x": B * IO * F32, "w": IO * HID * F32, "bias": HID * F32, "v": HID * IO * F32,
            "dot_general_0": B * HID * F32, "<unwritten out>": B * IO * F32}
    assert {b.name: b.bytes for b in c.peak_buffers} == want
    assert c.memory_bytes == sum(want.values())
    assert [b.bytes for b in c.peak_buffers] == sorted((b.bytes for b in c.peak_buffers), reverse=True)


@pytest.mark.parametrize("layout", ["", "hidden:model"], ids=["replicated", "hidden-on-model"])
def test_temporaries_at_the_peak_are_xlas(layout):
    # the buffers other than the step's arguments at the model's peak, by size, against the values
    # XLA's buffer assignment holds at its peak (temp heap and output allocations; hidden:model:
    # the second dot's partial sums and the all-reduced output, both [b, io])
    g = _mlp()
    with tempfile.TemporaryDirectory() as dump:
        ex = execute(g, MESH, layout, repeats=1, reference=False,
                     compiler_options={"xla_dump_to": dump, "xla_dump_hlo_as_text": True})
        xla = Counter(v["bytes"] for v in live_values(dump) if v["bytes"] >= 1024)  # not the scalars
    args = {op.name for op in g.ops() if op.kind in ("param", "input")}
    ours = Counter(b.bytes for b in ex.predicted.peak_buffers if b.name not in args)
    assert ours == xla and sum(xla.elements()) > 0


@pytest.mark.parametrize("model, train, layout, hardware", [
    ("mlp", True, "", "cpu"),
    ("mlp", True, "batch:data;hidden:model", "cpu"),
    ("mlp", True, "batch:data,model|*:data,model@3", "h100"),
    ("transformer_lm", True, "batch:data;heads:model;d_ff:model|remat=full", "cpu"),
    ("transformer_lm", True, "batch:data,model|*:data,model@3", "tpu-v4"),
    ("moe", True, "batch:data;experts:model", "cpu"),
    ("llama", False, "batch:data;kv_heads:model;d_ff:model", "h200"),
], ids=["mlp-cpu", "mlp-tp-cpu", "mlp-zero3-h100", "lm-remat-cpu", "lm-zero3-tpu", "moe-cpu", "llama-fwd-h200"])
def test_buffers_add_up_to_the_peak_and_its_breakdown(model, train, layout, hardware):
    c = predict(models.MODELS[model](**bench.ZOO_SIZES[model], train=train), MESH, layout, hardware=hardware)
    assert sum(b.bytes for b in c.peak_buffers) == c.memory_bytes
    by_category = Counter()
    for b in c.peak_buffers:
        by_category[b.category] += b.bytes
    assert {k: v for k, v in c.memory.items() if v} == {k: v for k, v in by_category.items() if v}
    assert all(b.bytes > 0 for b in c.peak_buffers if b.name != "<temporaries in donated buffers>")
