"""The processor mesh: :class:`Mesh` (named axes and their sizes), the checks on the
names of mesh axes and tensor dims, and :class:`LayoutError`, the error of a malformed
mesh or layout. :mod:`autolayout.core` builds :class:`~autolayout.core.Layout` on them.
"""
from __future__ import annotations

import difflib
import math
import numbers
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # jax is imported lazily: core values must stay cheap to import
    import jax

__all__ = ["Mesh", "LayoutError", "check_name", "closest"]


class LayoutError(ValueError):
    """A mesh or layout is malformed, or does not fit a graph on a mesh.

    Messages say what is wrong, where (tensor, dimension, mesh axis), the sizes
    involved, and a fix.
    """


# Names must not contain the separators of the string forms, so that every
# Mesh and Layout prints to a string that parses back to the same value.
_NAME_RE = re.compile(r"[^\s:;,|@=]+")
_AUTO_AXIS_NAMES = {1: ("all",), 2: ("rows", "cols"), 3: ("rows", "cols", "planes")}


def check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise LayoutError(
            f"{what} must be a non-empty string without whitespace or any of ':;,|@=', got {name!r}"
        )
    return name


def closest(name: str, known: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest known name, or '' if none is close."""
    match = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean {match[0]!r}?" if match else ""


# --------------------------------------------------------------------------- Mesh


@dataclass(frozen=True)
class Mesh:
    """An ordered processor mesh with named axes.

    Every form users write is accepted (also by the constructor)::

        >>> Mesh.parse("rows:16,cols:32")
        Mesh('rows:16,cols:32')
        >>> Mesh({"rows": 16, "cols": 32}) == Mesh([("rows", 16), ("cols", 32)])
        True
        >>> str(Mesh((16, 32))), str(Mesh(8))      # axes named automatically
        ('rows:16,cols:32', 'all:8')
        >>> Mesh("rows:16,cols:32").size
        512
    """

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", _mesh_axes(self.axes))

    @classmethod
    def parse(cls, spec: Any) -> Mesh:
        """Build a Mesh from a Mesh, string, dict, list of pairs, sizes or int."""
        return spec if isinstance(spec, Mesh) else cls(spec)

    coerce = parse

    @property
    def size(self) -> int:
        """Number of devices (product of the axis sizes)."""
        return math.prod(size for _, size in self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size, in mesh order."""
        return dict(self.axes)

    def axis_size(self, name: str) -> int:
        for axis, size in self.axes:
            if axis == name:
                return size
        raise LayoutError(
            f"mesh axis {name!r} does not exist; mesh {self} has axes {list(self.axis_names)}."
            + closest(name, self.axis_names)
        )

    def to_jax(self, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
        """A ``jax.sharding.Mesh`` over the first ``self.size`` devices (default: ``jax.devices()``)."""
        import jax
        import numpy as np

        devices = list(jax.devices() if devices is None else devices)
        if len(devices) < self.size:
            raise LayoutError(
                f"mesh {self} needs {self.size} devices but only {len(devices)} are available; "
                "use a smaller mesh, or for CPU testing set JAX_NUM_CPU_DEVICES before importing jax."
            )
        grid = np.array(devices[: self.size], dtype=object).reshape([s for _, s in self.axes])
        return jax.sharding.Mesh(grid, self.axis_names)

    def __contains__(self, name: object) -> bool:
        return name in self.axis_names

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.axes)

    def __len__(self) -> int:
        return len(self.axes)

    def __str__(self) -> str:
        return ",".join(f"{name}:{size}" for name, size in self.axes)

    def __repr__(self) -> str:
        return f"Mesh({str(self)!r})"


_MESH_EXAMPLE = "expected e.g. 'rows:16,cols:32', {'rows': 16, 'cols': 32}, [('rows', 16), ('cols', 32)] or (16, 32)"


def _mesh_axes(spec: Any) -> tuple[tuple[str, int], ...]:
    """Normalise any accepted mesh form to ((name, size), ...) and validate it."""
    if isinstance(spec, Mesh):
        return spec.axes
    if isinstance(spec, bool):
        raise LayoutError(f"cannot read a mesh from {spec!r}; {_MESH_EXAMPLE}")
    if isinstance(spec, numbers.Integral):
        spec = (spec,)
    if isinstance(spec, str):
        pairs = _parse_mesh_string(spec)
    elif isinstance(spec, Mapping):
        pairs = list(spec.items())
    elif isinstance(spec, Iterable):
        items = list(spec)
        if items and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in items):
            names = _AUTO_AXIS_NAMES.get(len(items)) or tuple(f"a{i}" for i in range(len(items)))
            pairs = list(zip(names, items))
        elif all(isinstance(x, (tuple, list)) and len(x) == 2 for x in items):
            pairs = [tuple(x) for x in items]
        else:
            raise LayoutError(f"cannot read a mesh from {spec!r}; {_MESH_EXAMPLE}")
    else:
        raise LayoutError(f"cannot read a mesh from {spec!r}; {_MESH_EXAMPLE}")
    if not pairs:
        raise LayoutError(f"a mesh needs at least one axis; {_MESH_EXAMPLE}")
    seen: set[str] = set()
    out = []
    for name, size in pairs:
        check_name(name, "mesh axis name")
        if name in seen:
            raise LayoutError(f"mesh axis {name!r} appears twice in {spec!r}; axis names must be unique")
        seen.add(name)
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise LayoutError(f"mesh axis {name!r} must have a positive integer size, got {size!r}")
        out.append((name, int(size)))
    return tuple(out)


def _parse_mesh_string(text: str) -> list[tuple[str, int]]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if parts and all(p.isdigit() for p in parts):  # "16,32" or "8": sizes only
        return list(_mesh_axes(tuple(int(p) for p in parts)))
    pairs = []
    for part in parts:
        name, sep, size = (s.strip() for s in part.partition(":"))
        if not sep or not re.fullmatch(r"[+-]?\d+", size):
            raise LayoutError(
                f"cannot read mesh axis {part!r} in {text!r}: expected 'name:size' items "
                "separated by ',', e.g. 'rows:16,cols:32'"
            )
        pairs.append((name, int(size)))
    return pairs
