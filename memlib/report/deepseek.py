"""Numbers, tables and figures of the chapter "How DeepSeek-V3 trains without tensor parallelism"
(``notebooks/09_deepseek_v3.md``).

The DeepSeek-V3 report (arXiv 2412.19437 §3.2-§3.3) trains on 2048 H800 of 80 GB: PP16 with
DualPipe, EP64 over 8 nodes, ZeRO-1 data parallelism, no TP; BF16 AdamW moments with FP32 master
weights and gradients; Linear inputs cached in FP8 (the attention output in E5M6, the SwiGLU input in
FP8 with its output recomputed); recomputation of every RMSNorm and the MLA up-projections; the MTP
module on the last stage, sharing the embedding and the head with the main model through DualPipe's
placement (rank 0 holds stages 0 and 15).  Everything here is computed by
:func:`memlib.memory.estimate` under the ``megatron`` activation profile; the chapter only glues.

>>> rows = ablation("deepseek-v3")
>>> [r["label"] for r in rows][0], rows[-1]["fits"]
('naive baseline', True)
"""
from __future__ import annotations


from ..config import ModelConfig, TrainingConfig, load_model
from ..memory import Estimate, estimate
from ..overhead import OVERHEAD_PRESETS, Overheads
from ..states import RECIPES
from ..units import fmt_bytes, fmt_count
from .core import CAPACITY_80GB, PALETTE, gib, md_table, new_figure

__all__ = [
    "GPU", "CAPACITY", "V3_LAYOUT", "V3_TRAIN", "STEPS", "v3_estimate", "ablation", "ablation_table",
    "ablation_figure", "steps", "stage_table", "stage_figure", "text_values", "layout_text", "problem",
    "ledger_table",
]

#: the device: H800, 80 GB of HBM3 (decimal gigabytes, as the vendor counts)
GPU = "H800"
CAPACITY = CAPACITY_80GB

#: 61 layers over 16 stages: the three dense layers alone on stage 0 (with the embedding), four
#: layers on stages 1-14, two on stage 15 (with the head and the MTP module); under DualPipe rank 0
#: holds stages 0 and 15, i.e. five layers, the embedding, the head and the MTP module
V3_LAYOUT = (3,) + (4,) * 14 + (2,)

#: the report's configuration: 2048 GPUs = DP128 x PP16, EP64 carved out of DP (EDP 2)
V3_TRAIN = TrainingConfig(dp=128, tp=1, pp=16, ep=64, etp=1, schedule="dualpipe", zero=1,
                          precision="deepseek-v3", recompute="deepseek", profile="megatron",
                          micro_batch=1, seq_len=4096, layout=V3_LAYOUT)

#: the ablation: a naive baseline, then the report's techniques switched on one at a time
#: (label, what changes, the configuration after the change)
def steps(train: TrainingConfig = V3_TRAIN) -> tuple[tuple[str, str, TrainingConfig], ...]:
    """The ablation's steps for ``train``: a naive baseline with the same parallel sizes and layout,
    then DualPipe, ZeRO-1, BF16 moments, FP8 activations and recomputation, ending at ``train``."""
    base = train.with_(schedule="1f1b", zero=0, precision="megatron", recompute="none")
    return (
        ("naive baseline", "1F1B, ZeRO-0, fp32 master weights, gradients and AdamW moments, bf16 activations, "
                           "no recomputation", base),
        ("+ DualPipe", "bidirectional schedule: every rank holds two model stages (rank 0: the first and the last)",
         base.with_(schedule="dualpipe")),
        ("+ ZeRO-1", "optimizer states sharded over the data-parallel ranks (EDP ranks for the routed experts)",
         base.with_(schedule="dualpipe", zero=1)),
        ("+ BF16 moments", "AdamW moments in bf16 (master weights and gradients stay fp32)",
         base.with_(schedule="dualpipe", zero=1, precision="paper")),
        ("+ FP8 activations", "Linear inputs cached in FP8 (attention output in E5M6), SwiGLU input in FP8 and "
                              "its output recomputed", base.with_(schedule="dualpipe", zero=1, precision="deepseek-v3")),
        ("+ recompute norms and up-projections", "every RMSNorm output and the MLA up-projections recomputed "
                                                 "in backward: the DeepSeek-V3 configuration", train),
    )


