"""Published values memlib is checked against, as their sources print them.

These are *data*, not formulas: the numbers the paper (arXiv 2502.07846) and other sources
printed, kept verbatim (printed decimals as strings) so the book's errata and the tests can put
memlib's exact values beside them.  Nothing in memlib computes from this module.

The paper's "GB" columns are GiB (2**30 bytes): 12,500,729,856 bytes is printed "11.64 GB".
The paper's values are those of its tables and text as printed in the arXiv version; a value that
is only inferred, not printed, is not kept here.
"""
from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import sympy as sp

from ..core.symbols import sym
from ..device.allocator import PYTORCH_ALLOCATOR
from ..config.versions import MEGATRON_COMMIT as MEGATRON_LM_COMMIT
from ..search.plan import DEFAULT_GLOBAL_BATCH

__all__ = ["PAPER", "ZERO_PAPER", "MEGATRON_BYTES_PER_PARAM", "DEEPSEEK_OFFICIAL", "DEEPSEEK_V3_TRAINING"]
__all__ += ["PAPER_TABLE9", "PAPER_ACTIVATION_FORMULAS", "KORTHIKANTI_TABLE2", "KORTHIKANTI_SYMBOLS",
            "KORTHIKANTI_MODELS"]
__all__ += ["MEASURED_RESERVED", "CUDA_CONTEXT_MEASURED", "PYTORCH_ALLOCATOR", "NCCL_BUFFSIZE"]
__all__ += ["MEGATRON_LM_COMMIT", "MEGATRON_RUNS_DIR", "MEGATRON_PLATFORMS", "MEGATRON_WORLD_SIZES", "MEGATRON_RUNS"]


PAPER = {
    "arxiv": "2502.07846",
    # Table 1: structural configuration of DeepSeek-V3 (HF field -> printed value)
    "table1": {
        "hidden_size": 7168, "moe_intermediate_size": 2048, "intermediate_size": 18432,
        "qk_nope_head_dim": 128, "num_attention_heads": 128, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "kv_lora_rank": 512, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_hidden_layers": 61, "vocab_size": 129280,
        "num_experts_per_tok": 8,  # Table 9
    },
    # Table 2 (as counts implied by the printed shapes) and the per-block counts of §2
    "mla_per_layer": 187_107_328,
    "moe_ffn_per_layer": 11_320_164_352,   # gate + 257 experts
    # Table 3: per-layer counts and BF16 memory, as printed, keyed by the layers of the row
    "table3": {
        "0": {"params": "1.5B", "memory_gb": "2.8"},
        "1-2": {"params": "0.58B", "memory_gb": "1.1"},
        "3-59": {"params": "11.5B", "memory_gb": "21.44"},
        "60": {"params": "12.4B", "memory_gb": "23.16"},
        "total": {"params": "671B", "memory_gb": "1250"},
    },
    # Table 4: per-stage counts under PP16, as printed, keyed by the stages of the row
    "table4": {
        "0": {"params": "14.16B", "memory_gb": "26"},
        "1-14": {"params": "46B", "memory_gb": "86"},
        "15": {"params": "12.4B", "memory_gb": "23"},
    },
    # Table 5: parallel configuration
    "table5": {"dp": 32, "tp": 2, "pp": 16, "ep": 8, "etp": 1, "edp": 8},
    # §3.2: MLA of one stage-1..14 device, split and replicated parts
    "mla_tp_split": 318_767_104,
    "mla_replicated": 110_886_912,
    # Table 6: static parameters per device, stages 1-14 (params, bytes, printed GB), keyed by module
    "table6": {
        "RMSNorm": {"params": 65_536, "bytes": 131_072, "memory_gb": "0"},
        "MLA": {"params": 429_654_016, "bytes": 859_308_032, "memory_gb": "0.82"},
        "non-MoE": {"params": 429_719_552, "bytes": 859_439_104, "memory_gb": "0.82"},
        "MoE": {"params": 5_820_645_376, "bytes": 11_641_290_752, "memory_gb": "10.84"},
        "total": {"params": 6_250_364_928, "bytes": 12_500_729_856, "memory_gb": "11.64"},
    },
    # §4: parameters one device owns once sharded (non-MoE / DP + MoE / EDP)
    "zero_sharded_params": 741_009_408,
    # Table 7: bytes per element
    "table7": {"weights": 2, "activations": 2, "gradients": 4, "master_weights": 4, "exp_avg": 2, "exp_avg_sq": 2},
    # Table 8: model states per device, stages 1-14, printed GB, keyed by the ZeRO stage
    "table8": {
        0: {"parameters": "11.64", "gradients": "23.3", "optimizer_states": "46.6", "total": "81.54"},
        1: {"parameters": "11.64", "gradients": "23.3", "optimizer_states": "5.52", "total": "40.46"},
        2: {"parameters": "11.64", "gradients": "2.76", "optimizer_states": "5.52", "total": "19.92"},
        3: {"parameters": "1.38", "gradients": "2.76", "optimizer_states": "5.52", "total": "9.66"},
    },
    # §4 prose (bottom of page 6), which swaps the labels relative to Tables 7 and 8
    "prose_swap": "23.3 GB (6,250,364,928 x 4) for optimizer states, and 46.6 GB (6,250,364,928 x 8) for gradients",
}

