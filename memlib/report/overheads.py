"""Tables, numbers and figures of the overheads chapter (``notebooks/07_overheads.md``).

The paper's §6 gives no formula for the memory a device needs beyond its tensors, only ranges:
5 % to 30 % fragmentation and 0.8 to 2 "GB" (GiB) of communication buffers.  memlib carries them
as named, sourced terms (:mod:`memlib.overhead`), with a CUDA-context term from the calculator
notes cited in the project's peers reference, and three presets (``none``, ``low``, ``high``).
This module shows what they add to stage 1 of the paper's configuration, and lists what exact
accounting of tensors does not cover (:data:`NOT_COVERED`), with the constants that govern it.

>>> rows = preset_values("deepseek-v3")
>>> [r["preset"] for r in rows]
['none', 'low', 'high']
>>> rows[0]["overhead"]
0
"""
from __future__ import annotations

from fractions import Fraction

from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model
from ..memory import ALLOCATED, estimate
from ..overhead import OVERHEAD_PRESETS, SOURCES, Overheads, overheads
from ..units import fmt_decimal, fmt_bytes, fmt_count
from .core import PALETTE, md_table, new_figure
from .static import stage_names

__all__ = [
    "TERMS", "TERM_LABELS", "PRESET_ORDER", "BASE_TRAINING", "RECONSTRUCTION", "MEASURED_RATIOS",
    "NOT_COVERED", "fraction_text", "sources_table", "preset_values", "preset_table", "preset_figure",
    "reconstruction_check", "not_covered_table", "measured_table", "problem_answers", "summary",
]

#: the overhead terms, in memlib's order
TERMS = ("cuda_context", "comm_buffers", "fragmentation")
TERM_LABELS = {"cuda_context": "CUDA context and kernels", "comm_buffers": "communication buffers",
               "fragmentation": "allocator fragmentation"}
PRESET_ORDER = ("none", "low", "high")

#: the configuration the chapter adds overheads to: the paper's, with the ZeRO stage DeepSeek-V3
#: uses (ZeRO-1) and the paper's "AC = Full", which is what fits (chapter 8 shows the others)
BASE_TRAINING = PAPER_TRAINING.with_(zero=1, recompute="full")

#: the reference reconstruction's own total for stages 1-14 (shared/reference/paper.md §6,
#: [inferred], not the paper): ZeRO-1 + AC=Full activations + buffers + fragmentation, in "GB"
RECONSTRUCTION = {"low": "47", "high": "60", "before_fragmentation": ("44.6", "45.8"),
                  "activations": "3.3"}

#: measured reserved / allocated memory (SimuMax B200 runs, peers reference, "Physical facts"), GiB
MEASURED_RATIOS = (
    {"run": "Llama3-70B (SimuMax, B200)", "reserved": "70.88", "allocated": "66.55"},
    {"run": "DeepSeek-V3, four layers, EP8 (SimuMax, B200)", "reserved": "110.18", "allocated": "104.30"},
)

#: what the exact accounting does not cover: (what, the constant that governs it, source)
NOT_COVERED = (
    ("allocator block rounding", "every request rounded up to 512 B; requests above 10 MiB to 2 MiB; "
     "small requests packed in 2 MiB segments, 1 to 10 MiB in 20 MiB segments",
     "PyTorch `c10/cuda/CUDACachingAllocator.cpp` (`kMinBlockSize`, `kRoundLarge`, `kSmallBuffer`, `kLargeBuffer`)"),
    ("cached but free blocks", "the allocator keeps freed blocks reserved; `expandable_segments:True` "
     "reduces the waste", "PyTorch `PYTORCH_CUDA_ALLOC_CONF`; Megatron-Core MoE guide"),
    ("NCCL buffers", "`NCCL_BUFFSIZE` = 4 MiB per channel and peer connection; NVLink SHARP buffers on top "
     "(Megatron's MoE guide sets `NCCL_NVLS_ENABLE=0`)", "NCCL documentation; Megatron-Core MoE guide"),
    ("transient peaks", "tensors alive only inside one operation: fp32 logits upcasts, all-to-all dispatch "
     "and combine buffers, gradient-reduction buckets, the optimizer step's temporaries",
     "not in the paper; memlib counts only what is saved between forward and backward"),
)


