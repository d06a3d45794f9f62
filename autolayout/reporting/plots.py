"""The charts of a report, as PNG bytes.

Figures are built with matplotlib's object API on an Agg canvas (no pyplot, no global
backend switch), so they render headless and do not disturb a notebook's backend. In a
notebook, show one with ``IPython.display.Image(png)``.
"""
from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["time_bars", "memory_bars", "scatter", "scaling_lines", "lines", "paper_bars", "time_unit",
           "byte_unit"]

COMPUTE = "#4C72B0"
COMM = "#DD8452"
MEASURED = "#55A868"
MARKERS = ["o", "s", "D", "^", "v", "P", "X", "*"]
PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def _figure(width: float = 7.5, height: float = 3.6) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", bbox_inches="tight", pad_inches=0.1)  # keeps legends outside the axes
    return buf.getvalue()


def _legend_outside(ax: Any, **kw: Any) -> None:
    """The legend to the right of the axes, where it cannot cover data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, frameon=False, **kw)


def time_unit(seconds: Sequence[float]) -> tuple[str, float]:
    """``(unit, scale)`` that shows the largest of ``seconds`` as a number between 1 and 1000."""
    top = max([abs(v) for v in seconds if v == v] or [0.0])
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if top >= scale:
            return unit, scale
    return "ns", 1e-9


def byte_unit(values: Sequence[float]) -> tuple[str, float]:
    """``(unit, scale)`` in binary units that shows the largest of ``values`` below 1024."""
    top = max([abs(v) for v in values if v == v] or [0.0])
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if top >= scale:
            return unit, scale
    return "B", 1.0


def _height(n: int) -> float:
    return max(2.4, 0.9 + 0.42 * n)


def time_bars(names: Sequence[str], compute_s: Sequence[float], comm_s: Sequence[float],
              measured_s: Sequence[float] | None = None, title: str = "") -> bytes:
    """Stacked horizontal bars: predicted compute + communication per layout (ms).

    ``measured_s`` (optional) adds a marker for the measured step time of each layout.
    """
    fig = _figure(7.5, _height(len(names)))
    ax = fig.add_subplot()
    y = list(range(len(names)))[::-1]
    unit, scale = time_unit([c + m for c, m in zip(compute_s, comm_s)] + list(measured_s or []))
    comp = [c / scale for c in compute_s]
    comm = [c / scale for c in comm_s]
    ax.barh(y, comp, color=COMPUTE, label="compute (predicted)")
    ax.barh(y, comm, left=comp, color=COMM, label="communication (predicted)")
    if measured_s is not None and any(m == m for m in measured_s):
        ax.scatter([m / scale for m in measured_s], y, marker="D", color=MEASURED, zorder=3,
                   label="measured step")
    ax.set_yticks(y, names)
    ax.set_xlabel(f"time per step ({unit})")
    ax.set_title(title or "Predicted step time: compute vs communication")
    _legend_outside(ax)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def memory_bars(names: Sequence[str], memory_bytes: Sequence[float], hbm_bytes: float,
                breakdown: Sequence[dict] | None = None, title: str = "") -> bytes:
    """Predicted peak memory per device per layout, against the device's HBM (dashed line).

    A log axis is used when HBM dwarfs every layout (small models), so the bars stay readable.
    """
    fig = _figure(7.5, _height(len(names)))
    ax = fig.add_subplot()
    y = list(range(len(names)))[::-1]
    top = max(memory_bytes or [1])
    show_hbm = hbm_bytes <= 20 * top  # a line at 20x the largest bar would squash every bar into the margin
    unit, scale = byte_unit(list(memory_bytes) + ([hbm_bytes] if show_hbm else []))
    if breakdown:
        left = [0.0] * len(names)
        for k, key in enumerate(("params", "grads", "opt_state", "activations")):
            vals = [b.get(key, 0) / scale for b in breakdown]
            ax.barh(y, vals, left=left, color=PALETTE[k], label=key.replace("opt_state", "optimizer state"))
            left = [a + b for a, b in zip(left, vals)]
        rest = [m / scale - lf for m, lf in zip(memory_bytes, left)]
        if any(r > 1e-9 for r in rest):
            ax.barh(y, [max(r, 0) for r in rest], left=left, color=PALETTE[5], label="other")
    else:
        ax.barh(y, [m / scale for m in memory_bytes], color=PALETTE[0], label="peak memory")
    hbm_label = f"HBM {hbm_bytes / 2**30:.3g} GiB"
    if show_hbm:
        ax.axvline(hbm_bytes / scale, color="#C44E52", linestyle="--", label=hbm_label)
    else:
        ax.plot([], [], color="#C44E52", linestyle="--",
                label=f"{hbm_label}\n(off the chart: {hbm_bytes / top:.3g}x\nthe largest bar)")
    ax.set_yticks(y, names)
    ax.set_xlabel(f"memory per device ({unit})")
    ax.set_title(title or "Predicted peak memory per device")
    _legend_outside(ax)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def scatter(predicted_s: Sequence[float], measured_s: Sequence[float], labels: Sequence[str],
            rho: float, title: str = "", groups: Sequence[str] | None = None, max_labels: int = 10,
            xlabel: str = "predicted step time") -> bytes:
    """Predicted vs measured step time (log-log), one point per layout, Spearman rho in the title.

    With ``groups`` (e.g. the model) points are coloured by group; otherwise, with at most
    ``max_labels`` points, each point has its own marker and legend entry (outside the
    axes, so labels never overlap the points or each other).
    """
    fig = _figure(7.6, 4.4)
    ax = fig.add_subplot()
    pts = [(p, m, lab, grp) for p, m, lab, grp in
           zip(predicted_s, measured_s, labels, list(groups) if groups is not None else [""] * len(labels))
           if p == p and m == m and p > 0 and m > 0]
    unit, scale = time_unit([p for p, *_ in pts] + [m for _, m, *_ in pts])
    if pts:
        if groups is None and len(pts) <= max_labels:
            for k, (p, m, lab, _) in enumerate(pts):
                ax.scatter([p / scale], [m / scale], color=PALETTE[k % len(PALETTE)], marker=MARKERS[k % len(MARKERS)],
                           s=46, zorder=3, label=lab)
        else:
            for k, grp in enumerate(dict.fromkeys(g for *_, g in pts)):
                mine = [(p, m) for p, m, _, g in pts if g == grp]
                ax.scatter([p / scale for p, _ in mine], [m / scale for _, m in mine], color=PALETTE[k % len(PALETTE)],
                           zorder=3, label=grp or None)
        lo = min(min(p for p, *_ in pts), min(m for _, m, *_ in pts)) * 0.7 / scale
        hi = max(max(p for p, *_ in pts), max(m for _, m, *_ in pts)) * 1.4 / scale
        ax.plot([lo, hi], [lo, hi], color="#8C8C8C", linestyle=":", label="measured = predicted")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax)
        _legend_outside(ax)
    ax.set_xlabel(f"{xlabel} ({unit})")
    ax.set_ylabel(f"measured step time ({unit})")
    rho_text = "n/a" if rho != rho else f"{rho:.2f}"
    ax.set_title((title or "Predicted vs measured") + f" (Spearman rho = {rho_text})", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    return _png(fig)


def scaling_lines(df: Any, title: str = "") -> bytes:
    """Predicted efficiency (MFU) vs number of devices, one line per layout family.

    ``df`` has columns ``layout_family``, ``devices``, ``efficiency`` and ``fits``;
    layouts that do not fit in HBM are drawn hollow.
    """
    fig = _figure(6.8, 4.2)
    ax = fig.add_subplot()
    for k, (fam, part) in enumerate(df.groupby("layout_family", sort=False)):
        part = part.sort_values("devices")
        color = PALETTE[k % len(PALETTE)]
        ax.plot(part.devices, part.efficiency * 100, marker="o", color=color, label=fam)
        bad = part[~part.fits]
        if len(bad):
            ax.scatter(bad.devices, bad.efficiency * 100, s=80, facecolors="white", edgecolors=color, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 100)
    ax.set_xlabel("devices (batch and hidden scaled with sqrt(devices))")
    ax.set_ylabel("predicted efficiency (% of peak)")
    ax.set_title(title or "Scaling (paper §8.6)")
    if len(df) and not df.fits.all():
        ax.scatter([], [], s=80, facecolors="white", edgecolors="#555", label="does not fit in HBM")
    _legend_outside(ax)
    ax.grid(alpha=0.3)
    return _png(fig)


def lines(series: dict[str, tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str,
          title: str, logx: bool = False, logy: bool = False, xticks: Sequence[float] | None = None) -> bytes:
    """One line per named series of ``(x, y)``; ``xticks`` labels those x values plainly."""
    fig = _figure(7.2, 4.0)
    ax = fig.add_subplot()
    for k, (name, (x, y)) in enumerate(series.items()):
        ax.plot(list(x), list(y), marker=MARKERS[k % len(MARKERS)], color=PALETTE[k % len(PALETTE)], label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    if xticks is not None:
        from matplotlib.ticker import NullFormatter
        ax.set_xticks(list(xticks), [f"{v:g}" for v in xticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _legend_outside(ax)
    ax.grid(alpha=0.3, which="both")
    return _png(fig)


def paper_bars(names: Sequence[str], ours: Sequence[float], paper: Sequence[float], ylabel: str,
               title: str, log: bool = False) -> bytes:
    """Grouped bars: our prediction beside the paper's figure, per row."""
    fig = _figure(7.5, 3.8)
    ax = fig.add_subplot()
    x = list(range(len(names)))
    w = 0.38
    top = max([abs(v) for v in list(ours) + list(paper) if v == v] or [0.0])
    scale, word = next(((s, w_) for s, w_ in ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands"))
                        if top >= s and not log), (1.0, ""))
    ax.bar([i - w / 2 for i in x], [v / scale for v in ours], w, color=COMPUTE, label="autolayout (predicted)")
    ax.bar([i + w / 2 for i in x], [p / scale if p == p else 0 for p in paper], w, color=COMM, label="paper")
    ylabel = f"{ylabel} ({word})" if word else ylabel
    ax.set_xticks(x, names, fontsize=8, rotation=12 if max(len(n) for n in names) > 12 else 0)
    if log and all(v > 0 for v in list(ours) + [p for p in paper if p == p]):
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _legend_outside(ax)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def _plain_log_ticks(ax: Any) -> None:
    """Log axes labelled 0.5, 1, 2, 5, 10 ... rather than 5x10^-1."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if v is not None and not math.isnan(v)]
