"""Tests for autolayout.core: Mesh, Layout, validation and error messages."""
from __future__ import annotations

import doctest
import sys
import types
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import autolayout
import autolayout.core
import autolayout.mesh
from autolayout import Dim, Layout, LayoutError, Mesh
from autolayout import cli


# ----------------------------------------------------------------- a fake graph
@dataclass(frozen=True)
class FakeTensor:
    name: str
    shape: tuple[Dim, ...]
    role: str


class FakeGraph:
    """Duck-typed stand-in for autolayout's Graph: ``dims`` and ``tensors()``."""

    def __init__(self, tensors: list[FakeTensor]) -> None:
        self._tensors = tensors
        self.dims = {d.name: d.size for t in tensors for d in t.shape}

    def tensors(self) -> list[FakeTensor]:
        return self._tensors


B, IO, H = Dim("batch", 64), Dim("d_io", 12), Dim("hidden", 128)

# The two-layer MLP of the Mesh-TensorFlow paper (Algorithm 1).
MLP = FakeGraph(
    [
        FakeTensor("x", (B, IO), "input"),
        FakeTensor("w", (IO, H), "param"),
        FakeTensor("bias", (H,), "param"),
        FakeTensor("v", (H, IO), "param"),
        FakeTensor("h", (B, H), "activation"),
        FakeTensor("y", (B, IO), "output"),
    ]
)


# ------------------------------------------------------------------------- Mesh
@pytest.mark.parametrize(
    "spec, expected",
    [
        ("rows:16,cols:32", "rows:16,cols:32"),
        (" rows : 16 , cols:32 ", "rows:16,cols:32"),
        ({"rows": 16, "cols": 32}, "rows:16,cols:32"),
        ([("rows", 16), ("cols", 32)], "rows:16,cols:32"),
        ((16, 32), "rows:16,cols:32"),
        ([16, 32], "rows:16,cols:32"),
        (8, "all:8"),
        ("8", "all:8"),
        ((2, 2, 2), "rows:2,cols:2,planes:2"),
        ((2, 2, 2, 2), "a0:2,a1:2,a2:2,a3:2"),
        (Mesh("x:4"), "x:4"),
    ],
    ids=["string", "string-spaces", "dict", "mtf-pairs", "tuple", "list", "int", "int-string",
         "3-axes-auto", "4-axes-auto", "mesh"],
)
def test_mesh_parse_forms(spec, expected):
    assert str(Mesh.parse(spec)) == expected
    assert Mesh.coerce(spec) == Mesh(spec) == Mesh.parse(expected)


def test_mesh_properties():
    mesh = Mesh("rows:16,cols:32")
    assert mesh.size == 512
    assert mesh.axis_names == ("rows", "cols")
    assert mesh.shape == {"rows": 16, "cols": 32}
    assert mesh.axis_size("cols") == 32
    assert list(mesh) == [("rows", 16), ("cols", 32)]
    assert len(mesh) == 2
    assert "rows" in mesh and "planes" not in mesh
    assert repr(mesh) == "Mesh('rows:16,cols:32')"
    assert hash(mesh) == hash(Mesh((16, 32)))


@pytest.mark.parametrize(
    "spec, match",
    [
        ("rows:16,rows:2", r"'rows' appears twice"),
        ([("a", 2), ("a", 2)], r"'a' appears twice"),
        ("rows:0", r"'rows' must have a positive integer size, got 0"),
        ({"rows": -4}, r"positive integer size, got -4"),
        ((4, 0), r"positive integer size, got 0"),
        ("rows=16", r"expected 'name:size' items separated by ',', e\.g\. 'rows:16,cols:32'"),
        ("rows:sixteen", r"cannot read mesh axis 'rows:sixteen'"),
        ("", r"at least one axis"),
        ({}, r"at least one axis"),
        (True, r"cannot read a mesh"),
        (2.5, r"cannot read a mesh"),
        ({"my axis": 2}, r"without whitespace"),
    ],
    ids=["dup-string", "dup-pairs", "zero", "negative", "zero-auto", "unparsable", "non-int",
         "empty-string", "empty-dict", "bool", "float", "bad-name"],
)
def test_mesh_errors(spec, match):
    with pytest.raises(LayoutError, match=match):
        Mesh.parse(spec)


