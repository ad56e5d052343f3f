"""Chapter 8, "Putting it together": tables, figures and glued values, formatted from
:mod:`memlib.scenarios.together`.

The chapter builds the grid of ZeRO stages x recompute policies once
(:func:`memlib.scenarios.together.grid` of its ``EST``) and the schedule comparison once
(:func:`memlib.scenarios.together.schedules`), and hands them to these functions; nothing here
computes a quantity, and every word that says "fits", "over", "the last rank" comes from a value the
library computed.
"""
from __future__ import annotations

from ..device.estimate import Estimate
from ..paper import PAPER_TRAINING
from ..scenarios import overheads as so
from ..scenarios import together as st
from ..config import Schedule
from ..config import ZeroStage
from ..device.timeline import DURATION, OverTime, clock, microbatch, op_duration
from .figures import (CATEGORY_COLORS, CATEGORY_LABELS, OKABE_ITO, OP_COLORS, OP_LABELS, POLICY_COLORS,
                      SECOND_CHUNK_ALPHA, TEXT_WIDTH, Series,
                      capacity_line, in_unit, memory_time_panels, new_figure, schedule_boxes, stacked_bars)
from .format import (number_word, fmt_bytes, fmt_capacity, fmt_count, fmt_decimal, fmt_difference, join_and, layout_text, md_table,
                     pct, percent, zero_name)
from .notation import chapter_notation
from .tables import band_text
from ..scenarios.uncertainty import measured_band

__all__ = ["capacity_label", "notation", "values", "fit_table", "grid_figure", "no_recompute_values", "schedule_values",
           "schedule_table", "schedule_figure", "problem_values", "SCHEDULE_NAMES",
           "memory_time_values", "memory_time_figure", "diagram_values", "schedule_diagram", "routed_values"]

SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "dualpipe": "DualPipe"}
SCHEDULE_COLORS = {"gpipe": OKABE_ITO["vermillion"], "1f1b": OKABE_ITO["blue"], "interleaved": OKABE_ITO["sky"],
                   "dualpipe": OKABE_ITO["orange"]}
#: the byte terms of a device, stacked in this order
TERMS = ("parameters", "gradients", "optimizer_states", "activations", "overhead")
#: the policies of the grid figure (the module list is in the table)
GROWTH_PHRASES = {"working": "the working set of the recomputed layer, which grows with b",
                  "held": "the activations held for the backward, which grow with b",
                  "overhead": "the overheads (fragmentation grows with the allocated bytes)",
                  "states": "the model states"}
#: the recompute policies in a sentence (any other: a module list, :func:`_policy_words`)
POLICY_WORDS = {"none": "no recomputation", "selective": "selective recomputation", "deepseek": "the deepseek policy",
                "full": "full recomputation"}


def _policy_words(p: str) -> str:
    return POLICY_WORDS.get(p, "the module list")


def _policy_label(p: str) -> str:
    """A policy as a figure names it: its name, or "module list"."""
    return p if p in POLICY_WORDS else "module list"


#: how a cell of the fit table gives a verdict read with memlib's measured errors
FIT_CELLS = {"fits": "fits", "marginal": "*marginal*", "does not fit": "**does not fit**"}
#: the schedule table's "every stage fits", read with memlib's measured errors
SCHEDULE_FIT_CELLS = {"fits": "yes", "marginal": "*marginal*", "does not fit": "**no**"}
#: the verdict of ZeRO-1 with full recomputation, after "so it"
FIT_WORDS = {"fits": "fits even at the band's far end", "marginal": "is marginal: inside the band it may not fit",
             "does not fit": "does not fit even at the band's near end"}


def _capacity() -> int:
    return st.CAPACITY_80GB


def capacity_label() -> str:
    """``H800: 81,559 MiB = 79.65 GiB``: the device, its capacity as its driver reports it and in the book's unit."""
    return f"{so.CAPACITY_GPU}: {fmt_bytes(_capacity(), 'MiB', 0)} = {fmt_bytes(_capacity(), 'GiB', 2)}"


def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch08", est.model, est.train)


