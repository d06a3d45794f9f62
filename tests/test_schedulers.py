"""XLA's memory-minimising schedulers (``costmodel/schedulers.py``): by hand on small graphs, on the
example ``ListScheduler``'s own comment works through, and replayed on the entry computations of
the committed XLA:GPU programs (``reports/gpu/hlo.zip``, ``hlo_loss.zip``), whose printed order is
the order XLA ran them in: the reference there is XLA's own schedule of its own instructions.
"""
from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from autolayout.costmodel.schedulers import dfs_schedule, list_schedule, post_order_schedule

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from xla_memory_scheduler import kendall_tau, replay  # noqa: E402

# hlo_memory_scheduler.cc's comment: A -> B => C -> G, A -> D -> F => G, A -> E -> F ("=>": size 2)
EXAMPLE = {"A": [], "B": ["A"], "C": ["B"], "D": ["A"], "E": ["A"], "F": ["D", "E"], "G": ["C", "F"]}
EXAMPLE_BYTES = {"A": 1, "B": 2, "C": 1, "D": 1, "E": 1, "F": 2, "G": 1}


def test_list_scheduler_defers_the_instruction_whose_output_is_bigger():
    """The comment's point: the greedy list scheduler defers B (it defines 2 and frees nothing
    while A has other readers) to after F, "A D E F B C G"."""
    order = list_schedule(list("ABCDEFG"), EXAMPLE, EXAMPLE_BYTES, live_out={"G"})
    assert order.index("B") > order.index("F") and order[0] == "A" and order[-3:] == ["B", "C", "G"]


def test_list_scheduler_ties_go_to_the_instruction_queued_last():
    """D and E tie (each defines 1 and frees nothing while A has other readers): the ready list is a
    multimap whose last entry is taken, so E, queued after D, runs first; then D, the last reader of
    A's value but one (B), and F, which frees D and E."""
    assert list_schedule(list("ABCDEFG"), EXAMPLE, EXAMPLE_BYTES, live_out={"G"}) == list("AEDFBCG")


@pytest.mark.parametrize("ignored, expected", [((), ["b", "p", "a"]), (("p",), ["p", "a", "b"])],
                         ids=["p-counted", "p-a-parameter"])
def test_list_scheduler_counts_no_bytes_of_parameters(ignored, expected):
    """p (8 bytes) and b (4) are ready at the start; a reads p. Counted, p ranks -8 and b -4: b runs
    first, then p, then a, which frees p. A parameter defines nothing (rank 0): p runs first; then a
    and b both rank -4 (a frees no parameter) and a, queued last, runs first."""
    ops = {"p": [], "a": ["p"], "b": []}
    assert list_schedule(["p", "a", "b"], ops, {"p": 8, "a": 4, "b": 4}, live_out={"a", "b"},
                         ignored=ignored) == expected


@pytest.mark.parametrize("scalars, expected", [((), ["x0", "x", "s"]), (("s",), ["x0", "s", "x"])],
                         ids=["s-by-size", "s-a-scalar"])
def test_list_scheduler_runs_an_effective_scalar_as_soon_as_it_is_ready(scalars, expected):
    """s (4 bytes) and x (1) both read x0, which neither frees: by size x (-1) goes before s (-4); an
    effective scalar goes first whatever it defines."""
    ops = {"x0": [], "s": ["x0"], "x": ["x0"]}
    assert list_schedule(["x0", "s", "x"], ops, {"x0": 10, "s": 4, "x": 1}, live_out={"s", "x"},
                         scalars=scalars) == expected


def test_list_scheduler_names_a_cycle():
    with pytest.raises(ValueError, match="a cycle among"):
        list_schedule(["a", "b"], {"a": ["b"], "b": ["a"]}, {"a": 1, "b": 1})


def test_dfs_scheduler_visits_fan_out_first_then_the_larger_subtree():
    """d reads b then c. b's subtree has an instruction with three users (extra users 2), c's none:
    b's first though c's is larger; with equal extra users the larger total size goes first."""
    ops = {"a": [], "b": ["a"], "c": [], "d": ["b", "c"], "u1": ["a"], "u2": ["a"]}
    size = {"a": 1, "b": 1, "c": 9, "d": 1, "u1": 1, "u2": 1}
    order = dfs_schedule(["a", "b", "c", "d", "u1", "u2"], ops, size, roots=["d", "u1", "u2"])
    assert order.index("b") < order.index("c")
    ops2 = {"b": [], "c": [], "d": ["b", "c"]}
    assert dfs_schedule(["b", "c", "d"], ops2, {"b": 1, "c": 9, "d": 1}, roots=["d"]) == ["c", "b", "d"]
    assert dfs_schedule(["b", "c", "d"], ops2, {"b": 9, "c": 1, "d": 1}, roots=["d"]) == ["b", "c", "d"]


