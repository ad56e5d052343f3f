"""Published values memlib is checked against, as their sources print them.

These are *data*, not formulas: the numbers the paper (arXiv 2502.07846) and other sources
printed, kept verbatim (printed decimals as strings) so the book's errata and the tests can put
memlib's exact values beside them.  Nothing in memlib computes from this module.

The paper's "GB" columns are GiB (2**30 bytes): 12,500,729,856 bytes is printed "11.64 GB".
Most of the paper's tables are known through a secondary transcription of its text ("DD" in
:data:`SECONDARY`); a value that is only inferred, not printed, is not kept here.
"""
from __future__ import annotations

import sympy as sp

from .symbols import sym

__all__ = ["PAPER", "PAPER_UNIT_NOTE", "ZERO_PAPER", "MEGATRON_BYTES_PER_PARAM", "DEEPSEEK_OFFICIAL", "SECONDARY"]
__all__ += ["PAPER_TABLE9", "PAPER_ACTIVATION_FORMULAS", "KORTHIKANTI_TABLE2", "KORTHIKANTI_SYMBOLS",
            "KORTHIKANTI_22B"]
__all__ += ["MEASURED_RESERVED", "CUDA_CONTEXT_MEASURED", "PYTORCH_ALLOCATOR", "NCCL_BUFFSIZE"]

PAPER_UNIT_NOTE = "the paper prints GB; its numbers are GiB (2**30 bytes)"

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
DEEPSEEK_OFFICIAL = {
    "deepseek-v3": {"total": "671", "activated": "37", "mtp": "11.5", "checkpoint": "685",
                    "activated_weights_doc": "36.7"},
    "deepseek-v2": {"total": "236", "activated": "21"},
    "deepseek-v2-lite": {"total": "15.7", "activated": "2.4"},
}

#: statements of the paper's public transcription ("DD") that differ from memlib, verbatim
SECONDARY = {
    "dd_replicated_share": "26%",          # "the replicated part is about 26% of MLA parameters"
    "dd_full_moe": "2bsh + 2bsN_r",        # its implementation notes for the MoE block under full recompute
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

#: their Figure 1, the 22B model: activations of one device in GiB, tensor parallelism alone and with
#: sequence parallelism and selective recompute (the values as Calculon's validation transcribes them,
#: github.com/calculon-ai/calculon, calculon/llm/validation.py)
KORTHIKANTI_22B = {"name": "22B", "h": 6144, "a": 64, "L": 48, "t": 8, "b": 4, "s": 2048,
                   "gib": {"none": "59.25", "sp_selective": "9.5625"}}


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

#: PyTorch's CUDA caching allocator, bytes (c10/cuda/CUDACachingAllocator.cpp; c10/core/AllocatorConfig.h
#: in recent releases): every request rounded up to kMinBlockSize; requests up to kSmallSize served from
#: kSmallBuffer segments, those below kMinLargeAlloc from kLargeBuffer segments, larger ones from
#: segments rounded up to kRoundLarge
PYTORCH_ALLOCATOR = {"kMinBlockSize": 512, "kSmallSize": 1_048_576, "kSmallBuffer": 2_097_152,
                     "kLargeBuffer": 20_971_520, "kMinLargeAlloc": 10_485_760, "kRoundLarge": 2_097_152}

#: NCCL's default buffer per channel and peer connection, bytes (NCCL documentation, NCCL_BUFFSIZE)
NCCL_BUFFSIZE = 4_194_304
