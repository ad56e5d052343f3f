"""The ``megatron`` ledger's blocks: kernel choices and what each block of a Megatron-Core layer saves for backward.

:class:`Kernels` holds the kernel choices of a training configuration (:data:`TE_DEFAULT`, Transformer
Engine's defaults; :data:`KERNEL_SOURCES`, where each rule is read); one function per block gives its
saved tensors: the norms (Transformer Engine's fused kernel or ``torch.nn.RMSNorm``), MLA attention, the
SwiGLU and dense FFN, the router and the auxiliary loss, the MoE block, and the other families'
grouped-query and multi-head attention, LayerNorm, GeLU MLP and Qwen2-MoE's gated shared expert.
:mod:`memlib.ledgers.megatron` assembles them into layers and the profile; the kernel rules are described
there.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import sympy as sp

from .base import Policy, Saved, parse_policy, saved as _S
from ..config import ConfigError, ModelConfig, TrainingConfig
from ..config.versions import MCORE_VERSION
from ..config.strategies import CP_A2A, AttnBackend, CrossEntropyFusionImpl, LoadBalancing, Runtime, TransformerImpl
from ..core.symbols import sym, b, s, h, h_F, h_E, n_h, d_h, d_v, d_hR, d_cq, d_c, N, N_s, N_r


__all__ = ["Kernels", "TE_DEFAULT", "KERNEL_SOURCES", "ROUTER_SOFTMAX_FIRST", "router_softmax_first"]


#: the public source files each kernel's entries are read from (tag or release named)
KERNEL_SOURCES = {
    "te_rmsnorm": "TransformerEngine v2.18 transformer_engine/pytorch/ops/basic/rmsnorm.py (saves x and rstdevs)",
    "te_layernorm_linear": "TransformerEngine v2.18 transformer_engine/pytorch/module/layernorm_linear.py "
                           "(saves inputmat, ln_out, rsigma; makes its input contiguous in prepare_forward)",
    "te_fused_attention": "TransformerEngine v2.18 transformer_engine/pytorch/attention/dot_product_attention/"
                          "backends.py FusedAttnFunc (saves q, k, v, out and aux_ctx_tensors: the fp32 softmax "
                          "statistics and the RNG state)",
    "flash_attention": "Dao-AILab/flash-attention flash_attn/flash_attn_interface.py and hopper/"
                       "flash_attn_interface.py (save q, k, v, out, softmax_lse, rng_state)",
    "te_unfused_attention": "TransformerEngine v2.18 transformer_engine/pytorch/attention/dot_product_attention/"
                            "backends.py UnfusedDotProductAttention and softmax.py ScaledUpperTriangMaskedSoftmax "
                            "(saves the bf16 softmax results)",
    "te_cross_entropy": "TransformerEngine v2.18 transformer_engine/pytorch/cross_entropy.py and triton/"
                        "cross_entropy.py (writes the gradient into the logits and saves them)",
    "te_linear": "TransformerEngine v2.18 transformer_engine/pytorch/module/linear.py and grouped_linear.py "
                 "(save their input)",
    "torch_fused_rms_norm": "on a GPU torch.nn.RMSNorm's torch.rms_norm runs the fused _fused_rms_norm kernel, whose "
                            "backward keeps the input (a view keeps its whole storage) and one fp32 1/rms per row; "
                            f"measured: megatron-core {MCORE_VERSION}, torch 2.11 on an H200 (memlib/data/gpu_peaks)",
}


@dataclass(frozen=True)
class Kernels:
    """The kernel choices the megatron ledger depends on (from a :class:`TrainingConfig`)."""

    impl: TransformerImpl = TransformerImpl.TRANSFORMER_ENGINE
    backend: AttnBackend = AttnBackend.AUTO
    softmax_fp32: bool = False
    swiglu_fusion: bool = True
    ce_fusion: bool = False
    ce_impl: CrossEntropyFusionImpl = CrossEntropyFusionImpl.NATIVE
    aux_loss: LoadBalancing = LoadBalancing.SEQ_AUX_LOSS
    fp32: bool = False              #: activations in fp32 (precision fp32): no separate upcast copies
    policy: Policy = Policy("none")  #: the recompute policy (for the checkpoints that exist once per model)
    gathered_rope_key: bool = False  #: TP > 1 with SP: MLA gathers k^R over TP before RoPE
    tp: int = 1                      #: the TP size (grouped-query attention with TP > n_kv is not in the ledger)
    hidden_dropout: bool = False     #: --hidden-dropout > 0: the bias-dropout-adds and the embedding keep masks
    attention_dropout: bool = False  #: --attention-dropout > 0: the s x s attention keeps a mask and its output
    cp_a2a: bool = False             #: CP > 1 with --cp-comm-type a2a or a2a+p2p (TE): the pre-all-to-all output
    runtime: Runtime = Runtime.CUDA  #: where torch runs (:class:`~memlib.config.strategies.Runtime`)

    @property
    def local_norm(self) -> bool:
        """Megatron-Core's own norms (``torch.nn.RMSNorm``/``LayerNorm``), not Transformer Engine's."""
        return not self.impl.uses_te

    @property
    def composite_rms_norm(self) -> bool:
        """``torch.nn.RMSNorm`` as torch's composite (the CPU): an fp32 copy of its input and the fp32
        normalised values kept; on a GPU it is one fused kernel that keeps its input and the fp32 1/rms."""
        return self.local_norm and self.runtime is Runtime.CPU

    @property
    def norm_keeps_input(self) -> bool:
        """Whether a local RMSNorm keeps its input tensor itself (not an upcast copy): the fused kernel does,
        the composite does in fp32 training."""
        return not self.composite_rms_norm or self.fp32

    @property
    def block_recompute(self) -> bool:
        """Full recomputation of the first K layers only: Megatron-Core skips the MTP module's then."""
        return self.policy.full and self.policy.block_layers is not None

    @classmethod
    def of(cls, train: TrainingConfig) -> "Kernels":
        rec = train.recipe
        impl = train.transformer_impl
        policy = parse_policy(train.recompute)
        if not impl.uses_te:
            if rec.fp8_activations or rec.weights == 1:
                raise ConfigError(f"precision={train.precision} with transformer_impl={impl}: FP8 needs "
                                  f"Transformer Engine (transformer_impl=transformer_engine)")
            if "moe_act" in policy.modules:
                raise ConfigError(f"recompute={train.recompute} with transformer_impl={impl}: Megatron-Core "
                                  f"recomputes moe_act only in the grouped-GEMM experts of Transformer Engine")
        return cls(impl=impl, backend=train.attention_backend, softmax_fp32=train.attention_softmax_in_fp32,
                   swiglu_fusion=train.bias_swiglu_fusion, ce_fusion=train.cross_entropy_loss_fusion,
                   ce_impl=train.cross_entropy_fusion_impl, aux_loss=train.moe_aux_loss,
                   fp32=rec.activations == 4, policy=policy, gathered_rope_key=train.tp > 1 and train.sp,
                   tp=train.tp, hidden_dropout=train.hidden_dropout > 0, attention_dropout=train.attention_dropout > 0,
                   cp_a2a=train.cp > 1 and train.cp_comm_type in CP_A2A and impl.uses_te,
                   runtime=train.runtime)


