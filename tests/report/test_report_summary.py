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
    assert table.strip().endswith("| 70.62 GiB | −41.54 GiB | yes |")
    assert "fits the H800" in table


def test_knob_values_name_the_model_or_say_the_recipe_does_not_apply():
    import tiny as T
    v = ch.knob_values("deepseek-v2-lite")
    assert v["model"] == "DeepSeek-V2-Lite" and "| naive baseline |" in v["table"]
    one = ch.knob_values(T.tiny(num_hidden_layers=1, first_k_dense_replace=0))
    assert one["table"].startswith("DeepSeek-V3's recipe does not apply to tiny: num_hidden_layers=1")
