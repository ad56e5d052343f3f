"""Chapter 4, "Static parameters per device": tables, figures and glued values, formatted from
:mod:`memlib.paper.static` and :mod:`memlib.scenarios.static`.

Every function takes the chapter's :class:`~memlib.device.estimate.Estimate` (built once in the chapter's
configuration cell); nothing here computes a quantity.  The paper's printed values reach the
chapter only through :func:`paper_values` and the printed columns of :func:`table5` and
:func:`table6`, all empty for a model other than the paper's; :func:`absent_paper_values` glues a
placeholder under each of :data:`PAPER_KEYS` for such a model, because a ``{glue:text}`` role is
resolved even inside an ``{only} paper_model`` block that the build then drops.
"""
from __future__ import annotations

from ..model.architecture import attention_name, block_names
from ..device.estimate import Estimate
from ..paper import analysed_stage, is_paper_model, moe_stages
from ..paper import static as pstatic
from ..model.partition import SHARDING
from ..scenarios import static as sstatic
from ..config.precision import RECIPES
from ..core.symbols import SYMBOLS
from .diagrams import ep_groups_per_row, stage_diagram
from .figures import BLOCK_COLORS, Series, new_figure, stacked_bars
from .format import (counted, fmt_bytes, fmt_count, join_and, layout_text, math, md_table, model_name, pct, ratio, span, tex)
from .notation import chapter_notation

__all__ = ["convention_differences", "stage", "notation", "values", "paper_values", "PAPER_KEYS", "absent_paper_values", "table5",
           "tensor_table", "table6", "stage_table", "split_table", "stages_figure", "problem_values", "ep_problem_values",
           "device_figure", "device_values"]

#: the number formats of a byte width, for the prose
FORMATS = {1: "fp8", 2: "bf16", 4: "fp32", 8: "fp64"}

#: the rows of the paper's Table 6 as the chapter labels them
T6_LABELS = {"RMSNorm": "RMSNorm", "MLA, split": "MLA, split by TP", "MLA, replicated": "MLA, replicated",
             "MLA": "MLA", "non-MoE": "non-MoE (RMSNorm + MLA)", "MoE": "MoE", "total": "**total**"}

#: glue keys (after the chapter's prefix) of the Table 6 rows
T6_KEYS = {"RMSNorm": "rmsnorm", "MLA, split": "mla_split", "MLA, replicated": "mla_replicated", "MLA": "mla",
           "non-MoE": "non_moe", "MoE": "moe", "total": "total"}

#: what :func:`paper_values` glues for the paper's model
PAPER_KEYS = ("printed_total", "printed_total_gb", "printed_mla_gb", "t6_counts", "t6_slips", "t6_slips_verb")

SHARDS = ("tp", "replicated", "expert")


def stage(est: Estimate) -> int:
    """The stage the chapter analyses (the paper's: the first MoE-only stage)."""
    return analysed_stage(est.partition)


def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch04", est.model, est.train)


def _stages_text(indices: list[int]) -> str:
    """``'stage 15'``, ``'stages 1–14'``, ``'stages 0 and 15'``: consecutive runs collapsed."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] + 1 == i:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    parts = [span(a, b) for a, b in runs]
    return ("stage " if len(indices) == 1 else "stages ") + join_and(parts)


def _holds(row: dict, profile: str = "paper") -> str:
    """What a stage's device holds, in words: its layers and the ends of the model."""
    blocks = row[profile]["blocks"]
    parts = []
    if row["dense"]:
        parts.append(counted(row["dense"], "dense layer"))
    if row["moe"]:
        parts.append(counted(row["moe"], "MoE layer"))
    if row["first"]:
        parts.append("the embedding")
    if "final_norm" in blocks:
        parts.append("the final RMSNorm")
    if "head" in blocks:
        parts.append("the output head")
    if row[profile]["mtp"]:
        parts.append("the MTP modules")
    return join_and(parts)


