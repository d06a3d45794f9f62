"""The model zoo (autolayout.models): dims, roles, parameter counts and the Adam step.

Expected dims and parameter counts are derived here from the sizes passed in;
the Adam step is recomputed with plain JAX from the forward pass alone.
"""
from __future__ import annotations

import inspect
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo_cases
from autolayout import init_opt_state, models, train_step, trace

# Kingma & Ba 2015, Algorithm 1 defaults.
B1, B2, EPS = 0.9, 0.999, 1e-8
LANGUAGE_MODELS = zoo_cases.ADAM_MODELS  # the Adam-trained zoo models


def expected_dims(model: str) -> dict[str, int]:
    s = zoo_cases.SIZES[model]
    if model == "mlp":
        return {"batch": s["batch"], "io": s["d_io"], "hidden": s["d_hidden"]}
    if model == "transformer_lm":
        return {"batch": s["batch"], "length": s["length"], "length_1": s["length"],
                "d_model": s["d_model"], "heads": s["heads"], "d_kv": s["d_kv"], "d_ff": s["d_ff"],
                "vocab": s["vocab"], "layers": s["n_layers"]}
    if model == "llama":
        return {"batch": s["batch"], "length": s["length"], "length_1": s["length"],
                "d_model": s["d_model"], "kv_heads": s["kv_heads"], "group": s["heads"] // s["kv_heads"],
                "d_kv": s["d_kv"], "rotary": s["d_kv"] // 2, "pair": 2, "pair_out": 2, "d_ff": s["d_ff"],
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
    language models' training steps; everything else is data."""
    g = zoo_cases.graph(model, train)
    kinds = ["param"] + (["opt_state"] if model in LANGUAGE_MODELS and train else [])
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


@pytest.mark.parametrize("model", LANGUAGE_MODELS)
def test_adam_moments_are_opt_state_shaped_like_params(model):
    g = zoo_cases.graph(model, True)
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


def assert_adam_step_equals_hand_written_step(model: str, forward, param_ulps: int = 0) -> None:
    """The zoo's training step of ``model`` equals Adam written out by hand on the
    gradient of the mean cross entropy of ``forward(params, tokens) -> logits``.

    ``param_ulps``: when ``forward`` is computed another way than the model (different
    rounding of the gradients), each updated parameter may round to a neighbouring float32
    of the reference's: the update is then checked to 0.1 % plus that many units in the
    last place of the parameter (``np.spacing``), the resolution of ``new - old``."""
    g = zoo_cases.graph(model, True)
    lr = inspect.signature(models.MODELS[model]).parameters["learning_rate"].default
    params, opt_state, batch = models.example_args(g, seed=1)
    opt_state = {**opt_state, "count": jnp.asarray(4, jnp.int32)}  # exercise bias correction

    def loss(p):
        logits = forward(p, batch["tokens"])
        logp = logits - jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
        picked = jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)
        return -picked.mean()

    ref_loss, grads = jax.jit(jax.value_and_grad(loss))(params)
    ref_params, ref_state = jax.jit(hand_adam)(params, opt_state, grads, lr)
    evaluate, _ = zoo_cases.jitted(model, True)
    new_params, new_state, new_loss = evaluate(params, opt_state, batch)
    zoo_cases.assert_tree_close(new_loss, ref_loss)
    zoo_cases.assert_tree_close(new_state, ref_state)
    zoo_cases.assert_tree_close(new_params, ref_params)
    # the update itself (lr-sized, so invisible at rtol 1e-5 on the params) to 0.1 %
    delta = jax.tree_util.tree_map(lambda a, b: a - b, new_params, params)
    ref_delta = jax.tree_util.tree_map(lambda a, b: a - b, ref_params, params)
    if not param_ulps:
        zoo_cases.assert_tree_close(delta, ref_delta, rtol=1e-3)
        return
    for d, r, p in zip(*(jax.tree_util.tree_leaves(t) for t in (delta, ref_delta, params))):
        d, r, p = np.asarray(d), np.asarray(r), np.asarray(p)
        assert np.all(np.abs(d - r) <= 1e-3 * np.abs(r) + param_ulps * np.abs(np.spacing(p)))
        assert np.abs(r).max() > 100 * np.abs(np.spacing(p)).max()  # the update is well resolved