def values(est: Estimate, grid: dict) -> dict[str, str]:
    """The chapter's configuration, capacity and grid counts for its prose."""
    t = est.train
    n_fit, n = st.grid_counts(grid)
    z1 = st.policy_change(grid, "full", ZeroStage.OS)
    cap = _capacity()
    fit = st.fitting(grid)
    marginal = [k for k in fit if grid[k].verdict == "marginal"]
    z1_verdict = grid[(ZeroStage.OS, "full")].verdict
    marginal_words = (f"{fmt_count(len(marginal))} of them only marginally" if marginal
                      else "none of them marginally")
    return {
        "label": t.label(), "b": fmt_count(t.micro_batch), "s": fmt_count(t.seq_len),
        # the paper's PP16@TP2@EP8@ETP1, or what the model allows of it (a dense model: EP1)
        "whose": "the paper's" if t.label() == PAPER_TRAINING.label() else "the paper's, as far as the model allows:",
        "schedule": SCHEDULE_NAMES.get(t.schedule, t.schedule),
        "capacity": capacity_label(), "capacity_text": fmt_capacity(cap), "capacity_gpu": so.CAPACITY_GPU,
        "capacity_bytes": fmt_count(cap),
        "n_combos": fmt_count(n), "n_fit": fmt_count(n_fit),
        "fit_count": (f"All {fmt_count(n)} combinations of ZeRO stage and recompute policy fit" if n_fit == n else
                      f"None of the {fmt_count(n)} combinations of ZeRO stage and recompute policy fits" if not n_fit
                      else f"{fmt_count(n_fit)} of {fmt_count(n)} combinations of ZeRO stage and recompute policy fit"),
        "fit_sentence": (f"All {fmt_count(n)} combinations fit." if n_fit == n else
                         "The combinations that fit: " + "; ".join(
                             f"{zero_name(z, short=True)} with {_policy_words(p)}"
                             + (" (marginal)" if (z, p) in marginal else "") for z, p in fit) + "." if fit else
                         "No combination fits."),
        "n_marginal": marginal_words,
        "fit_paren": ("no combination does" if not n_fit else
                      (f"all {fmt_count(n)} combinations do" if n_fit == n
                       else f"{fmt_count(n_fit)} of {fmt_count(n)} combinations do") + f", {marginal_words}"),
        "band": band_text(measured_band(est.model)), "z1_verdict": FIT_WORDS[z1_verdict],
        "z1_full": fmt_bytes(z1["total"]), "z1_full_stage": fmt_count(z1["stage"]),
        "z1_full_margin": fmt_bytes(z1["room"] if z1["fits"] else z1["excess"]),
        "z1_full_side": "below" if z1["fits"] else "above",
    }


def fit_table(grid: dict) -> str:
    """Rows: recompute policies; columns: ZeRO stages; a cell gives the peak device's total GiB, its
    stage, and whether every stage fits."""
    zs = sorted({z for z, _ in grid})
    policies = list(dict.fromkeys(p for _, p in grid))
    rows = []
    for p in policies:
        row = [f"`{p}`"]
        for z in zs:
            c = grid[(z, p)]
            row.append(f"{fmt_bytes(c.peak_total, with_unit=False)} (stage {c.peak}), {FIT_CELLS[c.verdict]}")
        rows.append(row)
    headers = ["recompute"] + [f"{zero_name(z)}: peak GiB (stage)" for z in zs]
    return md_table(headers, rows, "l" + "r" * len(zs))


def grid_figure(grid: dict):
    """Small multiples: rows are the grid's recompute policies (every one its fit count includes),
    columns ZeRO stages; each panel stacks the terms of every pipeline stage's device, GiB, with the
    capacity as a dashed line (named in the legend)."""
    from matplotlib.lines import Line2D

    zs = sorted({z for z, _ in grid})
    policies = list(dict.fromkeys(p for _, p in grid))
    fig, axes = new_figure(TEXT_WIDTH, 1.05 * len(policies) + 0.9, nrows=len(policies), ncols=len(zs), sharex=True,
                           sharey="row", squeeze=False)
    for i, p in enumerate(policies):
        for j, z in enumerate(zs):
            ax = axes[i][j]
            stages = grid[(z, p)].est.stages
            series = [Series(CATEGORY_LABELS[k], CATEGORY_COLORS[k], [s.bytes[k] for s in stages]) for k in TERMS]
            labels = [str(s.stage.index) for s in stages]
            stacked_bars(ax, labels, series, totals=False, width=0.8, ticks=False)
            capacity_line(ax, _capacity(), "")
            ax.set_xticks(range(0, len(labels), 5), labels[::5])
            ax.set_ylabel("")
            if i == 0:
                ax.set_title(zero_name(z).replace(" (", "\n("), fontsize=10)
            if j == 0:
                name = p if p in POLICY_COLORS else "modules"
                ax.set_ylabel(_policy_label(p), color=POLICY_COLORS[name])
            if i == len(policies) - 1:
                ax.set_xlabel("stage")
    fig.supylabel("GiB per device")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(Line2D([], [], color=OKABE_ITO["black"], lw=1.1, ls="--"))
    labels.append(capacity_label())
    fig.legend(handles, labels, loc="outside lower center", ncol=3)
    return fig


