"""Chapter 10, "Validation": tables, figures and glued values, formatted from
:mod:`memlib.scenarios.validation`.

Every function takes the chapter's :class:`~memlib.device.estimate.Estimate` (built once in the chapter's
configuration cell); the measurements run on the model in miniature
(:func:`memlib.scenarios.validation.miniature`), the one-layer views at the model's full size with
the configuration's micro-batch and sequence length.  Nothing here computes a quantity: it reads the
library's values, formats them and picks words from its booleans.
"""
from __future__ import annotations

from ..device.estimate import Estimate
from ..data.reference import PYTORCH_ALLOCATOR
from ..model.architecture import attention_name, attention_tensors
from ..model.blocks import model_blocks
from ..scenarios import gpu_steps as gs
from ..scenarios import validation as sv
from .figures import OKABE_ITO, Series, new_figure, plain_log_ticks, stacked_bars
from .format import fmt_bytes, fmt_count, join_and, number_word, math, signed_pct, md_table, model_name, pct, ratio, signed_bytes, tex, yes_no
from .notation import chapter_notation

__all__ = ["notation", "measure", "values", "clauses", "miniature_table", "parameter_table", "hf_table", "hf_figure",
           "group_table", "entry_table", "megatron_table", "side_table", "side_figure", "megatron_entry_table",
           "gpu_values", "gpu_config_table", "gpu_bytes_table", "gpu_allocator_table", "step_values", "step_table",
           "problem_values"]

#: what a Transformer Engine entry's bytes are read from (keys of memlib.scenarios.validation.TE_SOURCES)
SOURCE_LABELS = {"flash_attention": "flash-attention, TE fused attention (source)",
                 "te_unfused_attention": "TE unfused attention (source)",
                 "te_layernorm_linear": "TE LayerNormLinear (source)", "te_rmsnorm": "TE RMSNorm (source)",
                 "te_cross_entropy": "TE cross-entropy (source)", "te_linear": "TE Linear (source)",
                 "measured": "Megatron-Core code (measured)", "read": "Megatron-Core code (read)"}

#: the columns of the one-layer views
COLUMN_LABELS = {"paper": "the paper's ledger", "hf-eager": "Hugging Face eager (hf-eager)",
                 "megatron-local": "Megatron-Core local (megatron)",
                 "megatron-te": "Megatron-Core + TE (megatron, TE sources)"}

_KIND = {"moe": "MoE", "dense": "dense"}


def _b_s(est: Estimate) -> tuple[int, int]:
    return est.train.micro_batch, est.train.seq_len


def _kind(est: Estimate) -> str:
    return sv.analysed_kind(est.model)


def _signed(n: int) -> str:
    return f"{n:+,}".replace("-", "−")


def _all(flag: bool, yes: str, no: str) -> str:
    return yes if flag else no


def _of(part: int, whole: int, noun: str, verb: str) -> str:
    """``'all three cases match'``, ``'two of three cases match'``, ``'none of the 18 regions differs'``: a count
    of a whole in words (``verb`` in the plural; its singular adds an s)."""
    if part == whole and whole > 1:
        return f"all {number_word(whole)} {noun} {verb}"
    if part == 0:
        return f"none of the {number_word(whole)} {noun} {verb.split(' ', 1)[0]}s{verb[len(verb.split(' ', 1)[0]):]}"
    return f"{number_word(part)} of {number_word(whole)} {noun} {verb}"


def _kinds(kinds) -> str:
    """A model's decoder layers by kind, ``1 dense, 1 MoE`` (a kind it lacks left out)."""
    return ", ".join(f"{kinds.count(k)} {_KIND[k]}" for k in ("dense", "moe") if k in kinds)


def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch10", est.model, est.train)


def measure(est: Estimate) -> None:
    """Run the chapter's measurements once (Megatron-Core's worker beside the transformers runs);
    every later function reads their cached results."""
    sv.measure_all(est.model)