def test_transformer_adam_step_equals_hand_written_step():
    forward = zoo_cases.graph("transformer_lm", False).fn  # forward(params, tokens) -> logits
    assert_adam_step_equals_hand_written_step("transformer_lm", forward)


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


@pytest.mark.parametrize("state, needle", [
    ((), r"opt_state is \(\) \(SGD's state\)"),
    ({"mu": {"w": 0.0}}, r"opt_state is a dict with keys \['mu'\]"),
    ({"mu": {"v": 0.0}, "nu": {"v": 0.0}, "count": 0}, r'opt_state\["mu"\] has structure'),
], ids=["sgd-state", "missing-keys", "other-params"])
def test_adam_step_with_a_state_not_made_by_init_opt_state(state, needle):
    params = {"w": jax.ShapeDtypeStruct((16, 64), jnp.float32)}
    batch = {"x": jax.ShapeDtypeStruct((32, 16), jnp.float32)}
    step = train_step(lambda p, b: jnp.mean(b["x"] @ p["w"]), "adam", 0.1)
    with pytest.raises(ValueError, match=needle + r'.*init_opt_state\("adam", params\)') as info:
        trace(step, params, state, batch, dims=({"w": "io hidden"}, None, {"x": "batch io"}),
              roles=("param", "opt_state", "input"))
    assert type(info.value).__name__ == "OptimizerStateError"
    # the state init_opt_state makes is accepted
    g = trace(step, params, init_opt_state("adam", params), batch, dims=({"w": "io hidden"}, None, {"x": "batch io"}),
              roles=("param", "opt_state", "input"))
    assert g.dims["hidden"] == 64


@pytest.mark.parametrize("model, size, value", [("mlp", "batch", -8), ("mlp", "batch", 0),
                                                ("transformer_lm", "n_layers", 0), ("moe", "experts", 2.5),
                                                ("llama", "heads", True)])
def test_zoo_sizes_must_be_positive_integers(model, size, value):
    with pytest.raises(ValueError, match=rf"{model}: {size}={value!r} is not a dimension size; give a positive "
                                         rf"integer, e.g. {size}=\d+"):
        models.MODELS[model](**{size: value})


# --------------------------------------------------------------------------- llama
def reference_llama(params, tokens, *, heads, kv_heads, d_kv, rope_theta=10000.0, norm_eps=1e-5, **_):
    """LLaMA's forward pass written out as Meta's reference ``llama/model.py`` does it —
    independently of the zoo: a Python loop over layers, RoPE by complex multiplication of
    interleaved pairs (``precompute_freqs_cis``/``apply_rotary_emb``), keys and values
    repeated ``heads // kv_heads`` times (``repeat_kv``), a boolean causal mask, SwiGLU.
    The zoo's weights are read with query head ``kv * group + g`` (Meta's head order)."""
    x = params["embed"][tokens]
    b, n, _ = x.shape
    group = heads // kv_heads
    freqs = 1.0 / rope_theta ** (np.arange(0, d_kv, 2) / d_kv)
    cis = np.exp(1j * np.outer(np.arange(n), freqs)).astype(np.complex64)  # [n, d_kv / 2]

    def rotate(t):  # t[b, n, h, d_kv]
        tc = t.reshape(*t.shape[:-1], -1, 2)
        out = (tc[..., 0] + 1j * tc[..., 1]) * cis[None, :, None, :]
        return jnp.stack([out.real, out.imag], -1).reshape(t.shape)

    def rms(t, w):
        return t * jax.lax.rsqrt(jnp.mean(t * t, -1, keepdims=True) + norm_eps) * w

    mask = np.tril(np.ones((n, n), bool))
    for i in range(params["layers"]["wq"].shape[0]):
        p = {k: v[i] for k, v in params["layers"].items()}
        h = rms(x, p["attn_norm"])
        q = rotate(jnp.einsum("bnd,dkgh->bnkgh", h, p["wq"]).reshape(b, n, heads, d_kv))
        k = jnp.repeat(rotate(jnp.einsum("bnd,dkh->bnkh", h, p["wk"])), group, axis=2)
        v = jnp.repeat(jnp.einsum("bnd,dkh->bnkh", h, p["wv"]), group, axis=2)
        s = jnp.where(mask, jnp.einsum("bnhe,bmhe->bhnm", q, k) / np.sqrt(d_kv), -jnp.inf)
        o = jnp.einsum("bhnm,bmhe->bnhe", jax.nn.softmax(s, axis=-1), v).reshape(b, n, kv_heads, group, d_kv)
        x = x + jnp.einsum("bnkge,kged->bnd", o, p["wo"])
        h = rms(x, p["ffn_norm"])
        x = x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
    return rms(x, params["final_norm"]) @ params["head"]


