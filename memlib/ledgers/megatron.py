"""The ``megatron`` activation ledger: what Megatron-Core saves for backward, per kernel choice.

A DeepSeek-V3-style ``GPTModel`` of megatron-core 0.19.2 (MLA with the latent RMSNorms, YaRN RoPE,
dense and MoE layers, shared experts, fp32 router with expert bias and group-limited top-k, alltoall
dispatch, SwiGLU, RMSNorm, MTP), trained with Megatron-LM's command-line defaults.  The kernel
choices are fields of :class:`~memlib.config.TrainingConfig`, typed in :mod:`memlib.config.strategies`, named
after Megatron-LM's own arguments:

``transformer_impl=local`` (``--transformer-impl local``)
    Megatron-Core's own modules: ``torch.nn.RMSNorm``, ``ColumnParallelLinear`` and
    ``DotProductAttention``.  **Measured**: :mod:`memlib.measure.megatron` runs them on the CPU and
    this ledger (``runtime=cpu``) equals, to the byte, what autograd holds at the end of the forward pass,
    for every recompute policy megatron-core runs there; on an H200 (``runtime=cuda``, the default) whole
    training steps were measured against the peak (``benchmarks/gpu_peaks.py``).  On the CPU
    ``torch.nn.RMSNorm`` keeps an fp32 copy of its input, the fp32 ``1/rms`` and the fp32 normalised values;
    on a GPU torch's fused kernel keeps its input itself and the fp32 ``1/rms``.  The attention keeps q, k, v, the
    ``[b, n_h, s, s]`` probabilities (in bf16 unless ``--attention-softmax-in-fp32``, which adds an
    fp32 copy) and the dataset's ``[b, 1, s, s]`` bool mask once; RoPE keeps cos and sin twice per
    layer.  The CPU runs with ``--no-rope-fusion`` and ``--no-masked-softmax-fusion`` (their kernels
    need a GPU); on a GPU with those fusions the RoPE tables and the mask differ (see the notes).
``transformer_impl=transformer_engine`` (the default)
    Transformer Engine's fused RMSNorm (input and an fp32 ``rsigma`` per token), fused norm + linear,
    and for ``attention_backend`` ``auto``/``flash``/``fused`` flash or cuDNN attention (q, k, v, the
    output and an fp32 softmax statistic per query and head, no ``s x s`` tensor).  Not measurable on
    the CPU: every entry that differs from the local path cites the kernel source that defines what it
    saves in its ``note``.  ``unfused`` (TE's) and ``local`` (Megatron-Core's) attention backends keep
    the ``s x s`` probabilities.

The other families (:data:`memlib.config.FAMILIES`: grouped-query and multi-head attention, q/k RMSNorms,
biases, LayerNorm, learned positions, the GeLU MLP, Mixtral/Qwen-style routing, Qwen2-MoE's gated shared
expert) are measured on the local path too, to the byte (:func:`_gqa_local`); on the TE path their
entries are read from the code.

Both paths share Megatron-Core's own code for what is not a TE kernel, measured on the CPU: the router
(``--moe-router-fusion`` off, the default), the unfused permutation (``--moe-permute-fusion`` off, the
default), the SwiGLU (fused by default, ``--no-bias-swiglu-fusion`` unfuses it), the experts'
probability weighting, the vocab-parallel cross-entropy (or its native fusion), the MTP loss, the
checkpoints of every recompute module and of full recomputation, and ``pretrain_gpt.py``'s
``loss_func``.

:func:`megatron_layer` without kernel choices is the Transformer Engine default.
"""
from __future__ import annotations

from dataclasses import replace

import sympy as sp

from .base import ActProfile, Saved, renamed, saved as _S
from ..config import ModelConfig, TrainingConfig
from ..config.strategies import AttnBackend
from ..core.symbols import sym, b, s, h, v
from .megatron_blocks import (KERNEL_SOURCES, TE_DEFAULT, Kernels, _FROM_CODE, _MEASURED, _SHARED_CODE, _attention,
                              _dense, _gelu_dense, _gqa_attention, _layernorm_mu, _moe, _norm, _qwen2_shared)

