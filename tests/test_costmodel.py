"""Cost model against the paper's formulas and hand-derived figures."""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import pytest

from autolayout import models
from autolayout.core import LayoutError
from autolayout.costmodel import get_hardware, predict
from autolayout.reporting.table1 import table1
from autolayout.trace import trace

SIZES = [  # (b, d_io, d_h, n, r, c, p)
    pytest.param(64, 32, 128, 8, 4, 2, 2, id="b64-io32-h128"),
    pytest.param(256, 64, 32, 8, 2, 4, 2, id="b256-io64-h32"),
    pytest.param(32, 16, 512, 16, 4, 4, 2, id="b32-io16-h512-n16"),
]


def _allreduced_values(cost) -> int:
    return sum(c.bytes // 4 * c.count for c in cost.collectives if c.kind == "all-reduce")


@pytest.mark.parametrize("b,dio,dh,n,r,c,p", SIZES)
def test_allreduced_values_match_paper_section_8(b, dio, dh, n, r, c, p):
    """§8.1-8.3 text: values all-reduced per processor in a training step. We also count
    the bias gradient (d_h, or its slice) and the scalar loss when the batch is split."""
    g = models.mlp(b, dio, dh)
    expected = {
        ("", f"all:{n}"): 0,
        ("batch:all", f"all:{n}"): 2 * dio * dh + dh + 1,
        ("hidden:all", f"all:{n}"): 2 * b * dio,
        ("batch:rows;hidden:cols", f"rows:{r},cols:{c}"): 2 * b * dio // r + 2 * dio * dh // c + dh // c + 1,
        ("batch:rows;hidden:cols;io:planes", f"rows:{r},cols:{c},planes:{p}"):
            2 * (b // r * dio // p + b // r * dh // c + dio // p * dh // c) + dh // c + 1,
    }
    for (layout, mesh), values in expected.items():
        assert _allreduced_values(predict(g, mesh, layout)) == values, layout


@pytest.mark.parametrize("b,dio,dh,n,r,c,p", SIZES)
def test_parameter_memory_is_the_tables_slices(b, dio, dh, n, r, c, p):
    g = models.mlp(b, dio, dh)
    cases = {
        ("batch:all", f"all:{n}"): 2 * dio * dh + dh,
        ("hidden:all", f"all:{n}"): (2 * dio * dh + dh) // n,
        ("batch:rows;hidden:cols", f"rows:{r},cols:{c}"): (2 * dio * dh + dh) // c,
        ("batch:rows;hidden:cols;io:planes", f"rows:{r},cols:{c},planes:{p}"): 2 * (dio // p) * (dh // c) + dh // c,
    }
    for (layout, mesh), values in cases.items():
        assert predict(g, mesh, layout).memory["params"] == 4 * values, layout


@pytest.mark.parametrize("b,dio,dh,n,r,c,p", SIZES)
def test_compute_divides_by_the_split_factor(b, dio, dh, n, r, c, p):
    """Six b·d_io·d_h matmuls per training step (2 forward, 4 backward), 2 flops per MAC."""
    df = table1(b, dio, dh, n=n, r=r, c=c, p=p)
    split = {"[]": 1, "batch:all": n, "hidden:all": n, "batch:rows;hidden:cols": r * c,
             "batch:rows;hidden:cols;io:planes": r * c * p}
    for row in df.itertuples():
        assert row.comp_flops == 6 * 2 * b * dio * dh / split[row.layout]
        assert row.comp_ratio == 12.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=3), "table1: n=3 does not divide b=64, which Table 1's layout 'batch:all' splits over it; give n a "
                "value that divides 64, or b a multiple of 3"),
    (dict(n=16, b=128), "table1: n=16 does not divide d_h=40, which Table 1's layout 'hidden:all'"),
    (dict(c=3, d_h=64), "table1: c=3 does not divide d_h=64"),
], ids=["n-batch", "n-hidden", "c-hidden"])
def test_table1_sizes_the_mesh_does_not_divide(kwargs, message):
    args = dict(b=64, d_io=32, d_h=40 if "b" in kwargs else 128) | kwargs
    b, d_io, d_h = args.pop("b"), args.pop("d_io"), args.pop("d_h")
    with pytest.raises(ValueError, match=re.escape(message)):
        table1(b, d_io, d_h, **args)


def test_table1_beside_paper_text():
    df = table1(64, 32, 128)
    assert list(df.layout) == ["[]", "batch:all", "hidden:all", "batch:rows;hidden:cols",
                               "batch:rows;hidden:cols;io:planes"]
    # the text's approximate figure plus the bias-gradient slice and the scalar loss
    extra = {"[]": 0, "batch:all": 128 + 1, "hidden:all": 0, "batch:rows;hidden:cols": 64 + 1,
             "batch:rows;hidden:cols;io:planes": 64 + 1}
    for row in df.itertuples():
        assert row.allreduced_values == row.paper_text + extra[row.layout]


