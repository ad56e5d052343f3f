"""Chapter 6, "Activations": tables, figures and glued values, formatted from
:mod:`memlib.paper.activations` and :mod:`memlib.scenarios.activations`.

Every function takes the chapter's :class:`~memlib.device.estimate.Estimate` (built once in the chapter's
configuration cell); the analysed stage is the paper's (:func:`memlib.paper.analysed_stage`).
Nothing here computes a quantity.
"""
from __future__ import annotations


from ..device.estimate import Estimate
from ..model.architecture import attention_name
from ..paper import analysed_stage, is_paper_model, moe_stages
from ..paper import activations as pact
from ..scenarios import activations as sact
from .figures import (CATEGORY_COLORS, OKABE_ITO, POLICY_COLORS, SMALL_FONT, TEXT_WIDTH, in_unit, new_figure,
                      plain_log_ticks)
from .format import (counted, number_word, fmt_bytes, fmt_number, join_and, fmt_count, fmt_decimal, layout_text, math, md_table, model_name, pct, span, tex,
                     wrapped_math, zero_name)
from .notation import chapter_notation

__all__ = ["stage", "notation", "values", "paper_values", "table9", "ledger_table", "dataflow_figure",
           "formula_check_table", "table10_formulas", "table10", "korthikanti_table", "korthikanti_values",
           "microbatch", "seqlen_figure", "policy_table", "problem_values",
           "BLOCK_LABELS", "CLASS_COLORS", "CLASS_LABELS", "routed_count_table", "routed_count_values"]

#: the blocks of a MoE layer, as the book names them
BLOCK_LABELS = {"attention": "MLA", "moe": "MoE"}


def _block_labels(est: Estimate) -> dict[str, str]:
    """The analysed layer's blocks (:func:`memlib.paper.activations.layer_blocks`) as the book names them: the
    model's own attention, then "MoE", or "FFN" for a dense model."""
    attention, ffn = pact.layer_blocks(est.model)
    return {attention: attention_name(est.model), ffn: "MoE" if est.model.has_moe else "FFN"}


def _layer_name(m) -> str:
    """The layer the chapter follows, in words: a MoE layer, or a dense model's decoder layer."""
    return "MoE layer" if m.has_moe else "decoder layer"


def _class_labels(m) -> dict[str, str]:
    """:data:`CLASS_LABELS` in the model's own blocks (the up-projections only with MLA)."""
    return {**CLASS_LABELS, "deepseek": "norm outputs, up-projections (deepseek)" if m.attention == "mla"
            else "norm outputs (deepseek)"}

#: the colour of a saved tensor in the data-flow figure: the weakest named policy that drops it
CLASS_COLORS = {"selective": POLICY_COLORS["selective"], "deepseek": POLICY_COLORS["deepseek"],
                "moe": POLICY_COLORS["modules"], "full": POLICY_COLORS["none"], "kept": POLICY_COLORS["full"]}
CLASS_LABELS = {"selective": "attention core (selective)", "deepseek": "norm outputs, up-projections (deepseek)",
                "moe": "MoE internals (module lists)", "full": "dropped by full recomputation only",
                "kept": "kept by every policy (checkpointed inputs)"}

SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "dualpipe": "DualPipe"}
#: each schedule in words, where the chapter first names it
SCHEDULE_DEFINED = {
    "gpipe": "GPipe (every micro-batch's forward pass, then every backward pass)",
    "1f1b": "1F1B (one forward, one backward: once the pipeline is full, each stage alternates the two passes)",
    "interleaved": "interleaved 1F1B (1F1B over several smaller virtual stages per device)",
    "dualpipe": "DualPipe (DeepSeek-V3's schedule, which feeds micro-batches from both ends of the pipeline)"}
DTYPE_NAMES = {"mask": "mask", "fp32": "fp32", "int64": "int64", "int32": "int32"}


def stage(est: Estimate) -> int:
    """The stage the chapter analyses (the paper's: the first MoE-only stage)."""
    return analysed_stage(est.partition)


def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch06", est.model, est.train)


