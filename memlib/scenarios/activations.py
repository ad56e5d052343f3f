"""Activations as one setting changes: the micro-batch size, the sequence length (where the attention
scores, quadratic in s, overtake the rest), the recompute policy, and a longer sequence under full
recomputation.  Every function takes the chapter's :class:`~memlib.device.estimate.Estimate` and returns exact
integers or :class:`~fractions.Fraction` s.

>>> from memlib import PAPER_TRAINING, estimate
>>> crossover(estimate("deepseek-v3", PAPER_TRAINING))["s"]
610
"""
from __future__ import annotations

from fractions import Fraction

import sympy as sp

from ..ledgers.base import entry_bytes, ledger_bytes, parse_policy
from ..model.profiles import act_profile
from ..device.estimate import Estimate, estimate
from ..paper import analysed_stage
from ..paper.activations import layer_kind
from ..core.symbols import sym

__all__ = ["POLICIES_COMPARED", "MODULE_LIST", "module_list", "policies_compared", "modules_acting", "stage_activations", "microbatch_sweep", "microbatch_facts",
           "layer_split", "crossover", "seqlen_sweep", "policy_comparison", "seq_len_change"]

#: a list of recompute modules, compared with the named policies (DeepSeek-V3's; :func:`module_list` for a model)
MODULE_LIST = "core_attn,layernorm,mla_up_proj,moe_act"

#: the policies the chapter compares, weakest named first, then the module list
POLICIES_COMPARED = ("none", "selective", "deepseek", "full", MODULE_LIST)


def module_list(m) -> str:
    """The module list compared with the named policies, of ``m``'s own blocks: the attention core, the norms,
    MLA's up-projections (MLA only) and the experts' activation function (a dense model: its FFN's internals)."""
    mods = ["core_attn", "layernorm"] + (["mla_up_proj"] if m.attention == "mla" else []) \
        + (["moe_act"] if m.has_moe else ["mlp"])
    return ",".join(mods)


def policies_compared(m) -> tuple[str, ...]:
    """:data:`POLICIES_COMPARED` with ``m``'s :func:`module_list`."""
    return (*POLICIES_COMPARED[:-1], module_list(m))


def modules_acting(m, profile: str, modules) -> tuple[str, ...]:
    """The recompute ``modules`` that drop a saved tensor of ``m``'s analysed layer (``mla_up_proj`` drops
    nothing of a model without MLA), sorted."""
    entries = act_profile(profile).layer(m, layer_kind(m))
    return tuple(sorted(mod for mod in modules if any(mod in e.modules for e in entries)))

b, s = sym("b"), sym("s")


def _whole(x: Fraction) -> int | Fraction:
    """An int where the bytes are whole (every valid sequence length), else the exact Fraction."""
    return int(x) if x.denominator == 1 else x


def _index(est: Estimate, index: int | None) -> int:
    return analysed_stage(est.partition) if index is None else index


def stage_activations(est: Estimate, index: int | None = None, **changes) -> dict[str, int]:
    """The activations of one device of stage ``index`` with ``changes`` to ``est``'s configuration:
    one micro-batch (``per_microbatch``), the micro-batches held at the schedule's peak
    (``in_flight``, their bytes ``held``), the working set of a recomputed layer (``working``) and
    the ``total`` held at the peak, ``held + working``."""
    i = _index(est, index)
    c = est.train.with_(**changes) if changes else est.train
    a = (est if c == est.train else estimate(est.model, c)).stages[i]
    act = a.activations
    held = sum(ch["per_microbatch"] * ch["in_flight"] for ch in act["chunks"])
    out = {"per_microbatch": act["per_microbatch"], "in_flight": act["microbatches_in_flight"], "held": held,
           "working": act["recompute_working_set"], "total": a.bytes["activations"]}
    assert out["total"] == held + out["working"]
    return out


def microbatch_sweep(est: Estimate, micro_batches=range(1, 9), policies=None,
                     index: int | None = None) -> dict[str, list[dict[str, int]]]:
    """Per policy (the model's :func:`policies_compared` by default), per micro-batch size:
    :func:`stage_activations` of stage ``index``."""
    policies = policies or policies_compared(est.model)
    return {p: [{"b": bb, **stage_activations(est, index, micro_batch=bb, recompute=p)} for bb in micro_batches]
            for p in policies}


def microbatch_facts(sweep: dict[str, list[dict[str, int]]]) -> dict[str, bool]:
    """Whether one micro-batch's bytes are proportional to b under every policy, and whether the
    policies keep their order (by one micro-batch's bytes) at every b."""
    proportional = all(r["per_microbatch"] * rows[0]["b"] == rows[0]["per_microbatch"] * r["b"]
                       for rows in sweep.values() for r in rows)
    n = len(next(iter(sweep.values())))
    orders = {tuple(sorted(sweep, key=lambda p: sweep[p][k]["per_microbatch"])) for k in range(n)}
    return {"proportional": proportional, "same_order": len(orders) == 1}


