"""The static-memory chapter's module: every table and value for DeepSeek-V3 and for other models, no
DeepSeek-V3 number in another model's chapter, and every value the chapter's prose shows glued for
every model (a ``{glue:text}`` role is resolved even inside an ``{only}`` block the build drops)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from memlib import estimate
from memlib.paper import paper_training
from memlib.report import ch04_static as ch

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "04_static_memory.md"
MODELS = ["deepseek-v3", "deepseek-v2", "deepseek-v2-lite", "mixtral-8x7b", "llama-3-8b"]

#: DeepSeek-V3's numbers in this chapter (Table 6, §3, the stages, the conventions, the problems)
V3_NUMBERS = ("6,250,364,928", "11.64", "429,654,016", "5,820,645,376", "12,500,729,856", "318,767,104",
              "110,886,912", "859,308,032", "10.84", "0.82", "2,025,937,920", "4,046,647,296", "6,137,118,720",
              "113,246,208", "3,431,792,640", "748,421,120", "6,569,132,032")


@pytest.fixture(scope="module", params=MODELS)
def est(request):
    return estimate(request.param, paper_training(request.param))


def glued(est) -> dict[str, str]:
    """Every value the notebook glues under the ``static`` prefix, as its cells glue them."""
    from memlib.model.architecture import is_deepseek_architecture

    out = {}
    # glue_deepseek: the problem on more EP for DeepSeekMoE's experts, placeholders (the paper's keys) otherwise
    ep = ch.ep_problem_values(est if is_deepseek_architecture(est.model) else
                              estimate("deepseek-v3", paper_training("deepseek-v3")))
    for values in (ch.values(est), ch.paper_values(est), ch.absent_paper_values(est), ch.problem_values(est), ep,
                   ch.device_values(est, zero=1)):
        out.update({f"static_{k}": v for k, v in values.items()})
    return out


def chapter_text(est) -> str:
    parts = [ch.notation(est), ch.table5(est), ch.tensor_table(est), ch.table6(est), ch.stage_table(est),
             ch.split_table(est)]
    parts += list(ch.values(est).values()) + list(ch.paper_values(est).values()) + list(ch.problem_values(est).values())
    if est.model.attention == "mla":
        parts += list(ch.ep_problem_values(est).values())
    return "\n".join(parts)


def test_every_function_runs_and_every_prose_key_is_glued(est):
    keys = glued(est)
    used = set(re.findall(r"\{glue:text\}`(static_\w+)`", NOTEBOOK.read_text(encoding="utf-8")))
    assert used and not used - set(keys), sorted(used - set(keys))
    assert all(isinstance(v, str) and v for v in keys.values())


def test_deepseek_v3_chapter_has_the_papers_numbers():
    est = estimate("deepseek-v3", paper_training("deepseek-v3"))
    text = chapter_text(est)
    for n in V3_NUMBERS:
        assert n in text, n
    pv = ch.paper_values(est)
    assert tuple(pv) == ch.PAPER_KEYS and ch.absent_paper_values(est) == {}
    assert pv["t6_counts"] == "every parameter and byte count equals the paper's"
    assert pv["t6_slips"] == "MLA and non-MoE" and pv["printed_mla_gb"] == "0.82"
    assert "paper prints" in ch.table5(est) and "parameters (paper)" in ch.table6(est)
    v = ch.values(est)
    assert (v["largest_stages"], v["analysed_largest"], v["expert_majority"]) == (
        "stages 1–14", "is one of them", "every stage except stage 0")
    assert v["last_change"].startswith("grows") and v["mtp_note"] == "this model has one MTP module"


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_another_models_chapter_has_no_deepseek_v3_number(model):
    est = estimate(model, paper_training(model))
    assert ch.paper_values(est) == {} and set(ch.absent_paper_values(est)) == set(ch.PAPER_KEYS)
    assert "paper" not in ch.table5(est) and "paper" not in ch.table6(est)
    text = chapter_text(est)
    assert not [n for n in V3_NUMBERS if n in text]
    v = ch.values(est)
    assert v["model"] != "DeepSeek-V3" and v["mtp_note"] == "this model has none"
    assert v["last_change"].startswith("shrinks") and v["analysed_largest"] == "stores less"


def test_deepseek_v2_lite_words():
    v = ch.values(estimate("deepseek-v2-lite", paper_training("deepseek-v2-lite")))
    assert v["largest_stages"] == "stage 15" and v["expert_majority"] == "every stage except stages 0 and 15"
    assert v["shared_word"] == "shared experts" and v["first_holds"] == "one dense layer and the embedding"
    assert "runs out of layers" in v["layout_rule"]


def test_the_figure_draws(est):
    import matplotlib

    matplotlib.use("Agg")
    fig = ch.stages_figure(est)
    top, bottom = fig.axes[:2]
    assert len(top.get_xticks()) == len(bottom.get_xticks()) == est.train.pp
    assert top.patches and bottom.patches
