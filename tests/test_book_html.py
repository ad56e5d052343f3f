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

ROOT = Path(__file__).resolve().parents[1]
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