# ------------------------------------------------------------------------------------------------
# the prose's values
# ------------------------------------------------------------------------------------------------
def values(est: Estimate) -> dict[str, str]:
    """The chapter's numbers and words for its prose (every one of them, formatted)."""
    m = est.model
    b, s = _b_s(est)
    kind = _kind(est)
    mini = sv.miniature(m)
    ver = sv.versions()
    hf = sv.hf_summary(sv.hf_comparisons(m))
    mc = sv.megatron_summary(sv.megatron_comparisons(m))
    rc = sv.random_check()
    pc = sv.parameter_checks(m)
    groups = sv.layer_groups(m, kind, b, s)
    gt = sv.ground_truths(m, kind, b, s)
    kd = sv.kernel_differences(m, kind, b, s)
    top = sv.largest_difference(m, kind, b, s)
    zero = {"paper": 0, "hf-eager": 0}
    more = groups["total"]["difference"] >= 0
    return {
        "model": model_name(m), "b": fmt_count(b), "s": fmt_count(s), "kind": _KIND[kind],
        "attention": attention_name(m), "mini_layers_words": _mini_layers(m, mini),
        # versions
        "torch": ver["installed"]["torch"], "transformers": ver["installed"]["transformers"],
        "mcore": ver["installed"]["megatron_core"], "torch_pinned": ver["pinned"]["torch"],
        "transformers_pinned": ver["pinned"]["transformers"], "mcore_pinned": ver["pinned"]["megatron_core"],
        "versions_pinned": _all(all(ver["same"].values()), "the pinned ones", "not all the pinned ones"),
        "versions_ran": _all(all(ver["same"].values()), "This chapter ran with exactly these.",
                             f"This chapter ran with transformers {ver['installed']['transformers']}, PyTorch "
                             f"{ver['installed']['torch']} and megatron-core {ver['installed']['megatron_core']}: "
                             f"not all the pinned ones."),
        # the miniature
        "mini_h": fmt_count(mini.hidden_size),
        # parameters
        "params_verdict": _all(pc[0]["ok"], "agree exactly", "do not agree"),
        "params_class": pc[0]["class"], "params_tensors": fmt_count(len(pc[0]["tensors"])),
        "params_differing": fmt_count(pc[0]["tensors_differing"]),
        "params_differ_clause": _of(pc[0]["tensors_differing"], len(pc[0]["tensors"]), "tensors", "differ"),
        "params_buffers": fmt_count(pc[0]["buffers"]["transformers"]),
        "params_buffers_clause": ("holds no buffer beside them" if not pc[0]["buffers"]["transformers"] else
                                  f"holds {fmt_count(pc[0]['buffers']['transformers'])} buffer elements beside them"),
        "others": _others(pc, m),
        "others_verdict": _all(all(r["ok"] for r in pc[1:]), "agree exactly as well", "do not all agree"),
        # hf-eager, measured
        "hf_head_case": ("a single head of wider values" if m.attention == "mla" else
                         "a single, wider query and key-value head"),
        "hf_configs": fmt_count(hf["configs"]), "hf_exact": fmt_count(hf["exact_configs"]),
        "hf_regions": fmt_count(hf["regions"]), "hf_mismatched": fmt_count(hf["mismatched_regions"]),
        "hf_storages": fmt_count(hf["storages"]), "hf_bytes": fmt_count(hf["measured_bytes"]),
        "hf_verdict": _all(hf["all_exact"], "match exactly", "do not all match"),
        "hf_cases": _of(hf["exact_configs"], hf["configs"], "cases", "match exactly"),
        "hf_regions_clause": _of(hf["mismatched_regions"], hf["regions"], "regions compared", "differ by any byte"),
        "random_clause": _of(rc["exact"], rc["configs"],
                             f"random small configurations drawn from seed {fmt_count(rc['seed'])}", "match exactly"),
        "random_configs": fmt_count(rc["configs"]), "random_exact": fmt_count(rc["exact"]),
        "random_seed": fmt_count(rc["seed"]),
        # megatron, measured
        "m_configs": fmt_count(mc["configs"]), "m_exact": fmt_count(mc["exact_configs"]),
        "m_blocks": fmt_count(mc["blocks"]), "m_mismatched": fmt_count(mc["mismatched_blocks"]),
        "m_storages": fmt_count(mc["storages"]), "m_param_bytes": fmt_count(mc["parameter_bytes"]),
        "m_grad_bytes": fmt_count(mc["main_grad_bytes"]),
        "m_verdict": _all(mc["all_exact"], "agree byte for byte", "do not all agree"),
        "m_cases": _of(mc["exact_configs"], mc["configs"], "cases", "agree byte for byte"),
        "m_blocks_clause": _of(mc["mismatched_blocks"], mc["blocks"], "blocks", "differ"),
        "m_states_verdict": _all(mc["parameter_difference"] == 0 and mc["main_grad_difference"] == 0,
                                 "equal", "differ from"),
        # one layer: the paper's ledger against hf-eager
        "layer_paper": fmt_bytes(groups["total"]["paper"]), "layer_hf": fmt_bytes(groups["total"]["hf-eager"]),
        "layer_more": "more" if more else "less", "layer_diff": fmt_bytes(abs(groups["total"]["difference"])),
        "norms_paper": fmt_bytes(groups.get("RMSNorms", zero)["paper"], "MiB"),
        "norms_hf": fmt_bytes(groups.get("RMSNorms", zero)["hf-eager"], "MiB"),
        "scores_paper": fmt_bytes(groups.get("attention scores", zero)["paper"], "MiB"),
        "scores_hf": fmt_bytes(groups.get("attention scores", zero)["hf-eager"], "MiB"),
        "router_paper": fmt_bytes(groups.get("router", zero)["paper"], "MiB"),
        "router_hf": fmt_bytes(groups.get("router", zero)["hf-eager"], "MiB"),
        "top_group": sv.group_name(top["group"], m),
        "top_share": pct(top["share"], 1, 0) if top["share"] is not None else "—",
        # one layer, three implementations
        "k_probs_local": fmt_bytes(kd["probs_local"]), "k_lse_te": fmt_bytes(kd["lse_te"], "MiB"),
        "k_norms_local": fmt_bytes(kd["norms_local"], "MiB"), "k_norms_te": fmt_bytes(kd["norms_te"], "MiB"),
        "k_rope_local": fmt_bytes(kd["rope_local"], "MiB"), "k_total_hf": fmt_bytes(kd["total_hf"]),
        "k_total_local": fmt_bytes(kd["total_local"]), "k_total_te": fmt_bytes(kd["total_te"]),
        "k_differ": _list(sv.group_name(g, m) for g in gt["local_te_differ"]),
        "k_differ_count": number_word(len(gt["local_te_differ"])),
        # the allocator
        "min_block": fmt_count(PYTORCH_ALLOCATOR["kMinBlockSize"]),
    }


