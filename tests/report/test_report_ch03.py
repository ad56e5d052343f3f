"""The parameters chapter's module: every table and value for DeepSeek-V3, V2 and V2-Lite, the
paper's printed values and DeepSeek-V3's statements only in DeepSeek-V3's chapter."""
from __future__ import annotations

import pytest

from memlib import estimate
from memlib.paper import paper_training
from memlib.report import ch03_parameters as ch

MODELS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")
#: totals of the DeepSeek-V3 chapter that must not appear in another model's
V3_NUMBERS = ("671,026,404,352", "671.03B", "187,107,328", "14,184,415,232", "46,029,144,064", "37,552,282,624",
              "11,507,286,016", "14.16B", "21.44", "36.7B", "685B", "11,320,164,352")


def est(model: str):
    return estimate(model, paper_training(model))


def per_model_text(model: str) -> str:
    """Everything the chapter shows about its model (the comparison of every shipped model, which
    every book shows whole, apart)."""
    e = est(model)
    parts = [ch.notation(e), ch.matrix_table(e), ch.layer_table(e), ch.stage_table(e), ch.official_table(e),
             *ch.values(e).values(), *ch.paper_values(e).values(), *ch.problem_values(e).values()]
    return "\n".join(parts)


@pytest.mark.parametrize("model", MODELS)
def test_every_function_runs(model):
    import matplotlib

    matplotlib.use("Agg")
    e = est(model)
    assert per_model_text(model) and ch.totals_table(e).count("\n") == 4              # header, rule, 3 models
    fig = ch.stage_figure(e)
    assert len(fig.axes[0].get_xticklabels()) == e.train.pp


def test_deepseek_v3_chapter_has_the_papers_numbers():
    text = per_model_text("deepseek-v3")
    assert not [n for n in V3_NUMBERS if n not in text]
    p = ch.paper_values(est("deepseek-v3"))
    assert p["mla_exact"] == p["moe_ffn_exact"] == "exactly" and p["layout_is_papers"] == "is"
    assert p["disagree"] == "the GiB of layers 3–59 and the count of stage 0"
    assert p["stage0_sum_terms"] == "1.5B + 0.58B + 0.58B + 11.5B = 14.16B" and p["stage0_sum_is_printed"] == "is"
    assert p["card_relation"] == "truncates to it" and p["doc_gap"] == "0.07B"
    assert p["mtp_block_relation"] == "rounds and truncates to it" and p["checkpoint_b"] == "684.49B"
    v = ch.values(est("deepseek-v3"))
    assert v["largest_match"] == "the heaviest stages are exactly these" and v["stage_max_stages"] == "1–14"
    assert "| 3–59 | MLA + router + experts + norms | 11,507,286,016 | 21.43 | 11.5B | 21.44 |" in ch.layer_table(
        est("deepseek-v3"))


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_another_models_chapter_has_no_deepseek_v3_number(model):
    e = est(model)
    assert ch.paper_values(e) == {}
    assert "paper:" not in ch.layer_table(e) and "paper:" not in ch.stage_table(e)
    text = per_model_text(model)
    assert not [n for n in V3_NUMBERS if n in text]
    # the comparison of the shipped models shows DeepSeek-V3 too, but none of its exact counts
    assert "DeepSeek-V3" in ch.totals_table(e) and "671,026,404,352" not in ch.totals_table(e)


def test_v2_stages_are_computed_not_assumed():
    v = ch.values(est("deepseek-v2"))
    assert v["largest_match"] == "the heaviest stages are not exactly these" and v["stage_max_stages"] == "2–13"
    assert v["moe_stages"] == "1–14" and v["layout"] == "3 × 2, 4 × 12, 3 × 2"
    assert "236B" in ch.official_table(est("deepseek-v2"))


def test_problems():
    p = ch.problem_values(est("deepseek-v3"))
    assert (p["lite_act_b"], p["lite_act_ne_b"], p["lite_official_act"]) == ("2.66B", "2.45B", "2.4B")
    assert p["lite_closest"] == "without the embedding" and p["lite_ne_relation"] == "truncates to it"
    assert p["lite_ne_rounded"] == "2.5B" and p["tie_saving"] == "926,679,040" and p["tie_saving_share"] == "0.14%"
    assert ch.problem_values(est("deepseek-v2"))["tie_saving"] == "524,288,000"


def test_paper_keys_are_the_paper_values_keys():
    """glue_paper glues placeholders under PAPER_KEYS for another model: they must be every key the
    paper's book glues, or that model's build would miss one."""
    assert set(ch.paper_values(estimate("deepseek-v3", paper_training("deepseek-v3")))) == set(ch.PAPER_KEYS)
