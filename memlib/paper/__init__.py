"""The paper's views of memlib's counts (arXiv 2502.07846, Zhang and Su 2025).

The paper analyses DeepSeek-V3 under one configuration; these modules compute, for any model and
configuration, the quantities its tables and formulas report, as exact values keyed by the row
labels of :data:`memlib.data.reference.PAPER`, so that the book can put them beside the printed ones
where the model is the paper's (:func:`is_paper_model`) and stand on its own where it is not.
"""
from __future__ import annotations

from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model
from ..model.partition import balanced_layout, default_layout
from ..data.reference import PAPER

__all__ = ["is_paper_model", "paper_training", "PAPER_MODEL", "device_group"]

#: the model the paper analyses
PAPER_MODEL = "deepseek-v3"


def is_paper_model(model: ModelConfig | str) -> bool:
    """Whether ``model`` is the model the paper analyses: every field of its Table 1 (and Table 9's
    N_r) equal to DeepSeek-V3's, and DeepSeek-V3's layer pattern and MTP module."""
    m = load_model(model)
    ref = load_model(PAPER_MODEL)
    same_table1 = all(getattr(m, k) == v for k, v in PAPER["table1"].items())
    return same_table1 and m.layer_kinds == ref.layer_kinds and \
        m.num_nextn_predict_layers == ref.num_nextn_predict_layers and m.tie_word_embeddings == ref.tie_word_embeddings


def paper_training(model: ModelConfig | str, base: TrainingConfig = PAPER_TRAINING) -> TrainingConfig:
    """The paper's configuration (PP16@TP2@EP8@ETP1, DP32) for ``model``, as close as the model
    allows: the default layout where it is valid (DeepSeek-V3: the paper's 4 x 15 + 1), else the
    balanced one (:func:`memlib.model.partition.balanced_layout`); fewer stages than layers; EP the largest
    divisor of the routed experts not above 8 (1 for a dense model); TP the largest divisor of the
    query heads (and of the key-value heads, GQA) not above 2."""
    m = load_model(model)
    t = base
    pp = min(t.pp, m.num_hidden_layers)
    heads = (m.num_attention_heads, m.num_key_value_heads or m.num_attention_heads)
    tp = max(d for d in range(1, t.tp + 1) if all(n % d == 0 for n in heads) and t.tp % d == 0)
    # a dense model has no experts to lay out: EP 1
    ep = 1 if not m.has_moe else max(d for d in range(1, t.ep + 1)
                                     if m.n_routed_experts % d == 0 and (t.dp * tp) % (d * t.etp) == 0)
    try:
        default_layout(m.num_hidden_layers, pp)
        layout = None
    except Exception:
        layout = balanced_layout(m.num_hidden_layers, pp)
    if (pp, tp, ep, layout) == (t.pp, t.tp, t.ep, t.layout):
        return t
    return t.with_(pp=pp, tp=tp, ep=ep, layout=layout)


def moe_stages(part) -> list[int]:
    """The pipeline stages that hold MoE layers only (neither the embedding nor the head): the
    stages the paper analyses (1 to 14 for DeepSeek-V3 on 16 stages)."""
    m = part.model
    return [st.index for st in part.stages if st.layers and not st.first and not st.last
            and all(m.is_moe_layer(i) for i in st.layers)]


def analysed_stage(part) -> int:
    """The stage the paper analyses: the first MoE-only stage (stage 1 for DeepSeek-V3), or, for a
    layout without one, the stage with the most MoE layers."""
    stages = moe_stages(part)
    if stages:
        return stages[0]
    m = part.model
    return max(part.stages, key=lambda st: (sum(m.is_moe_layer(i) for i in st.layers), -st.index)).index


__all__ += ["moe_stages", "analysed_stage"]


_MOE_BLOCKS = ("router", "shared_experts", "routed_experts")


def device_group(key: str, kind: str, sharding: str) -> str:
    """The row of the paper's Table 6 a tensor falls in: ``rmsnorm``, ``mla_split``,
    ``mla_replicated``, ``moe`` (or its block: ``dense_ffn``, ``embedding``, ``head``, ``mtp``)."""
    if key.startswith("mtp."):
        return "mtp"
    if kind == "norm":
        return "rmsnorm"
    block = key.split(".")[0]
    if block == "attention":
        return "mla_split" if sharding == "tp" else "mla_replicated"
    if block in _MOE_BLOCKS:
        return "moe"
    return block