def no_recompute_values(grid: dict) -> dict[str, str]:
    """No recomputation, in numbers and in words computed from the grid."""
    v = st.no_recompute(grid)
    n_fit, n = v["n_fit"], v["n"]
    if n_fit == 0:
        verdict = (f"Without recomputation no combination fits, and ZeRO does not help: the best peak is "
                   f"{fmt_bytes(v['best'])}.")
    elif n_fit == n:
        verdict = f"Without recomputation every ZeRO stage fits, the largest peak being {fmt_bytes(v['worst'])}."
    else:
        verdict = (f"Without recomputation {fmt_count(n_fit)} of the {fmt_count(n)} ZeRO stages fit; the best peak is "
                   f"{fmt_bytes(v['best'])}.")
    ds = v["policy_fits"].get("deepseek", 0)
    deepseek = ("it fails with every ZeRO stage, for the same reason" if ds == 0 and n_fit == 0 else
                "it fits with every ZeRO stage" if ds == n else
                f"it fits with {fmt_count(ds)} of the {fmt_count(n)} ZeRO stages")
    dropping = [_policy_words(p) for p, d in v["drops_scores"].items() if d]
    # the policies that keep the scores and fit, but for the two the paragraph has named (none, deepseek)
    keeping_fit = [_policy_words(p) for p, d in v["drops_scores"].items()
                   if not d and v["policy_fits"][p] and p not in ("none", "deepseek")]
    if v["every_fitting_drops"]:
        policies = "Every policy that fits with some ZeRO stage drops them: " + ", ".join(dropping) + "."
    elif keeping_fit:
        policies = "Here policies that keep them fit too: " + ", ".join(keeping_fit) + "."
    else:
        policies = ""
    return {
        "zero": zero_name(v["zero"]), "stage": fmt_count(v["stage"]), "layers": number_word(v["layers"]),
        "in_flight": fmt_count(v["in_flight"]), "states": fmt_bytes(v["states"]),
        "per_mb": fmt_bytes(v["per_microbatch"]), "scores": fmt_bytes(v["scores"]), "share": pct(v["share"], 1),
        "scores_held": fmt_bytes(v["scores_held"]), "held": fmt_bytes(v["held"]),
        "times": (f"{fmt_decimal(v['held_over_capacity'], 1)} times the card's capacity" if v["held_over_capacity"] >= 1
                  else f"{percent(v['held_over_capacity'], 0)} of the card's capacity"),
        "rest": fmt_bytes(v["without_scores"]),
        "verdict": verdict, "deepseek": deepseek, "policies": policies,
        "deepseek_what": "the norms and the up-projections" if next(iter(grid.values())).est.model.attention == "mla"
        else "the norms",
    }


def _config_text(name: str, train, math: bool = True) -> str:
    if train.schedule is Schedule.GPIPE:
        return f"GPipe, {'$M$' if math else 'M'} = {train.num_microbatches}"
    if train.schedule is Schedule.INTERLEAVED:
        return f"interleaved 1F1B, {'$V$' if math else 'V'} = {train.vpp}"
    return SCHEDULE_NAMES[name]


def _schedule_text(r: st.Outcome, math: bool = True) -> str:
    return _config_text(r.name, r.train, math)