STEPS: tuple[tuple[str, str, TrainingConfig], ...] = steps(V3_TRAIN)



def v3_estimate(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN,
                overhead: Overheads | None = None) -> Estimate:
    """The estimate with the H800's capacity and (by default) the low overhead preset."""
    return estimate(model, train, overhead if overhead is not None else OVERHEAD_PRESETS["low"], CAPACITY)


def layout_text(layout=V3_LAYOUT) -> str:
    """``3, 4 x 14, 2`` style text of a layout."""
    parts, i = [], 0
    while i < len(layout):
        j = i
        while j < len(layout) and layout[j] == layout[i]:
            j += 1
        parts.append(str(layout[i]) if j - i == 1 else f"{layout[i]} × {j - i}")
        i = j
    return ", ".join(parts)


def _states(st) -> int:
    return st.bytes["parameters"] + st.bytes["gradients"] + st.bytes["optimizer_states"]


def ablation(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN) -> list[dict]:
    """One row per step of :func:`steps` for ``train``: the peak device's states, activations, overhead
    and total, and the change."""
    rows, prev = [], None
    for label, what, step in steps(train):
        est = v3_estimate(model, step)
        pk = est.peak
        row = {"label": label, "what": what, "train": step, "stage": pk.stage.index,
               "states": _states(pk), "activations": pk.bytes["activations"], "overhead": pk.bytes["overhead"],
               "allocated": pk.allocated, "total": pk.total, "fits": est.fits(pk),
               "change": None if prev is None else pk.total - prev}
        rows.append(row)
        prev = pk.total
    return rows


def _signed(n: int) -> str:
    return ("−" if n < 0 else "+") + fmt_bytes(abs(n), "GiB")


def ablation_table(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN) -> str:
    rows = [(r["label"], r["what"], str(r["stage"]), fmt_bytes(r["states"]), fmt_bytes(r["activations"]),
             fmt_bytes(r["overhead"]), fmt_bytes(r["total"]), "—" if r["change"] is None else _signed(r["change"]),
             "yes" if r["fits"] else "no")
            for r in ablation(model, train)]
    return md_table(["step", "what changes", "peak rank", "model states", "activations", "overheads",
                     "total", "change", f"fits {fmt_bytes(CAPACITY, 'GB', 0)}"], rows, "llrrrrrrc")