def _holds_short(row: dict) -> str:
    """The stage table's "holds" column: ``3 dense + 1 MoE; embedding``."""
    layers = " + ".join(x for x in (f"{row['dense']} dense" if row["dense"] else "",
                                    f"{row['moe']} MoE" if row["moe"] else "") if x)
    ends = [name for name, present in (("embedding", row["first"]), ("final norm", "final_norm" in row["paper"]["blocks"]),
                                       ("head", "head" in row["paper"]["blocks"])) if present]
    text = "; ".join(x for x in (layers, ", ".join(ends)) if x)
    return text + (" (+ MTP for megatron)" if row["megatron"]["mtp"] and not row["paper"]["mtp"] else "")


_LAYOUT_RULES = {
    "default": "the default rule: ⌈l/PP⌉ layers on every stage and the remainder on the last",
    "balanced": "the layers spread as evenly as possible, the lighter stages at the ends",
    "given": "as the configuration gives them",
}

#: why the layout is not the default one, by whether the default rule fits the model
_DEFAULT_FITS = {True: "", False: " (the default rule, ⌈l/PP⌉ layers on every stage and the remainder on the "
                                   "last, runs out of layers before the last stage)"}


def _shared_experts(n: int) -> str:
    """The shared experts after "the": 'shared expert' for one, 'two shared experts' for more."""
    return "shared expert" if n == 1 else counted(n, "shared expert")


def values(est: Estimate) -> dict[str, str]:
    """The chapter's numbers and computed words for its prose (every one of them, formatted)."""
    part, t, m = est.partition, est.train, est.model
    i = stage(est)
    rec = RECIPES[t.precision]
    t6, b6 = pstatic.table6(part, i), pstatic.table6_bytes(part, i)
    sh = pstatic.shares(part, i)
    ex = pstatic.experts_per_device(part, i)
    moe = moe_stages(part)
    rows = pstatic.stage_rows(part)
    big = pstatic.largest_stages(part, i)
    pc = pstatic.profile_comparison(part, i)
    layout = pstatic.layout_rule(part)
    shared_word = "shared expert" if ex["shared"] == 1 else "shared experts"
    out = {
        "model": model_name(m), "label": t.label(),
        **{k: fmt_count(v) for k, v in pstatic.table5(t).items()},
        "world": fmt_count(t.world_size), "bw": fmt_count(rec.weights),
        "weights_format": FORMATS.get(rec.weights, f"{rec.weights}-byte"),
        "attention": attention_name(m),
        "stage": fmt_count(i), "moe_stages": span(moe[0], moe[-1]) if moe else fmt_count(i),
        "first_stage": fmt_count(rows[0]["stage"]), "last_stage": fmt_count(rows[-1]["stage"]),
        "layout": layout_text(part.layout), "layout_rule": _LAYOUT_RULES[layout["rule"]]
        + (_DEFAULT_FITS[layout["default_fits"]] if layout["rule"] != "default" else ""),
        "moe_layers": fmt_count(ex["moe_layers"]), "moe_layers_text": counted(ex["moe_layers"], "MoE layer"),
        "experts_routed": fmt_count(ex["routed"]), "experts_shared": fmt_count(ex["shared"]),
        "shared_word": shared_word, "experts_per_layer": fmt_count(ex["per_layer"]),
        "shared_clause": (f" and the {_shared_experts(ex['shared'])}" if ex["shared"] else "")
        + f", so {counted(ex['per_layer'], 'expert')}",
        "experts_per_device": fmt_count(ex["per_device"]),
        **{T6_KEYS[r]: fmt_count(n) for r, n in t6.items()},
        **{T6_KEYS[r] + "_gib": fmt_bytes(n) for r, n in b6.items()},
        "total_bytes": fmt_count(b6["total"]), "mla_bytes": fmt_count(b6["MLA"]), "mla_mib": fmt_bytes(b6["MLA"], "MiB"),
        "moe_share": pct(sh["MoE"], 1), "non_moe_share": pct(sh["non-MoE"], 1),
        "tp_share": pct(sh["tp"], 1), "expert_share": pct(sh["expert"], 1),
        "replicated_params": fmt_count(pstatic.sharded(part, i)["replicated"]),
        "largest_share": {"tp": "what TP splits", "replicated": "what every rank replicates",
                          "expert": "the routed experts EP splits"}[pstatic.largest_share(part, i)],
        "first_holds": _holds(rows[0]), "last_holds": _holds(rows[-1]),
        "largest_stages": _stages_text(big["stages"]), "largest_params": fmt_count(big["params"]),
        "largest_gib": fmt_bytes(big["bytes"]),
        "analysed_largest": ("stores less" if not big["includes"] else
                             "is that stage" if len(big["stages"]) == 1 else "is one of them"),
        "expert_majority": _majority(est),
        "diff_wqr": fmt_count(pc["wqr"]), "diff_shared": fmt_count(pc["shared"]), "diff_stage": fmt_count(pc["stage"]),
        "diff_stage_gib": fmt_bytes(pc["stage_bytes"]), "megatron_stage_gib": fmt_bytes(pc["megatron_stage_bytes"]),
        "mtp": fmt_count(pc["mtp"]), "mtp_note": "this model has " + (counted(m.num_nextn_predict_layers, "MTP module") if pc["has_mtp"] else "none"),
        "final_norm": fmt_count(pc["final_norm"]), "last_paper": fmt_count(pc["paper_last"]),
        "last_megatron": fmt_count(pc["megatron_last"]),
        "last_change": (f"grows, although its {attention_name(m)} and {shared_word} shrink" if pc["last_grows"]
                        else f"shrinks with its {attention_name(m)} and {shared_word}"),
        "last_takeaway": ("and its MTP modules make the last stage heavier than the paper assumes" if pc["last_grows"]
                          else "on the last stage too, which holds no MTP module"),
        **_block_words(est, rows[i], moe),
    }
    return out


