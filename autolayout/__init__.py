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

import sys
import types
from typing import Any

from autolayout import models
from autolayout.core import Dim, Layout, LayoutError, Mesh, Shape
from autolayout.costmodel import Cost, Hardware, get_hardware, known_hardware, predict
from autolayout.graph import Graph, Op, Tensor
from autolayout.trace import TraceError, named, trace
from autolayout.train import init_opt_state, train_step

__version__ = "0.1.0"


def _unavailable(what: str, exc: BaseException) -> Any:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"autolayout.{what} is not available in this installation: "
                          f"{type(exc).__name__}: {exc}") from exc
    missing.__name__ = what
    return missing


class _CallableModule(types.ModuleType):
    """A module that runs its ``__main_function__`` when called (``autolayout.search(g, mesh)``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, self.__dict__.get("__main_function__", self.__name__.rpartition(".")[2]))(*args, **kwargs)


# The search (CP-SAT via ortools) and execution layers. Imported here, not lazily, so that the
# search module is callable however it was first imported; a broken or missing layer leaves
# the rest of the library importable and says why when used.
try:
    import autolayout.search as _search_module

    _search_module.__class__ = _CallableModule
    from autolayout.search import layout
except Exception as _exc:  # noqa: BLE001
    search = layout = _unavailable("search", _exc)
else:
    search = _search_module
try:
    from autolayout.exec import calibrate, execute
except Exception as _exc:  # noqa: BLE001
    execute, calibrate = _unavailable("execute", _exc), _unavailable("calibrate", _exc)


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