def test_mesh_axis_size_unknown():
    with pytest.raises(LayoutError, match=r"'row' does not exist.*\['rows', 'cols'\].*Did you mean 'rows'"):
        Mesh("rows:2,cols:4").axis_size("row")


def test_mesh_to_jax(cpu_devices):
    jmesh = Mesh("rows:2,cols:4").to_jax()
    assert dict(jmesh.shape) == {"rows": 2, "cols": 4}
    with pytest.raises(LayoutError, match="needs 16 devices"):
        Mesh("rows:4,cols:4").to_jax()


# ----------------------------------------------------------------------- Layout
@pytest.mark.parametrize(
    "spec",
    [
        {"batch": "rows", "hidden": ("cols",)},
        {"batch": ["rows"], "hidden": "cols", "d_io": None},
        [("batch", "rows"), ("hidden", "cols")],
        (["batch", "rows"], ["hidden", "cols"]),
        ["batch:rows", "hidden:cols"],
        "batch:rows;hidden:cols",
        " batch : rows ; hidden:cols ; ",
        Layout("batch:rows;hidden:cols"),
    ],
    ids=["dict", "dict-none-unsplit", "mtf-pairs", "mtf-lists", "rule-strings", "string",
         "string-spaces", "layout"],
)
def test_layout_forms(spec):
    layout = Layout.coerce(spec)
    assert layout == Layout(spec) == Layout.parse("batch:rows;hidden:cols")
    assert layout.rules == (("batch", ("rows",)), ("hidden", ("cols",)))
    assert repr(layout) == "Layout('batch:rows;hidden:cols')"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "batch:all",
        "batch:rows;hidden:cols",
        "batch:rows,planes;hidden:cols",
        "batch:rows;hidden:cols|w:rows;v:rows",
        "|w:rows,cols",
        "hidden:cols;batch:rows",
    ],
    ids=["empty", "data-parallel", "2d", "multi-axis", "update-sharding", "only-update", "unsorted"],
)
def test_layout_string_round_trip(text):
    layout = Layout.parse(text)
    assert str(layout) == text
    assert Layout.parse(str(layout)) == layout
    assert eval(repr(layout), {"Layout": Layout}) == layout


def test_layout_empty():
    assert Layout() == Layout.coerce(None) == Layout("") == Layout({}) == Layout([])
    assert str(Layout()) == ""
    assert Layout().rules == () and Layout().update_sharding == ()


def test_layout_update_sharding_constructor():
    a = Layout({"batch": "rows"}, update_sharding={"w": "rows", "v": ("rows",)})
    assert a == Layout("batch:rows|w:rows;v:rows")
    assert a.update_axes_of("w") == ("rows",)
    assert a.update_axes_of("bias") == ()
    assert Layout(a) == a


def test_layout_order_and_canonical():
    a, b = Layout("batch:rows;hidden:cols"), Layout("hidden:cols;batch:rows")
    assert a != b
    assert a.canonical() == b.canonical() == Layout("batch:rows;hidden:cols")
    assert Layout("b:x|w:r;v:r").canonical() == Layout("b:x|v:r;w:r")
    assert len({a, b, Layout("batch:rows;hidden:cols")}) == 2


