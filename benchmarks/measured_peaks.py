"""memlib's peak_allocated against the peaks Megatron-LM's functional tests log: the error table.

Every case of memlib.scenarios.measured (read from the test's own model_config.yaml, the world size of
its recipe or derived), the logged steady peak (third iteration) and run maximum, memlib's prediction
and its parts, the error, and the routing imbalance at which memlib reaches the run maximum; then the
tests memlib cannot express, with the reason; then the wall-clock time of the whole comparison.

    .venv/bin/python benchmarks/measured_peaks.py [--unit GiB|GB]
"""
from __future__ import annotations

import argparse
import time

from memlib.core.units import fmt_bytes, fmt_decimal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", default="GiB", choices=("GiB", "GB"))
    u = ap.parse_args().unit
    t0 = time.perf_counter()
    from memlib.scenarios import measured as sm

    cases = sm.measured_cases()
    elapsed = time.perf_counter() - t0
    f = lambda n: fmt_bytes(n, u, 2, with_unit=False)  # noqa: E731
    head = ("case", "GPU", "GPUs", "steady", "run max", "memlib", "persistent", "activations", "transient", "error",
            "vs run max", "imbalance")
    rows = []
    for c in cases:
        p = c.peak
        rows.append((c.case.label + ("" if c.case.issue else " *"), c.device, str(c.world_size), f(c.steady),
                     f(c.run_max), f(c.predicted), f(sum(p.persistent.values())), f(sum(p.activations.values())),
                     f(sum(p.transient.values())), fmt_decimal(100 * c.error, 2) + " %",
                     fmt_decimal(100 * c.error_run_max, 2) + " %",
                     fmt_decimal(c.imbalance, 3) if c.imbalance is not None else "-"))
    w = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    print(f"memlib peak_allocated vs Megatron-LM's logged max_memory_allocated, last rank ({u}; * = not one of "
          f"the published maxima the comparison was set up on)")
    print("  ".join(h.rjust(x) for h, x in zip(head, w)))
    for r in rows:
        print("  ".join(v.rjust(x) for v, x in zip(r, w)))
    s = sm.summary(cases)
    print(f"\nwithin {fmt_decimal(100 * sm.TARGET, 0)} % of the steady peak: {s['within']} of {s['n']}; largest |error| "
          f"{fmt_decimal(100 * s['max_abs'], 2)} %, mean |error| {fmt_decimal(100 * s['mean_abs'], 2)} %")
    print("\nnot expressible:")
    for name, why, mx in sm.not_expressible():
        print(f"  {name} ({fmt_bytes(mx, u)}): {why}")
    print(f"\nall cases predicted in {elapsed:.2f} s (imports included)")


if __name__ == "__main__":
    from results import recorded   # benchmarks/results.py: writes benchmarks/results/measured_peaks.md

    with recorded("measured_peaks"):
        main()
