"""The ``megatron`` activation ledger: what Megatron-Core saves for backward.

Megatron-Core with Transformer Engine for a DeepSeek-V3-style model, read from the code
(``multi_latent_attention.py``, ``moe/{router,token_dispatcher,experts,shared_experts}.py``,
``fusions/fused_bias_swiglu.py``, ``transformer_layer.py``, ``multi_token_prediction.py``): fused
attention keeps q, k, v, its output and an fp32 log-sum-exp (no s^2 tensor); no dropout; every
RMSNorm keeps its input and an fp32 1/rms; the MLA latents are SP-sharded; SwiGLU keeps its input
(fc1 output, 2 h_E wide) and fc2 its output; the fp32 router keeps scores, map and permutation
indices; the routed experts hold b s N_r ETP / TP dispatched tokens per rank (EP does not divide
them); shared experts are TP-split; full recomputation keeps each layer's input only.  Entries
whose size depends on a version or an option say so in their ``note``.

Import this module to register the profile (``memlib.ledgers.ACT_PROFILES["megatron"]``);
:mod:`memlib.ledgers` does so at its end.
"""
from __future__ import annotations

from .activations import Saved, renamed, saved as _S
from .config import ModelConfig
from .ledgers import ACT_PROFILES, ActProfile, common_embedding
from .symbols import sym

__all__ = ["megatron_layer", "megatron_head"]

b, s = sym("b"), sym("s")
h, h_F, h_E = sym("h"), sym("h_F"), sym("h_E")
n_h, d_h, d_v, d_hR = sym("n_h"), sym("d_h"), sym("d_v"), sym("d_hR")
d_cq, d_c = sym("d_cq"), sym("d_c")
N, N_s, N_r, v = sym("N"), sym("N_s"), sym("N_r"), sym("v")


# ------------------------------------------------------------------------------------------------
# Megatron-Core with Transformer Engine (MLA, TE fused attention, SwiGLU, fp32 router, alltoall MoE)
# ------------------------------------------------------------------------------------------------
_SWIGLU_FP8 = ("not a Linear input, but cacheable in FP8 like one: DeepSeek-V3 caches the SwiGLU input "
               "in FP8 (report §3.3), Megatron with --activation-func-fp8-input-store")


def _meg_norm(prefix: str, what: str, tokens, width, *, shard: set, input_modules=(), output_modules=(),
              keep_full: bool = False, output_name: str, output_linear: bool = True,
              output_note: str = "") -> list[Saved]:
    """An RMSNorm as TE runs it: it keeps its input (bf16) and one fp32 1/rms per token; its output is
    kept by the Linear that consumes it.  ``keep_full`` marks the input only (a layer's checkpoint)."""
    return [
        _S(f"{prefix}.norm_input", f"{what}, input of its RMSNorm", tokens * width, shard=shard,
           modules=input_modules, keep_full=keep_full),
        _S(f"{prefix}.norm_rstd", f"{what}: the RMSNorm's 1/rms per token, fp32", tokens, "fp32", shard=shard,
           modules=output_modules),
        _S(f"{prefix}.norm_output", output_name, tokens * width, shard=shard, modules=output_modules,
           linear_input=output_linear, note=output_note),
    ]


