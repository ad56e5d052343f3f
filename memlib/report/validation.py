"""Tables, numbers and figures of the validation chapter (``notebooks/10_validation.md``).

Ground truth comes from :mod:`memlib.measure` (the ``measure`` extra: torch and transformers):
parameter counts of the presets built on the meta device, and the bytes autograd saves for
backward in one bf16 training forward pass of small models, against the ``hf-eager`` ledger of
:mod:`memlib.ledgers_hf`.  Every number the chapter shows is computed here.
"""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from functools import lru_cache

from ..activations import training_values
from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model, model_from_dict
from ..ledgers import act_profile
from ..params import values
from ..partition import parallel_values
from ..states import recipe
from ..units import fmt_bytes, fmt_count
from .core import PALETTE, latex, md_table, new_figure

__all__ = ["GPU_RESULT", "gpu_result", "gpu_table", "CONFIGS", "PRESETS", "versions", "results", "summary", "comparison_table", "comparison_figure",
           "preset_checks", "preset_table", "layer_entries", "entry_table", "group_table", "group_values",
           "GROUPS", "random_check", "problem_answers", "MEGATRON_CONFIGS", "megatron_versions", "megatron_results",
           "megatron_summary", "megatron_table", "SIDE_GROUPS", "megatron_group", "ground_truths",
           "ground_truth_table", "megatron_entry_table", "kernel_differences"]

#: a spread of small configs: (label, the config.json fields that differ from ``_BASE``, b, s)
_BASE = {
    "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_attention_heads": 4,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "q_lora_rank": 16, "kv_lora_rank": 12,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hidden_layers": 3,
    "first_k_dense_replace": 1, "vocab_size": 64, "model_type": "deepseek_v3",
}
CONFIGS = (
    ("V3-like, q LoRA", {}, 2, 16),
    ("no q LoRA (as V2-Lite)", {"q_lora_rank": None}, 2, 16),
    ("one sequence", {}, 1, 16),
    ("one head, wide values", {"num_attention_heads": 1, "v_head_dim": 24}, 3, 8),
    ("long sequence", {"num_hidden_layers": 2}, 1, 96),
    ("many experts", {"n_routed_experts": 32, "num_experts_per_tok": 6, "n_shared_experts": 2}, 4, 8),
    ("all dense", {"first_k_dense_replace": 3}, 2, 24),
    ("no shared expert", {"n_shared_experts": 0, "first_k_dense_replace": 0}, 2, 12),
)

#: the presets whose parameters are checked at full size
PRESETS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")


def _model(label: str, changes: dict) -> ModelConfig:
    return model_from_dict({**_BASE, **changes}, name=label)


