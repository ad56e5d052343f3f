"""Chapter 5, "ZeRO and precision": tables, figures and glued values, formatted from
:mod:`memlib.paper.zero`, :mod:`memlib.paper.static` and :mod:`memlib.scenarios.sweeps`.

Every function takes the chapter's :class:`~memlib.device.estimate.Estimate` (built once in the chapter's
configuration cell) and the analysed stage; nothing here computes a quantity.
"""
from __future__ import annotations

from ..device.estimate import Estimate
from ..paper import analysed_stage, is_paper_model, moe_stages
from ..paper import static as pstatic
from ..paper import zero as pzero
from ..data.reference import PAPER
from ..scenarios.sweeps import ep_sweep, recipe_change
from ..model.architecture import attention_name
from ..config import ZeroStage
from ..config.precision import RECIPES
from .figures import CATEGORY_COLORS, CATEGORY_LABELS, Series, new_figure, stacked_bars
from .format import (fmt_bytes, fmt_count, fmt_difference, fmt_size, layout_text, math, md_table, span, tex, yes_no,
                     zero_name)
from .notation import chapter_notation

__all__ = ["stage", "values", "count_words", "paper_values", "table7", "recipes_table", "sharding_table", "table8",
           "table8_printed", "prose_swap_table", "megatron_table", "ep_table", "ep_values", "states_figure",
           "problem_values", "zero_paper_table", "notation"]

TERMS = pzero.TERMS
TERM_LABELS = {t: CATEGORY_LABELS[t] for t in TERMS}


def stage(est: Estimate) -> int:
    """The stage the chapter analyses (the paper's: the first MoE-only stage)."""
    return analysed_stage(est.partition)


def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch05", est.model, est.train)


def _router_and_shared(m) -> str:
    """The MoE block's parameters outside the routed experts, named by the model's blocks."""
    return "the router and the shared experts" if m.has_shared_experts else "the router"


def count_words(est: Estimate) -> dict[str, str]:
    """The parameter counts the prose substitutes, in Markdown: :math:`P_{ne}` and :math:`P_e` for a model with MoE
    layers, :math:`P` for a dense one (whose eq. (5.1) has no expert term)."""
    if est.model.has_moe:
        return {"counts": "$P_{ne}$, $P_e$", "megatron_p": r"no expert parameters ($P_e = 0$) and $\tilde P = P/d$",
                "p2_p": r"$P_{ne} = \Psi$, $P_e = 0$"}
    return {"counts": "$P$", "megatron_p": r"$\tilde P = P/d$", "p2_p": r"$P = \Psi$"}


def values(est: Estimate) -> dict[str, str]:
    """The chapter's numbers for its prose (every one of them, formatted)."""
    i = stage(est)
    part, t = est.partition, est.train
    rec = RECIPES[t.precision]
    t6 = pstatic.table6(part, i)
    t8 = pzero.table8(est, i)
    sh = pzero.sharding(part, i)
    rules = pzero.rule_totals(part, i)
    moe = moe_stages(part)
    return {
        "router_shared": _router_and_shared(est.model), "attention": attention_name(est.model),
        "its": "their" if "shared" in _router_and_shared(est.model) else "its",
        "them": "them" if "shared" in _router_and_shared(est.model) else "it",
        "router_shared_is": _router_and_shared(est.model) + (" are" if "shared" in _router_and_shared(est.model)
                                                             else " is"),
        "router_shared_shard": _router_and_shared(est.model) + (" shard" if "shared" in _router_and_shared(est.model)
                                                                else " shards"),
        "label": t.label(), "stage": fmt_count(i), "moe_stages": span(moe[0], moe[-1]) if moe else fmt_count(i),
        # which device: the first MoE-only stage's where the model has MoE layers (a dense model's stage is named
        # in the sentence already)
        "stage_clause": f", the first of stages {span(moe[0], moe[-1])}, which hold MoE layers only" if moe else "",
        "stages_word": f"stages {span(moe[0], moe[-1])}" if moe else f"stage {fmt_count(i)}",
        "params": fmt_count(t6["total"]), "params_gib": fmt_bytes(pstatic.table6_bytes(part, i)["total"]),
        "bw": fmt_count(rec.weights), "bg": fmt_count(rec.gradients), "bo": fmt_count(rec.optimizer_bytes),
        "bytes_total": fmt_count(rec.total_bytes), "megatron_total": fmt_count(RECIPES["megatron"].total_bytes),
        "edp": fmt_count(t.edp), "ne_div": fmt_count(sh["paper"]["ne_div"]),
        "p_ne": fmt_count(sh["paper"]["P_ne"]), "p_e": fmt_count(sh["paper"]["P_e"]),
        "shard": fmt_count(sh["paper"]["shard"]), "shard_megatron": fmt_count(sh["megatron"]["shard"]),
        "shard_diff": fmt_count(sh["difference"]["shard"]), "moved": fmt_count(sh["difference"]["moved"]),
        "megatron_clause": _megatron_clause(rules), "megatron_lowers": _megatron_lowers(rules),
        **{f"total_{k}": fmt_bytes(t8[z]["total"]) for k, z in _KEYS.items()},
        "total_none_bytes": fmt_count(t8[ZeroStage.NONE]["total"]),
        "grads_full": fmt_bytes(t8[ZeroStage.NONE]["gradients"]),
        "opt_full": fmt_bytes(t8[ZeroStage.NONE]["optimizer_states"]),
        "params_shard": fmt_bytes(t8[ZeroStage.OS_G_PARAMS]["parameters"]),
        "grads_shard": fmt_bytes(t8[ZeroStage.OS_G_PARAMS]["gradients"]),
        "opt_shard": fmt_bytes(t8[ZeroStage.OS_G_PARAMS]["optimizer_states"]),
        "layout": layout_text(part.layout),
    }


