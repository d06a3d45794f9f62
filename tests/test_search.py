"""Layout search (DESIGN §5): exact w.r.t. the cost model, checked against exhaustive enumeration.

Graphs are traced once per module; enumerations stay small (few dims or small
meshes). The oracle times every valid layout with ``rules.op_cost`` per
signature class (what ``predict`` sums when no weight update is sharded) and
confirms its best with ``predict`` itself.
"""
from __future__ import annotations

import itertools
import math
import re

import pytest

from autolayout import models
from autolayout.core import Layout, LayoutError, Mesh
from autolayout.costmodel.attention import kernel_graph
from autolayout.costmodel.profiles import get_hardware
from autolayout.costmodel.predict import predict
from autolayout.costmodel.overlap import domain_of, overlappable, split, step_time
from autolayout.costmodel.rules import check_op, op_cost
from autolayout.search import SearchError, SearchResult, enumerate_layouts, layout, mesh_shapes, search
from autolayout.search.liveness import peak_of
from autolayout.search.names import param_copy
from autolayout.search.solver import search_points
from autolayout.search.warm import sizes_of
from autolayout.search.tables import Tables
from autolayout.search.wus import wus_options
from storage_variants import storage_variants

INF = math.inf
# Mesh-TensorFlow's global rules (no region rules, the scans as traced): the space
# enumerate_layouts lists, for the tests that hold the search against it
MTF = dict(regions=False, remat="none")

# --------------------------------------------------------------------------- graphs
_GRAPHS: dict = {}


def graph(name: str):
    """Zoo graphs at sizes where layouts matter but enumerations stay small (cached)."""
    if name not in _GRAPHS:
        _GRAPHS[name] = {
            "mlp": lambda: models.mlp(batch=8192, d_io=4096, d_hidden=16384),
            "mlp_dp": lambda: models.mlp(batch=65536, d_io=1024, d_hidden=1024),
            "mlp_mp": lambda: models.mlp(batch=64, d_io=1024, d_hidden=65536),
            "mlp_tiny": lambda: models.mlp(batch=8, d_io=4, d_hidden=8),
            "mlp_mse": lambda: models.mlp(batch=8192, d_io=4096, d_hidden=16384, loss="mse"),
            "moe_mse": lambda: models.moe(d_model=1024, d_ff=4096, experts=8, capacity=64, batch=32, length=256,
                                          loss="mse"),
            "moe": lambda: models.moe(d_model=1024, d_ff=4096, experts=8, capacity=64, batch=32, length=256),
            "transformer": lambda: models.transformer_lm(d_model=1024, d_ff=4096, heads=16, d_kv=64,
                                                         n_layers=2, vocab=32768, batch=64, length=256),
        }[name]()
    return _GRAPHS[name]


def oracle(g, mesh, hw, memory_limit=INF):
    """Best (time, layout) over enumerate_layouts, without weight-update sharding."""
    mesh, hw = Mesh.parse(mesh), get_hardware(hw)
    g = kernel_graph(g, hw)  # the step as the hardware runs it (fused attention), as predict prices it
    ov = overlappable(g, hw)
    classes: dict = {}  # ops costed alike: signature, overlap domain, overlap flags
    for op in g.ops():
        key = (op.signature(), domain_of(op), ov.flags(op))
        classes.setdefault(key, [op, 0])[1] += op.multiplicity
    cache: dict = {}
    scored = []
    for lay in enumerate_layouts(g, mesh):
        axes_of = dict(lay.rules)
        linear, terms = 0.0, {}
        for op, k in classes.values():
            key = (id(op), tuple(axes_of.get(d.name, ()) for d in op.dims))
            if key not in cache:
                cache[key] = split(op_cost(op, axes_of, mesh, hw, overlap=ov), op, ov)
            linear += cache[key][0] * k
            for dom, v in cache[key][1].items():
                terms[dom] = terms.get(dom, 0.0) + v * k
        scored.append((step_time(linear, terms), str(lay), lay))
    scored.sort(key=lambda s: (s[0], s[1]))
    if math.isinf(memory_limit):
        best = scored[0]
        assert predict(g, mesh, best[2], hardware=hw).time_s == pytest.approx(best[0], rel=1e-12)
        return best[0], best[2]
    for total, _, lay in scored:  # fastest layout that fits
        if predict(g, mesh, lay, hardware=hw).memory_bytes <= memory_limit:
            return total, lay
    return None


def maximal_storage_axes(g, mesh, lay, p, hw) -> list[tuple[str, ...]]:
    """The axis sets ``predict`` accepts for storing parameter ``p`` under ``lay``'s rules,
    keeping only the maximal ones (the options the search offers)."""
    ok = []
    for r in range(1, len(mesh) + 1):
        for axes in itertools.combinations(mesh.axis_names, r):
            try:
                predict(g, mesh, Layout(lay.rules, [(p, axes, 1)]), hardware=hw)
                ok.append(axes)
            except LayoutError:
                pass
    return [a for a in ok if not any(set(a) < set(b) for b in ok)]


def assert_exact(r: SearchResult) -> None:
    """The solver's objective is predict's time of the returned layout (within the integer scaling)."""
    assert r.status == "OPTIMAL"
    assert r.gap == 0.0
    assert r.cost.time_s == pytest.approx(r.objective_s, rel=1e-9, abs=r.tolerance_s)
    assert r.bound_s <= r.objective_s
    assert r.num_variables > 0 and r.num_constraints > 0


# ------------------------------------------------------------------- enumeration oracle
@pytest.mark.parametrize("name, mesh", [
    ("mlp_tiny", "all:2"), ("mlp_tiny", "rows:2,cols:2"), ("mlp_tiny", "rows:2,cols:2,planes:2"),
    ("mlp_tiny", "rows:1,cols:2"), ("transformer", "all:2"),
], ids=lambda v: str(v))
def test_enumerate_layouts_is_exactly_the_valid_layouts(name, mesh):
    g, mesh = graph(name), Mesh.parse(mesh)
    dims = [d for d in g.dims if d not in g.loop_dims]
    subsets = [c for r in range(len(mesh) + 1) for c in itertools.combinations(mesh.axis_names, r)]
    brute = set()
    for combo in itertools.product(subsets, repeat=len(dims)):
        lay = Layout([(d, a) for d, a in zip(dims, combo) if a])
        try:
            lay.validate(g, mesh)
            for op in g.ops():
                check_op(op, lay.as_dict())
        except LayoutError:
            continue
        brute.add(lay.canonical())
    listed = [lay.canonical() for lay in enumerate_layouts(g, mesh)]
    assert len(listed) == len(set(listed))
    assert set(listed) == brute