def test_illegal_layout_of_section_8_5_is_rejected():
    g = models.mlp(64, 32, 128)
    with pytest.raises(LayoutError, match=r"'h'.*batch.*hidden.*'all'|'h'.*hidden.*batch.*'all'"):
        predict(g, "all:8", "batch:all;hidden:all")


def test_all_reduce_time_is_the_ring_formula():
    """Data-parallel on one axis: each gradient all-reduce costs 2(n-1)/n·V/B + 2(n-1)α."""
    hw = get_hardware("tpu-v3")
    g = models.mlp(64, 32, 128)
    cost = predict(g, "all:8", "batch:all", hardware=hw)
    link = hw.link_for("all")
    expect = sum(2 * 7 / 8 * c.bytes / link.bandwidth + 2 * 7 * link.latency for c in cost.collectives)
    assert cost.comm_s == pytest.approx(expect, rel=1e-12)


def test_compute_is_a_roofline_with_elementwise_fusion():
    """relu(x·w + bias): the add is fused into the relu (XLA loop fusion), so the add reads
    x·w and bias but writes nothing, and the relu writes h but reads nothing from HBM."""
    hw = get_hardware("tpu-v3")
    g = models.mlp(64, 32, 128, train=False)
    cost = predict(g, "all:8", "hidden:all", hardware=hw)
    rows = cost.per_op.set_index("op")
    add = next(op.name for op in g.ops() if op.fn == "add")
    peak = hw.peak("float32") * hw.efficiency
    assert rows.loc[add].bytes == (64 * 16 + 16) * 4
    assert rows.loc["h"].bytes == 64 * 16 * 4
    for name in (add, "h"):
        flops, nbytes = 64 * 16, rows.loc[name].bytes
        assert rows.loc[name].compute_s == pytest.approx(max(flops / peak, nbytes / hw.hbm_bandwidth))
    dot = rows[rows.fn == "dot"].iloc[0]
    assert dot.flops == 2 * 64 * 32 * 16
    assert dot.bytes == (64 * 32 + 32 * 16 + 64 * 16) * 4
    assert dot.compute_s == pytest.approx(max(dot.flops / peak, dot.bytes / hw.hbm_bandwidth))


def test_slow_axis_only_slows_its_collectives():
    base = get_hardware("tpu-v4")
    slow = base.with_axis_link("rows", base.link.__class__(bandwidth=base.link.bandwidth / 10,
                                                            latency=base.link.latency))
    g = models.mlp(64, 32, 128)
    fast_c = predict(g, "rows:4,cols:2", "batch:rows;hidden:cols", hardware=base)
    slow_c = predict(g, "rows:4,cols:2", "batch:rows;hidden:cols", hardware=slow)
    for a, b_ in zip(fast_c.collectives, slow_c.collectives):
        if "rows" in a.mesh_axes:
            assert b_.time_s > a.time_s
        else:
            assert b_.time_s == a.time_s


def test_two_dims_of_one_gather_on_one_axis_is_rejected():
    """No tensor has both vocab and batch, but the lookup op does: devices holding different
    vocab rows and different batch rows cannot combine partial lookups by a sum."""
    def f(table, ids):
        return jnp.take(table, ids, axis=0)

    g = trace(f, jax.ShapeDtypeStruct((16, 4), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.int32),
              dims=("vocab d", "batch"))
    with pytest.raises(LayoutError, match=r"dims 'vocab' and 'batch' both split over mesh axis 'all'"):
        predict(g, "all:2", "vocab:all;batch:all")
    assert predict(g, "rows:2,cols:2", "vocab:rows;batch:cols").collectives[0].mesh_axes == ("rows",)


def _split_heads(x, w):
    return (x @ w).reshape(x.shape[0], 4, 8).sum()


@pytest.mark.parametrize("layout,kinds", [
    ("heads:all;d32:all", []),            # major dims of one split group: local reshape
    ("d32:all", ["all-gather"]),          # split -> unsplit
    ("heads:all", []),                    # unsplit -> split: a local slice
    ("d32:all;d_kv:all", ["all-to-all"]),  # the axis moves to a minor dim
], ids=["major-kept", "gather", "slice", "all-to-all"])
def test_reshape_split_rules(layout, kinds):
    g = trace(_split_heads, jax.ShapeDtypeStruct((16, 8), jnp.float32),
              jax.ShapeDtypeStruct((8, 32), jnp.float32), dims=("batch d_model", "d_model _"))
    g2 = g
    names = set(g2.dims)
    assert {"heads", "d_kv"} - names == {"heads", "d_kv"}  # auto-named; map them
    split = next(op for op in g2.ops() if op.kind == "reshape")
    merged, (major, minor) = split.attrs[0][1][1][0][0], split.attrs[0][1][1][1]
    lay = layout.replace("d32", merged).replace("heads", major).replace("d_kv", minor)
    cost = predict(g2, "all:2", lay)
    got = [c.kind for c in cost.collectives if c.op == split.name]
    assert got == kinds
    if kinds:
        local_in = 16 * 32 // 2 * 4
        assert [c.bytes for c in cost.collectives if c.op == split.name] == [local_in]


