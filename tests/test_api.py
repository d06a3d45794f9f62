"""The top-level API's contract: bad arguments are ``ValueError`` subclasses naming the argument,
and sizes are read the same way as on the command line (issue 14)."""
from __future__ import annotations

import pytest

import autolayout
from autolayout import models

MESH = "rows:2,cols:4"


@pytest.fixture(scope="module")
def g():
    return models.mlp(batch=64, d_io=32, d_hidden=128)


@pytest.mark.parametrize("name, args, kwargs", [
    ("predict", (None, MESH, "batch:rows"), {}),
    ("search", (None, MESH), {}),
    ("layout", (None, MESH), {}),
    ("execute", (None, MESH, "batch:rows"), {}),
    ("report", (None, MESH, ["batch:rows"]), {"execute": False, "search": False}),
    ("predict", ("mlp", MESH, "batch:rows"), {}),
], ids=["predict", "search", "layout", "execute", "report", "predict-a-string"])
def test_not_a_graph(name, args, kwargs, tmp_path):
    from autolayout.graph import NotAGraphError
    kwargs = dict(kwargs, out=tmp_path) if name == "report" else kwargs
    with pytest.raises(NotAGraphError, match=rf"{'search' if name == 'layout' else name}: argument 'graph' must be "
                                             r"a traced autolayout Graph .* got (NoneType|str)"):
        getattr(autolayout, name)(*args, **kwargs)
    assert issubclass(NotAGraphError, ValueError)


@pytest.mark.parametrize("text, value", [("16GB", 16e9), ("16GiB", 16 * 2**30), ("512 MiB", 512 * 2**20)],
                         ids=["GB", "GiB", "MiB"])
def test_memory_limit_as_text_like_the_cli(g, text, value):
    a = autolayout.search(g, MESH, memory_limit=text, shard_weight_update=False)
    b = autolayout.search(g, MESH, memory_limit=value, shard_weight_update=False)
    assert str(a.layout) == str(b.layout) and a.cost.memory_bytes <= value


@pytest.mark.parametrize("bad", ["16 parsecs", 0, -1, "0GB"], ids=["unit", "zero", "negative", "zero-text"])
def test_bad_memory_limit_names_the_argument(g, bad):
    with pytest.raises(autolayout.SearchError, match=r"memory_limit must be a positive number of bytes per device "
                                                     r"or a size such as '16GiB'"):
        autolayout.search(g, MESH, memory_limit=bad)
