"""Chapter 11, "Measured peaks": tables, the figure and glued values, formatted from
:mod:`memlib.scenarios.functional` (Megatron-LM's functional tests) and :mod:`memlib.scenarios.measured` (published
measurements).  Nothing here computes a quantity."""
from __future__ import annotations

from fractions import Fraction

from ..config.versions import NGC_BLACKWELL_CUBLAS_32MIB, NGC_TRANSFORMER_ENGINE, RULES
from ..data.reference import SIMUMAX_COMMIT, SIMUMAX_SETUP
from ..device.megatron_buffers import torch_cublas_workspace_bytes
from ..scenarios import functional as fv, measured as sm
from .figures import OKABE_ITO, SMALL_FONT, in_unit, new_figure, plain_log_ticks
from .format import fmt_bytes, fmt_count, fmt_decimal, md_table, signed_bytes

__all__ = ["values", "family_table", "cases_table", "not_expressible_table", "figure", "published_values",
           "published_table", "published_stage_table", "assumptions_table", "not_used_table"]

UNIT = "GiB"


def _err(x) -> str:
    s = fmt_decimal(100 * x, 1)
    return ("+" + s if x > 0 else s.replace("-", "−")) + " %"


def _gib(n: int, digits: int = 2) -> str:
    """A table cell: the unit is in the column's header."""
    return fmt_bytes(n, UNIT, digits, with_unit=False)


def _where(c) -> str:
    """Where a miss lies, from the logs: after the step (what stays that the persistent account misses) or at the
    peak (the activations and transient terms), whichever holds more of the error."""
    err = c.predicted - c.steady
    if abs(c.post_step_gap) >= abs(c.peak_gap):
        return "after the step: " + ("not counted" if c.post_step_gap > 0 else "counted, not held")
    return "at the peak: " + ("not counted" if c.peak_gap > 0 else "counted, not held") if err else "-"


def values() -> dict[str, str]:
    """The chapter's numbers and words for its prose and its answer box."""
    ok, no = fv.validation()
    s = fv.summary(ok)
    fam = s["families"]
    ds = [c for c in ok if c.family == fv.FAMILIES[0]]
    out = {
        "commit": fv.FUNCTIONAL_TESTS_COMMIT[:10], "n_files": fmt_count(len(ok) + len(no)),
        "n_tests": fmt_count(len({c.golden.key for c in ok} | {n.golden.key for n in no})),
        "n_cases": fmt_count(s["n"]), "n_within": fmt_count(s["within"]), "n_missed": fmt_count(s["n"] - s["within"]),
        "n_not_expressible": fmt_count(len(no)),
        "target": fmt_decimal(100 * fv.TARGET, 0) + " %",
        "target_share": fmt_decimal(100 * fv.TARGET_SHARE, 0) + " %",
        "target_met": "is met" if s["target_met"] else "is not met",
        "te_refused": next(r.commit for r in RULES if r.key == "te_cross_entropy_refused"),
        "share_within": fmt_decimal(100 * Fraction(s["within"], max(s["n"], 1)), 0) + " %",
        "max_abs": _err(s["max_abs"]).lstrip("+"), "mean_abs": _err(s["mean_abs"]).lstrip("+"),
        "n_deepseek": fmt_count(len(ds)), "n_deepseek_within": fmt_count(sum(c.within_target for c in ds)),
        "n_gpt": fmt_count(fam[fv.FAMILIES[3]]["n"]), "n_gpt_within": fmt_count(fam[fv.FAMILIES[3]]["within"]),
        "n_mixtral": fmt_count(fam[fv.FAMILIES[1]]["n"]), "n_llama": fmt_count(fam[fv.FAMILIES[2]]["n"]),
        "n_derived": fmt_count(sum("derived" in c.world_size_source for c in ok)),
        # the software of the CI images (memlib.config.versions.container_rules)
        "lts_containers": ", ".join(f"{y:02d}.{m:02d}" for y, m in sorted(NGC_TRANSFORMER_ENGINE)),
        "lts_te": ", ".join(".".join(map(str, v)) for v in sorted(set(NGC_TRANSFORMER_ENGINE.values()))),
        "blackwell_container": "{:02d}.{:02d}".format(*NGC_BLACKWELL_CUBLAS_32MIB),
        "cublas_old": fmt_bytes(torch_cublas_workspace_bytes(10, blackwell_32mib=False), "MiB", 3),
        "cublas_new": fmt_bytes(torch_cublas_workspace_bytes(10), "MiB", 0),
    }
    return out