def _megatron_attention(m: ModelConfig) -> list[Saved]:
    bs = b * s
    out = _meg_norm(
        "attention", "the layer input (residual stream)", bs, h, shard={"SP", "CP"}, keep_full=True,
        output_modules={"layernorm"},
        output_name="input RMSNorm output, input of the down-projections W^DQ and W^DKV",
        output_note="W^DQ and W^DKV run on the local s/TP tokens (TE 'duplicated' Linear); in FP8 each of the "
                    "two unfused GEMMs keeps its own quantized copy unless fused (linear_qkv_down_proj) "
                    "or layernorm recompute makes them keep the bf16 original: counted once")
    sp_note = ("SP-sharded: the down-projection runs on the local s/TP tokens; the fused RMSNorm + up-projection "
               "(TELayerNormColumnParallelLinear) keeps its local input and gathers over TP after the norm")
    lat = [("q", "query latent c^Q", d_cq, "W^UQ")] if m.q_lora_rank is not None else []
    lat.append(("kv", "key-value latent c^KV", d_c, "W^UK and W^UV"))
    for key, what, width, proj in lat:
        out += [
            _S(f"attention.c_{key}", f"{what} before its RMSNorm (input of the fused norm + {proj})", bs * width,
               shard={"SP", "CP"}, note=sp_note),
            _S(f"attention.c_{key}_rstd", f"{what}: the RMSNorm's 1/rms per token, fp32", bs, "fp32",
               shard={"SP", "CP"}, modules={"mla_up_proj"}),
            _S(f"attention.c_{key}_normed", f"normalised {what}, input of {proj}", bs * width, shard={"SP", "CP"},
               modules={"mla_up_proj"}, linear_input=True,
               note="kept by the up-projection for its weight gradient (re-gathered over TP in backward)"),
        ]
    qkv_note = ("saved by the fused attention kernel (TE DotProductAttention) as its inputs; the up-projection "
                "outputs themselves are freed by the fused RoPE (it keeps only cos/sin)")
    out += [
        _S("attention.q", "queries [q^C; q^R] after RoPE, input of the attention kernel", bs * n_h * (d_h + d_hR),
           shard={"TP", "CP"}, modules={"mla_up_proj"}, note=qkv_note),
        _S("attention.k", "keys [k^C; k^R] (the RoPE key broadcast to every head), input of the attention kernel",
           bs * n_h * (d_h + d_hR), shard={"TP", "CP"}, modules={"mla_up_proj"},
           note="under mla_up_proj the checkpoint keeps the gathered RoPE key k^R (b s d_h^R elements, CP-sharded) "
                "as an input: not counted"),
        _S("attention.v", "values, input of the attention kernel", bs * n_h * d_v, shard={"TP", "CP"},
           modules={"mla_up_proj"}, note="not padded to the query head dim (the kernel takes d_v != d_h + d_h^R)"),
        _S("attention.softmax_lse", "softmax statistics (log-sum-exp per query and head), fp32", b * n_h * s, "fp32",
           shard={"TP", "CP"}, modules={"core_attn"},
           note="flash/fused attention keeps no s^2 tensor, only one fp32 statistic per row (plus an RNG state "
                "of a few bytes); with attention dropout 0 there is no mask. core_attn recompute checkpoints the "
                "kernel: its inputs q, k, v stay, this statistic goes"),
        _S("attention.context", "attention output, kept by the attention kernel and as the input of W^O",
           bs * n_h * d_v, shard={"TP", "CP"}, linear_input=True, fp8_exception="E5M6",
           note="one tensor for both uses: under FP8 Megatron has W^O keep the kernel's bf16 output "
                "(set_save_original_input), DeepSeek-V3 caches it in E5M6 (report §3.3)"),
    ]
    return out


def _megatron_swiglu(prefix: str, label: str, tokens, width, shard: set, modules: set, act_modules: set,
                     note: str = "") -> list[Saved]:
    return [
        _S(f"{prefix}.swiglu_input", f"{label} fc1 output [gate; up], SwiGLU input", tokens * 2 * width,
           shard=shard, modules=modules, linear_input=True, note=_SWIGLU_FP8),
        _S(f"{prefix}.act_output", f"{label} SwiGLU output, input of fc2", tokens * width, shard=shard,
           modules=act_modules, linear_input=True, note=note),
    ]


def _megatron_moe(m: ModelConfig) -> list[Saved]:
    bs = b * s
    ETP = sym("ETP")
    out = _meg_norm(
        "moe", "the MoE block input (residual stream after attention)", bs, h, shard={"SP", "CP"},
        output_modules={"layernorm"},
        output_name="pre-MLP RMSNorm output, input of the router and the shared experts", output_linear=False,
        output_note="kept in bf16: the router's GEMM needs it in high precision, and under FP8 Megatron has the "
                    "shared experts' fc1 keep this original (set_save_original_input); the dispatched tokens "
                    "are a separate copy")
    out += [
        _S("moe.router_scores", "router scores sigmoid(logits), fp32, kept by the top-k score function", bs * N,
           "fp32", shard={"SP", "CP"}, modules={"moe"},
           note="--moe-router-dtype fp32: logits and scores in fp32; the fused top-k (and the unfused sigmoid) "
                "keeps one fp32 [tokens, N] for backward; the logits are not kept"),
        _S("moe.aux_loss_scores", "router scores recomputed for the load-balancing loss, fp32", bs * N, "fp32",
           shard={"SP", "CP"}, modules={"moe"},
           note="only with an auxiliary loss (DeepSeek-V3 keeps a sequence-wise one with a tiny weight); "
                "uncertain: assumes the score function for the loss keeps its own fp32 copy"),
        _S("moe.routing_map", "routing map, one bool per token and expert", bs * N, "mask", shard={"SP", "CP"},
           modules={"moe"}, note="[tokens, N] bool, not top-k indices; kept by the fused top-k backward"),
        _S("moe.permute_map", "token permutation's row-id map, int32", bs * (2 * N + 1), "int32",
           shard={"SP", "CP"}, modules={"moe"},
           note="uncertain: TE's fused permute (moe_permute_fusion) builds a [tokens, 2N + 1] int32 map in "
                "recent versions ([N, tokens] in older ones); the unfused path keeps N_r int64 indices per token"),
    ]
    routed = bs * N_r * ETP      # dispatched token copies on one rank, before the SP division by TP
    routed_note = ("the dispatched tokens: each rank's s/TP local tokens times N_r, gathered over ETP; EP moves "
                   "tokens between ranks but does not divide them (balanced routing assumed)")
    out += [
        _S("moe.routed.fc1_input", "dispatched tokens, input of the routed experts' fc1", routed * h,
           shard={"SP", "CP"}, modules={"moe"}, linear_input=True, note=routed_note),
        _S("moe.routed.probs", "routing probabilities of the dispatched tokens, fp32 (applied in the SwiGLU)",
           routed, "fp32", shard={"SP", "CP"}, modules={"moe"}),
    ]
    # width h_E / ETP on routed tokens b s N_r ETP / TP: ETP cancels
    out += _megatron_swiglu("moe.routed", "routed experts'", bs * N_r, h_E, {"SP", "CP"}, {"moe"},
                            {"moe", "moe_act"},
                            note="moe_act recomputes it from the SwiGLU input (output-discarding checkpoint)")
    if m.n_shared_experts:
        out += _megatron_swiglu("moe.shared", "shared experts'", bs, N_s * h_E, {"TP", "CP"},
                                {"moe", "shared_experts"}, {"moe", "shared_experts"},
                                note="TP-split like the dense FFN over all s tokens (fc1 gathers its SP input); "
                                     "Megatron's moe_act covers the routed experts only")
    return out


