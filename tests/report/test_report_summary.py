"""The summary page's module: every numbered equation once, in the book's order; DeepSeek-V3's knobs."""
from __future__ import annotations

import re

from memlib.formulas import book_formulas
from memlib.report import summary as ch
from memlib.scenarios import deepseek as ds


def test_every_numbered_equation_is_typeset_with_its_value_in_order():
    text = ch.equations("deepseek-v3")
    numbers = re.findall(r"^\*\*\(([\d.]+)\)\*\*", text, re.M)
    # every numbered equation but those of another attention than DeepSeek-V3's MLA (chapter 12's GQA per token)
    assert numbers == [f.number for f in book_formulas() if f.attention in (None, "mla")]
    assert "12.1" not in numbers and "12.2" in numbers
    assert text.count("$$") == 2 * len(numbers)
    # values from memlib, checked by hand: 3 h h_E = 3 x 7168 x 2048; DeepSeek-V3's 671B; 14 bytes per parameter
    assert "(`params.expert`): **44,040,192**\n\n$$\nP_{\\mathrm{expert}} = 3 h h_{E}\n$$" in text
    assert "(`params.total`): **671,026,404,352**" in text
    assert "(`states.zero0`): **87,505,108,992 bytes, 81.50 GiB**" in text
    assert "(`activations.paper.mla_full`): **29,360,128 bytes, 28.00 MiB**" in text


def test_a_model_without_mla_shows_no_mla_equation():
    text = ch.equations("llama-3-8b")
    assert "(`mla." not in text and "(`mtp." not in text and "(`params.total`)" in text


def test_values_are_exact_and_agree_with_each_other():
    from memlib.formulas import value
    assert value("params.expert") == 3 * 7168 * 2048
    assert value("states.zero0") == 14 * value("static.device")        # 2 + 4 + 8 bytes per parameter
    assert value("parallel.devices") == 1024 and value("parallel.edp") == 8
    assert value("params.total") == 671_026_404_352


def test_glossary_values_come_from_the_registries():
    g = ch.glossary_values()
    assert g["policy_selective"] == "`core_attn`" and g["policy_deepseek"] == "`layernorm`, `mla_up_proj`"
    assert g["zero_stages"].startswith("ZeRO-0: none; ZeRO-1: os;")
    assert "$W^{QR}$" in g["profile_paper"] and "W^QR" not in g["profile_paper"]


def test_knob_table_for_deepseek_v3():
    rows = ds.ablation("deepseek-v3", ds.deepseek_recipe("deepseek-v3"))
    table = ch.knob_table(rows)
    assert "| naive baseline |" in table and "| 140.33 GiB | — | no |" in table
    # the change is the difference of the printed totals, 112.15 - 70.62 (the exact bytes differ by 41.54 GiB)
    assert "| 112.15 GiB |" in table and table.strip().endswith("| 70.62 GiB | −41.53 GiB | yes |")
    assert "fits the H800" in table


def test_knob_values_name_the_model_or_say_the_recipe_does_not_apply():
    import tiny as T
    v = ch.knob_values("deepseek-v2-lite")
    assert v["model"] == "DeepSeek-V2-Lite" and "| naive baseline |" in v["table"]
    one = ch.knob_values(T.tiny(num_hidden_layers=1, first_k_dense_replace=0))
    assert one["table"].startswith("DeepSeek-V3's recipe does not apply to tiny: num_hidden_layers=1")


