"""Model zoo: plain JAX programs, traced into named-dimension graphs.

Every model is written as ordinary JAX and traced; nothing is hand-built.
Each function returns the traced :class:`~autolayout.graph.Graph` of one
training step (``train=False``: the forward pass only) and, via
:func:`example_args`, matching random arguments for execution and tests.

Sizes default to small, CPU-friendly values (:func:`default_sizes`; the command
line uses the same ones), so ``models.transformer_lm()`` traces as it is.

**Mixed precision**, as flax and MaxText write it (MaxText's ``weight_dtype`` and
``dtype``; flax's ``param_dtype`` and ``dtype``): parameters are stored in
``param_dtype`` (the master weights, default float32) and cast to ``compute_dtype``
(default: ``param_dtype``) where a layer uses them; activations, matmuls and the
residual stream run in ``compute_dtype``. Normalisation statistics, attention
softmax and the loss are computed in float32 (MaxText's RMSNorm and
``cast_logits_to_fp32``, flax's LayerNorm ``_compute_stats``; flash attention keeps
its softmax statistics in float32), gradients come back in ``param_dtype`` (the
transpose of the cast) and Adam's moments are float32 (:func:`~autolayout.train.init_opt_state`).
The casts are ``convert_element_type`` equations, which the tracer records as
elementwise ops, so each tensor of the graph carries its own dtype. With
``compute_dtype == param_dtype`` no cast is emitted and the graph is the single-precision one.
"""
from __future__ import annotations

import inspect
import math
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from autolayout.graph import Graph
from autolayout.trace import named, trace
from autolayout.train import init_opt_state, label_grads, train_step

__all__ = ["mlp", "transformer_lm", "moe", "llama", "LLAMA_PRESETS", "default_sizes",
           "example_args", "invalid_sizes", "MODELS"]


def _sds(shape: tuple, dtype: Any) -> Any:
    import jax
    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), dtype)


def _is_size(value: Any) -> bool:
    """A dimension size: a positive integer (bools are not sizes)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value > 0


def _check_sizes(model: str, given: Mapping[str, Any]) -> None:
    """Raise ValueError naming ``model``'s first size parameter in ``given`` that is not a positive integer."""
    for name, value in invalid_sizes(model, given):
        raise ValueError(f"{model}: {name}={value!r} is not a dimension size; give a positive integer, "
                         f"e.g. {name}={default_sizes(model)[name]}")


LOSSES = ("linear", "mse")


def _check_loss(model: str, loss: str) -> None:
    """Raise ValueError naming ``model``'s ``loss`` option where it is not one of :data:`LOSSES`."""
    if loss not in LOSSES:
        raise ValueError(f"{model}: loss={loss!r} is not a known loss; give one of {LOSSES}")


def _loss(loss: str, y: Any, dy: Any) -> Any:
    """The loss of :func:`mlp` and :func:`moe` for output ``y``, in float32: ``"linear"``,
    ``sum(y * dy)`` for a given cotangent ``dy`` (the paper's Table 1 accounting: the gradient
    flowing into the layer is the input ``dy``, known before the forward runs, so a compiler may
    start the backward's input-gradient matmuls first), or ``"mse"``, ``sum((y - dy)**2) / 2``
    for a target ``dy`` (a regression loss: the gradient ``y - dy`` needs the forward, as in a
    real training step). ``loss`` is one of :data:`LOSSES`: the model checked it
    (:func:`_check_loss`) before tracing.
    """
    import jax.numpy as jnp

    if loss == "linear":
        return jnp.sum(y * dy, dtype=jnp.float32)
    diff = y.astype(jnp.float32) - dy.astype(jnp.float32)
    return jnp.sum(diff * diff) / 2


