"""Wall-clock time of a clean build of the whole book (every chapter executed), as `make book` does it.

Builds into a fresh temporary folder each time, with a fresh execution cache (``MEMLIB_BOOK_CACHE``, see
``book/_ext/memlib_book.py``), so that every chapter is executed, and prints each run's seconds
and the median.  The brief's target: about a minute on 2 cores.

    .venv/bin/python benchmarks/book_build.py [--repeat 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    jb = Path(sys.executable).with_name("jupyter-book")
    times = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            r = subprocess.run([str(jb), "build", str(ROOT), "--path-output", out, "-W", "-n", "--keep-going"],
                               capture_output=True, text=True, check=False,
                               env={**os.environ, "MEMLIB_BOOK_CACHE": str(Path(out) / "cache")})
            dt = time.perf_counter() - t0
            if r.returncode:
                sys.exit(f"build failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            times.append(dt)
            print(f"run {i + 1}: {dt:.1f} s")
    print(f"clean book build on {os.cpu_count()} cores: median {statistics.median(times):.1f} s over {len(times)} run(s)")


if __name__ == "__main__":
    from results import recorded   # benchmarks/results.py: writes benchmarks/results/book_build.md

    with recorded("book_build"):
        main()