def schedule_values(runs: dict[str, st.Outcome]) -> dict[str, str]:
    """The schedules' settings and what each costs, in numbers and words."""
    g, il, dp, one = runs["gpipe"], runs["interleaved"], runs["dualpipe"], runs["1f1b"]
    lay = il.train.layout
    layers = il.est.model.num_hidden_layers
    n_virtual, split = len(lay), st.layout_split(lay)
    if split == "empty":
        layout = (f"The model's {fmt_count(layers)} layers are fewer than the {fmt_count(n_virtual)} virtual "
                  f"stages, so some hold no decoder layer (the first keeps the embedding, the last the head; "
                  f"Megatron-Core's pipeline layouts allow empty stages): layers per virtual stage "
                  f"{layout_text(lay)}.")
    elif split == "even":
        layout = (f"The model's {fmt_count(layers)} layers split evenly over the {fmt_count(n_virtual)} virtual "
                  f"stages, {fmt_count(lay[0])} each.")
    else:
        layout = (f"The model's {fmt_count(layers)} layers do not split evenly over the {fmt_count(n_virtual)} "
                  f"virtual stages, so memlib gives the lighter chunks to the first virtual stage (with the "
                  f"embedding) and the last ones (with the head): layers per virtual stage {layout_text(lay)}.")
    gpipe = (f"GPipe peaks on the last rank, which holds the logits and the fp32 softmax of the loss for every "
             f"one of its micro-batches: {fmt_bytes(g.peak_total)}" if g.peak == g.last_rank else
             f"GPipe peaks on rank {g.peak} with {fmt_bytes(g.peak_total)}")
    dual = (f"DualPipe peaks on rank {dp.peak}, whose two model stages hold {fmt_bytes(dp.peak_stage.model_states)} "
            f"of model states, {fmt_bytes(dp.peak_total)} in all; "
            + ("under this partition it is over the capacity" if not dp.fits
               else "under this partition every rank fits"))
    more = st.costs_more(runs)
    n_fit, n = st.schedule_counts(runs)
    return {
        "m": fmt_count(g.train.num_microbatches), "per_stage": fmt_count(st.MICROBATCHES_PER_STAGE),
        "v": fmt_count(il.train.vpp), "layout_sentence": layout,
        "gpipe_sentence": gpipe, "dualpipe_sentence": dual,
        "one_peak": fmt_bytes(one.peak_total),
        "gpipe_cost": ("GPipe costs more than 1F1B here, in micro-batches held" if more["gpipe"]
                       else "GPipe costs no more than 1F1B here"),
        "dualpipe_cost": ("DualPipe costs more, in a second copy of the model states" if more["dualpipe"]
                          else "DualPipe costs no more, despite its second copy of the model states"),
        "n_fit": fmt_count(n_fit), "n": fmt_count(n),
    }


def schedule_table(runs: dict[str, st.Outcome]) -> str:
    rows = []
    for r in runs.values():
        pk = r.peak_stage
        rows.append([_schedule_text(r), fmt_count(len(pk.stage.chunks)), fmt_count(r.peak),
                     fmt_count(pk.activations["microbatches_in_flight"]),
                     fmt_bytes(pk.model_states, with_unit=False), fmt_bytes(pk.bytes["activations"], with_unit=False),
                     fmt_bytes(pk.bytes["overhead"], with_unit=False),
                     f"**{fmt_bytes(r.peak_total, with_unit=False)}**",
                     SCHEDULE_FIT_CELLS[r.verdict] if r.fits else "**no**"])
    headers = ["schedule", "model chunks per device", "peak stage", "micro-batches in flight there (all chunks)",
               "model states (GiB)", "activations (GiB)", "overheads (GiB)", "total (GiB)", "every stage fits"]
    return md_table(headers, rows, "lrrrrrrrl")


def schedule_figure(runs: dict[str, st.Outcome]):
    """Total memory of every pipeline rank's device under each schedule, GiB, with the capacity."""
    fig, ax = new_figure(height=3.8)
    top = 0.0
    last = 0
    for name, r in runs.items():
        x = list(range(len(r.totals)))
        ys = [in_unit(t) for t in r.totals]
        ax.plot(x, ys, marker="o", ms=4, color=SCHEDULE_COLORS[name], label=_schedule_text(r, math=False))
        top, last = max([top] + ys), x[-1]
    capacity_line(ax, _capacity(), capacity_label())
    ax.set_xlim(-0.5, last + 0.45 * (last + 1))        # room on the right for the capacity's label
    ax.set_ylim(0, max(top, in_unit(_capacity())) * 1.12)
    ax.set_xticks(range(last + 1))
    ax.set_xlabel("pipeline stage (rank)")
    ax.set_ylabel("total, GiB per device")
    ax.legend(loc="lower right")
    return fig


