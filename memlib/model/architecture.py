"""The architecture: which parameter tensors a model has, with symbolic shapes.

A decoder layer is built from block kinds, each one table entry: :data:`ATTENTION` (``mla``, ``gqa``),
:data:`DENSE_FFN` (``swiglu``, ``gelu``), :data:`MOE` (``deepseek``, ``mixtral``, ``qwen2_moe``,
``qwen3_moe``) and :data:`NORMS` (``rmsnorm``, ``layernorm``); the model's kinds come from its
:data:`memlib.config.FAMILIES` entry.  Nothing here asks which model it is, only which kinds it has.

Each tensor is a :class:`Tensor` with a symbolic shape in the notation of :mod:`memlib.core.symbols`,
the Hugging Face module that holds it, and what its dimensions mean for sharding.  The *structure*
(which tensors exist) comes from the config: q compression or not (``q_lora_rank: null``), dense or
MoE layers (``first_k_dense_replace``, ``moe_layer_freq``), shared experts, tied embeddings, the
router's bias buffer and the MTP modules.  The *sizes* stay symbols until a config is substituted.

MLA's eight matrices follow the DeepSeek-V2/V3 papers (arXiv 2405.04434, 2412.19437):
Hugging Face fuses some of them, which :attr:`Tensor.hf` records (``q_b_proj`` = W^UQ and W^QR,
``kv_a_proj_with_mqa`` = W^DKV and W^KR, ``kv_b_proj`` = W^UK and W^UV).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import sympy as sp

from ..config import ModelConfig
from ..core.symbols import (latex, sym, h, h_F, h_E, n_h, d_h, d_v, d_hR, d_cq, d_c, N, N_s, v, n_kv, d_head,
                            h_S, n_pos)

__all__ = [
    "Tensor", "attention_name", "is_deepseek_architecture", "block_kinds", "MOE_NAMES", "attention_tensors", "block_norm_tensors", "dense_ffn_tensors", "moe_tensors",
    "decoder_layer_tensors", "embedding_tensors", "head_tensors", "mtp_tensors", "mtp_embedding_copy",
    "tied_head_copy",
    "model_values", "block_names",
    "MLA_EQUATIONS", "mla_equation", "BLOCKS", "ATTENTION", "DENSE_FFN", "MOE", "NORMS",
]


#: display names of the blocks a parameter can belong to, in the order data flows
BLOCKS = {
    "embedding": "embedding",
    "attention": "MLA",
    "norms": "block RMSNorms",
    "dense_ffn": "dense FFN",
    "router": "router",
    "shared_experts": "shared experts",
    "routed_experts": "routed experts",
    "final_norm": "final RMSNorm",
    "head": "output head",
    "mtp": "MTP module",
}


def block_names(m: ModelConfig) -> dict[str, str]:
    """:data:`BLOCKS` named for ``m``: its attention by :func:`attention_name` (``GQA`` for Llama, never
    ``MLA``), its norms as RMSNorms or LayerNorms."""
    norm = "LayerNorm" if NORMS[m.norm] else "RMSNorm"
    return {**BLOCKS, "attention": attention_name(m), "norms": f"block {norm}s", "final_norm": f"final {norm}"}


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor (or buffer) of a block."""

    key: str                    #: component key, unique within a layer, e.g. ``"attention.W_UQ"``
    latex: str                  #: LaTeX name, e.g. ``"W^{UQ}"``
    shape: tuple                #: symbolic shape (rows = output features for a Linear)
    hf: str                     #: Hugging Face parameter name within its module
    kind: str = "matrix"        #: ``"matrix"``, ``"norm"``, ``"bias"``, ``"embedding"`` or ``"buffer"``
    tp_dim: Optional[sp.Expr] = None   #: the size TP splits when the tensor is TP-sharded
    expert: bool = False        #: a routed-expert tensor (leading dimension N)

    @property
    def block(self) -> str:
        return self.key.split(".")[0]

    @property
    def numel(self) -> sp.Expr:
        return sp.Mul(*self.shape)