#: ZeRO paper (arXiv 1910.02054), Fig. 1 example: model states per device in GB (decimal)
ZERO_PAPER = {"psi": 7_500_000_000, "k": 12, "n_d": 64,
              "gb": {0: "120", 1: "31.4", 2: "16.6", 3: "1.9"}}

#: Megatron-LM distributed-optimizer table (docs/user-guide/features/dist_optimizer.md):
#: recipe -> (bytes without distributed optimizer, (fixed, sharded numerator) with it: fixed + n/d)
MEGATRON_BYTES_PER_PARAM = {
    "megatron-fp16": (20, (4, 16)),
    "megatron": (18, (6, 12)),
    "fp32": (16, (8, 8)),
}

#: what DeepSeek states (model cards and reports), in billions as printed
#: DeepSeek-V3's pre-training as its report states it (arXiv 2412.19437): "each trillion tokens requires only 180K
#: H800 GPU hours, i.e., 3.7 days on our cluster with 2048 H800 GPUs" (§1; Table 1: 2664K GPU hours of
#: pre-training); sequences of 4K tokens, a batch of 15360 sequences after the first 469B tokens (§4.2; plan's
#: DEFAULT_GLOBAL_BATCH)
DEEPSEEK_V3_TRAINING = {"gpu_hours_per_trillion_tokens": 180_000, "gpus": 2048, "seq_len": 4096,
                        "global_batch": DEFAULT_GLOBAL_BATCH, "source": "arXiv 2412.19437 §1, Table 1, §4.2"}

DEEPSEEK_OFFICIAL = {
    "deepseek-v3": {"total": "671", "activated": "37", "mtp": "11.5", "checkpoint": "685",
                    "activated_weights_doc": "36.7"},
    "deepseek-v2": {"total": "236", "activated": "21"},
    "deepseek-v2-lite": {"total": "15.7", "activated": "2.4"},
}

# ------------------------------------------------------------------------------------------------
# The paper's §5 (activations)
# ------------------------------------------------------------------------------------------------
#: Table 9: the micro-batch sizes and recompute policies (AC) of the paper's activation analysis
PAPER_TABLE9 = {"micro_batch": (1, 2, 4), "recompute": ("none", "full")}


def _paper_activation_formulas() -> dict[str, dict[str, sp.Expr]]:
    """The per-layer and per-stage activation formulas the paper prints, as SymPy, keyed by where
    they are printed.  As printed: the paper writes d_h for the value head dimension (memlib's d_v),
    and DeepSeek-V3's N/EP = 32 local experts and N_s = 1 shared expert as numbers."""
    b, s, h, h_E = sym("b"), sym("s"), sym("h"), sym("h_E")
    n_h, d_h, d_hR, d_cq, d_c = sym("n_h"), sym("d_h"), sym("d_hR"), sym("d_cq"), sym("d_c")
    N, N_r = sym("N"), sym("N_r")
    bs, half = b * s, sp.Rational(1, 2)
    E = bs * N_r / N                                  # E_token, tokens per expert
    return {
        "§5.1": {                                     # MLA, one layer
            "mla": 4 * bs * h + 2 * bs * (d_cq + d_c) + 4 * bs * (d_h + d_hR) * n_h + 2 * bs * d_h * n_h
            + 5 * b * n_h * s**2 + 2 * bs * d_h * n_h + bs * h,
            "mla_tp": half * 4 * bs * h + 2 * bs * (d_cq + d_c) + half * 4 * bs * (d_h + d_hR) * n_h
            + half * 2 * bs * d_h * n_h + half * 5 * b * n_h * s**2 + half * 2 * bs * d_h * n_h + half * bs * h,
            "mla_full": bs * h,
        },
        "§5.2": {                                     # MoE, one layer
            "moe_ep": half * 4 * bs * h + 4 * bs * N + 2 * bs * N_r + 32 * (3 * E * h + 8 * E * h_E)
            + 1 * (3 * bs * h + 8 * bs * h_E),
            "moe_full": bs * h + 2 * bs * N_r,
        },
        "Table 10": {                                 # a stage of four MoE layers
            "mla": 10 * bs * h + 8 * bs * (d_cq + d_c) + 16 * bs * d_h * n_h + 8 * bs * d_hR * n_h
            + 10 * b * n_h * s**2,
            "moe": 20 * bs * h + 16 * bs * N + 8 * bs * N_r + 4 * bs * N_r / N * (96 * h + 256 * h_E)
            + 32 * bs * h_E,
            "mla_full": 4 * bs * h,
            "moe_full": 4 * bs * h + 8 * bs * N_r,
        },
    }


#: the paper's printed activation formulas (§5.1, §5.2, Table 10), bytes per micro-batch on one device
PAPER_ACTIVATION_FORMULAS = _paper_activation_formulas()

# ------------------------------------------------------------------------------------------------
# Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (arXiv 2205.05198)
# ------------------------------------------------------------------------------------------------
#: their symbols: a attention heads, t tensor-parallel size (s, b, h are memlib's)
KORTHIKANTI_SYMBOLS = {"a": sp.Symbol("a", positive=True), "t": sp.Symbol("t", positive=True)}


