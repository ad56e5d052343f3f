"""Chapter 3, "Parameters": per tensor, per layer, per pipeline stage and per model, beside the
paper's Tables 2-4 (for its model) and DeepSeek's statements, formatted from
:mod:`memlib.paper.parameters` and :mod:`memlib.scenarios.models`.

Every function takes the chapter's :class:`~memlib.device.estimate.Estimate` (built once in the chapter's
configuration cell); nothing here computes a quantity.  The paper's printed values appear only in
:func:`paper_values` and in the paper's columns of :func:`layer_table` and :func:`stage_table`, all of them
empty for another model (the paper's errata are chapter 14's).
"""
from __future__ import annotations

from ..model.architecture import BLOCKS, attention_name, block_names
from ..model.blocks import model_blocks
from ..config import load_model
from ..device.estimate import Estimate
from ..paper import is_paper_model
from ..paper import parameters as pp
from ..data.reference import PAPER
from ..scenarios import models as sm
from ..config.precision import RECIPES
from .figures import BLOCK_COLORS, Series, new_figure, stacked_bars
from .format import (counted, number_word,
    fmt_billions, fmt_bytes, fmt_count, fmt_decimal, join_and, layer_word, layout_text, md_table, model_name, pct,
    span, tex,
)
from .notation import chapter_notation

__all__ = ["PAPER_KEYS", "notation", "values", "paper_values", "matrix_table", "layer_table", "stage_table",
           "totals_table", "official_table", "stage_figure", "problem_values", "stages_text"]

#: weight formats by bytes per element (the column headings)
FORMATS = {1: "fp8", 2: "bf16", 4: "fp32"}

#: what each of DeepSeek's statements is, and what each count beside it is
STATEMENTS = {"total": "total", "activated": "activated", "activated_weights_doc": "activated (weights documentation)",
              "mtp": "MTP module", "checkpoint": "checkpoint (main model and MTP)"}
QUANTITIES = {"total": "main model", "activated": "activated, embedding counted whole",
              "activated_no_embedding": "activated, without the embedding", "mtp": "MTP modules, own parameters",
              "mtp_block": "MTP decoder block alone",
              "checkpoint": "main model + MTP + the MTP's embedding and head copies",
              "stored": "the same, with the FP8 scales and buffers the files store"}

#: legend of the stage figure, per block of :data:`memlib.paper.parameters.FIGURE_BLOCKS`
FIGURE_LABELS = {**BLOCKS, "norms": "RMSNorms", "mtp": "MTP modules"}


def _fmt(est: Estimate) -> str:
    return FORMATS.get(RECIPES[est.train.precision].weights, "weights")


def _gib(n_bytes: int, digits: int = 2, unit: bool = True) -> str:
    return fmt_bytes(n_bytes, "GiB", digits, with_unit=unit)


def stages_text(stages: list[int]) -> str:
    """Stages as ranges: ``1–14``, ``2–13, 15``; ``none`` for no stage."""
    return ", ".join(span(a, b) for a, b in pp.index_runs(stages)) or "none"


def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch03", est.model, est.train)


_RULES = {"default": "memlib's default rule: the layers divided evenly, rounded up, the remainder on the last stage",
          "balanced": "the balanced rule: every stage gets the same number of layers or one more, the lighter "
                      "stages at the ends",
          "given": "a layout given in the configuration"}