def attention_name(m: ModelConfig) -> str:
    """The attention's name: ``MLA``, ``GQA`` (fewer key-value heads than query heads) or ``MHA``
    (grouped-query attention with as many key-value heads as query heads: GPT-2)."""
    if m.attention == "mla":
        return "MLA"
    return "MHA" if m.num_key_value_heads == m.num_attention_heads else "GQA"


def is_deepseek_architecture(m: ModelConfig) -> bool:
    """Whether ``m`` has the blocks the paper analyses: MLA and (where it has MoE layers) DeepSeekMoE."""
    return m.attention == "mla" and m.moe in ("deepseek", None)


#: what each MoE kind is, in words
MOE_NAMES = {"deepseek": "DeepSeekMoE (shared and routed experts)", "mixtral": "Mixtral's top-k MoE (no shared expert)",
             "qwen3_moe": "Qwen3-MoE (no shared expert)", "qwen2_moe": "Qwen2-MoE (a gated shared expert)"}


def block_kinds(m: ModelConfig) -> dict:
    """The blocks of ``m`` as the book describes them: ``attention`` (:func:`attention_name`), ``n_h``,
    ``n_kv`` and ``d_head`` (GQA; None for MLA), ``qk_norm``, ``ffn`` (``SwiGLU`` or ``GeLU``), ``moe``
    (:data:`MOE_NAMES`, None for a dense model), ``N``, ``N_r``, ``shared`` (whether an MoE layer has a
    shared expert), ``norm`` (``RMSNorm`` or ``LayerNorm``), ``positions`` (``RoPE`` or ``learned``),
    ``tied`` and ``deepseek`` (:func:`is_deepseek_architecture`)."""
    gqa = m.attention != "mla"
    return {"attention": attention_name(m), "n_h": m.num_attention_heads,
            "n_kv": m.num_key_value_heads if gqa else None, "d_head": m.head_dim if gqa else None,
            "qk_norm": m.qk_norm, "ffn": {"swiglu": "SwiGLU", "gelu": "GeLU"}[m.mlp],
            "moe": MOE_NAMES[m.moe] if m.moe else None, "N": m.n_routed_experts, "N_r": m.num_experts_per_tok,
            "shared": m.has_shared_experts,
            "norm": "LayerNorm" if NORMS[m.norm] else "RMSNorm", "positions": "learned" if m.positions == "learned" else "RoPE",
            "tied": m.tie_word_embeddings, "deepseek": is_deepseek_architecture(m)}


def attention_tensors(m: ModelConfig) -> list[Tensor]:
    """The attention block of ``m``'s kind (:data:`ATTENTION`)."""
    return ATTENTION[m.attention](m)


def _bias(key: str, latex: str, size, hf: str, tp_dim=None) -> Tensor:
    """A Linear's bias: split with a column-parallel weight (``tp_dim``), replicated with a row-parallel one."""
    return Tensor(key, latex, (size,), hf, "bias", tp_dim=tp_dim)


def _gqa_tensors(m: ModelConfig) -> list[Tensor]:
    """Grouped-query attention (multi-head when n_kv = n_h): W^Q over n_h heads, W^K and W^V over n_kv
    key-value heads of d_head each, W^O; optional q, k, v biases and an output bias; optional RMSNorms
    of each query and key head over d_head (Qwen3).  TP splits the query heads and the key-value heads
    (their tp_dim is the output width n_kv d_head: Megatron-Core splits its fused QKV weight evenly)."""
    t = [Tensor("attention.W_Q", "W^{Q}", (n_h * d_head, h), "self_attn.q_proj.weight", tp_dim=n_h)]
    if m.qkv_bias:
        t.append(_bias("attention.b_Q", "b^{Q}", n_h * d_head, "self_attn.q_proj.bias", n_h))
    t.append(Tensor("attention.W_K", "W^{K}", (n_kv * d_head, h), "self_attn.k_proj.weight", tp_dim=n_kv * d_head))
    if m.qkv_bias:
        t.append(_bias("attention.b_K", "b^{K}", n_kv * d_head, "self_attn.k_proj.bias", n_kv * d_head))
    t.append(Tensor("attention.W_V", "W^{V}", (n_kv * d_head, h), "self_attn.v_proj.weight", tp_dim=n_kv * d_head))
    if m.qkv_bias:
        t.append(_bias("attention.b_V", "b^{V}", n_kv * d_head, "self_attn.v_proj.bias", n_kv * d_head))
    t.append(Tensor("attention.W_O", "W^{O}", (h, n_h * d_head), "self_attn.o_proj.weight", tp_dim=n_h))
    if m.o_bias:
        t.append(_bias("attention.b_O", "b^{O}", h, "self_attn.o_proj.bias"))
    if m.qk_norm:
        t += [Tensor("attention.q_head_norm", r"\mathrm{RMSNorm}(q_i)", (d_head,), "self_attn.q_norm.weight", "norm"),
              Tensor("attention.k_head_norm", r"\mathrm{RMSNorm}(k_i)", (d_head,), "self_attn.k_norm.weight", "norm")]
    return t