def test_post_order_visits_operands_in_order_and_appends_the_unreached():
    ops = {"a": [], "b": ["a"], "c": [], "d": ["c", "b"], "dead": ["a"]}
    assert post_order_schedule(["a", "b", "c", "d", "dead"], ops, roots=["d"]) == ["c", "a", "b", "d", "dead"]


def _program(archive: str, name: str) -> str:
    with zipfile.ZipFile(ROOT / "reports" / "gpu" / archive) as z:
        return z.read(f"{name}.compiled.txt").decode()


# (program, the scheduler whose replay is closest to XLA:GPU's order, the least Kendall tau it reaches);
# benchmarks/xla_memory_scheduler.py prints the whole table
XLA_GPU_CHOICES = [("hlo_loss.zip", "moe-mse", "post-order", 1.0), ("hlo.zip", "moe", "list", 0.95),
                   ("hlo.zip", "mlp-small", "list", 0.98), ("hlo.zip", "gpt-350m", "dfs", 1.0),
                   ("hlo.zip", "llama-1b", "dfs", 1.0), ("hlo.zip", "llama-1b-remat", "list", 0.88)]


@pytest.mark.parametrize("archive, name, scheduler, tau", XLA_GPU_CHOICES, ids=[c[1] for c in XLA_GPU_CHOICES])
def test_replayed_on_xla_gpu_programs_one_scheduler_gives_xlas_order(archive, name, scheduler, tau):
    """XLA:GPU kept one of the three per program (``DefaultMemoryScheduler``); replayed on the
    program's own entry computation, that one reproduces XLA's order (moe-mse's post order to the
    instruction) and the other two do not come near it."""
    seq, orders = replay(_program(archive, name))
    taus = {s: kendall_tau(o, seq) for s, o in orders.items()}
    assert taus[scheduler] >= tau
    assert all(t < taus[scheduler] - 0.1 for s, t in taus.items() if s != scheduler), taus
    if tau == 1.0:
        assert orders[scheduler] == seq


_XLA_CPU_DFS = r'''
import json, os, sys
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp
from xla_memory_scheduler import replay

def block(p, x):  # layer norm, attention, an MLP: fan-out and shared operands for the heuristics
    mu = x.mean(-1, keepdims=True)
    xn = (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    q, k, v = xn @ p["q"], xn @ p["k"], xn @ p["v"]
    o = (jax.nn.softmax(q @ k.T / 8.0, axis=-1) @ v) @ p["o"] + x
    return jnp.sum(jnp.tanh(o @ p["f1"]) @ p["f2"])

def step(p, x):
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, jax.grad(block)(p, x))

d = 64
p = {k: jnp.full((d, d), 0.01) for k in "qkvo"} | {"f1": jnp.full((d, 4 * d), 0.01), "f2": jnp.full((4 * d, d), 0.01)}
seq, orders = replay(jax.jit(step).lower(p, jnp.ones((128, d))).compile().as_text())
print(json.dumps({"xla": seq, "dfs": orders["dfs"]}))
'''


def test_dfs_scheduler_gives_xla_cpus_own_dfs_order():
    """XLA:CPU schedules with DFSMemoryScheduler where its concurrency-optimised scheduler is off
    (``cpu_compiler.cc``, ``CreateHloSchedule``; an XLA flag, so a process of its own): replayed on
    the compiled training step's entry computation, the DFS scheduler gives XLA's order exactly."""
    import json
    import os
    import subprocess

    env = dict(os.environ, XLA_FLAGS="--xla_cpu_enable_concurrency_optimized_scheduler=false",
               JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    out = subprocess.run([sys.executable, "-c", _XLA_CPU_DFS, str(ROOT / "benchmarks")], env=env, check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert len(got["xla"]) > 40 and got["dfs"] == got["xla"]