def test_layout_queries_and_updates():
    layout = Layout("batch:rows,planes;hidden:cols")
    assert layout.axes_of("batch") == ("rows", "planes")
    assert layout.axes_of(Dim("hidden", 8)) == ("cols",)
    assert layout.axes_of("d_io") == ()
    assert layout.as_dict() == {"batch": ("rows", "planes"), "hidden": ("cols",)}
    assert layout.mesh_axes() == {"rows", "planes", "cols"}
    assert str(layout.with_rule("batch", "rows")) == "batch:rows;hidden:cols"
    assert str(layout.with_rule("d_io", ("planes",))) == "batch:rows,planes;hidden:cols;d_io:planes"
    assert str(layout.without("batch")) == "hidden:cols"
    assert layout.without("unknown") == layout
    assert str(layout.with_rule("batch", None)) == "hidden:cols"
    upd = layout.with_update_sharding("w", "rows")
    assert str(upd) == "batch:rows,planes;hidden:cols|w:rows"
    assert upd.with_update_sharding("w", None) == layout
    assert str(upd.with_rule("d_io", "planes")) == "batch:rows,planes;hidden:cols;d_io:planes|w:rows"


@pytest.mark.parametrize(
    "spec, match",
    [
        ("batch:rows;batch:cols", r"dim 'batch' has two rules \(rows and cols\)"),
        ([("batch", "rows"), ("batch", "cols")], r"dim 'batch' has two rules"),
        ("batch:rows,rows", r"mesh axis 'rows' is repeated in the rule for dim 'batch'"),
        ({"batch": ("rows", "cols", "rows")}, r"'rows' is repeated"),
        ("batch:rows|w:rows;w:cols", r"parameter 'w' has two rules"),
        ("batch:rows|w:cols,cols", r"'cols' is repeated in the rule for parameter 'w'"),
        ("batch", r"cannot read rule 'batch': expected 'dim:axis'.*e\.g\. 'batch:rows;hidden:cols'"),
        ("batch:", r"cannot read rule 'batch:'"),
        ("batch rows:cols", r"dim name must be a non-empty string without whitespace"),
        ([("batch", "rows", "cols")], r"cannot read rule"),
        (42, r"cannot read a layout from 42"),
        ({"batch": 3}, r"must be a name or tuple of names"),
    ],
    ids=["dup-dim-string", "dup-dim-pairs", "repeated-axis", "repeated-axis-tuple", "dup-param",
         "repeated-update-axis", "no-colon", "no-axes", "space-in-name", "triple", "int", "int-axes"],
)
def test_layout_construction_errors(spec, match):
    with pytest.raises(LayoutError, match=match):
        Layout(spec)


@pytest.mark.parametrize("text, storage", [
    ("batch:rows|w:rows", (("w", ("rows",), 1),)),
    ("batch:rows|w:rows@2", (("w", ("rows",), 2),)),
    ("batch:rows,cols|*:rows,cols@3", (("*", ("rows", "cols"), 3),)),
    ("batch:rows|*:rows@3;embed:rows", (("*", ("rows",), 3), ("embed", ("rows",), 1))),
    ("batch:rows|*:rows@3;final_norm:-", (("*", ("rows",), 3), ("final_norm", (), 0))),
], ids=["stage1-default", "stage2", "fsdp-star", "star-and-override", "star-and-whole"])
def test_layout_storage_stages_round_trip(text, storage):
    layout = Layout.parse(text)
    assert layout.storage == storage
    assert str(layout) == text and Layout.parse(str(layout)) == layout
    assert eval(repr(layout), {"Layout": Layout}) == layout


def test_layout_regions_and_remat_round_trip():
    text = "heads:x;d_ff:x;batch:y,z;length@norm:x|*:y,z@3;remat=full"
    layout = Layout(text)
    assert str(layout) == text and Layout(str(layout)) == layout
    assert layout.axes_of("length") == () and layout.region_axes("length", "norm") == ("x",)
    assert layout.region_axes("batch", "norm") == ("y", "z") and layout.remat == "full"
    assert Layout("a:x", remat="dots") == Layout("a:x|remat=dots") != Layout("a:x")
    assert str(layout.with_rule("heads", None)) == "d_ff:x;batch:y,z;length@norm:x|*:y,z@3;remat=full"


