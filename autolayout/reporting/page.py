"""One report directory: ``index.html`` (self-contained), ``report.md``, PNGs, CSVs, ``summary.json``.

A :class:`Page` collects blocks (paragraphs, tables, images, code) in order and writes
them twice: as HTML with every image embedded as a base64 ``data:`` URI (the file can be
mailed or opened anywhere), and as Markdown that links the PNG files next to it. Each
table is also written as CSV (the raw numbers, not the rounded display), and
``summary.json`` holds the key figures for scripts and tests.
"""
from __future__ import annotations

import base64
import datetime
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Page", "Cell", "human", "jsonable"]

# Laid out for a 1200-px window (benchmarks/check_pages.py checks it): tables take the
# page width and wrap their cells, long codes wrap instead of scrolling, figures scale down.
CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;
background:#fafafa;color:#222;line-height:1.45}
main{max-width:1080px;margin:0 auto;padding:24px 32px;background:#fff;box-sizing:border-box}
h1{font-size:1.7em;margin-bottom:.3em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}
p.intro{font-size:1.05em;background:#f3f6fb;padding:12px 16px;border-left:4px solid #4C72B0}
table{border-collapse:collapse;margin:12px 0;font-size:.84em;max-width:100%}
th,td{border:1px solid #ddd;padding:4px 6px;text-align:right;overflow-wrap:break-word}td.num{white-space:nowrap}
th{background:#f0f0f0;font-weight:600;vertical-align:bottom}
td.text,th.text{text-align:left}caption{caption-side:top;text-align:left;font-weight:600;padding:4px 0}
td span[title]{border-bottom:1px dotted #888;cursor:help}
figure{margin:16px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}figcaption{font-size:.9em;color:#555}
pre{background:#f6f8fa;padding:10px;font-size:.85em;white-space:pre-wrap;overflow-wrap:anywhere}
code{overflow-wrap:anywhere}p.note{font-size:.88em;color:#444}
footer{margin-top:2em;font-size:.8em;color:#777}
""".strip()


@dataclass(frozen=True)
class Cell:
    """A table cell shown as ``text`` with the full value in a tooltip (HTML ``title``)."""

    text: str
    title: str = ""

    def __str__(self) -> str:
        return self.text


# column-name suffixes of the CSVs -> the unit a reader sees in the header
_UNITS = [("_ms", "ms"), ("_us", "us"), ("_s", "s"), ("_MiB", "MiB"), ("_GiB", "GiB"), ("_bytes", "bytes"),
          ("_B", "B"), ("_pct", "%"), ("_M", "millions"), ("_b", "billions")]


def human(column: str) -> str:
    """A CSV column name as a table header: ``predicted_ms`` -> ``predicted (ms)``."""
    name, unit = str(column), ""
    for suffix, u in _UNITS:
        if name.endswith(suffix) and len(name) > len(suffix):
            name, unit = name[: -len(suffix)], u
            break
    name = name.replace("_", " ")
    return f"{name} ({unit})" if unit else name


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, Cell):
        return v.text
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}" if abs(v) >= 1e4 else str(int(v))
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 1e4 else str(v)
    return str(v)


_NUMERIC = re.compile(r"[-+]?[\d.,]+(e[-+]?\d+)?\s*(%|x|B|KiB|MiB|GiB|TiB|ns|us|ms|s|GB/s|TFLOP/s)?"
                      r"(\s*\(.*\))?", re.IGNORECASE)


def _is_text(values: list[Any]) -> bool:
    """A column is text (left-aligned) unless every value is a number, possibly with a unit."""
    values = [v.text if isinstance(v, Cell) else v for v in values]
    return any(isinstance(v, str) and v and not _NUMERIC.fullmatch(v.strip()) for v in values)


@dataclass
class _Block:
    kind: str  # heading | paragraph | note | table | image | code
    text: str = ""
    data: Any = None
    name: str = ""


@dataclass
class Page:
    """A report page; add blocks, then :meth:`write` it to a directory."""

    title: str
    intro: str
    blocks: list[_Block] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    command: str = ""

    def heading(self, text: str) -> Page:
        self.blocks.append(_Block("heading", text))
        return self

    def paragraph(self, text: str) -> Page:
        self.blocks.append(_Block("paragraph", text))
        return self

    def code(self, text: str) -> Page:
        self.blocks.append(_Block("code", text))
        return self

    def table(self, df: Any, name: str, caption: str = "", display: Any = None) -> Page:
        """``df`` goes to ``NAME.csv``; ``display`` is what the page shows (default: ``df``
        with :func:`human` column names). Cells may be :class:`Cell` (text + tooltip)."""
        if display is None:
            display = df.rename(columns=human)
        self.blocks.append(_Block("table", caption, (df, display), name))
        return self

    def note(self, text: str) -> Page:
        """A small-print paragraph (footnotes under a table)."""
        self.blocks.append(_Block("note", text))
        return self

    def image(self, png: bytes, name: str, caption: str) -> Page:
        self.blocks.append(_Block("image", caption, png, name))
        return self

    # ------------------------------------------------------------------------ output
    def write(self, out: str | Path) -> Path:
        """Write ``index.html``, ``report.md``, ``*.png``, ``*.csv`` and ``summary.json``; return ``out``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for b in self.blocks:
            if b.kind == "table":
                b.data[0].to_csv(out / f"{b.name}.csv", index=False)
            elif b.kind == "image":
                (out / f"{b.name}.png").write_bytes(b.data)
        (out / "index.html").write_text(self.html())
        (out / "report.md").write_text(self.markdown())
        (out / "summary.json").write_text(json.dumps(jsonable(self.summary), indent=2, sort_keys=True) + "\n")
        return out

    def _footer(self) -> str:
        from autolayout.version import __version__

        when = datetime.date.today().isoformat()
        how = f" Regenerate with <code>{html.escape(self.command)}</code>." if self.command else ""
        return f"Generated by autolayout {__version__} on {when}.{how}"

    def html(self) -> str:
        e = html.escape
        parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
                 '<meta name="viewport" content="width=device-width, initial-scale=1">',
                 f"<title>{e(self.title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>", "<main>",
                 f"<h1>{e(self.title)}</h1>", f'<p class="intro">{_inline_html(self.intro)}</p>']
        open_section = False
        for b in self.blocks:
            if b.kind == "heading":
                if open_section:
                    parts.append("</section>")
                parts.append(f"<section><h2>{e(b.text)}</h2>")
                open_section = True
            elif b.kind == "paragraph":
                parts.append(f"<p>{_inline_html(b.text)}</p>")
            elif b.kind == "note":
                parts.append(f'<p class="note">{_inline_html(b.text)}</p>')
            elif b.kind == "code":
                parts.append(f"<pre><code>{e(b.text)}</code></pre>")
            elif b.kind == "table":
                parts.append(_html_table(b.data[1], b.text))
            elif b.kind == "image":
                data = base64.b64encode(b.data).decode("ascii")
                parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{e(b.text)}">'
                             f"<figcaption>{e(b.text)}</figcaption></figure>")
        if open_section:
            parts.append("</section>")
        parts += [f"<footer>{self._footer()}</footer>", "</main>", "</body>", "</html>"]
        return "\n".join(parts) + "\n"

    def markdown(self) -> str:
        lines = [f"# {self.title}", "", self.intro, ""]
        for b in self.blocks:
            if b.kind == "heading":
                lines += [f"## {b.text}", ""]
            elif b.kind in ("paragraph", "note"):
                lines += [b.text, ""]
            elif b.kind == "code":
                lines += ["```", b.text, "```", ""]
            elif b.kind == "table":
                if b.text:
                    lines += [f"**{b.text}**", ""]
                lines += [_md_table(b.data[1]), "", f"([{b.name}.csv]({b.name}.csv))", ""]
            elif b.kind == "image":
                lines += [f"![{b.text}]({b.name}.png)", "", f"*{b.text}*", ""]
        lines += [re.sub(r"</?code>", "`", self._footer()), ""]
        return "\n".join(lines)


def _inline_html(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _html_table(df: Any, caption: str) -> str:
    e = html.escape
    cols = list(df.columns)
    text_cols = [_is_text(list(df[c])) for c in cols]
    out = ["<table>"]
    if caption:
        out.append(f"<caption>{e(caption)}</caption>")
    out.append("<thead><tr>" + "".join(
        f'<th class="{"text" if t else "num"}">{e(str(c))}</th>' for c, t in zip(cols, text_cols)) + "</tr></thead>")
    out.append("<tbody>")
    for row in df.itertuples(index=False):
        out.append("<tr>" + "".join(
            f'<td class="{"text" if t else "num"}">{_html_cell(v)}</td>' for v, t in zip(row, text_cols)) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _breakable(text: str) -> str:
    """Escaped text with line-break opportunities after ``;`` ``,`` ``|`` ``/`` (layouts, meshes)."""
    return re.sub(r"([;,|/])(?=\S)", r"\1<wbr>", html.escape(text))


def _html_cell(v: Any) -> str:
    if isinstance(v, Cell) and v.title and v.title != v.text:
        return f'<span title="{html.escape(v.title)}">{_breakable(v.text)}</span>'
    return _breakable(_cell(v))


def _md_table(df: Any) -> str:
    cols = [str(c) for c in df.columns]
    text_cols = [_is_text(list(df[c])) for c in df.columns]
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in cols) + " |",
             "|" + "|".join(":---" if t else "---:" for t in text_cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(esc(_cell(v)) for v in row) + " |")
    return "\n".join(lines)


def jsonable(x: Any) -> Any:
    """``x`` with numpy scalars, tuples and non-string keys made JSON-serialisable."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return jsonable(x.item())
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)