def values(est: Estimate) -> dict[str, str]:
    """The chapter's numbers for its prose (every one of them, formatted)."""
    m, t, part = est.model, est.train, est.partition
    b = pp.layer_blocks(m)
    tot = pp.totals(m)
    st = pp.stage_summary(part)
    rl = pp.routed_largest(part)
    prec = t.precision
    return {
        "model": model_name(m), "config": t.label(), "pp": fmt_count(t.pp), "layout": layout_text(part.layout),
        "layout_rule": _RULES[pp.layout_rule(part)], "bf16_bytes": fmt_count(RECIPES[prec].weights),
        "format": _fmt(est),
        "tied": "true" if m.tie_word_embeddings else "false",
        "ends": "one shared matrix" if m.tie_word_embeddings else "separate matrices",
        # per layer
        "mla_layer": fmt_count(b["mla"]), "mla_matrices": fmt_count(b["mla_matrices"]),
        "mla_matrix_count": fmt_count(b["mla_matrix_count"]), "mla_latent_norms": fmt_count(b["mla_latent_norms"]),
        "expert": fmt_count(b["expert"]), "router": fmt_count(b["router"]), "moe_ffn": fmt_count(b["moe"]),
        # the model's typical layer: an MoE layer where it has them, else a dense one
        "norms_layer": fmt_count(b["layer_norms"]), "moe_layer": fmt_count(b[f"{layer_word(m)[0]}_layer"]),
        "moe_layer_gib3": _gib(pp.weights(b[f"{layer_word(m)[0]}_layer"], prec), 3),
        "final_norm": fmt_count(b["final_norm"]),
        # per stage
        "stage_max": fmt_count(st["largest"]), "stage_max_b": fmt_billions(st["largest"]),
        "stage_max_gib": _gib(st["largest_bytes"]), "stage_max_n": fmt_count(len(st["largest_stages"])),
        "stage_max_stages": stages_text(st["largest_stages"]),
        "heaviest": (f"The heaviest stages, {stages_text(st['largest_stages'])} "
                     f"({fmt_count(len(st['largest_stages']))} of them), each hold"
                     if len(st["largest_stages"]) > 1 else
                     f"The heaviest stage, {stages_text(st['largest_stages'])}, holds"), "moe_stages": stages_text(st["moe_stages"]),
        "largest_match": "the heaviest stages are exactly these" if st["largest_are_moe_stages"]
        else "the heaviest stages are not exactly these",
        "stage0": fmt_count(st["first"]), "stage0_b": fmt_billions(st["first"]), "stage_last": fmt_count(st["last"]),
        "dense_stages": stages_text(st["dense_stages"]),
        "routed_largest": fmt_count(rl["routed_largest"]), "moe_stage_count": fmt_count(rl["moe_stages"]),
        # totals
        "total": fmt_count(tot["total"]), "total_b": fmt_billions(tot["total"]),
        "total_gib": _gib(pp.weights(tot["total"], prec)),
        "routed_share": pct(tot["routed_share"], 1), "routed": fmt_billions(tot["routed"]),
        "activated": fmt_count(tot["activated"]), "activated_b": fmt_billions(tot["activated"]),
        "activated_ne": fmt_count(tot["activated_no_embedding"]),
        "activated_ne_b": fmt_billions(tot["activated_no_embedding"]),
        "activated_share": pct(tot["activated_share"], 1),
        "embedding": fmt_count(tot["embedding"]), "embedding_b": fmt_billions(tot["embedding"]),
        "n_mtp": fmt_count(tot["mtp_modules"]), "mtp_own": fmt_count(tot["mtp"]), "mtp_own_b": fmt_billions(tot["mtp"]),
        "mtp_block_b": fmt_billions(tot["mtp_block"]), "mtp_proj": fmt_count(tot["mtp_proj"]),
        "mtp_norms": fmt_count(tot["mtp_norms"]),
        "router_bias": fmt_count(tot["buffers"]), "router_bias_per_layer": fmt_count(tot["bias_per_layer"]),
        "moe_layers": fmt_count(tot["moe_layers"]),
        "bias_presets": ", ".join(model_name(x) for x in sm.presets_where(lambda c: c.router_bias)) or "none",
        "official_count": fmt_count(len(pp.official(m))),
        "official_intro": _official_intro(m),
        "blocks_phrase": _blocks_phrase(m),
        "apart": _capital(join_and((["buffers that no optimizer updates (the router's bias)"]
                                      if m.has_moe and m.router_bias else [])
                                     + (["the MTP modules, which the paper leaves out,"]
                                        if m.num_nextn_predict_layers else []))) + " are counted apart."
        if (m.has_moe and m.router_bias) or m.num_nextn_predict_layers
        else "Every tensor of the model is trained, and all of them are counted.",
        "beyond": join_and(["activated parameters"] + (["the MTP modules"] if m.num_nextn_predict_layers else [])
                             + (["the router's bias buffer"] if m.has_moe and m.router_bias else [])),
        "matrices_clause": "matrices" + (f" and {fmt_count(b['mla_latent_norms'])} in the latent norms"
                                         if m.attention == "mla" else ""),
        "norms_kind": "block and latent" if m.attention == "mla" else "block",
        "mla_split": (f": {fmt_count(b['mla_matrices'])} in the {number_word(b['mla_matrix_count'])} matrices and "
                      f"{fmt_count(b['mla_latent_norms'])} in the latent norms" if m.attention == "mla"
                      else f", all in its {number_word(b['mla_matrix_count'])} matrices" if b["mla_matrices"] == b["mla"]
                      else f": {fmt_count(b['mla_matrices'])} in the {number_word(b['mla_matrix_count'])} matrices"),
        "norms_clause": ", block and latent together," if m.attention == "mla" else "",
        "attention": attention_name(m),
        "mtp_modules": "one MTP module" if tot["mtp_modules"] == 1 else f"{fmt_count(tot['mtp_modules'])} MTP modules",
        **_block_words(est),
    }


