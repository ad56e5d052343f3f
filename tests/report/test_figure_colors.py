"""One colour per memory category in every figure of the book: every series a chapter's figure labels
with a category (parameters, gradients, optimizer states, model states, activations, overheads) is
drawn in that category's colour of :data:`memlib.report.figures.CATEGORY_COLORS`, and no two
categories share a colour."""
from __future__ import annotations

import pytest
from matplotlib.colors import to_hex

from memlib.report.figures import CATEGORY_COLORS, CATEGORY_LABELS

import book_figures

MODEL = "deepseek-v3"
BY_LABEL = {label: key for key, label in CATEGORY_LABELS.items()}


def test_categories_have_distinct_colours():
    assert len(set(CATEGORY_COLORS.values())) == len(CATEGORY_COLORS)
    assert set(CATEGORY_LABELS) == set(CATEGORY_COLORS)


@pytest.fixture(scope="module")
def figures():
    """Every matplotlib figure the book glues (the diagrams, drawn by Graphviz, are tests/report/test_diagrams.py's),
    by glue key."""
    return {k: f for k, f in book_figures.figures(MODEL).items() if hasattr(f, "axes")}


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