def test_layout_storage_of_and_aliases():
    layout = Layout("batch:data|*:data@fsdp;embed:data@zero1")
    assert str(layout) == "batch:data|*:data@3;embed:data"
    assert layout.storage_of("layers/w1") == (("data",), 3)  # the '*' entry
    assert layout.storage_of("embed") == (("data",), 1)
    assert Layout("batch:data").storage_of("w") == ((), 0)
    assert Layout({"batch": "data"}, {"w": (("data",), 2)}) == Layout("batch:data|w:data@2")
    assert str(Layout("b:x").with_storage("w", "x", 3).with_storage("v", "x")) == "b:x|w:x@3;v:x"
    whole = Layout("batch:data|*:data@3;pos:-")  # stored whole: no entry's axes, whatever '*' says
    assert whole.storage_of("pos") == ((), 0) and whole.storage_of("embed") == (("data",), 3)
    assert Layout({"batch": "data"}, [("*", "data", 3), ("pos", "-")]) == whole == Layout("batch:data|*:data@3;pos: - ")


@pytest.mark.parametrize("spec, match", [
    ("batch:rows|w:rows@4", r"storage entry for 'w': unknown stage '4'; use 1, 2 or 3"),
    ("batch:rows|w@3", r"cannot read storage entry 'w@3'.*'parameter:axis\[@stage\]'"),
    ("batch:rows|w:rows;w:cols@3", r"parameter 'w' has two rules"),
    ({"b@x": "rows"}, r"rule 'b@x': unknown region 'x'; regions are norm"),
    ("batch:rows|w=rows", r"unknown layout option 'w'.*'remat=full\|dots\|none'"),
    ("batch:rows|remat=half", r"unknown remat policy 'half'"),
    ({"b=x": "rows"}, r"without whitespace or any of ':;,\|@='"),
    ("batch:rows|*:rows@3;w:-@3", r"storage entry 'w:-@3': a parameter stored whole has no ZeRO stage. Fix: "
                                   r"write 'w:-'"),
    ("batch:rows|*:-", r"storage entry '\*:-': .* as no '\*' entry does. Fix: drop the entry"),
], ids=["bad-stage", "no-axes", "dup", "unknown-region", "unknown-option", "bad-remat", "equals-in-name",
        "whole-with-stage", "star-whole"])
def test_layout_storage_errors(spec, match):
    with pytest.raises(LayoutError, match=match):
        Layout(spec)


def test_layout_update_sharding_given_twice():
    with pytest.raises(LayoutError, match="given twice"):
        Layout("batch:rows|w:rows", update_sharding={"v": "rows"})


def test_layout_parse_rejects_non_string():
    with pytest.raises(LayoutError, match="expects a string"):
        Layout.parse({"batch": "rows"})


# ------------------------------------------------------------- hypothesis
_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)
_axes = st.lists(_names, min_size=1, max_size=3, unique=True).map(tuple)
_rules = st.dictionaries(_names, _axes, max_size=6).map(lambda d: tuple(d.items()))


@given(rules=_rules, update=_rules)
def test_layout_round_trip_property(rules, update):
    layout = Layout(rules, update_sharding=update)
    assert Layout.parse(str(layout)) == layout
    assert Layout.coerce(layout.as_dict()) == Layout(layout.rules)
    assert hash(Layout.parse(str(layout))) == hash(layout)
    assert layout.canonical() == Layout(list(reversed(rules)), list(reversed(update))).canonical()


@given(axes=st.dictionaries(_names, st.integers(1, 64), min_size=1, max_size=5))
def test_mesh_round_trip_property(axes):
    mesh = Mesh(axes)
    assert Mesh.parse(str(mesh)) == mesh
    assert mesh.shape == axes


