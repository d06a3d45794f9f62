"""Alpha-beta time of collectives along one or several mesh axes.

Conventions
-----------
* ``operand_bytes`` is the size of the collective's *input on one device*:
  the local tensor for all-reduce, reduce-scatter and all-to-all; the local
  shard for all-gather (the gathered result is ``n`` times larger).
* ``n`` is the group size (devices along the axis). ``n == 1`` costs 0.
* A :class:`~autolayout.costmodel.hardware.Link` gives ``B`` (``bandwidth``:
  effective per-device ring bandwidth, see hardware.py) and ``alpha``
  (``latency``: seconds per step).

Single-axis formulas (ring algorithms, ``V`` = full, un-scattered size)
-----------------------------------------------------------------------
* all-gather, ``V = n * operand``:  ``(n-1)/n * V / B + (n-1) * alpha``
* reduce-scatter, ``V = operand``:  ``(n-1)/n * V / B + (n-1) * alpha``
* all-reduce, ``V = operand``:     ``2 (n-1)/n * V / B + 2 (n-1) * alpha``

These are the ring costs of Thakur, Rabenseifner & Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1) 2005 (also the
comments of MPICH's allgather_intra_ring.c: "Cost = (p-1).alpha +
n.((p-1)/p).beta"; all-reduce = reduce-scatter + all-gather, Rabenseifner),
and the bus-bandwidth factors of NVIDIA/nccl-tests doc/PERFORMANCE.md:
``2(n-1)/n`` for AllReduce, ``(n-1)/n`` for AllGather and ReduceScatter, "S
is the size in bytes of the total array". The step counts ``2(n-1)`` and
``n-1`` are the ``nsteps`` NCCL's own tuning model multiplies its per-step
latency by (NVIDIA/nccl src/graph/tuning.cc). The reduction arithmetic
(MPICH's gamma term) is not charged: it is memory-bound and overlapped.

all-to-all (``L = operand``, each device keeps ``L/n`` and sends ``L/n`` to
every other device) depends on the link topology:

* ``"switch"`` (NVSwitch, fat tree): pairwise exchange, every device sends
  ``(n-1)/n * L`` directly: ``(n-1)/n * L / B + (n-1) * alpha``. Thakur et
  al. 2005 / MPICH alltoall: "Cost = (p-1).alpha + n.beta where n is the
  total amount of data a process needs to send"; the scaling-book GPU
  chapter gives the same ``B_total (N-1) / (W N^2)``.
* ``"ring"`` (TPU torus axis): chunks travel the shorter way round a
  bidirectional ring and forward through intermediate chips. The busiest
  directed link carries ``sum of hop distances`` chunks of ``L/n``; with the
  antipodal chunk (even ``n``) split over both directions this is ``n^2/8``
  chunks for even ``n`` and ``(n^2-1)/8`` for odd ``n``, at the one-way rate
  ``B/2``: ``T = (n^2 - n mod 2) / (4 n) * L / B``. For large ``n`` this is
  ``n L / (4 B)``, a quarter of an all-gather of the same total ``n L``, as
  in the scaling-book sharding chapter ("an AllToAll ... is actually cheaper
  than an allgather (by a factor of 1/4)" on bidirectional rings,
  https://jax-ml.github.io/scaling-book/sharding/). Latency ``(n-1) alpha``
  as for the pairwise exchange (``n-1`` shift steps).

In-process devices (``topology="in-process"``: XLA:CPU's virtual devices, threads of
one process) move no data over a wire: XLA's in-process communicator runs every
collective as one *rendezvous* of its group — the participants meet, each computes its
part of the result from the others' buffers in shared memory, and each waits for all
to finish (openxla/xla ``xla/backends/cpu/collectives/in_process_communicator.cc``,
``OpParticipants``; an all-reduce that XLA's all-reduce combiner merged still runs one
rendezvous per buffer, ``xla/backends/cpu/runtime/all_reduce_thunk.cc``). There are no
ring steps, so the latency does not depend on the kind: an all-reduce costs what a
reduce-scatter or an all-gather costs, not twice (so weight-update sharding, which
turns one all-reduce into a reduce-scatter and an all-gather, pays one more
rendezvous). What the rendezvous waits for grows with the group: measured on 8 virtual
CPU devices sharing 2 cores (``benchmarks/calibrate_validate.py --collectives``), a
1 KiB collective took 40, 72 and 113 us for groups of 2, 4 and 8, every kind alike
within 15%, and one over two axes (2 x 4) as one over a single axis of 8: ``ceil(log2
n)`` rounds of ``alpha`` (:func:`latency_steps`). The bytes are priced with the ring
factors above (each device reads or writes about the full buffer either way;
``B`` is fitted on them).

Several mesh axes: phase by axis, see :func:`collective_time`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from autolayout.costmodel.hardware import IN_PROCESS, RING, SWITCH, Link

ALL_REDUCE = "all-reduce"
ALL_GATHER = "all-gather"
REDUCE_SCATTER = "reduce-scatter"
ALL_TO_ALL = "all-to-all"
KINDS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL)


def normalize_kind(kind: str) -> str:
    """``"AllReduce"``, ``"all_reduce"``, ``"all-reduce"`` -> ``"all-reduce"``.

    >>> normalize_kind("AllGather")
    'all-gather'
    """
    key = "".join(ch for ch in kind.lower() if ch not in "-_ ")
    for k in KINDS:
        if k.replace("-", "") == key:
            return k
    raise ValueError(f"Unknown collective kind {kind!r}; expected one of {', '.join(KINDS)}")


def _check(operand_bytes: float, n: int) -> None:
    if operand_bytes < 0:
        raise ValueError(f"operand_bytes must be >= 0, got {operand_bytes}")
    if int(n) != n or n < 1:
        raise ValueError(f"group size n must be a positive integer, got {n}")


def latency_steps(kind: str, n: int, topology: str) -> int:
    """How many ``alpha`` one collective of ``kind`` over ``n`` devices waits: the ring
    algorithms' steps (``2 (n-1)`` for all-reduce, ``n-1`` for the others) on ``"ring"``
    and ``"switch"`` links; ``ceil(log2 n)`` rounds of one rendezvous, whatever the kind,
    on ``"in-process"`` links (see the module docstring).

    >>> latency_steps("all-reduce", 4, "switch"), latency_steps("all-reduce", 4, "in-process")
    (6, 2)
    >>> latency_steps("reduce-scatter", 8, "ring"), latency_steps("reduce-scatter", 8, "in-process")
    (7, 3)
    """
    kind = normalize_kind(kind)
    _check(0, n)
    if n == 1:
        return 0
    if topology == IN_PROCESS:
        return math.ceil(math.log2(n) - 1e-12)
    if topology not in (RING, SWITCH):  # Link validates its topology; this guards future additions.
        raise ValueError(f"no latency model for topology {topology!r}")
    return 2 * (n - 1) if kind == ALL_REDUCE else n - 1


def reduce_scatter_time(operand_bytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter of the local ``operand_bytes`` over ``n`` devices.

    ``(n-1)/n * V / B + (n-1) * alpha`` with ``V = operand_bytes``.

    >>> reduce_scatter_time(8e9, 8, Link(bandwidth=1e11, latency=0.0))
    0.07
    """
    _check(operand_bytes, n)
    if n == 1:
        return 0.0
    return (n - 1) / n * operand_bytes / link.bandwidth + latency_steps(REDUCE_SCATTER, n, link.topology) * link.latency