def _block_words(est: Estimate, row: dict, moe: list[int]) -> dict[str, str]:
    """The clauses whose words depend on the model's blocks: the analysed device's blocks (a dense model's
    are its own: embedding, attention, norms, dense FFN), where the routed experts go, which stage is the example
    and why, and the split a dense model's device has instead of the MoE block's."""
    m, t, i = est.model, est.train, row["stage"]
    if m.has_moe:
        t6 = pstatic.table6(est.partition, i)
        return {"answer_blocks": f"{attention_name(m)} {fmt_count(t6['MLA'])}, the RMSNorms {fmt_count(t6['RMSNorm'])} "
                                 f"and the MoE block {fmt_count(t6['MoE'])}",
                "expert_clause": f" inside each, and the routed experts of a layer spread over EP = {fmt_count(t.ep)} ranks "
                                 f"with ETP = {fmt_count(t.etp)}",
                "example": (f"Stages {span(moe[0], moe[-1]) if moe else fmt_count(i)} "
                            + ("hold only MoE layers" if "dense" in m.layer_kinds
                               else "hold MoE layers and neither the embedding nor the head") + ", the kind "
                            "of stage the paper analyses; we take the device of the first of them, stage "
                            f"{fmt_count(i)} with {counted(row['moe'], 'MoE layer')}, as the example."),
                "every_intro": "The paper stops at the MoE-only stages; memlib counts every stage.",
                "computes": "the paper's Table 5 (the parallel configuration) and Table 6 (static parameters per device)",
                "fig_majority": "The routed experts are more than half of a device's parameters on "
                                + _majority(est) + "."}
    names = block_names(m)
    blocks = row["paper"]["blocks"]
    return {"answer_blocks": join_and(f"the {names.get(b, b)} {fmt_count(n)}" if b != "attention"
                                      else f"{attention_name(m)} {fmt_count(n)}" for b, n in blocks.items() if n),
            "expert_clause": " inside each",
            "example": (f"Every stage holds dense layers only; we take the device of stage {fmt_count(i)}, which "
                        "also holds the embedding, as the example."),
            "every_intro": "memlib counts every stage.", "fig_majority": "Every stage holds dense layers only.",
            "computes": "the paper's Table 5 (the parallel configuration) and the parameters each device stores"}


def _majority(est: Estimate) -> str:
    """The stages on which the routed experts are more than half of a device's parameters, in words."""
    majority = pstatic.expert_majority(est.partition)
    minority = [s for s, yes in majority.items() if not yes]
    return "every stage" + (" except " + _stages_text(minority) if minority else "")