def fraction_text(x: Fraction) -> str:
    """A fraction as a percentage, e.g. ``5 %`` (display only)."""
    return fmt_decimal(Fraction(x) * 100, 0) + " %"


def _term_text(o: Overheads, term: str) -> str:
    if term == "fragmentation":
        return fraction_text(o.fragmentation) + " of allocated"
    n = getattr(o, term)
    if n < 2**30 and n % 2**20 == 0:
        return fmt_bytes(n, "MiB", 0)
    return fmt_bytes(n, "GiB")


def sources_table() -> str:
    """Each overhead term: what it is, the low and high presets' values, the source."""
    rows = [[TERM_LABELS[t], f"`{t}`", _term_text(OVERHEAD_PRESETS["low"], t),
             _term_text(OVERHEAD_PRESETS["high"], t), SOURCES[t]] for t in TERMS]
    return md_table(["term", "name", "preset `low`", "preset `high`", "source"], rows, "lllll")


def _stage(model, train: TrainingConfig) -> int:
    return stage_names(model, train)["analysed"]


def preset_values(model: ModelConfig | str, train: TrainingConfig = BASE_TRAINING) -> list[dict]:
    """Stage 1 (the analysed stage) under each preset: allocated bytes, the terms, the total."""
    m = load_model(model)
    stage = _stage(m, train)
    out = []
    for p in PRESET_ORDER:
        st = estimate(m, train, OVERHEAD_PRESETS[p]).stages[stage]
        out.append({"preset": p, "allocated": st.allocated, **st.overheads, "overhead": st.bytes["overhead"],
                    "total": st.total, "share": fmt_decimal(Fraction(st.bytes["overhead"] * 100, st.total), 1) + " %"})
    return out


def preset_table(model: ModelConfig | str, train: TrainingConfig = BASE_TRAINING) -> str:
    rows = []
    for r in preset_values(model, train):
        rows.append([f"`{r['preset']}`", fmt_bytes(r["allocated"], "GiB", with_unit=False)]
                    + [fmt_bytes(r[t], "GiB", with_unit=False) for t in TERMS]
                    + [fmt_bytes(r["overhead"], "GiB", with_unit=False), r["share"],
                       f"**{fmt_bytes(r['total'], 'GiB', with_unit=False)}**", fmt_count(r["total"])])
    headers = ["preset", "allocated (GiB)"] + [f"{TERM_LABELS[t]} (GiB)" for t in TERMS] + [
        "overhead (GiB)", "overhead share of total", "total (GiB)", "total (bytes)"]
    return md_table(headers, rows, "lrrrrrrrr")


