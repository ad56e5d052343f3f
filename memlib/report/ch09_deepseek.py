"""Chapter 9, "DeepSeek-V3's recipe, without tensor parallelism": tables, figures and glued values,
formatted from :mod:`memlib.scenarios.deepseek`.

Every function takes the chapter's :class:`~memlib.device.estimate.Estimate`, built in the chapter's
configuration cell from DeepSeek-V3's recipe (:func:`memlib.scenarios.deepseek.deepseek_recipe`);
nothing here computes a quantity: it reads the library's values, formats them and picks words from
the library's booleans and signs.
"""
from __future__ import annotations

from ..device.estimate import Estimate
from ..scenarios import deepseek as ds
from ..config.precision import RECIPES
from ..ledgers.base import fp8_scaling
from ..device.timeline import DURATION, OverTime
from .figures import (CATEGORY_COLORS, CATEGORY_LABELS, Series, capacity_line, in_unit, memory_time_panels, new_figure,
                      stacked_bars)
from ..scenarios.uncertainty import accounting_gap, judged
from .format import (VERDICT_CELLS, number_word, fmt_bytes, fmt_count, fmt_difference, join_and, layout_text, md_table, model_name, pct,
                     span, yes_no)
from .notation import chapter_notation
from .tables import attention_switch_values, band_text, collapse_runs

__all__ = ["notation", "values", "verdict_values", "band_text", "choices_table", "choices_values", "ablation_values", "ablation_table", "ablation_figure", "rank_table",
           "rank_figure", "ledger_table", "problem_values", "PROBLEM_MICRO_BATCH", "CAPACITY_LABEL", "switch_values",
           "memory_time_values", "memory_time_figure"]

#: the worked problem's micro-batch (sequences)
PROBLEM_MICRO_BATCH = 2

#: the capacity as the figures label it: decimal GB as the vendor counts, and GiB as the bars
CAPACITY_LABEL = f"{ds.GPU}: {fmt_bytes(ds.CAPACITY, 'MiB', 0)} = {fmt_bytes(ds.CAPACITY, 'GiB', 2)}"

#: the three categories of a device's total, as the figures and the tables name them
_SERIES = (("states", "model_states"), ("activations", "activations"), ("overhead", "overhead"))


def _fits(x: bool) -> str:
    return "fits" if x else "does not fit"


def _margin(total: int) -> str:
    """The margin of a device needing ``total`` bytes to the capacity in words, the difference of the two as
    printed (:func:`~memlib.report.format.fmt_difference`)."""
    if total <= ds.CAPACITY:
        return f"leaves {fmt_difference(ds.CAPACITY, total)} below the capacity"
    return f"exceeds the capacity by {fmt_difference(total, ds.CAPACITY)}"


def _effect(total: int, before: int) -> str:
    """A step's change of the peak, from ``before`` to ``total`` bytes, in words: ``costs 1.20 GiB`` / ``saves 0.40
    GiB``, the difference of the two totals as printed."""
    if total > before:
        return f"costs {fmt_difference(total, before)}"
    if total < before:
        return f"saves {fmt_difference(before, total)}"
    return "changes nothing"


def _before(rows: list[dict]) -> list[int | None]:
    """The total of the step before each row of the ablation (None for the first)."""
    return [None] + [r["total"] for r in rows[:-1]]