def _korthikanti_table2() -> dict[str, sp.Expr]:
    a, t = KORTHIKANTI_SYMBOLS["a"], KORTHIKANTI_SYMBOLS["t"]
    s, h = sym("s"), sym("h")
    return {
        "no parallelism": 34 + 5 * a * s / h,
        "tensor parallel (baseline)": 10 + 24 / t + 5 * a * s / (h * t),
        "tensor + sequence parallel": 34 / t + 5 * a * s / (h * t),
        "tensor parallel + selective recompute": 10 + 24 / t,
        "tensor + sequence parallel + selective recompute": 34 / t,
        "full recompute": sp.Integer(2),
    }


#: their Table 2: activation bytes per layer divided by s b h, per technique (f = 4h)
KORTHIKANTI_TABLE2 = _korthikanti_table2()

#: their four models (Table 3: heads a, hidden size h, layers L, tensor- and pipeline-parallel sizes t and p,
#: the interleaved schedule's chunks per rank V (1: plain 1F1B), micro-batch b, sequence s = 2048, f = 4h)
#: and Figure 1's activations of the first pipeline rank in GiB, with tensor parallelism alone (``none``)
#: and with sequence parallelism and selective recompute (``sp_selective``), as Calculon's validation
#: transcribes them (github.com/calculon-ai/calculon, calculon/llm/validation.py and models/*.json)
KORTHIKANTI_MODELS = {
    "22B": {"h": 6144, "a": 64, "L": 48, "t": 8, "p": 1, "V": 1, "b": 4, "s": 2048,
            "gib": {"none": "59.25", "sp_selective": "9.5625"}},
    "175B": {"h": 12288, "a": 96, "L": 96, "t": 8, "p": 8, "V": 3, "b": 1, "s": 2048,
             "gib": {"none": "66.84375", "sp_selective": "12.3515625"}},
    "530B": {"h": 20480, "a": 128, "L": 105, "t": 8, "p": 35, "V": 3, "b": 1, "s": 2048,
             "gib": {"none": "114.0234375", "sp_selective": "23.076171875"}},
    "1T": {"h": 25600, "a": 160, "L": 128, "t": 8, "p": 64, "V": 1, "b": 1, "s": 2048,
           "gib": {"none": "131.25", "sp_selective": "26.5625"}},
}


# ------------------------------------------------------------------------------------------------
# Memory beyond the tensors (chapter 7): measured runs and the constants of the allocator and NCCL
# ------------------------------------------------------------------------------------------------
#: measured peak reserved and allocated memory of one device (GiB, as printed: ``real_reserved_gib``
#: and ``real_alloc_gib``), MooreThreads/SimuMax, docs/b200/b200_release_v1.2_summary.json (B200 runs)
MEASURED_RESERVED = {
    "source": "SimuMax v1.2 B200 release summary (github.com/MooreThreads/SimuMax, "
              "docs/b200/b200_release_v1.2_summary.json)",
    "runs": {
        "llama3_70b_l12_tp1_pp2_dp4_mbc4_cef": {"model": "Llama3-70B, 12 layers", "parallel": "TP1 PP2 DP4",
                                                "reserved_gib": "70.88", "allocated_gib": "66.55"},
        "deepseekv2_tp1_ep8_pp1_dp8_l4_mbc4_cef": {"model": "DeepSeek-V2, 4 layers", "parallel": "TP1 EP8 DP8",
                                                   "reserved_gib": "48.79", "allocated_gib": "45.63"},
        "deepseekv3_l4_tp1_ep8_pp1_dp8_mbc4_cef": {"model": "DeepSeek-V3, 4 layers", "parallel": "TP1 EP8 DP8",
                                                   "reserved_gib": "110.18", "allocated_gib": "104.3"},
    },
}

#: device memory in use (cudaMemGetInfo: total - free) after PyTorch moved one 20 x 16 x 50 x 100 fp32
#: tensor to the GPU, with CUDA's lazy module loading and without: pytorch/pytorch pull request #86509
CUDA_CONTEXT_MEASURED = {"lazy": 287_047_680, "eager": 666_632_192,
                         "source": "PyTorch pull request #86509, github.com/pytorch/pytorch/pull/86509"}

#: NCCL's default buffer per channel and peer connection, bytes (NCCL documentation, NCCL_BUFFSIZE)
NCCL_BUFFSIZE = 4_194_304


# ------------------------------------------------------------------------------------------------
# Megatron-LM's functional tests: the memory they log (issue 11)
# ------------------------------------------------------------------------------------------------
#: the Megatron-LM commit the test cases, their golden values and configs were read at is
#: :data:`MEGATRON_LM_COMMIT`, the one every Megatron-LM source memlib cites is read at

#: where the copies live: ``<case>.yaml`` (model_config.yaml verbatim) and ``<case>.json`` (the memory
#: metrics of each golden-values file, as the file holds them), written by tools/megatron_runs.py
MEGATRON_RUNS_DIR = Path(__file__).with_name("megatron_runs")

#: GPU of each platform name in the golden-values file names, with its CUDA compute capability (major)
MEGATRON_PLATFORMS = {
    "dgx_a100": ("A100", 8), "dgxa100_dracooci": ("A100", 8), "dgxa100_dracooci-ord": ("A100", 8),
    "dgx_h100": ("H100", 9), "dgxh100_dgxc": ("H100", 9), "dgx_gb200": ("GB200", 10),
}

