"""One colour per memory category in every figure of the book: every series a chapter's figure labels
with a category (parameters, gradients, optimizer states, model states, activations, overheads) is
drawn in that category's colour of :data:`memlib.report.figures.CATEGORY_COLORS`, and no two
categories share a colour."""
from __future__ import annotations

import matplotlib
import pytest
from matplotlib.colors import to_hex

from memlib import estimate
from memlib.paper import paper_training
from memlib.config import ZeroStage
from memlib.report import (ch02_architecture, ch03_parameters, ch04_static, ch05_zero, ch06_activations, ch07_overheads, ch08_together,
                           ch09_deepseek, ch10_validation, ch12_architectures, ch13_fits)
from memlib.report.figures import CATEGORY_COLORS, CATEGORY_LABELS
from memlib.scenarios.deepseek import deepseek_recipe
from memlib.scenarios.overheads import base_training
from memlib.scenarios.together import diagram_configs, grid, memory_timeline, schedules
from memlib.device.timeline import over_time

MODEL = "deepseek-v3"
BY_LABEL = {label: key for key, label in CATEGORY_LABELS.items()}


def test_categories_have_distinct_colours():
    assert len(set(CATEGORY_COLORS.values())) == len(CATEGORY_COLORS)
    assert set(CATEGORY_LABELS) == set(CATEGORY_COLORS)


@pytest.fixture(scope="module")
def figures():
    matplotlib.use("Agg")
    matplotlib.rcParams["figure.max_open_warning"] = 0       # every chapter's figures open at once, on purpose
    est = estimate(MODEL, paper_training(MODEL))
    runs = schedules(est)
    ds = estimate(MODEL, deepseek_recipe(MODEL))
    return {
        "ch02.attention_figure": ch02_architecture.block_figure(est, "attention"),
        "ch02.ffn_figure": ch02_architecture.block_figure(est, "ffn"),
        "ch03.stage_figure": ch03_parameters.stage_figure(est),
        "ch04.stages_figure": ch04_static.stages_figure(est),
        "ch04.device_figure": ch04_static.device_figure(est, zero=ZeroStage.OS),
        "ch05.states_figure": ch05_zero.states_figure(est),
        "ch06.dataflow_figure": ch06_activations.dataflow_figure(est),
        "ch06.microbatch": ch06_activations.microbatch(est)[1],
        "ch06.seqlen_figure": ch06_activations.seqlen_figure(est),
        "ch06.policy_figure": ch06_activations.policy_figure(est),
        "ch07.preset_figure": ch07_overheads.preset_figure(estimate(MODEL, base_training(paper_training(MODEL)))),
        "ch08.grid_figure": ch08_together.grid_figure(grid(est)),
        "ch08.schedule_figure": ch08_together.schedule_figure(runs),
        "ch08.schedule_diagram": ch08_together.schedule_diagram(diagram_configs()),
        "ch08.memory_time_figure": ch08_together.memory_time_figure(memory_timeline(runs)),
        "ch09.rank_figure": ch09_deepseek.rank_figure(ds),
        "ch09.ablation_figure": ch09_deepseek.ablation_figure(ds),
        "ch09.memory_time_figure": ch09_deepseek.memory_time_figure(over_time(ds)),
        "ch10.hf_figure": ch10_validation.hf_figure(estimate(MODEL, paper_training(MODEL))),
        "ch10.side_figure": ch10_validation.side_figure(estimate(MODEL, paper_training(MODEL))),
        "ch12.pairs_figure": ch12_architectures.pairs_figure(),
        "ch13.region_figure": ch13_fits.region_figure(MODEL),
        "ch13.pareto_figure": ch13_fits.pareto_figure(MODEL),
    }


def labelled_series(fig) -> list[tuple[str, str]]:
    """(label, colour) of every labelled series drawn: bars, filled areas, lines, legend handles."""
    out = []
    for ax in fig.axes:
        for c in ax.containers:
            if c.get_label() and c.patches:
                out.append((c.get_label(), to_hex(c.patches[0].get_facecolor(), keep_alpha=False)))
        for coll in ax.collections:
            if coll.get_label() and not coll.get_label().startswith("_") and len(coll.get_facecolor()):
                out.append((coll.get_label(), to_hex(coll.get_facecolor()[0], keep_alpha=False)))
        for line in ax.lines:
            if line.get_label() and not line.get_label().startswith("_"):
                out.append((line.get_label(), to_hex(line.get_color(), keep_alpha=False)))
    for leg in [ax.get_legend() for ax in fig.axes] + list(fig.legends):
        if leg is None:
            continue
        for handle, text in zip(leg.legend_handles, leg.get_texts()):
            if hasattr(handle, "get_facecolor") and not hasattr(handle, "get_xdata"):
                out.append((text.get_text(), to_hex(handle.get_facecolor(), keep_alpha=False)))
            elif hasattr(handle, "get_color"):
                out.append((text.get_text(), to_hex(handle.get_color(), keep_alpha=False)))
    return out


def test_every_figure_draws_categories_in_their_colours(figures):
    wrong, seen = [], set()
    for name, fig in figures.items():
        for label, color in labelled_series(fig):
            key = BY_LABEL.get(label.strip().lower())
            if key is None:
                continue
            seen.add(key)
            if color.lower() != CATEGORY_COLORS[key].lower():
                wrong.append(f"{name}: {label!r} drawn in {color}, not {CATEGORY_COLORS[key]}")
    assert not wrong, "\n".join(wrong)
    # the test sees every category somewhere (a figure that stops labelling them would pass unseen)
    assert seen == set(CATEGORY_COLORS)


def test_the_lint_sees_a_wrong_colour():
    from memlib.report.figures import new_figure
    fig, ax = new_figure()
    ax.bar([0], [1], color=CATEGORY_COLORS["activations"], label=CATEGORY_LABELS["gradients"])
    ax.legend()
    assert (CATEGORY_LABELS["gradients"], CATEGORY_COLORS["activations"].lower()) in labelled_series(fig)