def all_gather_time(operand_bytes: float, n: int, link: Link) -> float:
    """Ring all-gather of a local shard of ``operand_bytes`` over ``n`` devices.

    ``(n-1)/n * V / B + (n-1) * alpha`` with ``V = n * operand_bytes`` (the
    gathered size), i.e. ``(n-1)`` steps each forwarding one shard.

    >>> all_gather_time(1e9, 8, Link(bandwidth=1e11, latency=0.0))
    0.07
    """
    _check(operand_bytes, n)
    if n == 1:
        return 0.0
    return (n - 1) * operand_bytes / link.bandwidth + latency_steps(ALL_GATHER, n, link.topology) * link.latency


def all_reduce_time(operand_bytes: float, n: int, link: Link) -> float:
    """Ring all-reduce (reduce-scatter then all-gather) of the local tensor.

    ``2 (n-1)/n * V / B + 2 (n-1) * alpha`` with ``V = operand_bytes``.

    >>> all_reduce_time(8e9, 8, Link(bandwidth=1e11, latency=0.0))
    0.14
    """
    _check(operand_bytes, n)
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * operand_bytes / link.bandwidth + latency_steps(ALL_REDUCE, n, link.topology) * link.latency


def all_to_all_time(operand_bytes: float, n: int, link: Link) -> float:
    """All-to-all of the local ``operand_bytes`` over ``n`` devices.

    Switch links: ``(n-1)/n * L / B``; ring links: ``(n^2 - n mod 2)/(4n) * L / B``
    (see the module docstring); both plus ``(n-1) * alpha``.

    >>> all_to_all_time(8e9, 8, Link(bandwidth=1e11, latency=0.0, topology="switch"))
    0.07
    >>> all_to_all_time(8e9, 8, Link(bandwidth=1e11, latency=0.0, topology="ring"))
    0.16
    """
    _check(operand_bytes, n)
    if n == 1:
        return 0.0
    if link.topology in (SWITCH, IN_PROCESS):  # in-process: each device copies its L/n chunks to the others
        factor = (n - 1) / n
    elif link.topology == RING:
        factor = (n * n - n % 2) / (4 * n)
    else:  # Link validates its topology; this guards future additions.
        raise ValueError(f"no all-to-all model for topology {link.topology!r}")
    return factor * operand_bytes / link.bandwidth + latency_steps(ALL_TO_ALL, n, link.topology) * link.latency


_SINGLE_AXIS = {
    ALL_REDUCE: all_reduce_time,
    ALL_GATHER: all_gather_time,
    REDUCE_SCATTER: reduce_scatter_time,
    ALL_TO_ALL: all_to_all_time,
}


