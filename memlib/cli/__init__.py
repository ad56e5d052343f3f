"""The ``memlib`` command line.

``memlib params``   parameter counts of a model (total, activated, MTP, per component).
``memlib estimate`` per-stage, per-device memory under a training configuration.
``memlib measure``  measured against predicted activation bytes (needs ``pip install memlib[measure]``;
                    ``--framework megatron-core`` also megatron-core 0.19.2).

Output with ``--json`` is a contract: keys are added by later versions, never renamed.  Bad input
prints one line on stderr naming the field, its value and the rule, and exits with code 2.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from ..config import FP8_FORMATS, FP8_RECIPES, LIMITS, OFFLOAD_MODULES, PAPER_TRAINING, ConfigError, TrainingConfig, \
    load_model, show
from ..config.strategies import AttnBackend, CrossEntropyFusionImpl, LoadBalancing, TransformerImpl
from ..model.params import activated_params, buffer_params, by_block, model_params, mtp_params, values
from ..model.states import RECIPES
from ..core.symbols import latex
from ..core.units import fmt_bytes, fmt_count, parse_bytes, parse_number

__all__ = ["main"]


_QUOTED = re.compile(r"'([^']{60,})'")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (a long value it quotes, shortened)."""

    def error(self, message):  # noqa: D401 - argparse API
        one_line = " ".join(message.split())
        raise ConfigError(_QUOTED.sub(lambda mo: show(mo.group(1)), one_line))


_DIGITS = 20   # an integer option has at most this many digits (the LIMITS are far below 10^20)


def _integer(name: str, text: str, minimum: int = 1) -> int:
    """An integer option, read without converting an unbounded string: plain ASCII digits (an
    optional minus sign, so that a negative value is named as such), at most 20 of them."""
    t = text.strip()
    body = t[1:] if t.startswith("-") else t
    if body and len(body) > _DIGITS and all("0" <= c <= "9" for c in body):
        raise ConfigError(f"{name}={show(text)} has {len(body)} digits, more than any size memlib accepts")
    if not body or len(body) > _DIGITS or not all("0" <= c <= "9" for c in body):
        rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{name}={show(text)} must be {rule}")
    return int(t)


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

    pl = sub.add_parser("plan", help="every parallel configuration of N GPUs that fits, ranked",
                        description="Enumerates every valid configuration of --gpus GPUs (DP TP PP CP = N, EP, ETP, "
                                    "ZeRO 0-3, micro-batch sizes, the allowed profiles, precisions, recompute "
                                    "policies, schedules and layouts), keeps those whose peak stage fits "
                                    "--gpu-memory (estimate's total, to the byte) and ranks them by a stated cost "
                                    "model (memlib.search.plan: pipeline bubble, recomputation, communication volume). "
                                    "Not a throughput simulator: every term is shown.")
    pl.add_argument("--model", default="deepseek-v3", help="preset name or path to a config.json")
    pl.add_argument("--gpus", type=_count("gpus"), required=True, help="N, the number of GPUs")
    pl.add_argument("--gpu-memory", required=True, help="device capacity, e.g. 80GB or 141GB")
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
    pl.add_argument("--zero", default="0,1,2,3", help="comma list of ZeRO stages (default 0,1,2,3)")
    pl.add_argument("--layout-rule", default="default,balanced", help="comma list: default, balanced")
    pl.add_argument("--fix", action="append", default=[], metavar="K=V,...",
                    help="pin knobs: dp, tp, pp, ep, etp, cp, zero, b, vpp (e.g. tp=1,pp=16)")
    pl.add_argument("--max-micro-batch", type=_count("max_micro_batch"), default=16,
                    help="largest micro-batch size searched (default 16)")
    pl.add_argument("--max-vpp", type=_count("max_vpp"), default=4,
                    help="most model chunks per rank for the interleaved schedule (default 4)")
    pl.add_argument("--overhead", default="low", help="overhead preset: low, high or none (default low)")
    pl.add_argument("--top", type=_count("top"), default=10, help="configurations listed (default 10)")
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


def _modules(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


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
                  "ddp_bucket_size")


def _explicit(argv: list[str]) -> set[str]:
    """The ``estimate`` options given on the command line (not left at their defaults)."""
    p = _parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices["estimate"]
    for action in sub._actions:
        action.default = argparse.SUPPRESS
    return set(vars(p.parse_args(argv))) - {"command"}