def test_attention_rename_gathers_when_length_is_split():
    g = models.transformer_lm(d_model=16, d_ff=32, heads=4, d_kv=8, n_layers=2, vocab=64, batch=4, length=8)
    cost = predict(g, "all:2", "length:all")
    renames = [c for c in cost.collectives if g.op(c.op).fn == "rename"]
    assert renames and {c.kind for c in renames} <= {"all-gather"}
    # k and v in the forward loop: [batch, length/2, heads, d_kv] gathered over 'all'
    fwd = [c for c in renames if g.op(c.op).loop == "loop0"]
    assert [c.bytes for c in fwd] == [4 * 4 * 4 * 8 * 4] * 2
    assert all(c.count == 2 for c in fwd)
    # length and length_1 on different axes: every rename gathers once, over the axis of the
    # dim it renames away (the new dim's split is a local slice)
    cost2 = predict(g, "rows:2,cols:2", "length:rows;length_1:cols")
    axis_of = {"length": ("rows",), "length_1": ("cols",)}
    renames2 = [c for c in cost2.collectives if g.op(c.op).fn == "rename"]
    for c in renames2:
        op = g.op(c.op)
        (gone,) = {d.name for d in op.input_shapes[0]} - {d.name for d in op.output.shape}
        assert c.kind == "all-gather" and c.mesh_axes == axis_of[gone], (c, gone)
    length_renames = [op.name for op in g.ops() if op.fn == "rename"
                      and {d.name for d in op.input_shapes[0]} & set(axis_of)]
    assert sorted(c.op for c in renames2) == sorted(length_renames)


def test_gather_and_scatter_over_split_vocab_and_batch():
    g = models.transformer_lm(d_model=16, d_ff=32, heads=4, d_kv=8, n_layers=1, vocab=64, batch=4, length=8)
    cost = predict(g, "rows:2,cols:2", "vocab:rows;batch:cols")
    gather = next(op for op in g.ops() if op.kind == "gather")
    scatter = next(op for op in g.ops() if op.kind == "scatter")
    (gc,) = [c for c in cost.collectives if c.op == gather.name]
    assert (gc.kind, gc.mesh_axes, gc.bytes) == ("all-reduce", ("rows",), 2 * 8 * 16 * 4)
    (sc,) = [c for c in cost.collectives if c.op == scatter.name]
    assert (sc.kind, sc.mesh_axes, sc.bytes) == ("all-reduce", ("cols",), 32 * 16 * 4)


def test_loop_dim_cannot_be_split():
    g = models.transformer_lm(d_model=16, d_ff=32, heads=4, d_kv=8, n_layers=2, vocab=64, batch=4, length=8)
    with pytest.raises(LayoutError, match=r"'layers' indexes the iterations of a scan"):
        predict(g, "all:2", "layers:all")


def test_scan_multiplicity_scales_time_not_graph():
    kw = dict(d_model=16, d_ff=32, heads=4, d_kv=8, vocab=64, batch=4, length=8)
    c2 = predict(models.transformer_lm(n_layers=2, **kw), "all:4", "batch:all")
    c4 = predict(models.transformer_lm(n_layers=4, **kw), "all:4", "batch:all")
    body2 = c2.per_op[c2.per_op.loop != ""]
    body4 = c4.per_op[c4.per_op.loop != ""]
    assert (body4.total_s.sum()) == pytest.approx(2 * body2.total_s.sum())


def test_liveness_peak_of_a_chain():
    """y = exp(x) is materialised (a reduction reads it), s = sum_b y, out = y * s: out is
    element-wise and y's last read, so it is written over y's buffer (XLA shares it); at
    the last op x, y/out and s are live: 2 x + s, what jax.jit's memory_analysis reports
    (argument 8192 + output 8192 + temp 256 B); exp alone would have been fused away."""
    def f(x):
        y = jnp.exp(x)
        return y * y.sum(1, keepdims=True)

    g = trace(f, jax.ShapeDtypeStruct((64, 32), jnp.float32), dims=("a b",))
    x_bytes, s_bytes = 64 * 32 * 4, 64 * 4
    m = jax.jit(f).lower(jax.ShapeDtypeStruct((64, 32), jnp.float32)).compile().memory_analysis()
    assert m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes == 2 * x_bytes + s_bytes
    cost = predict(g, "all:4", "")
    assert cost.memory_bytes == 2 * x_bytes + s_bytes
    cost = predict(g, "all:4", "a:all")
    assert cost.memory_bytes == (2 * x_bytes + s_bytes) // 4
    assert cost.memory == {"params": 0, "grads": 0, "opt_state": 0, "activations": (2 * x_bytes + s_bytes) // 4,
                           "transient": 0}
    g2 = trace(lambda x: jnp.tanh(jnp.exp(x)), jax.ShapeDtypeStruct((64, 32), jnp.float32), dims=("a b",))
    assert predict(g2, "all:4", "").memory_bytes == 2 * x_bytes  # exp(x) fused into tanh


