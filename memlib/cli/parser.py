"""The command line's parser: every sub-command's options, their types and one-line errors."""
from __future__ import annotations

import argparse
import re

from ..config import (FP8_FORMATS, FP8_RECIPES, LIMITS, OFFLOAD_MODULES, PAPER_TRAINING, ConfigError, TrainingConfig,
                      parse_count, show)
from ..config.strategies import (CP_COMM_TYPES, AttnBackend, CrossEntropyFusionImpl, LoadBalancing, Runtime,
                                 TransformerImpl)
from ..config.precision import RECIPES
from ..config.versions import MEGATRON_COMMIT, MEGATRON_COMMIT_DATE
from ..core.units import parse_number


_QUOTED = re.compile(r"'([^']{60,})'")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (a long value it quotes, shortened)."""

    def error(self, message):  # noqa: D401 - argparse API
        one_line = " ".join(message.split())
        raise ConfigError(_QUOTED.sub(lambda mo: show(mo.group(1)), one_line))


def _integer(name: str, text: str, minimum: int = 1) -> int:
    """An integer option: :func:`memlib.config.parse_count`, the one parser of every integer memlib reads."""
    return parse_count(name, text, minimum=minimum)


def _count(name: str, minimum: int = 1):
    def parse(text: str) -> int:
        try:
            return _integer(name, text, minimum)
        except ConfigError as exc:           # argparse reports a type error as "argument --x: ..."
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = name
    return parse


def _layout(text: str):
    """A comma list of layer counts, or a Megatron-LM layout string (``Et|(tt|)*30mL``)."""
    if any(c in text for c in "EtmL|"):
        from ..megatron.layout import parse_layout

        try:
            return parse_layout(text, name="layout")
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parts = text.split(",")
    if len(parts) > LIMITS["virtual_stages"]:
        raise argparse.ArgumentTypeError(f"layout has {len(parts)} entries, more than {LIMITS['virtual_stages']} stages")
    try:
        return tuple(_integer("layout entry", x, minimum=0) for x in parts)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"layout={show(text)} must be a comma-separated list of non-negative layer counts, e.g. 4,4,4,1") from None


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="memlib", description="GPU memory of DeepSeek-style MoE training, exactly.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    pp = sub.add_parser("params", help="parameter counts of a model")
    pp.add_argument("--model", default="deepseek-v3", help="preset name or path to a config.json")
    pp.add_argument("--json", action="store_true", help="machine-readable output")

    pf = sub.add_parser("formula", help="print an equation of the book (plain text or LaTeX)",
                        description="Prints the equation NAME exactly as the book displays it (its number "
                                    "is in --list), for the structure of --model.")
    pf.add_argument("name", nargs="?", default=None, help="formula name; omit it (or --list) to list them")
    pf.add_argument("--model", default="deepseek-v3", help="model whose structure the formula follows")
    pf.add_argument("--latex", action="store_true", help="print the LaTeX the book renders")
    pf.add_argument("--expand", action="store_true",
                    help="print the right-hand side with every named block written out (ready to substitute)")
    pf.add_argument("--list", action="store_true", help="list the formulas with their numbers in the book")

    d = PAPER_TRAINING
    pe = sub.add_parser("estimate", help="per-stage memory per device",
                        description="Defaults are the paper's configuration: DeepSeek-V3, "
                                    "PP16@TP2@EP8@ETP1, DP32, ZeRO 0, precision paper.")
    pe.add_argument("--model", default="deepseek-v3", help="preset name or path to a config.json")
    for name, helptext in (("dp", "data-parallel size"), ("tp", "tensor-parallel size"),
                           ("pp", "pipeline stages"), ("ep", "expert-parallel size"),
                           ("etp", "expert tensor-parallel size"), ("cp", "context-parallel size")):
        pe.add_argument(f"--{name}", type=_count(name), default=getattr(d, name),
                        help=f"{helptext} (default {getattr(d, name)})")
    pe.add_argument("--no-sp", dest="sp", action="store_false", help="disable sequence parallelism")
    pe.add_argument("--layout", type=_layout, default=None,
                    help="decoder layers per stage, e.g. 4,4,...,4,1 (default: ceil(l/pp) per stage, remainder "
                         "last), or a Megatron-LM layout such as 'Et|(tt|)*30mL' (its stages set --vpp)")
    pe.add_argument("--zero", type=_count("zero", 0), default=d.zero, help="ZeRO stage: 0, 1, 2 or 3")
    pe.add_argument("--precision", default=d.precision,
                    help=f"precision recipe: {', '.join(RECIPES)}, or a spec BASE:FIELD=BYTES,... such as "
                         f"megatron:exp_avg=bf16,exp_avg_sq=bf16 (fields: weights, gradients, activations, "
                         f"master_weights, main_grad, exp_avg, exp_avg_sq)")
    pe.add_argument("--profile", default=d.profile, help="partition convention: paper or megatron")
    pe.add_argument("--micro-batch", type=_count("micro_batch"), default=d.micro_batch, help=f"b, sequences per micro-batch (default {d.micro_batch})")
    pe.add_argument("--seq-len", type=_count("seq_len"), default=d.seq_len, help=f"s, tokens per sequence (default {d.seq_len})")
    pe.add_argument("--recompute", default=d.recompute,
                    help="none, selective, deepseek, full, full-block:K, or a comma list of modules "
                         "(core_attn, layernorm, mla_up_proj, mlp, moe_act, moe, shared_experts)")
    pe.add_argument("--schedule", default=d.schedule, help="gpipe, 1f1b, interleaved or dualpipe (default 1f1b)")
    pe.add_argument("--num-microbatches", type=_count("num_microbatches"), default=None,
                    help="M per step (default: enough to fill the pipeline)")
    pe.add_argument("--vpp", type=_count("vpp"), default=1, help="V, model chunks per device (interleaved schedule)")
    _kernel_options(pe, d)
    _carried_options(pe, d)
    _framework_options(pe)
    pe.add_argument("--megatron-args", default=None, metavar="FILE",
                    help="Megatron-LM flags: a launch script, a flag list or a test's model_config.yaml ('-': "
                         "standard input); the model and training configuration come from it, options given "
                         "here override it")
    pe.add_argument("--world-size", type=_count("world_size"), default=None,
                    help="with --megatron-args: the number of GPUs (when the file does not say)")
    pe.add_argument("--vocab-size", type=_count("vocab_size"), default=None,
                    help="with --megatron-args: the tokenizer's vocabulary before Megatron's padding")
    pe.add_argument("--gpu-memory", default=None, help="device capacity, e.g. 80GiB or 80GB: adds 'fits'")
    pe.add_argument("--gpu", default=None, metavar="NAME",
                    help="the GPU (A100, H100, H800, H200, B200, GB200): sizes the framework's workspaces in the "
                         "predicted peak (default: a Hopper GPU) and, without --gpu-memory, gives the capacity "
                         "its driver reports (nvidia-smi's total, memlib.device.overhead.DEVICE_MEMORY): adds 'fits'")
    pe.add_argument("--overhead", default="low", help="overhead preset: low, high or none (default low)")
    pe.add_argument("--cuda-context", default=None, help="CUDA context size, e.g. 500MiB (overrides the preset)")
    pe.add_argument("--comm-buffers", default=None, help="communication buffers, e.g. 2GiB (overrides the preset)")
    pe.add_argument("--fragmentation", default=None, help="fraction of allocated memory, e.g. 0.1 (overrides the preset)")
    pe.add_argument("--unit", default="GiB", choices=("GiB", "GB"), help="unit of the readable table")
    pe.add_argument("--json", action="store_true", help="machine-readable output")

    pl = sub.add_parser("plan", help="every parallel configuration of N GPUs that fits, ranked by a step-time model",
                        description="Enumerates every valid configuration of --gpus GPUs in the practical space (DP TP "
                                    "PP CP = N, EP, ETP, ZeRO stages, micro-batch sizes, the allowed profiles, "
                                    "precisions, recompute policies, schedules and layouts; --space full for every one), "
                                    "keeps those whose peak stage fits the GPU's memory (estimate's total, to the byte) "
                                    "and ranks them by the predicted step time of memlib.search.cost (the slowest "
                                    "pipeline rank's FLOPs at the GPU's peak times a calibrated efficiency, the "
                                    "communication that is not overlapped on the link each group spans, the bubble, "
                                    "the data-parallel synchronisation, the optimizer step): every term is shown.")
    pl.add_argument("--model", default="deepseek-v3", help="preset name or path to a config.json")
    pl.add_argument("--gpus", type=_count("gpus"), required=True, help="N, the number of GPUs")
    pl.add_argument("--gpu", default="H100", metavar="NAME",
                    help="the GPU the step is priced for: A100, H100, H800, H200 or B200 (default H100; "
                         "memlib.search.cost.GPUS, each from its datasheet); without --gpu-memory also the capacity "
                         "its driver reports")
    pl.add_argument("--gpu-memory", default=None, help="device capacity, e.g. 80GB or 141GB (default: --gpu's)")
    for name, what in (("flops", "dense BF16 FLOP/s of one GPU, e.g. 989e12"),
                       ("hbm-bandwidth", "HBM bytes/s of one GPU, e.g. 3.35e12"),
                       ("nvlink", "NVLink bytes/s per GPU in one direction, e.g. 450e9"),
                       ("network", "network bytes/s per GPU across nodes, e.g. 50e9"),
                       ("efficiency", "achieved over peak FLOP/s of the computation, in (0, 1] (default: the "
                                      "calibrated one, memlib.search.cost.EFFICIENCY)")):
        pl.add_argument(f"--{name}", default=None, help=f"override --gpu's: {what}")
    pl.add_argument("--gpus-per-node", type=_count("gpus_per_node"), default=None,
                    help="GPUs per NVLink node (default 8): the links groups span, and the largest TP searched")
    pl.add_argument("--cp-comm", default="p2p", choices=("p2p", "a2a"),
                    help="context parallelism's communication, priced (default p2p, Megatron-Core's default)")
    pl.add_argument("--space", default="practical", choices=("practical", "full"),
                    help="practical (default): TP within a node, >= --min-cp-tokens tokens per CP rank, ETP 1 for "
                         "fine-grained experts, the megatron profile's ZeRO 0 and 1 (memlib.search.plan.Space); "
                         "full: every configuration the library allows")
    pl.add_argument("--min-cp-tokens", type=_count("min_cp_tokens"), default=None,
                    help="tokens per CP rank at least (default 4096 in the practical space; 1: no rule)")
    pl.add_argument("--tp-across-nodes", action="store_true", help="allow TP beyond the GPUs of a node")
    pl.add_argument("--any-etp", action="store_true", help="ETP 1 or TP for fine-grained experts too")
    pl.add_argument("--seq-len", type=_count("seq_len"), default=4096, help="s, tokens per sequence (default 4096)")
    pl.add_argument("--global-batch", type=_count("global_batch"), default=None,
                    help="B, sequences per step (default 15360, DeepSeek-V3's)")
    pl.add_argument("--profile", default="megatron", help="comma list of profiles (default megatron)")
    pl.add_argument("--precision", default="megatron", help="comma list of precision recipes (default megatron)")
    pl.add_argument("--recompute", default="none,selective,full",
                    help="comma list of recompute policies (default none,selective,full); a module list is "
                         "joined by '+', e.g. layernorm+mla_up_proj")
    pl.add_argument("--schedule", default="1f1b,interleaved,dualpipe",
                    help="comma list of schedules (default 1f1b,interleaved,dualpipe)")
    pl.add_argument("--zero", default=None,
                    help="comma list of ZeRO stages (default 0,1,2,3; the megatron profile's 0,1 in the practical space)")
    pl.add_argument("--layout-rule", default="default,balanced", help="comma list: default, balanced")
    pl.add_argument("--fix", action="append", default=[], metavar="K=V,...",
                    help="pin knobs: dp, tp, pp, ep, etp, cp, zero, b, vpp (e.g. tp=1,pp=16); a pinned knob is "
                         "not held to the practical space's rule")
    pl.add_argument("--max-micro-batch", type=_count("max_micro_batch"), default=16,
                    help="largest micro-batch size searched (default 16)")
    pl.add_argument("--max-vpp", type=_count("max_vpp", 2), default=4,
                    help="most model chunks per rank for the interleaved schedule (default 4)")
    pl.add_argument("--overhead", default="low", help="overhead preset: low, high or none (default low)")
    pl.add_argument("--top", type=_count("top", 0), default=10,
                    help=f"configurations listed (default 10, at most {LIMITS['top']:,})")
    pl.add_argument("--unit", default="GiB", choices=("GiB", "GB"), help="unit of the readable table")
    pl.add_argument("--json", action="store_true", help="machine-readable output")

    pm = sub.add_parser("measure", help="measured against predicted activation bytes (needs memlib[measure])",
                        description="Builds the model with random weights on the CPU, runs one training forward "
                                    "pass with labels and counts what autograd saves for backward, per layer and "
                                    "per tensor, beside the activation ledger's prediction; then gradient (and "
                                    "optimizer-state) bytes after backward. --framework transformers (default): "
                                    "Hugging Face transformers against the hf-eager ledger. --framework "
                                    "megatron-core: Megatron-Core's GPTModel (transformer_impl local) against the "
                                    "megatron ledger, with its parameters and main_grad buffers. Exit code 0 only "
                                    "when every number agrees.")
    pm.add_argument("--framework", default="transformers", choices=("transformers", "megatron-core"),
                    help="the implementation measured (default transformers)")
    pm.add_argument("--model", required=True, help="preset name or path to a config.json (keep it small)")
    pm.add_argument("--micro-batch", type=_count("micro_batch"), default=1, help="b, sequences per micro-batch (default 1)")
    pm.add_argument("--seq-len", type=_count("seq_len"), default=16, help="s, tokens per sequence (default 16)")
    pm.add_argument("--profile", default=None,
                    help="activation ledger to compare with (default hf-eager; megatron for megatron-core)")
    pm.add_argument("--recompute", default="none", help="megatron-core: recompute policy (as for estimate)")
    pm.add_argument("--precision", default="megatron", choices=("megatron", "fp32"),
                    help="megatron-core: megatron (bf16, Float16Module, fp32 main grads) or fp32 (default megatron)")
    _kernel_options(pm, TrainingConfig(transformer_impl=TransformerImpl.LOCAL), measure=True)
    pm.add_argument("--seed", type=_count("seed", 0), default=0, help="seed of the random weights and tokens (default 0)")
    pm.add_argument("--no-step", dest="step", action="store_false", help="skip backward and the optimizer step")
    pm.add_argument("--peak", action="store_true",
                    help="megatron-core: the allocation of whole training steps instead (two iterations of M "
                         "micro-batches and the optimizer step): before, peak per phase, after, max")
    pm.add_argument("--num-microbatches", type=_count("num_microbatches"), default=1,
                    help="with --peak: M micro-batches per step (default 1)")
    pm.add_argument("--no-distributed-optimizer", dest="distributed_optimizer", action="store_false",
                    help="with --peak: megatron-core's optimizer without the distributed optimizer")
    pm.add_argument("--adam", default="fused", choices=("fused", "foreach"),
                    help="with --peak: torch's Adam standing in for Transformer Engine's FusedAdam (default fused)")
    pm.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _kernel_options(p: argparse.ArgumentParser, d: TrainingConfig, measure: bool = False) -> None:
    """The megatron profile's kernel choices, spelled as Megatron-LM's arguments."""
    if not measure:
        p.add_argument("--transformer-impl", default=d.transformer_impl.value,
                       choices=[x.value for x in TransformerImpl],
                       help=f"megatron profile: modules built from (default {d.transformer_impl})")
        p.add_argument("--attention-backend", default=d.attention_backend.value, choices=[x.value for x in AttnBackend],
                       help=f"megatron profile: attention kernel; local and unfused keep the s x s probabilities "
                            f"(default {d.attention_backend})")
        p.add_argument("--cross-entropy-fusion-impl", default=d.cross_entropy_fusion_impl.value,
                       choices=[x.value for x in CrossEntropyFusionImpl],
                       help="megatron profile: with --cross-entropy-loss-fusion (default native)")
    p.add_argument("--attention-softmax-in-fp32", action="store_true",
                   help="megatron profile: the s x s softmax in fp32 (local and unfused attention)")
    p.add_argument("--no-bias-swiglu-fusion", dest="bias_swiglu_fusion", action="store_false",
                   help="megatron profile: unfused SwiGLU (keeps SiLU(gate) and up as well)")
    p.add_argument("--cross-entropy-loss-fusion", action="store_true",
                   help="megatron profile: fused cross-entropy (see --cross-entropy-fusion-impl)")
    p.add_argument("--moe-router-load-balancing-type", dest="moe_aux_loss", default=d.moe_aux_loss.value,
                   choices=[x.value for x in LoadBalancing],
                   help=f"megatron profile: the auxiliary loss (default {d.moe_aux_loss}, as DeepSeek-V3)")


def _framework_options(p: argparse.ArgumentParser) -> None:
    """How the framework around the model is built (memlib.device.peak.Framework), spelled as Megatron-LM's
    arguments where it has them; unset, the --megatron-args run's or memlib's defaults (a DeepSeek-V3-style
    run) hold."""
    p.add_argument("--no-gradient-accumulation-fusion", dest="gradient_accumulation_fusion", action="store_false",
                   default=None, help="megatron profile: each weight gradient a tensor of its own, added to main_grad "
                                      "(Megatron-LM's flag)")
    p.add_argument("--no-rope-fusion", dest="rope_fusion", action="store_false", default=None,
                   help="megatron profile: RoPE unfused (Megatron-LM's flag)")
    p.add_argument("--no-moe-grouped-gemm", dest="moe_grouped_gemm", action="store_false", default=None,
                   help="megatron profile: the experts as one Linear pair each (memlib assumes --moe-grouped-gemm)")
    p.add_argument("--no-moe-permute-fusion", dest="permute_fusion", action="store_false", default=None,
                   help="megatron profile: the token permutation unfused (memlib assumes --moe-permute-fusion)")
    p.add_argument("--create-attention-mask-in-dataloader", dest="attention_mask_in_batch", action="store_true",
                   default=None, help="megatron profile: the data loader's [b, 1, s, s] bool attention mask is in "
                                      "every micro-batch (Megatron-LM's default; memlib's is off)")
    p.add_argument("--no-create-attention-mask-in-dataloader", dest="attention_mask_in_batch",
                   action="store_false", default=None,
                   help="megatron profile: no attention mask in the batch (Megatron-LM's flag)")
    p.add_argument("--deterministic-mode", dest="deterministic", action="store_true", default=None,
                   help="megatron profile: deterministic kernels (Megatron-LM's flag): the embedding's backward "
                        "without partial sums")
    p.add_argument("--cublas-workspace-config", default=None, metavar=":SIZE:COUNT", type=_cublas_config,
                   help="megatron profile: the CUBLAS_WORKSPACE_CONFIG environment variable (KiB and count per "
                        "pair), which sets torch's cuBLAS workspaces")
    p.add_argument("--no-expandable-segments", dest="expandable_segments", action="store_false", default=None,
                   help="megatron profile: PYTORCH_CUDA_ALLOC_CONF without expandable_segments:True (the caching "
                        "allocator rounds large tensors to fresh segments)")
    p.add_argument("--rerun-mode", dest="rerun_mode", default=None,
                   choices=("disabled", "validate_results", "report_stats"),
                   help="megatron profile: Megatron-LM's rerun state machine (default validate_results); it saves "
                        "the step's micro-batches, which some versions keep on the GPU (docs/megatron_versions.md)")
    p.add_argument("--moe-token-dispatcher-type", dest="token_dispatcher", default=None,
                   choices=("alltoall", "allgather", "flex"),
                   help="megatron profile: the MoE token dispatcher (default alltoall)")
    p.add_argument("--runtime", default=TrainingConfig().runtime.value, choices=[x.value for x in Runtime],
                   help="where torch runs: cuda (a GPU, default) or cpu (memlib's measured ground truth: torch's "
                        "composite RMSNorm, Megatron's compiled functions run eagerly)")


def _carried_options(p: argparse.ArgumentParser, d: TrainingConfig) -> None:
    """Megatron-LM features: FP8 compute, overlap, offloading, uneven routing, DDP buckets."""
    p.add_argument("--fp8-format", dest="fp8", default=d.fp8, choices=FP8_FORMATS,
                   help="Megatron-LM's FP8 compute format: Linear inputs saved in FP8")
    p.add_argument("--fp8-recipe", default=d.fp8_recipe, choices=FP8_RECIPES,
                   help=f"Megatron-LM's FP8 scaling recipe (default {d.fp8_recipe}): the scales saved beside FP8 activations")
    p.add_argument("--overlap-moe-expert-parallel-comm", dest="moe_a2a_overlap", action="store_true",
                   help="overlap the MoE all-to-all with computation: one more layer's forward at the peak")
    p.add_argument("--offload-modules", type=_modules, default=d.offload_modules,
                   help="fine-grained activation offloading, a comma list of " + ", ".join(OFFLOAD_MODULES)
                        + ": their inputs move to the host")
    p.add_argument("--overlap-grad-reduce", action="store_true", help="overlap the gradient reduction (bucketed gradient buffers)")
    p.add_argument("--overlap-param-gather", action="store_true",
                   help="overlap the parameter all-gather; needs --overlap-grad-reduce and ZeRO >= 1")
    p.add_argument("--routing-imbalance", type=_imbalance, default=d.routing_imbalance,
                   help="the busiest rank's routed tokens over the balanced share, >= 1, e.g. 1.25")
    p.add_argument("--ddp-bucket-size", type=_count("ddp_bucket_size"), default=d.ddp_bucket_size,
                   help="elements per gradient bucket (Megatron-Core's DDP)")
    p.add_argument("--cp-comm-type", default=d.cp_comm_type, choices=CP_COMM_TYPES,
                   help=f"context parallelism's communication (default {d.cp_comm_type}); a2a and a2a+p2p keep one more "
                        f"attention output per layer")
    p.add_argument("--hidden-dropout", type=_probability("hidden_dropout"), default=d.hidden_dropout,
                   help="the residual stream's dropout probability (default 0; Megatron-LM's own default, 0.1, "
                        "applies when --megatron-args does not give it): one bool mask per bias-dropout-add")
    p.add_argument("--attention-dropout", type=_probability("attention_dropout"), default=d.attention_dropout,
                   help="the attention probabilities' dropout (default 0; Megatron-LM's 0.1 with --megatron-args): "
                        "a mask and the dropped probabilities where the s x s probabilities are kept")
    p.add_argument("--megatron-version", default=d.megatron_version,
                   help="the Megatron-LM whose flag rules apply: a release (core_r0.14.0), a date of the main branch "
                        "(YYYY-MM-DD) or a commit with its date (abc1234@YYYY-MM-DD); default: the commit memlib "
                        f"reads, {MEGATRON_COMMIT[:10]} ({MEGATRON_COMMIT_DATE}). See docs/megatron_versions.md")


def _modules(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _probability(name: str):
    def parse(text: str):
        try:
            return parse_number(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{name}={show(text)} {exc}") from None
    return parse


def _cublas_config(text: str):
    from ..device.megatron_buffers import cublas_workspace_pairs
    try:
        cublas_workspace_pairs(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _imbalance(text: str):
    try:
        return parse_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"routing_imbalance={show(text)} {exc}") from None


#: ``estimate`` options that are TrainingConfig fields (an explicit one overrides --megatron-args)
_TRAIN_OPTIONS = ("dp", "tp", "pp", "ep", "etp", "cp", "sp", "layout", "zero", "precision", "profile", "micro_batch",
                  "seq_len", "recompute", "schedule", "num_microbatches", "vpp", "transformer_impl",
                  "attention_backend", "attention_softmax_in_fp32", "bias_swiglu_fusion", "cross_entropy_loss_fusion",
                  "cross_entropy_fusion_impl", "moe_aux_loss", "fp8", "fp8_recipe", "moe_a2a_overlap",
                  "offload_modules", "overlap_grad_reduce", "overlap_param_gather", "routing_imbalance",
                  "ddp_bucket_size", "cp_comm_type", "hidden_dropout", "attention_dropout", "megatron_version",
                  "runtime")
#: the estimate options that set memlib.device.peak.Framework fields (None: not given)
_FRAMEWORK_OPTIONS = ("gradient_accumulation_fusion", "rope_fusion", "moe_grouped_gemm", "permute_fusion",
                      "token_dispatcher", "attention_mask_in_batch", "deterministic", "cublas_workspace_config",
                      "expandable_segments", "rerun_mode")


def _explicit(argv: list[str]) -> set[str]:
    """The ``estimate`` options given on the command line (not left at their defaults)."""
    p = _parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices["estimate"]
    for action in sub._actions:
        action.default = argparse.SUPPRESS
    return set(vars(p.parse_args(argv))) - {"command"}
