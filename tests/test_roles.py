"""Parameter roles (``graph.param_roles``): gradient, optimizer state and update of each
parameter, found from pytree structure for autolayout.train_step and for optax.

References are independent of the tracer: updates and optimizer-state leaves are the
graph tensors at the pytree paths where the traced function takes and returns them
(``graph.input_names`` / ``graph.outputs`` follow the flattening order of the arguments
and outputs); gradients are checked by value against ``jax.grad`` (optionally clipped by
optax itself) or recovered from the function's own outputs (``p - lr·g``, Adam's
``mu' = b1·mu + (1-b1)·g``), or are the tensor the step returns as an extra output.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

import zoo_cases
from autolayout import Graph, ParamRole, execute, models, predict, trace
from autolayout.graph import OutputSpec
from autolayout.train import ADAM_B1

S = jax.ShapeDtypeStruct
F32 = jnp.float32
FAST = {"xla_backend_optimization_level": 0}


# --------------------------------------------------------------------------- helpers
def input_at(g: Graph) -> dict:
    """Argument key path -> graph input tensor (``input_names`` is in flattening order)."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(g.example_spec)[0]]
    return dict(zip(paths, g.input_names))


def output_at(g: Graph) -> dict:
    """Output key path -> graph tensor of that output leaf."""
    tree = jax.tree_util.tree_unflatten(g.out_tree, list(range(len(g.outputs))))
    return {p: g.outputs[i].tensor for p, i in jax.tree_util.tree_flatten_with_path(tree)[0]}


def tensor_values(g: Graph, args, names: list[str], like: list[str]) -> list:
    """Values of graph tensors ``names`` on ``args``, each with the axes of tensor ``like[i]``
    in that tensor's order: the same ops, with those tensors as the outputs."""
    specs = []
    for n, ref in zip(names, like):
        t = g.tensor(ref)
        specs.append(OutputSpec(n, t.dim_names, tuple(d.size for d in t.shape), g.tensor(n).dtype))
    sub = Graph(g.ops(), input_names=g.input_names, in_tree=g.in_tree, outputs=specs,
                out_tree=jax.tree_util.tree_structure([0] * len(names)), loops=tuple(g.loops.values()))
    return sub.evaluate(*args)


def param_paths(g: Graph) -> dict:
    """Parameter tensor -> its key path relative to the first argument (zoo: params first)."""
    at = input_at(g)
    return {name: p[1:] for p, name in at.items() if p[0] == SequenceKey(0)}


def concrete(spec, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda s: jnp.asarray(rng.standard_normal(s.shape) * scale, s.dtype)
        if jnp.issubdtype(s.dtype, jnp.floating) else jnp.zeros(s.shape, s.dtype), spec)


# --------------------------------------------------------------------------- the zoo
@pytest.mark.parametrize("model", list(zoo_cases.SIZES))
def test_zoo_updates_and_optimizer_state_are_at_the_parameters_paths(model):
    g = zoo_cases.graph(model, True)
    outs, ins = output_at(g), input_at(g)
    paths = param_paths(g)
    assert set(g.param_roles) == set(paths) == {t.name for t in g.params()}
    adam = model in zoo_cases.ADAM_MODELS  # the zoo's Adam step: (params, {"mu", "nu", "count"}, batch)
    for name, rel in paths.items():
        role = g.param_roles[name]
        assert role.update == outs[(SequenceKey(0), *rel)]
        want = tuple(ins[(SequenceKey(1), DictKey(k), *rel)] for k in ("mu", "nu")) if adam else ()
        assert role.opt_state == want


@pytest.mark.parametrize("model", list(zoo_cases.SIZES))
def test_zoo_gradients_have_the_gradients_values(model):
    g = zoo_cases.graph(model, True)
    args, _, ref = zoo_cases.run(model, True)
    paths = param_paths(g)
    names = list(paths)
    values = dict(zip(names, tensor_values(g, args, [g.param_roles[n].grad for n in names], names)))

    def at(tree, path):
        for k in path:
            tree = tree[getattr(k, "key", getattr(k, "idx", None))]
        return np.asarray(tree, np.float64)

    for name, rel in paths.items():
        if model in zoo_cases.ADAM_MODELS:  # Adam: mu' = b1 mu + (1 - b1) g
            expected = (at(ref[1]["mu"], rel) - ADAM_B1 * at(args[1]["mu"], rel)) / (1 - ADAM_B1)
        else:  # SGD with learning rate 0.1 (the zoo default): p' = p - 0.1 g
            expected = (at(args[0], rel) - at(ref[0], rel)) / 0.1
        got = np.asarray(values[name], np.float64)
        np.testing.assert_allclose(got, expected.reshape(got.shape), rtol=2e-3,
                                   atol=2e-3 * np.abs(expected).max(), err_msg=name)


