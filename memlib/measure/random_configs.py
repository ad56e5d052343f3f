"""Random small configurations for the ground-truth checks: models for transformers, requests for Megatron-Core.

:func:`random_config` draws a small model of one of :data:`HF_RANDOM_FAMILIES` (with a micro-batch and a
sequence length) for :mod:`memlib.measure.hf`; :func:`random_request` a small DeepSeek-style model with
random kernel choices and recompute policy, and :func:`random_family_request` one of
:data:`MCORE_RANDOM_FAMILIES`, for :mod:`memlib.measure.megatron`.  Every draw is a function of the
generator it is given, so a seed reproduces a batch.
"""
from __future__ import annotations

import random
from dataclasses import replace

from ..config import ConfigError, ModelConfig, TrainingConfig, show
from ..ledgers.base import parse_policy
from .megatron import Request

__all__ = ["HF_RANDOM_FAMILIES", "random_config", "CPU_RECOMPUTE", "random_request", "GQA_CPU_RECOMPUTE",
           "MCORE_RANDOM_FAMILIES", "random_family_request"]


# ------------------------------------------------------------------------------------------------
# for transformers (memlib.measure.hf)
# ------------------------------------------------------------------------------------------------
#: families :func:`random_config` draws, with their transformers class
HF_RANDOM_FAMILIES = {"deepseek": "DeepseekV3ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                   "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                   "qwen3_moe": "Qwen3MoeForCausalLM", "gpt2": "GPT2LMHeadModel", "gpt": None}


def _random_gqa(rng: random.Random, family: str) -> dict:
    """A random small config.json of a grouped-query family (h a multiple of 8 for grouped_mm)."""
    n_kv = rng.choice([1, 2, 4])
    n_h = n_kv * rng.choice([1, 2, 3])
    d = {"model_type": family, "num_attention_heads": n_h, "num_key_value_heads": n_kv,
         "num_hidden_layers": rng.randint(1, 3), "vocab_size": rng.randint(8, 64),
         "tie_word_embeddings": rng.random() < 0.3, "hidden_size": 8 * n_h * rng.randint(1, 2),
         "hidden_act": rng.choice(["silu", "silu", "gelu_new"])}
    if rng.random() < 0.5 or family == "qwen3":
        d["head_dim"] = rng.choice([2, 4, 6, 8])
    if family in ("llama", "qwen3"):
        d["intermediate_size"] = rng.randint(4, 40)
    if family == "llama":
        d["mlp_bias"] = rng.random() < 0.5
    if family in ("llama", "qwen3", "qwen3_moe"):
        d["attention_bias"] = rng.random() < 0.5
    if family in ("mixtral", "qwen2_moe", "qwen3_moe"):
        n = rng.randint(1, 8)
        width = 8 * rng.randint(1, 3)          # grouped_mm needs 16-byte strides
        d["num_experts_per_tok"] = rng.randint(1, n)
        if family == "mixtral":
            d.update(num_local_experts=n, intermediate_size=width)
        else:
            d.update(num_experts=n, moe_intermediate_size=width, norm_topk_prob=rng.random() < 0.5)
    if family == "qwen2_moe":
        d.update(shared_expert_intermediate_size=rng.randint(2, 30), qkv_bias=rng.random() < 0.7)
    return d


def random_config(rng: random.Random, family: str = "deepseek") -> tuple[ModelConfig, int, int]:
    """A random small config of ``family`` (DeepSeek-V3-style by default), with a micro-batch size and a
    sequence length."""
    from ..config import model_from_dict

    if family not in HF_RANDOM_FAMILIES:
        raise ConfigError(f"family={show(family)} must be one of {', '.join(HF_RANDOM_FAMILIES)}")
    if family == "deepseek":
        return _random_deepseek(rng)
    b = rng.choice([1, 1, 2, 3])
    s = rng.choice([1, rng.randint(2, 12)])
    if family in ("gpt2", "gpt"):
        n_h = rng.randint(1, 4)
        act = rng.choice(["gelu_new", "gelu_new", "gelu", "gelu_pytorch_tanh"])
        h, layers, pos, vocab = n_h * rng.randint(1, 6), rng.randint(1, 3), rng.randint(s, 24), rng.randint(8, 64)
        if family == "gpt2":
            d = {"model_type": "gpt2", "n_embd": h, "n_head": n_h, "n_layer": layers, "n_positions": pos,
                 "vocab_size": vocab, "n_inner": rng.choice([None, rng.randint(4, 40)]), "activation_function": act,
                 "tie_word_embeddings": rng.random() < 0.8}
        else:
            d = {"model_type": "gpt", "hidden_size": h, "num_attention_heads": n_h, "num_hidden_layers": layers,
                 "max_position_embeddings": pos, "vocab_size": vocab, "intermediate_size": rng.randint(4, 40),
                 "hidden_act": act, "tie_word_embeddings": rng.random() < 0.8}
        return model_from_dict(d, name=f"random-{family}"), b, s
    return model_from_dict(_random_gqa(rng, family), name=f"random-{family}"), b, s


