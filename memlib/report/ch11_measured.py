"""Chapter 11, "Measured peaks": tables, the figure and glued values, formatted from
:mod:`memlib.scenarios.measured`.  Nothing here computes a quantity."""
from __future__ import annotations


from ..device.peak import TRANSIENT_TERMS
from ..data.reference import MEGATRON_LM_COMMIT, SIMUMAX_COMMIT, SIMUMAX_SETUP
from ..scenarios import measured as sm
from .figures import CATEGORY_COLORS, OKABE_ITO, Series, in_unit, new_figure, stacked_bars
from .format import fmt_bytes, fmt_count, fmt_decimal, md_table, signed_bytes

__all__ = ["values", "cases_table", "breakdown_table", "post_step_table", "framework_table", "run_max_table",
           "not_expressible_table", "gaps_table", "figure", "published_values", "published_table",
           "published_stage_table", "assumptions_table", "not_used_table"]

UNIT = "GiB"


def _err(x) -> str:
    s = fmt_decimal(100 * x, 1)
    return ("+" + s if x > 0 else s.replace("-", "−")) + " %"


def _gib(n: int, digits: int = 2) -> str:
    """A table cell: the unit is in the column's header."""
    return fmt_bytes(n, UNIT, digits, with_unit=False)


def _term(n: int) -> str:
    """A named term's bytes in a cell (a released term is negative: a true minus sign)."""
    return ("−" if n < 0 else "") + _gib(abs(n))


def _gib_text(n: int, digits: int = 2) -> str:
    return fmt_bytes(n, UNIT, digits)


def _cases(issue_only: bool = False):
    return sm.measured_cases(issue_only)


def values() -> dict[str, str]:
    """The chapter's numbers and words for its prose."""
    cs, issue = _cases(), _cases(True)
    s_all, s_issue = sm.summary(cs), sm.summary(issue)
    unexplained = [c.post_step_unexplained for c in cs]
    small = [c for c in cs if c.persistent < 16 * 2**30]
    proxies = [c for c in cs if c.persistent >= 16 * 2**30]
    over_small = [c.post_step - sum(v for k, v in c.peak.persistent.items() if k not in c.framework) for c in small]
    over_proxy = [c.post_step - sum(v for k, v in c.peak.persistent.items() if k not in c.framework) for c in proxies]
    pairs = {c.case.label: c for c in cs}
    h100, h100_sm = pairs["DeepSeek-V3 proxy, H100"], pairs["DeepSeek-V3 proxy, H100 (_sm)"]
    return {
        "commit": MEGATRON_LM_COMMIT[:10],
        "n_cases": fmt_count(len(cs)), "n_issue": fmt_count(len(issue)),
        "n_within": fmt_count(s_all["within"]), "n_issue_within": fmt_count(s_issue["within"]),
        "target": fmt_decimal(100 * sm.TARGET, 0) + " %",
        "max_abs": _err(s_all["max_abs"]).lstrip("+"), "mean_abs": _err(s_all["mean_abs"]).lstrip("+"),
        "issue_max_abs": _err(s_issue["max_abs"]).lstrip("+"),
        "n_not_expressible": fmt_count(len(sm.NOT_EXPRESSIBLE)),
        "unexplained_min": _gib_text(min(unexplained)), "unexplained_max": _gib_text(max(unexplained)),
        "over_small_min": _gib_text(min(over_small)), "over_small_max": _gib_text(max(over_small)),
        "over_proxy_min": _gib_text(min(over_proxy)), "over_proxy_max": _gib_text(max(over_proxy)),
        "proxy_dummy_wgrad": _gib_text(h100.framework.get("te_dummy_wgrads", 0)),
        "proxy_world": fmt_count(h100.world_size), "proxy_dp": fmt_count(h100.run.train.dp),
        "gb200_world": fmt_count(pairs["DeepSeek-V3 proxy, GB200"].world_size),
        "sm_steady": _gib_text(h100_sm.steady), "h100_steady": _gib_text(h100.steady),
        "sm_spread": signed_bytes(h100_sm.steady - h100.steady, UNIT),
        "transient_terms": ", ".join(t.replace("_", " ") for t in TRANSIENT_TERMS),
    }


def cases_table() -> str:
    rows = []
    for c in _cases():
        rows.append([c.case.label + ("" if c.case.issue else " †"), c.device, fmt_count(c.world_size),
                     _gib(c.steady), _gib(c.predicted), _err(c.error), "yes" if c.within_target else "no"])
    return md_table(["case", "GPU", "GPUs", f"measured steady peak ({UNIT})", f"memlib peak_allocated ({UNIT})",
                     "error", f"within {fmt_decimal(100 * sm.TARGET, 0)} %"], rows, "llrrrrl")