@pytest.mark.parametrize("model", list(zoo_cases.SIZES))
def test_zoo_forward_passes_have_no_gradients_or_updates(model):
    g = zoo_cases.graph(model, False)
    assert g.param_roles == {t.name: ParamRole(t.name, None, (), None) for t in g.params()}


# --------------------------------------------------------------------------- optax
PARAMS = {"w1": S((6, 10), F32), "b1": S((10,), F32), "w2": S((10, 6), F32)}
BATCH = {"x": S((8, 6), F32), "y": S((8, 6), F32)}
PDIMS = {"w1": "io hidden", "b1": "hidden", "w2": "hidden io"}
BDIMS = {"x": "batch io", "y": "batch io"}


def loss_fn(p, b):
    h = jax.nn.relu(b["x"] @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] - b["y"]) ** 2)


CLIP = 1e-3  # small enough that the clip really scales (checked below)
# name -> (optimizer, the optimizer-state key paths that mirror the params tree)
OPTIMIZERS = {
    "sgd": (lambda: optax.sgd(0.1), []),
    "adam": (lambda: optax.adam(1e-3), [(SequenceKey(0), GetAttrKey("mu")), (SequenceKey(0), GetAttrKey("nu"))]),
    "adamw": (lambda: optax.adamw(1e-3, weight_decay=0.1),
              [(SequenceKey(0), GetAttrKey("mu")), (SequenceKey(0), GetAttrKey("nu"))]),
    "clip_adamw": (lambda: optax.chain(optax.clip_by_global_norm(CLIP), optax.adamw(1e-3)),
                   [(SequenceKey(1), SequenceKey(0), GetAttrKey("mu")),
                    (SequenceKey(1), SequenceKey(0), GetAttrKey("nu"))]),
    "adam_cosine_schedule": (lambda: optax.adam(optax.cosine_decay_schedule(1e-3, 100)),
                             [(SequenceKey(0), GetAttrKey("mu")), (SequenceKey(0), GetAttrKey("nu"))]),
    "sgd_momentum": (lambda: optax.sgd(0.1, momentum=0.9), [(SequenceKey(0), GetAttrKey("trace"))]),
    "lamb": (lambda: optax.lamb(1e-3), [(SequenceKey(0), GetAttrKey("mu")), (SequenceKey(0), GetAttrKey("nu"))]),
}


