"""benchmarks/xla_cpu_reductions.py: the large buffers of XLA:CPU's optimized HLO around a
reduction, read from the entry computation, against what ``memory_analysis()`` charges for
them (each buffer of the large shape is 32 KiB of the temp or output figure)."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from xla_cpu_reductions import B, D, cases, model_buffers, xla_buffers  # noqa: E402

LARGE_BYTES = B * D * 4

# program -> large buffers XLA:CPU writes (read off its optimized HLO by hand, jax 0.10.2): a
# chain into a sum is one fusion; a value two sums read is computed once; an expensive value
# and its exp, read by a sum and a dot, are two
CASES = {"sum(x * 2 + 1, 1)": 0, "x*r read by two sums": 1, "tanh(x) read by exp and a sum": 2}


@pytest.mark.parametrize("name", list(CASES), ids=["chain", "shared_by_two_sums", "expensive_shared"])
def test_entry_buffers_are_what_memory_analysis_charges(name):
    fn, args = cases()[name]
    compiled = jax.jit(fn).lower(*args).compile()
    found = xla_buffers(compiled.as_text())
    assert len(found) == CASES[name], found
    m = compiled.memory_analysis()
    small = m.temp_size_in_bytes + m.output_size_in_bytes - len(found) * LARGE_BYTES
    assert 0 <= small < LARGE_BYTES  # the rest is the reductions' small results


@pytest.mark.parametrize("name", list(CASES)[:2], ids=["chain", "shared_by_two_sums"])
def test_fusion_marks_as_many_large_buffers_as_xla_cpu_writes(name):
    """fusion.with_fusion's reduction rule: a reduction takes in its element-wise producers, a
    value it shares with another fusion is written once (the counts of CASES, read off XLA:CPU's
    optimized HLO by hand and checked against memory_analysis above). The third program's
    ``y.T`` is a rename the model materialises and XLA bitcasts (DESIGN §11, rule (a)): the
    benchmark prints it as a difference."""
    fn, args = cases()[name]
    assert len(model_buffers(fn, args)) == CASES[name], model_buffers(fn, args)