def _mla_tensors(m: ModelConfig) -> list[Tensor]:
    """MLA: the eight projection matrices and the two latent RMSNorms (or W^Q without q LoRA)."""
    t = []
    if m.q_lora_rank is not None:
        t += [
            Tensor("attention.W_DQ", "W^{DQ}", (d_cq, h), "self_attn.q_a_proj.weight"),
            Tensor("attention.q_norm", r"\mathrm{RMSNorm}(c^Q)", (d_cq,), "self_attn.q_a_layernorm.weight", "norm"),
            Tensor("attention.W_UQ", "W^{UQ}", (n_h * d_h, d_cq), "self_attn.q_b_proj.weight", tp_dim=n_h),
            Tensor("attention.W_QR", "W^{QR}", (n_h * d_hR, d_cq), "self_attn.q_b_proj.weight", tp_dim=n_h),
        ]
    else:
        t += [
            Tensor("attention.W_Q", "W^{Q}", (n_h * d_h, h), "self_attn.q_proj.weight", tp_dim=n_h),
            Tensor("attention.W_QR", "W^{QR}", (n_h * d_hR, h), "self_attn.q_proj.weight", tp_dim=n_h),
        ]
    t += [
        Tensor("attention.W_DKV", "W^{DKV}", (d_c, h), "self_attn.kv_a_proj_with_mqa.weight"),
        Tensor("attention.W_KR", "W^{KR}", (d_hR, h), "self_attn.kv_a_proj_with_mqa.weight"),
        Tensor("attention.kv_norm", r"\mathrm{RMSNorm}(c^{KV})", (d_c,), "self_attn.kv_a_layernorm.weight", "norm"),
        Tensor("attention.W_UK", "W^{UK}", (n_h * d_h, d_c), "self_attn.kv_b_proj.weight", tp_dim=n_h),
        Tensor("attention.W_UV", "W^{UV}", (n_h * d_v, d_c), "self_attn.kv_b_proj.weight", tp_dim=n_h),
        Tensor("attention.W_O", "W^{O}", (h, n_h * d_v), "self_attn.o_proj.weight", tp_dim=n_h),
    ]
    return t


def _norm_tensors(m: ModelConfig | None, key: str, latex: str, hf: str) -> list[Tensor]:
    """A norm over h: RMSNorm (a weight) or LayerNorm (a weight and a bias), as :data:`NORMS` says."""
    t = [Tensor(key, latex, (h,), hf + ".weight", "norm")]
    if m is not None and NORMS[m.norm]:
        t.append(Tensor(key + "_bias", latex.replace("RMSNorm", "LayerNorm") + "^{b}", (h,), hf + ".bias", "norm"))
    return t


def block_norm_tensors(m: ModelConfig | None = None) -> list[Tensor]:
    """The two norms of a decoder layer (before attention, before the FFN): RMSNorms, or LayerNorms
    with their biases."""
    return (_norm_tensors(m, "norms.attn_norm", r"\mathrm{RMSNorm}_1", "input_layernorm")
            + _norm_tensors(m, "norms.ffn_norm", r"\mathrm{RMSNorm}_2", "post_attention_layernorm"))


