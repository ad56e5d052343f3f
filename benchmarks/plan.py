"""memlib plan's speed, and what fits: the DeepSeek-V3 search on 2048 GPUs, the compiled grid, estimate().

    PYTHONPATH=. .venv/bin/python benchmarks/plan.py

Prints, in-process (after ``import memlib``): the time of ``plan`` over the DeepSeek-V3 options (precision
deepseek-v3, recompute deepseek, DualPipe; every PP, TP, CP, DP, EP, ETP, ZeRO, b and layout rule) and over
the default space (recompute none/selective/full, 1F1B/interleaved/DualPipe), cold (first call: compiling)
and warm (the compiled families kept); the compiled evaluator's stage-configurations per second; estimate()
for one configuration; where the DeepSeek-V3 recipe ranks; and how many configurations fit on 1024 and 512
GPUs of 80 GB and 141 GB.
"""
from __future__ import annotations

import time

import numpy as np

from memlib import TrainingConfig, estimate
from memlib.compiled import Family
from memlib.plan import plan

GB = 10**9
DS = dict(profiles=("megatron",), precisions=("deepseek-v3",), recomputes=("deepseek",), schedules=("dualpipe",))
RECIPE = TrainingConfig(dp=128, tp=1, pp=16, ep=64, etp=1, zero=1, profile="megatron", precision="deepseek-v3",
                        recompute="deepseek", schedule="dualpipe", num_microbatches=120)


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0


def main() -> None:
    for label, kw in (("DeepSeek-V3 options", DS), ("default space", {})):
        r, cold = timed(plan, "deepseek-v3", 2048, 80 * GB, top=10, **kw)
        _, warm = timed(plan, "deepseek-v3", 2048, 80 * GB, top=10, **kw)
        print(f"plan deepseek-v3, 2048 GPUs, 80 GB, {label}, top 10: {r.searched:,} searched, {r.fitting:,} fit; "
              f"cold {cold:.2f} s, warm {warm:.2f} s")
        if kw is DS:
            r = plan("deepseek-v3", 2048, 80 * GB, top=None, **kw)     # every fitting configuration listed
            rank = next(i for i, c in enumerate(r.configs, 1)
                        if (c["config"]["pp"], c["config"]["tp"], c["config"]["ep"], c["config"]["zero"],
                            c["config"]["micro_batch"]) == (16, 1, 64, 1, 1))
            print(f"  the DeepSeek-V3 recipe (PP16 TP1 EP64 ZeRO-1 DualPipe b=1) ranks {rank} of {r.fitting}")

    fam = Family.of("deepseek-v3", RECIPE)
    pipe = fam.pipeline(16, "dualpipe")
    n = 200_000
    rng = np.random.default_rng(0)
    ep = rng.choice([8, 16, 32, 64], n)
    knobs = dict(dp=np.full(n, 128), tp=np.ones(n, int), ep=ep, etp=np.ones(n, int), cp=np.ones(n, int),
                 micro_batch=rng.integers(1, 5, n), seq_len=np.full(n, 4096), zero=rng.integers(0, 4, n),
                 num_microbatches=np.full(n, 120))
    pipe.evaluate(**{k: v[:1000] for k, v in knobs.items()})
    _, t = timed(pipe.evaluate, **knobs)
    print(f"compiled grid (PP16 DualPipe, {n:,} random rows, no cache): {n * 16 / t:,.0f} stage-configurations/s "
          f"({t:.2f} s)")

    estimate("deepseek-v3", RECIPE).stages
    ts = [timed(lambda: estimate("deepseek-v3", RECIPE).stages)[1] for _ in range(5)]
    print(f"estimate() one configuration, after the first call: {min(ts) * 1e3:.1f} ms")

    for gpus in (1024, 512):
        for cap in (80, 141):
            r = plan("deepseek-v3", gpus, cap * GB, top=1, **DS)
            best = r.configs[0]["config"] if r.configs else None
            desc = "nothing" if best is None else (
                f"best PP{best['pp']} TP{best['tp']} CP{best['cp']} DP{best['dp']} EP{best['ep']} "
                f"ZeRO-{best['zero']} b={best['micro_batch']}, peak {r.configs[0]['peak'] / 2**30:.1f} GiB")
            print(f"{gpus} GPUs of {cap} GB (DeepSeek-V3 options): {r.fitting:,} of {r.searched:,} fit; {desc}")


if __name__ == "__main__":
    main()
