"""Models written the way Flax (linen, nnx), optax and equinox users write them — the
``examples/`` — traced without workarounds, executed under layouts, and held against
``jax.jit(step)`` (outputs) and the compiled HLO (collectives, via ``execute``).
"""
from __future__ import annotations

import importlib.util
import re
import sys
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from autolayout import execute, trace
from autolayout.export import partition_specs

FAST = {"xla_backend_optimization_level": 0}
MESH = "data:2,model:4"
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclass fields (a linen Module's) resolve their module
    spec.loader.exec_module(module)
    return module


def check(graph, step, args, layout):
    ex = execute(graph, MESH, layout, args=args, repeats=1, compiler_options=FAST)
    ref = jax.jit(step)(*args)
    got, want = jax.tree.leaves(ex.outputs), jax.tree.leaves(ref)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=2e-4, atol=2e-5)
    assert ex.collectives_match, ex.collective_diff()
    return ex


@pytest.fixture(scope="module")
def linen_gpt():
    m = example("linen_gpt")
    state = m.make_state(m.GPT())
    tokens, targets = m.batch()
    g = trace(m.train_step, state, tokens, targets, dims={"tokens": "batch length", "targets": "batch length"})
    return m, g, (state, tokens, targets)


def test_linen_gpt_reads_logical_names_and_train_state_roles(linen_gpt):
    m, g, (state, *_) = linen_gpt
    names = {"vocab", "embed", "heads", "kv", "mlp", "layers", "batch", "length"}
    assert names <= set(g.dims)
    assert g.dims["heads"] == m.HEADS and g.dims["layers"] == m.LAYERS
    roles = g.param_roles
    assert len(roles) == len(jax.tree.leaves(state.params))
    # adamw's mu and nu for every parameter; every gradient found (past clip-by-global-norm)
    assert all(len(r.opt_state) == 2 and r.grad and r.update for r in roles.values())


LINEN_LAYOUTS = {
    "data-parallel": "batch:data,model",
    "megatron+fsdp": "batch:data;heads:model;mlp:model|*:data@3",
    "vocab+zero2": "batch:data;heads:model;mlp:model;vocab:model|*:data@2",
}


@pytest.mark.parametrize("layout", list(LINEN_LAYOUTS.values()), ids=list(LINEN_LAYOUTS))
def test_linen_gpt_executes_like_jax_jit(linen_gpt, layout):
    m, g, args = linen_gpt
    check(g, m.train_step, args, layout)


def test_linen_gpt_exports_specs_for_its_train_state(linen_gpt):
    m, g, (state, *_) = linen_gpt
    specs = partition_specs(g, MESH, "batch:data;heads:model;mlp:model|*:data@3")
    qkv = specs[0].params["ScanCheckpointBlock_0"]["MultiHeadDotProductAttention_0"]["query"]["kernel"]
    # [layers, embed, heads, kv]: layers never split, heads over model, FSDP over data on embed
    assert qkv.value == P(None, "data", "model", None)


@pytest.fixture(scope="module")
def nnx_llama():
    m = example("nnx_llama")
    step, args = m.setup()
    return m, step, m.trace_block(step, args), args


def test_nnx_llama_names_come_from_its_metadata(nnx_llama):
    _, _, g, _ = nnx_llama
    assert {"embed", "heads", "kv_heads", "head_dim", "mlp", "kv_length"} <= set(g.dims)
    assert all(len(r.opt_state) == 2 and r.grad and r.update for r in g.param_roles.values())


@pytest.mark.parametrize("layout", ["batch:data;heads:model;mlp:model", "batch:model;kv_heads:data|*:model@2"])
def test_nnx_llama_executes_like_jax_jit(nnx_llama, layout):
    _, step, g, args = nnx_llama
    check(g, step, args, layout)


@pytest.fixture(scope="module")
def equinox_block():
    m = example("equinox_block")
    args = m.setup()
    g = trace(m.train_step, *args, dims=(m.param_dims(args[0]), None, "batch length embed", "batch length embed"),
              roles=("param", "opt_state", "input", "input"), names={"d4": "heads"})
    return m, g, args


