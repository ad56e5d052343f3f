"""Tables, numbers and figures of the chapter that puts everything together
(``notebooks/08_putting_together.md``).

Every stage of the paper's configuration (PP16@TP2@EP8@ETP1, b = 1, s = 4096, 1F1B) under each
ZeRO stage and recompute policy, with the ``low`` overhead preset, against an 80 GB device
(80 * 10**9 bytes, the H800's and H100's HBM; the figures are in GiB); why no recomputation cannot
fit; and the pipeline schedules compared on one configuration.

>>> v = grid_values("deepseek-v3")
>>> v[(1, "full")]["fits"], v[(0, "none")]["fits"]
(True, False)
"""
from __future__ import annotations

from fractions import Fraction

from ..activations import POLICIES
from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model
from ..ledgers import paper_layer
from ..memory import estimate
from ..overhead import OVERHEAD_PRESETS, Overheads
from ..partition import Partition
from ..states import ZeroStage
from ..units import fmt_decimal, fmt_bytes, fmt_count
from .activations import MODULE_LIST, POLICY_ORDER
from .core import CAPACITY_80GB, PALETTE, gib, md_table, new_figure
from .zero import stage_label

__all__ = [
    "CAPACITY", "capacity_label", "TERMS", "TERM_LABELS", "POLICIES_SHOWN", "ZERO_STAGES", "OVERHEAD",
    "grid_values", "grid_figure", "fit_table", "no_recompute", "interleaved_layout", "schedule_configs",
    "schedule_values", "schedule_table", "layout_text", "SCHEDULE_BASE", "schedule_base", "schedule_figure", "problem_answers", "summary", "policy_name",
]

#: an 80 GB device (H800 / H100 SXM), decimal bytes as the vendor counts them
CAPACITY = CAPACITY_80GB

#: the byte terms of a device, stacked in this order
TERMS = ("parameters", "gradients", "optimizer_states", "activations", "overhead")
TERM_LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer_states": "optimizer states",
               "activations": "activations", "overhead": "overhead (low preset)"}

#: the recompute policies and ZeRO stages the chapter crosses
POLICIES_SHOWN = POLICY_ORDER + (MODULE_LIST,)
ZERO_STAGES = tuple(int(z) for z in ZeroStage)

#: the configuration the schedules are compared on: the paper's with ZeRO-1 and full recomputation
SCHEDULE_BASE = PAPER_TRAINING.with_(zero=int(ZeroStage.OS), recompute="full")

#: overheads used throughout the chapter
OVERHEAD: Overheads = OVERHEAD_PRESETS["low"]


def capacity_label(capacity: int = CAPACITY) -> str:
    """``80 GB (74.5 GiB)``: the device in the vendor's unit and in the book's."""
    return f"{fmt_bytes(capacity, 'GB', 0)} ({fmt_bytes(capacity, 'GiB', 1)})"


def policy_name(p: str) -> str:
    return p if p in POLICIES else "module list"


# --------------------------------------------------------------------------------------------
# every (ZeRO, recompute) combination
# --------------------------------------------------------------------------------------------
def grid_values(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING,
                overhead: Overheads = OVERHEAD, capacity: int = CAPACITY) -> dict:
    """(zero, policy) -> per-stage bytes, the peak stage and whether every stage fits."""
    m = load_model(model)
    out = {}
    for z in ZERO_STAGES:
        for p in POLICIES_SHOWN:
            est = estimate(m, train.with_(zero=z, recompute=p), overhead, capacity)
            stages = [{**st.bytes, "total": st.total, "index": st.stage.index} for st in est.stages]
            peak = est.peak
            out[(z, p)] = {"stages": stages, "peak": peak.stage.index, "peak_total": peak.total,
                           "peak_bytes": dict(peak.bytes),
                           "fits": all(est.fits(st) for st in est.stages)}
    return out