def _ranks(ranks: list[int]) -> str:
    """``rank 1`` / ``ranks 1–14`` / ``ranks 0 and 15`` (runs of consecutive ranks collapsed)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    parts = [span(a, b) for a, b in runs]
    if len(ranks) == 1:
        return f"rank {parts[0]}"
    return "ranks " + join_and(parts)


def _recipe(est: Estimate) -> list[dict]:
    return ds.ablation(est.model, est.train)


def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch09", est.model, est.train)


def _block_clauses(m) -> dict[str, str]:
    """The clauses of the chapter that name a block only a model with it has (the routed experts, MLA's
    up-projections): a model without the block reads the sentence without them."""
    moe, mla = m.has_moe, m.attention == "mla"
    return {
        "report_ep_clause": f", expert parallelism over {fmt_count(ds.REPORT['ep'])} ranks" if moe else "",
        "experts_share": " and a share of their experts" if moe else "",
        "allow_clause": (f"the layout and the expert parallelism that its {fmt_count(m.num_hidden_layers)} layers and "
                         f"{fmt_count(m.n_routed_experts)} routed experts allow" if moe else
                         f"the layout that its {fmt_count(m.num_hidden_layers)} layers allow"),
        "high_precision": "The output head, the router and the norms" if moe else "The output head and the norms",
        "upproj_clause": " and its attention's up-projections" if mla else "",
        "swiglu_clause": (", and the routed experts' SwiGLU output from its cached input" if moe else ""),
        "balanced_clause": ", balanced expert load" if moe else "",
        "ep_clause": ("; expert parallelism does not divide activations either, because each device dispatches its "
                      "own tokens and receives as many for its experts") if moe else "",
    }


def values(est: Estimate) -> dict[str, str]:
    """The chapter's numbers and words for its prose: the report's setup, this configuration, the
    peak device, rank 0, the ledger's totals and the overhead range."""
    m, t = est.model, est.train
    rep = ds.REPORT
    pk = ds.peak(est)
    shallow, deep = pk["chunks"]
    r0 = ds.rank_zero(est)
    layer = ds.layer_totals(m, t)
    ovh = ds.overhead_range(m, t)
    kind = ds.ledger_kind(m)
    return {
        "model": model_name(m),
        "head_clause": "the output head" + ("; the report places its MTP module there so that it shares the "
                                            "embedding and the head with the main model"
                                            if m.num_nextn_predict_layers else ""),
        "recomputed": "the norms and MLA up-projections" if m.attention == "mla" else "the norms",
        **_block_clauses(m),
        "report_gpus": fmt_count(rep["gpus"]), "report_pp": fmt_count(rep["pp"]), "report_ep": fmt_count(rep["ep"]),
        "report_dp": fmt_count(rep["dp"]),
        "gpu": ds.GPU, "cap_mib": fmt_bytes(ds.CAPACITY, "MiB", 0), "cap_gib": fmt_bytes(ds.CAPACITY, "GiB", 2),
        "label": t.label(), "gpus": fmt_count(t.world_size), "pp": fmt_count(t.pp), "ep": fmt_count(t.ep),
        "dp": fmt_count(t.dp), "edp": fmt_count(t.edp), "tp": fmt_count(t.tp), "b": fmt_count(t.micro_batch),
        "s": fmt_count(t.seq_len), "layers": fmt_count(m.num_hidden_layers),
        "dense": fmt_count(m.first_k_dense_replace), "experts": fmt_count(m.n_routed_experts or 0),
        "layout": layout_text(est.partition.layout), "stages_count": fmt_count(len(est.partition.layout)),
        "bytes_per_param": fmt_count(RECIPES[t.precision].total_bytes), "fp8_tile": fmt_count(fp8_scaling(RECIPES[t.precision])[0]),
        "megatron_bytes_per_param": fmt_count(RECIPES["megatron"].total_bytes),
        "ovh_ctx": fmt_bytes(est.overhead.cuda_context, "MiB", 0), "ovh_comm": fmt_bytes(est.overhead.comm_buffers),
        "ovh_frag": pct(est.overhead.fragmentation, 1, 0),
        # the peak device
        "peak_rank": fmt_count(pk["rank"]), "peak_ranks": _ranks(pk["ranks"]), "peak": fmt_bytes(pk["total"]),
        "peak_alloc": fmt_bytes(pk["allocated"]), "peak_states": fmt_bytes(pk["states"]),
        "peak_acts": fmt_bytes(pk["activations"]), "peak_ovh": fmt_bytes(pk["overhead"]),
        "peak_fits": _fits(pk["fits"]), "peak_margin": _margin(pk["total"]),
        "all_fit": "every rank fits" if pk["all_fit"] else "not every rank fits",
        "peak_mb": fmt_count(pk["microbatches"]),
        "shallow_stage": fmt_count(shallow["stage"]), "shallow_mb": fmt_count(shallow["in_flight"]),
        "deep_stage": fmt_count(deep["stage"]), "deep_mb": fmt_count(deep["in_flight"]),
        # rank 0
        "rank0": fmt_bytes(r0["total"]), "rank0_layers": number_word(r0["layers"]),
        "peak_layers": number_word(r0["peak_layers"]),
        "rank0_compare": ("as much as the peak" if r0["is_peak"] else
                          f"{fmt_difference(pk['total'], r0['total'])} less than the peak" if r0["lighter"] else
                          f"{fmt_difference(r0['total'], pk['total'])} more than the peak"),
        "rank0_holds": ("the embedding, the output head and the MTP module" if r0["mtp"] == 1 else
                        f"the embedding, the output head and the {fmt_count(r0['mtp'])} MTP modules" if r0["mtp"] else
                        "the embedding and the output head"),
        "rank0_sentence": (
            f"Rank 0, a peak device, holds {_rank0_holds(r0)} beside its {number_word(r0['layers'])} decoder layers"
            if r0["is_peak"] else
            f"Rank 0, with {_rank0_holds(r0)} beside its {number_word(r0['layers'])} decoder layers "
            f"({number_word(r0['peak_layers'])} on the peak device), needs {fmt_bytes(r0['total'])}, "
            + (f"{fmt_difference(pk['total'], r0['total'])} less than the peak" if r0["lighter"] else
               f"{fmt_difference(r0['total'], pk['total'])} more than the peak")),
        # one layer's ledger
        "ledger_kind": "MoE" if kind == "moe" else "dense",
        "layer_plain": fmt_bytes(layer["plain"], "MiB"), "layer_recipe": fmt_bytes(layer["recipe"], "MiB"),
        "layer_saved": fmt_difference(layer["plain"], layer["recipe"], "MiB"),
        # the overhead bands
        "peak_high": fmt_bytes(ovh["high"]["total"]), "high_fits": _fits(ovh["high"]["fits"]),
        "high_margin": _margin(ovh["high"]["total"]),
    }