def optax_graph(opt: str, aux_grads: bool = False) -> tuple[Graph, callable]:
    """``step(params, opt_state, batch) -> (params, opt_state, loss)`` as optax users write it;
    ``aux_grads``: the chain's gradient transform is applied by hand and its result returned too."""
    tx = OPTIMIZERS[opt][0]()

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step_aux(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        if opt == "clip_adamw":  # what optax.chain does, with the clipped gradients kept
            clip, inner = optax.clip_by_global_norm(CLIP), optax.adamw(1e-3)
            grads, s0 = clip.update(grads, opt_state[0])
            updates, s1 = inner.update(grads, opt_state[1], params)
            opt_state = (s0, s1)
        else:
            updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    fn = step_aux if aux_grads else step
    state = jax.eval_shape(tx.init, PARAMS)
    g = trace(fn, PARAMS, state, BATCH, dims=(PDIMS, None, BDIMS), roles=("param", "opt_state", "input"))
    return g, fn


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_optax_roles_are_at_the_pytree_paths(opt):
    g, _ = optax_graph(opt, aux_grads=True)
    ins, outs = input_at(g), output_at(g)
    for p in PARAMS:
        role = g.param_roles[ins[(SequenceKey(0), DictKey(p))]]
        assert role.update == outs[(SequenceKey(0), DictKey(p))]
        assert role.grad == outs[(SequenceKey(3), DictKey(p))]
        assert role.opt_state == tuple(ins[(SequenceKey(1), *m, DictKey(p))] for m in OPTIMIZERS[opt][1])


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_optax_gradients_have_the_gradients_values(opt):
    g, fn = optax_graph(opt)
    params, batch = concrete(PARAMS, 1), concrete(BATCH, 2)
    state = OPTIMIZERS[opt][0]().init(params)
    grads = jax.grad(loss_fn)(params, batch)
    if opt == "clip_adamw":
        assert optax.tree.norm(grads) > 10 * CLIP  # the clip is not the identity here
        grads, _ = optax.clip_by_global_norm(CLIP).update(grads, optax.EmptyState())
    names = [g.input_names[i] for i in range(3)]  # params flatten first: b1, w1, w2
    assert names == [g.input_names[list(input_at(g)).index((SequenceKey(0), DictKey(k)))]
                     for k in sorted(PARAMS)]
    got = tensor_values(g, (params, state, batch), [g.param_roles[n].grad for n in names], names)
    for k, v in zip(sorted(PARAMS), got):
        np.testing.assert_allclose(np.asarray(v).reshape(grads[k].shape), grads[k], rtol=1e-5, atol=1e-7,
                                   err_msg=f"{opt}: {k}")


def test_optax_roles_do_not_depend_on_labels():
    # autolayout.train_step labels grad/<p>; optax's gradients carry no name and are found
    g, _ = optax_graph("adam")
    assert not any(t.name.startswith("grad/") for t in g.tensors())
    assert all(r.grad and r.update and len(r.opt_state) == 2 for r in g.param_roles.values())


def test_train_step_with_and_without_labels_find_the_same_gradient_op():
    step = models.train_step(loss_fn, "adam", 1e-3)
    state = models.init_opt_state("adam", PARAMS)
    g = trace(step, PARAMS, state, BATCH, dims=(PDIMS, None, BDIMS), roles=("param", "opt_state", "input"))
    for p in PARAMS:
        assert g.param_roles[p].grad == f"grad/{p}"


def test_weight_update_sharding_applies_to_an_optax_optimizer():
    """Seed 003 for optax.adamw: the gradient all-reduce of w1 becomes a reduce-scatter, and the
    updated w1 is all-gathered. No dim of w1 [6, 10] divides by 8, so (seed 003 §4) the
    flattened 60 elements are padded to 64: shards of 8 float32."""
    g, _ = optax_graph("adamw")
    base = predict(g, "all:8", "batch:all")
    wus = predict(g, "all:8", "batch:all|w1:all")
    shard = 8 * 4  # ceil(60 / 8) float32
    assert [c.kind for c in base.collectives].count("reduce-scatter") == 0
    (rs,) = [c for c in wus.collectives if c.kind == "reduce-scatter"]
    (ag,) = [c for c in wus.collectives if c.kind == "all-gather"]
    assert rs.bytes == 8 * shard and rs.op == g.param_roles["w1"].grad
    assert ag.op == g.param_roles["w1"].update and ag.bytes == shard


def test_weight_update_sharded_optax_step_runs_and_matches_the_compiled_collectives():
    g, fn = optax_graph("adamw")
    params, batch = concrete(PARAMS, 1), concrete(BATCH, 2)
    state = OPTIMIZERS["adamw"][0]().init(params)
    ex = execute(g, "all:8", "batch:all|w1:all", args=(params, state, batch), repeats=1, compiler_options=FAST)
    assert ex.max_abs_error < 1e-5
    assert ex.collectives_match, ex.comparison


# --------------------------------------------------------------------------- limits, made visible
def test_optimizer_state_that_would_pair_with_two_parameters_pairs_with_none():
    tx = optax.adam(1e-3)

    def step(w1, w2, opt_state, x):
        loss, grads = jax.value_and_grad(lambda a, b: jnp.sum(jnp.tanh(x @ a) @ b), argnums=(0, 1))(w1, w2)
        updates, opt_state = tx.update(grads, opt_state)
        new = optax.apply_updates((w1, w2), updates)
        return new[0], new[1], opt_state, loss

    w = S((6, 6), F32)
    g = trace(step, w, w, jax.eval_shape(tx.init, (w, w)), S((4, 6), F32),
              roles=("param", "param", "opt_state", "input"))
    roles = list(g.param_roles.values())
    assert [r.opt_state for r in roles] == [(), ()]  # mu[0], mu[1], nu[0], nu[1]: which is whose?
    assert all(r.grad is not None for r in roles)
    outs = output_at(g)
    assert [r.update for r in roles] == [outs[(SequenceKey(0),)], outs[(SequenceKey(1),)]]


def test_frozen_parameter_has_no_gradient_or_update():
    def step(params, x):
        grads = jax.grad(lambda p: jnp.sum(x @ p["w"] * p["frozen"]))(params)
        return {"w": params["w"] - 0.1 * grads["w"], "frozen": params["frozen"]}

    g = trace(step, {"w": S((4, 5), F32), "frozen": S((5,), F32)}, S((3, 4), F32), roles=("param", "input"))
    assert g.param_roles["frozen"] == ParamRole("frozen", None, (), None)
    assert g.param_roles["w"].grad is not None and g.param_roles["w"].update is not None


def test_update_found_by_structure_when_outputs_are_reordered():
    def step(params, x):
        loss, grads = jax.value_and_grad(lambda p: jnp.sum(jnp.tanh(x @ p["w"]) @ p["v"]))(params)
        return loss, jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    g = trace(step, {"w": S((4, 5), F32), "v": S((5, 2), F32)}, S((3, 4), F32), roles=("param", "input"))
    outs = output_at(g)
    for p in ("w", "v"):
        assert g.param_roles[p].update == outs[(SequenceKey(1), DictKey(p))]


def test_flax_train_state_roles():
    from flax.training import train_state

    tx = optax.adamw(1e-3)
    state = jax.eval_shape(lambda: train_state.TrainState.create(
        apply_fn=None, params=jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), PARAMS), tx=tx))

    def step(state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
        return state.apply_gradients(grads=grads), loss

    roles = state.replace(step="input", params="param", opt_state="opt_state")
    dims = state.replace(step=None, params=PDIMS, opt_state=None)
    g = trace(step, state, BATCH, dims=(dims, BDIMS), roles=(roles, "input"))
    ins, outs = input_at(g), output_at(g)
    for p in PARAMS:
        role = g.param_roles[ins[(SequenceKey(0), GetAttrKey("params"), DictKey(p))]]
        assert role.update == outs[(SequenceKey(0), GetAttrKey("params"), DictKey(p))]
        assert role.opt_state == tuple(
            ins[(SequenceKey(0), GetAttrKey("opt_state"), SequenceKey(0), GetAttrKey(k), DictKey(p))]
            for k in ("mu", "nu"))
        assert role.grad is not None


def _user_train_state():
    """A subclass of Flax's TrainState defined here, as users add batch statistics or a
    dropout key to it."""
    from flax import struct
    from flax.training import train_state

    class UserState(train_state.TrainState):
        extra: dict = struct.field(default_factory=dict)

    return UserState


@pytest.mark.parametrize("subclass", [False, True], ids=["TrainState", "user-subclass-of-TrainState"])
def test_flax_train_state_roles_without_roles_given(subclass):
    from flax.training import train_state

    cls = _user_train_state() if subclass else train_state.TrainState
    extra = {"extra": {"ema": S((6,), F32)}} if subclass else {}
    state = jax.eval_shape(lambda: cls.create(
        apply_fn=None, params=jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), PARAMS),
        tx=optax.adam(1e-3), **extra))

    def step(state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
        return state.apply_gradients(grads=grads), loss

    g = trace(step, state, BATCH, dims=(state.replace(step=None, params=PDIMS, opt_state=None,
                                                      **({"extra": {"ema": "io"}} if subclass else {})), BDIMS))
    ins = input_at(g)
    # every leaf under .params is a parameter, every leaf under .opt_state optimizer state (its
    # arrays: Adam's mu and nu and count), the rest inputs: read off the state's own pytree
    for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]:
        role = g.tensor(ins[(SequenceKey(0), *path)]).role
        field = path[0].name
        assert role == {"params": "param", "opt_state": "opt_state"}.get(field, "input"), (path, role)
    assert set(g.param_roles) == {ins[(SequenceKey(0), GetAttrKey("params"), DictKey(p))] for p in PARAMS}


