"""Which of XLA's memory schedulers ordered each committed XLA:GPU program, replayed on its own HLO.

XLA:GPU orders a module with ``DefaultMemoryScheduler`` (list, DFS and post-order schedules, the
least peak kept: ``autolayout/costmodel/schedulers.py``). The committed H200 programs
(``reports/gpu/hlo.zip``, ``hlo_loss.zip``: the compiled HLO ``gpu_validate.py`` saved) print
their entry computation in the order XLA ran it. This script builds that computation's graph from
the text (each instruction, its operands, the bytes of its result; a ``bitcast`` or
``get-tuple-element`` defines nothing; parameters and constants are ignored by the heuristics),
runs ``autolayout.costmodel.schedulers``' three schedulers on it, and prints how closely each
reproduces XLA's sequence: Kendall's tau over every pair of instructions and the share of
positions where the two sequences hold the same instruction. Independent of the cost model: the
reference is XLA's own order, the graph XLA's own instructions.

Where one scheduler matches XLA's order closely (tau near 1) the implementations and the
mechanism are confirmed for that program; which of the three XLA kept depends on the whole
module's peak, while bodies included, which this script does not replay.

Run: ``PYTHONPATH=$PWD python benchmarks/xla_memory_scheduler.py [--dir reports/gpu]``
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xla_schedule_live import entry_instructions  # noqa: E402

from autolayout.costmodel.schedulers import dfs_schedule, list_schedule, post_order_schedule  # noqa: E402
from autolayout.exec.hlo import array_bytes  # noqa: E402

__all__ = ["SCHEDULERS", "replay", "kendall_tau", "main"]

SCHEDULERS = ("list", "dfs", "post-order")
_ALIASES = ("bitcast", "get-tuple-element")  # XLA's dataflow: these define no buffer of their own
_SCALAR = re.compile(r"[a-z]+[0-9]*\[\](\{\})?")


def replay(hlo_text: str) -> tuple[list[str], dict[str, list[str]]]:
    """``(XLA's sequence, {scheduler: its order})`` of the entry computation of ``hlo_text``, each
    scheduler of :data:`SCHEDULERS` run on the computation's own instructions. The list scheduler
    reads values as XLA's dataflow has them (:func:`_values`)."""
    ins = entry_instructions(hlo_text)
    names = [x["name"] for x in ins]
    present = set(names)
    operands = {x["name"]: [o for o in x["operands"] if o in present] for x in ins}
    ignored = {x["name"] for x in ins if x["opcode"] in ("parameter", "constant")}
    values, value_bytes, defined = _values(ins, ignored)
    buffers = {x["name"]: [v for o in operands[x["name"]] for v in values[o]] for x in ins}
    scalars = {x["name"] for x in ins if _SCALAR.fullmatch(x["shape"].strip())}
    roots = [x["name"] for x in ins if x["root"]]
    return names, {
        "list": list_schedule(names, operands, defined, live_out={v for r in roots for v in values[r]},
                              ignored=ignored, scalars=scalars, buffers=buffers, buffer_bytes=value_bytes),
        "dfs": dfs_schedule(names, operands, defined, roots=roots, ignored=ignored),
        "post-order": post_order_schedule(names, operands, roots=roots),
    }


def _values(ins: list[dict], ignored: set[str]) -> tuple[dict[str, list], dict, dict[str, int]]:
    """``(the values each instruction holds, each value's bytes, the bytes each instruction
    defines)``, as ``HloDataflowAnalysis`` has them: a ``bitcast`` holds its operand's values, a
    ``get-tuple-element`` the element's, a ``tuple`` its operands' and a pointer table of its own
    (8 bytes an element), a tuple-shaped instruction one value per element and the table, any
    other one value. Parameters' and constants' values have no bytes (``ListScheduler`` ignores
    them)."""
    values: dict[str, list] = {}
    value_bytes: dict = {}
    defined: dict[str, int] = {}
    for x in ins:
        name, op = x["name"], x["opcode"]
        arrays = [b for _, _, b in array_bytes(x["shape"])]
        tupled = x["shape"].strip().startswith("(")
        if op == "bitcast":
            values[name] = list(values[x["operands"][0]])
        elif op == "get-tuple-element":
            src = values[x["operands"][0]]
            k = int(re.search(r"index=(\d+)", x["line"]).group(1))
            values[name] = [src[1 + k]] if len(src) > 1 else list(src)
        elif op == "tuple":
            values[name] = [(name, "table")] + [v for o in x["operands"] for v in values[o][-1:]]
            value_bytes[(name, "table")] = 0 if name in ignored else 8 * len(x["operands"])
        elif tupled:
            values[name] = [(name, "table")] + [(name, k) for k in range(len(arrays))]
            value_bytes[(name, "table")] = 8 * len(arrays)
            value_bytes.update({(name, k): b for k, b in enumerate(arrays)})
        else:
            values[name] = [(name, 0)]
            value_bytes[(name, 0)] = sum(arrays)
        own = [v for v in values[name] if v[0] == name]
        if name in ignored:
            value_bytes.update({v: 0 for v in own})
        defined[name] = sum(value_bytes[v] for v in own)
    return values, value_bytes, defined


def kendall_tau(a: list[str], b: list[str]) -> float:
    """Kendall's tau between two orders of the same items (1: the same order, -1: reversed)."""
    pos = {n: i for i, n in enumerate(b)}
    x = [pos[n] for n in a]
    n = len(x)
    pairs = n * (n - 1) // 2
    inversions = sum(x[i] > x[j] for i in range(n) for j in range(i + 1, n))
    return 1.0 - 2.0 * inversions / pairs if pairs else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="reports/gpu", help="folder with hlo.zip (and hlo_loss.zip)")
    a = ap.parse_args(argv)
    print(f"{'program':22s} " + " ".join(f"{s:>18s}" for s in SCHEDULERS) + "   closest")
    print(f"{'':22s} " + " ".join(f"{'tau / same place':>18s}" for _ in SCHEDULERS))
    for archive in ("hlo.zip", "hlo_loss.zip"):
        path = os.path.join(a.dir, archive)
        if not os.path.exists(path):
            continue
        with zipfile.ZipFile(path) as z:
            for member in sorted(z.namelist()):
                seq, orders = replay(z.read(member).decode())
                cells, taus = [], {}
                for s in SCHEDULERS:
                    taus[s] = kendall_tau(orders[s], seq)
                    same = sum(p == q for p, q in zip(orders[s], seq)) / len(seq)
                    cells.append(f"{taus[s]:7.3f} / {same:6.0%}   ")
                name = member.removesuffix(".compiled.txt")
                print(f"{name:22s} " + " ".join(f"{c:>18s}" for c in cells) + f"   {max(taus, key=taus.get)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