_RECIPE = "tests/test_utils/recipes/{}: nodes {} x gpus {}"
_H100_MOE, _GB200_MOE = _RECIPE.format("h100/moe.yaml", 1, 8), _RECIPE.format("gb200/moe.yaml", 2, 4)
_H100_GPT, _GB200_GPT = _RECIPE.format("h100/gpt.yaml", 1, 8), _RECIPE.format("gb200/gpt.yaml", 2, 4)
_DERIVED = ("not in the repository (no recipe lists the case): derived from the logged post-step allocation by "
            "memlib.device.megatron_buffers.derive_data_parallel_size, DP = {}, world = DP TP PP")

#: case -> file -> (world size, how it is known); the recipe's default platform (dgx_a100) covers the A100
#: and LTS files; a recipe entry that is commented out at this commit still fixes nodes x gpus
MEGATRON_WORLD_SIZES: dict[str, dict[str, tuple[int, str]]] = {
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed": {
        "golden_values_dev_dgx_h100.json": (8, _H100_MOE),
        "golden_values_dev_dgxh100_dgxc.json": (8, "no recipe names the dgxh100_dgxc platform at this commit: "
                                                    "the allocation is within 5 MiB of the dgx_h100 file's, which "
                                                    "fixes DP = 2 (the optimizer shards are 12/DP bytes a parameter)"),
    },
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8": {
        "golden_values_dev_dgx_h100.json": (8, _H100_MOE + " (entry commented out)")},
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental": {
        "golden_values_dev_dgx_h100.json": (8, _H100_MOE + " (entry commented out)")},
    "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading": {
        "golden_values_dev_dgx_h100.json": (8, _H100_MOE), "golden_values_dev_dgx_gb200.json": (8, _GB200_MOE)},
    "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading": {
        "golden_values_dev_dgx_h100.json": (8, _H100_MOE), "golden_values_dev_dgx_gb200.json": (8, _GB200_MOE)},
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_resume_torch_dist_attn_cudagraph": {
        "golden_values_dev_dgx_h100.json": (8, _H100_MOE)},
    "gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4": {
        f: (8, _H100_MOE) for f in ("golden_values_dev_dgx_a100.json", "golden_values_dev_dgx_h100.json",
                                    "golden_values_lts.json", "golden_values_lts_dgx_a100.json",
                                    "golden_values_lts_dgxa100_dracooci-ord.json",
                                    "golden_values_lts_dgxa100_dracooci.json")},
    "gpt3_mcore_te_tp2_pp2_mla": {
        "golden_values_dev_dgx_a100.json": (8, _H100_GPT), "golden_values_dev_dgx_h100.json": (8, _H100_GPT),
        "golden_values_dev_dgx_h100_2nd.json": (8, _H100_GPT), "golden_values_dev_dgx_gb200.json": (8, _GB200_GPT),
        "golden_values_dev_dgx_gb200_2nd.json": (8, _GB200_GPT)},
    "gpt3_mcore_te_tp2_pp2_mla_1node": {
        "golden_values_dev_dgx_gb200.json": (4, _RECIPE.format("gb200/gpt-1node.yaml", 1, 4))},
    "deepseek_proxy_fsdp_ep2_fsdp2": {"golden_values_dev_dgx_gb200.json": (8, _GB200_MOE)},
    "deepseek_proxy_fsdp_ep2_fsdp2_1node": {
        "golden_values_dev_dgx_gb200.json": (4, _RECIPE.format("gb200/moe-1node.yaml", 1, 4))},
    "deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap": {"golden_values_dev_dgx_h100.json": (8, _H100_MOE)},
    "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release": {"golden_values_dev_dgx_h100.json": (64, _DERIVED.format(8))},
    "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm": {
        "golden_values_dev_dgx_h100.json": (64, _DERIVED.format(8))},
    "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release": {
        "golden_values_dev_dgx_gb200.json": (32, _DERIVED.format(8))},
    "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release_sm": {
        "golden_values_dev_dgx_gb200.json": (32, _DERIVED.format(8))},
}


def _exact(value):
    """A logged float of integer value as an ``int`` (``None`` for a ``"nan"`` entry); anything else is an error."""
    if isinstance(value, str):
        if value.lower() == "nan":
            return None
        raise ValueError(f"unexpected entry {value!r}")
    f = Fraction(value)          # exact: a float's binary value
    if f.denominator != 1:
        raise ValueError(f"{value!r} is not an integer")
    return int(f)


def _platform(file: str) -> tuple[str, str, bool]:
    """(environment, platform, second run) of a golden-values file name; ``golden_values_lts.json`` has no
    platform: the recipe's default, dgx_a100."""
    stem = file.removeprefix("golden_values_").removesuffix(".json")
    second = stem.endswith("_2nd")
    env, _, platform = stem.removesuffix("_2nd").partition("_")
    return env, platform or "dgx_a100", second


