"""Published values memlib is checked against, as their sources print them.

These are *data*, not formulas: the numbers the paper (arXiv 2502.07846) and other sources
printed, kept verbatim (printed decimals as strings) so the book's errata and the tests can put
memlib's exact values beside them.  Nothing in memlib computes from this module.

The paper's "GB" columns are GiB (2**30 bytes): 12,500,729,856 bytes is printed "11.64 GB".
Tags follow ``shared/reference/paper.md``: most of the paper's tables are known through a faithful
secondary transcription ("DD"); where the reference marks a value as inferred it is not here.
"""
from __future__ import annotations

__all__ = ["PAPER", "PAPER_UNIT_NOTE", "ZERO_PAPER", "MEGATRON_BYTES_PER_PARAM", "DEEPSEEK_OFFICIAL", "SECONDARY"]

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
