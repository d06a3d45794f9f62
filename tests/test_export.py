"""Exports of a layout (:mod:`autolayout.export`): PartitionSpecs for ``jax.jit``, flax/t5x
``logical_axis_rules`` and MaxText's config vocabulary.

References: the shardings autolayout's own execution gives its inputs (the arrays it
places), ``jax.jit(step)`` outputs, Flax's own rule resolution
(``flax.linen.logical_to_mesh_axes``), MaxText's ``configs/base.yml`` names, and specs
written by hand.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from autolayout import Layout, Mesh, execute, trace
from autolayout.export import ExportError, logical_axis_rules, maxtext_config, partition_specs, resolve

S = jax.ShapeDtypeStruct
F32 = jnp.float32
FAST = {"xla_backend_optimization_level": 0}
MESH = "data:2,model:4"

PARAMS = {"w1": S((16, 32), F32), "w2": S((32, 16), F32)}
TX = optax.chain(optax.clip_by_global_norm(1e-3), optax.adamw(1e-3))


def loss_fn(p, x):
    return jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"]) ** 2)


def step(params, opt_state, x):
    loss, grads = jax.value_and_grad(loss_fn)(params, x)
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


@pytest.fixture(scope="module")
def graph():
    return trace(step, PARAMS, jax.eval_shape(TX.init, PARAMS), S((16, 16), F32),
                 dims=({"w1": "embed mlp", "w2": "mlp embed"}, None, "batch embed"),
                 roles=("param", "opt_state", "input"))


def concrete():
    params = {k: jax.random.normal(jax.random.key(i), v.shape) / 4 for i, (k, v) in enumerate(PARAMS.items())}
    return params, TX.init(params), jax.random.normal(jax.random.key(9), (16, 16))


# layout -> hand-written specs of (w1, w2) and of Adam's mu for w1
SPECS = {
    "tensor-parallel": ("batch:data;mlp:model", P(None, "model"), P("model", None), P(None, "model")),
    # ZeRO-1/2: weights whole, optimizer state split over data on the first dim that divides
    "zero2": ("batch:data;mlp:model|*:data@2", P(None, "model"), P("model", None), P("data", "model")),
    # FSDP: weights stored split too; w2's first dim already holds model, data is added after it
    "fsdp": ("batch:data;mlp:model|*:data@3", P("data", "model"), P(("model", "data"), None), P("data", "model")),
}


@pytest.mark.parametrize(("layout", "w1", "w2", "mu_w1"), list(SPECS.values()), ids=list(SPECS))
def test_partition_specs_of_params_and_optimizer_state(graph, layout, w1, w2, mu_w1):
    specs = partition_specs(graph, MESH, layout)
    params, (clip_state, (adam, *_)), x = specs
    assert params == {"w1": w1, "w2": w2}
    assert adam.mu["w1"] == mu_w1 and adam.nu["w1"] == mu_w1
    assert adam.count == P() and x == P("data", None)


@pytest.mark.parametrize("layout", [v[0] for v in SPECS.values()], ids=list(SPECS))
def test_exported_specs_in_jax_jit_shard_like_autolayouts_own_execution(graph, layout):
    args = concrete()
    ex = execute(graph, MESH, layout, args=args, repeats=1, compiler_options=FAST)
    jmesh = Mesh(MESH).to_jax()
    in_specs = partition_specs(graph, MESH, layout)
    out_specs = partition_specs(graph, MESH, layout, outputs=True)
    shard = lambda tree: jax.tree.map(lambda p: NamedSharding(jmesh, p), tree, is_leaf=lambda x: isinstance(x, P))
    jitted = jax.jit(step, in_shardings=shard(in_specs), out_shardings=shard(out_specs))
    compiled = jitted.lower(*args).compile()
    placed = ex._step.placed  # the arrays autolayout's execution runs its step on
    assert len(placed) == len(jax.tree.leaves(compiled.input_shardings[0])) == len(graph.input_names)
    for name, leaf, mine, theirs in zip(graph.input_names, jax.tree.leaves(args),
                                        jax.tree.leaves(compiled.input_shardings[0]), placed):
        shape = np.shape(leaf)
        assert mine.devices_indices_map(shape) == theirs.sharding.devices_indices_map(shape), name
    out = jitted(*args)
    ref = jax.jit(step)(*args)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(ex.outputs), jax.tree.leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_flattened_shards_have_no_partition_spec():
    p6 = {"w1": S((6, 10), F32), "w2": S((10, 6), F32)}  # no dim divides by 8
    g = trace(step, p6, jax.eval_shape(TX.init, p6), S((8, 6), F32),
              dims=({"w1": "io hidden", "w2": "hidden io"}, None, "batch io"), roles=("param", "opt_state", "input"))
    with pytest.raises(ExportError, match=r"flattened, padded shard over all.*Fix"):
        partition_specs(g, "all:8", "batch:all|w1:all@2")


# --------------------------------------------------------------------------- logical axis rules
RESOLVE_CASES = {
    "first-rule-wins": (("batch", "embed"), [("batch", "data"), ("batch", "model"), ("embed", "model")]),
    "used-axis-skipped": (("batch", "embed"), [("batch", "data"), ("embed", "data"), ("embed", "model")]),
    "tuple-axes": (("batch", "mlp"), [("batch", ("data", "model")), ("mlp", "model")]),
    "none-rule": (("embed", "mlp"), [("embed", None), ("mlp", "model")]),
    "unnamed-axis": ((None, "mlp"), [("mlp", "model")]),
    "no-rule": (("heads", "kv"), [("mlp", "model")]),
}


@pytest.mark.parametrize(("names", "rules"), list(RESOLVE_CASES.values()), ids=list(RESOLVE_CASES))
def test_resolve_follows_flax(names, rules):
    assert P(*resolve(names, rules)) == nn.logical_to_mesh_axes(names, rules)


@pytest.mark.parametrize("layout", [v[0] for v in SPECS.values()], ids=list(SPECS))
def test_logical_axis_rules_round_trip(graph, layout):
    lr = logical_axis_rules(graph, MESH, layout)
    compute = [r for r in lr.rules if r not in lr.storage_rules]
    assert Layout(compute).canonical() == Layout(Layout(layout).rules).canonical()
    assert {d for d, _ in lr.rules} == set(graph.dims)  # every logical axis is covered
    specs = dict(zip(graph.input_names, jax.tree.leaves(partition_specs(graph, MESH, layout),
                                                        is_leaf=lambda x: isinstance(x, P))))
    for name in graph.input_names:
        t = graph.tensor(name)
        if not t.dim_names:
            continue
        flax_spec = nn.logical_to_mesh_axes(t.dim_names, list(lr.rules))
        noted = any(n.startswith(repr(name)) for n in lr.notes)
        assert (flax_spec == specs[name]) != noted, (name, flax_spec, specs[name], lr.notes)


def test_fsdp_rule_follows_the_compute_rules_so_activations_skip_it(graph):
    lr = logical_axis_rules(graph, MESH, "batch:data;mlp:model|*:data@3")
    assert lr.storage_rules[0] == ("embed", "data")
    rules = list(lr.rules)
    assert rules.index(("embed", "data")) > rules.index(("batch", "data"))
    assert nn.logical_to_mesh_axes(("batch", "embed"), rules) == P("data", None)  # activation
    assert nn.logical_to_mesh_axes(("embed", "mlp"), rules) == P("data", "model")  # w1 as stored
    # w2 [mlp, embed] is stored with data on mlp: one rule per name cannot say so
    assert any(n.startswith("'w2'") for n in lr.notes)


# --------------------------------------------------------------------------- MaxText
def test_maxtext_names_the_fsdp_axis_and_its_logical_rules(graph):
    mt = maxtext_config(graph, MESH, "batch:data;mlp:model|*:data@3")
    assert mt.mesh_axes == {"data": "fsdp", "model": "tensor"}
    assert mt.ici_parallelism == {"ici_fsdp_parallelism": 2, "ici_tensor_parallelism": 4}
    assert ["activation_batch", ["fsdp"]] in mt.logical_axis_rules
    assert ["embed", ["fsdp"]] in mt.logical_axis_rules and ["mlp", ["tensor"]] in mt.logical_axis_rules
    plain = maxtext_config(graph, MESH, "batch:data;mlp:model")
    assert plain.mesh_axes == {"data": "data", "model": "tensor"}
    assert ["embed", []] in plain.logical_axis_rules


def test_maxtext_says_what_does_not_map():
    g = trace(lambda x, w: jnp.sum(jnp.tanh(x @ w)), S((8, 16), F32), S((16, 32), F32), dims=("rows io", "io cols"))
    mt = maxtext_config(g, MESH, "rows:data;cols:model")
    assert mt.mesh_axes["data"] is None and any("'rows'" in n and "no MaxText logical name" in n for n in mt.notes)
    renamed = maxtext_config(g.rename({"rows": "batch", "cols": "mlp"}), MESH, "batch:data;mlp:model")
    assert renamed.mesh_axes == {"data": "data", "model": "tensor"} and not renamed.notes