def _prints_same(rules: dict, z: ZeroStage) -> bool:
    """Whether the two sharding rules' model states under ``z`` print as the same GiB."""
    return fmt_bytes(rules["paper"][z]) == fmt_bytes(rules["megatron"][z])


def _megatron_clause(rules: dict) -> str:
    """What Megatron-Core's sharding rule would need under ZeRO-1 and ZeRO-3, or, where that prints as the paper's
    rule's GiB (Mixtral's router: a few KiB), what it would save."""
    zs = (ZeroStage.OS, ZeroStage.OS_G_PARAMS)
    if not any(_prints_same(rules, z) for z in zs):
        m = rules["megatron"]
        return f"with Megatron-Core's rule ZeRO-1 would need {fmt_bytes(m[zs[0]])} and ZeRO-3 {fmt_bytes(m[zs[1]])}"
    return (f"Megatron-Core's rule would save only {fmt_size(rules['saving'][zs[0]], small='B')} under ZeRO-1 and "
            f"{fmt_size(rules['saving'][zs[1]], small='B')} under ZeRO-3")


def _megatron_lowers(rules: dict) -> str:
    """"lowers ZeRO-1 to 43.30 GiB", or "lowers ZeRO-1 by only 49,152 B" where the GiB would print the same."""
    if not _prints_same(rules, ZeroStage.OS):
        return f"lowers ZeRO-1 to {fmt_bytes(rules['megatron'][ZeroStage.OS])}"
    return f"lowers ZeRO-1 by only {fmt_size(rules['saving'][ZeroStage.OS], small='B')}"


_KEYS = {"none": ZeroStage.NONE, "os": ZeroStage.OS, "os_g": ZeroStage.OS_G, "os_g_params": ZeroStage.OS_G_PARAMS}


#: the keys of :func:`paper_values` (glued as placeholders for another model)
PAPER_KEYS = ("printed_none", "printed_os", "printed_grads", "printed_opt", "printed_shard", "prose_quote")


def paper_values(est: Estimate) -> dict[str, str]:
    """The paper's printed values the prose compares with (empty unless the model is the paper's)."""
    if not is_paper_model(est.model):
        return {}
    t8 = PAPER["table8"]
    quote = pzero.prose_swap(est, stage(est))["quote"]
    return {"printed_none": t8[0]["total"], "printed_os": t8[1]["total"], "printed_grads": t8[0]["gradients"],
            "printed_opt": t8[0]["optimizer_states"], "printed_shard": fmt_count(PAPER["zero_sharded_params"]),
            "prose_quote": quote}


def table7(est: Estimate) -> str:
    """The recipe's bytes per element (the paper's Table 7 for its own recipe)."""
    rec = RECIPES[est.train.precision]
    fmt = {1: "fp8", 2: "bf16", 4: "fp32", 8: "fp64"}
    rows = [[item.replace("_", " "), fmt.get(n, f"{n} bytes"), str(n)] for item, n in pzero.table7(rec)]
    return md_table(["item", "format", "bytes per element"], rows, "llr")


