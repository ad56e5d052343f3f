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
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from memlib.config import model_from_dict
from memlib.measure import measure_activations, predicted
from memlib.units import fmt_bytes

BASE = {"qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "model_type": "deepseek_v3",
        "n_shared_experts": 1, "first_k_dense_replace": 1, "topk_method": "noaux_tc"}
CONFIGS = [
    ("small", {**BASE, "hidden_size": 512, "intermediate_size": 1408, "moe_intermediate_size": 256,
               "num_attention_heads": 8, "q_lora_rank": 256, "kv_lora_rank": 128, "n_routed_experts": 16,
               "num_experts_per_tok": 4, "num_hidden_layers": 3, "vocab_size": 8192}, 2, 1024),
    ("medium", {**BASE, "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 512,
                "num_attention_heads": 16, "q_lora_rank": 768, "kv_lora_rank": 512, "n_routed_experts": 64,
                "num_experts_per_tok": 6, "num_hidden_layers": 4, "vocab_size": 32768}, 1, 4096),
    ("v3-widths", {**BASE, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                   "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "n_routed_experts": 256,
                   "num_experts_per_tok": 8, "num_hidden_layers": 2, "vocab_size": 129280}, 1, 4096),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for gpu_validation.json")
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
    (Path(args.out) / "gpu_validation.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
