"""``memlib estimate``: per-stage, per-device memory under a training configuration, as a table or JSON."""
from __future__ import annotations

import json
import sys

from ..config import ConfigError
from ..core.units import fmt_bytes, fmt_count
from .options import _capacity, _cli_training, _fraction, _framework, _read_args_file, _shown, _size
from .parser import _TRAIN_OPTIONS, _explicit


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
