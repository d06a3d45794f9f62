"""The cost model's peak memory per device against XLA's ``memory_analysis()`` of the executed
program (issue 12 item 3): within 10% for a table of executed layouts of zoo and traced user
models (the benchmarks/memory_vs_xla.py builders, 8 virtual CPU devices). The reference is the
compiled program's buffer assignment (argument + output + temp - alias bytes), never the cost
model. Layouts measured off by more than 10% are strict xfails that name the measured reason.
"""
from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import memory_vs_xla as bench  # noqa: E402

from autolayout import execute  # noqa: E402

WITHIN = [  # (model id in bench.CASES, layout)
    ("mlp-train", ""),
    ("mlp-train", "batch:data,model"),  # the gradients' combined all-reduce (memory.held_bytes)
    ("mlp-train", "batch:data,model|*:data,model@1"),  # ... and the reduce-scatters' relayout copy
    ("mlp-train", "batch:data,model|*:data,model@3"),
    ("moe-train", "batch:data,model"),
    ("mlp-forward", "batch:data,model"),
    ("transformer_lm-forward", "batch:data;heads:model;d_ff:model"),  # the scan's state is one buffer
    ("transformer_lm-train", "batch:data,model"),
    ("transformer_lm-train", "batch:data;heads:model;d_ff:model"),
    ("transformer_lm-train", "batch:data,model|*:data,model@1"),
    ("llama-train", "batch:data,model|*:data,model@2"),
    ("moe-train", ""),
    ("moe-train", "batch:data;experts:model"),
    ("linen_gpt", "batch:data,model"),
    ("nnx_llama", "batch:data,model"),
    ("equinox_block", "batch:data,model"),
    ("linen_bf16_mlp", ""),
    ("top2_moe", "batch:data;experts:model"),
]

NOT_DONATED = (
    "the step does not donate its arguments: XLA allocates the updated parameters and optimizer state as "
    "output buffers of their own for the whole call and fits into them only temporaries no larger than "
    "each; the model counts outputs from their producer (costmodel/memory.py; counting them for the whole "
    "call instead brings these layouts to 0.83-1.11 but puts the data-parallel layouts of the same models, "
    "whose activations do fit, about 30% over)")
DOT_COPIES = (
    "XLA:CPU's operand copies for dots ({what} live at XLA's peak): the model prices them in time only "
    "(costmodel/dotcopy.py); holding each copy while its dot runs over-predicts the MoE layouts (1.14-1.22), "
    "where XLA frees the original as the copy is made")

OFF = {  # measured ratio predicted / XLA and why (benchmarks/memory_vs_xla.py)
    ("mlp-train", "hidden:data,model"): (
        "0.89: XLA combines the forward output's all-reduce (read only by the loss) with the input "
        "gradient's into one after the backward pass; the model combines parameter-gradient reductions only"),
    ("transformer_lm-train", "batch:data,model|*:data,model@3"): (
        "0.90: not root-caused; XLA's peak is in the backward scan with the stacked gradient accumulators "
        "(zero-initialised) and all-gathered layer weights live"),
    ("moe-train", "batch:data;experts:model|*:data@3"): "0.90: " + DOT_COPIES.format(what="five copies, 104 KiB"),
    ("llama-forward", ""): "0.90: " + DOT_COPIES.format(what="a transposed key copy and a weight copy, 96 KiB"),
    ("linen_gpt", ""): "0.75: " + NOT_DONATED,
    ("linen_gpt", "batch:data;heads:model;mlp:model|*:data@3"): "0.88: " + NOT_DONATED,
    ("nnx_llama", ""): "0.68: " + NOT_DONATED,
    ("nnx_llama", "batch:data;heads:model;mlp:model"): "0.83: " + NOT_DONATED,
    ("nnx_llama", "batch:model;kv_heads:data|*:model@2"): "0.79: " + NOT_DONATED,
    ("equinox_block", ""): "0.73: " + NOT_DONATED + "; and XLA:CPU's transposed activation copies",
    ("equinox_block", "batch:data;heads:model;mlp:model|*:data@3"): "0.76: " + NOT_DONATED,
    ("linen_bf16_mlp", "batch:data;mlp:model|*:data@3"): "0.70: " + NOT_DONATED,
    ("top2_moe", "batch:data;mlp:model|*:data@3"): "0.79: " + NOT_DONATED,
}


@lru_cache(maxsize=None)
def built(model: str):
    return bench.CASES[model][0]()


def _check(model: str, layout: str) -> None:
    g, args = built(model)
    ex = execute(g, bench.MESH, layout, args=args, repeats=1, reference=False, compiler_options=bench.FAST)
    xla = ex.xla_memory
    assert xla["argument"] > 0 and xla["output"] > 0, xla
    ratio = ex.predicted.memory_bytes / (xla["argument"] + xla["output"] + xla["temp"] - xla["alias"])
    assert ex.memory_ratio == ratio
    assert ex.memory_matches == (abs(ratio - 1) <= 0.10)
    assert abs(ratio - 1) <= 0.10, (f"{model} {layout or '(replicated)'}: predicted {ex.predicted.memory_bytes} B "
                                    f"{ex.predicted.memory} vs XLA {xla}: ratio {ratio:.3f}")


@pytest.mark.parametrize("model,layout", WITHIN, ids=[f"{m}:{lay or 'replicated'}" for m, lay in WITHIN])
def test_predicted_peak_memory_within_10_percent_of_xla(model, layout):
    _check(model, layout)


@pytest.mark.parametrize("model,layout", [pytest.param(m, lay, marks=pytest.mark.xfail(strict=True, reason=why))
                                          for (m, lay), why in OFF.items()],
                         ids=[f"{m}:{lay or 'replicated'}" for m, lay in OFF])
def test_known_memory_gaps_to_xla(model, layout):
    _check(model, layout)
