"""Dim names of arguments the way JAX and Flax users already write them (:mod:`autolayout._dims`):
``dims``/``roles`` as any pytree prefix, Flax logical-axis metadata, and renaming dims after
tracing (:meth:`Graph.rename`, ``trace(..., names=...)``).

References: the names each test writes by hand, the argument shapes, ``jax.jit(fn)`` outputs,
and for pairing, the pytree paths where optax puts each parameter's state.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state
from jax.sharding import PartitionSpec as P

from autolayout import execute, search, trace
from autolayout.trace import DimsError

S = jax.ShapeDtypeStruct
F32 = jnp.float32
FAST = {"xla_backend_optimization_level": 0}
LP = nn.with_logical_partitioning
INIT = nn.initializers.lecun_normal()

PARAMS = {"w1": S((6, 10), F32), "w2": S((10, 6), F32)}
X = S((8, 6), F32)


def mlp_loss(p, x):
    return jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"]) ** 2)


def grad_step(p, x):
    return jax.grad(mlp_loss)(p, x)


def arg_dims(g, i=None):
    """Argument tensor -> its dim names (the traced graph's)."""
    return {n: g.tensor(n).dim_names for n in g.input_names}


WANT = {"w1": ("io", "hidden"), "w2": ("hidden", "io"), "x": ("batch", "io")}


# --------------------------------------------------------------------------- pytree prefixes
PREFIXES = {
    "strings": ({"w1": "io hidden", "w2": "hidden io"}, "batch io"),
    "tuples": ({"w1": ("io", "hidden"), "w2": ("hidden", "io")}, ("batch", "io")),
    "partition-specs": ({"w1": P("io", "hidden"), "w2": P("hidden", "io")}, P("batch", "io")),
    "list-at-top": [{"w1": "io hidden", "w2": "hidden io"}, "batch io"],
    "by-parameter-name": {"p": {"w1": "io hidden", "w2": "hidden io"}, "x": "batch io"},
}


@pytest.mark.parametrize("dims", list(PREFIXES.values()), ids=list(PREFIXES))
def test_dims_as_any_pytree_prefix(dims):
    g = trace(grad_step, PARAMS, X, dims=dims)
    assert arg_dims(g) == WANT


def test_a_dict_may_leave_entries_out():
    g = trace(grad_step, PARAMS, X, dims=({"w1": "io hidden"}, "batch io"))
    assert arg_dims(g)["w1"] == WANT["w1"] and arg_dims(g)["w2"][0] == "hidden"


class Boxed(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(10, use_bias=False, kernel_init=LP(INIT, ("io", "hidden")))(x)
        return nn.Dense(6, use_bias=False, kernel_init=LP(INIT, ("hidden", "io")))(jax.nn.relu(h))


def _state():
    model = Boxed()
    variables = jax.eval_shape(model.init, jax.random.key(0), X)
    return model, variables, jax.eval_shape(lambda v: train_state.TrainState.create(
        apply_fn=model.apply, params=v["params"], tx=optax.adamw(1e-3)), variables)


def _ts_step(state, x):
    grads = jax.grad(lambda p: jnp.mean(state.apply_fn({"params": p}, x) ** 2))(state.params)
    return state.apply_gradients(grads=grads)


def test_flax_logical_metadata_needs_no_dims_and_train_state_needs_no_roles():
    _, _, state = _state()
    g = trace(_ts_step, state, X, dims=(None, "batch io"))
    assert arg_dims(g)["params/Dense_0/kernel"] == ("io", "hidden")
    assert arg_dims(g)["params/Dense_1/kernel"] == ("hidden", "io")
    # Adam's state carries the same boxes: it is named too, and pairs with its parameter
    assert arg_dims(g)["opt_state/0/mu/Dense_0/kernel"] == ("io", "hidden")
    role = g.param_roles["params/Dense_0/kernel"]
    assert role.opt_state == ("opt_state/0/mu/Dense_0/kernel", "opt_state/0/nu/Dense_0/kernel")
    assert role.update == "out/params/Dense_0/kernel" and role.grad is not None


def test_dims_reach_boxed_params_by_attribute_path_and_override_metadata():
    _, _, state = _state()
    dims = ({"params": {"Dense_0": {"kernel": ("io", "wide")}, "Dense_1": {"kernel": "wide io"}}}, "batch io")
    g = trace(_ts_step, state, X, dims=dims)
    assert arg_dims(g)["params/Dense_0/kernel"] == ("io", "wide")
    assert arg_dims(g)["params/Dense_1/kernel"] == ("wide", "io")
    # overriding one box only: its neighbour's metadata still names the same axis 'hidden'
    with pytest.raises(ValueError, match="axis you named 'wide' to the axis you named 'hidden'"):
        trace(_ts_step, state, X, dims=({"params": {"Dense_0": {"kernel": ("io", "wide")}}}, "batch io"))


def test_get_partition_spec_of_logical_params_as_dims():
    model, variables, _ = _state()
    params = nn.unbox(variables["params"])

    def step(p, x):
        return jax.grad(lambda q: jnp.mean(model.apply({"params": q}, x) ** 2))(p)

    g = trace(step, params, X, dims=(nn.get_partition_spec(variables["params"]), "batch io"))
    assert arg_dims(g)["Dense_0/kernel"] == ("io", "hidden")


def test_nnx_sharding_metadata_names_dims_and_pairs_optimizer_state():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(6, 10, use_bias=False, rngs=rngs,
                                 kernel_init=nnx.with_partitioning(INIT, ("io", "hidden")))
            self.down = nnx.Linear(10, 6, use_bias=False, rngs=rngs,
                                   kernel_init=nnx.with_partitioning(INIT, ("hidden", "io")))

        def __call__(self, x):
            return self.down(jax.nn.relu(self.up(x)))

    with nnx.use_eager_sharding(False):
        model = Net(nnx.Rngs(0))
        opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, params = nnx.split(model)
    opt_def, opt_state = nnx.split(opt)

    def step(params, opt_state, x):
        m, o = nnx.merge(graphdef, params), nnx.merge(opt_def, opt_state)
        grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(m)
        o.update(m, grads)
        return nnx.state(m), nnx.state(o)

    g = trace(step, params, opt_state, X, dims=(None, None, "batch io"))
    assert arg_dims(g)["up/kernel"] == ("io", "hidden")
    role = g.param_roles["up/kernel"]
    assert [g.tensor(s).dim_names for s in role.opt_state] == [("io", "hidden")] * 2
    assert role.update is not None and role.grad is not None
    args = (params, opt_state, jnp.ones((8, 6), F32))
    ref = jax.jit(step)(*args)
    for a, b in zip(jax.tree_util.tree_leaves(g.evaluate(*args)), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- mismatches
MISMATCHES = {
    "unknown-key": (({"w1": "io hidden", "w11": "a b"}, None), r"names 'w11' at \[0\].*Did you mean 'w1'"),
    "too-few-names": (({"w1": "io"}, None), r"argument 'w1'.*shape \(6, 10\).*1 names"),
    "not-a-name": (({"w1": 3}, None), r"argument 'w1'.*gives 3 \(int\)"),
    "tuple-too-short": ((None,), r"argument 'x'.*no entry for \[1\]"),
    "bad-role": ("roles", r"role 'weights' is not one of"),
}


@pytest.mark.parametrize(("dims", "pattern"), list(MISMATCHES.values()), ids=list(MISMATCHES))
def test_mismatched_dims_name_the_path_and_the_fix(dims, pattern):
    if dims == "roles":
        with pytest.raises(ValueError, match=pattern):
            trace(grad_step, PARAMS, X, roles=("weights", "input"))
        return
    with pytest.raises(DimsError, match=pattern):
        trace(grad_step, PARAMS, X, dims=dims)
    assert issubclass(DimsError, ValueError)


def test_box_metadata_with_mesh_axis_tuples_is_refused_with_a_fix():
    from flax import nnx

    with nnx.use_eager_sharding(False):
        lin = nnx.Linear(6, 10, use_bias=False, rngs=nnx.Rngs(0),
                         kernel_init=nnx.with_partitioning(INIT, (("x", "y"), None)))
    _, params = nnx.split(lin)
    with pytest.raises(DimsError, match=r"mesh-axis tuples.*axis_metadata=False"):
        trace(lambda p, x: x @ p["kernel"][...], params, X)
    g = trace(lambda p, x: x @ p["kernel"][...], params, X, axis_metadata=False)
    assert len(g.dims) == 3


# --------------------------------------------------------------------------- rename
def _heads_step(x, w):
    def loss(w):
        q = (x @ w).reshape(8, 16, 4, 8)
        return jnp.sum(jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, q)) ** 2)
    return jax.grad(loss)(w)


HEADS_ARGS = (S((8, 16, 32), F32), S((32, 32), F32))
HEADS_DIMS = ("batch length embed", "embed hk")


def test_rename_gives_automatic_dims_real_names_everywhere():
    g = trace(_heads_step, *HEADS_ARGS, dims=HEADS_DIMS)
    assert {"d4", "d8"} <= set(g.dims)  # heads and d_kv come from a reshape: nothing names them
    r = g.rename({"d4": "heads", "d8": "d_kv"})
    assert r is not g and {"heads", "d_kv"} <= set(r.dims) and not {"d4", "d8"} & set(r.dims)
    assert all("d4" not in str(op.attrs) for op in r.ops())
    assert trace(_heads_step, *HEADS_ARGS, dims=HEADS_DIMS, names={"d4": "heads", "d8": "d_kv"}).dims == r.dims
    x = jax.random.normal(jax.random.key(0), (8, 16, 32))
    w = jax.random.normal(jax.random.key(1), (32, 32))
    np.testing.assert_allclose(r.evaluate(x, w), jax.jit(_heads_step)(x, w), rtol=1e-5, atol=1e-5)


def test_a_renamed_graph_searches_and_executes_with_its_names():
    g = trace(_heads_step, *HEADS_ARGS, dims=HEADS_DIMS, names={"d4": "heads"})
    best = search(g, "x:2,y:4", hardware="tpu-v4")
    assert "d4" not in str(best.layout)
    x = jax.random.normal(jax.random.key(0), (8, 16, 32))
    w = jax.random.normal(jax.random.key(1), (32, 32))
    ex = execute(g, "x:2,y:4", "batch:x;heads:y", args=(x, w), repeats=1, compiler_options=FAST)
    np.testing.assert_allclose(ex.outputs, jax.jit(_heads_step)(x, w), rtol=1e-4, atol=1e-4)
    assert ex.collectives_match, ex.collective_diff()


RENAME_ERRORS = {
    "unknown": ({"d_4": "heads"}, r"no dim 'd_4'.*Did you mean 'd4'"),
    "taken": ({"d4": "batch"}, r"'batch' is taken \(dim 'batch' keeps that name\)"),
    "merge": ({"d4": "h", "d8": "h"}, r"'h' is taken \(dims 'd4' and 'd8' would both get it\)"),
    "bad-name": ({"d4": "two words"}, r"new name of dim 'd4'"),
}


@pytest.mark.parametrize(("names", "pattern"), list(RENAME_ERRORS.values()), ids=list(RENAME_ERRORS))
def test_rename_errors_name_the_dims(names, pattern):
    g = trace(_heads_step, *HEADS_ARGS, dims=HEADS_DIMS)
    with pytest.raises(ValueError, match=pattern):
        g.rename(names)
