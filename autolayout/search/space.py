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
from autolayout.costmodel.regions import EMPTY, Regions, regions
from autolayout.graph import Graph, Op

__all__ = ["Space", "Views", "enumerate_layouts", "draw_layouts", "conflict_groups"]

# An assignment of a tuple of dims: one tuple of mesh axes (mesh order) per dim.
Assignment = tuple[tuple[str, ...], ...]


class Views:
    """Dim names as the search sees them: a dim ``d`` of the norm region
    (:mod:`autolayout.costmodel.regions`) is the search dim ``d@norm`` wherever a tensor is
    stored or an op computes in the region, so a layout may split it there differently
    (``length@norm:x``). ``regions=False``: Mesh-TensorFlow's global rules only."""

    def __init__(self, graph: Graph, use_regions: bool = True) -> None:
        self.graph = graph
        self.regions: Regions = regions(graph) if use_regions else EMPTY
        self._tensor: dict[str, tuple[str, ...]] = {}
        self._op: dict[str, tuple[str, ...]] = {}

    def tensor(self, name: str) -> tuple[str, ...]:
        """The stored view of tensor ``name``'s dims."""
        hit = self._tensor.get(name)
        if hit is None:
            r = self.regions
            hit = self._tensor[name] = r.view(self.graph.tensor(name).dim_names, r.tensor_region(name))
        return hit

    def compute(self, op: Op, dims: Any = None) -> tuple[str, ...]:
        """``dims`` (default: all the op's dims) as the op computes them."""
        dims = [d.name for d in op.dims] if dims is None else list(dims)
        return self.regions.view(dims, self.regions.op_region(op.name))

    def op(self, op: Op) -> tuple[str, ...]:
        """Every search dim ``op``'s plan depends on: its compute view, the stored views of its
        inputs and output, unique, in first-seen order."""
        hit = self._op.get(op.name)
        if hit is None:
            names = [*self.compute(op), *self.tensor(op.name)]
            for i in op.inputs:
                names += self.tensor(i)
            hit = self._op[op.name] = tuple(dict.fromkeys(names))
        return hit


def conflict_groups(graph: Graph, views: Views | None = None) -> list[frozenset[str]]:
    """Maximal sets of non-loop (search) dims that must sit on pairwise different mesh axes.

    One set per tensor (its dims as stored, and as each op reads and writes it, paper
    §8.5) and per reducing op (all its dims, ``check_op``); sets contained in another are
    dropped.
    """
    views = views or Views(graph, False)
    loop = graph.loop_dims
    groups: set[frozenset[str]] = set()
    for op in graph.ops():
        for names in (views.tensor(op.name), views.compute(op, op.output.dim_names),
                      *(views.tensor(i) for i in op.inputs),
                      *(views.compute(op, [d.name for d in shape]) for shape in op.input_shapes)):
            groups.add(frozenset(names) - loop)
        if op.kind in REDUCING:
            groups.add(frozenset(views.compute(op)) - loop)
    groups = {g for g in groups if len(g) >= 2}
    maximal = [g for g in groups if not any(g < h for h in groups)]
    return sorted(maximal, key=lambda g: sorted(g))


class Space:
    """Valid per-dim axis choices of ``graph`` on ``mesh``.

    ``axes`` are the mesh axes the search may use: all of them for the
    enumerator (``include_trivial=True``), only axes of size > 1 for the search
    (splitting over a size-1 axis changes nothing). ``dims`` are the non-loop
    dims in ``graph.dims`` order, then the region dims (``length@norm``, see
    :class:`Views`); ``base`` maps each to its graph dim. A region dim's axes
    include its base dim's (a region adds axes): :meth:`iter_assignments` and the
    CP-SAT model enforce it.
    """

    def __init__(self, graph: Graph, mesh: Mesh, *, include_trivial: bool = False, regions: bool = True) -> None:
        self.graph, self.mesh = graph, mesh
        self.views = Views(graph, regions)
        self.axes: tuple[str, ...] = tuple(a for a, s in mesh if include_trivial or s > 1)
        real = tuple(d for d in graph.dims if d not in graph.loop_dims)
        virtual = tuple(f"{d}@norm" for d in real if d in self.views.regions.dims)
        self.dims: tuple[str, ...] = real + virtual
        self.base = {d: d.partition("@")[0] for d in self.dims}
        self.size = {d: graph.dims[self.base[d]] for d in self.dims}
        self.fixed = {d for op in graph.ops() for d in unsplittable(op)}
        self.fixed |= {v for v in virtual if self.base[v] in self.fixed}
        self.rank = {d: i for i, d in enumerate(self.dims)}
        self.groups = conflict_groups(graph, self.views)
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

    def mesh_order(self, axes: Any) -> tuple[str, ...]:
        axes = set(axes)
        return tuple(a for a in self.axes if a in axes)

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

        pos = {d: i for i, d in enumerate(dims)}

        def rec(i: int) -> Iterator[Assignment]:
            if i == len(dims):
                yield tuple(cur)
                return
            d = dims[i]
            bad = self.conflicts[d]
            below = cur[pos[self.base[d]]] if self.base[d] != d and self.base[d] in pos else ()
            for combo in self.subsets[d]:
                if any(o in bad for m in combo for o in used[m]) or not set(below) <= set(combo):
                    continue
                for m in combo:
                    used[m].append(d)
                cur.append(combo)
                yield from rec(i + 1)
                cur.pop()
                for m in combo:
                    used[m].pop()

        yield from rec(0)

    def layout_of(self, axes_of: dict[str, tuple[str, ...]], update_sharding: Any = None,
                  remat: str = "") -> Layout:
        """A Layout with rules in graph dim order (unsplit dims omitted; a region dim only
        where it adds axes to its base dim)."""
        rules = [(d, axes_of[d]) for d in self.dims if axes_of.get(d)
                 and (self.base[d] == d or set(axes_of[d]) != set(axes_of.get(self.base[d], ())))]
        return Layout(rules, update_sharding, remat=remat)