def _policy_name(p: str) -> str:
    return p if p in pact.POLICY_ORDER else "module list"


def _block_words(m) -> dict[str, str]:
    """The words of the chapter that name the model's own blocks."""
    mla, shared = m.attention == "mla", bool(m.n_shared_experts) or m.moe == "qwen2_moe"
    if m.has_moe:
        intro = ("The MoE block: the router and the routed experts of one device with their share of the tokens"
                 + (", and the shared experts, which see every token:" if shared else ":"))
    else:
        intro = "The dense FFN, which sees every token:"
    whole = (["the key-value latent"] if mla else []) + (["the query latent"] if mla and m.q_lora_rank else []) \
        + (["the router"] if m.has_moe else []) + (["the shared experts"] if m.has_moe and shared else [])
    listed = join_and(whole)
    layer = _layer_name(m)
    return {"layer_name": layer, "layer_name_cap": f"{layer[:1].upper()}{layer[1:]}",
            "full_keeps": "each block's input (split by sequence parallelism) and, in the MoE block, the routing "
            "map, so that the recomputed forward routes every token as before" if m.has_moe
            else "each block's input (split by sequence parallelism)",
            "balanced": ", perfectly balanced experts," if m.has_moe else ",",
            "full_policy": "everything but each layer's input and the routing map" if m.has_moe
            else "everything but each layer's input","attention": attention_name(m), "ffn_name": "MoE" if m.has_moe else "FFN", "ffn_intro": intro,
            "whole_sentence": (f" {listed[:1].upper()}{listed[1:]} {'stays' if len(whole) == 1 else 'stay'} whole, "
                               f"since {'its' if len(whole) == 1 else 'their'} weights are replicated.")
            if whole else " The norms' weights are replicated."}


def values(est: Estimate) -> dict[str, str]:
    """The chapter's numbers and computed words for its prose, for any model."""
    t, i = est.train, stage(est)
    moe = moe_stages(est.partition)
    t9 = pact.table9(est)
    first = t9["micro_batches"][0]
    t10 = pact.table10(est)[first]
    facts = pact.table10_facts(est)
    tokens = pact.routed_tokens(est)
    split = sact.layer_split(est)
    cross = sact.crossover(est)
    pol = {r["policy"]: r for r in sact.policy_comparison(est)}
    n_layers = pact.moe_layers(est)
    held = ("that hold MoE layers only" if "dense" in est.model.layer_kinds
            else "that hold neither the embedding nor the head")
    device = (f"one of stage {fmt_count(i)}, the first of the stages {span(moe[0], moe[-1]) if moe else fmt_count(i)} "
              f"{held}: it holds {counted(n_layers, 'MoE layer')}" if est.model.has_moe else
              f"one of stage {fmt_count(i)}, which holds {counted(n_layers, 'decoder layer')}"
              + (" after the embedding" if est.partition.stages[i].first else ""))
    return {
        "model": model_name(est.model), "label": t.label(), "stage": fmt_count(i), "device": device,
        "stage_layers": counted(n_layers, _layer_name(est.model)),
        **_block_words(est.model),
        "moe_stages": span(moe[0], moe[-1]) if moe else fmt_count(i), "layout": layout_text(est.partition.layout),
        "layers": number_word(pact.moe_layers(est)), "seq_len": fmt_count(t.seq_len), "b": fmt_count(t.micro_batch),
        "tp": fmt_count(t.tp), "ep": fmt_count(t.ep), "etp": fmt_count(t.etp), "cp": fmt_count(t.cp),
        "sp": f"sequence parallelism over the {fmt_count(t.tp)} tensor-parallel ranks" if t9["sp"]
        else "no sequence parallelism",
        "micro_batches": join_and([fmt_count(x) for x in t9["micro_batches"]]), "b_first": fmt_count(first),
        "schedule": SCHEDULE_NAMES.get(t.schedule, t.schedule), "in_flight": fmt_count(pol["none"]["in_flight"]),
        "schedule_defined": SCHEDULE_DEFINED.get(t.schedule, t.schedule),
        # Table 10 at the first micro-batch size
        "none_bytes": fmt_count(t10["none"]["total"]), "none_gib": fmt_bytes(t10["none"]["total"]),
        "full_bytes": fmt_count(t10["full"]["total"]), "full_mib": fmt_bytes(t10["full"]["total"], "MiB"),
        "mla_share": pct(facts["mla_share"], 1), "mla_most": "most" if facts["mla_most"] else "less than half",
        "ratio_none_full": fmt_decimal(facts["none_over_full"], 0),
        # routed tokens
        "local_experts": fmt_count(tokens["local_experts"]), "shared": fmt_count(est.model.n_shared_experts),
        "e_token": fmt_number(tokens["e_token"]), "paper_tokens": fmt_count(tokens["paper"]),
        "held_tokens": fmt_number(tokens["held"]), "held_more": "more" if tokens["held_exceeds"] else "no more",
        # the attention scores
        "scores_count": number_word(split["tensors"]), "scores_layer": fmt_bytes(split["quadratic"]),
        "scores_share": pct(split["share"], 1), "scores_verb": "dominate" if split["dominates"] else "do not dominate",
        "crossover": fmt_count(cross["s"]) if cross else "no",
        # policies
        **{f"{p}_total": fmt_bytes(pol[p]["total"]) for p in pact.POLICY_ORDER},
        "list_total": fmt_bytes(pol[sact.module_list(est.model)]["total"]),
        "full_held": fmt_bytes(pol["full"]["held"]), "full_working": fmt_bytes(pol["full"]["working"]),
    }


