"""The static-memory chapter's worked problems: what a device of a stage stores when one parallel size
changes and the devices stay the same; and which share of each tensor family one device holds
(:func:`device_slices`), for the device-slicing figure.

>>> from memlib import PAPER_TRAINING, estimate
>>> r = more_ep(estimate("deepseek-v3", PAPER_TRAINING))
>>> r["ep"], r["edp"], r["params"]
(16, 4, 3431792640)
"""
from __future__ import annotations

from fractions import Fraction

from ..model.architecture import BLOCKS
from ..config import ConfigError, TrainingConfig, ZeroStage
from ..device.estimate import Estimate
from ..model.partition import SHARDING, Partition, shard_divisor
from ..paper import analysed_stage
from ..paper import static as pstatic

__all__ = ["next_ep", "more_ep", "no_tp", "device_coords", "stage_groups", "device_slices"]


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
    ``extra_bytes``), ``changed`` (the groups of :data:`memlib.paper.static.GROUPS` whose count changes: a
    dense model's FFN and embedding are split by TP as well), ``only_mla`` (whether the attention's split part is
    the only one), ``mla_share`` (the attention's exact share of the device's parameters without TP) and
    ``growth`` (the device's parameters without TP over those with it)."""
    i = analysed_stage(est.partition) if index is None else index
    t0 = est.train
    base = _device(est, t0, i)
    new = _device(est, t0.with_(tp=1, dp=t0.dp * t0.tp), i)
    t = new["train"]
    part = Partition(est.model, t)
    before, after = pstatic.device_groups(est.partition, i), pstatic.device_groups(part, i)
    changed = [g for g in pstatic.GROUPS if after.get(g, 0) != before.get(g, 0)]
    return {**new, "tp": t.tp, "dp": t.dp, "mla": new["table6"]["MLA"], "extra_params": new["params"] - base["params"],
            "extra_bytes": new["bytes"] - base["bytes"], "changed": changed, "only_mla": changed == ["mla_split"],
            "mla_share": pstatic.shares(part, i)["MLA"], "growth": Fraction(new["params"], base["params"])}


def device_coords(train: TrainingConfig, rank: int) -> dict[str, int]:
    """The coordinates of rank ``rank`` of a stage (0 to DP TP CP - 1) in Megatron-Core's default order
    (``tp-cp-ep-dp-pp``: TP varies fastest, then CP, then DP; the expert groups ETP fastest, then EP,
    then EDP)."""
    t = train
    if not 0 <= rank < t.dp * t.tp * t.cp:
        raise ConfigError(f"rank={rank} must be between 0 and dp*tp*cp-1={t.dp * t.tp * t.cp - 1}")
    return {"tp": rank % t.tp, "cp": rank // t.tp % t.cp, "dp": rank // (t.tp * t.cp),
            "etp": rank % t.etp, "ep": rank // t.etp % t.ep, "edp": rank // (t.etp * t.ep)}


#: the groups :func:`stage_groups` forms: group -> the coordinates its ranks share (the others vary)
_GROUPS = {"tp": ("cp", "dp"), "cp": ("tp", "dp"), "dp": ("tp", "cp"),
           "etp": ("ep", "edp"), "ep": ("etp", "edp"), "edp": ("etp", "ep")}


def stage_groups(train: TrainingConfig) -> dict[str, list[tuple[int, ...]]]:
    """The ranks of one pipeline stage (0 to DP TP CP - 1) in their communication groups, each group the ranks
    whose other coordinates (:func:`device_coords`) agree, in rank order: ``tp`` (the TP groups, which split
    one layer's tensors), ``cp``, ``dp`` (the data-parallel replicas of a TP rank's slice), ``etp``, ``ep``
    (the expert-parallel groups: together they hold every routed expert once) and ``edp`` (the ranks
    that hold the same routed experts)."""
    ranks = train.dp * train.tp * train.cp
    coords = [device_coords(train, r) for r in range(ranks)]
    out = {}
    for name, shared in _GROUPS.items():
        groups: dict[tuple, list[int]] = {}
        for r, c in enumerate(coords):
            groups.setdefault(tuple(c[k] for k in shared), []).append(r)
        out[name] = sorted(tuple(g) for g in groups.values())
    return out


def device_slices(est: Estimate, index: int | None = None, rank: int | None = None,
                  zero: int | None = None) -> dict[str, object]:
    """Which share of each tensor family one device holds: rank ``rank`` (one past the middle of the stage by default) of
    stage ``index`` (the analysed one by default).

    Returns ``stage``, ``rank``, ``pp``, ``ranks`` (per stage, DP TP CP), ``coords``
    (:func:`device_coords`), ``ep_of_rank`` (each rank's EP index, the routed experts it holds), ``tp_of_rank``,
    ``experts`` (the first and last routed expert of the device; None without MoE), ``experts_of_ep`` (the same
    for each EP index) and ``families``: per
    (block, sharding, ZeRO group) of the stage's trained tensors, its ``label``, ``elements`` (the whole
    family on the stage, before any split) and the exact ``parameters``, ``gradients`` and
    ``optimizer_states`` fractions of it the device holds: 1/TP, 1/(EP ETP) or 1 as the partition shards
    it, then divided by DP CP (EDP for the expert states) where the ZeRO stage (``zero``, ``est``'s by
    default; it does not change what the partition stores) shards that state; ``zero`` is returned too."""
    part = est.partition
    t = est.train
    i = analysed_stage(part) if index is None else index
    ranks = t.dp * t.tp * t.cp
    r = min(ranks // 2 + 1, ranks - 1) if rank is None else rank
    coords = device_coords(t, r)
    zero = ZeroStage(t.zero if zero is None else zero)
    edp = part.edp_keys(part.stages[i])
    fams: dict[tuple, dict] = {}
    for tensor, n in part.tensors(part.stages[i]):
        if tensor.kind == "buffer":
            continue
        kind = part.sharding(tensor)
        block = pstatic.block_of(tensor.key)
        expert_group = tensor.key in edp
        key = (block, kind, expert_group)
        if key not in fams:
            held = Fraction(1, int(shard_divisor(kind).xreplace(part.values)))
            group = t.edp if expert_group else t.dp_cp
            name = "attention (GQA)" if block == "attention" and est.model.attention != "mla" else BLOCKS.get(block, block)
            fams[key] = {"block": block, "sharding": kind, "label": f"{name}, {SHARDING[kind]}",
                         "elements": 0, "zero_group": group,
                         **{state: held / (group if zero.shards(state) else 1)
                            for state in ("parameters", "gradients", "optimizer_states")}}
        fams[key]["elements"] += int((n * tensor.numel).xreplace(part.values))
    m = est.model
    per_ep = m.n_routed_experts // t.ep if m.has_moe else None
    return {"stage": i, "rank": r, "pp": t.pp, "zero": zero.value, "ranks": ranks, "coords": coords,
            "ep_of_rank": [device_coords(t, x)["ep"] for x in range(ranks)],
            "tp_of_rank": [device_coords(t, x)["tp"] for x in range(ranks)],
            "experts": None if per_ep is None else (coords["ep"] * per_ep, (coords["ep"] + 1) * per_ep - 1),
            "experts_of_ep": None if per_ep is None else [(e * per_ep, (e + 1) * per_ep - 1) for e in range(t.ep)],
            "families": list(fams.values())}