def _random_deepseek(rng: random.Random) -> tuple[ModelConfig, int, int]:
    from ..config import model_from_dict

    n = rng.randint(2, 8)
    d = {
        "hidden_size": rng.choice([8, 16, 24, 32]),
        "intermediate_size": rng.randint(4, 48),
        "moe_intermediate_size": 8 * rng.randint(1, 3),   # grouped_mm needs 16-byte strides
        "num_attention_heads": rng.randint(1, 4),
        "qk_nope_head_dim": rng.randint(1, 12),
        "qk_rope_head_dim": 2 * rng.randint(1, 4),
        "v_head_dim": rng.randint(1, 12),
        "q_lora_rank": rng.choice([None, rng.randint(2, 20)]),
        "kv_lora_rank": rng.randint(2, 20),
        "n_routed_experts": n,
        "n_shared_experts": rng.randint(0, 2),
        "num_experts_per_tok": rng.randint(1, n),
        "num_hidden_layers": rng.randint(1, 3),
        "first_k_dense_replace": 0,
        "vocab_size": rng.randint(8, 64),
        "model_type": "deepseek_v3",
    }
    d["first_k_dense_replace"] = rng.randint(0, d["num_hidden_layers"])
    b = rng.choice([1, 1, 2, 3])
    s = rng.choice([1, rng.randint(2, 12)])
    return model_from_dict(d, name="random"), b, s


# ------------------------------------------------------------------------------------------------
# for Megatron-Core (memlib.measure.megatron)
# ------------------------------------------------------------------------------------------------
#: the recompute policies megatron-core runs on the CPU (moe_act needs Transformer Engine's grouped MLP)
CPU_RECOMPUTE = ("none", "selective", "core_attn", "mla_up_proj", "layernorm", "mlp", "moe", "shared_experts",
                 "deepseek", "layernorm,moe", "core_attn,mla_up_proj,layernorm,mlp,moe,shared_experts",
                 "full", "full-block:1", "full-block:2")


