"""Figures: one style, one colour per memory category everywhere, one stacked-bar helper.

Every figure of the book is drawn by :func:`new_figure` in the book style, with colours from the
Okabe-Ito palette (colour-blind safe, Okabe & Ito 2008).  A memory category keeps its colour in
every figure (:data:`CATEGORY_COLORS`); parameter blocks have their own fixed colours
(:data:`BLOCK_COLORS`).  Heights are converted to floats here, for drawing only.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from ..units import UNITS, fmt_bytes

__all__ = ["OKABE_ITO", "CATEGORY_COLORS", "CATEGORY_LABELS", "BLOCK_COLORS", "POLICY_COLORS", "use_style",
           "new_figure", "Series", "stacked_bars", "capacity_line", "in_unit"]

#: the Okabe-Ito palette, by name
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7"}

#: one colour per memory category, the same in every figure
CATEGORY_COLORS = {
    "parameters": OKABE_ITO["blue"],
    "gradients": OKABE_ITO["sky"],
    "optimizer_states": OKABE_ITO["green"],
    "model_states": OKABE_ITO["blue"],          # parameters + gradients + optimizer states, drawn as one
    "activations": OKABE_ITO["orange"],
    "overhead": OKABE_ITO["purple"],
}
CATEGORY_LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer_states": "optimizer states",
                   "model_states": "model states", "activations": "activations", "overhead": "overheads"}

#: parameter blocks (memlib.architecture.BLOCKS), one colour each
BLOCK_COLORS = {
    "embedding": OKABE_ITO["green"], "attention": OKABE_ITO["orange"], "norms": OKABE_ITO["yellow"],
    "dense_ffn": OKABE_ITO["vermillion"], "router": OKABE_ITO["purple"], "shared_experts": OKABE_ITO["sky"],
    "routed_experts": OKABE_ITO["blue"], "final_norm": OKABE_ITO["yellow"], "head": OKABE_ITO["black"],
    "mtp": "#999999",
}

#: recompute policies, one colour each
POLICY_COLORS = {"none": OKABE_ITO["vermillion"], "selective": OKABE_ITO["orange"], "deepseek": OKABE_ITO["sky"],
                 "full": OKABE_ITO["blue"], "modules": OKABE_ITO["purple"]}

CAPACITY_COLOR = OKABE_ITO["black"]


def in_unit(n: int, unit: str = "GiB") -> float:
    """Bytes in ``unit`` as a float, for drawing only."""
    return float(Fraction(int(n), UNITS[unit]))


def use_style() -> None:
    """The book style: deterministic output, units on axes, light grid."""
    # No matplotlib.use(...): inside a kernel the inline backend must stay, so that glued figures
    # render as images; on a machine without a display matplotlib falls back to Agg by itself.
    import matplotlib.pyplot as plt
    from cycler import cycler

    plt.rcParams.update({
        "figure.figsize": (7.0, 3.6), "figure.dpi": 110, "savefig.dpi": 110,
        "axes.prop_cycle": cycler(color=list(OKABE_ITO.values())[1:] + ["#000000"]),
        "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
        "lines.linewidth": 2, "font.size": 10, "legend.frameon": False,
        "svg.hashsalt": "memlib", "path.simplify": False,
    })


def new_figure(width: float = 7.0, height: float = 3.6, nrows: int = 1, ncols: int = 1, **kw):
    """A new (figure, axes) pair in the book style."""
    import matplotlib.pyplot as plt

    use_style()
    return plt.subplots(nrows, ncols, figsize=(width, height), layout="constrained", **kw)


@dataclass(frozen=True)
class Series:
    """One layer of a stacked bar chart: a label, a colour and exact heights in bytes."""

    label: str
    color: str
    values: Sequence[int]


def stacked_bars(ax, labels: Sequence[str], series: Sequence[Series], unit: str = "GiB", totals: bool = True,
                 digits: int = 1, width: float = 0.65, fontsize: float = 7) -> list[float]:
    """Draw stacked bars (one per label), optionally with each bar's total above it; returns the
    tops (floats, in ``unit``)."""
    x = list(range(len(labels)))
    bottom = [0.0] * len(labels)
    exact = [0] * len(labels)
    for s in series:
        if not any(s.values):
            continue
        hs = [in_unit(v, unit) for v in s.values]
        ax.bar(x, hs, bottom=bottom, width=width, color=s.color, label=s.label)
        bottom = [a + b for a, b in zip(bottom, hs)]
        exact = [a + b for a, b in zip(exact, s.values)]
    if totals:
        for xi, top, n in zip(x, bottom, exact):
            ax.annotate(fmt_bytes(n, unit, digits), (xi, top), ha="center", va="bottom", fontsize=fontsize,
                        xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, labels, fontsize=fontsize)
    ax.set_ylabel(f"{unit} per device")
    return bottom


def capacity_line(ax, capacity: int, label: str, unit: str = "GiB") -> None:
    """A dashed horizontal line at ``capacity`` bytes, labelled at the right edge, above the line."""
    y = in_unit(capacity, unit)
    ax.axhline(y, color=CAPACITY_COLOR, lw=1.1, ls="--", zorder=0.5)
    ax.annotate(label, (1.0, y), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8,
                xytext=(0, 2), textcoords="offset points", color=CAPACITY_COLOR)