def _block_words(est: Estimate) -> dict[str, str]:
    """The clauses whose words depend on the model's blocks: what share of it the routed experts are (a dense
    model has none, and a token passes through all of it), which FFN its layers have, which parallelism splits a
    stage, and the figure's sentence on the routed experts."""
    m = est.model
    tot, rl = pp.totals(m), pp.routed_largest(est.partition)
    own = model_blocks(m)
    kind, word = layer_word(m)
    article = "an" if kind == "moe" else "a"         # "an MoE layer" (em-o-e), "a decoder layer"
    ffn = {frozenset({"moe", "dense_layers"}): "FFN, dense or MoE", frozenset({"moe"}): "MoE block",
           frozenset({"dense_layers"}): "dense FFN"}[frozenset(own & {"moe", "dense_layers"})]
    return {
        "share_clause": (f"of which the routed experts are {pct(tot['routed_share'], 1)}" if "moe" in own
                         else "every one of which a token passes through (the model is dense)"),
        "answer_tail": (f"of which the routed experts are {pct(tot['routed_share'], 1)}; a token activates "
                        f"{fmt_count(tot['activated'])} of them ({pct(tot['activated_share'], 1)})" if "moe" in own
                        else "and a token passes through all of them (the model is dense)"),
        "routed_clause": (f"{pct(tot['routed_share'], 1)} of them are routed experts, and a token activates"
                          if "moe" in own else "a dense model activates all of them:"),
        "ffn_word": ffn, "a_layer": f"{article.capitalize()} {word}", "a_layer_lc": f"{article} {word}",
        "split_kinds": "tensor or expert parallelism" if "moe" in own else "tensor parallelism",
        "split_word": "tensor or expert split" if "moe" in own else "tensor split",
        "fig_routed": (("The routed experts are the largest block in every stage that holds an MoE layer; "
                        "the first stage"
                        if rl["routed_largest"] == rl["moe_stages"] else
                        f"The routed experts are the largest block in {fmt_count(rl['routed_largest'])} of the "
                        f"{fmt_count(rl['moe_stages'])} stages that hold an MoE layer; the first stage")
                       if "moe" in own else "The first stage"),
    }


def _words(row: dict) -> str:
    if row["rounds"] and row["truncates"]:
        return "rounds and truncates to it"
    return "rounds to it" if row["rounds"] else ("truncates to it" if row["truncates"] else
                                                 "neither rounds nor truncates to it")


#: the keys of :func:`paper_values` (glued as placeholders for another model)
PAPER_KEYS = ("paper_mla_layer", "mla_exact", "paper_moe_ffn", "moe_ffn_exact", "paper_moe_layer", "paper_moe_layer_gb",
              "moe_layer_gib2", "moe_gib_from_rounded", "moe_rounded_b", "disagree", "disagree_n", "paper_stage0",
              "stage0_sum_terms", "stage0_sum_is_printed", "layout_is_papers", "official_total", "total_relation",
              "official_activated", "official_activated_doc", "card_relation", "doc_relation", "doc_gap",
              "official_mtp", "mtp_block_relation", "mtp_relation", "official_checkpoint", "mtp_stored_b",
              "checkpoint_b", "checkpoint_relation", "fp8_block", "fp8_scales", "stored_b", "stored_relation")