TRANSFORMER = dict(d_model=32, d_ff=64, heads=4, d_kv=8, n_layers=2, vocab=64, batch=8, length=8)


def test_weight_update_sharding_adam_memory_and_communication():
    """Seed 003: all-reduce -> reduce-scatter + all-gather; Adam state and update compute / N."""
    g = models.transformer_lm(**TRANSFORMER)
    base = predict(g, "all:8", "batch:all")
    wus = predict(g, "all:8", "batch:all|softmax:all")
    softmax = g.tensor("softmax")
    assert base.memory["opt_state"] - wus.memory["opt_state"] == 2 * 4 * softmax.size * 7 // 8
    rs = [c for c in wus.collectives if c.kind == "reduce-scatter"]
    ag = [c for c in wus.collectives if c.kind == "all-gather"]
    assert len(rs) == 1 and len(ag) == 1
    ar = [c for c in base.collectives if c.op == rs[0].op]
    assert [c.kind for c in ar] == ["all-reduce"] and ar[0].bytes == rs[0].bytes == 4 * softmax.size
    assert ag[0].bytes == 4 * softmax.size // 8 and g.tensor(ag[0].op).role == "output"
    # the gradient's all-reduce is replaced (not joined) by the reduce-scatter
    assert [c.kind for c in wus.collectives if c.op == rs[0].op] == ["reduce-scatter"]
    # bytes on the wire: RS + AG moves what one AR moves
    assert wus.comm_bytes == base.comm_bytes - ar[0].bytes + rs[0].bytes + ag[0].bytes
    # update compute shrinks by 8: the flops of the Adam update ops for softmax
    assert wus.flops < base.flops


def test_weight_update_sharding_errors():
    g = models.transformer_lm(**TRANSFORMER)
    with pytest.raises(LayoutError, match=r"embed.*not all-reduced over all"):
        predict(g, "all:8", "d_ff:all|embed:all")
    with pytest.raises(LayoutError, match=r"softmax"):
        predict(g, "all:8", "vocab:all|softmax:all")
    with pytest.raises(LayoutError, match=r"not_a_param"):
        predict(g, "all:8", "batch:all|not_a_param:all")


@pytest.mark.parametrize("layout, needles", [
    ("hidden:cols|*:rows@3", ["'*:rows@3' shards no parameter over mesh axis rows", "splits no dim its gradient is "
                              "summed over", "Fix: split the batch over rows (e.g. 'batch:rows'), or drop it"]),
    ("batch:rows|*:rows,cols@3", ["'*:rows,cols@3' shards no parameter over mesh axis cols",
                                  "or drop cols from it ('*:rows@3')"]),
    ("hidden:cols;batch:rows|*:rows,cols", ["'*:rows,cols' shards no parameter over mesh axis cols",
                                            "(or splits the parameter itself)"]),  # every mlp param has hidden
    ("batch:rows|*:rows@3;w:rows;v:rows;bias:rows", ["'*:rows@3' applies to no parameter", "drop the entry"]),
], ids=["axis-reduces-no-gradient", "one-axis-of-two", "params-split-there", "all-params-named"])
def test_a_star_storage_entry_that_shards_nothing_is_an_error(layout, needles):
    """A ``*`` entry that would change nothing is refused, as the same entry naming a parameter is."""
    g = models.mlp(64, 32, 128)
    with pytest.raises(LayoutError) as info:
        predict(g, "rows:2,cols:4", layout)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    with pytest.raises(LayoutError, match=r"'w'.*not all-reduced over rows"):  # the same request by name
        predict(g, "rows:2,cols:4", "hidden:cols|w:rows@3")
    with pytest.raises(LayoutError, match=r"'\*:rows@3' shards no parameter: the graph records no gradient"):
        predict(models.mlp(64, 32, 128, train=False), "rows:2,cols:4", "batch:rows|*:rows@3")