def _dtypes(param_dtype: Any, compute_dtype: Any) -> tuple[Any, Any]:
    """``(param_dtype, compute_dtype)`` as numpy dtypes; ``compute_dtype=None`` means the same."""
    import jax.numpy as jnp

    out = []
    for option, value in (("param_dtype", param_dtype), ("compute_dtype", compute_dtype)):
        value = param_dtype if value is None else value
        try:
            dt = jnp.dtype(value)
        except TypeError as exc:
            raise ValueError(f"{option}={value!r} is not a dtype; use e.g. 'float32' or 'bfloat16'") from exc
        if not jnp.issubdtype(dt, jnp.floating):
            raise ValueError(f"{option}={value!r} is not a floating-point dtype; use e.g. 'float32' or "
                             "'bfloat16'")
        out.append(dt)
    return out[0], out[1]


def _cast(tree: Any, dtype: Any) -> Any:
    """Every leaf of ``tree`` as ``dtype`` (no equation where it already is)."""
    import jax
    return jax.tree_util.tree_map(lambda x: x.astype(dtype), tree)


# --------------------------------------------------------------------------- mlp
def mlp(batch: int = 1024, d_io: int = 512, d_hidden: int = 2048, train: bool = True,
        param_dtype: str = "float32", compute_dtype: str | None = None,
        learning_rate: float = 0.1, loss: str = "linear") -> Graph:
    """The paper's §8 example ``y = relu(x·w + bias)·v`` (dims ``batch``, ``io``, ``hidden``).

    ``x`` comes from earlier layers, so the training step also returns its
    gradient; the loss is ``sum(y * dy)`` (summed in float32) for a given cotangent
    ``dy[batch, io]`` — the paper's accounting for Table 1 — or with ``loss="mse"``
    ``sum((y - dy)**2) / 2`` for a target ``dy`` (:func:`_loss`). SGD updates ``w``,
    ``bias``, ``v``. The hidden activation is named ``h`` (``checkpoint_name``).
    ``x`` and ``dy`` are activations, in ``compute_dtype``.

    Example::

        g = mlp(batch=64, d_io=32, d_hidden=128)
        g.dims  # {'batch': 64, 'io': 32, 'hidden': 128}
    """
    _check_sizes("mlp", locals())
    _check_loss("mlp", loss)
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    pd, cd = _dtypes(param_dtype, compute_dtype)

    def forward(params: dict, x: Any) -> Any:
        p = _cast(params, cd)
        h = checkpoint_name(jax.nn.relu(x @ p["w"] + p["bias"]), "h")
        return h @ p["v"]

    params = {"w": _sds((d_io, d_hidden), pd), "bias": _sds((d_hidden,), pd),
              "v": _sds((d_hidden, d_io), pd)}
    pdims = {"w": "io hidden", "bias": "hidden", "v": "hidden io"}
    if not train:
        args = (params, _sds((batch, d_io), cd))
        dims, roles = (pdims, "batch io"), ("param", "input")
        return trace(forward, *args, dims=dims, roles=roles, name="mlp_forward")

    def step(params: dict, batch: dict) -> tuple:
        def loss_fn(p: dict, x: Any) -> Any:
            return _loss(loss, forward(p, x), batch["dy"])

        value, (gp, gx) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, batch["x"])
        gp = label_grads(gp)
        new = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, gp)
        return new, gx, value

    args = (params, {"x": _sds((batch, d_io), cd), "dy": _sds((batch, d_io), cd)})
    dims, roles = (pdims, {"x": "batch io", "dy": "batch io"}), ("param", "input")
    return trace(step, *args, dims=dims, roles=roles, name="mlp", donate_argnums=(0,))


# --------------------------------------------------------------------------- language models
def _layer_norm(x: Any, scale: Any, bias: Any, dtype: Any) -> Any:
    """Layer norm with float32 statistics (flax ``LayerNorm``), returned in ``dtype``."""
    import jax
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    # 1e-6: the epsilon of Mesh-TensorFlow's transformer layer_norm.
    return ((x - mean) * jax.lax.rsqrt(var + 1e-6)).astype(dtype) * scale + bias


def _rms_norm(x: Any, scale: Any, eps: float, dtype: Any) -> Any:
    """RMSNorm (Zhang & Sennrich 2019) with float32 statistics, as MaxText's ``RMSNorm``."""
    import jax
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    return (x * jax.lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + eps)).astype(dtype) * scale


