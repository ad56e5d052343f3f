"""Other architectures: per-token attention activations (MLA against GQA), MLA's costs and savings,
dense against MoE pairs, against hand-worked values from the presets' config.json sizes."""
from __future__ import annotations

from fractions import Fraction

import pytest
import sympy as sp

from memlib import estimate
from memlib.config import PRESETS, ConfigError, load_model
from memlib.paper import paper_training
from memlib.model.params import values as model_values
from memlib.scenarios import architectures as A
from memlib.core.symbols import sym

S = A.SEQ_LEN


def test_every_preset_is_in_the_chapter_dense_first():
    assert sorted(A.CHAPTER_PRESETS) == sorted(PRESETS)
    kinds = [(load_model(m).has_moe, load_model(m).attention == "mla") for m in A.CHAPTER_PRESETS]
    assert kinds == sorted(kinds)


def test_llama_3_8b_attention_by_hand_paper():
    # h = 4096, n_h = 32, n_kv = 8, d_head = 128, bf16: norm in/out 2h + 2h, q 2 n_h d, k and v 2 n_kv d each,
    # three s x s tensors per head (2 + 1 + 2 bytes), context 2 n_h d, dropout mask h
    h, n_h, n_kv, d = 4096, 32, 8, 128
    expected = 4 * h + 2 * n_h * d + 4 * n_kv * d + 5 * n_h * S + 2 * n_h * d + h
    entries = A.attention_token("llama-3-8b", "paper")
    assert sum(e.bytes for e in entries) == expected
    assert A.role_bytes(entries)["keys_values"] == 4 * n_kv * d
    assert A.role_bytes(entries)["latents"] == 0 and all(e.rope == 0 for e in entries)


def test_deepseek_v3_mla_split_by_hand_paper():
    # d_c' = 1536, d_c = 512, n_h = 128, d_h = 128, d_h^R = 64, d_v = 128, bf16
    sp_ = A.mla_split("deepseek-v3", "paper")
    assert sp_["latents"] == 2 * (1536 + 512)
    assert sp_["rope"] == 2 * 2 * 128 * 64                      # q^R and the broadcast k^R, per head
    assert sp_["kv_heads"] == 2 * 128 * (128 + 64) + 2 * 128 * 128
    assert sp_["saves"] == sp_["kv_heads"] + sp_["queries"]     # the paper's up-projection recompute drops q, k, v
    assert sp_["cost"] == sp_["latents"] + sp_["rope"] and sp_["total"] - sp_["saves"] == sp_["recomputed"]


def test_deepseek_v3_mla_split_megatron():
    sp_ = A.mla_split("deepseek-v3", "megatron")
    # c^Q and c^KV before and after their norms (bf16) and one fp32 1/rms per token each
    assert sp_["latents"] == 2 * 2 * (1536 + 512) + 2 * 4
    # recomputing keeps [c^KV; k^R] (bf16) and drops q, k, v, the normalised latents, c^KV and the norms' statistics
    dropped = sp_["kv_heads"] + sp_["queries"] + 2 * 1536 + 4 + 2 * 512 + 2 * 512 + 4
    assert sp_["saves"] == dropped - 2 * (512 + 64)


def test_gqa_has_no_mla_split():
    assert A.mla_split("llama-3-70b") is None and A.mla_split("mixtral-8x7b", "megatron") is None


@pytest.mark.parametrize("profile", A.PROFILES)
@pytest.mark.parametrize("model", ["llama-3-8b", "qwen3-30b-a3b", "deepseek-v2-lite", "deepseek-v3"])
def test_the_formula_is_the_ledgers_sum(model, profile):
    m = load_model(model)
    f = A.attention_token_formula(m, profile)
    value = f.xreplace(model_values(m)).xreplace({sym("s"): S})
    assert sp.Rational(value) == sum(e.bytes for e in A.attention_token(m, profile))


def test_the_formulas_shape():
    s, n_h = sym("s"), sym("n_h")
    # the paper keeps s x s scores (5 bytes per head and key), the megatron profile's flash kernel none
    assert sp.expand(A.attention_token_formula("llama-3-8b", "paper")).coeff(s) == 5 * n_h
    assert sp.expand(A.attention_token_formula("deepseek-v3", "megatron")).coeff(s) == 0
    mla = A.attention_token_formula("deepseek-v3", "paper")
    assert {sym("d_c"), sym("d_cq"), sym("d_hR")} <= mla.free_symbols


def test_recompute_drops_and_longer_sequences_cost_more():
    full = sum(e.bytes for e in A.attention_token("deepseek-v2", "paper"))
    sel = sum(e.bytes for e in A.attention_token("deepseek-v2", "paper", "selective"))
    assert sel < full
    longer = sum(e.bytes for e in A.attention_token("deepseek-v2", "paper", seq_len=2 * S))
    assert longer - full == 5 * 128 * S       # 5 bytes per head for each further key