def paper_values(est: Estimate) -> dict[str, str]:
    """The paper's printed values and DeepSeek-V3's statements the prose compares with (empty unless
    the model is the paper's)."""
    m, part = est.model, est.partition
    if not is_paper_model(m):
        return {}
    prec = est.train.precision
    per_layer = pp.per_layer_check(m)
    tot = pp.totals(m)
    t3 = {r["key"]: r for r in pp.table3_check(m, prec)}
    t4 = {r["key"]: r for r in pp.table4_check(part)}
    off = {(r["statement"], r["quantity"]): r for r in pp.official_rows(m)}
    doc = off[("activated_weights_doc", "activated_no_embedding")]
    card = off[("activated", "activated")]
    s0 = pp.printed_stage_sum(pp.paper_layers_of_stage(0))
    moe = t3["3-59"]
    disagree = [f"the {what} of {kind if '-' in k else kind[:-1]} {k.replace('-', '–')}"
                for rows, kind in ((t3, "layers"), (t4, "stages")) for k, r in rows.items()
                for what, ok in (("count", r["params_agree"]), ("GiB", r["gib_agree"])) if ok is False]
    return {
        "paper_mla_layer": fmt_count(per_layer["mla"]["printed"]),
        "mla_exact": "exactly" if per_layer["mla"]["equal"] else "not",
        "paper_moe_ffn": fmt_count(per_layer["moe"]["printed"]),
        "moe_ffn_exact": "exactly" if per_layer["moe"]["equal"] else "not",
        "paper_moe_layer": PAPER["table3"]["3-59"]["params"],
        "paper_moe_layer_gb": moe["printed"]["memory_gb"],
        "moe_layer_gib2": _gib(moe["bytes"], 2),
        "moe_gib_from_rounded": fmt_decimal(moe["gib_from_rounded"], 3) + " GiB",
        "moe_rounded_b": fmt_billions(moe["params"]),
        "disagree": join_and(disagree) or "none",
        "disagree_n": number_word(len(disagree)),
        "paper_stage0": PAPER["table4"]["0"]["params"],
        "stage0_sum_terms": " + ".join(p for _, p in s0["terms"]) + " = " + fmt_decimal(s0["sum"], 2) + "B",
        "stage0_sum_is_printed": "is" if pp.rounds_to(s0["sum"], PAPER["table4"]["0"]["params"]) else "is not",
        "layout_is_papers": "is" if pp.is_paper_layout(part) else "is not",
        "official_total": off[("total", "total")]["printed_text"] + "B",
        "total_relation": _words(off[("total", "total")]),
        "official_activated": card["printed_text"] + "B", "official_activated_doc": doc["printed_text"] + "B",
        "card_relation": _words(card), "doc_relation": _words(doc), "doc_gap": fmt_billions(doc["difference"]),
        "official_mtp": off[("mtp", "mtp")]["printed_text"] + "B",
        "mtp_block_relation": _words(off[("mtp", "mtp_block")]), "mtp_relation": _words(off[("mtp", "mtp")]),
        "official_checkpoint": off[("checkpoint", "checkpoint")]["printed_text"] + "B",
        "mtp_stored_b": fmt_billions(tot["mtp_stored"]), "checkpoint_b": fmt_billions(tot["checkpoint"]),
        "checkpoint_relation": _words(off[("checkpoint", "checkpoint")]),
        "fp8_block": " × ".join(fmt_count(x) for x in m.weight_block_size) if m.weight_block_size else "none",
        "fp8_scales": fmt_count(tot["fp8_scales"]), "stored_b": fmt_billions(tot["stored"]),
        "stored_relation": _words(off[("checkpoint", "stored")]),
    }


def matrix_table(est: Estimate) -> str:
    """The paper's Table 2, extended to every tensor: block, tensor, symbolic shape, the model's
    shape and the element count (routed experts: all N of one layer, and one expert)."""
    rows, names = [], block_names(est.model)
    for r in pp.tensor_rows(est.model):
        t = r["tensor"]
        block = names.get(t.block, t.block) + (" (buffer, not trained)" if r["buffer"] else "")
        count = fmt_count(r["count"])
        if r["per_expert"] is not None:
            count += f" ({fmt_count(r['per_expert'])} per expert)"
        rows.append([block, f"${t.latex}$", "$[" + ", ".join(tex(d) for d in t.shape) + "]$",
                     "[" + ", ".join(fmt_count(d) for d in r["shape"]) + "]", count])
    return md_table(["block", "tensor", "shape", model_name(est.model), "parameters"], rows, "llllr")


def _contents_layer(r: dict, attention: str) -> str:
    parts = (["embedding"] if r["embedding"] else []) + [attention, "dense FFN" if r["kind"] == "dense" else
                                                         "router + experts", "norms"]
    return " + ".join(parts + (["final norm", "head"] if r["head"] else []))


