"""Chapter 13, "What fits, and what is fastest": tables, figures and glued values, formatted from
:mod:`memlib.scenarios.fits` (every configuration of a GPU count in plan's practical space, with its exact peak and
its predicted step on each GPU) and :mod:`memlib.scenarios.steps` (the step-time model against measured runs).
Nothing here computes a quantity: it reads the searches, formats them and picks words."""
from __future__ import annotations

from ..config import ModelConfig, load_model
from ..data.reference import DEEPSEEK_V3_TRAINING
from ..device.overhead import DEVICE_PRODUCT_GB
from ..scenarios import fits as sf
from ..scenarios import steps as st
from ..scenarios.deepseek import GPU as RECIPE_GPU, deepseek_recipe
from ..search.cost import EFFICIENCY, GPU_SOURCES, GPUS, NETWORK_ETA, TIE_BAND
from ..search.plan import PRACTICAL, SPACE_RULES, fine_grained
from .figures import STEP_TICKS, CATEGORY_COLORS, OKABE_ITO, SMALL_FONT, capacity_line, in_unit, in_units, new_figure, plain_log_ticks
from .format import (counted, fmt_bytes, fmt_count, fmt_float, fmt_percent, fmt_rate, join_and, md_table, model_name,
                     signed_pct, zero_name)
from .tables import THIN_BAND_WORDS

__all__ = ["values", "recipe_values", "RECIPE_KEYS", "rules_table", "gpus_table", "validation_table", "fits_table",
           "fastest_table", "memory_table", "recipe_table", "region_figure", "region_fix", "pareto_figure"]

UNIT = "GiB"
#: the tensor-parallel sizes the region figure draws (one line each), in these colours
_TP_COLORS = (OKABE_ITO["blue"], OKABE_ITO["orange"], OKABE_ITO["green"], OKABE_ITO["vermillion"])
RECIPE_KEYS = ("rank", "fitting", "tied_word", "peak", "step", "implied", "over", "gpu", "cap", "label", "best",
               "best_step", "largest_term", "largest_diff", "ep_bytes", "ep_hidden", "ep_1f1b", "gpu_hours", "batch",
               "seq", "gpus")
#: the chapter's main card and the larger ones it sets against it
MAIN, LARGER = "H100", ("H200", "B200")
_TERM_NAMES = {"compute_s": "compute", "tp_s": "TP", "ep_s": "EP", "cp_s": "CP", "pp_s": "PP", "bubble_s": "bubble",
               "dp_s": "DP", "optimizer_s": "optimizer"}
#: the same terms in words
_TERM_WORDS = {"compute_s": "the computation", "tp_s": "tensor parallelism's collectives",
               "ep_s": "the experts' all-to-alls", "cp_s": "context parallelism's exchange",
               "pp_s": "the pipeline's sends", "bubble_s": "the pipeline bubble",
               "dp_s": "the data-parallel synchronisation", "optimizer_s": "the optimizer step"}


