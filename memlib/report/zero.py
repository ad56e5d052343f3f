"""Tables, numbers and figures of the ZeRO chapter (``notebooks/05_zero.md``).

The chapter reproduces §4 of arXiv 2502.07846: its data types (Table 7), the model states of a
stage-1..14 device under ZeRO stages 0 to 3 (Table 8) and the sharding rule behind them.  All
values come from :mod:`memlib.states` and :mod:`memlib.memory`; the printed values of the paper
(:data:`memlib.reference.PAPER`) are only put beside them.

>>> from memlib.config import PAPER_TRAINING, load_model
>>> [fmt_bytes(t, "GiB") for t in table8_values(load_model("deepseek-v3"), PAPER_TRAINING)["total"]]
['81.50 GiB', '40.45 GiB', '19.92 GiB', '9.66 GiB']
"""
from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import sympy as sp

from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig
from ..memory import estimate
from ..partition import Partition
from ..reference import MEGATRON_BYTES_PER_PARAM, PAPER, ZERO_PAPER
from ..states import RECIPES, Recipe, ZeroStage, sharded_count, states_formula
from ..symbols import sym
from ..units import fmt_bytes, fmt_count
from .core import PALETTE, md_table, new_figure

__all__ = [
    "PAPER_TABLES", "STAGES", "TERMS", "TERM_LABELS", "P_SHARD", "dtype_name", "table7",
    "recipes_table", "formula", "formula_lhs", "shard_formula", "sharding_values", "sharding_table",
    "table8_values", "table8", "table8_printed", "prose_swap", "prose_swap_table",
    "megatron_per_param", "megatron_table", "zero_paper_check", "states_figure", "stage_label",
    "rule_totals", "problem_answers", "ep_sweep", "ep_sweep_table", "ep_sweep_summary",
]

#: the paper's table numbers, as names (prose cannot type digits)
PAPER_TABLES = {"dtypes": "Table 7", "zero": "Table 8", "static": "Table 6"}

#: the ZeRO stages in order
STAGES = tuple(ZeroStage)

#: the three model-state terms, in the order of :func:`memlib.states.states_formula`
TERMS = ("parameters", "gradients", "optimizer_states")
TERM_LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer_states": "optimizer states"}

#: display symbol for the sharded count (the formula is :func:`memlib.states.sharded_count`)
P_SHARD = sp.Symbol(r"\tilde{P}", integer=True, nonnegative=True)


def stage_label(z: ZeroStage) -> str:
    """``"ZeRO-1 (os)"``."""
    return f"ZeRO-{int(z)} ({z.label})"


def dtype_name(nbytes: int, half: str = "bf16") -> str:
    """The storage format of a state of ``nbytes`` bytes (``half`` names the 2-byte format)."""
    return {2: half, 4: "fp32"}[nbytes]


# --------------------------------------------------------------------------------------------
# data types (the paper's Table 7) and the recipes
# --------------------------------------------------------------------------------------------

_STATE_LABELS = {"master_weights": "optimizer: fp32 copy of the weights", "exp_avg": "optimizer: momentum",
                 "exp_avg_sq": "optimizer: variance", "main_grad": "optimizer: fp32 main gradient"}


def table7(rec: Recipe = RECIPES["paper"]) -> str:
    """The paper's Table 7 rendered from a recipe, the printed bytes beside memlib's."""
    printed = PAPER["table7"]
    rows = [["weights", dtype_name(rec.weights), str(rec.weights), str(printed["weights"])],
            ["activations", dtype_name(printed["activations"]), "not a model state", str(printed["activations"])],
            ["gradients", dtype_name(rec.gradients), str(rec.gradients), str(printed["gradients"])]]
    for name, b in rec.optimizer:
        rows.append([_STATE_LABELS[name], dtype_name(b), str(b), str(printed.get(name, "—"))])
    rows.append(["**total per parameter**", "", f"**{rec.total_bytes}**", "—"])
    return md_table(["item", "format", "bytes (memlib recipe)", "bytes (paper)"], rows, "llrr")