__all__ = ["megatron_layer", "megatron_head", "megatron_embedding", "megatron_mtp", "bind", "MEGATRON_PROFILE",
           "te_attention_backend"]


_DROPOUT_SOURCE = ("--hidden-dropout > 0: the bias-dropout-add (megatron/core/fusions/fused_bias_dropout.py:69-73, "
                   "@jit_fuser, i.e. torch.compile) saves one bool mask of the residual stream per call (Inductor's "
                   "partition, torch 2.13; unfused, CUDA's native_dropout saves the same bool mask); p = 0 saves none")


def _bda_mask(prefix: str, what: str) -> Saved:
    """The dropout mask of one bias-dropout-add (or of the embedding's dropout): bool, the residual stream's shape."""
    return _S(f"{prefix}.dropout_mask", f"{what}: the dropout mask [s, b, h], bool", b * s * h, "mask",
              shard={"SP", "CP"}, note=_DROPOUT_SOURCE)


def _attention_extras(att: list[Saved], k: Kernels) -> list[Saved]:
    """What the attention keeps beyond the block's own entries, by kernel: attention dropout on the s x s
    probabilities (a bool mask and the dropped probabilities that P V keeps, beside the softmax's own output:
    ``torch.nn.Dropout``, TE backends.py:357,660 at v2.18, the local DotProductAttention likewise; flash and fused
    attention drop inside the kernel, an RNG state only); TE's flash-attn path (the kernel's bshd output beside
    the sbhd copy linear_proj keeps); with all-to-all context parallelism TE (>= 2.8) the attention output before
    the post-attention all-to-all beside the one linear_proj keeps (context_parallel.py:4473,4482,4560-4563 at
    v2.18)."""
    out: list[Saved] = []
    last_probs = max((i for i, e in enumerate(att) if e.key in ("attention.softmax_out", "attention.softmax_fp32")),
                     default=None)
    for i, e in enumerate(att):
        if e.key == "attention.context" and k.backend is AttnBackend.FLASH and not k.local_norm:
            # one sequence per micro-batch: [1, s, hd] transposed to [s, 1, hd] is already contiguous, so
            # .contiguous() returns the kernel's output itself and linear_proj keeps that one tensor
            out.append(replace(e, key="attention.flash_out", linear_input=False, fp8_exception="", width=None,
                               modules=frozenset({"core_attn"}), elements=e.elements * sp.Min(1, b - 1),
                               name="the flash kernel's [b, s, n_h, d] output, kept by flash-attn",
                               note="TE's FlashAttention runs flash-attn on bshd tensors: it makes sbhd q, k, v "
                                    "bshd copies (which flash-attn keeps) and returns its output transposed back and "
                                    ".contiguous() (attention/dot_product_attention/backends.py FlashAttention.forward, "
                                    "v2.12), the copy linear_proj keeps: two output-sized tensors where b > 1; with "
                                    "b = 1 the transposed output is contiguous already and .contiguous() returns it "
                                    "(backends.py:1131-1139 at v2.12): one tensor, so none here"))
        if e.key == "attention.context" and k.cp_a2a:
            out.append(replace(e, key="attention.context_pre_a2a", linear_input=False, fp8_exception="", width=None,
                               modules=frozenset({"core_attn"}),
                               name="attention output before the post-attention all-to-all (CP a2a), kept by TE's "
                                    "AttnFuncWithCPAndQKVOA2A",
                               note="TE >= 2.8 saves out_part, the output before the all-to-all; linear_proj keeps the "
                                    "one after (attention/dot_product_attention/context_parallel.py:4473,4482,4560 "
                                    "at v2.18; v2.7 saved the post-all-to-all output, :3431)"))
        out.append(e)
        if i == last_probs and k.attention_dropout:
            src = "torch.nn.Dropout on the probabilities (TE backends.py:357,660 at v2.18; CUDA native_dropout)"
            out += [
                _S("attention.probs_dropout_mask", "attention dropout mask [b, n_h, s, s], bool",
                   b * sym("n_h") * s * s, "mask", shard={"TP", "CP"}, modules={"core_attn"}, note=src),
                _S("attention.probs_dropped", "the probabilities after dropout, kept by P V", b * sym("n_h") * s * s,
                   shard={"TP", "CP"}, modules={"core_attn"}, note=src),
            ]
    return out