def convention_differences(est: Estimate) -> str:
    """Where the paper's and Megatron-Core's conventions store different parameters, as a counted list of
    only the differences this model has (Markdown), or that they store the same."""
    v, pc = values(est), pstatic.profile_comparison(est.partition, stage(est))
    items = []
    if pc["wqr"]:
        items.append(f"* **Splitting $W^{{QR}}$ by TP** (Megatron-Core) stores {v['diff_wqr']} fewer parameters on a "
                     f"device of stage {v['stage']}.")
    if pc["shared"]:
        items.append(f"* **Splitting the {v['shared_word']} by TP** stores {v['diff_shared']} fewer.")
    if pc["wqr"] or pc["shared"]:
        items.append(f"  Together the device of stage {v['stage']} drops by {v['diff_stage']} parameters "
                     f"({v['diff_stage_gib']}), to {v['megatron_stage_gib']}.")
    if pc["mtp"]:
        items.append(f"* **The MTP modules**, which Megatron-Core builds on the last stage and the paper leaves out, "
                     f"add {v['mtp']} parameters per device there ({v['mtp_note']}). The last stage's device goes from "
                     f"{v['last_paper']} parameters to {v['last_megatron']}: it {v['last_change']}.")
    n = len([x for x in (pc["wqr"], pc["shared"], pc["mtp"]) if x])
    if n == 0:
        return (f"The two conventions store the same parameters on every device of {model_name(est.model)}: "
                "it has none of the tensors they place differently.")
    where = {1: "one place", 2: "two places", 3: "three places"}[n]
    return f"The conventions differ in {where}, all visible in the figure above:\n\n" + "\n".join(items)


def paper_values(est: Estimate) -> dict[str, str]:
    """The paper's printed values and the comparisons with them (empty unless the model is the paper's)."""
    printed = pstatic.printed_table6(est.model)
    if not printed:
        return {}
    part, i = est.partition, stage(est)
    same = pstatic.table6_matches(part, i)
    slips = pstatic.printed_memory_slips(part, i)
    return {"printed_total": fmt_count(printed["total"]["params"]), "printed_total_gb": printed["total"]["memory_gb"],
            "printed_mla_gb": printed["MLA"]["memory_gb"],
            "t6_counts": "every parameter and byte count equals the paper's" if same
            else "not every count equals the paper's",
            "t6_slips": join_and(slips) if slips else "none", "t6_slips_verb": "does" if len(slips) == 1 else "do"}


def absent_paper_values(est: Estimate) -> dict[str, str]:
    """A placeholder under each key of :data:`PAPER_KEYS` for a model other than the paper's (the
    ``{only} paper_model`` blocks that show them are dropped from its book); empty for the paper's."""
    return {} if is_paper_model(est.model) else {k: "—" for k in PAPER_KEYS}


def table5(est: Estimate) -> str:
    """The paper's Table 5 for the chapter's configuration, the printed values beside it for the paper's model."""
    v = pstatic.table5(est.train)
    printed = pstatic.printed_table5(est.model)
    symbols = {"dp": "DP", "tp": "TP", "pp": "PP", "ep": "EP", "etp": "ETP", "cp": "CP", "edp": "EDP"}
    rows = []
    for key in pstatic.TABLE5_KEYS:
        if key in ("ep", "etp", "edp") and not est.model.has_moe:
            continue                                   # a dense model has no expert parallelism
        if key == "devices":
            row = ["devices (world size)", r"$\mathrm{DP}\,\mathrm{TP}\,\mathrm{CP}\,\mathrm{PP}$", fmt_count(v[key])]
        else:
            row = [SYMBOLS[symbols[key]].meaning.split(",")[0], math(symbols[key]), fmt_count(v[key])]
        if printed:
            row.append(fmt_count(printed[key]) if key in printed else "—")
        rows.append(row)
    return md_table(["quantity", "symbol", "memlib"] + (["paper prints"] if printed else []), rows,
                    "lcr" + ("r" if printed else ""))


