"""Activation ledgers: what each implementation saves for backward, per layer and around it.

A *profile* is a ledger variant (see :mod:`memlib.activations` for the machinery):

``paper``
    arXiv 2502.07846 §5, term by term: MLA 4bsh + 2bs(d_c'+d_c) + 4bs(d_h+d_h^R)n_h + 2bs d_h n_h
    + 5bn_h s^2 + 2bs d_h n_h + bsh; MoE 4bsh/2 + 4bsN + 2bsN_r + (N/EP)(3E_token h + 8E_token h_E)
    + N_s(3bsh + 8bsh_E) under SP, with E_token = bsN_r/N.  Dense layers, the embedding, the head
    and the MTP modules, which the paper does not analyse, follow the same conventions.
``megatron``
    Megatron-Core with Transformer Engine for a DeepSeek-V3-style model, read from the code
    (``multi_latent_attention.py``, ``moe/{router,token_dispatcher,experts,shared_experts}.py``,
    ``fusions/fused_bias_swiglu.py``, ``transformer_layer.py``, ``multi_token_prediction.py``): fused
    attention keeps q, k, v, its output and an fp32 log-sum-exp (no s^2 tensor); no dropout; every
    RMSNorm keeps its input and an fp32 1/rms; the MLA latents are SP-sharded; SwiGLU keeps its input
    (fc1 output, 2 h_E wide) and fc2 its output; the fp32 router keeps scores, map and permutation
    indices; the routed experts hold b s N_r ETP / TP dispatched tokens per rank (EP does not divide
    them); shared experts are TP-split; full recomputation keeps each layer's input only.  Entries
    whose size depends on a version or an option say so in their ``note``.

:func:`gpt_layer` reproduces Korthikanti et al. (arXiv 2205.05198) for a dense GPT layer, to show
that the ledger is not tuned to one paper.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .activations import MODULES, Saved, renamed, saved as _S
from .config import ConfigError, ModelConfig, show
from .symbols import sym

__all__ = ["ActProfile", "ACT_PROFILES", "act_profile", "paper_layer", "gpt_layer", "common_embedding",
           "common_head", "megatron_layer", "megatron_head"]

b, s = sym("b"), sym("s")
h, h_F, h_E = sym("h"), sym("h_F"), sym("h_E")
n_h, d_h, d_v, d_hR = sym("n_h"), sym("d_h"), sym("d_v"), sym("d_hR")
d_cq, d_c = sym("d_cq"), sym("d_c")
N, N_s, N_r, v = sym("N"), sym("N_s"), sym("N_r"), sym("v")
EP = sym("EP")


# ------------------------------------------------------------------------------------------------
# the paper's ledger (arXiv 2502.07846 §5), generalised to dense layers, embedding and head
# ------------------------------------------------------------------------------------------------
def _paper_norm(block: str, input_name: str, output_name: str) -> list[Saved]:
    """A block's pre-norm as the paper counts it: its input (the block input, kept under full
    recomputation) and its output (the next Linear's input), both SP-split."""
    bs = b * s
    return [
        _S(f"{block}.norm_input", input_name, bs * h, shard={"SP", "CP"}, keep_full=True, width=h),
        _S(f"{block}.norm_output", output_name, bs * h, shard={"SP", "CP"}, modules={"layernorm"},
           linear_input=True, width=h),
    ]


def _paper_attention(m: ModelConfig) -> list[Saved]:
    bs = b * s
    out = _paper_norm("attention", "RMSNorm input (the layer input)", "RMSNorm output, input of the down-projections")
    if m.q_lora_rank is not None:
        out.append(_S("attention.c_q", "query latent c^Q, input of W^UQ and W^QR", bs * d_cq, shard={"CP"},
                      linear_input=True, width=d_cq, note="replicated over TP: W^DQ is not split"))
    out += [
        _S("attention.c_kv", "key-value latent c^KV, input of W^UK and W^UV", bs * d_c, shard={"CP"},
           linear_input=True, width=d_c, note="replicated over TP: W^DKV is not split"),
        _S("attention.q", "queries q (no-RoPE and RoPE parts)", bs * n_h * (d_h + d_hR), shard={"TP", "CP"},
           modules={"mla_up_proj"}, width=n_h * (d_h + d_hR)),
        _S("attention.k", "keys k (no-RoPE part and the shared RoPE key, per head)", bs * n_h * (d_h + d_hR),
           shard={"TP", "CP"}, modules={"mla_up_proj"}, width=n_h * (d_h + d_hR)),
        _S("attention.v", "values v", bs * n_h * d_v, shard={"TP", "CP"}, modules={"mla_up_proj"},
           width=n_h * d_v, note="the paper writes d_h; DeepSeek's configs call this v_head_dim"),
        _S("attention.softmax_out", "softmax output (attention probabilities)", b * n_h * s * s,
           shard={"TP", "CP"}, modules={"core_attn"}),
        _S("attention.softmax_dropout_mask", "attention-dropout mask", b * n_h * s * s, "mask",
           shard={"TP", "CP"}, modules={"core_attn"}),
        _S("attention.softmax_dropout_out", "attention-dropout output", b * n_h * s * s,
           shard={"TP", "CP"}, modules={"core_attn"}),
        _S("attention.context", "attention output, input of W^O", bs * n_h * d_v, shard={"TP", "CP"},
           linear_input=True, fp8_exception="E5M6", width=n_h * d_v),
        _S("attention.out_dropout_mask", "dropout mask after W^O", bs * h, "mask", shard={"SP", "CP"}),
    ]
    return out


def _paper_ffn(prefix: str, width, tokens, *, shard_w: set, shard_in: set, module: str,
               label: str, input_mask: bool, mean_rows: bool = False) -> list[Saved]:
    """A SwiGLU FFN as the paper counts an expert: input (and its mask), gate, up, SiLU, product.
    ``mean_rows``: ``tokens`` is an expected count (routed experts), rounded up on a device."""
    out = []
    kw = {"mean_rows": mean_rows}
    if input_mask:
        out += [
            _S(f"{prefix}.input", f"{label} input", tokens * h, shard=shard_in, modules={module}, linear_input=True,
               width=h, **kw),
            _S(f"{prefix}.input_mask", f"{label} input mask", tokens * h, "mask", shard=shard_in, modules={module},
               width=h, note="the paper's 3 E_token h: input (2 bytes) and a 1-byte mask, as its transcription "
                             "reads it", **kw),
        ]
    out += [
        _S(f"{prefix}.gate_out", f"{label} gate projection output (SwiGLU input)", tokens * width,
           shard=shard_w, modules={module}, width=width, **kw),
        _S(f"{prefix}.up_out", f"{label} up projection output (SwiGLU input)", tokens * width,
           shard=shard_w, modules={module}, width=width, **kw),
        _S(f"{prefix}.act_out", f"{label} SiLU output", tokens * width, shard=shard_w,
           modules={module, "moe_act"} if prefix == "routed" else {module}, width=width, **kw),
        _S(f"{prefix}.product", f"{label} SiLU(gate) * up, input of the down projection", tokens * width,
           shard=shard_w, modules={module, "moe_act"} if prefix == "routed" else {module}, linear_input=True,
           width=width, **kw),
    ]
    return out


def _paper_moe(m: ModelConfig) -> list[Saved]:
    bs = b * s
    # local experts x E_token = (N / EP)(b s N_r / N): b s N_r token copies spread over the EP ranks, a
    # mean under balanced routing, rounded up to whole tokens on a device (shard "EP", mean_rows)
    routed_tokens = bs * N_r
    out = _paper_norm("moe", "RMSNorm input (the MoE block input)", "RMSNorm output, input of the router and experts")
    out += [
        _S("moe.router_logits", "router logits", bs * N, shard={"CP"}, modules={"moe"}),
        _S("moe.router_probs", "router probabilities", bs * N, shard={"CP"}, modules={"moe"}),
        _S("moe.routing_map", "top-k routing map (which experts each token goes to)", bs * N_r, shard={"CP"},
           keep_full=True, note="kept under full recomputation so that routing is reproduced exactly"),
    ]
    out += [e for e in _paper_ffn("routed", h_E, routed_tokens, shard_w={"CP", "EP", "ETP"}, shard_in={"CP", "EP"},
                                  module="moe", label="routed experts'", input_mask=True, mean_rows=True)]
    if m.n_shared_experts:
        out += _paper_ffn("shared", N_s * h_E, bs, shard_w={"CP"}, shard_in={"CP"}, module="shared_experts",
                          label="shared experts'", input_mask=True)
    return [e if e.key.startswith("moe.") else renamed(e, "moe." + e.key) for e in out]


def _paper_dense(m: ModelConfig) -> list[Saved]:
    bs = b * s
    out = _paper_norm("dense_ffn", "RMSNorm input (the FFN block input)", "RMSNorm output, input of the FFN")
    out += [renamed(e, "dense_ffn." + e.key.split(".", 1)[1])
            for e in _paper_ffn("ffn", h_F, bs, shard_w={"TP", "CP"}, shard_in={"SP", "CP"}, module="mlp",
                                label="dense FFN", input_mask=False)]
    out.append(_S("dense_ffn.out_dropout_mask", "dropout mask after the FFN", bs * h, "mask", shard={"SP", "CP"},
                  note="beyond the paper (it analyses MoE stages only); as Korthikanti's MLP dropout mask"))
    return out


def common_embedding() -> list[Saved]:
    return [_S("embedding.token_ids", "input token ids (for the embedding's backward)", b * s, "int64",
               shard={"CP"}, keep_full=True)]


def common_head(prefix: str = "head") -> list[Saved]:
    bs = b * s
    return [
        _S(f"{prefix}.norm_input", "final RMSNorm input", bs * h, shard={"SP", "CP"}, keep_full=True, width=h),
        _S(f"{prefix}.input", "final RMSNorm output, input of the output head", bs * h, shard={"SP", "CP"},
           keep_full=True, linear_input=True, width=h),
        _S(f"{prefix}.logits", "logits", bs * v, shard={"TP", "CP"}, keep_full=True),
        _S(f"{prefix}.loss_softmax", "cross-entropy softmax of the logits, upcast to fp32", bs * v, "fp32",
           shard={"TP", "CP"}, keep_full=True, note="vocab-parallel cross-entropy keeps fp32 probabilities"),
    ]


def _paper_mtp(m: ModelConfig, j: int) -> list[Saved]:
    bs = b * s
    kind = "moe" if m.is_moe_layer(m.num_hidden_layers + j) else "dense"
    own = [
        _S("mtp.token_ids", "shifted token ids of the MTP module", bs, "int64", shard={"CP"}, keep_full=True),
        _S("mtp.enorm_input", "embedding of the shifted tokens, RMSNorm input", bs * h, shard={"SP", "CP"}, keep_full=True),
        _S("mtp.hnorm_input", "main model's final hidden state, RMSNorm input", bs * h, shard={"SP", "CP"}, keep_full=True),
        _S("mtp.eh_proj_input", "concatenated normalised inputs of the projection M", bs * 2 * h,
           shard={"SP", "CP"}, keep_full=True, linear_input=True, width=2 * h),
    ]
    block = [renamed(e, "mtp." + e.key) for e in paper_layer(m, kind)]
    return own + block + common_head("mtp.head")


def paper_layer(m: ModelConfig, kind: str) -> list[Saved]:
    """The paper profile's ledger of one decoder layer of ``kind``."""
    return _paper_attention(m) + (_paper_moe(m) if kind == "moe" else _paper_dense(m))


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
           linear_input=output_linear, note=output_note, width=width),
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
               modules={"mla_up_proj"}, linear_input=True, width=width,
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
           bs * n_h * d_v, shard={"TP", "CP"}, linear_input=True, fp8_exception="E5M6", width=n_h * d_v,
           note="one tensor for both uses: under FP8 Megatron has W^O keep the kernel's bf16 output "
                "(set_save_original_input), DeepSeek-V3 caches it in E5M6 (report §3.3)"),
    ]
    return out


