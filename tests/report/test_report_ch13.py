"""The what-fits chapter's module: the values the prose glues, the tables' rows, the figures, for DeepSeek-V3
and for a book built for another model (no recipe, no DeepSeek-V3 number)."""
from __future__ import annotations

import re

import matplotlib
import pytest

from memlib.core.units import fmt_bytes
from memlib.report import ch13_fits as ch
from memlib.scenarios import fits as sf
from memlib.scenarios import steps as st

matplotlib.use("Agg")


def _rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_fits_table_has_one_row_per_gpu_count_and_card():
    rows = _rows(ch.fits_table("deepseek-v3"))
    fl = sf.fits("deepseek-v3")
    assert len(rows) == len(sf.GPU_COUNTS) * len(sf.cards()) == len(fl)
    for row, f in zip(rows, fl):
        assert row[0] == f"{f.gpus:,}" and row[1] == f.card.name and row[4] == f"{f.fitting:,}"
        # the peak, marked where memlib's measured error could take it over the card (chapter 11's band)
        marginal = " (marginal)" if sf.best_verdict("deepseek-v3", f) == "marginal" else ""
        assert row[6] == (fmt_bytes(f.best_peak, "GiB", 2, with_unit=False) + marginal if f.best else "—")
        assert row[8] == f"{f.tied:,}"
    # 79.86 GiB on the A100's 80.00 GiB: memlib short of DeepSeek-style measurements by up to 8.49 % would take it over
    assert [r[6] for r in rows if (r[0], r[1]) == ("512", "A100")] == ["79.86 (marginal)"]


def test_the_answer_states_the_measured_band():
    v = ch.values("deepseek-v3")
    # (the percent sign with or without a space: the book's percent style is main's to set)
    assert re.fullmatch(r"Against 15 measured runs of DeepSeek-style \(MLA, MoE\) models memlib's peaks were −4\.19 ?% "
                        r"to 0\.00 ?% off \(chapter 11\): within that range of the card, the fastest configuration on "
                        r"512 A100s is a marginal fit\.", v["verdicts"])


def test_values_and_the_recipe_for_deepseek_v3():
    v = ch.values("deepseek-v3")
    assert all(isinstance(x, str) and x for x in v.values())
    g = sf.grid("deepseek-v3", sf.GPU_COUNTS[0])
    assert v["searched"] == f"{g.searched:,}" and v["fit"] == f"{int(g.fits(sf.card('H100').capacity).sum()):,}"
    assert v["right"] == f"{st.validation().right}" and v["runs"] == "43"
    r = ch.recipe_values("deepseek-v3")
    assert set(r) == set(ch.RECIPE_KEYS) and r["label"].startswith("PP16@TP1@EP64@ETP1, DP128, ZeRO-1")
    assert r["tied_word"] in ("is", "is not") and r["implied"] == "19.9 s"
    assert len(_rows(ch.recipe_table("deepseek-v3"))) == 2


def test_validation_table_holds_every_run():
    rows = _rows(ch.validation_table())
    assert sum(int(r[1]) for r in rows) == len(st.validation().rows)
    assert [r[0].split(" (")[0] for r in rows] == list(st.validation().spearman())


def test_another_model_has_no_recipe_and_no_deepseek_v3_number():
    v3 = ch.values("deepseek-v3")
    v = ch.values("deepseek-v2-lite")
    assert ch.recipe_values("deepseek-v2-lite") == {} and ch.recipe_table("deepseek-v2-lite") == ""
    text = " ".join(v.values()) + ch.fits_table("deepseek-v2-lite") + ch.fastest_table("deepseek-v2-lite")
    assert v3["searched"] not in text and v3["fit"] not in text and v["model"] == "DeepSeek-V2-Lite"


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2-lite"])
def test_figures_draw(model):
    reg = sf.region(sf.grid(model, sf.GPU_COUNTS[0]))
    fig = ch.region_figure(model)
    assert len(fig.axes) == len(reg.pps)
    assert len(ch.pareto_figure(model).axes) >= 1


def test_a_band_of_few_runs_says_so():
    """Mixtral's band rests on two measured steps: the answer says 'only' and that its ends are not firm; DeepSeek's
    fifteen do not."""
    from memlib.report.tables import THIN_BAND_WORDS

    thin, firm = ch._verdicts("mixtral-8x7b", []), ch._verdicts("deepseek-v3", [])
    assert thin.startswith("Against only 2 measured runs of Mixtral-style") and THIN_BAND_WORDS in thin
    assert firm.startswith("Against 15 measured runs") and THIN_BAND_WORDS not in firm
