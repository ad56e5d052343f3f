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

from ..core.units import UNITS, fmt_bytes

__all__ = ["SMALL_FONT", "TEXT_WIDTH", "plain_log_ticks", "OKABE_ITO", "CATEGORY_COLORS", "CATEGORY_LABELS", "BLOCK_COLORS", "POLICY_COLORS", "use_style",
           "new_figure", "Series", "stacked_bars", "capacity_line", "in_unit", "in_units", "OP_COLORS", "OP_LABELS", "memory_lines",
           "memory_areas", "memory_time_panels", "schedule_boxes", "op_label"]

#: the Okabe-Ito palette, by name
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7"}

#: one colour per memory category, the same in every figure
CATEGORY_COLORS = {
    "parameters": OKABE_ITO["blue"],
    "gradients": OKABE_ITO["sky"],
    "optimizer_states": OKABE_ITO["green"],
    "model_states": "#5F6B7A",                  # parameters + gradients + optimizer states drawn as one: slate, no
                                                # Okabe-Ito hue, so that blue always means parameters
    "activations": OKABE_ITO["orange"],
    "overhead": OKABE_ITO["purple"],
}
CATEGORY_LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer_states": "optimizer states",
                   "model_states": "model states", "activations": "activations", "overhead": "overheads"}

#: parameter blocks (memlib.model.architecture.BLOCKS), one colour each
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

#: the smallest text of a figure, pt, and the width a figure is drawn at, inches: the PDF's text width less a
#: margin for the tight bounding box, so that a figure prints at its natural size, every text at least 8 pt
#: (memlib.report.legibility, tests/report/test_figure_legibility.py)
SMALL_FONT = 9
TEXT_WIDTH = 6.3
#: the text of a box narrower than a slot in a schedule diagram (a chunk's half-length operation): the
#: smallest that still prints at 8 pt
NARROW_FONT = 8.2

#: the operations of a pipeline schedule diagram: forward, backward, deferred weight gradient
#: (colours no memory category uses)
OP_COLORS = {"F": OKABE_ITO["yellow"], "B": OKABE_ITO["vermillion"], "W": "#BBBBBB"}
OP_LABELS = {"F": "forward", "B": "backward", "W": "weight gradient (deferred)"}
#: a rank's second model chunk (interleaved, DualPipe) is drawn in a lighter shade of its operation
SECOND_CHUNK_ALPHA = 0.45


#: the labelled values of a log axis of step times, s (1, 2, 3, 5 in each decade)
STEP_TICKS = [m * 10.0 ** e for e in range(-2, 5) for m in (1, 2, 3, 5)]

def in_unit(n: int, unit: str = "GiB") -> float:
    """Bytes in ``unit`` as a float, for drawing only."""
    return float(Fraction(int(n), UNITS[unit]))


def in_units(ns, unit: str = "GiB"):
    """Many byte counts in ``unit`` as a float array, for drawing only."""
    import numpy as np

    return np.asarray(ns, dtype=np.float64) / float(UNITS[unit])


def use_style() -> None:
    """The book style: deterministic output, units on axes, light grid."""
    # No matplotlib.use(...): inside a kernel the inline backend must stay, so that glued figures
    # render as images; on a machine without a display matplotlib falls back to Agg by itself.
    # matplotlib, not pyplot: the style is rcParams only, and a chapter without a figure need not import
    # pyplot (about 0.4 s of its kernel); new_figure imports it and sets the style again.
    import matplotlib
    from cycler import cycler

    matplotlib.rcParams.update({
        "figure.figsize": (TEXT_WIDTH, 3.6), "figure.dpi": 110, "savefig.dpi": 110,
        "axes.prop_cycle": cycler(color=list(OKABE_ITO.values())[1:] + ["#000000"]),
        "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
        "lines.linewidth": 2, "font.size": 10, "legend.frameon": False, "legend.fontsize": SMALL_FONT,
        "xtick.labelsize": SMALL_FONT, "ytick.labelsize": SMALL_FONT,
        "svg.hashsalt": "memlib", "path.simplify": False,
    })


