"""autolayout: choose how to split every named tensor dimension across a processor mesh.

>>> from autolayout import Layout, Mesh
>>> Layout("batch:rows;hidden:cols").partition_spec(["batch", "hidden"])
P('rows', 'cols')
"""
from __future__ import annotations

from autolayout import models
from autolayout.core import Dim, Layout, LayoutError, Mesh, Shape
from autolayout.graph import Graph, Op, Tensor
from autolayout.trace import TraceError, named, trace
from autolayout.train import init_opt_state, train_step

__version__ = "0.1.0"

# One name per line so that adding exports is a one-line change.
__all__ = [
    "Dim",
    "Graph",
    "Layout",
    "LayoutError",
    "Mesh",
    "Op",
    "Shape",
    "Tensor",
    "TraceError",
    "init_opt_state",
    "models",
    "named",
    "trace",
    "train_step",
]