def _local_softmax_fp32(n_h: int, k: Kernels):
    """``--attention-softmax-in-fp32``'s fp32 probabilities of Megatron-Core's local attention, kept by the torch
    softmax beside the bf16 copy P V keeps; none where the fused CUDA kernel runs (a GPU: it keeps its bf16 result
    once whatever the flag).  FusedScaleMaskSoftmax.is_kernel_available (megatron/core/fusions/fused_softmax.py:238-270
    at the pin; --masked-softmax-fusion, the default): bf16/fp16 input, 16 < s/CP <= 4096, s/CP and b n_h/TP
    multiples of 4, and for the causal mask b n_h/TP a multiple of the kernel's batches per block (4 above 128 keys,
    8 from 17 to 128: get_batch_per_block)."""
    size = b * n_h * s * s
    if k.runtime is Runtime.CPU:
        return size
    tp, cp = sym("TP"), sym("CP")
    sk, batches = s / cp, b * n_h / tp

    def multiple(x, n):
        return sp.Eq(sp.floor(x / n) * n, x)

    fused = ((sk > 16) & (sk <= 4096) & multiple(sk, 4) & multiple(batches, 4)
             & ((sk > 128) | multiple(batches, 8)))
    return sp.Piecewise((0, fused), (size, True))


TE_DEFAULT = Kernels()

_SWIGLU_FP8 = ("not a Linear input, but cacheable in FP8 like one: DeepSeek-V3 caches the SwiGLU input "
               "in FP8 (report §3.3), Megatron with --activation-func-fp8-input-store")
_MEASURED = f"measured: megatron-core {MCORE_VERSION} on the CPU (memlib.measure.megatron)"
_SHARED_CODE = "megatron-core's own code on both paths; " + _MEASURED


# ------------------------------------------------------------------------------------------------
# RMSNorm: Transformer Engine's fused kernel, or torch.nn.RMSNorm (the local path)
# ------------------------------------------------------------------------------------------------
def _norm(prefix: str, what: str, width, k: Kernels, *, shard=frozenset({"SP", "CP"}), modules=(),
          keep_input: bool = False, keep_all: bool = False, output_name: str = "", output_modules=None,
          output_linear: bool = True, output_note: str = "", checkpoint_module: str = "",
          output: bool = True, te_source: str = "te_rmsnorm", layernorm: bool = False,
          output_saves: int = 1) -> list[Saved]:
    """An RMSNorm over ``width`` features of every token and its output (kept by the Linear that reads it).

    TE keeps its input in the activation dtype and one fp32 ``rsigma`` per token, and so does
    ``torch.nn.RMSNorm`` on a GPU (torch's fused kernel); on the CPU (torch's composite) it keeps an fp32 copy of
    its input (the input itself in fp32 training), the fp32 ``1/rms`` and the fp32 normalised values.  ``modules`` drop all but TE's input; ``keep_input`` keeps TE's input
    under full recomputation (it is the layer's checkpoint), ``keep_all`` keeps everything (a norm outside
    any checkpoint).  ``checkpoint_module``: under that recompute module an output-discarding checkpoint
    wraps the norm and keeps its (activation-dtype) input instead.

    ``layernorm`` (the local path): ``torch.nn.LayerNorm`` instead, which keeps its input itself and its
    mean and 1/std per token in the activation dtype; the input is the same storage its output-discarding
    checkpoint keeps, so it stays under ``checkpoint_module`` too."""
    bs = b * s
    out_modules = modules if output_modules is None else output_modules
    if k.local_norm and layernorm:
        note = ("torch.nn.LayerNorm (native_layer_norm on the CPU) keeps its input and its mean and 1/std per "
                "token in the input's dtype; " + _MEASURED)
        out = [
            _S(f"{prefix}.norm_input", f"{what}, input of its LayerNorm (and of the LayerNorm's checkpoint)",
               bs * width, shard=shard, modules=() if checkpoint_module else modules,
               keep_full=keep_input or keep_all, note=note),
            _S(f"{prefix}.norm_mean", f"{what}: the LayerNorm's mean per token", bs, shard=shard, modules=modules,
               keep_full=keep_all, note=note),
            _S(f"{prefix}.norm_rstd", f"{what}: the LayerNorm's 1/std per token", bs, shard=shard, modules=modules,
               keep_full=keep_all, note=note),
        ]
    elif k.composite_rms_norm:
        note = ("torch.nn.RMSNorm (torch.rms_norm's composite on the CPU) upcasts its input to fp32 and keeps "
                "it; in fp32 training the upcast is the input itself" + ("; " + _MEASURED))
        out = [
            _S(f"{prefix}.norm_input_fp32", f"{what}, upcast to fp32 (kept by the RMSNorm)", bs * width, "fp32",
               shard=shard, modules=modules, keep_full=keep_all, note=note),
            _S(f"{prefix}.norm_rstd", f"{what}: the RMSNorm's 1/rms per token, fp32", bs, "fp32", shard=shard,
               modules=modules, keep_full=keep_all),
            _S(f"{prefix}.norm_normalized", f"{what}: normalised, fp32 (kept by the product with the weight)",
               bs * width, "fp32", shard=shard, modules=modules, keep_full=keep_all),
        ]
        if checkpoint_module:
            out.append(_S(f"{prefix}.norm_checkpoint_input", f"{what}, kept by the RMSNorm's output-discarding "
                          f"checkpoint ({checkpoint_module} recomputation)", bs * width, shard=shard,
                          only_when={checkpoint_module}, note=_MEASURED))
    else:
        if k.local_norm:
            te = KERNEL_SOURCES["torch_fused_rms_norm"]
        else:
            te = ("TE RMSNorm keeps its input and rsigma: " if te_source == "te_rmsnorm" else
                  "the RMSNorm fused into fc1 keeps its input, rsigma and its output: ") + KERNEL_SOURCES[te_source]
        out = [
            _S(f"{prefix}.norm_input", f"{what}, input of its RMSNorm", bs * width, shard=shard,
               keep_full=keep_input or keep_all, note=te),
            _S(f"{prefix}.norm_rstd", f"{what}: the RMSNorm's 1/rms per token, fp32", bs, "fp32", shard=shard,
               modules=modules, keep_full=keep_all, note=te),
        ]
    if output:
        out.append(_S(f"{prefix}.norm_output", output_name, bs * width, shard=shard, modules=out_modules,
                      linear_input=output_linear, keep_full=keep_all, note=output_note, width=width,
                      saves=output_saves))
    return out