def preset_figure(model: ModelConfig | str, train: TrainingConfig = BASE_TRAINING):
    """Horizontal stacked bars per preset: allocated memory and the three overhead terms, GiB per
    device of the analysed stage."""
    rows = preset_values(model, train)
    fig, ax = new_figure(7.0, 2.6)
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    parts = (("allocated", "allocated tensors"),) + tuple((t, TERM_LABELS[t]) for t in TERMS)
    for colour, (key, label) in zip(PALETTE, parts):
        w = [float(Fraction(r[key], 2**30)) for r in rows]
        ax.barh(y, w, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, w)]
    for yi, r, x in zip(y, rows, left):
        ax.annotate(fmt_bytes(r["total"], "GiB"), (x, yi), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(y, [f"preset {r['preset']}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("memory, GiB per device")
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return fig


def reconstruction_check(model: ModelConfig | str, train: TrainingConfig = BASE_TRAINING) -> dict:
    """memlib's low and high totals beside the reference reconstruction's range, and the terms the
    reconstruction leaves out (the recompute working set and the CUDA context)."""
    m = load_model(model)
    stage = _stage(m, train)
    rows = {r["preset"]: r for r in preset_values(m, train)}
    st = estimate(m, train).stages[stage]
    return {"low": fmt_bytes(rows["low"]["total"], "GiB"), "high": fmt_bytes(rows["high"]["total"], "GiB"),
            "printed_low": RECONSTRUCTION["low"], "printed_high": RECONSTRUCTION["high"],
            "printed_activations": RECONSTRUCTION["activations"],
            "held": fmt_bytes(st.activations["per_microbatch"] * st.activations["microbatches_in_flight"], "GiB"),
            "working": fmt_bytes(st.activations["recompute_working_set"], "GiB"),
            "activations": fmt_bytes(st.bytes["activations"], "GiB"),
            "context_low": fmt_bytes(rows["low"]["cuda_context"], "MiB", 0),
            "context_high": fmt_bytes(rows["high"]["cuda_context"], "GiB", 0)}


def not_covered_table() -> str:
    return md_table(["what", "what governs it", "source"], [list(r) for r in NOT_COVERED], "lll")


def _ratio(r: dict) -> Fraction:
    return Fraction(r["reserved"]) / Fraction(r["allocated"])


def measured_table() -> str:
    """Measured reserved / allocated ratios beside the paper's fragmentation band."""
    rows = [[r["run"], r["reserved"], r["allocated"], fmt_decimal((_ratio(r) - 1) * 100, 1) + " %"] for r in MEASURED_RATIOS]
    return md_table(["run", "reserved (GiB)", "allocated (GiB)", "reserved beyond allocated"], rows, "lrrr")


def problem_answers(model: ModelConfig | str, train: TrainingConfig = BASE_TRAINING,
                    capacity: int = 80 * 10**9) -> dict:
    """(1) stage 1 with the measured DeepSeek-V3 ratio as fragmentation; (2) the largest
    fragmentation at which stage 1 still fits ``capacity`` with the low preset's fixed terms."""
    m = load_model(model)
    stage = _stage(m, train)
    measured = _ratio(MEASURED_RATIOS[-1]) - 1
    st = estimate(m, train, overheads("low", fragmentation=measured)).stages[stage]
    low = OVERHEAD_PRESETS["low"]
    base = estimate(m, train, low).stages[stage]
    room = Fraction(capacity - base.allocated - low.cuda_context - low.comm_buffers, base.allocated)
    return {"measured": fmt_decimal(measured * 100, 1) + " %", "fragmentation": st.overheads["fragmentation"],
            "total": st.total, "capacity": capacity, "capacity_gib": fmt_bytes(capacity, "GiB", 1),
            "capacity_gb": fmt_bytes(capacity, "GB", 0), "max_fragmentation": fmt_decimal(room * 100, 1) + " %"}


def summary(model: ModelConfig | str, train: TrainingConfig = BASE_TRAINING) -> dict[str, str]:
    """Ready strings for the prose."""
    m = load_model(model)
    rows = {r["preset"]: r for r in preset_values(m, train)}
    low, high = OVERHEAD_PRESETS["low"], OVERHEAD_PRESETS["high"]
    return {
        "label": train.label(), "stage": str(_stage(m, train)), "zero": f"ZeRO-{train.zero}",
        "recompute": train.recompute, "allocated": fmt_bytes(rows["low"]["allocated"], "GiB"),
        "allocated_bytes": fmt_count(rows["low"]["allocated"]),
        "low_overhead": fmt_bytes(rows["low"]["overhead"], "GiB"), "high_overhead": fmt_bytes(rows["high"]["overhead"], "GiB"),
        "low_total": fmt_bytes(rows["low"]["total"], "GiB"), "high_total": fmt_bytes(rows["high"]["total"], "GiB"),
        "low_share": rows["low"]["share"], "high_share": rows["high"]["share"],
        "frag_low": fraction_text(low.fragmentation), "frag_high": fraction_text(high.fragmentation),
        "comm_low": fmt_bytes(low.comm_buffers, "GiB", 1), "comm_high": fmt_bytes(high.comm_buffers, "GiB", 1),
        "ctx_low": fmt_bytes(low.cuda_context, "MiB", 0), "ctx_high": fmt_bytes(high.cuda_context, "GiB", 0),
        "high_frag": fmt_bytes(rows["high"]["fragmentation"], "GiB"),
        "allocated_terms": ", ".join(ALLOCATED).replace("_", " "),
    }
