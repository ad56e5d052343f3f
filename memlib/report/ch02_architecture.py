"""Chapter 2, "Architecture and notation": the notation, MLA's tensors, the layer patterns, MTP and
the shipped models side by side, formatted from :mod:`memlib.paper.parameters` and
:mod:`memlib.scenarios.models`.

Every function takes the chapter's :class:`~memlib.device.estimate.Estimate` (built once in the chapter's
configuration cell); nothing here computes a quantity.  The tables that compare the shipped presets
show all of them whatever the book's model (and the book's model too when it is none of them).
"""
from __future__ import annotations

from ..device.estimate import Estimate
from ..paper import parameters as pp
from ..scenarios import models as sm
from ..model.architecture import block_kinds
from ..scenarios.dataflow import block_flow, ffn_block
from .diagrams import flow_diagram
from .format import architecture_note, counted, fmt_count, number_word, math, md_table, model_name, pct, span, tex, yes_no
from .tables import notation_table

__all__ = ["models", "notation", "values", "mla_values", "gqa_values", "preset_values", "other_values", "attention_table", "layer_pattern_table",
           "model_fields_table", "mtp_table", "block_figure", "block_values"]


def models(est: Estimate) -> tuple:
    """The models of the comparison tables: the shipped presets, and the book's model if it is none."""
    return sm.PRESET_ORDER if est.model.name in sm.PRESET_ORDER else sm.PRESET_ORDER + (est.model,)


def notation(est: Estimate) -> str:
    """The notation table (the model symbols) with the model's values."""
    return notation_table(("model",), est.model)


def _opt(x) -> str:
    return "— (null)" if x is None else fmt_count(x)


def _topics(m) -> str:
    """What the chapter goes on to do for ``m``: the sections its book keeps."""
    from ..model.blocks import model_blocks

    own = model_blocks(m)
    if "mla" not in own:
        return "draws its blocks"
    parts = ["writes out multi-head latent attention (MLA)"]
    if "moe" in own and "dense_layers" in own:
        parts.append("shows how dense and mixture-of-experts (MoE) layers alternate")
    if "mtp" in own:
        parts.append("describes what multi-token prediction (MTP) adds")
    return ", ".join(parts) + ", and sets the models memlib ships side by side"


def _answer(m, s: dict) -> str:
    """The answer box's first clause: the MoE layers and their experts, or a dense model's layers."""
    from ..model.architecture import attention_name

    if s["moe_layers"]:
        return (f"{model_name(m)} has {fmt_count(s['moe_layers'])} MoE layers of {fmt_count(m.n_routed_experts)} routed "
                f"experts each, {fmt_count(s['routed'])} routed experts in all")
    return f"{model_name(m)} has {fmt_count(m.num_hidden_layers)} decoder layers of {attention_name(m)} and a dense FFN"


def _layers_sentence(m, s: dict) -> str:
    """How many decoder layers of each kind the model has, and what an MoE layer holds, in words: no kind
    counted zero, no shared experts named where there are none."""
    from ..model.blocks import model_blocks

    own, name = model_blocks(m), model_name(m)
    kinds = [f"{fmt_count(s['dense_layers'])} dense"] if s["dense_layers"] else []
    kinds += [f"{fmt_count(s['moe_layers'])} MoE"] if s["moe_layers"] else []
    text = f"{name} has {fmt_count(m.num_hidden_layers)} decoder layers" + (
        f": {' and '.join(kinds)}" if len(kinds) > 1 else f", all {kinds[0].split(' ', 1)[1]}")
    if "moe" in own:
        routed = f"{fmt_count(m.n_routed_experts)} routed experts"
        if "shared_experts" in own and m.n_shared_experts:
            n = m.n_shared_experts
            routed += f" and {fmt_count(n)} shared expert{'s' if n > 1 else ''}"
        text += (f", each MoE layer with {routed}, "
                 f"{fmt_count(m.num_experts_per_tok)} routed experts active per token")
    return text + "."