def recipes_table() -> str:
    """Every recipe memlib ships, in bytes per parameter."""
    rows = [[f"`{r.name}`", r.description, str(r.weights), str(r.gradients),
             " + ".join(f"{b} ({n.replace('_', ' ')})" for n, b in r.optimizer) + f" = {r.optimizer_bytes}",
             str(r.total_bytes)] for r in RECIPES.values()]
    return md_table(["recipe", "what it is", "$B_w$", "$B_g$", "$B_o$", "bytes per parameter"], rows, "llrrlr")


def sharding_table(est: Estimate) -> str:
    v = pzero.sharding(est.partition, stage(est))
    labels = {"paper": f"paper (§4): {_router_and_shared(est.model)} with the experts",
              "megatron": "Megatron-Core: routed experts only"}
    rows = [[labels[n], fmt_count(r["P_ne"]), fmt_count(r["ne_div"]), fmt_count(r["shard_ne"]), fmt_count(r["P_e"]),
             fmt_count(r["e_div"]), fmt_count(r["shard_e"]), fmt_count(r["shard"])]
            for n, r in v.items() if n != "difference"]
    if is_paper_model(est.model):
        rows.append(["printed by the paper", "—", "—", "—", "—", "—", "—", fmt_count(PAPER["zero_sharded_params"])])
    return md_table(["rule", math("P_ne"), r"$\mathrm{DP}\,\mathrm{CP}$", r"$P_{ne}/(\mathrm{DP}\,\mathrm{CP})$",
                     math("P_e"), math("EDP"), r"$P_e/\mathrm{EDP}$", r"$\tilde P$"], rows, "lrrrrrrr")


def table8(est: Estimate) -> str:
    """Model states per ZeRO stage as memlib computes them: GiB per term, total GiB and bytes."""
    v = pzero.table8(est, stage(est))
    rows = [[zero_name(z)] + [fmt_bytes(r[t], with_unit=False) for t in TERMS]
            + [f"**{fmt_bytes(r['total'], with_unit=False)}**", fmt_count(r["total"])] for z, r in v.items()]
    return md_table(["ZeRO stage", "parameters (GiB)", "gradients (GiB)", "optimizer states (GiB)", "total (GiB)",
                     "total (bytes)"], rows, "lrrrrr")


def table8_printed(est: Estimate) -> str:
    """The paper's printed Table 8 (its "GB" are GiB), the sum of its printed terms and memlib's total."""
    v = pzero.table8(est, stage(est))
    rows = [[zero_name(z)] + [row[t] for t in TERMS] + [row["total"], pzero.printed_sum(row),
                                                            fmt_bytes(v[z]["total"], with_unit=False)]
            for z, row in zip(ZeroStage, PAPER["table8"].values())]
    return md_table(["ZeRO stage", "parameters", "gradients", "optimizer states", "total", "sum of printed terms",
                     "memlib total"], rows, "lrrrrrr")


def prose_swap_table(est: Estimate) -> str:
    s = pzero.prose_swap(est, stage(est))
    rows = [[f"× {s['B_g']}", "optimizer states", "gradients ($B_g$)", fmt_bytes(s["gradients"])],
            [f"× {s['B_o']}", "gradients", "optimizer states ($B_o$)", fmt_bytes(s["optimizer_states"])]]
    return md_table(["bytes per parameter", "the paper's prose calls it", "memlib and the paper's tables call it",
                     "memlib value"], rows, "rllr")


def megatron_table() -> str:
    """Megatron-LM's distributed-optimizer table reproduced from memlib's recipes."""
    formats = {"megatron-fp16": "fp16 parameters, fp16 gradients", "megatron": "bf16 parameters, fp32 gradients",
               "fp32": "fp32 parameters, fp32 gradients"}
    rows = [[formats[r["recipe"]], f"`{r['recipe']}`", str(r["memlib"]), f"${tex(r['memlib_zero1'])}$",
             str(r["docs"]), f"${tex(r['docs_zero1'])}$", yes_no(r["match"])] for r in pzero.megatron_bytes()]
    rec = RECIPES["paper"]
    rows.append(["bf16 parameters, fp32 gradients, bf16 moments (the paper)", "`paper`", str(rec.total_bytes),
                 f"${tex(pzero.megatron_per_param(rec))}$", "—", "—", "—"])
    return md_table(["formats", "recipe", "memlib, no sharding", "memlib, ZeRO-1", "Megatron docs, no sharding",
                     "Megatron docs, distributed", "match"], rows, "llrrrrl")


