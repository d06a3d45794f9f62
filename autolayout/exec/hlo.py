"""Collectives of an HLO module, and their comparison with the cost model's list.

**Parsing rule.** Every instruction whose opcode is ``all-reduce``,
``all-gather``, ``reduce-scatter`` or ``all-to-all`` (``-start`` variants count
as the collective, ``-done`` does not) is one collective *occurrence in the
program text*. Its ``bytes`` is the operand size on one device, the cost
model's convention: taken from the operand types when the text prints them
(optimised HLO), otherwise derived from the result type (pre-optimisation
HLO): all-reduce and all-to-all keep the size, an all-gather's operand is the
result / group size, a reduce-scatter's the result x group size. Tuple-shaped
collectives (several operands at once) sum their parts. The group size is the
length of the first replica group (``{{0,4},{1,5},...}``, or the iota form
``[groups,size]<=[...]``; ``{}`` means all devices). A computation called from
several places (``call``/``while``/``conditional``; JAX shares identical
sub-functions) counts once per call path from the entry computation.

**Mesh axes.** Replica groups list logical device ids, the positions in the
mesh's device array (row-major over its axes; ``use_global_device_ids``). Given
the mesh, each group's members are turned into mesh coordinates and the
collective's mesh axes are the axes along which they vary; a group that is not a
whole sub-mesh over those axes gets ``("?",)`` and matches nothing.

**Matching rule.** ``predict`` lists each collective of each op once, with
``count`` = the op's multiplicity (scan iterations). A scan lowers to one
``while`` loop whose body holds the op once, so the comparison is *per
occurrence in the program text*: the predicted list with each entry taken
once (``count`` ignored) must equal the HLO list as a multiset of
``(kind, bytes, group size, mesh axes)`` (mesh axes in mesh order; axes of
size 1 dropped; without a mesh, ``(kind, bytes, group size)``).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
_DTYPE_BYTES = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.*?)\s+"
    r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all)(?P<start>-start)?\((?P<rest>.*)$")
_SHAPE = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


@dataclass(frozen=True)
class HloCollective:
    """One collective instruction of an HLO module."""

    kind: str
    bytes: int
    group_size: int
    replica_groups: str
    dtype: str
    shape: str
    name: str
    computation: str = ""
    mesh_axes: tuple[str, ...] | None = None  # None when parsed without a mesh

    @property
    def key(self) -> tuple:
        base = (self.kind, self.bytes, self.group_size)
        return base if self.mesh_axes is None else base + (self.mesh_axes,)

    def __str__(self) -> str:
        axes = f" over {','.join(self.mesh_axes)}" if self.mesh_axes else ""
        return f"{self.kind}({self.bytes}B, group {self.group_size}{axes}) {self.name} {self.shape}"


def array_bytes(text: str) -> list[tuple[str, str, int]]:
    """``(dtype, dims, bytes)`` of each array of an HLO shape, in order (a tuple's elements;
    ``token`` and other types without a size are left out).

    Example::

        array_bytes("(bf16[4,8]{1,0}, f32[])")  # [("bf16", "4,8", 64), ("f32", "", 4)]
    """
    return [(dt, dims, _DTYPE_BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d))
            for dt, dims in _SHAPE.findall(text) if dt in _DTYPE_BYTES]


def _shapes_bytes(text: str) -> tuple[int, str, str]:
    arrays = array_bytes(text)
    return (sum(b for _, _, b in arrays), arrays[0][0] if arrays else "",
            ", ".join(f"{dt}[{dims}]" for dt, dims, _ in arrays))


def _groups(rest: str, num_devices: int) -> tuple[list[list[int]], str]:
    """The replica groups of an instruction (explicit ``{{0,1},{2,3}}`` or iota
    ``[groups,size]<=[dims]T(perm)`` form; ``{}`` or none: all devices in one group)."""
    import numpy as np

    m = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", rest)
    if m:
        shape = [int(v) for v in m.group(1).split(",")]
        dims = [int(v) for v in m.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(v) for v in m.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist(), m.group(0)[len("replica_groups="):]
    m = re.search(r"replica_groups=(\{(?:\{[0-9,\s]*\},?\s*)*\})", rest)
    if m:
        groups = [[int(v) for v in g.split(",") if v.strip()] for g in re.findall(r"\{([0-9,\s]*)\}", m.group(1)[1:])]
        groups = [g for g in groups if g]
        return (groups or [list(range(num_devices))]), m.group(1)
    return [list(range(num_devices))], ""


def group_axes(group: Sequence[int], mesh_shape: Sequence[tuple[str, int]]) -> tuple[str, ...]:
    """Mesh axes (mesh order) a replica group spans, from its members' positions in the
    mesh's device array; ``("?",)`` unless the group is a whole sub-mesh over them.

    >>> group_axes([0, 4], [("rows", 2), ("cols", 4)])
    ('rows',)
    """
    import numpy as np

    names = [n for n, _ in mesh_shape]
    sizes = [s for _, s in mesh_shape]
    coords = np.array(np.unravel_index(np.asarray(group, dtype=np.int64), sizes)).T
    varying = [i for i in range(len(sizes)) if len(set(coords[:, i].tolist())) > 1]
    if len(group) != math.prod(sizes[i] for i in varying) or len({tuple(c) for c in coords.tolist()}) != len(group):
        return ("?",)
    fixed = [i for i in range(len(sizes)) if i not in varying]
    if len({tuple(c[i] for i in fixed) for c in coords.tolist()}) != 1:
        return ("?",)
    return tuple(names[i] for i in varying)


_CALLEE = re.compile(r"\b(?:to_apply|calls|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")


def parse_collectives(hlo_text: str, num_devices: int,
                      mesh_shape: Sequence[tuple[str, int]] | None = None) -> list[HloCollective]:
    """Collectives of an HLO module text, in program order (see the module doc).

    A computation called from several places (JAX shares identical sub-functions)
    contributes its collectives once per call path from the entry computation. With
    ``mesh_shape`` (``[(axis, size), ...]``, e.g. an autolayout ``Mesh``'s ``axes``) each
    collective also gets the mesh axes its replica groups span.
    """
    found: list[tuple[str, HloCollective]] = []
    calls: dict[str, list[str]] = {}
    comp, entry = "", ""
    for line in hlo_text.splitlines():
        cm = _COMP.match(line)
        if cm and "=" not in line.split("{")[0]:
            comp = cm.group(1)
            if line.lstrip().startswith("ENTRY"):
                entry = comp
            continue
        for callee in _CALLEE.findall(line):
            calls.setdefault(callee, []).append(comp)
        for group in _BRANCHES.findall(line):
            for callee in group.split(","):
                calls.setdefault(callee.strip().lstrip("%"), []).append(comp)
        m = _INSTR.match(line)
        if not m:
            continue
        kind = m.group("op")
        rest = m.group("rest")
        groups, groups_text = _groups(rest, num_devices)
        group = len(groups[0])
        axes = group_axes(groups[0], mesh_shape) if mesh_shape is not None else None
        result_bytes, dtype, shape = _shapes_bytes(m.group("type"))
        operand_bytes, odtype, _ = _shapes_bytes(rest.split(")", 1)[0])
        if not operand_bytes:
            if kind == "all-gather":
                operand_bytes = result_bytes // max(group, 1)
            elif kind == "reduce-scatter":
                operand_bytes = result_bytes * group
            else:
                operand_bytes = result_bytes
        found.append((comp, HloCollective(kind, int(operand_bytes), int(group), groups_text,
                                          odtype or dtype, shape, m.group("name"), comp, axes)))
    memo: dict[str, int] = {}

    def paths(c: str, seen: frozenset = frozenset()) -> int:
        if not entry or c == entry:
            return 1
        if c in seen:
            return 0
        if c not in memo:
            memo[c] = sum(paths(p, seen | {c}) for p in calls.get(c, ()))
        return memo[c]

    return [x for c, x in found for _ in range(paths(c))]


def predicted_keys(collectives: Iterable, mesh_shape: Sequence[tuple[str, int]] | None = None) -> list[tuple]:
    """The cost model's collectives as ``(kind, bytes, group size[, mesh axes])``, one per op
    entry (mesh axes in mesh order, size-1 axes dropped, when ``mesh_shape`` is given)."""
    if mesh_shape is None:
        return [(c.kind, int(c.bytes), int(c.group_size)) for c in collectives]
    size = dict(mesh_shape)
    order = [n for n, _ in mesh_shape]
    return [(c.kind, int(c.bytes), int(c.group_size),
             tuple(a for a in order if a in set(c.mesh_axes) and size[a] > 1)) for c in collectives]


def compare(predicted: Sequence, compiled: Sequence[HloCollective],
            mesh_shape: Sequence[tuple[str, int]] | None = None) -> tuple[bool, Counter, Counter]:
    """``(equal as multisets, only predicted, only compiled)``; with ``mesh_shape`` (and
    ``compiled`` parsed with it) the mesh axes are compared too."""
    p = Counter(predicted_keys(predicted, mesh_shape))
    c = Counter(x.key if mesh_shape is not None else x.key[:3] for x in compiled)
    return p == c, p - c, c - p


def diff_text(predicted: Sequence, compiled: Sequence[HloCollective],
              mesh_shape: Sequence[tuple[str, int]] | None = None) -> str:
    """A readable diff of the two lists; ``""`` when they match."""
    ok, only_p, only_c = compare(predicted, compiled, mesh_shape)
    if ok:
        return ""
    lines = [f"collectives differ: predicted {len(predicted)}, compiled {len(compiled)} "
             "(kind, operand bytes per device, group size[, mesh axes]; one entry per occurrence in the program)"]

    def show(key: tuple) -> str:
        axes = f" over {','.join(key[3])}" if len(key) > 3 else ""
        return f"{key[0]} {key[1]}B group {key[2]}{axes}"

    pkeys = predicted_keys(predicted, mesh_shape)
    for key, n in sorted(only_p.items()):
        ops = [c.op for c, k in zip(predicted, pkeys) if k == key]
        lines.append(f"  - predicted only: {n} x {show(key)}  (ops: {', '.join(ops[:6])})")
    for key, n in sorted(only_c.items()):
        names = [c.name for c in compiled if (c.key if mesh_shape is not None else c.key[:3]) == key]
        lines.append(f"  + compiled only:  {n} x {show(key)}  (HLO: {', '.join(names[:6])})")
    return "\n".join(lines)