def ablation_values(est: Estimate) -> dict[str, str]:
    """The ablation in words: the baseline, each step's effect on the peak, the final peak."""
    rows = {r["key"]: r for r in _recipe(est)}
    summary = ds.ablation_summary(list(rows.values()))
    base, dual, final = rows["baseline"], rows["dualpipe"], rows["recompute"]
    out = {
        "base": fmt_bytes(base["total"]), "base_rank": fmt_count(base["stage"]),
        "base_largest": CATEGORY_LABELS[dict(_SERIES)[base["largest"]]],
        "base_largest_bytes": fmt_bytes(base[base["largest"]]), "base_fits": _fits(base["fits"]),
        "base_mb": fmt_count(base["microbatches"]), "dual_mb": fmt_count(dual["microbatches"]),
        "base_params": fmt_count(base["parameters"]), "dual_params": fmt_count(dual["parameters"]),
        "final": fmt_bytes(final["total"]), "final_fits": _fits(final["fits"]), "final_margin": _margin(final["total"]),
        "saved": fmt_bytes(summary["saved"]),
        "fit_summary": ("no step fits the device" if summary["none_fit"] else
                        "only the last step, the full recipe, fits the device" if summary["only_last_fits"] else
                        "every step fits the device, the naive baseline included" if summary["first_fit"] == "baseline" else
                        f"the peak device fits from the step “{rows[summary['first_fit']]['label']}” on"
                        if summary["first_fit"] else "the full recipe does not fit the device"),
    }
    for (key, r), before in zip(rows.items(), _before(list(rows.values()))):
        if before is not None:
            out[f"{key}_effect"] = _effect(r["total"], before)
    return out


def ablation_table(est: Estimate) -> str:
    """The peak device after each step: its rank, its terms, its total, the change, and whether it fits (GiB),
    read with memlib's measured errors (``marginal`` inside their band)."""
    steps = _recipe(est)
    rows = [[r["label"], r["what"], fmt_count(r["stage"]), fmt_bytes(r["states"], with_unit=False),
             fmt_bytes(r["activations"], with_unit=False), fmt_bytes(r["overhead"], with_unit=False),
             f"**{fmt_bytes(r['total'], with_unit=False)}**",
             "—" if before is None else fmt_difference(r["total"], before, signed=True, with_unit=False),
             VERDICT_CELLS[r["verdict"]]]
            for r, before in zip(steps, _before(steps))]
    return md_table(["step", "what changes", "peak rank", "model states (GiB)", "activations (GiB)",
                     "overheads (GiB)", "total (GiB)", "change (GiB)", f"fits the {ds.GPU}"], rows, "llrrrrrrc")


