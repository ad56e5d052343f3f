"""memlib plan's speed, and what fits: the DeepSeek-V3 search on 2048 GPUs, the compiled grid, estimate().

    PYTHONPATH=. .venv/bin/python benchmarks/plan.py

Prints, in-process (after ``import memlib``): the time of ``plan`` over the DeepSeek-V3 options (precision
deepseek-v3, recompute deepseek, DualPipe; every PP, TP, CP, DP, EP, ETP, ZeRO, b and layout rule) and over
the default space (recompute none/selective/full, 1F1B/interleaved/DualPipe), cold (first call: compiling)
and warm (the compiled families kept); the compiled evaluator's stage-configurations per second beside the
exact one-by-one path (``estimate()``, every stage) and Megatron-LM's closed form
(``megatron/training/theoretical_memory_usage.py``, floats, the first stage only: a reference point for
speed, read from the Megatron-LM mirror when there is one); estimate() for one configuration after the
first call (the same configuration, and configurations that differ in EP, b and ZeRO); where the
DeepSeek-V3 recipe ranks; and how many configurations fit on 1024 and 512 GPUs of 80 GB and 141 GB.

Every time is the best of several runs (``--repeat``), wall clock and CPU time of this process: on a
shared machine the CPU time is the fairer figure.  First, the same DeepSeek-V3 search as a user runs it from
a shell, ``python -m memlib plan ... --top 3 --json`` in a fresh process (interpreter start-up, the imports,
SymPy's included, the compilation and the search): best wall clock and CPU time (user + system) of
``max(--repeat, 5)`` runs.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np

from memlib import TrainingConfig, estimate
from memlib.search.compiled import Family
from memlib.search.plan import SearchSpace, plan

GB = 10**9
DS = dict(profiles=("megatron",), precisions=("deepseek-v3",), recomputes=("deepseek",), schedules=("dualpipe",))
RECIPE = TrainingConfig(dp=128, tp=1, pp=16, ep=64, etp=1, zero=1, profile="megatron", precision="deepseek-v3",
                        recompute="deepseek", schedule="dualpipe", num_microbatches=120)


MIRROR = os.environ.get("MEGATRON_LM_GIT", "/work/.mirror/NVIDIA+Megatron-LM/repo")


def timed(fn, *a, **kw):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0, time.process_time() - c0


def best_of(fn, repeat: int):
    """(result, best wall seconds, best CPU seconds) of ``repeat`` runs."""
    runs = [timed(fn) for _ in range(repeat)]
    return runs[-1][0], min(r[1] for r in runs), min(r[2] for r in runs)


CLI = ["plan", "--model", "deepseek-v3", "--gpus", "2048", "--gpu-memory", "80GB", "--profile", "megatron",
       "--precision", "deepseek-v3", "--recompute", "deepseek", "--schedule", "dualpipe", "--top", "3", "--json"]


def cli_cold(repeat: int) -> tuple[float, float]:
    """Best wall clock and CPU seconds of ``python -m memlib plan`` (the DeepSeek-V3 search) in fresh processes."""
    walls, cpus = [], []
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "memlib", *CLI], check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return min(walls), min(cpus)


def megatron_closed_form():
    """Megatron-LM's theoretical_memory_usage functions (weights and optimizer, activations), or None."""
    try:
        src = subprocess.run(["git", "--git-dir", MIRROR, "show", "HEAD:megatron/training/theoretical_memory_usage.py"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    src = src.replace("from .utils import is_hybrid_model, print_rank_0",
                      "is_hybrid_model = lambda args: False\nprint_rank_0 = lambda *a, **k: None")
    ns: dict = {}
    exec(compile(src, "theoretical_memory_usage.py", "exec"), ns)
    return ns["compute_weight_and_optimizer_memory"], ns["compute_activation_memory"]


def megatron_args(m, dp, tp, pp, ep, b, M):
    """Megatron-LM's arguments for DeepSeek-V3 under one configuration (what the closed form reads)."""
    return SimpleNamespace(
        add_bias_linear=False, data_parallel_size=dp, expert_model_parallel_size=ep, expert_tensor_parallel_size=1,
        ffn_hidden_size=m.intermediate_size, group_query_attention=False, hidden_size=m.hidden_size,
        kv_channels=m.qk_nope_head_dim, kv_lora_rank=m.kv_lora_rank, micro_batch_size=b,
        moe_ffn_hidden_size=m.moe_intermediate_size, moe_latent_size=None,
        moe_layer_freq=[0 if k == "dense" else 1 for k in m.layer_kinds], moe_router_topk=m.num_experts_per_tok,
        moe_shared_expert_intermediate_size=m.moe_intermediate_size * m.n_shared_experts,
        mtp_num_layers=m.num_nextn_predict_layers, multi_latent_attention=True, normalization="RMSNorm",
        num_attention_heads=m.num_attention_heads, num_experts=m.n_routed_experts, num_layers=m.num_hidden_layers,
        num_query_groups=m.num_attention_heads, padded_vocab_size=m.vocab_size,
        pipeline_model_parallel_size=pp, q_lora_rank=m.q_lora_rank, qk_head_dim=m.qk_nope_head_dim,
        qk_pos_emb_head_dim=m.qk_rope_head_dim, recompute_granularity=None, seq_length=4096, sequence_parallel=True,
        swiglu=True, tensor_model_parallel_size=tp, untie_embeddings_and_output_weights=True,
        use_distributed_optimizer=True, v_head_dim=m.v_head_dim, virtual_pipeline_model_parallel_size=None,
        world_size=dp * tp * pp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per timing (the best is printed)")
    ap.add_argument("--quick", action="store_true", help="skip the default space and the smaller GPU counts")
    args = ap.parse_args()
    spaces = (("DeepSeek-V3 options", DS),) if args.quick else (("DeepSeek-V3 options", DS), ("default space", {}))
    n = max(args.repeat, 5)
    wall, cpu = cli_cold(n)
    print(f"memlib plan from a shell (fresh process, DeepSeek-V3 options, 2048 GPUs, 80 GB, --top 3 --json): "
          f"best of {n}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    for label, kw in spaces:
        r, cold, cold_cpu = timed(plan, "deepseek-v3", 2048, 80 * GB, SearchSpace(**kw), top=10)
        _, warm, warm_cpu = best_of(lambda: plan("deepseek-v3", 2048, 80 * GB, SearchSpace(**kw), top=10), args.repeat)
        print(f"plan deepseek-v3, 2048 GPUs, 80 GB, {label}, top 10: {r.searched:,} searched, {r.fitting:,} fit; "
              f"cold {cold:.2f} s ({cold_cpu:.2f} s CPU), warm {warm:.2f} s ({warm_cpu:.2f} s CPU)")
        if kw is DS:
            r = plan("deepseek-v3", 2048, 80 * GB, SearchSpace(**kw), top=None)     # every fitting configuration listed
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
    _, t, tc = best_of(lambda: pipe.evaluate(**knobs), args.repeat)
    print(f"compiled grid (PP16 DualPipe, {n:,} random rows, no cache kept between calls): "
          f"{n * 16 / t:,.0f} stage-configurations/s wall, {n * 16 / tc:,.0f} per CPU second ({t:.3f} s)")

    sample = [RECIPE.with_(ep=int(ep[i]), micro_batch=int(knobs["micro_batch"][i]), zero=int(knobs["zero"][i]))
              for i in range(200)]
    estimate("deepseek-v3", RECIPE).stages
    _, t, tc = best_of(lambda: [estimate("deepseek-v3", c).stages for c in sample], args.repeat)
    print(f"exact path one by one (estimate(), every stage, the same 200 rows' configurations): "
          f"{len(sample) * 16 / t:,.0f} stage-configurations/s wall, {len(sample) * 16 / tc:,.0f} per CPU second")

    mf = megatron_closed_form()
    if mf is None:
        print("Megatron-LM's closed form: no mirror at", MIRROR)
    else:
        weights, acts = mf
        m = Family.of("deepseek-v3", RECIPE).model
        rows = [megatron_args(m, 128, 1, 16, int(ep[i]), int(knobs["micro_batch"][i]), 120) for i in range(2000)]

        def closed():
            return [weights(a) + acts(a, 120) for a in rows]
        _, t, tc = best_of(closed, args.repeat)
        print(f"Megatron-LM's closed form (theoretical_memory_usage.py, floats, first stage only): "
              f"{len(rows) / t:,.0f} configurations/s wall, {len(rows) / tc:,.0f} per CPU second")

    estimate("deepseek-v3", RECIPE).stages
    _, t, tc = best_of(lambda: estimate("deepseek-v3", RECIPE).stages, 10 * args.repeat)
    print(f"estimate() one configuration, after the first call: {t * 1e3:.2f} ms ({tc * 1e3:.2f} ms CPU)")
    _, t, tc = best_of(lambda: [estimate("deepseek-v3", c).stages for c in sample[:20]], args.repeat)
    print(f"estimate() of configurations that differ in EP, b and ZeRO: {t * 1e3 / 20:.2f} ms each "
          f"({tc * 1e3 / 20:.2f} ms CPU)")

    if args.quick:
        return
    for gpus in (1024, 512):
        for cap in (80, 141):
            r = plan("deepseek-v3", gpus, cap * GB, SearchSpace(**DS), top=1)
            best = r.configs[0]["config"] if r.configs else None
            desc = "nothing" if best is None else (
                f"best PP{best['pp']} TP{best['tp']} CP{best['cp']} DP{best['dp']} EP{best['ep']} "
                f"ZeRO-{best['zero']} b={best['micro_batch']}, peak {r.configs[0]['peak'] / 2**30:.1f} GiB")
            print(f"{gpus} GPUs of {cap} GB (DeepSeek-V3 options): {r.fitting:,} of {r.searched:,} fit; {desc}")


if __name__ == "__main__":
    from results import recorded   # benchmarks/results.py: writes benchmarks/results/plan.md

    with recorded("plan"):
        main()
