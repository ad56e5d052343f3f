"""memlib's peak_allocated against every peak Megatron-LM's functional tests log, and against SimuMax's B200 runs.

Every golden-values file of memlib.scenarios.functional (the test's model_config.yaml and the Megatron-LM version
that wrote the values, the recipe's world size or a derived one, the platform's GPU): the measured steady peak
(third logged iteration), memlib's prediction, the error, and where a miss lies (after the step, or at the peak);
the hits and misses per family and GPU; the reasons of the cases memlib cannot express, with their counts; then
SimuMax's published Llama-3 runs stage by stage; then the wall-clock time of the whole comparison.

    PYTHONPATH=. .venv/bin/python benchmarks/measured_peaks.py [--unit GiB|GB] [--misses]
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

from memlib.core.units import fmt_bytes, fmt_decimal


def _pct(x) -> str:
    return fmt_decimal(100 * x, 2) + " %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", default="GiB", choices=("GiB", "GB"))
    ap.add_argument("--misses", action="store_true", help="list only the cases outside 1 %")
    args = ap.parse_args()
    u = args.unit
    t0 = time.perf_counter()
    from memlib.scenarios import functional as fv, measured as sm

    ok, no = fv.validation()
    published = sm.published_cases()
    elapsed = time.perf_counter() - t0
    f = lambda n: fmt_bytes(n, u, 3, with_unit=False)  # noqa: E731
    mib = lambda n: fmt_decimal(n / 2**20, 0)  # noqa: E731
    head = ("functional test", "file", "GPUs", "measured", "memlib", "error", "after step MiB", "at peak MiB")
    rows = [(c.golden.test, c.golden.file.removeprefix("golden_values_").removesuffix(".json"), str(c.world_size),
             f(c.steady), f(c.predicted), _pct(c.error), mib(c.post_step_gap), mib(c.peak_gap))
            for c in sorted(ok, key=lambda c: (c.family, c.golden.test, c.golden.file))
            if not (args.misses and c.within_target)]
    w = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    print(f"memlib peak_allocated vs the steady peak Megatron-LM's functional tests log on the last rank ({u})")
    print("  ".join(h.ljust(x) if i < 2 else h.rjust(x) for i, (h, x) in enumerate(zip(head, w))))
    for r in rows:
        print("  ".join(v.ljust(x) if i < 2 else v.rjust(x) for i, (v, x) in enumerate(zip(r, w))))
    s = fv.summary(ok)
    print(f"\n{s['n']} of {len(ok) + len(no)} golden files expressed; within {fmt_decimal(100 * fv.TARGET, 0)} % of the "
          f"steady peak: {s['within']} ({_pct(s['within'] / max(s['n'], 1))}); largest |error| {_pct(s['max_abs'])}, "
          f"mean |error| {_pct(s['mean_abs'])}")
    for fam in s["families"]:
        for gpu in ("A100", "H100", "GB200"):
            cs = [c for c in ok if c.family == fam and c.golden.gpu == gpu]
            if cs:
                print(f"  {fam:28s} {gpu:6s} {sum(c.within_target for c in cs):4d} of {len(cs):4d} within")
    print("\nnot expressible (golden files, reason):")
    for why, n in Counter(x.reason for x in no).most_common():
        print(f"  {n:4d}  {why}")
    print("\nSimuMax B200 Llama-3 runs (measured maximum per stage, memlib, error):")
    for c in published:
        stages = ", ".join(f"{f(m)} / {f(p.peak_allocated)} ({_pct(e)})"
                           for m, p, e in zip(c.measured, c.peaks, c.stage_errors))
        print(f"  {c.label:38s} {stages}")
    print(f"\nall cases predicted in {elapsed:.1f} s (imports and the data file included)")


if __name__ == "__main__":
    from results import recorded   # benchmarks/results.py: writes benchmarks/results/measured_peaks.md

    with recorded("measured_peaks"):
        main()