def _wrap(label: str) -> str:
    """A step's label on lines short enough for its bar's width."""
    import textwrap

    return textwrap.fill(label, 12, break_on_hyphens=False, break_long_words=False)


def _clear_of_line(fig, ax, totals, line_y: float) -> None:
    """Keep the capacity line off the bars' totals: a total that the line would cross moves inside the
    top of its bar (the line's label is in the legend, clear of the bars)."""
    fig.draw_without_rendering()
    y = ax.transData.transform((0, line_y))[1]
    for t in totals:
        box = t.get_window_extent()
        if box.y0 <= y <= box.y1:
            t.set(va="top")
            t.xyann = (0, -2)


def ablation_figure(est: Estimate):
    """The peak device after each step as stacked bars (model states, activations, overheads), GiB,
    with the device's capacity (the line crosses no label)."""
    rows = _recipe(est)
    fig, ax = new_figure(height=4.0)
    series = [Series(CATEGORY_LABELS[cat], CATEGORY_COLORS[cat], [r[key] for r in rows]) for key, cat in _SERIES]
    stacked_bars(ax, [_wrap(r["label"]) for r in rows], series, total_unit=False)
    totals = list(ax.texts)
    capacity_line(ax, ds.CAPACITY, CAPACITY_LABEL, legend=True)
    ax.margins(y=0.1)
    ax.set_ylabel("peak device, GiB")
    ax.legend(ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    _clear_of_line(fig, ax, totals, in_unit(ds.CAPACITY))
    return fig


def rank_table(est: Estimate) -> str:
    """Every pipeline rank: its model stages (layers), micro-batches in flight at its peak per stage,
    parameters and the bytes of the three categories the figure draws (GiB): nine columns, so that the
    totals and the verdict fit the text column."""
    rows = []
    for r in ds.rank_rows(est):
        rows.append([fmt_count(r["rank"]), " + ".join(f"{c['stage']} ({c['layers']})" for c in r["chunks"]),
                     " + ".join(fmt_count(c["in_flight"]) for c in r["chunks"]), fmt_count(r["parameters"]),
                     fmt_bytes(r["states"], with_unit=False), fmt_bytes(r["activations"], with_unit=False),
                     fmt_bytes(r["overhead"], with_unit=False), f"**{fmt_bytes(r['total'], with_unit=False)}**",
                     yes_no(r["fits"])])
    rows = collapse_runs(rows, 3)
    return md_table(["rank", "model stages (layers)", "micro-batches in flight", "parameters", "model states (GiB)",
                     "activations (GiB)", "overheads (GiB)", "total (GiB)", f"fits the {ds.GPU}"], rows, "llrrrrrrc")


def rank_figure(est: Estimate):
    """Stacked bars per pipeline rank (model states, activations, overheads), GiB, with the capacity."""
    rows = ds.rank_rows(est)
    fig, ax = new_figure(height=3.8)
    series = [Series(CATEGORY_LABELS[cat], CATEGORY_COLORS[cat], [r[key] for r in rows]) for key, cat in _SERIES]
    stacked_bars(ax, [fmt_count(r["rank"]) for r in rows], series, totals=False)
    capacity_line(ax, ds.CAPACITY, CAPACITY_LABEL, legend=True)
    ax.margins(y=0.1)
    ax.set_xlabel("pipeline rank")
    ax.legend(ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    return fig


#: how the choices table names a layer kind
_KIND_WORDS = {"dense": "dense layers", "moe": "MoE layers"}


#: how a verdict reads after "it"
_VERDICT_WORDS = {"fits": "fits", "marginal": "is marginal on", "does not fit": "does not fit"}


#: the transient terms of a replayed peak (:data:`memlib.device.peak.TRANSIENT_TERMS`), in words
_TRANSIENT_WORDS = {"recompute_working_set": "a recomputed layer's tensors", "backward_gradients": "the backward's gradients",
                    "cross_entropy_logits": "the loss's logits", "cross_entropy_workspace": "the fused loss's workspace",
                    "offload_reload": "the reloaded offloaded tensors", "forward_transients": "the forward's transient tensors",
                    "batch_attention_mask": "the batch's attention mask",
                    "backward_released": "less what the backward has freed"}


def _gap_clause(g: dict) -> str:
    """Why ``max_memory_allocated`` differs from this accounting's allocated bytes
    (:func:`memlib.scenarios.uncertainty.accounting_gap`), as a clause after the replay's value: the terms that
    differ, each beside the one it takes the place of."""
    if g["replay"] == g["book"]:
        return ", the allocated bytes of this accounting"
    parts = []
    if g["persistent"] != g["states"]:
        parts.append(f"Megatron-Core's buffers ({fmt_bytes(g['persistent'])}) where this accounting counts the model "
                     f"states ({fmt_bytes(g['states'])})")
    if g["replay_held"] != g["book_held"]:
        parts.append(f"{fmt_bytes(g['replay_held'])} of micro-batches held where this accounting counts "
                     f"{fmt_bytes(g['book_held'])}")
    transient = g["transient_total"]
    if transient != g["working_set"]:
        what = join_and(_TRANSIENT_WORDS[k] for k in g["transient"]) or "nothing"
        parts.append(f"what is alive only while the busiest step computes, {what} ({fmt_bytes(transient)}), where this "
                     f"accounting counts one layer's "
                     f"recompute working set ({fmt_bytes(g['working_set'])})")
    return (f", not the {fmt_bytes(g['book'])} allocated of this accounting: replaying the schedule step by step, it "
            f"counts {join_and(parts)}")


def verdict_values(est: Estimate) -> dict[str, str]:
    """The peak device read with memlib's measured errors (:func:`memlib.scenarios.uncertainty.judged`), and why
    ``max_memory_allocated`` differs from this accounting (:func:`memlib.scenarios.uncertainty.accounting_gap`)."""
    j = judged(est, ds.CAPACITY)
    return {"pa": fmt_bytes(j["peak_allocated"]), "pa_why": _gap_clause(accounting_gap(est)),
            "rest": fmt_bytes(j["rest"]), "band": band_text(j["band"]),
            "far": fmt_bytes(j["far"]), "verdict": _VERDICT_WORDS[j["verdict"]]}


def choices_table(est: Estimate) -> str:
    """The norm and SwiGLU outputs the recipe recomputes or keeps (:func:`memlib.scenarios.deepseek.
    recipe_choices`), one row per saved tensor with the layers it concerns."""
    c = ds.recipe_choices(est.model, est.train)
    kinds = list(dict.fromkeys(est.model.layer_kinds))
    rows = []
    for what, word in (("recomputed", "recomputed in backward"), ("kept", "kept from the forward")):
        where: dict[str, list[str]] = {}
        for kind, name in c[what]:
            where.setdefault(name, []).append(kind)
        rows += [[name, "every layer" if len(ks) == len(kinds) > 1 or kinds == ks else
                  ", ".join(_KIND_WORDS[k] for k in ks), word] for name, ks in where.items()]
    return md_table(["saved tensor", "in", "under the recipe"], rows, "lll")


def choices_values(est: Estimate) -> dict[str, str]:
    """The recipe's choices in words: the E5M6 tensors and DualPipe's mirrored optimizer states."""
    c = ds.recipe_choices(est.model, est.train)
    e5m6 = " and ".join(n.split(",")[0] for n in c["e5m6"])
    return {"e5m6_clause": (f"; the {e5m6} in the report's twelve-bit E5M6 format, counted at 12 bits an element "
                            f"with no scale, as the report describes none") if e5m6 else "",
            "mirror_saving": fmt_bytes(c["mirror_saving"]), "mirror_rank": fmt_count(c["peak_rank"])}


def ledger_table(est: Estimate) -> str:
    """One layer's saved tensors, bytes per micro-batch on one device (MiB), plain and under the recipe."""
    rows = [[r["name"], fmt_bytes(r["plain"], "MiB", with_unit=False),
             "recomputed" if r["recomputed"] else fmt_bytes(r["recipe"], "MiB", with_unit=False),
             "—" if r["recomputed"] else _FORMATS.get(r["format"], r["format"])]
            for r in ds.ledger_rows(est.model, est.train)]
    return md_table(["saved tensor", "bf16, nothing recomputed (MiB)", "the recipe (MiB)", "stored as"], rows, "lrrl")


#: how the ledger table names a stored format
_FORMATS = {"fp8": "FP8", "E5M6": "E5M6", "bf16": "bf16", "fp32": "fp32", "mask": "bool (one byte)", "int32": "int32",
            "int64": "int64"}


def problem_values(est: Estimate) -> dict[str, str]:
    """The worked problem: the recipe with more sequences per micro-batch."""
    p = ds.micro_batch_change(est.model, est.train, PROBLEM_MICRO_BATCH)
    return {"p_b": fmt_count(p["micro_batch"]), "p_rank": fmt_count(p["rank"]), "p_peak": fmt_bytes(p["total"]),
            "p_acts": fmt_bytes(p["activations"]), "p_acts_before": fmt_bytes(p["activations_before"]),
            "p_states": fmt_bytes(p["states"]),
            "p_states_word": "do not change" if p["states_unchanged"] else "change",
            "p_verdict": _fits(p["fits"]), "p_margin": _margin(p["total"]),
            "p_conclusion": ("one sequence per micro-batch is what the memory allows" if not p["fits"] else
                             "the memory allows the larger micro-batch")}


#: DualPipe's two chunks of a rank, and the operations, in words
_CHUNK_WORDS = {0: "shallow", 1: "deep"}
_OP_WORDS = {"F": "forward", "B": "backward", "W": "weight gradient"}


def _rank0_holds(r0: dict) -> str:
    return ("the embedding, the output head and the MTP module" if r0["mtp"] == 1 else
            f"the embedding, the output head and the {fmt_count(r0['mtp'])} MTP modules" if r0["mtp"] else
            "the embedding and the output head")


def memory_time_values(ot: OverTime) -> dict[str, str]:
    """One DualPipe iteration on the clock: the peak rank's busiest step and what it holds then."""
    pk = ot.peak
    ops = " overlapped with ".join(f"the {_OP_WORDS[op.kind]} of micro-batch {op.mb} on its {_CHUNK_WORDS[op.chunk]} "
                                   f"chunk" for op in pk.slot.ops)
    r0 = ot.peaks[0]
    return {"m": fmt_count(ot.microbatches), "length": fmt_count(ot.length), "peak_rank": fmt_count(ot.peak_rank),
            "peak": fmt_bytes(pk.allocated), "peak_start": fmt_count(pk.slot.start), "ops": ops,
            "shallow": fmt_count(pk.counts[0]), "deep": fmt_count(pk.counts[1]), "total": fmt_count(pk.microbatches),
            "r0_shallow": fmt_count(r0.counts[0]), "r0_deep": fmt_count(r0.counts[1]), "r0_peak": fmt_bytes(r0.allocated),
            "r0_sentence": ("" if ot.peak_rank == 0 else
                            f"Rank 0 holds {fmt_count(r0.counts[0])} and {fmt_count(r0.counts[1])} at its peak, "
                            f"{fmt_bytes(r0.allocated)}.")}


def memory_time_figure(ot: OverTime):
    """Every rank's allocated bytes over one DualPipe iteration, and the peak rank's split into model
    states and activations, GiB per device."""
    return memory_time_panels(ot, f"time (slots: a forward {DURATION['F']}, a backward {DURATION['B']}, "
                                  f"an overlapped pair both)")


def switch_values(sw: dict, model=None) -> dict[str, str]:
    """The eager-to-fused switch between the previous chapter and this one, for the prose (with ``model``, the
    sentence that says why the ``deepseek`` policy does or does not fit under eager attention)."""
    return attention_switch_values(sw, model)