def _split_expressions(est: Estimate, kind: str | None = None) -> tuple[sp.Expr, sp.Expr, int]:
    """One layer of ``kind`` on one device, one micro-batch of ``est``'s b: the bytes of the saved
    tensors quadratic in s and of the others, as expressions in s; and how many are quadratic."""
    entries = act_profile(est.train.profile).layer(est.model, kind or layer_kind(est.model))
    vals = {k: v for k, v in est.values.items() if k != s}
    quad, lin, n = sp.Integer(0), sp.Integer(0), 0
    for e in entries:
        x = entry_bytes(e, est.train, est.recipe).xreplace(vals)
        if sp.Poly(e.elements, s).degree() == 2:
            quad, n = quad + x, n + 1
        else:
            lin = lin + x
    return quad, lin, n


def layer_split(est: Estimate, seq_len: int | None = None, kind: str | None = None) -> dict:
    """One layer of ``kind`` on one device, one micro-batch, at ``seq_len`` (``est``'s by default):
    the bytes of the tensors quadratic in s (the attention scores), of the others, the total, the
    share of the quadratic ones and whether they are most of the layer; ``tensors``: how many there are."""
    quad, lin, n = _split_expressions(est, kind)
    at = {s: est.train.seq_len if seq_len is None else seq_len}
    q, li = Fraction(str(quad.xreplace(at))), Fraction(str(lin.xreplace(at)))
    total = q + li
    return {"seq_len": at[s], "quadratic": _whole(q), "linear": _whole(li), "total": _whole(total), "tensors": n,
            "share": q / total if total else Fraction(0), "dominates": 2 * q > total}


def crossover(est: Estimate, kind: str | None = None) -> dict | None:
    """The sequence length at which the saved tensors quadratic in s reach all the others in one
    layer of ``kind`` on one device: ``s``, the least whole s with quadratic >= linear (the ledger's
    rounding of the routed tokens included), and ``s_mean``, the exact crossing with the routed tokens
    at their mean.  None if the ledger keeps no tensor quadratic in s (fused attention)."""
    quad, lin, n = _split_expressions(est, kind)
    if n == 0:
        return None
    mean = lin.replace(sp.ceiling, lambda x: x)
    q2 = sp.Poly(sp.expand(quad), s).coeff_monomial(s**2)
    l1 = sp.Poly(sp.expand(mean), s).coeff_monomial(s)
    s_mean = Fraction(str(l1)) / Fraction(str(q2))

    def reached(x: int) -> bool:
        return quad.xreplace({s: x}) >= lin.xreplace({s: x})

    x = max(1, -(-s_mean.numerator // s_mean.denominator))
    while x > 1 and reached(x - 1):
        x -= 1
    while not reached(x):
        x += 1
    return {"s": x, "s_mean": s_mean}


def seqlen_sweep(est: Estimate, lo: int = 8, hi: int = 17, per_octave: int = 4, kind: str | None = None) -> list[dict]:
    """:func:`layer_split` at whole sequence lengths from 2**lo to 2**hi, ``per_octave`` evenly spaced
    lengths in each octave (2**j (1 + i/per_octave); 2**lo must be a multiple of ``per_octave``)."""
    quad, lin, _ = _split_expressions(est, kind)
    lengths = [2**j * (per_octave + i) // per_octave for j in range(lo, hi) for i in range(per_octave)] + [2**hi]
    out = []
    for x in lengths:
        q, li = Fraction(str(quad.xreplace({s: x}))), Fraction(str(lin.xreplace({s: x})))
        out.append({"seq_len": x, "quadratic": _whole(q), "linear": _whole(li), "total": _whole(q + li)})
    return out


def policy_comparison(est: Estimate, policies=None, index: int | None = None) -> list[dict]:
    """Per recompute policy (the model's :func:`policies_compared` by default): what it recomputes
    (``modules`` that act on the model, :func:`modules_acting`, or ``full``), one analysed layer's kept bytes
    (:func:`memlib.paper.activations.layer_kind`) on one device for one micro-batch (``layer``), and
    :func:`stage_activations` of stage ``index``."""
    m = est.model
    entries = act_profile(est.train.profile).layer(m, layer_kind(m))
    out = []
    for p in policies or policies_compared(m):
        pol = parse_policy(p)
        layer = ledger_bytes(entries, est.train, est.recipe, pol).evaluate_total(est.values)
        out.append({"policy": p, "full": pol.full, "modules": modules_acting(m, est.train.profile, pol.modules),
                    "layer": int(layer),
                    **stage_activations(est, index, recompute=p)})
    return out


def seq_len_change(est: Estimate, factor: int = 2, policy: str = "full", index: int | None = None) -> dict:
    """Stage ``index`` under ``policy`` at ``est``'s sequence length and at ``factor`` times it:
    :func:`stage_activations` of both, the ratios of one micro-batch and of the working set, and
    whether the working set is then more than the micro-batches held."""
    base = stage_activations(est, index, recompute=policy)
    new = stage_activations(est, index, recompute=policy, seq_len=factor * est.train.seq_len)
    return {"seq_len": factor * est.train.seq_len, "base": base, "new": new,
            "held_ratio": Fraction(new["held"], base["held"]) if base["held"] else None,
            "per_microbatch_ratio": Fraction(new["per_microbatch"], base["per_microbatch"]),
            "working_ratio": Fraction(new["working"], base["working"]) if base["working"] else None,
            "working_dominates": new["working"] > new["held"]}