# ------------------------------------------------------------------------------------------------
# the attention block
# ------------------------------------------------------------------------------------------------
def _attention(m: ModelConfig, k: Kernels) -> list[Saved]:
    bs = b * s
    local = k.local_norm
    out = _norm(
        "attention", "the layer input (residual stream)", h, k, keep_input=True, modules={"layernorm"},
        checkpoint_module="layernorm",
        output_name="input RMSNorm output, input of " + ("the down-projections W^DQ and W^DKV" if m.q_lora_rank
                                                         is not None else "W^Q and the down-projection W^DKV"),
        output_note=("W^DQ and W^DKV run on the local s/TP tokens (TE 'duplicated' Linear); in FP8 each of the "
                     "two unfused GEMMs keeps its own quantized copy unless fused (linear_qkv_down_proj) "
                     "or layernorm recompute makes them keep the bf16 original: counted once; "
                     + KERNEL_SOURCES["te_linear"]) if not local
        else "kept once by both down-projections (one tensor); " + _MEASURED,
        output_saves=1 if local else 2)      # W^DQ (or W^Q) and W^DKV each save it (get_query_key_value_tensors)
    if k.composite_rms_norm:          # (the fused norm's kept input is the layer input itself)
        out.append(_S("attention.layer_input", "the layer input, kept by the layer's checkpoint (full recomputation)",
                      bs * h, shard={"SP", "CP"}, only_when={"full"}, keep_full=True, note=_MEASURED))
    if m.q_lora_rank is None and not local:
        out += [
            _S("attention.q_proj_norm_rstd", "W^Q's fused RMSNorm (no q LoRA): 1/rms per token, fp32", bs, "fp32",
               shard={"SP", "CP"}, modules={"layernorm"},
               note="without q LoRA megatron-core 0.19.2 fuses a query norm into linear_q_proj "
                    "(transformer/mla_qk_norm_config.py resolves qk_layernorm to TELayerNormColumnParallelLinear); "
                    + KERNEL_SOURCES["te_layernorm_linear"]),
            _S("attention.q_proj_norm_output", "W^Q's fused RMSNorm output, input of W^Q (no q LoRA)", bs * h,
               shard={"SP", "CP"}, modules={"layernorm"}, linear_input=True, width=h,
               note="ln_out of the fused norm + linear: " + KERNEL_SOURCES["te_layernorm_linear"]),
        ]
    lat = [("q", "query latent c^Q", d_cq, "W^UQ and W^QR")] if m.q_lora_rank is not None else []
    lat.append(("kv", "key-value latent c^KV", d_c, "W^UK and W^UV"))
    for key, what, width, proj in lat:
        if local and not k.composite_rms_norm:
            out += [
                _S(f"attention.c_{key}", f"{what}, kept by its RMSNorm", bs * width if key == "q" else bs * (d_c + d_hR),
                   shard={"SP", "CP"},
                   note=("c^KV is a view of the W^DKV/W^KR output [c^KV; k^R]: the whole storage stays; "
                         if key == "kv" else "") + KERNEL_SOURCES["torch_fused_rms_norm"]),
                _S(f"attention.c_{key}_rstd", f"{what}: the RMSNorm's 1/rms per token, fp32", bs, "fp32",
                   shard={"SP", "CP"}, note=KERNEL_SOURCES["torch_fused_rms_norm"]),
                _S(f"attention.c_{key}_normed", f"normalised {what}, input of {proj}", bs * width, shard={"SP", "CP"},
                   linear_input=True, width=width,
                   note="kept by the up-projection, and as an input of its checkpoint under "
                        "mla_up_proj recomputation"),
            ]
        elif local:
            out += [
                _S(f"attention.c_{key}_fp32", f"{what}, upcast to fp32 by its RMSNorm", bs * width
                   if not (k.fp32 and key == "kv") else bs * (d_c + d_hR), "fp32", shard={"SP", "CP"},
                   note=("in fp32 training the norm keeps c^KV itself, a view of the W^DKV/W^KR output "
                         "[c^KV; k^R]: the whole storage stays; " if key == "kv" else "") + _MEASURED),
                _S(f"attention.c_{key}_rstd", f"{what}: the RMSNorm's 1/rms per token, fp32", bs, "fp32",
                   shard={"SP", "CP"}),
                _S(f"attention.c_{key}_normalized", f"{what}: normalised, fp32 (kept by the product with the weight)",
                   bs * width, "fp32", shard={"SP", "CP"}),
                _S(f"attention.c_{key}_normed", f"normalised {what}, input of {proj}", bs * width, shard={"SP", "CP"},
                   linear_input=True, width=width,
                   note="kept by the up-projection, and as an input of its checkpoint under "
                                           "mla_up_proj recomputation"),
            ]
        else:
            sp_note = ("SP-sharded: the down-projection runs on the local s/TP tokens; the fused RMSNorm + up-projection "
                       "(TELayerNormColumnParallelLinear) keeps a contiguous copy of its local input and gathers over "
                       "TP after the norm: " + KERNEL_SOURCES["te_layernorm_linear"])
            out += [
                _S(f"attention.c_{key}", f"{what} before its RMSNorm (input of the fused norm + {proj})", bs * width,
                   shard={"SP", "CP"}, modules={"mla_up_proj"} if key == "kv" else (),
                   note=sp_note + ("; under mla_up_proj the fused norm + linear runs inside the checkpoint, which "
                                   "keeps the down-projection output instead" if key == "kv" else
                                   "; under mla_up_proj the checkpoint keeps this same tensor as its input")),
                _S(f"attention.c_{key}_rstd", f"{what}: the RMSNorm's 1/rms per token, fp32", bs, "fp32",
                   shard={"SP", "CP"}, modules={"mla_up_proj"}, note=KERNEL_SOURCES["te_layernorm_linear"]),
                _S(f"attention.c_{key}_normed", f"normalised {what}, input of {proj}", bs * width, shard={"SP", "CP"},
                   modules={"mla_up_proj"}, linear_input=True, width=width,
                   note="kept by the up-projection for its weight gradient (re-gathered over TP in backward): ln_out, "
                        + KERNEL_SOURCES["te_layernorm_linear"]),
            ]
    # the up-projection checkpoint (mla_up_proj) keeps its inputs: c^Q and c^KV normalised (local; TE: before
    # the norm, already counted) and k^R, a view of the W^DKV/W^KR output, which keeps that storage whole
    if not (local and k.norm_keeps_input):       # (else the kv norm keeps that storage already)
        out.append(_S("attention.kv_latent_with_rope_key", "[c^KV; k^R], the W^DKV/W^KR output, kept whole by the "
                      "up-projection checkpoint (its inputs c^KV and k^R are views of it)", bs * (d_c + d_hR),
                      shard={"SP", "CP"}, only_when={"mla_up_proj"},
                      note="multi_latent_attention.py checkpoints qkv_up_proj_and_rope_apply(q_compressed, kv_compressed, "
                           "k_pos_emb, rotary_pos_emb); " + _SHARED_CODE))
    if k.gathered_rope_key and not local:
        out.append(_S("attention.rope_key_gathered", "the RoPE key k^R gathered over TP (SP), an input of the "
                      "up-projection checkpoint", bs * d_hR, shard={"CP"}, only_when={"mla_up_proj"},
                      note="with TP > 1 and SP, k_pos_emb is gathered from the sequence-parallel region before RoPE "
                           "(multi_latent_attention.py): read from Megatron-Core's code, not measurable on the CPU "
                           "(the local RMSNorm has no SP)"))
    if local:
        out += [
            _S("attention.rope_freqs", "RoPE angles [s, 1, 1, d_h^R], fp32, an input of the up-projection checkpoint",
               s * d_hR, "fp32", shard={"CP"}, only_when={"mla_up_proj"}, note=_MEASURED),
            _S("attention.rope_tables", "RoPE cos and sin [s, 1, 1, d_h^R], built separately for the queries and "
               "for the key (four tables), kept by the RoPE products", 4 * s * d_hR, shard={"CP"},
               modules={"mla_up_proj"},
               note="--no-rope-fusion (the CPU); with the fused MLA RoPE (a Triton kernel, the GPU default) the "
                    "cos/sin tables are cached once per model instead; " + _MEASURED),
        ]
    kernel = ("the attention kernel" if not k.backend.is_local(k.impl) else "Megatron-Core's DotProductAttention")
    if k.backend.keeps_scores(k.impl):
        qkv_note = ("kept by the batched matmuls Q K^T and P V (as their inputs): "
                    + (_MEASURED if k.backend.is_local(k.impl) else KERNEL_SOURCES["te_unfused_attention"]))
    elif k.backend is AttnBackend.FLASH:
        qkv_note = "saved by flash attention as its inputs: " + KERNEL_SOURCES["flash_attention"]
    else:
        qkv_note = ("saved by the fused attention kernel (flash or cuDNN, TE DotProductAttention) as its inputs: "
                    + KERNEL_SOURCES["te_fused_attention"] + "; " + KERNEL_SOURCES["flash_attention"])
    if not local:
        qkv_note += ("; the up-projection outputs themselves are freed by the fused RoPE (it keeps only the cached "
                     "cos/sin)")
    out += [
        _S("attention.q", f"queries [q^C; q^R] after RoPE, input of {kernel}", bs * n_h * (d_h + d_hR),
           shard={"TP", "CP"}, modules={"mla_up_proj"}, note=qkv_note),
        _S("attention.k", f"keys [k^C; k^R] (the RoPE key broadcast to every head), input of {kernel}",
           bs * n_h * (d_h + d_hR), shard={"TP", "CP"}, modules={"mla_up_proj"},
           note="under core_attn recomputation the checkpoint keeps q, k and v as its inputs; " + qkv_note),
        _S("attention.v", f"values, input of {kernel}",
           bs * n_h * d_v if not local else
           sp.Piecewise((bs * n_h * (d_h + d_v), sp.Eq(b * s * n_h, sym("TP"))), (bs * n_h * d_v, True)),
           shard={"TP", "CP"}, modules={"mla_up_proj"},
           note="not padded to the query head dim (the kernels take d_v != d_h + d_h^R); " + qkv_note if not local else
           "V is a slice of the W^UK/W^UV output made contiguous: a copy, except with one token and one head per "
           "rank (b s n_h / TP = 1), where the slice is already contiguous and keeps the whole output [k^C; v] "
           "alive; " + _MEASURED),
        _S("attention.attn_mask_type", "the mask type, kept as a one-element int32 tensor by the core-attention "
           "checkpoint", 1, "int32", only_when={"core_attn"},
           note="attention.py _checkpointed_attention_forward encodes the enum as a tensor; " + _SHARED_CODE),
    ]
    if k.backend.keeps_scores(k.impl):
        if k.backend.is_local(k.impl):
            note = ("Megatron-Core's FusedScaleMaskSoftmax unfused (torch) path, --no-masked-softmax-fusion as on the "
                    "CPU: the softmax and P V keep the same probabilities; dropout 0 keeps no mask. With the fused "
                    "kernel (a GPU, bf16, 16 < s <= 4096) it keeps them once in bf16 even with "
                    "--attention-softmax-in-fp32, and no mask; " + _MEASURED)
        else:
            note = ("TE's unfused attention keeps its fused softmax kernel's bf16 results (its torch fallback, "
                    "outside that kernel's shapes, keeps fp32 and bf16 copies): " + KERNEL_SOURCES["te_unfused_attention"])
        fp32_copy = k.softmax_fp32 and not k.fp32 and k.backend.is_local(k.impl)
        # the softmax and P V save the same probabilities (two saves of one tensor) unless the softmax keeps an fp32 copy
        out.append(_S("attention.softmax_out", "softmax probabilities [b, n_h, s, s]", b * n_h * s * s,
                      shard={"TP", "CP"}, modules={"core_attn"}, note=note, saves=1 if fp32_copy else 2))
        if fp32_copy:
            out.append(_S("attention.softmax_fp32", "softmax probabilities in fp32 (--attention-softmax-in-fp32), "
                          "kept by the softmax beside the bf16 copy P V keeps (the torch path)",
                          _local_softmax_fp32(n_h, k), "fp32", shard={"TP", "CP"}, modules={"core_attn"},
                          note="measured on the CPU; on a GPU the fused kernel keeps none: " + _MEASURED))
    else:
        src = KERNEL_SOURCES["flash_attention"] if k.backend is AttnBackend.FLASH else (
            KERNEL_SOURCES["te_fused_attention"] + "; " + KERNEL_SOURCES["flash_attention"])
        out.append(_S("attention.softmax_lse", "softmax statistics (log-sum-exp per query and head), fp32",
                      b * n_h * s, "fp32", shard={"TP", "CP"}, modules={"core_attn"},
                      note="flash/fused attention keeps no s^2 tensor, only one fp32 statistic per row (plus an RNG "
                           "state of a few bytes); with attention dropout 0 there is no mask. core_attn recompute "
                           "checkpoints the kernel: its inputs q, k, v stay, this statistic goes: " + src))
    out.append(_S("attention.context", "attention output, kept by the attention kernel and as the input of W^O",
                  bs * n_h * d_v, shard={"TP", "CP"}, linear_input=True, fp8_exception="E5M6", width=n_h * d_v,
                  note=("one tensor for both uses: under FP8 Megatron has W^O keep the kernel's bf16 output "
                        "(set_save_original_input), DeepSeek-V3 caches it in E5M6 (report §3.3); " + qkv_note
                        + "; " + KERNEL_SOURCES["te_linear"]) if not local
                  else "kept by W^O (RowParallelLinear); " + _MEASURED))
    return out