_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}


def _n(n: int, one: str, many: str | None = None) -> str:
    """A count and its noun: ``one MoE layer``, ``4 routed experts``."""
    return f"{_WORDS.get(n, fmt_count(n))} {one if n == 1 else (many or one + 's')}"


def _mini_layers(m, mini) -> str:
    """The miniature's layers (and routed experts), in words: ``one dense and one MoE layer and 32 routed experts,
    the fewest multiple of the expert groups that holds twice the experts per token``."""
    kinds = [k for k in ("dense", "moe") if k in mini.layer_kinds]
    counts = [mini.layer_kinds.count(k) for k in kinds]
    if len(kinds) == 1:
        text = _n(counts[0], f"{_KIND[kinds[0]]} layer")
    else:
        text = " and ".join(f"{_WORDS.get(c, fmt_count(c))} {_KIND[k]}" for k, c in zip(kinds, counts)) + " layer"
    if not mini.has_moe:
        return text
    rule = ("the fewest multiple of the expert groups that holds twice the experts per token"
            if m.family == "deepseek" else "twice the experts per token, or all of the model's if it has fewer")
    return f"{text} and {_n(mini.n_routed_experts, 'routed expert')} ({rule})"


def clauses(est: Estimate) -> dict[str, str]:
    """The clauses of the chapter's prose that name the model's own blocks (Markdown: code and math), chosen from
    :func:`memlib.model.blocks.model_blocks`: what the miniature keeps, which tensors ``transformers`` fuses, what
    Megatron-Core's model is built with and where its storages are placed, and what both GPU paths share."""
    m = est.model
    own = model_blocks(m)
    mini = sv.miniature(m)
    # the miniature keeps: the structure of each block the model has
    keep = []
    if "mla" in own:
        keep.append("query compression" if m.q_lora_rank else "no query compression")
    if "gqa" in own:
        keep.append("as many key-value heads as query heads" if m.num_key_value_heads == m.num_attention_heads
                    else "fewer key-value heads than query heads")
    if "shared_experts" in own:
        keep.append("its shared experts")
    if "moe" in own:
        keep += ([f"{math('N_r')} = {fmt_count(m.num_experts_per_tok)} experts per token"]
                 if mini.num_experts_per_tok == m.num_experts_per_tok else [])
        keep += ([f"{math('n_g')} = {fmt_count(m.n_group)} expert groups, {math('k_g')} = {fmt_count(m.topk_group)}"
                  " per token"] if m.n_group > 1 else [])
        keep.append(f"the router's {m.scoring_func}" + (" and its bias" if "router_bias" in own else ""))
    if "mtp" in own:
        keep.append("one MTP module")
    if m.tie_word_embeddings:
        keep.append("a head tied to the embedding")
    # transformers' fused tensors: one Hugging Face tensor that holds several of memlib's
    by_hf: dict[str, list[str]] = {}
    for t in attention_tensors(m):
        by_hf.setdefault(t.hf.rsplit(".", 2)[-2] if t.hf.endswith(".weight") else t.hf, []).append(t.latex)
    fused = [f"`{hf}` holds {join_and(f'${x}$' for x in xs)}" for hf, xs in by_hf.items() if len(xs) > 1]
    if "moe" in own:
        fused.append("the routed experts of a layer are stacked into three-dimensional tensors")
    # Megatron-Core's GPTModel for the model
    built = ["MLA with its latent RMSNorms" if "mla" in own else
             f"{'multi-head' if m.num_key_value_heads == m.num_attention_heads else 'grouped-query'} attention"]
    if "dense_layers" in own and "moe" in own:
        built.append("dense and MoE layers")
    elif "moe" in own:
        built.append("MoE layers")
    else:
        built.append("dense layers")
    if "shared_experts" in own:
        built.append("shared experts")
    if "moe" in own:
        built.append(f"{m.scoring_func} routing" + (" with an expert bias" if "router_bias" in own else "")
                     + (" and group-limited top-k" if m.n_group > 1 else ""))
    built.append({"swiglu": "SwiGLU", "gelu": "GELU"}.get(m.mlp, m.mlp))
    if "mtp" in own:
        built.append("an MTP module")
    regions = ["the inputs", "each decoder layer", "the head with the loss"] + (["the MTP module"] if "mtp" in own else [])
    blocks = (["attention"] + (["the dense FFN"] if "dense_layers" in own else []) + (["the MoE layer"] if "moe" in own
              else []) + (["the MTP module's own tensors and its head"] if "mtp" in own else []))
    same = (["the router", "the token permutation"] if "moe" in own else []) + ["the SwiGLU"] + (
        ["the experts' probability weighting"] if "moe" in own else []) + ["the cross-entropy"] + (
        ["the MTP loss"] if "mtp" in own else []) + ["the recompute checkpoints"]
    params = ("Each tensor `transformers` builds is matched to the memlib tensors it holds"
              + (f" (some are fused: {'; '.join(fused)})" if fused else "") + ", then compared per tensor, per block and "
              "in total." + (" The router's bias `e_score_correction_bias` is a buffer on both sides."
                             if "router_bias" in own else ""))
    rope = ("the shared RoPE key expanded to every head" if "rope_split" in own
            else "the keys and values repeated to every query head" if "gqa" in own else "one per head")
    latents = "latents $c^Q$ and $c^{KV}$ before their norm" if "q_latent" in own else "latent $c^{KV}$ before its norm"
    te_norms = "its input and one FP32 `rsigma` per token" + (
        f"; its fused norm and linear of the {latents.split(' ')[0]} keeps the normalised output for the weight "
        f"gradient and the {latents}, which the table counts with the MLA latents and projections"
        if "mla" in own else "")
    return {"mini_keeps": join_and(keep) if keep else "its blocks", "params_method": params, "rope_copies": rope,
            "k_norms_te": te_norms,
            "m_built": join_and(built), "m_regions": join_and(regions), "m_blocks": join_and(blocks),
            "k_same": join_and(same), "mini_changed": _mini_changed(m, mini)}