def breakdown_table() -> str:
    rows = []
    for c in _cases():
        p = c.peak
        tr = ", ".join(f"{k.replace('_', ' ')} {_term(v)}" for k, v in p.transient.items() if v)
        acts = ", ".join(f"{k.replace('_', ' ')} {_gib(v)}" for k, v in p.activations.items() if v)
        rows.append([c.case.label, _gib(sum(p.persistent.values())), acts or "–", tr or "–", _gib(p.peak_allocated),
                     _gib(c.steady)])
    return md_table(["case", f"persistent ({UNIT})", f"activations held ({UNIT})", f"transient ({UNIT})",
                     f"memlib ({UNIT})", f"measured ({UNIT})"], rows, "lrllrr")


def post_step_table() -> str:
    rows = []
    for c in _cases():
        states = sum(v for k, v in c.peak.persistent.items() if k not in c.framework)
        rows.append([c.case.label, _gib(c.post_step), _gib(states), _gib(sum(c.framework.values())),
                     signed_bytes(c.post_step_unexplained, UNIT).removesuffix(" " + UNIT)])
    return md_table(["case", f"logged after the step ({UNIT})", f"model states and buffers ({UNIT})",
                     f"framework buffers ({UNIT})", f"left unexplained ({UNIT})"], rows, "lrrrr")


def framework_table() -> str:
    """The framework terms of the smallest and the largest case, side by side."""
    cs = _cases(True)
    a, b = cs[0], max(cs, key=lambda c: c.persistent)
    keys = [k for k in dict.fromkeys([*a.framework, *b.framework])]
    rows = [[k.replace("_", " "), _gib(a.framework.get(k, 0), 3), _gib(b.framework.get(k, 0), 3)] for k in keys]
    rows.append(["total", _gib(sum(a.framework.values()), 3), _gib(sum(b.framework.values()), 3)])
    return md_table(["term", f"{a.case.label} ({UNIT})", f"{b.case.label} ({UNIT})"], rows, "lrr")


def run_max_table() -> str:
    rows = []
    for c in _cases():
        imb = fmt_decimal(c.imbalance, 2) if c.imbalance is not None else "–"
        rows.append([c.case.label, _gib(c.steady), _gib(c.run_max), fmt_count(c.run_max_at), _err(c.error_run_max),
                     imb])
    return md_table(["case", f"steady peak ({UNIT})", f"run maximum ({UNIT})", "at iteration",
                     "memlib vs run maximum", "routing imbalance reaching it"], rows, "lrrrrr")


def not_expressible_table() -> str:
    rows = [[name, why, _gib(mx)] for name, why, mx in sm.not_expressible()]
    return md_table(["test case", "why memlib cannot express it", f"published maximum ({UNIT})"], rows, "llr")


def gaps_table() -> str:
    rows = []
    for c in _cases():
        if c.within_target:
            continue
        rows.append([c.case.label, _err(c.error), signed_bytes(c.post_step_unexplained, UNIT).removesuffix(" " + UNIT),
                     signed_bytes(c.dynamic_gap, UNIT).removesuffix(" " + UNIT),
                     sm.gap_text(c)])
    return md_table(["case", "error", f"persistent, not counted ({UNIT})",
                     f"activations and transient, not counted ({UNIT})", "the term"], rows, "lrrrl")


def figure():
    """Per case, memlib's peak_allocated part by part (stacked bars) beside the steady peak and the run's maximum
    Megatron-LM logged (last rank); the cases named on the x axis, slanted, at the book's smallest size."""
    cs = _cases()
    labels = [c.case.label.replace("DeepSeek-V3 proxy", "V3 proxy") for c in cs]
    pers = [sum(c.peak.persistent.values()) for c in cs]
    acts = [sum(c.peak.activations.values()) for c in cs]
    trans = [sum(c.peak.transient.values()) for c in cs]
    fig, ax = new_figure(height=4.6)
    stacked_bars(ax, labels, [Series("persistent (states, buffers)", CATEGORY_COLORS["model_states"], pers),
                              Series("activations held", CATEGORY_COLORS["activations"], acts),
                              Series("transient", OKABE_ITO["vermillion"], trans)], UNIT, totals=False, ticks=False)
    xs = list(range(len(cs)))
    ax.set_xticks(xs, labels, rotation=30, ha="right", rotation_mode="anchor")
    ax.scatter(xs, [in_unit(c.steady, UNIT) for c in cs], marker="_", s=300, color=OKABE_ITO["black"], zorder=3,
               label="measured steady peak")
    ax.scatter(xs, [in_unit(c.run_max, UNIT) for c in cs], marker="x", s=25, color=OKABE_ITO["black"], zorder=3,
               label="measured run maximum")
    ax.set_ylabel(f"{UNIT} per device, last rank")
    ax.legend(ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0))
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
