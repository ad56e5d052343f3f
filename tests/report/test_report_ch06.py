"""The activations chapter's module: every table, value and figure for DeepSeek-V3 and for other
models, and no DeepSeek-V3 number in another model's chapter."""
from __future__ import annotations

import matplotlib
import pytest

from memlib import estimate
from memlib.paper import activations as pa
from memlib.paper import paper_training
from memlib.paper.activations import routed_count_comparison
from memlib.data.reference import PAPER_ACTIVATION_FORMULAS
from memlib.report import ch06_activations as ch
from memlib.core.symbols import sym

matplotlib.use("Agg")

MODELS = ["deepseek-v3", "deepseek-v2", "deepseek-v2-lite"]

#: numbers of the DeepSeek-V3 chapter that must not appear in another model's: Table 10 (bytes, GiB,
#: MiB), the MLA share, the policy totals, the routed tokens a device holds
V3_NUMBERS = ("24,671,158,272", "235,143,168", "22.98", "23,177,723,904", "1,493,434,368", "224.25", "93.9%",
              "344.65", "326.68", "49.65", "8.97 GiB", "5.69 GiB", "16,384")


@pytest.fixture(scope="module", params=MODELS)
def est(request):
    return estimate(request.param, paper_training(request.param))


_TEXT: dict[str, str] = {}


def chapter_text(est) -> str:
    """Everything the chapter glues, as text (figures excepted)."""
    name = est.model.name
    if name not in _TEXT:
        parts = [ch.notation(est), ch.table9(est), ch.ledger_table(est, "attention"), ch.ledger_table(est, "ffn"),
                 ch.formula_check_table(est), ch.table10_formulas(est), ch.table10(est), ch.korthikanti_table(),
                 ch.policy_table(est)]
        words, fig = ch.microbatch(est)
        matplotlib.pyplot.close(fig)
        for d in (ch.values(est), ch.paper_values(est), ch.korthikanti_values(), ch.problem_values(est), words):
            parts += list(d.values())
        _TEXT[name] = "\n".join(parts)
    return _TEXT[name]


def test_every_function_runs(est):
    assert chapter_text(est)
    assert ch.stage(est) == 1
    for fig in (ch.dataflow_figure(est), ch.seqlen_figure(est)):
        assert fig.axes
        matplotlib.pyplot.close(fig)


def test_deepseek_v3_chapter_has_the_papers_numbers():
    e = estimate("deepseek-v3", paper_training("deepseek-v3"))
    text = chapter_text(e)
    for n in V3_NUMBERS:
        assert n in text, n
    v = ch.values(e)
    assert (v["none_bytes"], v["none_gib"], v["full_bytes"], v["full_mib"]) == \
        ("24,671,158,272", "22.98 GiB", "235,143,168", "224.25 MiB")
    assert (v["crossover"], v["scores_verb"], v["mla_most"], v["paper_tokens"], v["held_tokens"]) == \
        ("610", "dominate", "most", "4,096", "16,384")
    assert ch.paper_values(e) == {"formulas": "nine", "formulas_equal": "all nine equal the ledger's sum",
                                  "formulas_verdict": "reproduces",
                                  "formulas_rounding": "does not act, since the product of the expert- and context-parallel sizes divides a micro-batch's routed token copies"}
    # the formula check says "equal" on every row; the routed-token count the paper's differs from is stated
    # (its erratum is in the appendix, chapter 14)
    table = ch.formula_check_table(e)
    assert table.count("| equal |") == 9 and "differs" not in table
    claim = ch.routed_count_values(routed_count_comparison(e))["rc_claim"]
    assert "16,384" in claim and "4,096" in claim


def test_the_formula_check_says_differs(monkeypatch):
    e = estimate("deepseek-v3", paper_training("deepseek-v3"))
    wrong = {**PAPER_ACTIVATION_FORMULAS, "Table 10": {**PAPER_ACTIVATION_FORMULAS["Table 10"]}}
    wrong["Table 10"]["mla_full"] = 2 * sym("b") * sym("s") * sym("h")
    monkeypatch.setattr(pa, "PAPER_ACTIVATION_FORMULAS", wrong)
    table = ch.formula_check_table(e)
    assert table.count("| equal |") == 8 and table.count("**differs**") == 1
    assert ch.paper_values(e)["formulas_equal"] == "eight of the nine equal the ledger's sum"


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_another_models_chapter_has_no_deepseek_v3_number(model):
    e = estimate(model, paper_training(model))
    assert ch.paper_values(e) == {}
    assert "|" not in ch.formula_check_table(e)                                # not compared
    text = chapter_text(e)
    assert not [n for n in V3_NUMBERS if n in text]
    assert "DeepSeek-V3" not in ch.values(e)["model"]


def test_the_figures_draw():
    e = estimate("deepseek-v3", paper_training("deepseek-v3"))
    fig = ch.dataflow_figure(e)
    assert len(fig.axes[0].patches) == len(pa.ledger_rows(e, "attention")) + len(pa.ledger_rows(e, "moe"))
    matplotlib.pyplot.close(fig)
    _, fig = ch.microbatch(e)
    assert [len(ax.lines) for ax in fig.axes] == [len(ch.sact.POLICIES_COMPARED)] * 2
    matplotlib.pyplot.close(fig)


def test_paper_keys_are_the_paper_values_keys():
    from memlib import estimate
    from memlib.paper import paper_training
    from memlib.report import ch06_activations

    v3 = estimate("deepseek-v3", paper_training("deepseek-v3"))
    assert set(ch06_activations.paper_values(v3)) == set(ch06_activations.PAPER_KEYS)


def test_routed_count_table_shows_both_counts_in_gib():
    from memlib import estimate
    from memlib.paper import paper_training
    from memlib.paper.activations import routed_count_comparison
    from memlib.report import ch06_activations as ch6
    est = estimate("deepseek-v3", paper_training("deepseek-v3"))
    c = routed_count_comparison(est)
    table = ch6.routed_count_table(c, est)
    assert "the device's total under ZeRO-0, overheads included" in table
    assert "| routed token copies on one device | 4,096 | 16,384 |" in table
    assert "| routed tensors of one MoE layer, one micro-batch | 0.14 GiB | 0.58 GiB |" in table
    v = ch6.routed_count_values(c)
    assert (v["rc_ratio"], v["rc_added"]) == ("four", "26.02 GiB")
    assert v["rc_claim"] == "16,384 instead of the paper's 4,096, four times as many"
    same = ch6.routed_count_values(routed_count_comparison(
        estimate("deepseek-v3", paper_training("deepseek-v3").with_(ep=2))))     # EP ETP = TP: one count
    assert same["rc_claim"].startswith("under this layout as many as the paper counts, 16,384")


def test_a_dense_model_routes_no_token():
    """A model without routed experts (Llama-3-8B): the routed-token comparison has nothing to compare, and says so
    instead of dividing by zero."""
    cmp = pa.routed_count_comparison(estimate("llama-3-8b", paper_training("llama-3-8b")))
    assert cmp["paper"]["tokens"] == cmp["held"]["tokens"] == 0
    assert cmp["held"]["layer_routed"] == cmp["paper"]["layer_routed"]
    v = ch.routed_count_values(cmp)
    assert v["rc_ratio"] == "—" and "no token" in v["rc_claim"]
