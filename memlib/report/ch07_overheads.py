"""Chapter 7, "Buffers, fragmentation and other overheads": tables, figure and glued values, formatted
from :mod:`memlib.scenarios.overheads`.

Every function takes the chapter's device estimate (``BASE``: the chapter's configuration with
ZeRO-1 and full recomputation, :func:`memlib.scenarios.overheads.base_training`) or nothing; the
device is the analysed stage (:func:`memlib.paper.analysed_stage`).  Nothing here computes a quantity.
"""
from __future__ import annotations

from ..device.estimate import ALLOCATED, Estimate
from ..device.overhead import OVERHEAD_PRESETS, SOURCES
from ..paper import analysed_stage
from ..data.reference import CUDA_CONTEXT_MEASURED, MEASURED_RESERVED
from ..scenarios import overheads as so
from .figures import CATEGORY_COLORS, CATEGORY_LABELS, Series, new_figure, stacked_bars
from .format import (fmt_bytes, fmt_capacity, fmt_count, fmt_decimal, fmt_difference, fmt_size, md_table, pct, ratio,
                     zero_name)
from .notation import chapter_notation

__all__ = ["stage", "notation", "values", "sources_table", "preset_table", "preset_figure", "measured_table",
           "measured_values", "not_covered_table", "problem_values", "TERM_LABELS"]

TERM_LABELS = {"cuda_context": "CUDA context and kernels", "comm_buffers": "communication buffers",
               "fragmentation": "allocator fragmentation"}
#: the term in a sentence ("... is decided by the CUDA context")
TERM_PHRASES = {"cuda_context": "the CUDA context", "comm_buffers": "the communication buffers",
                "fragmentation": "fragmentation"}
POSITION_PHRASES = {"below": "below the paper's band", "lower half": "in the lower half of the paper's band",
                    "upper half": "in the upper half of the paper's band", "above": "above the paper's band"}
HATCHES = {"cuda_context": "", "comm_buffers": "//", "fragmentation": ".."}


def stage(base: Estimate) -> int:
    """The device the chapter analyses: the paper's stage (the first MoE-only one)."""
    return analysed_stage(base.partition)


def _device(base: Estimate):
    return base.stages[stage(base)]


def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch07", est.model, est.train)


def _term_text(preset: str, term: str) -> str:
    o = OVERHEAD_PRESETS[preset]
    if term == "fragmentation":
        return pct(o.fragmentation, 1, 0) + " of allocated"
    return fmt_size(getattr(o, term))


def _frac(x) -> str:
    return pct(x, 1, 0)


def values(base: Estimate) -> dict[str, str]:
    """The chapter's numbers and words for its prose."""
    st = _device(base)
    rows = so.preset_terms(st)
    low, high = OVERHEAD_PRESETS["low"], OVERHEAD_PRESETS["high"]
    widest = so.widest_term(st)
    cap = so.CAPACITY_80GB
    return {
        "label": base.train.label(), "stage": fmt_count(stage(base)), "zero": zero_name(base.train.zero, short=True),
        "recompute": base.train.recompute, "layers": fmt_count(len(st.stage.layers)),
        "allocated": fmt_bytes(st.allocated), "allocated_bytes": fmt_count(st.allocated),
        "allocated_terms": ", ".join(CATEGORY_LABELS[k] for k in ALLOCATED),
        "low_overhead": fmt_bytes(rows["low"]["overhead"]), "high_overhead": fmt_bytes(rows["high"]["overhead"]),
        "low_total": fmt_bytes(rows["low"]["total"]), "high_total": fmt_bytes(rows["high"]["total"]),
        "low_share": pct(rows["low"]["share"], 1), "high_share": pct(rows["high"]["share"], 1),
        "frag_low": _frac(low.fragmentation), "frag_high": _frac(high.fragmentation),
        "comm_low": fmt_bytes(low.comm_buffers, "GiB", 1), "comm_high": fmt_bytes(high.comm_buffers, "GiB", 1),
        "ctx_low": _term_text("low", "cuda_context"), "ctx_high": _term_text("high", "cuda_context"),
        "widest": TERM_PHRASES[widest], "widest_high": fmt_bytes(rows["high"][widest]),
        "widest_spread": fmt_bytes(so.spread(st)[widest]),
        "capacity": fmt_capacity(cap),
        **_fit_words(so.judged_fit(st, base.model, "low", cap)),
    }


