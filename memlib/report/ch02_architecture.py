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
from .figures import block_diagram, new_figure
from .format import architecture_note, fmt_count, math, md_table, model_name, pct, span, tex, yes_no
from .tables import notation_table

__all__ = ["models", "notation", "values", "mla_values", "preset_values", "other_values", "attention_table", "layer_pattern_table",
           "model_fields_table", "mtp_table", "block_node_text", "block_figure", "block_values"]


def models(est: Estimate) -> tuple:
    """The models of the comparison tables: the shipped presets, and the book's model if it is none."""
    return sm.PRESET_ORDER if est.model.name in sm.PRESET_ORDER else sm.PRESET_ORDER + (est.model,)


def notation(est: Estimate) -> str:
    """The notation table (the model symbols) with the model's values."""
    return notation_table(("model",), est.model)


def _opt(x) -> str:
    return "— (null)" if x is None else fmt_count(x)


def values(est: Estimate) -> dict[str, str]:
    """The numbers the chapter quotes for the book's model."""
    m = est.model
    s = sm.preset_summary(m)
    mtp = pp.mtp_module(m)
    return {
        "model": model_name(m), "note": architecture_note(m, "multi-head latent attention (MLA)"),
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
        "mla_matrices": fmt_count(b["mla_matrix_count"]), "mla_norms": fmt_count(b["mla_norm_count"]),
        "qk_width": fmt_count(w["qk"]), "rope_share": pct(w["rope_share"], 1, 1),
        "kv_cache_width": fmt_count(w["kv_cache"]), "mha_kv_width": fmt_count(w["mha_kv"]),
    }


def _names(xs) -> str:
    return ", ".join(model_name(x) for x in xs) or "none"


def preset_values() -> dict[str, str]:
    """Facts of the shipped presets the chapter's comparison quotes (the same in every book)."""
    v2, lite = sm.preset_summary("deepseek-v2"), sm.preset_summary("deepseek-v2-lite")
    return {
        "v2_h": fmt_count(v2["h"]), "v2_N": fmt_count(v2["N"]), "v2_N_s": fmt_count(v2["N_s"]),
        "v2_k_dense": fmt_count(v2["k_dense"]), "v2_router_bias": "has a" if v2["router_bias"] else "has no",
        "v2_mtp": fmt_count(v2["mtp"]),
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


def attention_table(est: Estimate) -> str:
    """The MLA tensors of the book's model and of the preset that projects its queries the other
    way: symbolic shape = numeric shape, and the Hugging Face parameter."""
    ms = [est.model] + [n for n in [sm.contrasting_preset(est.model)] if n]
    rows = []
    for r in sm.attention_shapes(ms):
        t0 = r["tensor"]
        shapes = ["—" if s is None else f"{_shape_tex(s[0].shape)} = {_shape_num(s[1])}" for s in r["shapes"]]
        rows.append([f"${t0.latex}$", f"`{t0.hf}`"] + shapes)
    return md_table(["tensor", "Hugging Face parameter"] + [model_name(m) for m in ms], rows, "l" * (2 + len(ms)))


def layer_pattern_table(est: Estimate) -> str:
    """Which decoder layers are dense and which MoE, per model."""
    rows = []
    for m, p in sm.layer_patterns(models(est)):
        pattern = ", ".join(f"{'dense' if k == 'dense' else 'MoE'} {span(a, b)}" for k, a, b in p["runs"])
        rows.append([model_name(m), fmt_count(p["layers"]), fmt_count(p["dense"]), fmt_count(p["moe"]), pattern,
                     fmt_count(p["mtp"])])
    return md_table(["model", "layers $l$", "dense", "MoE", "layer indices", "MTP modules"], rows, "lrrrlr")


def _field(x) -> str:
    if isinstance(x, bool):
        return yes_no(x)
    return _opt(x)


_FIELD_LABELS = {"router_bias": ("$b^{G}$", "router bias buffer (`topk_method: noaux_tc`)")}


def model_fields_table(est: Estimate) -> str:
    """Every model symbol with its configuration field and its value in each model."""
    ms = models(est)
    rows = []
    for r in sm.model_fields(ms):
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
def _mathtext(words: str) -> str:
    """An activation's name from the ledger with its symbols typeset: ``query latent c^Q`` -> ``$c^{Q}$``."""
    out = []
    for w in words.split(" "):
        if "^" in w:
            base, sup = w.split("^", 1)
            w = f"${base}^{{{sup}}}$"
        out.append(w)
    return " ".join(out)


def block_node_text(node) -> tuple[str, str, str, str]:
    """One :class:`~memlib.scenarios.models.Node` as the diagram writes it: name, shape, what slices it
    (``none``: replicated, or whole on every rank), category."""
    name = node.name if node.category == "parameters" else _mathtext(node.name)
    shape = "$[" + ",\\ ".join(tex(d) for d in node.shape) + "]$"
    return name, shape, ", ".join(node.sliced_by) or "none", node.category


def _ffn_block(est: Estimate) -> str:
    return "moe" if est.model.has_moe else "dense_ffn"


def block_figure(est: Estimate, block: str):
    """The tensors of the book's model's ``block`` (``attention``, or ``ffn``: the MoE layer, or the dense
    FFN of a model without one) in data-flow order, each with its shape and what slices it (under the
    chapter's partition profile)."""
    b = _ffn_block(est) if block == "ffn" else block
    nodes = [block_node_text(n) for n in sm.block_nodes(est.model, b, est.train.profile)]
    rows = (len(nodes) + 3) // 4
    fig, ax = new_figure(10.0, 0.95 * rows + 0.5)
    block_diagram(ax, nodes)
    return fig


def block_values(est: Estimate) -> dict[str, str]:
    """Words for the diagrams' captions: the attention's kind, the FFN block drawn."""
    m = est.model
    return {"diagram_attention": "multi-head latent attention (MLA)" if m.attention == "mla"
            else "grouped-query attention (this model has no MLA)",
            "diagram_ffn": "MoE layer" if m.has_moe else "dense FFN (this model has no MoE layer)",
            "diagram_profile": est.train.profile}