def _summary(allocated: dict, peak: dict, full_run: dict | None) -> dict:
    after = sorted({v for v in allocated.values() if v is not None})
    finite = {k: v for k, v in peak.items() if v is not None}
    top = max(finite.values())
    at = min(k for k, v in finite.items() if v == top)
    if full_run is not None:        # the whole run, not only the iterations kept
        job = max(full_run["jobs"], key=lambda j: (j["max_allocated"], -j["at"]))
        top, at = job["max_allocated"], job["at"]
    return {
        "post_step": after[0] if len(after) == 1 else tuple(after),
        "max_first": tuple((k, peak[k]) for k in sorted(peak)[:3]),
        "max_run": top,
        "max_run_at": at,
    }


def _load_megatron_runs() -> dict[str, dict]:
    runs = {}
    for case, worlds in MEGATRON_WORLD_SIZES.items():
        data = json.loads((MEGATRON_RUNS_DIR / f"{case}.json").read_text(encoding="utf-8"))
        base = f"tests/functional_tests/test_cases/{data['folder']}/{case}"
        files = {}
        for name, entry in data["files"].items():
            env, platform, second = _platform(name)
            device, cc = MEGATRON_PLATFORMS[platform]
            allocated = {int(k): _exact(v) for k, v in entry["mem-allocated-bytes"]["values"].items()}
            peak = {int(k): _exact(v) for k, v in entry["mem-max-allocated-bytes"]["values"].items()}
            world, how = worlds[name]
            files[name] = {
                "source": f"{base}/{name}", "commit": MEGATRON_LM_COMMIT, "values_since": entry["values_since"],
                "environment": env, "platform": platform, "device": device, "compute_capability": cc,
                "second_run": second, "world_size": world, "world_size_source": how,
                "allocated": allocated, "max_allocated": peak, **_summary(allocated, peak, entry.get("full_run")),
                "full_run": entry.get("full_run"),
            }
        runs[case] = {"source": base, "config": f"{base}/model_config.yaml", "commit": MEGATRON_LM_COMMIT,
                      "config_copy": str(MEGATRON_RUNS_DIR / f"{case}.yaml"), "files": files}
    return runs


MEGATRON_RUNS: dict[str, dict] = _load_megatron_runs()
"""Megatron-LM's functional tests that log memory, keyed by test case (the issue's eight, then the other MLA
cases with memory metrics).  Per golden-values file: ``source`` and ``commit``; ``device`` and
``compute_capability``; ``world_size`` and ``world_size_source`` (a recipe, or derived); ``allocated``
(``mem-allocated-bytes``: ``torch.cuda.memory_stats()["allocated_bytes.all.current"]`` on the last global
rank, after the optimizer step, megatron/training/training.py:3436-3447 and global_vars.py:241) and
``max_allocated`` (``mem-max-allocated-bytes``: the allocator's peak, never reset, so a running maximum
within one job), iteration -> exact ``int`` (``None`` where the file has ``"nan"``); the summaries
``post_step`` (the allocation after the step: its value, or its values when they vary), ``max_first``
(the maximum at the first three logged iterations), ``max_run`` and ``max_run_at``.  The release runs
(tens of thousands of iterations) keep their first 60 logged iterations here and their whole run in
``full_run`` (post-step range, the running maximum of every job: it restarts when a job resumes).

What the maximum shows: it grows with the iterations.  At iteration 1 Adam's moments do not exist yet
when the activations peak (they are created at the first step), so the peak is lower; from iteration 2 or
3 it is the steady peak; and later iterations add up to GiBs as the routing becomes unbalanced and some
rank's experts receive more tokens than before.  The memory_speed test on H100 peaks at 53.94 GiB from
iteration 3 and at 55.98 GiB at iteration 39, while the other H100 cluster's file (dgxh100_dgxc) tops
out at 53.98 GiB; the DeepSeek-V3 proxy on H100 reaches 43.40 GiB in its first job (iteration 345) and
less in the later ones.  A single run's maximum is therefore one draw of the routing, not a bound.
"""


def _mla_moe(layers: int, dense: int, mtp: int, hidden: int = 1024) -> dict:
    """The small MLA/MoE tests' model (moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_*), as a config.json."""
    return {"hidden_size": hidden, "intermediate_size": 4096, "moe_intermediate_size": 1024,
            "num_attention_heads": 32, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "n_routed_experts": 32, "n_shared_experts": 1,
            "num_experts_per_tok": 4, "num_hidden_layers": layers, "first_k_dense_replace": dense,
            "num_nextn_predict_layers": mtp, "n_group": 4, "topk_group": 2, "scoring_func": "sigmoid",
            "topk_method": "noaux_tc", "tie_word_embeddings": False, "vocab_size": 51712}


_PROXY = {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "q_lora_rank": 1536,
          "kv_lora_rank": 512, "n_routed_experts": 64, "n_shared_experts": 1, "num_experts_per_tok": 8,
          "num_hidden_layers": 14, "first_k_dense_replace": 3, "num_nextn_predict_layers": 1, "n_group": 8,
          "topk_group": 4, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "tie_word_embeddings": False,
          "vocab_size": 258560}
_SMALL = {"tp": 2, "pp": 2, "vpp": 4, "ep": 4, "etp": 1, "schedule": "interleaved", "seq_len": 4096}
#: --offload-modules of the fine-grained offloading tests (their model_config.yaml)
_OFFLOADED = ("expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear", "core_attn", "attn_proj")
_PROXY_H100 = {"tp": 2, "pp": 4, "vpp": 2, "ep": 16, "etp": 1, "schedule": "interleaved",
               "layout": (2, 2, 2, 2, 2, 2, 1, 1), "micro_batch": 1, "seq_len": 4096}
