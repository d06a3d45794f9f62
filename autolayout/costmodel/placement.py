"""Where a tensor's elements live on the mesh, and the one rule for moving them.

A :class:`Placement` says, for one tensor, which mesh axes split each of its
dims (major first), optionally that the block left on a device is further split
*flattened* over more axes, and over which axes its values are still partial
sums. Three generalisations of Mesh-TensorFlow's one-rule-per-dim layouts rest
on it: weight-update / storage shards of parameters (seed 003), regions that
split a dim differently from the contractions around them, and deferred
gradient reductions.

* **Flattened shards** (seed 003 §4, "data formatting"): when no dim of a
  parameter divides by the size ``F`` of the axes to shard it over, the local
  block of its non-loop dims is flattened, padded to a multiple of ``F`` and
  sliced into ``F`` chunks. Loop dims (stacked layers) are *kept*, so stacked
  parameters are padded layer by layer, the same way whether the gradient is
  reduce-scattered one layer at a time inside a scan or the update runs on the
  whole stack: :meth:`Placement.local_shape` is the one place padding is
  computed.
* :func:`moves` is the one rule for moving data between two placements of the
  same elements: a reshape (split, merge, rename: Mesh-TensorFlow §6.1) or a
  plain conversion (each dim its own group). Per mesh axis it compares where
  the axis sits in the row-major digits of each group before and after
  (Mesh-TensorFlow's cumulative products): same place = local; only before =
  all-gather; only after = local slice; moved = all-to-all, unless its new
  place is still held by another axis before (a multi-axis split whose axes
  swap), which no single all-to-all can do: then it is gathered and sliced.
  The cost model prices what it returns and the shard_map lowering executes
  it (``exec/local_ops.py`` reads the digit positions from here).
* :func:`reduction` turns partial sums into a stored placement: a
  reduce-scatter over the axes the stored placement adds (along its dim, or of
  the flattened padded block), then an all-reduce over the remaining partial
  axes (seed 003, Fig. 3).
* :func:`conversion` moves a (fully reduced) tensor between two placements:
  flattened shards are gathered or sliced, dims regrouped by :func:`moves`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autolayout.core import Mesh

__all__ = ["Placement", "Step", "Moves", "moves", "conversion", "reduction", "mesh_order", "move_buffer_bytes",
           "ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL"]

ALL_REDUCE = "all-reduce"
ALL_GATHER = "all-gather"
REDUCE_SCATTER = "reduce-scatter"
ALL_TO_ALL = "all-to-all"


def mesh_order(mesh: Mesh, axes: Sequence[str]) -> tuple[str, ...]:
    """``axes`` in mesh order (the order XLA's replica groups list devices in)."""
    s = set(axes)
    return tuple(a for a in mesh.axis_names if a in s)


def _prod(mesh: Mesh, axes: Sequence[str]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


@dataclass(frozen=True)
class Placement:
    """How one tensor is laid out on the mesh.

    Attributes:
        dims: the tensor's dim names, in the tensor's order.
        axes: per dim, the mesh axes splitting it (major first).
        flat: axes splitting the flattened, padded local block of the dims not
            in ``kept`` (``()``: not flattened).
        kept: with ``flat``, the dims kept unflattened (loop dims), leading.
        partial: axes over which the values are unreduced partial sums.

    >>> str(Placement(("batch", "hidden"), (("rows",), ())))
    '[batch:rows, hidden]'
    """

    dims: tuple[str, ...]
    axes: tuple[tuple[str, ...], ...]
    flat: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    partial: tuple[str, ...] = ()

    @classmethod
    def of(cls, dims: Sequence[str], axes_of: Mapping[str, tuple[str, ...]]) -> Placement:
        """Each dim split as ``axes_of`` says (a layout's rules)."""
        dims = tuple(dims)
        return cls(dims, tuple(tuple(axes_of.get(d, ())) for d in dims))

    def axes_of(self, dim: str) -> tuple[str, ...]:
        return self.axes[self.dims.index(dim)] if dim in self.dims else ()

    def split_axes(self) -> tuple[str, ...]:
        """Every axis that splits the stored elements (dims' axes, then flat axes)."""
        return tuple(a for ax in self.axes for a in ax) + self.flat

    def base(self) -> Placement:
        """The placement without flattening or partial sums."""
        return Placement(self.dims, self.axes)

    def replace_axes(self, dim: str, axes: tuple[str, ...]) -> Placement:
        i = self.dims.index(dim)
        return Placement(self.dims, self.axes[:i] + (tuple(axes),) + self.axes[i + 1:], self.flat, self.kept,
                         self.partial)

    def with_partial(self, axes: Sequence[str]) -> Placement:
        return Placement(self.dims, self.axes, self.flat, self.kept, tuple(axes))

    def restrict(self, dims: Sequence[str]) -> Placement:
        """The placement of a tensor with a subset of these dims (not for flattened placements)."""
        return Placement(tuple(dims), tuple(self.axes_of(d) for d in dims))

    def divides(self, sizes: Mapping[str, int], mesh: Mesh) -> bool:
        """Whether every dim's size is divisible by the product of its axes."""
        return all(sizes[d] % _prod(mesh, ax) == 0 for d, ax in zip(self.dims, self.axes))

    def local_size(self, dim: str, size: int, mesh: Mesh) -> int:
        return size // _prod(mesh, self.axes_of(dim))

    def flat_elements(self, sizes: Mapping[str, int], mesh: Mesh) -> int:
        """With ``flat``: elements of one layer's local block before padding."""
        return math.prod(self.local_size(d, sizes[d], mesh) for d in self.dims if d not in self.kept)

    def chunk(self, sizes: Mapping[str, int], mesh: Mesh) -> int:
        """With ``flat``: one layer's flattened shard, padded (``ceil(elements / F)``)."""
        return -(-self.flat_elements(sizes, mesh) // _prod(mesh, self.flat))

    def local_shape(self, sizes: Mapping[str, int], mesh: Mesh) -> tuple[int, ...]:
        """Shape of the block one device holds: the dims' local sizes, or, flattened,
        ``(kept dims..., chunk)``."""
        if not self.flat:
            return tuple(self.local_size(d, sizes[d], mesh) for d in self.dims)
        kept = tuple(self.local_size(d, sizes[d], mesh) for d in self.dims if d in self.kept)
        return kept + (self.chunk(sizes, mesh),)

    def local_elements(self, sizes: Mapping[str, int], mesh: Mesh) -> int:
        return math.prod(self.local_shape(sizes, mesh))

    def __str__(self) -> str:
        parts = [f"{d}:{','.join(ax)}" if ax else d for d, ax in zip(self.dims, self.axes)]
        text = "[" + ", ".join(parts) + "]"
        if self.flat:
            text += f" flat:{','.join(self.flat)}"
        if self.partial:
            text += f" partial:{','.join(self.partial)}"
        return text

    __repr__ = __str__


@dataclass(frozen=True)
class Step:
    """One collective of a plan, in the terms XLA's HLO states it.

    ``bytes`` is the operand's size on one device (the local tensor for
    all-reduce, reduce-scatter and all-to-all; the local shard for all-gather);
    ``axes`` are the mesh axes of the group, in mesh order; ``dim`` says what
    moves (the dim gathered or scattered, ``"a>b"`` for an all-to-all, ``""``
    for a flattened block); ``pad_bytes`` the padding included in ``bytes``;
    ``reduce`` the reduction of an all-reduce/reduce-scatter.
    """

    kind: str
    tensor: str
    axes: tuple[str, ...]
    group_size: int
    bytes: int
    dim: str = ""
    pad_bytes: int = 0
    reduce: str = "sum"

    def __str__(self) -> str:
        what = f" along {self.dim}" if self.dim else ""
        return f"{self.kind}({self.tensor}{what}: {self.bytes}B over {','.join(self.axes)}[{self.group_size}])"


# --------------------------------------------------------------------------- moves
Range = tuple  # (group index, hi, lo): a digit range [lo, hi) of a group's cumulative product


@dataclass(frozen=True)
class Moves:
    """Per mesh axis, where it sits before and after a regrouping of one tensor's elements.

    ``pos_in``/``pos_out`` map a mesh axis to its digit range, ``local_in``/
    ``local_out`` a dim to the range of its local part, ``fine`` a group to its
    digit boundaries (descending). ``all_to_all`` and ``all_gather`` are the
    collectives (axes in mesh order), ``slices`` the axes split locally after
    them; ``held_in``/``held_out`` name the dim an axis splits; ``new_dims``
    maps output dims created by broadcasting to their local sizes.
    """

    groups: tuple
    pos_in: Mapping[str, Range]
    pos_out: Mapping[str, Range]
    local_in: Mapping[str, Range]
    local_out: Mapping[str, Range]
    fine: Mapping[int, tuple[int, ...]]
    all_to_all: tuple[str, ...]
    all_gather: tuple[str, ...]
    slices: tuple[str, ...]
    held_in: Mapping[str, str] = field(default_factory=dict)
    held_out: Mapping[str, str] = field(default_factory=dict)
    new_dims: Mapping[str, int] = field(default_factory=dict)  # created dim -> its local size

    def fines(self, rng: Range) -> list[Range]:
        """The finest digit ranges inside ``rng``."""
        gi, hi, lo = rng
        bs = [v for v in self.fine[gi] if lo <= v <= hi]
        return [(gi, bs[k], bs[k + 1]) for k in range(len(bs) - 1)]

    @property
    def local(self) -> bool:
        return not self.all_to_all and not self.all_gather


def identity_groups(dims: Sequence[str]) -> tuple:
    return tuple(((d,), (d,)) for d in dims)


def moves(groups: Sequence, sizes: Mapping[str, int], axes_in: Mapping[str, tuple[str, ...]],
          axes_out: Mapping[str, tuple[str, ...]], mesh: Mesh) -> Moves:
    """Paper §6.1 per mesh axis, for split/merge/rename groups (see the module docstring).

    ``groups`` pairs input dims with output dims whose sizes multiply to the same
    number (``((hk,), (heads, d_kv))``); a group without inputs creates dims by
    broadcasting, a group without outputs drops a loop dim (never split).
    """
    pos_in: dict[str, Range] = {}
    pos_out: dict[str, Range] = {}
    local_in: dict[str, Range] = {}
    local_out: dict[str, Range] = {}
    held_in: dict[str, str] = {}
    held_out: dict[str, str] = {}
    bounds: dict[int, set] = {}
    new_dims: dict[str, int] = {}
    for gi, (gin, gout) in enumerate(groups):
        if not gin:
            for d in gout:
                new_dims[d] = sizes[d] // _prod(mesh, axes_out.get(d, ()))
            continue
        if not gout:
            continue  # a loop slice drops the (never split) loop dim
        b = bounds.setdefault(gi, set())
        for dims, axes, pos, loc, held in ((gin, axes_in, pos_in, local_in, held_in),
                                           (gout, axes_out, pos_out, local_out, held_out)):
            hi = math.prod(sizes[d] for d in dims)
            for d in dims:
                rest = sizes[d]
                for a in axes.get(d, ()):
                    n = mesh.axis_size(a)
                    pos[a] = (gi, hi, hi // n)
                    held[a] = d
                    b.update((hi, hi // n))
                    hi, rest = hi // n, rest // n
                loc[d] = (gi, hi, hi // rest)
                b.update((hi, hi // rest))
                hi //= rest
    fine = {gi: tuple(sorted(b, reverse=True)) for gi, b in bounds.items()}
    probe = Moves(tuple(groups), pos_in, pos_out, local_in, local_out, fine, (), (), ())
    held_locally = {f for d in local_in for f in probe.fines(local_in[d])}
    order = mesh.axis_names
    gather = [a for a in order if a in pos_in and a not in pos_out]
    slices = [a for a in order if a in pos_out and a not in pos_in]
    alltoall = []
    for a in order:
        if a in pos_in and a in pos_out and pos_in[a] != pos_out[a]:
            if all(f in held_locally for f in probe.fines(pos_out[a])):
                alltoall.append(a)
            else:  # its new place is held by another axis: gather, then slice
                gather.append(a)
                slices.append(a)
    return Moves(tuple(groups), pos_in, pos_out, local_in, local_out, fine, tuple(alltoall),
                 mesh_order(mesh, gather), mesh_order(mesh, slices), held_in, held_out, new_dims)


def move_steps(tensor: str, mv: Moves, operand_bytes: int, mesh: Mesh) -> list[Step]:
    """The collectives of ``mv``: one all-to-all over every moved axis, then one all-gather
    over every gathered axis, each of the local input block (``operand_bytes``)."""
    out = []
    if mv.all_to_all:
        dim = ",".join(sorted({f"{mv.held_in[a]}>{mv.held_out[a]}" for a in mv.all_to_all}))
        out.append(Step(ALL_TO_ALL, tensor, mv.all_to_all, _prod(mesh, mv.all_to_all), operand_bytes, dim))
    if mv.all_gather:
        dim = ",".join(dict.fromkeys(mv.held_in[a] for a in mv.all_gather))
        out.append(Step(ALL_GATHER, tensor, mv.all_gather, _prod(mesh, mv.all_gather), operand_bytes, dim))
    return out


def move_buffer_bytes(mv: Moves, steps: Sequence[Step]) -> int:
    """The bytes of the all-gathers' own buffers among ``steps`` (:func:`move_steps` of ``mv``)
    where ``mv`` slices the gathered result locally (``mv.slices``): a regrouping that moves a
    dim from one mesh axis to another (an attention's ``length:model -> length_1:data`` rename)
    all-gathers the local block over the old axis, each device then keeping its slice for the
    new one. The gathered block is a buffer of its own, the group size times the operand,
    beside the sliced output while the op runs; 0 where nothing is sliced (the gathered block is
    the output) or nothing gathered. ``Planner`` adds it to the op's transient bytes
    (``OpPlan.temp_bytes``), which ``predict`` and the search's tables both read (one rule).

    Measured in XLA:CPU's optimized HLO (jax 0.10.2, 8 CPU devices,
    ``benchmarks/memory_vs_xla.py``): ``transformer_lm``'s forward scan under
    ``length:model;length_1:data`` all-gathers the keys and the values over ``model``
    (``all_gather_invariant.21``, ``.23``: ``f32[4,8,8,4,16]``, 64 KiB each, twice the
    renamed tensors), back to back as the breadth-first schedule queues them, and slices them
    in the transposing copies that read them; the two are live together at XLA's peak. Without
    this buffer the model's peak was 0.880 and 0.872 of ``memory_analysis()`` on the two such
    rows of the 803 stored (``--predict``); with it 0.960 and 0.936, no other row moving
    (``tests/test_memory_xla.py``; by hand and against the HLO: ``tests/test_memory_rules.py``)."""
    if not mv.slices:
        return 0
    return int(sum(s.bytes * s.group_size for s in steps if s.kind == ALL_GATHER))


# ------------------------------------------------------------------- conversions
@dataclass(frozen=True)
class Conversion:
    """Moving one tensor from placement ``src`` to ``dst`` (both fully reduced).

    Executed in this order: ``unflatten`` (all-gather the flattened shards over
    ``src.flat``, unpad), ``moves`` (regroup the dims' axes), ``flatten`` (pad,
    flatten and slice over ``dst.flat``, local). ``steps`` are the collectives.
    """

    src: Placement
    dst: Placement
    steps: tuple[Step, ...]
    moves: Moves | None
    unflatten: bool
    flatten: bool

    @property
    def identity(self) -> bool:
        return not self.unflatten and not self.flatten and self.moves is None


def _axes_map(p: Placement) -> dict[str, tuple[str, ...]]:
    return {d: ax for d, ax in zip(p.dims, p.axes) if ax}


def conversion(tensor: str, src: Placement, dst: Placement, sizes: Mapping[str, int], mesh: Mesh,
               itemsize: int) -> Conversion:
    """The steps moving ``tensor`` from ``src`` to ``dst`` (same dims, any order)."""
    if set(src.dims) != set(dst.dims):
        raise ValueError(f"internal: conversion of {tensor!r} between dims {src.dims} and {dst.dims}")
    same_base = _axes_map(src) == _axes_map(dst)
    if same_base and src.flat == dst.flat:
        return Conversion(src, dst, (), None, False, False)
    steps: list[Step] = []
    unflatten = bool(src.flat) and not (same_base and src.flat == dst.flat)
    if unflatten:
        nbytes = src.local_elements(sizes, mesh) * itemsize
        steps.append(Step(ALL_GATHER, tensor, mesh_order(mesh, src.flat), _prod(mesh, src.flat), nbytes))
    mv = None
    if not same_base:
        mv = moves(identity_groups(src.dims), sizes, _axes_map(src), _axes_map(dst), mesh)
        nbytes = src.base().local_elements(sizes, mesh) * itemsize
        steps += move_steps(tensor, mv, nbytes, mesh)
    return Conversion(src, dst, tuple(steps), mv, unflatten, bool(dst.flat))


def reduce_target(computed: Placement, stored: Placement) -> Placement:
    """Where a partial result is reduced to before any local reshuffle: ``computed`` plus the
    axes ``stored`` splits it over that are partial (a reduce-scatter reaches those);
    :func:`conversion` then moves it to ``stored`` (slicing or gathering the rest)."""
    partial, have = set(computed.partial), set(computed.split_axes())
    if stored.flat and set(stored.flat) <= partial and _axes_map(stored) == _axes_map(computed):
        return stored
    axes = tuple(computed.axes_of(d) + tuple(a for a in stored.axes_of(d) if a not in have and a in partial)
                 for d in computed.dims)
    return Placement(computed.dims, axes, partial=stored.partial)


def reduction(tensor: str, computed: Placement, stored: Placement, sizes: Mapping[str, int], mesh: Mesh,
              itemsize: int, reduce: str = "sum") -> list[Step]:
    """Steps turning a value computed in ``computed`` (partial over ``computed.partial``)
    into ``stored``: a reduce-scatter over the partial axes ``stored`` adds (along each dim
    that takes new axes, minor to its existing ones, or of the flattened block, padded),
    then an all-reduce over the partial axes left, except those ``stored`` keeps partial."""
    partial = set(computed.partial)
    extra = [a for a in stored.split_axes() if a not in computed.split_axes()]
    scatter = [a for a in extra if a in partial]
    keep = set(stored.partial)
    steps: list[Step] = []
    operand = computed.local_elements(sizes, mesh) * itemsize
    if scatter and scatter != extra:
        raise ValueError(f"internal: {tensor!r} is stored split over {extra} but only {scatter} are "
                         "partial; a reduce-scatter cannot also slice")
    if scatter and stored.flat:
        n = _prod(mesh, scatter)
        pad = (stored.chunk(sizes, mesh) * n - stored.flat_elements(sizes, mesh)) * itemsize
        kept = math.prod(stored.local_shape(sizes, mesh)[:-1])
        operand = stored.chunk(sizes, mesh) * n * kept * itemsize
        steps.append(Step(REDUCE_SCATTER, tensor, mesh_order(mesh, scatter), n, operand, "", pad * kept, reduce))
        operand //= n
    elif scatter:  # one reduce-scatter per dim that takes new axes, each on the shrinking shard
        for d in stored.dims:
            axes = [a for a in stored.axes_of(d) if a in scatter]
            if axes:
                n = _prod(mesh, axes)
                steps.append(Step(REDUCE_SCATTER, tensor, mesh_order(mesh, axes), n, operand, d, 0, reduce))
                operand //= n
    rest = mesh_order(mesh, [a for a in partial if a not in scatter and a not in keep])
    if rest:
        steps.append(Step(ALL_REDUCE, tensor, rest, _prod(mesh, rest), operand, "", 0, reduce))
    return steps
