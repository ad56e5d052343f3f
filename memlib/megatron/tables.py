"""The flag tables: what memlib knows about a Megatron-LM flag before reading a run.

The tokenizers whose vocabulary size is public, the flags known not to change device memory (by prefix,
by name, torchrun's own), Megatron-LM's ``--moe-*`` flags (nothing on a dense model), and the
:class:`~memlib.config.TrainingConfig` fields the CLI may override with the flags behind each.
:mod:`~memlib.megatron.flags` reads a run with them.  Sources: ``docs/derivations/megatron_flags.md``.
"""
from __future__ import annotations

from typing import Optional

#: where the semantics come from
SOURCE = "NVIDIA/Megatron-LM at d98e8a64dd and megatron-core 0.19.2"


#: tokenizers whose vocabulary size is public: (tokenizer type, model file or None) -> (size, source)
TOKENIZER_SIZES: dict[tuple[str, Optional[str]], tuple[int, str]] = {
    ("GPT2BPETokenizer", None): (
        50257, "GPT-2's byte-level BPE: 50,257 tokens, the <|endoftext|> end-of-document token included "
               "(Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', section 2.2); "
               "Megatron-Core's HuggingFaceTokenizer adds none (vocab_size = len(tokenizer)). A --vocab-file "
               "is assumed to be GPT-2's vocab.json"),
    ("GPTSentencePieceTokenizer", "nemotron_2_256k.model"): (
        256000, "the Nemotron-4 tokenizer: 256,000 SentencePiece tokens (Nemotron-4 15B Technical Report, "
                "arXiv 2402.16819, section 2; Megatron-LM's tests/functional_tests/test_cases/gpt/"
                "gpt3_15b_8t_release trains Nemotron-4 15B's architecture with this file); Megatron-Core's "
                "SentencePieceTokenizer counts get_piece_size() and adds no token"),
}
#: tokenizer types that read their vocabulary from a SentencePiece model file (--tokenizer-model)
SENTENCEPIECE = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")
TIKTOKEN_DEFAULT = 2**17       # megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py