_PROXY_GB200 = {"tp": 2, "pp": 2, "ep": 8, "etp": 1, "layout": (7, 7), "micro_batch": 4, "seq_len": 4096}

#: the cases memlib lays out (MLA and MoE under Megatron-Core's DDP and distributed optimizer), read off their
#: model_config.yaml: ``model`` as a config.json (the vocabulary padded as Megatron-LM pads it: GPT-2's 50,257
#: tokens to a multiple of 3,232 x TP = 51,712; the proxies' nemotron_2_256k tokenizer, 256,000 tokens by its
#: name, to 258,560, which any size from 252,097 to 258,560 gives), ``training`` as TrainingConfig fields (DP
#: from the world size; a layout such as ``Et*3|(tt|)*6tmL`` as decoder layers per virtual stage, the MTP and the
#: head on the last), ``options`` for memlib.device.megatron_buffers; the H100 proxy's file predates
#: ``--moe-flex-dispatcher-backend hybridep`` (it used DeepEP) and ``--cross-entropy-fusion-impl native``
MEGATRON_RUN_SETUPS: dict[str, dict] = {
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed": {
        "model": _mla_moe(16, 1, 1), "training": {**_SMALL, "dp": 2, "micro_batch": 4},
        "options": {"overlap_grad_reduce": True, "rope_fusion": False}},
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8": {
        "model": _mla_moe(16, 1, 1), "training": {**_SMALL, "dp": 2, "micro_batch": 4},
        "options": {"overlap_grad_reduce": True, "rope_fusion": False, "fp8": "hybrid", "fp8_recipe": "tensorwise"}},
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental": {
        "model": _mla_moe(16, 3, 1), "training": {**_SMALL, "dp": 2, "micro_batch": 4,
                                                  "layout": (3, 2, 2, 2, 2, 2, 2, 1)},
        "options": {"overlap_grad_reduce": True, "rope_fusion": False}},
    "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading": {
        "model": _mla_moe(15, 3, 1), "training": {**_SMALL, "dp": 2, "micro_batch": 1,
                                                  "layout": (3, 2, 2, 2, 2, 2, 2, 0), "offload_modules": _OFFLOADED},
        "options": {"rope_fusion": False, "cublas_workspace_config": ":4096:8"}},
    "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading": {
        "model": _mla_moe(15, 3, 0), "training": {**_SMALL, "dp": 2, "micro_batch": 1,
                                                  "layout": (3, 2, 2, 2, 2, 2, 2, 0), "offload_modules": _OFFLOADED},
        "options": {"rope_fusion": False, "cublas_workspace_config": ":4096:8"}},
    "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release": {
        "model": _PROXY, "training": {**_PROXY_H100, "dp": 8},
        "options": {"overlap_grad_reduce": True, "token_dispatcher": "flex"}},
    "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm": {
        "model": _PROXY, "training": {**_PROXY_H100, "dp": 8},
        "options": {"overlap_grad_reduce": True, "token_dispatcher": "flex"}},
    # logged on NGC 26.02, whose PyTorch predates 32 MiB cuBLAS workspaces on Blackwell (container_rules)
    "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release": {
        "model": _PROXY, "training": {**_PROXY_GB200, "dp": 8},
        "options": {"overlap_grad_reduce": True, "token_dispatcher": "flex", "blackwell_cublas_32mib": False}},
    "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release_sm": {
        "model": _PROXY, "training": {**_PROXY_GB200, "dp": 8},
        "options": {"overlap_grad_reduce": True, "token_dispatcher": "flex"}},
}
__all__.append("MEGATRON_RUN_SETUPS")


# ------------------------------------------------------------------------------------------------
# other published measurements of Megatron-LM runs (Llama, Mixtral)
# ------------------------------------------------------------------------------------------------
#: the SimuMax commit its B200 table and launch scripts were read at (MooreThreads/SimuMax, 2026-05-11)
SIMUMAX_COMMIT = "4dcaae513ba7679d56c116a17cd4a691ec41e252"
#: the copy of the Llama rows of docs/b200/b200_release_v1.2_summary.json, written by tools/published_runs.py
SIMUMAX_RUNS_FILE = Path(__file__).with_name("published_runs") / "simumax_b200_llama3.json"
#: the step times of every row of the same table, written by tools/published_runs.py
SIMUMAX_STEPS_FILE = Path(__file__).with_name("published_runs") / "simumax_b200_steps.json"