#: the keys of :func:`paper_values` (glued as placeholders for another model)
PAPER_KEYS = ("formulas", "formulas_equal", "formulas_verdict", "formulas_rounding")


#: the routed-token rounding in words (a glued text phrase carries no math)
ROUTED_DIVISOR = "the product of the expert- and context-parallel sizes"
ROUTED_COPIES = "a micro-batch's routed token copies"


def paper_values(est: Estimate) -> dict[str, str]:
    """What the prose says of the paper's printed formulas (empty unless the model is the paper's)."""
    if not is_paper_model(est.model):
        return {}
    summary = pact.formula_summary(pact.formula_checks(est))
    n = number_word(summary["formulas"])
    return {"formulas": n,
            "formulas_equal": f"all {n} equal the ledger's sum" if summary["all_equal"]
            else f"{number_word(summary['equal'])} of the {n} equal the ledger's sum",
            "formulas_verdict": "reproduces" if summary["all_equal"] else "does not reproduce",
            "formulas_rounding": f"does not act, since {ROUTED_DIVISOR} divides {ROUTED_COPIES}" if summary["exact"]
            else f"acts, since {ROUTED_DIVISOR} does not divide {ROUTED_COPIES}"}


def table9(est: Estimate) -> str:
    """The paper's Table 9 (the configuration of its activation analysis) for the chapter's model."""
    v = pact.table9(est)
    routed = [
        ["$N_r$", "routed experts per token", fmt_count(v["N_r"])],
        ["$N$", "routed experts per layer", fmt_count(v["N"])],
        ["$E_{token} = b s N_r / N$", "tokens per expert (balanced routing)",
         " / ".join(fmt_number(x) for x in v["e_token"])],
        [r"$\lceil b s N_r / (\mathrm{EP}\,\mathrm{CP}) \rceil$", "the paper's routed token copies on one device",
         " / ".join(fmt_count(x) for x in v["paper_tokens"])],
    ] if est.model.has_moe else []       # a dense model routes no token
    rows = [
        ["$b$", "micro-batch size", " / ".join(fmt_count(x) for x in v["micro_batches"])],
        ["$s$", "sequence length", fmt_count(v["seq_len"])],
        *routed,
        ["$SP$", "sequence parallelism",
         f"on, over the $\\mathrm{{TP}}$ = {fmt_count(v['sp_degree'])} ranks" if v["sp"] else "off"],
        [r"$\mathrm{CP}$", "context parallelism", fmt_count(v["cp"])],
        ["AC", "activation checkpointing (recompute policy)", " or ".join(v["recompute"])],
    ]
    return md_table(["symbol", "meaning", "value"], rows, "lll")


