"""Check that every report page fits a 1200-px browser window, and screenshot it.

    python benchmarks/check_pages.py                       # every reports/*/index.html
    python benchmarks/check_pages.py /tmp/autolayout-demo-*/index.html --shots /tmp/shots

Each page is opened in headless Chromium (Debian: ``apt-get install chromium``) at
1200 x 900 CSS pixels. A small script, injected into a temporary copy of the page (the
page itself is not changed), measures after layout:

* the page: ``scrollWidth`` of the document must not exceed the window (no horizontal
  scroll bar);
* every table, figure, image and code block: its right edge must stay inside the page's
  ``<main>`` column, and it must not scroll horizontally itself;
* every table cell: its content must not overflow the cell (``scrollWidth`` <= ``clientWidth``);
* every image: it must be shown at least at 60% of its natural width (a chart squeezed
  further is unreadable).

A full-page PNG of each page goes to ``--shots`` (default ``/tmp/autolayout-page-shots``)
for a person to look at: overlapping labels and legends over data are not measurable
from the DOM. Prints one line per page and exits 1 if any page fails.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1200, 900
MIN_IMAGE_SCALE = 0.6

PROBE = """
<script>
window.addEventListener('load', () => {
  const problems = [];
  const W = window.innerWidth;
  const doc = document.documentElement;
  if (doc.scrollWidth > W + 1) problems.push(`page is ${doc.scrollWidth}px wide in a ${W}px window`);
  const main = document.querySelector('main') || document.body;
  const right = main.getBoundingClientRect().right;
  const label = (el) => {
    const cap = el.querySelector && el.querySelector('caption');
    const txt = (cap ? cap.textContent : (el.getAttribute('alt') || el.textContent || '')).trim();
    return `<${el.tagName.toLowerCase()}> "${txt.slice(0, 50)}"`;
  };
  for (const el of document.querySelectorAll('table, figure, img, pre')) {
    const r = el.getBoundingClientRect();
    if (r.right > right + 1) problems.push(`${label(el)} ends at ${Math.round(r.right)}px, past the page column (${Math.round(right)}px)`);
    if (el.scrollWidth > el.clientWidth + 1 && el.tagName !== 'IMG') problems.push(`${label(el)} scrolls sideways (${el.scrollWidth}px of content in ${el.clientWidth}px)`);
  }
  for (const td of document.querySelectorAll('td, th')) {
    if (td.scrollWidth > td.clientWidth + 1) problems.push(`cell "${td.textContent.trim().slice(0, 40)}" overflows (${td.scrollWidth}px in ${td.clientWidth}px)`);
  }
  for (const img of document.images) {
    if (img.naturalWidth && img.width < MIN_SCALE * img.naturalWidth) problems.push(`${label(img)} shown at ${Math.round(100 * img.width / img.naturalWidth)}% of its width`);
  }
  const out = document.createElement('pre');
  out.id = 'page-check-result';
  out.textContent = JSON.stringify({problems, height: doc.scrollHeight, width: doc.scrollWidth,
                                    tables: document.querySelectorAll('table').length,
                                    images: document.images.length});
  document.body.appendChild(out);
});
</script>
"""


def find_browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("check_pages: no headless browser found; install one with `apt-get install chromium` "
                     "(Debian/Ubuntu) and run again")


def _browser(browser: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--force-device-scale-factor=1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check_page(path: Path, browser: str, shots: Path) -> tuple[list[str], Path | None]:
    """``(problems, screenshot)`` for one HTML page."""
    html = path.read_text()
    probe = PROBE.replace("MIN_SCALE", str(MIN_IMAGE_SCALE))
    with tempfile.TemporaryDirectory(prefix="check-pages-") as tmp:
        copy = Path(tmp) / "index.html"
        copy.write_text(html.replace("</body>", probe + "</body>", 1) if "</body>" in html else html + probe)
        run = _browser(browser, f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=5000", "--dump-dom",
                       copy.as_uri())
        m = re.search(r'<pre id="page-check-result">(.*?)</pre>', run.stdout, re.S)
        if not m:
            return [f"the browser did not run the check (exit {run.returncode}): {run.stderr.strip()[-300:]}"], None
        result = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                            .replace("&amp;", "&"))
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / f"{path.parent.name}.png"
    _browser(browser, f"--window-size={WIDTH},{max(int(result['height']), HEIGHT)}", f"--screenshot={shot}",
             path.resolve().as_uri())
    return result["problems"], shot if shot.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="*", type=Path, help="HTML pages (default: reports/*/index.html)")
    parser.add_argument("--shots", type=Path, default=Path(tempfile.gettempdir()) / "autolayout-page-shots",
                        help="directory for the full-page screenshots")
    args = parser.parse_args(argv)
    pages = args.pages or sorted((ROOT / "reports").glob("*/index.html"))
    if not pages:
        print("check_pages: no pages to check", file=sys.stderr)
        return 1
    browser = find_browser()
    failed = 0
    for page in pages:
        problems, shot = check_page(page, browser, args.shots)
        status = "ok  " if not problems else "FAIL"
        failed += bool(problems)
        print(f"{status} {page}  (screenshot: {shot})")
        for p in problems:
            print(f"       {p}")
    print(f"{len(pages) - failed} of {len(pages)} pages fit a {WIDTH}-px window; screenshots in {args.shots}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
