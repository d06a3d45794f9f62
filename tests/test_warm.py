"""The search's warm start (search/warm.py), held against ``predict``: the storage options it
takes with a layout never make the layout slower, and under a memory limit the local search
returns the fastest fitting layout it passed, not only where its memory descent ended.
"""
from __future__ import annotations

import math

import pytest

from autolayout import models
from autolayout.core import Mesh
from autolayout.costmodel.attention import kernel_graph
from autolayout.costmodel.predict import predict
from autolayout.costmodel.profiles import get_hardware
from autolayout.search import search
from autolayout.search.model import Decoded, evaluate_time
from autolayout.search.solver import layout_of
from autolayout.search.tables import Tables
from autolayout.search.warm import with_best_wus
from autolayout.search.wus import wus_options

_GRAPHS: dict = {}


def graph(name: str):
    if name not in _GRAPHS:
        _GRAPHS[name] = {"transformer_lm": models.transformer_lm, "llama": models.llama,
                         "mlp": lambda: models.mlp(batch=8192, d_io=4096, d_hidden=16384)}[name]()
    return _GRAPHS[name]


def _time(g, mesh, hw, lay) -> float:
    return predict(g, mesh, str(lay), hardware=hw).time_s


CASES = [(m, mesh, hw) for m in ("transformer_lm", "llama", "mlp") for mesh in ("rows:2,cols:4", "data:8")
         for hw in ("tpu-v4", "h100")]


@pytest.mark.parametrize("name,mesh,hw", CASES, ids=[f"{m}-{mesh}-{hw}" for m, mesh, hw in CASES])
def test_storage_options_of_the_warm_start_never_slow_a_layout_down(name, mesh, hw):
    """Each storage option's own time change (``dtime``) can be negative while together they
    are slower: they also move gathers and reduce-scatters into an overlap domain, where their
    sum can exceed the compute that hides them (overlap.step_time). The warm start's options,
    priced by ``predict``, are no slower than none and than every option that saves time alone."""
    g = graph(name)
    tables = Tables(kernel_graph(g, get_hardware(hw)), Mesh.parse(mesh), get_hardware(hw), regions=False)
    wus, _ = wus_options(tables)
    axes_of = {"batch": tuple(tables.space.axes)}  # data parallel: every parameter can be sharded
    bare = _time(g, mesh, hw, layout_of(tables, Decoded(axes_of, {}, [])))
    alone = []  # the option that saves the most time by itself, per parameter
    for k, p in enumerate(wus):
        best = min(((p.options[j].dtime, j) for j in p.at(tables.restrict(axes_of, p.dims))), default=None)
        if best is not None and best[0] < 0:
            alone.append((k, best[1]))
    every_alone = Decoded(axes_of, {wus[k].param: (wus[k].options[j].axes, wus[k].options[j].stage)
                                    for k, j in alone}, alone)
    chosen = with_best_wus(tables, wus, axes_of)
    t = _time(g, mesh, hw, layout_of(tables, chosen))
    assert math.isclose(evaluate_time(tables, wus, chosen), t, rel_tol=1e-9)
    assert t <= bare * (1 + 1e-9)
    assert t <= _time(g, mesh, hw, layout_of(tables, every_alone)) * (1 + 1e-9)


def test_the_old_rule_was_slower_than_no_storage_sharding_here():
    """The case the test above guards: on TPU v4, taking every option that saves time alone
    makes the zoo transformer's data-parallel step slower than sharding no storage at all
    (``predict``: the gathers no longer fit behind the compute)."""
    g, mesh, hw = graph("transformer_lm"), "rows:2,cols:4", "tpu-v4"
    bare = _time(g, mesh, hw, "batch:rows,cols")
    every = _time(g, mesh, hw, "batch:rows,cols|*:rows,cols@3")
    assert every > bare
    tables = Tables(kernel_graph(g, get_hardware(hw)), Mesh.parse(mesh), get_hardware(hw), regions=False)
    wus, _ = wus_options(tables)
    assert _time(g, mesh, hw, layout_of(tables, with_best_wus(tables, wus, {"batch": ("rows", "cols")}))) < bare


