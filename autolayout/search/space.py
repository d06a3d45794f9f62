"""The layout space: which dims may go on which mesh axes, and what a valid layout is.

A layout assigns every non-loop dim a set of mesh axes (listed in mesh order).
It is *valid* on a graph when (DESIGN §1, §5):

* **divisibility** — each dim's size is divisible by the product of its axes;
* **legality** — no tensor has two dims on one mesh axis (paper §8.5);
* **check_op** — no reducing op (einsum/reduce/gather/scatter) has two dims on
  one mesh axis (``costmodel.rules.check_op``).

Legality and check_op are both *pairwise*: dims ``d1, d2`` conflict when some
tensor, or some reducing op, has both. A layout is valid iff it is divisible
and no axis carries two conflicting dims. :class:`Space` precomputes the
conflict graph and each dim's allowed axis subsets; :meth:`Space.assignments`
lists the valid restrictions of layouts to a set of dims (the ``a`` of the
``y[c, a]`` one-hots), and :func:`enumerate_layouts` walks every valid layout
(the exhaustive oracle).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

from autolayout.core import Layout, Mesh
from autolayout.costmodel.plan import REDUCING, unsplittable
from autolayout.graph import Graph

__all__ = ["Space", "enumerate_layouts", "conflict_groups"]

# An assignment of a tuple of dims: one tuple of mesh axes (mesh order) per dim.
Assignment = tuple[tuple[str, ...], ...]


def conflict_groups(graph: Graph) -> list[frozenset[str]]:
    """Maximal sets of non-loop dims that must sit on pairwise different mesh axes.

    One set per tensor (its dims, paper §8.5) and per reducing op (all its dims,
    ``check_op``); sets contained in another are dropped.
    """
    loop = graph.loop_dims
    groups: set[frozenset[str]] = set()
    for op in graph.ops():
        shapes = [op.output.shape, *op.input_shapes]
        for shape in shapes:
            groups.add(frozenset(d.name for d in shape) - loop)
        if op.kind in REDUCING:
            groups.add(frozenset(d.name for d in op.dims) - loop)
    groups = {g for g in groups if len(g) >= 2}
    maximal = [g for g in groups if not any(g < h for h in groups)]
    return sorted(maximal, key=lambda g: sorted(g))


class Space:
    """Valid per-dim axis choices of ``graph`` on ``mesh``.

    ``axes`` are the mesh axes the search may use: all of them for the
    enumerator (``include_trivial=True``), only axes of size > 1 for the search
    (splitting over a size-1 axis changes nothing). ``dims`` are the non-loop
    dims in ``graph.dims`` order.
    """

    def __init__(self, graph: Graph, mesh: Mesh, *, include_trivial: bool = False) -> None:
        self.graph, self.mesh = graph, mesh
        self.axes: tuple[str, ...] = tuple(a for a, s in mesh if include_trivial or s > 1)
        self.dims: tuple[str, ...] = tuple(d for d in graph.dims if d not in graph.loop_dims)
        self.size = {d: graph.dims[d] for d in self.dims}
        self.fixed = {d for op in graph.ops() for d in unsplittable(op)}
        self.rank = {d: i for i, d in enumerate(self.dims)}
        self.groups = conflict_groups(graph)
        self.conflicts: dict[str, set[str]] = {d: set() for d in self.dims}
        for g in self.groups:
            for a, b in itertools.permutations(g, 2):
                self.conflicts[a].add(b)
        # allowed axis subsets per dim (mesh order), divisibility only, () first
        self.subsets: dict[str, list[tuple[str, ...]]] = {}
        for d in self.dims:
            opts = []
            for r in range(len(self.axes) + 1 if d not in self.fixed else 1):
                for combo in itertools.combinations(self.axes, r):
                    n = math.prod(mesh.axis_size(a) for a in combo)
                    if self.size[d] % n == 0:
                        opts.append(combo)
            self.subsets[d] = opts
        self._cache: dict[tuple[str, ...], list[Assignment]] = {}

    def usable(self, d: str, m: str) -> bool:
        """Whether dim ``d`` can be split over axis ``m`` at all (divisibility of the axis alone)."""
        return d in self.size and d not in self.fixed and self.size[d] % self.mesh.axis_size(m) == 0

    def order(self, dims: Any) -> tuple[str, ...]:
        """Non-loop dims of ``dims`` in canonical (graph) order."""
        return tuple(sorted({d for d in dims if d in self.rank}, key=self.rank.__getitem__))

    def assignments(self, dims: Sequence[str]) -> list[Assignment]:
        """Every valid restriction of a layout to ``dims`` (canonical order, see :meth:`order`).

        Each is a tuple of axis tuples aligned with ``dims``; the all-unsplit
        assignment comes first. Valid means divisible and free of conflicts
        *among these dims*; conflicts with other dims are the layout's business.
        """
        dims = tuple(dims)
        hit = self._cache.get(dims)
        if hit is None:
            hit = self._cache[dims] = list(self.iter_assignments(dims))
        return hit

    def iter_assignments(self, dims: Sequence[str]) -> Iterator[Assignment]:
        """Like :meth:`assignments`, lazily (depth-first, each dim unsplit first)."""
        dims = tuple(dims)
        cur: list[tuple[str, ...]] = []
        used: dict[str, list[str]] = {m: [] for m in self.axes}

        def rec(i: int) -> Iterator[Assignment]:
            if i == len(dims):
                yield tuple(cur)
                return
            d = dims[i]
            bad = self.conflicts[d]
            for combo in self.subsets[d]:
                if any(o in bad for m in combo for o in used[m]):
                    continue
                for m in combo:
                    used[m].append(d)
                cur.append(combo)
                yield from rec(i + 1)
                cur.pop()
                for m in combo:
                    used[m].pop()

        yield from rec(0)

    def layout_of(self, axes_of: dict[str, tuple[str, ...]], update_sharding: Any = None) -> Layout:
        """A Layout with rules in graph dim order (unsplit dims omitted)."""
        rules = [(d, axes_of[d]) for d in self.dims if axes_of.get(d)]
        return Layout(rules, update_sharding)


def enumerate_layouts(graph: Graph, mesh: Any) -> Iterator[Layout]:
    """Every valid layout of ``graph`` on ``mesh`` (the exhaustive oracle).

    Each non-loop dim is unsplit or split over one or more mesh axes (listed in
    mesh order — the order the cost model phases collectives in); a layout is
    yielded iff every dim is divisible by the product of its axes, no tensor has
    two dims on one axis, and no reducing op has two dims on one axis
    (``check_op``). Axes of size 1 are included, so layouts that differ only by
    a size-1 axis are all listed. Order: depth-first over dims in graph order,
    each dim trying "unsplit" first. Without weight-update sharding.

    >>> from autolayout import models
    >>> g = models.mlp(batch=8, d_io=4, d_hidden=8)
    >>> sorted(str(l) for l in enumerate_layouts(g, "all:2"))[:3]
    ['', 'batch:all', 'hidden:all']
    """
    mesh = Mesh.parse(mesh)
    space = Space(graph, mesh, include_trivial=True)
    for a in space.iter_assignments(space.dims):
        yield space.layout_of(dict(zip(space.dims, a)))