#: what the B200 runs ran, each fact with the SimuMax file (at SIMUMAX_COMMIT) that states it
SIMUMAX_SETUP: dict[str, tuple] = {
    "megatron_commit": ("23e00ed0963c35382dfe8a5a94fb3cda4d21e133",
                        "docs/b200/b200_real_repro_guide.md §2: the Megatron-LM checkout of the real runs"),
    "gpu": (("B200", 10), "docs/b200/b200_real_repro_guide.md; configs/system/b200_bf16_ceperm.json"),
    "world_size": (8, "simu_tools/megatron_scripts/run_llama3.sh: world_size=8, DP = 8 / (TP CP PP)"),
    "micro_batch": (1, "tools/b200/run_params/b200_bf16_ceperm_sweep.json (mbs_list [1]); "
                       "tools/b200/run_megatron_perf_real_pipeline.py (micro_batch_size 1)"),
    "seq_len": (4096, "tools/b200/run_params/b200_bf16_ceperm_sweep.json (seq_len_list [4096]); "
                      "the CP rows name theirs (seq32768, seq131072)"),
    "flags": ("--use-distributed-optimizer --use-flash-attn --sequence-parallel --recompute-granularity full "
              "--recompute-method block --recompute-num-layers 0 --bf16 --accumulate-allreduce-grads-in-fp32 "
              "--untie-embeddings-and-output-weights --swiglu --normalization RMSNorm --disable-bias-linear "
              "--position-embedding-type rope --group-query-attention --transformer-impl transformer_engine "
              "--tokenizer-type NullTokenizer --vocab-size V (no overlap flags)",
              "simu_tools/megatron_scripts/scripts/run_pretrain_llama3.sh"),
    "cross_entropy": ("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te",
                      "docs/strategy.md: the _cef suffix of the result tables' cases means both flags in the real "
                      "runs"),
    "vocab": ("NullTokenizer: --vocab-size + 1 (one EOD token), padded to a multiple of 128 TP",
              "Megatron-LM 23e00ed0: megatron/training/tokenizer/tokenizer.py (_NullTokenizer.vocab_size, "
              "_vocab_size_with_padding)"),
    "cp_comm_type": ("a2a", "simu_tools/megatron_scripts/scripts/run_pretrain_llama3.sh: CP_COMM_TYPE=${CP_COMM_TYPE:-a2a}, "
                            "passed as --cp-comm-type with CP > 1; docs/b200/b200_real_repro_guide.md: cp_comm_type=a2a"),
    "rank_order": ("tp-cp-ep-dp-pp", "Megatron-LM 23e00ed0: megatron/core/parallel_state.py, initialize_model_parallel's "
                                     "default order (pipeline stage slowest: ranks 0 .. 8/PP - 1 are the first stage)"),
    "metric": ("torch.cuda.max_memory_allocated() / 2**20 of every rank, the published value their maximum",
               "simu_tools/megatron_scripts/patches/megatron_b200_memory_logging.patch; "
               "tools/b200/run_megatron_perf_real_pipeline.py (max over all ranks)"),
    "step_time": ("real_ms: the fastest iteration from the second on of the last rank's 'elapsed time per iteration'",
                  "tools/b200/run_megatron_perf_real_batch.py (parse_fastest_run_logs)"),
    "global_batch": ("micro-batch x micro-batches (mbc) x DP sequences",
                     "simu_tools/megatron_scripts/run_llama3.sh, run_deepseekv2.sh (global_batch_size)"),
    "overlap": ("none: no --overlap-grad-reduce or --overlap-param-gather, TP communication overlap disabled "
                "(--disable-tp-comm-overlap-ag/-rs), --no-overlap-p2p-communication; CP by all-to-all (a2a)",
                "simu_tools/megatron_scripts/scripts/run_pretrain_llama3.sh (CP_COMM_TYPE a2a); "
                "tools/b200/run_megatron_perf_real_batch.py; docs/b200/b200_real_repro_guide.md §3.3 (a non-overlap "
                "contract)"),
    "moe": ("--moe-token-dispatcher-type alltoall --moe-grouped-gemm --moe-permute-fusion --moe-expert-capacity-factor "
            "1 --moe-pad-expert-input-to-capacity (every expert computes its capacity: balanced work); the first "
            "layer dense (--moe-layer-freq ([0]*1+[1]*(L-1))); no MTP; ETP = TP = 1",
            "simu_tools/megatron_scripts/scripts/run_pretrain_deepseekv2.sh (MOE_ARGS)"),
}

