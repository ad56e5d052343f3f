"""The paper's §4 (Tables 7 and 8): model states per ZeRO stage, the sharding rule behind them, and
the published references they can be checked against (Megatron-LM's bytes per parameter, the ZeRO
paper's example).

>>> from memlib import PAPER_TRAINING, estimate
>>> t8 = table8(estimate("deepseek-v3", PAPER_TRAINING), 1)
>>> [row["total"] for row in t8.values()]
[87505108992, 43430264832, 21392842752, 10374131712]
"""
from __future__ import annotations

import sympy as sp

from ..device.estimate import Estimate, estimate
from ..model.partition import Partition
from ..data.reference import MEGATRON_BYTES_PER_PARAM, PAPER, ZERO_PAPER
from ..config import ZeroStage
from ..config.precision import RECIPES, Recipe
from ..model.states import states_formula
from ..core.symbols import sym

__all__ = ["TERMS", "table7", "sharding", "table8", "printed_sum", "rule_totals", "prose_swap",
           "megatron_per_param", "megatron_bytes", "zero_paper_example", "STATE_RULES"]

#: the three model states, in the order of :func:`memlib.model.states.states_formula`
TERMS = ("parameters", "gradients", "optimizer_states")

#: which blocks' states shard over EDP under each rule (the others over DP CP)
STATE_RULES = {
    "paper": frozenset({"router", "shared_experts", "routed_experts"}),    # §4: the whole MoE block
    "megatron": frozenset({"routed_experts"}),                             # the distributed optimizer
}


def table7(rec: Recipe) -> list[tuple[str, int]]:
    """The paper's Table 7 for a recipe: (item, bytes per element), weights to optimizer states."""
    return [("weights", rec.weights), ("activations", rec.activations), ("gradients", rec.gradients),
            *rec.optimizer]


def sharding(part: Partition, index: int) -> dict[str, dict[str, int]]:
    """The sharded count of a device of stage ``index`` under each rule of :data:`STATE_RULES`, on
    the same partition: P_ne and P_e, their divisors, their shards and the total P~; and the
    ``difference`` of the two rules (``moved``: the parameters the paper counts as expert states)."""
    t = part.train
    params = part.params(part.stages[index])
    ne_div, e_div = t.dp_cp, t.edp
    out: dict[str, dict[str, int]] = {}
    for name, blocks in STATE_RULES.items():
        expert = params.select(lambda k: k.removeprefix("mtp.").split(".")[0] in blocks)
        e = expert.evaluate_total(part.values)
        ne = params.evaluate_total(part.values) - e
        shard_ne, shard_e = -(-ne // ne_div), -(-e // e_div)
        out[name] = {"P_ne": ne, "P_e": e, "ne_div": ne_div, "e_div": e_div, "shard_ne": shard_ne,
                     "shard_e": shard_e, "shard": shard_ne + shard_e}
    out["difference"] = {"shard": out["paper"]["shard"] - out["megatron"]["shard"],
                         "moved": out["paper"]["P_e"] - out["megatron"]["P_e"]}
    return out


def table8(est: Estimate, index: int) -> dict[ZeroStage, dict[str, int]]:
    """The paper's Table 8: bytes of each model state and their total on one device of stage
    ``index``, per ZeRO stage (the configuration of ``est`` otherwise)."""
    out = {}
    for z in ZeroStage:
        s = est.stages[index] if est.train.zero == z else estimate(est.model, est.train.with_(zero=z)).stages[index]
        out[z] = {**{t: s.bytes[t] for t in TERMS}, "total": s.model_states}
    return out


def printed_sum(row: dict[str, str]) -> str:
    """The sum of a printed Table 8 row's three terms, with as many decimals as the most precise
    (the paper's totals are such sums: 11.64 + 23.3 + 46.6 = 81.54)."""
    from decimal import Decimal

    terms = [Decimal(row[t]) for t in TERMS]
    places = max(-d.as_tuple().exponent for d in terms)
    return f"{sum(terms):.{places}f}"


def rule_totals(part: Partition, index: int) -> dict[str, dict[ZeroStage, int]]:
    """Model-state bytes of a device of stage ``index`` per ZeRO stage under each sharding rule (``paper``,
    ``megatron``), and what Megatron-Core's rule saves against the paper's (``saving``)."""
    rec = RECIPES[part.train.precision]
    t = part.train
    out: dict[str, dict[ZeroStage, int]] = {}
    for name, r in sharding(part, index).items():
        if name == "difference":
            continue
        subs = {sym("P_ne"): r["P_ne"], sym("P_e"): r["P_e"], sym("DP"): t.dp, sym("CP"): t.cp, sym("EDP"): t.edp}
        out[name] = {z: int(states_formula(z, rec).total.xreplace(subs)) for z in ZeroStage}
    out["saving"] = {z: out["paper"][z] - out["megatron"][z] for z in ZeroStage}
    return out


def prose_swap(est: Estimate, index: int) -> dict[str, object]:
    """The paper's §4 prose labels the x4 term "optimizer states" and the x8 term "gradients"; its
    Tables 7 and 8 have B_g = 4 and B_o = 8.  The quote, and memlib's unsharded terms."""
    s = table8(est, index)[ZeroStage.NONE]
    rec = RECIPES[est.train.precision]
    return {"quote": PAPER["prose_swap"], "gradients": s["gradients"], "optimizer_states": s["optimizer_states"],
            "B_g": rec.gradients, "B_o": rec.optimizer_bytes}


D = sp.Symbol("d", integer=True, positive=True)


def megatron_per_param(rec: Recipe) -> sp.Expr:
    """Bytes per parameter under ZeRO-1 on d data-parallel ranks, from :func:`states_formula`: a
    device holds P parameters, none of them expert, so P~ = P/d (Megatron-LM's distributed optimizer)."""
    P = sym("P")
    expr = states_formula(ZeroStage.OS, rec).total.replace(sp.ceiling, lambda x: x)
    expr = expr.xreplace({sym("P_e"): 0, sym("CP"): 1, sym("DP"): D, sym("P_ne"): P})
    return sp.expand(expr / P)


def megatron_bytes() -> list[dict[str, object]]:
    """Megatron-LM's distributed-optimizer table (its docs) against memlib's recipes: per recipe, the
    bytes per parameter without sharding and with ZeRO-1, both sides, and whether they match."""
    rows = []
    for name, (plain, (fixed, num)) in MEGATRON_BYTES_PER_PARAM.items():
        rec = RECIPES[name]
        dist = megatron_per_param(rec)
        rows.append({"recipe": name, "memlib": rec.total_bytes, "memlib_zero1": dist, "docs": plain,
                     "docs_zero1": fixed + num / D,
                     "match": rec.total_bytes == plain and sp.expand(dist - (fixed + num / D)) == 0})
    return rows


def zero_paper_example() -> dict[str, object]:
    """The ZeRO paper's example (7.5B parameters, 64 data-parallel ranks, fp16 mixed precision, Adam
    K = 12) from :func:`states_formula`: bytes per ZeRO stage, and what that paper prints (decimal GB)."""
    rec = RECIPES["fp16-mixed"]
    psi, nd = ZERO_PAPER["psi"], ZERO_PAPER["n_d"]
    subs = {sym("P_ne"): psi, sym("P_e"): 0, sym("DP"): nd, sym("CP"): 1, sym("EDP"): 1}
    return {"psi": psi, "n_d": nd, "k": ZERO_PAPER["k"],
            "bytes": {z: int(states_formula(z, rec).total.xreplace(subs)) for z in ZeroStage},
            "printed_gb": {z: ZERO_PAPER["gb"][z] for z in ZeroStage}}