def grid_figure(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING,
                policies=POLICY_ORDER, capacity: int = CAPACITY):
    """Small multiples: rows are recompute policies, columns ZeRO stages; each panel stacks the
    terms of every pipeline stage, GiB per device, with the device's capacity as a line."""
    v = grid_values(model, train, capacity=capacity)
    fig, _ = new_figure(11.0, 2.3 * len(policies) + 0.8)
    fig.clf()
    axes = fig.subplots(len(policies), len(ZERO_STAGES), sharex=True, sharey="row", squeeze=False)
    cap = gib(capacity)
    for i, p in enumerate(policies):
        for j, z in enumerate(ZERO_STAGES):
            ax = axes[i][j]
            stages = v[(z, p)]["stages"]
            x = [s["index"] for s in stages]
            bottom = [0.0] * len(stages)
            for colour, t in zip(PALETTE, TERMS):
                hgt = [gib(s[t]) for s in stages]
                ax.bar(x, hgt, bottom=bottom, color=colour, width=0.8, label=TERM_LABELS[t])
                bottom = [a + b for a, b in zip(bottom, hgt)]
            ax.axhline(cap, color=PALETTE[7], lw=1, ls="--", label=capacity_label(capacity))
            if i == 0:
                ax.text(0.5, 1.04, stage_label(ZeroStage(z)), transform=ax.transAxes, ha="center", fontsize=9)
            ax.set_xticks(x[::5])
            if j == 0:
                ax.set_ylabel(f"{policy_name(p)}\nGiB per device", fontsize=9)
            if i == len(policies) - 1:
                ax.set_xlabel("pipeline stage", fontsize=9)
            ax.tick_params(labelsize=7)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8, bbox_to_anchor=(0.5, -0.04))
    return fig


def fit_table(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, capacity: int = CAPACITY) -> str:
    """Rows: recompute policies; columns: ZeRO stages; a cell gives the peak device's total GiB,
    its stage, and whether every stage fits ``capacity``."""
    v = grid_values(model, train, capacity=capacity)
    rows = []
    for p in POLICIES_SHOWN:
        row = [f"`{p}`"]
        for z in ZERO_STAGES:
            c = v[(z, p)]
            verdict = "fits" if c["fits"] else "**does not fit**"
            row.append(f"{fmt_bytes(c['peak_total'], 'GiB', with_unit=False)} (stage {c['peak']}), {verdict}")
        rows.append(row)
    headers = ["recompute"] + [f"{stage_label(ZeroStage(z))}: peak GiB (stage)" for z in ZERO_STAGES]
    return md_table(headers, rows, "l" + "r" * len(ZERO_STAGES))


# --------------------------------------------------------------------------------------------
# why no recomputation cannot fit
# --------------------------------------------------------------------------------------------
def no_recompute(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, capacity: int = CAPACITY) -> dict:
    """Stage 0 without recomputation under the strongest ZeRO: micro-batches in flight, the
    attention scores of one micro-batch, and how far the activations alone exceed ``capacity``."""
    m = load_model(model)
    t = train.with_(zero=int(ZeroStage.OS_G_PARAMS), recompute="none")
    est = estimate(m, t, OVERHEAD, capacity)
    st = est.stages[0]
    a = st.activations
    score_keys = {e.key for kind in ("dense", "moe") for e in paper_layer(m, kind) if "core_attn" in e.modules}
    scores = sum(x for k, x in a["by_entry"].items() if k in score_keys)
    held = a["per_microbatch"] * a["microbatches_in_flight"]
    states = st.bytes["parameters"] + st.bytes["gradients"] + st.bytes["optimizer_states"]
    return {"zero": stage_label(ZeroStage(t.zero)), "stage": st.stage.index, "in_flight": a["microbatches_in_flight"], "pp": t.pp,
            "per_microbatch": a["per_microbatch"], "scores": scores, "scores_held": scores * a["microbatches_in_flight"],
            "held": held, "states": states, "total": st.total, "layers": len(st.stage.layers),
            "times": fmt_decimal(Fraction(held, capacity), 1), "share": fmt_decimal(Fraction(scores * 100, a["per_microbatch"]), 1) + " %",
            "without_scores": held - scores * a["microbatches_in_flight"]}