def _megatron_swiglu(prefix: str, label: str, tokens, width, shard: set, modules: set, act_modules: set,
                     note: str = "") -> list[Saved]:
    return [
        _S(f"{prefix}.swiglu_input", f"{label} fc1 output [gate; up], SwiGLU input", tokens * 2 * width,
           shard=shard, modules=modules, linear_input=True, note=_SWIGLU_FP8, width=2 * width),
        _S(f"{prefix}.act_output", f"{label} SwiGLU output, input of fc2", tokens * width, shard=shard,
           modules=act_modules, linear_input=True, note=note, width=width),
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
           shard={"SP", "CP"}, modules={"moe"}, linear_input=True, note=routed_note, width=h),
        _S("moe.routed.probs", "routing probabilities of the dispatched tokens, fp32 (applied in the SwiGLU)",
           routed, "fp32", shard={"SP", "CP"}, modules={"moe"}),
    ]
    # width h_E / ETP on the b s N_r ETP / TP dispatched tokens (ETP cancels in the bytes, not in the tiles)
    out += _megatron_swiglu("moe.routed", "routed experts'", routed, h_E, {"SP", "CP", "ETP"}, {"moe"},
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
           bs * 2 * h, shard={"SP", "CP"}, keep_full=True, linear_input=True, width=2 * h,
           note="the hidden-state norm's input is the main model's final-norm output, already kept by the head"),
    ]
    block = [renamed(e, "mtp." + e.key) for e in megatron_layer(m, kind)]
    return own + block + megatron_head("mtp.head")