# ------------------------------------------------------------------------------------------------
# SwiGLU, dense FFN, MoE
# ------------------------------------------------------------------------------------------------
def _swiglu(prefix: str, label: str, tokens, width, shard: set, modules: set, act_modules: set, k: Kernels,
            *, weighted: bool = False, note: str = "") -> list[Saved]:
    """fc1's output [gate; up] and fc2's input; unfused (--no-bias-swiglu-fusion) also SiLU(gate), the
    ``up + glu_linear_offset`` sum (a new tensor) and, for the experts, the SwiGLU output before the
    routing probabilities multiply it."""
    fused = ("fused SwiGLU (fused_bias_swiglu.py): keeps only its input" if k.swiglu_fusion
             else "unfused SwiGLU (mlp.py glu): silu and the product keep their inputs")
    out = [_S(f"{prefix}.swiglu_input", f"{label} fc1 output [gate; up], SwiGLU input", tokens * 2 * width,
              shard=shard, modules=modules, linear_input=True, width=2 * width,
              note=_SWIGLU_FP8 + "; " + fused + "; " + _SHARED_CODE)]
    if not k.swiglu_fusion:
        out += [
            _S(f"{prefix}.silu_output", f"{label} SiLU(gate), kept by the product", tokens * width, shard=shard,
               modules=act_modules, note=_SHARED_CODE),
            _S(f"{prefix}.up_offset", f"{label} up + glu_linear_offset (a new tensor, offset 0), kept by the product",
               tokens * width, shard=shard, modules=act_modules, note=_SHARED_CODE),
        ]
        if weighted:
            out.append(_S(f"{prefix}.glu_output", f"{label} SwiGLU output, kept by its product with the routing "
                          "probabilities", tokens * width, shard=shard, modules=act_modules, note=_SHARED_CODE))
    out.append(_S(f"{prefix}.act_output", f"{label} SwiGLU output, input of fc2", tokens * width, shard=shard,
                  modules=act_modules, linear_input=True, width=width,
                  note=note + ("; " if note else "") + "kept by fc2 (" + ("ColumnParallelLinear/RowParallelLinear, "
                       + _MEASURED if k.local_norm else KERNEL_SOURCES["te_linear"]) + ")"))
    return out