def test_equinox_block_executes_like_jax_jit(equinox_block):
    m, g, args = equinox_block
    assert g.dims["heads"] == m.HEADS
    check(g, m.train_step, args, "batch:data;heads:model;mlp:model|*:data@3")


# --------------------------------------------------------------------------- architectures
def test_linen_bf16_mixed_precision_executes_like_jax_jit():
    """``nn.Dense(dtype=bfloat16, param_dtype=float32)``: float32 master weights, bf16
    compute. Compared with jax.jit at bf16's resolution (8-bit mantissa: 2^-8 relative)."""
    m = example("linen_bf16_mlp")
    step, (state, x, y) = m.setup(embed=32, mlp=64, batch=16)
    g = m.trace_mlp(step, (state, x, y))
    assert {t.dtype for t in g.params()} == {"float32"}
    assert any(t.dtype == "bfloat16" for t in g.tensors())
    ex = execute(g, MESH, "batch:data;mlp:model|*:data@3", args=(state, x, y), repeats=1, compiler_options=FAST)
    assert ex.collectives_match, ex.collective_diff()
    for a, b in zip(jax.tree.leaves(ex.outputs), jax.tree.leaves(jax.jit(step)(state, x, y))):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2, atol=1e-3)


def test_top2_moe_executes_like_jax_jit():
    """A top-2 mixture of experts (``lax.top_k`` routing, dense combine), optax adamw."""
    m = example("top2_moe")
    step, args = m.setup(experts=4, embed=16, mlp=32, batch=16)
    g = m.trace_moe(step, args)
    assert g.dims["top"] == 2
    for layout in ("batch:data;experts:model", "batch:data;mlp:model|*:data@3"):
        check(g, step, args, layout)


# --------------------------------------------------------------------------- T5, ViT (searched)
def searched(graph):
    """The layout the search finds with half the memory replicating everything takes (at
    these toy sizes replicating is fastest, so the limit makes it split the model)."""
    from autolayout import predict, search

    whole = predict(graph, MESH, "", hardware="tpu-v4").memory_bytes
    best = search(graph, MESH, hardware="tpu-v4", memory_limit=whole / 2, time_limit_s=30)
    assert best.cost.memory_bytes <= whole / 2
    return best.layout


@pytest.fixture(scope="module")
def linen_t5():
    m = example("linen_t5")
    state = m.make_state(m.T5(layers=1))  # one layer per stack: compiles in half the time
    args = (state, *m.batch())
    return m, m.trace_step(*args), args


def test_linen_t5_names_both_lengths_of_cross_attention(linen_t5):
    m, g, (state, *_) = linen_t5
    assert {"enc_length", "dec_length", "enc_keys", "dec_keys", "heads", "kv", "buckets", "vocab"} <= set(g.dims)
    assert (g.dims["enc_length"], g.dims["dec_length"]) == (m.ENC_LEN, m.DEC_LEN)
    assert not [d for d in g.dims if re.fullmatch(r"d\d+(_\d+)?", d)]  # no automatic names left
    scores = {frozenset(op.output.dim_names) for op in g.ops() if op.kind == "einsum" and op.fn == "dot"
              and "heads" in op.output.dim_names and "kv" not in op.output.dim_names}
    # encoder self-, decoder self- and cross-attention scores, each with its two lengths
    assert scores == {frozenset({"batch", "heads", q, k}) for q, k in (
        ("enc_length", "enc_keys"), ("dec_length", "dec_keys"), ("dec_length", "enc_length"))}
    # the relative-position tables are [buckets, heads]; the tied embedding is [vocab, embed]
    assert g.tensor("params/enc_bias/rel_embedding").dim_names == ("buckets", "heads")
    roles = g.param_roles
    assert len(roles) == len(jax.tree.leaves(state.params))
    assert all(len(r.opt_state) == 2 and r.grad and r.update for r in roles.values())


def test_linen_t5_searched_layout_executes_like_jax_jit(linen_t5):
    m, g, args = linen_t5
    check(g, m.train_step, args, searched(g))


def test_linen_t5_megatron_zero_executes_like_jax_jit(linen_t5):
    m, g, args = linen_t5
    check(g, m.train_step, args, "batch:data;heads:model;mlp:model|*:data@2")