def _dtype(r: dict) -> str:
    name = DTYPE_NAMES.get(r["dtype"]) or ("bf16" if r["element_bytes"] == 2 else "activation dtype")
    return f"{tex(r['element_bytes'])} ({name})"


def ledger_table(est: Estimate, block: str) -> str:
    """The saved tensors of one block (``attention``, or ``ffn``: the model's :func:`memlib.paper.activations.
    ffn_block`): elements, bytes per element, divisors, exact bytes on one device of the configuration, what
    drops it, and notes."""
    rows = []
    for r in pact.ledger_rows(est, pact.ffn_block(est.model) if block == "ffn" else block):
        div = ", ".join(f"${d}$" for d in r["divisors"]) or "—"
        if r["mean_rows"]:
            div += r" $\uparrow$"
        mods = ", ".join(f"`{m}`" for m in r["modules"])
        dropped = f"{mods} ({', '.join(r['policies'])})" if r["policies"] else mods or "none (kept)"
        rows.append([r["name"], math(r["elements"]), _dtype(r), div, fmt_count(r["bytes"]), dropped,
                     r["note"] or "—"])
    return md_table(["saved tensor", "elements", "bytes per element", r"divided by ($\uparrow$: tokens rounded up)",
                     "bytes per device", "dropped by: modules (policies)", "note"], rows, "llllrll")


def _short_name(name: str) -> str:
    """A ledger entry's name as a box of :func:`dataflow_figure` shows it: before its first comma or
    parenthesis, "after W^O" as "after the output", other symbols left out (``c^Q``: the words name it), "gate projection
    output" as "gate output"."""
    short = name.split(",")[0].split(" (")[0].replace(" projection output", " output").replace(" after W^O", " after the output").replace(" * ", " × ")
    return " ".join(w for w in short.split(" ") if "^" not in w)


def dataflow_figure(est: Estimate):
    """The data flow of one MoE layer as the ledger lists it (the paper's Fig. 2 and its MoE
    counterpart): one box per saved tensor, in order, coloured by the weakest policy that drops it,
    labelled with its MiB on one device."""
    from matplotlib.patches import FancyBboxPatch, Patch

    labels = _block_labels(est)
    columns = [(blk, pact.ledger_rows(est, blk)) for blk in labels]
    classes = _class_labels(est.model)
    n = max(len(rows) for _, rows in columns)
    fig, ax = new_figure(TEXT_WIDTH, 0.21 * n + 0.9)
    for col, (blk, rows) in enumerate(columns):
        x0 = col * 1.0
        ax.text(x0 + 0.47, 0.3, f"{labels[blk]} block", ha="center", va="bottom", fontsize=10,
                fontweight="bold")
        for k, r in enumerate(rows):
            y = -k
            ax.add_patch(FancyBboxPatch((x0, y - 0.38), 0.94, 0.7, boxstyle="round,pad=0.0,rounding_size=0.05",
                                        facecolor=CLASS_COLORS[r["class"]], edgecolor="white", alpha=0.85))
            ax.text(x0 + 0.02, y - 0.03, _short_name(r["name"]), ha="left", va="center", fontsize=SMALL_FONT,
                    color="black")
            ax.text(x0 + 0.92, y - 0.03, fmt_bytes(r["bytes"], "MiB", 1), ha="right", va="center",
                    fontsize=SMALL_FONT, color="black")
            if k + 1 < len(rows):
                ax.annotate("", xy=(x0 + 0.45, y - 0.62), xytext=(x0 + 0.45, y - 0.38),
                            arrowprops={"arrowstyle": "->", "lw": 0.8, "color": "grey"})
    ax.set_xlim(-0.02, 1.96)
    ax.set_ylim(-n + 0.3, 0.9)
    ax.axis("off")
    ax.grid(False)
    present = {r["class"] for _, rows in columns for r in rows}
    handles = [Patch(color=CLASS_COLORS[c], label=classes[c]) for c in pact.RECOMPUTE_CLASSES if c in present]
    fig.legend(handles=handles, ncol=2, loc="outside lower center")
    return fig