def values(est: Estimate) -> dict[str, str]:
    """The numbers the chapter quotes for the book's model."""
    m = est.model
    s = sm.preset_summary(m)
    mtp = pp.mtp_module(m)
    return {
        "model": model_name(m), "note": architecture_note(m, "multi-head latent attention (MLA)"),
        "layers_sentence": _layers_sentence(m, s), "answer": _answer(m, s), "topics": _topics(m),
        "h": fmt_count(m.hidden_size), "n_h": fmt_count(m.num_attention_heads), "l": fmt_count(m.num_hidden_layers),
        "k_dense": fmt_count(m.first_k_dense_replace), "dense_layers": fmt_count(s["dense_layers"]),
        "moe_layers": fmt_count(s["moe_layers"]),
        "N": fmt_count(m.n_routed_experts or 0), "N_s": fmt_count(m.n_shared_experts),
        "N_r": fmt_count(m.num_experts_per_tok or 0),
        "routed_total": fmt_count(s["routed"]),
        "router_bias": "has such a buffer" if m.router_bias else "has no such buffer",
        "moe_layer_freq": fmt_count(m.moe_layer_freq),
        "n_mtp": fmt_count(m.num_nextn_predict_layers), "mtp_kind": "MoE" if mtp["kind"] == "moe" else "dense",
        "mtp_module": fmt_count(mtp["total"]), "mtp_own": fmt_count(pp.totals(m)["mtp"]),
    }


def mla_values(est: Estimate) -> dict[str, str]:
    """The numbers the chapter quotes on the model's MLA (glued with
    :func:`~memlib.report.glue.glue_deepseek`: only a model with MLA has them)."""
    m = est.model
    s = sm.preset_summary(m)
    b = pp.layer_blocks(m)
    w = pp.mla_widths(m)
    return {
        "d_h": fmt_count(m.qk_nope_head_dim), "d_v": fmt_count(m.v_head_dim), "d_hR": fmt_count(m.qk_rope_head_dim),
        "d_c": fmt_count(m.kv_lora_rank),
        "d_cq": fmt_count(m.q_lora_rank) if s["q_compression"] else "null: this model projects queries directly",
        "head_dims": "the same" if m.qk_nope_head_dim == m.v_head_dim else "different",
        "mla_matrices": counted(b["mla_matrix_count"], "matrix", "matrices"),
        "mla_norms": counted(b["mla_norm_count"], "latent RMSNorm"),
        "attention_beside": "" if (other := _contrast(m)) is None
        else f", beside {model_name(other)}'s, which projects its queries the other way",
        "qk_width": fmt_count(w["qk"]), "rope_share": pct(w["rope_share"], 1, 1),
        "kv_cache_width": fmt_count(w["kv_cache"]), "mha_kv_width": fmt_count(w["mha_kv"]),
    }


def gqa_values(est: Estimate) -> dict[str, str]:
    """The numbers of the chapter's problem on grouped-query attention's KV cache (placeholders for MLA, whose
    book has its own problems)."""
    m = est.model
    if m.attention == "mla":
        return {k: "—" for k in ("gqa_kv_cache", "gqa_mha_kv", "gqa_group", "gqa_d_head", "gqa_n_kv")}
    w = pp.gqa_widths(m)
    return {"gqa_kv_cache": fmt_count(w["kv_cache"]), "gqa_mha_kv": fmt_count(w["mha_kv"]),
            "gqa_group": number_word(w["group"]), "gqa_d_head": fmt_count(m.head_dim),
            "gqa_n_kv": number_word(m.num_key_value_heads)}


def _names(xs) -> str:
    return ", ".join(model_name(x) for x in xs) or "none"


def preset_values() -> dict[str, str]:
    """Facts of the shipped presets the chapter's comparison quotes (the same in every book)."""
    v2, lite = sm.preset_summary("deepseek-v2"), sm.preset_summary("deepseek-v2-lite")
    return {
        "v2_h": fmt_count(v2["h"]), "v2_N": fmt_count(v2["N"]), "v2_N_s": fmt_count(v2["N_s"]),
        "v2_k_dense": fmt_count(v2["k_dense"]), "v2_router_bias": "has a" if v2["router_bias"] else "has no",
        "v2_mtp": fmt_count(v2["mtp"]),
        "v2_mtp_words": ("no MTP module" if not v2["mtp"] else "one MTP module" if v2["mtp"] == 1
                         else f"{fmt_count(v2['mtp'])} MTP modules"),
        "lite_q_lora": "null" if lite["d_cq"] is None else fmt_count(lite["d_cq"]),
        "lite_n_h": fmt_count(lite["n_h"]), "lite_l": fmt_count(lite["l"]),
        "bias_presets": _names(sm.presets_where(lambda m: m.router_bias)),
        "mtp_presets": _names(sm.presets_where(lambda m: m.num_nextn_predict_layers > 0)),
        "untied_presets": _names(sm.presets_where(lambda m: not m.tie_word_embeddings)),
        "equal_head_dims": _names(sm.presets_where(lambda m: m.qk_nope_head_dim == m.v_head_dim)),
        "freq_one": _names(sm.presets_where(lambda m: m.moe_layer_freq == 1)),
    }


