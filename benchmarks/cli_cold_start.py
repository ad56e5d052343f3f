"""Cold-start wall time of the memlib CLI.

Runs `memlib estimate --model deepseek-v3 --dp 32 --tp 2 --pp 16 --ep 8 --etp 1` N times, each in a
fresh process (so every run pays interpreter start-up + imports, e.g. sympy), and prints the
min / median / max wall-clock seconds.

Usage:  .venv/bin/python benchmarks/cli_cold_start.py [--repeat N]     (or: make bench)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARGS = ["estimate", "--model", "deepseek-v3", "--dp", "32", "--tp", "2", "--pp", "16", "--ep", "8", "--etp", "1"]


def memlib_command() -> list[str]:
    """The venv's `memlib` console script next to sys.executable, else `python -m memlib`."""
    exe = Path(sys.executable).with_name("memlib")
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("memlib", path=str(Path(sys.executable).parent))
    if found:
        return [found]
    return [sys.executable, "-m", "memlib"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="number of fresh-process runs (default 10)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    cmd = memlib_command() + ARGS
    print("command:", " ".join(cmd))
    times: list[float] = []
    for i in range(args.repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            print(f"run {i + 1} failed (exit {proc.returncode}):\n{proc.stderr}", file=sys.stderr)
            return 1
        times.append(elapsed)

    print(f"runs:   {len(times)}")
    print(f"min:    {min(times):.3f} s")
    print(f"median: {statistics.median(times):.3f} s")
    print(f"max:    {max(times):.3f} s")
    return 0


if __name__ == "__main__":
    from results import recorded   # benchmarks/results.py: writes benchmarks/results/cli_cold_start.md

    with recorded("cli_cold_start"):
        code = main()
    raise SystemExit(code)
