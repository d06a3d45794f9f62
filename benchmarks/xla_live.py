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
out values such as the elements of a combined all-reduce's result tuple. :func:`live_values` lists
the values live at that peak (or at any position), to set beside the model's live set where the
two disagree.

:func:`packed_heap` asks whether the fragmentation follows from the live ranges alone: it packs the
temp heap's buffers again from their sizes and live ranges, the way XLA's
``GlobalDecreasingSizeBestFitHeap`` does in its spatial order (``xla/service/heap_simulator``:
buffers largest first, then longest-lived on the simulator's clock, which ticks once per
allocation and once per free; each at the smallest gap that fits among the buffers live at the same
time, else above them; a buffer's colocated values — an op writing over its operand, a loop's
state — at one place), at XLA:CPU's 64-byte alignment (every offset in its buffer-assignment dumps
is a multiple of 64). Where the packed size is XLA's heap, a cost model that knows each buffer's
live range can predict the fragmentation by the same packing. Measured on 62 layouts of
``benchmarks/memory_vs_xla.py`` (38 of its 41 rows off XLA's figure by more than 10%, and 24 drawn
from the rest): within 0.1% of XLA's heap on 53 and within 1% on 59, among them the llama and MoE
forward passes whose heaps are 18-28% fragmentation; 14% and 24% under it on the MLP step
``io:data;batch:model|*:model@3`` and the llama forward ``vocab:model;d_ff:model;kv_heads:data``,
and 12% under on a heap of 296 bytes; on the replicated llama forward pass 3.8% over.

Run: ``python benchmarks/xla_live.py DUMP_DIR [--at POSITION]``
"""
from __future__ import annotations

import pathlib
import re
import sys

__all__ = ["live_peak", "live_values", "packed_heap", "main"]

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
    return _peak(_read(dump_dir, "live_peak"))


def live_values(dump_dir: str | pathlib.Path, at: int | None = None) -> list[dict]:
    """The values live at position ``at`` of the schedule (default: :func:`live_peak`'s ``at``) in
    the output allocations and the temp heap of the program dumped under ``dump_dir``, largest
    first: ``{"value", "bytes", "allocation", "offset", "start", "stop"}`` (``start..stop``: its
    live range). Values sharing bytes of one allocation are each listed. What a miss of the cost
    model is made of: set it beside the model's live set at its own peak.

    Raises:
        ValueError: as :func:`live_peak`.
    """
    dump = _read(dump_dir, "live_values")
    return _values_at(dump, _peak(dump)["at"] if at is None else at)


def packed_heap(dump_dir: str | pathlib.Path) -> dict:
    """``{"heap_bytes", "packed_bytes", "live_bytes", "buffers"}`` for the temp heap of the program
    dumped under ``dump_dir``: XLA's size of it, the size that packing its buffers by best fit,
    largest first (module docstring) gives, the most of their bytes live at once, and how many
    buffers there are. A buffer is one value, or values XLA keeps at one offset (colocated): an op
    writing over its operand (the two live ranges meet at that op), or a loop's state (the
    ``while``'s values and its body's parameter, ``wide.param``). Its place must be free over each
    of its values' live ranges, not between them; it is ordered by its first value's duration, on
    the heap simulator's clock (:func:`_events`), as XLA orders a buffer and its colocations.

    Raises:
        ValueError: as :func:`live_peak`.
    """
    return _packed(_read(dump_dir, "packed_heap"))


def _packed(dump: tuple) -> dict:
    """:func:`packed_heap` of a dump :func:`_read` parsed."""
    ba, allocs, values, ranges = dump
    temp = _counted(allocs)[2]
    if len(temp) != 1:
        raise ValueError(f"packed_heap: expected one temp heap (preallocated-temp allocation) in {ba}, "
                         f"found {len(temp)}")
    (heap,) = temp
    in_heap = [(n, off, size) for n, a, off, size in values if a == heap and n in ranges]
    bufs = _heap_buffers(in_heap, ranges)
    alloc_event, free_event = _events([ranges[n] for n, _, _ in in_heap])

    def largest_then_longest(buf: tuple[int, list]) -> tuple:
        start, stop = buf[1][0]
        return -_aligned(buf[0]), alloc_event[start] - free_event[stop], start

    placed: list[tuple[int, int, list]] = []  # (offset, aligned end, live ranges)
    top = 0
    for size, spans in sorted(bufs, key=largest_then_longest):
        need, reach, best = _aligned(size), 0, None
        busy = sorted((o, e) for o, e, other in placed
                      if any(s <= t2 and s2 <= t for s, t in spans for s2, t2 in other))
        for lo, hi in busy:
            if lo - reach >= need and (best is None or lo - reach < best[1]):
                best = (reach, lo - reach)
            reach = max(reach, hi)
        offset = best[0] if best else reach
        placed.append((offset, offset + need, spans))
        top = max(top, offset + size)
    points = {s for _, spans in bufs for s, _ in spans}
    live = max((sum(_aligned(size) for size, spans in bufs if any(s <= t <= e for s, e in spans))
                for t in points), default=0)
    return {"heap_bytes": allocs[heap][0], "packed_bytes": top, "live_bytes": live, "buffers": len(bufs)}


def _events(spans: list[tuple[int, int]]) -> tuple[dict[int, int], dict[int, int]]:
    """``({position: events before its allocations}, {position: events before its frees})``: the heap
    simulator's clock, which ticks once per allocation and once per free, at each position of the
    schedule its allocations first, then its frees, over the live ranges ``spans``."""
    allocs: dict[int, int] = {}
    frees: dict[int, int] = {}
    for start, stop in spans:
        allocs[start] = allocs.get(start, 0) + 1
        frees[stop] = frees.get(stop, 0) + 1
    before_alloc, before_free, clock = {}, {}, 0
    for t in range(max((stop for _, stop in spans), default=-1) + 1):
        before_alloc[t] = clock
        clock += allocs.get(t, 0)
        before_free[t] = clock
        clock += frees.get(t, 0)
    return before_alloc, before_free


def _aligned(n: int) -> int:
    return -(-n // 64) * 64


def _heap_buffers(values: list[tuple[str, int, int]], ranges: dict) -> list[tuple[int, list[tuple[int, int]]]]:
    """``(size, live ranges)`` of the buffers of :func:`packed_heap` made of the temp heap's ``values``
    (``(name, offset, size)``), the ranges in the order of their starts. Values at one offset one
    after the other, whose ranges do not meet, are separate buffers the packing put in one place."""
    chains: list[list] = []  # [offset, size, live ranges, is loop state]
    for name, off, size in sorted(values, key=lambda v: (v[1], v[2], ranges[v[0]][0])):
        start, stop = ranges[name]
        loop = name.startswith(("while", "wide.param"))
        last = chains[-1] if chains else None
        if last and last[:2] == [off, size] and start <= max(t for _, t in last[2]):
            last[2].append((start, stop))
            last[3] = last[3] or loop
        else:
            chains.append([off, size, [(start, stop)], loop])
    out: list[tuple[int, list[tuple[int, int]]]] = []
    state: dict[tuple[int, int], int] = {}
    for off, size, spans, loop in chains:
        if loop and (off, size) in state:
            out[state[off, size]][1].extend(spans)
            continue
        if loop:
            state[off, size] = len(out)
        out.append((size, spans))
    return out


def _peak(dump: tuple) -> dict:
    """:func:`live_peak` of a dump :func:`_read` parsed."""
    ba, allocs, values, ranges = dump
    end = max((b for _, b in ranges.values()), default=0)
    whole = sum(size for size, kind in allocs.values() if kind.startswith("parameter"))
    counted, outputs, temp = _counted(allocs)
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


def _values_at(dump: tuple, t: int) -> list[dict]:
    """:func:`live_values` at position ``t`` of a dump :func:`_read` parsed."""
    _, allocs, values, ranges = dump
    counted = _counted(allocs)[0]
    out = [{"value": name, "bytes": size, "allocation": a, "offset": off, "start": ranges[name][0],
            "stop": ranges[name][1]}
           for name, a, off, size in _live_at(values, ranges, t) if a in counted]
    return sorted(out, key=lambda v: (-v["bytes"], v["value"]))


def _read(dump_dir: str | pathlib.Path, caller: str) -> tuple:
    """``(buffer-assignment file, {allocation: (size, kind)}, [(value, allocation, offset, size)],
    {value: (start, stop)})`` of the one program dumped under ``dump_dir``."""
    found = sorted(pathlib.Path(dump_dir).glob("*after_optimizations-buffer-assignment.txt"))
    if len(found) != 1:
        raise ValueError(f"{caller}: expected one program's buffer-assignment dump under {dump_dir}, found "
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
    return ba, allocs, values, ranges


def _counted(allocs: dict[int, tuple[int, str]]) -> tuple[set, set, set]:
    """``(counted, outputs, temp)``: the allocations ``memory_analysis`` counts beside the
    parameters (output or live-out, and the temp heap; not constants, not thread-locals)."""
    outputs = {a for a, (_, kind) in allocs.items()
               if not kind.startswith("parameter") and ("output" in kind or "live-out" in kind)}
    temp = {a for a, (_, kind) in allocs.items() if "preallocated-temp" in kind}
    return outputs | temp, outputs, temp


def _used(values, ranges, t: int) -> dict[int, int]:
    """Bytes in use at point ``t`` in each allocation."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for _, a, off, size in _live_at(values, ranges, t):
        spans.setdefault(a, []).append((off, off + size))
    return {a: _union(sp) for a, sp in spans.items()}