def test_a_star_storage_entry_on_a_batch_axis_shards_every_parameter():
    """The valid ``*`` entries still apply: ZeRO-3 over the batch axes stores each of the mlp's
    parameters (and its gradient) split 8 ways: 3 * 4 bytes * (32*128 + 128 + 128*32) * 7/8 less."""
    g = models.mlp(64, 32, 128)
    plain = predict(g, "rows:2,cols:4", "batch:rows,cols")
    zero3 = predict(g, "rows:2,cols:4", "batch:rows,cols|*:rows,cols@3")
    assert plain.memory["params"] - zero3.memory["params"] == 4 * (32 * 128 + 128 + 128 * 32) * 7 // 8
    assert {c.kind for c in zero3.collectives} >= {"reduce-scatter", "all-gather"}


ZOO = {
    "mlp": lambda: models.mlp(16, 8, 32),
    "transformer": lambda: models.transformer_lm(d_model=8, d_ff=16, heads=2, d_kv=4, n_layers=2, vocab=16,
                                                 batch=4, length=4),
    "moe": lambda: models.moe(d_model=8, d_ff=16, experts=4, capacity=2, batch=4, length=4),
}


@pytest.mark.parametrize("model", list(ZOO), ids=list(ZOO))
@pytest.mark.parametrize("mesh", ["all:2", "rows:2,cols:2", "rows:2,cols:2,planes:2"],
                         ids=["1axis", "2axes", "3axes"])
def test_predict_every_single_dim_layout_of_the_zoo(model, mesh):
    """Every layout that splits one or two dims: valid ones predict, invalid ones raise LayoutError."""
    g = ZOO[model]()
    axes = [a.split(":")[0] for a in mesh.split(",")]
    dims = [d for d in g.dims if d not in g.loop_dims]
    ok = 0
    for d in dims:
        for a in axes:
            try:
                c = predict(g, mesh, f"{d}:{a}")
            except LayoutError:
                continue
            ok += 1
            assert c.time_s > 0 and c.memory_bytes > 0
            assert c.flops <= predict(g, mesh, "").flops
    assert ok >= len(dims)


def test_unknown_hardware_lists_known():
    with pytest.raises(ValueError, match=r"tpu-v4"):
        predict(models.mlp(8, 8, 8), "all:2", "", hardware="tpu-v99")


def test_mfu_uses_model_flops():
    # model flops by hand (PaLM appendix B): 3 x the forward pass's two matmuls of
    # 2 * batch * d_io * d_hidden flops each; the step executes 6 (it returns dX too),
    # split 8 ways
    g = models.mlp(64, 32, 128)
    c = predict(g, "all:8", "batch:all", hardware="tpu-v3")
    model = 3 * 2 * (2 * 64 * 32 * 128)
    assert c.model_flops == model
    peak = get_hardware("tpu-v3").peak("float32")
    assert c.mfu == pytest.approx(model / (c.time_s * 8 * peak))
    assert c.hfu == pytest.approx(6 * 2 * 64 * 32 * 128 / 8 / (c.time_s * peak))


@pytest.mark.parametrize("hw", ["tpu-v3", "cpu"])
def test_overlap_rule_by_hand(hw):
    # data-parallel MLP layer (the paper's: dy is an input; no scan: one overlap domain).
    # The weight gradients' all-reduces (d_io x d_hidden twice, and the bias d_hidden) run
    # behind any compute (pooled, O); the scalar output sum(y * dy) is all-reduced beside
    # independent work only (I): no backward matmul reads it. Here the backward reads dy,
    # not y, so all six matmuls are independent of some tensor: W = their compute. Hand:
    # T = C + E + max(0, O + I - C, I - W) (compute hides at most C in all, the
    # independent work at most W of I), ring formula.
    b, io, h = 64, 32, 128
    g = models.mlp(b, io, h)
    c = predict(g, "all:8", "batch:all", hardware=hw)
    link = get_hardware(hw).link
    if not get_hardware(hw).async_collectives:  # XLA:CPU: every collective in line
        assert c.overlapped_comm_s == 0 and c.time_s == pytest.approx(c.compute_s + c.comm_s, rel=1e-12)
        return
    ar = lambda nbytes: 2 * 7 / 8 * nbytes / link.bandwidth + 2 * 7 * link.latency  # noqa: E731
    o, i = 2 * ar(io * h * 4) + ar(h * 4), ar(4)
    assert c.overlapped_comm_s == pytest.approx(o + i, rel=1e-9)
    e = c.comm_s - o - i
    dots = c.per_op[c.per_op.fn == "dot"]
    assert len(dots) == 6
    w = float((dots.compute_s * dots["count"]).sum())
    assert c.time_s == pytest.approx(c.compute_s + e + max(0.0, o + i - c.compute_s, i - w), rel=1e-9)
    hidden = {x.tensor for x in c.collectives if x.overlapped}
    assert all("batch" not in g.tensor(t).dim_names for t in hidden)


def _two_megatron_mlps(params, x):
    # two Megatron MLP blocks (column- then row-parallel matmul), a mean-square loss
    for w1, w2 in params:
        x = jax.nn.relu(x @ w1) @ w2
    return jnp.mean(x ** 2)


