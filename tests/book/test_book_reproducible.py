"""Building the book twice gives the same HTML text and the same figures, byte for byte.

Builds a second copy into a temporary folder and compares it with ``_build/html`` (from ``make book``).  The
second build reuses the chapters the first one executed (``execute_notebooks: cache``, keyed by memlib and the
environment: ``book/_ext/memlib_book.py``), so it checks that the book is rendered the same from the same
executions; ``MEMLIB_CHECK_REPRODUCIBLE=execute`` executes every chapter again into a fresh cache, which also
checks that two executions print the same.  It runs only when ``MEMLIB_REQUIRE_BOOK=1`` (CI) or
``MEMLIB_CHECK_REPRODUCIBLE`` is set.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
CHECK = os.environ.get("MEMLIB_CHECK_REPRODUCIBLE", "")
RUN = os.environ.get("MEMLIB_REQUIRE_BOOK") == "1" or CHECK in ("1", "execute")


def _files(root: Path) -> dict[str, bytes]:
    """The HTML pages and the images they show (an earlier build's images may linger in _images/)."""
    # Sphinx appends "?v=<checksum>" to a static file's link only when the file is already in the
    # output folder (a rebuild into the same folder): a cache-buster, not content
    out = {p.relative_to(root).as_posix(): re.sub(rb"\?v=[0-9a-f]+", b"", p.read_bytes())
           for p in sorted(root.rglob("*.html")) if not p.relative_to(root).as_posix().startswith("_static/")}
    shown = {m for text in out.values() for m in re.findall(rb"_images/([^\"'?#\s]+)", text)}
    for name in sorted(shown):
        out[f"_images/{name.decode()}"] = (root / "_images" / name.decode()).read_bytes()
    return out


@pytest.mark.slow
@pytest.mark.skipif(not RUN, reason="set MEMLIB_CHECK_REPRODUCIBLE=1 (CI sets MEMLIB_REQUIRE_BOOK=1) to build twice")
def test_second_build_is_identical(tmp_path):
    if not (HTML / "index.html").is_file():
        pytest.fail("the book is not built (make book)")
    jb = Path(sys.executable).with_name("jupyter-book")
    env = {**os.environ, "MEMLIB_BOOK_CACHE": str(tmp_path / "cache")} if CHECK == "execute" else None
    r = subprocess.run([str(jb), "build", str(ROOT), "--path-output", str(tmp_path), "-W", "-n", "--keep-going"],
                       capture_output=True, text=True, timeout=1200, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    first, second = _files(HTML), _files(tmp_path / "_build" / "html")
    assert sorted(first) == sorted(second)
    differ = [k for k in first if first[k] != second[k]]
    assert differ == [], f"differ between two builds: {differ[:10]}"