def _swiglu_tensors(m: ModelConfig | None) -> list[Tensor]:
    """SwiGLU FFN of width h_F (gate, up, down), with biases when ``mlp_bias``."""
    t = [
        Tensor("dense_ffn.gate", r"W^{gate}", (h_F, h), "mlp.gate_proj.weight", tp_dim=h_F),
        Tensor("dense_ffn.up", r"W^{up}", (h_F, h), "mlp.up_proj.weight", tp_dim=h_F),
        Tensor("dense_ffn.down", r"W^{down}", (h, h_F), "mlp.down_proj.weight", tp_dim=h_F),
    ]
    if m is not None and m.mlp_bias:
        t += [_bias("dense_ffn.gate_bias", "b^{gate}", h_F, "mlp.gate_proj.bias", h_F),
              _bias("dense_ffn.up_bias", "b^{up}", h_F, "mlp.up_proj.bias", h_F),
              _bias("dense_ffn.down_bias", "b^{down}", h, "mlp.down_proj.bias")]
    return t


def _gelu_tensors(m: ModelConfig | None) -> list[Tensor]:
    """The classic GPT MLP: fc1 (h -> h_F), GeLU, fc2 (h_F -> h), with biases when ``mlp_bias``."""
    bias = m is not None and m.mlp_bias
    t = [Tensor("dense_ffn.fc1", r"W^{fc1}", (h_F, h), "mlp.c_fc.weight", tp_dim=h_F)]
    if bias:
        t.append(_bias("dense_ffn.fc1_bias", "b^{fc1}", h_F, "mlp.c_fc.bias", h_F))
    t.append(Tensor("dense_ffn.fc2", r"W^{fc2}", (h, h_F), "mlp.c_proj.weight", tp_dim=h_F))
    if bias:
        t.append(_bias("dense_ffn.fc2_bias", "b^{fc2}", h, "mlp.c_proj.bias"))
    return t


def dense_ffn_tensors(m: ModelConfig | None = None) -> list[Tensor]:
    """The dense FFN of ``m``'s kind (:data:`DENSE_FFN`; SwiGLU without ``m``)."""
    return DENSE_FFN["swiglu" if m is None else m.mlp](m)


def _router(m: ModelConfig) -> list[Tensor]:
    """The router's weight, its bias where ``mlp_bias`` (Megatron-Core's TopKRouter has one with
    add_bias_linear, moe/router.py:67-72 at the pin) and the expert-bias buffer of ``noaux_tc`` routing."""
    t = [Tensor("router.gate", "W^{G}", (N, h), "mlp.gate.weight")]
    if m.mlp_bias:
        t.append(Tensor("router.bias", "b^{R}", (N,), "mlp.gate.bias", "bias"))
    if m.router_bias:
        t.append(Tensor("router.e_score_correction_bias", "b^{G}", (N,), "mlp.gate.e_score_correction_bias", "buffer"))
    return t


def _routed(m: ModelConfig) -> list[Tensor]:
    """The N routed experts, each an MLP of width h_E of the model's own kind (Megatron-Core's experts follow
    ``gated_linear_unit`` and ``activation_func`` as its dense MLP does): SwiGLU (gate, up, down) or GeLU (fc1,
    fc2), with biases when ``mlp_bias`` (``add_bias_linear`` biases the experts too).  A bias of fc1 (and gate,
    up) splits with the expert's width over ETP; fc2's (down's) is the expert's output bias, replicated over
    ETP (:data:`ETP_REPLICATED`)."""
    if m.mlp == "gelu":
        t = [Tensor("routed_experts.fc1", r"W^{fc1}_{i}", (N, h_E, h), "mlp.experts.*.c_fc.weight", expert=True)]
        if m.mlp_bias:
            t.append(Tensor("routed_experts.fc1_bias", r"b^{fc1}_{i}", (N, h_E), "mlp.experts.*.c_fc.bias", "bias",
                            expert=True))
        t.append(Tensor("routed_experts.fc2", r"W^{fc2}_{i}", (N, h, h_E), "mlp.experts.*.c_proj.weight", expert=True))
        if m.mlp_bias:
            t.append(Tensor("routed_experts.fc2_bias", r"b^{fc2}_{i}", (N, h), "mlp.experts.*.c_proj.bias", "bias",
                            expert=True))
        return t
    t = [
        Tensor("routed_experts.gate", r"W^{gate}_{i}", (N, h_E, h), "mlp.experts.*.gate_proj.weight", expert=True),
        Tensor("routed_experts.up", r"W^{up}_{i}", (N, h_E, h), "mlp.experts.*.up_proj.weight", expert=True),
        Tensor("routed_experts.down", r"W^{down}_{i}", (N, h, h_E), "mlp.experts.*.down_proj.weight", expert=True),
    ]
    if m.mlp_bias:
        t += [Tensor("routed_experts.gate_bias", r"b^{gate}_{i}", (N, h_E), "mlp.experts.*.gate_proj.bias", "bias",
                     expert=True),
              Tensor("routed_experts.up_bias", r"b^{up}_{i}", (N, h_E), "mlp.experts.*.up_proj.bias", "bias",
                     expert=True),
              Tensor("routed_experts.down_bias", r"b^{down}_{i}", (N, h), "mlp.experts.*.down_proj.bias", "bias",
                     expert=True)]
    return t