def recipes_table() -> str:
    """Bytes per parameter of every recipe memlib ships: B_w, B_g, B_o (split) and the total."""
    rows = []
    for r in RECIPES.values():
        opt = " + ".join(str(b) for _, b in r.optimizer)
        rows.append([f"`{r.name}`", r.description, str(r.weights), str(r.gradients),
                     f"{r.optimizer_bytes} ({opt})", str(r.total_bytes)])
    return md_table(["recipe", "formats", "$B_w$", "$B_g$", "$B_o$", "bytes per parameter"], rows, "llrrrr")


# --------------------------------------------------------------------------------------------
# the formulas
# --------------------------------------------------------------------------------------------

def _display(expr: sp.Expr) -> sp.Expr:
    return expr.xreplace({sym("P_ne") + sym("P_e"): sym("P"), sharded_count(): P_SHARD})


def formula(z: ZeroStage, rec: Recipe | None = None) -> str:
    """LaTeX of the model-state bytes of one device under ZeRO stage ``z``, one term per state,
    with :math:`P = P_{ne}+P_e` and :math:`\\tilde P` the sharded count."""
    b = states_formula(int(z)).map(_display)
    if rec is not None:
        nums = {sym("B_w"): rec.weights, sym("B_g"): rec.gradients, sym("B_o"): rec.optimizer_bytes}
        b = b.map(lambda e: e.xreplace(nums))
    return b.latex()


def formula_lhs(z: ZeroStage) -> str:
    return r"M_{\mathrm{ZeRO\text{-}" + str(int(z)) + "}}"


def shard_formula() -> sp.Expr:
    """The sharded count :math:`\\tilde P` (memlib's :func:`~memlib.states.sharded_count`)."""
    return sharded_count()


# --------------------------------------------------------------------------------------------
# the sharding rule: which states shard over DP CP and which over EDP
# --------------------------------------------------------------------------------------------

