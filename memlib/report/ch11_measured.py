"""Chapter 11, "Measured peaks": tables, the figure and glued values, formatted from
:mod:`memlib.scenarios.functional` (Megatron-LM's functional tests) and :mod:`memlib.scenarios.measured` (published
measurements).  Nothing here computes a quantity."""
from __future__ import annotations

from ..config.versions import MEGATRON_COMMIT, NGC_BLACKWELL_CUBLAS_32MIB, NGC_TRANSFORMER_ENGINE, RULES
from ..data.reference import SIMUMAX_COMMIT, SIMUMAX_SETUP
from ..device.megatron_buffers import torch_cublas_workspace_bytes
from ..scenarios import functional as fv, measured as sm
from .figures import OKABE_ITO, SMALL_FONT, in_unit, new_figure, plain_log_ticks
from .format import fmt_bytes, fmt_count, fmt_percent, number_word, md_table, signed_bytes, signed_pct

__all__ = ["values", "worked_values", "family_table", "cases_table", "misses_table", "not_expressible_table", "reasons_table",
           "measured_figure", "published_values", "published_table", "published_stage_table", "assumptions_table",
           "not_used_table"]

UNIT = "GiB"
#: the target as the tables' headers say it
WITHIN = f"within {fmt_percent(fv.TARGET)}"


def _err(x) -> str:
    """A signed relative error, two decimals ('+1.50%', '−1.01%'): one decimal would print a miss of −1.01% as
    '−1.0%', which reads as within the 1% target."""
    return signed_pct(x, 2)


def _abs(x) -> str:
    """An absolute relative error (non-negative), one decimal: '1.5%'."""
    return signed_pct(x, 1).lstrip("+")


def _gib(n: int, digits: int = 2) -> str:
    """A table cell: the unit is in the column's header."""
    return fmt_bytes(n, UNIT, digits, with_unit=False)


def _where(loc) -> str:
    """Where a miss lies (Validation.miss_location): after the step (what stays that the persistent account
    misses) or at the peak (the activations and transient terms), and whether memlib counts too little there."""
    if loc is None:
        return "-"
    place, short = loc
    return f"{place}: " + ("not counted" if short else "counted, not held")


def values() -> dict[str, str]:
    """The chapter's numbers and words for its prose and its answer box."""
    k = fv.chapter_counts()
    a, fam = k.all, k.families
    ds, gpt = fam[fv.FAMILIES[0]], fam[fv.FAMILIES[3]]
    return {
        "commit": MEGATRON_COMMIT[:10], "n_files": fmt_count(k.n_files), "n_tests": fmt_count(k.n_tests),
        "n_cases": fmt_count(a.n), "n_within": fmt_count(a.within), "n_missed": fmt_count(a.missed),
        "n_miss_tests": fmt_count(k.n_miss_tests),
        "n_miss_step": fmt_count(k.miss_places[fv.PLACES[0]]), "n_miss_peak": fmt_count(k.miss_places[fv.PLACES[1]]),
        "n_miss_short": fmt_count(k.n_miss_short),
        **_miss_most(k.miss_places),
        "n_not_expressible": fmt_count(k.n_not_expressible),
        "target": fmt_percent(fv.TARGET), "target_share": fmt_percent(fv.TARGET_SHARE),
        "target_met": "is met" if k.target_met else "is not met",
        "te_refused": next(r.commit for r in RULES if r.key == "te_cross_entropy_refused"),
        "share_within": fmt_percent(a.share_within),
        "max_abs": _abs(a.max_abs), "mean_abs": _abs(a.mean_abs),
        "n_deepseek": fmt_count(ds.n), "n_deepseek_within": fmt_count(ds.within),
        "deepseek_max_abs": _abs(ds.max_abs), "deepseek_mean_abs": _abs(ds.mean_abs),
        "n_gpt": fmt_count(gpt.n), "n_gpt_within": fmt_count(gpt.within), "gpt_mean_abs": _abs(gpt.mean_abs),
        "n_mixtral": fmt_count(fam[fv.FAMILIES[1]].n), "n_llama": fmt_count(fam[fv.FAMILIES[2]].n),
        "n_derived": number_word(k.n_derived),
        # the software of the CI images (memlib.config.versions.container_rules)
        "lts_containers": ", ".join(f"{y:02d}.{m:02d}" for y, m in sorted(NGC_TRANSFORMER_ENGINE)),
        "lts_te": ", ".join(".".join(map(str, v)) for v in sorted(set(NGC_TRANSFORMER_ENGINE.values()))),
        "blackwell_container": "{:02d}.{:02d}".format(*NGC_BLACKWELL_CUBLAS_32MIB),
        "cublas_old": fmt_bytes(torch_cublas_workspace_bytes(10, blackwell_32mib=False), "MiB", 3),
        "cublas_new": fmt_bytes(torch_cublas_workspace_bytes(10), "MiB", 0),
    }


