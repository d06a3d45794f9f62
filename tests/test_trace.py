"""Tracing JAX functions into named-dimension graphs (DESIGN §3).

References are independent of the tracer: flops are recounted from the jaxpr,
names from the ``dims`` the test passes, values from running the function.
"""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import zoo_cases
from autolayout import TraceError, named, trace
from autolayout.graph import Graph

S = jax.ShapeDtypeStruct
F32 = jnp.float32

# Primitives whose parameters hold a sub-jaxpr that runs once per execution; scan's
# runs ``length`` times. Any other sub-jaxpr with a contraction fails the reference loudly.
CALL_PRIMITIVES = {"jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call", "remat2",
                   "checkpoint"}


def jaxpr_flops(jaxpr, mult: int = 1) -> int:
    """2 · batch · M · N · K for every ``dot_general``, recursing into calls and scans."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
            lhs, rhs = (tuple(v.aval.shape) for v in eqn.invars[:2])
            rhs_free = [s for i, s in enumerate(rhs) if i not in rc and i not in rb]
            total += mult * 2 * math.prod(lhs) * math.prod(rhs_free)
        inner = mult * eqn.params["length"] if name == "scan" else mult
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)
                if not hasattr(sub, "eqns"):
                    continue
                if name == "scan" or name in CALL_PRIMITIVES:
                    total += jaxpr_flops(sub, inner)
                elif jaxpr_flops(sub):  # e.g. scatter-add's combiner holds no contraction
                    pytest.fail(f"flops reference does not know how often `{name}` runs its body")
    return total


def user_names(dims) -> set[str]:
    """Every axis name in a ``dims`` pytree (strings of space-separated names)."""
    names = set()
    for leaf in jax.tree_util.tree_leaves(dims):
        names |= {n for n in leaf.replace(",", " ").split() if n != "_"}
    return names


def kitchen_sink_graph(grad: bool) -> tuple[Graph, object, tuple]:
    loss, args, dims, roles = zoo_cases.kitchen_sink()
    fn = jax.value_and_grad(loss) if grad else loss
    return trace(fn, *args, dims=dims, roles=roles), fn, args


# --------------------------------------------------------------------------- flops
@pytest.mark.parametrize(("model", "train"), zoo_cases.CASES, ids=zoo_cases.CASE_IDS)
def test_flops_equal_jaxpr_dot_generals(model, train):
    g = zoo_cases.graph(model, train)
    closed = jax.make_jaxpr(g.fn)(*g.example_spec)
    expected = jaxpr_flops(closed.jaxpr)
    assert expected > 0
    assert g.flops() == expected


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "value_and_grad"])
def test_flops_of_calls_checkpoint_and_custom_derivatives(grad):
    g, fn, args = kitchen_sink_graph(grad)
    assert g.flops() == jaxpr_flops(jax.make_jaxpr(fn)(*args).jaxpr)


def test_flops_of_an_unrolled_python_loop_count_every_layer():
    def f(x, ws):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    args = (S((8, 16), F32), [S((16, 16), F32)] * 3)
    assert trace(f, *args).flops() == 3 * 2 * 8 * 16 * 16


# --------------------------------------------------------------------------- names
@pytest.mark.parametrize(("model", "train"), zoo_cases.CASES, ids=zoo_cases.CASE_IDS)
def test_user_names_survive(model, train):
    g = zoo_cases.graph(model, train)
    names = user_names(g.arg_dims)
    assert names and names <= set(g.dims)


def test_user_names_and_sizes_of_a_hand_traced_function():
    g = trace(lambda x, w: jnp.tanh(x @ w), S((8, 16), F32), S((16, 32), F32),
              dims=("batch io", "io hidden"))
    assert g.dims == {"batch": 8, "io": 16, "hidden": 32}


def _rename_groups(g: Graph) -> list:
    return [op.attr("groups") for op in g.ops() if op.kind == "reshape" and op.fn == "rename"]


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_attention_gets_two_length_dims_and_explicit_renames(train):
    g = zoo_cases.graph("transformer_lm", train)
    length = zoo_cases.SIZES["transformer_lm"]["length"]
    assert g.dims["length"] == g.dims["length_1"] == length
    renames = _rename_groups(g)
    assert renames, "attention must rename keys/values with an explicit reshape op"
    assert all(((("length",), ("length_1",)) in groups) or ((("length_1",), ("length",)) in groups)
               for groups in renames)
    scores = [op for op in g.ops() if op.kind == "einsum" and len(op.inputs) == 2
              and {d.name for d in op.reduced_dims} == {"d_kv"}]
    assert scores, "no q·k einsum contracting d_kv"
    for op in scores:
        assert {"batch", "heads", "length", "length_1"} == set(op.output.dim_names)


def test_self_similarity_renames_one_operand():
    g = trace(lambda x: jnp.einsum("bld,bmd->blm", x, x), S((2, 7, 3), F32), dims=("batch length d",))
    assert g.dims == {"batch": 2, "length": 7, "d": 3, "length_1": 7}
    assert _rename_groups(g) == [((("batch",), ("batch",)), (("d",), ("d",)),
                                  (("length",), ("length_1",)))]
    (out,) = [op for op in g.ops() if op.kind == "einsum"]
    assert set(out.output.dim_names) == {"batch", "length", "length_1"}


def test_named_sets_tensor_and_axis_names():
    def f(x, w):
        h = named(jnp.tanh(x @ w), "batch hidden", name="h")
        return h.sum()

    g = trace(f, S((4, 6), F32), S((6, 10), F32))
    assert g.tensor("h").dim_names == ("batch", "hidden")
    assert g.dims["batch"] == 4 and g.dims["hidden"] == 10
    assert sorted(g.dims.values()) == [4, 6, 10]  # the contracted axis keeps an inferred name


# --------------------------------------------------------------------------- scan
@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_scan_body_is_traced_once_with_multiplicity(train):
    depths = (2, 4, 8)
    graphs = {n: zoo_cases.graph("transformer_lm", train, n_layers=n) for n in depths}
    for n, g in graphs.items():
        assert g.dims["layers"] == n
        assert "layers" in g.loop_dims
        loops = list(g.loops.values())
        assert len(loops) == (2 if train else 1)  # the backward pass is a reverse scan
        assert all(lp.length == n and lp.dim == "layers" for lp in loops)
        body = {o for lp in loops for o in lp.body}
        assert any(g.op(o).kind == "einsum" for o in body)
        for op in g.ops():
            assert op.multiplicity == (n if op.name in body else 1), op.name
    assert len({len(g) for g in graphs.values()}) == 1
    assert len({len(g.signature_classes()) for g in graphs.values()}) == 1
    f2, f4, f8 = (graphs[n].flops() for n in depths)
    per_layer = (f4 - f2) // 2
    assert per_layer > 0
    assert f8 - f4 == 4 * per_layer
    assert f2 - 2 * per_layer > 0  # embedding-free parts: the softmax layer


def rnn(x, w, reverse=False):
    """A recurrent layer with a square weight: ``h @ w`` gives h's axis w's *other* name,
    so the next carry must be renamed back inside the loop body."""

    def body(h, xi):
        h = jnp.tanh(h @ w + xi)
        return h, 2.0 * h

    return lax.scan(body, jnp.zeros(x.shape[1:], x.dtype), x, reverse=reverse)


SCAN_PROGRAMS = [
    ("rnn", rnn),
    ("rnn-reverse", lambda x, w: rnn(x, w, reverse=True)),
    ("rnn-grad", lambda x, w: jax.grad(lambda w, x: rnn(x, w)[1].sum(), argnums=(0, 1))(w, x)),
]


@pytest.mark.parametrize("fn", [c[1] for c in SCAN_PROGRAMS], ids=[c[0] for c in SCAN_PROGRAMS])
def test_scan_carry_renamed_in_body_evaluates_exactly(fn):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((5, 3, 4)), F32)
    w = jnp.asarray(rng.standard_normal((4, 4)) / 2, F32)
    g = trace(fn, x, w, dims=("time batch hidden", None))
    assert {"time", "batch", "hidden"} <= set(g.dims)
    assert sorted(g.dims.values()) == [3, 4, 4, 5]  # w's other axis: one more dim of size 4
    assert g.loop_dims == {"time"}
    body = {n for lp in g.loops.values() for n in lp.body}
    assert any(g.op(n).fn == "rename" for n in body)
    assert g.flops() == jaxpr_flops(jax.make_jaxpr(fn)(x, w).jaxpr)
    zoo_cases.assert_tree_close(g.evaluate(x, w), fn(x, w))


# --------------------------------------------------------------------------- shapes
def test_size_one_axes_are_not_dims():
    def f(x):
        return x.sum(-1, keepdims=True) * x / x.max(0, keepdims=True)

    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 1, 5)), F32)
    g = trace(f, x, dims=("a _ c",))
    assert g.dims == {"a": 4, "c": 5}
    assert all(d.size != 1 for t in g.tensors() for d in t.shape)
    np.testing.assert_allclose(g.evaluate(x), f(x), rtol=1e-6)


def test_reshape_split_and_merge_are_reshape_ops_with_groups():
    def f(x, w):
        y = named((x @ w).reshape(2, 3, 4, 5), "batch length heads d_kv")
        y = jnp.tanh(y)
        return y.reshape(2, 3, 20)

    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 6)), F32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((6, 20)), F32)
    g = trace(f, x, w, dims=("batch length d_model", "d_model hk"))
    reshapes = [op for op in g.ops() if op.kind == "reshape"]
    assert [op.fn for op in reshapes] == ["split", "merge"]
    split, merge = reshapes
    kept = ((("batch",), ("batch",)), (("length",), ("length",)))
    assert split.attr("groups") == kept + ((("hk",), ("heads", "d_kv")),)
    (merged,) = merge.output.dim_names[2:]
    assert merge.attr("groups") == kept + ((("heads", "d_kv"), (merged,)),)
    assert g.dims[merged] == 20 and g.dims["heads"] == 4 and g.dims["d_kv"] == 5
    np.testing.assert_allclose(g.evaluate(x, w), f(x, w), rtol=1e-5, atol=1e-6)


def test_transpose_is_an_alias_not_an_op():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((6, 4)), F32)
    w = jnp.asarray(rng.standard_normal((6, 5)), F32)

    def with_transposes(x, w):
        return jnp.tanh(x.T @ w).T

    def without(x, w):
        return jnp.tanh(jnp.einsum("ib,io->ob", x, w))

    assert "transpose" in zoo_cases.primitives(jax.make_jaxpr(with_transposes)(x, w).jaxpr)
    g = trace(with_transposes, x, w, dims=("d batch", "d out"))
    ref = trace(without, x, w, dims=("d batch", "d out"))
    assert [(op.kind, op.fn) for op in g.ops()] == [(op.kind, op.fn) for op in ref.ops()]
    assert all("transpose" not in op.fn for op in g.ops())
    np.testing.assert_allclose(g.evaluate(x, w), with_transposes(x, w), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- inputs
def test_shape_dtype_structs_and_arrays_trace_alike():
    def f(x, w):
        return jax.nn.relu(x @ w).sum(0)

    rng = np.random.default_rng(0)
    arrays = (jnp.asarray(rng.standard_normal((8, 16)), F32), jnp.asarray(rng.standard_normal((16, 4)), F32))
    specs = tuple(S(a.shape, a.dtype) for a in arrays)
    dims = ("batch io", "io hidden")
    a, s = trace(f, *arrays, dims=dims), trace(f, *specs, dims=dims)
    assert a.dims == s.dims
    assert [(op.name, op.signature(), op.inputs) for op in a.ops()] == \
        [(op.name, op.signature(), op.inputs) for op in s.ops()]
    np.testing.assert_allclose(s.evaluate(*arrays), f(*arrays), rtol=1e-5)


def test_shape_dtype_structs_allocate_nothing():
    # 2**20 x 2**16 float32 = 256 GiB: tracing must never materialise it.
    big = (S((2 ** 20, 2 ** 16), F32), S((2 ** 16, 2 ** 16), F32))
    g = trace(lambda x, w: x @ w, *big, dims=("batch io", "io hidden"))
    assert g.flops() == 2 * 2 ** 20 * 2 ** 16 * 2 ** 16


# --------------------------------------------------------------------------- errors
def _nested_scan(x):
    def outer(c, row):
        inner, _ = lax.scan(lambda c2, e: (c2 + e, None), c, row)
        return inner, None

    return lax.scan(outer, jnp.zeros((), x.dtype), x)[0]


X46 = S((4, 6), F32)
THIS_FILE = re.escape("test_trace.py")

USER_ERRORS = [
    ("wrong-name-count", lambda: trace(lambda x: x * 2, X46, dims=("batch",)),
     r"argument 'x' has shape \(4, 6\).*1 names"),
    ("same-name-twice", lambda: trace(lambda x: x * 2, S((4, 4), F32), dims=("batch batch",)),
     r"argument 'x' of shape \(4, 4\).*two axes named 'batch'"),
    ("one-name-two-sizes", lambda: trace(lambda x, y: x.sum() + y.sum(), X46, S((5,), F32),
                                         dims=("batch d", "batch")),
     r"argument 'y'.*'batch' has size 4 elsewhere but 5"),
    ("unknown-role", lambda: trace(lambda x: x * 2, X46, roles=("weights",)),
     r"argument 'x': role 'weights' is not one of"),
    ("nested-scan", lambda: trace(_nested_scan, X46),
     rf"`scan` with inputs .* at .*{THIS_FILE}.*nested scans are not supported"),
    ("named-two-axes-same-name", lambda: trace(lambda x: named(x @ x.T, "p p"), X46),
     rf"autolayout.named at .*{THIS_FILE}.*two axes named 'p'"),
    ("named-wrong-count", lambda: trace(lambda x: named(x, "p"), X46),
     rf"autolayout.named at .*{THIS_FILE}.*1 names \['p'\] for a value of shape \(4, 6\)"),
    # dims and roles mirror args (issue 14): a missing, extra or misnamed entry names the path
    ("dims-wrong-key", lambda: trace(lambda p: p["w"] * 2, {"w": X46}, dims=({"v": "a b"},)),
     r"the dims tree names 'v' at \[0\], which the arguments do not have there"),
    ("dims-extra-key", lambda: trace(lambda p: p["w"] * 2, {"w": X46}, dims=({"w": "a b", "b": "c"},)),
     r"the dims tree names 'b' at \[0\], which the arguments do not have there"),
    ("dims-extra-argument", lambda: trace(lambda x: x * 2, X46, dims=("a b", "c d")),
     r"dims has an entry \[1\] that matches no argument"),
    ("roles-extra-key", lambda: trace(lambda p: p["w"] * 2, {"w": X46}, roles=({"w": "param", "z": "param"},)),
     r"the roles tree names 'z' at \[0\], which the arguments do not have there"),
    ("dim-name-with-colon", lambda: trace(lambda x: x * 2, X46, dims=("batch:x d",)),
     r"dims of argument 'x': dim name .* got 'batch:x'"),
    ("named-dim-with-semicolon", lambda: trace(lambda x: named(x, "a;b c"), X46),
     r"named\(\.\.\., 'a;b c'\): dim name .* got 'a;b'"),
]


@pytest.mark.parametrize(("make", "pattern"), [c[1:] for c in USER_ERRORS], ids=[c[0] for c in USER_ERRORS])
def test_user_errors_are_explained(make, pattern):
    with pytest.raises(TraceError, match=pattern):
        make()


UNSUPPORTED = [
    ("while", lambda x, n: lax.fori_loop(0, n, lambda i, c: c * 2.0, x), (X46, S((), jnp.int32)), "while",
     "~int32[], int32[], float32[4,6]"),
    ("cond", lambda x: lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x), (X46,), "cond", "int32[], float32[4,6]"),
    ("scatter", lambda x, i: x.at[i].set(1.0), (X46, S((2,), jnp.int32)), "scatter",
     "float32[4,6], int32[2,1], float32[2,6]"),
    # dropout with a typed key argument (``jax.random.key``), as Flax's nn.Dropout draws it
    ("typed-key", lambda x, k: x * jax.random.bernoulli(k, 0.9, x.shape), (X46, jax.random.key(0)),
     "random_bits", "key<fry>[]"),
]
@pytest.mark.parametrize(("fn", "args", "prim", "shapes"), [c[1:] for c in UNSUPPORTED],
                         ids=[c[0] for c in UNSUPPORTED])
def test_unsupported_primitive_names_primitive_shapes_and_source_line(fn, args, prim, shapes):
    pattern = rf"unsupported primitive `{prim}` with inputs \({re.escape(shapes)}\) at .*{THIS_FILE}:\d+"
    with pytest.raises(TraceError, match=pattern):
        trace(fn, *args)


@pytest.mark.parametrize("returned", [True, False], ids=["key-returned", "key-unused"])
def test_a_typed_key_passed_through_traces_and_predicts_and_execute_says_what_to_do(returned):
    """A typed PRNG key the step does not read (a TrainState's dropout key, an NNX model's
    RngState in eval mode) is carried as an argument and maybe returned: ``trace`` and
    ``predict`` accept it; ``execute``, whose sharded program holds plain arrays, names it and
    the fix instead of failing inside numpy on the key's dtype."""
    from autolayout import execute, predict
    from autolayout.exec.runner import ArgumentError

    def step(w, key, x):
        w = w - 0.1 * jnp.mean(x @ w)
        return (w, key) if returned else w

    w, key, x = jnp.ones((8, 8)), jax.random.key(0), jnp.ones((4, 8))
    g = trace(step, w, key, x, dims=("d e", None, "batch d"), roles=("param", "input", "input"))
    assert [o.dtype for o in g.outputs] == [str(o.dtype) for o in jax.tree.leaves(jax.eval_shape(step, w, key, x))]
    assert predict(g, "data:2,model:4", "batch:data", hardware="tpu-v4").memory_bytes > 0
    with pytest.raises(ArgumentError, match=r"argument \[1\](, output \[1\] of 'step' are typed PRNG keys| of 'step' is a typed PRNG key)"
                       r" \(jax.random.key\).*Leave the key out"):
        execute(g, "data:2,model:4", "batch:data", args=(w, key, x), repeats=1, reference=False)


