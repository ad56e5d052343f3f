"""The paper's §3 (Tables 5 and 6): the parameters one device stores, grouped as the paper groups
them, for any model, configuration and stage; and where the two partition conventions differ.

>>> from memlib import PAPER_TRAINING
>>> from memlib.partition import Partition
>>> t6 = table6(Partition("deepseek-v3", PAPER_TRAINING), 1)
>>> t6["total"], t6["MLA"], t6["MoE"]
(6250364928, 429654016, 5820645376)
"""
from __future__ import annotations

from ..formulas import device_group
from ..partition import Partition, shard_divisor

__all__ = ["GROUPS", "device_groups", "table6", "profile_deltas", "experts_per_device"]

#: the groups of the paper's Table 6 (and the other blocks a first or last stage holds), in order
GROUPS = ("rmsnorm", "mla_split", "mla_replicated", "moe", "dense_ffn", "embedding", "head", "mtp")


def device_groups(part: Partition, index: int) -> dict[str, int]:
    """Exact parameters one device of stage ``index`` stores, per group of :data:`GROUPS` (present
    groups only)."""
    out: dict[str, int] = {}
    for t, n in part.tensors(part.stages[index]):
        if t.kind == "buffer":
            continue
        kind = part.sharding(t)
        g = device_group(t.key, t.kind, kind)
        out[g] = out.get(g, 0) + int((n * t.numel / shard_divisor(kind)).xreplace(part.values))
    return {g: out[g] for g in GROUPS if g in out}


def table6(part: Partition, index: int) -> dict[str, int]:
    """The rows of the paper's Table 6 for one device of stage ``index``, keyed by the paper's row
    labels (``RMSNorm``, ``MLA``, ``non-MoE``, ``MoE``, ``total``), with MLA's split and replicated
    parts, exact parameter counts."""
    g = device_groups(part, index)
    mla = g.get("mla_split", 0) + g.get("mla_replicated", 0)
    return {"RMSNorm": g.get("rmsnorm", 0), "MLA, split": g.get("mla_split", 0),
            "MLA, replicated": g.get("mla_replicated", 0), "MLA": mla,
            "non-MoE": mla + g.get("rmsnorm", 0), "MoE": g.get("moe", 0), "total": sum(g.values())}


def experts_per_device(part: Partition, index: int) -> dict[str, int]:
    """Routed experts per EP rank, shared experts, their sum per layer and on one device of the stage."""
    m, t = part.model, part.train
    moe_layers = sum(1 for i in part.stages[index].layers if m.is_moe_layer(i))
    routed = m.n_routed_experts // t.ep
    per_layer = routed + m.n_shared_experts
    return {"routed": routed, "shared": m.n_shared_experts, "per_layer": per_layer,
            "moe_layers": moe_layers, "per_device": per_layer * moe_layers}


def profile_deltas(part: Partition, index: int) -> dict[str, int]:
    """Where the ``paper`` and ``megatron`` conventions differ on stage ``index`` and on the last
    stage, in parameters per device: ``wqr`` (W^QR split with W^UQ), ``shared`` (the shared experts
    split by TP), ``stage`` (the whole difference), ``mtp`` (the MTP modules on the last stage,
    megatron only), ``final_norm``; and each profile's totals."""
    pa = Partition(part.model, part.train.with_(profile="paper"))
    me = Partition(part.model, part.train.with_(profile="megatron"))

    def total(p: Partition, i: int, pred=lambda k: True) -> int:
        return p.params(p.stages[i]).select(pred).evaluate_total(p.values)

    last = len(pa.stages) - 1
    return {
        "wqr": total(pa, index, lambda k: k == "attention.W_QR") - total(me, index, lambda k: k == "attention.W_QR"),
        "shared": total(pa, index, lambda k: k.startswith("shared_experts."))
        - total(me, index, lambda k: k.startswith("shared_experts.")),
        "stage": total(pa, index) - total(me, index),
        "mtp": total(me, last, lambda k: k.startswith("mtp.")),
        "final_norm": total(pa, last, lambda k: k.startswith("final_norm.")),
        "paper_stage": total(pa, index), "megatron_stage": total(me, index),
        "paper_last": total(pa, last), "megatron_last": total(me, last), "last": last,
    }
