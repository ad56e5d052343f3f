"""A tiny DeepSeek-style model whose parameter counts are worked out by hand in the tests.

Imported by the test modules (pytest puts ``tests/`` on ``sys.path``).  Every size is different
from every other one that could be confused with it (d_h = 3, d_v = 5, d_h^R = 2), so a formula
that uses the wrong dimension gives a different number.

Hand-worked per-layer counts (see tests/model/test_params.py for the term-by-term derivation):

* MLA (with q LoRA)  310  = W^DQ 48 + q_norm 6 + W^UQ 36 + W^QR 24 + W^DKV 32 + W^KR 16
                           + kv_norm 4 + W^UK 24 + W^UV 40 + W^O 80
* block norms         16  = 2 h
* dense FFN          384  = 3 h h_F
* router              32  = N h
* shared experts      96  = 3 h (N_s h_E)
* routed experts     384  = N 3 h h_E
* embedding / head    80  = v h each; final norm 8 = h
"""
from __future__ import annotations

import json
from pathlib import Path

from memlib.config import ModelConfig, model_from_dict

TINY_HF = {
    "hidden_size": 8,             # h
    "intermediate_size": 16,      # h_F
    "moe_intermediate_size": 4,   # h_E
    "num_attention_heads": 2,     # n_h
    "qk_nope_head_dim": 3,        # d_h
    "qk_rope_head_dim": 2,        # d_h^R
    "v_head_dim": 5,              # d_v
    "q_lora_rank": 6,             # d_c'
    "kv_lora_rank": 4,            # d_c
    "n_routed_experts": 4,        # N
    "n_shared_experts": 1,        # N_s
    "num_experts_per_tok": 2,     # N_r
    "num_hidden_layers": 3,       # l
    "first_k_dense_replace": 1,   # layer 0 dense, layers 1 and 2 MoE
    "vocab_size": 10,             # v
}

# hand-worked building blocks (one device, no parallelism)
MLA = 310
NORMS = 16
DENSE_FFN = 384
ROUTER = 32
SHARED = 96
ROUTED = 384
EMBEDDING = 80
HEAD = 80
FINAL_NORM = 8
DENSE_LAYER = MLA + NORMS + DENSE_FFN            # 710
MOE_LAYER = MLA + NORMS + ROUTER + SHARED + ROUTED  # 838


def tiny(**changes) -> ModelConfig:
    """The tiny model, with Hugging Face fields in ``changes`` overriding ``TINY_HF``."""
    return model_from_dict({**TINY_HF, **changes}, name="tiny")


def write_tiny(path: Path, **changes) -> Path:
    """Write the tiny model's ``config.json`` to ``path`` and return it."""
    path.write_text(json.dumps({**TINY_HF, **changes}))
    return path


_GQA = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 50}
#: a valid small config.json of every family memlib reads (memlib.config.FAMILIES), each optional integer field set
FAMILY_CONFIGS = {
    "deepseek": {**TINY_HF, "moe_layer_freq": 1, "num_nextn_predict_layers": 1, "n_group": 2, "topk_group": 1},
    "llama": {"architectures": ["LlamaForCausalLM"], **_GQA, "intermediate_size": 96},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], **_GQA, "intermediate_size": 96, "head_dim": 8},
    "mixtral": {"architectures": ["MixtralForCausalLM"], **_GQA, "num_local_experts": 4, "intermediate_size": 32,
                "num_experts_per_tok": 2, "decoder_sparse_step": 1},
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], **_GQA, "num_experts": 4, "moe_intermediate_size": 16,
                  "num_experts_per_tok": 2, "shared_expert_intermediate_size": 32, "intermediate_size": 96,
                  "decoder_sparse_step": 1},
    "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], **_GQA, "num_experts": 4, "moe_intermediate_size": 16,
                  "num_experts_per_tok": 2, "intermediate_size": 96, "decoder_sparse_step": 1, "head_dim": 8},
    "gpt": {"architectures": ["GPTForCausalLM"], "hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 2,
            "vocab_size": 50, "max_position_embeddings": 128, "intermediate_size": 96},
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 8, "n_layer": 2, "vocab_size": 50,
             "n_positions": 128, "n_inner": 96},
}