def test_overlap_hides_a_backward_input_gradient_all_reduce_behind_its_weight_gradient():
    # Megatron-LM's tensor parallelism with d_ff split 8 ways (Shoeybi et al. 2019 §3): each
    # block's forward output is a partial sum, all-reduced on the critical path (the next
    # block or the loss reads it); in the backward pass the second block's input gradient
    # dX = dH·W1ᵀ is all-reduced while dW1 = Xᵀ·dH runs (Megatron's asynchronous all-reduce),
    # and the first block's input gradient is never computed (x is an input). Hand count:
    # 2 exposed and 1 overlapped all-reduce of [batch, d_model] float32 over 8 devices; the
    # weight gradients are local (each device holds its d_ff slice). The overlapped one hides
    # behind independent matmuls only: three of the four weight gradients (block 2's dW1 and
    # dW2, block 1's dW2; block 1's dW1 reads the reduced dX), each as big as any other dot.
    b, d, f = 64, 32, 256
    S = jax.ShapeDtypeStruct
    params = [(S((d, f), jnp.float32), S((f, d), jnp.float32))] * 2
    step = lambda params, x: jax.value_and_grad(_two_megatron_mlps)(params, x)  # noqa: E731
    g = trace(step, params, S((b, d), jnp.float32), dims=([("d_model d_ff", "d_ff d_model")] * 2, "batch d_model"),
              roles=("param", "input"))
    hw = get_hardware("tpu-v4")
    c = predict(g, "all:8", "d_ff:all", hardware=hw)
    link = hw.link
    ar = 2 * 7 / 8 * (b * d * 4) / link.bandwidth + 2 * 7 * link.latency
    kinds = sorted((x.kind, x.bytes, x.overlapped, x.count) for x in c.collectives)
    assert kinds == [("all-reduce", b * d * 4, False, 1)] * 2 + [("all-reduce", b * d * 4, True, 1)], kinds
    assert c.overlapped_comm_s == pytest.approx(ar, rel=1e-9)
    assert c.comm_s == pytest.approx(3 * ar, rel=1e-9)
    dots = c.per_op[c.per_op.fn == "dot"]
    assert len(dots) == 11 and dots.compute_s.nunique() == 1  # 4 forward, 4 dW, 3 dX or dH
    w = 3 * float(dots.compute_s.iloc[0])
    assert c.time_s == pytest.approx(c.compute_s + 2 * ar + max(0.0, ar - w), rel=1e-9)


@pytest.mark.parametrize("fn, kw", [
    ("transformer_lm", dict(d_model=32, d_ff=64, heads=2, d_kv=16, n_layers=2, vocab=64, batch=8, length=8)),
    ("llama", dict(d_model=32, d_ff=64, heads=4, kv_heads=2, d_kv=8, n_layers=2, vocab=64, batch=8, length=8)),
    ("moe", dict(d_model=16, d_ff=32, experts=4, capacity=8, batch=8, length=8)),
], ids=["transformer_lm", "llama", "moe"])
def test_model_flops_are_three_forward_passes(fn, kw):
    # independent reference: the forward pass traced on its own (train=False), whose
    # contractions the graph counts like the jaxpr (test_graph); a training step's model
    # flops are three of them (PaLM appendix B), with or without remat
    fwd = getattr(models, fn)(**kw, train=False)
    for remat in (False, True) if fn != "moe" else (False,):
        extra = dict(remat=remat) if remat else {}
        c = predict(getattr(models, fn)(**kw, **extra), "all:8", "batch:all", hardware="tpu-v4")
        assert c.model_flops == 3 * fwd.flops()


def test_mfu_does_not_count_recompute():
    # the same model traced with and without jax.checkpoint: equal model flops; the
    # rematerialised graph executes the forward matmuls once more (hardware flops)
    kw = dict(d_model=32, d_ff=64, heads=2, d_kv=16, n_layers=2, vocab=64, batch=8, length=8)
    plain, remat = models.transformer_lm(**kw), models.transformer_lm(**kw, remat=True)
    a, b = predict(plain, "all:8", "batch:all", hardware="tpu-v4"), predict(remat, "all:8", "batch:all", hardware="tpu-v4")
    assert a.model_flops == b.model_flops == plain.flops()
    assert remat.flops() > plain.flops()
    assert b.flops > a.flops and b.hfu * b.time_s > a.hfu * a.time_s


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_GRAPHS = {name: make() for name, make in ZOO.items()}
_MESHES = ["all:2", "rows:2,cols:2", "rows:2,cols:2,planes:2", "rows:4,cols:2"]