def _mini_changed(m, mini) -> str:
    """The widths the miniature shrinks, ``$h$ 7,168 → 32``, in the order of :data:`_MINI_FIELDS`."""
    return join_and(f"{math(k)} {_field(getattr(m, f))} → {_field(getattr(mini, f))}" for f, k in _mini_fields(m)
                    if k and getattr(m, f) != getattr(mini, f) and getattr(m, f) is not None)


def _others(checks, m) -> str:
    """The other presets checked (DeepSeek's own models, :data:`memlib.scenarios.models.PRESET_ORDER`), by name:
    ``DeepSeek's other models, DeepSeek-V2 and DeepSeek-V2-Lite`` in the book of one of them."""
    names = join_and(model_name(r["model"]) for r in checks[1:])
    if not names:
        return "no other preset"
    from ..scenarios.models import PRESET_ORDER

    return f"DeepSeek's other models, {names}" if m.name in PRESET_ORDER else f"DeepSeek's models {names}"


def _list(names) -> str:
    return join_and(names) or "none"


# ------------------------------------------------------------------------------------------------
# the miniature and the parameters
# ------------------------------------------------------------------------------------------------
#: the config fields the miniature table shows, each with its registry symbol (None: none), per block of the
#: model (:func:`memlib.model.blocks.model_blocks`; ``None``: every model)
_MINI_FIELDS = (
    (None, (("hidden_size", "h"), ("num_attention_heads", "n_h"))),
    ("gqa", (("num_key_value_heads", "n_kv"), ("head_dim", "d_head"))),
    ("mla", (("qk_nope_head_dim", "d_h"), ("v_head_dim", "d_v"), ("q_lora_rank", "d_cq"), ("kv_lora_rank", "d_c"))),
    ("rope_split", (("qk_rope_head_dim", "d_hR"),)),
    ("dense_layers", (("intermediate_size", "h_F"),)),
    ("moe", (("moe_intermediate_size", "h_E"), ("n_routed_experts", "N"), ("num_experts_per_tok", "N_r"),
             ("n_group", "n_g"), ("topk_group", "k_g"), ("scoring_func", None))),
    ("shared_experts", (("n_shared_experts", "N_s"), ("shared_expert_intermediate_size", "h_S"))),
    ("router_bias", (("router_bias", None),)),
    (None, (("vocab_size", "v"), ("num_hidden_layers", "l"))),
    ("mtp", (("num_nextn_predict_layers", "n_mtp"),)),
    (None, (("tie_word_embeddings", None),)),
)


def _mini_fields(m) -> list[tuple[str, str | None]]:
    """The fields of :data:`_MINI_FIELDS` of ``m``'s own blocks (a field it leaves null is left out)."""
    own = model_blocks(m)
    return [(f, k) for block, fs in _MINI_FIELDS if block is None or block in own for f, k in fs
            if getattr(m, f) is not None and (m.n_group > 1 or f not in ("n_group", "topk_group"))]


def _field(x) -> str:
    if x is None:
        return "— (null)"
    if isinstance(x, bool):
        return yes_no(x)
    return fmt_count(x) if isinstance(x, int) else str(x)


def miniature_table(est: Estimate) -> str:
    """The model beside its miniature, field by field, and whether the miniature keeps the value."""
    m, mini = est.model, sv.miniature(est.model)
    rows = [[f"`{f}`" + (f" ({math(k)})" if k else ""), _field(getattr(m, f)), _field(getattr(mini, f)),
             yes_no(getattr(m, f) == getattr(mini, f))] for f, k in _mini_fields(m)]
    return md_table(["field", model_name(m), "in miniature", "same"], rows, "lrrl")