def test_a_non_array_argument_leaf_is_named_with_the_fix():
    """An equinox model passed whole (as eqx.filter_jit takes it) holds its activation
    function: trace names that leaf and says to partition the arrays out."""
    import equinox as eqx
    model = eqx.nn.MLP(4, 2, 8, depth=1, key=jax.random.key(0))
    with pytest.raises(TraceError, match=r"argument \[0\]\.activation is a \w+, not an array.*eqx\.partition"):
        trace(lambda m, x: jnp.sum(jax.vmap(m)(x)), model, jnp.ones((8, 4)))


def test_optax_multisteps_cond_says_to_accumulate_with_a_scan():
    """optax.MultiSteps picks between accumulating and applying with a `lax.cond` inside optax,
    where the user cannot apply the generic rewrite: the message says what to do instead."""
    import optax

    tx = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2)
    w = jnp.ones((6, 4))
    state = tx.init(w)

    def step(w, state, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        u, state = tx.update(g, state, w)
        return optax.apply_updates(w, u), state

    with pytest.raises(TraceError, match=r"unsupported primitive `cond`.*optax\.MultiSteps.*`lax\.scan`"):
        trace(step, w, state, jnp.ones((8, 6)))


def test_one_line_s_forward_and_backward_equations_are_one_item():
    """jax.grad of a `lax.cond` has a cond in the forward and one in the backward pass, both at
    the user's line: one item, both inputs' shapes named."""
    def f(x):
        return jnp.sum(lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x))

    with pytest.raises(TraceError) as exc:
        trace(jax.grad(f), X46)
    msg = str(exc.value)
    assert "unsupported constructs" not in msg  # a single item, not a list
    assert re.search(r"unsupported primitive `cond` with inputs \(int32\[\], float32\[4,6\]\) and "
                     r"\(int32\[\], float32\[4,6\], float32\[4,6\]\) at .*" + THIS_FILE, msg), msg