#: routed-expert tensors split by EP only, replicated over the ETP ranks of an expert: the output biases (the
#: row-parallel fc2's bias, added after the reduction over ETP)
ETP_REPLICATED = frozenset({"routed_experts.fc2_bias", "routed_experts.down_bias"})


def _shared(m: ModelConfig, width, hf: str) -> list[Tensor]:
    """Shared experts: one MLP of ``width`` of the model's kind (SwiGLU or GeLU, Megatron-Core's
    SharedExpertMLP), TP-split like the dense FFN, biased when ``mlp_bias``."""
    if m.mlp == "gelu":
        t = [Tensor("shared_experts.fc1", r"W^{fc1}_{s}", (width, h), f"mlp.{hf}.c_fc.weight", tp_dim=width)]
        if m.mlp_bias:
            t.append(_bias("shared_experts.fc1_bias", "b^{fc1}_{s}", width, f"mlp.{hf}.c_fc.bias", width))
        t.append(Tensor("shared_experts.fc2", r"W^{fc2}_{s}", (h, width), f"mlp.{hf}.c_proj.weight", tp_dim=width))
        if m.mlp_bias:
            t.append(_bias("shared_experts.fc2_bias", "b^{fc2}_{s}", h, f"mlp.{hf}.c_proj.bias"))
        return t
    t = [
        Tensor("shared_experts.gate", r"W^{gate}_{s}", (width, h), f"mlp.{hf}.gate_proj.weight", tp_dim=width),
        Tensor("shared_experts.up", r"W^{up}_{s}", (width, h), f"mlp.{hf}.up_proj.weight", tp_dim=width),
        Tensor("shared_experts.down", r"W^{down}_{s}", (h, width), f"mlp.{hf}.down_proj.weight", tp_dim=width),
    ]
    if m.mlp_bias:
        t += [_bias("shared_experts.gate_bias", "b^{gate}_{s}", width, f"mlp.{hf}.gate_proj.bias", width),
              _bias("shared_experts.up_bias", "b^{up}_{s}", width, f"mlp.{hf}.up_proj.bias", width),
              _bias("shared_experts.down_bias", "b^{down}_{s}", h, f"mlp.{hf}.down_proj.bias")]
    return t


def _deepseek_moe(m: ModelConfig) -> list[Tensor]:
    """Router (and its bias buffer), shared experts (one MLP of width N_s h_E), routed experts."""
    return _router(m) + (_shared(m, N_s * h_E, "shared_experts") if m.n_shared_experts else []) + _routed(m)


def _topk_moe(m: ModelConfig) -> list[Tensor]:
    """Mixtral and Qwen3-MoE: a router over N experts (top-k, no groups, no shared expert), routed experts
    (transformers 5 fuses gate and up into one ``gate_up_proj`` parameter: the same count)."""
    return _router(m) + _routed(m)


def _qwen2_moe(m: ModelConfig) -> list[Tensor]:
    """Qwen2-MoE: router, routed experts, one shared expert of width h_S and its sigmoid gate (1 x h)."""
    return (_router(m) + _routed(m) + _shared(m, h_S, "shared_expert")
            + [Tensor("shared_experts.gate_weight", r"W^{gate}_{S}", (1, h), "mlp.shared_expert_gate.weight")])