# ------------------------------------------------------ conversions and sizes
@pytest.mark.parametrize(
    "layout, dims, expected",
    [
        ("", ["batch", "hidden"], P(None, None)),
        ("batch:all", ["batch", "d_io"], P("all", None)),
        ("hidden:all", [IO, H], P(None, "all")),
        ("batch:rows;hidden:cols", [B, H], P("rows", "cols")),
        ("batch:rows,planes;hidden:cols", ["batch", "d_io", "hidden"], P(("rows", "planes"), None, "cols")),
        ("batch:rows", [], P()),
    ],
    ids=["empty-replicated", "data-parallel", "model-parallel-dims", "2d", "multi-axis", "scalar"],
)
def test_partition_spec(layout, dims, expected):
    assert Layout(layout).partition_spec(dims) == expected


def test_partition_spec_from_tensor_and_conflict():
    h = MLP.tensors()[4]
    assert Layout("batch:rows;hidden:cols").partition_spec(h) == P("rows", "cols")
    with pytest.raises(LayoutError, match=r"'batch' and 'hidden'.*mesh axis 'all'"):
        Layout("batch:all;hidden:all").partition_spec(h)


@pytest.mark.parametrize(
    "layout, dims, expected",
    [
        ("batch:rows;hidden:cols", None, [("batch", "rows"), ("hidden", "cols")]),
        ("batch:rows,planes", None, [("batch", ("rows", "planes"))]),
        ("batch:rows", ["batch", "d_io"], [("batch", "rows"), ("d_io", None)]),
        ("", None, []),
    ],
    ids=["one-axis", "several-axes", "with-unsplit-dims", "empty"],
)
def test_logical_axis_rules(layout, dims, expected):
    assert Layout(layout).logical_axis_rules(dims) == expected


def test_local_size():
    mesh = Mesh("rows:2,cols:4,planes:2")
    layout = Layout("batch:rows,planes;hidden:cols")
    assert layout.local_size(B, mesh) == 16
    assert layout.local_size(H, "rows:2,cols:4,planes:2") == 32
    assert layout.local_size(IO, mesh) == 12
    with pytest.raises(LayoutError, match=r"'d_io' of size 12 is not divisible by the product 8"):
        Layout("d_io:rows,cols").local_size(IO, mesh)
    with pytest.raises(LayoutError, match=r"'nope' does not exist"):
        Layout("d_io:nope").local_size(IO, mesh)


# ------------------------------------------------------------------- validate
@pytest.mark.parametrize(
    "layout, mesh",
    [
        ("batch:all", "all:8"),  # paper 8.1 data-parallel
        ("hidden:all", "all:8"),  # paper 8.2 model-parallel
        ("batch:rows;hidden:cols", "rows:2,cols:4"),  # paper 8.3
        ("batch:rows;hidden:cols;d_io:planes", "rows:2,cols:2,planes:2"),  # paper 8.3, 3-D
        ("", "all:8"),  # paper 8.4: inefficient but legal
        ("batch:rows,planes;hidden:cols", "rows:2,cols:2,planes:2"),
        ("batch:rows|w:rows;v:rows;bias:rows", "rows:2,cols:4"),  # weight-update sharding
    ],
    ids=["8.1-data", "8.2-model", "8.3-2d", "8.3-3d", "8.4-empty", "multi-axis", "update-sharding"],
)
def test_validate_legal(layout, mesh):
    assert Layout(layout).validate(MLP, mesh) == Layout(layout)
    autolayout.core.validate_layout(layout, MLP, mesh)