def parameter_table(est: Estimate) -> str:
    """The model's parameters at full size, memlib against transformers, per memlib block."""
    r = sv.parameter_checks(est.model)[0]
    rows = [[x["block"].replace("_", " ").replace("ffn", "FFN"), fmt_count(x["memlib"] or 0), fmt_count(x["transformers"] or 0),
             _signed(x["difference"])] for x in r["block_rows"]]
    rows.append(["**total**", fmt_count(r["total"]["memlib"]), fmt_count(r["total"]["transformers"]),
                 _signed(r["difference"])])
    return md_table(["block", "parameters, memlib", "parameters, transformers", "difference"], rows, "lrrr")


# ------------------------------------------------------------------------------------------------
# hf-eager against transformers
# ------------------------------------------------------------------------------------------------
def hf_table(est: Estimate) -> str:
    """One row per measured case: shape, activation bytes predicted and measured, gradients and AdamW
    state (measured, with the difference from the prediction), bytes."""
    rows = []
    for r in sv.hf_comparisons(est.model):
        a, g, o = r["activations"], r["gradients"], r["optimizer_states"]
        rows.append([r["label"], _kinds(r["kinds"]), fmt_count(r["micro_batch"]), fmt_count(r["seq_len"]),
                     fmt_count(a["predicted"]), fmt_count(a["measured"]), _signed(a["difference"]),
                     f"{fmt_count(g['measured'])} ({_signed(g['difference'])})",
                     f"{fmt_count(o['measured'])} ({_signed(o['difference'])})"])
    return md_table(["case", "layers", "$b$", "$s$", "predicted (bytes)", "measured (bytes)", "Δ",
                     "gradients (Δ)", "AdamW state (Δ)"], rows, "llrrrrrrr")


_CASE_COLORS = [OKABE_ITO[k] for k in ("blue", "orange", "green", "vermillion", "purple", "sky", "yellow", "black")]


def hf_figure(est: Estimate):
    """Predicted against measured saved bytes, one point per region (hf-eager) or block (megatron)
    of every measured case; the line is equality."""
    from matplotlib.lines import Line2D

    fig, ax = new_figure(height=4.6)
    cases = [("hf-eager: " + r["label"], [(x["predicted"], x["measured"]) for x in r["regions"]], "o")
             for r in sv.hf_comparisons(est.model)]
    cases += [("Megatron-Core: " + r["label"], [(x["predicted"], x["measured"]) for x in r["blocks"]], "s")
              for r in sv.megatron_comparisons(est.model)]
    points = [p for _, pts, _ in cases for p in pts if p[0] and p[1]]
    lo, hi = min(min(p) for p in points), max(max(p) for p in points)
    ax.plot([lo, hi], [lo, hi], color=OKABE_ITO["black"], alpha=0.4, lw=1, zorder=1)
    handles = []
    for color, (label, pts, marker) in zip(_CASE_COLORS, cases):
        pts = [p for p in pts if p[0] and p[1]]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, s=24, alpha=0.85, zorder=3)
        handles.append(Line2D([], [], ls="", marker=marker, color=color, label=label))
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax, "x")
    plain_log_ticks(ax)
    ax.set_xlabel("predicted by the ledger, bytes")
    ax.set_ylabel("measured with autograd hooks, bytes")
    ax.legend(handles=handles, loc="lower right")
    return fig


# ------------------------------------------------------------------------------------------------
# one layer: the paper's ledger beside hf-eager
# ------------------------------------------------------------------------------------------------
def group_table(est: Estimate) -> str:
    b, s = _b_s(est)
    rows = []
    for g, v in sv.layer_groups(est.model, _kind(est), b, s).items():
        rows.append([f"**{g}**" if g == "total" else sv.group_name(g, est.model), fmt_bytes(v["paper"], "MiB", with_unit=False),
                     fmt_bytes(v["hf-eager"], "MiB", with_unit=False),
                     ("+" if v["difference"] >= 0 else "−") + fmt_bytes(abs(v["difference"]), "MiB", with_unit=False),
                     "—" if v["ratio"] is None else ratio(v["ratio"], 1)])
    return md_table(["entries", "paper, MiB", "hf-eager, MiB", "difference, MiB", "hf-eager / paper"], rows, "lrrrr")


def entry_table(est: Estimate) -> str:
    b, s = _b_s(est)
    rows = []
    for e in sv.layer_entries(est.model, _kind(est), "hf-eager", b, s):
        dtype = {"act": "bf16"}.get(e["dtype"], e["dtype"])
        rows.append([f"`{e['key']}`", e["name"], dtype, f"${tex(e['formula'])}$", fmt_bytes(e["bytes"], "MiB")])
    return md_table(["entry", "tensor", "dtype", "bytes", "MiB"], rows, "lllll")


# ------------------------------------------------------------------------------------------------
# megatron against Megatron-Core, and the three implementations
# ------------------------------------------------------------------------------------------------
def megatron_table(est: Estimate) -> str:
    """One row per measured case: activations predicted and measured, parameters and main_grad
    buffers (measured, with the difference), bytes."""
    rows = []
    for r in sv.megatron_comparisons(est.model):
        a, p, g, t = r["activations"], r["parameters"], r["main_grad"], r["train"]
        rows.append([r["label"], _kinds(r["kinds"]), f"`{t.recompute}`", t.precision, fmt_count(a["predicted"]),
                     fmt_count(a["measured"]), _signed(a["difference"]),
                     f"{fmt_count(p['measured'])} ({_signed(p['difference'])})",
                     f"{fmt_count(g['measured'])} ({_signed(g['difference'])})"])
    return md_table(["case", "layers", "recompute", "precision", "predicted (bytes)", "measured (bytes)", "Δ",
                     "parameters (Δ)", "main_grad (Δ)"], rows, "llllrrrrr")


