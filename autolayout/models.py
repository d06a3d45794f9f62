"""Model zoo: plain JAX programs, traced into named-dimension graphs.

Every model is written as ordinary JAX and traced; nothing is hand-built.
Each function returns the traced :class:`~autolayout.graph.Graph` of one
training step (``train=False``: the forward pass only) and, via
:func:`example_args`, matching random arguments for execution and tests.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from autolayout.graph import Graph
from autolayout.trace import named, trace
from autolayout.train import init_opt_state, label_grads, train_step

__all__ = ["mlp", "transformer_lm", "moe", "example_args", "MODELS"]


def _sds(shape: tuple, dtype: Any) -> Any:
    import jax
    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), dtype)


# --------------------------------------------------------------------------- mlp
def mlp(batch: int = 1024, d_io: int = 512, d_hidden: int = 2048, train: bool = True, dtype: Any = "float32",
        learning_rate: float = 0.1) -> Graph:
    """The paper's §8 example ``y = relu(x·w + bias)·v`` (dims ``batch``, ``io``, ``hidden``).

    ``x`` comes from earlier layers, so the training step also returns its
    gradient; the loss is ``sum(y * dy)`` for a given cotangent ``dy[batch, io]``
    — the paper's accounting for Table 1. SGD updates ``w``, ``bias``, ``v``.
    The hidden activation is named ``h`` (``checkpoint_name``). The default sizes (every
    zoo model has them; ``autolayout search mlp --help`` shows them) are CPU-friendly —
    the step traces in about a second and runs on 8 virtual CPU devices in seconds — and
    divisible by meshes of up to 8 devices.

    Example::

        g = mlp(batch=64, d_io=32, d_hidden=128)
        g.dims  # {'batch': 64, 'io': 32, 'hidden': 128}
    """
    import jax
    from jax.ad_checkpoint import checkpoint_name

    def forward(params: dict, x: Any) -> Any:
        h = checkpoint_name(jax.nn.relu(x @ params["w"] + params["bias"]), "h")
        return h @ params["v"]

    params = {"w": _sds((d_io, d_hidden), dtype), "bias": _sds((d_hidden,), dtype),
              "v": _sds((d_hidden, d_io), dtype)}
    pdims = {"w": "io hidden", "bias": "hidden", "v": "hidden io"}
    if not train:
        args = (params, _sds((batch, d_io), dtype))
        dims, roles = (pdims, "batch io"), ("param", "input")
        return trace(forward, *args, dims=dims, roles=roles, name="mlp_forward")

    def step(params: dict, batch: dict) -> tuple:
        def loss_fn(p: dict, x: Any) -> Any:
            return (forward(p, x) * batch["dy"]).sum()

        loss, (gp, gx) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, batch["x"])
        gp = label_grads(gp)
        new = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, gp)
        return new, gx, loss

    args = (params, {"x": _sds((batch, d_io), dtype), "dy": _sds((batch, d_io), dtype)})
    dims, roles = (pdims, {"x": "batch io", "dy": "batch io"}), ("param", "input")
    return trace(step, *args, dims=dims, roles=roles, name="mlp", donate_argnums=(0,))


# --------------------------------------------------------------------------- transformer
def _layer_norm(x: Any, scale: Any, bias: Any) -> Any:
    import jax.numpy as jnp
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    # 1e-6: the epsilon of Mesh-TensorFlow's transformer layer_norm.
    return (x - mean) * jax_rsqrt(var + 1e-6) * scale + bias


def jax_rsqrt(x: Any) -> Any:
    import jax
    return jax.lax.rsqrt(x)


def transformer_lm(*, d_model: int = 64, d_ff: int = 256, heads: int = 4, d_kv: int = 16, n_layers: int = 2,
                   vocab: int = 256, batch: int = 16, length: int = 32, train: bool = True, dtype: Any = "float32",
                   optimizer: str = "adam", learning_rate: float = 1e-3, remat: bool = False) -> Graph:
    """The paper's §9 decoder-only language model, one training step with Adam.

    Untied input embedding and output softmax, learned positions, pre-norm layer
    norm, causal multi-head self-attention and a ReLU feed-forward layer, layers
    stacked and run with ``lax.scan`` (graph size independent of depth). Dims:
    ``batch``, ``length``, ``d_model``, ``heads``, ``d_kv``, ``d_ff``, ``vocab``,
    ``layers`` and the attention memory length ``length_1``. ``remat=True`` wraps each
    layer in ``jax.checkpoint`` (activation rematerialisation, as GPT-3-scale training
    does): the backward pass recomputes the layer, which the traced graph contains
    explicitly, so the cost model sees both the extra compute and the smaller memory.
    The default sizes are a small model this machine runs in seconds (``transformer_lm()``);
    the paper's §9 model is ``d_model=1024, d_ff=262144, heads=256, d_kv=256, n_layers=6``.

    Example::

        g = transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2,
                           vocab=128, batch=8, length=16)
    """
    import jax
    import jax.numpy as jnp

    def block(x: Any, p: dict) -> tuple:
        y = _layer_norm(x, p["ln1_scale"], p["ln1_bias"])
        q = jnp.einsum("bld,dhk->blhk", y, p["wq"])
        k = jnp.einsum("bld,dhk->blhk", y, p["wk"])
        v = jnp.einsum("bld,dhk->blhk", y, p["wv"])
        scores = jnp.einsum("blhk,bmhk->bhlm", q, k) / math.sqrt(d_kv)
        causal = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhlm,bmhk->blhk", probs, v)
        x = x + jnp.einsum("blhk,hkd->bld", o, p["wo"])
        y = _layer_norm(x, p["ln2_scale"], p["ln2_bias"])
        x = x + jnp.einsum("blf,fd->bld", jax.nn.relu(jnp.einsum("bld,df->blf", y, p["w1"])), p["w2"])
        return x, None

    def forward(params: dict, tokens: Any) -> Any:
        x = jnp.take(params["embed"], tokens, axis=0) + params["pos"]
        x, _ = jax.lax.scan(jax.checkpoint(block) if remat else block, x, params["layers"])
        x = _layer_norm(x, params["ln_f_scale"], params["ln_f_bias"])
        return jnp.einsum("bld,dv->blv", x, params["softmax"])

    def loss_fn(params: dict, batch_: dict) -> Any:
        logits = forward(params, batch_["tokens"])
        logp = jax.nn.log_softmax(logits, axis=-1)
        onehot = jax.nn.one_hot(batch_["targets"], vocab, dtype=logp.dtype)
        return -(logp * onehot).sum() / (batch * length)

    L = n_layers
    params = {
        "embed": _sds((vocab, d_model), dtype), "pos": _sds((length, d_model), dtype),
        "layers": {
            "ln1_scale": _sds((L, d_model), dtype), "ln1_bias": _sds((L, d_model), dtype),
            "wq": _sds((L, d_model, heads, d_kv), dtype), "wk": _sds((L, d_model, heads, d_kv), dtype),
            "wv": _sds((L, d_model, heads, d_kv), dtype), "wo": _sds((L, heads, d_kv, d_model), dtype),
            "ln2_scale": _sds((L, d_model), dtype), "ln2_bias": _sds((L, d_model), dtype),
            "w1": _sds((L, d_model, d_ff), dtype), "w2": _sds((L, d_ff, d_model), dtype)},
        "ln_f_scale": _sds((d_model,), dtype), "ln_f_bias": _sds((d_model,), dtype),
        "softmax": _sds((d_model, vocab), dtype)}
    pdims = {
        "embed": "vocab d_model", "pos": "length d_model",
        "layers": {"ln1_scale": "layers d_model", "ln1_bias": "layers d_model",
                   "wq": "layers d_model heads d_kv", "wk": "layers d_model heads d_kv",
                   "wv": "layers d_model heads d_kv", "wo": "layers heads d_kv d_model",
                   "ln2_scale": "layers d_model", "ln2_bias": "layers d_model",
                   "w1": "layers d_model d_ff", "w2": "layers d_ff d_model"},
        "ln_f_scale": "d_model", "ln_f_bias": "d_model", "softmax": "d_model vocab"}
    batch_spec = {"tokens": _sds((batch, length), "int32"), "targets": _sds((batch, length), "int32")}
    bdims = {"tokens": "batch length", "targets": "batch length"}
    if not train:
        args = (params, batch_spec["tokens"])
        dims, roles = (pdims, "batch length"), ("param", "input")
        return trace(forward, *args, dims=dims, roles=roles, name="transformer_lm_forward")
    step = train_step(loss_fn, optimizer, learning_rate)
    args = (params, init_opt_state(optimizer, params), batch_spec)
    dims, roles = (pdims, None, bdims), ("param", "opt_state", "input")
    return trace(step, *args, dims=dims, roles=roles, name="transformer_lm", donate_argnums=(0, 1))


# --------------------------------------------------------------------------- moe
def moe(*, d_model: int = 64, d_ff: int = 128, experts: int = 8, capacity: int = 8, batch: int = 8,
        length: int = 32,
        train: bool = True, dtype: Any = "float32", learning_rate: float = 0.1) -> Graph:
    """A sparsely-gated top-1 mixture-of-experts feed-forward layer (Shazeer et al. 2017,
    as Mesh-TensorFlow's ``moe`` layer writes it) with einsum dispatch and combine.

    Tokens are grouped per ``batch`` row; each group routes its ``length`` tokens
    to ``experts`` experts of ``capacity`` slots each (tokens past capacity are
    dropped). The position of a token in its expert's buffer is a cumulative
    sum written as an einsum with a causal (lower-triangular) matrix, so the
    whole layer is einsums and elementwise ops. Like :func:`mlp`, ``x`` comes
    from earlier layers and the loss is ``sum(y * dy)``; SGD updates the gate and
    expert weights. Dims: ``batch``, ``length``, ``d_model``, ``experts``,
    ``capacity``, ``d_ff`` (and ``length_1`` for the cumulative-sum matrix).
    """
    import jax
    import jax.numpy as jnp

    def forward(params: dict, x: Any) -> Any:
        gates = jax.nn.softmax(jnp.einsum("bld,de->ble", x, params["gate"]), axis=-1)
        expert = jnp.argmax(gates, axis=-1)
        mask = jax.nn.one_hot(expert, experts, dtype=x.dtype)  # [b, l, e]
        upto = (jnp.arange(length)[:, None] <= jnp.arange(length)[None, :]).astype(x.dtype)
        # inclusive cumsum over tokens; the matrix's second token axis becomes the renamed
        # dim `length_1` (cannot-link, DESIGN §3), so slot is renamed back where it meets mask
        position = jnp.einsum("ble,lm->bme", mask, upto) - 1.0
        slot = jax.nn.one_hot(position.astype(jnp.int32), capacity, dtype=x.dtype)
        slot = named(slot, "batch _ experts capacity")
        dispatch = mask[..., None] * slot
        combine = dispatch * gates[..., None]
        expert_in = jnp.einsum("blec,bld->becd", dispatch, x)
        h = jax.nn.relu(jnp.einsum("becd,edf->becf", expert_in, params["w1"]))
        expert_out = jnp.einsum("becf,efd->becd", h, params["w2"])
        return jnp.einsum("blec,becd->bld", combine, expert_out)

    params = {"gate": _sds((d_model, experts), dtype), "w1": _sds((experts, d_model, d_ff), dtype),
              "w2": _sds((experts, d_ff, d_model), dtype)}
    pdims = {"gate": "d_model experts", "w1": "experts d_model d_ff", "w2": "experts d_ff d_model"}
    if not train:
        args = (params, _sds((batch, length, d_model), dtype))
        dims, roles = (pdims, "batch length d_model"), ("param", "input")
        return trace(forward, *args, dims=dims, roles=roles, name="moe_forward")

    def step(params: dict, batch_: dict) -> tuple:
        def loss_fn(p: dict) -> Any:
            return (forward(p, batch_["x"]) * batch_["dy"]).sum()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        grads = label_grads(grads)
        new = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
        return new, loss

    x = _sds((batch, length, d_model), dtype)
    args = (params, {"x": x, "dy": x})
    dims = (pdims, {"x": "batch length d_model", "dy": "batch length d_model"})
    roles = ("param", "input")
    return trace(step, *args, dims=dims, roles=roles, name="moe", donate_argnums=(0,))


MODELS: dict[str, Callable[..., Graph]] = {"mlp": mlp, "transformer_lm": transformer_lm, "moe": moe}


def example_args(graph: Graph, seed: int = 0) -> tuple:
    """Random concrete arguments matching a zoo graph's traced signature.

    Floats are standard normal scaled by 1/sqrt(last axis) (keeps activations
    O(1)); integer inputs are token ids below the ``vocab`` dim size (or the
    axis size); Adam moments start at zero (``nu`` positive) and ``count`` at 0.
    """
    import jax
    import jax.numpy as jnp

    spec = getattr(graph, "example_spec", None)
    if spec is None:
        raise ValueError(f"graph {graph.name!r} was not built by autolayout.models; pass args explicitly")
    rng = np.random.default_rng(seed)
    vocab = graph.dims.get("vocab")
    leaves, tree = jax.tree_util.tree_flatten_with_path(spec)
    out = []
    for path, s in leaves:
        keys = [str(getattr(k, "key", getattr(k, "idx", ""))) for k in path]
        if np.issubdtype(np.dtype(s.dtype), np.integer):
            if keys and keys[-1] == "count":
                out.append(jnp.zeros(s.shape, s.dtype))
            else:
                out.append(jnp.asarray(rng.integers(0, vocab or 2, s.shape), s.dtype))
        elif "nu" in keys:
            out.append(jnp.asarray(rng.random(s.shape) * 1e-3 + 1e-4, s.dtype))
        elif "mu" in keys:
            out.append(jnp.asarray(rng.standard_normal(s.shape) * 1e-3, s.dtype))
        else:
            scale = 1.0 / math.sqrt(s.shape[-1]) if s.shape else 1.0
            out.append(jnp.asarray(rng.standard_normal(s.shape) * scale, s.dtype))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(spec), out)