def versions() -> dict[str, str]:
    """The installed torch and transformers versions (what the ledger was checked against)."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


@lru_cache(maxsize=None)
def results() -> tuple[dict, ...]:
    """:func:`memlib.measure.compare` for each of :data:`CONFIGS`, with backward and one AdamW step."""
    from ..measure import compare

    out = []
    for label, changes, b, s in CONFIGS:
        r = compare(_model(label, changes), b, s)
        r["label"] = label
        out.append(r)
    return tuple(out)


def summary() -> dict:
    """How many configs, regions and bytes were compared, and how many differ."""
    rs = results()
    regions = [x for r in rs for x in r["regions"]]
    return {
        "configs": len(rs),
        "regions": len(regions),
        "mismatched_regions": sum(1 for x in regions if x["difference"]),
        "exact_configs": sum(1 for r in rs if r["exact"]),
        "measured_bytes": sum(r["activations"]["measured"] for r in rs),
        "storages": sum(len(r["storages"]) for r in rs),
        "max_abs_difference": max(abs(x["difference"]) for x in regions),
    }


def _kinds(m: ModelConfig) -> str:
    return f"{m.layer_kinds.count('dense')}, {m.layer_kinds.count('moe')}"


def comparison_table() -> str:
    """One row per config: shape, activation bytes predicted and measured, gradients, AdamW state
    (measured, with the difference from the prediction)."""
    rows = []
    for r, (label, changes, b, s) in zip(results(), CONFIGS):
        m = _model(label, changes)
        a, g, o = r["activations"], r["gradients"], r["optimizer_states"]
        rows.append([label, _kinds(m), fmt_count(b), fmt_count(s), fmt_count(a["predicted"]), fmt_count(a["measured"]),
                     f"{a['difference']:+,}", f"{fmt_count(g['measured'])} ({g['difference']:+,})",
                     f"{fmt_count(o['measured'])} ({o['difference']:+,})"])
    return md_table(["config", "dense, MoE", "$b$", "$s$", "predicted", "measured", "Δ", "gradients (Δ)",
                     "AdamW (Δ)"], rows, "llrrrrrrr")


def comparison_figure():
    """Left: predicted against measured saved bytes, one point per region of every config.  Right:
    the difference, measured minus predicted, per region."""
    import math

    from matplotlib.lines import Line2D

    fig, _ = new_figure(8.6, 4.0)
    fig.clf()
    ax, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    markers = {"layer": "o", "embedding": "s", "final_norm": "v", "head": "^", "loss": "D"}
    names = {"layer": "decoder layer", "embedding": "embedding, RoPE tables", "final_norm": "final RMSNorm",
             "head": "head input", "loss": "loss"}
    lo, hi = math.inf, 0
    colours = PALETTE * 2
    for i, (colour, r) in enumerate(zip(colours, results())):
        for j, x in enumerate(r["regions"]):
            kind = "layer" if x["region"].startswith("layer.") else x["region"]
            p, q = x["predicted"], x["measured"]
            lo, hi = min(lo, p, q), max(hi, p, q)
            ax.scatter([p], [q], marker=markers[kind], color=colour, s=26, alpha=0.85, zorder=3)
            ax2.scatter([i], [x["difference"]], marker=markers[kind], color=colour, s=26, alpha=0.85, zorder=3)
    ax.plot([lo, hi], [lo, hi], color=PALETTE[7], alpha=0.5, lw=1, zorder=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted by the hf-eager ledger, bytes")
    ax.set_ylabel("measured with autograd hooks, bytes")
    handles = [Line2D([], [], ls="", marker="o", color=c, label=r["label"]) for c, r in zip(colours, results())]
    handles += [Line2D([], [], ls="", marker=m, color=PALETTE[7], label=names[k]) for k, m in markers.items()]
    ax.legend(handles=handles, fontsize=7, ncol=2, loc="upper left")
    ax2.axhline(0, color=PALETTE[7], alpha=0.5, lw=1, zorder=1)
    ax2.set_xticks(range(len(results())), [r["label"] for r in results()], rotation=60, fontsize=7, ha="right")
    ax2.set_ylabel("measured − predicted, bytes")
    worst = max(abs(x["difference"]) for r in results() for x in r["regions"])
    ax2.set_ylim(-max(1, 1.2 * worst), max(1, 1.2 * worst))
    return fig


# ------------------------------------------------------------------------------------------------
# parameters
# ------------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def preset_checks() -> tuple[dict, ...]:
    """:func:`memlib.measure.param_check` of every preset (built at full size on the meta device)."""
    from ..measure import param_check

    return tuple(param_check(p) for p in PRESETS)


def preset_table() -> str:
    rows = []
    for r in preset_checks():
        bad = sum(1 for t in r["tensors"] if not t["ok"])
        cls = r["class"].removesuffix("ForCausalLM")
        rows.append([r["model"], f"`{cls}`", fmt_count(len(r["tensors"])), fmt_count(r["total"]["memlib"]),
                     fmt_count(r["total"]["transformers"]),
                     f"{r['total']['transformers'] - r['total']['memlib']:+,}", fmt_count(r["buffers"]["transformers"]),
                     fmt_count(bad)])
    return md_table(["preset", "transformers class (`…ForCausalLM`)", "tensors", "parameters, memlib", "parameters, transformers",
                     "difference", "buffer elements", "tensors that differ"], rows, "llrrrrrr")


# ------------------------------------------------------------------------------------------------
# hf-eager against the paper, one layer
# ------------------------------------------------------------------------------------------------
#: entry groups for the side-by-side view, in data-flow order
GROUPS = ("RMSNorms", "MLA latents and projections", "attention scores", "dropout masks", "router",
          "routed experts", "shared experts", "dense FFN")


def _group(key: str) -> str:
    part, _, rest = key.partition(".")
    if "norm" in rest and not rest.startswith(("routed", "shared")):
        return "RMSNorms"
    if "dropout_mask" in rest and "softmax" not in rest:
        return "dropout masks"
    if part == "attention":
        return "attention scores" if any(w in rest for w in ("softmax", "probs")) else "MLA latents and projections"
    if part == "dense_ffn":
        return "dense FFN"
    if rest.startswith("routed"):
        return "routed experts"
    if rest.startswith("shared"):
        return "shared experts"
    return "router"


def _train(b: int, s: int, profile: str) -> TrainingConfig:
    return TrainingConfig(micro_batch=b, seq_len=s, profile=profile)


def layer_entries(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", profile: str = "hf-eager",
                  b: int | None = None, s: int | None = None) -> list[dict]:
    """The entries of one decoder layer: key, name, dtype, bytes formula (LaTeX, one device with no
    parallelism) and exact bytes at ``b``, ``s`` (default: the paper's micro-batch and sequence)."""
    from .. import ledgers_hf  # noqa: F401  (registers hf-eager)
    from ..activations import entry_bytes

    m = load_model(model)
    b = PAPER_TRAINING.micro_batch if b is None else b
    s = PAPER_TRAINING.seq_len if s is None else s
    t = _train(b, s, profile)
    rec = recipe(t.precision)
    vals = {**values(m), **parallel_values(t), **training_values(t)}
    par = parallel_values(t)
    out = []
    for e in act_profile(profile).layer(m, kind):
        expr = entry_bytes(e, t, rec).xreplace(par)
        out.append({"key": e.key, "name": e.name, "dtype": e.dtype, "group": _group(e.key),
                    "formula": expr, "bytes": int(expr.xreplace(vals))})
    return out


def entry_table(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", profile: str = "hf-eager",
                b: int | None = None, s: int | None = None) -> str:
    rows = []
    for e in layer_entries(model, kind, profile, b, s):
        dtype = {"act": "bf16"}.get(e["dtype"], e["dtype"])
        rows.append([f"`{e['key']}`", e["name"], dtype, f"${latex(e['formula'])}$", fmt_bytes(e["bytes"], "MiB")])
    return md_table(["entry", "tensor", "dtype", "bytes", "MiB"], rows, "lllll")


def group_values(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                 s: int | None = None) -> dict[str, dict[str, int]]:
    """Bytes per group of one layer under the paper's ledger and hf-eager, and the totals."""
    out: dict[str, dict[str, int]] = {}
    for profile in ("paper", "hf-eager"):
        for e in layer_entries(model, kind, profile, b, s):
            out.setdefault(e["group"], {"paper": 0, "hf-eager": 0})[profile] += e["bytes"]
    ordered = {g: out[g] for g in GROUPS if g in out}
    ordered["total"] = {p: sum(v[p] for v in ordered.values()) for p in ("paper", "hf-eager")}
    return ordered


def group_table(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                s: int | None = None) -> str:
    rows = []
    for g, v in group_values(model, kind, b, s).items():
        ratio = "—" if not v["paper"] else f"{float(Fraction(v['hf-eager'], v['paper'])):.2f}"
        rows.append([f"**{g}**" if g == "total" else g, fmt_bytes(v["paper"], "MiB", with_unit=False),
                     fmt_bytes(v["hf-eager"], "MiB", with_unit=False),
                     f"{(v['hf-eager'] - v['paper']) / 2**20:+,.2f}", ratio])
    return md_table(["entries", "paper, MiB", "hf-eager, MiB", "difference, MiB", "hf-eager / paper"], rows, "lrrrr")


def random_check(n: int = 30, seed: int = 0) -> dict:
    """``n`` random small configs, drawn from ``seed`` (the test suite draws a fresh seed each run)."""
    import random

    from ..measure import compare, random_config

    rng = random.Random(seed)
    exact = 0
    for i in range(n):
        m, b, s = random_config(rng)
        exact += compare(m, b, s, seed=i, step=False)["exact"]
    return {"configs": n, "exact": exact, "seed": seed}


def problem_answers(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                    s: int | None = None) -> dict[str, str]:
    """The chapter's worked problems, formatted: (1) one layer at twice the sequence length under
    both ledgers; (2) the group of entries where ``hf-eager`` keeps the most beyond the paper."""
    b = PAPER_TRAINING.micro_batch if b is None else b
    s = PAPER_TRAINING.seq_len if s is None else s
    one = group_values(model, kind, b, s)
    two = group_values(model, kind, b, 2 * s)
    diffs = {g: v["hf-eager"] - v["paper"] for g, v in one.items() if g != "total"}
    top = max(diffs, key=lambda g: diffs[g])
    ratio = {p: Fraction(two["total"][p], one["total"][p]) for p in ("paper", "hf-eager")}
    return {
        "s2": fmt_count(2 * s),
        "paper_s2": fmt_bytes(two["total"]["paper"], "GiB"),
        "hf_s2": fmt_bytes(two["total"]["hf-eager"], "GiB"),
        "paper_ratio": f"{float(ratio['paper']):.2f}",
        "hf_ratio": f"{float(ratio['hf-eager']):.2f}",
        "scores_paper_s2": fmt_bytes(two["attention scores"]["paper"], "GiB"),
        "scores_hf_s2": fmt_bytes(two["attention scores"]["hf-eager"], "GiB"),
        "top_group": top,
        "top_paper": fmt_bytes(one[top]["paper"], "GiB"),
        "top_hf": fmt_bytes(one[top]["hf-eager"], "GiB"),
        "top_diff": fmt_bytes(diffs[top], "GiB"),
        "total_diff": fmt_bytes(abs(one["total"]["hf-eager"] - one["total"]["paper"]), "GiB"),
        "total_sign": "more" if one["total"]["hf-eager"] >= one["total"]["paper"] else "less",
    }


# ------------------------------------------------------------------------------------------------
# the recorded GPU run (benchmarks/gpu_validation.py on an H200; committed as data)
# ------------------------------------------------------------------------------------------------
#: the measured result of ``benchmarks/gpu_validation.py`` on one H200, committed with the code
GPU_RESULT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_validation_h200.json"


def gpu_result() -> dict:
    """The recorded GPU run, with a few derived values formatted for glue."""
    import json

    data = json.loads(GPU_RESULT.read_text())
    rows = data["rows"]
    big = max(rows, key=lambda r: r["saved"])
    return {
        "device": data["device"], "torch": data["torch"], "transformers": data["transformers"],
        "configs": fmt_count(len(rows)), "exact": fmt_count(sum(r["exact"] for r in rows)),
        "big": big["config"], "big_saved": fmt_bytes(big["saved"], "GiB"), "big_saved_exact": fmt_count(big["saved"]),
        "big_logits": fmt_bytes(big["logits"], "MiB"),
        "big_gap": fmt_bytes(abs(big["held_minus_saved"] - big["logits"]), "KiB"),
        "big_transient": fmt_bytes(big["transient_above_held"], "GiB"),
    }


def gpu_table() -> str:
    """One row per recorded configuration: predicted, saved, held after forward, peak, reserved (GiB)."""
    import json

    data = json.loads(GPU_RESULT.read_text())
    rows = [[r["config"], fmt_count(r["micro_batch"]), fmt_count(r["seq_len"]), fmt_count(r["predicted"]),
             fmt_count(r["saved"]), "yes" if r["exact"] else "no", fmt_bytes(r["held_after_forward"], "GiB"),
             fmt_bytes(r["logits"], "GiB"), fmt_bytes(r["peak_above_before"], "GiB"), fmt_bytes(r["reserved"], "GiB")]
            for r in data["rows"]]
    return md_table(["config", "b", "s", "predicted (bytes)", "saved (bytes)", "exact", "held after forward",
                     "logits", "peak in forward", "reserved"], rows, "lrrrrlrrrr")


# ------------------------------------------------------------------------------------------------
# the second ground truth: Megatron-Core (memlib.measure_megatron, megatron-core 0.19.2 on the CPU)
# ------------------------------------------------------------------------------------------------
#: small configs measured against megatron-core: (label, config.json changes from ``_BASE``, training options)
MEGATRON_CONFIGS = (
    ("V3-like, MTP, b 2, s 16", {"num_nextn_predict_layers": 1, "n_group": 4, "topk_group": 2}, {}),
    ("selective recompute", {"num_nextn_predict_layers": 1}, {"recompute": "selective"}),
    ("no q LoRA, softmax routing", {"q_lora_rank": None, "model_type": "deepseek_v2"}, {}),
    ("fp32 softmax, unfused SwiGLU", {}, {"attention_softmax_in_fp32": True, "bias_swiglu_fusion": False}),
    ("DeepSeek recompute", {"num_nextn_predict_layers": 1}, {"recompute": "deepseek"}),
    ("full recompute, fp32", {"num_nextn_predict_layers": 1}, {"recompute": "full", "precision": "fp32"}),
)


def _megatron_pair(label: str, changes: dict, train: dict, b: int = 2, s: int = 16):
    m = model_from_dict({**_BASE, **changes}, name=label)
    t = TrainingConfig(dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", transformer_impl="local", micro_batch=b,
                       seq_len=s, **{"precision": "megatron", **train})
    return m, t


def megatron_versions() -> dict[str, str]:
    """The installed megatron-core and torch versions, and the pinned one."""
    from importlib.metadata import version

    from ..measure_megatron import MCORE_VERSION

    return {"megatron_core": version("megatron-core"), "pinned": MCORE_VERSION, "torch": versions()["torch"]}


@lru_cache(maxsize=None)
def megatron_results() -> tuple[dict, ...]:
    """:func:`memlib.measure_megatron.compare` for each of :data:`MEGATRON_CONFIGS`, in one worker process."""
    from ..measure_megatron import compare_many

    pairs = [_megatron_pair(*c) for c in MEGATRON_CONFIGS]
    out = []
    for (label, _, _), r in zip(MEGATRON_CONFIGS, compare_many(pairs, step=True)):
        r["label"] = label
        out.append(r)
    return tuple(out)


def megatron_summary() -> dict:
    """How many configs, regions, blocks and storages were compared against megatron-core, and how many differ."""
    rs = megatron_results()
    blocks = [x for r in rs for x in r["blocks"]]
    return {
        "configs": len(rs), "exact_configs": sum(1 for r in rs if r["exact"]),
        "regions": sum(len(r["regions"]) for r in rs), "blocks": len(blocks),
        "mismatched_blocks": sum(1 for x in blocks if x["difference"]),
        "storages": sum(len(r["storages"]) for r in rs),
        "measured_bytes": sum(r["activations"]["measured"] for r in rs),
        "parameter_bytes": sum(r["parameters"]["measured"] for r in rs),
        "main_grad_bytes": sum(r["main_grad"]["measured"] for r in rs),
    }


def megatron_table() -> str:
    """One row per config: activations predicted and measured, parameters and main_grad buffers (Δ)."""
    rows = []
    for r, (label, changes, train) in zip(megatron_results(), MEGATRON_CONFIGS):
        m, t = _megatron_pair(label, changes, train)
        a, p, g = r["activations"], r["parameters"], r["main_grad"]
        rows.append([label, _kinds(m), f"`{t.recompute}`", t.precision, fmt_count(a["predicted"]),
                     fmt_count(a["measured"]), f"{a['difference']:+,}", f"{fmt_count(p['measured'])} ({p['difference']:+,})",
                     f"{fmt_count(g['measured'])} ({g['difference']:+,})"])
    return md_table(["config", "dense, MoE", "recompute", "precision", "predicted", "measured", "Δ",
                     "parameters (Δ)", "main_grad (Δ)"], rows, "llllrrrrr")


#: entry groups of the side-by-side view, in data-flow order
SIDE_GROUPS = ("RMSNorms", "MLA latents and projections", "RoPE", "attention scores", "router", "dispatch",
               "routed experts", "shared experts", "dense FFN")


def megatron_group(key: str) -> str:
    """The group of a megatron or hf-eager ledger entry key (one layer)."""
    part, _, rest = key.partition(".")
    if rest.startswith("routed"):
        return "routed experts"
    if rest.startswith("shared"):
        return "shared experts"
    if part == "dense_ffn":
        return "RMSNorms" if "norm" in rest else "dense FFN"
    if part == "moe":
        if "norm" in rest:
            return "RMSNorms"
        return "dispatch" if rest.startswith("permute") or rest.startswith("routed.token") else "router"
    if "norm" in rest or rest.endswith(("_fp32", "_rstd", "_normalized", "input_fp32")) and rest.startswith("c_"):
        return "RMSNorms"
    if "rope" in rest:
        return "RoPE"
    if any(w in rest for w in ("softmax", "probs")):
        return "attention scores"
    return "MLA latents and projections"


def _one_layer(model: ModelConfig, kind: str, profile: str, train: TrainingConfig) -> dict[str, int]:
    from ..activations import ledger_bytes

    vals = {**values(model), **parallel_values(train), **training_values(train)}
    return ledger_bytes(act_profile(profile, train).layer(model, kind), train, recipe(train.precision)).evaluate(vals)


def ground_truths(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                  s: int | None = None) -> dict:
    """One decoder layer on one device under the three implementations memlib checks: Hugging Face
    eager (hf-eager, measured), Megatron-Core's local modules (measured) and Megatron-Core with
    Transformer Engine (its kernels' sources): bytes per entry and per group, and the totals."""
    from .. import ledgers_hf  # noqa: F401  (registers hf-eager)

    m = load_model(model)
    b = PAPER_TRAINING.micro_batch if b is None else b
    s = PAPER_TRAINING.seq_len if s is None else s
    one = dict(dp=1, tp=1, pp=1, ep=1, etp=1, micro_batch=b, seq_len=s, precision="megatron")
    cols = {"hf-eager": _one_layer(m, kind, "hf-eager", TrainingConfig(profile="hf-eager", **one)),
            "megatron-local": _one_layer(m, kind, "megatron",
                                         TrainingConfig(profile="megatron", transformer_impl="local", **one)),
            "megatron-te": _one_layer(m, kind, "megatron", TrainingConfig(profile="megatron", **one))}
    groups = {g: {c: 0 for c in cols} for g in SIDE_GROUPS}
    for c, entries in cols.items():
        for key, x in entries.items():
            groups[megatron_group(key)][c] += x
    groups = {g: v for g, v in groups.items() if any(v.values())}
    groups["total"] = {c: sum(e.values()) for c, e in cols.items()}
    return {"entries": cols, "groups": groups, "b": b, "s": s}


def ground_truth_table(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                       s: int | None = None) -> str:
    rows = []
    for g, v in ground_truths(model, kind, b, s)["groups"].items():
        cells = [fmt_bytes(v[c], "MiB", with_unit=False) for c in ("hf-eager", "megatron-local", "megatron-te")]
        rows.append([f"**{g}**" if g == "total" else g, *cells])
    return md_table(["entries", "Hugging Face eager, MiB (measured)", "Megatron-Core local, MiB (measured)",
                     "Megatron-Core + TE, MiB (from the kernels' sources)"], rows, "lrrr")


def megatron_entry_table(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                         s: int | None = None) -> str:
    """Every entry of one megatron layer, local beside Transformer Engine, with where each number
    comes from (measured on the CPU, or the kernel source that saves it)."""
    from ..ledgers_megatron import Kernels, megatron_layer

    m = load_model(model)
    gt = ground_truths(m, kind, b, s)
    loc, te = gt["entries"]["megatron-local"], gt["entries"]["megatron-te"]
    notes = {e.key: e.note for e in megatron_layer(m, kind, Kernels())}
    rows = []
    for key in list(loc) + [k for k in te if k not in loc]:
        rows.append([f"`{key}`", megatron_group(key),
                     fmt_bytes(loc[key], "MiB") if key in loc else "—",
                     fmt_bytes(te[key], "MiB") if key in te else "—", _source_of(notes[key]) if key in te else ""])
    return md_table(["entry", "group", "local (measured)", "Transformer Engine", "TE value from"], rows, "llrrl")


#: the kernels whose sources an entry's note may cite, in the order a label is looked up
_KERNEL_LABELS = (("flash_attention", "flash-attention, TE fused attention"),
                  ("te_unfused_attention", "TE unfused attention"), ("te_layernorm_linear", "TE LayerNormLinear"),
                  ("te_rmsnorm", "TE RMSNorm"), ("te_cross_entropy", "TE cross-entropy"), ("te_linear", "TE Linear"))


def _source_of(note: str) -> str:
    """Where a Transformer Engine entry's bytes come from, from its note: a kernel's source, or
    Megatron-Core's own code (measured on the CPU, or read where the CPU cannot run it)."""
    from ..ledgers_megatron import KERNEL_SOURCES

    for name, label in _KERNEL_LABELS:
        if KERNEL_SOURCES[name] in note:
            return label + " (source)"
    return "Megatron-Core code (measured)" if "measured" in note else "Megatron-Core code (read)"


def kernel_differences(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                       s: int | None = None) -> dict[str, str]:
    """The chapter's numbers for the local-against-TE differences of one layer, formatted."""
    gt = ground_truths(model, kind, b, s)
    loc, te, g = gt["entries"]["megatron-local"], gt["entries"]["megatron-te"], gt["groups"]
    return {
        "probs_local": fmt_bytes(loc["attention.softmax_out"], "GiB"),
        "lse_te": fmt_bytes(te["attention.softmax_lse"], "MiB"),
        "norms_local": fmt_bytes(g["RMSNorms"]["megatron-local"], "MiB"),
        "norms_te": fmt_bytes(g["RMSNorms"]["megatron-te"], "MiB"),
        "total_local": fmt_bytes(g["total"]["megatron-local"], "GiB"),
        "total_te": fmt_bytes(g["total"]["megatron-te"], "GiB"),
        "total_hf": fmt_bytes(g["total"]["hf-eager"], "GiB"),
        "rope_local": fmt_bytes(loc["attention.rope_tables"], "MiB"),
    }