def side_table(est: Estimate) -> str:
    b, s = _b_s(est)
    rows = []
    for g, v in sv.ground_truths(est.model, _kind(est), b, s)["groups"].items():
        cells = [fmt_bytes(v[c], "MiB", with_unit=False) for c in sv.COLUMNS]
        rows.append([f"**{g}**" if g == "total" else sv.group_name(g, est.model), *cells])
    return md_table(["entries"] + [COLUMN_LABELS[c] + ", MiB" for c in sv.COLUMNS], rows, "lrrr")


_GROUP_COLORS = dict(zip(sv.SIDE_GROUPS, [OKABE_ITO[k] for k in ("yellow", "sky", "purple", "vermillion", "black",
                                                                  "green", "blue", "orange")] + ["#999999"]))


def side_figure(est: Estimate):
    """One layer of the model under the paper's ledger, Hugging Face eager, Megatron-Core local and
    Megatron-Core with Transformer Engine: stacked bars by group of entries, GiB."""
    b, s = _b_s(est)
    cols = sv.by_group(est.model, _kind(est), b, s)
    fig, ax = new_figure(height=4.2)
    series = [Series(sv.group_name(g, est.model), _GROUP_COLORS[g], [cols[c][g] for c in cols]) for g in sv.SIDE_GROUPS]
    stacked_bars(ax, [COLUMN_LABELS[c].replace(" (", "\n(") for c in cols], series, digits=2)
    ax.set_ylabel(f"one {_KIND[_kind(est)]} layer, GiB")
    ax.legend(ncol=2)
    return fig


def megatron_entry_table(est: Estimate) -> str:
    """Every entry of one megatron layer, local beside Transformer Engine, with where each TE number
    comes from (measured on the CPU, or the kernel source that saves it)."""
    b, s = _b_s(est)
    rows = [[f"`{e['key']}`", sv.group_name(e["group"], est.model), "—" if e["local"] is None else fmt_bytes(e["local"], "MiB"),
             "—" if e["te"] is None else fmt_bytes(e["te"], "MiB"), SOURCE_LABELS.get(e["source"], "")]
            for e in sv.megatron_layer_entries(est.model, _kind(est), b, s)]
    return md_table(["entry", "group", "local (measured)", "Transformer Engine", "TE value from"], rows, "llrrl")


# ------------------------------------------------------------------------------------------------
# the GPU run
# ------------------------------------------------------------------------------------------------
def gpu_values(est: Estimate) -> dict[str, str]:
    """The recorded GPU run, in words and numbers: the device and versions, the verdict, and the
    allocator's view of its largest configuration."""
    run = sv.gpu_run()
    big = next(r for r in run["rows"] if r["config"] == run["largest"])
    widths = big["widths_of"]
    return {
        "device": run["device"], "torch": run["torch_version"], "torch_build": run["torch"],
        "transformers": run["transformers"], "torch_pinned": run["pinned"]["torch"],
        "torch_same": _all(run["same_torch"], "the pinned version", "not the pinned version"),
        "transformers_same": _all(run["same_transformers"], "the pinned version", "not the pinned version"),
        "transformers_pinned": run["pinned"]["transformers"],
        "cuda": f"built for CUDA {run['cuda']}" if run["cuda"] else "its CUDA version not recorded",
        "order": ", ".join(run["order"]),
        "shared": ", ".join(f"{math(k)} = {fmt_count(v)}" for k, v in sv.gpu_shared().items()),
        "configs": number_word(run["configs"]), "exact": fmt_count(run["exact"]),
        "in_exact": (f"In all {number_word(run['configs'])} configurations" if run["exact"] == run["configs"] > 1 else
                     f"In {fmt_count(run['exact'])} of {fmt_count(run['configs'])} configurations"),
        "verdict": _all(run["all_exact"], "equals", "does not always equal"),
        "prediction_same": _all(run["all_same_prediction"], "gives the same predictions", "gives other predictions"),
        "big": big["config"], "big_widths": f"{model_name(widths)}'s widths" if widths else "the widths of no shipped preset",
        "big_is_model": _all(widths == est.model.name, "this book's model", "not this book's model"),
        "big_layers": fmt_count(big["model"].num_hidden_layers),
        "big_kinds": " and ".join(f"{fmt_count(big['model'].layer_kinds.count(k))} {_KIND[k]}" for k in _KIND
                                  if k in big["model"].layer_kinds),
        "big_saved": fmt_bytes(big["saved"]), "big_saved_bytes": fmt_count(big["saved"]),
        "big_logits": fmt_bytes(big["logits"], "MiB"), "big_beyond_logits": fmt_count(abs(big["held_beyond_logits"])),
        "big_beyond_sign": "less" if big["held_beyond_logits"] < 0 else "more",
        "big_transient": fmt_bytes(big["transient_above_held"]), "big_held": fmt_bytes(big["held_after_forward"]),
        "big_reserved": fmt_bytes(big["reserved"]), "big_weights": fmt_bytes(big["weights"]),
        "big_allocated": fmt_bytes(big["allocated_after_min"]), "big_peak": fmt_bytes(big["peak_min"]),
        "big_peak_above": fmt_bytes(big["peak_above_before"]),
        "big_over_allocated": fmt_bytes(big["reserved_over_allocated_max"]),
        "big_over_peak": fmt_bytes(big["reserved_over_peak_max"]),
    }


