"""Megatron-LM's own launch flags read as a memlib configuration (``memlib estimate --megatron-args``).

:func:`parse_megatron_args` reads the flags of a ``pretrain_gpt.py`` run (:mod:`~memlib.megatron.reader`)
and returns a :class:`MegatronRun`: the :class:`~memlib.config.ModelConfig`, the
:class:`~memlib.config.TrainingConfig` (profile ``megatron``), the flags it mapped, the flags known not to
change memory, and the flags memlib does not model (one warning line).  Semantics and defaults are
Megatron-LM's at commit d98e8a64dd and megatron-core 0.19.2: how each flag maps (model, vocabulary,
parallelism, layout strings, precision) and which flags are refused or warned about.

The derivation, with its sources (file:line), is in ``docs/derivations/megatron_flags.md``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping, Optional

from ..ledgers.base import MODULES as RECOMPUTE_MODULES
from ..config import (
    FP8_FORMATS, FP8_RECIPES, LIMITS, OFFLOAD_MODULES, ConfigError, ModelConfig, TrainingConfig, model_from_dict,
    show,
)
from ..config.strategies import CP_COMM_TYPES, AttnBackend, LoadBalancing, TransformerImpl
from ..config.versions import DEFAULT_VERSION, parse_version
from ..device.peak import Framework
from ..model.states import DTYPE_BYTES, RECIPES, recipe
from .layout import MegatronLayout, layout_stages, megatron_layout, parse_layout
from .listexpr import moe_layer_pattern, pattern_to_hf
from .reader import Flag, _fraction, _Flags, read_env, read_flags

__all__ = ["MegatronRun", "parse_megatron_args", "parse_megatron_config", "pad_vocab", "precision_spec", "TOKENIZER_SIZES",
           "SOURCE", "MOE_FLAGS"]

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
_SENTENCEPIECE = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")
_TIKTOKEN_DEFAULT = 2**17       # megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py


# ------------------------------------------------------------------------------------------------
# vocabulary and precision
# ------------------------------------------------------------------------------------------------
def pad_vocab(size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding (``megatron/core/tokenizers/utils/build_tokenizer.py``
    ``vocab_size_with_padding``): up to a multiple of ``divisible_by * tp``.

    >>> pad_vocab(50257, 128, 1), pad_vocab(50257, 3232, 2), pad_vocab(256000, 3232, 2)
    (50304, 51712, 258560)
    """
    multiple = divisible_by * tp
    return -(-size // multiple) * multiple


_DTYPE_FLAGS = {"--main-grads-dtype": ("fp32", "bf16"), "--main-params-dtype": ("fp32", "fp16"),
                "--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"), "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8")}


def precision_spec(*, bf16: bool, fp16: bool, fp8_param_gather: bool = False, grad_reduce_in_bf16: bool = False,
                   accumulate_in_fp32: bool = False, precision_aware: bool = False, main_grads: str = "fp32",
                   main_params: str = "fp32", exp_avg: str = "fp32", exp_avg_sq: str = "fp32",
                   fp8: Optional[str] = None, fp8_recipe: str = "delayed") -> str:
    """The memlib precision (a preset or a recipe spec) of Megatron's mixed-precision flags.

    * the preset: ``megatron`` (bf16), ``megatron-fp16``, ``megatron-fp8-param`` (bf16 with
      ``--fp8-param-gather``), ``fp32`` (neither);
    * the main_grad buffer is bf16 with ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16``
      (``gradients=2``); without the precision-aware optimizer the distributed optimizer then copies
      each shard to fp32 for the step (``main_grad=4``, an optimizer state, as the ``megatron-fp16``
      preset counts it);
    * ``--use-precision-aware-optimizer`` hands the gradient buffer to Transformer Engine's FusedAdam
      (no fp32 copy) with moments of ``--exp-avg(-sq)-dtype``; its master weights are
      ``--main-params-dtype``, and with bf16 weights and fp32 master weights FusedAdam keeps only the
      16 remainder bits (``store_param_remainders``, on by default: ``master_weights=2``) where it
      manages them (``megatron/core/optimizer/__init__.py``: not for an FP8 recipe other than delayed).

    >>> precision_spec(bf16=True, fp16=False)
    'megatron'
    >>> precision_spec(bf16=True, fp16=False, precision_aware=True, exp_avg="bf16", exp_avg_sq="bf16")
    'megatron:master_weights=2,exp_avg=2,exp_avg_sq=2'
    >>> precision_spec(bf16=True, fp16=False, grad_reduce_in_bf16=True)
    'megatron:gradients=2,main_grad=4'
    """
    if bf16 and fp16:
        raise ConfigError("--bf16=on and --fp16=on contradict each other: give one")
    if not precision_aware and (main_grads, main_params, exp_avg, exp_avg_sq) != ("fp32",) * 4:
        flag = next(f for f, v in zip(_DTYPE_FLAGS, (main_grads, main_params, exp_avg, exp_avg_sq)) if v != "fp32")
        value = dict(zip(_DTYPE_FLAGS, (main_grads, main_params, exp_avg, exp_avg_sq)))[flag]
        raise ConfigError(f"{flag}={value} needs --use-precision-aware-optimizer (Megatron-Core keeps fp32 otherwise)")
    if not (bf16 or fp16):
        for flag, on in (("--fp8-param-gather", fp8_param_gather), ("--grad-reduce-in-bf16", grad_reduce_in_bf16),
                         ("--use-precision-aware-optimizer", precision_aware)):
            if on:
                raise ConfigError(f"{flag}=on without --bf16 or --fp16 is not modelled (an fp32 run)")
        return "fp32"
    if fp16:
        if fp8_param_gather or grad_reduce_in_bf16:
            flag = "--fp8-param-gather" if fp8_param_gather else "--grad-reduce-in-bf16"
            raise ConfigError(f"{flag}=on with --fp16 is not modelled (use --bf16)")
        base, changes = "megatron-fp16", {}
        grads = 4 if accumulate_in_fp32 else 2
        if accumulate_in_fp32:
            changes.update(gradients=4, main_grad=0)
        if precision_aware:
            changes.update(gradients=grads, main_grad=0, master_weights=DTYPE_BYTES[main_params],
                           exp_avg=DTYPE_BYTES[exp_avg], exp_avg_sq=DTYPE_BYTES[exp_avg_sq])
    else:
        base = "megatron-fp8-param" if fp8_param_gather else "megatron"
        grads = 2 if (grad_reduce_in_bf16 or main_grads == "bf16") else 4
        changes = {}
        if precision_aware:
            te_managed = main_params != "fp32" or fp8 is None or fp8_recipe == "delayed"
            master = 2 if main_params == "fp16" or (te_managed and not fp8_param_gather) else 4
            changes.update(gradients=grads, master_weights=master, exp_avg=DTYPE_BYTES[exp_avg],
                           exp_avg_sq=DTYPE_BYTES[exp_avg_sq])
        elif grads == 2:
            changes.update(gradients=2, main_grad=4)
    rec = RECIPES[base]
    current = {"gradients": rec.gradients, **dict(rec.optimizer)}
    changes = {k: b for k, b in changes.items() if current.get(k, 0) != b}
    return base if not changes else recipe(base + ":" + ",".join(f"{k}={b}" for k, b in changes.items())).name


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


