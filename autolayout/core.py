"""Core value types: Dim, Mesh, Layout (being written; Dim is the contract)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dim:
    """A named tensor dimension: ``str(Dim("batch", 256)) == "batch:256"``."""

    name: str
    size: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Dim name must be a non-empty string, got {self.name!r}")
        if int(self.size) != self.size or self.size < 1:
            raise ValueError(f"Dim {self.name!r} size must be a positive integer, got {self.size!r}")

    def __str__(self) -> str:
        return f"{self.name}:{self.size}"

    __repr__ = __str__


Shape = tuple[Dim, ...]