def gpu_config_table() -> str:
    """What each configuration of the GPU run is: widths, layers, b and s."""
    rows = []
    for name, _, b, s in sv.GPU_CONFIGS:
        m = sv.gpu_model(name)
        w = sv.widths_of(m)
        rows.append([name, fmt_count(m.hidden_size), fmt_count(m.num_attention_heads), _field(m.q_lora_rank),
                     fmt_count(m.kv_lora_rank), fmt_count(m.intermediate_size), fmt_count(m.moe_intermediate_size),
                     fmt_count(m.n_routed_experts), fmt_count(m.num_experts_per_tok), fmt_count(m.n_shared_experts),
                     fmt_count(m.vocab_size), _kinds(m.layer_kinds), fmt_count(b), fmt_count(s),
                     model_name(w) if w else "—"])
    return md_table(["config", "$h$", "$n_h$", "$d_c'$", "$d_c$", "$h_F$", "$h_E$", "$N$", "$N_r$", "$N_s$", "$v$",
                     "layers", "$b$", "$s$", "widths of"], rows, "lrrrrrrrrrrlrrl")


def gpu_bytes_table() -> str:
    """Per configuration (a column each): the bytes memlib predicted then and predicts now, the bytes saved,
    and what the forward pass left allocated beyond them (bytes, exact).  Seven quantities of up to 14 digits
    side by side would not fit the text column; three configurations do."""
    runs = sv.gpu_run()["rows"]
    lines = [("predicted in the run", lambda r: fmt_count(r["predicted"])),
             ("predicted today", lambda r: fmt_count(r["predicted_now"])),
             ("saved for backward", lambda r: fmt_count(r["saved"])),
             ("exact", lambda r: yes_no(r["exact"])),
             ("held after forward", lambda r: fmt_count(r["held_after_forward"])),
             ("logits", lambda r: fmt_count(r["logits"])),
             ("held − saved − logits", lambda r: _signed(r["held_beyond_logits"]))]
    rows = [[what, *(cell(r) for r in runs)] for what, cell in lines]
    return md_table(["bytes", *(r["config"] for r in runs)], rows, "l" + "r" * len(runs))


def gpu_allocator_table() -> str:
    """Per configuration, in GiB: the weights (memlib), what the forward pass left allocated and its
    peak (lower bounds), what the allocator reserved, and how far reserved lies above them."""
    rows = [[r["config"], fmt_bytes(r["weights"], with_unit=False), fmt_bytes(r["held_after_forward"], with_unit=False),
             "≥ " + fmt_bytes(r["allocated_after_min"], with_unit=False),
             fmt_bytes(r["peak_above_before"], with_unit=False), "≥ " + fmt_bytes(r["peak_min"], with_unit=False),
             fmt_bytes(r["reserved"], with_unit=False),
             "≤ " + fmt_bytes(r["reserved_over_peak_max"], with_unit=False)] for r in sv.gpu_run()["rows"]]
    return md_table(["config", "weights (memlib)", "held after forward", "allocated after forward",
                     "peak above before", "peak allocated", "reserved", "reserved − peak"], rows, "lrrrrrrr")


# ------------------------------------------------------------------------------------------------
# whole training steps on a GPU (memlib.scenarios.gpu_steps)
# ------------------------------------------------------------------------------------------------
#: where the peak is: the allocator's site (memlib.scenarios.gpu_steps.GpuStep.measured_site) and memlib's
#: candidate moment (memlib.device.transient), in words
STEP_SITES = {"loss": "the loss's forward", "recomputation": "a recomputed layer's backward",
              "backward": "the backward"}
STEP_MOMENTS = {"forward_end": "the loss's forward", "backward_attention": "an attention's backward",
                "forward_moe": "the experts' forward", "recompute": "a recomputed layer's backward"}
def _gib(n: int) -> str:
    return fmt_bytes(n, "GiB", 2, with_unit=False)


def _names(steps) -> str:
    return join_and(s.name for s in steps)


def _misses(misses) -> str:
    """The cases short by more than rounding, in a sentence each kind of site can stand behind."""
    if not misses:
        return "No case is off by more than rounding."
    cases = "; ".join(f"{s.name}, {signed_pct(s.error)} ({signed_bytes(s.difference, 'MiB', 0)})"
                      for s in misses)
    head = ("One case is off by more than rounding: " if len(misses) == 1 else
            f"{fmt_count(len(misses)).capitalize()} cases are off by more than rounding: ") + cases + "."
    sites = {s.measured_site for s in misses}
    if sites == {"recomputation"}:
        it = "It peaks" if len(misses) == 1 else "They peak"
        head += (f" {it} in the backward of a recomputed layer, while its attention's gradients are computed, where "
                 "more gradients of the residual stream's size are alive than memlib's moment lists.")
    return head