def test_layer_and_model_bytes():
    m = load_model("deepseek-v3")
    dense, moe = A.layer_token_bytes(m, "paper", "dense"), A.layer_token_bytes(m, "paper", "moe")
    assert A.layer_token_bytes(m) == moe
    assert A.model_token_bytes(m) == 3 * dense + 58 * moe
    assert A.model_token_bytes("llama-3-8b", "megatron") == 32 * A.layer_token_bytes("llama-3-8b", "megatron")
    with pytest.raises(ConfigError, match="no moe layer"):
        A.layer_token_bytes("llama-3-8b", kind="moe")


def test_per_token_bytes_are_exact_fractions():
    x = A.layer_token_bytes("qwen3-30b-a3b", "megatron")
    assert isinstance(x, Fraction) and x.denominator > 1      # a one-element tensor per sequence


def test_pairs_nearest_activated():
    pairs = A.equal_activated_pairs()
    assert [(p.dense, p.moe) for p in pairs] == [("llama-3-8b", "mixtral-8x7b"), ("llama-3-70b", "mixtral-8x22b")]
    for p in pairs:
        assert 1 <= p.ratio <= A.PAIR_RATIO
    assert A.equal_activated_pairs(max_ratio=Fraction(1)) == []
    # llama-3.1-405b pairs with Mixtral-8x22B (the largest activated count) only when any ratio is allowed
    wide = A.equal_activated_pairs(max_ratio=Fraction(100))
    assert ("llama-3.1-405b", "mixtral-8x22b") in [(p.dense, p.moe) for p in wide]
    with pytest.raises(ConfigError, match="max_ratio"):
        A.equal_activated_pairs(max_ratio=Fraction(1, 2))


def test_peak_device_is_estimates_largest_stage():
    est = estimate("mixtral-8x7b", paper_training("mixtral-8x7b"))
    pk = A.peak_device("mixtral-8x7b")
    assert pk["allocated"] == max(st.allocated for st in est.stages)
    assert pk["allocated"] == pk["model_states"] + pk["activations"]
    assert pk["model_states"] == pk["parameters"] + pk["gradients"] + pk["optimizer_states"]


def test_dense_model_gets_the_papers_configuration_without_experts():
    t = paper_training("llama-3-8b")
    assert (t.ep, t.tp, t.pp) == (1, 2, 16)
    row = A.preset_row("llama-3-8b")
    assert row["total"] == row["activated"] and row["attention"] == "GQA" and not row["moe"]


def test_moe_rows_activate_fewer_than_they_hold():
    for row in A.preset_rows(["qwen3-30b-a3b", "kimi-k2"]):
        assert row["activated"] < row["total"] and row["moe"]
    assert A.attention_kind("deepseek-v3") == "MLA"


def test_bad_profile_is_a_config_error():
    with pytest.raises(ConfigError, match="profile='hf-eager'"):
        A.attention_token("llama-3-8b", "hf-eager")


@pytest.mark.parametrize("profile", A.PROFILES)
def test_one_expression_per_attention_kind(profile):
    """The chapter shows one equation for GQA (no per-head q/k norms) and one for MLA with q compression."""
    f = A.attention_token_formula
    assert f("llama-3-70b", profile) == f("mixtral-8x22b", profile) == f("llama-3-8b", profile)
    assert f("deepseek-v2", profile) == f("kimi-k2", profile) == f("deepseek-v3", profile)
    assert f("deepseek-v2-lite", profile) != f("deepseek-v3", profile)


def test_pair_facts_follow_the_rows():
    """The chapter's words on each pair come from the rows: the MoE side keeps more per token exactly
    when its per-token bytes are larger, and peaks higher exactly when its peak is larger."""
    for p in A.equal_activated_pairs():
        d, m = A.preset_row(p.dense), A.preset_row(p.moe)
        f = A.pair_facts(p)
        assert f["moe_more_per_token"] == (m["model_megatron"] > d["model_megatron"])
        assert f["moe_higher_peak"] == (m["peak_megatron"] > d["peak_megatron"])
    # today's presets: Mixtral-8x7B keeps more per token than Llama-3-8B; the second pair peaks lower
    facts = [A.pair_facts(p) for p in A.equal_activated_pairs()]
    assert facts[0]["moe_more_per_token"] and facts[0] != facts[1]


def test_a_longer_context_grows_eager_attention_per_token_and_leaves_the_fused_kernel_s_alone():
    # DeepSeek-V3, paper profile (12.2): 2 d_c + 2 d_c' + 4 n_h (d_h + d_h^R + d_v) + 5 h + 5 n_h s bytes per token
    lc = A.longer_context("deepseek-v3", 32_768)
    d_c, d_cq, n_h, d_h, d_hr, d_v, h = 512, 1536, 128, 128, 64, 128, 7168
    assert lc["paper"]["token_long"] == 2 * d_c + 2 * d_cq + 4 * n_h * (d_h + d_hr + d_v) + 5 * h + 5 * n_h * 32_768
    assert lc["paper"]["token"] == lc["paper"]["token_long"] - 5 * n_h * (32_768 - 4_096)
    assert lc["megatron"]["token_long"] == lc["megatron"]["token"]          # (12.4) has no s
    assert lc["megatron"]["sequence_long"] == lc["megatron"]["token"] * 32_768