def _kernel_kwargs(args) -> dict:
    out = {"attention_softmax_in_fp32": args.attention_softmax_in_fp32, "bias_swiglu_fusion": args.bias_swiglu_fusion,
           "cross_entropy_loss_fusion": args.cross_entropy_loss_fusion, "moe_aux_loss": args.moe_aux_loss}
    for name in ("transformer_impl", "attention_backend", "cross_entropy_fusion_impl"):
        if hasattr(args, name):
            out[name] = getattr(args, name)
    return out


def _params(args) -> int:
    m = load_model(args.model)
    vals = values(m)
    total = model_params(m)
    out = {
        "model": m.name,
        "total": total.evaluate_total(vals),
        "activated": activated_params(m).evaluate_total(vals),
        "mtp": mtp_params(m).evaluate_total(vals),
        "components": by_block(total).evaluate(vals),
        "mtp_components": by_block(mtp_params(m)).evaluate(vals),
        "buffers": buffer_params(m).evaluate(vals),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{m.name}: {fmt_count(out['total'])} parameters (main model), "
          f"{fmt_count(out['activated'])} activated per token, {fmt_count(out['mtp'])} in MTP modules")
    width = max(map(len, out["components"]))
    for k, n in out["components"].items():
        print(f"  {k:<{width}}  {fmt_count(n):>20}")
    for k, n in out["buffers"].items():
        print(f"  buffer {k}: {fmt_count(n)} (not trained, not in the total)")
    return 0


def _size(name: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_bytes(text, LIMITS["bytes"])
    except ValueError as exc:
        raise ConfigError(f"{name}={show(text)} {exc}") from None


def _fraction(name: str, text: str | None):
    if text is None:
        return None
    try:
        return parse_number(text)
    except ValueError:
        raise ConfigError(f"{name}={show(text)} must be a number such as 0.1") from None


def _read_args_file(name: str) -> str:
    """The text of ``--megatron-args`` (a path, or ``-`` for standard input), bounded and UTF-8."""
    from ..megatron.reader import MAX_ARGS_BYTES

    try:
        if name == "-":
            data = sys.stdin.buffer.read(MAX_ARGS_BYTES + 1) if hasattr(sys.stdin, "buffer") else \
                sys.stdin.read(MAX_ARGS_BYTES + 1).encode("utf-8")
        else:
            with open(name, "rb") as fh:
                data = fh.read(MAX_ARGS_BYTES + 1)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc.__class__.__name__
        raise ConfigError(f"megatron_args={show(name, 300)}: cannot read it ({reason})") from None
    if len(data) > MAX_ARGS_BYTES:
        raise ConfigError(f"megatron_args={show(name, 300)}: more than {MAX_ARGS_BYTES:,} bytes, more than a "
                          f"launch file holds")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"megatron_args={show(name, 300)}: the file is not UTF-8 text (byte {exc.start})") from None


def _train_kwargs(args) -> dict:
    return {name: getattr(args, name) for name in _TRAIN_OPTIONS}


def _cli_training(args, explicit: set[str]) -> TrainingConfig:
    """The training configuration of the options (a Megatron-LM layout string sets V and the schedule)."""
    from ..megatron.layout import MegatronLayout, layout_stages

    kw = _train_kwargs(args)
    if not {"ep", "etp"} <= explicit and not load_model(args.model).has_moe:
        # a dense model has no experts to lay out: the paper's EP8 default does not apply to it
        kw.update({k: 1 for k in ("ep", "etp") if k not in explicit})
    if isinstance(args.layout, MegatronLayout):
        m = load_model(args.model)
        lay, vpp = layout_stages(args.layout, args.pp, m.num_hidden_layers, None, name="layout")
        mtp = "".join(args.layout.stages).count("m")
        if mtp not in (0, m.num_nextn_predict_layers):
            raise ConfigError(f"layout={args.layout} places {mtp} MTP layers but the model has "
                              f"{m.num_nextn_predict_layers}")
        if "vpp" in explicit and args.vpp != vpp:
            raise ConfigError(f"vpp={args.vpp} but layout={args.layout} has {len(lay)} stages: vpp={vpp} on pp={args.pp}")
        kw.update(layout=lay, vpp=vpp)
        if "schedule" not in explicit and vpp > 1:
            kw["schedule"] = "interleaved"
    return TrainingConfig(**kw)