def ablation_figure(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN):
    """The peak device of each step as stacked bars (states, activations, overheads), GiB, with the
    capacity line."""
    rows = ablation(model, train)
    fig, ax = new_figure(7.2, 3.8)
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for colour, key, name in zip(PALETTE, ("states", "activations", "overhead"),
                                 ("model states", "activations", "overheads (low preset)")):
        hs = [gib(r[key]) for r in rows]
        ax.bar(x, hs, bottom=bottom, width=0.6, color=colour, label=name)
        bottom = [a + b for a, b in zip(bottom, hs)]
    for xi, r in zip(x, rows):
        ax.annotate(fmt_bytes(r["total"], "GiB", 1), (xi, gib(r["total"])), ha="center", va="bottom",
                    fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.axhline(gib(CAPACITY), color=PALETTE[7], lw=1.2, ls="--")
    ax.annotate(f"{GPU}: {fmt_bytes(CAPACITY, 'GB', 0)} = {fmt_bytes(CAPACITY, 'GiB', 1)}",
                (-0.45, gib(CAPACITY)), ha="left", va="bottom", fontsize=8, color=PALETTE[7])
    ax.set_xticks(x, [r["label"].replace(" and ", "\nand ").replace("+ FP8 ", "+ FP8\n").replace("+ BF16 ", "+ BF16\n")
                      for r in rows], fontsize=7)
    ax.set_ylabel("peak rank, GiB per device")
    ax.legend(fontsize=8, loc="upper right")
    return fig


def stage_table(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN) -> str:
    est = v3_estimate(model, train)
    rows = []
    for st in est.stages:
        chunks = " + ".join(f"{c['stage']} ({len(c['layers'])})" for c in st.activations["chunks"])
        rows.append((str(st.stage.index), chunks, fmt_count(st.parameters), fmt_bytes(st.bytes["parameters"]),
                     fmt_bytes(st.bytes["gradients"]), fmt_bytes(st.bytes["optimizer_states"]),
                     fmt_bytes(st.bytes["activations"]), str(st.activations["microbatches_in_flight"]),
                     fmt_bytes(st.bytes["overhead"]), fmt_bytes(st.total)))
    return md_table(["rank", "model stages (layers)", "parameters", "weights", "gradients", "optimizer",
                     "activations", "micro-batches", "overheads", "total"], rows, "llrrrrrrrr")


def stage_figure(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN):
    """Stacked bars per pipeline rank of the DeepSeek-V3 configuration, GiB, with the capacity line."""
    est = v3_estimate(model, train)
    fig, ax = new_figure(7.2, 3.6)
    x = [st.stage.index for st in est.stages]
    parts = (("weights", lambda st: st.bytes["parameters"]), ("gradients", lambda st: st.bytes["gradients"]),
             ("optimizer states", lambda st: st.bytes["optimizer_states"]),
             ("activations", lambda st: st.bytes["activations"]), ("overheads", lambda st: st.bytes["overhead"]))
    bottom = [0.0] * len(x)
    for colour, (name, get) in zip(PALETTE, parts):
        hs = [gib(get(st)) for st in est.stages]
        ax.bar(x, hs, bottom=bottom, width=0.7, color=colour, label=name)
        bottom = [a + b for a, b in zip(bottom, hs)]
    ax.axhline(gib(CAPACITY), color=PALETTE[7], lw=1.2, ls="--")
    ax.annotate(f"{GPU}: {fmt_bytes(CAPACITY, 'GB', 0)} = {fmt_bytes(CAPACITY, 'GiB', 1)}", (x[-1] + 0.4, gib(CAPACITY)),
                ha="right", va="bottom", fontsize=8, color=PALETTE[7])
    ax.set_xticks(x)
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("GiB per device")
    ax.legend(fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    return fig


def ledger_table(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN,
                 kind: str = "moe") -> str:
    """The megatron ledger of one layer under ``train``: bytes per micro-batch of each entry, with and
    without the recipe's FP8 caching and recomputation."""
    from ..activations import entry_bytes
    from ..ledgers import act_profile

    est = v3_estimate(model, train)
    m, vals = est.model, est.values
    plain = train.with_(precision="paper", recompute="none")
    plain_rec = RECIPES[plain.precision]
    rows = []
    for e in act_profile(train.profile).layer(m, kind):
        b0 = int(entry_bytes(e, plain, plain_rec).xreplace(vals))
        b1 = 0 if est.policy.drops(e) else int(entry_bytes(e, train, est.recipe).xreplace(vals))
        rows.append((e.name, fmt_bytes(b0, "MiB"), "recomputed" if est.policy.drops(e) else fmt_bytes(b1, "MiB")))
    return md_table(["saved tensor", "bf16, nothing recomputed", "DeepSeek-V3 recipe"], rows, "lrr")


def _layer_total(model, train: TrainingConfig, kind: str = "moe") -> int:
    from ..activations import ledger_bytes
    from ..ledgers import act_profile

    est = v3_estimate(model, train)
    led = act_profile(train.profile).layer(est.model, kind)
    return sum(ledger_bytes(led, train, est.recipe, est.policy).evaluate(est.values).values())


def text_values(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN) -> dict[str, str]:
    """Every number of the chapter's prose, formatted, keyed by its glue key."""
    m = load_model(model)
    t = train
    est = v3_estimate(m, t)
    pk = est.peak
    high = v3_estimate(m, t, OVERHEAD_PRESETS["high"]).peak
    rows = ablation(m, t)
    base, final = rows[0], rows[-1]
    plain = t.with_(precision="paper", recompute="none")
    out = {
        "v3_gpus": fmt_count(t.world_size), "v3_gpu": GPU, "v3_pp": fmt_count(t.pp), "v3_ep": fmt_count(t.ep),
        "v3_dp": fmt_count(t.dp), "v3_edp": fmt_count(t.edp), "v3_tp": fmt_count(t.tp),
        "v3_b": fmt_count(t.micro_batch), "v3_s": fmt_count(t.seq_len), "v3_layers": fmt_count(m.num_hidden_layers),
        "v3_dense": fmt_count(m.first_k_dense_replace), "v3_layout": layout_text(est.partition.layout),
        "v3_label": t.label(), "v3_cap_gb": fmt_bytes(CAPACITY, "GB", 0), "v3_cap_gib": fmt_bytes(CAPACITY, "GiB", 1),
        "v3_bytes_per_param": fmt_count(RECIPES[t.precision].total_bytes),
        "v3_megatron_bytes_per_param": fmt_count(RECIPES["megatron"].total_bytes),
        "v3_peak_rank": fmt_count(pk.stage.index), "v3_peak": fmt_bytes(pk.total), "v3_peak_alloc": fmt_bytes(pk.allocated),
        "v3_peak_states": fmt_bytes(_states(pk)), "v3_peak_acts": fmt_bytes(pk.bytes["activations"]),
        "v3_peak_ovh": fmt_bytes(pk.bytes["overhead"]), "v3_peak_high": fmt_bytes(high.total),
        "v3_headroom": fmt_bytes(CAPACITY - pk.total), "v3_peak_mb": fmt_count(pk.activations["microbatches_in_flight"]),
        "v3_min_total": fmt_bytes(min(s.total for s in est.stages)),
        "v3_rank0": fmt_bytes(est.stages[0].total),
        "v3_base": fmt_bytes(base["total"]), "v3_base_rank": fmt_count(base["stage"]),
        "v3_base_acts": fmt_bytes(base["activations"]), "v3_base_states": fmt_bytes(base["states"]),
        "v3_final": fmt_bytes(final["total"]), "v3_saved": fmt_bytes(base["total"] - final["total"]),
        "v3_dualpipe_cost": fmt_bytes(rows[1]["change"]),
        "v3_zero_saving": fmt_bytes(-rows[2]["change"]), "v3_moments_saving": fmt_bytes(-rows[3]["change"]),
        "v3_fp8_saving": fmt_bytes(-rows[4]["change"]), "v3_recompute_saving": fmt_bytes(-rows[5]["change"]),
        "v3_layer_plain": fmt_bytes(_layer_total(m, plain), "MiB"), "v3_layer_v3": fmt_bytes(_layer_total(m, t), "MiB"),
        "v3_ovh_ctx": fmt_bytes(est.overhead.cuda_context, "MiB", 0), "v3_ovh_comm": fmt_bytes(est.overhead.comm_buffers),
        "v3_ovh_frag": f"{float(est.overhead.fragmentation) * 100:.0f} %",
    }
    return out


def problem(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = V3_TRAIN) -> dict[str, str]:
    """Worked problem: the configuration with twice the sequences per micro-batch."""
    t2 = train.with_(micro_batch=2 * train.micro_batch)
    est = v3_estimate(model, t2)
    pk = est.peak
    one = v3_estimate(model, train).peak
    return {"v3_p_b": fmt_count(t2.micro_batch), "v3_p_peak": fmt_bytes(pk.total), "v3_p_rank": fmt_count(pk.stage.index),
            "v3_p_acts": fmt_bytes(pk.bytes["activations"]), "v3_p_acts1": fmt_bytes(one.bytes["activations"]),
            "v3_p_verdict": "fits" if est.fits(pk) else "does not fit",
            "v3_p_over": fmt_bytes(abs(pk.total - CAPACITY))}
