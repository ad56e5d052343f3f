"""The architecture chapter's module: every table and value for DeepSeek-V3, V2 and V2-Lite, the
model's own numbers in prose, the shipped models side by side in every book."""
from __future__ import annotations

import pytest

from memlib import estimate, load_model
from memlib.paper import paper_training
from memlib.report import ch02_architecture as ch
from memlib.report.format import model_name

MODELS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")
#: DeepSeek-V3's numbers in this chapter's prose and per-model tables (its MTP module, routed
#: experts in all, the width h)
V3_NUMBERS = ("11,610,067,968", "14,848", "7,168", "102,760,448")


def est(model: str):
    return estimate(model, paper_training(model))


def per_model_text(model: str) -> str:
    e = est(model)
    parts = [ch.notation(e), ch.attention_table(e), ch.mtp_table(e), *ch.values(e).values(),
             *ch.mla_values(e).values(), *ch.other_values(e).values()]
    return "\n".join(parts)


@pytest.mark.parametrize("model", MODELS)
def test_every_function_runs(model):
    e = est(model)
    for table in (ch.notation(e), ch.attention_table(e), ch.layer_pattern_table(e), ch.model_fields_table(e),
                  ch.mtp_table(e)):
        assert table.startswith("| ")
    assert ch.values(e)["model"] in ch.model_fields_table(e)
    assert ch.other_values(e)["name"] != ch.values(e)["model"]


def test_deepseek_v3_values():
    v = {**ch.values(est("deepseek-v3")), **ch.mla_values(est("deepseek-v3"))}
    assert (v["l"], v["k_dense"], v["moe_layers"], v["N"], v["N_s"], v["n_mtp"]) == ("61", "3", "58", "256", "1", "1")
    assert (v["qk_width"], v["rope_share"], v["kv_cache_width"], v["mha_kv_width"]) == ("192", "33.3%", "576", "40,960")
    assert v["mtp_module"] == v["mtp_own"] == "11,610,067,968" and v["router_bias"] == "has such a buffer"
    assert v["mla_matrices"] == "eight matrices" and v["d_cq"] == "1,536" and v["head_dims"] == "the same"
    assert ch.other_values(est("deepseek-v3"))["routed_total"] == "1,664"          # V2-Lite: 26 x 64
    assert not [n for n in V3_NUMBERS if n not in per_model_text("deepseek-v3")]


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_another_models_chapter_is_about_that_model(model):
    assert not [n for n in V3_NUMBERS if n in per_model_text(model)]
    v = ch.values(est(model))
    assert v["router_bias"] == "has no such buffer" and v["n_mtp"] == "0" and v["mtp_own"] == "0"


def test_v2_lite_has_no_query_compression():
    v = ch.mla_values(est("deepseek-v2-lite"))
    assert v["mla_matrices"] == "seven matrices" and v["mla_norms"] == "one latent RMSNorm" and v["attention_beside"] == ""
    assert ch.other_values(est("deepseek-v2-lite"))["name"] == "DeepSeek-V2"
    # its own tensors only: no query latent of another model in the book of a model without one
    table = ch.attention_table(est("deepseek-v2-lite"))
    assert "$W^{Q}$" in table and "W^{DQ}" not in table and "DeepSeek-V2 " not in table.replace("V2-Lite", "")
    # DeepSeek-V3's book sets V2-Lite's direct query projection beside its own query latent
    v3 = ch.attention_table(est("deepseek-v3"))
    assert "$W^{Q}$" in v3 and "W^{DQ}" in v3 and "DeepSeek-V2-Lite" in v3
    assert ch.mla_values(est("deepseek-v3"))["attention_beside"] == (
        ", beside DeepSeek-V2-Lite's, which projects its queries the other way")


def test_the_query_equation_is_the_models_own():
    """V2-Lite projects h_t to its queries (W^Q, W^QR reading h_t); V3 up-projects its query latent c^Q_t; a model
    without a query latent has no equation for one (a one-line error naming the formula)."""
    from memlib.config import ConfigError
    from memlib.formulas import equation

    lite, v3 = equation("mla.q", "deepseek-v2-lite"), equation("mla.q", "deepseek-v3")
    assert "W^{Q} h_t" in lite and r"\mathrm{RoPE}(W^{QR} h_t)" in lite and "c^Q" not in lite
    assert "W^{UQ} c^Q_t" in v3 and r"\mathrm{RoPE}(W^{QR} c^Q_t)" in v3
    with pytest.raises(ConfigError, match="formula=mla.cq: deepseek-v2-lite compresses no query"):
        equation("mla.cq", "deepseek-v2-lite")


def test_the_comparison_shows_every_preset_in_every_book():
    p = ch.preset_values()
    assert p["bias_presets"] == "DeepSeek-V3" and p["lite_q_lora"] == "null" and p["v2_router_bias"] == "has no"
    assert p["equal_head_dims"] == "DeepSeek-V3, DeepSeek-V2, DeepSeek-V2-Lite"
    for model in MODELS:
        table = ch.model_fields_table(est(model))
        assert all(name in table for name in ("DeepSeek-V3", "DeepSeek-V2", "DeepSeek-V2-Lite"))
        assert "dense 0–2, MoE 3–60" in ch.layer_pattern_table(est(model))


@pytest.mark.parametrize("model", ["mixtral-8x7b", "llama-3-8b"])
def test_another_architecture_says_what_it_has(model):
    """A model without MLA: the chapter's general numbers, and a note naming its attention and FFN
    (the MLA numbers are glued as placeholders by glue_deepseek, in blocks its book drops)."""
    e = est(model)
    v = ch.values(e)
    assert v["model"] == model_name(model) and "grouped-query attention (GQA: 32 query heads, 8 key-value heads of 128)" in v["note"]
    assert ("Mixtral's top-k MoE" in v["note"]) == (model == "mixtral-8x7b")
    assert ("a dense SwiGLU FFN in every layer" in v["note"]) == (model == "llama-3-8b")
    assert v["N"] == ("8" if model == "mixtral-8x7b" else "0") and v["N_s"] == "0"
    assert "every section applies" in ch.values(est("deepseek-v2-lite"))["note"]


def test_the_layers_sentence_counts_shared_experts_in_the_right_number():
    """'1 shared expert', '2 shared experts'; no shared experts named for Mixtral, no MoE layer for Llama."""
    from memlib.report.ch02_architecture import _layers_sentence
    from memlib.scenarios import models as sm

    said = {n: _layers_sentence(load_model(n), sm.preset_summary(load_model(n)))
            for n in ("deepseek-v3", "deepseek-v2", "mixtral-8x7b", "llama-3-8b")}
    assert "256 routed experts and 1 shared expert," in said["deepseek-v3"]
    assert "160 routed experts and 2 shared experts," in said["deepseek-v2"]
    assert "shared" not in said["mixtral-8x7b"] and said["llama-3-8b"].endswith("32 decoder layers, all dense.")