def layer_table(est: Estimate) -> str:
    """The paper's Table 3 for the model: layers, contents, exact count and weights of each layer;
    for the paper's model its printed values beside them."""
    m = est.model
    paper = is_paper_model(m)
    checks = pp.table3_check(m, est.train.precision)
    rows = []
    for r, c in zip(pp.layer_groups(m, est.train.precision) + [None], checks):
        label, contents = ("all", "") if r is None else (span(r["first"], r["last"]), _contents_layer(r, attention_name(m)))
        row = [label, contents, fmt_count(c["params"]), _gib(c["bytes"], unit=False)]
        if paper:
            p = c["printed"]
            row += [p["params"], p["memory_gb"]] if p else ["—", "—"]
        rows.append(row)
    f = _fmt(est)
    headers = ["layers", "contents", "parameters (each)", f"{f} GiB (each)"]
    if paper:
        headers += ["paper: parameters", "paper: GiB (printed “GB”)"]
    return md_table(headers, rows, "llrrrr"[: len(headers)])


def _contents_stage(r: dict) -> str:
    parts = (["embedding"] if r["embedding"] else []) + ([f"{r['dense']} dense"] if r["dense"] else []) \
        + ([f"{r['moe']} MoE"] if r["moe"] else []) + (["final norm", "head"] if r["head"] else [])
    return " + ".join(parts) + (" (each)" if r["stages"] > 1 else "")


def stage_table(est: Estimate) -> str:
    """The paper's Table 4 for the model under the configuration: stages, layers, contents, exact
    count and weights per stage (before TP/EP); for the paper's model its printed values beside them."""
    part = est.partition
    paper = is_paper_model(est.model)
    st = pp.stage_summary(part)
    rows = []
    for r, c in zip(pp.stage_groups(part), pp.table4_check(part)):
        row = [span(r["first"], r["last"]), span(*r["layers"]), _contents_stage(r), fmt_count(r["params"]),
               _gib(r["bytes"], unit=False)]
        if paper:
            p = c["printed"]
            row += [p["params"], p["memory_gb"]] if p else ["—", "—"]
        rows.append(row)
    last_layer = est.model.num_hidden_layers - 1
    row = ["all", span(0, last_layer), "", fmt_count(st["sum"]),
           _gib(pp.weights(st["sum"], est.train.precision), unit=False)]
    rows.append(row + (["", ""] if paper else []))
    f = _fmt(est)
    headers = ["stage", "layers", "contents", "parameters per stage", f"{f} GiB per stage"]
    if paper:
        headers += ["paper: parameters", "paper: GiB (printed “GB”)"]
    return md_table(headers, rows, "lllrrrr"[: len(headers)])


def _stated(off: dict, key: str) -> str:
    x = off.get(key)
    return "— (not stated)" if x is None else x + "B"


def _capital(text: str) -> str:
    return f"{text[:1].upper()}{text[1:]}"


def _blocks_phrase(m) -> str:
    """The blocks of a layer besides the attention, in the order of the chapter's equations."""
    own = model_blocks(m)
    moe = "the MoE block (router, " + ("shared experts, " if "shared_experts" in own else "") + "routed experts)"
    parts = ["the two block norms of every layer"] + (["the dense FFN"] if "dense_layers" in own else []) + \
        ([moe] if "moe" in own else [])
    return ", ".join(parts[:-1]) + (", and " if len(parts) > 2 else " and ") + parts[-1]


def _official_intro(m) -> str:
    """The sentence before the table of DeepSeek's statements, or that there are none to check."""
    n = len(pp.official(m))
    if n == 0:
        return f"DeepSeek publishes no parameter counts for {model_name(m)}, so there is nothing to set beside these."
    what = counted(n, "figure")
    return (f"DeepSeek states {what} for {model_name(m)} (model cards, reports, weights documentation). Beside "
            "each, the counts memlib computes for what it is about, whether a count rounds or truncates to the "
            "printed digits, and the one closest to it:")


