"""The model zoo (autolayout.models): dims, roles, parameter counts and the Adam step.

Expected dims and parameter counts are derived here from the sizes passed in;
the Adam step is recomputed with plain JAX from the forward pass alone.
"""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo_cases
from autolayout import init_opt_state, models, train_step, trace

# Kingma & Ba 2015, Algorithm 1 defaults.
B1, B2, EPS = 0.9, 0.999, 1e-8


def expected_dims(model: str) -> dict[str, int]:
    s = zoo_cases.SIZES[model]
    if model == "mlp":
        return {"batch": s["batch"], "io": s["d_io"], "hidden": s["d_hidden"]}
    if model == "transformer_lm":
        return {"batch": s["batch"], "length": s["length"], "length_1": s["length"],
                "d_model": s["d_model"], "heads": s["heads"], "d_kv": s["d_kv"], "d_ff": s["d_ff"],
                "vocab": s["vocab"], "layers": s["n_layers"]}
    assert model == "moe"
    return {"batch": s["batch"], "length": s["length"], "length_1": s["length"],
            "d_model": s["d_model"], "experts": s["experts"], "capacity": s["capacity"],
            "d_ff": s["d_ff"]}


@pytest.mark.parametrize(("model", "train"), zoo_cases.CASES, ids=zoo_cases.CASE_IDS)
def test_dims_and_sizes(model, train):
    assert zoo_cases.graph(model, train).dims == expected_dims(model)


def expected_roles(model: str, train: bool) -> list[str]:
    """Roles of the flattened arguments: params first; Adam state second in the
    transformer's training step; everything else is data."""
    g = zoo_cases.graph(model, train)
    kinds = ["param"] + (["opt_state"] if model == "transformer_lm" and train else [])
    roles = []
    for i, arg in enumerate(g.example_spec):
        roles += [kinds[i] if i < len(kinds) else "input"] * zoo_cases.count_leaves(arg)
    return roles


@pytest.mark.parametrize(("model", "train"), zoo_cases.CASES, ids=zoo_cases.CASE_IDS)
def test_roles(model, train):
    g = zoo_cases.graph(model, train)
    assert [g.tensor(n).role for n in g.input_names] == expected_roles(model, train)
    inputs = set(g.input_names)
    for t in g.tensors():
        if t.name not in inputs:
            assert t.role in ("activation", "output"), t
    outputs = {spec.tensor for spec in g.outputs if spec.tensor is not None} - inputs
    assert outputs and all(g.tensor(n).role == "output" for n in outputs)


@pytest.mark.parametrize("model", list(zoo_cases.SIZES))
def test_forward_graphs_have_no_optimizer_state(model):
    g = zoo_cases.graph(model, False)
    assert not [t for t in g.tensors() if t.role == "opt_state"]


def test_adam_moments_are_opt_state_shaped_like_params():
    g = zoo_cases.graph("transformer_lm", True)
    params = {n: g.tensor(n).shape for n in g.input_names if g.tensor(n).role == "param"}
    state = {n: g.tensor(n) for n in g.input_names if g.tensor(n).role == "opt_state"}
    assert set(state) == {f"{m}/{p}" for m in ("mu", "nu") for p in params} | {"count"}
    for m in ("mu", "nu"):
        for p, shape in params.items():
            assert state[f"{m}/{p}"].shape == shape and state[f"{m}/{p}"].dtype == "float32"


def transformer_params(s: dict[str, int]) -> int:
    d, f, h, k, L, v, n = (s[x] for x in ("d_model", "d_ff", "heads", "d_kv", "n_layers", "vocab", "length"))
    embed, pos, softmax, final_norm = v * d, n * d, d * v, 2 * d
    per_layer = 4 * d * h * k + 2 * d * f + 2 * 2 * d  # q, k, v, o; two ffn matrices; two norms
    return embed + pos + L * per_layer + final_norm + softmax


@pytest.mark.parametrize("train", [True, False], ids=["train", "forward"])
def test_transformer_num_params_is_analytic(train):
    assert zoo_cases.graph("transformer_lm", train).num_params() == transformer_params(
        zoo_cases.SIZES["transformer_lm"])


def test_transformer_num_params_gpt3_shape():
    sizes = dict(d_model=12288, d_ff=49152, heads=96, d_kv=128, n_layers=96, vocab=50304,
                 batch=1, length=2048)
    g = models.transformer_lm(**sizes, train=False)
    assert g.num_params() == transformer_params(sizes)
    assert 174e9 < g.num_params() < 176e9  # "GPT-3 175B"


