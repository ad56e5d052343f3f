"""The what-fits chapter's module: the values the prose glues, the tables' rows, the figures, for DeepSeek-V3
and for a book built for another model (no recipe, no DeepSeek-V3 number)."""
from __future__ import annotations

import matplotlib
import pytest

from memlib.report import ch13_fits as ch
from memlib.scenarios import fits as sf
from memlib.core.units import fmt_bytes

matplotlib.use("Agg")


def _rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_fits_table_has_one_row_per_gpu_count_and_card():
    rows = _rows(ch.fits_table("deepseek-v3"))
    fl = sf.fits("deepseek-v3")
    assert len(rows) == len(sf.GPU_COUNTS) * len(sf.cards()) == len(fl)
    for row, f in zip(rows, fl):
        assert row[0] == f"{f.gpus:,}" and row[1] == f.card.label and row[4] == f"{f.fitting:,}"
        assert row[7] == (fmt_bytes(f.best_peak, "GiB", 2, with_unit=False) if f.best else "—")


def test_values_and_the_recipe_for_deepseek_v3():
    v = ch.values("deepseek-v3")
    assert all(isinstance(x, str) and x for x in v.values())
    g = sf.grid("deepseek-v3", sf.GPU_COUNTS[0])
    assert v["searched"] == f"{g.searched:,}" and v["fit_small"] == f"{int(g.fits(sf.cards()[0].capacity).sum()):,}"
    r = ch.recipe_values("deepseek-v3")
    assert set(r) == set(ch.RECIPE_KEYS) and r["label"].startswith("PP16@TP1@EP64@ETP1, DP128, ZeRO-1")
    assert r["front_word"] in ("is", "is not")


def test_another_model_has_no_recipe_and_no_deepseek_v3_number():
    v3 = ch.values("deepseek-v3")
    v = ch.values("deepseek-v2-lite")
    assert ch.recipe_values("deepseek-v2-lite") == {}
    text = " ".join(v.values()) + ch.fits_table("deepseek-v2-lite")
    assert v3["searched"] not in text and v3["fit_small"] not in text and v["model"] == "DeepSeek-V2-Lite"


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2-lite"])
def test_figures_draw(model):
    reg = sf.region(sf.grid(model, sf.GPU_COUNTS[0]))
    fig = ch.region_figure(model)
    assert len(fig.axes) == len(reg.pps)
    assert len(ch.pareto_figure(model).axes) >= 1
    front = ch.front_figure(model)
    labels = {t.get_text() for ax in front.axes for t in ax.get_legend().get_texts()}
    assert labels == {"model states", "activations", "overheads"}
    assert len(_rows(ch.front_table(model))) == len(sf.pareto(sf.grid(model, sf.GPU_COUNTS[0]), sf.cards()[0].capacity))
