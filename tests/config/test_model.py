"""memlib.config.model: a config.json read into a ModelConfig: which layers are MoE, what each family reads and
infers, and the one-line error for every rule a config can break.  The expected layer patterns, head widths and
inferred flags are worked out by hand below from the fields given; none is read back from the code."""
from __future__ import annotations

import pytest

from memlib.config import ConfigError, model_from_dict
from memlib.config.model import FAMILIES, family_of

#: a small DeepSeek-V2-style config: MLA, 8 routed experts of which 2 per token, one shared expert
DS = {"hidden_size": 16, "intermediate_size": 40, "moe_intermediate_size": 8, "num_attention_heads": 2,
      "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4, "q_lora_rank": None, "kv_lora_rank": 6,
      "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hidden_layers": 6,
      "first_k_dense_replace": 1, "vocab_size": 50}
#: a Llama-style GQA config: h 24 over 6 heads (d_head 4), 2 key-value heads
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 24, "num_attention_heads": 6,
         "num_key_value_heads": 2, "num_hidden_layers": 3, "vocab_size": 40, "intermediate_size": 64}
#: a Mixtral-style MoE: 4 experts of width 32, 2 per token
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "hidden_size": 16, "num_attention_heads": 4,
           "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 30, "intermediate_size": 32,
           "num_local_experts": 4, "num_experts_per_tok": 2}


def ds(**changes):
    return model_from_dict({**DS, **changes}, name="ds")


# --- which layers are MoE ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("first_dense, freq, kinds", [
    # layer i is MoE when i >= first_k_dense_replace and i is a multiple of moe_layer_freq
    (1, 1, "DMMMMM"),
    (0, 1, "MMMMMM"),
    (2, 2, "DDMDMD"),      # 2 and 4 are even; 3 and 5 are not
    (1, 3, "DDDMDD"),      # 3 is the only multiple of 3 from 1 on (0 is before the first MoE layer)
    (6, 1, "DDDDDD"),      # every layer dense
])
def test_which_layers_are_moe(first_dense, freq, kinds):
    m = ds(first_k_dense_replace=first_dense, moe_layer_freq=freq)
    assert "".join(k[0].upper() for k in m.layer_kinds) == kinds
    assert m.has_moe