@dataclass(frozen=True)
class ActProfile:
    """A ledger variant: what an implementation saves."""

    name: str
    description: str
    layer: Callable[[ModelConfig, str], list[Saved]]
    embedding: Callable[[ModelConfig], list[Saved]]
    head: Callable[[ModelConfig], list[Saved]]
    mtp: Callable[[ModelConfig, int], list[Saved]]
    modules: frozenset = field(default_factory=lambda: frozenset(MODULES))
    #: parallel axes the implementation does not have (their size must be 1), e.g. transformers has
    #: no tensor, context or expert parallelism
    no_parallel: tuple[str, ...] = ()


ACT_PROFILES: dict[str, ActProfile] = {
    "paper": ActProfile(
        "paper", "arXiv 2502.07846 §5: eager attention with dropout, bf16, every intermediate kept",
        paper_layer, lambda m: common_embedding(), lambda m: common_head(), _paper_mtp),
    "megatron": ActProfile(
        "megatron", "Megatron-Core with Transformer Engine: fused attention (no s^2), no dropout, SwiGLU, "
        "fp32 router, alltoall dispatch over EP/ETP, TP-split shared experts, sequence parallelism, MTP",
        megatron_layer, lambda m: common_embedding(), lambda m: megatron_head(), _megatron_mtp),
}