def sharding_values(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> dict[str, dict]:
    """The sharded count of a device of ``stage`` under two rules, on the same partition.

    ``paper``: the whole MoE block (router, shared and routed experts) shards over EDP (§4);
    ``megatron``: only the routed experts shard over EDP, the rest over DP CP."""
    part = Partition(model, train)
    st = part.stages[stage]
    params = part.params(st)
    ne_div, e_div = train.dp * train.cp, train.edp
    rules = {
        "paper": part.edp_keys(st) if train.profile == "paper" else
        Partition(model, train.with_(profile="paper")).edp_keys(st),
        "megatron": {k for k in params if k.startswith("routed_experts.")},
    }
    out = {}
    for name, keys in rules.items():
        e = params.select(lambda k: k in keys).evaluate_total(part.values)
        ne = params.select(lambda k: k not in keys).evaluate_total(part.values)
        shard_ne, shard_e = -(-ne // ne_div), -(-e // e_div)
        out[name] = {"P_ne": ne, "P_e": e, "ne_div": ne_div, "e_div": e_div, "shard_ne": shard_ne,
                     "shard_e": shard_e, "shard": shard_ne + shard_e}
    out["difference"] = {"shard": out["paper"]["shard"] - out["megatron"]["shard"],
                         "moved": out["paper"]["P_e"] - out["megatron"]["P_e"]}
    return out


def sharding_table(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> str:
    v = sharding_values(model, train, stage)
    labels = {"paper": "paper (§4): router and shared expert with the experts",
              "megatron": "Megatron-Core: routed experts only"}
    rows = []
    for name in ("paper", "megatron"):
        r = v[name]
        rows.append([labels[name], fmt_count(r["P_ne"]), fmt_count(r["ne_div"]), fmt_count(r["shard_ne"]),
                     fmt_count(r["P_e"]), fmt_count(r["e_div"]), fmt_count(r["shard_e"]), fmt_count(r["shard"])])
    rows.append(["printed by the paper", "—", "—", "—", "—", "—", "—", fmt_count(PAPER["zero_sharded_params"])])
    headers = ["rule", "$P_{ne}$", "$DP\\,CP$", "$P_{ne}/(DP\\,CP)$", "$P_e$", "$EDP$", "$P_e/EDP$", "$\\tilde P$"]
    return md_table(headers, rows, "lrrrrrrr")


# --------------------------------------------------------------------------------------------
# the paper's Table 8
# --------------------------------------------------------------------------------------------

def table8_values(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> dict[str, list[int]]:
    """Exact bytes per term and total, one entry per ZeRO stage, for one device of ``stage``."""
    out: dict[str, list[int]] = {t: [] for t in TERMS + ("total",)}
    for z in STAGES:
        s = estimate(model, train.with_(zero=int(z))).stages[stage]
        for t in TERMS:
            out[t].append(s.bytes[t])
        out["total"].append(s.model_states)
    return out


def table8(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> str:
    """Table 8 as memlib computes it: GiB per term, total GiB and the exact total in bytes."""
    v = table8_values(model, train, stage)
    rows = []
    for i, z in enumerate(STAGES):
        rows.append([stage_label(z)] + [fmt_bytes(v[t][i], "GiB", with_unit=False) for t in TERMS]
                    + [f"**{fmt_bytes(v['total'][i], 'GiB', with_unit=False)}**", fmt_count(v["total"][i])])
    headers = ["ZeRO stage", "parameters (GiB)", "gradients (GiB)", "optimizer states (GiB)",
               "total (GiB)", "total (bytes)"]
    return md_table(headers, rows, "lrrrrr")


def _printed_sum(row: dict) -> str:
    """The sum of the printed terms, with the printed number of decimals."""
    terms = [Decimal(row[t]) for t in TERMS]
    places = max(-d.as_tuple().exponent for d in terms)
    return f"{sum(terms):.{places}f}"


def table8_printed(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> str:
    """The paper's printed Table 8 (its "GB" are GiB), the sum of its printed terms and memlib's total."""
    v = table8_values(model, train, stage)
    rows = []
    for i, (z, row) in enumerate(zip(STAGES, PAPER["table8"].values())):
        rows.append([stage_label(z)] + [row[t] for t in TERMS] + [row["total"], _printed_sum(row),
                    fmt_bytes(v["total"][i], "GiB", with_unit=False)])
    headers = ["ZeRO stage", "parameters", "gradients", "optimizer states", "total", "sum of printed terms",
               "memlib total"]
    return md_table(headers, rows, "lrrrrrr")


def prose_swap(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> dict[str, object]:
    """The paper's §4 prose labels the ×4 term "optimizer states" and the ×8 term "gradients";
    its Tables 7 and 8 have B_g = 4 and B_o = 8.  Returns the quote and memlib's terms."""
    v = table8_values(model, train, stage)
    rec = RECIPES[train.precision]
    return {"quote": PAPER["prose_swap"], "gradients": v["gradients"][0], "optimizer_states": v["optimizer_states"][0],
            "B_g": rec.gradients, "B_o": rec.optimizer_bytes}


def prose_swap_table(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> str:
    s = prose_swap(model, train, stage)
    rows = [[f"× {s['B_g']}", "optimizer states", "gradients ($B_g$)", fmt_bytes(s["gradients"], "GiB")],
            [f"× {s['B_o']}", "gradients", "optimizer states ($B_o$)", fmt_bytes(s["optimizer_states"], "GiB")]]
    return md_table(["bytes per parameter", "the paper's prose calls it", "memlib and the paper's tables call it",
                     "memlib value"], rows, "rllr")


# --------------------------------------------------------------------------------------------
# Megatron's bytes-per-parameter table, from the recipes
# --------------------------------------------------------------------------------------------

def megatron_per_param(rec: Recipe) -> sp.Expr:
    """Bytes per parameter under ZeRO-1 on d data-parallel ranks, from :func:`states_formula`:
    a device holds P parameters, none of them expert, so :math:`\\tilde P = P/d`."""
    P, d = sym("P"), sp.Symbol("d", integer=True, positive=True)
    expr = states_formula(int(ZeroStage.OS), rec).total
    expr = expr.replace(sp.ceiling, lambda x: x)
    expr = expr.xreplace({sym("P_e"): 0, sym("CP"): 1, sym("DP"): d, sym("P_ne"): P})
    return sp.expand(expr / P)


def megatron_table() -> str:
    """Megatron-LM's distributed-optimizer table, reproduced from memlib's recipes."""
    d = sp.Symbol("d", integer=True, positive=True)
    formats = {"megatron-fp16": "fp16 parameters, fp16 gradients", "megatron": "bf16 parameters, fp32 gradients",
               "fp32": "fp32 parameters, fp32 gradients"}
    rows = []
    for name, (plain, (fixed, num)) in MEGATRON_BYTES_PER_PARAM.items():
        rec = RECIPES[name]
        dist = megatron_per_param(rec)
        match = rec.total_bytes == plain and sp.expand(dist - (fixed + num / d)) == 0
        rows.append([formats[name], f"`{name}`", str(rec.total_bytes), f"${sp.latex(dist)}$",
                     f"{plain}", f"${fixed} + {num}/d$", "yes" if match else "**no**"])
    rec = RECIPES["paper"]
    rows.append(["bf16 parameters, fp32 gradients, bf16 moments (the paper)", "`paper`", str(rec.total_bytes),
                 f"${sp.latex(megatron_per_param(rec))}$", "—", "—", "—"])
    headers = ["formats", "recipe", "memlib, no sharding", "memlib, ZeRO-1", "Megatron docs, no sharding",
               "Megatron docs, distributed", "match"]
    return md_table(headers, rows, "llrrrrl")


def zero_paper_check() -> dict[str, object]:
    """The ZeRO paper's example (7.5B parameters, 64 ranks, K = 12, fp16 mixed precision),
    recomputed with :func:`states_formula`; decimal GB as that paper prints."""
    rec = RECIPES["fp16-mixed"]
    psi, nd = ZERO_PAPER["psi"], ZERO_PAPER["n_d"]
    subs = {sym("P_ne"): psi, sym("P_e"): 0, sym("DP"): nd, sym("CP"): 1, sym("EDP"): 1}
    rows, values = [], []
    for z in STAGES:
        b = int(states_formula(int(z), rec).total.xreplace(subs))
        values.append(b)
        rows.append([stage_label(z), fmt_bytes(b, "GB", 1, with_unit=False), ZERO_PAPER["gb"][int(z)]])
    return {"psi": fmt_count(psi), "n_d": fmt_count(nd), "k": str(ZERO_PAPER["k"]), "bytes": values,
            "table": md_table(["ZeRO stage", "memlib (GB)", "ZeRO paper (GB)"], rows, "lrr")}


# --------------------------------------------------------------------------------------------
# figure
# --------------------------------------------------------------------------------------------

def states_figure(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1):
    """Stacked bars: parameters, gradients and optimizer states per ZeRO stage, GiB per device."""
    v = table8_values(model, train, stage)
    fig, ax = new_figure(6.5, 3.6)
    x = list(range(len(STAGES)))
    bottom = [0.0] * len(STAGES)
    for colour, t in zip(PALETTE, TERMS):
        h = [float(Fraction(b, 2**30)) for b in v[t]]
        ax.bar(x, h, bottom=bottom, width=0.6, color=colour, label=TERM_LABELS[t])
        bottom = [a + b for a, b in zip(bottom, h)]
    for xi, total in zip(x, v["total"]):
        ax.annotate(fmt_bytes(total, "GiB"), (xi, float(Fraction(total, 2**30))), ha="center", va="bottom",
                    fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, [stage_label(z) for z in STAGES])
    ax.set_ylabel("model states, GiB per device")
    ax.set_xlabel("ZeRO stage")
    ax.legend(fontsize=8)
    return fig


# --------------------------------------------------------------------------------------------
# derived numbers for the prose and the worked problems
# --------------------------------------------------------------------------------------------

def rule_totals(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> dict[str, list[int]]:
    """Model-state bytes per ZeRO stage under the paper's and Megatron-Core's sharding rule."""
    v = sharding_values(model, train, stage)
    rec = RECIPES[train.precision]
    out = {}
    for name in ("paper", "megatron"):
        r = v[name]
        subs = {sym("P_ne"): r["P_ne"], sym("P_e"): r["P_e"], sym("DP"): train.dp, sym("CP"): train.cp,
                sym("EDP"): train.edp}
        out[name] = [int(states_formula(int(z), rec).total.xreplace(subs)) for z in STAGES]
    out["difference"] = [a - b for a, b in zip(out["paper"], out["megatron"])]
    return out


def ep_sweep(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1,
             zero: ZeroStage = ZeroStage.OS_G_PARAMS) -> list[dict[str, int]]:
    """Model-state bytes of a device of ``stage`` under ZeRO stage ``zero`` for every power-of-two EP
    that the experts and the stage's ranks allow, with the paper's convention (router and shared
    expert sharded over EDP) and Megatron-Core's (over DP CP), the rest of ``train`` unchanged."""
    m = estimate(model, train).model
    rows, ep = [], 1
    while m.n_routed_experts % ep == 0 and (train.dp * train.tp * train.cp) % (ep * train.etp) == 0:
        t = train.with_(ep=ep, zero=int(zero))
        rows.append({"ep": ep, "edp": t.edp,
                     "paper": estimate(model, t.with_(profile="paper")).stages[stage].model_states,
                     "megatron": estimate(model, t.with_(profile="megatron")).stages[stage].model_states})
        ep *= 2
    return rows


def ep_sweep_table(rows: list[dict[str, int]]) -> str:
    return md_table(["$EP$", "$EDP$", "paper's convention", "Megatron-Core's"],
                    [[fmt_count(r["ep"]), fmt_count(r["edp"]), fmt_bytes(r["paper"]), fmt_bytes(r["megatron"])]
                     for r in rows], "rrrr")


def ep_sweep_summary(rows: list[dict[str, int]]) -> dict[str, str]:
    """Glue values for the prose: whether each convention ever rises with EP, and the end points."""
    def rises(key):
        return any(b[key] > a[key] for a, b in zip(rows, rows[1:]))
    return {
        "paper_rises": "rise" if rises("paper") else "never rise",
        "megatron_rises": "rise" if rises("megatron") else "never rise",
        "ep_first": fmt_count(rows[0]["ep"]), "ep_last": fmt_count(rows[-1]["ep"]),
        "paper_first": fmt_bytes(rows[0]["paper"]), "paper_last": fmt_bytes(rows[-1]["paper"]),
        "megatron_first": fmt_bytes(rows[0]["megatron"]), "megatron_last": fmt_bytes(rows[-1]["megatron"]),
    }


def problem_answers(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> dict[str, object]:
    """The worked problem: Megatron's fp32-moment recipe under ZeRO-1 against the paper's recipe."""
    base = estimate(model, train.with_(zero=int(ZeroStage.OS))).stages[stage]
    other = estimate(model, train.with_(zero=int(ZeroStage.OS), precision="megatron")).stages[stage]
    rec = RECIPES["megatron"]
    return {"recipe": rec.name, "B_o": rec.optimizer_bytes, "bytes_per_param": rec.total_bytes,
            "paper_total": base.model_states, "total": other.model_states, "optimizer": other.bytes["optimizer_states"],
            "delta": other.model_states - base.model_states}
