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