def _dense(m: ModelConfig, k: Kernels) -> list[Saved]:
    bs = b * s
    if k.local_norm:
        out = _norm("dense_ffn", "the FFN block input (residual stream after attention)", h, k, modules={"layernorm"},
                    checkpoint_module="layernorm", output_modules={"layernorm"},
                    output_name="pre-MLP norm output, input of fc1 (gate and up)",
                    output_note="kept by fc1, and by the mlp checkpoint as its input; " + _MEASURED,
                    layernorm=m.norm == "layernorm")
    else:
        out = _norm("dense_ffn", "the FFN block input (residual stream after attention)", h, k, modules={"mlp"},
                    output_name="RMSNorm output, input of fc1 (gate and up)", te_source="te_layernorm_linear",
                    output_note="the norm is fused into fc1 (TELayerNormColumnParallelLinear): Megatron's layernorm "
                                "module does not recompute it, only mlp does; DeepSeek-V3 recomputes every RMSNorm; ln_out, "
                                + KERNEL_SOURCES["te_layernorm_linear"])
    out += _swiglu("dense_ffn", "dense FFN", bs, h_F, {"TP", "CP"}, {"mlp"}, {"mlp"}, k)
    return out


#: MoE kind -> whether Megatron-Core's router takes the softmax before the top-k (--moe-router-pre-softmax:
#: DeepSeek, and Qwen2-MoE, whose top-k probabilities are not renormalised) or after it, over the top-k logits
#: (Mixtral; Qwen3-MoE, whose norm_topk_prob renormalises the top-k of the softmax: the same probabilities)
ROUTER_SOFTMAX_FIRST = {"deepseek": True, "qwen2_moe": True, "mixtral": False, "qwen3_moe": False}


def router_softmax_first(m: ModelConfig) -> bool:
    """Whether the router takes the softmax before the top-k: :data:`ROUTER_SOFTMAX_FIRST`, and always with
    top-1 (Megatron-Core refuses --no-moe-router-pre-softmax with top-1: "Please use --moe-router-pre-softmax
    when topk is 1")."""
    return ROUTER_SOFTMAX_FIRST[m.moe] or m.num_experts_per_tok == 1


def _router(m: ModelConfig, k: Kernels) -> list[Saved]:
    """Megatron-Core's TopKRouter, unfused (--moe-router-fusion off), fp32 (--moe-router-dtype fp32)."""
    bs = b * s
    sigmoid = m.scoring_func == "sigmoid"
    tok = {"SP", "CP"}
    if not router_softmax_first(m):
        out = [
            _S("moe.topk_indices", "top-k expert indices of the logits, int64 (kept by the top-k and by the scatter "
               "into [tokens, N])", bs * N_r, "int64", shard=tok, modules={"moe"}, note=_SHARED_CODE),
            _S("moe.topk_probs", "softmax over the top-k logits, fp32, kept by the softmax", bs * N_r, "fp32",
               shard=tok, modules={"moe"}, note="--no-moe-router-pre-softmax (the renormalised top-k of the softmax, "
                                                "as Mixtral and Qwen3-MoE route); " + _SHARED_CODE),
        ]
        return out + _aux_loss(k, sigmoid, tok)
    out = [
        _S("moe.router_scores", f"router scores {'sigmoid' if sigmoid else 'softmax'}(logits), fp32, kept by the "
           "score function", bs * N, "fp32", shard=tok, modules={"moe"},
           note="--moe-router-dtype fp32: the gating GEMM keeps the bf16 norm output (already counted); " + _SHARED_CODE),
        _S("moe.topk_indices", "top-k expert indices, int64 (kept by the top-k/gather and by the scatter into "
           "[tokens, N])", bs * N_r, "int64", shard=tok, modules={"moe"}, note=_SHARED_CODE),
    ]
    if sigmoid and m.num_experts_per_tok > 1:
        out += [
            _S("moe.topk_scores", "the top-k sigmoid scores, fp32, kept by their normalisation", bs * N_r, "fp32",
               shard=tok, modules={"moe"}, note=_SHARED_CODE),
            _S("moe.topk_denominator", "sum of the top-k scores + 1e-20 per token, fp32", bs, "fp32", shard=tok,
               modules={"moe"}, note=_SHARED_CODE),
        ]
    if m.n_group > 1 and not m.router_bias:
        out.append(_S("moe.group_mask", "group-limited routing: the mask of the experts outside the chosen groups, "
                      "bool (kept by masked_fill)", bs * N, "mask", shard=tok, modules={"moe"},
                      note="with an expert bias the top-k runs on scores + bias, whose values nothing keeps; "
                           + _SHARED_CODE))
    return out + _aux_loss(k, sigmoid, tok)


def _aux_loss(k: Kernels, sigmoid: bool, tok: set) -> list[Saved]:
    """The load-balancing loss's tensors (``--moe-router-load-balancing-type``)."""
    bs = b * s
    out = []
    if k.aux_loss.has_aux_loss:
        seq = k.aux_loss is LoadBalancing.SEQ_AUX_LOSS
        out.append(_S("moe.aux_loss_scores", "router scores recomputed for the load-balancing loss, fp32", bs * N,
                      "fp32", shard=tok, modules={"moe"},
                      note="compute_routing_scores_for_aux_loss runs the score function again; " + _SHARED_CODE))
        if sigmoid:
            out.append(_S("moe.aux_loss_denominator", "their per-token normaliser, fp32", bs, "fp32", shard=tok,
                          modules={"moe"}, note=_SHARED_CODE))
        out += [
            _S("moe.aux_tokens_per_expert", "tokens per expert " + ("and sequence" if seq else "") + ", int64, kept "
               "by the loss's product", (b if seq else 1) * N, "int64", modules={"moe"},
               note=("seq_aux_loss folds the micro-batch into the expert dimension: b N counts; "
                     if seq else "aux_loss: N counts, reduced over TP and CP; ") + _SHARED_CODE),
            _S("moe.aux_loss", "the auxiliary loss, a 0-dim fp32 tensor kept by MoEAuxLossAutoScaler", 1, "fp32",
               modules={"moe"}, note=_SHARED_CODE),
        ]
    return out