def test_a_dense_family_has_no_moe_layer():
    m = model_from_dict(LLAMA)
    assert m.layer_kinds == ("dense",) * 3 and not m.has_moe
    assert (m.n_routed_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (None, None, None)
    assert m.first_k_dense_replace == 3


# --- what a family reads and infers ------------------------------------------------------------------------------
def test_the_deepseek_reader_infers_the_router():
    # no topk_method: V3's model_type means the noaux_tc bias and sigmoid scores; V2's softmax and no bias
    v3 = ds(model_type="deepseek_v3")
    assert (v3.router_bias, v3.scoring_func) == (True, "sigmoid")
    v2 = ds(model_type="deepseek_v2")
    assert (v2.router_bias, v2.scoring_func) == (False, "softmax")
    assert ds(model_type="deepseek_v2", topk_method="noaux_tc").router_bias
    assert not ds(model_type="deepseek_v3", topk_method="greedy").router_bias
    # absent optional fields: one MoE layer in every layer after the dense ones, no MTP, untied, one group
    m = ds()
    assert (m.moe_layer_freq, m.num_nextn_predict_layers, m.tie_word_embeddings, m.n_group, m.topk_group) == \
        (1, 0, False, 1, 1)
    assert ds(num_nextn_predict_layers=None).num_nextn_predict_layers == 0     # null read as absent


def test_a_gqa_family_derives_its_head_width():
    m = model_from_dict(LLAMA)
    assert (m.family, m.attention, m.head_dim, m.num_key_value_heads) == ("llama", "gqa", 4, 2)   # 24 / 6
    assert model_from_dict({**LLAMA, "head_dim": 16}).head_dim == 16            # given: taken as it is
    # Qwen3's own default head width is 128 whatever h / n_h is
    qwen3 = {**LLAMA, "architectures": ["Qwen3ForCausalLM"]}
    assert model_from_dict(qwen3).head_dim == 128 and model_from_dict(qwen3).qk_norm


def test_gpt2_reads_its_own_field_names():
    # n_embd 12 over n_head 3 heads: d_head 4, one key-value head per query head; n_inner absent: 4 h = 48
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "n_embd": 12, "n_head": 3, "n_layer": 2, "n_positions": 10,
            "vocab_size": 20}
    m = model_from_dict(gpt2)
    assert (m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (12, 3, 3, 4)
    assert (m.intermediate_size, m.max_position_embeddings, m.num_hidden_layers) == (48, 10, 2)
    assert (m.tie_word_embeddings, m.qkv_bias, m.mlp_bias, m.hidden_act) == (True, True, True, "gelu_new")
    assert (m.norm, m.positions, m.mlp) == ("layernorm", "learned", "gelu")


def test_mixtral_reads_its_experts():
    m = model_from_dict(MIXTRAL)
    assert (m.n_routed_experts, m.moe_intermediate_size, m.num_experts_per_tok, m.n_shared_experts) == (4, 32, 2, 0)
    assert m.layer_kinds == ("moe", "moe") and m.norm_topk_prob


def test_the_family_is_found_by_class_then_by_model_type():
    by_name = {f.name: f for f in FAMILIES}
    assert family_of({}) is by_name["deepseek"]                                 # memlib's original input
    assert family_of({"model_type": "qwen2_moe"}) is by_name["qwen2_moe"]
    # the first class name decides, before model_type
    assert family_of({"architectures": ["MixtralForCausalLM"], "model_type": "llama"}) is by_name["mixtral"]
    # an unknown class falls back to a known model_type
    assert family_of({"architectures": ["MyLlama"], "model_type": "llama"}) is by_name["llama"]


# --- one line naming the field, the value and the rule ---------------------------------------------------------------
@pytest.mark.parametrize("changes, message", [
    (dict(n_group=3), "n_group=3 must divide n_routed_experts=8"),
    (dict(n_group=2, topk_group=3), "topk_group=3 must not exceed n_group=2"),
    # 4 groups of 2 experts, one group allowed: 2 experts for num_experts_per_tok 3
    (dict(n_group=4, topk_group=1, num_experts_per_tok=3),
     "topk_group=1 groups of n_routed_experts/n_group=2 experts must hold num_experts_per_tok=3"),
    (dict(scoring_func="relu"), "scoring_func='relu' must be softmax or sigmoid"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9 must not exceed n_routed_experts=8"),
    (dict(first_k_dense_replace=7), "first_k_dense_replace=7 must not exceed num_hidden_layers=6"),
    (dict(tie_word_embeddings="yes"), "tie_word_embeddings='yes' must be true or false"),
    (dict(hidden_size=0), "hidden_size=0 must be a positive integer"),
    (dict(n_shared_experts=-1), "n_shared_experts=-1 must be an integer >= 0"),
    (dict(num_hidden_layers=2**16 + 1), r"num_hidden_layers=65537 exceeds 2\^16"),
    (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [128]}),
     r"quantization_config.weight_block_size=\[128\] must be two integers"),
])
def test_a_bad_deepseek_config_is_one_line(changes, message):
    with pytest.raises(ConfigError, match=message) as e:
        ds(**changes)
    assert "\n" not in str(e.value)


def test_a_missing_field_is_named():
    d = dict(DS)
    del d["kv_lora_rank"], d["vocab_size"]
    with pytest.raises(ConfigError, match="model config ds is missing required field"):
        model_from_dict(d, name="ds")
    with pytest.raises(ConfigError, match=r"\(llama\) is missing required field\(s\): num_key_value_heads"):
        model_from_dict({k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}, name="l")


@pytest.mark.parametrize("config, message", [
    ({**LLAMA, "num_key_value_heads": 4}, "num_key_value_heads=4 must divide num_attention_heads=6"),
    ({**LLAMA, "hidden_size": 25}, "head_dim=null needs num_attention_heads=6 to divide hidden_size=25"),
    ({**LLAMA, "vocab_size": None}, r"vocab_size=None must be a positive integer \(llama\)"),
    ({**LLAMA, "attention_bias": 1}, "attention_bias=1 must be true or false"),
    ({**LLAMA, "hidden_act": ""}, "hidden_act='' must be the name of an activation function"),
    ({**MIXTRAL, "num_experts_per_tok": 5}, "num_experts_per_tok=5 must not exceed the 4 experts"),
    ({**MIXTRAL, "decoder_sparse_step": 2}, "decoder_sparse_step=2: memlib reads MoE models whose every layer"),
    ({**MIXTRAL, "mlp_only_layers": [0]}, r"mlp_only_layers=\[0\]: memlib reads MoE models"),
    ({"architectures": "LlamaForCausalLM"}, "architectures='LlamaForCausalLM' must be a non-empty list"),
    ({"model_type": 3}, "model_type=3 must be a string"),
    ({"architectures": ["BertModel"]}, "architectures=\\['BertModel'\\] of model config x is not an architecture"),
    ({"model_type": "bert"}, "model_type='bert' of model config x is not an architecture memlib knows"),
])
def test_a_bad_family_config_is_one_line(config, message):
    with pytest.raises(ConfigError, match=message) as e:
        model_from_dict(config, name="x")
    assert "\n" not in str(e.value)