def other_values(est: Estimate) -> dict[str, str]:
    """The preset the worked problem sets beside the book's model (the one whose queries are
    projected the other way)."""
    name = sm.contrasting_preset(est.model)
    if name is None:
        return {}
    s = sm.preset_summary(name)
    return {"name": model_name(name), "l": fmt_count(s["l"]), "k_dense": fmt_count(s["k_dense"]),
            "moe_layers": fmt_count(s["moe_layers"]), "N": fmt_count(s["N"]), "N_s": fmt_count(s["N_s"]),
            "routed_total": fmt_count(s["routed"])}


def _shape_tex(shape) -> str:
    return "$[" + ", ".join(tex(d) for d in shape) + "]$"


def _shape_num(shape) -> str:
    return "[" + ", ".join(fmt_count(d) for d in shape) + "]"


def _contrast(m) -> str | None:
    """The preset the attention table sets beside ``m``: the one that projects its queries the other way, for a
    model that compresses its queries (a book without query compression tabulates no query latent)."""
    return sm.contrasting_preset(m) if m.q_lora_rank is not None else None


def attention_table(est: Estimate) -> str:
    """The MLA tensors of the book's model and, for a model that compresses its queries, of the preset that
    projects them directly (:func:`_contrast`): symbolic shape = numeric shape, and the Hugging Face parameter."""
    ms = [est.model] + [n for n in [_contrast(est.model)] if n]
    rows = []
    for r in sm.attention_shapes(ms):
        t0 = r["tensor"]
        shapes = ["—" if s is None else f"{_shape_tex(s[0].shape)} = {_shape_num(s[1])}" for s in r["shapes"]]
        rows.append([f"${t0.latex}$", f"`{t0.hf}`"] + shapes)
    return md_table(["tensor", "Hugging Face parameter"] + [model_name(m) for m in ms], rows, "l" * (2 + len(ms)))


def layer_pattern_table(est: Estimate) -> str:
    """Which decoder layers are dense and which MoE, per model."""
    rows, mtp = [], est.model.num_nextn_predict_layers > 0     # the MTP column in the book of a model with MTP
    for m, p in sm.layer_patterns(models(est)):
        pattern = ", ".join(f"{'dense' if k == 'dense' else 'MoE'} {span(a, b)}" for k, a, b in p["runs"])
        rows.append([model_name(m), fmt_count(p["layers"]), fmt_count(p["dense"]), fmt_count(p["moe"]), pattern]
                    + ([fmt_count(p["mtp"])] if mtp else []))
    return md_table(["model", "layers $l$", "dense", "MoE", "layer indices"] + (["MTP modules"] if mtp else []), rows,
                    "lrrrl" + ("r" if mtp else ""))


def _field(x) -> str:
    if isinstance(x, bool):
        return yes_no(x)
    return _opt(x)


_FIELD_LABELS = {"router_bias": ("$b^{G}$", "router bias buffer (`topk_method: noaux_tc`)")}


def model_fields_table(est: Estimate) -> str:
    """Every model symbol with its configuration field and its value in each model."""
    from ..model.blocks import model_blocks
    from .tables import _not_own

    ms, gone = models(est), _not_own(est.model)       # the rows of blocks the book's model has
    gone |= set() if "router_bias" in model_blocks(est.model) else {"router_bias"}
    rows = []
    for r in sm.model_fields(ms):
        if (r["symbol"] or r["field"]) in gone:
            continue
        sym, field = _FIELD_LABELS.get(r["field"], (math(r["symbol"]) if r["symbol"] else "", f"`{r['field']}`"))
        rows.append([sym, field] + [_field(x) for x in r["values"]])
    return md_table(["symbol", "config field"] + [model_name(m) for m in ms], rows, "ll" + "r" * len(ms))