def memory_time_values(ot: OverTime) -> dict[str, str]:
    """One iteration of the 1F1B run on the clock: its length, and where rank 0 and the peak rank peak."""
    r0, pk = ot.peaks[0], ot.peak
    if ot.peak_rank == 0:
        sentence = (f"Rank 0 holds the most micro-batches, {fmt_count(r0.microbatches)}, and peaks highest, at "
                    f"{fmt_bytes(r0.allocated)} with {fmt_bytes(r0.states)} of model states.")
    else:
        sentence = (f"Rank 0 holds the most micro-batches, {fmt_count(r0.microbatches)}, but with "
                    f"{fmt_bytes(r0.states)} of model states it peaks at {fmt_bytes(r0.allocated)}; rank "
                    f"{ot.peak_rank} holds {number_word(pk.microbatches)} on top of {fmt_bytes(pk.states)} of model "
                    f"states and peaks at {fmt_bytes(pk.allocated)}, the most of any rank.")
    last = ot.peaks[-1]
    idle = st.first_idle(ot) or st.first_idle(ot, 0)     # the peak rank's wait, or the first rank's
    caption = ""
    if idle is None or not idle["drop"]:
        drop = ""
    else:
        caption = ("A rank's memory steps down while it waits between its warm-up forwards and its first backward: "
                   "the working set of a computing chunk is released while nothing computes.")
        what = (f"the working set of the chunk that last computed, {fmt_bytes(idle['working'])}, and the "
                f"{fmt_bytes(idle['released'])} of activations its last backward freed" if idle["released"]
                else "the working set of the chunk that last computed")
        drop = (f"Between its warm-up forwards and its first backward (slots {fmt_count(idle['start'])} to "
                f"{fmt_count(idle['end'])}) rank {fmt_count(idle['rank'])} computes nothing, and its memory drops by "
                f"{fmt_bytes(idle['drop'])}, {what}; it keeps its model states and the "
                f"{fmt_bytes(idle['held'])} of activations its micro-batches saved for their backwards.")
    return {"m": fmt_count(ot.microbatches), "length": fmt_count(ot.length), "sentence": sentence, "idle": drop,
            "idle_caption": caption,
            "peak_rank": fmt_count(ot.peak_rank), "peak": fmt_bytes(pk.allocated),
            "peak_start": fmt_count(pk.slot.start), "last_rank": fmt_count(len(ot.peaks) - 1),
            "last_mb": fmt_count(last.microbatches), "last_peak": fmt_bytes(last.allocated),
            "last_sentence": ("" if ot.peak_rank == len(ot.peaks) - 1 else
                              f"The last rank, {fmt_count(len(ot.peaks) - 1)}, holds {number_word(last.microbatches)} "
                              f"at a time and peaks at {fmt_bytes(last.allocated)}."),
            "f": fmt_count(DURATION["F"]), "b": fmt_count(DURATION["B"])}


def memory_time_figure(ot: OverTime):
    """Top: every rank's allocated bytes over one iteration, the peak rank in black; bottom: the
    peak rank's, split into model states and activations. GiB per device, time in slots."""
    return memory_time_panels(ot, f"time (slots: a forward {DURATION['F']}, a backward {DURATION['B']})")


def diagram_values(configs: dict) -> dict[str, str]:
    """The diagrams' pipeline: ranks, micro-batches, chunks, and each operation's length."""
    one = configs["1f1b"]
    return {"pp": fmt_count(one.pp), "m": fmt_count(one.num_microbatches), "v": fmt_count(configs["interleaved"].vpp),
            "f": fmt_count(DURATION["F"]), "b": fmt_count(DURATION["B"]), "bw": fmt_count(DURATION["B*"]),
            "w": fmt_count(DURATION["W"])}


def schedule_diagram(configs: dict):
    """The operations of every rank under each schedule of ``configs`` on the clock
    (:func:`memlib.device.timeline.clock`): one panel per schedule, a row per rank, a box per operation."""
    from matplotlib.patches import Patch

    fig, axes = new_figure(TEXT_WIDTH, 1.15 * len(configs) * 1.15, nrows=len(configs))
    for ax, (name, t) in zip(axes, configs.items()):
        schedule_boxes(ax, clock(t), lambda op, t=t: microbatch(t, op), lambda op, t=t: op_duration(t, op))
        ax.set_title(_config_text(name, t, math=False), fontsize=10, loc="left")
        ax.set_ylabel("rank")
    end = max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:
        ax.set_xlim(0, end)
    axes[-1].set_xlabel("time (slots)")
    handles = [Patch(facecolor=OP_COLORS[k], edgecolor="black", lw=0.4, label=OP_LABELS[k]) for k in OP_COLORS]
    handles += [Patch(facecolor=OP_COLORS[k], edgecolor="black", lw=0.4, alpha=SECOND_CHUNK_ALPHA,
                      label=f"{OP_LABELS[k]}, second chunk") for k in ("F", "B")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2)
    return fig