def _s(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else fmt_float(x, digits) + " s"


def _pct(x: float | None) -> str:
    return "—" if x is None else fmt_percent(x)


def _shortens(gain: float | None) -> str:
    """How the memory changes the fastest step, in words."""
    if gain is None or fmt_percent(gain) == fmt_percent(0):
        return "leaves the fastest step as it is (to the percent)"
    return f"shortens the fastest step by {_pct(gain)}"


def _config(t, rule: str | None = None) -> str:
    """A searched configuration in one line: ``PP16@TP1@EP64@ETP1, DP128, ZeRO-1, b = 1, DualPipe, none``; with
    ``rule`` ``balanced``, the layout rule too (two configurations that differ only in it are two rows)."""
    sched = t.schedule.value + (f" V{t.vpp}" if t.vpp > 1 else "")
    layout = ", balanced layers" if rule == "balanced" else ""
    return (f"{t.label()}, DP{t.dp}, {zero_name(t.zero, short=True)}, b = {t.micro_batch}, {sched}, "
            f"recompute {t.recompute}{layout}")


def _fit(fl, gpus, name):
    return next(f for f in fl if f.gpus == gpus and f.card.name == name)


def values(model: ModelConfig | str) -> dict[str, str]:
    """The chapter's numbers and words for its prose."""
    fl = sf.fits(model)
    main = _fit(fl, sf.GPU_COUNTS[0], MAIN)
    v = st.validation()
    mem = sf.memory_buys(model, sf.GPU_COUNTS[0], MAIN, LARGER[0])
    small = sf.memory_buys(model, sf.GPU_COUNTS[-1], MAIN, LARGER[0])
    sp = sf.SPACE
    return {
        "model": model_name(model), "gpus": join_and(fmt_count(n) for n in sf.GPU_COUNTS),
        "gpus_main": fmt_count(main.gpus), "gpus_small": fmt_count(sf.GPU_COUNTS[-1]),
        "searched": fmt_count(main.searched), "card": MAIN,
        "global_batch": fmt_count(sf.grid(model, sf.GPU_COUNTS[0]).global_batch),
        "seq_len": fmt_count(sf.grid(model, sf.GPU_COUNTS[0]).seq_len), "cap": f"{DEVICE_PRODUCT_GB[MAIN]} GB",
        "fit": fmt_count(main.fitting), "best": _config(main.best, main.best_layout_rule) if main.best else "nothing",
        "best_step": _s(main.best_step_s), "best_peak": fmt_bytes(main.best_peak, UNIT) if main.best else "—",
        "tied": f"{counted(main.tied, 'configuration')} {'is' if main.tied == 1 else 'are'}", "tie_band": _pct(TIE_BAND),
        "smallest_peak": fmt_bytes(main.smallest_peak, UNIT) if main.smallest_peak is not None else "—",
        "profile": sp["profiles"][0], "precision": sp["precisions"][0], "recomputes": join_and(sp["recomputes"]),
        "schedules": join_and(sp["schedules"]), "cp_tokens": fmt_count(PRACTICAL.min_cp_tokens),
        "gpus_list": join_and(GPUS), "efficiency": fmt_float(EFFICIENCY[st.GPU]),
        "efficiency_gpu": st.GPU, "runs": fmt_count(len(v.rows)), "right": fmt_count(v.right),
        "counted": fmt_count(v.counted), "threshold": _pct(st.THRESHOLD),
        **{k: fmt_float(x) for k, x in v.ranges().items()}, "network_eta": fmt_float(NETWORK_ETA),
        "large": LARGER[0], "large_cap": f"{DEVICE_PRODUCT_GB[LARGER[0]]} GB",
        "large_fit": fmt_count(mem.large.fitting), "more_fit": fmt_count(mem.more_fit),
        "large_step": _s(mem.large.best_step_s), "memory_gain": _pct(mem.memory_gain),
        "memory_shortens": _shortens(mem.memory_gain), "small_memory_shortens": _shortens(small.memory_gain),
        "small_fit": fmt_count(small.small.fitting), "small_large_fit": fmt_count(small.large.fitting),
        "small_step": _s(small.small.best_step_s), "small_memory_gain": _pct(small.memory_gain),
        "fastest_gpu": LARGER[-1], "fastest_gpu_step": _s(_fit(fl, sf.GPU_COUNTS[0], LARGER[-1]).best_step_s),
        "fastest_gpu_gain": _pct(sf.memory_buys(model, sf.GPU_COUNTS[0], MAIN, LARGER[-1]).gain),
        "region_fix": region_fix(model), "verdicts": _verdicts(model, fl),
        "questions": ("which parallel configurations fit at all, which of those is fastest, and is the recipe someone "
                      "published among them?" if sf.has_recipe(model) else
                      "which parallel configurations fit at all, and which of those is fastest?"),
        "small_memory_compare": (f", as on {fmt_count(main.gpus)} GPUs"
                                 if _shortens(small.memory_gain) == _shortens(mem.memory_gain)
                                 else f"; on {fmt_count(main.gpus)} GPUs it {_shortens(mem.memory_gain)}"),
        **_block_words(model),
    }


def _verdicts(model: ModelConfig | str, fl) -> str:
    """The fastest configurations of the fits table against memlib's measured errors for the model's family, in a
    sentence (:func:`memlib.scenarios.fits.best_verdict`)."""
    from ..scenarios.uncertainty import measured_band

    band = measured_band(model)
    if band.n == 0:
        return (f"No measured run of a {band.family} model bounds memlib's error, so these fits are the "
                "prediction's alone.")
    marginal = [f"{fmt_count(f.gpus)} {f.card.name}s" for f in fl if sf.best_verdict(model, f) == "marginal"]
    head = (f"Against {'only ' if band.thin else ''}{fmt_count(band.n)} measured runs of {band.family} models "
            f"memlib's peaks were {signed_pct(band.low, 2)} to {signed_pct(band.high, 2)} off (chapter 11"
            + (f"; {THIN_BAND_WORDS})" if band.thin else ")"))
    if not marginal:
        return f"{head}; every fastest configuration of the table fits even at the far end of that range."
    fits = "is a marginal fit" if len(marginal) == 1 else "are marginal fits"
    return f"{head}: within that range of the card, the fastest configuration on {join_and(marginal)} {fits}."


def _block_words(model: ModelConfig | str) -> dict[str, str]:
    """The clauses on expert parallelism, the routed experts and their all-to-alls, only for a model with experts
    (a dense model's clause keeps the sentence's joint)."""
    moe = load_model(model).has_moe
    return {
        "ep_clause": " every expert-parallel size that divides the routed experts," if moe else " and",
        "flops_words": ("every weight's two per token in the forward pass, the routed experts' share of theirs"
                        if moe else "every weight's two per token in the forward pass"),
        "rank_order": "context, expert, data and pipeline" if moe else "context, data and pipeline",
        "a2a_clause": (("every layer, the experts' all-to-alls (hidden by DualPipe where the computation is longer),"
                        if sf.has_recipe(model) else "every layer, the experts' all-to-alls,")
                       if moe else "every layer,"),
        "region_choice": "tensor, expert and pipeline" if moe else "tensor and pipeline",
        "region_rest": "expert tensor parallelism and the layout rule" if moe else "the layout rule",
        "region_axes": ("tensor-parallel (line), expert-parallel (x axis) and pipeline-parallel (panel)" if moe
                        else "tensor-parallel (line) and pipeline-parallel (panel)"),
    }


def recipe_values(model: ModelConfig | str) -> dict[str, str]:
    """Where DeepSeek-V3's own recipe stands among the configurations of its options that fit its GPUs, and its step
    against its report's (empty for another model: the recipe is DeepSeek-V3's)."""
    r = sf.recipe_step(model)
    if r is None:
        return {}
    k = r.rank
    return {"rank": fmt_count(k.rank), "fitting": fmt_count(k.fitting), "tied_word": "is" if k.tied else "is not",
            "peak": fmt_bytes(k.peak, UNIT), "step": _s(k.step_s), "implied": _s(r.implied_s, 1),
            "over": fmt_float(r.over_report), "gpu": RECIPE_GPU,
            "cap": f"{DEVICE_PRODUCT_GB[RECIPE_GPU]} GB", "label": _config(deepseek_recipe(model)),
            "best": _config(r.best_train), "best_step": _s(r.best["step_s"]),
            "largest_term": _TERM_WORDS[r.largest_term()], "largest_diff": _TERM_WORDS[r.largest_difference()],
            "ep_bytes": fmt_bytes(int(r.recipe["ep_bytes"]), "GB", 0), "ep_hidden": _s(r.recipe["ep_s"]),
            "ep_1f1b": _s(r.one_f_one_b["ep_s"]),
            "gpu_hours": fmt_count(DEEPSEEK_V3_TRAINING["gpu_hours_per_trillion_tokens"]),
            "batch": fmt_count(DEEPSEEK_V3_TRAINING["global_batch"]), "seq": fmt_count(DEEPSEEK_V3_TRAINING["seq_len"]),
            "gpus": fmt_count(DEEPSEEK_V3_TRAINING["gpus"])}


def rules_table(model: ModelConfig | str | None = None) -> str:
    """The practical space's rules, their values and sources (the rule on experts only for a ``model`` with them;
    every rule without a model)."""
    # the rule on experts only where it binds: a model with fine-grained experts (none without a model)
    coarse = model is not None and not fine_grained(load_model(model))
    rows = [[what.replace("min_cp_tokens", fmt_count(PRACTICAL.min_cp_tokens)).replace("gpus_per_node", "8 by default"),
             src] for key, (what, src) in SPACE_RULES.items() if not (coarse and key == "etp1_fine_grained")]
    return md_table(["the practical space keeps", "source"], rows, "ll")


def gpus_table() -> str:
    """The GPUs the step is priced for: their numbers and sources."""
    rows = [[g.name, fmt_rate(g.flops, 1e12), fmt_rate(g.hbm_bw, 1e12, 2), fmt_rate(g.nvlink, 1e9),
             fmt_rate(g.network, 1e9), GPU_SOURCES[g.name]]
            for g in GPUS.values()]
    return md_table(["GPU", "dense BF16 TFLOP/s", "HBM TB/s", "NVLink GB/s (one direction)", "network GB/s",
                     "source"], rows, "lrrrrl")


def validation_table() -> str:
    """The step-time model against SimuMax's measured B200 runs, per model."""
    rows = [[f"{x.model} ({x.layers} layers)", fmt_count(x.runs), f"{x.right} of {x.pairs}",
             fmt_float(x.spearman), f"{fmt_float(x.low)} – {fmt_float(x.high)}", fmt_float(x.spread)] for x in st.by_model()]
    return md_table(["model (SimuMax's proxy)", "runs", "pairs in the measured order", "Spearman",
                     "predicted / measured step", "largest spread in a group"], rows, "lrrrrr")


def fits_table(model: ModelConfig | str) -> str:
    rows = []
    for f in sf.fits(model):
        rows.append([fmt_count(f.gpus), f.card.name, fmt_bytes(f.card.capacity, UNIT, 1, with_unit=False),
                     fmt_count(f.searched), fmt_count(f.fitting),
                     _config(f.best, f.best_layout_rule) if f.best else "nothing fits",
                     (fmt_bytes(f.best_peak, UNIT, 2, with_unit=False)
                      + (" (marginal)" if sf.best_verdict(model, f) == "marginal" else "")) if f.best else "—",
                     _s(f.best_step_s),
                     fmt_count(f.tied)])
    return md_table(["GPUs", "GPU", f"capacity ({UNIT})", "searched", "fit", "fastest (predicted)",
                     f"its peak ({UNIT})", "its step", "within the tie band"], rows, "rlrrrlrrr")


def fastest_table(model: ModelConfig | str, limit: int = 8) -> str:
    """The fastest configurations on the main card, within the tie band (at most ``limit``), with their terms."""
    g = sf.grid(model, sf.GPU_COUNTS[0], MAIN)
    # no expert-parallel column for a model without experts
    names = {k: v for k, v in _TERM_NAMES.items() if k != "ep_s" or load_model(model).has_moe}
    rules = g.labels("layout_rule")
    rows = []
    for i in sf.fastest(g, sf.card(MAIN).capacity, limit):
        t = sf.terms(g, i)
        rows.append([_config(g.train(int(i)), str(rules[i])), fmt_bytes(int(g.peak[i]), UNIT, 2, with_unit=False),
                     *(fmt_float(t[k]) for k in names), fmt_float(t["step_s"])])
    return md_table(["configuration", f"peak ({UNIT})", *names.values(), "step (s)"], rows,
                    "lr" + "r" * (len(names) + 1))


def memory_table(model: ModelConfig | str) -> str:
    """What the larger cards buy over the main one, per GPU count."""
    rows = []
    for gpus in sf.GPU_COUNTS:
        for name in LARGER:
            m = sf.memory_buys(model, gpus, MAIN, name)
            rows.append([fmt_count(gpus), f"{MAIN} → {name}", _s(m.same_gpu_step_s), _pct(m.memory_gain), _pct(m.gain)])
    return md_table(["GPUs", "card", f"larger card's fastest, on the {MAIN}'s GPU", "memory alone", "memory and GPU"],
                    rows, "rlrrr")


def recipe_table(model: ModelConfig | str) -> str:
    """DeepSeek-V3's recipe beside the fastest configuration of its options, term by term."""
    r = sf.recipe_step(model)
    if r is None:
        return ""
    rows = [[name, _config(t), *(fmt_float(x[k]) for k in _TERM_NAMES), fmt_float(x["step_s"])]
            for name, t, x in (("the recipe", deepseek_recipe(model), r.recipe), ("the fastest", r.best_train, r.best))]
    return md_table(["", "configuration", *_TERM_NAMES.values(), "step (s)"], rows, "ll" + "r" * (len(_TERM_NAMES) + 1))


def _card_label(c) -> str:
    """A card as the book names it everywhere: its product's size and the capacity its driver reports."""
    return f"{c.name}: {DEVICE_PRODUCT_GB[c.name]} GB = {fmt_bytes(c.capacity, 'GiB', 2)}"


#: the line style of each card's capacity, smallest first (named in the figure's legend)
_CARD_STYLES = ("--", "-.", ":")


def region_figure(model: ModelConfig | str):
    """The smallest peak per (TP, EP, PP) with the knobs of :data:`~memlib.scenarios.fits.REGION_FIX` fixed: one
    panel per PP (three to a row), EP on the x axis, one line per TP, the capacities of the chapter's cards
    (:data:`MAIN`, :data:`LARGER`) as black lines of their own style, all named in the legend below."""
    from matplotlib.lines import Line2D

    reg = sf.region(sf.grid(model, sf.GPU_COUNTS[0]))
    tps = reg.tps[:len(_TP_COLORS)]
    caps = [sf.card(n) for n in (MAIN, *LARGER)][:len(_CARD_STYLES)]
    ncols = min(3, len(reg.pps))
    nrows = -(-len(reg.pps) // ncols)
    fig, axes = new_figure(height=1.65 * nrows + 0.7, nrows=nrows, ncols=ncols, sharey=True, squeeze=False)
    axes = list(axes.flat)
    for ax in axes[len(reg.pps):]:
        ax.remove()
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
        plain_log_ticks(ax, "x", reg.eps[::1 if len(reg.eps) <= 5 else 2])
        plain_log_ticks(ax)
        ax.set_title(f"PP {pp}", fontsize=SMALL_FONT + 1)
        ax.set_xlabel("EP")
        for c, ls in zip(caps, _CARD_STYLES):
            ax.axhline(in_unit(c.capacity, UNIT), color=OKABE_ITO["black"], lw=1.0, ls=ls, zorder=0.5)
    fig.supylabel(f"smallest peak, {UNIT} per device", fontsize=SMALL_FONT + 1)
    handles = [Line2D([], [], color=color, marker="o", ms=3, lw=1.4, label=f"TP {tp}") for tp, color in zip(tps, _TP_COLORS)]
    handles += [Line2D([], [], color=OKABE_ITO["black"], lw=1.0, ls=ls, label=_card_label(c))
                for c, ls in zip(caps, _CARD_STYLES)]
    fig.legend(handles=handles, loc="outside lower center", ncol=4)
    return fig


def region_fix(model: ModelConfig | str) -> str:
    """The knobs the region figure fixes, in words."""
    names = {"cp": "CP", "zero": "ZeRO stage", "b": "micro-batch size", "dp": "DP", "etp": "ETP"}
    return join_and(f"{names.get(k, k)} {v}" for k, v in sf.region(sf.grid(model, sf.GPU_COUNTS[0])).fix)




def pareto_figure(model: ModelConfig | str):
    """Every configuration that fits the main card: peak memory against the predicted step (density), the Pareto
    front, the tie band of the fastest."""
    g = sf.grid(model, sf.GPU_COUNTS[0], MAIN)
    card = sf.card(MAIN)
    fits = g.fits(card.capacity)
    front = sf.pareto(g, card.capacity)
    fig, ax = new_figure(height=2.6)
    if fits.any():
        hb = ax.hexbin(g.cost["step_s"][fits], in_units(g.peak[fits], UNIT), gridsize=60, bins="log", cmap="Greys",
                       xscale="log", mincnt=1, linewidths=0)
        plain_log_ticks(fig.colorbar(hb, ax=ax, label="configurations", pad=0.01).ax)
        ax.plot(g.cost["step_s"][front], in_units(g.peak[front], UNIT), marker="o", ms=3, lw=1.4,
                color=CATEGORY_COLORS["activations"], label="Pareto front")
        tied = sf.fastest(g, card.capacity)
        ax.plot(g.cost["step_s"][tied], in_units(g.peak[tied], UNIT), marker="*", ms=8, ls="none",
                color=OKABE_ITO["vermillion"], markeredgecolor="black", label="within the tie band of the fastest")
    capacity_line(ax, card.capacity, _card_label(card), legend=True)
    lo, hi = ax.get_xlim()
    plain_log_ticks(ax, "x", [t for t in STEP_TICKS if lo <= t <= hi])
    ax.set_xlabel("predicted step time, s")
    ax.set_ylabel(f"peak, {UNIT} per device")
    fig.legend(loc="outside lower center", ncol=2)
    return fig

