"""autolayout: choose how to split every named tensor dimension across a processor mesh.

>>> from autolayout import Layout, Mesh
>>> Layout("batch:rows;hidden:cols").partition_spec(["batch", "hidden"])
P('rows', 'cols')

The pipeline, one call per step; every step takes ``(graph, mesh, ...)`` and a
keyword-only ``hardware`` (default :data:`DEFAULT_HARDWARE`, ``"tpu-v3"``; ``execute``
prices its run on the profile of the devices it runs on unless told otherwise)::

    g = autolayout.models.transformer_lm(...)            # or autolayout.trace(fn, *args, dims=...)
    cost = autolayout.predict(g, "rows:2,cols:4", "batch:rows;heads:cols", hardware="tpu-v4")
    best = autolayout.search(g, "rows:2,cols:4", hardware="tpu-v4")   # SearchResult
    run = autolayout.execute(g, "rows:2,cols:4", best.layout)         # Execution
    autolayout.report(g, "rows:2,cols:4", ["batch:rows,cols"], out="reports/mine")   # Report

``autolayout.search`` and ``autolayout.report`` are plain functions. ``autolayout.search``
is :func:`autolayout.exec.verify.search`: the search layer's
:func:`autolayout.search.api.search` plus ``verify=k`` (run the ``k`` best layouts on the
local devices and return the measured fastest), which needs the execution layer. The packages of the
same names stay importable by their full module names (``import autolayout.search.api``,
``from autolayout.search import solver``, ``from autolayout.report import Report``): they are
imported here first, then the top-level names are bound to the functions, so later
submodule imports cannot rebind them. (``import autolayout.search.solver as s`` does not
work: Python resolves it through the attribute ``autolayout.search``, the function.)
Importing :mod:`autolayout` does not import ortools, pandas or matplotlib.
"""
from __future__ import annotations

from autolayout import models
from autolayout.core import Dim, Layout, LayoutError, Mesh, Shape
from autolayout.costmodel import Cost, Hardware, Link, compact_layout, get_hardware, known_hardware, predict
from autolayout.costmodel.profiles import DEFAULT_HARDWARE
from autolayout.exec import Execution, calibrate, execute
from autolayout.graph import Graph, Op, ParamRole, Tensor
from autolayout.trace import TraceError, named, trace
from autolayout.train import init_opt_state, train_step
from autolayout.version import __version__

# Import the packages first, then bind the names to the functions (see the docstring).
import autolayout.report  # noqa: E402,F401
import autolayout.search  # noqa: E402,F401
from autolayout.report import Report, report  # noqa: E402
from autolayout.search.api import SearchResult, Verified, best_layouts, layout, mesh_shapes  # noqa: E402
from autolayout.exec.verify import search  # noqa: E402  (search.api.search, plus verify=k)
from autolayout.search.errors import SearchError  # noqa: E402

# One name per line so that adding exports is a one-line change.
__all__ = [
    "Cost",
    "DEFAULT_HARDWARE",
    "Dim",
    "Execution",
    "Graph",
    "Hardware",
    "Layout",
    "LayoutError",
    "Link",
    "Mesh",
    "Op",
    "ParamRole",
    "Report",
    "SearchError",
    "SearchResult",
    "Shape",
    "Tensor",
    "TraceError",
    "Verified",
    "best_layouts",
    "calibrate",
    "compact_layout",
    "execute",
    "get_hardware",
    "init_opt_state",
    "known_hardware",
    "layout",
    "mesh_shapes",
    "models",
    "named",
    "predict",
    "report",
    "search",
    "trace",
    "train_step",
]