def _lm_loss(logits: Any, targets: Any, vocab: int) -> Any:
    """Mean next-token cross entropy of float32 ``logits[batch, length, vocab]``."""
    import jax

    logp = jax.nn.log_softmax(logits, axis=-1)
    onehot = jax.nn.one_hot(targets, vocab, dtype=logp.dtype)
    return -(logp * onehot).sum() / (targets.shape[0] * targets.shape[1])


def _causal_softmax(scores: Any, length: int, dtype: Any) -> Any:
    """Causal softmax over the last axis (memory positions) of float32 ``scores``, in ``dtype``."""
    import jax
    import jax.numpy as jnp

    causal = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1).astype(dtype)


def _lm_graph(name: str, forward: Callable, params: dict, pdims: dict, *, vocab: int, batch: int,
              length: int, train: bool, optimizer: str, learning_rate: float) -> Graph:
    """Trace a language model's forward pass, or one training step of it with the zoo's
    ``train_step`` (loss: :func:`_lm_loss`)."""
    batch_spec = {"tokens": _sds((batch, length), "int32"), "targets": _sds((batch, length), "int32")}
    bdims = {"tokens": "batch length", "targets": "batch length"}
    if not train:
        args = (params, batch_spec["tokens"])
        dims, roles = (pdims, "batch length"), ("param", "input")
        return trace(forward, *args, dims=dims, roles=roles, name=f"{name}_forward")

    def loss_fn(params: dict, batch_: dict) -> Any:
        return _lm_loss(forward(params, batch_["tokens"]), batch_["targets"], vocab)

    step = train_step(loss_fn, optimizer, learning_rate)
    args = (params, init_opt_state(optimizer, params), batch_spec)
    dims, roles = (pdims, None, bdims), ("param", "opt_state", "input")
    return trace(step, *args, dims=dims, roles=roles, name=name, donate_argnums=(0, 1))