def random_request(rng: random.Random, seed: int = 0) -> Request:
    """A random small DeepSeek-style model with random megatron kernel choices and recompute policy.

    Request ``seed`` (its position in a batch) cycles what must be covered: every recompute policy of
    :data:`CPU_RECOMPUTE`, fp32 every fourth, no q LoRA two in five, MTP two in three."""
    from ..config import model_from_dict

    n_group = rng.choice([1, 1, 2, 4])
    n = n_group * rng.randint(1, 4)
    topk_group = rng.randint(1, n_group)
    n_r = rng.randint(1, topk_group * (n // n_group))
    layers = rng.randint(1, 3)
    sigmoid = rng.random() < 0.7
    d = {
        "hidden_size": rng.choice([8, 16, 24, 32]),
        "intermediate_size": rng.randint(4, 40),
        "moe_intermediate_size": rng.randint(2, 24),
        "num_attention_heads": rng.randint(1, 4),
        "qk_nope_head_dim": rng.randint(1, 10),
        "qk_rope_head_dim": 2 * rng.randint(1, 4),
        "v_head_dim": rng.randint(1, 10),
        "q_lora_rank": None if seed % 5 in (0, 3) else rng.randint(2, 20),
        "kv_lora_rank": rng.randint(2, 20),
        "n_routed_experts": n,
        "n_shared_experts": rng.choice([0, 1, 2]),
        "num_experts_per_tok": n_r,
        "num_hidden_layers": layers,
        "first_k_dense_replace": rng.randint(0, layers),
        "moe_layer_freq": rng.choice([1, 1, 1, 2]),
        "vocab_size": rng.randint(8, 64),
        "num_nextn_predict_layers": 0 if seed % 3 == 2 else 1,
        "n_group": n_group,
        "topk_group": topk_group,
        "scoring_func": "sigmoid" if sigmoid else "softmax",
        "topk_method": "noaux_tc" if sigmoid and rng.random() < 0.8 else "greedy",
        "tie_word_embeddings": rng.random() < 0.2,
        "model_type": "deepseek_v3",
    }
    m = model_from_dict(d, name="random")
    train = TrainingConfig(
        dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", transformer_impl="local", runtime="cpu",
        precision="fp32" if seed % 4 == 3 else "megatron",
        micro_batch=rng.choice([1, 1, 2, 3]), seq_len=rng.choice([1, rng.randint(2, 12), rng.randint(13, 24)]),
        recompute=CPU_RECOMPUTE[seed % len(CPU_RECOMPUTE)], attention_softmax_in_fp32=rng.random() < 0.3,
        bias_swiglu_fusion=rng.random() < 0.6, cross_entropy_loss_fusion=rng.random() < 0.3,
        moe_aux_loss=rng.choice(["seq_aux_loss", "seq_aux_loss", "aux_loss", "none"]))
    return Request(m, train, seed)


#: the recompute policies of a grouped-query-attention model on the CPU (mla_up_proj is MLA's)
GQA_CPU_RECOMPUTE = ("none", "selective", "core_attn", "layernorm", "mlp", "moe", "shared_experts", "layernorm,moe",
                     "core_attn,layernorm,mlp,moe,shared_experts", "full", "full-block:1", "full-block:2")
#: the families :func:`random_family_request` cycles through (besides DeepSeek's :func:`random_request`)
MCORE_RANDOM_FAMILIES = ("llama", "qwen3", "gpt", "mixtral", "qwen2_moe", "qwen3_moe")


def random_family_request(rng: random.Random, seed: int = 0) -> Request:
    """A random small model of one of :data:`MCORE_RANDOM_FAMILIES` read from a Hugging Face-style config.json,
    with random megatron kernel choices.  ``seed`` cycles the family and the recompute policy of
    :data:`GQA_CPU_RECOMPUTE` (24 requests cover every family and every policy; 72 every pair), fp32
    every fourth.

    Grouped-query and multi-head attention (n_kv = n_h one time in three), biases where Megatron-Core can
    place them (its add_bias_linear biases linear_proj and the MLP together: Llama's attention_bias and
    mlp_bias are drawn equal, the GPT's too; the MoE families have no output or expert bias: megatron-core's
    SequentialMLP adds an expert's fc2 bias in place on a view, which autograd refuses on the CPU), tied and
    untied embeddings; every second Mixtral has GeLU experts (no --swiglu), half of them with LayerNorm and
    learned positions."""
    from ..config import model_from_dict

    fam = MCORE_RANDOM_FAMILIES[seed % len(MCORE_RANDOM_FAMILIES)]
    recompute = GQA_CPU_RECOMPUTE[(seed + seed // len(MCORE_RANDOM_FAMILIES)) % len(GQA_CPU_RECOMPUTE)]
    no_bias = "mlp" in parse_policy(recompute).modules        # see _check_request
    n_kv = rng.randint(1, 3)
    n_h = n_kv * (1 if rng.random() < 1 / 3 else rng.randint(2, 3))
    d = {"num_attention_heads": n_h, "num_key_value_heads": n_kv, "num_hidden_layers": rng.randint(1, 2),
         "vocab_size": rng.randint(8, 64), "tie_word_embeddings": rng.random() < 0.3}
    if fam == "gpt":
        d.update(model_type="gpt", hidden_size=n_h * rng.randint(1, 6), intermediate_size=rng.randint(4, 40),
                 max_position_embeddings=rng.randint(24, 40))
        bias = rng.random() < 0.8 and not no_bias
        d.update(attention_bias=bias, mlp_bias=bias)
    else:
        d.update(architectures=[{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM",
                                 "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[fam]],
                 hidden_size=rng.choice([8, 16, 24, 32]), head_dim=2 * rng.randint(1, 5))
        if fam == "llama":
            bias = rng.random() < 0.4 and not no_bias
            d.update(intermediate_size=rng.randint(4, 40), attention_bias=bias, mlp_bias=bias)
        elif fam == "qwen3":
            d.update(intermediate_size=rng.randint(4, 40))
        else:
            n = rng.randint(1, 8)
            d.update(num_experts_per_tok=rng.randint(1, n))
            d["num_local_experts" if fam == "mixtral" else "num_experts"] = n
            d["intermediate_size" if fam == "mixtral" else "moe_intermediate_size"] = rng.randint(2, 24)
            if fam == "qwen2_moe":
                d.update(shared_expert_intermediate_size=rng.randint(2, 24), qkv_bias=rng.random() < 0.7)
    m = model_from_dict(d, name="random-" + fam)
    if fam == "mixtral" and (seed // len(MCORE_RANDOM_FAMILIES)) % 2:
        # every second Mixtral: GeLU experts, as Megatron-LM builds them without --swiglu (its GPT MoE tests), half
        # of them with the GPT's LayerNorm and learned positions
        ln = rng.random() < 0.5
        m = replace(m, name="random-gelu-moe", mlp="gelu", hidden_act="gelu", norm="layernorm" if ln else m.norm,
                    positions="learned" if ln else m.positions,
                    max_position_embeddings=rng.randint(24, 40) if ln else None)
    train = TrainingConfig(
        dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", transformer_impl="local", runtime="cpu",
        precision="fp32" if seed % 4 == 3 else "megatron",
        micro_batch=rng.choice([1, 1, 2, 3]), seq_len=rng.choice([1, rng.randint(2, 12), rng.randint(13, 24)]),
        recompute=recompute,
        attention_softmax_in_fp32=rng.random() < 0.3,
        bias_swiglu_fusion=rng.random() < 0.6 and (m.mlp == "swiglu" or m.mlp_bias),
        cross_entropy_loss_fusion=rng.random() < 0.3,
        moe_aux_loss=rng.choice(["seq_aux_loss", "aux_loss", "aux_loss", "none"]))
    return Request(m, train, seed)