def tensor_table(est: Estimate) -> str:
    """Each tensor of one MoE layer: shape, how each convention lays it out, and its per-device count."""
    rows, names = [], block_names(est.model)
    for r in pstatic.tensor_layout(est.partition):
        row = [f"${r['latex']}$", names[r["block"]], "$" + r" \times ".join(tex(d) for d in r["shape"]) + "$"]
        for name in pstatic.PROFILE_NAMES:
            row += [SHARDING[r[name]["sharding"]], fmt_count(r[name]["per_device"])]
        rows.append(row)
    return md_table(["tensor", "block", "shape", "paper", "per device", "megatron", "per device"], rows, "llllrlr")


def table6(est: Estimate) -> str:
    """The paper's Table 6 for a device of the analysed stage: exact counts, bytes and GiB, with the
    paper's printed values beside them for the paper's model (its "GB" are GiB)."""
    part, i = est.partition, stage(est)
    t6, b6 = pstatic.table6(part, i), pstatic.table6_bytes(part, i)
    printed = pstatic.printed_table6(est.model)
    rows = []
    # an attention without MLA's replicated down-projections: its split part is the whole (no row "replicated: 0")
    keys = [k for k in pstatic.TABLE6_ROWS if est.model.attention == "mla" or k not in ("MLA, replicated", "MLA")]
    for key in keys:
        p = printed.get(key, {})
        row = [T6_LABELS[key].replace("MLA", attention_name(est.model)), fmt_count(t6[key])]
        if printed:
            row.append(fmt_count(p["params"]) if "params" in p else "—")
        row += [fmt_count(b6[key]), fmt_bytes(b6[key], with_unit=False)]
        if printed:
            row.append(p.get("memory_gb", "—"))
        rows.append(row)
    if printed:
        headers = ["module", "parameters (memlib)", "parameters (paper)", "bytes (memlib)", "GiB (memlib)",
                   "paper prints \"GB\" (= GiB)"]
    else:
        headers = ["module", "parameters", "bytes", "GiB"]
    return md_table(headers, rows)


def stage_table(est: Estimate) -> str:
    """Every stage under both conventions: per-device parameters, GiB of stored weights, the difference; a run
    of consecutive stages that store the same is one row (``1–14``, their layers as one range, "(each)")."""
    rows = []
    for run in _runs(pstatic.stage_rows(est.partition)):
        r, last = run[0], run[-1]
        layers = span(r["layers"][0], last["layers"][-1]) if r["layers"] else "—"
        rows.append([span(r["stage"], last["stage"]), layers, _holds_short(r) + (" (each)" if len(run) > 1 else ""),
                     fmt_count(r["paper"]["params"]), fmt_bytes(r["paper"]["bytes"], with_unit=False),
                     fmt_count(r["megatron"]["params"]), fmt_bytes(r["megatron"]["bytes"], with_unit=False),
                     f"{r['difference']:+,}".replace("-", "−")])
    return md_table(["stage", "decoder layers", "holds", "paper: parameters", "paper: GiB", "megatron: parameters",
                     "megatron: GiB", "megatron − paper (parameters)"], rows, "rllrrrrr")


def _runs(rows: list[dict]) -> list[list[dict]]:
    """Consecutive stages whose devices store the same (their layers' kinds, their ends, both conventions' counts)."""
    def same(r: dict) -> tuple:
        return (r["dense"], r["moe"], r["first"], r["last"], r["paper"]["params"], r["megatron"]["params"],
                r["paper"]["mtp"], r["megatron"]["mtp"])
    runs: list[list[dict]] = []
    for r in rows:
        if runs and same(runs[-1][-1]) == same(r):
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def split_table(est: Estimate) -> str:
    """Every stage's stored weights by how they are sharded, GiB per device, both conventions."""
    shards = [k for k in SHARDS if k != "expert" or est.model.has_moe]      # no expert column for a dense model
    rows = []
    for run in _runs(pstatic.stage_rows(est.partition)):
        r = run[0]
        rows.append([span(run[0]["stage"], run[-1]["stage"])] + [fmt_bytes(r[p]["split_bytes"][k], with_unit=False)
                                               for p in pstatic.PROFILE_NAMES for k in shards])
    headers = ["stage"] + [f"{p}: {SHARDING[k]}" for p in pstatic.PROFILE_NAMES for k in shards]
    return md_table(headers, rows, "r" * len(headers))