# --------------------------------------------------------------------------- Graph fields
def test_graph_records_what_was_traced():
    g = zoo_cases.graph("mlp", True)
    assert callable(g.fn) and g.arg_roles == ("param", "input")
    assert jax.tree_util.tree_structure(g.example_spec) == g.in_tree
    assert all(isinstance(x, S) for x in jax.tree_util.tree_leaves(g.example_spec))
    assert set(g.donated) == {g.param_roles[p].update for p in ("w", "bias", "v")}
    with pytest.raises(TypeError):
        g.param_roles["w"] = None  # read-only mapping


def test_graph_rejects_roles_of_tensors_it_does_not_have():
    g = zoo_cases.graph("mlp", True)
    kw = dict(input_names=g.input_names, in_tree=g.in_tree, outputs=g.outputs, out_tree=g.out_tree)
    with pytest.raises(ValueError, match=re.escape("param_roles['w'].grad: graph has no tensor 'nope'")):
        Graph(g.ops(), **kw, param_roles={"w": ParamRole("w", "nope", (), None)})
    with pytest.raises(ValueError, match=re.escape("param_roles names ['x']")):
        Graph(g.ops(), **kw, param_roles={"x": ParamRole("x", None, (), None)})
    empty = Graph(g.ops(), **kw)
    assert empty.param_roles["w"] == ParamRole("w", None, (), None)


