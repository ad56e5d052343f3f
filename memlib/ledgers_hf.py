"""The ``hf-eager`` activation ledger: what the pinned ``transformers`` DeepSeek-V3 saves for backward.

``DeepseekV3ForCausalLM`` of transformers 5.24.0 on torch 2.13.0, in bf16, trained
(``model.train()``, ``labels`` given, so the loss is part of the forward pass), with
``attn_implementation="eager"`` and its default experts kernel (``grouped_mm``, every routed
token-expert pair in one grouped matrix multiply).  Each entry below is one tensor that autograd
holds when the forward pass ends, counted once per storage (a view costs nothing beyond its
base); parameters and buffers are not activations.  :mod:`memlib.measure` checks the ledger
against autograd, to the byte, on random small configs.

What makes it differ from the paper's ledger (:mod:`memlib.ledgers`):

* **RMSNorm** (``DeepseekV3RMSNorm``) upcasts its input to fp32 and keeps that copy (for
  ``pow`` and the product), the fp32 ``rsqrt`` per token and the bf16 normalised value (for the
  product with the weight); its output is kept by the projections that read it.  The bf16 input
  itself, the residual stream, is kept by nobody: the paper's 2bsh "norm input" becomes
  4bsh + 4bs (+ 2bsh normalised).  The latent norms of c^Q and c^KV do the same.
* **RoPE**: ``q * cos`` keeps only ``cos`` (q needs no gradient through cos), so no rotated copy
  of q or k is kept; the cos and sin tables (s d_h^R each, computed once per forward) are kept.
  This holds for ``rope_interleave`` true (the default) and false alike.
* **Queries and keys**: the concatenated query and the key built with ``new_empty`` + ``copy_``
  (the RoPE key expanded to every head) are kept, bs n_h (d_h + d_h^R) each.
* **Softmax** runs in fp32 (``dtype=torch.float32``): its fp32 output is kept (for the softmax
  backward) and the bf16 copy that multiplies V; with ``attention_dropout = 0`` dropout returns
  its input and keeps no mask.
* **Values**: V is a slice of the ``kv_b_proj`` output.  ``matmul`` folds [b, n_h, s, d_v] to
  [b n_h, s, d_v], which is a view only if b = 1, s = 1 or n_h = 1; otherwise it copies, and
  the bf16 copy (bs n_h d_v) is kept.  In the view case the whole ``kv_b_proj`` output
  (bs n_h (d_h + d_v)) stays alive.  The ledger says so with a ``Piecewise``.
* **Router** (fp32 weight, as transformers keeps it): an fp32 copy of its input, the sigmoid
  scores, the top-k indices (int64), the normaliser and the selected weights (fp32).  The group
  top-k and the masks are freed before the forward ends.
* **Routed experts** (``grouped_mm``): every one of the S = b s N_r token-expert pairs is
  gathered into one sorted matrix, so each kept tensor has S rows whatever the routing: the
  gathered input, the fused gate-up output, the SiLU output, the product, the down output, the
  routing weights (fp32), three int64 index vectors, and one int32 offset per expert.  Routing
  decides which rows, not how many: the count is exact for any routing.
* **Head and loss**: the head keeps its input; the bf16 logits are not kept (``logits.float()``
  keeps nothing), the loss keeps the fp32 log-softmax, the int64 shifted labels (for b = 1 the
  padded labels, s + 1 of them, since the shifted slice is already contiguous) and a 4-byte fp32
  normaliser (``total_weight``).
* The embedding keeps the token ids (int64).

:mod:`memlib.ledgers` registers the profile (``ACT_PROFILES["hf-eager"]``).
"""
from __future__ import annotations

import sympy as sp

from .activations import DTYPE_BYTES, ActProfile, Saved, saved as _S
from .config import ConfigError, ModelConfig
from .symbols import sym

__all__ = ["hf_eager_layer", "hf_embedding", "hf_head", "HF_VERSIONS"]

#: the versions this ledger is exact for
HF_VERSIONS = {"torch": "2.13.0", "transformers": "5.24.0"}

DTYPE_BYTES.setdefault("int32", 4)     # the experts' grouped_mm offsets

