"""Formatting shared by the command line, the demo and the reports."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from autolayout.units import SizeError, fmt_bytes, parse_bytes  # re-exported: the CLI and reports read and write sizes

__all__ = ["parse_bytes", "fmt_bytes", "fmt_time", "fmt_num", "short_layout", "text_table", "spearman",
           "SizeError"]


def fmt_time(s: float) -> str:
    """Seconds in the unit that reads best: ``0.00123 -> '1.23 ms'``."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return ""
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def fmt_num(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.{digits}g}"


# storage (weight-update) sharding stages as reports name them: seed 003's weight-update
# sharding is ZeRO stage 1 (Rajbhandari et al. 2020); stage 3 is FSDP
STAGE_NAMES = {1: "WUS", 2: "ZeRO-2", 3: "ZeRO-3"}


def short_layout(layout: Any, limit: int = 60) -> str:
    """A layout as text that fits a table cell.

    Storage (weight-update) sharding entries are summarised per stage
    (``"| WUS: 15 params over rows,cols"``, ``"| ZeRO-3: all params over fsdp"``) and the
    replicated layout reads ``(replicated)``.
    """
    from autolayout.core import Layout

    lay = Layout.coerce(layout)
    text = str(Layout(lay.rules)) or "(replicated)"
    storage = getattr(lay, "storage", None) or tuple((p, axes, 1) for p, axes in lay.update_sharding)
    named = any(p != "*" for p, _, _ in storage)  # then a '*' entry covers the others only
    by_stage: dict[int, dict[tuple[str, ...], list[str]]] = {}
    for param, axes, stage in storage:
        if axes:  # 'param:-' (stored whole) is summed up last
            by_stage.setdefault(stage, {}).setdefault(tuple(axes), []).append(param)
    for stage in sorted(by_stage):
        parts = []
        for axes, params in by_stage[stage].items():
            n = sum(p != "*" for p in params)
            who = ([f"{n} param{'s' * (n != 1)}"] if n else []) + (["all others" if named else "all params"]
                                                                   if "*" in params else [])
            parts.append(f"{' + '.join(who)} over {','.join(axes)}")
        text += f" | {STAGE_NAMES.get(stage, f'stage {stage}')}: " + "; ".join(parts)
    whole = sum(not axes for _, axes, _ in storage)
    if whole:
        text += f" | {whole} param{'s' * (whole != 1)} whole"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def text_table(rows: Sequence[Sequence[Any]], head: Sequence[str], align: str | None = None,
               indent: str = "  ") -> str:
    """Rows under a header, columns padded; ``align`` has one ``<`` or ``>`` per column."""
    align = align or "<" + ">" * (len(head) - 1)
    cells = [tuple(str(c) for c in head)] + [tuple("" if c is None else str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = []
    for k, row in enumerate(cells):
        lines.append(indent + "  ".join(c.ljust(w) if a == "<" else c.rjust(w)
                                        for c, w, a in zip(row, widths, align)).rstrip())
        if k == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ranks(values: Sequence[float]) -> list[float]:
    """Average ranks (ties share the mean of their positions), as Spearman needs."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation of paired values (NaN pairs dropped; NaN if < 3 pairs or constant).

    >>> spearman([1, 2, 3, 4], [10, 20, 25, 100])
    1.0
    """
    pairs = [(float(a), float(b)) for a, b in zip(x, y)
             if a is not None and b is not None and not (math.isnan(float(a)) or math.isnan(float(b)))]
    if len(pairs) < 3:
        return math.nan
    rx, ry = _ranks([a for a, _ in pairs]), _ranks([b for _, b in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return math.nan
    return cov / math.sqrt(vx * vy)