# --------------------------------------------------------------------------------------------
# pipeline schedules
# --------------------------------------------------------------------------------------------
def schedule_base(train: TrainingConfig = PAPER_TRAINING) -> TrainingConfig:
    """``train`` with ZeRO-1 and full recomputation: the configuration the schedules are compared on."""
    return train.with_(zero=int(ZeroStage.OS), recompute="full")


def interleaved_layout(model: ModelConfig | str, pp: int, vpp: int,
                       train: TrainingConfig = PAPER_TRAINING) -> tuple[int, ...]:
    """Decoder layers per virtual stage for the interleaved schedule: as even as possible, the
    lighter chunks on the first virtual stage (it also holds the embedding) and the last ones
    (the head).  Validated by building the partition."""
    m = load_model(model)
    n, layers = pp * vpp, m.num_hidden_layers
    base, extra = divmod(layers, n)
    light = n - extra
    if base == 0:
        raise ValueError(f"{layers} layers cannot fill {n} virtual stages")
    sizes = [base + 1] * n
    if light:
        sizes[0] = base
        for i in range(n - light + 1, n):
            sizes[i] = base
    layout = tuple(sizes)
    Partition(m, train.with_(pp=pp, schedule="interleaved", vpp=vpp, layout=layout))
    if sum(layout) != layers or min(layout) < 1:
        raise ValueError(f"layout {layout} does not cover the {layers} layers")
    return layout


def layout_text(layout: tuple[int, ...]) -> str:
    """A layout as runs, e.g. ``1, 2 (×29), 1 (×2)``."""
    runs: list[list[int]] = []
    for x in layout:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return ", ".join(f"{x} (×{n})" if n > 1 else str(x) for x, n in runs)


def schedule_configs(model: ModelConfig | str, train: TrainingConfig) -> dict[str, TrainingConfig]:
    """The four schedules on one configuration: GPipe with M = 2 PP micro-batches, 1F1B,
    interleaved 1F1B with V = 2 and :func:`interleaved_layout`, DualPipe."""
    m_gpipe = 2 * train.pp
    return {
        "gpipe": train.with_(schedule="gpipe", num_microbatches=m_gpipe),
        "1f1b": train.with_(schedule="1f1b"),
        "interleaved": train.with_(schedule="interleaved", vpp=2, layout=interleaved_layout(model, train.pp, 2, train)),
        "dualpipe": train.with_(schedule="dualpipe"),
    }


def schedule_values(model: ModelConfig | str, train: TrainingConfig, capacity: int = CAPACITY) -> dict[str, dict]:
    m = load_model(model)
    out = {}
    for name, t in schedule_configs(m, train).items():
        est = estimate(m, t, OVERHEAD, capacity)
        peak = est.peak
        out[name] = {"train": t, "totals": [st.total for st in est.stages],
                     "activations": [st.bytes["activations"] for st in est.stages],
                     "peak": peak.stage.index, "peak_total": peak.total, "peak_bytes": dict(peak.bytes),
                     "in_flight": peak.activations["microbatches_in_flight"], "chunks": len(peak.stage.chunks),
                     "fits": all(est.fits(st) for st in est.stages),
                     "max_in_flight": max(st.activations["microbatches_in_flight"] for st in est.stages)}
    return out


def _schedule_text(name: str, t: TrainingConfig) -> str:
    if name == "gpipe":
        return f"GPipe, $M$ = {t.num_microbatches}"
    if name == "interleaved":
        return f"interleaved 1F1B, $V$ = {t.vpp}"
    return {"1f1b": "1F1B", "dualpipe": "DualPipe"}[name]


def schedule_table(model: ModelConfig | str, train: TrainingConfig, capacity: int = CAPACITY) -> str:
    rows = []
    for name, r in schedule_values(model, train, capacity).items():
        b = r["peak_bytes"]
        rows.append([_schedule_text(name, r["train"]), str(r["chunks"]), str(r["peak"]), str(r["in_flight"]),
                     fmt_bytes(b["parameters"] + b["gradients"] + b["optimizer_states"], "GiB", with_unit=False),
                     fmt_bytes(b["activations"], "GiB", with_unit=False),
                     f"**{fmt_bytes(r['peak_total'], 'GiB', with_unit=False)}**",
                     "yes" if r["fits"] else "**no**"])
    headers = ["schedule", "model chunks per device", "peak stage", "micro-batches in flight there (all chunks)",
               "model states (GiB)", "activations (GiB)", "total (GiB)", f"every stage fits {capacity_label(capacity)}"]
    return md_table(headers, rows, "lrrrrrrl")