@st.composite
def _case(draw):
    model = draw(st.sampled_from(sorted(_GRAPHS)))
    mesh = draw(st.sampled_from(_MESHES))
    g = _GRAPHS[model]
    axes = [a.split(":")[0] for a in mesh.split(",")]
    dims = sorted(d for d in g.dims if d not in g.loop_dims)
    rules = {}
    for a in axes:
        d = draw(st.sampled_from([None] + dims))
        if d is not None:
            rules.setdefault(d, []).append(a)
    return model, mesh, ";".join(f"{d}:{','.join(x)}" for d, x in rules.items())


@settings(max_examples=60, deadline=None)
@given(_case())
def test_random_layouts_predict_consistently(case):
    """Any multi-axis layout either raises LayoutError or gives figures that agree with
    independent accounting: parameter memory is the sum of local slices, and splitting can
    only divide (never lose) model flops."""
    model, mesh_s, layout_s = case
    g = _GRAPHS[model]
    try:
        c = predict(g, mesh_s, layout_s)
    except LayoutError:
        return
    sizes = dict(a.split(":") for a in mesh_s.split(","))
    rules = dict(r.split(":") for r in layout_s.split(";") if r)
    n_dev = math.prod(int(v) for v in sizes.values())

    def local(t):
        return math.prod(d.size // math.prod(int(sizes[a]) for a in rules.get(d.name, "").split(",") if a)
                         for d in t.shape)

    assert c.memory["params"] == sum(4 * local(t) for t in g.params())  # params live all step
    dots = c.per_op[(c.per_op.kind == "einsum") & (c.per_op.fn == "dot")]
    assert float((dots.flops * dots["count"]).sum()) * n_dev >= g.flops()
    # overlap hides at most the overlappable collectives, never compute
    eps = 1e-12 * (c.compute_s + c.comm_s)
    assert c.compute_s + c.comm_s - c.overlapped_comm_s - eps <= c.time_s <= c.compute_s + c.comm_s + eps
    assert c.time_s >= c.compute_s - eps
    assert c.overlapped_comm_s == pytest.approx(sum(x.time_s * x.count for x in c.collectives if x.overlapped))
    assert c.comm_bytes == sum(x.bytes * x.count for x in c.collectives)
    for x in c.collectives:
        assert x.group_size == math.prod(int(sizes[a]) for a in x.mesh_axes)


# ------------------------------------------------------------------ storage stages (ZeRO)
STAGE_MODEL = dict(d_model=32, d_ff=64, heads=4, d_kv=8, n_layers=3, vocab=64, batch=16, length=8)