def _megatron_dense(m: ModelConfig) -> list[Saved]:
    bs = b * s
    out = _meg_norm(
        "dense_ffn", "the FFN block input (residual stream after attention)", bs, h, shard={"SP", "CP"},
        output_modules={"mlp"}, output_name="RMSNorm output, input of fc1 (gate and up)",
        output_note="the norm is fused into fc1 (TELayerNormColumnParallelLinear): Megatron's layernorm module "
                    "does not recompute it, only mlp does; DeepSeek-V3 recomputes every RMSNorm")
    out += _megatron_swiglu("dense_ffn", "dense FFN", bs, h_F, {"TP", "CP"}, {"mlp"}, {"mlp"})
    return out


def megatron_layer(m: ModelConfig, kind: str) -> list[Saved]:
    """The megatron profile's ledger of one decoder layer of ``kind``."""
    return _megatron_attention(m) + (_megatron_moe(m) if kind == "moe" else _megatron_dense(m))


def megatron_head(prefix: str = "head") -> list[Saved]:
    bs = b * s
    return [
        _S(f"{prefix}.norm_input", "final RMSNorm input", bs * h, shard={"SP", "CP"}, keep_full=True),
        _S(f"{prefix}.norm_rstd", "final RMSNorm's 1/rms per token, fp32", bs, "fp32", shard={"SP", "CP"},
           keep_full=True),
        _S(f"{prefix}.input", "final RMSNorm output, input of the output layer", bs * h, shard={"SP", "CP"},
           keep_full=True, note="the output head stays in bf16 (DeepSeek-V3 report §3.3): not FP8-cached"),
        _S(f"{prefix}.loss_softmax", "cross-entropy softmax of the logits, fp32", bs * v, "fp32",
           shard={"TP", "CP"}, keep_full=True,
           note="vocab-parallel cross-entropy casts the logits to fp32 and keeps the softmax; the bf16 logits "
                "are freed after the cast (the output layer does not keep its output)"),
        _S(f"{prefix}.targets", "target token ids, int64", bs, "int64", shard={"CP"}, keep_full=True),
    ]


def _megatron_mtp(m: ModelConfig, j: int) -> list[Saved]:
    bs = b * s
    kind = "moe" if m.is_moe_layer(m.num_hidden_layers + j) else "dense"
    own = [
        _S("mtp.token_ids", "shifted token ids of the MTP embedding, int64", bs, "int64", shard={"CP"},
           keep_full=True),
        _S("mtp.enorm_input", "embedding of the shifted tokens, input of the MTP's embedding RMSNorm", bs * h,
           shard={"SP", "CP"}, keep_full=True),
        _S("mtp.norms_rstd", "the two MTP input RMSNorms' 1/rms per token, fp32", 2 * bs, "fp32",
           shard={"SP", "CP"}, keep_full=True),
        _S("mtp.eh_proj_input", "concatenated normalised embedding and hidden state, input of the projection M",
           bs * 2 * h, shard={"SP", "CP"}, keep_full=True, linear_input=True,
           note="the hidden-state norm's input is the main model's final-norm output, already kept by the head"),
    ]
    block = [renamed(e, "mtp." + e.key) for e in megatron_layer(m, kind)]
    return own + block + megatron_head("mtp.head")


ACT_PROFILES["megatron"] = ActProfile(
    "megatron", "Megatron-Core with Transformer Engine: fused attention (no s^2), no dropout, SwiGLU, "
    "fp32 router, alltoall dispatch over EP/ETP, TP-split shared experts, sequence parallelism, MTP",
    megatron_layer, lambda m: common_embedding(), lambda m: megatron_head(), _megatron_mtp)