def totals_table(est: Estimate) -> str:
    """Total and activated parameters of every shipped model (and the book's), in billions, beside
    what DeepSeek states (billions as printed).  Billions only: the exact counts of the book's
    model are in the prose, and a book built for one model prints no other model's exact totals."""
    ms = sm.PRESET_ORDER if est.model.name in sm.PRESET_ORDER else sm.PRESET_ORDER + (est.model,)
    rows, own = [], model_blocks(est.model)
    for r in sm.preset_totals(ms):
        off = r["official"]
        stated_act = " / ".join(x + "B" for x in (off.get("activated"), off.get("activated_weights_doc")) if x)
        name = model_name(r["model"]) + (" (this book)" if r["model"] == est.model.name else "")
        rows.append([name, fmt_billions(r["total"]), _stated(off, "total"), fmt_billions(r["activated"]),
                     fmt_billions(r["activated_no_embedding"]), stated_act or "—"]
                    + ([fmt_billions(r["mtp"]) if r["mtp"] else "—"] if "mtp" in own else [])
                    + ([fmt_count(r["buffers"]) if r["buffers"] else "—"] if "router_bias" in own else []))
    # the MTP and router-bias columns only in the book of a model with those blocks
    extra = (["MTP (own)"] if "mtp" in own else []) + (["router-bias buffer"] if "router_bias" in own else [])
    return md_table(["model", "total", "DeepSeek: total", "activated, with embedding", "activated, without embedding",
                     "DeepSeek: activated", *extra], rows, "lrrrrr" + "r" * len(extra))


def official_table(est: Estimate) -> str:
    """DeepSeek's statements for the model beside the counts they are about: whether each count
    rounds or truncates to the printed digits, and the difference."""
    rows = [[STATEMENTS[r["statement"]], r["printed_text"] + "B", QUANTITIES[r["quantity"]], fmt_count(r["count"]),
             fmt_billions(r["count"], r["digits"] + 2), _words(r), fmt_billions(r["difference"]),
             "**closest**" if r["closest"] else ""]
            for r in pp.official_rows(est.model)]
    if not rows:
        return ""
    return md_table(["DeepSeek states", "printed", "memlib counts", "exact", "billions", "the count",
                     "printed − count", ""], rows, "lrlrrlrl")


def stage_figure(est: Estimate):
    """Stacked bars: the weights of each whole pipeline stage (before TP/EP), per block, in GiB."""
    part = est.partition
    per = pp.stage_block_weights(part)
    labels = {**FIGURE_LABELS, "attention": attention_name(est.model)}
    series = [Series(labels[b], BLOCK_COLORS[b], [p[b] for p in per]) for b in pp.FIGURE_BLOCKS]
    fig, ax = new_figure(height=3.8)
    stacked_bars(ax, [str(st.index) for st in part.stages], series, totals=False, width=0.8)
    ax.use_sticky_edges = False          # zero-height segments would pin the top of the axis to the tallest bar
    ax.margins(y=0.06)
    ax.autoscale_view()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel(f"{_fmt(est)} weights per stage, GiB")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(list(reversed(handles)), list(reversed(labels)), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4)
    return fig


def problem_values(est: Estimate) -> dict[str, str]:
    """The worked problems: DeepSeek-V2-Lite's stated counts (the same in every book), and tying the
    book's model's head to its embedding."""
    lite = load_model("deepseek-v2-lite")
    t = pp.totals(lite)
    off = {(r["statement"], r["quantity"]): r for r in pp.official_rows(lite)}
    ne = off[("activated", "activated_no_embedding")]
    closest = next(r for r in off.values() if r["statement"] == "activated" and r["closest"])
    own = pp.totals(est.model)
    return {
        "lite_total": fmt_count(t["total"]), "lite_total_b": fmt_billions(t["total"]),
        "lite_official_total": off[("total", "total")]["printed_text"] + "B",
        "lite_total_relation": _words(off[("total", "total")]),
        "lite_act_b": fmt_billions(t["activated"]), "lite_act_ne_b": fmt_billions(t["activated_no_embedding"]),
        "lite_emb_b": fmt_billions(t["embedding"]), "lite_official_act": ne["printed_text"] + "B",
        "lite_closest": QUANTITIES[closest["quantity"]].split(", ", 1)[1],
        "lite_ne_relation": _words(ne), "lite_ne_rounded": fmt_billions(ne["count"], ne["digits"]),
        "tie_saving": fmt_count(own["tie_saving"]),
        "tie_saving_gib": _gib(pp.weights(own["tie_saving"], est.train.precision)),
        "tie_saving_share": pct(own["tie_saving_share"], 1, 2),
    }

