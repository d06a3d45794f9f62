"""A tiny progress bar for the long steps (tracing, search, compiling and running layouts).

On a terminal it redraws one line (``[####------] 2/4  executing batch:rows  12.3 s``);
elsewhere (CI logs, pipes) it prints one line per finished step. It writes to
stderr so that ``--json`` output on stdout stays clean.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, Callable, TextIO, TypeVar

__all__ = ["Progress", "progress"]

T = TypeVar("T")


class Progress:
    """``with Progress(4, "executing") as p: p.start("layout A"); ...; p.advance()``.

    ``enabled=False`` makes every call a no-op (e.g. ``--quiet``).
    """

    def __init__(self, total: int, label: str = "", *, stream: TextIO | None = None, width: int = 24,
                 enabled: bool = True) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.enabled = enabled
        self.done = 0
        self.item = ""
        self.t0 = time.perf_counter()
        self.t_item = self.t0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_len = 0

    def _bar(self) -> str:
        filled = int(self.width * self.done / self.total)
        return "[" + "#" * filled + "-" * (self.width - filled) + "]"

    def _draw(self, text: str, final: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            pad = max(self._last_len - len(text), 0)
            self.stream.write("\r" + text + " " * pad + ("\n" if final else ""))
            self._last_len = 0 if final else len(text)
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()

    def start(self, item: str) -> None:
        """Announce the step that starts now."""
        self.item = item
        self.t_item = time.perf_counter()
        self._draw(f"  {self._bar()} {self.done}/{self.total} {self.label} {item} ...")

    def advance(self, note: str = "") -> None:
        """Mark the current step finished."""
        self.done = min(self.done + 1, self.total)
        took = time.perf_counter() - self.t_item
        text = f"  {self._bar()} {self.done}/{self.total} {self.label} {self.item} ({took:.1f} s{', ' + note if note else ''})"
        # a terminal keeps one line until the last step; a log gets a line per step
        self._draw(text, final=not self.tty or self.done == self.total)

    def close(self) -> None:
        if self.tty and self._last_len:
            self._draw("", final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress(items: Iterable[T], label: str = "", *, describe: Callable[[T], str] = str,
             enabled: bool = True, stream: TextIO | None = None) -> Iterator[T]:
    """Iterate over ``items`` with a progress bar: ``for x in progress(xs, "executing"): ...``."""
    items = list(items)
    with Progress(len(items), label, enabled=enabled, stream=stream) as bar:
        for item in items:
            bar.start(describe(item))
            yield item
            bar.advance()
