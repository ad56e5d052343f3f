"""Parameter counts: per tensor, per layer, per model; total, activated per token, MTP, buffers.

Every count is a :class:`~memlib.core.breakdown.Breakdown` of SymPy terms in the notation of
:mod:`memlib.core.symbols`; :func:`values` gives the substitution that turns it into exact integers.

>>> from memlib.config import load_model
>>> m = load_model("deepseek-v3")
>>> model_params(m).evaluate_total(values(m))
671026404352
>>> activated_params(m).evaluate_total(values(m))
37552282624
"""
from __future__ import annotations

import sympy as sp

from .architecture import (
    Tensor, decoder_layer_tensors, embedding_tensors, head_tensors, model_values, moe_tensors, mtp_tensors,
)
from ..core.breakdown import Breakdown, exact_int
from ..config import ModelConfig
from ..core.symbols import sym

__all__ = [
    "values", "tensor_counts", "layer_params", "layer_counts", "model_params", "activated_params",
    "mtp_params", "buffer_params", "by_block", "expert_params", "per_layer_totals", "readable",
    "block_formulas", "total_formula", "fp8_scales",
]


def values(m: ModelConfig) -> dict:
    """Substitution symbol -> value for the model symbols."""
    return model_values(m)


def tensor_counts(tensors: list[Tensor], *, buffers: bool = False, times=1) -> Breakdown:
    """Element count of each tensor (trained parameters only unless ``buffers``)."""
    return Breakdown([(t.key, times * t.numel) for t in tensors if (t.kind == "buffer") == buffers])


def layer_params(m: ModelConfig, kind: str, *, buffers: bool = False) -> Breakdown:
    """One decoder layer of ``kind`` (``"dense"`` or ``"moe"``), per tensor."""
    return tensor_counts(decoder_layer_tensors(m, kind), buffers=buffers)


def layer_counts(m: ModelConfig) -> dict[str, sp.Expr]:
    """How many dense and MoE decoder layers: l and 0 when every layer is of one kind (a dense model,
    Mixtral), symbolic (k_dense, l - k_dense) when every layer after the first ``first_k_dense_replace``
    is MoE, exact integers otherwise."""
    kinds = m.layer_kinds
    if len(set(kinds)) == 1:
        return {k: sym("l") if k == kinds[0] else sp.Integer(0) for k in ("dense", "moe")}
    if m.moe_layer_freq == 1:
        return {"dense": sym("k_dense"), "moe": sym("l") - sym("k_dense")}
    return {"dense": sp.Integer(kinds.count("dense")), "moe": sp.Integer(kinds.count("moe"))}


def _layers(m: ModelConfig, *, buffers: bool = False, routed_scale=1) -> Breakdown:
    n = layer_counts(m)
    terms = []
    for kind in (k for k in ("dense", "moe") if k in m.layer_kinds):
        for t in decoder_layer_tensors(m, kind):
            if (t.kind == "buffer") != buffers:
                continue
            scale = routed_scale if t.expert else 1
            terms.append((t.key, n[kind] * scale * t.numel))
    return Breakdown(terms)


def model_params(m: ModelConfig) -> Breakdown:
    """The main model (no MTP, no buffers), per tensor summed over layers: embedding, layers, head."""
    return tensor_counts(embedding_tensors(m)) + _layers(m) + tensor_counts(head_tensors(m))


def activated_params(m: ModelConfig, *, embedding: bool = True) -> Breakdown:
    """Parameters one token passes through: every non-routed-expert parameter plus N_r of the N
    routed experts in each MoE layer.

    With ``embedding=True`` the embedding matrix counts whole, as in DeepSeek's "37B"; a token's
    lookup reads one row of it, and leaving it out gives the "36.7B" of DeepSeek-V3's weights
    documentation (36.63B)."""
    emb = tensor_counts(embedding_tensors(m)) if embedding else Breakdown()
    return emb + _layers(m, routed_scale=sym("N_r") / sym("N")) + tensor_counts(head_tensors(m))


def mtp_params(m: ModelConfig) -> Breakdown:
    """The MTP modules' own parameters (embedding and head are shared with the main model).

    Module ``j`` is typed like decoder layer ``l + j``, exactly as the last pipeline stage holds it."""
    return Breakdown([
        (t.key, t.numel)
        for j in range(m.num_nextn_predict_layers) for t in mtp_tensors(m, j) if t.kind != "buffer"
    ])


def buffer_params(m: ModelConfig) -> Breakdown:
    """Buffers that are not trained (the router's ``e_score_correction_bias``), main model only."""
    return _layers(m, buffers=True)


#: the blocks whose projection matrices a block-FP8 checkpoint stores in FP8, each with its scales: DeepSeek-V3's
#: published weights quantise the decoder layers' attention, FFN and expert matrices and keep the router, the
#: embedding, the head and the MTP projection in bf16 (the checkpoint's safetensors headers)
FP8_BLOCKS = ("attention", "dense_ffn", "shared_experts", "routed_experts")


