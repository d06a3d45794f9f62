"""Units the user writes: memory sizes (``"16GiB"``), read the same by the API and the CLI, and
written the same by the search's errors, the reports and the command line (:func:`fmt_bytes`).

The lowest layer (no autolayout imports), so the search, the reports and the command
line share one parser and one formatter.
"""
from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["SizeError", "fmt_bytes", "parse_bytes"]


class SizeError(ValueError):
    """A memory size that cannot be read (e.g. ``"16 parsecs"``)."""


_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}


def parse_bytes(text: Any) -> float:
    """A memory size in bytes: ``"16GiB"``, ``"16 GB"``, ``"512MiB"``, ``"1.5e9"``, ``1e9``, ``"inf"``.

    Decimal units (KB, MB, GB, TB) are powers of 10, binary ones (KiB, MiB,
    GiB, TiB) powers of 2; case is ignored.

    >>> parse_bytes("16GiB"), parse_bytes("2 GB"), parse_bytes("inf")
    (17179869184.0, 2000000000.0, inf)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        if s.lower() in ("inf", "infinity", "none", "unlimited"):
            return math.inf
        # a sign is read so that '-5GiB' is "must be positive", not "cannot read"
        m = re.fullmatch(r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)", s)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise SizeError(
                f"cannot read memory size {text!r}: expected a number with an optional unit "
                "B, KB, MB, GB, TB (powers of 10) or KiB, MiB, GiB, TiB (powers of 2), e.g. '16GiB'")
        value = float(m.group(1)) * _UNITS[unit]
    if not value > 0:
        raise SizeError(f"memory size must be positive, got {text!r}; give bytes per device, e.g. '16GiB'")
    return value


def fmt_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``; binary units, 3 significant digits."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return ""
    if math.isinf(n):
        return "inf"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"