#: the largest micro-batch that fits, read with memlib's measured errors (after "the peak is X on stage N, ")
P1_WORDS = {"fits": "inside the card even at the far end of memlib's measured error",
            "marginal": "inside the card, but only marginally: within memlib's measured error it may not fit",
            "does not fit": "inside the card by the prediction, but not at the near end of memlib's measured error"}
#: a fit of the grid, as the answer to "does it fit?"
P2_WORDS = {"fits": "Yes", "marginal": "Marginally", "does not fit": "No"}


def problem_values(est: Estimate, grid: dict) -> dict[str, str]:
    """(1) the largest micro-batch that fits with ZeRO-1 and full recomputation; (2) selective
    recomputation with ZeRO-1, and with ZeRO-3."""
    b = st.largest_micro_batch(est)
    if b["b"]:
        thin = f" (an error measured on only {fmt_count(b['band'].n)} runs)" if b["band"].thin else ""
        answer = (f"b = {b['b']}: the peak is {fmt_bytes(b['total'])} on stage {b['stage']}, "
                  f"{P1_WORDS[b['verdict']] if b['band'].n else 'by the prediction alone'}{thin}.")
        growth = f"; most of the growth is {GROWTH_PHRASES[b['grew_most']]}"
    else:
        answer = "None: even b = 1 does not fit."
        growth = ""
    sel = st.policy_change(grid, "selective")
    first = (f"{P2_WORDS[sel['verdict']]}: stage {sel['stage']} needs {fmt_bytes(sel['total'])}, "
             f"{fmt_bytes(sel['room'])} under the capacity." if sel["fits"] else
             f"No: stage {sel['stage']} needs {fmt_bytes(sel['total'])}, {fmt_bytes(sel['excess'])} over.")
    # the stronger ZeRO stage only where ZeRO-1 does not fit
    second = ("" if sel["fits"] else f" {zero_name(sel['other'], short=True)} brings it to "
              f"{fmt_bytes(sel['other_total'])}, which " + ("fits." if sel["other_fits"] else "still does not fit."))
    return {"p1_answer": answer, "p1_next": fmt_count(b["next"]), "p1_next_total": fmt_bytes(b["next_total"]),
            "p1_next_stage": fmt_count(b["next_stage"]), "p1_growth": growth, "p2_answer": f"{first}{second}"}


def routed_values(eff: dict) -> dict[str, str]:
    """The grid under the paper's routed-token count beside the held count
    (:func:`memlib.scenarios.together.routed_count_effect`), in words and GiB."""
    lost = eff["lost"]
    n, held = fmt_count(eff["n"]), fmt_count(eff["fit_held"])
    names = join_and(f"{zero_name(z, short=True)} with {_policy_words(p)}" for z, p in lost)
    verb = "stop" if len(lost) > 1 else "stops"
    count = (f"{held} of {n} combinations fit instead of {fmt_count(eff['fit_paper'])}: {names} {verb} fitting"
             if lost else f"all {n} combinations still fit" if eff["fit_held"] == eff["n"] else
             f"the same {held} of the {n} combinations fit")
    return {"count_sentence": count, "fit_paper": fmt_count(eff["fit_paper"]), "fit_held": held, "n": n,
            "lost": names if lost else "none of them", "lost_verb": verb,
            "paper_total": fmt_bytes(eff["paper_total"]), "held_total": fmt_bytes(eff["held_total"]),
            "held_stage": fmt_count(eff["held_stage"]), "difference": fmt_difference(eff["held_total"], eff["paper_total"]),
            "held_verdict": ("and still fits" if eff["held_fits"] and eff["paper_fits"] else
                             "and no longer fits" if eff["paper_fits"] else
                             "and now fits" if eff["held_fits"] else "and does not fit either")}

