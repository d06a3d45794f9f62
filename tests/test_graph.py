"""The graph IR (DESIGN §2): reference evaluation, exact counts, signature classes, networkx view.

Every value is checked against the traced function itself; every count against
one recomputed here from the arguments or the loop structure.
"""
from __future__ import annotations

import re
from collections import Counter

import jax
import jax.numpy as jnp
import networkx as nx
import numpy as np
import pytest

import zoo_cases
from autolayout import Graph, models, trace

S = jax.ShapeDtypeStruct
F32 = jnp.float32

KITCHEN_SINK_PRIMITIVES = {
    False: {"gather", "remat2", "custom_jvp_call", "custom_vjp_call", "jit", "iota", "select_n",
            "integer_pow", "erf", "tanh", "logistic", "rsqrt", "reduce_max", "reduce_min",
            "convert_element_type", "stop_gradient"},
    True: {"gather", "scatter-add", "remat2", "custom_jvp_call", "jit", "iota", "select_n",
           "integer_pow", "erf", "tanh", "logistic", "rsqrt", "reduce_max", "reduce_min",
           "convert_element_type", "stop_gradient"},
}
GRAD_IDS = ["forward", "value_and_grad"]


def kitchen_sink(grad: bool) -> tuple[Graph, object, tuple]:
    loss, args, dims, roles = zoo_cases.kitchen_sink()
    fn = jax.value_and_grad(loss) if grad else loss
    return trace(fn, *args, dims=dims, roles=roles), fn, args


GRAPH_IDS = zoo_cases.CASE_IDS + [f"kitchen_sink-{i}" for i in GRAD_IDS]


@pytest.fixture(params=range(len(GRAPH_IDS)), ids=GRAPH_IDS)
def graph(request) -> Graph:
    i = request.param
    if i < len(zoo_cases.CASES):
        return zoo_cases.graph(*zoo_cases.CASES[i])
    return kitchen_sink(bool(i - len(zoo_cases.CASES)))[0]


# --------------------------------------------------------------------------- evaluate
@pytest.mark.parametrize(("model", "train"), zoo_cases.CASES, ids=zoo_cases.CASE_IDS)
def test_evaluate_equals_the_traced_function(model, train):
    _, out, ref = zoo_cases.run(model, train)
    zoo_cases.assert_tree_close(out, ref)


@pytest.mark.parametrize("grad", [False, True], ids=GRAD_IDS)
def test_evaluate_hand_written_program(grad):
    g, fn, args = kitchen_sink(grad)
    # the program really exercises what it claims to
    assert KITCHEN_SINK_PRIMITIVES[grad] <= zoo_cases.primitives(jax.make_jaxpr(fn)(*args).jaxpr)
    zoo_cases.assert_tree_close(jax.jit(g.evaluate)(*args), jax.jit(fn)(*args))


def test_evaluate_with_other_values_than_traced():
    # a graph traced from ShapeDtypeStructs runs on any values of those shapes
    evaluate, fn = zoo_cases.jitted("mlp", True)
    args = models.example_args(zoo_cases.graph("mlp", True), seed=3)
    zoo_cases.assert_tree_close(evaluate(*args), fn(*args))


BROADCAST_CASES = {
    # issue 13's repro: the gradient of a mean over `seq` broadcasts back over it into a matmul
    "mean_pool_grad": (lambda w, x: jax.value_and_grad(lambda w: jnp.sum((x @ w).mean(axis=1) ** 2))(w),
                       ((4, 8), (4, 3, 4)), ("embed mlp", "batch seq embed"), "batch:rows;mlp:cols"),
    # grouped-query attention: jnp.repeat of the key heads is a broadcast and a merge
    "gqa_repeat": (lambda q, k: jnp.einsum("blhd,bmhd->bhlm", q, jnp.repeat(k, 2, axis=2)),
                   ((2, 5, 4, 3), (2, 5, 2, 3)), ("batch length heads d", "batch length kvh d"),
                   "batch:rows;d:cols"),
}


