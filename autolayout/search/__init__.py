"""Layout search (DESIGN §5): the provably fastest layout under the cost model, by CP-SAT.

>>> from autolayout import models
>>> from autolayout.search.api import layout
>>> g = models.mlp(batch=65536, d_io=1024, d_hidden=1024)
>>> str(layout(g, "all:8", shard_weight_update=False))
'batch:all'

``autolayout.search`` (the top-level name) is the function :func:`autolayout.exec.verify.search`:
:func:`~autolayout.search.api.search` plus ``verify=k`` (which runs layouts, so it lives in
the execution layer); this package stays importable by its full module names
(``import autolayout.search.api``, ``from autolayout.search import best_layouts``).
:func:`~autolayout.search.api.best_layouts` gives the ``k`` best distinct layouts.

Modules: ``space`` (valid layouts, the exhaustive :func:`enumerate_layouts`),
``tables`` (cost-model figures per dim group and assignment), ``wus``
(weight-update sharding options), ``liveness`` (memory per schedule point),
``model`` (the CP-SAT model), ``solver`` (solve loop), ``api`` (entry points),
``errors`` (:class:`SearchError`). Importing the package does not import ortools;
the first search does.
"""
from __future__ import annotations

from autolayout.search.api import SearchResult, Verified, best_layouts, layout, mesh_shapes, search
from autolayout.search.errors import SearchError, SearchWarning
from autolayout.search.space import enumerate_layouts

__all__ = ["SearchError", "SearchResult", "SearchWarning", "Verified", "best_layouts", "enumerate_layouts", "layout",
           "mesh_shapes", "search"]
