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

**Matching rule.** ``predict`` lists each collective of each op once, with
``count`` = the op's multiplicity (scan iterations). A scan lowers to one
``while`` loop whose body holds the op once, so the comparison is *per
occurrence in the program text*: the predicted list with each entry taken
once (``count`` ignored) must equal the HLO list as a multiset of
``(kind, bytes, group size)``.
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

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.kind, self.bytes, self.group_size)

    def __str__(self) -> str:
        return f"{self.kind}({self.bytes}B, group {self.group_size}) {self.name} {self.shape}"


def _shapes_bytes(text: str) -> tuple[int, str, str]:
    total, dtype, shapes = 0, "", []
    for dt, dims in _SHAPE.findall(text):
        if dt not in _DTYPE_BYTES:
            continue
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * _DTYPE_BYTES[dt]
        dtype = dtype or dt
        shapes.append(f"{dt}[{dims}]")
    return total, dtype, ", ".join(shapes)


def _group_size(rest: str, num_devices: int) -> tuple[int, str]:
    m = re.search(r"replica_groups=(\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?)", rest)
    if m:
        dims = [int(v) for v in m.group(1)[1:m.group(1).index("]")].split(",")]
        return dims[-1], m.group(1)
    m = re.search(r"replica_groups=(\{(?:\{[0-9,\s]*\},?\s*)*\})", rest)
    if m:
        first = re.search(r"\{([0-9,\s]*)\}", m.group(1)[1:])
        if first and first.group(1).strip():
            return len([v for v in first.group(1).split(",") if v.strip()]), m.group(1)
        return num_devices, m.group(1)
    return num_devices, ""


_CALLEE = re.compile(r"\b(?:to_apply|calls|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")


def parse_collectives(hlo_text: str, num_devices: int) -> list[HloCollective]:
    """Collectives of an HLO module text, in program order (see the module doc).

    A computation called from several places (JAX shares identical sub-functions)
    contributes its collectives once per call path from the entry computation.
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
        group, groups_text = _group_size(rest, num_devices)
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
                                          odtype or dtype, shape, m.group("name"), comp)))
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


def predicted_keys(collectives: Iterable) -> list[tuple[str, int, int]]:
    """The cost model's collectives as ``(kind, bytes, group size)``, one per op entry."""
    return [(c.kind, int(c.bytes), int(c.group_size)) for c in collectives]


def compare(predicted: Sequence, compiled: Sequence[HloCollective]) -> tuple[bool, Counter, Counter]:
    """``(equal as multisets, only predicted, only compiled)``."""
    p = Counter(predicted_keys(predicted))
    c = Counter(x.key for x in compiled)
    return p == c, p - c, c - p


def diff_text(predicted: Sequence, compiled: Sequence[HloCollective]) -> str:
    """A readable diff of the two lists; ``""`` when they match."""
    ok, only_p, only_c = compare(predicted, compiled)
    if ok:
        return ""
    lines = [f"collectives differ: predicted {len(predicted)}, compiled {len(compiled)} "
             "(kind, operand bytes per device, group size; one entry per occurrence in the program)"]
    for (kind, nbytes, group), n in sorted(only_p.items()):
        ops = [c.op for c in predicted if (c.kind, c.bytes, c.group_size) == (kind, nbytes, group)]
        lines.append(f"  - predicted only: {n} x {kind} {nbytes}B group {group}  (ops: {', '.join(ops[:6])})")
    for (kind, nbytes, group), n in sorted(only_c.items()):
        names = [c.name for c in compiled if c.key == (kind, nbytes, group)]
        lines.append(f"  + compiled only:  {n} x {kind} {nbytes}B group {group}  (HLO: {', '.join(names[:6])})")
    return "\n".join(lines)