def family_table() -> str:
    """Hits and misses per model family and GPU."""
    ok, _ = fv.validation()
    rows = []
    for fam in fv.FAMILIES:
        for gpu in ("A100", "H100", "GB200"):
            cs = [c for c in ok if c.family == fam and c.golden.gpu == gpu]
            if not cs:
                continue
            s = fv.summary(cs)
            rows.append([fam, gpu, fmt_count(s["n"]), fmt_count(s["within"]), fmt_count(s["n"] - s["within"]),
                         _err(s["mean_abs"]).lstrip("+"), _err(s["max_abs"]).lstrip("+")])
    return md_table(["family", "GPU", "cases", f"within {fmt_decimal(100 * fv.TARGET, 0)} %", "missed",
                     "mean |error|", "largest |error|"], rows, "llrrrrr")


def _breakable(name: str) -> str:
    """A test or platform name that may wrap after its underscores (a zero-width space after each), so that
    the long names fit the text column."""
    return name.replace("_", "_\u200b")


def _case_name(c) -> str:
    return _breakable(c.golden.test) + (" (2nd run)" if c.golden.second_run else "")


def cases_table() -> str:
    """Every case memlib expresses: measured, predicted, error, and where a miss lies."""
    ok, _ = fv.validation()
    rows = []
    for c in sorted(ok, key=lambda c: (fv.FAMILIES.index(c.family), c.golden.test, c.golden.file)):
        gaps = " / ".join(signed_bytes(x, "MiB", 0).removesuffix(" MiB") for x in (c.post_step_gap, c.peak_gap))
        rows.append([_case_name(c), _breakable(f"{c.golden.environment} {c.golden.platform}, "
                                               f"{fmt_count(c.world_size)} GPUs"),
                     _gib(c.steady), _gib(c.predicted), _err(c.error), gaps,
                     "yes" if c.within_target else _where(c)])
    return md_table(["functional test", "image, platform", f"measured ({UNIT})", f"memlib ({UNIT})", "error",
                     "after the step / at the peak (MiB)", f"within {fmt_decimal(100 * fv.TARGET, 0)} %"],
                    rows, "llrrrrl")


def not_expressible_table() -> str:
    """The cases memlib cannot express, grouped by reason (with how many golden files each)."""
    _, no = fv.validation()
    groups: dict[str, list] = {}
    for n in no:
        groups.setdefault(n.reason, []).append(n)
    rows = []
    for why, ns in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        tests = sorted({n.golden.test for n in ns})
        shown = ", ".join(map(_breakable, tests[:3])) + (f" and {len(tests) - 3} more" if len(tests) > 3 else "")
        rows.append([_breakable(why), fmt_count(len(ns)), shown])
    return md_table(["why memlib cannot express it", "golden files", "tests"], rows, "lrl")


def figure():
    """memlib against the measured steady peak, every case (log-log), the 1 % band."""
    ok, _ = fv.validation()
    fig, ax = new_figure(height=4.4)
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
    errs = [abs(c.error) for c in cs]
    stage = [abs(e) for c in cs for e in c.stage_errors]
    over = [c for c in cs for e in c.stage_errors if abs(e) > sm.TARGET]
    return {
        "n_runs": fmt_count(len(cs)), "n_rows": fmt_count(sum(len(c.rows) for c in cs)),
        "n_within": fmt_count(sum(c.within_target for c in cs)),
        "max_abs": _err(max(errs)).lstrip("+"), "mean_abs": _err(sum(errs) / len(errs)).lstrip("+"),
        "stage_max_abs": _err(max(stage)).lstrip("+"), "n_stage_over": fmt_count(len(over)),
        "simumax_commit": SIMUMAX_COMMIT[:10], "megatron_commit": SIMUMAX_SETUP["megatron_commit"][0][:8],
        "gpu": SIMUMAX_SETUP["gpu"][0][0], "world": fmt_count(SIMUMAX_SETUP["world_size"][0]),
        "n_not_used": fmt_count(len(sm.PUBLISHED_NOT_USED)),
        "unfused_max_abs": _err(max(abs(c.error_unfused_ce) for c in cs)).lstrip("+"),
        "models": " and ".join(dict.fromkeys(c.label.split(" ")[0] for c in cs)),
    }


def published_table() -> str:
    rows = []
    for c in sm.published_cases():
        rows.append([c.label, _parallel(c), fmt_count(c.train.seq_len), fmt_count(len(c.rows)), _gib(c.measured_max),
                     _gib(c.predicted), _err(c.error), "yes" if c.within_target else "no", _err(c.error_unfused_ce)])
    return md_table(["run", "parallel sizes", "sequence", "published rows", f"measured maximum ({UNIT})",
                     f"memlib peak_allocated ({UNIT})", "error", f"within {fmt_decimal(100 * sm.TARGET, 0)} %",
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