def _moe(m: ModelConfig, k: Kernels) -> list[Saved]:
    bs = b * s
    ETP = sym("ETP")
    if m.mlp == "gelu" and m.mlp_bias and k.swiglu_fusion:
        raise ConfigError("bias_swiglu_fusion=True (Megatron's bias_activation_fusion: --bias-gelu-fusion for a GeLU "
                          "model) with GeLU experts and biases: Megatron-Core fuses only SwiGLU and quick-GeGLU in its "
                          "experts (moe/experts.py raises 'Only support fusion of swiglu and quick_gelu'); use "
                          "--no-bias-swiglu-fusion (--no-bias-gelu-fusion)")
    out = _norm("moe", "the MoE block input (residual stream after attention)", h, k, modules={"layernorm"},
                checkpoint_module="layernorm", output_linear=False, layernorm=m.norm == "layernorm",
                output_name="pre-MLP RMSNorm output, input of the router" + (
                    " and the shared experts" if m.has_shared_experts else ""),
                output_note=("kept in bf16: the router's GEMM needs it in high precision, and under FP8 Megatron has "
                             "the shared experts' fc1 keep this original (set_save_original_input); the dispatched "
                             "tokens are a separate copy") if not k.local_norm
                else "kept by the router's GEMM and the shared experts' fc1, and by the moe and shared_experts "
                     "checkpoints as their input; " + _MEASURED)
    if not k.local_norm:
        out[-1] = replace(out[-1], note=out[-1].note + "; kept by the router's GEMM (" + _SHARED_CODE + ") and "
                                                         "the shared experts' fc1 (" + KERNEL_SOURCES["te_linear"] + ")")
    out += _router(m, k)
    out += [
        _S("moe.permute_sort", "argsort of the flattened [N, tokens] routing map, int64, kept whole (its first "
           "b s N_r entries index the probabilities)", bs * N, "int64", shard={"SP", "CP"}, modules={"moe"},
           note="the unfused permute (--moe-permute-fusion off, the default) in moe_utils.permute; " + _SHARED_CODE),
        _S("moe.permute_indices", "token index of each dispatched copy, int64 (kept by the gather and the "
           "un-permute's scatter)", bs * N_r, "int64", shard={"SP", "CP"}, modules={"moe"}, note=_SHARED_CODE),
    ]
    routed = bs * N_r * ETP      # dispatched token copies on one rank, before the SP division by TP
    routed_note = ("the dispatched tokens: each rank's s/TP local tokens times N_r, gathered over ETP; EP moves "
                   "tokens between ranks but does not divide them (balanced routing assumed: with EP > 1 a rank's "
                   "share follows the routing, the sum over the EP group is exact)")
    out += [
        _S("moe.routed.fc1_input", "dispatched tokens, input of the routed experts' fc1", routed * h,
           shard={"SP", "CP"}, modules={"moe"}, linear_input=True, width=h,
           note=routed_note + "; kept by fc1 (" + ("SequentialMLP's ColumnParallelLinear, " + _MEASURED
                                                   if k.local_norm else KERNEL_SOURCES["te_linear"]) + ")"),
        _S("moe.routed.probs", "routing probabilities of the dispatched tokens, fp32 (applied after the "
           "activation)", routed, "fp32", shard={"SP", "CP"}, modules={"moe"}, note=_SHARED_CODE),
    ]
    # width h_E / ETP on the b s N_r ETP / TP dispatched tokens (ETP cancels in the bytes, not in the FP8 tiles)
    if m.mlp == "gelu":
        out += _gelu_experts(routed, k)
    else:
        out += _swiglu("moe.routed", "routed experts'", routed, h_E, {"SP", "CP", "ETP"}, {"moe"},
                       {"moe", "moe_act"}, k, weighted=True,
                       note="moe_act recomputes it from the SwiGLU input (output-discarding checkpoint)")
    if m.n_shared_experts:
        shared_note = ("TP-split like the dense FFN over all s tokens (fc1 gathers its SP input); Megatron's moe_act "
                       "covers the routed experts only")
        if m.mlp == "gelu":
            out += _gelu_mlp("moe.shared", "shared experts'", bs, N_s * h_E, {"moe", "shared_experts"}, k,
                             note=shared_note)
        else:
            out += _swiglu("moe.shared", "shared experts'", bs, N_s * h_E, {"TP", "CP"}, {"moe", "shared_experts"},
                           {"moe", "shared_experts"}, k, note=shared_note)
    return out


def _gelu_experts(routed, k: Kernels) -> list[Saved]:
    """Routed GeLU experts (no --swiglu): fc1's output, the GeLU's input; the GeLU's output, kept by its product
    with the fp32 routing probabilities; that product cast back to the activation dtype, fc2's input (in fp32
    training the cast returns the product itself: still its own tensor).  TEGroupedMLP and SequentialMLP alike
    (moe/experts.py and transformer/mlp.py at the pin: with a GeLU and the probabilities Megatron-Core has no
    fused kernel, so bias_activation_fusion must be off); a bias adds nothing kept: fc1's is added before the
    GeLU (the sum is its input), fc2's is scaled by the probabilities the block already keeps."""
    shard = {"SP", "CP", "ETP"}
    return [
        _S("moe.routed.gelu_input", "routed experts' fc1 output (with its bias), the GeLU's input", routed * h_E,
           shard=shard, modules={"moe"},
           note="F.gelu keeps its input; moe_act's output-discarding checkpoint keeps it as its input; "
                + _SHARED_CODE),
        _S("moe.routed.gelu_output", "routed experts' GeLU output, kept by its product with the routing "
           "probabilities", routed * h_E, shard=shard, modules={"moe", "moe_act"}, note=_SHARED_CODE),
        _S("moe.routed.act_output", "routed experts' weighted GeLU output (cast back from the fp32 product), input "
           "of fc2", routed * h_E, shard=shard, modules={"moe", "moe_act"}, linear_input=True, width=h_E,
           note="the fp32 product itself is freed by the cast; kept by fc2 (" + (
               "SequentialMLP's RowParallelLinear, " + _MEASURED if k.local_norm else KERNEL_SOURCES["te_linear"])
                + "); moe_act recomputes it from the GeLU input"),
    ]


def _gelu_mlp(prefix: str, label: str, tokens, width, modules: set, k: Kernels, *, note: str = "") -> list[Saved]:
    """A GeLU MLP's fc1 output (the GeLU's input; the fused bias-GeLU keeps the same) and its GeLU output, fc2's
    input (TP-split)."""
    return [
        _S(f"{prefix}.gelu_input", f"{label} fc1 output, the GeLU's input", tokens * width, shard={"TP", "CP"},
           modules=modules, note="fused_bias_gelu.py keeps its input and the bias; F.gelu keeps its input: the same "
                                 "bytes; " + _SHARED_CODE),
        _S(f"{prefix}.act_output", f"{label} GeLU output, input of fc2", tokens * width, shard={"TP", "CP"},
           modules=modules, linear_input=True, width=width,
           note=note + ("; " if note else "") + "kept by fc2 (" + ("ColumnParallelLinear/RowParallelLinear, "
                + _MEASURED if k.local_norm else KERNEL_SOURCES["te_linear"]) + ")"),
    ]


# ------------------------------------------------------------------------------------------------
# grouped-query attention, the GeLU MLP and LayerNorm (Megatron-Core's GPT layer spec with TE)
# ------------------------------------------------------------------------------------------------
_FROM_CODE = f"read from megatron-core {MCORE_VERSION}'s and Transformer Engine's code, not measured"


def _layernorm_mu(prefix: str, what: str, m: ModelConfig, shard=frozenset({"SP", "CP"}), modules=(),
                  keep_full: bool = False) -> list[Saved]:
    """TE's LayerNorm keeps the mean per token (fp32) beside rsigma; an RMSNorm has none."""
    if m.norm != "layernorm":
        return []
    return [_S(f"{prefix}.norm_mu", f"{what}: the LayerNorm's mean per token, fp32", b * s, "fp32", shard=shard,
               modules=modules, keep_full=keep_full, note=KERNEL_SOURCES["te_layernorm_linear"] + "; " + _FROM_CODE)]


