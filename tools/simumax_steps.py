"""Copy SimuMax's measured B200 step times (all 43 rows) into tools/data/simumax_b200_steps.json.

Usage: ``python tools/simumax_steps.py /path/to/SimuMax.git`` (a clone or bare mirror holding commit ``COMMIT`` of
MooreThreads/SimuMax; the ``fetch`` tool puts one at /work/.mirror/MooreThreads+SimuMax/repo).

What ran, read from the files of that commit (each fact below names its file):

* 43 Megatron-LM runs (Megatron-LM 23e00ed0, Transformer Engine 2.11, bf16) on one node of eight B200s,
  ``docs/b200/b200_release_v1.2_summary.json`` (``rows``; the table ``..._summary.md`` prints).  ``real_ms`` is the
  fastest steady iteration (iteration >= 2) of the last rank's ``elapsed time per iteration``
  (``tools/b200/run_megatron_perf_real_batch.py``, ``parse_fastest_run_logs``); ``perf_ms`` is SimuMax's own
  prediction, kept for comparison.
* the parallel sizes are in each case's name (``tp``, ``pp``, ``ep``, ``cp``, ``dp``; ``seqN`` the sequence when it is
  not 4096); ``mbc`` is the number of micro-batches per step; the micro-batch size is 1
  (``tools/b200/run_megatron_perf_real_pipeline.py``: ``micro_batch_size`` 1); the global batch is b M DP
  (``simu_tools/megatron_scripts/run_llama3.sh`` and ``run_deepseekv2.sh``: ``global_batch_size``).
* the launch flags (``simu_tools/megatron_scripts/scripts/run_pretrain_llama3.sh``, ``run_pretrain_deepseekv2.sh``):
  ZeRO-1 (``--use-distributed-optimizer``), sequence parallelism, flash attention, no recomputation
  (``--recompute-granularity full --recompute-method block --recompute-num-layers 0``), fp32 gradient reduction
  (``--accumulate-allreduce-grads-in-fp32``), no ``--overlap-grad-reduce`` / ``--overlap-param-gather``, TP
  communication overlap disabled (``--disable-tp-comm-overlap-*``), ``--no-overlap-p2p-communication``
  (``run_megatron_perf_real_batch.py``), CP by all-to-all (``CP_COMM_TYPE=a2a``), the fused cross entropy of
  Transformer Engine (the ``_cef`` suffix, ``docs/strategy.md``).  The MoE runs: the alltoall token dispatcher,
  grouped GEMM, ``--moe-expert-capacity-factor 1 --moe-pad-expert-input-to-capacity`` (every expert computes its
  full capacity: balanced work), the first layer dense (``MOE_LAYER_FREQ="([0]*1+[1]*(L-1))"``), no MTP, ETP = TP.

The output keeps the fields that say what ran and what was measured, as the file holds them, and adds the sizes
read from each name.  Nothing here runs at import time.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

COMMIT = "4dcaae513ba7679d56c116a17cd4a691ec41e252"
SOURCE = "docs/b200/b200_release_v1.2_summary.json"
OUT = Path(__file__).resolve().parent / "data" / "simumax_b200_steps.json"
FIELDS = ("case", "model", "parallel", "layer_num", "mbc", "vp_size", "kind", "status", "real_ms", "perf_ms",
          "rel_err_pct", "timing_rank", "steady_iterations")
WORLD = 8
SIZES = re.compile(r"_(tp|pp|ep|cp|dp)(\d+)")

#: what the launchers set, each with the file of COMMIT that says it
SETUP = {
    "gpu": ("B200", "docs/b200/b200_real_repro_guide.md; configs/system/b200_bf16_ceperm.json (num_per_node 8)"),
    "world_size": (WORLD, "simu_tools/megatron_scripts/run_llama3.sh, run_deepseekv2.sh: world_size=8"),
    "megatron_commit": ("23e00ed0963c35382dfe8a5a94fb3cda4d21e133", "docs/b200/b200_real_repro_guide.md §2"),
    "micro_batch": (1, "tools/b200/run_megatron_perf_real_pipeline.py: micro_batch_size 1; "
                       "tools/b200/run_params/b200_bf16_ceperm_sweep.json: mbs_list [1]"),
    "global_batch": ("micro_batch * mbc * dp", "run_llama3.sh, run_deepseekv2.sh: global_batch_size"),
    "seq_len": (4096, "run_pretrain_llama3.sh, run_pretrain_deepseekv2.sh: SEQ_LEN default 4096; the CP rows name "
                      "theirs (seq32768, seq131072)"),
    "zero": (1, "--use-distributed-optimizer (run_pretrain_*.sh)"),
    "recompute": ("none", "--recompute-granularity full --recompute-method block --recompute-num-layers 0"),
    "overlap": ("none", "no --overlap-grad-reduce, --overlap-param-gather; --disable-tp-comm-overlap-ag/-rs "
                        "(run_pretrain_llama3.sh); --no-overlap-p2p-communication (run_megatron_perf_real_batch.py); "
                        "docs/b200/b200_real_repro_guide.md §3.3: 'a non-overlap contract'"),
    "grad_reduce_dtype": ("fp32", "--accumulate-allreduce-grads-in-fp32"),
    "cp_comm_type": ("a2a", "run_pretrain_llama3.sh: CP_COMM_TYPE default a2a"),
    "cross_entropy": ("te fused", "docs/strategy.md: the _cef suffix means --cross-entropy-loss-fusion "
                                  "--cross-entropy-fusion-impl te"),
    "moe": ("alltoall dispatcher, grouped GEMM, capacity factor 1 with padding to capacity, first layer dense, "
            "no MTP, ETP = TP = 1", "run_pretrain_deepseekv2.sh (MOE_ARGS, MOE_LAYER_FREQ)"),
    "step_time": ("fastest iteration >= 2 of the last rank", "tools/b200/run_megatron_perf_real_batch.py "
                                                             "(parse_fastest_run_logs)"),
}

#: the launchers' model shapes (run_pretrain_llama3.sh MODEL_TYPE; run_pretrain_deepseekv2.sh MODEL_TYPE, MLA_ARGS)
MODELS = {
    "llama3-70b": {"preset": "llama-3-70b", "hidden_size": 8192, "intermediate_size": 28672,
                   "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256},
    "llama3-405b": {"preset": "llama-3.1-405b", "hidden_size": 16384, "intermediate_size": 53248,
                    "num_attention_heads": 128, "num_key_value_heads": 16, "vocab_size": 128256},
    "deepseekv2": {"preset": "deepseek-v2", "hidden_size": 5120, "intermediate_size": 12288,
                   "moe_intermediate_size": 1536, "n_routed_experts": 160, "num_experts_per_tok": 6,
                   "n_shared_experts": 2, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
                   "vocab_size": 102400, "first_k_dense_replace": 1},
    "deepseekv3": {"preset": "deepseek-v3", "hidden_size": 7168, "intermediate_size": 18432,
                   "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
                   "n_shared_experts": 1, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
                   "vocab_size": 129280, "first_k_dense_replace": 1},
}


def sizes(case: str) -> dict:
    """TP, PP, EP, CP, DP and the sequence length of a case name (DP = 8 / (TP PP CP) where the name omits it)."""
    got = {k: int(v) for k, v in SIZES.findall(case)}
    out = {k: got.get(k, 1) for k in ("tp", "pp", "ep", "cp")}
    out["dp"] = WORLD // (out["tp"] * out["pp"] * out["cp"])
    if "dp" in got and got["dp"] != out["dp"]:
        raise ValueError(f"{case}: dp{got['dp']} is not 8 / (TP PP CP) = {out['dp']}")
    seq = re.search(r"_seq(\d+)", case)
    out["seq_len"] = int(seq.group(1)) if seq else SETUP["seq_len"][0]
    return out


def main(repo: str) -> None:
    text = subprocess.run(["git", "--git-dir", repo, "show", f"{COMMIT}:{SOURCE}"], capture_output=True, text=True,
                          check=True).stdout
    data = json.loads(text)
    rows = []
    for r in data["rows"]:
        row = {k: r[k] for k in FIELDS if k in r}
        s = sizes(r["case"])
        row.update(s, micro_batch=SETUP["micro_batch"][0], global_batch=SETUP["micro_batch"][0] * r["mbc"] * s["dp"])
        rows.append(row)
    out = {"_source": f"MooreThreads/SimuMax, {SOURCE} at commit {COMMIT}",
           "_licence": "Apache License 2.0 (SimuMax, Copyright (c) 2023-2024 Moore Threads Technology Co., Ltd)",
           "_fields": "the fields of each row that say what ran and what was measured, as the file holds them, with "
                      "tp, pp, ep, cp, dp, seq_len (from the case name), micro_batch and global_batch (sequences) added",
           "commit": COMMIT, "generated_at": data["generated_at"], "notes": data["notes"],
           "setup": {k: {"value": v, "source": src} for k, (v, src) in SETUP.items()}, "models": MODELS, "rows": rows}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"{len(rows)} rows -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
