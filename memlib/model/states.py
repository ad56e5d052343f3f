"""Model states: weights, gradients and optimizer states under a precision recipe and a ZeRO stage.

A precision recipe (:mod:`memlib.config.precision`) gives the bytes per parameter of the stored weights,
the gradients and each optimizer state (master copy, moments).  A ZeRO stage says which of the three are
sharded over the data-parallel ranks (Rajbhandari et al., arXiv 1910.02054):

====  ==============  ==========================================
ZeRO  name            sharded
====  ==============  ==========================================
0     none            nothing
1     os              optimizer states
2     os+g            optimizer states and gradients
3     os+g+params     optimizer states, gradients and parameters
====  ==============  ==========================================

Non-expert states shard over the DP CP ranks that hold the same non-expert parameters; expert
states over the EDP ranks that hold the same experts.  Which states count as "expert" is the
profile's choice (:meth:`memlib.model.partition.Partition.edp_keys`): the paper's §4 puts the whole MoE
block (router and shared expert too) over EDP=8; Megatron only the routed experts.
A shard is rounded up to a whole element (ZeRO pads the flat buffer to a multiple of the ranks).
"""
from __future__ import annotations

import sympy as sp

from ..core.breakdown import Breakdown
from ..config import ZeroStage
from ..config.precision import Recipe
from .partition import Partition, Stage
from ..core.symbols import sym

__all__ = ["sharded_count", "states_formula", "model_states", "optimizer_states"]


P, P_ne, P_e = sym("P"), sym("P_ne"), sym("P_e")
B_w, B_g, B_o = sym("B_w"), sym("B_g"), sym("B_o")
DP, CP, EDP = sym("DP"), sym("CP"), sym("EDP")


def sharded_count(moe: bool = True) -> sp.Expr:
    r"""Parameters one device owns once sharded: :math:`\lceil P_{ne}/(DP\,CP)\rceil + \lceil P_e/EDP\rceil`;
    for a model without MoE layers (``moe=False``: no expert parameters, every parameter non-expert)
    :math:`\lceil P/(DP\,CP)\rceil`, the same count with :math:`P_e = 0`."""
    if not moe:
        return sp.ceiling(P / (DP * CP))
    return sp.ceiling(P_ne / (DP * CP)) + sp.ceiling(P_e / EDP)


def states_formula(zero: ZeroStage | int, rec: Recipe | None = None) -> Breakdown:
    """Model-state bytes on one device as a formula in P_ne, P_e (and B_w, B_g, B_o if no recipe).

    >>> states_formula(1).total
    B_g*(P_{e} + P_{ne}) + B_o*(ceiling(P_{e}/EDP) + ceiling(P_{ne}/(CP*DP))) + B_w*(P_{e} + P_{ne})
    """
    z = ZeroStage(zero)
    full, shard = P_ne + P_e, sharded_count()
    bw, bg, bo = (B_w, B_g, B_o) if rec is None else (rec.weights, rec.gradients, rec.optimizer_bytes)
    return Breakdown({state: width * (shard if z.shards(state) else full)
                      for state, width in (("parameters", bw), ("gradients", bg), ("optimizer_states", bo))})


def _counts(part: Partition, stage: Stage) -> dict:
    params = part.params(stage)
    experts = part.edp_keys(stage)
    ne = params.select(lambda k: k not in experts).evaluate_total(part.values)
    e = params.select(lambda k: k in experts).evaluate_total(part.values)
    return {P_ne: ne, P_e: e}


def model_states(part: Partition, stage: Stage) -> Breakdown:
    """Exact bytes of parameters, gradients and optimizer states on one device of ``stage``."""
    rec = part.train.recipe
    subs = {**part.values, **_counts(part, stage)}
    return Breakdown({k: sp.Integer(v) for k, v in
                      states_formula(part.train.zero, rec).evaluate(subs).items()})


def optimizer_states(part: Partition, stage: Stage) -> Breakdown:
    """Optimizer-state bytes on one device of ``stage``, per state (master copy, moments, ...)."""
    rec = part.train.recipe
    subs = {**part.values, **_counts(part, stage)}
    count = sharded_count() if part.train.zero >= ZeroStage.OS else P_ne + P_e
    n = sp.Integer(count.xreplace(subs))
    return Breakdown({name: b * n for name, b in rec.optimizer})