def formula_check_table(est: Estimate) -> str:
    """Each formula the paper prints beside the ledger's sum: equal or differs (the paper's model only:
    its printed formulas are DeepSeek-V3's)."""
    if not is_paper_model(est.model):
        return "The paper's printed formulas are DeepSeek-V3's: the book built for that model compares them."
    rows = []
    for c in pact.formula_checks(est):
        verdict = "equal" if c["equal"] else (
            "**differs**: the rounding of the routed tokens acts" if c["same_formula"]
            else f"**differs** by ${tex(c['difference'])}$")
        rows.append([c["label"], f"${tex(c['printed'])}$", verdict])
    return md_table(["printed formula", "as printed (expanded)",
                     "the ledger's sum ($d_v = d_h$, the model's $N$, $N_s$)"], rows, "lll")


def table10_formulas(est: Estimate) -> str:
    """The paper's Table 10 as formulas: the stage's MoE layers on one device, both policies."""
    f = pact.table10_formulas(est)
    # the sums without recomputation run to a dozen terms: broken into lines, they fit the column
    rows = [[_block_labels(est).get(blk, blk), wrapped_math(v["none"], 30), wrapped_math(v["full"], 30)]
            for blk, v in f.items()]
    return md_table(["block", "AC = none", "AC = full"], rows, "lll")


def table10(est: Estimate) -> str:
    """Table 10 in numbers: one micro-batch through the analysed stage, exact bytes and GiB."""
    rows = []
    attn_block, ffn_block = pact.layer_blocks(est.model)
    for bb, row in pact.table10(est).items():
        none, full = row["none"], row["full"]
        rows.append([fmt_count(bb), fmt_count(none[attn_block]), fmt_count(none[ffn_block]), fmt_count(none["total"]),
                     fmt_bytes(none["total"], with_unit=False), fmt_count(full["total"]),
                     fmt_bytes(full["total"], digits=3, with_unit=False)])
    attn, ffn = _block_labels(est).values()
    return md_table(["$b$", f"{attn}, none (bytes)", f"{ffn}, none (bytes)", "total, none (bytes)", "total, none (GiB)",
                     "total, full (bytes)", "total, full (GiB)"], rows, "rrrrrrr")


def korthikanti_table() -> str:
    rows = [[r["name"], f"$sbh\\left({tex(r['coefficient'])}\\right)$", f"$sbh\\left({tex(r['printed'])}\\right)$",
             "equal" if r["equal"] else "**differs**"] for r in pact.korthikanti_gpt_rows()]
    return md_table(["technique", "memlib (gpt family's layer)", "Korthikanti et al.", "check"], rows,
                    "llll")


def korthikanti_values() -> dict[str, str]:
    """Korthikanti et al.'s 22B model (the second worked problem) and the verdict on their Table 2."""
    k = pact.korthikanti_22b()
    c = k["config"]
    rows = pact.formula_summary(pact.korthikanti_gpt_rows())
    return {"k_rows": "every row" if rows["all_equal"] else "not every row",
            "p2_name": k["name"], "p2_h": fmt_count(c["h"]), "p2_a": fmt_count(c["a"]), "p2_l": fmt_count(c["L"]),
            "p2_t": fmt_count(c["t"]), "p2_b": fmt_count(c["b"]), "p2_s": fmt_count(c["s"]),
            "p2_none_bytes": fmt_count(k["none"]["bytes"]), "p2_none_gib": fmt_bytes(k["none"]["bytes"], digits=4),
            "p2_none_printed": k["none"]["printed"], "p2_sel_bytes": fmt_count(k["sp_selective"]["bytes"]),
            "p2_sel_gib": fmt_bytes(k["sp_selective"]["bytes"], digits=4),
            "p2_sel_printed": k["sp_selective"]["printed"],
            "p2_verdict": "Both agree exactly." if k["all_equal"] else "They do not both agree."}