# --------------------------------------------------------------------------- optax all the way
WIDE = {"w1": S((16, 32), F32), "w2": S((32, 16), F32)}  # dims divide by the shard count
CHAINS = {
    "adamw": lambda: optax.adamw(1e-3, weight_decay=0.1),
    "clip_adamw": lambda: optax.chain(optax.clip_by_global_norm(CLIP), optax.adamw(1e-3)),
    "sgd_momentum": lambda: optax.sgd(0.1, momentum=0.9),
    "adafactor": lambda: optax.adafactor(1e-3, min_dim_size_to_factor=8),
}


def wide_graph(opt: str):
    tx = CHAINS[opt]()

    def step(params, opt_state, x):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"]) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    g = trace(step, WIDE, jax.eval_shape(tx.init, WIDE), S((16, 16), F32),
              dims=({"w1": "embed mlp", "w2": "mlp embed"}, None, "batch embed"),
              roles=("param", "opt_state", "input"))
    params = concrete(WIDE, 3, 0.25)
    return g, step, (params, tx.init(params), concrete(S((16, 16), F32), 4))


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("opt", list(CHAINS))
def test_optax_chains_store_sharded_and_gather_only_weights(opt, stage):
    """Storage sharding over ``data`` (the batch axis) for any optax chain: each parameter's
    optimizer state that mirrors it (not adafactor's factored rows/columns) is sharded, and the
    only all-gathers are of weights — the updated weights (stage 2) or each weight before its
    matmul (stage 3). Clip-by-global-norm's norm of the sharded gradient is a local sum of
    squares and a 4-byte all-reduce, not an all-gather; the compiled program agrees."""
    g, step, args = wide_graph(opt)
    if opt != "adafactor":
        assert all(len(r.opt_state) >= 1 for r in g.param_roles.values())
    layout = f"batch:data;mlp:model|*:data@{stage}"
    ex = execute(g, "data:2,model:4", layout, args=args, repeats=1, compiler_options=FAST)
    assert ex.collectives_match, ex.collective_diff()
    assert ex.max_rel_error < 1e-5
    if opt == "adafactor":
        return  # its factored second moments reduce the gradient over one dim: gathered first
    gathers = [c for c in ex.predicted.collectives if c.kind == "all-gather"]
    updates = {r.update for r in g.param_roles.values()}
    for c in gathers:
        op = g.op(c.op)
        assert (op.kind == "einsum" and len(op.inputs) == 2) if stage == 3 else c.op in updates, (c, c.op)
    sums = [c for c in ex.predicted.collectives if c.kind == "all-reduce" and c.bytes == 4
            and set(c.mesh_axes) == {"data", "model"}]
    if opt == "clip_adamw":  # each parameter's sum of squares: split over data (the shard) and model
        assert len(sums) == 2, ex.predicted.collectives
