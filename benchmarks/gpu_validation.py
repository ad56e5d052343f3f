"""On a CUDA GPU: the hf-eager ledger against autograd's saved tensors and the caching allocator.

For a few configurations, up to DeepSeek-V3's real widths (two decoder layers, one dense and one
MoE, all 256 experts), one bf16 training forward pass with labels runs on the GPU.  It reports the
bytes memlib predicts, the bytes saved for backward (autograd hooks, each storage once), and the
caching allocator's view: what the forward pass left allocated, its peak, and what was reserved.
The difference between "held after forward" and "saved" is what the prediction does not claim to
cover (the logits and loss kept alive by the caller, allocator rounding); the peak above "held" is
the transient working memory of the kernels.

Needs torch with CUDA and transformers 5.24.0 (the version the hf-eager ledger follows).

    python benchmarks/gpu_validation.py [--out DIR]

The result is written as ``gpu_validation_<gpu>.json`` (``gpu_validation_h200.json`` on an H200) into
``memlib/data/`` unless ``--out`` names another folder: chapter 10 reads the H200 run from there, as package data.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from memlib.config import model_from_dict
from memlib.measure.hf import measure_activations, predicted
from memlib.scenarios.validation import GPU_CONFIGS
from memlib.core.units import fmt_bytes

#: where the committed result lives: memlib's package data, read by memlib.scenarios.validation.GPU_RESULT
DATA = Path(__file__).resolve().parents[1] / "memlib" / "data"

#: the configurations, defined once in the library (chapter 10 renders the committed result)
CONFIGS = GPU_CONFIGS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DATA), help="folder for gpu_validation_<gpu>.json (default: memlib/data)")
    ap.add_argument("--only", default=None, help="run one configuration by name")
    args = ap.parse_args()
    import torch
    import transformers

    rows = []
    for name, cfg, b, s in CONFIGS:
        if args.only and name != args.only:
            continue
        m = model_from_dict(cfg, name=name)
        t0 = time.perf_counter()
        pred = sum(predicted(m, b, s, "hf-eager")["regions"].values())
        meas = measure_activations(m, b, s, device="cuda", step=False)
        a = meas.allocator
        held = a["after_forward"] - a["before"]
        row = {"config": name, "micro_batch": b, "seq_len": s, "predicted": pred, "saved": meas.total,
               "exact": pred == meas.total, "held_after_forward": held,
               "held_minus_saved": held - meas.total, "logits": a["logits"],
               "peak_above_before": a["peak_forward"] - a["before"],
               "transient_above_held": a["peak_forward"] - a["after_forward"],
               "reserved": a["reserved"], "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(f"{name:10s} b={b} s={s}: predicted {fmt_bytes(pred)} saved {fmt_bytes(meas.total)} "
              f"({'exact' if row['exact'] else 'DIFF ' + str(meas.total - pred)}); held after forward "
              f"{fmt_bytes(held)} (+{fmt_bytes(row['held_minus_saved'], 'MiB')} over saved, logits "
              f"{fmt_bytes(a['logits'], 'MiB')}); peak {fmt_bytes(row['peak_above_before'])}; "
              f"reserved {fmt_bytes(a['reserved'])}; {row['seconds']} s", flush=True)
        del meas
        torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "transformers": transformers.__version__, "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    gpu = out["device"].split()[-1].lower()   # "NVIDIA H200" -> "h200"
    (Path(args.out) / f"gpu_validation_{gpu}.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