#: the units a sweep may be printed in, coarsest first (:func:`_unit_showing`)
_SWEEP_UNITS = (("GiB", 2), ("MiB", 2), ("KiB", 2))


def _unit_showing(values) -> tuple[str, int]:
    """The coarsest unit of :data:`_SWEEP_UNITS` in which values that differ are printed differently (Mixtral's
    router moves the sharded states by a tenth of a MiB: "0.59 GiB" to "0.59 GiB" would say it does not)."""
    distinct = sorted(set(values))
    for unit, digits in _SWEEP_UNITS:
        if len({fmt_bytes(v, unit, digits) for v in distinct}) == len(distinct):
            return unit, digits
    return _SWEEP_UNITS[-1]


def _sweep_unit(rows) -> tuple[str, int]:
    return _unit_showing([r[k] for r in rows for k in ("paper", "megatron")])


def ep_values(est: Estimate) -> dict[str, str]:
    """The EP sweep under ZeRO-3, in words and numbers: whether each convention ever rises."""
    rows = ep_sweep(est, stage(est))
    unit, digits = _sweep_unit(rows)

    def b(n):
        return fmt_bytes(n, unit, digits)

    def rises(key):
        return any(y[key] > x[key] for x, y in zip(rows, rows[1:]))
    return {"paper_rises": "rise" if rises("paper") else "never rise",
            "megatron_rises": "rise" if rises("megatron") else "never rise",
            "ep_first": fmt_count(rows[0]["ep"]), "ep_last": fmt_count(rows[-1]["ep"]),
            "paper_first": b(rows[0]["paper"]), "paper_last": b(rows[-1]["paper"]),
            "megatron_first": b(rows[0]["megatron"]), "megatron_last": b(rows[-1]["megatron"]),
            "megatron_clause": (f"stay at {b(rows[0]['megatron'])}"
                                if all(r["megatron"] == rows[0]["megatron"] for r in rows) else
                                f"{'rise' if rises('megatron') else 'never rise'} ({b(rows[0]['megatron'])} "
                                f"to {b(rows[-1]['megatron'])})")}


def ep_table(est: Estimate) -> str:
    rows = ep_sweep(est, stage(est))
    unit, digits = _sweep_unit(rows)
    return md_table([math("EP"), math("EDP"), "paper's convention", "Megatron-Core's"],
                    [[fmt_count(r["ep"]), fmt_count(r["edp"]), fmt_bytes(r["paper"], unit, digits),
                      fmt_bytes(r["megatron"], unit, digits)] for r in rows], "rrrr")


def states_figure(est: Estimate):
    """Stacked bars: parameters, gradients and optimizer states per ZeRO stage, GiB per device."""
    v = pzero.table8(est, stage(est))
    fig, ax = new_figure()
    series = [Series(TERM_LABELS[t], CATEGORY_COLORS[t], [r[t] for r in v.values()]) for t in TERMS]
    stacked_bars(ax, [zero_name(z) for z in v], series, digits=2)
    ax.set_ylabel("model states, GiB per device")
    ax.set_xlabel("ZeRO stage")
    ax.legend()
    return fig


def problem_values(est: Estimate) -> dict[str, str]:
    """The worked problem: Megatron's fp32-moment recipe under ZeRO-1."""
    r = recipe_change(est, stage(est), "megatron", ZeroStage.OS)
    rec = RECIPES["megatron"]
    return {"p1_bo": fmt_count(rec.optimizer_bytes), "p1_bpp": fmt_count(rec.total_bytes),
            "p1_opt": fmt_bytes(r["optimizer"]), "p1_total": fmt_bytes(r["total"]),
            # the difference of the printed totals (2.85 GiB against 2.80 GiB is 0.05 GiB more, not 0.06)
            "p1_delta": fmt_difference(r["total"], r["base"])}


def zero_paper_table() -> tuple[dict[str, str], str]:
    """The ZeRO paper's example: its sizes for the prose, and memlib's values beside the printed ones
    (decimal GB, as that paper prints)."""
    ex = pzero.zero_paper_example()
    rows = [[zero_name(z), fmt_bytes(ex["bytes"][z], "GB", 1, with_unit=False), ex["printed_gb"][z]]
            for z in ZeroStage]
    return ({"p2_psi": fmt_count(ex["psi"]), "p2_nd": fmt_count(ex["n_d"]), "p2_k": str(ex["k"])},
            md_table(["ZeRO stage", "memlib (GB)", "ZeRO paper (GB)"], rows, "lrr"))

