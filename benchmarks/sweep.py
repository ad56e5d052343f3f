"""Vectorised sweep against one-by-one evaluation.

Builds the allocated bytes of one device of stage 1 (DeepSeek-V3, the paper's layout, ZeRO-1, full
recomputation, 1F1B) as a SymPy formula in DP, TP, EP, ETP, CP, b and s (memlib.device.estimate.stage_formula),
lambdifies it and evaluates it on a grid of more than 10^5 configurations with NumPy.  The baselines
evaluate configurations one by one: exactly through memlib.estimate (the CLI's path) and by exact
substitution into the same formula.  The vectorised floats are checked against the exact integers.

    .venv/bin/python benchmarks/sweep.py [--sample 200]
"""
from __future__ import annotations

import argparse
import itertools
import random
import time

import numpy as np

from memlib import PAPER_TRAINING, estimate
from memlib.device.estimate import stage_formula
from memlib.core.symbols import sym

KEYS = ("DP", "TP", "EP", "ETP", "CP", "b", "s")
GRID = {
    "DP": (4, 8, 16, 32, 64, 128, 256, 512),
    "TP": (1, 2, 4, 8, 16),
    "EP": (1, 2, 4, 8, 16, 32, 64),
    "ETP": (1, 2),
    "CP": (1, 2, 4),
    "b": (1, 2, 3, 4, 5, 6, 7, 8),
    "s": (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=200, help="configurations evaluated one by one")
    args = ap.parse_args()

    base = PAPER_TRAINING.with_(zero=1, recompute="full")
    t0 = time.perf_counter()
    formula = stage_formula(estimate("deepseek-v3", base), 1).total
    t_build = time.perf_counter() - t0
    syms = [sym(k) for k in KEYS]
    f = __import__("sympy").lambdify(syms, formula, modules="numpy")

    grid = np.array(list(itertools.product(*(GRID[k] for k in KEYS))), dtype=np.float64)
    n = len(grid)
    t0 = time.perf_counter()
    values = f(*grid.T)
    t_vec = time.perf_counter() - t0

    rng = random.Random(0)
    rows = rng.sample(range(n), args.sample)
    t0 = time.perf_counter()
    exact_subs = [int(formula.xreplace(dict(zip(syms, map(int, grid[i]))))) for i in rows]
    t_subs = time.perf_counter() - t0

    valid = [i for i in rows if (grid[i][0] * grid[i][1] * grid[i][4]) % (grid[i][2] * grid[i][3]) == 0
             and grid[i][6] % (grid[i][4] * grid[i][1]) == 0 and 2048 % grid[i][3] == 0 and 128 % grid[i][1] == 0]
    t0 = time.perf_counter()
    for i in valid:
        c = dict(zip(KEYS, map(int, grid[i])))
        estimate("deepseek-v3", base.with_(dp=c["DP"], tp=c["TP"], ep=c["EP"], etp=c["ETP"], cp=c["CP"],
                                           micro_batch=c["b"], seq_len=c["s"])).stages[1].allocated
    t_est = time.perf_counter() - t0

    worst = max(abs(values[i] - e) / e for i, e in zip(rows, exact_subs))
    print(f"formula built in {t_build:.2f} s; {n:,} configurations")
    print(f"vectorised (lambdify + NumPy): {t_vec * 1e3:.1f} ms  -> {n / t_vec:,.0f} configurations/s")
    print(f"one by one, exact substitution: {t_subs / len(rows) * 1e3:.2f} ms each -> {len(rows) / t_subs:,.0f} configurations/s")
    if valid:
        print(f"one by one, memlib.estimate (valid {len(valid)} of the sample): {t_est / len(valid) * 1e3:.1f} ms each "
              f"-> {len(valid) / t_est:,.0f} configurations/s")
    print(f"speed-up of the vectorised sweep over exact substitution: {(n / t_vec) / (len(rows) / t_subs):,.0f}x")
    print(f"largest relative difference, floats vs exact integers: {worst:.1e}")


if __name__ == "__main__":
    from results import recorded   # benchmarks/results.py: writes benchmarks/results/sweep.md

    with recorded("sweep"):
        main()