#: a verdict of :func:`memlib.scenarios.overheads.judged_fit`: the verb, and how it reads with memlib's measured error
FIT_VERBS = {"fits": "fits", "marginal": "fits", "does not fit": "does not fit"}
FIT_BANDS = {"fits": "even at the far end of memlib's measured error",
             "marginal": "but only marginally, inside memlib's measured error",
             "does not fit": "even at the near end of memlib's measured error"}


def _fit_words(j: dict) -> dict[str, str]:
    band = ("by the prediction alone, which no measured run of a model of its family checks" if j["band"].n == 0
            else FIT_BANDS[j["verdict"]])
    return {"fits": FIT_VERBS[j["verdict"]], "fits_band": band}


def sources_table() -> str:
    """Each overhead term: what it is, the low and high presets' values, the source."""
    ctx = (f"memlib's assumption (no public source states this range); for scale, a PyTorch process holding "
           f"one small tensor used {fmt_bytes(CUDA_CONTEXT_MEASURED['lazy'], 'MiB', 0)} of device memory with "
           f"CUDA's lazy module loading and {fmt_bytes(CUDA_CONTEXT_MEASURED['eager'], 'MiB', 0)} without "
           f"({CUDA_CONTEXT_MEASURED['source']})")
    source = {"cuda_context": ctx, "comm_buffers": SOURCES["comm_buffers"], "fragmentation": SOURCES["fragmentation"]}
    rows = [[TERM_LABELS[t], f"`{t}`", _term_text("low", t), _term_text("high", t), source[t]] for t in so.TERMS]
    return md_table(["term", "name", "preset `low`", "preset `high`", "source"], rows, "lllll")


def preset_table(base: Estimate) -> str:
    """The device under each preset: allocated bytes, the three terms, their sum, its share, the total."""
    rows = []
    for p, r in so.preset_terms(_device(base)).items():
        rows.append([f"`{p}`", fmt_bytes(r["allocated"], with_unit=False)]
                    + [fmt_bytes(r[t], with_unit=False) for t in so.TERMS]
                    + [f"{fmt_bytes(r['overhead'], with_unit=False)} ({pct(r['share'], 1)})",
                       f"**{fmt_bytes(r['total'], with_unit=False)}**", fmt_count(r["total"])])
    # the overheads' share of the total beside them, not in a column of its own: the exact total fits the column
    headers = ["preset", "allocated (GiB)"] + [f"{TERM_LABELS[t]} (GiB)" for t in so.TERMS] + [
        "overheads (GiB, share of the total)", "total (GiB)", "total (bytes)"]
    return md_table(headers, rows, "lrrrrrrr")


def preset_figure(base: Estimate):
    """Stacked bars per preset: the allocated categories in their colours, then the three overhead
    terms in the overheads' colour (hatched apart), GiB per device."""
    st = _device(base)
    rows = so.preset_terms(st)
    presets = list(rows)
    series = [Series(CATEGORY_LABELS[k], CATEGORY_COLORS[k], [st.bytes[k]] * len(presets)) for k in ALLOCATED]
    series += [Series(TERM_LABELS[t], CATEGORY_COLORS["overhead"], [rows[p][t] for p in presets]) for t in so.TERMS]
    fig, ax = new_figure(height=3.8)
    tops = stacked_bars(ax, [f"preset {p}" for p in presets], series, digits=2)
    for c in ax.containers:
        for t in so.TERMS:
            if c.get_label() == TERM_LABELS[t]:
                for patch in c.patches:
                    patch.set_hatch(HATCHES[t])
                    patch.set_edgecolor("white")
    ax.set_ylim(0, max(tops) * 1.15)
    ax.set_ylabel("memory, GiB per device")
    ax.legend(loc="upper left", ncol=2)
    return fig


def measured_table() -> str:
    """Measured reserved and allocated memory, and the reserved beyond the allocated."""
    rows = [[f"{r['model']} ({r['parallel']})", fmt_decimal(r["reserved_gib"], 2), fmt_decimal(r["allocated_gib"], 2),
             pct(r["excess"], 1, 1)] for r in so.measured_ratios()]
    return md_table(["run (B200)", "reserved (GiB)", "allocated (GiB)", "reserved beyond allocated"], rows, "lrrr")