def plain_log_ticks(ax, axis: str = "y", ticks: Sequence[float] | None = None) -> None:
    """A log axis labelled with plain numbers (``0.1``, ``1``, ``10``, ``1,000``) rather than powers of ten,
    whose exponents matplotlib sets at 0.7 of the tick's size.  ``ticks``: the values labelled (the minor
    ticks then unlabelled), for an axis whose powers are too close (base 2) or too few (less than a decade)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:.10g}")
    a = getattr(ax, f"{axis}axis")
    if ticks is not None:
        a.set_major_locator(FixedLocator(list(ticks)))
        a.set_minor_formatter(NullFormatter())
    a.set_major_formatter(fmt)


def new_figure(width: float = TEXT_WIDTH, height: float = 3.6, nrows: int = 1, ncols: int = 1, **kw):
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
                 digits: int = 1, width: float = 0.65, fontsize: float = SMALL_FONT, ticks: bool = True,
                 total_unit: bool = True) -> list[float]:
    """Draw stacked bars (one per label), optionally with each bar's total above it (``total_unit=False``:
    without the unit, which the axis then names); returns the tops (floats, in ``unit``).  ``ticks=False``
    leaves the x ticks to the caller (a label on every bar would only be replaced)."""
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
            ax.annotate(fmt_bytes(n, unit, digits, with_unit=total_unit), (xi, top), ha="center", va="bottom", fontsize=fontsize,
                        xytext=(0, 2), textcoords="offset points")
    if ticks:
        ax.set_xticks(x, labels, fontsize=fontsize)
    ax.set_ylabel(f"{unit} per device")
    return bottom


def capacity_line(ax, capacity: int, label: str, unit: str = "GiB", legend: bool = False) -> None:
    """A dashed horizontal line at ``capacity`` bytes, labelled at the right edge, above the line, or
    (``legend=True``: where bars may rise through the label's place) named in the axes' legend."""
    y = in_unit(capacity, unit)
    ax.axhline(y, color=CAPACITY_COLOR, lw=1.1, ls="--", zorder=0.5, label=label if legend else None)
    if legend:
        return
    ax.annotate(label, (1.0, y), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=SMALL_FONT,
                xytext=(0, 2), textcoords="offset points", color=CAPACITY_COLOR)


# ------------------------------------------------------------------------------------------------
# memory over time and schedule diagrams (memlib.device.timeline)
# ------------------------------------------------------------------------------------------------
def _step_xy(rows, during, after) -> tuple[list[int], list[int]]:
    """A rank's steps as a step line: ``during(row)`` while the step runs, ``after(row)`` from its end
    to the start of the next one (from time 0, before the first step, the first step's states)."""
    xs, ys = [0], [rows[0].states]
    for i, r in enumerate(rows):
        xs += [r.slot.start, r.slot.start, r.slot.end]
        ys += [ys[-1], during(r), during(r)]
        nxt = rows[i + 1].slot.start if i + 1 < len(rows) else None
        if nxt != r.slot.end:            # idle (or the end): what the step did not release
            xs += [r.slot.end, r.slot.end if nxt is None else nxt]
            ys += [after(r), after(r)]
    return [float(x) for x in xs], ys


def memory_lines(ax, ranks, highlight: int, unit: str = "GiB", cmap: str = "cividis") -> list:
    """Every rank's allocated bytes over one iteration (``ranks``: per rank, its
    :class:`memlib.device.timeline.MemoryStep` rows) as step lines coloured by rank, ``highlight`` in black."""
    import matplotlib

    colors = matplotlib.colormaps[cmap]
    n = max(len(ranks) - 1, 1)
    lines = []
    for r, rows in enumerate(ranks):
        xs, ys = _step_xy(rows, lambda x: x.allocated, lambda x: x.allocated_after)
        hi = r == highlight
        (ln,) = ax.plot(xs, [in_unit(y, unit) for y in ys], color=OKABE_ITO["black"] if hi else colors(r / n),
                        lw=2.0 if hi else 1.0, zorder=3 if hi else 2, label=f"rank {r}" if hi else None)
        lines.append(ln)
    return lines


def memory_areas(ax, rows, unit: str = "GiB") -> None:
    """One rank's allocated bytes over one iteration, stacked: model states, then activations (the
    micro-batches held and the working set of the chunk computing), in the categories' colours."""
    xs, states = _step_xy(rows, lambda x: x.states, lambda x: x.states)
    _, total = _step_xy(rows, lambda x: x.allocated, lambda x: x.allocated_after)
    s = [in_unit(y, unit) for y in states]
    t = [in_unit(y, unit) for y in total]
    ax.fill_between(xs, [0.0] * len(xs), s, color=CATEGORY_COLORS["model_states"], label=CATEGORY_LABELS["model_states"],
                    lw=0)
    ax.fill_between(xs, s, t, color=CATEGORY_COLORS["activations"], label=CATEGORY_LABELS["activations"], lw=0)


def op_label(op, micro_batch: int) -> str:
    """``F0.3``: the kind, chunk and micro-batch of an operation (``*``: its weight gradient deferred)."""
    return f"{op.kind}{op.chunk}.{micro_batch}" + ("*" if op.deferred else "")


def schedule_boxes(ax, slots, micro_batch, op_duration, fontsize: float = SMALL_FONT) -> None:
    """A pipeline schedule as boxes: one row per rank (``slots``: per rank, its
    :class:`memlib.device.timeline.Slot` list), one box per operation from its start for ``op_duration(op)``
    slots, coloured by kind (:data:`OP_COLORS`), lighter on chunk 1, labelled with its micro-batch
    (``micro_batch(op)``; in :data:`NARROW_FONT` in a box shorter than a slot).  Each box's ``gid`` is ``rank:`` and :func:`op_label` (the tests read them)."""
    from matplotlib.patches import Rectangle

    for r, rank in enumerate(slots):
        for s in rank:
            x = s.start
            for op in s.ops:
                w = float(op_duration(op))
                mb = micro_batch(op)
                ax.add_patch(Rectangle((float(x), r - 0.4), w, 0.8, facecolor=OP_COLORS[op.kind], edgecolor="black", lw=0.4,
                                       alpha=SECOND_CHUNK_ALPHA if op.chunk % 2 else 1.0,
                                       gid=f"{r}:{op_label(op, mb)}"))
                ax.text(float(x) + w / 2, r, str(mb), ha="center", va="center", clip_on=True,
                        fontsize=fontsize if w >= 1 else min(fontsize, NARROW_FONT))
                x += op_duration(op)
    ax.set_ylim(len(slots) - 0.5, -0.5)
    ax.set_xlim(0, float(max(rank[-1].end for rank in slots if rank)))
    ax.set_yticks(range(len(slots)), [str(r) for r in range(len(slots))])
    ax.grid(False)


def memory_time_panels(ot, xlabel: str):
    """Memory over one iteration (``ot``: a :class:`memlib.device.timeline.OverTime`): top, every rank's
    allocated bytes (:func:`memory_lines`, a colour bar for the ranks); bottom, the peak rank's split
    into model states and activations (:func:`memory_areas`). GiB per device."""
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig, (ax1, ax2) = new_figure(TEXT_WIDTH, 5.6, nrows=2, sharex=True)
    memory_lines(ax1, ot.rows, ot.peak_rank)
    sm = ScalarMappable(norm=Normalize(0, len(ot.rows) - 1), cmap=matplotlib.colormaps["cividis"])
    fig.colorbar(sm, ax=[ax1, ax2], label="rank", pad=0.01, shrink=0.5, anchor=(0.0, 1.0))
    ax1.set_ylabel("allocated, GiB per device")
    ax1.set_xlim(0, float(ot.length))
    ax1.margins(y=0.25)
    ax1.set_ylim(bottom=0)
    ax1.legend(loc="upper right")
    memory_areas(ax2, ot.rows[ot.peak_rank])
    ax2.margins(y=0.25)
    ax2.set_ylim(bottom=0)
    ax2.set_ylabel(f"rank {ot.peak_rank}, GiB per device")
    ax2.set_xlabel(xlabel)
    ax2.legend(loc="upper right", ncol=2)
    return fig