# ------------------------------------------------------------------------------------------------
# classification of the flags memlib does not map
# ------------------------------------------------------------------------------------------------
#: prefixes of flags that do not change device memory (optimisation schedule, logging, data, checkpoints)
NO_EFFECT_PREFIXES = (
    "--lr", "--min-lr", "--log-", "--logging-", "--tensorboard", "--wandb-", "--save", "--load", "--eval-",
    "--exit-", "--data-", "--train-", "--valid-", "--test-", "--split", "--ckpt-", "--dist-ckpt-", "--timing-",
    "--distributed-timeout", "--one-logger", "--straggler", "--rerun-", "--adam-", "--sgd-", "--weight-decay",
    "--start-weight-decay", "--end-weight-decay", "--clip-grad", "--init-method", "--seed", "--no-load-",
    "--no-save-", "--finetune", "--async-save", "--use-persistent-ckpt-worker", "--auto-detect-ckpt-format",
    "--use-checkpoint-", "--override-opt-param-scheduler", "--use-dist-ckpt", "--no-check-for-nan",
    "--check-for-nan", "--manual-gc", "--num-workers", "--no-mmap-bin-files", "--mmap-bin-files", "--mock-data",
    "--per-split-data-args-path", "--tokenizer-", "--vocab-file", "--merge-file", "--enable-ft-package",
    "--ft-", "--heartbeat", "--profile", "--use-pytorch-profiler", "--record-memory-history",
)
#: flags that do not change device memory
NO_EFFECT = {
    "--use-mcore-models", "--distributed-backend", "--mtp-loss-scaling-factor", "--norm-epsilon", "--rotary-base",
    "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--rotary-interleaved",
    "--moe-router-topk-scaling-factor", "--moe-router-bias-update-rate", "--use-flash-attn",
    "--apply-layernorm-1p", "--no-bias-gelu-fusion", "--max-position-embeddings", "--kv-channels",
    "--world-size", "--local-rank", "--rank", "--dataloader-type", "--no-persist-layer-norm",
    "--moe-per-layer-logging", "--moe-z-loss-coeff-logging", "--make-vocab-size-divisible-by",
    # the loss is summed per token instead of averaged: a few scalars; the rank order of the groups; a
    # check of the weights' hash; checkpointing and data options; the learning rate of some parameters; the
    # averaging inside the gradient collective; the CPU process groups; Transformer Engine's RNG tracker
    # (RNG states); the parameter gather overlapped with the step (the same parameter buffer)
    "--calculate-per-token-loss", "--use-tp-pp-dp-mapping", "--check-weight-hash-across-dp-replicas-interval",
    "--no-ckpt-fully-parallel-save", "--async-strategy", "--async-ckpt-use-cpu-shm", "--verify-integrity",
    "--fim-data", "--fim-rate", "--fim-spm-rate", "--decoupled-lr", "--decoupled-min-lr",
    "--ddp-average-in-collective", "--disable-gloo-process-groups", "--te-rng-tracker",
    "--overlap-param-gather-with-optimizer-step", "--enable-experimental",
}
#: torchrun's own flags: the launcher, not the model
LAUNCHER = {
    "--nproc_per_node", "--nproc-per-node", "--nnodes", "--node_rank", "--node-rank", "--master_addr",
    "--master-addr", "--master_port", "--master-port", "--rdzv_id", "--rdzv-id", "--rdzv_backend",
    "--rdzv-backend", "--rdzv_endpoint", "--rdzv-endpoint", "--rdzv_conf", "--rdzv-conf", "--standalone",
    "--max_restarts", "--max-restarts", "--monitor_interval", "--monitor-interval", "--start_method",
    "--start-method", "--role", "--tee", "--redirects", "--log_dir", "--log-dir", "--local-ranks-filter",
    "--local_ranks_filter", "--run_path", "--no_python", "--no-python", "--module",
}


#: Megatron-LM's --moe-* flags: the MoE fields of megatron-core's TransformerConfig (0.19.2, and at d98e8a64dd)
#: that megatron/training/arguments.py turns into flags, and the MoE argument group's own (_add_moe_args).  A
#: dense model (no --num-experts) builds no MoE layer: they change nothing there.  An unknown --moe-* flag is
#: not among them: it is warned as not modelled, as any unknown flag is
MOE_FLAGS = frozenset({
    "--moe-apply-probs-on-input", "--moe-aux-loss-coeff", "--moe-combine-bwd-dtype", "--moe-deepep-num-sms",
    "--moe-dispatch-fwd-dtype", "--moe-enable-deepep", "--moe-enable-routing-replay",
    "--moe-expert-capacity-factor", "--moe-expert-rank-capacity-factor", "--moe-ffn-hidden-size",
    "--moe-flex-dispatcher-backend", "--moe-flex-dispatcher-num-sms", "--moe-grouped-gemm",
    "--moe-hybridep-num-blocks-permute", "--moe-hybridep-num-blocks-unpermute", "--moe-hybridep-num-sms",
    "--moe-hybridep-num-sms-preprocessing", "--moe-hybridep-pad-uneven-dispatch-inputs", "--moe-input-jitter-eps",
    "--moe-latent-size", "--moe-layer-freq", "--moe-layer-recompute", "--moe-mlp-glu-interleave-size",
    "--moe-ncclep-static-shape", "--moe-ncclep-zero-copy", "--moe-pad-expert-input-to-capacity",
    "--moe-pad-experts-for-cuda-graph-inference", "--moe-paged-stash", "--moe-paged-stash-buffer-size-factor-cpu",
    "--moe-paged-stash-buffer-size-factor-cuda", "--moe-paged-stash-page-size", "--moe-per-layer-logging",
    "--moe-permute-fusion", "--moe-permute-fusion-into-hybridep", "--moe-router-bias-update-rate",
    "--moe-router-dtype", "--moe-router-enable-expert-bias", "--moe-router-force-biased",
    "--moe-router-force-load-balancing", "--moe-router-fusion", "--moe-router-group-topk",
    "--moe-router-load-balancing-type", "--moe-router-num-groups", "--moe-router-padding-for-fp8",
    "--moe-router-padding-for-quantization", "--moe-router-pre-softmax", "--moe-router-quantile-balancing-ema",
    "--moe-router-score-function", "--moe-router-topk", "--moe-router-topk-limited-devices",
    "--moe-router-topk-scaling-factor", "--moe-shared-expert-gate", "--moe-shared-expert-glu-interleave-size",
    "--moe-shared-expert-intermediate-size", "--moe-shared-expert-overlap", "--moe-single-grouped-bias",
    "--moe-single-grouped-weight", "--moe-token-dispatcher-type", "--moe-token-drop-policy", "--moe-token-dropping",
    "--moe-upcycling-granularity", "--moe-use-grouped-tensor", "--moe-use-upcycling", "--moe-z-loss-coeff",
})