def test_max_pool_gradient_names_the_reshape_rewrite():
    def pool(x):
        return jnp.sum(lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") ** 2)

    with pytest.raises(TraceError, match=r"(?s)2 unsupported constructs.*`reduce_window_max`.*"
                                         r"`select_and_scatter_add` .*max-pool's gradient.*reshape"):
        trace(jax.grad(pool), S((2, 4, 4, 3), F32))


def test_trace_error_is_a_value_error():
    # the CLI prints ValueErrors as one-line messages
    assert issubclass(TraceError, ValueError)


def test_two_user_names_for_one_dim_is_an_error():
    """DESIGN §3.3: an equation relating two differently named axes is a naming mistake."""
    from autolayout.trace import TraceError, trace as trace_

    with pytest.raises(TraceError, match=r"named 'd_model' to the axis you named 'd_in'.*call both 'd_model'"):
        trace_(lambda a, b: a @ b, jax.ShapeDtypeStruct((4, 8), jnp.float32),
               jax.ShapeDtypeStruct((8, 2), jnp.float32), dims=("batch d_model", "d_in d_out"))


# --------------------------------------------------------------------------- readable names
def _attention(x, wq, wk):
    q, k = x @ wq, x @ wk
    return jax.nn.softmax(jnp.einsum("bld,bmd->blm", q, k), axis=-1) @ x


def test_unrolled_layers_share_one_key_length_dim():
    """Each unrolled self-attention layer renames its keys' length; the renames of one dim
    are one dim (as with ``lax.scan``), so a layout splits every layer's keys alike."""
    def f(x, ws):
        for wq, wk in ws:
            x = x + _attention(x, wq, wk)
        return jnp.sum(x ** 2)

    args = (S((2, 7, 4), F32), [(S((4, 4), F32), S((4, 4), F32))] * 3)
    for fn in (f, jax.grad(f, argnums=(0, 1))):
        g = trace(fn, *args, dims=("batch length d", [("d dk", "d dk")] * 3))
        assert g.dims == {"batch": 2, "length": 7, "d": 4, "dk": 4, "length_1": 7}


def test_a_second_rename_of_one_dim_is_suffixed_2():
    """Three axes of one tensor from one dim: ``length``, ``length_1``, ``length_2``."""
    g = trace(lambda x: x[:, :, None, None] * x[:, None, :, None] * x[:, None, None, :], S((2, 5), F32),
              dims=("batch length",))
    assert g.dims == {"batch": 2, "length": 5, "length_1": 5, "length_2": 5}


def test_patch_embedding_gradient_names_the_grid_patches_and_tokens_once():
    """ViT's front: a strided conv (patch grid), flattened to patches, a class token
    concatenated. The gradient runs it backwards — a ``split`` of the tokens
    (``concatenate``'s transpose), a reshape of the patches back to the grid, the kernel
    gradient's conv (which relates no grid axis to the forward one) — and names each piece
    as the forward pass did, not with new dims."""
    def f(cls, k, images):
        x = lax.conv_general_dilated(images, k, (4, 4), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        t = jnp.concatenate([jnp.broadcast_to(cls, (2, 1, 5)), x.reshape(2, 6, 5)], axis=1)
        return jnp.sum(jnp.tanh(t) ** 2)

    def sgd(cls, k, images):
        return jax.tree.map(lambda p, g: p - 0.1 * g, (cls, k), jax.grad(f, argnums=(0, 1))(cls, k, images))

    g = trace(sgd, S((5,), F32), S((4, 4, 3, 5), F32), S((2, 8, 12, 3), F32),
              dims=("embed", "ph pw channels embed", "batch height width channels"))
    # d2, d3: the 2 x 3 grid; d6: its patches; d7: the 1 + 6 tokens
    assert set(g.dims) - {"embed", "ph", "pw", "channels", "batch", "height", "width"} == {"d2", "d3", "d6", "d7"}
    (split,) = [op for op in g.ops() if op.kind == "reshape" and op.fn == "split"]
    assert split.attr("groups")[1] == (("d6",), ("d2", "d3"))
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.standard_normal(s), F32) for s in ((5,), (4, 4, 3, 5), (2, 8, 12, 3))]
    for got, want in zip(jax.tree.leaves(g.evaluate(*args)), jax.tree.leaves(sgd(*args))):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bit_operations_are_elementwise():
    """Shifts, population counts and same-width bitcasts (hashing, random-bit code) are
    element-wise ops, evaluated as JAX does."""
    def f(x):
        y = jnp.right_shift(x, 3) ^ jnp.left_shift(x, 1) ^ lax.population_count(x)
        return lax.bitcast_convert_type(y, jnp.int32)

    x = jnp.asarray(np.random.default_rng(0).integers(0, 2 ** 31, (4, 6)), jnp.uint32)
    g = trace(f, x, dims=("batch d",))
    assert {op.kind for op in g.ops()} == {"input", "elementwise"}
    np.testing.assert_array_equal(g.evaluate(x), f(x))


