"""One knob at a time: what a device of a stage holds as one setting of the configuration changes.

>>> from memlib import PAPER_TRAINING, estimate
>>> rows = ep_sweep(estimate("deepseek-v3", PAPER_TRAINING), 1)
>>> [r["ep"] for r in rows]
[1, 2, 4, 8, 16, 32, 64]
"""
from __future__ import annotations

from ..device.estimate import Estimate, estimate
from ..config import ZeroStage
from ..paper import zero as pzero

__all__ = ["ep_sweep", "recipe_change"]


def ep_sweep(est: Estimate, index: int, zero: ZeroStage = ZeroStage.OS_G_PARAMS) -> list[dict[str, int]]:
    """Model-state bytes of a device of stage ``index`` under ZeRO stage ``zero`` for every power-of-two
    EP that the experts and the stage's ranks allow, the rest of ``est``'s configuration (its partition
    included) unchanged, under each sharding rule of :data:`memlib.paper.zero.STATE_RULES` (``paper``: the
    router and shared expert shard over EDP; ``megatron``: over DP CP): the two columns differ by that rule
    alone."""
    m, t = est.model, est.train
    rows, ep = [], 1
    while (m.n_routed_experts or 1) % ep == 0 and (t.dp * t.tp * t.cp) % (ep * t.etp) == 0:
        c = t.with_(ep=ep, zero=zero)
        rules = pzero.rule_totals(estimate(m, c).partition, index)
        rows.append({"ep": ep, "edp": c.edp, **{rule: by_stage[zero] for rule, by_stage in rules.items()}})
        ep *= 2
    return rows


def recipe_change(est: Estimate, index: int, precision: str, zero: ZeroStage | None = None) -> dict[str, int]:
    """The model states of a device of stage ``index`` with another precision recipe (and ZeRO
    stage), beside ``est``'s own under the same ZeRO stage: totals, the optimizer term and the change."""
    z = est.train.zero if zero is None else zero
    base = estimate(est.model, est.train.with_(zero=z)).stages[index]
    other = estimate(est.model, est.train.with_(zero=z, precision=precision)).stages[index]
    return {"base": base.model_states, "total": other.model_states, "optimizer": other.bytes["optimizer_states"],
            "delta": other.model_states - base.model_states}