def _gqa_attention(m: ModelConfig, k: Kernels) -> list[Saved]:
    """Grouped-query (or multi-head) attention on the Transformer Engine path: the input norm fused into
    linear_qkv (TELayerNormColumnParallelLinear keeps its input, rsigma (and mu) and ln_out), q, k, v after
    the fused RoPE, the attention kernel's output and, for flash/fused attention, the fp32 softmax
    statistics (or, unfused, the s x s probabilities), the output projection's input."""
    if k.tp > m.num_key_value_heads:
        raise ConfigError(f"tp={k.tp} > num_key_value_heads={m.num_key_value_heads}: Megatron-Core all-gathers the "
                          f"QKV output and replicates a key-value group; the megatron activation ledger does not "
                          f"count that yet (use tp <= num_key_value_heads)")
    if k.local_norm:
        return _gqa_local(m, k)
    bs = b * s
    n_kv, d_head = sym("n_kv"), sym("d_head")
    te = KERNEL_SOURCES["te_layernorm_linear"]
    out = [
        _S("attention.norm_input", "the layer input (residual stream), kept by the norm fused into linear_qkv",
           bs * h, shard={"SP", "CP"}, keep_full=True, note=te + "; " + _FROM_CODE),
        _S("attention.norm_rstd", "the input norm's 1/rms (1/std) per token, fp32", bs, "fp32", shard={"SP", "CP"},
           modules={"layernorm"}, note=te),
    ] + _layernorm_mu("attention", "the layer input", m, modules={"layernorm"}) + [
        _S("attention.norm_output", "input norm output (ln_out), input of linear_qkv", bs * h, shard={"SP", "CP"},
           modules={"layernorm"}, linear_input=True, width=h, note=te),
    ]
    if m.qk_norm:
        out += [
            _S("attention.qkv_output", "linear_qkv output [q; k; v] per group, kept by the q/k layernorms (their "
               "inputs are views of it)", bs * (sym("n_h") + 2 * n_kv) * d_head, shard={"TP", "CP"},
               note="q_layernorm and k_layernorm (TENorm over d_head) run on views of mixed_qkv; " + _FROM_CODE),
            _S("attention.qk_norm_rstd", "the q and k layernorms' 1/rms per head and token, fp32",
               bs * (sym("n_h") + n_kv), "fp32", shard={"TP", "CP"}, note=KERNEL_SOURCES["te_rmsnorm"]),
        ]
    if k.backend.keeps_scores(k.impl):
        qkv_note = "kept by the batched matmuls Q K^T and P V: " + KERNEL_SOURCES["te_unfused_attention"]
    elif k.backend is AttnBackend.FLASH:
        qkv_note = "saved by flash attention as its inputs: " + KERNEL_SOURCES["flash_attention"]
    else:
        qkv_note = ("saved by the fused attention kernel as its inputs: " + KERNEL_SOURCES["te_fused_attention"])
    qkv_note += ("; q and k are new tensors (the fused RoPE's outputs; it keeps only the cached frequencies), v a "
                 "slice of linear_qkv's output counted as its own tensor; " + _FROM_CODE)
    out += [
        _S("attention.q", "queries after RoPE, input of the attention kernel", bs * n_h * d_head, shard={"TP", "CP"},
           note=qkv_note),
        _S("attention.k", "keys after RoPE (n_kv heads), input of the attention kernel", bs * n_kv * d_head,
           shard={"TP", "CP"}, note=qkv_note),
        _S("attention.v", "values (n_kv heads), input of the attention kernel", bs * n_kv * d_head,
           shard={"TP", "CP"}, note=qkv_note),
        _S("attention.attn_mask_type", "the mask type, kept as a one-element int32 tensor by the core-attention "
           "checkpoint", 1, "int32", only_when={"core_attn"}, note=_SHARED_CODE),
    ]
    if k.backend.keeps_scores(k.impl):
        out.append(_S("attention.softmax_out", "softmax probabilities [b, n_h, s, s]", b * n_h * s * s,
                      shard={"TP", "CP"}, modules={"core_attn"}, note=KERNEL_SOURCES["te_unfused_attention"],
                      saves=2))       # the fused softmax (ctx.save_for_backward) and P V (torch.bmm) each save them
    else:
        out.append(_S("attention.softmax_lse", "softmax statistics (log-sum-exp per query and head), fp32",
                      b * n_h * s, "fp32", shard={"TP", "CP"}, modules={"core_attn"},
                      note="flash/fused attention keeps no s^2 tensor: " + KERNEL_SOURCES["flash_attention"]))
    out.append(_S("attention.context", "attention output, kept by the kernel and as the input of linear_proj",
                  bs * n_h * d_head, shard={"TP", "CP"}, linear_input=True, width=n_h * d_head,
                  note=qkv_note + "; " + KERNEL_SOURCES["te_linear"]))
    return out