def _no_effect(name: str, dense: bool) -> bool:
    return (name in NO_EFFECT or name in LAUNCHER or name.startswith(NO_EFFECT_PREFIXES)
            or (dense and name in MOE_FLAGS))


# ------------------------------------------------------------------------------------------------
# the result
# ------------------------------------------------------------------------------------------------
#: overrides applied where the file's values are derived, not on the result
_EARLY = ("dp", "tp", "pp", "ep", "etp", "cp", "micro_batch", "seq_len", "num_microbatches", "layout", "vpp")
#: TrainingConfig fields an override may set (the CLI's explicit options)
OVERRIDABLE = ("dp", "tp", "pp", "ep", "etp", "cp", "sp", "layout", "zero", "precision", "profile", "micro_batch",
               "seq_len", "recompute", "schedule", "num_microbatches", "vpp", "transformer_impl", "attention_backend",
               "attention_softmax_in_fp32", "bias_swiglu_fusion", "cross_entropy_loss_fusion",
               "cross_entropy_fusion_impl", "moe_aux_loss", "fp8", "fp8_recipe", "moe_a2a_overlap", "offload_modules",
               "overlap_grad_reduce", "overlap_param_gather", "routing_imbalance", "ddp_bucket_size", "cp_comm_type",
               "hidden_dropout", "attention_dropout", "megatron_version")


@dataclass(frozen=True)
class MegatronRun:
    """A Megatron-LM run read from its flags."""

    model: ModelConfig
    train: TrainingConfig
    world_size: int
    vocab: dict                       #: tokenizer, size (before padding), padded, divisible_by, source
    mapped: dict                      #: flag -> its value as written ("" for a switch), flags memlib turned into fields
    no_effect: tuple[str, ...]        #: flags known not to change device memory
    not_modelled: tuple[str, ...]     #: the warning list: flags (and Megatron defaults) memlib does not count
    overridden: dict = field(default_factory=dict)   #: field -> {"file": value, "given": value}
    #: how the framework is built (memlib.device.peak.Framework: fusions, grouped GEMM, dispatcher), from the flags
    framework: Framework = field(default_factory=Framework)
    #: the environment variables memlib reads (megatron.reader.ENV_READ), as the launch sets them
    env: dict = field(default_factory=dict)

    def warning(self) -> str:
        """One line naming what memlib does not model ("" when nothing)."""
        if not self.not_modelled:
            return ""
        return f"not modelled ({len(self.not_modelled)}): " + ", ".join(self.not_modelled)

    def values(self) -> dict:
        """For the JSON output."""
        return {"model": self.model.values(), "config": self.train.values(), "framework": self.framework.values(),
                "world_size": self.world_size,
                "vocab": dict(self.vocab), "mapped": dict(self.mapped), "no_memory_effect": list(self.no_effect),
                "not_modelled": list(self.not_modelled),
                "overridden": {k: {"file": _plain(v["file"]), "given": _plain(v["given"])}
                               for k, v in self.overridden.items()}}


def _plain(x):
    if isinstance(x, (bool, int, str)) or x is None:
        return x
    if isinstance(x, (tuple, list)):
        return [_plain(y) for y in x]
    return str(x)


# ------------------------------------------------------------------------------------------------
# the mapping
# ------------------------------------------------------------------------------------------------
def parse_megatron_args(text: str, world_size: Optional[int] = None, vocab_size: Optional[int] = None,
                        overrides: Optional[Mapping] = None, name: str = "megatron") -> MegatronRun:
    """Read Megatron-LM flags (a launch script, a flag list or a ``model_config.yaml``).

    ``world_size`` is the number of GPUs (needed unless the file implies it or ``overrides`` gives
    ``dp``); ``vocab_size`` the tokenizer's vocabulary before padding (overrides the file's);
    ``overrides`` maps :class:`~memlib.config.TrainingConfig` fields to values that replace the
    file's (the CLI's explicit options): TP, PP, CP, EP and ETP before anything is derived from them
    (DP, the padded vocabulary, the layout), the rest on the result."""
    over = dict(overrides or {})
    _check_call(over, world_size, vocab_size)
    mapper = _Mapper(read_flags(text, name), world_size, vocab_size, over, name)
    mapper.env = read_env(text)
    return mapper.run()


def parse_megatron_config(model_args: Mapping, env_vars: Optional[Mapping] = None, world_size: Optional[int] = None,
                          vocab_size: Optional[int] = None, overrides: Optional[Mapping] = None,
                          name: str = "megatron") -> MegatronRun:
    """:func:`parse_megatron_args` of a ``model_config.yaml`` already read: its ``MODEL_ARGS`` and ``ENV_VARS``
    mappings (the validation set reads hundreds of them)."""
    from .reader import ENV_READ, mapping_flags

    over = dict(overrides or {})
    _check_call(over, world_size, vocab_size)
    mapper = _Mapper(mapping_flags(dict(model_args), f"megatron_args={show(name, 120)}"), world_size, vocab_size,
                     over, name)
    mapper.env = {k: str(v) for k, v in (env_vars or {}).items() if k in ENV_READ and v is not None}
    return mapper.run()


def _check_call(over: dict, world_size, vocab_size) -> None:
    unknown = sorted(set(over) - set(OVERRIDABLE))
    if unknown:
        raise ConfigError(f"overrides={show(unknown)}: only TrainingConfig fields {', '.join(OVERRIDABLE)} may be given")
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                   or not 1 <= world_size <= LIMITS["ranks"] * LIMITS["pp"]):
        raise ConfigError(f"world_size={show(world_size)} must be a positive integer")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                   or not 1 <= vocab_size <= LIMITS["width"]):
        raise ConfigError(f"vocab_size={show(vocab_size)} must be a positive integer")