def stages_figure(est: Estimate):
    """Stacked bars, one panel per convention: GiB of stored weights on one device of each stage, by block."""
    rows = pstatic.stage_rows(est.partition)
    fig, axes = new_figure(height=6.4, nrows=2, sharex=True, sharey=True)
    handles: dict[str, object] = {}
    titles = {"paper": "the paper's convention (paper)", "megatron": "Megatron-Core's convention (megatron)"}
    for ax, name in zip(axes, pstatic.PROFILE_NAMES):
        series = [Series(label, BLOCK_COLORS[b], [r[name]["block_bytes"].get(b, 0) for r in rows])
                  for b, label in block_names(est.model).items()]
        stacked_bars(ax, [fmt_count(r["stage"]) for r in rows], series, digits=1, total_unit=False)
        ax.set_title(titles[name], fontsize=10, loc="left", pad=12)
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    axes[-1].set_xlabel("pipeline stage")
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", ncol=4)
    return fig


def ep_problem_values(est: Estimate) -> dict[str, str]:
    """The worked problem on more expert parallelism, on the same devices (DeepSeekMoE's experts:
    glued with :func:`~memlib.report.glue.glue_deepseek`)."""
    ep = sstatic.more_ep(est)
    return {
        "p1_label": ep["label"], "p1_ep": fmt_count(ep["ep"]), "p1_edp": fmt_count(ep["edp"]),
        "p1_routed": fmt_count(ep["experts"]["routed"]),
        "p1_shared_words": _shared_experts(ep["experts"]["shared"]),
        "p1_experts": fmt_count(ep["experts"]["per_device"]), "p1_params": fmt_count(ep["params"]),
        "p1_gib": fmt_bytes(ep["bytes"]), "p1_saving_gib": fmt_bytes(ep["saved_bytes"]),
    }


def problem_values(est: Estimate) -> dict[str, str]:
    """The worked problem on no tensor parallelism, on the same devices."""
    tp = sstatic.no_tp(est)
    return {
        "p2_label": tp["label"], "p2_tp": fmt_count(tp["tp"]), "p2_dp": fmt_count(tp["dp"]),
        "p2_mla": fmt_count(tp["mla"]), "p2_params": fmt_count(tp["params"]), "p2_gib": fmt_bytes(tp["bytes"]),
        "p2_extra_gib": fmt_bytes(tp["extra_bytes"]),
        "p2_changed": ("nothing else changes" if tp["only_mla"]
                       else join_and(f"the {_GROUP_WORDS[g](est.model)}" for g in tp["changed"] if g != "mla_split")
                       + " grow too: TP split them as well"),
        "p2_why": (f", since {attention_name(est.model)}, even whole, is {pct(tp['mla_share'], 1)} of the device's "
                   "parameters" if tp["only_mla"] else f", {ratio(tp['growth'], 1)} times as much"),
    }


#: a group of :data:`memlib.paper.static.GROUPS` in words, for a model
_GROUP_WORDS = {"rmsnorm": lambda m: block_names(m)["norms"], "mla_split": attention_name,
                "mla_replicated": lambda m: f"replicated part of {attention_name(m)}", "moe": lambda m: "MoE block",
                "dense_ffn": lambda m: "dense FFN", "embedding": lambda m: "embedding", "head": lambda m: "output head",
                "mtp": lambda m: "MTP modules"}


#: the model states the device-slicing figure shows, in order
STATE_CATEGORIES = ("parameters", "gradients", "optimizer_states")


def _experts(e: tuple[int, int]) -> str:
    """``routed experts 32–63``, or ``routed expert 1``."""
    return f"routed expert {e[0]}" if e[0] == e[1] else f"routed experts {span(*e)}"


def _fraction(f) -> str:
    """A share of a tensor family: ``1/64``, or ``whole``."""
    return "whole" if f == 1 else str(f)