def te_attention_backend(compute_capability: int, *, deterministic: bool, dropout: bool,
                         minor: int = 0, te_version: tuple[int, int] | None = None) -> AttnBackend:
    """The kernel Transformer Engine's ``--attention-backend auto`` runs for causal bf16 training attention in the
    sbhd format (TE v2.12 attention/dot_product_attention/utils.py ``get_attention_backend``; common/fused_attn/
    fused_attn.cpp ``nvte_get_fused_attn_backend``): cuDNN's fused attention (``fused``) is preferred from Hopper
    on (utils.py: "Disabling FlashAttention to give FusedAttention preference on Hopper+"); below sm90 deterministic
    training disables it ("for determinism reasons") and flash-attn wins when both run (it is taken first); on
    sm100 and later the fused kernel's deterministic backward needs attention dropout 0 (fused_attn.cpp:451-456),
    so deterministic training with dropout runs flash-attn.  Deterministic: ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``.

    ``te_version`` below (1, 3) is Transformer Engine 1.2.x (the NGC 24.01 container's,
    :func:`memlib.config.versions.container_rules`): deterministic training disables flash-attn 2 whatever its
    version (TE v1.2 transformer_engine/pytorch/attention.py:2005-2011) and, below sm90, cuDNN's arbitrary-sequence
    fused attention (attention.py:2377-2381), so it runs the unfused attention below Hopper; TE 1.3 and later
    keep flash-attn from 2.4.1 on.

    >>> te_attention_backend(8, deterministic=False, dropout=True).value
    'flash'
    >>> te_attention_backend(9, deterministic=True, dropout=True).value
    'fused'
    >>> te_attention_backend(10, deterministic=True, dropout=True).value
    'flash'
    >>> te_attention_backend(8, deterministic=True, dropout=True, te_version=(1, 2)).value
    'unfused'
    """
    if te_version is not None and te_version < (1, 3) and deterministic and (compute_capability, minor) < (9, 0):
        return AttnBackend.UNFUSED
    if (compute_capability, minor) < (9, 0):
        return AttnBackend.FLASH
    if compute_capability >= 10 and deterministic and dropout:
        return AttnBackend.FLASH
    return AttnBackend.FUSED


def megatron_layer(m: ModelConfig, kind: str, k: Kernels = TE_DEFAULT) -> list[Saved]:
    """The megatron profile's ledger of one decoder layer of ``kind`` under kernel choices ``k``."""
    att = _attention_extras(_attention(m, k) if m.attention == "mla" else _gqa_attention(m, k), k)
    if k.hidden_dropout:
        att.append(_bda_mask("attention", "after the attention block's bias-dropout-add"))
    if kind == "moe":
        ffn = _moe(m, k)
        if m.moe == "qwen2_moe":
            ffn += _qwen2_shared(m, k)
        if m.norm == "layernorm" and not k.local_norm:
            ffn[1:1] = _layernorm_mu("moe", "the MoE block input", m, modules={"layernorm"})
    elif m.mlp == "gelu":
        ffn = _gelu_dense(m, k)
    else:
        ffn = _dense(m, k)
        if m.norm == "layernorm" and not k.local_norm:
            ffn[1:1] = _layernorm_mu("dense_ffn", "the FFN block input", m, modules={"mlp"})
    if k.hidden_dropout:
        ffn.append(_bda_mask("mlp_bda", "after the MLP block's bias-dropout-add"))
    return att + ffn


