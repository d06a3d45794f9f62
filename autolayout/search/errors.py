"""The search's error, in a module without the solver so that catching it stays cheap."""
from __future__ import annotations

from autolayout.core import Layout, LayoutError

__all__ = ["Dominated", "SearchError", "SearchWarning"]


class SearchError(LayoutError):
    """No layout satisfies the request (a ``ValueError``).

    Raised when the memory budget is below what any layout needs, and when the time
    budget ran out before the solver found a layout that fits (the message says what it
    found).

    Attributes:
        reason: ``"memory"`` (no layout fits: proven) or ``"time"`` (the time limit came
            before a fitting layout was found; one may exist).
        bound_s: for ``"time"``, a lower bound on the step time of any layout (seconds),
            when the solver had one; else ``None``.
        layout: for ``"memory"`` on one mesh, the layout (an ``autolayout.Layout``, with its remat
            policy) that reaches the smallest peak memory found, the least over the remat
            policies searched; else ``None``.
        memory_bytes: that layout's peak memory per device (bytes); else ``None``.
    """

    def __init__(self, message: str, *, reason: str = "memory", bound_s: float | None = None,
                 layout: Layout | None = None, memory_bytes: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.bound_s = bound_s
        self.layout = layout
        self.memory_bytes = memory_bytes


class SearchWarning(UserWarning):
    """A search result that is not proven optimal (status ``FEASIBLE``) returned without its status."""


class Dominated(Exception):
    """Internal to the search: ``solver.solve(..., upper_s=t)`` proved that no layout that fits
    the memory limit takes at most ``t`` seconds per step (another search of the same request,
    e.g. under another remat policy, already has one that fast)."""
