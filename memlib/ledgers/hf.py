"""The ``hf-eager`` activation ledger: what the pinned ``transformers`` saves for backward.

One ledger per transformers model class (:data:`HF_CODE`), of transformers 5.24.0 on torch 2.13.0, in
bf16, trained, with ``attn_implementation="eager"``, every dropout probability 0 and the default experts
kernel.  Each entry is one tensor that autograd holds when the forward pass ends, counted once per
storage.  The ledger is assembled from block tables, one function per kind of transformers code (the
attention of :data:`HF_CODE`, :data:`NORMS_HF`, :data:`DENSE_HF`, :data:`MOE_HF`,
:data:`ACTIVATIONS_HF`); :mod:`memlib.measure.hf` checks it against autograd, to the byte, on random
small configs of every family.  How it differs from the paper's ledger, tensor by tensor, is in the
document below.

The derivation, with its sources (file:line), is in ``docs/derivations/ledgers_hf.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import sympy as sp

from .base import DTYPE_BYTES, ActProfile, Saved, saved as _S
from ..config import ConfigError, ModelConfig, show
from ..core.symbols import (b, s, h, h_F, h_E, n_h, d_h, d_v, d_hR, d_cq, d_c, N, N_s, N_r, v, n_kv,
                            d_head, h_S)

__all__ = ["hf_eager_layer", "hf_embedding", "hf_head", "HF_VERSIONS", "HF_CODE", "HfCode", "hf_code",
           "NORMS_HF", "DENSE_HF", "MOE_HF", "ACTIVATIONS_HF"]

#: the versions this ledger is exact for
HF_VERSIONS = {"torch": "2.13.0", "transformers": "5.24.0"}

DTYPE_BYTES.setdefault("int32", 4)     # the experts' grouped_mm offsets


# ------------------------------------------------------------------------------------------------
# norms: kind -> what it keeps of its input (its output is kept by the projections that read it)
# ------------------------------------------------------------------------------------------------
def _rmsnorm(prefix: str, what: str, width, rows=None) -> list[Saved]:
    """``LlamaRMSNorm`` (and its copies) on a bf16 input of ``rows`` x ``width`` (rows b s unless given)."""
    rows = b * s if rows is None else rows
    return [
        _S(f"{prefix}.input_fp32", f"{what}: the input upcast to fp32 (kept by pow and the product)", rows * width,
           "fp32", modules={"layernorm"}),
        _S(f"{prefix}.rsqrt", f"{what}: rsqrt(mean(x^2) + eps), fp32, one per row", rows, "fp32",
           modules={"layernorm"}),
        _S(f"{prefix}.normalized", f"{what}: the normalised value cast back to bf16 (kept by the weight product)",
           rows * width, modules={"layernorm"}),
    ]


_CPU_STATS = ("the CPU kernel keeps the statistics in the input's dtype when the weight has it too; CUDA's "
              "keeps them in fp32 (2 bytes more each)")


def _layernorm(prefix: str, what: str, width, rows=None) -> list[Saved]:
    """``nn.LayerNorm`` in bf16 (``native_layer_norm`` on the CPU): its input, and the mean and 1/std of
    each row in bf16 (CUDA's kernel keeps those two in fp32)."""
    rows = b * s if rows is None else rows
    return [
        _S(f"{prefix}.input", f"{what}: its bf16 input (the residual stream)", rows * width, modules={"layernorm"}),
        _S(f"{prefix}.mean", f"{what}: mean of each row, bf16 on the CPU", rows, modules={"layernorm"},
           note=_CPU_STATS),
        _S(f"{prefix}.rstd", f"{what}: reciprocal standard deviation of each row, bf16 on the CPU", rows,
           modules={"layernorm"}, note=_CPU_STATS),
    ]


#: the norms of transformers' code, by memlib's norm kind
NORMS_HF: dict[str, Callable[..., list[Saved]]] = {"rmsnorm": _rmsnorm, "layernorm": _layernorm}


# ------------------------------------------------------------------------------------------------
# activation functions: name -> the tensors it keeps besides its output (its input first)
# ------------------------------------------------------------------------------------------------
#: transformers' ``hidden_act`` / ``activation_function`` name -> (key suffix, what) of each kept tensor
ACTIVATIONS_HF: dict[str, tuple[tuple[str, str], ...]] = {
    "silu": (("act_input", "input (F.silu keeps it)"),),
    "swish": (("act_input", "input (F.silu keeps it)"),),
    "gelu": (("act_input", "input (F.gelu keeps it)"),),
    "gelu_pytorch_tanh": (("act_input", "input (F.gelu(approximate='tanh') keeps it)"),),
    "gelu_new": (("act_input", "input (kept by pow(x, 3))"),
                 ("gelu_half", "0.5 x of gelu_new's Python formula (kept by the last product)"),
                 ("gelu_tanh", "tanh(...) of gelu_new (kept by tanh's backward)"),
                 ("gelu_one_plus_tanh", "1 + tanh(...) of gelu_new (kept by the last product)")),
}


def _activation(m: ModelConfig, prefix: str, what: str, rows, width, input_key: str, modules) -> list[Saved]:
    """What ``m.hidden_act`` keeps on ``rows`` x ``width``: its input under ``input_key``, and the rest."""
    kept = ACTIVATIONS_HF[m.hidden_act]
    out = [_S(f"{prefix}.{input_key}", f"{what}: {kept[0][1]}", rows * width, modules=modules)]
    out += [_S(f"{prefix}.{k}", f"{what}: {name}", rows * width, modules=modules) for k, name in kept[1:]]
    return out


def _swiglu(m: ModelConfig, prefix: str, what: str, rows, width, modules=frozenset()) -> list[Saved]:
    """gate and up projections, the activation, the product (the input is listed by the caller)."""
    return (_activation(m, prefix, f"{what}: gate_proj output", rows, width, "gate_out", modules) + [
        _S(f"{prefix}.act_out", f"{what}: activation output", rows * width, modules=modules),
        _S(f"{prefix}.up_out", f"{what}: up_proj output", rows * width, modules=modules),
        _S(f"{prefix}.product", f"{what}: act(gate) * up, input of down_proj", rows * width, modules=modules),
    ])


# ------------------------------------------------------------------------------------------------
# attention: one function per kind of transformers code
# ------------------------------------------------------------------------------------------------
def _pre_norm(m: ModelConfig, block: str, what: str, reader: str, modules=frozenset()) -> list[Saved]:
    """A block's pre-norm (RMSNorm or LayerNorm) and its output, kept by ``reader``."""
    return NORMS_HF[m.norm](f"{block}.norm", what, h) + [
        _S(f"{block}.norm_output", f"{what} output, input of {reader}", b * s * h, modules=modules)]


def _mla_attention(m: ModelConfig) -> list[Saved]:
    """``DeepseekV3Attention`` (MLA) with eager attention."""
    bs = b * s
    out = _pre_norm(m, "attention", "input RMSNorm",
                    ("q_a_proj" if m.q_lora_rank is not None else "q_proj") + " and kv_a_proj_with_mqa")
    if m.q_lora_rank is not None:
        out += _rmsnorm("attention.q_norm", "RMSNorm of the query latent c^Q", d_cq)
        out.append(_S("attention.c_q", "normalised query latent c^Q, input of q_b_proj", bs * d_cq))
    out += _rmsnorm("attention.kv_norm", "RMSNorm of the key-value latent c^KV", d_c)
    out += [
        _S("attention.c_kv", "normalised key-value latent c^KV, input of kv_b_proj", bs * d_c),
        _S("attention.query", "queries: cat(q_nope, RoPE(q_rope)), a new tensor (for QK^T)",
           bs * n_h * (d_h + d_hR), modules={"core_attn"}),
        _S("attention.key", "keys: new_empty + copy of k_nope and the RoPE key expanded to every head (for QK^T)",
           bs * n_h * (d_h + d_hR), modules={"core_attn"}),
        *_softmax_fp32(),
        _S("attention.value", "values for probs @ V: a contiguous copy of the V slice when matmul cannot fold "
           "[b, n_h] into one batch dimension (b, s, n_h > 1); otherwise a view that keeps the whole "
           "kv_b_proj output (k_nope and V) alive",
           sp.Piecewise((bs * n_h * (d_h + d_v), sp.Eq(b, 1) | sp.Eq(s, 1) | sp.Eq(n_h, 1)),
                        (bs * n_h * d_v, True)), modules={"core_attn"}),
        _S("attention.context", "attention output, transposed contiguous, input of o_proj", bs * n_h * d_v),
    ]
    return out


def _softmax_fp32() -> list[Saved]:
    """``softmax(..., dtype=float32).to(bf16)``: the fp32 output and its bf16 copy (dropout p=0 keeps no mask)."""
    return [
        _S("attention.softmax_fp32", "softmax output in fp32 (softmax(..., dtype=float32), for its backward)",
           b * n_h * s * s, "fp32", modules={"core_attn"}),
        _S("attention.probs", "attention probabilities cast to bf16 (for probs @ V); dropout p=0 keeps no mask",
           b * n_h * s * s, modules={"core_attn"}),
    ]


def _gqa_attention(m: ModelConfig) -> list[Saved]:
    """``LlamaAttention`` and its copies (Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE) with eager attention:
    q, k, v projections (biases keep nothing more), Qwen3's per-head q/k RMSNorms, RoPE, ``repeat_kv``."""
    bs = b * s
    out = _pre_norm(m, "attention", "input RMSNorm", "q_proj, k_proj and v_proj")
    if m.qk_norm:
        out += _rmsnorm("attention.q_norm", "per-head RMSNorm of the queries (over d_head)", d_head, bs * n_h)
        out += _rmsnorm("attention.k_norm", "per-head RMSNorm of the keys (over d_head)", d_head, bs * n_kv)
    # repeat_kv expands [b, n_kv, s, d] to n_h heads and reshapes: a copy, unless n_kv = 1 (then a view with
    # stride 0 over the heads, which the batched matmul folds without copying only when b = 1)
    kv = sp.Piecewise((bs * n_kv * d_head, sp.Eq(n_kv, 1) & sp.Eq(b, 1)), (bs * n_h * d_head, True))
    out += [
        _S("attention.query", "RoPE'd queries q cos + rotate_half(q) sin, a new tensor kept by QK^T (itself or "
           "the contiguous copy the batched matmul makes)", bs * n_h * d_head, modules={"core_attn"}),
        _S("attention.key", "keys for QK^T: repeat_kv's copy over the n_h query heads (or, without repetition, "
           "the RoPE'd key or its contiguous copy); with one key-value head and b = 1 the stride-0 view of the "
           "RoPE'd key, whose storage has n_kv heads", kv, modules={"core_attn"}),
        *_softmax_fp32(),
        _S("attention.value", "values for probs @ V: repeat_kv's copy over the n_h query heads (or, without "
           "repetition, v_proj's output or its contiguous copy); with one key-value head and b = 1 the stride-0 "
           "view of v_proj's output", kv, modules={"core_attn"}),
        _S("attention.context", "attention output, transposed contiguous, input of o_proj", bs * n_h * d_head),
    ]
    return out


def _gpt2_attention(m: ModelConfig) -> list[Saved]:
    """``GPT2Attention`` with eager attention: one fused c_attn, softmax in bf16."""
    bs = b * s
    return _pre_norm(m, "attention", "ln_1 (LayerNorm)", "c_attn") + [
        _S("attention.qkv", "c_attn output (q, k, v): the batched matmuls keep views of it when b = 1 or n_h = 1, "
           "else a contiguous copy of each of q, k^T and v (b s n_h d_head each): 3 b s n_h d_head either way",
           3 * bs * n_h * d_head, modules={"core_attn"}),
        _S("attention.probs", "softmax output in bf16 (kept by softmax and probs @ V); dropout p=0 keeps no mask",
           b * n_h * s * s, modules={"core_attn"}),
        _S("attention.context", "attention output, transposed contiguous, input of c_proj", bs * n_h * d_head),
    ]


# ------------------------------------------------------------------------------------------------
# dense FFNs: memlib's mlp kind -> transformers' code
# ------------------------------------------------------------------------------------------------
def _swiglu_dense(m: ModelConfig) -> list[Saved]:
    """``LlamaMLP`` / ``DeepseekV3MLP``: gate, up, down (biases keep nothing more)."""
    return (_pre_norm(m, "dense_ffn", "post-attention RMSNorm", "gate_proj and up_proj", {"mlp"})
            + _swiglu(m, "dense_ffn", "dense FFN", b * s, h_F, {"mlp"}))


def _gelu_dense(m: ModelConfig) -> list[Saved]:
    """``GPT2MLP``: c_fc, the activation, c_proj."""
    bs = b * s
    return (_pre_norm(m, "dense_ffn", "ln_2 (LayerNorm)", "c_fc", {"mlp"})
            + _activation(m, "dense_ffn", "dense FFN: c_fc output", bs, h_F, "fc_out", {"mlp"})
            + [_S("dense_ffn.act_out", "dense FFN: activation output, input of c_proj", bs * h_F, modules={"mlp"})])


#: the dense FFNs of transformers' code, by memlib's mlp kind
DENSE_HF: dict[str, Callable[[ModelConfig], list[Saved]]] = {"swiglu": _swiglu_dense, "gelu": _gelu_dense}


# ------------------------------------------------------------------------------------------------
# MoE blocks: memlib's moe kind -> transformers' code
# ------------------------------------------------------------------------------------------------
def _grouped_mm_experts(m: ModelConfig, weights_dtype: str) -> list[Saved]:
    """``grouped_mm_experts_forward`` (transformers' integrations.moe): S = b s N_r sorted pairs."""
    S = b * s * N_r          # token-expert pairs
    mods = {"moe"}
    gate = _activation(m, "moe.routed", "gate half of the fused gate-up output", S, h_E, "act_input",
                       {"moe", "moe_act"})[1:]   # its input is a view of gate_up_out
    return [
        _S("moe.routed.token_index", "perm // top_k: token of each sorted pair, int64 (gather of the input)", S,
           "int64", modules=mods),
        _S("moe.routed.perm", "sort permutation of the pairs, int64 (gather of the routing weights)", S, "int64",
           modules=mods),
        _S("moe.routed.offsets", "grouped_mm offsets: cumulative pairs per expert, int32", N, "int32",
           modules=mods, note="one per expert, whatever the routing"),
        _S("moe.routed.input", "gathered expert input, one row per pair (input of the gate-up grouped_mm)", S * h,
           modules=mods),
        _S("moe.routed.gate_up_out", "fused gate-up grouped_mm output (the activation keeps the gate half, the "
           "product the up half: one storage)", S * 2 * h_E, modules=mods),
        *gate,
        _S("moe.routed.act_out", "activation output of the gate half", S * h_E, modules={"moe", "moe_act"}),
        _S("moe.routed.product", "act(gate) * up, input of the down grouped_mm", S * h_E, modules={"moe", "moe_act"}),
        _S("moe.routed.down_out", "down grouped_mm output, bf16 (kept by the product with the routing weights)",
           S * h, modules=mods),
        _S("moe.routed.weights", f"routing weights of the sorted pairs, {'fp32' if weights_dtype == 'fp32' else 'bf16'}",
           S, weights_dtype, modules=mods),
        _S("moe.routed.inverse_perm", "inverse permutation, int64 (restores the token order)", S, "int64",
           modules=mods),
    ]


def _topk_normaliser(what: str, plus: str = "", note: str = "") -> list[Saved]:
    """The in-place ``top /= top.sum(-1, keepdim=True) (+ plus)``: the denominator and a copy of the old values."""
    bs = b * s
    return [
        _S("moe.topk_denominator", f"sum of the top-k {what}{plus}, fp32 (kept by the in-place division)", bs, "fp32",
           modules={"moe"}, note=note),
        _S("moe.topk_weights", f"top-k {what} before normalisation, fp32 (kept by the in-place division)", bs * N_r,
           "fp32", modules={"moe"}),
    ]


def _deepseek_moe(m: ModelConfig) -> list[Saved]:
    """``DeepseekV3MoE``: fp32 sigmoid router, grouped_mm experts, shared experts (one MLP of N_s h_E)."""
    bs = b * s
    out = _pre_norm(m, "moe", "post-attention RMSNorm", "the shared experts (the routed experts keep only gather "
                    "indices of it)")
    out += [
        _S("moe.router_input_fp32", "router input upcast to fp32 (F.linear with the fp32 router weight)", bs * h,
           "fp32", modules={"moe"}),
        _S("moe.router_scores", "sigmoid scores, fp32 (kept by sigmoid and gather)", bs * N, "fp32", modules={"moe"}),
        _S("moe.topk_indices", "top-k expert indices, int64 (kept by gather)", bs * N_r, "int64", modules={"moe"},
           keep_full=True),
    ]
    out += _topk_normaliser("scores", " + 1e-20", note="norm_topk_prob=True, the DeepSeek-V3 default")
    out += _grouped_mm_experts(m, "fp32")
    out += [_S("moe." + e.key, e.name, e.elements, e.dtype, modules={"shared_experts"})
            for e in _swiglu(m, "shared", "shared experts", bs, N_s * h_E)]
    return out


#: Mixtral's router returns fp32 routing weights; Qwen's cast them to the model's dtype (bf16)
_ROUTING_WEIGHTS_DTYPE = {"mixtral": "fp32", "qwen2_moe": "act", "qwen3_moe": "act"}


def _softmax_topk_moe(m: ModelConfig) -> list[Saved]:
    """``MixtralSparseMoeBlock`` / ``Qwen3MoeSparseMoeBlock``: bf16 router, fp32 softmax over the N experts,
    top-k (renormalised when ``norm_topk_prob``), grouped_mm experts."""
    bs = b * s
    out = _pre_norm(m, "moe", "post-attention RMSNorm", "the router (the routed experts keep only gather "
                    "indices of it)")
    out += [
        _S("moe.router_probs", "softmax over the N experts, fp32 (router_logits.float(); kept by the softmax)",
           bs * N, "fp32", modules={"moe"}),
        _S("moe.topk_indices", "top-k expert indices, int64 (kept by topk)", bs * N_r, "int64", modules={"moe"},
           keep_full=True),
    ]
    if m.norm_topk_prob:
        out += _topk_normaliser("probabilities")
    return out + _grouped_mm_experts(m, _ROUTING_WEIGHTS_DTYPE[m.moe])


def _qwen2_moe(m: ModelConfig) -> list[Saved]:
    """``Qwen2MoeSparseMoeBlock``: Qwen3-MoE's routed block plus one shared expert (width h_S) behind a
    sigmoid gate (``shared_expert_gate``, 1 x h)."""
    bs = b * s
    out = _softmax_topk_moe(m)
    out += [_S("moe." + e.key, e.name, e.elements, e.dtype, modules={"shared_experts"})
            for e in _swiglu(m, "shared", "shared expert", bs, h_S)]
    out += [
        _S("moe.shared.gate_sigmoid", "sigmoid of shared_expert_gate, one per token (kept by sigmoid and the "
           "product)", bs, modules={"shared_experts"}),
        _S("moe.shared.down_out", "shared expert output (kept by the product with its sigmoid gate)", bs * h,
           modules={"shared_experts"}),
    ]
    return out


#: the MoE blocks of transformers' code, by memlib's moe kind
MOE_HF: dict[str, Callable[[ModelConfig], list[Saved]]] = {
    "deepseek": _deepseek_moe, "mixtral": _softmax_topk_moe, "qwen3_moe": _softmax_topk_moe,
    "qwen2_moe": _qwen2_moe}


# ------------------------------------------------------------------------------------------------
# embeddings
# ------------------------------------------------------------------------------------------------
def _token_ids() -> Saved:
    return _S("embedding.token_ids", "input token ids, int64 (kept by the embedding)", b * s, "int64", keep_full=True)


def _rope_embedding(width) -> Callable[[ModelConfig], list[Saved]]:
    """Token ids, and the RoPE tables ([1, s, width] bf16) computed once and kept by every layer."""
    def tables(m: ModelConfig) -> list[Saved]:
        return [
            _token_ids(),
            _S("embedding.rope_cos", "RoPE cos table [1, s, d], bf16, shared by every layer", s * width,
               keep_full=True),
            _S("embedding.rope_sin", "RoPE sin table [1, s, d], bf16, shared by every layer", s * width,
               keep_full=True),
        ]
    return tables


def _learned_embedding(m: ModelConfig) -> list[Saved]:
    """GPT-2: token ids (wte) and position ids (wpe, arange(s) unsqueezed to [1, s])."""
    return [_token_ids(),
            _S("embedding.position_ids", "position ids arange(s), int64 (kept by wpe)", s, "int64", keep_full=True)]


# ------------------------------------------------------------------------------------------------
# the model classes
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HfCode:
    """One transformers model class: its attention code and its embedding (the norm, dense FFN and MoE
    block follow memlib's kinds: :data:`NORMS_HF`, :data:`DENSE_HF`, :data:`MOE_HF`)."""

    cls: str                                              #: transformers class
    attention: Callable[[ModelConfig], list[Saved]]
    embedding: Callable[[ModelConfig], list[Saved]]
    #: a config this class cannot express raises a one-line ConfigError (None: any config of the family)
    check: Callable[[ModelConfig], None] | None = None


def _gpt_as_gpt2(m: ModelConfig) -> None:
    """memlib's ``gpt`` is GPT-2's code when GPT-2 can express it."""
    rules = (("num_key_value_heads", m.num_key_value_heads, m.num_key_value_heads == m.num_attention_heads,
              f"must equal num_attention_heads={m.num_attention_heads} (GPT-2 has no grouped-query attention)"),
             ("head_dim", m.head_dim, m.head_dim * m.num_attention_heads == m.hidden_size,
              "must be hidden_size / num_attention_heads (GPT-2's head dimension)"),
             ("attention_bias", m.qkv_bias and m.o_bias, m.qkv_bias and m.o_bias,
              "must be true (GPT-2's c_attn and c_proj have biases)"),
             ("mlp_bias", m.mlp_bias, m.mlp_bias, "must be true (GPT-2's c_fc and c_proj have biases)"))
    for field, value, ok, rule in rules:
        if not ok:
            raise ConfigError(f"{field}={show(value)} {rule}: profile=hf-eager measures a gpt config as "
                              f"transformers' GPT2LMHeadModel, the one class with its blocks")


_GPT2 = HfCode("GPT2LMHeadModel", _gpt2_attention, _learned_embedding)

#: memlib family -> the transformers class whose eager code the ledger follows
HF_CODE: dict[str, HfCode] = {
    "deepseek": HfCode("DeepseekV3ForCausalLM", _mla_attention, _rope_embedding(d_hR)),
    "llama": HfCode("LlamaForCausalLM", _gqa_attention, _rope_embedding(d_head)),
    "qwen3": HfCode("Qwen3ForCausalLM", _gqa_attention, _rope_embedding(d_head)),
    "mixtral": HfCode("MixtralForCausalLM", _gqa_attention, _rope_embedding(d_head)),
    "qwen2_moe": HfCode("Qwen2MoeForCausalLM", _gqa_attention, _rope_embedding(d_head)),
    "qwen3_moe": HfCode("Qwen3MoeForCausalLM", _gqa_attention, _rope_embedding(d_head)),
    "gpt2": _GPT2,
    "gpt": HfCode(_GPT2.cls, _GPT2.attention, _GPT2.embedding, _gpt_as_gpt2),
}


def hf_code(m: ModelConfig) -> HfCode:
    """The transformers class of ``m``, or a one-line ConfigError saying why it has no hf-eager ledger."""
    code = HF_CODE.get(m.family)
    if code is None:
        raise ConfigError(f"profile=hf-eager has no ledger for family={m.family} ({m.name}); it has "
                          f"{', '.join(HF_CODE)}")
    if code.check is not None:
        code.check(m)
    if m.has_moe and m.mlp != "swiglu":
        raise ConfigError(f"mlp={m.mlp} with MoE layers: transformers' MoE classes ({', '.join(sorted(MOE_HF))}) have "
                          f"SwiGLU experts; profile=hf-eager has no ledger for {m.mlp} experts (profile megatron has)")
    if m.hidden_act not in ACTIVATIONS_HF:
        raise ConfigError(f"hidden_act={show(m.hidden_act)}: profile=hf-eager knows what "
                          f"{', '.join(ACTIVATIONS_HF)} keep for backward, not this activation")
    return code


def hf_eager_layer(m: ModelConfig, kind: str) -> list[Saved]:
    """The ``hf-eager`` ledger of one decoder layer of ``kind`` (``dense`` or ``moe``)."""
    code = hf_code(m)
    return code.attention(m) + (MOE_HF[m.moe](m) if kind == "moe" else DENSE_HF[m.mlp](m))


def hf_embedding(m: ModelConfig) -> list[Saved]:
    """The embedding keeps the token ids; the RoPE tables (or GPT-2's position ids) are kept too."""
    return hf_code(m).embedding(m)


def hf_head(m: ModelConfig) -> list[Saved]:
    """Final norm, the head's input, and what the cross-entropy loss keeps."""
    hf_code(m)
    bs = b * s
    return NORMS_HF[m.norm]("final_norm", "final norm", h) + [
        _S("head.input", "final norm output, input of lm_head", bs * h, keep_full=True),
        _S("loss.log_softmax", "log-softmax of the fp32 logits (the bf16 logits are not kept)", bs * v, "fp32",
           keep_full=True),
        _S("loss.labels", "shifted labels, int64 (kept by nll_loss): labels padded by one and sliced; for b = 1 the "
           "slice is already contiguous, so the padded tensor (s + 1 ids) is what stays alive",
           sp.Piecewise((s + 1, sp.Eq(b, 1)), (bs, True)), "int64", keep_full=True),
        _S("loss.total_weight", "nll_loss's normaliser (count of counted tokens), a 0-dim fp32 tensor", 1, "fp32",
           keep_full=True),
    ]


def _no_mtp(m: ModelConfig, j: int) -> list[Saved]:
    return []          # transformers builds no MTP module (partition profile hf-eager: include_mtp=False)


#: the hf-eager profile (registered by :mod:`memlib.ledgers.paper`)
HF_EAGER_PROFILE = ActProfile(
    "hf-eager", "transformers 5.24.0 (DeepseekV3, Llama, Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-2 "
    "ForCausalLM) on torch 2.13.0: bf16, eager attention, grouped_mm experts, no dropout, loss included; exact "
    "to the byte against autograd",
    hf_eager_layer, hf_embedding, hf_head, _no_mtp,
    modules=frozenset({"core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts"}),
    no_parallel=("tp", "cp", "ep", "etp"))