def has_no_effect(name: str, dense: bool) -> bool:
    return (name in NO_EFFECT or name in LAUNCHER or name.startswith(NO_EFFECT_PREFIXES)
            or (dense and name in MOE_FLAGS))


#: overrides applied where the file's values are derived, not on the result
EARLY = ("dp", "tp", "pp", "ep", "etp", "cp", "micro_batch", "seq_len", "num_microbatches", "layout", "vpp")
#: TrainingConfig fields an override may set (the CLI's explicit options)
OVERRIDABLE = ("dp", "tp", "pp", "ep", "etp", "cp", "sp", "layout", "zero", "precision", "profile", "micro_batch",
               "seq_len", "recompute", "schedule", "num_microbatches", "vpp", "transformer_impl", "attention_backend",
               "attention_softmax_in_fp32", "bias_swiglu_fusion", "cross_entropy_loss_fusion",
               "cross_entropy_fusion_impl", "moe_aux_loss", "fp8", "fp8_recipe", "moe_a2a_overlap", "offload_modules",
               "overlap_grad_reduce", "overlap_param_gather", "routing_imbalance", "ddp_bucket_size", "cp_comm_type",
               "hidden_dropout", "attention_dropout", "megatron_version")


#: the flags behind each overridable field (a shell variable in them is tolerated when the field is given)
FIELD_FLAGS = {
    "tp": ("--tensor-model-parallel-size",), "pp": ("--pipeline-model-parallel-size",),
    "cp": ("--context-parallel-size",), "ep": ("--expert-model-parallel-size",),
    "etp": ("--expert-tensor-parallel-size",), "micro_batch": ("--micro-batch-size",),
    "seq_len": ("--seq-length",), "num_microbatches": ("--global-batch-size",),
    "dp": ("--world-size", "--global-batch-size"),
    "layout": ("--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
               "--decoder-last-pipeline-num-layers", "--num-layers-in-first-pipeline-stage",
               "--num-layers-in-last-pipeline-stage"),
    "vpp": ("--num-virtual-stages-per-pipeline-rank", "--virtual-pipeline-model-parallel-size",
            "--num-layers-per-virtual-pipeline-stage"),
    "recompute": ("--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules"),
    "transformer_impl": ("--transformer-impl",), "attention_backend": ("--attention-backend",),
    "cross_entropy_fusion_impl": ("--cross-entropy-fusion-impl",), "fp8": ("--fp8-format",),
    "fp8_recipe": ("--fp8-recipe",), "ddp_bucket_size": ("--ddp-bucket-size",),
    "moe_aux_loss": ("--moe-router-load-balancing-type", "--moe-aux-loss-coeff"),
    "offload_modules": ("--offload-modules",), "cp_comm_type": ("--cp-comm-type",),
    "hidden_dropout": ("--hidden-dropout",), "attention_dropout": ("--attention-dropout",),
    "precision": ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"),
}