def mtp_table(est: Estimate) -> str:
    """The tensors of one MTP module of the model, with its decoder block in one row."""
    mod = pp.mtp_module(est.model)
    own = [[f"${t.latex}$", f"`{t.hf}`", _shape_tex(t.shape), fmt_count(n)] for t, n in mod["own"]]
    kind = "MoE" if mod["kind"] == "moe" else "dense"
    rows = own[:3] + [[f"one {kind} decoder block", "`mlp.*`, `self_attn.*`, norms", "as a decoder layer",
                       fmt_count(mod["block"])]] + own[3:]
    rows.append(["embedding $W^{E}$, head $W^{head}$", "shared with the main model", "", "not counted again"])
    rows.append(["**total (own parameters of one module)**", "", "", f"**{fmt_count(mod['total'])}**"])
    return md_table(["tensor", "Hugging Face parameter", "shape", "parameters"], rows, "lllr")


# ------------------------------------------------------------------------------------------------
# the block diagrams
# ------------------------------------------------------------------------------------------------
def block_figure(est: Estimate, block: str):
    """The book's model's ``block`` (``attention``, or ``ffn``: the MoE layer, or the dense FFN of a model
    without one) as a dataflow drawn by Graphviz (:func:`memlib.report.diagrams.flow_diagram` of
    :func:`memlib.scenarios.dataflow.block_flow`): values, the weights and operations between them, what the
    paper's ledger saves, what inference caches."""
    b = ffn_block(est.model) if block == "ffn" else block
    return flow_diagram(block_flow(est.model, b, est.train.profile))


def block_values(est: Estimate) -> dict[str, str]:
    """Words for the diagrams' text and captions, from the model's blocks
    (:func:`memlib.model.architecture.block_kinds`): the blocks' names, what the KV cache holds, and how
    data flows through each block."""
    m = est.model
    k = block_kinds(m)
    rope = k["positions"] == "RoPE"
    if m.attention == "mla":
        cache = "the key-value latent and the RoPE key that every head shares, all that MLA caches"
        queries = ("the query branch compresses the normalised input into a latent and expands it into the queries"
                   if m.q_lora_rank else "the queries are projected from the normalised input directly")
        flow = (f"{queries.capitalize()}, with a separate RoPE part; the key-value branch compresses the input into "
                "one latent, expands it into the keys and values, and computes one RoPE key that every head "
                "shares; the branches meet at the attention, whose output the output projection maps back to "
                "the hidden size.")
    else:
        # the heads in words, or both in digits where the query heads are too many to spell (a series is written
        # one way: "32 query heads and 8 key-value heads")
        spell = number_word if k["n_h"] < 10 else fmt_count
        n_h, n_kv = spell(k["n_h"]), spell(k["n_kv"])
        cache = f"the keys and values of its {number_word(k['n_kv'])} key-value heads"
        steps = [f"The normalised input is projected into {n_h} heads of queries, keys and values"
                 if k["n_kv"] == k["n_h"] else
                 f"The normalised input is projected into {n_h} query heads and {n_kv} key-value heads"]
        if k["qk_norm"]:
            steps.append("each query and key head is normalised by an RMSNorm")
        if rope:
            steps.append("RoPE rotates the queries and keys")
        flow = "; ".join(steps) + "; they meet at the attention, whose output the output projection maps back to " \
                                  "the hidden size."
    if m.has_moe:
        choice = f"The router scores every token against the {fmt_count(k['N'])} routed experts and picks " \
                 f"{fmt_count(k['N_r'])}" + (", its bias added for the choice only" if m.router_bias else "")
        shared = ""
        if m.moe == "qwen2_moe":
            shared = "; beside them the shared expert, scaled by its sigmoid gate, sees every token"
        elif m.n_shared_experts == 1:
            shared = "; beside them the shared expert sees every token"
        elif m.n_shared_experts:
            shared = f"; beside them the {number_word(m.n_shared_experts)} shared experts see every token"
        ffn_flow = (f"{choice}; the tokens are dispatched to the ranks that hold their experts (an all-to-all "
                    f"over the EP ranks), and the experts' outputs are combined back, weighted by the router's "
                    f"probabilities{shared}; the sum is added to the block's input.")
    elif m.mlp == "gelu":
        ffn_flow = "A projection to the FFN's width, its GeLU, and the projection back, added to the block's input."
    else:
        ffn_flow = ("A SwiGLU: two projections of the normalised input (gate and up), the SiLU of the gate times "
                    "the up projection, and the down projection, added to the block's input.")
    return {"diagram_attention": block_flow(m, "attention").title, "diagram_ffn": block_flow(m, ffn_block(m)).title,
            "diagram_cache": cache, "diagram_attention_flow": flow, "diagram_ffn_flow": ffn_flow}
