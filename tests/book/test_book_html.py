"""The built HTML book works offline: equations typeset, figures present, no request leaves the machine.

Opens every built page in headless Chromium (Debian's ``chromium``) inside a network namespace with
no network (``unshare -n``), lets MathJax run, and reads back the DOM and Chromium's network log.
Needs ``make book`` first; skipped when the book or Chromium is missing, unless
``MEMLIB_REQUIRE_BOOK=1`` (CI sets it), which turns a skip into a failure.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
REQUIRE = os.environ.get("MEMLIB_REQUIRE_BOOK") == "1"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--mute-audio",
         "--virtual-time-budget=20000"]


def _need(cond: bool, why: str) -> None:
    if not cond:
        if REQUIRE:
            pytest.fail(why)
        pytest.skip(why)


def _pages() -> list[Path]:
    return sorted(HTML.glob("notebooks/*.html")) + sorted(HTML.glob("book/*.html"))


def render(page: Path, tmp: Path) -> tuple[str, list[str]]:
    """DOM after scripts ran, and the URLs of requests the page (not the browser itself) started."""
    net = tmp / "net.json"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--log-net-log={net}", "--dump-dom",
           page.as_uri()]
    if shutil.which("unshare") and os.geteuid() == 0:
        cmd = ["unshare", "-n", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    log = json.loads(net.read_text())
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    requests = []
    for e in log["events"]:
        p = e.get("params", {})
        if names.get(e["type"]) == "URL_REQUEST_START_JOB" and "url" in p:
            # the browser's own services start requests with initiator "not an origin"
            if p.get("initiator") != "not an origin":
                requests.append(p["url"])
    return r.stdout, requests


@pytest.fixture(scope="module")
def chromium():
    _need(CHROMIUM is not None, "chromium is not installed (apt-get install chromium)")
    return CHROMIUM


def test_checker_sees_an_outgoing_request(chromium, tmp_path):
    # the check must be able to fail: a page that asks for a remote image is caught
    page = tmp_path / "leak.html"
    page.write_text('<html><body><img src="https://example.invalid/x.png"></body></html>')
    _, requests = render(page, tmp_path)
    assert any("example.invalid" in u for u in requests)


def test_book_is_built():
    _need((HTML / "index.html").is_file(), "the book is not built (make book)")
    assert _pages(), "no pages under _build/html/notebooks"


@pytest.mark.parametrize("name", [p.relative_to(HTML).as_posix() for p in _pages()] or ["<none>"])
def test_page_offline(chromium, name, tmp_path):
    _need((HTML / "index.html").is_file(), "the book is not built (make book)")
    page = HTML / name
    dom, requests = render(page, tmp_path)
    assert requests == [], f"{name} requested {requests}"
    source = page.read_text()
    n_math = len(re.findall(r'class="math', source))
    if n_math:
        assert dom.count("<mjx-container") >= n_math, f"{name}: MathJax typeset {dom.count('<mjx-container')} of {n_math}"
    for src in re.findall(r'<img[^>]+src="([^"]+)"', dom):
        u = urlparse(src)
        assert u.scheme in ("", "file", "data"), f"{name}: image from {src}"
        if u.scheme != "data":
            target = (page.parent / unquote(u.path)).resolve() if not u.scheme else Path(unquote(u.path))
            assert target.is_file(), f"{name}: missing image {src}"
    for src in re.findall(r'<script[^>]+src="([^"]+)"', source):
        assert not urlparse(src).scheme.startswith("http"), f"{name}: remote script {src}"


# --- layout: no table wider than the text column --------------------------------------------------------------
#: the reader's window; the book is read at 1300 px (a laptop) and 1920 px
WIDTHS = (1300,)

#: measures, after MathJax typeset, every table against the text column (article.bd-article); writes JSON into
#: a <pre> that --dump-dom hands back
_MEASURE = """<script>
window.addEventListener('load', function () {
  function go() {
    var col = document.querySelector('article.bd-article') || document.body;
    var width = col.clientWidth, out = [];
    document.querySelectorAll('table').forEach(function (t, i) {
      var cap = t.querySelector('caption'), head = t.querySelector('tr');
      out.push({i: i, w: Math.ceil(t.scrollWidth), col: width,
                what: ((cap ? cap.textContent : '') + ' | ' + (head ? head.textContent : '')).replace(/\\s+/g, ' ').slice(0, 120)});
    });
    var eqs = [];
    document.querySelectorAll('mjx-container[display="true"]').forEach(function (c, i) {
      var m = c.querySelector('mjx-math') || c, lab = c.closest('.math') || c.parentElement;
      eqs.push({i: i, w: Math.ceil(m.getBoundingClientRect().width), col: width,
                what: ((lab && lab.id) || '') + ' ' + (c.getAttribute('aria-label') || c.textContent || '').replace(/\\s+/g, ' ').slice(0, 100)});
    });
    var pre = document.createElement('pre'); pre.id = 'memlib-measure';
    pre.textContent = JSON.stringify({col: width, tables: out, equations: eqs});
    document.body.appendChild(pre);
  }
  var mj = window.MathJax && MathJax.startup && MathJax.startup.promise;
  (mj || Promise.resolve()).then(function () { setTimeout(go, 200); });
});
</script>"""


def table_widths(page: Path, tmp: Path, width: int, source: str | None = None) -> dict:
    """``{"col": text-column px, "tables": [{"w": table px, "what": caption | header}, ...]}`` for ``page`` in a
    ``width``-px window: a copy of the page (its links resolved against the original's folder) that measures."""
    import html as _html

    src = page.read_text() if source is None else source
    src = src.replace("<head>", f'<head><base href="{page.parent.as_uri()}/">', 1).replace("</body>", _MEASURE + "</body>", 1)
    copy = tmp / page.name
    copy.write_text(src)
    cmd = [CHROMIUM, *FLAGS, f"--window-size={width},1000", f"--user-data-dir={tmp / 'profile'}", "--dump-dom",
           copy.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="memlib-measure"[^>]*>(.*?)</pre>', r.stdout, re.S)
    assert m, f"{page.name}: the measuring script did not run"
    return json.loads(_html.unescape(m.group(1)))


def test_width_checker_sees_a_wide_table(chromium, tmp_path):
    # the check must be able to fail: a table of unbreakable 60-digit cells is wider than the column
    page = HTML / "notebooks" / "01_introduction.html"
    _need(page.is_file(), "the book is not built (make book)")
    wide = "<table><tr><td>" + "9" * 60 + "</td><td>" + "8" * 60 + "</td></tr></table>"
    source = page.read_text().replace('<article class="bd-article">', '<article class="bd-article">' + wide, 1)
    got = table_widths(page, tmp_path, 1300, source)
    assert got["tables"] and got["tables"][0]["w"] > got["col"] > 300


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", [p.relative_to(HTML).as_posix() for p in _pages()] or ["<none>"])
def test_tables_and_equations_fit_the_text_column(chromium, name, width, tmp_path):
    """No table and no displayed equation is wider than the text column (the registry breaks a long equation
    into aligned lines: memlib.formulas.DISPLAY_WIDTH)."""
    _need((HTML / "index.html").is_file(), "the book is not built (make book)")
    got = table_widths(HTML / name, tmp_path, width)
    wide = [f"table {t['w']} px > {t['col']} px: {t['what']}" for t in got["tables"] if t["w"] > t["col"]]
    wide += [f"equation {e['w']} px > {e['col']} px: {e['what']}" for e in got["equations"] if e["w"] > e["col"]]
    assert not wide, f"{name} at {width} px: {len(wide)} wider than the text column:\n" + "\n".join(wide)


def test_width_checker_sees_a_wide_equation(chromium, tmp_path):
    # a displayed equation of 80 terms is wider than the column: the measure must see it
    page = HTML / "notebooks" / "01_introduction.html"
    _need(page.is_file(), "the book is not built (make book)")
    wide = '<div class="math notranslate nohighlight">\\[' + " + ".join(f"x_{{{i}}}" for i in range(80)) + "\\]</div>"
    source = page.read_text().replace('<article class="bd-article">', '<article class="bd-article">' + wide, 1)
    got = table_widths(page, tmp_path, 1300, source)
    assert got["equations"] and got["equations"][0]["w"] > got["col"] > 300