def schedule_figure(model: ModelConfig | str, train: TrainingConfig, capacity: int = CAPACITY):
    """Total memory of every pipeline stage's device under each schedule, GiB per device."""
    v = schedule_values(model, train, capacity)
    fig, ax = new_figure(7.5, 3.6)
    for colour, (name, r) in zip(PALETTE, v.items()):
        x = list(range(len(r["totals"])))
        ax.plot(x, [gib(t) for t in r["totals"]], marker="o", ms=4, color=colour,
                label=_schedule_text(name, r["train"]).replace("$", ""))
    ax.axhline(gib(capacity), color=PALETTE[7], lw=1, ls="--", label=capacity_label(capacity))
    ax.set_xticks(range(len(next(iter(v.values()))["totals"])))
    ax.set_xlabel("pipeline stage (rank)")
    ax.set_ylabel("total, GiB per device")
    ax.legend(fontsize=8, ncol=2)
    return fig


# --------------------------------------------------------------------------------------------
# worked problems and prose numbers
# --------------------------------------------------------------------------------------------
def problem_answers(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, capacity: int = CAPACITY) -> dict:
    """(1) the largest micro-batch with which ZeRO-1 + full recomputation still fits;
    (2) ZeRO-1 + selective recomputation: how much must go for it to fit."""
    m = load_model(model)
    t = train.with_(zero=int(ZeroStage.OS), recompute="full")
    best, bb = None, 1
    while True:
        est = estimate(m, t.with_(micro_batch=bb), OVERHEAD, capacity)
        if not all(est.fits(st) for st in est.stages):
            break
        best, bb = (bb, est.peak.total, est.peak.stage.index), bb + 1
    over = estimate(m, t.with_(micro_batch=bb), OVERHEAD, capacity).peak
    sel = estimate(m, train.with_(zero=int(ZeroStage.OS), recompute="selective"), OVERHEAD, capacity).peak
    sel3 = estimate(m, train.with_(zero=int(ZeroStage.OS_G_PARAMS), recompute="selective"), OVERHEAD, capacity).peak
    return {"b_max": best[0], "b_max_total": best[1], "b_max_stage": best[2], "b_next": bb,
            "b_next_total": over.total, "b_next_stage": over.stage.index,
            "sel_total": sel.total, "sel_stage": sel.stage.index, "sel_excess": sel.total - capacity,
            "sel3_total": sel3.total, "sel3_stage": sel3.stage.index}


def summary(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, capacity: int = CAPACITY) -> dict[str, str]:
    """Ready strings for the prose."""
    v = grid_values(model, train, capacity=capacity)
    fit = [(z, p) for (z, p), c in v.items() if c["fits"]]
    best = v[(int(ZeroStage.OS), "full")]
    return {
        "label": train.label(), "capacity": capacity_label(capacity), "capacity_gb": fmt_bytes(capacity, "GB", 0),
        "capacity_gib": fmt_bytes(capacity, "GiB", 1), "capacity_bytes": fmt_count(capacity),
        "b": str(train.micro_batch), "s": fmt_count(train.seq_len), "schedule": train.schedule.upper(),
        "n_combos": str(len(v)), "n_fit": str(len(fit)),
        "fit_list": "; ".join(f"{stage_label(ZeroStage(z))} with `{p}`" for z, p in fit),
        "z1_full": fmt_bytes(best["peak_total"], "GiB"), "z1_full_stage": str(best["peak"]),
        "z1_full_margin": fmt_bytes(capacity - best["peak_total"], "GiB"),
        "none_best": fmt_bytes(min(v[(z, "none")]["peak_total"] for z in ZERO_STAGES), "GiB"),
    }