def transformer_lm(*, d_model: int = 64, d_ff: int = 256, heads: int = 4, d_kv: int = 16,
                   n_layers: int = 2, vocab: int = 256, batch: int = 16, length: int = 32,
                   train: bool = True, param_dtype: str = "float32", compute_dtype: str | None = None,
                   optimizer: str = "adam", learning_rate: float = 1e-3, remat: bool = False,
                   parallel_layers: bool = False) -> Graph:
    """The paper's §9 decoder-only language model, one training step with Adam.

    Untied input embedding and output softmax, learned positions, pre-norm layer
    norm, causal multi-head self-attention and a ReLU feed-forward layer, layers
    stacked and run with ``lax.scan`` (graph size independent of depth). Dims:
    ``batch``, ``length``, ``d_model``, ``heads``, ``d_kv``, ``d_ff``, ``vocab``,
    ``layers`` and the attention memory length ``length_1``. ``remat=True`` wraps each
    layer in ``jax.checkpoint`` (activation rematerialisation, as GPT-3-scale training
    does): the backward pass recomputes the layer, which the traced graph contains
    explicitly, so the cost model sees both the extra compute and the smaller memory.
    Mixed precision (``param_dtype``/``compute_dtype``) as in the module docstring:
    the embedding table is cast before the lookup (flax ``Embed``), each layer casts
    its weights, attention scores and logits come out of their matmuls in float32.

    ``parallel_layers=True``: PaLM's "parallel" formulation (Chowdhery et al. 2022, §2,
    "Parallel Layers"; GPT-J's): ``y = x + MLP(LayerNorm(x)) + Attention(LayerNorm(x))``
    with one layer norm per layer (parameters ``ln1_*``; no ``ln2_*``), written
    ``x + (attention + mlp)`` so that the two branches' outputs are summed before the
    residual add.

    Example::

        g = transformer_lm(d_model=64, d_ff=256, heads=4, d_kv=16, n_layers=2,
                           vocab=128, batch=8, length=16, compute_dtype="bfloat16")
    """
    _check_sizes("transformer_lm", locals())
    import jax
    import jax.numpy as jnp

    pd, cd = _dtypes(param_dtype, compute_dtype)
    f32 = jnp.float32

    def block(x: Any, p: dict) -> tuple:
        p = _cast(p, cd)
        y = _layer_norm(x, p["ln1_scale"], p["ln1_bias"], cd)
        q = jnp.einsum("bld,dhk->blhk", y, p["wq"])
        k = jnp.einsum("bld,dhk->blhk", y, p["wk"])
        v = jnp.einsum("bld,dhk->blhk", y, p["wv"])
        scores = jnp.einsum("blhk,bmhk->bhlm", q, k, preferred_element_type=f32) / math.sqrt(d_kv)
        o = jnp.einsum("bhlm,bmhk->blhk", _causal_softmax(scores, length, cd), v)
        attention = jnp.einsum("blhk,hkd->bld", o, p["wo"])
        if parallel_layers:  # PaLM §2: both branches read the same normalised input
            mlp = jnp.einsum("blf,fd->bld", jax.nn.relu(jnp.einsum("bld,df->blf", y, p["w1"])), p["w2"])
            return x + (attention + mlp), None
        x = x + attention
        y = _layer_norm(x, p["ln2_scale"], p["ln2_bias"], cd)
        x = x + jnp.einsum("blf,fd->bld", jax.nn.relu(jnp.einsum("bld,df->blf", y, p["w1"])), p["w2"])
        return x, None

    def forward(params: dict, tokens: Any) -> Any:
        x = jnp.take(params["embed"].astype(cd), tokens, axis=0) + params["pos"].astype(cd)
        x, _ = jax.lax.scan(jax.checkpoint(block) if remat else block, x, params["layers"])
        x = _layer_norm(x, params["ln_f_scale"].astype(cd), params["ln_f_bias"].astype(cd), cd)
        return jnp.einsum("bld,dv->blv", x, params["softmax"].astype(cd), preferred_element_type=f32)

    L = n_layers
    params = {
        "embed": _sds((vocab, d_model), pd), "pos": _sds((length, d_model), pd),
        "layers": {
            "ln1_scale": _sds((L, d_model), pd), "ln1_bias": _sds((L, d_model), pd),
            "wq": _sds((L, d_model, heads, d_kv), pd), "wk": _sds((L, d_model, heads, d_kv), pd),
            "wv": _sds((L, d_model, heads, d_kv), pd), "wo": _sds((L, heads, d_kv, d_model), pd),
            "ln2_scale": _sds((L, d_model), pd), "ln2_bias": _sds((L, d_model), pd),
            "w1": _sds((L, d_model, d_ff), pd), "w2": _sds((L, d_ff, d_model), pd)},
        "ln_f_scale": _sds((d_model,), pd), "ln_f_bias": _sds((d_model,), pd),
        "softmax": _sds((d_model, vocab), pd)}
    pdims = {
        "embed": "vocab d_model", "pos": "length d_model",
        "layers": {"ln1_scale": "layers d_model", "ln1_bias": "layers d_model",
                   "wq": "layers d_model heads d_kv", "wk": "layers d_model heads d_kv",
                   "wv": "layers d_model heads d_kv", "wo": "layers heads d_kv d_model",
                   "ln2_scale": "layers d_model", "ln2_bias": "layers d_model",
                   "w1": "layers d_model d_ff", "w2": "layers d_ff d_model"},
        "ln_f_scale": "d_model", "ln_f_bias": "d_model", "softmax": "d_model vocab"}
    if parallel_layers:  # one layer norm per layer
        for tree in (params["layers"], pdims["layers"]):
            del tree["ln2_scale"], tree["ln2_bias"]
    return _lm_graph("transformer_lm", forward, params, pdims, vocab=vocab, batch=batch, length=length,
                     train=train, optimizer=optimizer, learning_rate=learning_rate)