# ------------------------------------------------------------------------------------------------
# inputs, head and loss, MTP
# ------------------------------------------------------------------------------------------------
def megatron_embedding(m: ModelConfig, k: Kernels = TE_DEFAULT) -> list[Saved]:
    """The token ids (kept by the embedding) and the dataset's attention mask where something keeps it."""
    out = [_S("embedding.token_ids", "input token ids (for the embedding's backward)", b * s, "int64",
              shard={"CP"}, keep_full=True,
              note="with TP > 1 the vocab-parallel embedding keeps its own shifted copy instead: the same bytes; "
                   + _SHARED_CODE),
           _vocab_mask("embedding")]
    if m.positions == "learned":
        out.append(_S("embedding.position_ids", "position ids (for the learned position embedding's backward)", b * s,
                      "int64", shard={"CP"}, keep_full=True, note="language_model_embedding.py; " + _FROM_CODE))
    if m.attention == "gqa" and m.positions == "rope" and k.policy.full:
        out.append(_S("embedding.rope_freqs", "RoPE angles [s, 1, 1, d_head], fp32, one tensor for every layer",
                      s * sym("d_head"), "fp32", shard={"CP"}, keep_full=True,
                      note="GPTModel computes them once and hands them to every layer; each fully recomputed layer's "
                           "checkpoint keeps them as an input (counted here once; a later pipeline stage keeps its "
                           "own); " + _MEASURED))
    mask_kept = k.backend.keeps_scores(k.impl) and k.backend.is_local(k.impl)
    if mask_kept or k.policy.full or "core_attn" in k.policy.modules:
        out.append(_S("embedding.attention_mask", "the dataset's attention mask [b, 1, s, s], bool, one tensor "
                      "for every layer", b * s * s, "mask", shard={"CP"}, keep_full=True,
                      note=("kept by the local attention's masked_fill" if mask_kept else
                            "kept as an input by the core-attention and layer checkpoints (the fused kernels ignore "
                            "it under the causal mask type)")
                      + "; pretrain_gpt.py passes the GPT dataset's default mask (create_attention_mask) to the first "
                        "and last pipeline stages; " + _MEASURED))
    if k.hidden_dropout:
        out.append(replace(_bda_mask("embedding", "the embedding's dropout"), keep_full=True,
                           note="LanguageModelEmbedding's torch.nn.Dropout(hidden_dropout) "
                                "(models/common/embeddings/language_model_embedding.py:153-156): CUDA's native_dropout "
                                "saves a bool mask of its output's shape"))
    return out


def _vocab_mask(prefix: str) -> Saved:
    """With TP > 1, VocabParallelEmbedding zeroes the rows of tokens outside its vocabulary shard by
    a boolean index (tensor_parallel/layers.py), which keeps that mask."""
    TP = sym("TP")
    return _S(f"{prefix}.vocab_mask", "tokens outside this rank's vocabulary shard, bool (TP > 1 only)",
              sp.Piecewise((b * s, sp.StrictGreaterThan(TP, 1)), (0, True)), "mask", shard={"CP"}, keep_full=True,
              note="kept by output_parallel[input_mask, :] = 0; " + _MEASURED + " (TP = 2)")