def moe_tensors(m: ModelConfig) -> list[Tensor]:
    """The MoE block of ``m``'s kind (:data:`MOE`)."""
    if m.moe is None:
        raise ValueError(f"{m.name} has no MoE layers")   # pragma: no cover - callers check has_moe
    return MOE[m.moe](m)


def decoder_layer_tensors(m: ModelConfig, kind: str) -> list[Tensor]:
    """All tensors of one decoder layer of ``kind`` (``"dense"`` or ``"moe"``)."""
    ffn = dense_ffn_tensors(m) if kind == "dense" else moe_tensors(m)
    return attention_tensors(m) + block_norm_tensors(m) + ffn


def embedding_tensors(m: ModelConfig | None = None) -> list[Tensor]:
    """The token embedding (vocab-parallel), and learned absolute positions where the model has them
    (replicated over TP, as Megatron-Core's LanguageModelEmbedding holds them)."""
    t = [Tensor("embedding.weight", "W^{E}", (v, h), "model.embed_tokens.weight", "embedding", tp_dim=v)]
    if m is not None and m.positions == "learned":
        t.append(Tensor("embedding.positions", "W^{P}", (n_pos, h), "transformer.wpe.weight", "embedding"))
    return t


def head_tensors(m: ModelConfig) -> list[Tensor]:
    """Final norm and, unless tied to the embedding, the output head."""
    t = _norm_tensors(m, "final_norm.weight", r"\mathrm{RMSNorm}_{final}", "model.norm")
    if len(t) == 2:
        t[1] = Tensor("final_norm.bias", t[1].latex, t[1].shape, t[1].hf, "norm")
    if not m.tie_word_embeddings:
        t.append(Tensor("head.weight", "W^{head}", (v, h), "lm_head.weight", "embedding", tp_dim=v))
    return t


def mtp_tensors(m: ModelConfig, j: int = 0, kind: str | None = None) -> list[Tensor]:
    """One MTP module (DeepSeek-V3 report, Sec. 2.2): its own norms, projection and decoder block.

    Its embedding and output head are shared with the main model and are not counted again.  The
    block is typed like decoder layer ``l + j`` (MoE in DeepSeek-V3), or as ``kind`` says (Megatron-Core
    builds it like the last decoder layer).
    """
    if kind is None:
        kind = "moe" if m.is_moe_layer(m.num_hidden_layers + j) else "dense"
    own = [
        Tensor("mtp.enorm", r"\mathrm{RMSNorm}_{e}", (h,), "enorm.weight", "norm"),
        Tensor("mtp.hnorm", r"\mathrm{RMSNorm}_{h}", (h,), "hnorm.weight", "norm"),
        Tensor("mtp.eh_proj", r"M", (h, 2 * h), "eh_proj.weight", tp_dim=h),
        Tensor("mtp.final_norm", r"\mathrm{RMSNorm}_{MTP}", (h,), "shared_head.norm.weight", "norm"),
    ]
    block = [
        Tensor("mtp." + t.key, t.latex, t.shape, t.hf, t.kind, t.tp_dim, t.expert)
        for t in decoder_layer_tensors(m, kind)
    ]
    return own[:3] + block + own[3:]


#: the block kinds: kind -> its tensors (a function of the model config)
ATTENTION = {"mla": _mla_tensors, "gqa": _gqa_tensors}
DENSE_FFN = {"swiglu": _swiglu_tensors, "gelu": _gelu_tensors}
MOE = {"deepseek": _deepseek_moe, "mixtral": _topk_moe, "qwen3_moe": _topk_moe, "qwen2_moe": _qwen2_moe}
#: norm kind -> whether it has a bias
NORMS = {"rmsnorm": False, "layernorm": True}


def mtp_embedding_copy() -> list[Tensor]:
    """The embedding copy a pipeline stage keeps for its MTP modules when it does not hold the
    embedding itself (a copy of a shared parameter, not a parameter of its own)."""
    return [Tensor("mtp.embedding_copy", "W^{E}_{MTP}", (v, h), "model.embed_tokens.weight", "embedding", tp_dim=v)]


