"""Chapter 13, "What fits": tables, figures and glued values, formatted from :mod:`memlib.scenarios.fits`
(every configuration of a GPU count that :func:`memlib.search.plan.search` goes through, with its exact peak).
Nothing here computes a quantity: it reads the searches, formats them and picks words."""
from __future__ import annotations

from fractions import Fraction

from ..config import ModelConfig
from ..scenarios import fits as sf
from ..scenarios.deepseek import CAPACITY as RECIPE_CAPACITY, GPU as RECIPE_GPU, deepseek_recipe
from .figures import (CAPACITY_COLOR, CATEGORY_COLORS, CATEGORY_LABELS, OKABE_ITO, Series, capacity_line, in_unit,
                      in_units, new_figure, stacked_bars)
from .format import fmt_bytes, fmt_count, fmt_decimal, md_table, model_name

__all__ = ["values", "recipe_values", "RECIPE_KEYS", "fits_table", "region_figure", "region_fix", "pareto_figure", "front_figure",
           "front_table"]

UNIT = "GiB"
#: the tensor-parallel sizes the region figure draws (one line each), in these colours
_TP_COLORS = (OKABE_ITO["blue"], OKABE_ITO["orange"], OKABE_ITO["green"], OKABE_ITO["vermillion"])
RECIPE_KEYS = ("rank", "fitting", "rule", "peak", "step", "beaten", "front_word", "label", "gpu", "cap")


def _words(xs) -> str:
    xs = [str(x) for x in xs]
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def _card(c: sf.Card) -> str:
    return f"{c.label} ({fmt_bytes(c.capacity, 'GB', 0)} = {fmt_bytes(c.capacity, UNIT, 1)})"


def _seconds(x: float) -> str:
    return fmt_decimal(Fraction(x), 2) + " s"


def _config(t) -> str:
    """A searched configuration in one line: ``PP16@TP1@EP64@ETP1, DP128, ZeRO-1, b = 1``."""
    return f"{t.label()}, DP{t.dp}, ZeRO-{int(t.zero)}, b = {t.micro_batch}"


def _main(model):
    return sf.grid(model, sf.GPU_COUNTS[0])


def values(model: ModelConfig | str) -> dict[str, str]:
    """The chapter's numbers and words for its prose."""
    cards = sf.cards()
    fl = sf.fits(model, sf.GPU_COUNTS[:1], cards)
    g = _main(model)
    small, large = fl[0], fl[-1]
    front = sf.pareto(g, small.card.capacity)
    sp = sf.SPACE
    return {
        "model": model_name(model), "gpus": _words(fmt_count(n) for n in sf.GPU_COUNTS),
        "gpus_main": fmt_count(g.gpus), "searched": fmt_count(g.searched),
        "seq_len": fmt_count(g.seq_len), "global_batch": fmt_count(g.global_batch),
        "profile": sp["profiles"][0], "precision": sp["precisions"][0], "recompute": sp["recomputes"][0],
        "cards": _words(_card(c) for c in cards), "n_cards": fmt_count(len(cards)),
        "card_small": small.card.label, "cap_small": fmt_bytes(small.card.capacity, "GB", 0),
        "card_large": large.card.label, "cap_large": fmt_bytes(large.card.capacity, "GB", 0),
        "fit_small": fmt_count(small.fitting), "fit_large": fmt_count(large.fitting),
        "best_small": _config(small.best) if small.best else "nothing",
        "best_small_peak": fmt_bytes(small.best_peak, UNIT) if small.best else "—",
        "best_small_step": _seconds(small.best_step_s) if small.best else "—",
        "smallest_peak": fmt_bytes(small.smallest_peak, UNIT) if small.smallest_peak is not None else "—",
        "front_n": fmt_count(len(front)), "region_fix": region_fix(model),
    }


def recipe_values(model: ModelConfig | str) -> dict[str, str]:
    """Where DeepSeek-V3's own recipe stands among the configurations that fit its card (empty for another model:
    the recipe is DeepSeek-V3's)."""
    if not sf.has_recipe(model):
        return {}
    train = deepseek_recipe(model)
    r = sf.recipe_rank(sf.grid(model, train.world_size), train, RECIPE_CAPACITY)
    card = {"label": _config(train), "gpu": RECIPE_GPU, "cap": fmt_bytes(RECIPE_CAPACITY, "GB", 0)}
    if r.rank is None:
        return {"rank": "none (it does not fit)", "fitting": fmt_count(r.fitting), "rule": "—", "peak": "—",
                "step": "—", "beaten": "—", "front_word": "is not", **card}
    return {"rank": fmt_count(r.rank), "fitting": fmt_count(r.fitting), "rule": r.layout_rule,
            "peak": fmt_bytes(r.peak, UNIT), "step": _seconds(r.step_s), "beaten": fmt_count(r.faster_and_smaller),
            "front_word": "is" if r.on_front else "is not", **card}


def fits_table(model: ModelConfig | str) -> str:
    rows = []
    for f in sf.fits(model):
        rows.append([fmt_count(f.gpus), f.card.label, fmt_bytes(f.card.capacity, UNIT, 1, with_unit=False),
                     fmt_count(f.searched), fmt_count(f.fitting),
                     _config(f.best) if f.best else "nothing fits", f.best_layout_rule or "—",
                     fmt_bytes(f.best_peak, UNIT, 2, with_unit=False) if f.best else "—",
                     _seconds(f.best_step_s) if f.best else "—"])
    return md_table(["GPUs", "card", f"capacity ({UNIT})", "searched", "fit", "best by the cost model", "layout",
                     f"its peak ({UNIT})", "est. step time"], rows, "rlrrrllrr")


