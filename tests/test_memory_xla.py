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

OFF = {  # measured ratio predicted / XLA and why
    ("equinox_block", ""): (
        "0.73: the step does not donate its arguments, so XLA allocates the updated parameters and "
        "Adam moments for the whole call, and it materialises transposed copies of activations for "
        "the weight-gradient dots; the model counts outputs from their producer (see "
        "costmodel/memory.py) and transposes as free"),
    ("linen_gpt", "batch:data;heads:model;mlp:model|*:data@3"): (
        "0.88: the step does not donate its arguments: XLA allocates the updated parameters and Adam "
        "moments (41 KB) as output buffers of their own for the whole call and fits only part of the "
        "temporaries into them; the model counts outputs from their producer (see costmodel/memory.py)"),
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
