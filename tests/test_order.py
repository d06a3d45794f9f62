"""The order the memory model walks (``costmodel/order.py``): XLA:CPU's breadth-first
``BFSMemoryScheduler`` on the cpu profile, the traced order elsewhere. Checked against hand-run
first-in first-out Kahn orders, XLA's ``memory_analysis()`` of a program whose traced order and
breadth-first order peak differently, and the schedule's data flow.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from autolayout import execute, models, predict, trace
from autolayout.costmodel.order import MEMORY_SCHEDULERS, breadth_first, fifo_order, memory_order, min_memory
from autolayout.costmodel.profiles import get_hardware
from autolayout.graph import Loop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from xla_cpu_reductions import computations  # noqa: E402
from xla_schedule_live import entry_instructions  # noqa: E402

CPU = get_hardware("cpu")
TRACED_CPU = dataclasses.replace(CPU, breadth_first_schedule=False)  # the same profile walking the traced order
H100 = get_hardware("h100")
TRACED_H100 = dataclasses.replace(H100, min_memory_schedule=False)


def test_fifo_order_by_hand():
    # a, b sources; c <- a; d <- c; e <- b; f <- d, e. Queue: [a, b] -> a queues c -> b queues e ->
    # c queues d -> e (f still waits for d) -> d queues f -> f
    deps = {"c": ["a"], "d": ["c"], "e": ["b"], "f": ["d", "e"]}
    assert fifo_order(["a", "c", "d", "b", "e", "f"], deps) == ["a", "b", "c", "e", "d", "f"]
    # sources keep the order given; a dependency outside the nodes is ignored
    assert fifo_order(["b", "a", "c"], {"c": ["a", "z"]}) == ["b", "a", "c"]


def test_fifo_order_combined_by_hand():
    """g1 <- a and g2 <- d (d deep: a -> c -> d) are combined: their readers u1 <- g1, u2 <- g2 wait
    for the one instruction that reads both. Without it u1 runs as soon as g1 has."""
    nodes = ["a", "g1", "u1", "c", "d", "g2", "u2"]
    deps = {"g1": ["a"], "u1": ["g1"], "c": ["a"], "d": ["c"], "g2": ["d"], "u2": ["g2"]}
    # queue: [a] -> g1, c -> u1, d -> g2 -> u2
    assert fifo_order(nodes, deps) == ["a", "g1", "c", "u1", "d", "g2", "u2"]
    # combined: a -> g1, c -> (g1 done, sync waits for g2) d -> g2 -> sync -> u1, u2
    assert fifo_order(nodes, deps, combined=["g1", "g2"]) == ["a", "g1", "c", "d", "g2", "u1", "u2"]


def test_fifo_order_names_a_cycle():
    with pytest.raises(ValueError, match="a cycle among"):
        fifo_order(["a", "b"], {"a": ["b"], "b": ["a"]})


B, D, H = 64, 128, 256  # x [B, D]; a, b [D, H]: each dot's output is 64 KiB


def _two_dots(x, a, b):
    s = jnp.sum(jnp.sin(x @ a))
    return s + jnp.sum(jnp.cos(x @ b))  # traced after the first sum, but needs only arguments


def _args():
    return jnp.ones((B, D)), jnp.ones((D, H)), jnp.ones((D, H))


def test_xla_cpu_computes_independent_work_breadth_first():
    """Traced order: x @ a, its sum, then x @ b, so one dot output (64 KiB) is live at a time.
    XLA:CPU's breadth-first schedule runs both dots first (both read only arguments), holding both;
    the cpu profile predicts that (the compiled program's buffer assignment is the reference), the
    traced order does not."""
    g = trace(_two_dots, *_args())
    assert [u for u in g.schedule if "dot" in u or "reduce" in u] == [
        "dot_general_0", "reduce_sum_0", "dot_general_1", "reduce_sum_1"]
    walk = memory_order(g, CPU)
    assert [u for u in walk.schedule if "dot" in u or "reduce" in u] == [
        "dot_general_0", "dot_general_1", "reduce_sum_0", "reduce_sum_1"]
    m = jax.jit(_two_dots).lower(*_args()).compile().memory_analysis()
    assert m.temp_size_in_bytes == 2 * B * H * 4  # both dot outputs (sin and cos run in place over them)
    args_bytes = (B * D + 2 * D * H) * 4  # per device: replicated
    # both dot outputs (sin, cos written over them) and the scalar output's allocation
    assert predict(g, "d:8", "", hardware=CPU).memory_bytes == args_bytes + 2 * B * H * 4 + 4
    # traced: one dot output, the output's allocation and the first sum (4 B) live across the second dot
    assert predict(g, "d:8", "", hardware=TRACED_CPU).memory_bytes == args_bytes + B * H * 4 + 4 + 4
    ex = execute(g, "d:8", "", args=_args(), repeats=1, reference=False)
    assert ex.memory_ratio == 1.0


def _stacked(xs, w1, w2):
    """A scan body whose first value ``a`` is also the scan's stacked output, then three more dots."""
    def body(h, x):
        a = jnp.tanh(h @ w1)
        c = jnp.tanh(jnp.tanh(a @ w2) @ w1)
        return jnp.tanh(c @ w2) + x, a
    return jax.lax.scan(body, jnp.ones(xs.shape[1:]), xs)


def test_xla_cpu_writes_a_scan_output_into_its_stack_when_it_is_ready():
    """XLA:CPU's breadth-first schedule runs the ``dynamic-update-slice`` that writes ``a`` into the
    scan's output stack as soon as ``a`` is ready, before the body's later dots, so ``a``'s buffer is
    free after its last reader in the body. The model's lifetime of ``a`` ends there on the cpu
    profile (it had held ``a`` for the whole iteration: 1.19 of XLA's figure) and at the body's end
    in the traced order, where the body's outputs are written last."""
    from autolayout.costmodel.lifetimes import body_lifetimes

    args = jnp.ones((4, 256, 64)), jnp.ones((64, 128)), jnp.ones((128, 64))
    compiled = jax.jit(_stacked).lower(*args).compile()
    text = compiled.as_text()
    comps, name = computations(text)
    kernels = [line for line in comps[name].splitlines() if "fusion(" in line]
    dus = [i for i, line in enumerate(kernels) if "dynamic-update-slice" in line]
    dots = [i for i, line in enumerate(kernels) if "kind=kCustom" in line]  # the four dots (YNNPACK fusions)
    assert len(dus) == 1 and len(dots) == 4 and dots[1] < dus[0] < dots[2], kernels
    g = trace(_stacked, *args, dims=("layers b d", "d e", "e d"))
    (lp,) = g.loops.values()
    (a,) = [n for n in lp.body if any(n in g.op(s).inputs for s in lp.stacks)]
    reader = next(n for n in lp.body if g.op(n).kind == "einsum" and a in g.op(n).inputs)
    walk = memory_order(g, CPU)
    order, last = body_lifetimes(walk, walk.loops[lp.name])
    assert last[a] == order[reader]
    _, traced_last = body_lifetimes(g, lp)
    assert traced_last[a] == len(lp.body)
    m = compiled.memory_analysis()
    xla = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    assert abs(predict(g, "d:1", "", hardware=CPU).memory_bytes / xla - 1) <= 0.10


def test_xla_cpu_fills_a_scans_stacks_at_the_step_start():
    """``jax.lax.scan``'s stacked outputs are loop state initialised with a broadcast of a zero
    constant; XLA:CPU's breadth-first schedule runs it right after the constant, before the forward
    scan, so in a remat step whose peak is its loss (between the two scans) the backward's gradient
    stacks are live there. The model allocated a stack at its scan: 0.893 of ``memory_analysis()``
    for this step; from the step's start, on the cpu profile only (0.973)."""
    from autolayout.costmodel.lifetimes import lifetimes

    g = models.transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=8, vocab=2048, batch=8,
                              length=32, remat=True)
    ex = execute(g, "data:2,model:4", "", repeats=1, reference=False,
                 compiler_options={"xla_backend_optimization_level": 0})
    entry = entry_instructions(ex.compiled_hlo_text)  # in schedule order
    defs = {x["name"]: x for x in entry}
    at = {x["name"]: i for i, x in enumerate(entry)}
    whiles = [x["name"] for x in entry if x["opcode"] == "while"]
    assert len(whiles) == 2, whiles
    forward, backward = whiles
    fills = set()
    for name in defs[defs[backward]["operands"][0]]["operands"]:  # the backward while's initial tuple
        while defs.get(name, {}).get("opcode") == "copy":  # a fill shared by two stacks is copied
            name = defs[name]["operands"][0]
        fills.add(name)
    fills = [f for f in fills if "broadcast" in f and " fusion(%constant" in defs[f]["line"]]
    walk = memory_order(g, CPU)
    stacks = [u for u in walk.schedule if isinstance(u, Loop)][-1].stacks  # the backward scan's
    assert len(fills) >= 2 and stacks, (fills, stacks)  # the gradients of each stacked weight shape
    assert all(at[f] < at[forward] for f in fills), [(f, at[f], at[forward]) for f in fills]
    _, alloc, _ = lifetimes(walk)
    assert all(alloc[n] == 0 for n in stacks)
    _, traced_alloc, _ = lifetimes(g)  # the traced order (accelerators): at the scan
    assert all(traced_alloc[n] > 0 for n in stacks)
    assert abs(ex.memory_ratio - 1) <= 0.10, ex.memory_ratio


