"""The package's import structure: no cycles, cheap core, plain functions at the top level.

The import graph is read from the source (``ast``), function-local imports included, so a
cycle hidden inside a function body fails here although it would not fail at import time.
"""
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

import autolayout

ROOT = Path(autolayout.__file__).parent


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = ["autolayout", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module an imported name lives in: the longest module prefix of ``name``."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> nx.DiGraph:
    """``a -> b`` when module ``a`` imports module ``b`` anywhere in its source.

    ``from package import name`` is an edge to ``package.name`` when that is a module and
    to ``package`` otherwise (its ``__init__`` runs to provide the name).
    """
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for mod, path in MODULES.items():
        is_pkg = path.name == "__init__.py"
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
            for t in targets:
                t = _target(t) if t.startswith("autolayout") else None
                if t is not None and t != mod:
                    g.add_edge(mod, t)
    return g


def test_import_graph_sees_known_edges():
    """The graph builder itself: edges we know exist (top-level and function-local)."""
    g = import_graph()
    assert g.has_edge("autolayout.search.api", "autolayout.search.solver")   # local import in _search_one
    assert g.has_edge("autolayout.cli", "autolayout.report")                 # local import in _run_report
    assert g.has_edge("autolayout.search.solver", "autolayout.search.model")  # top-level
    assert g.has_edge("autolayout", "autolayout.search.api")


def test_no_import_cycles():
    g = import_graph()
    cycles = list(nx.simple_cycles(g))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:10])


LAYERS = {  # lower layers never import higher ones (team guide: core & tracer -> costmodel -> search -> exec -> reporting/CLI)
    "autolayout.costmodel": 1, "autolayout.search": 2, "autolayout.exec": 3,
    "autolayout.reporting": 4, "autolayout.report": 4, "autolayout.demo": 4, "autolayout.export": 4,
    "autolayout.cli": 5,
}  # within a layer, test_no_import_cycles keeps the order


def _layer(mod: str) -> int:
    for prefix, level in LAYERS.items():
        if mod == prefix or mod.startswith(prefix + "."):
            return level
    return 0


def test_imports_flow_downward():
    g = import_graph()
    bad = [(a, b) for a, b in g.edges if a != "autolayout" and not a.endswith("__main__") and _layer(b) > _layer(a)]
    assert not bad, f"lower layers import higher ones: {bad}"


def test_table1_is_a_report():
    assert "autolayout.reporting.table1" in MODULES and "autolayout.costmodel.table1" not in MODULES


@pytest.mark.parametrize("module", ["autolayout.core", "autolayout", "autolayout.search.api"])
def test_import_is_cheap(module):
    code = (f"import sys, {module}; heavy = [m for m in ('ortools', 'pandas', 'matplotlib') if m in sys.modules]; "
            "print(','.join(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"import {module} pulled in {proc.stdout.strip()}"


# ----------------------------------------------------------------- one vocabulary
def test_search_and_report_are_plain_functions():
    assert inspect.isfunction(autolayout.search) and inspect.isfunction(autolayout.report)
    assert "memory_limit" in inspect.signature(autolayout.search).parameters
    assert "layouts" in inspect.signature(autolayout.report).parameters


def test_submodule_imports_do_not_rebind_the_functions():
    code = ("import autolayout.search.api, autolayout.search.solver, autolayout.report, autolayout, inspect; "
            "from autolayout.report import Report; import autolayout.search.space; "
            "print(inspect.isfunction(autolayout.search), inspect.isfunction(autolayout.report))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]


PIPELINE = ["predict", "search", "layout", "execute", "report"]


@pytest.mark.parametrize("name", PIPELINE)
def test_pipeline_functions_share_one_vocabulary(name):
    params = inspect.signature(getattr(autolayout, name)).parameters
    names = list(params)
    assert names[:2] == ["graph", "mesh"], names
    hw = params["hardware"]
    assert hw.kind is inspect.Parameter.KEYWORD_ONLY
    if name == "execute":  # prices the run on the devices it runs on unless told otherwise
        assert hw.default is None and "devices at hand" in autolayout.execute.__doc__
    else:
        assert hw.default == autolayout.DEFAULT_HARDWARE == "tpu-v3"


def test_search_result_times_have_units():
    fields = autolayout.SearchResult.__dataclass_fields__
    assert {"objective_s", "bound_s", "solve_time_s"} <= set(fields)
    assert not {"objective", "bound"} & set(fields)


def test_top_level_exports():
    for name in ("SearchResult", "SearchError", "Execution", "Report", "Link"):
        assert name in autolayout.__all__ and getattr(autolayout, name) is not None
    assert issubclass(autolayout.SearchError, ValueError)
    for name in autolayout.__all__:
        assert hasattr(autolayout, name), name
