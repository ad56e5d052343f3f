"""``memlib params``: the parameter counts of a model (total, activated, MTP, per component)."""
from __future__ import annotations

import json

from ..config import load_model
from ..model.params import activated_params, buffer_params, by_block, model_params, mtp_params, values
from ..core.units import fmt_count


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
