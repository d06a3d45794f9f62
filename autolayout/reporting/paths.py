"""``--out`` paths of the command line, checked before any work is done.

A report directory (``report``, ``demo``) or a file (``calibrate``) that cannot be written
is a :class:`ValueError` naming ``--out``, the path and the fix, raised before the command
traces, searches or runs anything; a missing folder is fine (it is created when written).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["check_out_dir", "check_out_file"]


def _try_writing_in(folder: Any) -> None:
    """Create ``folder`` (and its missing parents) and a file in it, then remove all it created.

    Raises:
        OSError: ``folder`` cannot be created or written.
    """
    folder = Path(folder)
    created, p = [], folder
    while not p.exists() and p != p.parent:
        created.append(p)  # innermost first: the order to remove them in
        p = p.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".autolayout-write-test-")
        os.close(fd)
        os.unlink(probe)
    finally:
        for d in created:
            if d.is_dir():
                d.rmdir()


def check_out_dir(out: str) -> None:
    """``--out`` for a report directory: raise ValueError before any work if it cannot be written
    (a missing directory is fine: it is created when the report is written)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out} is an existing file, not a directory: give a directory path for the report "
                         "(it is created if missing), or remove the file")
    try:
        _try_writing_in(out)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot create it or write in it ({exc.strerror or exc}); give a directory "
                         "you can write to (it is created if missing)") from exc


def check_out_file(out: str) -> None:
    """``--out`` for a file: raise ValueError before any work if it cannot be written (its
    missing parent folders are created when it is written)."""
    if os.path.isdir(out):
        raise ValueError(f"--out {out} is a directory: give a file path, e.g. --out {os.path.join(out, 'profile.json')}")
    try:
        if os.path.exists(out):
            with open(out, "a"):  # opening to append changes nothing
                pass
        else:
            _try_writing_in(os.path.dirname(out) or ".")
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write a file there ({exc.strerror or exc}); give a path you can "
                         "write to") from exc