#: the launchers' MODEL_TYPE shapes (run_pretrain_llama3.sh; run_pretrain_deepseekv2.sh with its MLA_ARGS), in
#: Hugging Face field names, --vocab-size as they pass it
SIMUMAX_MODELS: dict[str, dict[str, int]] = {
    "llama3-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                   "num_key_value_heads": 8, "vocab_size": 128256},
    "llama3-405b": {"hidden_size": 16384, "intermediate_size": 53248, "num_attention_heads": 128,
                    "num_key_value_heads": 16, "vocab_size": 128256},
    "deepseekv2": {"hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
                   "n_routed_experts": 160, "num_experts_per_tok": 6, "n_shared_experts": 2,
                   "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400},
    "deepseekv3": {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                   "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
                   "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280},
}

_SIMUMAX_SIZES = re.compile(r"_(tp|cp|pp|dp|ep)(\d+)")


def _mib_bytes(value) -> int:
    """A logged ``bytes / 2**20`` as the exact byte count (the float is a multiple of 2**-20)."""
    b = Fraction(value) * 2**20
    if b.denominator != 1:
        raise ValueError(f"{value!r} MiB is not a whole number of bytes")
    return int(b)


def _load_simumax_runs() -> dict[str, dict]:
    data = json.loads(SIMUMAX_RUNS_FILE.read_text(encoding="utf-8"))
    runs: dict[str, dict] = {}
    for row in data["rows"]:
        key = row.get("memory_source_case") or row["case"]
        if key in runs:
            runs[key]["rows"].append(row["case"])
            continue
        sizes = {k: int(v) for k, v in _SIMUMAX_SIZES.findall(key)}
        seq = re.search(r"_seq(\d+)", key)
        mem = row["peak_memory_by_rank_mb"]
        runs[key] = {
            "model": row["model"], "layers": row["layer_num"], "tp": sizes["tp"], "pp": sizes["pp"],
            "cp": sizes.get("cp", 1), "dp": sizes["dp"], "micro_batches": row["mbc"],
            "seq_len": int(seq.group(1)) if seq else SIMUMAX_SETUP["seq_len"][0],
            "max_allocated": {int(r): _mib_bytes(v["max_allocated_mb"]) for r, v in mem.items()},
            "max_reserved": {int(r): _mib_bytes(v["max_reserved_mb"]) for r, v in mem.items()},
            "printed_alloc_gib": f"{row['real_alloc_gib']:.2f}", "printed_reserved_gib": f"{row['real_reserved_gib']:.2f}",
            "rows": [row["case"]],
            "source": f"MooreThreads/SimuMax {SIMUMAX_COMMIT[:10]} docs/b200/b200_release_v1.2_summary.json",
        }
    return runs


SIMUMAX_B200_RUNS: dict[str, dict] = _load_simumax_runs()
"""SimuMax's measured B200 runs of Llama-3-70B (12 layers) and Llama-3-405B (4 layers) under Megatron-LM, keyed by
the case whose run was measured (``memory_source_case``: the rows with 8 and 32 micro-batches repeat the memory of
the 4-micro-batch run): the model, its layers, TP/PP/CP/DP, the micro-batches per step of the measured run, the sequence length; ``max_allocated`` and
``max_reserved``, rank -> exact bytes; the published GiB (the maximum over the ranks, printed with two decimals) and
the published rows that share the measurement."""



def _load_simumax_steps() -> list[dict]:
    data = json.loads(SIMUMAX_STEPS_FILE.read_text(encoding="utf-8"))
    world = SIMUMAX_SETUP["world_size"][0]
    out = []
    for row in data["rows"]:
        sizes = {k: int(v) for k, v in _SIMUMAX_SIZES.findall(row["case"])}
        seq = re.search(r"_seq(\d+)", row["case"])
        tp, pp, cp, ep = (sizes.get(k, 1) for k in ("tp", "pp", "cp", "ep"))
        dp = world // (tp * pp * cp)
        b = SIMUMAX_SETUP["micro_batch"][0]
        out.append({"case": row["case"], "model": row["model"], "layers": row["layer_num"], "tp": tp, "pp": pp,
                    "cp": cp, "ep": ep, "dp": dp, "micro_batch": b, "micro_batches": row["mbc"],
                    "global_batch": b * row["mbc"] * dp,
                    "seq_len": int(seq.group(1)) if seq else SIMUMAX_SETUP["seq_len"][0],
                    "measured_ms": row["real_ms"], "simumax_ms": row["perf_ms"]})
    return out


SIMUMAX_B200_STEPS: list[dict] = _load_simumax_steps()
"""Every row of SimuMax's B200 table (43 Megatron-LM runs on one node of eight B200s: proxies of Llama-3-70B and -405B,
DeepSeek-V2 and -V3 with fewer layers), in the table's order: the model, its layers, TP/PP/CP/EP/DP (read from the
case's name), the micro-batch size, micro-batches per step, global batch (sequences), sequence length, the measured
step (``measured_ms``) and SimuMax's own prediction (``simumax_ms``)."""

#: Megatron-LM PR #482 "Analysis Tool" (yxyOo, 2023): the table of its tools/get_training_info/README.md, as
#: printed (MBS, GBS, DP, PP, TP, "Peak_Memory_Actual", "Peak_Memory_Estimated"); Llama2 7B, bf16, one H800
#: node of eight GPUs (the PR's comment of 2023-10-07); actual = torch.cuda.max_memory_allocated() after
#: several iterations; a review comment adds a two-node row whose second rank is not given ("1:a")
PR482_LLAMA2_7B = {
    "source": "https://github.com/NVIDIA/Megatron-LM/pull/482, tools/get_training_info/README.md",
    "commit": "550b341be5c71e6a9f65c87e86615670f1e14248",
    "rows": (("2", "2048", "8", "1", "1", "69.1", "68.8"), ("4", "512", "4", "1", "2", "55.7", "55.5"),
             ("2", "2048", "4", "2", "1", "49.8", "49.5"), ("4", "128", "1", "1", "8", "28.8", "28.6")),
    "review_row": ("2", "2048", "8", "2", "1", "0:69.1, 1:a", "0:68.8, 1:a"),
}

__all__ += ["SIMUMAX_COMMIT", "SIMUMAX_RUNS_FILE", "SIMUMAX_SETUP", "SIMUMAX_MODELS", "SIMUMAX_B200_RUNS",
            "SIMUMAX_STEPS_FILE", "SIMUMAX_B200_STEPS", "PR482_LLAMA2_7B"]