def _loss(prefix: str, k: Kernels) -> list[Saved]:
    bs = b * s
    if k.ce_fusion and not k.ce_impl.keeps_fp32_softmax(True):
        return [_S(f"{prefix}.loss_grad", "logits overwritten with their gradient by TE's fused cross-entropy",
                   bs * v, shard={"TP", "CP"}, keep_full=True,
                   note="--cross-entropy-loss-fusion --cross-entropy-fusion-impl te (Megatron-LM core_v0.19.0 refuses "
                        "the combination for stability; megatron-core accepts it): " + KERNEL_SOURCES["te_cross_entropy"])]
    fusion = "the native fused kernel (fusions/fused_cross_entropy.py) saves the same; " if k.ce_fusion else ""
    return [
        _S(f"{prefix}.loss_softmax", "cross-entropy softmax of the logits, fp32", bs * v, "fp32",
           shard={"TP", "CP"}, keep_full=True,
           note="vocab-parallel cross-entropy casts the logits to fp32 and keeps the softmax; the bf16 logits "
                "are freed after the cast (the output layer does not keep its output); " + fusion + _SHARED_CODE),
        _S(f"{prefix}.target_mask", "cross-entropy: whether each target falls outside this rank's vocabulary "
           "shard, bool", bs, "mask", shard={"CP"}, keep_full=True, note=_SHARED_CODE),
        _S(f"{prefix}.targets", "target token ids (masked to this rank's shard), int64", bs, "int64",
           shard={"CP"}, keep_full=True, note=_SHARED_CODE),
    ]


def megatron_head(prefix: str = "head", k: Kernels = TE_DEFAULT, *, mtp: bool = False,
                  layernorm: bool = False) -> list[Saved]:
    """Final RMSNorm (``layernorm``: LayerNorm), the output layer's input and the loss (for an MTP module:
    ``mtp=True``, whose final norm runs inside its full-recomputation checkpoint)."""
    bs = b * s
    out = _norm(prefix, "final norm input", h, k, keep_all=not mtp, output=False, layernorm=layernorm)
    out.append(_S(f"{prefix}.input", "final RMSNorm output, input of the output layer", bs * h, shard={"SP", "CP"},
                  keep_full=True,
                  note="the output head stays in bf16 (DeepSeek-V3 report §3.3): not FP8-cached; with MTP the main "
                       "and MTP final hidden states are one concatenated tensor, chunked for the output layer; the "
                       "output layer is Megatron-Core's ColumnParallelLinear on both paths; " + _SHARED_CODE))
    out += _loss(prefix, k)
    if not mtp:
        out.append(_S(f"{prefix}.loss_mask", "the loss mask [b, s], fp32, kept by pretrain_gpt.py's loss_func "
                      "(losses * loss_mask)", bs, "fp32", shard={"CP"}, keep_full=True, note=_MEASURED))
    return out


