"""Alpha-beta collective times against hand-derived references."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autolayout.costmodel.collectives import (
    KINDS,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    bytes_on_wire,
    collective_time,
    normalize_kind,
    reduce_scatter_time,
)
from autolayout.costmodel.hardware import Link
from autolayout.costmodel.profiles import get_hardware

ICI = Link(bandwidth=1e11, latency=1e-6)  # ring, like a TPU torus axis
NVL = Link(bandwidth=1e11, latency=1e-6, topology="switch")
DCN = Link(bandwidth=1e10, latency=1e-5)
SINGLE = {
    "all-reduce": all_reduce_time,
    "all-gather": all_gather_time,
    "reduce-scatter": reduce_scatter_time,
    "all-to-all": all_to_all_time,
}

# (kind, operand bytes, n, link, expected seconds worked out by hand)
HAND = [
    # 2 (n-1)/n V/B + 2 (n-1) a = 2*7/8*1e9/1e11 + 14e-6
    ("all-reduce", 1e9, 8, ICI, 0.0175 + 14e-6),
    # (n-1)/n V/B + (n-1) a with V = 8 * 1e8 gathered
    ("all-gather", 1e8, 8, ICI, 7 / 8 * 8e8 / 1e11 + 7e-6),
    ("reduce-scatter", 1e9, 8, ICI, 0.00875 + 7e-6),
    # n=2: one exchange each way
    ("all-reduce", 4e9, 2, ICI, 0.04 + 2e-6),
    # switch all-to-all (Thakur pairwise): (n-1)/n L/B + (n-1) a
    ("all-to-all", 8e9, 8, NVL, 0.07 + 7e-6),
    # ring n=4: chunks of L/4; per direction one distance-1 chunk + half the
    # antipodal chunk over 2 hops = L/4 + L/4 = L/2 at one-way B/2 -> L/B
    ("all-to-all", 4e9, 4, ICI, 0.04 + 3e-6),
    # ring n=3: one L/3 chunk per direction at B/2 -> 2L/(3B)
    ("all-to-all", 3e9, 3, ICI, 0.02 + 2e-6),
    # ring n=2: the single L/2 chunk split over both links -> L/(2B)
    ("all-to-all", 2e9, 2, ICI, 0.01 + 1e-6),
    # real profile: 8xH100 NVLink all-reduce of 1 GB: 2*7/8*1e9/450e9 + 14 * 1.9 us
    ("all-reduce", 1e9, 8, get_hardware("h100").link, 1.75e9 / 450e9 + 14 * 1.9e-6),
]


@pytest.mark.parametrize(
    ("kind", "nbytes", "n", "link", "expected"),
    HAND,
    ids=[f"{k}-n{n}-{l.topology}-{b:.0e}B" for k, b, n, l, _ in HAND],
)
def test_single_axis_matches_hand_formula(kind, nbytes, n, link, expected):
    assert SINGLE[kind](nbytes, n, link) == pytest.approx(expected, rel=1e-12)
    assert collective_time(kind, nbytes, [(n, link)]) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_group_of_one_is_free(kind):
    assert SINGLE[kind](1e9, 1, ICI) == 0.0
    assert collective_time(kind, 1e9, [(1, ICI), (1, DCN)]) == 0.0
    assert collective_time(kind, 1e9, []) == 0.0
    assert bytes_on_wire(kind, 1e9, 1) == 0.0


def test_two_axis_all_reduce_is_hand_phase_sum():
    v = 8e9
    # reduce-scatter over 4 on V, all-reduce over 2 on V/4, all-gather over 4 of the V/4 shard
    rs = 3 / 4 * v / 1e11 + 3e-6
    ar = 2 * 1 / 2 * (v / 4) / 1e10 + 2 * 1e-5
    ag = 3 * (v / 4) / 1e11 + 3e-6
    assert collective_time("all-reduce", v, [(4, ICI), (2, DCN)]) == pytest.approx(rs + ar + ag, rel=1e-12)


def test_two_axis_all_gather_and_reduce_scatter_hand_sums():
    s = 1e8
    # the slow axis gathers first, on the shard s; then the fast axis gathers the 2s result
    ag = 1 * s / 1e10 + 1e-5 + 3 * (2 * s) / 1e11 + 3e-6
    assert collective_time("all-gather", s, [(4, ICI), (2, DCN)]) == pytest.approx(ag, rel=1e-12)
    v = 8e9
    rs = 3 / 4 * v / 1e11 + 3e-6 + 1 / 2 * (v / 4) / 1e10 + 1e-5
    assert collective_time("reduce-scatter", v, [(4, ICI), (2, DCN)]) == pytest.approx(rs, rel=1e-12)
    # all-to-all: every phase moves the whole local buffer
    a2a = all_to_all_time(v, 4, ICI) + all_to_all_time(v, 2, DCN)
    assert collective_time("all-to-all", v, [(4, ICI), (2, DCN)]) == pytest.approx(a2a, rel=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_hierarchical_order_does_not_depend_on_axis_order(kind):
    # the slow axis carries the least data whichever way the mesh lists the axes
    v = 8e9
    assert collective_time(kind, v, [(2, DCN), (4, ICI)]) == pytest.approx(
        collective_time(kind, v, [(4, ICI), (2, DCN)]), rel=1e-12)


@pytest.mark.parametrize(
    ("kind", "slow_bytes"),
    [("all-reduce", 8e9 / 8), ("reduce-scatter", 8e9 / 8), ("all-gather", 8e9 / 8)],
    ids=["all-reduce", "reduce-scatter", "all-gather"])
def test_slow_axis_carries_one_nth_of_the_payload(kind, slow_bytes):
    # 8 fast devices per node, 2 nodes; the DCN phase alone (infinitely fast ICI) must move
    # 1/8 of the 8e9-byte tensor per device, as reduce-scatter fast -> all-reduce slow ->
    # all-gather fast does: all-reduce 2·(1/2)·V/8, reduce-scatter (1/2)·V/8, all-gather of
    # the V/16 shard over 2 moves V/16 ... here (n-1)·S with S = V/8/2.
    free = Link(1e30, 0.0)
    dcn = Link(1e10, 0.0)
    operand = 8e9 / 16 if kind == "all-gather" else 8e9
    t = collective_time(kind, operand, [(2, dcn), (8, free)])
    factor = {"all-reduce": 2 * (2 - 1) / 2, "reduce-scatter": (2 - 1) / 2, "all-gather": (2 - 1) / 2}[kind]
    assert t == pytest.approx(factor * slow_bytes / 1e10, rel=1e-9)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["first", "last"])
def test_hierarchical_equals_single_axis_when_other_axis_is_one(kind, where):
    groups = [(1, DCN), (8, ICI)] if where == "first" else [(8, ICI), (1, DCN)]
    assert collective_time(kind, 3e9, groups) == pytest.approx(SINGLE[kind](3e9, 8, ICI), rel=1e-12)


def test_ring_all_to_all_is_quarter_of_all_gather_at_scale():
    # scaling-book: on a bidirectional ring an AllToAll costs ~1/4 of an AllGather
    # of an array of the same total size (n * L).
    n, local = 64, 1e9
    ratio = all_to_all_time(local, n, Link(1e11, 0.0)) / all_gather_time(local, n, Link(1e11, 0.0))
    assert ratio == pytest.approx(0.25, rel=0.02)


def test_switch_all_to_all_is_cheaper_than_ring():
    assert all_to_all_time(1e9, 8, NVL) < all_to_all_time(1e9, 8, ICI)


@pytest.mark.parametrize(
    ("kind", "n", "expected"),
    [("all-reduce", 8, 2 * 7 / 8 * 1e9), ("reduce-scatter", 8, 7 / 8 * 1e9), ("all-gather", 8, 7e9),
     ("all-to-all", 4, 3 / 4 * 1e9)],
    ids=["all-reduce", "reduce-scatter", "all-gather", "all-to-all"],
)
def test_bytes_on_wire(kind, n, expected):
    assert bytes_on_wire(kind, 1e9, n) == pytest.approx(expected)


@pytest.mark.parametrize("spelling", ["AllReduce", "all_reduce", "all-reduce", "ALL REDUCE"])
def test_kind_spellings(spelling):
    assert normalize_kind(spelling) == "all-reduce"
    assert collective_time(spelling, 1e9, [(8, ICI)]) == all_reduce_time(1e9, 8, ICI)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: collective_time("broadcast", 1.0, [(2, ICI)]), "Unknown collective kind"),
        (lambda: all_reduce_time(-1.0, 2, ICI), "operand_bytes"),
        (lambda: all_gather_time(1.0, 0, ICI), "positive integer"),
        (lambda: collective_time("all-reduce", 1.0, [(2.5, ICI)]), "positive integer"),
    ],
    ids=["bad-kind", "negative-bytes", "n=0", "fractional-n"],
)
def test_invalid_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_groups_must_hold_links():
    with pytest.raises(TypeError, match="Link"):
        collective_time("all-reduce", 1.0, [(2, 1e11)])


# ---------------------------------------------------------------- properties
links = st.builds(
    Link,
    bandwidth=st.floats(1e6, 1e13),
    latency=st.floats(0, 1e-4),
    topology=st.sampled_from(["ring", "switch"]),
)
sizes = st.floats(0, 1e12)
group_sizes = st.integers(1, 64)


@given(kind=st.sampled_from(KINDS), a=sizes, b=sizes, n=group_sizes, link=links)
def test_monotone_in_bytes(kind, a, b, n, link):
    lo, hi = sorted((a, b))
    assert 0.0 <= SINGLE[kind](lo, n, link) <= SINGLE[kind](hi, n, link)


@given(kind=st.sampled_from(KINDS), v=sizes, link=links)
def test_zero_for_n_equal_one(kind, v, link):
    assert SINGLE[kind](v, 1, link) == 0.0


@given(v=sizes, n=group_sizes, link=links)
def test_all_reduce_is_reduce_scatter_plus_all_gather_of_shard(v, n, link):
    expected = reduce_scatter_time(v, n, link) + all_gather_time(v / n, n, link)
    assert all_reduce_time(v, n, link) == pytest.approx(expected, rel=1e-9, abs=1e-300)


@given(kind=st.sampled_from(["all-reduce", "reduce-scatter"]), v=sizes, n1=group_sizes, n2=group_sizes, link=links)
def test_more_devices_never_cheaper_for_fixed_tensor(kind, v, n1, n2, link):
    lo, hi = sorted((n1, n2))
    assert SINGLE[kind](v, lo, link) <= SINGLE[kind](v, hi, link) * (1 + 1e-12)


@given(
    kind=st.sampled_from(["all-reduce", "all-gather", "reduce-scatter"]),
    v=st.floats(1, 1e12),
    dims=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    bw=st.floats(1e6, 1e13),
)
def test_phased_equals_flat_ring_with_equal_links_and_no_latency(kind, v, dims, bw):
    link = Link(bw, 0.0)
    total = 1
    for d in dims:
        total *= d
    flat = SINGLE[kind](v, total, link)
    assert collective_time(kind, v, [(d, link) for d in dims]) == pytest.approx(flat, rel=1e-9, abs=1e-300)