def test_enumerate_layouts_never_splits_loop_dims():
    g = graph("transformer")
    assert g.loop_dims == {"layers"}
    assert all(not lay.axes_of("layers") for lay in enumerate_layouts(g, "all:2"))


# ------------------------------------------------------------- search == exhaustive oracle
ORACLE_CASES = [
    ("mlp", "all:8", "tpu-v3"), ("mlp", "rows:2,cols:4", "tpu-v3"), ("mlp", "rows:2,cols:2,planes:2", "h100"),
    ("mlp_dp", "rows:2,cols:4", "tpu-v5e"), ("mlp_mp", "rows:2,cols:2,planes:2", "tpu-v4"),
    ("moe", "all:8", "tpu-v3"), ("moe", "rows:2,cols:4", "h100"), ("moe", "rows:2,cols:2,planes:2", "tpu-v5e"),
    ("transformer", "all:8", "tpu-v3"), ("transformer", "rows:2,cols:2", "h100"),
    ("transformer", "rows:2,cols:2", "tpu-v5p"),
]


@pytest.mark.parametrize("name, mesh, hw", ORACLE_CASES, ids=["-".join(c) for c in ORACLE_CASES])
def test_search_time_equals_exhaustive_minimum(name, mesh, hw):
    g = graph(name)
    best, best_layout = oracle(g, mesh, hw)
    r = search(g, mesh, hardware=hw, memory_limit=INF, shard_weight_update=False, **MTF)
    assert_exact(r)
    assert r.cost.time_s == pytest.approx(best, rel=1e-9), (str(r.layout), str(best_layout))
    assert not r.layout.update_sharding
    # weight-update sharding is decided in the same model: never worse, still exact
    rw = search(g, mesh, hardware=hw, memory_limit=INF, shard_weight_update=True, **MTF)
    assert_exact(rw)
    assert rw.cost.time_s <= r.cost.time_s * (1 + 1e-12)


def test_weight_update_sharding_is_chosen_when_it_pays():
    g = graph("transformer")
    r = search(g, "all:8", memory_limit=INF, **MTF)
    assert str(Layout(r.layout.rules)) == "batch:all"
    assert dict(r.layout.update_sharding)["layers/w1"] == ("all",)
    plain = predict(g, "all:8", "batch:all")
    assert r.cost.time_s < plain.time_s and r.cost.memory_bytes < plain.memory_bytes


def test_loop_dims_are_never_split():
    r = search(graph("transformer"), "rows:2,cols:2", memory_limit=INF)
    assert "layers" not in r.layout.as_dict()


# -------------------------------------------------------------------- paper (§8, §9)
@pytest.mark.parametrize("name, mesh, expected", [
    ("mlp_dp", "all:8", "batch:all"),                  # large batch, small hidden: data-parallel
    ("mlp_mp", "all:8", "hidden:all"),                 # small batch, large hidden: model-parallel
    ("mlp", "rows:2,cols:4", "hidden:cols;batch:rows"),  # both large, 2-D mesh: 2-D layout
], ids=["data-parallel", "model-parallel", "2-D"])
def test_rediscovers_the_paper_mlp_layouts(name, mesh, expected):
    # the paper's Table 1 prices every collective in line (Mesh-TF's synchronous schedule)
    hw = get_hardware("tpu-v3").replace(async_collectives=False)
    for wus in (False, True):
        r = search(graph(name), mesh, hardware=hw, shard_weight_update=wus, memory_limit=INF)
        assert Layout(r.layout.rules).canonical() == Layout(expected).canonical()


# ------------------------------------------------------------------------------- memory
CASES_LIVENESS = [("mlp", "rows:2,cols:4"), ("moe", "rows:2,cols:2"), ("transformer", "rows:2,cols:2")]


# the profile's memory order: tpu-v3 the traced one, h100 XLA:GPU's DefaultMemoryScheduler's
# (costmodel.order.min_memory; fused attention off, the graph predict prices as kernel_graph leaves it)
LIVENESS_HARDWARE = {"tpu-v3": get_hardware("tpu-v3"), "h100": get_hardware("h100").replace(fused_attention=False)}