@pytest.mark.parametrize("name", ["mlp", "transformer_lm", "moe", "llama"])
def test_breadth_first_reorders_within_data_flow(name):
    """The same units, each computation's ops after the operands it computes; loops keep their
    place in the data flow; the traced graph is left as it was."""
    g = getattr(models, name)(**({"batch": 8, "d_io": 16, "d_hidden": 32} if name == "mlp" else {}))
    before = g.schedule
    view = breadth_first(g, combined=True)
    assert g.schedule == before and breadth_first(view) is view
    assert view.order == g.order and view.ops() == g.ops()
    unit = {n: lp.name for lp in view.loops.values() for n in lp.body}
    keys = [u.name if isinstance(u, Loop) else u for u in view.schedule]
    assert sorted(keys) == sorted(u.name if isinstance(u, Loop) else u for u in before)
    at = {k: i for i, k in enumerate(keys)}
    for k in keys:
        for n in (view.loops[k].body if k in view.loops else (k,)):
            for src in g.op(n).inputs:
                assert at[unit.get(src, src)] <= at[k], (k, src)
    for lp in view.loops.values():
        assert sorted(lp.body) == sorted(g.loops[lp.name].body)
        pos = {n: i for i, n in enumerate(lp.body)}
        for n in lp.body:
            assert all(pos[s] < pos[n] for s in g.op(n).inputs if s in pos), (lp.name, n)
    assert view.schedule != before  # these steps have independent work the traced order runs later