# --------------------------------------------------------------------------- llama
# LLaMA shapes as published. LLaMA-2: Touvron et al. 2023, "Llama 2: Open Foundation and
# Fine-Tuned Chat Models", Table 1 (GQA for 34B/70B, 4k context) and §2.2; sizes as in
# Meta's released params.json / the Hugging Face configs (meta-llama/Llama-2-7b-hf,
# meta-llama/Llama-2-70b-hf: hidden_size, intermediate_size, num_attention_heads,
# num_key_value_heads, num_hidden_layers, vocab_size 32000, rms_norm_eps 1e-5,
# rope_theta 10000), mirrored in MaxText/configs/models/llama2-7b.yml and llama2-70b.yml.
# LLaMA-3: Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (8B: 32 layers, model
# dimension 4096, FFN 14336, 32 heads, 8 KV heads; 70B: 80 layers, 8192, 28672, 64 heads,
# 8 KV heads; vocabulary 128000 (128256 with special tokens in the released configs);
# RoPE base 500000), mirrored in MaxText/configs/models/llama3-8b.yml and llama3-70b.yml.
# Published parameter counts (tests/test_models.py checks the traced graphs against them):
# LLaMA-2-7B 6,738,415,616 and LLaMA-3-8B 8,030,261,248 (keras-hub llama_presets.py and
# llama3_presets.py "params"; the Hugging Face safetensors index of Meta-Llama-3-8B,
# total_size 16060522496 bytes of bfloat16); LLaMA-2-70B 68,976,648,192 and LLaMA-3-70B
# 70,553,706,496 (Hugging Face safetensors metadata, total parameters).
LLAMA_PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "llama2-7b": MappingProxyType(dict(d_model=4096, heads=32, kv_heads=32, d_kv=128, d_ff=11008,
                                       n_layers=32, vocab=32000, rope_theta=10000.0, norm_eps=1e-5)),
    "llama2-70b": MappingProxyType(dict(d_model=8192, heads=64, kv_heads=8, d_kv=128, d_ff=28672,
                                        n_layers=80, vocab=32000, rope_theta=10000.0, norm_eps=1e-5)),
    "llama3-8b": MappingProxyType(dict(d_model=4096, heads=32, kv_heads=8, d_kv=128, d_ff=14336,
                                       n_layers=32, vocab=128256, rope_theta=500000.0, norm_eps=1e-5)),
    "llama3-70b": MappingProxyType(dict(d_model=8192, heads=64, kv_heads=8, d_kv=128, d_ff=28672,
                                        n_layers=80, vocab=128256, rope_theta=500000.0, norm_eps=1e-5)),
})


def rope_rotations(length: int, d_kv: int, theta: float) -> np.ndarray:
    """Rotary-embedding rotations (Su et al. 2021, "RoFormer", eq. 34) as a constant
    ``[length, d_kv // 2, 2, 2]`` float32 array: position ``t`` rotates the pair
    ``(x[2i], x[2i+1])`` by ``t · theta^(-2i/d_kv)``; ``out[p] = sum_q R[t, i, p, q] x[q]``.
    Interleaved pairs, as Meta's reference ``apply_rotary_emb`` (``view_as_complex`` of
    ``x.reshape(..., -1, 2)``)."""
    inv_freq = theta ** (-np.arange(0, d_kv, 2, dtype=np.float64) / d_kv)
    angle = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    return np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2).astype(np.float32)