def act_profile(name: str) -> ActProfile:
    """The activation profile called ``name``."""
    try:
        return ACT_PROFILES[name]
    except KeyError:
        raise ConfigError(f"profile={show(name)} has no activation ledger; known: {', '.join(ACT_PROFILES)}") from None


# ------------------------------------------------------------------------------------------------
# Korthikanti et al. (arXiv 2205.05198): a dense GPT layer with LayerNorm, GeLU MLP and dropout
# ------------------------------------------------------------------------------------------------
def gpt_layer() -> list[Saved]:
    """One GPT layer as Korthikanti et al. count it (their §4.1): 34 sbh + 5 a s^2 b bytes with
    f = 4h, a = n_h heads.  Used to show that the ledger reproduces their Table 2."""
    sbh = s * b * h
    return [
        _S("attention.ln_input", "LayerNorm input (the layer input)", sbh, shard={"SP"}, keep_full=True),
        _S("attention.qkv_input", "LayerNorm output, input of the QKV projection", sbh, shard={"SP"},
           modules={"layernorm"}),
        _S("attention.q", "queries (for QK^T)", sbh, shard={"TP"}),
        _S("attention.k", "keys (for QK^T)", sbh, shard={"TP"}),
        _S("attention.softmax_out", "softmax output", n_h * s * s * b, shard={"TP"}, modules={"core_attn"}),
        _S("attention.softmax_dropout_mask", "attention-dropout mask", n_h * s * s * b, "mask",
           shard={"TP"}, modules={"core_attn"}),
        _S("attention.softmax_dropout_out", "attention-dropout output", n_h * s * s * b, shard={"TP"},
           modules={"core_attn"}),
        _S("attention.v", "values", sbh, shard={"TP"}),
        _S("attention.proj_input", "attention output, input of the output projection", sbh, shard={"TP"}),
        _S("attention.out_dropout_mask", "dropout mask after attention", sbh, "mask", shard={"SP"}),
        _S("mlp.ln_input", "LayerNorm input", sbh, shard={"SP"}),
        _S("mlp.fc1_input", "LayerNorm output, input of the first linear", sbh, shard={"SP"}, modules={"layernorm"}),
        _S("mlp.gelu_input", "GeLU input", s * b * h_F, shard={"TP"}, modules={"mlp"}),
        _S("mlp.gelu_output", "GeLU output, input of the second linear", s * b * h_F, shard={"TP"}, modules={"mlp"}),
        _S("mlp.dropout_mask", "dropout mask after the MLP", sbh, "mask", shard={"SP"}),
    ]