@pytest.mark.parametrize("name", ["mlp", "transformer_lm", "moe", "llama"])
def test_combined_reduction_runs_after_the_work_queued_before_the_last_gradient(name):
    """``Graph.combined_after``, checked against the first-in first-out rule itself: the units run
    between the last gradient op and the reduction were queued before that op left the queue (every
    operand they read computed before it, none a gradient), and the next unit was not."""
    from autolayout.costmodel.gradients import gradient_reducers

    g = getattr(models, name)(**({"batch": 8, "d_io": 16, "d_hidden": 32} if name == "mlp" else {}))
    view = breadth_first(g, combined=True)

    def sources(n):  # the materialised tensors op n reads, through the element-wise ops fused into it
        for src in g.op(n).inputs:
            yield from ((src,) if g.op(src).materialised else sources(src))

    computations = {None: [u.name if isinstance(u, Loop) else u for u in view.schedule]}
    computations.update({lp.name: list(lp.body) for lp in view.loops.values()})
    groups = gradient_reducers(view)
    assert set(view.combined_after) == {c for c in groups if computations[c]}
    for c, after in view.combined_after.items():
        unit = {} if c is not None else {n: lp.name for lp in view.loops.values() for n in lp.body}
        units = [u for u in computations[c] if u in view.loops or g.op(u).materialised]
        at = {u: i for i, u in enumerate(units)}
        group = {unit.get(o, o) for o in groups[c]} & set(units)

        def deps(u):
            ops = view.loops[u].body if u in view.loops and c is None else (u,)
            return {unit.get(s, s) for n in ops for s in sources(n)} & set(units) - {u}

        last, k = max(at[o] for o in group), at[after]
        assert k >= last, (c, after)
        for u in units[last + 1:k + 1]:
            assert all(at[d] < last for d in deps(u)) and not deps(u) & group, (c, u)
        if k + 1 < len(units):
            nxt = units[k + 1]
            assert any(at[d] >= last for d in deps(nxt)) or deps(nxt) & group, (c, nxt)


@pytest.mark.parametrize("hw", ["tpu-v4", "tpu-v5p"])
def test_tpus_walk_the_traced_order(hw):
    g = models.mlp(batch=8, d_io=16, d_hidden=32)
    assert memory_order(g, get_hardware(hw)) is g
    assert memory_order(g, CPU) is not g