def llama(*, d_model: int = 64, heads: int = 8, kv_heads: int = 4, d_kv: int = 16, d_ff: int = 192,
          n_layers: int = 2, vocab: int = 256, batch: int = 16, length: int = 32,
          rope_theta: float = 10000.0, norm_eps: float = 1e-5, train: bool = True,
          param_dtype: str = "float32", compute_dtype: str | None = None, optimizer: str = "adam",
          learning_rate: float = 1e-3, remat: bool = False) -> Graph:
    """A LLaMA-style decoder (Touvron et al. 2023), one training step with Adam.

    RMSNorm before attention and feed-forward, rotary position embeddings on queries
    and keys, causal grouped-query attention (``kv_heads`` key/value heads, each shared
    by ``heads // kv_heads`` query heads), a SwiGLU feed-forward layer
    ``w_down(silu(x·w_gate) * x·w_up)`` (Shazeer 2020), a final RMSNorm and an untied
    output ``head``; no biases; layers stacked and run with ``lax.scan``; ``remat``
    as in :func:`transformer_lm`. The same ``train_step`` (Adam) and loss as
    :func:`transformer_lm`; mixed precision as in the module docstring.

    Written with primitives the tracer handles (einsum, elementwise, reshape,
    reductions, gather, scan): grouped-query attention keeps the query heads as
    ``[batch, length, kv_heads, group, d_kv]`` against keys ``[batch, length, kv_heads,
    d_kv]`` — no ``jnp.repeat`` of keys and values; RoPE splits ``d_kv``
    into ``rotary`` (``d_kv / 2``) pairs of a 2-element ``pair`` axis (a reshape) and
    applies a constant 2x2 rotation per position and pair with one einsum
    (:func:`rope_rotations`; the rotated pair axis is ``pair_out``) — no slicing or
    concatenation. Dims: ``batch``, ``length`` and ``length_1`` (the scores' two position
    axes: the tracer renames the queries' side, the larger operand under GQA),
    ``d_model``, ``kv_heads``, ``group``, ``d_kv``, ``rotary``, ``pair``, ``pair_out``,
    ``d_ff``, ``vocab``, ``layers``.
    With ``kv_heads == heads`` (multi-head attention, LLaMA-2-7B) the group axis has
    size 1 and is not a dim: ``kv_heads`` is then the head axis; with ``kv_heads=1``
    (multi-query attention, PaLM) ``group`` is.

    Presets: :data:`LLAMA_PRESETS` (LLaMA-2-7B/70B, LLaMA-3-8B/70B, sources there).

    Example::

        g = llama(**LLAMA_PRESETS["llama3-8b"], batch=1, length=8192, train=False)
        g.num_params()  # 8030261248

    Raises:
        ValueError: ``heads`` is not a multiple of ``kv_heads``, or ``d_kv`` is odd.
    """
    _check_sizes("llama", locals())
    import jax
    import jax.numpy as jnp

    if heads % kv_heads:
        raise ValueError(f"llama: heads={heads} is not a multiple of kv_heads={kv_heads}; each key/value "
                         "head serves heads // kv_heads query heads")
    if d_kv % 2:
        raise ValueError(f"llama: d_kv={d_kv} is odd; rotary embeddings rotate pairs of the head dim")
    pd, cd = _dtypes(param_dtype, compute_dtype)
    f32, group = jnp.float32, heads // kv_heads
    rotations = rope_rotations(length, d_kv, rope_theta)

    def block(x: Any, p: dict) -> tuple:
        p = _cast(p, cd)
        y = _rms_norm(x, p["attn_norm"], norm_eps, cd)
        rot = jnp.asarray(rotations, cd)  # [length, rotary, pair_out, pair]
        q = jnp.einsum("bld,dkgh->blkgh", y, p["wq"]).reshape(batch, length, kv_heads, group, -1, 2)
        q = jnp.einsum("blkgrq,lrpq->blkgrp", named(q, "batch length kv_heads group rotary pair"), rot)
        q = named(q, "batch length kv_heads group rotary pair_out")
        k = jnp.einsum("bld,dkh->blkh", y, p["wk"]).reshape(batch, length, kv_heads, -1, 2)
        k = jnp.einsum("blkrq,lrpq->blkrp", named(k, "batch length kv_heads rotary pair"), rot)
        k = named(k, "batch length kv_heads rotary pair_out")
        v = jnp.einsum("bld,dkh->blkh", y, p["wv"])
        scores = jnp.einsum("blkgrp,bmkrp->bkglm", q, k, preferred_element_type=f32) / math.sqrt(d_kv)
        o = jnp.einsum("bkglm,bmkh->blkgh", _causal_softmax(scores, length, cd), v)
        x = x + jnp.einsum("blkgh,kghd->bld", o, p["wo"])
        y = _rms_norm(x, p["ffn_norm"], norm_eps, cd)
        h = jax.nn.silu(jnp.einsum("bld,df->blf", y, p["w_gate"])) * jnp.einsum("bld,df->blf", y, p["w_up"])
        return x + jnp.einsum("blf,fd->bld", h, p["w_down"]), None

    def forward(params: dict, tokens: Any) -> Any:
        x = jnp.take(params["embed"].astype(cd), tokens, axis=0)
        x, _ = jax.lax.scan(jax.checkpoint(block) if remat else block, x, params["layers"])
        x = _rms_norm(x, params["final_norm"].astype(cd), norm_eps, cd)
        return jnp.einsum("bld,dv->blv", x, params["head"].astype(cd), preferred_element_type=f32)

    L = n_layers
    params = {
        "embed": _sds((vocab, d_model), pd),
        "layers": {
            "attn_norm": _sds((L, d_model), pd),
            "wq": _sds((L, d_model, kv_heads, group, d_kv), pd),
            "wk": _sds((L, d_model, kv_heads, d_kv), pd), "wv": _sds((L, d_model, kv_heads, d_kv), pd),
            "wo": _sds((L, kv_heads, group, d_kv, d_model), pd),
            "ffn_norm": _sds((L, d_model), pd),
            "w_gate": _sds((L, d_model, d_ff), pd), "w_up": _sds((L, d_model, d_ff), pd),
            "w_down": _sds((L, d_ff, d_model), pd)},
        "final_norm": _sds((d_model,), pd), "head": _sds((d_model, vocab), pd)}
    pdims = {
        "embed": "vocab d_model",
        "layers": {"attn_norm": "layers d_model", "wq": "layers d_model kv_heads group d_kv",
                   "wk": "layers d_model kv_heads d_kv", "wv": "layers d_model kv_heads d_kv",
                   "wo": "layers kv_heads group d_kv d_model", "ffn_norm": "layers d_model",
                   "w_gate": "layers d_model d_ff", "w_up": "layers d_model d_ff",
                   "w_down": "layers d_ff d_model"},
        "final_norm": "d_model", "head": "d_model vocab"}
    return _lm_graph("llama", forward, params, pdims, vocab=vocab, batch=batch, length=length,
                     train=train, optimizer=optimizer, learning_rate=learning_rate)