def _miss_most(places: dict) -> dict[str, str]:
    """Where most misses lie, and what that place holds, for the takeaway."""
    step, peak = fv.PLACES
    most = peak if places[peak] >= places[step] else step
    what = ("in the activations and transient buffers, not in the persistent states" if most == peak
            else "in what stays after the optimizer step, not in the activations")
    return {"miss_most": most, "n_miss_most": fmt_count(places[most]), "miss_most_what": what}


def worked_values() -> dict[str, str]:
    """The worked problem's numbers: one missed case, its logs and memlib's account."""
    c = fv.worked_case()
    place, short = c.miss_location or (fv.PLACES[1], True)
    return {
        "test": c.golden.test, "platform": f"{c.golden.environment} {c.golden.platform}",
        "gpus": fmt_count(c.world_size), "steady": fmt_bytes(c.steady, "MiB", 0),
        "post_step": fmt_bytes(c.golden.post_step, "MiB", 0), "predicted": fmt_bytes(c.predicted, "MiB", 0),
        "persistent": fmt_bytes(c.persistent, "MiB", 0), "error": _err(c.error),
        "post_gap": signed_bytes(c.post_step_gap, "MiB", 0), "peak_gap": signed_bytes(c.peak_gap, "MiB", 0),
        "place": place, "short": "holds more than memlib counts" if short else "holds less than memlib counts",
    }


def family_table() -> str:
    """Hits and misses per model family and GPU."""
    rows = [[fam, gpu, fmt_count(t.n), fmt_count(t.within), fmt_count(t.missed), _abs(t.mean_abs), _abs(t.max_abs)]
            for fam, gpu, t in fv.family_tallies()]
    return md_table(["family", "GPU", "cases", WITHIN, "missed", "mean absolute error", "largest absolute error"], rows, "llrrrrr")


def _breakable(name: str) -> str:
    """A test or platform name that may wrap after its underscores (a zero-width space after each), so that
    the long names fit the text column."""
    return name.replace("_", "_\u200b")


def _case_name(c) -> str:
    return _breakable(c.golden.test) + (" (2nd run)" if c.golden.second_run else "")


def cases_table() -> str:
    """Every case memlib expresses: measured, predicted, error, and where a miss lies (the HTML book's)."""
    rows = []
    for c in sorted(fv.cases(), key=lambda c: (fv.FAMILIES.index(c.family), c.golden.test, c.golden.file)):
        gaps = " / ".join(signed_bytes(x, "MiB", 0).removesuffix(" MiB") for x in (c.post_step_gap, c.peak_gap))
        rows.append([_case_name(c), _breakable(f"{c.golden.environment} {c.golden.platform}, "
                                               f"{fmt_count(c.world_size)} GPUs"),
                     _gib(c.steady), _gib(c.predicted), _err(c.error), gaps,
                     "yes" if c.within_target else _where(c.miss_location)])
    return md_table(["functional test", "image, platform", f"measured ({UNIT})", f"memlib ({UNIT})", "error",
                     "after the step / at the peak (MiB)", WITHIN], rows, "llrrrrl")


def misses_table() -> str:
    """The missed cases, one row per functional test: its golden files, the range of their errors, where the
    misses lie."""
    rows = []
    for g in fv.miss_groups():
        low, high = _err(g.low), _err(g.high)
        errors = low if low == high else f"{low} to {high}"
        rows.append([_breakable(g.test), g.family.split(" (")[0], fmt_count(g.n), errors,
                     "; ".join(_where(loc) for loc in g.locations)])
    return md_table(["functional test", "family", "files", "error", "where the miss lies"], rows, "llrrl")


def not_expressible_table() -> str:
    """The cases memlib cannot express, grouped by reason, with the tests (the HTML book's)."""
    rows = []
    for why, ns, tests in fv.reason_groups():
        rows.append([_breakable(why), fmt_count(len(ns)), ", ".join(map(_breakable, tests))])
    return md_table(["why memlib cannot express it", "golden files", "tests"], rows, "lrl")


def reasons_table() -> str:
    """The reasons memlib cannot express a case, with how many golden files and tests each (the PDF's)."""
    rows = [[_breakable(why), fmt_count(len(ns)), fmt_count(len(tests))] for why, ns, tests in fv.reason_groups()]
    return md_table(["why memlib cannot express it", "golden files", "tests"], rows, "lrr")


