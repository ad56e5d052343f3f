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
             ch.ep_table(est), ch.errata_md(est)]
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
    assert ch.paper_values(est) == {} and ch.errata_md(est).count("\n") == 1      # header only
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