b, s = sym("b"), sym("s")
h, h_F, h_E = sym("h"), sym("h_F"), sym("h_E")
n_h, d_h, d_v, d_hR = sym("n_h"), sym("d_h"), sym("d_v"), sym("d_hR")
d_cq, d_c = sym("d_cq"), sym("d_c")
N, N_s, N_r, v = sym("N"), sym("N_s"), sym("N_r"), sym("v")

_HF = "transformers DeepseekV3"


def _rmsnorm(prefix: str, what: str, width) -> list[Saved]:
    """``DeepseekV3RMSNorm`` on a bf16 input of ``width`` features per token."""
    bs = b * s
    return [
        _S(f"{prefix}.input_fp32", f"{what}: the input upcast to fp32 (kept by pow and the product)", bs * width,
           "fp32", modules={"layernorm"}),
        _S(f"{prefix}.rsqrt", f"{what}: rsqrt(mean(x^2) + eps), fp32, one per token", bs, "fp32",
           modules={"layernorm"}),
        _S(f"{prefix}.normalized", f"{what}: the normalised value cast back to bf16 (kept by the weight product)",
           bs * width, modules={"layernorm"}),
    ]


def _attention(m: ModelConfig) -> list[Saved]:
    bs = b * s
    out = _rmsnorm("attention.norm", "input RMSNorm", h)
    out.append(_S("attention.norm_output", "input RMSNorm output, input of q_a_proj (q_proj) and kv_a_proj_with_mqa",
                  bs * h))
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
        _S("attention.softmax_fp32", "softmax output in fp32 (softmax(..., dtype=float32), for its backward)",
           b * n_h * s * s, "fp32", modules={"core_attn"}),
        _S("attention.probs", "attention probabilities cast to bf16 (for probs @ V); dropout p=0 keeps no mask",
           b * n_h * s * s, modules={"core_attn"}),
        _S("attention.value", "values for probs @ V: a contiguous copy of the V slice when matmul cannot fold "
           "[b, n_h] into one batch dimension (b, s, n_h > 1); otherwise a view that keeps the whole "
           "kv_b_proj output (k_nope and V) alive",
           sp.Piecewise((bs * n_h * (d_h + d_v), sp.Eq(b, 1) | sp.Eq(s, 1) | sp.Eq(n_h, 1)),
                        (bs * n_h * d_v, True)), modules={"core_attn"}),
        _S("attention.context", "attention output, transposed contiguous, input of o_proj", bs * n_h * d_v),
    ]
    return out


def _swiglu(prefix: str, what: str, rows, width) -> list[Saved]:
    """``DeepseekV3MLP``: gate and up projections, SiLU, product (its input is listed by the caller)."""
    return [
        _S(f"{prefix}.gate_out", f"{what}: gate_proj output (SiLU input)", rows * width),
        _S(f"{prefix}.act_out", f"{what}: SiLU output", rows * width),
        _S(f"{prefix}.up_out", f"{what}: up_proj output", rows * width),
        _S(f"{prefix}.product", f"{what}: SiLU(gate) * up, input of down_proj", rows * width),
    ]


def _dense(m: ModelConfig) -> list[Saved]:
    bs = b * s
    out = _rmsnorm("dense_ffn.norm", "post-attention RMSNorm", h)
    out.append(_S("dense_ffn.norm_output", "post-attention RMSNorm output, input of gate_proj and up_proj", bs * h,
                  modules={"mlp"}))
    out += [_S(e.key, e.name, e.elements, modules={"mlp"}) for e in _swiglu("dense_ffn", "dense FFN", bs, h_F)]
    return out


