"""jax's persistent compilation cache and executed layouts on 8 CPU devices.

An FSDP (``@3``) step loaded back from jax's persistent cache on CPU computes wrong numbers
in some runs (jax/jaxlib 0.10.2; see ``autolayout.demo.compile_cache_dir``). The demo used
to turn that cache on; these tests run in fresh processes so that no jax setting leaks
into the rest of the pytest session.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The program of the bug report: the small sequential transformer, ZeRO-3 storage sharding.
SETUP = """
import json, os, sys
import jax, numpy as np
from autolayout import demo, models
from autolayout.exec import OutputMismatchError, execute
g = models.transformer_lm(d_model=16, d_ff=32, heads=8, d_kv=8, n_layers=2, vocab=32, batch=8, length=8,
                          parallel_layers=False)
def run(args=None):
    return execute(g, "rows:2,cols:4", "batch:rows,cols|*:rows,cols@3", args=args, repeats=1,
                   compiler_options={"xla_backend_optimization_level": 0})
"""


def _python(code: str, tmp_path: Path, **env_extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(JAX_NUM_CPU_DEVICES="8", PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               HOME=str(tmp_path / "home"), **env_extra)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(SETUP) + textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_demos_runs_of_an_fsdp_step_match_jax_jit(tmp_path):
    """As the demo runs layouts (its cache setup, then the same program compiled again and
    again, as sections 5 and 6 and a second demo do), every run matches the unsharded
    ``jax.jit`` step. Before the fix the demo turned on jax's persistent cache and the
    runs loaded from it returned NaN or wrong values."""
    res = _python("""
        cache = demo.compile_cache_dir()
        errs = []
        for _ in range(4):
            try:
                errs.append(run().max_rel_error)
            except OutputMismatchError as exc:
                errs.append(str(exc)[:300])
        print(json.dumps({"cache": cache, "errs": errs}))
    """, tmp_path)
    assert all(isinstance(e, float) and e <= 1e-5 for e in res["errs"]), res["errs"]
    assert res["cache"] is None
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()  # no cache written


# How an executable loaded from the persistent cache crashes XLA:CPU (jax/jaxlib 0.10.2): the
# process aborts (SIGABRT) inside a collective's rendezvous, whose log is in its stderr. Seen:
# ``rendezvous.h:314 Check failed: id < num_threads``; threads reported stuck at an all-gather's
# rendezvous (``rendezvous.cc``), then glibc's ``malloc assertion failure`` or the stuck-thread
# termination. About one clean-clone CI run in five; a crash, never a result that could pass
# for a right one. Once, in a full pytest run beside other jobs (session 29), the process died
# by SIGSEGV instead; a segfault is accepted too, but only with the same rendezvous in its log.
_CACHE_ABORT = "rendezvous"
_CRASH_SIGNALS = (-6, -11)  # SIGABRT, SIGSEGV


def _cached_runs(tmp_path: Path, attempt: int) -> tuple[list[dict], int, str]:
    """Runs the cached step four times in a fresh process; returns the rows it printed (one
    JSON line per run, flushed, so the runs before a crash are kept), the return code and
    stderr (whole: a crash's rendezvous line comes before thousands of characters of stack)."""
    code = textwrap.dedent(SETUP) + textwrap.dedent("""
        args = models.example_args(g, 0)
        want = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(jax.jit(g.fn)(*args))]
        for _ in range(4):
            try:
                ex = run(args)
            except OutputMismatchError as exc:
                print(json.dumps({"raised": str(exc)[:200]}), flush=True)
                continue
            got = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(ex.outputs)]
            mine = max(float(np.max(np.abs(a - b))) for a, b in zip(got, want) if a.size)
            print(json.dumps({"reported": ex.max_abs_error, "mine": mine,
                              "nan": any(bool(np.isnan(a).any()) for a in got),
                              "files": len(os.listdir(os.environ["JAX_COMPILATION_CACHE_DIR"]))}), flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(JAX_NUM_CPU_DEVICES="8", PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               HOME=str(tmp_path / "home"), JAX_COMPILATION_CACHE_DIR=str(tmp_path / f"jaxcache{attempt}"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return rows, out.returncode, out.stderr


def test_a_wrong_run_from_the_cache_is_reported_not_hidden(tmp_path):
    """With the user's own persistent cache on, whatever a loaded program computes, the
    execution's error figures say so: each run either raises OutputMismatchError (NaN or
    infinity where ``jax.jit`` has none) or reports the max |error| that this test computes
    itself against its own ``jax.jit`` reference.

    A loaded program may also crash the process (an abort or segfault in XLA:CPU's rendezvous,
    ``_CACHE_ABORT``): only that crash is accepted, the runs printed before it are checked all the same, and the
    process is started again (a fresh cache) until at least two runs were checked."""
    rows: list[dict] = []
    for attempt in range(4):
        got, rc, err = _cached_runs(tmp_path, attempt)
        rows += got
        if rc != 0:
            said = [line for line in err.splitlines() if _CACHE_ABORT in line or "Fatal" in line or "Check failed" in line]
            assert rc in _CRASH_SIGNALS and _CACHE_ABORT in err, (rc, said[:5] or err[-3000:])
        if len(rows) >= 2:
            break
    assert len(rows) >= 2, rows
    for row in rows:
        if "raised" in row:
            assert "NaN or infinite in only one" in row["raised"]
        else:
            assert row["files"] > 0  # the cache was used
            # a finite wrong answer is never reported as a small error
            assert not row["nan"] and row["reported"] == pytest.approx(row["mine"], rel=1e-6, abs=1e-6), row