def draw_layouts(graph: Graph, mesh: Any, k: int, rng: Any, *, shard_every: int = 3,
                 stage: int | None = None, remat_every: int | None = None) -> list[Layout]:
    """``k`` layouts drawn at random (``rng.sample``) from :func:`enumerate_layouts`, distinct by
    :meth:`Layout.canonical`; every ``shard_every``-th also shards the weight update
    (``|*:AXES``, at ZeRO ``stage`` if given) over all the mesh's axes, else over the first
    single axis a plan takes (a ``*`` entry a layout cannot take is a ``LayoutError``). With
    ``remat_every``, where the graph has a backward scan to rematerialise
    (``autolayout.remat.remat_pairs``), every ``remat_every``-th (counted from the second) also
    takes a remat policy, ``full`` and ``dots`` in turn.

    The validation report (``reporting.measured``) and ``benchmarks/memory_vs_xla.py --random``
    draw their layouts with this.
    """
    from autolayout.core import LayoutError
    from autolayout.costmodel.plan import plan
    from autolayout.remat import remat_pairs

    policies = ("full", "dots") if remat_every and remat_pairs(graph) else ()

    mesh = Mesh.parse(mesh)
    names = list(mesh.axis_names)
    choices = [",".join(names)] + (names if len(names) > 1 else [])
    space = list(enumerate_layouts(graph, mesh))
    out: dict[str, Layout] = {}
    for i, lay in enumerate(rng.sample(space, min(k, len(space)))):
        if i % shard_every == shard_every - 1:
            for axes in choices:
                wus = Layout(f"{lay}|*:{axes}" + (f"@{stage}" if stage else ""))
                try:
                    plan(graph, mesh, wus)
                except LayoutError:  # a weight-update shard this layout cannot take
                    continue
                lay = wus
                break
        if policies and i % remat_every == min(1, remat_every - 1):
            lay = lay.with_remat(policies[(i // remat_every) % 2])
        out.setdefault(lay.canonical(), lay)
    return list(out.values())


def enumerate_layouts(graph: Graph, mesh: Any, *, regions: bool = False) -> Iterator[Layout]:
    """Every valid layout of ``graph`` on ``mesh`` (the exhaustive oracle).

    Each non-loop dim is unsplit or split over one or more mesh axes (listed in
    mesh order — the order the cost model phases collectives in); a layout is
    yielded iff every dim is divisible by the product of its axes, no tensor has
    two dims on one axis, and no reducing op has two dims on one axis
    (``check_op``). Axes of size 1 are included, so layouts that differ only by
    a size-1 axis are all listed. Order: depth-first over dims in graph order,
    each dim trying "unsplit" first. Without storage sharding; with
    ``regions=True`` also every region rule (``length@norm:x``) that adds axes.

    >>> from autolayout import models
    >>> g = models.mlp(batch=8, d_io=4, d_hidden=8)
    >>> sorted(str(l) for l in enumerate_layouts(g, "all:2"))[:3]
    ['', 'batch:all', 'hidden:all']
    """
    mesh = Mesh.parse(mesh)
    space = Space(graph, mesh, include_trivial=True, regions=regions)
    seen = set()
    for a in space.iter_assignments(space.dims):
        lay = space.layout_of(dict(zip(space.dims, a)))
        if lay not in seen:  # a region dim equal to its base prints as no rule
            seen.add(lay)
            yield lay
