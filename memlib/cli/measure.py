"""``memlib measure``: measured against predicted activation bytes (transformers or Megatron-Core on the CPU)."""
from __future__ import annotations

import json

from ..config import ConfigError, TrainingConfig, load_model
from ..config.strategies import TransformerImpl
from .options import _kernel_kwargs


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
    from ..measure.megatron import require
    from ..measure.megatron_compare import compare   # torch and megatron-core only when asked for

    require()
    if args.profile not in (None, "megatron"):
        raise ConfigError(f"profile={args.profile}: framework=megatron-core is compared with profile=megatron")
    model = load_model(args.model)
    train = TrainingConfig(micro_batch=args.micro_batch, seq_len=args.seq_len, recompute=args.recompute,
                           precision=args.precision, profile="megatron", transformer_impl=TransformerImpl.LOCAL,
                           dp=1, tp=1, pp=1, ep=1, etp=1, cp=1, runtime="cpu", **_kernel_kwargs(args))
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
    from ..measure.megatron_compare import entry_block

    return entry_block(key)


def _check_small(model) -> None:
    from ..measure.hf import MAX_MEASURED_PARAMS
    from ..model.params import model_params, values

    n = model_params(model).evaluate_total(values(model))
    if n > MAX_MEASURED_PARAMS:
        raise ConfigError(f"model={model.name} has {n} parameters, more than {MAX_MEASURED_PARAMS} that measure builds "
                          f"on the CPU; use a small config")