# --------------------------------------------------------------------------- moe
def moe(*, d_model: int = 64, d_ff: int = 128, experts: int = 8, capacity: int = 8, batch: int = 8,
        length: int = 32, train: bool = True, param_dtype: str = "float32",
        compute_dtype: str | None = None, learning_rate: float = 0.1, loss: str = "linear") -> Graph:
    """A sparsely-gated top-1 mixture-of-experts feed-forward layer (Shazeer et al. 2017,
    as Mesh-TensorFlow's ``moe`` layer writes it) with einsum dispatch and combine.

    Tokens are grouped per ``batch`` row; each group routes its ``length`` tokens
    to ``experts`` experts of ``capacity`` slots each (tokens past capacity are
    dropped). The position of a token in its expert's buffer is a cumulative
    sum written as an einsum with a causal (lower-triangular) matrix, so the
    whole layer is einsums and elementwise ops. Like :func:`mlp`, ``x`` comes
    from earlier layers and the loss is ``sum(y * dy)`` (or with ``loss="mse"`` a regression
    loss on the target ``dy``, :func:`_loss`); SGD updates the gate and
    expert weights. Dims: ``batch``, ``length``, ``d_model``, ``experts``,
    ``capacity``, ``d_ff`` (and ``length_1`` for the cumulative-sum matrix). In mixed
    precision the router's softmax and the token counts run in float32 (MaxText's
    ``MoeBlock`` computes its gate softmax in float32; a bfloat16 count is exact only
    up to 256 tokens); dispatch, experts and combine run in ``compute_dtype``.
    """
    _check_sizes("moe", locals())
    _check_loss("moe", loss)
    import jax
    import jax.numpy as jnp

    pd, cd = _dtypes(param_dtype, compute_dtype)
    f32 = jnp.float32

    def forward(params: dict, x: Any) -> Any:
        p = _cast(params, cd)
        logits = jnp.einsum("bld,de->ble", x, p["gate"], preferred_element_type=f32)
        gates = jax.nn.softmax(logits, axis=-1)
        expert = jnp.argmax(gates, axis=-1)
        mask = jax.nn.one_hot(expert, experts, dtype=f32)  # [b, l, e]
        upto = (jnp.arange(length)[:, None] <= jnp.arange(length)[None, :]).astype(f32)
        # inclusive cumsum over tokens; the matrix's second token axis becomes the renamed
        # dim `length_1` (cannot-link, DESIGN §3), so slot is renamed back where it meets mask
        position = jnp.einsum("ble,lm->bme", mask, upto) - 1.0
        slot = jax.nn.one_hot(position.astype(jnp.int32), capacity, dtype=cd)
        slot = named(slot, "batch _ experts capacity")
        dispatch = mask.astype(cd)[..., None] * slot
        combine = dispatch * gates.astype(cd)[..., None]
        expert_in = jnp.einsum("blec,bld->becd", dispatch, x)
        h = jax.nn.relu(jnp.einsum("becd,edf->becf", expert_in, p["w1"]))
        expert_out = jnp.einsum("becf,efd->becd", h, p["w2"])
        return jnp.einsum("blec,becd->bld", combine, expert_out)

    params = {"gate": _sds((d_model, experts), pd), "w1": _sds((experts, d_model, d_ff), pd),
              "w2": _sds((experts, d_ff, d_model), pd)}
    pdims = {"gate": "d_model experts", "w1": "experts d_model d_ff", "w2": "experts d_ff d_model"}
    if not train:
        args = (params, _sds((batch, length, d_model), cd))
        dims, roles = (pdims, "batch length d_model"), ("param", "input")
        return trace(forward, *args, dims=dims, roles=roles, name="moe_forward")

    def step(params: dict, batch_: dict) -> tuple:
        def loss_fn(p: dict) -> Any:
            return _loss(loss, forward(p, batch_["x"]), batch_["dy"])

        value, grads = jax.value_and_grad(loss_fn)(params)
        grads = label_grads(grads)
        new = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
        return new, value

    x = _sds((batch, length, d_model), cd)
    args = (params, {"x": x, "dy": x})
    dims = (pdims, {"x": "batch length d_model", "dy": "batch length d_model"})
    roles = ("param", "input")
    return trace(step, *args, dims=dims, roles=roles, name="moe", donate_argnums=(0,))