def _live_at(values, ranges, t: int):
    """The ``(value, allocation, offset, size)`` of ``values`` whose live range holds point ``t``."""
    return ((name, a, off, size) for name, a, off, size in values
            if name in ranges and ranges[name][0] <= t <= ranges[name][1])


def _union(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by byte ranges ``[lo, hi)`` (values sharing a buffer count once)."""
    total, reach = 0, -1
    for lo, hi in sorted(spans):
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total


def main(argv: list[str] | None = None) -> int:
    """Print a dump's split of ``memory_analysis`` (:func:`live_peak`) and the values live at its
    peak, or at ``--at``."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump_dir", help="the xla_dump_to folder of one compiled program")
    ap.add_argument("--at", type=int, help="a position of the schedule (default: the live peak)")
    a = ap.parse_args(argv)
    try:
        dump = _read(a.dump_dir, "xla_live")
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    peak = _peak(dump)
    found = _values_at(dump, peak["at"] if a.at is None else a.at)
    print(f"{peak['module']}: live peak {peak['live_bytes']} B at {peak['at']}, idle output allocations "
          f"{peak['idle_output_bytes']} B, heap fragmentation {peak['heap_gap_bytes']} B")
    try:
        packed = _packed(dump)
        print(f"temp heap {packed['heap_bytes']} B; its {packed['buffers']} buffers packed by best fit from their "
              f"live ranges: {packed['packed_bytes']} B ({packed['live_bytes']} B live at once)")
    except ValueError as e:  # a program without one temp heap: said, and the rest still printed
        print(f"temp heap not packed: {e}")
    print(f"values live at {peak['at'] if a.at is None else a.at} (output allocations and temp heap):")
    for v in found:
        print(f"  {v['bytes']:>10} {v['value']:<40} allocation {v['allocation']} offset {v['offset']}"
              f" live {v['start']}-{v['stop']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