@pytest.mark.parametrize("hw", sorted(LIVENESS_HARDWARE))
@pytest.mark.parametrize("name, mesh", CASES_LIVENESS, ids=["-".join(c) for c in CASES_LIVENESS])
def test_live_sets_reproduce_predict_memory(name, mesh, hw):
    g, mesh, hw = graph(name), Mesh.parse(mesh), LIVENESS_HARDWARE[hw]
    tables = Tables(g, mesh, hw)
    assert (getattr(tables.graph, "min_memory_of", None) is g) == hw.min_memory_schedule
    wus, _ = wus_options(tables)
    points = search_points(tables)
    layouts = list(enumerate_layouts(g, mesh))
    for lay in layouts[:: max(1, len(layouts) // 12)]:
        # the layout, then with every parameter's storage sharded that can be, at each ZeRO stage
        for lw, point in storage_variants(tables, wus, lay):
            assert peak_of(points, sizes_of(tables, wus, point))[0] == predict(g, mesh, lw, hardware=hw).memory_bytes, \
                str(lw)


CASES_COPIES = [("mlp_mse", "rows:2,cols:4", {True, False}), ("moe_mse", "rows:2,cols:2", {True, False}),
                ("mlp", "rows:2,cols:2", {True})]  # the linear loss's mlp: some parameter copied under every layout


@pytest.mark.parametrize("name, mesh, copied", CASES_COPIES, ids=["-".join(c[:2]) for c in CASES_COPIES])
def test_live_sets_reproduce_predict_memory_where_xla_copies_donated_parameters(name, mesh, copied):
    """On XLA:CPU (the ``cpu`` profile) a donated parameter read out of order is copied, and its
    own buffer holds temporaries until its update (``costmodel/donations.py``): which ones depends
    on the whole layout (ZeRO stage 3, the combined all-reduce), sized per layout in the live sets."""
    g, mesh, hw = graph(name), Mesh.parse(mesh), get_hardware("cpu")
    tables = Tables(g, mesh, hw)
    wus, _ = wus_options(tables)
    points = search_points(tables)
    layouts = list(enumerate_layouts(g, mesh))
    copies = set()
    for lay in layouts[:: max(1, len(layouts) // 12)]:
        for lw, point in storage_variants(tables, wus, lay):
            sizes = sizes_of(tables, wus, point)
            assert peak_of(points, sizes)[0] == predict(g, mesh, lw, hardware=hw).memory_bytes, str(lw)
            copies.add(any(sizes.get(param_copy(p), 0) for p in g.param_roles))
    assert copies == copied  # copied under some layouts, in place under others


@pytest.mark.parametrize("name, hw", [("moe_mse", "cpu"), ("transformer", "h100")], ids=["cpu-copies", "h100-order"])
def test_search_under_a_budget_is_exact(name, hw):
    """The fastest layout that fits (exhaustive): on cpu, where XLA's copies of donated parameters are
    sized by the whole layout, outside the linear rows (the solver cuts off a layout they put over
    the budget); on h100, in XLA:GPU's memory scheduler's order (``costmodel.order.min_memory``)."""
    g, mesh = graph(name), "rows:2,cols:2"
    free = search(g, mesh, hardware=hw, memory_limit=INF, shard_weight_update=False, **MTF)
    limit = free.cost.memory_bytes - 1
    expected = oracle(g, mesh, hw, memory_limit=limit)
    r = search(g, mesh, hardware=hw, memory_limit=limit, shard_weight_update=False, **MTF)
    assert_exact(r)
    assert r.cost.memory_bytes <= limit
    assert r.cost.time_s == pytest.approx(expected[0], rel=1e-9)


def test_budget_below_any_layout_raises_with_the_smallest_memory():
    g, mesh = graph("mlp"), "rows:2,cols:2"
    smallest = min(predict(g, mesh, lay).memory_bytes for lay in enumerate_layouts(g, mesh))
    with pytest.raises(SearchError, match=r"below the smallest peak memory any layout .* reaches") as err:
        search(g, mesh, memory_limit=smallest - 1, shard_weight_update=False)
    assert f"({smallest} B)" in str(err.value)
    stated = re.search(r"with layout '([^']*)'", str(err.value)).group(1)
    assert predict(g, mesh, stated).memory_bytes == smallest
    assert isinstance(err.value, ValueError)
    assert str(err.value.layout) == stated and err.value.memory_bytes == smallest
    # what is live there: the stated layout's largest buffers at its predicted peak, by name
    buffers = predict(g, mesh, stated).peak_buffers
    shown = re.search(r"the largest buffers (.*) and (\d+) more", str(err.value))
    assert [b.split(" (")[0] for b in shown.group(1).split(", ")] == [b.name for b in buffers[:3]]
    assert int(shown.group(2)) == len(buffers) - 3
    # at exactly that budget a layout exists
    assert search(g, mesh, memory_limit=smallest, shard_weight_update=False).cost.memory_bytes <= smallest


@pytest.mark.parametrize("name, mesh, hw", [("transformer", "all:8", "tpu-v3"),
                                            ("transformer", "rows:2,cols:2", "h100")],
                         ids=["transformer-all:8", "transformer-2x2"])
def test_memory_budget_gives_the_fastest_layout_that_fits(name, mesh, hw):
    g = graph(name)
    free = search(g, mesh, hardware=hw, memory_limit=INF, shard_weight_update=False, **MTF)
    mems = sorted({predict(g, mesh, lay, hardware=hw).memory_bytes for lay in enumerate_layouts(g, Mesh.parse(mesh))})
    if free.cost.memory_bytes == mems[0]:
        # the fastest layout is also the leanest (donated buffers can make data-parallel so):
        # any smaller budget is infeasible, and the minimum itself gives that layout back
        with pytest.raises(SearchError, match="below the smallest peak memory"):
            search(g, mesh, hardware=hw, memory_limit=mems[0] - 1, shard_weight_update=False, **MTF)
        r = search(g, mesh, hardware=hw, memory_limit=mems[0], shard_weight_update=False, **MTF)
        assert_exact(r)
        assert r.layout == free.layout
        return
    limit = free.cost.memory_bytes - 1
    expected = oracle(g, mesh, hw, memory_limit=limit)
    r = search(g, mesh, hardware=hw, memory_limit=limit, shard_weight_update=False, **MTF)
    assert_exact(r)
    assert r.cost.memory_bytes <= limit
    assert r.memory_rows >= 1
    assert r.cost.time_s == pytest.approx(expected[0], rel=1e-9)
    assert r.cost.time_s >= free.cost.time_s


def test_budget_below_any_sharded_storage_names_the_layout_compactly():
    # with weight-update sharding the smallest layout shards every parameter's storage: the error
    # writes the entry they share once, as '*' (compact_layout), and that layout is what it says
    g, mesh = models.transformer_lm(d_model=256, d_ff=1024, heads=4, d_kv=64, vocab=1024, batch=8, length=64), \
        "rows:2,cols:2"
    params = [t.name for t in g.tensors() if t.role == "param"]
    with pytest.raises(SearchError, match=r"below the smallest peak memory") as err:
        search(g, mesh, memory_limit=1e5, remat="none")
    stated = re.search(r"with layout '([^']*)'", str(err.value)).group(1)
    storage = stated.split("|")[1]
    assert storage.startswith("*:")
    assert len(storage.split(";")) < len(params)  # shorter than one entry per parameter
    assert str(err.value.layout) == stated
    assert predict(g, mesh, stated).memory_bytes == err.value.memory_bytes
    assert search(g, mesh, memory_limit=err.value.memory_bytes, remat="none").cost.memory_bytes \
        <= err.value.memory_bytes


def test_budget_between_data_parallel_and_minimum_forces_model_parallelism():
    g, mesh = graph("transformer"), "rows:2,cols:2"
    dp = predict(g, mesh, "batch:rows,cols")
    assert str(search(g, mesh, memory_limit=INF, shard_weight_update=False, **MTF).layout) == "batch:rows,cols"
    r = search(g, mesh, memory_limit=dp.memory_bytes - 1, shard_weight_update=False, **MTF)
    assert r.cost.memory_bytes < dp.memory_bytes
    assert {"d_ff", "heads", "vocab"} <= set(r.layout.as_dict())  # Megatron-style model parallelism


def test_budget_only_reachable_with_weight_update_sharding():
    g, mesh = graph("transformer"), "all:8"
    dp = predict(g, mesh, "batch:all")
    with_wus = search(g, mesh, memory_limit=INF, **MTF)
    assert with_wus.layout.update_sharding and with_wus.cost.memory_bytes < dp.memory_bytes
    limit = (dp.memory_bytes + with_wus.cost.memory_bytes) // 2
    with pytest.raises(SearchError, match="smallest peak memory"):
        search(g, mesh, memory_limit=limit, shard_weight_update=False, **MTF)
    r = search(g, mesh, memory_limit=limit, **MTF)
    assert_exact(r)
    assert r.cost.memory_bytes <= limit and r.layout.update_sharding
    assert str(Layout(r.layout.rules)) == "batch:all"


def test_default_memory_limit_is_the_device_hbm():
    g = graph("transformer")
    hbm = get_hardware("tpu-v2").hbm_bytes
    r = search(g, "rows:2,cols:2", hardware="tpu-v2")
    assert r.cost.memory_bytes <= hbm


@pytest.mark.parametrize("mesh", ["rows:2,cols:4", None], ids=["mesh", "mesh-shapes"])
def test_a_limit_above_the_device_memory_is_said(mesh):
    hbm = get_hardware("tpu-v3").hbm_bytes  # 16 GiB (profiles: the TPU v3 datasheet)
    kw = dict(hardware="tpu-v3", time_limit_s=10) | ({"num_devices": 8} if mesh is None else {})
    r = search(graph("mlp_tiny"), mesh, memory_limit=2 * hbm, **kw)
    assert any(re.fullmatch(r"memory_limit 32 GiB is above tpu-v3's 16 GiB of memory per device: the layout may not "
                            r"fit that device", n) for n in r.notes), r.notes
    for limit in (hbm, INF, None):  # at or below the device's memory, or no limit at all: nothing to say
        assert not any("above" in n for n in search(graph("mlp_tiny"), mesh, memory_limit=limit, **kw).notes)


# ------------------------------------------------------------------ API, meshes, solver
@pytest.mark.parametrize("mesh", [
    "rows:2,cols:4", {"rows": 2, "cols": 4}, [("rows", 2), ("cols", 4)], (2, 4), Mesh("rows:2,cols:4"),
], ids=["string", "dict", "mtf-pairs", "sizes", "Mesh"])
def test_every_mesh_form_gives_the_same_layout(mesh):
    lay = layout(graph("mlp"), mesh, memory_limit=INF, hardware=get_hardware("tpu-v3").replace(async_collectives=False))
    assert isinstance(lay, Layout)
    # w and v: their gradients come straight out of one matmul, so stages 1 and 2 are the
    # same plan and the lower is reported; bias: its gradient passes an elementwise op,
    # which stage 2 runs on the shard (faster than stage 1's full-size partial sums)
    assert str(lay) == "hidden:cols;batch:rows|bias:rows@2;v:rows;w:rows"


@pytest.mark.parametrize("n, max_axes, expected", [
    (8, 3, ["all:8", "rows:4,cols:2", "rows:2,cols:2,planes:2"]),
    (12, 2, ["all:12", "rows:6,cols:2", "rows:4,cols:3"]),
    (7, 3, ["all:7"]),
    (1, 3, ["all:1"]),
], ids=["8", "12-two-axes", "prime", "one"])
def test_mesh_shapes(n, max_axes, expected):
    assert [str(m) for m in mesh_shapes(n, max_axes)] == expected


def test_mesh_shape_search_returns_the_best_mesh():
    g = graph("mlp")
    r = search(g, num_devices=8, memory_limit=INF)
    assert [str(m) for m, _ in r.meshes] == [str(m) for m in mesh_shapes(8)]
    assert r.cost.time_s == min(t for _, t in r.meshes)
    single = search(g, r.mesh, memory_limit=INF)
    assert str(single.layout) == str(r.layout) and r.mesh == single.mesh


def test_same_inputs_give_the_same_layout():
    g = graph("moe")
    runs = {str(search(g, "rows:2,cols:2,planes:2", memory_limit=INF, random_seed=s).layout) for s in (0, 1, 7)}
    assert len(runs) == 1


def test_time_out_returns_a_layout_not_an_exception():
    g = graph("transformer")
    r = search(g, "rows:2,cols:2", memory_limit=INF, time_limit_s=1e-4)
    assert r.status in ("OPTIMAL", "FEASIBLE")
    assert r.bound_s <= r.objective_s + r.tolerance_s and 0.0 <= r.gap
    exact = search(g, "rows:2,cols:2", memory_limit=INF)
    assert r.cost.time_s >= exact.cost.time_s * (1 - 1e-12)


@pytest.mark.parametrize("kwargs, error, match", [
    ({}, LayoutError, "needs a mesh \\("),
    ({"mesh": "rows:2,cols:4", "num_devices": 4}, LayoutError, "not num_devices=4"),
    ({"mesh": "all:8", "memory_limit": 0}, SearchError, "positive number of bytes"),
    ({"mesh": "rows:2;cols:4"}, LayoutError, "cannot read mesh axis"),
    ({"num_devices": 0}, LayoutError, "positive integer"),
], ids=["no-mesh", "mesh-vs-num-devices", "zero-memory", "bad-mesh", "zero-devices"])
def test_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        search(graph("mlp_tiny"), **kwargs)


@pytest.mark.parametrize("mesh", ["data:24", "node:6,gpu:4"], ids=["24-devices", "6x4"])
def test_non_power_of_two_data_parallel_search_equals_predict(mesh):
    """A data-parallel run on 24 GPUs: no dim of d_model=1000 / d_ff=4000 divides by 24, so
    weight-update shards are flattened and padded; the search's objective (the same plan,
    priced per option) equals predict's time of the layout it returns."""
    g = models.transformer_lm(d_model=1000, d_ff=4000, heads=10, d_kv=100, n_layers=4, vocab=5000,
                              batch=48, length=64)
    r = search(g, mesh, hardware="h100", memory_limit=INF)
    assert_exact(r)
    assert r.layout.update_sharding  # the weight updates are sharded over the data axis
    assert r.cost.memory_bytes < predict(g, mesh, Layout(r.layout.rules), hardware="h100").memory_bytes


def storage_oracle(g, mesh, hw, memory_limit=INF):
    """Best (time, layout) over every valid layout and, per parameter, no storage sharding or
    each ZeRO stage over the largest axis set predict accepts for it (the gradient's reduced
    axes), found by trying every subset of mesh axes with predict itself."""
    mesh, hw = Mesh.parse(mesh), get_hardware(hw)
    params = [t.name for t in g.params()]
    best = None
    for lay in enumerate_layouts(g, mesh):
        choices = []
        for p in params:
            top = maximal_storage_axes(g, mesh, lay, p, hw)
            choices.append([None] + [(p, a, s) for a in top for s in (1, 2, 3)])
        for combo in itertools.product(*choices):
            entries = [c for c in combo if c is not None]
            try:
                c = predict(g, mesh, Layout(lay.rules, entries), hardware=hw)
            except LayoutError:
                continue  # e.g. stage 1 where the gradient path is not linear
            if c.memory_bytes <= memory_limit and (best is None or c.time_s < best[0]):
                best = (c.time_s, Layout(lay.rules, entries))
    return best


def adam_mlp(batch: int, io: int, hidden: int):
    """A two-matrix MLP trained with Adam (optimizer state twice the weights)."""
    import jax
    import jax.numpy as jnp

    import autolayout

    def loss(p, b):
        return jnp.sum((jax.nn.relu(b["x"] @ p["w"]) @ p["v"]) ** 2)

    f32 = jnp.float32
    params = {"w": jax.ShapeDtypeStruct((io, hidden), f32), "v": jax.ShapeDtypeStruct((hidden, io), f32)}
    b = {"x": jax.ShapeDtypeStruct((batch, io), f32)}
    return autolayout.trace(autolayout.train_step(loss, "adam", 1e-3), params,
                            autolayout.init_opt_state("adam", params), b,
                            dims=({"w": "io hidden", "v": "hidden io"}, None, {"x": "batch io"}),
                            roles=("param", "opt_state", "input"), name="adam_mlp", donate_argnums=(0, 1))


@pytest.mark.parametrize("limit_frac", [None, 0.60], ids=["no-limit", "tight-memory"])
def test_search_with_storage_stages_equals_exhaustive_minimum(limit_frac):
    """The search over layouts and per-parameter ZeRO stages finds the exhaustive optimum,
    with and without a memory limit (0.60 of data parallelism's: stage 3 needs 0.595 of it, the
    gradients' reduce-scatter transient and v all-gathered from the forward to the backward
    pass included (one all-gather for both, sharing.shared_reads); stages 1-2 0.64) that only
    stage 3 meets without losing time (splitting hidden over rows fits in 0.55, but is slower)."""
    g, mesh, hw = adam_mlp(4096, 1024, 4096), "rows:2,cols:2", "tpu-v3"
    limit = INF
    if limit_frac is not None:
        limit = int(predict(g, mesh, "batch:rows,cols", hardware=hw).memory_bytes * limit_frac)
    want = storage_oracle(g, mesh, hw, limit)
    r = search(g, mesh, hardware=hw, memory_limit=limit)
    assert_exact(r)
    assert r.cost.memory_bytes <= limit
    assert r.cost.time_s == pytest.approx(want[0], rel=1e-9, abs=r.tolerance_s)
    if limit_frac is not None:
        assert any(stage == 3 for _, _, stage in r.layout.storage), str(r.layout)


# ------------------------------------------------------- honest time-outs (issue 14)
def _layout_memories(g, mesh, hw="tpu-v3"):
    """Peak memory per device of every layout ``enumerate_layouts`` lists (exhaustive reference)."""
    return sorted({predict(g, mesh, lay, hardware=hw).memory_bytes for lay in enumerate_layouts(g, Mesh.parse(mesh))})


def _assert_fits(r, g, limit, hw="tpu-v3"):
    """The returned layout fits, by predict of the layout itself, and its status tells the truth."""
    mem = predict(g, r.mesh, r.layout, hardware=hw).memory_bytes
    assert mem == r.cost.memory_bytes <= limit, f"{r.layout} needs {mem} B > limit {limit} B"
    assert r.status in ("OPTIMAL", "FEASIBLE")
    assert r.bound_s <= r.objective_s + r.tolerance_s and r.gap >= 0
    if r.status == "OPTIMAL":
        assert r.gap == 0
    else:
        assert r.notes, "a FEASIBLE result says why"


@pytest.fixture
def no_cp_sat_solution(monkeypatch):
    """CP-SAT reports that the time limit came before it had any solution (status UNKNOWN)."""
    from autolayout.search import solver
    real = solver._status
    monkeypatch.setattr(solver, "_status", lambda code, model=None: "UNKNOWN" if model is not None else real(code))


def test_time_out_without_a_solution_returns_the_warm_start_only_if_it_fits(no_cp_sat_solution):
    g, mesh, kw = graph("moe"), "rows:2,cols:4", dict(MTF, shard_weight_update=False)  # enumerate_layouts' space
    r = search(g, mesh, memory_limit=INF, time_limit_s=1e-4, **kw)  # the warm start, labelled honestly
    assert r.status == "FEASIBLE" and any("warm start" in n for n in r.notes)
    warm_bytes = r.cost.memory_bytes
    below = [m for m in _layout_memories(g, mesh) if m < warm_bytes]
    assert below, "the test needs a warm start above the smallest memory"
    smallest = below[-1]  # the next memory level below the warm start's (exhaustive enumeration)
    r = search(g, mesh, memory_limit=warm_bytes, time_limit_s=1e-4, **kw)
    _assert_fits(r, g, warm_bytes)
    assert r.status == "FEASIBLE"
    # one level below, the warm start is moved until it fits (solver.greedy), and says so
    r = search(g, mesh, memory_limit=smallest, time_limit_s=1e-4, **kw)
    _assert_fits(r, g, smallest)
    assert r.status == "FEASIBLE" and any("warm start" in n for n in r.notes)
    # without that repair the time-out is an error that names the warm start's memory
    from autolayout.search import solver
    with pytest.MonkeyPatch.context() as mp:
        time_only = solver.greedy
        mp.setattr(solver, "greedy", lambda tables, wus, points=None, limit=0: time_only(tables, wus))
        with pytest.raises(SearchError, match=r"ran out before the search found a layout .* within memory_limit "
                                              rf"{smallest} B .* needs {warm_bytes} B\. Raise time_limit_s") as exc:
            search(g, mesh, memory_limit=smallest, time_limit_s=1e-4, **kw)
    assert exc.value.reason == "time" and isinstance(exc.value, ValueError)


def test_layout_warns_when_not_proven_optimal(no_cp_sat_solution):
    from autolayout.search import SearchWarning
    with pytest.warns(SearchWarning, match=r"status FEASIBLE: layout .* not proven fastest \(gap"):
        lay = layout(graph("mlp"), "rows:2,cols:4", memory_limit=INF, time_limit_s=1e-4)
    assert isinstance(lay, Layout)


def test_mesh_shape_search_time_out_never_over_the_limit(no_cp_sat_solution, monkeypatch):
    from autolayout.search import solver
    time_only = solver.greedy  # the warm start as the time descent alone leaves it (no repair to fit)
    monkeypatch.setattr(solver, "greedy", lambda tables, wus, points=None, limit=0: time_only(tables, wus))
    g = graph("mlp")
    hw = "cpu"  # (its meshes' warm starts differ in memory: the premise below needs that)
    warm = {str(m): search(g, m, memory_limit=INF, time_limit_s=1e-4, hardware=hw).cost.memory_bytes
            for m in mesh_shapes(8)}
    limit = sorted(warm.values())[1]  # some meshes' warm starts fit, at least one does not
    r = search(g, num_devices=8, memory_limit=limit, time_limit_s=1e-4, hardware=hw)
    _assert_fits(r, g, limit, hw)
    assert r.status == "FEASIBLE"
    assert {str(m): why for m, why in r.mesh_failures} == {m: "time" for m, b in warm.items() if b > limit} != {}
    assert {str(m) for m, t in r.meshes if t is None} == {m for m, b in warm.items() if b > limit}
    with pytest.raises(SearchError, match="no mesh shape of 8 devices has a layout found within the time limit") as e:
        search(g, num_devices=8, memory_limit=min(warm.values()) - 1, time_limit_s=1e-4, hardware=hw)
    assert e.value.reason == "time"


@pytest.mark.parametrize("fraction", [0.3, 0.6, 1.0, 2.0], ids=lambda f: f"limit-x{f}")
def test_tiny_time_budget_with_finite_limit(fraction):
    """No patching: whatever CP-SAT manages in 0.1 ms, the answer fits or is an error saying why."""
    g, mesh = graph("transformer"), "rows:2,cols:2"
    limit = int(predict(g, mesh, "batch:rows,cols", hardware="tpu-v3").memory_bytes * fraction)
    try:
        r = search(g, mesh, memory_limit=limit, time_limit_s=1e-4, remat="none")
    except SearchError as e:
        assert e.reason in ("time", "memory")
        assert ("Raise time_limit_s" if e.reason == "time" else "Raise memory_limit") in str(e)
    else:
        _assert_fits(r, g, limit)


def test_hypothesis_random_limits_and_budgets_never_over_the_limit():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    g, mesh = graph("moe"), "rows:2,cols:2"
    mems = _layout_memories(g, mesh)

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(limit=st.integers(mems[0] // 2, mems[-1] * 2), budget=st.floats(1e-4, 0.3))
    def check(limit, budget):
        try:
            r = search(g, mesh, memory_limit=limit, time_limit_s=budget, regions=False)
        except SearchError as e:
            assert e.reason in ("time", "memory")
            if e.reason == "memory":  # proven: below every layout's memory (storage sharding may go lower)
                assert limit < mems[0]
        else:
            _assert_fits(r, g, limit)

    check()


def test_overlap_rows_stay_exact_under_cp_sat_presolve():
    # A case where CP-SAT (ortools 9.15, presolve on, objective resolution 10^12) reported
    # an "OPTIMAL" objective above the value of the layout it returned; the true optimum,
    # found by enumerating every storage option of every layout with predict (the oracle
    # below), is what the search must return.
    import jax
    import jax.numpy as jnp

    from autolayout import trace, train_step, init_opt_state
    from autolayout.costmodel.hardware import Link

    def loss_fn(params, batch):
        h = jax.nn.gelu(batch["x"] @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)

    f32 = jnp.float32
    params = {"w1": jax.ShapeDtypeStruct((128, 512), f32), "b1": jax.ShapeDtypeStruct((512,), f32),
              "w2": jax.ShapeDtypeStruct((512, 64), f32)}
    batch = {"x": jax.ShapeDtypeStruct((256, 128), f32), "y": jax.ShapeDtypeStruct((256, 64), f32)}
    g = trace(train_step(loss_fn, "adam", 1e-3), params, init_opt_state("adam", params), batch,
              dims=({"w1": "features hidden", "b1": "hidden", "w2": "hidden out"}, None,
                    {"x": "batch features", "y": "batch out"}), roles=("param", "opt_state", "input"))
    cpu = get_hardware("cpu")
    hw = cpu.replace(async_collectives=True, peak_flops={"float32": 49548115707.281555, "bfloat16": 49548115707.281555},
                     efficiency=0.87, hbm_bandwidth=68126203118.92776)
    hw = hw.with_axis_link("rows", Link(3969446001.309345, 1.1536644112872505e-05, "switch"))
    hw = hw.with_axis_link("cols", Link(2399896858.791137, 6.9370068485418174e-06, "switch"))
    r = search(g, "rows:2,cols:4", hardware=hw, memory_limit=INF, remat="none", regions=False)
    assert_exact(r)
    best = min(predict(g, "rows:2,cols:4", Layout(lay.rules, [(p, ax, st) for p, ax, st in sto]), hardware=hw).time_s
               for lay in enumerate_layouts(g, Mesh.parse("rows:2,cols:4"))
               for sto in _storage_choices(g, lay))
    assert r.cost.time_s == pytest.approx(best, rel=1e-9)


def _storage_choices(g, lay):
    """Every combination of (no storage | stage s over the axes the batch uses) per parameter."""
    import itertools

    batch_axes = dict(lay.rules).get("batch", ())
    options = [None] + [(batch_axes, s) for s in (1, 2, 3)] if batch_axes else [None]
    params = [t.name for t in g.params()]
    for combo in itertools.product(options, repeat=len(params)):
        entries = [(p, o[0], o[1]) for p, o in zip(params, combo) if o is not None]
        try:
            Layout(lay.rules, entries)
        except LayoutError:  # e.g. a storage shard the layout cannot hold
            continue
        yield entries


# ------------------------------------------------------- k best layouts (issue 12.6)
def _swap_axes(lay: Layout, a: str, b: str) -> str:
    """``lay`` with mesh axes ``a`` and ``b`` exchanged (rules and storage), as a canonical string."""
    sw = {a: b, b: a}
    rules = [(d, tuple(sw.get(x, x) for x in axes)) for d, axes in lay.rules]
    storage = [(p, tuple(sw.get(x, x) for x in axes), st) for p, axes, st in lay.storage]
    return str(Layout(rules, storage).canonical())


def _sort_among(lay: Layout, symmetric: tuple) -> str:
    """``lay`` with the ``symmetric`` axes of each rule sorted among their own positions."""
    def sort(axes):
        it = iter(sorted(a for a in axes if a in symmetric))
        return tuple(next(it) if a in symmetric else a for a in axes)
    return str(Layout([(d, sort(axes)) for d, axes in lay.rules], list(lay.storage)).canonical())


def ranked_by_enumeration(g, mesh, hw, memory_limit=INF, storage=False, symmetric=()):
    """Predicted time of every distinct layout that fits, fastest first, by enumerating
    layouts (and, with ``storage``, every per-parameter storage choice of storage_oracle)
    and pricing each with predict; layouts equal up to exchanging the ``symmetric`` axes
    (globally, or among the axes that split one dim) count once."""
    mesh, hw = Mesh.parse(mesh), get_hardware(hw)
    params = [t.name for t in g.params()]
    seen, out = set(), []
    for lay in enumerate_layouts(g, mesh):
        combos = [()]
        if storage:
            choices = []
            for p in params:
                top = maximal_storage_axes(g, mesh, lay, p, hw)
                options = [None]
                for a in top:  # a stage with the same effect as a lower one is the same layout (search/wus.py)
                    effects = []
                    for s in (1, 2, 3):
                        try:
                            c = predict(g, mesh, Layout(lay.rules, [(p, a, s)]), hardware=hw)
                        except LayoutError:
                            continue
                        effect = (c.time_s, c.memory_bytes, tuple(sorted(c.memory.items())))
                        if effect not in effects:
                            effects.append(effect)
                            options.append((p, a, s))
                choices.append(options)
            combos = [tuple(c for c in combo if c is not None) for combo in itertools.product(*choices)]
        for entries in combos:
            full = Layout(lay.rules, list(entries))
            try:
                c = predict(g, mesh, full, hardware=hw)
            except LayoutError:
                continue  # e.g. stage 1 where the gradient path is not linear
            key = str(full.canonical())
            if symmetric:  # one dim over several interchangeable axes costs the same in any order
                key = min(_sort_among(Layout.parse(k), symmetric) for k in (key, _swap_axes(full, *symmetric)))
            if c.memory_bytes <= memory_limit and key not in seen:
                seen.add(key)
                out.append((c.time_s, key))
    return sorted(out)


def assert_k_best(rs, want, k):
    """The returned layouts are the k best of the enumeration, by time (ties in any order)."""
    from autolayout.search.api import best_layouts  # noqa: F401  (the function under test)
    assert len(rs) == min(k, len(want))
    assert len({str(r.layout) for r in rs}) == len(rs), "distinct layouts"
    got = [r.cost.time_s for r in rs]
    assert got == sorted(got), "fastest first"
    tol = max(r.tolerance_s for r in rs)
    assert got == pytest.approx([t for t, _ in want[:len(rs)]], rel=1e-9, abs=tol)
    for r in rs:
        assert r.status == "OPTIMAL"
        assert r.cost.time_s == pytest.approx(r.objective_s, rel=1e-9, abs=r.tolerance_s)


@pytest.mark.parametrize("name, mesh, limit_frac, k", [
    ("mlp", "rows:4,cols:2", None, 7), ("moe", "rows:2,cols:4", 0.44, 7), ("moe", "rows:4,cols:2", None, 7),
    ("moe", "rows:4,cols:2", 0.44, 7),
], ids=lambda v: str(v))
def test_best_layouts_are_the_k_best_of_the_enumeration(name, mesh, limit_frac, k):
    check_k_best(graph(name), mesh, "tpu-v3", limit_frac, k)


def check_k_best(g, mesh, hw, limit_frac, k):
    """best_layouts returns the k fastest layouts of ``g`` that the enumeration finds, under a
    memory limit of ``limit_frac`` of the data-parallel layout's memory (checked to bind), or
    with no limit where ``limit_frac`` is None."""
    from autolayout.search.api import best_layouts

    limit = INF
    if limit_frac is not None:
        limit = int(predict(g, mesh, "batch:rows,cols", hardware=hw).memory_bytes * limit_frac)
    want = ranked_by_enumeration(g, mesh, hw, limit)
    assert len(want) > k
    if limit_frac is not None:  # the limit binds: some layouts among the fastest do not fit
        everything = ranked_by_enumeration(g, mesh, hw)
        assert [t for t, _ in everything[:k]] != [t for t, _ in want[:k]]
    rs = best_layouts(g, mesh, k, hardware=hw, memory_limit=limit, shard_weight_update=False, **MTF)
    assert_k_best(rs, want, k)
    assert all(r.cost.memory_bytes <= limit for r in rs)


def test_best_layouts_count_interchangeable_axes_once():
    """On a 2x2 mesh (both axes alike) layouts equal up to exchanging rows and cols count once."""
    from autolayout.search.api import best_layouts

    g, mesh, hw, k = graph("moe"), "rows:2,cols:2", "tpu-v3", 8
    want = ranked_by_enumeration(g, mesh, hw, symmetric=("rows", "cols"))
    rs = best_layouts(g, mesh, k, hardware=hw, memory_limit=INF, shard_weight_update=False, **MTF)
    assert_k_best(rs, want, k)
    keys = {min(str(r.layout.canonical()), _swap_axes(r.layout, "rows", "cols")) for r in rs}
    assert len(keys) == k


@pytest.mark.parametrize("limit_frac", [None, 0.5], ids=["no-limit", "tight-memory"])
def test_best_layouts_with_storage_are_the_k_best_of_the_enumeration(limit_frac):
    from autolayout.search.api import best_layouts

    g, mesh, hw, k = adam_mlp(4096, 1024, 4096), "rows:4,cols:2", "tpu-v3", 6
    limit = INF
    if limit_frac is not None:
        limit = int(predict(g, mesh, "batch:rows,cols", hardware=hw).memory_bytes * limit_frac)
    want = ranked_by_enumeration(g, mesh, hw, limit, storage=True)
    rs = best_layouts(g, mesh, k, hardware=hw, memory_limit=limit)
    assert_k_best(rs, want, k)
    assert all(r.cost.memory_bytes <= limit for r in rs)
    assert any(r.layout.storage for r in rs)


def test_best_layouts_stop_when_no_other_layout_fits():
    from autolayout.search.api import best_layouts

    g, mesh, hw = graph("mlp_tiny"), "all:2", "tpu-v3"
    want = ranked_by_enumeration(g, mesh, hw)
    rs = best_layouts(g, mesh, len(want) + 3, hardware=hw, memory_limit=INF, shard_weight_update=False, **MTF)
    assert_k_best(rs, want, len(want) + 3)
    assert len(rs) == len(want) and any("no other layout" in n for n in rs[-1].notes)
    assert str(rs[0].layout) == str(search(g, mesh, hardware=hw, memory_limit=INF, shard_weight_update=False,
                                           **MTF).layout)


@pytest.mark.parametrize("k", [0, -1, 1.5, "3", True], ids=str)
def test_best_layouts_bad_k(k):
    from autolayout.search.api import best_layouts

    with pytest.raises(LayoutError, match=r"k must be a positive integer \(how many layouts\), got"):
        best_layouts(graph("mlp_tiny"), "all:2", k)


def test_best_layouts_with_regions_and_remat_beat_every_other_layout_sampled():
    """With region rules and the remat policies (too many layouts to enumerate here: 3 x 4489),
    the k best are distinct, the first is search's, and no layout of a random sample of the
    enumeration that is not among them is faster than the k-th."""
    import random

    from autolayout.remat import rematerialize
    from autolayout.search.api import best_layouts

    g, mesh, hw, k = graph("transformer"), "rows:4,cols:2", "tpu-v3", 4
    rs = best_layouts(g, mesh, k, hardware=hw, memory_limit=INF, shard_weight_update=False)
    assert len(rs) == k and len({str(r.layout.canonical()) for r in rs}) == k
    assert [r.cost.time_s for r in rs] == sorted(r.cost.time_s for r in rs)
    best = search(g, mesh, hardware=hw, memory_limit=INF, shard_weight_update=False)
    assert rs[0].cost.time_s == pytest.approx(best.cost.time_s, rel=1e-9, abs=best.tolerance_s)
    chosen = {str(r.layout.canonical()) for r in rs}
    rng = random.Random(0)
    sample = []
    for policy in ("none", "full", "dots"):
        layouts = list(enumerate_layouts(rematerialize(g, policy), Mesh.parse(mesh), regions=True))
        strong = [Layout(x) for x in ("batch:rows,cols", "batch:rows;heads:cols;d_ff:cols;vocab:cols",
                                      "batch:rows;d_ff:cols", "batch:rows;heads:cols")]
        sample += [lay.with_remat("" if policy == "none" else policy) for lay in rng.sample(layouts, 30) + strong]
    tol = max(r.tolerance_s for r in rs)
    for lay in sample:
        if str(lay.canonical()) not in chosen:
            assert predict(g, mesh, lay, hardware=hw).time_s >= rs[-1].cost.time_s - tol, str(lay)


def test_best_layouts_with_distinct_rules_are_the_k_best_rule_sets():
    """distinct="rules": the k best rule sets, each with its fastest storage sharding (enumerated)."""
    from autolayout.search.api import best_layouts

    g, mesh, hw, k = adam_mlp(4096, 1024, 4096), "rows:4,cols:2", "tpu-v3", 5
    per_rules: dict = {}
    for t, key in ranked_by_enumeration(g, mesh, hw, storage=True):
        rules = key.split("|")[0]
        per_rules[rules] = min(per_rules.get(rules, math.inf), t)
    want = sorted((t, r) for r, t in per_rules.items())
    rs = best_layouts(g, mesh, k, hardware=hw, memory_limit=INF, distinct="rules")
    assert_k_best(rs, want, k)
    assert len({str(Layout(r.layout.rules).canonical()) for r in rs}) == k
    with pytest.raises(LayoutError, match="distinct must be 'layout'"):
        best_layouts(g, mesh, k, distinct="storage")


@pytest.mark.parametrize("sizes", [[1, 1, 3, 2], [2, 1, 1], [4, 4, 1, 1, 2]], ids=["4-slots", "3-slots", "5-slots"])
def test_tie_break_weights_order_choices_lexicographically(sizes):
    """Every way to turn on at most one boolean per slot: the weighted sums order them as the
    tuples of 'slot is on' do (earlier slots first), checked by enumeration."""
    from autolayout.search.model import tie_break_weights
    w = tie_break_weights(sizes)
    choices = list(itertools.product(*[[0, 1]] * len(sizes)))
    by_sum = sorted(choices, key=lambda c: sum(wi * ci for wi, ci in zip(w, c)))
    assert by_sum == sorted(choices)
    assert len({sum(wi * ci for wi, ci in zip(w, c)) for c in choices}) == len(choices)


def test_tie_break_weights_stay_valid_for_cp_sat_on_a_large_model():
    """300 slots (a PaLM-sized model: ~80 split bits, parameters with thousands of storage
    options): the old 2^61.. weights made CP-SAT reject the model ('Possible integer overflow
    in objective'); these keep a model with those coefficients valid."""
    from ortools.sat.python import cp_model
    from autolayout.search.model import tie_break_weights
    sizes = [1] * 80 + [3000] * 220
    w = tie_break_weights(sizes)
    m = cp_model.CpModel()
    bits, coefs = [], []
    for i, (n, wi) in enumerate(zip(sizes, w)):
        vs = [m.NewBoolVar(f"b{i}_{j}") for j in range(n)]
        m.AddAtMostOne(vs)
        bits += vs
        coefs += [wi] * n
    m.Minimize(cp_model.LinearExpr.WeightedSum(bits, coefs))
    assert m.Validate() == ""
    assert w[0] > sum(w[1:])  # the first slot still outweighs everything after it


@pytest.mark.parametrize("name", ["mlp", "moe", "transformer_lm"])
def test_memory_floor_with_storage_sharding_is_a_positive_lower_bound(name):
    """With storage options the floor stays a true bound (at most the proven smallest peak,
    found by CP-SAT's memory minimisation) and is not vacuous: each option's saving is
    measured from the assignment it applies to, so without each tensor's share of the
    devices as a floor the savings took parameters below zero and the floor to 0."""
    from autolayout.search.solver import memory_floor, min_memory
    g = graph(name) if name != "transformer_lm" else models.transformer_lm(
        d_model=16, d_ff=32, heads=4, d_kv=8, n_layers=2, vocab=32, batch=8, length=8)
    tables = Tables(g, Mesh.parse("rows:2,cols:4"), get_hardware("tpu-v3"), regions=False)
    wus, _ = wus_options(tables)
    assert wus
    floor = memory_floor(tables, wus, search_points(tables))
    smallest, _, proven = min_memory(tables, wus)
    assert proven
    assert 0 < floor <= smallest
    # a tensor's local bytes are never below its share of the 8 devices: a bound by hand
    params = sum(-(-t.size // 8) * t.itemsize for t in g.tensors() if t.role == "param")
    assert floor >= params


@pytest.mark.parametrize("name", ["mlp", "moe"])
def test_memory_floor_is_below_every_layouts_peak(name):
    """The floor that lets the search prove 'nothing fits' without CP-SAT is a true lower bound:
    at most the smallest peak of the exhaustive enumeration (predict); below it the search
    says nothing fits."""
    from autolayout.search.solver import memory_floor
    g, mesh = graph(name), "rows:2,cols:4"
    tables = Tables(g, Mesh.parse(mesh), get_hardware("tpu-v3"), regions=False)
    floor = memory_floor(tables, [], search_points(tables))
    smallest = _layout_memories(g, mesh)[0]
    assert 0 < floor <= smallest
    with pytest.raises(SearchError, match="below the smallest peak memory") as exc:  # proven by the floor
        search(g, mesh, hardware="tpu-v3", memory_limit=floor - 1, shard_weight_update=False, **MTF)
    assert exc.value.reason == "memory"


@pytest.mark.parametrize("name", ["transformer", "mlp_tiny"])
def test_draw_layouts_rematerialise_every_third_where_a_backward_scan_is(name):
    """``draw_layouts(..., remat_every=3)`` (``benchmarks/memory_vs_xla.py --random``) gives the
    2nd, 5th, ... draw a remat policy, ``full`` and ``dots`` in turn, in a step whose forward scan
    a backward scan reads (``remat.remat_pairs``), and none elsewhere; the draws are otherwise the
    ones without it, and every one plans."""
    import random

    from autolayout.costmodel.plan import plan
    from autolayout.search.space import draw_layouts

    g = graph(name)
    plain = draw_layouts(g, "data:2,model:4", 7, random.Random(3), shard_every=2, stage=3)
    drawn = draw_layouts(g, "data:2,model:4", 7, random.Random(3), shard_every=2, stage=3, remat_every=3)
    want = ["", "full", "", "", "dots", "", ""] if name == "transformer" else [""] * len(plain)
    assert [lay.remat for lay in drawn] == want
    assert [lay.with_remat(None) for lay in drawn] == plain
    for lay in drawn:
        plan(g, "data:2,model:4", lay)