@pytest.mark.parametrize("stage", [1, 2, 3], ids=["zero1", "zero2", "zero3"])
def test_storage_stage_bytes_per_tensor(stage):
    """Data parallel over 8 devices with every parameter's storage sharded: optimizer state
    is 1/8 of its bytes at every stage; gradients 1/8 from stage 2 on (stage 1 holds a
    stacked layer gradient whole until the backward scan ends); weights 1/8 at stage 3 —
    each against the tensor's own byte count."""
    from autolayout.costmodel import plan
    g = models.transformer_lm(**STAGE_MODEL)
    p = plan(g, "all:8", f"batch:all|*:all@{stage}")
    for t in g.params():
        grad, states = g.param_roles[t.name].grad, g.param_roles[t.name].opt_state
        assert p.local_bytes[t.name] == (t.nbytes // 8 if stage == 3 else t.nbytes), t.name
        for s in states:
            assert p.local_bytes[s] == g.tensor(s).nbytes // 8, s
        stacked = "layers" in t.dim_names
        full = stage == 1 and stacked
        assert p.local_bytes[grad] == (g.tensor(grad).nbytes if full else g.tensor(grad).nbytes // 8), grad


def test_storage_stage_collectives_per_step():
    """Per stacked weight (3 layers): stage 1 reduce-scatters its gradient once and gathers
    the new weights once; stage 2 reduce-scatters once per layer; stage 3 gathers each
    layer's weights once in the forward and once in the backward scan, and never gathers
    the updated stack."""
    g = models.transformer_lm(**STAGE_MODEL)
    L = STAGE_MODEL["n_layers"]

    def counts(stage):
        c = predict(g, "all:8", f"batch:all|layers/w1:all@{stage}")
        rs = sum(x.count for x in c.collectives if x.kind == "reduce-scatter")
        ag = [x for x in c.collectives if x.kind == "all-gather"]
        return rs, sum(x.count for x in ag), {x.count for x in ag}

    assert counts(1) == (1, 1, {1})
    assert counts(2) == (L, 1, {1})
    rs, ag, per = counts(3)
    assert (rs, ag, per) == (L, 2 * L, {L})
    w1 = g.tensor("layers/w1")
    gathers = [x for x in predict(g, "all:8", "batch:all|layers/w1:all@3").collectives if x.kind == "all-gather"]
    assert {x.bytes for x in gathers} == {w1.nbytes // L // 8}  # one layer's shard per gather


def test_storage_stage1_needs_a_linear_gradient_path():
    """Stage 1 keeps the gradient a partial sum until it is complete; a stacked gradient
    that passes a non-linear op before the update cannot wait (stage 2 can)."""
    def step(w, x):
        def loss(w):
            h, _ = jax.lax.scan(lambda h, wl: (jnp.tanh(h @ wl), None), x, w)
            return jnp.sum(h)
        val, gw = jax.value_and_grad(loss)(w)
        return w - 0.1 * jnp.maximum(gw, 0.0) * jnp.sign(gw), val

    g = trace(step, jax.ShapeDtypeStruct((2, 16, 16), jnp.float32), jax.ShapeDtypeStruct((32, 16), jnp.float32),
              dims=("layers io _", "batch io"), roles=("param", "input"))
    assert g.param_roles["w"].grad is not None
    predict(g, "all:8", "batch:all|w:all@2")
    with pytest.raises(LayoutError, match=r"stage 1 keeps the gradient as a partial sum.*Use stage 2"):
        predict(g, "all:8", "batch:all|w:all@1")


# ------------------------------------------------------------- dot operand copies
def _xla_copied(op) -> tuple[int, ...]:
    """The operands XLA:CPU copies before the dot: the optimized HLO of the op's
    ``dot_general`` alone (operands in the graph's order, batch dims in the output's order,
    contracting dims in the lhs's order) has a copy, transpose or fusion of that operand."""
    import re

    from jax import lax
    shapes = [[d.name for d in s] for s in op.input_shapes]
    size = {d.name: d.size for d in op.dims}
    out = [d.name for d in op.output.shape]
    batch = [d for d in out if d in shapes[0] and d in shapes[1]]
    contract = [d for d in shapes[0] if d in shapes[1] and d not in out]
    dn = (([shapes[0].index(d) for d in contract], [shapes[1].index(d) for d in contract]),
          ([shapes[0].index(d) for d in batch], [shapes[1].index(d) for d in batch]))
    args = [jnp.ones([size[d] for d in s], jnp.float32) for s in shapes]
    text = jax.jit(lambda x, y: lax.dot_general(x, y, dn)).lower(*args).compile().as_text()
    return tuple(i for i, name in enumerate("xy")
                 if re.search(r"= f32\[[^\]]*\]\{[^}]*\} (fusion|copy|transpose)\(.*op_name=\"%s\"" % name, text))


@pytest.mark.parametrize("model", ["moe", "transformer_lm"])
def test_dot_operand_copies_match_xla_hlo(model):
    """Which operands of every contraction need a copy: the rule against XLA's own
    optimized HLO for the same dot (both copy and in-place cases occur in each model)."""
    from autolayout.costmodel.dotcopy import copied_operands
    g = getattr(models, model)()
    ops = [op for op in g.ops() if op.kind == "einsum" and len(op.inputs) == 2]
    got = {op.name: copied_operands(op, {d.name: d.size for d in op.dims}) for op in ops}
    assert got == {op.name: _xla_copied(op) for op in ops}
    assert any(got.values()) and not all(got.values())


def test_dot_operand_copies_priced_by_hand():
    """MoE's weight gradient ``becf,becd->efd`` under ``d_ff:cols``: both operands have the
    batch dim ``experts`` second, so both are copied: 2 x (8*8*8*32 + 8*8*8*64) x 4 B =
    393216 B at 1e9 B/s = 393.216 us on top of the op's compute; the gate einsum
    ``bld,de->ble`` reads both in place (+0). Off (every datasheet profile): nothing; on for the
    built-in ``cpu`` profile (XLA:CPU's compiler property, as ``calibrate`` sets it)."""
    from autolayout.core import Mesh
    from autolayout.costmodel.rules import op_cost
    g = models.moe()
    mesh = Mesh.parse("rows:2,cols:4")
    hw = get_hardware("cpu").replace(hbm_bandwidth=1e9)
    axes = {"d_ff": ("cols",)}
    for name, extra in (("grad/w1", 393216 / 1e9), ("dot_general_0", 0.0)):
        op = g.op(name)
        off = op_cost(op, axes, mesh, hw.replace(dot_operand_copies=False))
        on = op_cost(op, axes, mesh, hw.replace(dot_operand_copies=True))
        assert math.isclose(on.compute_s - off.compute_s, extra, rel_tol=1e-12, abs_tol=1e-15)
        assert on.comm_s == off.comm_s
    assert [s.name for s in g.op("grad/w1").input_shapes[0]] == ["batch", "experts", "capacity", "d_ff"]
    from autolayout.costmodel.hardware import Hardware
    from autolayout.costmodel.profiles import known_hardware
    assert [n for n in known_hardware() if get_hardware(n).dot_operand_copies] == ["cpu"]
    assert Hardware.from_dict(hw.replace(dot_operand_copies=True).to_dict()).dot_operand_copies
