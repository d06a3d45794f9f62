"""autolayout: choose how to split every named tensor dimension across a processor mesh.

>>> from autolayout import Layout, Mesh
>>> Layout("batch:rows;hidden:cols").partition_spec(["batch", "hidden"])
P('rows', 'cols')
"""
from __future__ import annotations

from autolayout.core import Dim, Layout, LayoutError, Mesh, Shape

__version__ = "0.1.0"

# One name per line so that adding exports is a one-line change.
__all__ = [
    "Dim",
    "Layout",
    "LayoutError",
    "Mesh",
    "Shape",
]