def test_llama_forward_equals_meta_style_reference():
    s = zoo_cases.SIZES["llama"]
    g = zoo_cases.graph("llama", False)
    params, tokens = models.example_args(g, seed=2)
    ref = jax.jit(lambda p, t: reference_llama(p, t, **s))(params, tokens)
    evaluate, _ = zoo_cases.jitted("llama", False)
    zoo_cases.assert_tree_close(evaluate(params, tokens), ref)


def test_llama_adam_step_equals_hand_written_step():
    s = zoo_cases.SIZES["llama"]
    assert_adam_step_equals_hand_written_step("llama", lambda p, t: reference_llama(p, t, **s), param_ulps=1)


def llama_params(s: dict) -> int:
    d, h, kv, k, f, L, v = (s[x] for x in ("d_model", "heads", "kv_heads", "d_kv", "d_ff", "n_layers", "vocab"))
    attention = d * h * k + 2 * d * kv * k + h * k * d  # q; k and v (kv_heads); o
    per_layer = attention + 3 * d * f + 2 * d  # gate, up, down; two RMSNorm scales
    return v * d + L * per_layer + d + d * v  # embedding, layers, final norm, untied head


@pytest.mark.parametrize("train", [True, False], ids=["train", "forward"])
def test_llama_num_params_is_analytic(train):
    assert zoo_cases.graph("llama", train).num_params() == llama_params(zoo_cases.SIZES["llama"])


# Published parameter counts: keras-hub llama_presets.py / llama3_presets.py ("params") for
# LLaMA-2-7B and LLaMA-3-8B; the Hugging Face safetensors metadata of meta-llama/Llama-2-70b-hf
# and Meta-Llama-3-70B (total parameters) for the 70B models.
PUBLISHED_PARAMS = {"llama2-7b": 6_738_415_616, "llama3-8b": 8_030_261_248,
                    "llama2-70b": 68_976_648_192, "llama3-70b": 70_553_706_496}


@pytest.mark.parametrize("preset", list(PUBLISHED_PARAMS))
def test_llama_presets_have_the_published_parameter_counts(preset):
    config = dict(models.LLAMA_PRESETS[preset])
    assert llama_params(config) == PUBLISHED_PARAMS[preset]  # the formula, from the config alone
    if preset.endswith("70b"):
        return  # the traced graph is checked at the 7B/8B shapes; 70B traces alike (and slower)
    g = models.llama(**config, batch=1, length=8, train=False)  # ShapeDtypeStructs: nothing allocated
    assert g.num_params() == PUBLISHED_PARAMS[preset]
    assert g.dims["layers"] == config["n_layers"] and g.dims["d_ff"] == config["d_ff"]


def test_llama_presets_are_read_only():
    with pytest.raises(TypeError):
        models.LLAMA_PRESETS["llama2-7b"]["d_model"] = 1  # type: ignore[index]


@pytest.mark.parametrize("train", [True, False], ids=["train", "forward"])
def test_llama_flops_are_analytic(train):
    """Per token per layer forward: 2 flops per matmul weight (q, k, v, o, gate, up, down),
    attention's q·k and p·v at 2·2·length·heads·d_kv, and RoPE's 2x2 rotation of every
    query and key pair (an einsum with a constant: 2·2·2 flops per pair); the output head
    2·d_model·vocab. The backward pass doubles every contraction of two activations or of
    an activation and a weight, but not RoPE's (the rotations are a constant: no gradient)."""
    s = zoo_cases.SIZES["llama"]
    d, h, kv, k, f, L, v, n = (s[x] for x in ("d_model", "heads", "kv_heads", "d_kv", "d_ff", "n_layers",
                                              "vocab", "length"))
    tokens = s["batch"] * n
    weights = L * (d * h * k + 2 * d * kv * k + h * k * d + 3 * d * f) + d * v
    matmuls = 2 * weights * tokens + L * 4 * n * h * k * tokens
    rope = L * 8 * (h + kv) * (k // 2) * tokens
    assert zoo_cases.graph("llama", train).flops() == (3 * matmuls + 2 * rope if train else matmuls + rope)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(heads=6, kv_heads=4), "heads=6 is not a multiple of kv_heads=4"),
    (dict(d_kv=5), "d_kv=5 is odd"),
], ids=["kv-heads", "odd-d-kv"])
def test_llama_rejects_bad_shapes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        models.llama(**kwargs)