def _dots_first(x, a, b):
    u, v = x @ a, x @ b  # both dots traced first: the traced order holds both outputs
    return jnp.sum(jnp.sin(u)) + jnp.sum(jnp.cos(v))


def test_gpus_walk_xlas_memory_scheduler():
    """The h100 profile walks XLA:GPU's DefaultMemoryScheduler order: each dot's sum right after it,
    so one 64 KiB dot output is live at a time where the traced order holds both. XLA's own
    memory-minimising DFS scheduler (XLA:CPU with its concurrency-optimised scheduler off) holds one
    too: its temp heap is one dot output and the first sum, as the model's."""
    g = trace(_dots_first, *_args())
    walk = memory_order(g, H100)
    assert walk is not g and walk.min_memory_scheduler in MEMORY_SCHEDULERS and memory_order(walk, H100) is walk
    assert min_memory(walk, H100) is walk
    units = [u for u in walk.schedule if "dot" in u or "reduce" in u]
    assert all("reduce" in units[i + 1] for i in range(0, 4, 2)), units  # dot, its sum, dot, its sum
    args_bytes = (B * D + 2 * D * H) * 4
    traced = predict(g, "d:1", "", hardware=TRACED_H100).memory_bytes
    # one dot output less; the first sum (4 B) is live across the second dot instead
    assert traced - predict(g, "d:1", "", hardware=H100).memory_bytes == B * H * 4 - 4
    assert traced >= args_bytes + 2 * B * H * 4
    # XLA's DFS scheduler (XLA:CPU with its concurrency-optimised one off: an XLA flag, so a process
    # of its own): one dot output and the first sum in its temp heap
    import os
    import subprocess

    code = ("import jax, jax.numpy as jnp\n"
            "def f(x, a, b):\n    u, v = x @ a, x @ b\n    return jnp.sum(jnp.sin(u)) + jnp.sum(jnp.cos(v))\n"
            f"args = jnp.ones(({B}, {D})), jnp.ones(({D}, {H})), jnp.ones(({D}, {H}))\n"
            "print(jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes)\n")
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_enable_concurrency_optimized_scheduler=false", JAX_PLATFORMS="cpu",
               JAX_NUM_CPU_DEVICES="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    assert int(out.split()[-1]) == B * H * 4 + 4


@pytest.mark.parametrize("name", ["mlp", "transformer_lm", "moe", "llama"])
def test_min_memory_orders_within_data_flow_and_keeps_the_least_peak(name):
    """Every computation's ops after the operands it computes, the same units; the view keeps the
    scheduler whose live peak is least, ties to the first of list, DFS and post order."""
    g = getattr(models, name)(**({"batch": 8, "d_io": 16, "d_hidden": 32} if name == "mlp" else {}))
    view = memory_order(g, H100)
    names = lambda units: sorted(u.name if isinstance(u, Loop) else u for u in units)  # noqa: E731
    assert view.order == g.order and names(view.schedule) == names(g.schedule)
    unit = {n: lp.name for lp in view.loops.values() for n in lp.body}
    keys = [u.name if isinstance(u, Loop) else u for u in view.schedule]
    at = {k: i for i, k in enumerate(keys)}
    for k in keys:
        for n in (view.loops[k].body if k in view.loops else (k,)):
            assert all(at[unit.get(s, s)] <= at[k] for s in g.op(n).inputs), (k, n)
    for lp in view.loops.values():
        pos = {n: i for i, n in enumerate(lp.body)}
        assert all(pos[s] < pos[n] for n in lp.body for s in g.op(n).inputs if s in pos), lp.name
    # each stacked output exists from its zero fill, an instruction the scheduler places before its scan
    loops_at = {u.name: i for i, u in enumerate(view.schedule) if isinstance(u, Loop)}
    assert set(view.stack_fills) == {st for lp in g.loops.values() for st in lp.stacks}
    assert all(view.stack_fills[st] <= loops_at[lp.name] for lp in g.loops.values() for st in lp.stacks)
    peaks = view.min_memory_peaks
    assert set(peaks) == set(MEMORY_SCHEDULERS) and all(p > 0 for p in peaks.values())
    assert view.min_memory_scheduler == min(MEMORY_SCHEDULERS, key=lambda s: (peaks[s], MEMORY_SCHEDULERS.index(s)))


def test_with_schedule_rejects_other_units():
    g = models.mlp(batch=8, d_io=16, d_hidden=32)
    with pytest.raises(ValueError, match="must be graph 'mlp'.s schedule units"):
        g.with_schedule(list(g.schedule)[1:])