@pytest.mark.parametrize("case", list(BROADCAST_CASES))
def test_broadcast_feeding_a_contraction_evaluates_and_executes(case):
    from autolayout import execute

    fn, shapes, dims, layout = BROADCAST_CASES[case]
    g = trace(fn, *(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes), dims=dims)
    assert any(op.fn == "broadcast" for op in g.ops())
    rng = np.random.default_rng(0)
    args = tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes)
    zoo_cases.assert_tree_close(jax.jit(g.evaluate)(*args), jax.jit(fn)(*args))
    mesh = "rows:2,cols:4" if case == "mean_pool_grad" else "rows:2,cols:3"
    ex = execute(g, mesh, layout, args=args, repeats=1, devices=jax.devices()[:6] if "3" in mesh else None,
                 compiler_options={"xla_backend_optimization_level": 0})
    assert ex.max_abs_error < 1e-5 and ex.collectives_match, ex.comparison


def test_evaluate_rejects_arguments_of_another_structure():
    g = zoo_cases.graph("mlp", False)
    params, x = models.example_args(g)
    with pytest.raises(ValueError, match=re.escape("evaluate: arguments have structure")):
        g.evaluate(params)


# --------------------------------------------------------------------------- counts
@pytest.mark.parametrize(("model", "train"), zoo_cases.CASES, ids=zoo_cases.CASE_IDS)
def test_num_params_is_the_size_of_the_param_leaves(model, train):
    g = zoo_cases.graph(model, train)
    params = g.example_spec[0]  # every zoo model takes its params first
    assert g.num_params() == zoo_cases.leaf_sizes(params)
    assert len(g.params()) == zoo_cases.count_leaves(params)


def test_num_params_of_a_hand_traced_function():
    g, _, (params, _) = kitchen_sink(False)
    assert g.num_params() == sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))


def test_signature_classes_partition_ops_and_sum_to_total_multiplicity(graph):
    classes = graph.signature_classes()
    in_loop = {name: lp.length for lp in graph.loops.values() for name in lp.body}
    executions = sum(in_loop.get(op.name, 1) for op in graph.ops())
    assert sum(c.count for c in classes) == executions
    members = [name for c in classes for name in c.ops]
    assert sorted(members) == sorted(op.name for op in graph.ops())
    for c in classes:
        assert len({graph.op(name).signature() for name in c.ops}) == 1
        assert c.kind == graph.op(c.ops[0]).kind


def residual_stack(n_layers: int) -> Graph:
    """``n_layers`` identical residual ReLU layers unrolled in Python (no scan)."""

    def f(x, ws, vs):
        for w, v in zip(ws, vs):
            x = x + jax.nn.relu(x @ w) @ v
        return x

    args = (S((8, 16), F32), [S((16, 32), F32)] * n_layers, [S((32, 16), F32)] * n_layers)
    dims = ("batch d_model", ["d_model d_ff"] * n_layers, ["d_ff d_model"] * n_layers)
    return trace(f, *args, dims=dims, roles=("input", "param", "param"))


def test_identical_layers_collapse_into_one_class_per_op():
    one, four = residual_stack(1), residual_stack(4)
    assert len(four) > len(one)
    assert len(four.signature_classes()) == len(one.signature_classes())
    counts = Counter(c.count for c in four.signature_classes())
    # every class is the input (once) or one op of the layer (four times)
    assert counts == {1: 1, 4: len(one.signature_classes()) - 1}


def test_networkx_graph_is_a_dag_whose_edges_are_op_inputs(graph):
    assert nx.is_directed_acyclic_graph(graph.nx)
    assert set(graph.nx.nodes) == {op.name for op in graph.ops()}
    expected_edges = {}
    for op in graph.ops():
        for pos, src in enumerate(op.inputs):
            expected_edges.setdefault((src, op.name), []).append(pos)
    assert {e: list(d["pos"]) for e, d in graph.nx.edges.items()} == expected_edges
    order = {name: i for i, name in enumerate(op.name for op in graph.ops())}
    assert all(order[a] < order[b] for a, b in graph.nx.edges)  # traced order is topological


def test_summary_mentions_every_dim_params_and_flops(graph):
    text = graph.summary()
    for name, size in graph.dims.items():
        assert f"{name}:{size}" in text
    assert f"{graph.num_params():,}" in text
    kinds = Counter(op.kind for op in graph.ops())
    for kind, n in kinds.items():
        assert f"{kind} {n}" in text