@pytest.mark.parametrize(("kv_heads", "dims"), [(6, {"kv_heads": 6}), (1, {"group": 6})],
                         ids=["multi-head", "multi-query"])
def test_llama_size_one_head_axes_are_not_dims(kv_heads, dims):
    """Multi-head (group 1) and multi-query (one key/value head) attention: the size-1 axis
    disappears and the other one is the head axis; results still equal a reference."""
    s = dict(zoo_cases.SIZES["llama"], kv_heads=kv_heads)
    g = models.llama(**s, train=False)
    assert {n: g.dims.get(n) for n in ("kv_heads", "group")} == {**{"kv_heads": None, "group": None}, **dims}
    params, tokens = models.example_args(g, seed=3)
    zoo_cases.assert_tree_close(jax.jit(g.evaluate)(params, tokens),
                                jax.jit(lambda p, t: reference_llama(p, t, **s))(params, tokens))


# --------------------------------------------------------------------------- mixed precision
def jaxpr_eqns(jaxpr):
    """All equations of ``jaxpr`` and its sub-jaxprs (scan bodies, calls, remat)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from jaxpr_eqns(sub)


def bf16_graph(model: str, train: bool):
    return zoo_cases.graph(model, train, compute_dtype="bfloat16")


@pytest.mark.parametrize(("model", "train"), zoo_cases.CASES, ids=zoo_cases.CASE_IDS)
def test_mixed_precision_tensor_dtypes_match_the_jaxpr(model, train):
    """float32 master weights, bfloat16 compute: the graph's arguments, results and matmuls
    have the jaxpr's dtypes, which are the ones frameworks use."""
    g = bf16_graph(model, train)
    closed = jax.make_jaxpr(g.fn)(*g.example_spec)
    # arguments and results, in order, at the jaxpr's dtypes
    assert [g.tensor(n).dtype for n in g.input_names] == [str(v.aval.dtype) for v in closed.jaxpr.invars]
    assert [s.dtype for s in g.outputs] == [str(v.aval.dtype) for v in closed.jaxpr.outvars]
    # ... which are: parameters float32, Adam moments float32 (count int32), data in bf16
    expected = {"param": {"float32"}, "opt_state": {"float32", "int32"},
                "input": {"int32"} if model in LANGUAGE_MODELS else {"bfloat16"}}
    for n in g.input_names:
        assert g.tensor(n).dtype in expected[g.tensor(n).role], g.tensor(n)
    # every matmul: operand and result dtypes as in the jaxpr (bf16 operands; float32 where
    # the scores, logits or router logits are asked for in float32, and their cotangents)
    dots = [e for e in jaxpr_eqns(closed.jaxpr) if e.primitive.name == "dot_general"]
    want = Counter((tuple(str(v.aval.dtype) for v in e.invars), str(e.outvars[0].aval.dtype)) for e in dots)
    got = Counter((op.input_dtypes, op.output.dtype) for op in g.ops() if op.kind == "einsum" and op.fn == "dot")
    assert got == want
    assert want[(("bfloat16", "bfloat16"), "bfloat16")] >= len(dots) // 2
    # gradients come back at the parameters' dtype
    grads = [t for t in g.tensors() if t.name.startswith("grad/")]
    assert len(grads) == (len(g.params()) if train else 0)
    assert {t.dtype for t in grads} <= {"float32"}


@pytest.mark.parametrize("model", list(zoo_cases.SIZES))
def test_mixed_precision_casts_are_elementwise_ops(model):
    """Each float32 -> bfloat16 cast of a weight is an elementwise ``convert_element_type``
    op reading the float32 parameter (or its per-layer slice) and writing bf16."""
    g = bf16_graph(model, False)
    params = {t.name for t in g.params()}
    slices = {op.name: op.inputs[0] for op in g.ops() if op.kind == "reshape" and op.fn == "slice"}
    cast = {slices.get(op.inputs[0], op.inputs[0]) for op in g.ops()
            if op.kind == "elementwise" and op.fn == "convert_element_type"
            and op.input_dtypes == ("float32",) and op.output.dtype == "bfloat16"}
    assert params <= cast


