"""Reports: ``autolayout.report`` renders, its HTML is well-formed and self-contained, images are PNGs."""
from __future__ import annotations

import base64
import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

import autolayout
from autolayout import models
from autolayout.core import Layout
from autolayout.report import named_layouts
from autolayout.reporting.fmt import SizeError, parse_bytes, short_layout, spearman

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "source", "wbr"}


class Checker(HTMLParser):
    """Balanced tags, the order of the first elements, images and links."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.order: list[str] = []
        self.images: list[dict] = []
        self.links: list[str] = []
        self.text: dict[str, str] = {}
        self._current: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.order.append(tag + ("." + attrs["class"] if "class" in attrs else ""))
        if tag == "img":
            self.images.append(attrs)
        if tag in ("a", "link", "script"):
            self.links.append(attrs.get("href") or attrs.get("src") or "")
        if tag not in VOID:
            self.stack.append(tag)
        if tag in ("h1", "title") or attrs.get("class") == "intro":
            self._current = tag if tag != "p" else "intro"
            self.text.setdefault(self._current, "")

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()
        if self._current and tag in ("h1", "title", "p"):
            self._current = None

    def handle_data(self, data):
        if self._current:
            self.text[self._current] += data


def check_html(path: Path) -> Checker:
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>")
    c = Checker()
    c.feed(text)
    c.close()
    assert not c.errors, c.errors[:5]
    assert not c.stack, f"unclosed tags {c.stack}"
    body = [t for t in c.order if t not in ("html", "head", "meta", "title", "style", "body", "main")]
    # the page opens with its title and one paragraph saying what it shows
    assert body[:2] == ["h1", "p.intro"], body[:4]
    assert c.text["h1"].strip() and len(c.text["intro"].split()) >= 20
    assert c.order.count("h1") == 1
    # self-contained: every image embedded as a PNG data URI, nothing fetched
    for img in c.images:
        src = img["src"]
        assert src.startswith("data:image/png;base64,"), src[:40]
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG)
        assert img.get("alt")
    assert all(not link.startswith(("http://", "https://", "//")) for link in c.links)
    return c


# ------------------------------------------------------------------------ report()
@pytest.fixture(scope="module")
def mlp_report(tmp_path_factory):
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    out = tmp_path_factory.mktemp("report") / "mlp"
    rep = autolayout.report(g, "rows:2,cols:4", {"data-parallel": "batch:rows,cols", "2-D": "batch:rows;hidden:cols",
                                                 "model-parallel": "hidden:cols"},
                            hardware="tpu-v4", out=out, repeats=1, progress=False, scaling=True)
    return rep


def test_report_writes_every_artefact(mlp_report):
    rep = mlp_report
    files = {p.name for p in rep.path.iterdir()}
    assert {"index.html", "report.md", "summary.json", "layouts.csv", "search.csv", "scaling.csv", "time.png",
            "memory.png", "predicted_vs_measured.png", "scaling.png"} <= files
    for png in rep.path.glob("*.png"):
        assert png.read_bytes().startswith(PNG)
    table = pd.read_csv(rep.path / "layouts.csv")
    assert len(table) == len(rep.results) >= 3
    assert table.collectives_match.all() and (table.max_abs_error < 1e-4).all()
    assert (table.time_ms > 0).all() and (table.measured_ms > 0).all()


def test_report_html_is_well_formed_and_self_contained(mlp_report):
    c = check_html(mlp_report.path / "index.html")
    assert len(c.images) == 4  # time, memory, predicted vs measured, scaling
    assert "rows:2,cols:4" in c.text["intro"] and "Spearman" in c.text["intro"]


def test_report_markdown_links_existing_images(mlp_report):
    md = (mlp_report.path / "report.md").read_text()
    assert md.startswith(f"# {mlp_report.title}\n\n{mlp_report.intro}")
    for name in ("time", "memory", "predicted_vs_measured", "scaling"):
        assert f"]({name}.png)" in md and (mlp_report.path / f"{name}.png").is_file()


def test_report_summary_and_search(mlp_report):
    summary = json.loads((mlp_report.path / "summary.json").read_text())
    assert summary["search"]["status"] == "OPTIMAL"
    assert set(summary["layouts"]) == {r.name for r in mlp_report.results}
    assert summary["spearman"] is None or -1 <= summary["spearman"] <= 1
    assert mlp_report.search is not None
    names = [r.name for r in mlp_report.results]
    assert names[0] == "searched" or any(n.endswith("(searched)") for n in names)


def test_report_without_execution_or_search(tmp_path):
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    rep = autolayout.report(g, "all:8", ["batch:all", ("model-parallel", "hidden:all"), "batch:all;hidden:all"],
                            execute=False, search=False, scaling=False, out=tmp_path, title="No execution")
    c = check_html(tmp_path / "index.html")
    assert c.text["h1"] == "No execution" and len(c.images) == 2
    bad = rep.results[-1]
    assert bad.cost is None and "illegal layout" in bad.error  # shown as a note, not raised
    assert "illegal layout" in (tmp_path / "report.md").read_text()


def test_report_module_is_callable_and_search_too():
    assert callable(autolayout.report) and callable(autolayout.search)
    g = models.mlp(batch=8192, d_io=512, d_hidden=2048)
    assert str(autolayout.search(g, "all:8", shard_weight_update=False).layout) == "batch:all"
    assert str(autolayout.layout(g, "all:8", shard_weight_update=False)) == "batch:all"
    assert autolayout.mesh_shapes(4)  # the search package's other names are exported too


def test_named_layouts():
    pairs = named_layouts(["batch:rows", ("2-D", "batch:rows;hidden:cols"), Layout("hidden:cols"), "batch:rows"])
    assert [n for n, _ in pairs] == ["batch:rows", "2-D", "hidden:cols"]
    assert named_layouts({"dp": "batch:all"}) == [("dp", Layout("batch:all"))]
    assert named_layouts("") == [("(replicated)", Layout(""))]


# ------------------------------------------------------------------------- committed
COMMITTED = sorted((ROOT / "reports").glob("*/index.html"))


def test_committed_reports_exist():
    names = {p.parent.name for p in COMMITTED}
    assert {"demo", "table1", "paper_transformer", "weight_update_sharding", "search_scaling", "validation"} <= names


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_committed_report_is_well_formed(path):
    c = check_html(path)
    assert c.images, "every committed report has at least one chart"
    for png in path.parent.glob("*.png"):
        assert png.read_bytes().startswith(PNG)
    assert (path.parent / "report.md").is_file()


def test_table1_report_regenerates(tmp_path):
    from autolayout.reporting.committed import generate_all

    generate_all(tmp_path, only=["table1"], progress=False)
    check_html(tmp_path / "table1" / "index.html")
    summary = json.loads((tmp_path / "table1" / "summary.json").read_text())
    assert summary["comp_ratio"] == [12.0] * 5
    assert summary["max_rel_diff_vs_paper_text"] < 0.01
    # §8.6: the 2-D layout keeps its efficiency, data-parallel does not
    assert summary["scaling_2d_efficiency"][-1] > 0.8 * summary["scaling_2d_efficiency"][0]
    assert summary["scaling_dp_efficiency"][-1] < 0.5 * summary["scaling_dp_efficiency"][0]


# ------------------------------------------------------------------------- helpers
def test_parse_bytes():
    assert parse_bytes("16GiB") == 16 * 2**30
    assert parse_bytes("16 GB") == 16e9 and parse_bytes("512mib") == 512 * 2**20
    assert parse_bytes("1.5e9") == 1.5e9 and parse_bytes(1024) == 1024 and math.isinf(parse_bytes("inf"))
    for bad in ("16 parsecs", "", "GiB", "--1GiB"):
        with pytest.raises(SizeError, match=f"cannot read memory size {bad!r}: expected a number"):
            parse_bytes(bad)
    for bad in ("-1GiB", "-5 GB", "0", "-0.5e9", -3):
        with pytest.raises(SizeError, match=f"memory size must be positive, got {bad!r}; give bytes per device"):
            parse_bytes(bad)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, rel=1e-6)  # ties share ranks
    assert math.isnan(spearman([1, 2], [1, 2])) and math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_short_layout():
    lay = Layout("batch:rows,cols|w:rows,cols;v:rows,cols;bias:rows")
    assert short_layout(lay, 200) == "batch:rows,cols | WUS: 2 params over rows,cols; 1 param over rows"
    assert short_layout("") == "(replicated)"
    assert short_layout("batch:fsdp|*:fsdp@3", 200) == "batch:fsdp | ZeRO-3: all params over fsdp"
    assert (short_layout("batch:fsdp|*:fsdp@3;final_norm:fsdp;pos:-;head:-", 200)
            == "batch:fsdp | WUS: 1 param over fsdp | ZeRO-3: all others over fsdp | 2 params whole")
    assert len(short_layout("a:x;b:y;c:z;d:w", limit=10)) == 10


# ------------------------------------------------------------------- readable pages
def test_report_keeps_target_predictions_apart_from_local_measurements(mlp_report):
    """tpu-v4 predictions sit beside, never ranked against, the CPU measurements."""
    rep = mlp_report
    assert rep.hardware.name == "tpu-v4" and rep.measure_hardware.name != "tpu-v4"
    table = pd.read_csv(rep.path / "layouts.csv")
    # the rank correlation is between local predictions and measurements (pandas as the reference)
    expected = table.local_predicted_ms.corr(table.measured_ms, method="spearman")
    summary = json.loads((rep.path / "summary.json").read_text())
    assert summary["spearman"] == pytest.approx(expected) or (math.isnan(expected) and summary["spearman"] is None)
    html = (rep.path / "index.html").read_text()
    local = rep.measure_hardware.name
    assert f"tpu-v4: step time" in html and f"here ({local}): predicted" in html and f"here ({local}): measured" in html
    assert "not ranked against" in rep.intro


def test_report_headline_compares_winner_with_runner_up(mlp_report):
    ranked = sorted((r for r in mlp_report.results if r.cost.fits), key=lambda r: r.cost.time_s)
    first, second = ranked[0], ranked[1]
    ratio = second.cost.time_s / first.cost.time_s
    assert f"`{first.name}` is predicted {ratio:.2f}x as fast as the runner-up `{second.name}`" in mlp_report.intro


def test_report_has_no_unrelated_scaling_section_by_default(tmp_path):
    g = models.mlp(batch=64, d_io=32, d_hidden=128)
    autolayout.report(g, "all:8", ["batch:all", "hidden:all"], execute=False, search=False, out=tmp_path)
    assert not (tmp_path / "scaling.png").exists()
    assert "§8.6" not in (tmp_path / "index.html").read_text()


def test_page_tables_have_human_headers_and_tooltips(tmp_path):
    from autolayout.reporting.page import Cell, Page, human

    assert [human(c) for c in ("predicted_ms", "memory_MiB", "solve_s", "max_abs_error", "params_M")] == [
        "predicted (ms)", "memory (MiB)", "solve (s)", "max abs error", "params (millions)"]
    long = "batch:rows,cols|embed:rows,cols;layers/w1:rows,cols"
    df = pd.DataFrame({"layout": [Cell("batch:rows,cols | WUS...", long)], "time_ms": [1.5]})
    page = Page("t", "an intro of enough words " * 4)
    page.table(df, "t", "caption")
    page.write(tmp_path)
    html = (tmp_path / "index.html").read_text()
    assert f'<span title="{long}">' in html and "time (ms)" in html
    assert "time_ms" in (tmp_path / "t.csv").read_text()  # the CSV keeps machine names


def test_collective_prints_as_xla_states_it():
    from autolayout.costmodel.rules import Collective

    c = Collective("all-reduce", 1048576, 4, ("cols",))
    assert repr(c) == str(c) == "all-reduce(1048576B over cols[4])"
    assert repr(Collective("all-gather", 64, 8, ("rows", "cols"), count=12)) == "all-gather(64B over rows,cols[8]) x12"


def test_describe_op_names_what_the_op_computes():
    from autolayout.reporting.describe import describe_op

    g = models.transformer_lm()
    texts = {n: describe_op(g, n) for n in (op.name for op in g.ops())}
    # the feed-forward output matmul reads w2[d_ff, d_model] (models.py: "blf,fd->bld")
    ffn_out = [t for n, t in texts.items() if g.op(n).kind == "einsum" and len(g.op(n).inputs) == 2
               and [d.name for d in g.op(n).output.shape] == ["batch", "length", "d_model"]
               and [d.name for d in g.op(n).input_shapes[1]] == ["d_ff", "d_model"]]
    assert ffn_out and ffn_out[0].startswith("matmul [batch,length,d_ff] × [d_ff,d_model] with layers/w2 (block, ")
    # the weight gradient of w1[d_model, d_ff]: a contraction over batch and length with that output
    w1_grad = [t for n, t in texts.items() if g.op(n).kind == "einsum" and len(g.op(n).inputs) == 2
               and {d.name for d in g.op(n).output.shape} == {"d_model", "d_ff"}]
    assert w1_grad and all("-> gradient of layers/w" in t for t in w1_grad)
    assert any("embedding lookup" in t and "with embed" in t for t in texts.values())


def test_why_faster_names_the_collectives_and_memory_saved():
    from types import SimpleNamespace as NS

    from autolayout.costmodel.rules import Collective
    from autolayout.reporting.describe import why_faster

    ar = lambda n, t, axes, count=1: Collective("all-reduce", n, 4, axes, count=count, time_s=t)  # noqa: E731
    winner = NS(time_s=2e-3, compute_s=1.5e-3, comm_s=0.5e-3, flops=1e9, memory_bytes=2 * 2**20,
                collectives=(ar(2**20, 0.25e-3, ("cols",), 2),))
    runner = NS(time_s=4e-3, compute_s=1.5e-3, comm_s=2.5e-3, flops=1e9, memory_bytes=3 * 2**20,
                collectives=(ar(2**22, 1.25e-3, ("rows", "cols"), 2),))
    text = why_faster("2-D", winner, "data-parallel", runner)
    assert text.startswith("`2-D` is predicted 2.00x as fast as the runner-up `data-parallel` (2 ms vs 4 ms per step)")
    assert "2 ms less communication" in text
    assert "2 all-reduces over cols moving 2 MiB in 500 us where the runner-up has 2 over rows×cols moving 8 MiB " \
           "in 2.5 ms" in text
    assert "It needs 2 MiB per device, less than the runner-up's 3 MiB." in text


def _ranking_rows(confirmed: bool) -> pd.DataFrame:
    # one model, five layouts; "c" was searched, "e" verified; "a" the fastest of the final round
    rows = [("a", "fit", False, False, 2.0, 2.2, 2.2), ("b", "held-out", False, False, 3.0, 2.8, math.nan),
            ("c", "held-out", True, False, 2.4, 2.6, 2.3), ("d", "held-out", False, False, 4.0, 4.4, math.nan),
            ("e", "verified", False, True, 2.1, 2.0, 2.4)]
    df = pd.DataFrame([{"model": "m", "layout": lay, "rules": lay, "half": half, "searched": s, "verified": v,
                        "measured_ms": meas, "predicted_ms": pred, "micro_ms": pred, "placeholder_ms": pred,
                        "collectives_match": True, "max_abs_error": 0.0,
                        **({"confirmed_ms": conf} if confirmed else {})}
                       for lay, half, s, v, meas, pred, conf in rows])
    return df


@pytest.mark.parametrize("confirmed", [True, False], ids=["re-timed", "final-round-only"])
def test_ranking_stats_gaps(confirmed):
    from autolayout.reporting.measured import ranking_stats

    st = ranking_stats(_ranking_rows(confirmed)).set_index("model")
    m = st.loc["m"]
    # ranks from the final round: c (2.4) is third after a (2.0) and e (2.1); e second
    assert (m.searched_rank, m.verified_rank) == (3, 2)
    # the final round's gaps against a's 2.0 ms, by hand
    assert m.searched_gap_final == pytest.approx(2.4 / 2.0 - 1)
    assert m.verified_gap_final == pytest.approx(2.1 / 2.0 - 1)
    # the re-timing: c 2.3 and e 2.4 against a's 2.2 ms; without it the final round's gap stands
    assert m.searched_gap == pytest.approx(2.3 / 2.2 - 1 if confirmed else 2.4 / 2.0 - 1)
    assert m.verified_gap == pytest.approx(2.4 / 2.2 - 1 if confirmed else 2.1 / 2.0 - 1)
    # held out: b, c, d (not the fit half, nor the verified-only layout): predicted 2.8, 2.6, 4.4 against
    # measured 3.0, 2.4, 4.0, the same order
    assert m.spearman == pytest.approx(1.0)
    assert m.median_abs_error == pytest.approx(sorted([0.2 / 3.0, 0.2 / 2.4, 0.4 / 4.0])[1])