def _framework(args, run):
    """The framework the peak is predicted for: the Megatron-LM flags' (``--megatron-args``), on ``--gpu``."""
    from dataclasses import replace

    from ..device.peak import COMPUTE_CAPABILITY, Framework

    fw = run.framework if run is not None else Framework()
    if args.gpu is not None:
        cc = COMPUTE_CAPABILITY.get(args.gpu.upper())
        if cc is None:
            raise ConfigError(f"gpu={show(args.gpu)} must be one of {', '.join(COMPUTE_CAPABILITY)}")
        fw = replace(fw, compute_capability=cc)
    return fw


def _capacity(args) -> int | None:
    """The device capacity: ``--gpu-memory`` as written (``80GB`` is 80e9 bytes), else the driver-reported
    capacity of ``--gpu`` where memlib knows it (:data:`memlib.device.overhead.DEVICE_MEMORY`), else none."""
    from ..device.overhead import DEVICE_MEMORY

    if args.gpu_memory is not None:
        return _size("gpu_memory", args.gpu_memory)
    return DEVICE_MEMORY.get(args.gpu.upper()) if args.gpu is not None else None


def _estimate(args) -> int:
    from ..device.estimate import estimate  # sympy-heavy; imported after argument checks
    from ..device.overhead import overheads

    explicit = _explicit(args.argv)
    run = None
    if args.megatron_args is not None:
        from ..megatron.flags import parse_megatron_args

        if "model" in explicit:
            raise ConfigError("model: --megatron-args gives the model; leave --model out")
        text = _read_args_file(args.megatron_args)
        name = "megatron-args" if args.megatron_args == "-" else args.megatron_args
        run = parse_megatron_args(text, world_size=args.world_size, vocab_size=args.vocab_size,
                                  overrides={k: getattr(args, k) for k in _TRAIN_OPTIONS if k in explicit},
                                  name=name)
        model, train = run.model, run.train
    else:
        for name in ("world_size", "vocab_size"):
            if name in explicit:
                raise ConfigError(f"{name}={getattr(args, name)} applies with --megatron-args only")
        model, train = args.model, _cli_training(args, explicit)
    ovh = overheads(args.overhead, cuda_context=_size("cuda_context", args.cuda_context),
                    comm_buffers=_size("comm_buffers", args.comm_buffers),
                    fragmentation=_fraction("fragmentation", args.fragmentation))
    fw = _framework(args, run)
    est = estimate(model, train, ovh, _capacity(args), framework=fw)
    data = est.to_dict()
    if run is not None:
        data["megatron_args"] = run.values()
        if run.warning():            # after the estimate: an error stays the only line on stderr
            print(f"memlib: warning: {run.warning()}", file=sys.stderr)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    u = args.unit
    rec = est.recipe
    if run is not None:
        v = run.vocab
        over = ", ".join(f"{k}={_shown(x['given'])} (file: {_shown(x['file'])})" for k, x in run.overridden.items())
        print(f"Megatron-LM flags {args.megatron_args}: {len(run.mapped)} mapped, {len(run.no_effect)} without a "
              f"memory effect, {len(run.not_modelled)} not modelled · world size {run.world_size} · vocabulary "
              f"{_shown(v['size'])} ({v['tokenizer']}) padded to {v['padded']}"
              + (f" · overridden: {over}" if over else ""))
    print(f"{est.model.name} · {train.label()} · DP{train.dp} EDP{train.edp} · {train.world_size} devices · "
          f"ZeRO-{train.zero} · precision {rec.name} ({rec.weights}/{rec.gradients}/{rec.optimizer_bytes} bytes) · "
          f"profile {train.profile}")
    print(f"b={train.micro_batch} s={train.seq_len} · recompute {train.recompute} · schedule {train.schedule}"
          + (f" (V={train.vpp})" if train.vpp > 1 else "")
          + (f" · M={train.num_microbatches}" if train.num_microbatches else ""))
    head = ("stage", "layers", "params/device", "weights", "grads", "optimizer", "states",
            "activations", "in flight", "overhead", "total")
    rows = []
    for s in data["stages"]:
        lay = s["layers"]
        layers = f"{lay[0]}-{lay[-1]}" if len(lay) > 1 and lay == list(range(lay[0], lay[-1] + 1)) else (
            ",".join(map(str, lay)) if lay else "-")
        b = s["bytes"]
        f = lambda n: fmt_bytes(n, u, with_unit=False)  # noqa: E731
        rows.append((str(s["stage"]), layers, fmt_count(s["parameters"]),
                     f(b["parameters"]), f(b["gradients"]), f(b["optimizer_states"]),
                     f(b["parameters"] + b["gradients"] + b["optimizer_states"]),
                     f(b["activations"]), str(s["activations"]["microbatches_in_flight"]),
                     f(b["overhead"]), f(b["total"]) + ("" if "fits" not in s else (" ok" if s["fits"] else " OOM"))))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    print(f"({u} per device; states = weights + grads + optimizer; total = states + activations + overhead)")
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    pk = data["peak"]
    print(f"peak: stage {pk['stage']}, {fmt_bytes(pk['bytes'], u)} ({fmt_count(pk['bytes'])} bytes) per device")
    top = max(data["stages"], key=lambda st: (st["peak_allocated"], -st["stage"]))
    br = top["peak_breakdown"]
    print(f"max_memory_allocated: stage {top['stage']}, {fmt_bytes(top['peak_allocated'], u)} "
          f"(persistent {fmt_bytes(sum(br['persistent'].values()), u)} + activations "
          f"{fmt_bytes(sum(br['activations'].values()), u)} + transient {fmt_bytes(sum(br['transient'].values()), u)}"
          f"); max_memory_reserved {fmt_bytes(top['peak_reserved'], u)}")
    if "fits" in data:
        verdict = "fits" if data["fits"] else "does NOT fit"
        print(f"capacity {fmt_bytes(data['capacity'], u)}: {verdict} on every stage" if data["fits"]
              else f"capacity {fmt_bytes(data['capacity'], u)}: {verdict} (OOM on stages "
                   f"{', '.join(str(s['stage']) for s in data['stages'] if not s['fits'])})")
    return 0