def microbatch(est: Estimate):
    """The micro-batch sweep: its computed words for the prose, and the figure (one micro-batch, left;
    everything held at the schedule's peak, right; GiB per device of the analysed stage)."""
    sweep = sact.microbatch_sweep(est)
    facts = sact.microbatch_facts(sweep)
    words = {"mb_proportional": "grow in proportion to" if facts["proportional"] else "do not grow in proportion to",
             "mb_order": "keep" if facts["same_order"] else "do not keep",
             "mb_max": fmt_count(next(iter(sweep.values()))[-1]["b"])}
    fig, (ax1, ax2) = new_figure(TEXT_WIDTH, 2.5, 1, 2)
    for p, rows in sweep.items():
        color = POLICY_COLORS.get(p, POLICY_COLORS["modules"])
        bs = [r["b"] for r in rows]
        ax1.plot(bs, [in_unit(r["per_microbatch"]) for r in rows], marker="o", color=color, label=_policy_name(p))
        ax2.plot(bs, [in_unit(r["total"]) for r in rows], marker="o", color=color, label=_policy_name(p))
    ax1.set_ylabel("one micro-batch, GiB per device")
    ax2.set_ylabel(f"held at the {SCHEDULE_NAMES.get(est.train.schedule, est.train.schedule)} peak,\nGiB per device")
    for ax in (ax1, ax2):
        ax.set_xlabel("micro-batch size b (sequences)")
        ax.set_yscale("log")
        plain_log_ticks(ax)
    fig.legend(*ax2.get_legend_handles_labels(), loc="outside lower center", ncol=5)
    return words, fig


