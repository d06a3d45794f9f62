"""autolayout: choose how to split every named tensor dimension across a processor mesh.

>>> from autolayout import Layout, Mesh
>>> Layout("batch:rows;hidden:cols").partition_spec(["batch", "hidden"])
P('rows', 'cols')

The pipeline, one call per step::

    g = autolayout.models.transformer_lm(...)            # or autolayout.trace(fn, *args, dims=...)
    cost = autolayout.predict(g, "rows:2,cols:4", "batch:rows;heads:cols", "tpu-v4")
    best = autolayout.search(g, "rows:2,cols:4", hardware="tpu-v4")   # SearchResult
    run = autolayout.execute(g, "rows:2,cols:4", best.layout)         # Execution
    autolayout.report(g, "rows:2,cols:4", ["batch:rows,cols"], out="reports/mine")

``autolayout.search`` and ``autolayout.report`` are modules that can be called: calling
one runs its main function (``autolayout.search.search``, ``autolayout.report.report``),
and ``autolayout.search.layout`` etc. stay reachable.
"""
from __future__ import annotations

import types
from typing import Any

from autolayout import models
from autolayout.core import Dim, Layout, LayoutError, Mesh, Shape
from autolayout.costmodel import Cost, Hardware, get_hardware, known_hardware, predict
from autolayout.graph import Graph, Op, ParamRole, Tensor
from autolayout.trace import TraceError, named, trace
from autolayout.train import init_opt_state, train_step

__version__ = "0.1.0"


class _CallableModule(types.ModuleType):
    """A module that runs its ``__main_function__`` when called (``autolayout.search(g, mesh)``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, self.__dict__.get("__main_function__", self.__name__.rpartition(".")[2]))(*args, **kwargs)


# The search package doubles as the ``autolayout.search(...)`` function the API promises
# (issue text: ``autolayout.search(graph, ...)`` and ``autolayout.search.enumerate_layouts``):
# imported eagerly so it is callable however it was first imported. ortools and jax are
# hard dependencies, so a failure here is a real error and is not hidden.
import autolayout.search as _search_module  # noqa: E402

_search_module.__class__ = _CallableModule
search = _search_module
from autolayout.exec import calibrate, execute  # noqa: E402
from autolayout.search import layout  # noqa: E402


def __getattr__(name: str) -> Any:
    # autolayout.report imports lazily (it pulls in the plotting layer only when it runs);
    # the module makes itself callable: autolayout.report(graph, mesh, layouts, out=...).
    if name == "report":
        import autolayout.report as module
        return module
    raise AttributeError(f"module 'autolayout' has no attribute {name!r}")


# One name per line so that adding exports is a one-line change.
__all__ = [
    "Cost",
    "Dim",
    "Graph",
    "Hardware",
    "Layout",
    "LayoutError",
    "Mesh",
    "Op",
    "ParamRole",
    "Shape",
    "Tensor",
    "TraceError",
    "calibrate",
    "execute",
    "get_hardware",
    "init_opt_state",
    "known_hardware",
    "layout",
    "models",
    "named",
    "predict",
    "report",
    "search",
    "trace",
    "train_step",
]