def _list(name: str, text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ConfigError(f"{name}={show(text)} must name at least one value")
    return items


def _plan(args) -> int:
    from ..device.overhead import overheads
    from ..search.plan import DEFAULT_GLOBAL_BATCH, parse_fix, plan

    zeros = []
    for z in _list("zero", args.zero):
        if z not in ("0", "1", "2", "3"):
            raise ConfigError(f"zero={show(z)} must be one of 0, 1, 2, 3")
        zeros.append(int(z))
    if args.max_vpp < 2:
        raise ConfigError(f"max_vpp={args.max_vpp} must be an integer >= 2")
    capacity = _size("gpu_memory", args.gpu_memory)
    result = plan(args.model, args.gpus, capacity, seq_len=args.seq_len,
                  global_batch=args.global_batch or DEFAULT_GLOBAL_BATCH,
                  profiles=_list("profile", args.profile), precisions=_list("precision", args.precision),
                  recomputes=[x.replace("+", ",") for x in _list("recompute", args.recompute)],
                  schedules=_list("schedule", args.schedule), zeros=zeros,
                  layout_rules=_list("layout_rule", args.layout_rule), fix=parse_fix(args.fix),
                  max_micro_batch=args.max_micro_batch, max_vpp=args.max_vpp, top=args.top,
                  overhead=overheads(args.overhead), progress=not args.json and sys.stderr.isatty())
    data = result.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    u = args.unit
    print(f"{data['model']} · {data['gpus']} GPUs of {fmt_bytes(data['capacity'], u)} · searched "
          f"{data['searched']:,} configurations, {data['fitting']:,} fit")
    print("(ranked by the estimated step time of memlib.search.plan's cost model; bubble and recompute as fractions, "
          "communication in GB per GPU per step)")
    head = ("#", "PP", "TP", "CP", "DP", "EP", "ETP", "ZeRO", "b", "M", "schedule", "layout", "recompute",
            "precision", f"peak {u}", "stage", "bubble", "recomp", "TP GB", "EP GB", "CP GB", "DP GB", "PP GB", "step s")
    rows = []
    for i, c in enumerate(data["configs"], 1):
        cf, co = c["config"], c["cost"]
        sched = cf["schedule"] + (f" V{cf['vpp']}" if cf["vpp"] > 1 else "")
        rows.append((str(i), str(cf["pp"]), str(cf["tp"]), str(cf["cp"]), str(cf["dp"]), str(cf["ep"]), str(cf["etp"]),
                     str(cf["zero"]), str(cf["micro_batch"]), str(cf["num_microbatches"]), sched, c["layout_rule"],
                     cf["recompute"], cf["precision"], fmt_bytes(c["peak"], u, with_unit=False), str(c["peak_stage"]),
                     f"{co['bubble']:.3f}", f"{co['recompute']:.3f}",
                     *(f"{co[k] / 1e9:.1f}" for k in ("tp_bytes", "ep_bytes", "cp_bytes", "dp_bytes", "pp_bytes")),
                     f"{co['step_s']:.2f}"))
    if not rows:
        print("nothing fits")
        return 0
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(x.rjust(w) for x, w in zip(r, widths)))
    return 0