def _moe(m: ModelConfig) -> list[Saved]:
    bs = b * s
    S = bs * N_r          # token-expert pairs
    out = _rmsnorm("moe.norm", "post-attention RMSNorm", h)
    out += [
        _S("moe.norm_output", "post-attention RMSNorm output, input of the shared experts "
           "(the routed experts keep only gather indices of it)", bs * h),
        _S("moe.router_input_fp32", "router input upcast to fp32 (F.linear with the fp32 router weight)", bs * h,
           "fp32", modules={"moe"}),
        _S("moe.router_scores", "sigmoid scores, fp32 (kept by sigmoid and gather)", bs * N, "fp32", modules={"moe"}),
        _S("moe.topk_indices", "top-k expert indices, int64 (kept by gather)", bs * N_r, "int64", modules={"moe"},
           keep_full=True),
        _S("moe.topk_denominator", "sum of the top-k scores + 1e-20, fp32 (kept by the in-place division)", bs,
           "fp32", modules={"moe"}, note="norm_topk_prob=True, the DeepSeek-V3 default"),
        _S("moe.topk_weights", "top-k scores before normalisation, fp32 (kept by the in-place division)", bs * N_r,
           "fp32", modules={"moe"}),
        _S("moe.routed.token_index", "perm // top_k: token of each sorted pair, int64 (gather of the input)", S,
           "int64", modules={"moe"}),
        _S("moe.routed.perm", "sort permutation of the pairs, int64 (gather of the routing weights)", S, "int64",
           modules={"moe"}),
        _S("moe.routed.offsets", "grouped_mm offsets: cumulative pairs per expert, int32", N, "int32",
           modules={"moe"}, note="one per expert, whatever the routing"),
        _S("moe.routed.input", "gathered expert input, one row per pair (input of the gate-up grouped_mm)", S * h,
           modules={"moe"}),
        _S("moe.routed.gate_up_out", "fused gate-up grouped_mm output (SiLU keeps the gate half, the product the up "
           "half: one storage)", S * 2 * h_E, modules={"moe"}),
        _S("moe.routed.act_out", "SiLU output of the gate half", S * h_E, modules={"moe", "moe_act"}),
        _S("moe.routed.product", "SiLU(gate) * up, input of the down grouped_mm", S * h_E, modules={"moe", "moe_act"}),
        _S("moe.routed.down_out", "down grouped_mm output, bf16 (kept by the product with the fp32 weights)", S * h,
           modules={"moe"}),
        _S("moe.routed.weights", "routing weights of the sorted pairs, fp32", S, "fp32", modules={"moe"}),
        _S("moe.routed.inverse_perm", "inverse permutation, int64 (restores the token order)", S, "int64",
           modules={"moe"}),
    ]
    out += [_S("moe." + e.key, e.name, e.elements, modules={"shared_experts"})
            for e in _swiglu("shared", "shared experts", bs, N_s * h_E)]
    return out


def _deepseek_only(m: ModelConfig) -> None:
    if m.family != "deepseek":
        raise ConfigError(f"profile=hf-eager has a ledger for transformers' DeepseekV2/V3 only; {m.name} is a "
                          f"{m.family} model (its hf-eager ledger is issue 12's second phase)")


def hf_eager_layer(m: ModelConfig, kind: str) -> list[Saved]:
    """The ``hf-eager`` ledger of one decoder layer of ``kind`` (``dense`` or ``moe``)."""
    _deepseek_only(m)
    return _attention(m) + (_moe(m) if kind == "moe" else _dense(m))


def hf_embedding(m: ModelConfig) -> list[Saved]:
    """The embedding keeps the token ids; the RoPE tables are computed once and kept by every layer."""
    _deepseek_only(m)
    return [
        _S("embedding.token_ids", "input token ids, int64 (kept by the embedding)", b * s, "int64", keep_full=True),
        _S("embedding.rope_cos", "RoPE cos table [1, s, d_h^R], bf16, shared by every layer", s * d_hR,
           keep_full=True),
        _S("embedding.rope_sin", "RoPE sin table [1, s, d_h^R], bf16, shared by every layer", s * d_hR,
           keep_full=True),
    ]


def hf_head(m: ModelConfig) -> list[Saved]:
    """Final RMSNorm, the head's input, and what the cross-entropy loss keeps."""
    bs = b * s
    return _rmsnorm("final_norm", "final RMSNorm", h) + [
        _S("head.input", "final RMSNorm output, input of lm_head", bs * h, keep_full=True),
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


#: the hf-eager profile (registered by :mod:`memlib.ledgers`)
HF_EAGER_PROFILE = ActProfile(
    "hf-eager", "transformers 5.24.0 DeepseekV3ForCausalLM on torch 2.13.0: bf16, eager attention, grouped_mm "
    "experts, no dropout, loss included; exact to the byte against autograd",
    hf_eager_layer, hf_embedding, hf_head, _no_mtp,
    modules=frozenset({"core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts"}),
    no_parallel=("tp", "cp", "ep", "etp"))