def megatron_mtp(m: ModelConfig, j: int, k: Kernels = TE_DEFAULT) -> list[Saved]:
    """MTP module ``j``: its embedding, norms and projection, its decoder layer (typed like the last
    decoder layer, as Megatron-Core builds it), its head and loss.  Under full recomputation the module
    is one checkpoint (concatenation, layer and final norm) that keeps its two inputs; under block
    recomputation Megatron-Core does not recompute it."""
    bs = b * s
    kind = m.layer_kinds[-1]
    own = [_S("mtp.token_ids", "shifted token ids of the MTP embedding, int64", bs, "int64", shard={"CP"},
              keep_full=True, note="rolled by one token, kept by the shared embedding; " + _SHARED_CODE),
           _vocab_mask("mtp")]
    if k.hidden_dropout:    # the MTP layer runs the shared embedding (and its dropout) on the shifted tokens
        own.append(replace(_bda_mask("mtp.embedding", "the MTP embedding's dropout"), keep_full=True))
    if k.local_norm:
        own += _norm("mtp.enorm", "embedding of the shifted tokens", h, k, output=False)
        own += _norm("mtp.hnorm", "the main model's final hidden state", h, k, output=False)
        own += [
            _S("mtp.embedding_input", "embedding of the shifted tokens, kept by the MTP checkpoint", bs * h,
               shard={"SP", "CP"}, only_when={"full"}, keep_full=True, note=_MEASURED),
            _S("mtp.hidden_input", "the main model's final hidden state, kept by the MTP checkpoint", bs * h,
               shard={"SP", "CP"}, only_when={"full"}, keep_full=True),
        ]
    else:
        te = KERNEL_SOURCES["te_rmsnorm"]
        own += [
            _S("mtp.enorm_input", "embedding of the shifted tokens, input of the MTP's embedding RMSNorm (and of "
               "the MTP checkpoint)", bs * h, shard={"SP", "CP"}, keep_full=True, note=te),
            _S("mtp.hnorm_input", "the main model's final hidden state, input of the MTP's hidden-state RMSNorm (and "
               "of the MTP checkpoint)", bs * h, shard={"SP", "CP"}, keep_full=True,
               note="its own tensor: the output layer keeps a chunk of the concatenated [main; MTP] hidden states, "
                    "a copy (multi_token_prediction.py torch.cat); " + te),
            _S("mtp.norms_rstd", "the two MTP input RMSNorms' 1/rms per token, fp32", 2 * bs, "fp32",
               shard={"SP", "CP"}, note=te),
        ]
    own.append(_S("mtp.eh_proj_input", "concatenated normalised embedding and hidden state, input of the projection M",
                  bs * 2 * h, shard={"SP", "CP"}, linear_input=True, width=2 * h,
                  note="a new tensor (torch.cat) kept by the projection; " + _SHARED_CODE))
    block = [renamed(replace(e, keep_full=False), "mtp." + e.key) for e in megatron_layer(m, kind, k)
             if "full" not in e.only_when]
    tail = megatron_head("mtp.head", k, mtp=True) + [
        _S("mtp.head.loss_mask", "the loss mask rolled by one token for this module, fp32", bs, "fp32", shard={"CP"},
           keep_full=True, note="process_mtp_loss: mtp_loss = loss_mask * mtp_loss; " + _SHARED_CODE),
        _S("mtp.head.scaled_loss", "the scaled per-token MTP loss, fp32, kept by MTPLossAutoScaler", bs, "fp32",
           shard={"CP"}, keep_full=True, note=_SHARED_CODE),
        _S("mtp.head.num_tokens", "the count of unmasked tokens (clamped), a 0-dim fp32 tensor kept by the division",
           1, "fp32", keep_full=True, note=_SHARED_CODE),
    ]
    out = own + block + tail
    if k.block_recompute:     # "recompute_method == 'block' is not supported for MTP yet. Skipping recompute."
        out = [replace(e, keep_full=True) for e in out if "full" not in e.only_when]
    return out


# ------------------------------------------------------------------------------------------------
# the profile
# ------------------------------------------------------------------------------------------------
def _profile(k: Kernels) -> ActProfile:
    local = not k.impl.uses_te
    modules = {"core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"} | (set() if local
                                                                                               else {"moe_act"})
    return ActProfile(
        "megatron", f"Megatron-Core (transformer_impl={k.impl}, attention_backend={k.backend}): "
        + (f"torch.nn.RMSNorm ({k.runtime}), local DotProductAttention with the s^2 probabilities, measured on "
           f"the CPU and on a GPU"
           if local else "fused attention (no s^2), no dropout, SwiGLU, fp32 router, alltoall dispatch over "
                         "EP/ETP, TP-split shared experts, sequence parallelism, MTP"),
        lambda m, kind: megatron_layer(m, kind, k), lambda m: megatron_embedding(m, k),
        lambda m: megatron_head("head", k, layernorm=m.norm == "layernorm")
        + ([] if local else _layernorm_mu("head", "final norm input", m, keep_full=True)),
        lambda m, j: megatron_mtp(m, j, k),
        modules=frozenset(modules), bind=bind, key=(k,))


def bind(train: TrainingConfig) -> ActProfile:
    """The megatron profile for ``train``'s kernel choices, precision and recompute policy."""
    return _profile(Kernels.of(train))


#: the megatron profile with Megatron-LM's default kernels (bound to a configuration's by ``bind``)
MEGATRON_PROFILE = _profile(TE_DEFAULT)
