"""Models written the way Flax (linen, nnx), optax and equinox users write them — the
``examples/`` — traced without workarounds, executed under layouts, and held against
``jax.jit(step)`` (outputs) and the compiled HLO (collectives, via ``execute``).
"""
from __future__ import annotations

import importlib.util
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
    import flax.linen as nn
    import optax
    from flax.training import train_state

    LP = nn.with_logical_partitioning

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = lambda n, names: nn.Dense(  # noqa: E731
                n, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                kernel_init=LP(nn.initializers.lecun_normal(), names), bias_init=LP(nn.initializers.zeros, names[1:]))
            return dense(32, ("mlp", "embed"))(nn.relu(dense(64, ("embed", "mlp"))(x)))

    model = MLP()
    x, y = jax.random.normal(jax.random.key(3), (16, 32)), jax.random.normal(jax.random.key(4), (16, 32))
    state = train_state.TrainState.create(apply_fn=model.apply, params=model.init(jax.random.key(0), x)["params"],
                                          tx=optax.adamw(1e-3))

    def step(state, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((state.apply_fn({"params": p}, x).astype(jnp.float32) - y) ** 2))(state.params)
        return state.apply_gradients(grads=grads), loss

    g = trace(step, state, x, y, dims={"x": "batch embed", "y": "batch embed"})
    assert {t.dtype for t in g.params()} == {"float32"}
    assert any(t.dtype == "bfloat16" for t in g.tensors())
    ex = execute(g, MESH, "batch:data;mlp:model|*:data@3", args=(state, x, y), repeats=1, compiler_options=FAST)
    assert ex.collectives_match, ex.collective_diff()
    for a, b in zip(jax.tree.leaves(ex.outputs), jax.tree.leaves(jax.jit(step)(state, x, y))):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2, atol=1e-3)


def test_top2_moe_executes_like_jax_jit():
    """A top-2 mixture of experts (``lax.top_k`` routing, dense combine), optax adamw."""
    import optax

    E, D, F, B = 4, 16, 32, 16

    def moe(p, x):
        w, idx = jax.lax.top_k(x @ p["router"], 2)
        combine = jnp.einsum("bk,bke->be", jax.nn.softmax(w, axis=-1), jax.nn.one_hot(idx, E))
        h = jax.nn.gelu(jnp.einsum("bd,edf->bef", x, p["w_in"]))
        return jnp.einsum("be,bed->bd", combine, jnp.einsum("bef,efd->bed", h, p["w_out"]))

    tx = optax.adamw(1e-3)

    def step(params, opt_state, x, t):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((moe(p, x) - t) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    shapes = {"router": (D, E), "w_in": (E, D, F), "w_out": (E, F, D)}
    params = {k: jax.random.normal(jax.random.key(i), s) * 0.2 for i, (k, s) in enumerate(shapes.items())}
    args = (params, tx.init(params), jax.random.normal(jax.random.key(7), (B, D)),
            jax.random.normal(jax.random.key(8), (B, D)))
    g = trace(step, *args, dims=({"router": "embed experts", "w_in": "experts embed mlp",
                                  "w_out": "experts mlp embed"}, None, "batch embed", "batch embed"),
              roles=("param", "opt_state", "input", "input"), names={"d2": "top"})
    assert g.dims["top"] == 2
    for layout in ("batch:data;experts:model", "batch:data;mlp:model|*:data@3"):
        check(g, step, args, layout)
