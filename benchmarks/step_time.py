"""plan's step-time model (memlib.search.cost) against SimuMax's 43 measured Megatron-LM runs on one B200 node.

    PYTHONPATH=. .venv/bin/python benchmarks/step_time.py [--rows]

Prints the efficiency refitted on the runs (memlib holds it as memlib.search.cost.EFFICIENCY["B200"]), the pairs of a
group (one model, micro-batch count and sequence) ordered as measured (those whose measured throughputs differ by 2 %
or more, and all), Spearman's correlation per model, predicted/measured step per model and its largest spread within
a group, the tie band (the median error of the model's ratio between two runs), the same figures for SimuMax's own
predictions (``perf_ms``: a simulator calibrated per GEMM shape and per collective, a reference point), and with
``--rows`` every run's terms.
"""
from __future__ import annotations

import argparse
import time

from memlib.scenarios import steps


def _pairs(rows, key) -> tuple[int, int]:
    right = total = 0
    groups: dict = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    for rs in groups.values():
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                if max(a.measured_tps, b.measured_tps) / min(a.measured_tps, b.measured_tps) - 1 < steps.THRESHOLD:
                    continue
                total += 1
                right += (a.measured_tps - b.measured_tps) * (a.tokens / key(a) - b.tokens / key(b)) > 0
    return right, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="every run's terms")
    args = ap.parse_args()
    t0 = time.perf_counter()
    eff = steps.calibrate()
    print(f"efficiency refitted on the runs: {eff:.4f} ({time.perf_counter() - t0:.1f} s)")
    v = steps.validation()
    print(f"with memlib's efficiency {v.efficiency}: {v.right} of {v.right + v.wrong} pairs (>= "
          f"{steps.THRESHOLD:.0%} apart) in the measured order; all pairs: "
          f"{sum(ok for *_, ok in v.pairs(0.0))} of {len(v.pairs(0.0))}")
    for x in steps.by_model(v):
        print(f"  {x.model:12s} {x.runs:2d} runs, pairs {x.right}/{x.pairs}, Spearman {x.spearman:.3f}, "
              f"predicted/measured {x.low:.3f}..{x.high:.3f}, largest spread in a group {x.spread:.3f}")
    print(f"tie band (median pairwise error): {steps.tie_band(v):.4f}")
    wrong = [(a.run["case"], b.run["case"]) for a, b, ok in v.pairs(steps.THRESHOLD) if not ok]
    print(f"ordered wrong: {wrong}")
    right, total = _pairs(v.rows, lambda r: r.run["simumax_ms"] / 1e3)
    print(f"SimuMax's own predictions (perf_ms): {right} of {total} pairs in the measured order")
    if args.rows:
        for r in v.rows:
            terms = " ".join(f"{k[:-2]} {x * 1e3:.0f}" for k, x in r.terms.items() if k.endswith("_s"))
            print(f"  {r.run['case'][:54]:54s} measured {r.run['measured_ms']:8.1f} ms  predicted/measured "
                  f"{r.ratio:.3f}  {terms}")


if __name__ == "__main__":
    from results import recorded   # benchmarks/results.py: writes benchmarks/results/step_time.md

    with recorded("step_time"):
        main()