def fp8_scales(m: ModelConfig) -> int:
    """Elements of the fp32 scale tensors (``weight_scale_inv``) a block-FP8 checkpoint of ``m`` stores, main
    model and MTP modules: one per started ``weight_block_size`` block of each stored matrix of
    :data:`FP8_BLOCKS` (a matrix the checkpoint fuses, such as MLA's ``q_b_proj`` = W^UQ and W^QR, is one
    matrix; each routed expert has its own); 0 when ``m`` has no ``weight_block_size``.

    >>> from memlib import load_model
    >>> fp8_scales(load_model("deepseek-v3"))
    41540496
    """
    if m.weight_block_size is None:
        return 0
    r, c = m.weight_block_size
    vals = values(m)

    def layer(kind: str) -> int:
        fused: dict[str, list[int]] = {}   # the checkpoint's matrix -> [copies, rows, columns]
        for t in decoder_layer_tensors(m, kind):
            if t.kind != "matrix" or t.block not in FP8_BLOCKS:
                continue
            shape = [exact_int(d, vals) for d in t.shape]
            copies, rows, cols = shape if t.expert else [1] + shape
            fused.setdefault(t.hf, [copies, 0, cols])[1] += rows
        return sum(n * -(-rows // r) * -(-cols // c) for n, rows, cols in fused.values())

    l = m.num_hidden_layers
    kinds = list(m.layer_kinds) + ["moe" if m.is_moe_layer(l + j) else "dense"
                                   for j in range(m.num_nextn_predict_layers)]
    per_kind = {k: layer(k) for k in set(kinds)}
    return sum(per_kind[k] for k in kinds)


def by_block(b: Breakdown) -> Breakdown:
    """Group a per-tensor breakdown by block (``attention``, ``routed_experts``, ...)."""
    def block(key: str) -> str:
        parts = key.split(".")
        return parts[0] if parts[0] != "mtp" or len(parts) == 2 else "mtp." + parts[1]
    return b.grouped(block)


def readable(expr: sp.Expr) -> sp.Expr:
    """``expr`` as a person writes it: expanded, then each latent or compressed width collected
    with its cofactor factored (MLA's d_c' (h + n_h (d_h + d_h^R) + 1) + ...); the value is
    unchanged."""
    e = sp.expand(expr)
    return sp.collect(e, [sym("d_cq"), sym("d_c")], func=sp.factor) if e.is_Add else sp.factor(e)


def block_formulas(m: ModelConfig) -> dict[str, sp.Expr]:
    """The per-layer blocks of eq. (3.6), each in :func:`readable` form: ``mla`` (the attention
    with its latent norms: MLA, or GQA with its biases and head norms), ``norms`` (the two block
    norms), ``ffn`` (a dense FFN) and ``moe`` (router, shared and routed experts); a block the model
    has no layer of is 0."""
    moe = by_block(layer_params(m, "moe")) if m.has_moe else Breakdown()
    dense = by_block(layer_params(m, "dense"))
    return {
        "mla": readable(dense["attention"]),
        "norms": readable(dense["norms"]),
        "ffn": readable(dense["dense_ffn"]) if "dense" in m.layer_kinds else sp.Integer(0),
        "moe": sp.Add(*(readable(moe[k]) for k in ("router", "shared_experts", "routed_experts") if k in moe)),
    }


def total_formula(m: ModelConfig) -> sp.Expr:
    """The main model's parameter count in the book's form (eq. 3.6): embedding, head and final
    norm, then every layer's MLA and norms, the dense layers' FFNs and the MoE layers' experts,
    each block written once.  Equal to :func:`model_params` (a test expands both)."""
    n, b = layer_counts(m), block_formulas(m)
    ends = tensor_counts(embedding_tensors(m)).total + tensor_counts(head_tensors(m)).total
    return ends + (n["dense"] + n["moe"]) * (b["mla"] + b["norms"]) + n["dense"] * b["ffn"] + n["moe"] * b["moe"]


def expert_params(m: ModelConfig) -> sp.Expr:
    """Parameters of one routed expert, read from the MoE block's routed-expert tensors: 3 h h_E
    (a SwiGLU of width h_E, in every MoE kind memlib knows); 0 for a dense model."""
    if not m.has_moe:
        return sp.Integer(0)
    return sp.expand(sp.Add(*(t.numel for t in moe_tensors(m) if t.expert)) / sym("N"))


def per_layer_totals(m: ModelConfig) -> list[int]:
    """Exact parameter count of each decoder layer, in order (no embedding, head or norm)."""
    vals = values(m)
    cache = {k: layer_params(m, k).evaluate_total(vals) for k in set(m.layer_kinds)}
    return [cache[k] for k in m.layer_kinds]