def _mixer(donate: tuple[int, ...] = ()):
    """A Flax MLP-Mixer training step (token- and channel-mixing MLPs; clipped Adam with masked
    weight decay and a schedule, as optax.chain composes it): a model whose
    unconstrained fastest layouts are over half its replicated memory while data parallelism
    fits under it. ``donate``: the step's ``donate_argnums``."""
    import jax
    import jax.numpy as jnp
    import flax.linen as nn
    import optax

    from autolayout import trace

    B, L, E, M, C = 8, 16, 32, 64, 10

    class Mixer(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(E)(x)
            for _ in range(2):
                y = jnp.swapaxes(nn.LayerNorm()(x), 1, 2)
                x = x + jnp.swapaxes(nn.Dense(L)(nn.gelu(nn.Dense(M)(y))), 1, 2)
                x = x + nn.Dense(E)(nn.gelu(nn.Dense(M)(nn.LayerNorm()(x))))
            return nn.Dense(C)(x.mean(1))

    model = Mixer()
    x, labels = jax.ShapeDtypeStruct((B, L, E), jnp.float32), jax.ShapeDtypeStruct((B,), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(x.shape))["params"])
    decay = jax.tree_util.tree_map_with_path(lambda p, _: p[-1].key == "kernel", params)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.add_decayed_weights(0.05, mask=decay),
                     optax.scale_by_schedule(optax.linear_schedule(1e-3, 1e-4, 100)), optax.scale(-1.0))
    opt_state = jax.eval_shape(tx.init, params)

    def step(params, opt_state, x, labels):
        loss, g = jax.value_and_grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
            model.apply({"params": p}, x), labels).mean())(params)
        u, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, u), opt_state, loss

    return trace(step, params, opt_state, x, labels, dims={"x": "batch length embed", "labels": "batch"},
                 roles={"params": "param", "opt_state": "opt_state", "x": "input", "labels": "input"},
                 donate_argnums=donate)


def test_time_out_returns_a_warm_start_no_slower_than_a_fitting_layout_it_passed(monkeypatch):
    """With CP-SAT finding nothing in time, the search returns the warm start. Under half the
    replicated memory, the local search's fastest layouts do not fit and its memory descent
    moves to one that does; data parallelism, where one descent starts, fits and is faster
    than where that descent ends, so the warm start must be at least as fast (``predict``)."""
    from autolayout.search import solver

    real = solver._status
    monkeypatch.setattr(solver, "_status", lambda code, model=None: "UNKNOWN" if model is not None else real(code))
    g, mesh, hw = _mixer(), "data:2,model:4", "tpu-v4"
    limit = predict(g, mesh, "", hardware=hw).memory_bytes / 2
    dp = predict(g, mesh, "batch:data,model", hardware=hw)
    assert dp.memory_bytes <= limit
    r = search(g, mesh, hardware=hw, memory_limit=limit, time_limit_s=1e-4)
    assert r.status == "FEASIBLE" and any("warm start" in n for n in r.notes)
    got = predict(g, mesh, str(r.layout), hardware=hw)
    assert got.memory_bytes <= limit
    assert got.time_s <= dp.time_s * (1 + 1e-9), (str(r.layout), got.time_s, dp.time_s)


@pytest.mark.parametrize("donate", [(), (0, 1)], ids=["not-donated", "donated"])
def test_time_out_after_output_cuts_advises_donating_the_state(monkeypatch, donate):
    """A step that does not donate its state has outputs XLA allocates beside its arguments for
    the whole call; a layout their bytes put over the limit is cut off alone (solver._add_rows).
    When the time runs out after such cuts the result says how many and to donate the state; a
    donated step has no such outputs and gets no such note. CP-SAT is stopped once the search has
    cut off its first layout (monkeypatch), or after 8 solves where it cuts none."""
    from autolayout.search import solver

    real_exclude, real_status, cuts, solves = solver.exclude, solver._status, [], []

    def exclude(lm, point, **kw):
        cuts.append(point)
        return real_exclude(lm, point, **kw)

    def status(code, model=None):  # UNKNOWN from then on, as in the test above
        if model is not None:
            solves.append(1)
        return "UNKNOWN" if model is not None and (cuts or len(solves) > 8) else real_status(code, model)

    monkeypatch.setattr(solver, "exclude", exclude)
    monkeypatch.setattr(solver, "_status", status)
    g, mesh, hw = _mixer(donate), "data:2,model:4", "tpu-v4"
    limit = predict(g, mesh, "", hardware=hw).memory_bytes / 2
    r = search(g, mesh, hardware=hw, memory_limit=limit, time_limit_s=600)
    advice = [n for n in r.notes if "donate_argnums" in n]
    if donate:
        assert not cuts and not advice
    else:
        assert r.status == "FEASIBLE" and cuts
        (note,) = advice
        assert note.startswith(f"{len(cuts)} layouts were cut off one at a time") and "does not donate its state" in note