@pytest.fixture(scope="module")
def linen_vit():
    m = example("linen_vit")
    state = m.make_state(m.ViT())
    args = (state, *m.batch())
    return m, m.trace_step(*args), args


def test_linen_vit_names_patches_tokens_and_keys(linen_vit):
    m, g, (state, *_) = linen_vit
    assert {"grid_h", "grid_w", "patches", "tokens", "keys", "height", "width", "channels"} <= set(g.dims)
    assert (g.dims["patches"], g.dims["tokens"]) == (m.GRID ** 2, m.GRID ** 2 + 1)
    assert not [d for d in g.dims if re.fullmatch(r"d\d+(_\d+)?", d)]
    conv = [op for op in g.ops() if op.fn == "conv"]
    # the patch embedding and, in the backward pass, its kernel gradient (images need none)
    assert len(conv) == 2
    assert conv[0].output.dim_names == ("batch", "grid_h", "grid_w", "embed")
    assert all(len(r.opt_state) == 2 and r.grad and r.update for r in g.param_roles.values())
    assert len(g.param_roles) == len(jax.tree.leaves(state.params))


def test_linen_vit_searched_layout_executes_like_jax_jit(linen_vit):
    m, g, args = linen_vit
    check(g, m.train_step, args, searched(g))


def test_linen_vit_splits_patches_and_heads_like_jax_jit(linen_vit):
    m, g, args = linen_vit
    check(g, m.train_step, args, "batch:data;heads:model;patches:model")


# --------------------------------------------------------------------------- optax.adafactor
def test_adafactor_factored_moments_pair_with_their_parameter_and_shard():
    """``optax.adafactor`` keeps, for a matrix, a row and a column second moment (``v_row``
    of the parameter's shape without its larger axis, ``v_col`` without the other) and a
    one-element placeholder ``v``; for a vector the full ``v`` and placeholders. The
    factored moments are the matrix's state; placeholders are no parameter's."""
    import optax

    D, F, B = 16, 32, 16
    tx = optax.adafactor(1e-2, min_dim_size_to_factor=8)  # factor these small matrices

    def step(params, opt_state, x, t):
        def loss(p):
            return jnp.mean((jnp.tanh(x @ p["w_in"] + p["b"]) @ p["w_out"] - t) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    keys = jax.random.split(jax.random.key(0), 4)
    params = {"w_in": jax.random.normal(keys[0], (D, F)) * 0.2, "b": jnp.zeros((F,)),
              "w_out": jax.random.normal(keys[1], (F, D)) * 0.2}
    args = (params, tx.init(params), jax.random.normal(keys[2], (B, D)), jax.random.normal(keys[3], (B, D)))
    g = trace(step, *args, dims=({"w_in": "embed mlp", "b": "mlp", "w_out": "mlp embed"}, None,
                                 "batch embed", "batch embed"), roles=("param", "opt_state", "input", "input"))
    roles = g.param_roles
    assert roles["w_in"].opt_state == ("0/v_row/w_in", "0/v_col/w_in")
    assert roles["w_out"].opt_state == ("0/v_row/w_out", "0/v_col/w_out")
    assert roles["b"].opt_state == ("0/v/b",)
    assert all(r.grad and r.update for r in roles.values())
    # the moments' dims: v_row of w_in [embed, mlp] averages over mlp (its larger axis)
    assert g.tensor("0/v_row/w_in").dim_names == ("embed",) and g.tensor("0/v_col/w_in").dim_names == ("mlp",)
    layout = "batch:data;mlp:model|*:data@2"
    # ZeRO-2 over data shards each matrix's state along its first dim that divides: w_in's
    # embed (v_row), w_out's mlp (v_col, already over model); the other moment stays whole
    v_row, v_col = partition_specs(g, MESH, layout)[1][0][1:3]
    assert (v_row["w_in"], v_col["w_in"]) == (P("data"), P("model"))
    assert (v_row["w_out"], v_col["w_out"]) == (P(None), P(("model", "data")))
    for lay in ("batch:data;mlp:model", layout, "batch:data,model|*:data,model@3"):
        check(g, step, args, lay)