def measured_figure():
    """memlib against the measured steady peak, every case (log-log), the 1 % band."""
    ok = fv.cases()
    fig, ax = new_figure(height=3.2)
    colours = {fv.FAMILIES[0]: OKABE_ITO["vermillion"], fv.FAMILIES[1]: OKABE_ITO["orange"],
               fv.FAMILIES[2]: OKABE_ITO["green"], fv.FAMILIES[3]: OKABE_ITO["blue"]}
    for fam in fv.FAMILIES:
        cs = [c for c in ok if c.family == fam]
        if cs:
            ax.scatter([in_unit(c.steady, UNIT) for c in cs], [float(100 * c.error) for c in cs], s=9,
                       color=colours[fam], label=f"{fam} ({len(cs)})", alpha=0.8)
    ax.set_xscale("log")
    plain_log_ticks(ax, "x")
    ax.axhspan(-100 * float(fv.TARGET), 100 * float(fv.TARGET), color=OKABE_ITO["black"], alpha=0.08, lw=0)
    ax.axhline(0, color=OKABE_ITO["black"], lw=0.6)
    ax.set_xlabel(f"measured steady peak ({UNIT})")
    ax.set_ylabel("memlib's error (%)")
    fig.legend(loc="outside lower center", ncol=2)
    ax.set_title("memlib's peak_allocated against Megatron-LM's functional tests (last rank)", fontsize=SMALL_FONT)
    return fig


# ------------------------------------------------------------------------------------------------
# published measurements of Llama runs (SimuMax, B200), and the published rows not used
# ------------------------------------------------------------------------------------------------
def _parallel(c) -> str:
    t = c.train
    return f"TP {t.tp}, CP {t.cp}, PP {t.pp}, DP {t.dp}"


def published_values() -> dict[str, str]:
    """The numbers and words of the section on the published measurements."""
    cs = sm.published_cases()
    p = sm.published_summary(cs)
    return {
        "n_runs": fmt_count(p.n_runs), "n_rows": fmt_count(p.n_rows), "n_within": fmt_count(p.n_within),
        "max_abs": _abs(p.max_abs), "mean_abs": _abs(p.mean_abs),
        "stage_max_abs": _abs(p.stage_max_abs), "n_stage_over": fmt_count(p.n_stage_over),
        "within_runs": (f"all {fmt_count(p.n_runs)}" if p.n_within == p.n_runs > 1 else
                        f"{fmt_count(p.n_within)} of the {fmt_count(p.n_runs)}"),
        "within_runs_cap": (f"All {fmt_count(p.n_runs)}" if p.n_within == p.n_runs > 1 else
                            f"{fmt_count(p.n_within)} of the {fmt_count(p.n_runs)}"),
        "stage_over_clause": ("every stage is within the target" if p.n_stage_over == 0 else
                              f"{fmt_count(p.n_stage_over)} stages are outside the target"
                              if p.n_stage_over > 1 else "one stage is outside the target"),
        "simumax_commit": SIMUMAX_COMMIT[:10], "megatron_commit": SIMUMAX_SETUP["megatron_commit"][0][:8],
        "gpu": SIMUMAX_SETUP["gpu"][0][0], "world": fmt_count(SIMUMAX_SETUP["world_size"][0]),
        "n_not_used": number_word(len(sm.PUBLISHED_NOT_USED)),
        "unfused_max_abs": _abs(p.unfused_max_abs),
        "models": " and ".join(dict.fromkeys(c.label.split(" ")[0] for c in cs)),
    }


def published_table() -> str:
    rows = []
    for c in sm.published_cases():
        rows.append([c.label, _parallel(c), fmt_count(c.train.seq_len), fmt_count(len(c.rows)), _gib(c.measured_max),
                     _gib(c.predicted), _err(c.error), "yes" if c.within_target else "no", _err(c.error_unfused_ce)])
    return md_table(["run", "parallel sizes", "sequence", "published rows", f"measured maximum ({UNIT})",
                     f"memlib peak_allocated ({UNIT})", "error", f"within {fmt_percent(sm.TARGET)}",
                     "error, cross-entropy not fused"], rows, "llrrrrrlr")


def published_stage_table() -> str:
    """The runs with more than one pipeline stage, stage by stage."""
    rows = []
    for c in sm.published_cases():
        if len(c.peaks) < 2:
            continue
        for i, (p, m, e) in enumerate(zip(c.peaks, c.measured, c.stage_errors)):
            rows.append([c.label, fmt_count(i + 1), _gib(m), _gib(p.peak_allocated), _err(e)])
    return md_table(["run", "stage", f"measured ({UNIT})", f"memlib ({UNIT})", "error"], rows, "lrrrr")


def assumptions_table() -> str:
    rows = [[what, SIMUMAX_SETUP[key][1]] for what, key in sm.SIMUMAX_ASSUMPTIONS]
    return md_table(["read as", "stated by (SimuMax, or the Megatron-LM it ran)"], rows, "ll")


def not_used_table() -> str:
    rows = [[src, what, val, why] for src, what, val, why in sm.not_used()]
    return md_table(["source", "rows", "published", "why not used"], rows, "llll")
