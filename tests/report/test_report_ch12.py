"""Chapter 12, "Other architectures": its values, equations, tables and figure format
memlib.scenarios.architectures for every preset, whatever model the book is built for."""
from __future__ import annotations

import re

import matplotlib
import pytest

from memlib.config import PRESETS
from memlib.report import ch12_architectures as ch
from memlib.report.figures import CATEGORY_COLORS, CATEGORY_LABELS
from memlib.report.format import model_name


@pytest.fixture(scope="module")
def vals():
    return ch.values()


def test_values_name_the_pairs_and_the_mla_split(vals):
    assert vals["pairs"] == "Llama-3-8B with Mixtral-8x7B (×1.60); Llama-3-70B with Mixtral-8x22B (×1.80)"
    assert vals["unpaired"] == "Llama-3.1-405B" and vals["n_presets"] == "12"
    # DeepSeek-V3, paper profile: 2 (d_c' + d_c) = 4,096 bytes of latents, 4 n_h d_hR = 32,768 of RoPE parts
    assert vals["v3_latents_paper"] == "4.00 KiB" and vals["v3_rope_paper"] == "32.00 KiB"
    # keys and values of 128 heads against Llama-3-70B's 8 groups: 81,920 against 4,096 bytes
    assert vals["v3_kv"] == "80.00 KiB" and vals["l70_kv"] == "4.00 KiB" and vals["v3_over_l70_kv"] == "20.0"
    assert all(v for v in vals.values())


def test_values_for_another_book_model_change_only_its_name(vals):
    other = ch.values("deepseek-v2-lite")
    assert other["book_model"] == "DeepSeek-V2-Lite"
    assert {k: v for k, v in other.items() if k != "book_model"} == {k: v for k, v in vals.items() if k != "book_model"}


def test_the_equations_are_the_registrys_of_the_ledger():
    """Chapter 12's four equations are registry formulas (numbered 12.1-12.4), each for its example model."""
    from memlib.formulas import FORMULAS, TOKEN_EXAMPLES, equation

    names = ["attention_token.gqa", "attention_token.mla", "attention_token.gqa_megatron",
             "attention_token.mla_megatron"]
    assert [FORMULAS[n].number for n in names] == ["12.1", "12.2", "12.3", "12.4"]
    eq = {n: equation(n, TOKEN_EXAMPLES[FORMULAS[n].attention]) for n in names}
    assert eq["attention_token.gqa"].startswith(r"\frac{M^{A}_{\mathrm{GQA}}}{b\,s} = ")
    assert "5 n_{h} s" in eq["attention_token.gqa"]
    assert "s" not in eq["attention_token.gqa_megatron"].split("=")[1].replace("\\", "")
    assert "d_{c'}" in eq["attention_token.mla"] and "n_{kv}" in eq["attention_token.gqa"]


def test_tables_list_every_preset():
    assert all(f"| {model_name(p)} |" in ch.presets_table() for p in PRESETS)
    # the attention table names every preset once, those with the same row together
    att = ch.attention_table()
    names = [n for line in att.splitlines()[2:] for n in line.split(" | ")[0].lstrip("| ").split(", ")]
    assert sorted(names) == sorted(model_name(p) for p in PRESETS)
    assert "| Llama-3-8B, Mixtral-8x7B | GQA |" in att
    mla = ch.mla_table()
    assert "| DeepSeek-V3 | megatron | 196.51 | 8.01 | 32.00 | 80.00 | 131.88 | 64.63 |" in mla
    assert "Llama" not in mla and "Mixtral" not in mla
    assert "| DeepSeek-V2-Lite, Moonlight-16B-A3B | paper |" in mla   # identical rows printed once
    pairs = ch.pairs_table()
    assert pairs.count("\n") == 5 and "PP16@TP2@EP1@ETP1" in pairs and "PP16@TP2@EP8@ETP1" in pairs


def test_figure_draws_the_categories_in_their_colours():
    matplotlib.use("Agg")
    fig = ch.pairs_figure()
    seen = {}
    for ax in fig.axes:
        for c in ax.containers:
            if c.get_label():
                seen[c.get_label()] = matplotlib.colors.to_hex(c.patches[0].get_facecolor())
    assert seen == {CATEGORY_LABELS[k]: CATEGORY_COLORS[k].lower() for k in ch.FIGURE_CATEGORIES}


def test_glue_keys_are_distinct():
    """Every key the chapter glues (the values under ``oa_``, the equations, tables and figure) once."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "notebooks" / "12_other_architectures.md").read_text()
    others = re.findall(r'glue_(?:md|figure)\("(\w+)"', text)
    keys = [f"oa_{k}" for k in ch.values()] + others
    assert len(keys) == len(set(keys)) and "oa_pairs_table" in others


def test_one_unit_and_one_precision_per_quantity():
    """Issue 24: the text gave a model's bytes per token in KiB beside the tables' MiB/token, and one decimal beside
    two. Per layer in KiB, per model in MiB, per device in GiB, two decimals each, in the text as in the tables."""
    v = ch.values()
    two = r"[\d,]+\.\d\d"
    for k, text in v.items():
        if k.endswith("_token"):
            assert re.fullmatch(two + " MiB", text), (k, text)
        elif k.endswith("_peak"):
            assert re.fullmatch(two + " GiB", text), (k, text)
        elif k.startswith("v3_") and k not in ("v3_n_h", "v3_over_l70_kv"):
            assert re.fullmatch(two + " KiB", text), (k, text)
    needs = ch.presets_table().split("\n\n")[1].splitlines()
    assert "(MiB/token)" in needs[0] and "(KiB/token)" in needs[0]
    for row in needs[2:]:
        cells = [c.strip() for c in row.split("|")[2:-1]]
        assert all(re.fullmatch(two, c) for c in cells), row
    pairs = ch.pairs_table().splitlines()
    assert "(MiB/token)" in pairs[0] and all(re.fullmatch(two, r.split("|")[-2].strip()) for r in pairs[2:])