def step_values() -> dict[str, str]:
    """The measured training steps in words and numbers: the machine, the verdict, each rule's bytes."""
    env, steps, lr = gs.gpu_environment(), {s.name: s for s in gs.gpu_steps()}, gs.loss_region()
    summ = gs.summary(list(steps.values()))
    misses = summ["misses"]
    ds, llama = steps["ds-none-native"], steps["llama-full-native"]
    out = {
        "gpu": env["gpu"], "driver": env["driver"], "torch": env["torch"], "cuda": env["cuda"],
        "mcore": env["megatron_core"], "n": number_word(summ["n"]), "smallest": fmt_bytes(summ["smallest"]),
        "largest": fmt_bytes(summ["largest"]), "card": fmt_bytes(env["total_memory"]), "max_abs": signed_pct(summ["max_abs"]).lstrip("+"),
        "worst": summ["worst"], "cpu_max_abs": signed_pct(summ["cpu_max_abs"]).lstrip("+"),
        "cpu_worst": summ["cpu_worst"], "n_rounding": number_word(summ["n_rounding"]),
        "rounding": signed_pct(summ["rounding"]).lstrip("+"), "misses_sentence": _misses(misses),
        "seq_len": fmt_count(ds.config["train"]["seq_len"]),
        "microbatches": " or ".join(sorted({fmt_count(x.config["train"]["num_microbatches"]) for x in steps.values()})),
        "norm_case": ds.name, "norm_bytes": fmt_bytes(ds.norm_bytes),
        "buffer_case": ds.name, "buffer_bytes": fmt_bytes(ds.attention_buffer),
        "workspace_case": llama.name, "workspace_bytes": fmt_bytes(llama.loss_workspace),
        "lr_shape": f"[{fmt_count(lr['seq_len'])}, {fmt_count(lr['micro_batch'])}, {fmt_count(lr['vocab_size'])}]",
        "lr_logits": fmt_bytes(lr["logits"]),
        "outliving": _names(summ["outliving"]),
        "outlived": " and ".join(fmt_bytes(s.outlived) for s in summ["outliving"]),
    }
    for impl in ("native", "unfused"):
        for what in ("held", "forward_peak", "backward_peak"):
            out[f"lr_{impl}_{what}"] = ratio(lr[impl][what], 1, 2) + " L"
    return out


def step_table() -> str:
    """Per case (named model-recompute-loss): b, the measured steady peak, memlib's and the error, the error
    memlib would make under the CPU's rules, and where each peak is."""
    rows = [[f"`{s.name}`", fmt_count(s.config["train"]["micro_batch"]), _gib(s.measured), _gib(s.predicted),
             signed_pct(s.error), signed_pct(s.cpu_error), STEP_SITES.get(s.measured_site, s.measured_site),
             STEP_MOMENTS[s.peak.candidate]] for s in gs.gpu_steps()]
    return md_table(["case", "$b$", "measured (GiB)", "memlib (GiB)", "error", "CPU's rules", "allocator's peak in",
                     "memlib's peak in"], rows, "lrrrrrll")


# ------------------------------------------------------------------------------------------------
# worked problems
# ------------------------------------------------------------------------------------------------
def _growth(r) -> str:
    return "more than doubles" if r > 2 else ("exactly doubles" if r == 2 else "less than doubles")


def problem_values(est: Estimate) -> dict[str, str]:
    """The worked problem: one layer at twice the sequence length under both ledgers."""
    b, s = _b_s(est)
    kind = _kind(est)
    ls = sv.longer_sequence(est.model, kind, b, s)
    return {
        "s2": fmt_count(ls["s2"]), "paper_s2": fmt_bytes(ls["paper_s2"]), "hf_s2": fmt_bytes(ls["hf_s2"]),
        "paper_ratio": ratio(ls["paper_ratio"], 1), "hf_ratio": ratio(ls["hf_ratio"], 1),
        "paper_growth": _growth(ls["paper_ratio"]), "hf_growth": _growth(ls["hf_ratio"]),
        "scores_paper_s2": fmt_bytes(ls["scores_paper_s2"]), "scores_hf_s2": fmt_bytes(ls["scores_hf_s2"]),
        "others_growth": (f"under both ledgers by a factor of {ratio(ls['others_ratio']['paper'], 1)}"
                          if ratio(ls["others_ratio"]["paper"], 1) == ratio(ls["others_ratio"]["hf-eager"], 1) else
                          f"by a factor of {ratio(ls['others_ratio']['paper'], 1)} under the paper's ledger and "
                          f"{ratio(ls['others_ratio']['hf-eager'], 1)} under hf-eager"),
        "others_constant": "or constant like the experts' offsets" if est.model.has_moe else "or constant",
        "others_bound": _all(ls["others_at_most_double"], "no other group more than doubles",
                             "other groups more than double too"),
    }
