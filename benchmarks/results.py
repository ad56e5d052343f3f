"""The benchmarks' committed results: each run writes what it printed to ``benchmarks/results/<name>.md``.

A benchmark's ``main`` runs inside :func:`recorded`, which passes everything it prints through to the
terminal and, when the run ends without an error, writes it with when and where it ran (date, cores, load
average, Python, memlib's commit) into ``benchmarks/results/<name>.md``, and rewrites the index
``benchmarks/results/README.md``: one row per benchmark and its last run.  The READMEs quote no figure of
their own; they link here.
"""
from __future__ import annotations

import datetime
import io
import os
import platform
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
_HEADER = re.compile(r"^\| \[`(?P<name>[\w-]+)`\]")


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self) -> None:
        for st in self.streams:
            st.flush()


def _commit() -> str:
    r = subprocess.run(["git", "-C", str(RESULTS.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True, check=False)
    dirty = subprocess.run(["git", "-C", str(RESULTS.parent), "status", "--porcelain", "--", "../memlib"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return (r.stdout.strip() or "unknown") + (" with local changes to memlib" if dirty else "")


def machine() -> dict[str, str]:
    """Where and when a benchmark ran."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": str(os.cpu_count()), "load": load, "python": platform.python_version(), "memlib": _commit()}


def write(name: str, output: str, argv: list[str]) -> Path:
    """``benchmarks/results/<name>.md`` for one run, and the index row of ``name``."""
    m = machine()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.md"
    command = " ".join(["python", f"benchmarks/{name}.py", *argv])
    path.write_text(f"# `{name}`: the last run\n\n"
                    f"`{command}` on {m['date']}: {m['cores']} cores (load average {m['load']}), Python "
                    f"{m['python']}, memlib at {m['memlib']}. Written by the benchmark itself "
                    f"(`benchmarks/results.py`); rerun it to update.\n\n```text\n{output.rstrip()}\n```\n",
                    encoding="utf-8")
    index = RESULTS / "README.md"
    rows = {}
    if index.exists():
        for line in index.read_text(encoding="utf-8").splitlines():
            mo = _HEADER.match(line)
            if mo:
                rows[mo.group("name")] = line
    rows[name] = (f"| [`{name}`]({name}.md) | `{command}` | {m['date']} | {m['cores']} cores, load {m['load']} | "
                  f"{m['memlib']} |")
    index.write_text("# The benchmarks' last runs\n\nEach row is written by the benchmark when it runs "
                     "(`benchmarks/results.py`); its file holds what it printed.\n\n"
                     "| benchmark | command | last run | machine | memlib |\n|---|---|---|---|---|\n"
                     + "\n".join(rows[k] for k in sorted(rows)) + "\n", encoding="utf-8")
    return path


@contextmanager
def recorded(name: str):
    """Run the body with its printed output kept; on success, :func:`write` it as ``name``'s results."""
    kept = io.StringIO()
    old = sys.stdout
    sys.stdout = _Tee(old, kept)
    try:
        yield
    finally:
        sys.stdout = old
    path = write(name, kept.getvalue(), sys.argv[1:])
    print(f"results: {path.relative_to(RESULTS.parents[0])}")
