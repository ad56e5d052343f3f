"""The ZeRO chapter's module: every table and value for DeepSeek-V3 and for other models, and no
DeepSeek-V3 number in another model's chapter."""
from __future__ import annotations

import pytest

from memlib import estimate
from memlib.paper import paper_training
from memlib.report import ch05_zero as ch

#: totals of the DeepSeek-V3 chapter that must not appear in another model's
V3_NUMBERS = ("81.50", "40.45", "19.92", "9.66", "741,009,408", "6,250,364,928", "81.54", "40.46")


def chapter_text(model: str) -> str:
    est = estimate(model, paper_training(model))
    parts = [ch.notation(est), ch.table7(est), ch.recipes_table(), ch.sharding_table(est), ch.table8(est),
             ch.ep_table(est)]
    parts += list(ch.values(est).values()) + list(ch.paper_values(est).values()) + list(ch.ep_values(est).values())
    parts += list(ch.problem_values(est).values())
    return "\n".join(parts)


def test_deepseek_v3_chapter_has_the_papers_numbers():
    text = chapter_text("deepseek-v3")
    for n in ("81.50", "40.45", "19.92", "9.66", "741,009,408", "81.54"):
        assert n in text, n


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_another_models_chapter_has_no_deepseek_v3_number(model):
    est = estimate(model, paper_training(model))
    assert ch.paper_values(est) == {}
    text = chapter_text(model)
    assert not [n for n in V3_NUMBERS if n in text]


def test_the_figure_draws():
    import matplotlib

    matplotlib.use("Agg")
    fig = ch.states_figure(estimate("deepseek-v3", paper_training("deepseek-v3")))
    assert len(fig.axes[0].patches) == 12                                        # 4 ZeRO stages x 3 states


def test_paper_keys_are_the_paper_values_keys():
    """glue_paper glues placeholders under PAPER_KEYS for another model: they must be every key the
    paper's book glues, or that model's build would miss one."""
    assert set(ch.paper_values(estimate("deepseek-v3", paper_training("deepseek-v3")))) == set(ch.PAPER_KEYS)


@pytest.mark.parametrize("model", ["deepseek-v3", "mixtral-8x7b", "llama-3-8b"])
def test_the_problems_difference_is_that_of_the_printed_totals(model):
    """A reader who subtracts the printed totals finds the printed difference (Llama-3-8B: 2.85 GiB against 2.80 GiB
    is 0.05 GiB more; the exact bytes differ by 0.056 GiB, printed 0.06)."""
    est = estimate(model, paper_training(model))
    v, p = ch.values(est), ch.problem_values(est)
    gib = [float(x.split()[0]) for x in (p["p1_total"], v["total_os"], p["p1_delta"])]
    assert round(gib[0] - gib[1], 2) == gib[2]


@pytest.mark.parametrize("model", ["deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_megatron_cores_rule_is_never_said_to_need_what_the_papers_needs(model):
    """Mixtral's router is 65,536 parameters a stage: Megatron-Core's rule saves 48 KiB, which in GiB prints as the
    paper's rule's 2.54 GiB ("lowers ZeRO-1 to 2.54 GiB" from 2.54 GiB); the text then gives the saving in bytes."""
    est = estimate(model, paper_training(model))
    v, e = ch.values(est), ch.ep_values(est)
    printed = (v["total_os"], v["total_os_g_params"])
    assert not [x for x in printed if x in v["megatron_clause"] or x in v["megatron_lowers"]]
    assert e["paper_first"] != e["paper_last"] or e["paper_rises"] == "never rise"


def test_a_dense_models_sharded_count_has_no_expert_term():
    """Llama-3-8B has no expert parameters: eq. (5.1) is the ceiling of P over DP CP (15,024,640 on its 32 copies),
    with no P_e, no EDP; the prose substitutes P alone."""
    from memlib.formulas import equation, value

    latex = equation("states.sharded", "llama-3-8b")
    assert "EDP" not in latex and "P_{e}" not in latex and "P_{ne}" not in latex
    assert value("states.sharded", "llama-3-8b") == 480_788_480 // 32 == 15_024_640
    assert ch.count_words(estimate("llama-3-8b", paper_training("llama-3-8b")))["counts"] == "$P$"
    assert "EDP" in equation("states.sharded", "mixtral-8x7b")
