"""From parsed options to memlib's objects: the training configuration, sizes, the framework, the capacity."""
from __future__ import annotations

import sys

from ..config import LIMITS, ConfigError, TrainingConfig, load_model, show
from ..core.units import parse_bytes, parse_number
from .parser import _TRAIN_OPTIONS


def _kernel_kwargs(args) -> dict:
    out = {"attention_softmax_in_fp32": args.attention_softmax_in_fp32, "bias_swiglu_fusion": args.bias_swiglu_fusion,
           "cross_entropy_loss_fusion": args.cross_entropy_loss_fusion, "moe_aux_loss": args.moe_aux_loss}
    for name in ("transformer_impl", "attention_backend", "cross_entropy_fusion_impl"):
        if hasattr(args, name):
            out[name] = getattr(args, name)
    return out


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

    from .parser import _FRAMEWORK_OPTIONS

    fw = run.framework if run is not None else Framework()
    given = {k: getattr(args, k) for k in _FRAMEWORK_OPTIONS if getattr(args, k, None) is not None}
    if given:
        fw = replace(fw, **given)
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


def _list(name: str, text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ConfigError(f"{name}={show(text)} must name at least one value")
    return items


def _precisions(text: str) -> list[str]:
    """A comma list of precision recipes, where a spec ``BASE:FIELD=BYTES,FIELD=BYTES`` is one item: a
    ``FIELD=BYTES`` (no colon) continues the spec before it."""
    items: list[str] = []
    for x in _list("precision", text):
        if ":" not in x and "=" in x and items and ":" in items[-1]:
            items[-1] += "," + x
        else:
            items.append(x)
    return items


def _shown(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, (tuple, list)):
        return ",".join(map(str, x))
    return str(x)