MODELS: dict[str, Callable[..., Graph]] = {"mlp": mlp, "transformer_lm": transformer_lm, "moe": moe,
                                           "llama": llama}


def default_sizes(model: str) -> dict[str, int]:
    """The default sizes (integer keyword arguments) of zoo model ``model``, read from its
    signature — the one place they are defined (the command line shows and uses them).

    Example::

        default_sizes("mlp")  # {'batch': 1024, 'd_io': 512, 'd_hidden': 2048}

    Raises:
        KeyError: ``model`` is not a zoo model.
    """
    if model not in MODELS:
        raise KeyError(f"unknown zoo model {model!r}; choose one of {sorted(MODELS)}")
    params = inspect.signature(MODELS[model]).parameters.values()
    return {p.name: p.default for p in params if type(p.default) is int}


def invalid_sizes(model: str, values: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(name, value)`` of each size parameter of zoo model ``model`` (an integer keyword of
    :func:`default_sizes`) in ``values`` that is not a positive integer — the one rule the zoo
    functions and the command line's ``--batch``/config checks share.

    Example::

        invalid_sizes("mlp", {"batch": -8, "d_io": 32})  # [('batch', -8)]
    """
    sizes = default_sizes(model)
    return [(k, v) for k, v in values.items() if k in sizes and not _is_size(v)]


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