def _gqa_local(m: ModelConfig, k: Kernels) -> list[Saved]:
    """Grouped-query (or multi-head) attention on the local path (``torch.nn.RMSNorm``/``LayerNorm``,
    ColumnParallelLinear, unfused RoPE, Megatron-Core's DotProductAttention), measured on the CPU.

    linear_qkv's output [q; k; v] (one tensor per key-value group) is split into views; reshaping q to its
    n_h heads copies it when a rank holds more than one group and a group more than one query head (the
    group's k and v lie between its queries and the next group's), and so does the attention's own reshape
    of a q that is still a view to [s, b n_h, d_head] when b > 1 (one group per rank, no RoPE: the GPT).
    RoPE (or the q/k RMSNorms of Qwen3) makes q and k new tensors; v stays a view.  The local DotProductAttention repeats k
    and v over the query heads of a group (``repeat_interleave``: copies) when n_kv < n_h, and keeps q,
    the (repeated) k and v and the s x s probabilities through its batched matmuls.  So the whole linear_qkv
    output stays alive exactly when a view of it is kept: q and k without RoPE or q/k norms, v in multi-head
    attention (not repeated), v as an input of the core-attention checkpoint, or the fp32 q/k norms' inputs
    (in fp32 training the norm's upcast is the input itself)."""
    bs = b * s
    n_kv, d_head = sym("n_kv"), sym("d_head")
    ln = m.norm == "layernorm"
    rope = m.positions == "rope"
    mha = m.num_key_value_heads == m.num_attention_heads
    new_qk = rope or m.qk_norm
    q_copy = not mha and m.num_key_value_heads > k.tp      # query.reshape(s, b, n_h / TP, d_head) copies
    tok, head = {"SP", "CP"}, {"TP", "CP"}
    out = _norm("attention", "the layer input (residual stream)", h, k, keep_input=True, modules={"layernorm"},
                checkpoint_module="layernorm", layernorm=ln,
                output_name="input norm output, input of linear_qkv",
                output_note="kept by linear_qkv (ColumnParallelLinear); " + _MEASURED)
    if not ln and k.composite_rms_norm:   # (the fused norm's kept input is the layer input itself)
        out.append(_S("attention.layer_input", "the layer input, kept by the layer's checkpoint (full recomputation)",
                      bs * h, shard=tok, only_when={"full"}, keep_full=True, note=_MEASURED))
    qkv = bs * (n_h + 2 * n_kv) * d_head
    qkv_kept = mha or (m.qk_norm and k.norm_keeps_input)
    # q still a view when it reaches the attention, not repeated: Q K^T keeps that view with b = 1; with
    # b > 1 the attention's reshape copies it
    q_view = not (new_qk or q_copy or mha)
    if qkv_kept:
        out.append(_S("attention.qkv_output", "linear_qkv output [q; k; v] per key-value group, kept whole while a "
                      "view of it is kept", qkv, shard=head,
                      note="kept by " + ("the batched matmuls' views of v (and of q and k without RoPE): n_kv = n_h, "
                                         "nothing repeated" if mha else
                                         "the q/k RMSNorms, whose kept input (fp32 training, or the GPU's fused kernel) is a view of it") + "; " + _MEASURED))
    else:
        if q_view:
            out.append(_S("attention.qkv_output", "linear_qkv output [q; k; v], kept whole by Q K^T's view of q "
                          "(b = 1)", sp.Piecewise((qkv, sp.Eq(b, 1)), (0, True)), shard=head, note=_MEASURED))
        out.append(_S("attention.qkv_output_checkpointed", "linear_qkv output [q; k; v], kept whole by the "
                      "core-attention checkpoint, whose input v is a view of it",
                      sp.Piecewise((qkv, b > 1), (0, True)) if q_view else qkv, shard=head,
                      only_when={"core_attn"}, note=_MEASURED))
    if m.qk_norm:
        # the CPU's composite norm keeps an fp32 upcast (the input itself in fp32 training) and the normalised
        # fp32 values; the GPU's fused kernel keeps its input itself (read from the kernel: no GPU case has q/k
        # norms) and the fp32 1/rms
        norm_note = _MEASURED if k.composite_rms_norm else KERNEL_SOURCES["torch_fused_rms_norm"]
        for x, heads in (("q", n_h), ("k", n_kv)):
            if not k.norm_keeps_input:
                out.append(_S(f"attention.{x}_norm_input_fp32", f"{x} per head, upcast to fp32 by its RMSNorm",
                              bs * heads * d_head, "fp32", shard=head, note=_MEASURED))
            elif x == "q" and q_copy:
                out.append(_S("attention.q_norm_input", "q per head (the reshape's copy), kept by its RMSNorm (no "
                              "upcast copy)", bs * heads * d_head, shard=head, note=norm_note))
            out.append(_S(f"attention.{x}_norm_rstd", f"{x}'s RMSNorm: 1/rms per head and token, fp32", bs * heads,
                          "fp32", shard=head, note=norm_note))
            if k.composite_rms_norm:
                out.append(_S(f"attention.{x}_norm_normalized", f"{x} normalised per head, fp32 (kept by the product "
                              "with the weight)", bs * heads * d_head, "fp32", shard=head, note=_MEASURED))
    if rope:
        out.append(_S("attention.rope_tables", "RoPE cos and sin [s, 1, 1, d_head], for the queries and for the keys "
                      "(four tables), kept by the RoPE products", 4 * s * d_head, shard={"CP"},
                      note="--no-rope-fusion (the CPU); " + _MEASURED))
    if new_qk or q_copy:
        out += [
            _S("attention.q", "queries after RoPE (or the q norm, or the reshape's copy), input of Megatron-Core's "
               "DotProductAttention",
               bs * n_h * d_head, shard=head, note="kept by Q K^T, and by the core-attention checkpoint; " + _MEASURED)]
    if q_view:
        out.append(_S("attention.q", "queries, copied by the attention's reshape to [s, b n_h, d_head] (b > 1), "
                      "kept by Q K^T", sp.Piecewise((bs * n_h * d_head, b > 1), (0, True)), shard=head,
                      modules={"core_attn"}, note=_MEASURED))
    if new_qk:
        out += [
            _S("attention.k", "keys after RoPE (or the k norm), n_kv heads", bs * n_kv * d_head, shard=head,
               only_when=() if mha else {"core_attn"},
               note=("kept by Q K^T (not repeated: n_kv = n_h)" if mha else
                     "kept only by the core-attention checkpoint (Q K^T keeps the repeated copy)") + "; " + _MEASURED),
        ]
    if not mha:
        out += [
            _S("attention.k_repeated", "keys repeated over each group's query heads (repeat_interleave), kept by Q K^T",
               bs * n_h * d_head, shard=head, modules={"core_attn"}, note=_MEASURED),
            _S("attention.v_repeated", "values repeated over each group's query heads, kept by P V",
               bs * n_h * d_head, shard=head, modules={"core_attn"}, note=_MEASURED),
        ]
    out += [
        _S("attention.attn_mask_type", "the mask type, kept as a one-element int32 tensor by the core-attention "
           "checkpoint", 1, "int32", only_when={"core_attn"}, note=_SHARED_CODE),
        _S("attention.softmax_out", "softmax probabilities [b, n_h, s, s]", b * n_h * s * s, shard=head,
           modules={"core_attn"}, note="Megatron-Core's FusedScaleMaskSoftmax unfused (torch) path; " + _MEASURED,
           saves=1 if k.softmax_fp32 and not k.fp32 else 2),   # softmax and P V save it (one fp32 copy apart)
    ]
    if k.softmax_fp32 and not k.fp32:
        out.append(_S("attention.softmax_fp32", "softmax probabilities in fp32 (--attention-softmax-in-fp32), "
                      "kept by the softmax beside the copy P V keeps (the torch path)", _local_softmax_fp32(n_h, k),
                      "fp32", shard=head, modules={"core_attn"},
                      note="measured on the CPU; on a GPU the fused kernel keeps none: " + _MEASURED))
    out.append(_S("attention.context", "attention output, input of linear_proj", bs * n_h * d_head, shard=head,
                  linear_input=True, width=n_h * d_head, note="kept by linear_proj (RowParallelLinear); " + _MEASURED))
    return out


def _gelu_dense(m: ModelConfig, k: Kernels) -> list[Saved]:
    """The classic GPT MLP on the TE path: the norm fused into fc1, the fused bias-GeLU's input and its output
    (fc2's input)."""
    bs = b * s
    if k.local_norm:
        out = _norm("dense_ffn", "the FFN block input (residual stream after attention)", h, k, modules={"layernorm"},
                    checkpoint_module="layernorm", output_modules={"layernorm"},
                    output_name="pre-MLP norm output, input of fc1", layernorm=m.norm == "layernorm",
                    output_note="kept by fc1, and by the mlp checkpoint as its input; " + _MEASURED)
        return out + [
            _S("dense_ffn.gelu_input", "fc1 output (before its bias), the GeLU's input", bs * h_F, shard={"TP", "CP"},
               modules={"mlp"}, note="the fused bias-GeLU (fused_bias_gelu.py, an autograd Function) keeps its input "
                                     "and the bias (a parameter); unfused, F.gelu keeps the biased sum: the same "
                                     "bytes; " + _MEASURED),
            _S("dense_ffn.act_output", "GeLU output, input of fc2", bs * h_F, shard={"TP", "CP"}, modules={"mlp"},
               linear_input=True, width=h_F, note="kept by fc2 (RowParallelLinear); " + _MEASURED),
        ]
    out = _norm("dense_ffn", "the FFN block input (residual stream after attention)", h, k, modules={"mlp"},
                output_name="norm output, input of fc1", te_source="te_layernorm_linear",
                output_note="ln_out of the norm fused into fc1: " + KERNEL_SOURCES["te_layernorm_linear"])
    out[1:1] = _layernorm_mu("dense_ffn", "the FFN block input", m, modules={"mlp"})
    out += [
        _S("dense_ffn.gelu_input", "fc1 output, the fused bias-GeLU's input", bs * h_F, shard={"TP", "CP"},
           modules={"mlp"}, note="fused_bias_gelu.py keeps its input and the bias; " + _FROM_CODE),
        _S("dense_ffn.act_output", "GeLU output, input of fc2", bs * h_F, shard={"TP", "CP"}, modules={"mlp"},
           linear_input=True, width=h_F, note=KERNEL_SOURCES["te_linear"]),
    ]
    return out


def _qwen2_shared(m: ModelConfig, k: Kernels) -> list[Saved]:
    """Qwen2-MoE's shared expert (width h_S, TP-split) and its sigmoid gate (SharedExpertMLP with
    use_shared_expert_gate: the gate logits' sigmoid output, one per token, kept by the product)."""
    bs = b * s
    out = _swiglu("moe.shared", "shared expert's", bs, sym("h_S"), {"TP", "CP"}, {"moe", "shared_experts"},
                  {"moe", "shared_experts"}, k, note="TP-split like the dense FFN over all s tokens")
    out += [
        _S("moe.shared.gate_sigmoid", "the shared expert's gate, sigmoid(x W^{gate}_S), kept by the product", bs,
           shard={"SP", "CP"}, modules={"moe", "shared_experts"}, note="shared_experts.py; " + _FROM_CODE),
        _S("moe.shared.output", "the shared expert's output, kept by the product with its gate", bs * h,
           shard={"SP", "CP"}, modules={"moe", "shared_experts"}, note="shared_experts.py; " + _FROM_CODE),
    ]
    return out