def _measure(args) -> int:
    if args.framework == "megatron-core":
        return _measure_megatron(args)
    from ..measure.hf import compare, require  # torch and transformers only when asked for

    require()
    if args.peak:
        raise ConfigError("peak=True applies to framework=megatron-core only")
    args.profile = args.profile or "hf-eager"
    kernels = _kernel_kwargs(args)
    default = TrainingConfig()
    for name, value in kernels.items():
        if str(value) != str(getattr(default, name)):
            raise ConfigError(f"{name}={value} applies to framework=megatron-core only")
    if args.recompute != "none" or args.precision != "megatron":
        raise ConfigError("recompute and precision apply to framework=megatron-core only "
                          "(transformers is measured in bf16 without recomputation)")
    for name in ("micro_batch", "seq_len"):
        if getattr(args, name) < 1:
            raise ConfigError(f"{name}={getattr(args, name)} must be a positive integer")
    r = compare(args.model, args.micro_batch, args.seq_len, args.profile, seed=args.seed, step=args.step)
    if args.json:
        print(json.dumps({k: x for k, x in r.items() if k != "storages"}, indent=2))
        return 0 if r["exact"] else 1
    print(f"{r['model']} · profile {r['profile']} · b={r['micro_batch']} s={r['seq_len']} · seed {r['seed']} "
          f"(bytes saved for backward, measured with autograd hooks)")
    rows = [(x["region"], f"{x['predicted']:,}", f"{x['measured']:,}", f"{x['difference']:+,}") for x in r["regions"]]
    a = r["activations"]
    rows.append(("total", f"{a['predicted']:,}", f"{a['measured']:,}", f"{a['difference']:+,}"))
    for k in ("gradients", "optimizer_states"):
        if k in r:
            rows.append((k, f"{r[k]['predicted']:,}", f"{r[k]['measured']:,}", f"{r[k]['difference']:+,}"))
    head = ("", "predicted", "measured", "difference")
    widths = [max(len(x[i]) for x in rows + [head]) for i in range(4)]
    print("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(head)))
    for x in rows:
        print("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(x)))
    print("exact" if r["exact"] else "NOT exact")
    return 0 if r["exact"] else 1


def _measure_megatron(args) -> int:
    from ..measure.megatron import compare, require   # torch and megatron-core only when asked for

    require()
    if args.profile not in (None, "megatron"):
        raise ConfigError(f"profile={args.profile}: framework=megatron-core is compared with profile=megatron")
    model = load_model(args.model)
    train = TrainingConfig(micro_batch=args.micro_batch, seq_len=args.seq_len, recompute=args.recompute,
                           precision=args.precision, profile="megatron", transformer_impl=TransformerImpl.LOCAL,
                           dp=1, tp=1, pp=1, ep=1, etp=1, cp=1, **_kernel_kwargs(args))
    _check_small(model)
    from ..measure.step import cli as peak
    if (code := peak(model, train, args)) is not None:
        return code
    r = compare(model, train, seed=args.seed, step=args.step)
    if "error" in r:
        raise ConfigError(f"megatron-core failed to run the configuration: {r['error']}")
    if args.json:
        print(json.dumps({k: x for k, x in r.items() if k != "storages"}, indent=2))
        return 0 if r["exact"] else 1
    print(f"{r['model']} · megatron-core (transformer_impl local, CPU) against profile megatron · "
          f"b={args.micro_batch} s={args.seq_len} · recompute {args.recompute} · precision {args.precision} · "
          f"seed {r['seed']}")
    print("(bytes saved for backward, measured with autograd hooks; per region, per block, then each ledger entry "
          "and each measured storage)")
    labels = [k for reg in r["entries"].values() for k in reg] + [
        f"{d['site']} {d['dtype']}{list(d['shape'])}" for d in r["storages"]]
    w = max(map(len, labels)) + 8
    print(f"{'':<{w}}{'predicted':>14}{'measured':>14}{'difference':>12}")
    for row in r["regions"]:
        print(f"{row['region']:<{w}}{row['predicted']:>14,}{row['measured']:>14,}{row['difference']:>+12,}")
        for blk in (x for x in r["blocks"] if x["region"] == row["region"]):
            print(f"  {blk['block']:<{w - 2}}{blk['predicted']:>14,}{blk['measured']:>14,}{blk['difference']:>+12,}")
            keys = [k for k, x in r["entries"].get(row["region"], {}).items() if x and _entry_block(k) == blk["block"]]
            for k in keys:
                print(f"      {k:<{w - 6}}{r['entries'][row['region']][k]:>14,}")
            for d in r["storages"]:
                if d["region"] == row["region"] and d["block"] == blk["block"]:
                    label = f"{d['site']} {d['dtype']}{list(d['shape'])}"
                    print(f"      {label:<{w - 6}}{'':>14}{d['bytes']:>14,}")
    a = r["activations"]
    print(f"{'total':<{w}}{a['predicted']:>14,}{a['measured']:>14,}{a['difference']:>+12,}")
    for k in ("parameters", "main_grad"):
        if k in r:
            print(f"{k + ' bytes':<{w}}{r[k]['predicted']:>14,}{r[k]['measured']:>14,}{r[k]['difference']:>+12,}")
    if r["ctx_held"]:
        print(f"tensors kept as autograd ctx attributes (not counted): {r['ctx_held']}")
    print("exact" if r["exact"] else "NOT exact")
    return 0 if r["exact"] else 1


def _entry_block(key: str) -> str:
    from ..measure.megatron import entry_block

    return entry_block(key)


def _check_small(model) -> None:
    from ..measure.hf import MAX_MEASURED_PARAMS
    from ..model.params import model_params, values

    n = model_params(model).evaluate_total(values(model))
    if n > MAX_MEASURED_PARAMS:
        raise ConfigError(f"model={model.name} has {n} parameters, more than {MAX_MEASURED_PARAMS} that measure builds "
                          f"on the CPU; use a small config")


def _formula(args) -> int:
    import sympy as sp

    from ..formulas import FORMULAS, book_formulas, equation, equation_text, formula

    if args.name is None or args.list:
        width = max(map(len, FORMULAS))
        shown = book_formulas()
        rest = sorted((f for f in FORMULAS.values() if not f.number), key=lambda f: f.name)
        for f in shown + rest:
            number = f"({f.number})" if f.number else "—"
            print(f"{number:>7}  {f.name:<{width}}  {f.description}")
        return 0
    if args.expand:
        expr = formula(args.name, args.model)
        print(latex(expr) if args.latex else sp.sstr(expr))
    else:
        print(equation(args.name, args.model) if args.latex else equation_text(args.name, args.model))
    return 0


def _shown(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, (tuple, list)):
        return ",".join(map(str, x))
    return str(x)


def main(argv: list[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = _parser().parse_args(argv)
        args.argv = argv
        return {"params": _params, "estimate": _estimate, "formula": _formula,
                "measure": _measure, "plan": _plan}[args.command](args)
    except ConfigError as exc:
        print(f"memlib: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `memlib estimate | head`: the reader left; not an error of ours
        _reader_left()
        return 0


def _reader_left() -> None:
    """stdout's reader has gone: later writes (and the flush at exit) go to /dev/null, not to a broken pipe."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


#: the commands whose process may end without the interpreter's teardown (nothing of theirs needs it); measure
#: runs torch, whose exit handlers must run
_QUICK_EXIT = ("params", "estimate", "formula", "plan")


def run() -> None:
    """The ``memlib`` console script and ``python -m memlib``: :func:`main`, its output flushed, then the
    process ends.  A command of :data:`_QUICK_EXIT` skips the interpreter's teardown (freeing SymPy's caches
    and a search's arrays one object at a time takes a tenth of a second or more of a one-second answer)."""
    code = main()
    quick = len(sys.argv) > 1 and sys.argv[1] in _QUICK_EXIT
    try:
        sys.stdout.flush()
    except BrokenPipeError:          # the reader left (``memlib plan | head``): not an error of ours
        _reader_left()
    sys.stderr.flush()
    if quick:
        os._exit(int(code or 0))
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