def measured_values() -> dict[str, str]:
    """Where the measured runs sit against the presets' fragmentation band, in words."""
    rows = so.measured_ratios()
    positions = {r["position"] for r in rows}
    where = POSITION_PHRASES[positions.pop()] if len(positions) == 1 else \
        "; ".join(f"{r['model']} {POSITION_PHRASES[r['position']]}" for r in rows)
    return {"where": where, "source": MEASURED_RESERVED["source"]}


def _size(n: int) -> str:
    return fmt_size(n, small="B")


def not_covered_table(model=None) -> str:
    """What the exact accounting does not cover, what governs it, and the source (the MoE layer's all-to-all
    buffers among the transient tensors only for a ``model`` with MoE layers; all of them without a model)."""
    a2a = "all-to-all dispatch and combine buffers, " if model is None or model.has_moe else ""
    governs = {
        "block_rounding": lambda c: (
            f"every request rounded up to {_size(c['min_block'])}; requests up to {_size(c['small_size'])} "
            f"packed in {_size(c['small_buffer'])} segments, those below {_size(c['min_large'])} in "
            f"{_size(c['large_buffer'])} segments, larger ones in segments rounded up to {_size(c['round_large'])}"),
        "cached_blocks": lambda c: ("the allocator keeps freed blocks reserved for reuse; "
                                    "`expandable_segments:True` reduces the waste"),
        "nccl": lambda c: (f"`NCCL_BUFFSIZE` = {_size(c['buffsize'])} per channel and peer connection by default; "
                           "NVLink SHARP buffers on top unless `NCCL_NVLS_ENABLE=0`"),
        "transient": lambda c: ("tensors alive only inside one operation: fp32 logits upcasts, " + a2a
                                + "gradient-reduction buckets, the optimizer step's temporaries"),
    }
    rows = [[r["what"], governs[r["key"]](r["constants"]), r["source"]] for r in so.NOT_COVERED]
    return md_table(["what", "what governs it", "source"], rows, "lll")


def problem_values(base: Estimate) -> dict[str, str]:
    """(1) the measured run's gap as the fragmentation fraction; (2) the headroom for fragmentation."""
    st = _device(base)
    key, own = so.measured_run(base.model)
    m = so.measured_fragmentation(st, key)
    run = MEASURED_RESERVED["runs"][key]
    h = so.headroom(st)
    if h["room"] < 0:
        answer = (f"None: with the low preset's fixed terms the device already exceeds "
                  f"{fmt_capacity(h['capacity'])} without any fragmentation.")
    else:
        band = ("above" if h["above_band"] else "at or below") + f" the paper's high end of {_frac(so.band()[1])}"
        judged = so.judged_fit(st, base.model, "high", h["capacity"])["verdict"]
        high = ("this device fits under any overhead in the paper's ranges" if judged == "fits" else
                "at the high end of the paper's ranges this device fits only marginally, inside memlib's measured "
                "error" if judged == "marginal" else
                "this device does not fit at the high end of the paper's ranges")
        if h["max_fraction"] >= 1:
            # a small device on a large card: fragmentation may outgrow the tensors themselves
            answer = (f"Up to {fmt_bytes(h['room'])}, {ratio(h['max_fraction'], 1, 1)} times the "
                      f"{fmt_bytes(st.allocated)} allocated, {band}: {high}.")
        else:
            answer = f"Up to {pct(h['max_fraction'], 1, 1)} of the allocated memory, {band}: {high}."
    return {"p1_run": f"{run['model']}, {run['parallel']}", "p1_measured": pct(m["fraction"], 1, 1),
            "p1_why": "a measured run of this model" if own else ("the measured MoE run with the largest gap"
                                                                  if base.model.has_moe else
                                                                  "the measured run of a dense model"),
            "p1_frag": fmt_bytes(m["fragmentation"]), "p1_total": fmt_bytes(m["total"]),
            "p1_delta": fmt_difference(m["total"], m["low_total"], signed=True), "p1_low_total": fmt_bytes(m["low_total"]),
            "p2_capacity": fmt_capacity(h["capacity"]),
            "p2_answer": answer}
