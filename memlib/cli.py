"""The ``memlib`` command line.

``memlib params``   parameter counts of a model (total, activated, MTP, per component).
``memlib estimate`` per-stage, per-device memory under a training configuration.

Output with ``--json`` is a contract: keys are added by later versions, never renamed.  Bad input
prints one line on stderr naming the field, its value and the rule, and exits with code 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from .config import PAPER_TRAINING, ConfigError, TrainingConfig, load_model
from .params import activated_params, buffer_params, by_block, model_params, mtp_params, values
from .states import RECIPES
from .units import fmt_bytes, fmt_count

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message):  # noqa: D401 - argparse API
        raise ConfigError(message)


def _layout(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"layout={text!r} must be a comma-separated list of layer counts, e.g. 4,4,4,1") from None


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="memlib", description="GPU memory of DeepSeek-style MoE training, exactly.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    pp = sub.add_parser("params", help="parameter counts of a model")
    pp.add_argument("--model", default="deepseek-v3", help="preset name or path to a config.json")
    pp.add_argument("--json", action="store_true", help="machine-readable output")

    d = PAPER_TRAINING
    pe = sub.add_parser("estimate", help="per-stage memory per device",
                        description="Defaults are the paper's configuration: DeepSeek-V3, "
                                    "PP16@TP2@EP8@ETP1, DP32, ZeRO 0, precision paper.")
    pe.add_argument("--model", default="deepseek-v3", help="preset name or path to a config.json")
    for name, helptext in (("dp", "data-parallel size"), ("tp", "tensor-parallel size"),
                           ("pp", "pipeline stages"), ("ep", "expert-parallel size"),
                           ("etp", "expert tensor-parallel size"), ("cp", "context-parallel size")):
        pe.add_argument(f"--{name}", type=int, default=getattr(d, name), help=f"{helptext} (default {getattr(d, name)})")
    pe.add_argument("--no-sp", dest="sp", action="store_false", help="disable sequence parallelism")
    pe.add_argument("--layout", type=_layout, default=None,
                    help="decoder layers per stage, e.g. 4,4,...,4,1 (default: ceil(l/pp) per stage, remainder last)")
    pe.add_argument("--zero", type=int, default=d.zero, choices=(0, 1, 2, 3), help="ZeRO stage")
    pe.add_argument("--precision", default=d.precision, help=f"precision recipe: {', '.join(RECIPES)}")
    pe.add_argument("--profile", default=d.profile, help="partition convention: paper or megatron")
    pe.add_argument("--unit", default="GiB", choices=("GiB", "GB"), help="unit of the readable table")
    pe.add_argument("--json", action="store_true", help="machine-readable output")
    return p


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


def _estimate(args) -> int:
    from .memory import estimate  # sympy-heavy; imported after argument checks

    train = TrainingConfig(dp=args.dp, tp=args.tp, pp=args.pp, ep=args.ep, etp=args.etp, cp=args.cp,
                           sp=args.sp, layout=args.layout, zero=args.zero, precision=args.precision,
                           profile=args.profile)
    if args.precision not in RECIPES:
        raise ConfigError(f"precision={args.precision!r} must be one of {', '.join(RECIPES)}")
    est = estimate(args.model, train)
    data = est.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    u = args.unit
    rec = RECIPES[train.precision]
    print(f"{est.model.name} · {train.label()} · DP{train.dp} EDP{train.edp} · {train.world_size} devices · "
          f"ZeRO-{train.zero} · precision {rec.name} ({rec.weights}/{rec.gradients}/{rec.optimizer_bytes} bytes) · "
          f"profile {train.profile}")
    head = ("stage", "layers", "params/device", f"weights {u}", f"grads {u}", f"optimizer {u}", f"total {u}")
    rows = []
    for s in data["stages"]:
        lay = s["layers"]
        layers = f"{lay[0]}-{lay[-1]}" if len(lay) > 1 else (str(lay[0]) if lay else "-")
        b = s["bytes"]
        rows.append((str(s["stage"]), layers, fmt_count(s["parameters"]),
                     *(fmt_bytes(b[k], u, with_unit=False)
                       for k in ("parameters", "gradients", "optimizer_states", "total"))))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    pk = data["peak"]
    print(f"peak: stage {pk['stage']}, {fmt_bytes(pk['bytes'], u)} ({fmt_count(pk['bytes'])} bytes) per device")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        return {"params": _params, "estimate": _estimate}[args.command](args)
    except ConfigError as exc:
        print(f"memlib: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `memlib estimate | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