def region_figure(model: ModelConfig | str):
    """The smallest peak per (TP, EP, PP) with the knobs of :data:`~memlib.scenarios.fits.REGION_FIX` fixed: one
    panel per PP, EP on the x axis, one line per TP, the cards' capacities as dashed lines."""
    from matplotlib.lines import Line2D

    reg = sf.region(_main(model))
    tps = reg.tps[:len(_TP_COLORS)]
    fig, axes = new_figure(9.0, 3.6, ncols=len(reg.pps), sharey=True)
    axes = list(axes) if len(reg.pps) > 1 else [axes]
    for ax, pp in zip(axes, reg.pps):
        for tp, color in zip(tps, _TP_COLORS):
            xs, ys = [], []
            for ep in reg.eps:
                if (tp, ep, pp) in reg.peak:
                    xs.append(ep)
                    ys.append(reg.peak[(tp, ep, pp)])
            if xs:
                ax.plot(xs, in_units(ys, UNIT), marker="o", ms=3, lw=1.4, color=color)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"PP {pp}", fontsize=9)
        ax.set_xlabel("EP")
        for c in sf.cards():
            capacity_line(ax, c.capacity, fmt_bytes(c.capacity, "GB", 0) if ax is axes[-1] else "")
    axes[0].set_ylabel(f"smallest peak, {UNIT} per device")
    handles = [Line2D([], [], color=color, marker="o", ms=3, lw=1.4, label=f"TP {tp}") for tp, color in zip(tps, _TP_COLORS)]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(tps), fontsize=8)
    return fig


def region_fix(model: ModelConfig | str) -> str:
    """The knobs the region figure fixes, in words."""
    names = {"cp": "CP", "zero": "ZeRO stage", "b": "micro-batch size", "dp": "DP", "etp": "ETP"}
    return _words(f"{names.get(k, k)} {v}" for k, v in sf.region(_main(model)).fix)


def pareto_figure(model: ModelConfig | str):
    """Every configuration that fits the smallest card: peak memory against the estimated step time (density),
    the Pareto front, and DeepSeek-V3's recipe where the book is DeepSeek-V3's."""
    g = _main(model)
    card = sf.cards()[0]
    fits = g.fits(card.capacity)
    front = sf.pareto(g, card.capacity)
    fig, ax = new_figure(7.0, 3.8)
    if fits.any():
        hb = ax.hexbin(g.cost["step_s"][fits], in_units(g.peak[fits], UNIT), gridsize=60, bins="log", cmap="Greys",
                       xscale="log", mincnt=1, linewidths=0)
        fig.colorbar(hb, ax=ax, label="configurations", pad=0.01)
        ax.plot(g.cost["step_s"][front], in_units(g.peak[front], UNIT), marker="o", ms=3, lw=1.4,
                color=CATEGORY_COLORS["activations"], label="Pareto front")
    if sf.has_recipe(model):
        train = deepseek_recipe(model)
        r = sf.recipe_rank(sf.grid(model, train.world_size), train, RECIPE_CAPACITY)
        if r.index is not None:
            ax.plot([r.step_s], [in_unit(r.peak, UNIT)], marker="*", ms=12, ls="none", color=OKABE_ITO["vermillion"],
                    markeredgecolor="black", label="DeepSeek-V3's recipe")
    capacity_line(ax, card.capacity, f"{card.label}: {fmt_bytes(card.capacity, 'GB', 0)}")
    ax.set_xlabel("estimated step time (cost model), s")
    ax.set_ylabel(f"peak, {UNIT} per device")
    fig.legend(loc="outside lower center", ncol=2, fontsize=8)
    return fig


def _front(model):
    g = _main(model)
    return sf.front_split(g, sf.pareto(g, sf.cards()[0].capacity))


def front_figure(model: ModelConfig | str):
    """The Pareto front's configurations, fastest first: their peak device in the book's categories."""
    sp = list(reversed(_front(model)))
    labels = [f"{s.train.label()}\nZ{int(s.train.zero)} b{s.train.micro_batch}" for s in sp]
    series = [Series(CATEGORY_LABELS["model_states"], CATEGORY_COLORS["model_states"], [s.model_states for s in sp]),
              Series(CATEGORY_LABELS["activations"], CATEGORY_COLORS["activations"], [s.activations for s in sp]),
              Series(CATEGORY_LABELS["overhead"], CATEGORY_COLORS["overhead"], [s.overhead for s in sp])]
    fig, ax = new_figure(9.0, 3.8)
    stacked_bars(ax, labels, series, UNIT, totals=False, fontsize=5)
    card = sf.cards()[0]
    capacity_line(ax, card.capacity, f"{card.label}: {fmt_bytes(card.capacity, 'GB', 0)}")
    ax.tick_params(axis="x", labelrotation=90)
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    return fig


def front_table(model: ModelConfig | str) -> str:
    rows = [[_config(s.train), s.train.schedule.value, fmt_count(s.stage), fmt_bytes(s.model_states, UNIT, 2, False),
             fmt_bytes(s.activations, UNIT, 2, False), fmt_bytes(s.overhead, UNIT, 2, False),
             fmt_bytes(s.total, UNIT, 2, False), _seconds(s.step_s)] for s in _front(model)]
    return md_table(["configuration", "schedule", "peak stage", f"model states ({UNIT})", f"activations ({UNIT})",
                     f"overheads ({UNIT})", f"peak ({UNIT})", "est. step time"], rows, "llrrrrrr")
