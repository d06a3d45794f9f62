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

__all__ = ["time_bars", "memory_bars", "scatter", "scaling_lines", "lines", "paper_bars"]

COMPUTE = "#4C72B0"
COMM = "#DD8452"
MEASURED = "#55A868"
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
    fig.savefig(buf, format="png")
    return buf.getvalue()


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
    comp = [c * 1e3 for c in compute_s]
    comm = [c * 1e3 for c in comm_s]
    ax.barh(y, comp, color=COMPUTE, label="compute (predicted)")
    ax.barh(y, comm, left=comp, color=COMM, label="communication (predicted)")
    if measured_s is not None and any(m == m for m in measured_s):
        ax.scatter([m * 1e3 for m in measured_s], y, marker="D", color=MEASURED, zorder=3,
                   label="measured step")
    ax.set_yticks(y, names)
    ax.set_xlabel("time per step (ms)")
    ax.set_title(title or "Predicted step time: compute vs communication")
    ax.legend(loc="lower right", fontsize=8)
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
    mib = 2**20
    if breakdown:
        left = [0.0] * len(names)
        for k, key in enumerate(("params", "grads", "opt_state", "activations")):
            vals = [b.get(key, 0) / mib for b in breakdown]
            ax.barh(y, vals, left=left, color=PALETTE[k], label=key)
            left = [a + b for a, b in zip(left, vals)]
        rest = [m / mib - lf for m, lf in zip(memory_bytes, left)]
        if any(r > 1e-9 for r in rest):
            ax.barh(y, [max(r, 0) for r in rest], left=left, color=PALETTE[5], label="other")
    else:
        ax.barh(y, [m / mib for m in memory_bytes], color=PALETTE[0], label="peak memory")
    top = max(memory_bytes or [1])
    hbm_label = f"HBM {hbm_bytes / 2**30:.3g} GiB"
    if hbm_bytes <= 20 * top:
        ax.axvline(hbm_bytes / mib, color="#C44E52", linestyle="--", label=hbm_label)
    else:  # a line at 20x the largest bar would squash every bar into the margin
        ax.plot([], [], color="#C44E52", linestyle="--",
                label=f"{hbm_label} (off the chart: {hbm_bytes / top:.3g}x the largest)")
    ax.set_yticks(y, names)
    ax.set_xlabel("memory per device (MiB)")
    ax.set_title(title or "Predicted peak memory per device")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def scatter(predicted_s: Sequence[float], measured_s: Sequence[float], labels: Sequence[str],
            rho: float, title: str = "", groups: Sequence[str] | None = None, max_labels: int = 10) -> bytes:
    """Predicted vs measured step time (log-log), one point per layout, Spearman rho in the title.

    ``groups`` colours the points (e.g. by model) with a legend; points are labelled only
    when there are at most ``max_labels`` of them (more would overlap).
    """
    fig = _figure(6.4, 4.6)
    ax = fig.add_subplot()
    groups = list(groups) if groups is not None else [""] * len(labels)
    pts = [(p * 1e3, m * 1e3, lab, grp) for p, m, lab, grp in zip(predicted_s, measured_s, labels, groups)
           if p == p and m == m and p > 0 and m > 0]
    if pts:
        for k, grp in enumerate(dict.fromkeys(g for *_, g in pts)):
            mine = [(p, m) for p, m, _, g in pts if g == grp]
            ax.scatter([p for p, _ in mine], [m for _, m in mine], color=PALETTE[k % len(PALETTE)], zorder=3,
                       label=grp or None)
        if len(pts) <= max_labels:
            for p, m, lab, _ in pts:
                ax.annotate(lab, (p, m), fontsize=7, xytext=(4, 3), textcoords="offset points")
        lo = min(min(p for p, *_ in pts), min(m for _, m, *_ in pts)) * 0.7
        hi = max(max(p for p, *_ in pts), max(m for _, m, *_ in pts)) * 1.4
        ax.plot([lo, hi], [lo, hi], color="#8C8C8C", linestyle=":", label="measured = predicted")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax)
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel("predicted step time (ms)")
    ax.set_ylabel("measured step time (ms)")
    rho_text = "n/a" if rho != rho else f"{rho:.2f}"
    ax.set_title((title or "Predicted vs measured") + f" (Spearman rho = {rho_text})")
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
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def lines(series: dict[str, tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str,
          title: str, logx: bool = False, logy: bool = False) -> bytes:
    """One line per named series of ``(x, y)``."""
    fig = _figure(6.8, 4.0)
    ax = fig.add_subplot()
    for k, (name, (x, y)) in enumerate(series.items()):
        ax.plot(list(x), list(y), marker="o", color=PALETTE[k % len(PALETTE)], label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _png(fig)


def paper_bars(names: Sequence[str], ours: Sequence[float], paper: Sequence[float], ylabel: str,
               title: str, log: bool = False) -> bytes:
    """Grouped bars: our prediction beside the paper's figure, per row."""
    fig = _figure(7.5, 3.8)
    ax = fig.add_subplot()
    x = list(range(len(names)))
    w = 0.38
    ax.bar([i - w / 2 for i in x], ours, w, color=COMPUTE, label="autolayout (predicted)")
    ax.bar([i + w / 2 for i in x], [p if p == p else 0 for p in paper], w, color=COMM, label="paper")
    ax.set_xticks(x, names, fontsize=8, rotation=12 if max(len(n) for n in names) > 12 else 0)
    if log and all(v > 0 for v in list(ours) + [p for p in paper if p == p]):
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
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