def _scans(jaxpr):
    """Every scan equation of a closed jaxpr, nested ones (in calls and scan bodies) too."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield eqn
        for sub in eqn.params.values():
            inner = getattr(sub, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                yield from _scans(inner)


def _scan_programs():
    w, xs, c = jnp.ones((3, 4)), jnp.ones((5, 3)), jnp.ones((3,))

    def consts_carry_xs(w, xs, c):
        return lax.scan(lambda h, x: (jnp.tanh(h @ w @ w.T + x), (h @ w).sum()), c, xs)

    def carry_only(c):
        return lax.scan(lambda h, _: (h * 2.0, None), c, None, length=5)

    def xs_only(xs):
        return lax.scan(lambda _, x: (None, x * 3.0), None, xs)

    return [("consts-carry-xs", consts_carry_xs, (w, xs, c)), ("carry-only", carry_only, (c,)),
            ("xs-only", xs_only, (xs,)),
            ("zoo-llama-train", None, "llama"), ("zoo-transformer_lm-remat", None, "transformer_lm")]


@pytest.mark.parametrize("drop", [("num_consts",), ("num_consts", "num_carry")], ids=["no-num_consts", "neither"])
@pytest.mark.parametrize("name,fn,args", _scan_programs(), ids=[c[0] for c in _scan_programs()])
def test_scan_split_from_shapes_matches_jax_params(name, fn, args, drop):
    """jax 0.11.2 (the NVIDIA image) has no num_consts on scan: the split read off the shapes
    must be the one jax 0.10 states in the params."""
    from types import SimpleNamespace

    from autolayout._interpret import scan_split

    if fn is None:  # a zoo model's training step (transformer_lm with remat: scans in checkpoints)
        g = zoo_cases.graph(args, **({"remat": True} if args == "transformer_lm" else {}))
        from autolayout import models
        fn, args = g.fn, models.example_args(g)
    closed = jax.make_jaxpr(fn)(*args)
    scans = list(_scans(closed.jaxpr))
    assert scans, name
    for eqn in scans:
        params = {k: v for k, v in eqn.params.items() if k not in drop}
        bare = SimpleNamespace(invars=eqn.invars, outvars=eqn.outvars, params=params)
        assert scan_split(bare) == (eqn.params["num_consts"], eqn.params["num_carry"])