def device_figure(est: Estimate, zero: int | None = None):
    """One pipeline stage of the run drawn by Graphviz (:func:`memlib.report.diagrams.stage_diagram`): the
    pipeline's stages with this one marked; its ranks in their TP groups (framed), a column per set of
    routed experts (its EDP group), coloured by EP index (by TP rank without expert parallelism); and what
    one rank holds: the share of each tensor family of the stage, for parameters, gradients and optimizer
    states under ZeRO stage ``zero`` (``est``'s by default)."""
    t = est.train
    d = sstatic.device_slices(est, zero=zero)
    st = est.partition.stages[d["stage"]]
    layers = f"layers {span(st.layers[0], st.layers[-1])}" if st.layers else "no decoder layer"
    shape = " × ".join(f"{k} {v}" for k, v in (("DP", t.dp), ("TP", t.tp), ("CP", t.cp)) if v > 1 or k == "DP")
    experts = f"; routed experts: EP {t.ep} × EDP {t.edp}" + (f" × ETP {t.etp}" if t.etp > 1 else "") if t.ep > 1 else ""
    zero_word = f"ZeRO-{d['zero']}" if d["zero"] else "no ZeRO"
    words = {
        "stage": f"pipeline stages (PP {t.pp}); stage {d['stage']} holds {layers}",
        "grid": f"stage {d['stage']}: {d['ranks']} ranks = {shape}{experts}",
        "columns": "routed experts", "experts": [span(a, b) for a, b in d["experts_of_ep"] or []],
        "row": "ranks {first}–{last}",
        "ep_row": "EP group {index}: ranks {first}–{last}",
        "rank": f"rank {d['rank']} holds" + (f" {_experts(d['experts'])} and" if d["experts"] else "")
                + " these shares of its stage's tensors",
        "slice_columns": ("parameters", "gradients", f"optimizer states\n({zero_word})"),
    }
    families = [(f["label"],) + tuple(_fraction(f[c]) for c in STATE_CATEGORIES) for f in d["families"]]
    return stage_diagram(sstatic.stage_groups(t), d, families, words)


def device_values(est: Estimate, zero: int | None = None) -> dict[str, str]:
    """The rank :func:`device_figure` details: its stage, rank and coordinates, its routed experts, the ZeRO
    stage and the data-parallel groups its states shard over; and the stage's groups in words."""
    t = est.train
    d = sstatic.device_slices(est, zero=zero)
    g = sstatic.stage_groups(t)
    c = d["coords"]
    e = d["experts"]
    parts = [f"each of the {fmt_count(len(g['tp']))} frames is a TP group of {fmt_count(t.tp)} ranks that split "
             "the tensors TP shards" if t.tp > 1 else "there is no TP (each rank holds its layers' "
             "tensors whole)"]
    if t.ep > 1:
        size = t.ep_etp
        per_row = ep_groups_per_row(t.tp, size, d["ranks"])
        where = (f"each row is one of them ({fmt_count(len(g['ep']))} rows); the {fmt_count(t.edp)} ranks of a column "
                 "hold the same routed experts, an EDP group that averages their gradients" if per_row == 1 else
                 f"each row holds {fmt_count(per_row)} of them; the ranks of the columns that hold the same "
                 "routed experts form an EDP group that averages their gradients")
        parts.append(f"an EP group of {fmt_count(size)} ranks holds all {fmt_count(est.model.n_routed_experts)} routed "
                     f"experts of a layer once: {where}")
    parts.append(f"the {fmt_count(t.dp_cp)} ranks with the same TP rank are the data-parallel group of the "
                 + ("other tensors" if t.ep > 1 else "tensors they hold"))
    groups = "; ".join(parts)
    return {"dev_stage": fmt_count(d["stage"]), "dev_rank": fmt_count(d["rank"]), "dev_ranks": fmt_count(d["ranks"]),
            "dev_zero": fmt_count(d["zero"]), "dev_dp_group": fmt_count(est.train.dp_cp),
            "dev_edp": fmt_count(est.train.edp),
            "dev_tp": fmt_count(c["tp"]), "dev_dp": fmt_count(c["dp"]), "dev_ep": fmt_count(c["ep"]),
            "dev_experts": "no routed experts (a dense model)" if e is None else f"{_experts(e)} of every MoE layer",
            "dev_groups": groups[0].upper() + groups[1:] + ".",
            "dev_colour": "its EP index, the routed experts it holds" if t.ep > 1 else "its TP rank",
            "dev_caption": ("(framed) and, where there is expert parallelism, one EP group per row and one set of routed "
                            "experts per column") if est.model.has_moe else "(framed)"}
