"""``costmodel.plan.compact_layout``: a layout's storage part written with ``*``, held to the
layout it came from by ``plan`` and ``predict`` (the shards, time, memory and collectives)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autolayout import models
from autolayout.core import Layout, LayoutError
from autolayout.costmodel import predict
from autolayout.costmodel.plan import compact_layout, plan

MESH = "rows:2,cols:4"
LM = dict(d_model=8, d_ff=16, heads=4, d_kv=4, n_layers=2, vocab=16, batch=8, length=4)
LM_PARAMS = ["embed", "layers/ln1_bias", "layers/ln1_scale", "layers/ln2_bias", "layers/ln2_scale", "layers/w1",
             "layers/w2", "layers/wk", "layers/wo", "layers/wq", "layers/wv", "ln_f_bias", "ln_f_scale", "pos",
             "softmax"]


def _same_plan(graph, explicit: str, short: Layout) -> None:
    """``short`` stores, times and sizes every tensor as ``explicit`` does."""
    assert plan(graph, MESH, short).shards == plan(graph, MESH, explicit).shards
    a, b = predict(graph, MESH, explicit), predict(graph, MESH, short)
    assert (a.time_s, a.memory_bytes, a.collectives) == (b.time_s, b.memory_bytes, b.collectives)


def _lm_layout(rules: str, entry: str, others: dict[str, str]) -> str:
    return rules + "|" + ";".join(f"{p}:{others.get(p, entry)}" for p in LM_PARAMS)


CASES = [  # (graph, explicit layout, the shorter one written by hand)
    pytest.param(lambda: models.mlp(64, 32, 128), "batch:rows,cols|w:rows,cols@3;v:rows,cols@3;bias:rows,cols",
                 "batch:rows,cols|*:rows,cols@3;bias:rows,cols", id="mlp-zero3-bias-zero1"),
    pytest.param(lambda: models.transformer_lm(**LM),
                 _lm_layout("batch:rows;heads:cols;d_ff:cols", "rows@3",
                            {p: "rows@2" for p in LM_PARAMS if "ln" in p}),
                 "batch:rows;heads:cols;d_ff:cols|*:rows@3;layers/ln1_bias:rows@2;layers/ln1_scale:rows@2;"
                 "layers/ln2_bias:rows@2;layers/ln2_scale:rows@2;ln_f_bias:rows@2;ln_f_scale:rows@2",
                 id="transformer-fsdp-norms-zero2"),
    pytest.param(lambda: models.transformer_lm(**LM),
                 _lm_layout("batch:rows,cols", "rows,cols@3", {}) + ";remat=full",
                 "batch:rows,cols|*:rows,cols@3;remat=full", id="transformer-fsdp-every-param"),
    pytest.param(lambda: models.mlp(64, 32, 128), "batch:rows,cols|w:rows,cols@3;v:rows,cols@3",
                 "batch:rows,cols|*:rows,cols@3;bias:-", id="mlp-zero3-bias-whole"),
    pytest.param(lambda: models.transformer_lm(**LM),
                 _lm_layout("batch:rows,cols", "rows,cols@3", {"pos": "rows@2"}).replace(";ln_f_scale:rows,cols@3", ""),
                 "batch:rows,cols|*:rows,cols@3;pos:rows@2;ln_f_scale:-", id="transformer-fsdp-one-norm-whole"),
]


@pytest.mark.parametrize("make,explicit,expected", CASES)
def test_compact_layout_writes_the_most_shared_entry_once(make, explicit, expected):
    g = make()
    short = compact_layout(g, MESH, explicit)
    assert str(short) == expected
    _same_plan(g, explicit, short)


@pytest.mark.parametrize("make,explicit", [
    (lambda: models.mlp(64, 32, 128), "batch:rows,cols|w:rows,cols@3;v:rows@3;bias:cols"),  # nothing shared
    (lambda: models.mlp(64, 32, 128), "batch:rows,cols|*:rows,cols@3;bias:rows,cols"),  # written with '*' already
    (lambda: models.mlp(64, 32, 128), "batch:rows,cols"),  # nothing stored sharded
    # two of the transformer's 15 parameters: '*' and 13 entries 'p:-' would be longer
    (lambda: models.transformer_lm(**LM), "batch:rows,cols|layers/w1:rows,cols@3;layers/w2:rows,cols@3"),
], ids=["nothing-shared", "has-a-star", "no-storage", "star-would-be-longer"])
def test_compact_layout_keeps_a_layout_no_star_entry_shortens(make, explicit):
    assert compact_layout(make(), MESH, explicit) == Layout(explicit)


def test_a_star_entry_without_whole_entries_would_change_the_plan():
    """``bias:-`` is needed: written with ``*`` alone, the mlp's ZeRO-3 layout above also stores
    the bias sharded, 4 bytes * 128 * 7/8 less of it per device."""
    g = models.mlp(64, 32, 128)
    named = predict(g, MESH, "batch:rows,cols|w:rows,cols@3;v:rows,cols@3")
    star = predict(g, MESH, "batch:rows,cols|*:rows,cols@3")
    assert named.memory["params"] - star.memory["params"] == 4 * 128 * 7 // 8
    whole = predict(g, MESH, "batch:rows,cols|*:rows,cols@3;bias:-")
    assert (whole.time_s, whole.memory_bytes) == (named.time_s, named.memory_bytes)


def test_compact_layout_rejects_an_invalid_layout():
    with pytest.raises(LayoutError, match="'nope'"):
        compact_layout(models.mlp(64, 32, 128), MESH, "batch:rows|nope:rows")


_LM_GRAPH = models.transformer_lm(**LM)


_ENTRY = st.tuples(st.sampled_from(["rows", "cols", "rows,cols"]), st.sampled_from([1, 2, 3]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ENTRY, st.lists(st.one_of(st.none(), _ENTRY), min_size=len(LM_PARAMS), max_size=len(LM_PARAMS)),
       st.sets(st.sampled_from(LM_PARAMS), max_size=3))
def test_compact_layout_plans_as_the_layout_does(shared, choice, unsharded):
    """Random storage of every parameter of a data-parallel transformer (an entry many of them
    share, else a subset of the batch's axes at any stage; ``unsharded`` stored whole): the
    shorter layout plans, times and sizes exactly as the named one."""
    entries = [f"{p}:{axes}" + (f"@{stage}" if stage > 1 else "")
               for p, (axes, stage) in zip(LM_PARAMS, [c or shared for c in choice]) if p not in unsharded]
    explicit = "batch:rows,cols" + ("|" + ";".join(entries) if entries else "")
    short = compact_layout(_LM_GRAPH, MESH, explicit)
    assert len(str(short)) <= len(explicit)
    _same_plan(_LM_GRAPH, explicit, short)