#: the flags behind each overridable field (a shell variable in them is tolerated when the field is given)
_FIELD_FLAGS = {
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


class _Mapper:
    def __init__(self, flags: list[Flag], world_size, vocab_size, overrides: dict, name: str):
        self.f = _Flags(flags)
        for fld in overrides:
            self.f.lenient.update(_FIELD_FLAGS.get(fld, ()))
        if world_size is not None:
            self.f.lenient.add("--world-size")
        self.world_arg, self.vocab_arg, self.over, self.name = world_size, vocab_size, overrides, name
        #: the Megatron-LM version whose rules apply (memlib.config.versions): the CLI's, else memlib's pin
        self.version = parse_version(overrides.get("megatron_version") or DEFAULT_VERSION)
        self.notes: list[str] = []          # not modelled, with a reason
        self.flagged: set[str] = set()      # flags read but not modelled
        self.overridden: dict = {}
        self.env: dict[str, str] = {}       # the launch's environment variables memlib reads (reader.ENV_READ)

    # -- helpers ---------------------------------------------------------------------------------
    def not_modelled(self, flag: str, entry: Optional[str] = None) -> None:
        """``flag`` (given, read) is not modelled; ``entry`` is the warning text (default the flag)."""
        self.flagged.add(flag)
        self.notes.append(entry or flag)

    def carried(self, entry: str) -> None:
        """A mapped flag whose memory memlib does not count (the field is carried): a warning entry."""
        self.notes.append(entry)

    def override(self, fld: str, file_value):
        if fld in self.over:
            given = self.over[fld]
            text = [self.f.unresolved[x] for x in _FIELD_FLAGS.get(fld, ()) if x in self.f.unresolved]
            if text:
                file_value = text[0]
            if given != file_value:
                self.overridden[fld] = {"file": file_value, "given": given}
            return given
        return file_value

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> MegatronRun:
        f = self.f
        if f.has("--hybrid-layer-pattern", "--hybrid-override-pattern"):
            raise ConfigError(f"--hybrid-layer-pattern={show(f.text('--hybrid-layer-pattern') or f.text('--hybrid-override-pattern'))}: "
                              f"hybrid (Mamba) models cannot be expressed; memlib models DeepSeek-style MLA transformers")
        self.mla = f.switch("--multi-latent-attention")
        if self.mla and f.switch("--group-query-attention"):
            raise ConfigError("--group-query-attention=on with --multi-latent-attention: Megatron-LM refuses the pair")
        model, dense = self.model_fields() if self.mla else self.gqa_fields()
        par = self.parallel(model, dense)
        train_kw = {**par, **self.recompute(), **self.kernels(dense), **self.precision(par["zero"])}
        model = self.vocabulary(model, par["tp"])
        self.structure(dense)
        train_kw = self.apply_overrides(train_kw)
        try:
            train = TrainingConfig(profile="megatron", **train_kw)
        except TypeError as exc:
            raise ConfigError(f"megatron_args={show(self.name, 120)}: {exc}") from None
        source = f"Megatron-LM flags ({SOURCE}; the rules of Megatron-LM {self.version.text})"
        m = model_from_dict(model, name=self.name, source=source) if self.mla else ModelConfig(
            **model, name=self.name, source=source)
        fw = Framework(gradient_accumulation_fusion=not f.switch("--no-gradient-accumulation-fusion"),
                       rope_fusion=not f.has("--no-rope-fusion"), moe_grouped_gemm=f.has("--moe-grouped-gemm"),
                       token_dispatcher=" ".join(f.values.get("--moe-token-dispatcher-type", ("allgather",))),
                       permute_fusion=f.switch("--moe-permute-fusion"), deterministic=self.deterministic,
                       attention_mask_in_batch=not f.switch("--no-create-attention-mask-in-dataloader"),
                       cublas_workspace_config=self.env.get("CUBLAS_WORKSPACE_CONFIG"),
                       expandable_segments="expandable_segments:true" in self.env.get(
                           "PYTORCH_CUDA_ALLOC_CONF", "").lower().replace(" ", ""))
        no_effect, unmodelled = [], []
        for flag in f.order:
            if flag in f.read:
                continue                    # mapped, or not modelled with its own note
            (no_effect if _no_effect(flag, dense) else unmodelled).append(flag)
        mapped = {x: " ".join(f.values[x]) for x in f.order if x in f.read and x not in self.flagged}
        return MegatronRun(m, train, self.world, self.vocab, mapped, tuple(no_effect),
                           tuple(self.notes + unmodelled), self.overridden, fw, dict(self.env))

    # -- the model -------------------------------------------------------------------------------
    def _sizes(self) -> tuple[int, int, int]:
        """``--num-layers``, ``--hidden-size``, ``--num-attention-heads`` (required), with Megatron-LM's rule on
        the head width."""
        f = self.f
        layers = f.int("--num-layers", None, bound=LIMITS["num_hidden_layers"])
        hidden = f.int("--hidden-size")
        heads = f.int("--num-attention-heads")
        for flag, v in (("--num-layers", layers), ("--hidden-size", hidden), ("--num-attention-heads", heads)):
            if v is None:
                raise ConfigError(f"{flag} is required (Megatron-LM requires it)")
        if "--kv-channels" not in f.values and hidden % heads:
            raise ConfigError(f"--hidden-size={hidden} must be divisible by --num-attention-heads={heads} "
                              f"(Megatron-LM's rule when --kv-channels is not given)")
        return layers, hidden, heads

    def model_fields(self) -> tuple[dict, bool]:
        f = self.f
        layers, hidden, heads = self._sizes()
        swiglu = f.switch("--swiglu")
        ffn = f.int("--ffn-hidden-size", (hidden // 24) * 64 if swiglu else 4 * hidden)
        if ffn < 1:
            raise ConfigError(f"--hidden-size={hidden}: Megatron's default FFN width int(8h/3/64)*64 is 0; "
                              f"give --ffn-hidden-size")
        experts = f.int("--num-experts", None, minimum=0)
        dense = not experts
        m = {
            "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": ffn,
            "qk_nope_head_dim": f.int("--qk-head-dim", 128), "qk_rope_head_dim": f.int("--qk-pos-emb-head-dim", 64),
            "v_head_dim": f.int("--v-head-dim", 128), "q_lora_rank": f.int("--q-lora-rank", None),
            "kv_lora_rank": f.int("--kv-lora-rank", 32),
            "num_nextn_predict_layers": f.int("--mtp-num-layers", 0, minimum=0, bound=LIMITS["num_nextn_predict_layers"]),
            "tie_word_embeddings": not f.switch("--untie-embeddings-and-output-weights"),
        }
        if dense:
            m.update(moe_intermediate_size=ffn, n_routed_experts=1, n_shared_experts=0, num_experts_per_tok=1,
                     first_k_dense_replace=layers, moe_layer_freq=1)
            return m, True
        moe_ffn, shared, topk, k, freq, score, bias, groups, group_topk, pre_softmax = self._router(layers, ffn)
        if score == "softmax" and pre_softmax:
            self.not_modelled("--moe-router-pre-softmax")
        m.update(moe_intermediate_size=moe_ffn, n_routed_experts=experts,
                 n_shared_experts=0 if shared is None else shared // moe_ffn, num_experts_per_tok=topk,
                 first_k_dense_replace=k, moe_layer_freq=freq,
                 n_group=groups if group_topk else 1, topk_group=group_topk or 1, scoring_func=score)
        m["topk_method"] = "noaux_tc" if bias else "greedy"
        f.switch("--moe-grouped-gemm")      # TE's grouped GEMM: what memlib's ledger assumes for the experts
        return m, False

    def _router(self, layers: int, ffn: int) -> tuple:
        """The MoE layers' flags both attention kinds read: (expert width, shared width or None, top-k, the HF
        pattern's first_k_dense_replace and moe_layer_freq, score function, expert bias, groups, group top-k,
        pre-softmax), with Megatron-Core's rules on them."""
        f = self.f
        moe_ffn = f.int("--moe-ffn-hidden-size", ffn)
        shared = f.int("--moe-shared-expert-intermediate-size", None)
        if shared is not None and shared % moe_ffn:
            raise ConfigError(f"--moe-shared-expert-intermediate-size={shared} must be a multiple of "
                              f"--moe-ffn-hidden-size={moe_ffn} (memlib counts shared experts of the routed width)")
        topk = f.int("--moe-router-topk", 2)
        k, freq = pattern_to_hf(moe_layer_pattern(f.one("--moe-layer-freq") or "1", layers))
        score = f.choice("--moe-router-score-function", "softmax", ("softmax", "sigmoid", "sqrtsoftplus"))
        if score == "sqrtsoftplus":
            raise ConfigError("--moe-router-score-function=sqrtsoftplus cannot be expressed (memlib: softmax or sigmoid)")
        bias = f.switch("--moe-router-enable-expert-bias")
        if bias and score != "sigmoid":
            raise ConfigError(f"--moe-router-enable-expert-bias with --moe-router-score-function={score}: Megatron-Core "
                              f"allows the expert bias with sigmoid only")
        groups = f.int("--moe-router-num-groups", None)
        group_topk = f.int("--moe-router-group-topk", None)
        if group_topk and not groups:
            raise ConfigError(f"--moe-router-group-topk={group_topk} needs --moe-router-num-groups (Megatron-Core's rule)")
        pre_softmax = f.switch("--moe-router-pre-softmax")      # sigmoid scores: it changes nothing
        if topk == 1 and score == "softmax" and not pre_softmax:
            raise ConfigError("--moe-router-topk=1 with softmax scores needs --moe-router-pre-softmax (Megatron-Core's rule)")
        return moe_ffn, shared, topk, k, freq, score, bias, groups, group_topk, pre_softmax

    def gqa_fields(self) -> tuple[dict, bool]:
        """A model without ``--multi-latent-attention``: grouped-query (or multi-head) attention, the dense FFN
        (SwiGLU with ``--swiglu``, else GeLU), LayerNorm or RMSNorm, learned absolute positions or RoPE, biases
        unless ``--disable-bias-linear`` (``--add-qkv-bias`` keeps those of q, k, v), Mixtral-style MoE layers
        (softmax after the top-k) or DeepSeek-style ones (softmax first or sigmoid scores, shared experts) with
        SwiGLU experts: ModelConfig's fields, given directly (``family`` names the nearest preset family)."""
        f = self.f
        layers, hidden, heads = self._sizes()
        head_dim = f.int("--kv-channels", hidden // heads)
        kv = f.int("--num-query-groups", 1) if f.switch("--group-query-attention") else heads
        if heads % kv:
            raise ConfigError(f"--num-query-groups={kv} must divide --num-attention-heads={heads}")
        for flag in ("--squared-relu", "--quick-geglu", "--multi-latent-attention"):
            if f.switch(flag) and flag != "--multi-latent-attention":
                raise ConfigError(f"{flag}=on: memlib's feed-forward is SwiGLU (--swiglu) or GeLU (the default)")
        if f.has("--activation-func"):
            raise ConfigError(f"--activation-func={show(f.text('--activation-func'))}: memlib's feed-forward is "
                              f"SwiGLU (--swiglu) or GeLU (the default)")
        swiglu = f.switch("--swiglu")
        ffn = f.int("--ffn-hidden-size", (hidden // 24) * 64 if swiglu else 4 * hidden)
        if ffn < 1:
            raise ConfigError(f"--hidden-size={hidden}: Megatron's default FFN width int(8h/3/64)*64 is 0; "
                              f"give --ffn-hidden-size")
        norm = f.choice("--normalization", "LayerNorm", ("LayerNorm", "RMSNorm"))
        pos = f.choice("--position-embedding-type", "learned_absolute",
                       ("learned_absolute", "rope", "yarn", "mrope", "relative", "none"))
        if pos not in ("learned_absolute", "rope"):
            raise ConfigError(f"--position-embedding-type={pos}: memlib models learned absolute positions and RoPE "
                              f"for attention without --multi-latent-attention")
        if f.has("--rotary-percent") and _fraction("--rotary-percent", f.one("--rotary-percent")) != 1:
            self.not_modelled("--rotary-percent", f"--rotary-percent={f.text('--rotary-percent')} (memlib's RoPE "
                                                  f"cache covers the whole head)")
        bias = not f.switch("--disable-bias-linear")
        qkv_bias = bias or f.switch("--add-qkv-bias")
        max_pos = f.int("--max-position-embeddings", None, bound=LIMITS["seq_len"])
        if pos == "learned_absolute" and max_pos is None:
            raise ConfigError("--max-position-embeddings is required with learned absolute positions (Megatron-LM's "
                              "rule)")
        experts = f.int("--num-experts", None, minimum=0)
        dense = not experts
        m = {
            "hidden_size": hidden, "intermediate_size": ffn, "num_attention_heads": heads,
            "qk_nope_head_dim": None, "qk_rope_head_dim": None, "v_head_dim": None, "q_lora_rank": None,
            "kv_lora_rank": None, "num_hidden_layers": layers,
            "num_nextn_predict_layers": f.int("--mtp-num-layers", 0, minimum=0, bound=LIMITS["num_nextn_predict_layers"]),
            "tie_word_embeddings": not f.switch("--untie-embeddings-and-output-weights"),
            "attention": "gqa", "mlp": "swiglu" if swiglu else "gelu", "norm": norm.lower(),
            "positions": "learned" if pos == "learned_absolute" else "rope", "num_key_value_heads": kv,
            "head_dim": head_dim, "qk_norm": f.switch("--qk-layernorm"), "qkv_bias": qkv_bias, "o_bias": bias,
            "mlp_bias": bias, "max_position_embeddings": max_pos if pos == "learned_absolute" else None,
            "hidden_act": "silu" if swiglu else "gelu", "scoring_func": "softmax",
        }
        if m["num_nextn_predict_layers"]:
            raise ConfigError(f"--mtp-num-layers={m['num_nextn_predict_layers']} without --multi-latent-attention: "
                              f"memlib models MTP modules of MLA models")
        if dense:
            m.update(moe_intermediate_size=None, n_routed_experts=None, n_shared_experts=0, num_experts_per_tok=None,
                     first_k_dense_replace=layers, moe_layer_freq=1, moe=None,
                     family="llama" if swiglu else "gpt")
            return m, True
        if not swiglu:
            raise ConfigError(f"--num-experts={experts} without --swiglu: memlib's routed experts are SwiGLU MLPs; "
                              f"GeLU experts cannot be expressed yet")
        if f.switch("--moe-shared-expert-gate"):
            raise ConfigError("--moe-shared-expert-gate=on cannot be expressed without --multi-latent-attention yet")
        moe_ffn, shared, topk, k, freq, score, bias_e, groups, group_topk, pre_softmax = self._router(layers, ffn)
        mixtral = score == "softmax" and not pre_softmax and not shared and not group_topk
        m.update(moe_intermediate_size=moe_ffn, n_routed_experts=experts,
                 n_shared_experts=0 if shared is None else shared // moe_ffn, num_experts_per_tok=topk,
                 first_k_dense_replace=k, moe_layer_freq=freq, n_group=groups if group_topk else 1,
                 topk_group=group_topk or 1, scoring_func=score, router_bias=bias_e,
                 moe="mixtral" if mixtral else "deepseek", family="mixtral",
                 intermediate_size=ffn if k or freq > 1 else None)
        f.switch("--moe-grouped-gemm")
        return m, False

    def vocabulary(self, m: dict, tp: int) -> dict:
        f = self.f
        tok = f.choice("--tokenizer-type", "GPT2BPETokenizer", (
            "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
            "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
            "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"))
        model_file = f.text("--tokenizer-model")
        f.text("--vocab-file"), f.text("--merge-file")
        divisible = f.int("--make-vocab-size-divisible-by", 128)
        padded_flag = f.int("--padded-vocab-size", None)
        no_pad = f.switch("--no-pad-vocab-size", "--disable-pad-vocab-size")
        file_size = f.int("--vocab-size", None)
        if f.has("--tokenizer-special-tokens"):
            self.not_modelled("--tokenizer-special-tokens", "--tokenizer-special-tokens (tokens added to the vocabulary)")
        if f.int("--vocab-extra-ids", 0, minimum=0):
            self.not_modelled("--vocab-extra-ids")
        vocab = {"tokenizer": tok, "model_file": model_file, "divisible_by": divisible}
        size, source = None, ""
        if self.vocab_arg is not None:
            size, source = self.vocab_arg, "given (vocab_size)"
        elif tok in ("NullTokenizer", "TikTokenizer"):
            size = file_size if file_size is not None else (_TIKTOKEN_DEFAULT if tok == "TikTokenizer" else None)
            source = f"--vocab-size ({tok})" if file_size is not None else f"{tok}'s default"
            if size is None and padded_flag is None:
                raise ConfigError("--tokenizer-type=NullTokenizer needs --vocab-size (its vocabulary)")
            if tok == "NullTokenizer" and size is not None and not self.version.has("null_tokenizer_eod"):
                size += 1
                source += (f" + 1: NullTokenizer's end-of-document token, added before Megatron-LM c9dfe34798 "
                           f"(version {self.version.text})")
        else:
            base = model_file.rsplit("/", 1)[-1] if model_file else None
            key = (tok, base if tok in _SENTENCEPIECE else None)
            if file_size is not None:
                self.not_modelled("--vocab-size", f"--vocab-size (Megatron-LM ignores it for {tok})")
            if key in TOKENIZER_SIZES:
                size, source = TOKENIZER_SIZES[key]
            elif padded_flag is None:
                what = f"{tok} with {base}" if base else tok
                raise ConfigError(f"vocab_size is unknown for --tokenizer-type={what}: give memlib the tokenizer's "
                                  f"vocabulary (memlib estimate --vocab-size N; memlib pads it as Megatron does)")
        if padded_flag is not None:
            padded, source = padded_flag, (source + "; " if source else "") + "--padded-vocab-size, used as it is"
        elif no_pad:
            raise ConfigError("--no-pad-vocab-size=on without --padded-vocab-size leaves Megatron-LM without a model "
                              "vocabulary size; give --padded-vocab-size")
        else:
            padded = pad_vocab(size, divisible, tp)
        vocab.update(size=size, padded=padded, source=source)
        self.vocab = vocab
        return {**m, "vocab_size": padded}

    def structure(self, dense: bool) -> None:
        """Megatron defaults (and flags) that build what memlib does not count."""
        f = self.f
        if not self.mla:
            self.structure_common(dense)
            return
        if not f.switch("--disable-bias-linear"):
            self.notes.append("biases (no --disable-bias-linear)")
        if f.switch("--add-qkv-bias"):
            self.not_modelled("--add-qkv-bias")
        norm = f.choice("--normalization", "LayerNorm", ("LayerNorm", "RMSNorm"))
        if norm != "RMSNorm":
            if f.has("--normalization"):
                self.not_modelled("--normalization", "--normalization=LayerNorm (memlib counts RMSNorm)")
            else:
                self.notes.append("--normalization=LayerNorm (Megatron's default; memlib counts RMSNorm)")
        if not f.has("--swiglu"):
            self.notes.append("no --swiglu (memlib counts a SwiGLU feed-forward)")
        if not f.switch("--qk-layernorm"):
            self.notes.append("no --qk-layernorm (memlib counts MLA's latent RMSNorms)")
        pos = f.choice("--position-embedding-type", "learned_absolute",
                       ("learned_absolute", "rope", "yarn", "mrope", "relative", "none"))
        if pos in ("learned_absolute", "mrope", "relative"):
            entry = f"--position-embedding-type={pos}" + ("" if f.has("--position-embedding-type") else
                                                          " (Megatron's default)")
            if f.has("--position-embedding-type"):
                self.not_modelled("--position-embedding-type", entry)
            else:
                self.notes.append(entry)
        self.structure_common(dense)

    def structure_common(self, dense: bool) -> None:
        """What every model shares: the token dispatcher, the router's dtype, the RoPE fusion."""
        f = self.f
        if not dense:
            dispatcher = f.choice("--moe-token-dispatcher-type", "allgather", ("allgather", "alltoall", "flex"))
            if dispatcher == "flex":    # DeepEP or HybridEP: the tokens move as with alltoall; their buffers not counted
                f.switch("--moe-enable-deepep")
                f.choice("--moe-flex-dispatcher-backend", "deepep", ("deepep", "hybridep"))
            if dispatcher not in ("alltoall", "flex"):
                if f.has("--moe-token-dispatcher-type"):
                    self.not_modelled("--moe-token-dispatcher-type",
                                      f"--moe-token-dispatcher-type={dispatcher} (memlib counts alltoall)")
                else:
                    self.notes.append("--moe-token-dispatcher-type=allgather (Megatron's default; memlib counts "
                                      "alltoall)")
            rdtype = f.choice("--moe-router-dtype", None, ("fp32", "fp64"))
            if rdtype != "fp32":
                if f.has("--moe-router-dtype"):
                    self.not_modelled("--moe-router-dtype", f"--moe-router-dtype={rdtype} (memlib counts fp32)")
                else:
                    self.notes.append("no --moe-router-dtype (memlib counts an fp32 router)")
        if f.switch("--no-rope-fusion") and self.impl.uses_te:
            self.not_modelled("--no-rope-fusion", "--no-rope-fusion (memlib counts the fused MLA RoPE with "
                                                  "transformer_engine)" if self.mla else
                              "--no-rope-fusion (memlib counts the fused RoPE of grouped-query attention with "
                              "transformer_engine)")

    # -- parallelism -----------------------------------------------------------------------------
    def parallel(self, m: dict, dense: bool) -> dict:
        f, ranks = self.f, LIMITS["ranks"]
        tp = self.override("tp", f.int("--tensor-model-parallel-size", 1, bound=ranks))
        pp = self.override("pp", f.int("--pipeline-model-parallel-size", 1, bound=LIMITS["pp"]))
        cp = self.override("cp", f.int("--context-parallel-size", 1, bound=ranks))
        ep = self.override("ep", f.int("--expert-model-parallel-size", 1, bound=ranks))
        etp = self.override("etp", f.int("--expert-tensor-parallel-size", tp, bound=ranks))
        if dense and "etp" not in self.over:
            etp = 1                     # a model without experts has none to split (ETP defaults to TP)
        if dense and ep > 1:
            raise ConfigError(f"--expert-model-parallel-size={ep} needs --num-experts (Megatron-LM's rule)")
        if not dense and m["n_routed_experts"] % ep:
            raise ConfigError(f"--expert-model-parallel-size={ep} must divide --num-experts={m['n_routed_experts']}")
        self.world = self._world(tp, pp, cp)
        dp = self.world // (tp * pp * cp)
        if (dp * tp * cp) % (ep * etp):
            raise ConfigError(f"ep*etp={ep * etp} (--expert-model-parallel-size={ep}, --expert-tensor-parallel-size="
                              f"{etp}) must divide dp*tp*cp={dp * tp * cp} (world size {self.world})")
        sp = f.switch("--sequence-parallel") and tp > 1
        if not dense and tp > 1 and not sp and "sp" not in self.over:
            raise ConfigError(f"--tensor-model-parallel-size={tp} with --num-experts needs --sequence-parallel "
                              f"(Megatron-Core's MoE layer refuses TP without it in training)")
        zero = 1 if f.switch("--use-distributed-optimizer") else 0
        mbs = self.override("micro_batch", f.int("--micro-batch-size", None, bound=LIMITS["micro_batch"]))
        if mbs is None:
            raise ConfigError("--micro-batch-size is required (Megatron-LM requires it)")
        seq = self.override("seq_len", f.int("--seq-length", None, bound=LIMITS["seq_len"]))
        if seq is None:
            raise ConfigError("--seq-length is required (memlib needs the sequence length)")
        if cp > 1 and seq % (2 * cp):
            raise ConfigError(f"--seq-length={seq} must be a multiple of 2*cp={2 * cp} (Megatron-LM's rule)")
        gbs = f.int("--global-batch-size", mbs * dp, bound=LIMITS["num_microbatches"] * LIMITS["micro_batch"])
        if f.has("--rampup-batch-size"):
            self.not_modelled("--rampup-batch-size", "--rampup-batch-size (memlib takes the final global batch)")
        if "num_microbatches" in self.over:
            mb = self.override("num_microbatches", None)
        else:
            if gbs % (mbs * dp):
                raise ConfigError(f"--global-batch-size={gbs} must be divisible by micro-batch*dp={mbs * dp} "
                                  f"(--micro-batch-size={mbs}, dp={dp})")
            mb = gbs // (mbs * dp)
        layout, vpp = self.pipeline(m["num_hidden_layers"], pp, m["num_nextn_predict_layers"])
        out = {"dp": dp, "tp": tp, "pp": pp, "ep": ep, "etp": etp, "cp": cp, "sp": sp, "zero": zero,
               "micro_batch": mbs, "seq_len": seq, "num_microbatches": mb, "vpp": vpp, "layout": layout,
               "schedule": "interleaved" if vpp > 1 else "1f1b",
               "overlap_grad_reduce": f.switch("--overlap-grad-reduce"),
               "overlap_param_gather": f.switch("--overlap-param-gather"),
               "ddp_bucket_size": f.int("--ddp-bucket-size", None, bound=LIMITS["bytes"])}
        if out["overlap_param_gather"] and not (out["overlap_grad_reduce"] and zero):
            raise ConfigError("--overlap-param-gather=on needs --overlap-grad-reduce and --use-distributed-optimizer "
                              "(Megatron-LM's rule)")
        return out

    def _world(self, tp: int, pp: int, cp: int) -> int:
        f = self.f
        model_ranks = tp * pp * cp
        if "dp" in self.over:
            dp = self.over["dp"]
            world = dp * model_ranks
            if self.world_arg is not None and self.world_arg != world:
                raise ConfigError(f"world_size={self.world_arg} but dp={dp} gives dp*tp*pp*cp={world}")
            self.overridden["dp"] = {"file": None, "given": dp}      # the file's DP needs the world size
            return world
        file_world = f.int("--world-size", None, bound=LIMITS["ranks"] * LIMITS["pp"])
        launcher = None
        nproc = f.values.get("--nproc_per_node") or f.values.get("--nproc-per-node")
        nnodes = f.values.get("--nnodes")
        number = re.compile(r"[0-9]{1,6}")
        if (nproc and len(nproc) == 1 and number.fullmatch(nproc[0])
                and (not nnodes or (len(nnodes) == 1 and number.fullmatch(nnodes[0])))):
            launcher = int(nproc[0]) * (int(nnodes[0]) if nnodes else 1) or None     # torchrun's own count
        if file_world is not None and launcher is not None and file_world != launcher:
            raise ConfigError(f"--world-size={file_world} but torchrun's --nproc_per_node and --nnodes give {launcher}")
        implied = file_world if file_world is not None else launcher
        world = self.world_arg if self.world_arg is not None else implied
        if world is None:
            raise ConfigError("world_size=unknown: give --world-size N, the number of GPUs (the flags do not say "
                              "how many there are)")
        if self.world_arg is not None and implied is not None and implied != self.world_arg:
            self.overridden["world_size"] = {"file": implied, "given": self.world_arg}
        if world % model_ranks:
            raise ConfigError(f"world_size={world} must be divisible by tp*pp*cp={model_ranks} "
                              f"(tp={tp}, pp={pp}, cp={cp})")
        return world

    def pipeline(self, layers: int, pp: int, mtp: int) -> tuple[tuple[int, ...], int]:
        """The layout and VPP of the file, or of the CLI's ``layout`` and ``vpp`` where given."""
        layout, vpp = self._file_pipeline(layers, pp, mtp)
        given_layout, given_vpp = self.over.get("layout"), self.over.get("vpp")
        if isinstance(given_layout, MegatronLayout):
            lay, lvpp = layout_stages(given_layout, pp, layers, mtp or None, name="layout")
            if given_vpp is not None and given_vpp != lvpp:
                raise ConfigError(f"vpp={given_vpp} but layout={given_layout} has {len(lay)} stages: vpp={lvpp} "
                                  f"on pp={pp}")
            new = (lay, lvpp)
        elif given_layout is not None:
            new = (tuple(given_layout), given_vpp or vpp)
        elif given_vpp is not None and given_vpp != vpp:
            if self.f.has("--pipeline-model-parallel-layout"):
                raise ConfigError(f"vpp={given_vpp} contradicts --pipeline-model-parallel-layout (vpp={vpp} on "
                                  f"pp={pp}); give a layout too")
            if given_vpp > 1 and pp == 1:
                raise ConfigError(f"vpp={given_vpp} needs pp > 1")
            new = (megatron_layout(layers, pp, given_vpp, *self._uneven), given_vpp)
        else:
            return layout, vpp
        for fld, file_value, value in (("layout", layout, new[0]), ("vpp", vpp, new[1])):
            if _plain(file_value) != _plain(value):
                self.overridden[fld] = {"file": file_value, "given": value}
        return new

    def _file_pipeline(self, layers: int, pp: int, mtp: int) -> tuple[tuple[int, ...], int]:
        f = self.f
        text = f.one("--pipeline-model-parallel-layout")
        nvs = f.int("--num-virtual-stages-per-pipeline-rank", None, "--virtual-pipeline-model-parallel-size")
        nlpvs = f.int("--num-layers-per-virtual-pipeline-stage", None)
        first = f.int("--decoder-first-pipeline-num-layers", None, "--num-layers-in-first-pipeline-stage")
        last = f.int("--decoder-last-pipeline-num-layers", None, "--num-layers-in-last-pipeline-stage")
        emb = f.switch("--account-for-embedding-in-pipeline-split")
        loss = f.switch("--account-for-loss-in-pipeline-split")
        self._uneven = (first, last, emb, loss)
        given = [n for n, v in (("--pipeline-model-parallel-layout", text),
                                ("--num-virtual-stages-per-pipeline-rank", nvs),
                                ("--num-layers-per-virtual-pipeline-stage", nlpvs)) if v is not None]
        if len(given) > 1:
            raise ConfigError(f"{given[0]}={f.text(given[0])} and {given[1]}={f.text(given[1])} contradict each "
                              f"other: Megatron-LM takes one of them")
        if text is not None:
            if first is not None or last is not None or emb or loss:
                raise ConfigError(f"--pipeline-model-parallel-layout={text} cannot be combined with uneven first/last "
                                  f"stages or --account-for-embedding/loss-in-pipeline-split (Megatron-Core refuses it)")
            layout, vpp = layout_stages(parse_layout(text), pp, layers, mtp or None)
        else:
            if nlpvs is not None:
                if first is not None or last is not None:
                    raise ConfigError(f"--num-layers-per-virtual-pipeline-stage={nlpvs} with uneven first/last stages: "
                                      f"Megatron-LM asks for --num-virtual-stages-per-pipeline-rank instead")
                n = layers + emb + loss
                if n % pp or (n // pp) % nlpvs:
                    raise ConfigError(f"--num-layers-per-virtual-pipeline-stage={nlpvs} must divide the "
                                      f"{n / pp:g} layers of each of the pp={pp} pipeline ranks")
                vpp = (n // pp) // nlpvs
            else:
                vpp = nvs or 1
            if vpp > 1 and pp == 1:
                raise ConfigError(f"virtual pipeline stages (vpp={vpp}) need --pipeline-model-parallel-size > 1")
            layout = megatron_layout(layers, pp, vpp, first, last, emb, loss)
        return layout, vpp

    # -- recomputation ---------------------------------------------------------------------------
    def recompute(self) -> dict:
        f = self.f
        gran = f.choice("--recompute-granularity", None, ("full", "selective"))
        if f.switch("--recompute-activations"):
            if gran == "full":
                raise ConfigError("--recompute-activations (selective) and --recompute-granularity=full contradict "
                                  "each other")
            gran = "selective"
        method = f.choice("--recompute-method", None, ("uniform", "block"))
        num = f.int("--recompute-num-layers", None, minimum=0, bound=LIMITS["num_hidden_layers"])
        modules = f.many("--recompute-modules")
        moe_layer = f.switch("--moe-layer-recompute")
        if moe_layer:
            if gran == "full":
                raise ConfigError("--moe-layer-recompute with --recompute-granularity=full: Megatron-Core refuses it")
            gran = "selective"
        if f.switch("--distribute-saved-activations"):
            self.not_modelled("--distribute-saved-activations")
        if method is not None and gran != "full":
            raise ConfigError(f"--recompute-method={method} needs --recompute-granularity full "
                              f"(granularity: {gran or 'none'})")
        if modules is not None and gran != "selective":
            raise ConfigError(f"--recompute-modules={' '.join(modules)} applies with --recompute-granularity selective "
                              f"only (granularity: {gran or 'none'})")
        if gran == "full":
            if method is None:
                raise ConfigError("--recompute-granularity=full needs --recompute-method uniform or block")
            if num is None:
                raise ConfigError("--recompute-granularity=full needs --recompute-num-layers")
            if method == "block":
                return {"recompute": f"full-block:{num}" if num else "none"}
            if num < 1:
                raise ConfigError("--recompute-num-layers=0 with --recompute-method=uniform: it must be at least 1")
            if num > 1:
                self.not_modelled("--recompute-num-layers", f"--recompute-num-layers={num} with uniform recompute "
                                  f"(memlib checkpoints every layer's input, as with 1)")
            return {"recompute": "full"}
        if gran == "selective":
            if num is not None:
                raise ConfigError(f"--recompute-num-layers={num} applies to --recompute-granularity full only "
                                  f"(Megatron-Core refuses it with selective)")
            mods = list(dict.fromkeys(modules or ("core_attn",)))
            if moe_layer and "moe" not in mods:
                mods.append("moe")
            bad = [x for x in mods if x not in RECOMPUTE_MODULES]
            if bad:
                raise ConfigError(f"--recompute-modules={bad[0]} is not a module memlib models "
                                  f"({', '.join(RECOMPUTE_MODULES)})")
            if "moe_act" in mods and not f.switch("--moe-grouped-gemm"):
                raise ConfigError("--recompute-modules=moe_act needs --moe-grouped-gemm (Megatron-Core's rule)")
            return {"recompute": ",".join(mods)}
        if num is not None:
            raise ConfigError(f"--recompute-num-layers={num} without --recompute-granularity full has no effect: "
                              f"give the granularity")
        return {"recompute": "none"}

    # -- kernels ---------------------------------------------------------------------------------
    def kernels(self, dense: bool) -> dict:
        f = self.f
        impl = f.choice("--transformer-impl", "transformer_engine", ("transformer_engine", "local",
                                                                     "inference_optimized"))
        if impl == "inference_optimized":
            raise ConfigError("--transformer-impl=inference_optimized is for inference; memlib models training")
        self.impl = TransformerImpl(impl)
        backend = f.choice("--attention-backend", "auto", tuple(x.value for x in AttnBackend))
        fusion = f.switch("--cross-entropy-loss-fusion")
        ce_impl = f.choice("--cross-entropy-fusion-impl", "native", ("native", "te"))
        if f.has("--cross-entropy-fusion-impl") and not self.version.has("cross_entropy_fusion_impl"):
            raise ConfigError(f"--cross-entropy-fusion-impl={ce_impl}: Megatron-LM {self.version.text} has no such flag "
                              f"(it came with 3b141a2471, 2025-04-05; --cross-entropy-loss-fusion runs the native kernel)")
        if fusion and ce_impl == "te" and self.version.has("te_cross_entropy_refused"):
            raise ConfigError(f"--cross-entropy-loss-fusion with --cross-entropy-fusion-impl=te: Megatron-LM "
                              f"{self.version.text} refuses it (from 168cb15d70, 2026-06-03; core_r0.18.0 and older "
                              f"accept it: give --megatron-version of the run)")
        self.deterministic = f.switch("--deterministic-mode")
        if fusion and self.deterministic:
            raise ConfigError("--deterministic-mode=on with --cross-entropy-loss-fusion: Megatron-LM refuses the pair")
        softmax_fp32 = f.switch("--attention-softmax-in-fp32") | f.switch("--apply-query-key-layer-scaling")
        cp_types = f.many("--cp-comm-type")
        cp_comm = "p2p"
        if cp_types is not None:
            types = ["allgather" if x == "all_gather" else x for x in cp_types]
            bad = [x for x in types if x not in CP_COMM_TYPES]
            if bad:
                raise ConfigError(f"--cp-comm-type={show(bad[0])} must be one of {', '.join(CP_COMM_TYPES)}")
            if len(set(types)) > 1:
                raise ConfigError(f"--cp-comm-type={' '.join(cp_types)}: memlib models one communication type for "
                                  f"every layer")
            cp_comm = types[0]
        out = {"cp_comm_type": cp_comm, "hidden_dropout": f.number("--hidden-dropout", Fraction(1, 10)),
               "attention_dropout": f.number("--attention-dropout", Fraction(1, 10)),
               "megatron_version": self.version.text}
        out |= {"transformer_impl": impl, "attention_backend": backend, "attention_softmax_in_fp32": softmax_fp32,
               "bias_swiglu_fusion": not f.switch("--no-bias-swiglu-fusion"), "cross_entropy_loss_fusion": fusion,
               "cross_entropy_fusion_impl": ce_impl, "moe_a2a_overlap": f.switch("--overlap-moe-expert-parallel-comm")}
        offload = f.switch("--fine-grained-activation-offloading")
        mods = f.many("--offload-modules")
        if mods is not None and not offload:
            raise ConfigError(f"--offload-modules={' '.join(mods)} applies with --fine-grained-activation-offloading only")
        if offload:
            if mods is None:
                raise ConfigError("--fine-grained-activation-offloading=on needs --offload-modules (Megatron-Core's rule)")
            if impl != "transformer_engine":
                raise ConfigError(f"--fine-grained-activation-offloading=on needs --transformer-impl transformer_engine "
                                  f"(--transformer-impl={impl})")
            bad = [x for x in mods if x not in OFFLOAD_MODULES]
            if bad:
                raise ConfigError(f"--offload-modules={bad[0]} is not one of {', '.join(OFFLOAD_MODULES)}")
            out["offload_modules"] = tuple(dict.fromkeys(mods))
        out["moe_aux_loss"] = LoadBalancing.NONE if dense else self.load_balancing()
        return out

    def load_balancing(self) -> LoadBalancing:
        f = self.f
        types = f.many("--moe-router-load-balancing-type") or ("aux_loss",)
        coeffs = [_fraction("--moe-aux-loss-coeff", c) for c in (f.many("--moe-aux-loss-coeff") or ("0",))]
        choices = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none")
        for t in types:
            if t not in choices:
                raise ConfigError(f"--moe-router-load-balancing-type={show(t)} must be one of {', '.join(choices)}")
        if len(coeffs) not in (1, len(types)):
            raise ConfigError(f"--moe-aux-loss-coeff={' '.join(map(str, coeffs))} has {len(coeffs)} values for "
                              f"{len(types)} load-balancing types")
        coeff = coeffs * len(types) if len(coeffs) == 1 else coeffs
        active = [t for t, c in zip(types, coeff) if c > 0 and t != "none"]
        if "sinkhorn" in types:
            raise ConfigError("--moe-router-load-balancing-type=sinkhorn cannot be expressed (memlib: seq_aux_loss, "
                              "aux_loss or none)")
        if not active:
            return LoadBalancing.NONE
        if len(active) > 1 or active[0] not in ("seq_aux_loss", "aux_loss"):
            raise ConfigError(f"--moe-router-load-balancing-type={' '.join(active)} (with a positive "
                              f"--moe-aux-loss-coeff) cannot be expressed (memlib: one of seq_aux_loss, aux_loss)")
        return LoadBalancing(active[0])

    # -- precision -------------------------------------------------------------------------------
    def precision(self, zero: int) -> dict:
        f = self.f
        bf16, fp16 = f.switch("--bf16"), f.switch("--fp16")
        fp8 = f.choice("--fp8-format", None, FP8_FORMATS)
        fp8_recipe = f.choice("--fp8-recipe", "delayed", FP8_RECIPES)
        if f.has("--fp8-recipe") and fp8 is None:
            raise ConfigError(f"--fp8-recipe={fp8_recipe} needs --fp8-format (Megatron-LM ignores it otherwise)")
        fp8_param = f.switch("--fp8-param-gather")
        if fp8_param and fp8 is None:
            raise ConfigError("--fp8-param-gather=on needs --fp8-format")
        if fp8_param and zero < 1:
            raise ConfigError("--fp8-param-gather=on needs --use-distributed-optimizer (Megatron-LM's rule)")
        pao = f.switch("--use-precision-aware-optimizer")
        dtypes = {flag: f.choice(flag, "fp32", choices) for flag, choices in _DTYPE_FLAGS.items()}
        grad_bf16 = f.switch("--grad-reduce-in-bf16")
        acc32 = f.switch("--accumulate-allreduce-grads-in-fp32")
        if grad_bf16 and acc32:
            raise ConfigError("--grad-reduce-in-bf16=on and --accumulate-allreduce-grads-in-fp32=on contradict each other")
        if grad_bf16 and not bf16:
            raise ConfigError("--grad-reduce-in-bf16=on needs --bf16")
        if acc32 and bf16 and dtypes["--main-grads-dtype"] != "fp32":
            raise ConfigError(f"--accumulate-allreduce-grads-in-fp32=on needs --main-grads-dtype fp32 (--main-grads-dtype={dtypes['--main-grads-dtype']})")
        if f.switch("--optimizer-cpu-offload"):
            self.not_modelled("--optimizer-cpu-offload", "--optimizer-cpu-offload (memlib keeps the optimizer states "
                                                         "on the GPU)")
        opt = f.choice("--optimizer", "adam", ("adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"))
        if opt != "adam":
            raise ConfigError(f"--optimizer={opt} cannot be expressed: memlib's recipes are Adam's (two moments)")
        spec = precision_spec(bf16=bf16, fp16=fp16, fp8_param_gather=fp8_param, grad_reduce_in_bf16=grad_bf16,
                              accumulate_in_fp32=acc32, precision_aware=pao,
                              main_grads=dtypes["--main-grads-dtype"], main_params=dtypes["--main-params-dtype"],
                              exp_avg=dtypes["--exp-avg-dtype"], exp_avg_sq=dtypes["--exp-avg-sq-dtype"],
                              fp8=fp8, fp8_recipe=fp8_recipe)
        if fp8 is not None:
            mods = self.f.values.get("--recompute-modules", ())
            if fp8_recipe == "delayed" and self.f.values.get("--recompute-granularity") == ("selective",) and (
                    "moe_act" in mods or "layernorm" in mods):
                raise ConfigError("--fp8-recipe=delayed with --recompute-modules moe_act or layernorm: Megatron-Core "
                                  "refuses it")
        return {"precision": spec, "fp8": fp8, "fp8_recipe": fp8_recipe}

    # -- the CLI's explicit options --------------------------------------------------------------
    def apply_overrides(self, kw: dict) -> dict:
        out = dict(kw)
        for fld in OVERRIDABLE:
            if fld in self.over and fld not in _EARLY:
                self._set(out, fld, self.over[fld])
        return out

    def _set(self, out: dict, fld: str, given) -> None:
        file_value = out.get(fld)
        if _plain(file_value) != _plain(given):
            self.overridden[fld] = {"file": file_value, "given": given}
        out[fld] = given