@pytest.mark.parametrize("train", [True, False], ids=["train", "forward"])
def test_transformer_flops_are_analytic(train):
    """2 flops per matmul weight per token forward (not the embedding and position tables,
    a gather and an add, nor the layer norms, elementwise), plus attention's q·k and p·v at
    2·2·length·heads·d_kv per token per layer; the backward pass doubles all of it."""
    s = zoo_cases.SIZES["transformer_lm"]
    d, f, h, k, L, v, n = (s[x] for x in ("d_model", "d_ff", "heads", "d_kv", "n_layers", "vocab", "length"))
    tokens = s["batch"] * n
    matmul_weights = L * (4 * d * h * k + 2 * d * f) + d * v
    forward = 2 * matmul_weights * tokens + L * 4 * n * h * k * tokens
    assert zoo_cases.graph("transformer_lm", train).flops() == (3 * forward if train else forward)


# --------------------------------------------------------------------------- Adam
def hand_adam(params, opt_state, grads, lr):
    """Adam (Kingma & Ba 2015, Algorithm 1) with bias correction, written out directly."""
    t = opt_state["count"] + 1
    tree = jax.tree_util.tree_map
    mu = tree(lambda m, g: B1 * m + (1 - B1) * g, opt_state["mu"], grads)
    nu = tree(lambda v, g: B2 * v + (1 - B2) * g * g, opt_state["nu"], grads)
    mhat = tree(lambda m: m / (1 - B1 ** t.astype(jnp.float32)), mu)
    vhat = tree(lambda v: v / (1 - B2 ** t.astype(jnp.float32)), nu)
    new = tree(lambda p, m, v: p - lr * m / (jnp.sqrt(v) + EPS), params, mhat, vhat)
    return new, {"mu": mu, "nu": nu, "count": t}


def test_transformer_adam_step_equals_hand_written_step():
    g = zoo_cases.graph("transformer_lm", True)
    forward = zoo_cases.graph("transformer_lm", False).fn  # forward(params, tokens) -> logits
    lr = inspect.signature(models.transformer_lm).parameters["learning_rate"].default
    params, opt_state, batch = models.example_args(g, seed=1)
    opt_state = {**opt_state, "count": jnp.asarray(4, jnp.int32)}  # exercise bias correction

    def loss(p):
        logits = forward(p, batch["tokens"])
        logp = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
        picked = jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)
        return -picked.mean()

    ref_loss, grads = jax.jit(jax.value_and_grad(loss))(params)
    ref_params, ref_state = jax.jit(hand_adam)(params, opt_state, grads, lr)
    evaluate, _ = zoo_cases.jitted("transformer_lm", True)
    new_params, new_state, new_loss = evaluate(params, opt_state, batch)
    zoo_cases.assert_tree_close(new_loss, ref_loss)
    zoo_cases.assert_tree_close(new_state, ref_state)
    zoo_cases.assert_tree_close(new_params, ref_params)
    # the update itself (lr-sized, so invisible at rtol 1e-5 on the params) to 0.1 %
    delta = jax.tree_util.tree_map(lambda a, b: a - b, new_params, params)
    ref_delta = jax.tree_util.tree_map(lambda a, b: a - b, ref_params, params)
    zoo_cases.assert_tree_close(delta, ref_delta, rtol=1e-3)


def test_adam_train_step_of_a_hand_traced_model_runs_two_steps_like_by_hand():
    def loss_fn(p, batch):
        return jnp.mean((jnp.tanh(batch["x"] @ p["w"] + p["b"]) - batch["y"]) ** 2)

    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.standard_normal((5, 3)), jnp.float32),
              "b": jnp.asarray(rng.standard_normal(3), jnp.float32)}
    batch = {"x": jnp.asarray(rng.standard_normal((7, 5)), jnp.float32),
             "y": jnp.asarray(rng.standard_normal((7, 3)), jnp.float32)}
    lr = 0.05
    step = train_step(loss_fn, "adam", lr)
    state = init_opt_state("adam", params)
    g = trace(step, params, state, batch, dims=({"w": "io hidden", "b": "hidden"}, None,
                                                 {"x": "batch io", "y": "batch hidden"}),
              roles=("param", "opt_state", "input"))
    evaluate, grad, adam = jax.jit(g.evaluate), jax.jit(jax.value_and_grad(loss_fn)), jax.jit(hand_adam)
    p, s, p_ref, s_ref = params, state, params, state
    for _ in range(2):
        p, s, loss = evaluate(p, s, batch)
        ref_loss, grads = grad(p_ref, batch)
        p_ref, s_ref = adam(p_ref, s_ref, grads, lr)
        zoo_cases.assert_tree_close(loss, ref_loss)
        zoo_cases.assert_tree_close((p, s), (p_ref, s_ref))
    assert int(s["count"]) == 2


def test_unknown_optimizer_is_rejected():
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'; choose one of"):
        train_step(lambda p, b: 0.0, "lamb")