def test_single_precision_graph_has_no_casts_of_floats():
    g = zoo_cases.graph("llama", True)
    floats = {"float32", "bfloat16"}
    assert not [op for op in g.ops() if op.fn == "convert_element_type"
                and set(op.input_dtypes) <= floats and op.output.dtype in floats]


# The language models' bf16 training steps take ~15 s each to compile for the CPU; their
# forward passes exercise the same casts, and the f32 replay and dtype tests above cover
# the backward passes.
BF16_RUNS = [("mlp", True), ("moe", True), ("transformer_lm", False), ("llama", False)]


@pytest.mark.parametrize(("model", "train"), BF16_RUNS, ids=[f"{m}-{'train' if t else 'forward'}"
                                                             for m, t in BF16_RUNS])
def test_mixed_precision_runs_like_the_traced_function(model, train):
    """bfloat16 compute: evaluate equals ``jax.jit(fn)`` to bfloat16 precision (XLA may fuse
    the two programs differently, so bf16 roundings can fall in different places)."""
    g = bf16_graph(model, train)
    args = models.example_args(g)
    out, ref = jax.jit(g.evaluate)(*args), jax.jit(g.fn)(*args)
    for a, e in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        assert a.dtype == e.dtype
        a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
        np.testing.assert_allclose(a, e, rtol=2e-2, atol=2e-2 * float(np.abs(e).max() or 1))


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(param_dtype="bf17"), r"param_dtype='bf17' is not a dtype"),
    (dict(compute_dtype="int8"), r"compute_dtype='int8' is not a floating-point dtype"),
], ids=["unknown", "integer"])
@pytest.mark.parametrize("model", list(zoo_cases.SIZES))
def test_bad_dtypes_are_rejected(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        models.MODELS[model](**zoo_cases.SIZES[model], **kwargs)


# --------------------------------------------------------------------------- defaults
def test_zoo_models_trace_with_their_default_sizes():
    assert models.mlp().dims == {"batch": 1024, "io": 512, "hidden": 2048}
    assert models.transformer_lm().dims["d_model"] == 64
    assert models.default_sizes("transformer_lm") == dict(
        d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2, vocab=256, batch=16, length=32)


def test_command_line_defaults_are_the_zoo_defaults():
    from autolayout.reporting.model_spec import ZOO_DEFAULTS
    for name, fn in models.MODELS.items():
        sig = inspect.signature(fn).parameters
        assert ZOO_DEFAULTS[name] == {k: p.default for k, p in sig.items() if type(p.default) is int}


def test_default_sizes_of_an_unknown_model():
    with pytest.raises(KeyError, match="unknown zoo model 'gpt5'"):
        models.default_sizes("gpt5")


# --------------------------------------------------------------------------- losses
@pytest.mark.parametrize("model", ["mlp", "moe"])
def test_regression_loss_is_half_the_squared_error_of_the_forward(model):
    """``loss="mse"``: the step's loss is ``sum((y - dy)**2) / 2`` of the forward graph's output
    ``y`` (the zoo's forward graph, evaluated on its own, and the error summed here in numpy), and
    SGD moves each parameter by ``-learning_rate`` times ``jax.grad`` of that loss written here."""
    sizes = zoo_cases.SIZES[model]
    step = models.MODELS[model](**sizes, loss="mse", learning_rate=0.5)
    params, batch = models.example_args(step)
    target = np.asarray(batch["dy"], np.float64)
    fwd = models.MODELS[model](**sizes, train=False)
    y = np.asarray(jax.jit(fwd.evaluate)(params, batch["x"]), np.float64)
    out = jax.jit(step.evaluate)(params, batch)
    np.testing.assert_allclose(float(out[-1]), ((y - target) ** 2).sum() / 2, rtol=1e-5)

    def loss(p):
        return jnp.sum((jax.jit(fwd.evaluate)(p, batch["x"]) - batch["dy"]) ** 2) / 2

    grads = jax.grad(loss)(params)
    for k in params:
        np.testing.assert_allclose(np.asarray(out[0][k]), np.asarray(params[k] - 0.5 * grads[k]), rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.parametrize("model", ["mlp", "moe"])
def test_unknown_loss_is_rejected(model):
    with pytest.raises(ValueError, match=rf"{model}: loss='huber' is not a known loss; give one of \('linear', 'mse'\)"):
        models.MODELS[model](**zoo_cases.SIZES[model], loss="huber")
