"""XLA's peak of *live* bytes per device, from the buffer-assignment dumps of a compiled program.

``memory_analysis()`` (the reference of ``benchmarks/memory_vs_xla.py``) is the size of XLA's
allocations: every argument, every output allocation for the whole call, and the temp heap,
whose size is where its buffers ended up packed (``GlobalDecreasingSizeBestFitHeap``), not the
most bytes live at once. The cost model predicts liveness: arguments for the whole step, every
other tensor while it is live. This module splits XLA's figure into the two, from the files
XLA writes with ``xla_dump_to`` and ``xla_dump_hlo_as_text`` (its compiler options):

* ``*-buffer-assignment.txt``: each allocation (size, kind: parameter, output, temp) and the
  values placed in it (offset, size);
* ``*-live-range.txt``: ``HloLiveRange``, each value's live range in the schedule.

At each point of the schedule, the bytes in use are: parameter allocations whole (the caller
owns them, as ``memory_analysis`` counts them), and in each output (live-out) allocation and the
temp heap the union of the byte ranges of the values live there (constants and thread-local
scalars are not in ``memory_analysis`` and are left out here too). The peak over the schedule
is ``live_bytes``; the rest of ``memory_analysis`` is ``idle_output_bytes`` (the part of output
allocations holding nothing live at that peak) and ``heap_gap_bytes`` (the temp heap's size beyond its own most bytes in use at once:
fragmentation); the three add up to ``memory_analysis`` (argument + output + temp - alias) where the temp
heap's own peak is at the same point. ``HloLiveRange``'s own "peak" line is not used: it leaves
out values such as the elements of a combined all-reduce's result tuple.
"""
from __future__ import annotations

import pathlib
import re

__all__ = ["live_peak"]

# XLA:GPU's dumps put the allocation's memory space first ("page 0, parameter 1, ..."), XLA:CPU's not
_ALLOC = re.compile(r"allocation (\d+): size (\d+), (?:page \d+, )?(.*)")
_VALUE = re.compile(r" value: <\d+ (\S+?)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\)")
_RANGE = re.compile(r"^    (\S+):(\d+)-(\d+)$", re.M)


def live_peak(dump_dir: str | pathlib.Path) -> dict:
    """``{"live_bytes", "at", "idle_output_bytes", "heap_gap_bytes", "module"}`` for the one
    program dumped under ``dump_dir`` (module docstring).

    Raises:
        ValueError: ``dump_dir`` holds no buffer-assignment dump, or more than one program's.
    """
    found = sorted(pathlib.Path(dump_dir).glob("*after_optimizations-buffer-assignment.txt"))
    if len(found) != 1:
        raise ValueError(f"live_peak: expected one program's buffer-assignment dump under {dump_dir}, found "
                         f"{[p.name for p in found]}; compile exactly one program with compiler options "
                         "xla_dump_to=<dir> and xla_dump_hlo_as_text=True")
    ba = found[0]
    ranges_text = pathlib.Path(str(ba).replace("-buffer-assignment.txt", "-live-range.txt")).read_text()
    allocs: dict[int, tuple[int, str]] = {}
    values: list[tuple[str, int, int, int]] = []  # (name, allocation, offset, size)
    current = None
    for line in ba.read_text().splitlines():
        m = _ALLOC.match(line)
        if m:
            current = int(m.group(1))
            allocs[current] = (int(m.group(2)), m.group(3))
            continue
        m = _VALUE.match(line)
        if m and current is not None:
            name = m.group(1) if "{" in m.group(1) else m.group(1) + "{}"
            values.append((name, current, int(m.group(3)), int(m.group(2))))
        elif not line.startswith(" ") and not m and current is not None and line.strip():
            current = None  # the per-allocation listing ended (totals, used values follow)
    ranges = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in _RANGE.finditer(ranges_text)}
    end = max((b for _, b in ranges.values()), default=0)
    whole = sum(size for size, kind in allocs.values() if kind.startswith("parameter"))
    # memory_analysis counts parameter, output (live-out) and temp allocations; not constants, not thread-locals
    outputs = {a for a, (_, kind) in allocs.items()
               if not kind.startswith("parameter") and ("output" in kind or "live-out" in kind)}
    temp = {a for a, (_, kind) in allocs.items() if "preallocated-temp" in kind}
    counted = outputs | temp
    best, at, used_at, heap_peak = -1, 0, {}, 0
    for t in range(end + 1):
        used = {a: v for a, v in _used(values, ranges, t).items() if a in counted}
        heap_peak = max(heap_peak, sum(v for a, v in used.items() if a in temp))
        total = whole + sum(used.values())
        if total > best:
            best, at, used_at = total, t, used
    return {"live_bytes": best, "at": at,
            "idle_output_bytes": sum(allocs[a][0] - used_at.get(a, 0) for a in outputs),
            "heap_gap_bytes": sum(allocs[a][0] for a in temp) - heap_peak, "module": ba.name}


def _used(values, ranges, t: int) -> dict[int, int]:
    """Bytes in use at point ``t`` in each allocation."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for name, a, off, size in values:
        if name in ranges and ranges[name][0] <= t <= ranges[name][1]:
            spans.setdefault(a, []).append((off, off + size))
    return {a: _union(sp) for a, sp in spans.items()}


def _union(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by byte ranges ``[lo, hi)`` (values sharing a buffer count once)."""
    total, reach = 0, -1
    for lo, hi in sorted(spans):
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total