def seqlen_figure(est: Estimate):
    """One MoE layer, one micro-batch, one device: the terms in s², the others and their sum against
    the sequence length, with the crossover and the configured s marked."""
    rows = sact.seqlen_sweep(est)
    cross = sact.crossover(est)
    xs = [r["seq_len"] for r in rows]
    fig, ax = new_figure(height=2.3)
    ax.plot(xs, [in_unit(r["quadratic"]) for r in rows], color=OKABE_ITO["vermillion"],
            label="attention scores (terms in s²)")
    ax.plot(xs, [in_unit(r["linear"]) for r in rows], color=OKABE_ITO["black"],
            label="all other saved tensors (terms in $s$)")
    ax.plot(xs, [in_unit(r["total"]) for r in rows], color=CATEGORY_COLORS["activations"], ls="--",
            label="activations of the layer")
    if cross:
        ax.axvline(cross["s"], color="grey", lw=1, ls=":")
        ax.annotate(f"crossover s = {fmt_count(cross['s'])}", (cross["s"], 0.02), xycoords=("data", "axes fraction"),
                    xytext=(4, 0), textcoords="offset points", fontsize=SMALL_FONT)
    s = est.train.seq_len
    ax.axvline(s, color="grey", lw=1, ls="-.")          # no category's colour: the lines are all activations
    ax.annotate(f"configured s = {fmt_count(s)}", (s, 0.9), xycoords=("data", "axes fraction"), xytext=(4, 0),
                textcoords="offset points", fontsize=SMALL_FONT, color="dimgrey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_log_ticks(ax, "x")
    plain_log_ticks(ax)
    ax.set_xlabel("sequence length s (tokens)")
    ax.set_ylabel(f"one {_layer_name(est.model)}, GiB per device")
    ax.legend(loc="lower right")
    return fig


def _recomputes(r: dict) -> str:
    if r["full"]:
        return "every layer, from its input"
    return ", ".join(f"`{m}`" for m in r["modules"]) or "nothing"


def _policy_name(policy: str) -> str:
    """A named policy in code; a list of modules as "module list" (its modules are in the next column)."""
    return "module list" if "," in policy else f"`{policy}`"


def policy_table(est: Estimate) -> str:
    rows = [[_policy_name(r["policy"]), _recomputes(r), fmt_count(r["layer"]),
             fmt_bytes(r["per_microbatch"], digits=3, with_unit=False), fmt_bytes(r["held"], with_unit=False), fmt_bytes(r["working"], with_unit=False),
             f"**{fmt_bytes(r['total'], with_unit=False)}**"] for r in sact.policy_comparison(est)]
    layer = _layer_name(est.model)
    return md_table(["policy", "recomputes", f"one {layer} (bytes)",
                     "stage, one micro-batch (GiB)", "micro-batches in flight (GiB)",
                     "recompute working set (GiB)", "stage total (GiB)"], rows, "llrrrrr")


def problem_values(est: Estimate) -> dict[str, str]:
    """The worked problem: twice the sequence length under full recomputation."""
    r = sact.seq_len_change(est, 2, "full")
    new = r["new"]
    return {"p1_s": fmt_count(r["seq_len"]), "p1_held": fmt_bytes(new["held"]), "p1_working": fmt_bytes(new["working"]),
            "p1_total": fmt_bytes(new["total"]), "p1_in_flight": fmt_count(new["in_flight"]),
            "p1_held_ratio": fmt_decimal(r["per_microbatch_ratio"], 2),
            "p1_working_ratio": fmt_decimal(r["working_ratio"], 2) if r["working_ratio"] is not None else "—",
            "p1_dominates": "now dominates" if r["working_dominates"] else "still does not dominate"}




#: the two routed-token counts, as the side-by-side table names them


def routed_count_table(cmp: dict, est: Estimate) -> str:
    """The paper's routed-token count beside the one a device holds (:func:`memlib.paper.activations.
    routed_count_comparison`): token copies, one MoE layer's routed tensors, the stage's activations of one
    micro-batch and at its peak, and the device's total, GiB."""
    p, h = cmp["paper"], cmp["held"]
    rows = [["routed token copies on one device", fmt_count(p["tokens"]), fmt_count(h["tokens"])],
            ["routed tensors of one MoE layer, one micro-batch", fmt_bytes(p["layer_routed"]),
             fmt_bytes(h["layer_routed"])],
            ["activations of the stage, one micro-batch", fmt_bytes(p["stage_per_microbatch"]),
             fmt_bytes(h["stage_per_microbatch"])],
            [f"activations held ({fmt_count(p['in_flight'])} micro-batches in flight)", fmt_bytes(p["stage_held"]),
             fmt_bytes(h["stage_held"])],
            [f"the device's total under {zero_name(est.train.zero, short=True)}, overheads included", fmt_bytes(p["total"]),
             fmt_bytes(h["total"])]]
    return md_table(["on one device of the stage", "paper's count", "held after the all-to-all"], rows, "lrr")


def routed_count_values(cmp: dict) -> dict[str, str]:
    """The comparison's numbers for the prose: the two counts, their ratio, what the held count adds."""
    p, h = cmp["paper"], cmp["held"]
    if not p["tokens"]:              # a dense model routes no token
        return {"rc_paper": "0", "rc_held": "0", "rc_ratio": "—", "rc_layer_paper": fmt_bytes(0),
                "rc_layer_held": fmt_bytes(0), "rc_added": fmt_bytes(0),
                "rc_claim": "a model without routed experts routes no token, so neither count applies to it"}
    times = number_word(int(cmp["ratio"])) if cmp["ratio"].denominator == 1 else fmt_decimal(cmp["ratio"], 2)
    return {"rc_paper": fmt_count(p["tokens"]), "rc_held": fmt_count(h["tokens"]), "rc_ratio": times,
            "rc_layer_paper": fmt_bytes(p["layer_routed"]), "rc_layer_held": fmt_bytes(h["layer_routed"]),
            "rc_added": fmt_bytes(cmp["added"]),
            "rc_claim": (f"{fmt_count(h['tokens'])} instead of the paper's {fmt_count(p['tokens'])}, "
                         f"{times} times as many" if h["tokens"] > p["tokens"] else
                         f"under this layout as many as the paper counts, {fmt_count(p['tokens'])}, since EP ETP does "
                         f"not exceed TP")}