def test_each_model_is_described_in_the_words_of_its_own_blocks():
    """Mixtral: four attention matrices, no shared expert, no dense FFN, no MTP; Llama: no MoE equation at all;
    V2-Lite: seven matrices (no query compression) and one latent norm; DeepSeek-V3's descriptions unchanged."""
    from memlib import load_model
    from memlib.model.blocks import words_of_lacking_blocks

    mixtral = ch.equations("mixtral-8x7b")
    assert "attention parameters of one layer (GQA: four matrices) (`params.mla`)" in mixtral
    assert "**(3.3)** router and routed experts of one MoE layer" in mixtral     # its chapter 3's number
    assert "(`params.dense_ffn`)" not in mixtral and "(`params.total`): **" in mixtral
    assert "parameters of the main model (`params.total`)" in mixtral           # nothing left out to name
    assert words_of_lacking_blocks(mixtral, load_model("mixtral-8x7b")) == []
    llama = ch.equations("llama-3-8b")
    assert "(`params.moe`)" not in llama and "(`parallel.edp`)" not in llama and "(`params.expert`)" not in llama
    assert "**(6.2)** FFN activation bytes" in llama
    assert "(`static.device`)" not in llama          # chapter 4's Table 6 section is on blocks Llama lacks
    assert "(MLA: seven matrices and one latent norm)" in ch.equations("deepseek-v2-lite")
    v3 = ch.equations("deepseek-v3")
    assert "(MLA: eight matrices and two latent norms)" in v3 and "main model (no MTP, no buffers)" in v3


def test_the_glossary_and_the_fit_matrix_name_the_models_own_modules():
    from memlib import load_model
    from memlib.scenarios.together import MODULE_LIST, model_policies

    assert ch.glossary_values("mixtral-8x7b")["policy_deepseek"] == "`layernorm`"
    assert "W^{UQ}" not in ch.glossary_values("llama-3-8b")["profile_paper"]
    assert model_policies(load_model("deepseek-v3"))[-1] == MODULE_LIST
    assert model_policies(load_model("mixtral-8x7b"))[-1] == "core_attn,layernorm,moe_act"
    assert model_policies(load_model("llama-3-8b"))[-1] == "core_attn,layernorm"


def test_an_equation_that_counts_nothing_for_the_model_is_left_out():
    """Grouped-query attention has no down-projection that TP replicates: (4.4) is 0 for Mixtral, and the page
    would print 'P^repl = 0'; DeepSeek-V3 replicates its down-projections and keeps (4.4)."""
    assert "(`static.mla_replicated`)" not in ch.equations("mixtral-8x7b")
    assert "(`static.mla_replicated`): **" in ch.equations("deepseek-v3")


def test_an_equation_of_a_width_the_model_leaves_null_is_left_out():
    # DeepSeek-V2-Lite projects its queries directly (q_lora_rank: null): no query latent c^Q of width d_c', and
    # its chapter 2 numbers its query projection (2.1), the key-value latent (2.2)
    lite, v3 = ch.equations("deepseek-v2-lite"), ch.equations("deepseek-v3")
    assert "c_t^{Q}" in v3 and "c^Q_t" in v3 and "c_t^{Q}" not in lite and "c^Q" not in lite
    q = lite.split("**(2.1)**")[1].split("**(2.2)**")
    assert "W^{Q} h_t" in q[0] and "W^{DKV} h_t" in q[1] and "**(2.5)**" in lite and "**(2.6)**" not in lite


def test_equation_numbers_follow_what_each_book_shows():
    """Read from the chapters' sources as Sphinx numbers them: a dense grouped-query model's chapter 3 leaves out the
    MoE and expert equations (3.4 and 3.5 of the DeepSeek-V3 book), so its total is (3.4); its chapter 4 keeps only
    the devices' count, the rest sits in sections on blocks it lacks."""
    from memlib.report.book import equation_numbers

    v3, llama = equation_numbers("deepseek-v3"), equation_numbers("llama-3-8b")
    assert v3["eq_params_total"] == "3.6" and v3["eq_static_mla_replicated"] == "4.4"
    assert llama["eq_params_total"] == "3.4" and llama["eq_parallel_devices"] == "4.1"
    assert "eq_params_moe" not in llama and "eq_static_moe" not in llama and "eq_mla_cq" not in llama
    assert "(3.4)** " in ch.equations("llama-3-8b").split("(`params.total`)")[0][-300:]
