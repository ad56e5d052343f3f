"""The architecture: which parameter tensors a DeepSeek-style model has, with symbolic shapes.

Each tensor is a :class:`Tensor` with a symbolic shape in the notation of :mod:`memlib.symbols`,
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

from .config import ModelConfig
from .symbols import sym

__all__ = [
    "Tensor", "attention_tensors", "block_norm_tensors", "dense_ffn_tensors", "moe_tensors",
    "decoder_layer_tensors", "embedding_tensors", "head_tensors", "mtp_tensors", "mtp_embedding_copy",
    "tied_head_copy",
    "model_values",
    "MLA_EQUATIONS", "BLOCKS",
]

h, h_F, h_E = sym("h"), sym("h_F"), sym("h_E")
n_h, d_h, d_v, d_hR = sym("n_h"), sym("d_h"), sym("d_v"), sym("d_hR")
d_cq, d_c = sym("d_cq"), sym("d_c")
N, N_s, v = sym("N"), sym("N_s"), sym("v")

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


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor (or buffer) of a block."""

    key: str                    #: component key, unique within a layer, e.g. ``"attention.W_UQ"``
    latex: str                  #: LaTeX name, e.g. ``"W^{UQ}"``
    shape: tuple                #: symbolic shape (rows = output features for a Linear)
    hf: str                     #: Hugging Face parameter name within its module
    kind: str = "matrix"        #: ``"matrix"``, ``"norm"``, ``"embedding"`` or ``"buffer"``
    tp_dim: Optional[sp.Expr] = None   #: the size TP splits when the tensor is TP-sharded
    expert: bool = False        #: a routed-expert tensor (leading dimension N)

    @property
    def block(self) -> str:
        return self.key.split(".")[0]

    @property
    def numel(self) -> sp.Expr:
        return sp.Mul(*self.shape)


def attention_tensors(m: ModelConfig) -> list[Tensor]:
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


def block_norm_tensors() -> list[Tensor]:
    """The two RMSNorms of a decoder layer (before attention, before the FFN)."""
    return [
        Tensor("norms.attn_norm", r"\mathrm{RMSNorm}_1", (h,), "input_layernorm.weight", "norm"),
        Tensor("norms.ffn_norm", r"\mathrm{RMSNorm}_2", (h,), "post_attention_layernorm.weight", "norm"),
    ]


def dense_ffn_tensors() -> list[Tensor]:
    """SwiGLU FFN of width h_F."""
    return [
        Tensor("dense_ffn.gate", r"W^{gate}", (h_F, h), "mlp.gate_proj.weight", tp_dim=h_F),
        Tensor("dense_ffn.up", r"W^{up}", (h_F, h), "mlp.up_proj.weight", tp_dim=h_F),
        Tensor("dense_ffn.down", r"W^{down}", (h, h_F), "mlp.down_proj.weight", tp_dim=h_F),
    ]


def moe_tensors(m: ModelConfig) -> list[Tensor]:
    """Router (and its bias buffer), shared experts (one MLP of width N_s h_E), routed experts."""
    t = [Tensor("router.gate", "W^{G}", (N, h), "mlp.gate.weight")]
    if m.router_bias:
        t.append(Tensor("router.e_score_correction_bias", "b^{G}", (N,), "mlp.gate.e_score_correction_bias", "buffer"))
    if m.n_shared_experts:
        t += [
            Tensor("shared_experts.gate", r"W^{gate}_{s}", (N_s * h_E, h), "mlp.shared_experts.gate_proj.weight", tp_dim=N_s * h_E),
            Tensor("shared_experts.up", r"W^{up}_{s}", (N_s * h_E, h), "mlp.shared_experts.up_proj.weight", tp_dim=N_s * h_E),
            Tensor("shared_experts.down", r"W^{down}_{s}", (h, N_s * h_E), "mlp.shared_experts.down_proj.weight", tp_dim=N_s * h_E),
        ]
    t += [
        Tensor("routed_experts.gate", r"W^{gate}_{i}", (N, h_E, h), "mlp.experts.*.gate_proj.weight", expert=True),
        Tensor("routed_experts.up", r"W^{up}_{i}", (N, h_E, h), "mlp.experts.*.up_proj.weight", expert=True),
        Tensor("routed_experts.down", r"W^{down}_{i}", (N, h, h_E), "mlp.experts.*.down_proj.weight", expert=True),
    ]
    return t


def decoder_layer_tensors(m: ModelConfig, kind: str) -> list[Tensor]:
    """All tensors of one decoder layer of ``kind`` (``"dense"`` or ``"moe"``)."""
    ffn = dense_ffn_tensors() if kind == "dense" else moe_tensors(m)
    return attention_tensors(m) + block_norm_tensors() + ffn


def embedding_tensors() -> list[Tensor]:
    return [Tensor("embedding.weight", "W^{E}", (v, h), "model.embed_tokens.weight", "embedding", tp_dim=v)]


def head_tensors(m: ModelConfig) -> list[Tensor]:
    """Final RMSNorm and, unless tied to the embedding, the output head."""
    t = [Tensor("final_norm.weight", r"\mathrm{RMSNorm}_{final}", (h,), "model.norm.weight", "norm")]
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
    from .symbols import REGISTRY

    vals = {}
    for n in REGISTRY:
        if n.kind != "model":
            continue
        x = getattr(m, n.field)
        vals[n.symbol] = 1 if x is None else int(x)
    return vals


#: MLA, as in the paper (its eqs. following DeepSeek-V2 App. C); LaTeX built from the registry
def _mla_equations() -> list[tuple[str, str]]:
    L = lambda k: sp.latex(sym(k))  # noqa: E731 - tiny local alias for readability
    dh, dhR = L("d_h"), L("d_hR")
    return [
        ("mla-cq", r"c_t^{Q} = W^{DQ} h_t \in \mathbb{R}^{" + L("d_cq") + "}"),
        ("mla-q", r"[q^C_{t,1};\dots;q^C_{t,n_h}] = W^{UQ} c^Q_t,\quad "
                  r"[q^R_{t,1};\dots;q^R_{t,n_h}] = \mathrm{RoPE}(W^{QR} c^Q_t),\quad "
                  r"q_{t,i} = [q^C_{t,i}; q^R_{t,i}] \in \mathbb{R}^{" + dh + "+" + dhR + "}"),
        ("mla-ckv", r"c_t^{KV} = W^{DKV} h_t \in \mathbb{R}^{" + L("d_c") + "}"),
        ("mla-k", r"[k^C_{t,1};\dots;k^C_{t,n_h}] = W^{UK} c^{KV}_t,\quad "
                  r"k^R_t = \mathrm{RoPE}(W^{KR} h_t),\quad k_{t,i} = [k^C_{t,i}; k^R_t]"),
        ("mla-v", r"[v^C_{t,1};\dots;v^C_{t,n_h}] = W^{UV} c^{KV}_t \in \mathbb{R}^{" + L("n_h") + " " + L("d_v") + "}"),
        ("mla-o", r"o_{t,i} = \sum_{j=1}^{t} \mathrm{Softmax}_j\!\left(\frac{q_{t,i}^{\top} k_{j,i}}{\sqrt{"
                  + dh + "+" + dhR + r"}}\right) v^C_{j,i},\qquad u_t = W^{O} [o_{t,1};\dots;o_{t,n_h}]"),
    ]


MLA_EQUATIONS: list[tuple[str, str]] = _mla_equations()
