"""``memlib plan``: every parallel configuration of N GPUs that fits, ranked, as a table or JSON."""
from __future__ import annotations

import json
import sys

from ..config import ConfigError, show
from ..core.units import fmt_bytes
from .options import _list, _size


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