def tied_head_copy() -> list[Tensor]:
    """The copy of a tied embedding that the last pipeline stage keeps as its output weight when
    the first stage (the embedding) is on another rank (a copy of a shared parameter, with its own
    gradient and optimizer state, not a parameter of the model)."""
    return [Tensor("head.tied_copy", "W^{E}_{head}", (v, h), "lm_head.weight", "embedding", tp_dim=v)]


def model_values(m: ModelConfig) -> dict:
    """Symbol -> value for every model symbol (unused ones, e.g. d_c' without q LoRA, get 1)."""
    from ..core.symbols import REGISTRY

    vals = {}
    for n in REGISTRY:
        if n.kind != "model":
            continue
        x = getattr(m, n.field)
        vals[n.symbol] = 1 if x is None else int(x)
    return vals


#: MLA, as in the paper (its eqs. following DeepSeek-V2 App. C); LaTeX built from the registry.  ``mla-q`` is the
#: query of a model that compresses queries; :func:`mla_equation` gives a model without query compression its own
def _mla_equations(q_latent: bool = True) -> list[tuple[str, str]]:
    L = lambda k: latex(sym(k))  # noqa: E731 - tiny local alias for readability
    dh, dhR = L("d_h"), L("d_hR")
    # the queries' up-projections read the query latent c^Q_t, or h_t itself where queries are not compressed
    wq, src = (r"W^{UQ}", r"c^Q_t") if q_latent else (r"W^{Q}", r"h_t")
    return [
        ("mla-cq", r"c_t^{Q} = W^{DQ} h_t \in \mathbb{R}^{" + L("d_cq") + "}"),
        ("mla-q", r"\begin{aligned}[q^C_{t,1};\dots;q^C_{t,n_h}] &= " + wq + " " + src + r",\qquad "
                  r"[q^R_{t,1};\dots;q^R_{t,n_h}] = \mathrm{RoPE}(W^{QR} " + src + r"),\\ "
                  r"q_{t,i} &= [q^C_{t,i}; q^R_{t,i}] \in \mathbb{R}^{" + dh + "+" + dhR + r"}\end{aligned}"),
        ("mla-ckv", r"c_t^{KV} = W^{DKV} h_t \in \mathbb{R}^{" + L("d_c") + "}"),
        ("mla-k", r"[k^C_{t,1};\dots;k^C_{t,n_h}] = W^{UK} c^{KV}_t,\quad "
                  r"k^R_t = \mathrm{RoPE}(W^{KR} h_t),\quad k_{t,i} = [k^C_{t,i}; k^R_t]"),
        ("mla-v", r"[v^C_{t,1};\dots;v^C_{t,n_h}] = W^{UV} c^{KV}_t \in \mathbb{R}^{" + L("n_h") + " " + L("d_v") + "}"),
        ("mla-o", r"o_{t,i} = \sum_{j=1}^{t} \mathrm{Softmax}_j\!\left(\frac{q_{t,i}^{\top} k_{j,i}}{\sqrt{"
                  + dh + "+" + dhR + r"}}\right) v^C_{j,i},\qquad u_t = W^{O} [o_{t,1};\dots;o_{t,n_h}]"),
    ]


MLA_EQUATIONS: list[tuple[str, str]] = _mla_equations()
_MLA_DIRECT_QUERY = dict(_mla_equations(q_latent=False))


def mla_equation(label: str, m: ModelConfig) -> str:
    """The MLA equation ``label`` (``mla-q``, ``mla-k``, ...) of :data:`MLA_EQUATIONS` as it holds for ``m``: without
    query compression (``q_lora_rank`` null, DeepSeek-V2-Lite) ``W^{Q}`` and ``W^{QR}`` read ``h_t``; the query
    latent's own equation ``mla-cq`` is then no equation of ``m`` (a :class:`ValueError`)."""
    if m.q_lora_rank is not None:
        return dict(MLA_EQUATIONS)[label]
    if label == "mla-cq":
        raise ValueError(f"{m.name} compresses no query (q_lora_rank is null): it has no query latent c^Q")
    return _MLA_DIRECT_QUERY[label]