@pytest.mark.parametrize(
    "layout, mesh, match",
    [
        # Paper section 8.5: h[batch, hidden] would have two dims on the one mesh axis.
        ("batch:all;hidden:all", "all:8",
         r"illegal layout 'batch:all;hidden:all': tensor 'h' \[batch:64, hidden:128\] would have two "
         r"dims, 'batch' and 'hidden', split over the same mesh axis 'all'.*section 8\.5.*"
         r"split one of them over a different mesh axis"),
        ("batch:rows;hidden:rows", "rows:2,cols:4",
         r"tensor 'h' .*'batch' and 'hidden'.*mesh axis 'rows'.*e\.g\. 'batch:rows;hidden:cols'"),
        ("batch:rows,cols;hidden:cols", "rows:2,cols:4",
         r"tensor 'h' .*'batch' and 'hidden'.*mesh axis 'cols'.*leave one unsplit"),
        ("batch:row", "rows:2,cols:4",
         r"dim 'batch' is split over mesh axis 'row', which does not exist; mesh rows:2,cols:4 has "
         r"axes \['rows', 'cols'\]\. Did you mean 'rows'\?"),
        ("batch:rows|w:planes", "rows:2,cols:4", r"parameter 'w' is split over mesh axis 'planes'"),
        ("hiden:all", "all:8",
         r"rule for dim 'hiden', which no tensor of the graph has; known dims: "
         r"\['batch', 'd_io', 'hidden'\]\. Did you mean 'hidden'\?"),
        ("d_io:all", "all:8",
         r"dim 'd_io' \(e\.g\. tensor 'x' \[batch:64, d_io:12\]\) has size 12, which is not divisible "
         r"by 8, the product of its mesh axes \(all:8\)\. Fix: leave 'd_io' unsplit"),
        ("d_io:rows,cols", "rows:2,cols:4",
         r"'d_io'.*size 12.*not divisible by 8.*\(rows:2, cols:4\)\. Fix: split 'd_io' over a mesh "
         r"axis whose size divides 12, e\.g\. 'd_io:cols', leave 'd_io' unsplit"),
        ("batch:rows|h:rows", "rows:2,cols:4",
         r"weight-update sharding names 'h', which is a tensor with role 'activation'.*"
         r"Parameters: \['bias', 'v', 'w'\]"),
        ("batch:rows|ww:rows", "rows:2,cols:4",
         r"names 'ww', which is not a tensor of the graph.*Did you mean 'w'\?"),
        ("hidden:cols|w:cols", "rows:2,cols:4",
         r"weight-update sharding of parameter 'w' over mesh axis 'cols', but 'w' is already split "
         r"over 'cols' by its dim 'hidden'"),
    ],
    ids=["8.5-illegal-h", "same-axis-2d-fix", "same-axis-multi", "unknown-axis", "unknown-update-axis",
         "unknown-dim", "indivisible", "indivisible-product", "update-not-param", "update-unknown",
         "update-already-split"],
)
def test_validate_errors(layout, mesh, match):
    with pytest.raises(LayoutError, match=match):
        Layout(layout).validate(MLP, mesh)


def test_validate_accepts_tensor_list_attribute():
    # graph.tensors may also be a plain attribute (e.g. a list), not only a method.
    graph = types.SimpleNamespace(dims=MLP.dims, tensors=MLP.tensors())
    with pytest.raises(LayoutError, match="tensor 'h'"):
        Layout("batch:all;hidden:all").validate(graph, "all:8")


def test_errors_are_value_errors():
    assert issubclass(LayoutError, ValueError)


def test_docstring_examples():
    for module in (autolayout.core, autolayout.mesh, autolayout):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------------ CLI
@pytest.fixture
def fake_demo(monkeypatch):
    """Install a stand-in ``autolayout.demo`` whose run() does what the test says."""

    def install(run):
        module = types.ModuleType("autolayout.demo")
        module.run = run
        monkeypatch.setitem(sys.modules, "autolayout.demo", module)

    return install


def test_cli_demo_runs(fake_demo, capsys):
    calls = []
    fake_demo(lambda **options: calls.append(1))
    assert cli.main(["demo"]) == 0
    assert calls == [1]


def test_cli_error_is_one_line(fake_demo, capsys):
    def run(**options):
        Layout("batch:all;hidden:all").validate(MLP, "all:8")

    fake_demo(run)
    assert cli.main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autolayout: error: illegal layout") and err.count("\n") == 1
    assert "Traceback" not in err


def test_cli_requires_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