def collective_time(kind: str, operand_bytes: float, groups: Sequence[tuple[int, Link]]) -> float:
    """Time of a collective spanning several mesh axes, phased axis by axis, the slow
    axes carrying the least data (hierarchical collectives).

    ``groups`` lists ``(axis size, link)`` for each mesh axis the collective spans.
    Axes of size 1 are skipped. The phases run in the order that keeps the payload on
    slow links smallest — what NCCL's hierarchical algorithms and XLA's multi-slice
    collectives do (reduce-scatter inside the node/slice, all-reduce across, all-gather
    inside; scaling-book GPU chapter, "How to parallelize a Transformer for training"
    on multi-slice DCN). With ``n_i`` the sizes, faster links (larger bandwidth) first
    where the payload shrinks, last where it grows; equal links keep the given order:

    * reduce-scatter (operand = local tensor ``V``): scatter over the fastest axis on
      ``V``, then the next on ``V / n_1``, ...: the slowest axis sees the smallest shard;
    * all-gather (operand = local shard ``S``): gather over the slowest axis first (on
      ``S``), then faster ones on the grown result;
    * all-reduce: reduce-scatter over every axis but the slowest (fastest first),
      all-reduce over the slowest on ``V / (n_1 ... n_{k-1})``, then all-gather back
      (reduce-scatter fast → all-reduce slow → all-gather fast);
    * all-to-all (operand = local ``L``): dimension by dimension, an all-to-all of the
      whole local buffer along each axis in turn; every phase moves ``L``.

    With equal links the bandwidth term equals one flat ring over ``prod(n_i)`` devices.

    On ``"in-process"`` links the collective is one rendezvous of all ``prod(n_i)``
    devices however it is phased: its latency is ``sum_i ceil(log2 n_i) * alpha_i`` once
    (``ceil(log2 prod(n_i)) * alpha`` for equal links and power-of-two sizes), and the
    phases add only their bytes.

    >>> ici, dcn = Link(1e11, 0.0), Link(1e10, 0.0)
    >>> round(collective_time("all-reduce", 8e9, [(2, dcn), (4, ici)]), 6)
    0.32
    """
    kind = normalize_kind(kind)
    for size, link in groups:
        _check(operand_bytes, size)
        if not isinstance(link, Link):
            raise TypeError(f"groups must hold (int, Link) pairs, got a {type(link).__name__}")
    phases = [(int(size), link) for size, link in groups if size > 1]
    if not phases:
        return 0.0
    # in-process: one rendezvous for the whole collective (latency once), the phases' bytes
    rendezvous = sum(latency_steps(kind, n, IN_PROCESS) * link.latency for n, link in phases
                     if link.topology == IN_PROCESS)
    if rendezvous:
        phases = [(n, dataclasses.replace(link, latency=0.0) if link.topology == IN_PROCESS else link)
                  for n, link in phases]
    return rendezvous + _phased(kind, operand_bytes, phases)


def _phased(kind: str, operand_bytes: float, phases: list[tuple[int, Link]]) -> float:
    """:func:`collective_time` of ``phases`` (axes of size > 1), phase by phase."""
    fast_first = sorted(phases, key=lambda p: -p[1].bandwidth)  # stable: equal links keep order
    if kind == ALL_GATHER:
        total, size_now = 0.0, float(operand_bytes)
        for n, link in reversed(fast_first):
            total += all_gather_time(size_now, n, link)
            size_now *= n
        return total
    if kind == REDUCE_SCATTER:
        total, size_now = 0.0, float(operand_bytes)
        for n, link in fast_first:
            total += reduce_scatter_time(size_now, n, link)
            size_now /= n
        return total
    if kind == ALL_TO_ALL:
        return sum(all_to_all_time(operand_bytes, n, link) for n, link in phases)
    # all-reduce: RS down the fast axes, AR on the slowest, AG back up.
    *outer, (n_last, link_last) = fast_first
    total, size_now = 0.0, float(operand_bytes)
    for n, link in outer:
        total += reduce_scatter_time(size_now, n, link)
        size_now /= n
    total += all_reduce_time(size_now, n_last, link_last)
    for n, link in reversed(outer):
        total += all_gather_time(size_now, n, link)
        size_now *= n
    return total


def bytes_on_wire(kind: str, operand_bytes: float, n: int) -> float:
    """Bytes one device sends for a single-axis collective, for reporting.

    * all-gather: ``(n-1) * operand`` (its shard to every other device, as
      forwarded around the ring);
    * reduce-scatter: ``(n-1)/n * operand``;
    * all-reduce: ``2 (n-1)/n * operand``;
    * all-to-all: ``(n-1)/n * operand``, the device's own payload that
      leaves it (on a ring, forwarding others' chunks adds to the link load
      but is not counted here, so the figure is topology-independent).

    >>> bytes_on_wire("all-reduce", 8e9, 8)
    14000000000.0
    """
    kind = normalize_kind(kind)
    _check(operand_bytes, n)
    if n == 1:
        return 0.0
    if kind == ALL_GATHER:
        return float((n - 1) * operand_bytes)
    if kind == ALL_REDUCE:
        return 2 * (n - 1) / n * operand_bytes
    return (n - 1) / n * operand_bytes
