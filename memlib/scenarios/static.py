"""The static-memory chapter's worked problems: what a device of a stage stores when one parallel size
changes and the devices stay the same.

>>> from memlib import PAPER_TRAINING, estimate
>>> r = more_ep(estimate("deepseek-v3", PAPER_TRAINING))
>>> r["ep"], r["edp"], r["params"]
(16, 4, 3431792640)
"""
from __future__ import annotations

from ..config import ConfigError, TrainingConfig
from ..memory import Estimate
from ..partition import Partition
from ..paper import analysed_stage
from ..paper import static as pstatic

__all__ = ["next_ep", "more_ep", "no_tp"]


def next_ep(est: Estimate) -> int:
    """The smallest expert-parallel size above ``est``'s that the model and the stage's ranks allow:
    it divides the routed experts N, and EP ETP divides DP TP CP (2 EP for the book's models)."""
    m, t = est.model, est.train
    ranks = t.dp * t.tp * t.cp
    for ep in range(t.ep + 1, min(m.n_routed_experts, ranks // t.etp) + 1):
        if m.n_routed_experts % ep == 0 and ranks % (ep * t.etp) == 0:
            return ep
    raise ConfigError(f"ep={t.ep} is already the largest expert parallelism that n_routed_experts="
                      f"{m.n_routed_experts} and dp*tp*cp={ranks} allow")


def _device(est: Estimate, train: TrainingConfig, index: int) -> dict[str, object]:
    part = Partition(est.model, train)
    t6 = pstatic.table6(part, index)
    return {"train": train, "label": train.label(), "table6": t6, "params": t6["total"],
            "bytes": pstatic.weight_bytes(train, t6["total"]), "experts": pstatic.experts_per_device(part, index)}


def more_ep(est: Estimate, index: int | None = None) -> dict[str, object]:
    """Expert parallelism raised to :func:`next_ep` on the same devices (EDP shrinks with it): a
    device of stage ``index`` (the analysed one by default) under the new configuration (``ep``,
    ``edp``, ``label``, ``experts``, its ``table6``, ``params``, ``bytes``), and what it saves
    against ``est``'s (``saved_params``, ``saved_bytes``, positive when it stores less)."""
    i = analysed_stage(est.partition) if index is None else index
    base = _device(est, est.train, i)
    new = _device(est, est.train.with_(ep=next_ep(est)), i)
    t = new["train"]
    return {**new, "ep": t.ep, "edp": t.edp, "saved_params": base["params"] - new["params"],
            "saved_bytes": base["bytes"] - new["bytes"]}


def no_tp(est: Estimate, index: int | None = None) -> dict[str, object]:
    """Tensor parallelism turned off on the same devices (TP 1, DP multiplied by the old TP): a device
    of stage ``index`` under the new configuration (``tp``, ``dp``, ``label``, ``mla``, its
    ``table6``, ``params``, ``bytes``), what it stores more than under ``est``'s (``extra_params``,
    ``extra_bytes``), ``changed`` (the rows of Table 6 that change, among RMSNorm, the two parts of
    MLA and MoE), ``only_mla`` (whether MLA's split part is the only one) and ``mla_share`` (MLA's
    exact share of the device's parameters without TP)."""
    i = analysed_stage(est.partition) if index is None else index
    t0 = est.train
    base = _device(est, t0, i)
    new = _device(est, t0.with_(tp=1, dp=t0.dp * t0.tp), i)
    t = new["train"]
    groups = ("RMSNorm", "MLA, split", "MLA, replicated", "MoE")
    changed = [g for g in groups if new["table6"][g] != base["table6"][g]]
    part = Partition(est.model, t)
    return {**new, "tp": t.tp, "dp": t.dp, "mla": new["table6"]["MLA"], "extra_params": new["params"] - base["params"],
            "extra_bytes": new["bytes"] - base["bytes"], "changed": changed, "only_mla": changed == ["MLA, split"],
            "mla_share": pstatic.shares(part, i)["MLA"]}
