"""The paper's §3 (Tables 5 and 6): the parameters one device stores, grouped as the paper groups
them, for any model, configuration and stage; and where the two partition conventions differ.

Beyond the paper's single stage: the layout of each tensor of a MoE layer under each convention
(:func:`tensor_layout`), every stage under both (:func:`stage_rows`, :func:`largest_stages`,
:func:`expert_majority`), what the conventions change (:func:`profile_comparison`), and the
comparisons with the paper's printed values, which exist only for the paper's model
(:func:`printed_table6`, :func:`compare_table6`, :func:`printed_memory_slips`).

>>> from memlib import PAPER_TRAINING
>>> from memlib.model.partition import Partition
>>> t6 = table6(Partition("deepseek-v3", PAPER_TRAINING), 1)
>>> t6["total"], t6["MLA"], t6["MoE"]
(6250364928, 429654016, 5820645376)
"""
from __future__ import annotations

from fractions import Fraction

from ..model.architecture import decoder_layer_tensors
from ..config import ConfigError, TrainingConfig
from ..model.partition import Partition, balanced_layout, default_layout, shard_divisor
from ..model.profiles import profile
from ..data.reference import PAPER
from ..config.precision import RECIPES
from ..core.units import fmt_decimal, to_unit
from . import device_group, is_paper_model

__all__ = ["GROUPS", "device_groups", "table6", "profile_deltas", "experts_per_device",
           "PROFILE_NAMES", "TABLE5_KEYS", "TABLE6_ROWS", "weight_bytes", "table5", "table6_bytes", "shares",
           "largest_share", "sharded", "printed_table5", "printed_table6", "compare_table6", "table6_matches", "printed_memory_slips", "tensor_layout", "block_of", "stage_rows",
           "largest_stages", "expert_majority", "layout_rule", "profile_comparison"]

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
    routed = (m.n_routed_experts or 0) // t.ep            # a dense model: no experts
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


# ------------------------------------------------------------------------------------------------
# the chapter's views: Table 5, Table 6 with bytes and shares, the printed values, each tensor,
# every stage under both conventions
# ------------------------------------------------------------------------------------------------

#: the two partition conventions the chapter compares, in its order
PROFILE_NAMES = ("paper", "megatron")

#: the quantities of the paper's Table 5 (and the world size), in its order
TABLE5_KEYS = ("dp", "tp", "pp", "ep", "etp", "cp", "edp", "devices")

#: the rows of :func:`table6`, in the chapter's order
TABLE6_ROWS = ("RMSNorm", "MLA, split", "MLA, replicated", "MLA", "non-MoE", "MoE", "total")


def weight_bytes(train: TrainingConfig, n_params: int) -> int:
    """Bytes of ``n_params`` stored weights under ``train``'s precision recipe (B_w each)."""
    return n_params * RECIPES[train.precision].weights


def table5(train: TrainingConfig) -> dict[str, int]:
    """The paper's Table 5 for ``train``: the parallel sizes, EDP = DP TP CP / (EP ETP) and the
    devices DP TP CP PP, keyed by :data:`TABLE5_KEYS`."""
    return {"dp": train.dp, "tp": train.tp, "pp": train.pp, "ep": train.ep, "etp": train.etp, "cp": train.cp,
            "edp": train.edp, "devices": train.world_size}


def table6_bytes(part: Partition, index: int) -> dict[str, int]:
    """The rows of :func:`table6` as bytes of stored weights (B_w per parameter)."""
    return {k: weight_bytes(part.train, n) for k, n in table6(part, index).items()}


def shares(part: Partition, index: int) -> dict[str, Fraction]:
    """Exact shares of a device's parameters on stage ``index``: per row of :func:`table6`
    (``MoE``, ``non-MoE``, ``MLA`` ...) and per sharding (``tp``, ``replicated``, ``expert``)."""
    t6 = table6(part, index)
    total = t6["total"]
    split = sharded(part, index)
    return {**{k: Fraction(v, total) for k, v in t6.items()}, **{k: Fraction(v, total) for k, v in split.items()}}


def sharded(part: Partition, index: int) -> dict[str, int]:
    """Exact parameters one device of stage ``index`` stores, per sharding (``tp``, ``replicated``, ``expert``)."""
    return {k: int(b.evaluate_total(part.values)) for k, b in part.split(part.stages[index]).items()}


def largest_share(part: Partition, index: int) -> str:
    """The sharding (``tp``, ``replicated`` or ``expert``) that holds the most of a device's parameters
    on stage ``index``."""
    sh = shares(part, index)
    return max(("tp", "replicated", "expert"), key=lambda k: sh[k])


def printed_table5(model) -> dict[str, int]:
    """What the paper's Table 5 prints, keyed like :func:`table5` (the sizes it prints only); empty
    unless ``model`` is the paper's."""
    return dict(PAPER["table5"]) if is_paper_model(model) else {}


def printed_table6(model) -> dict[str, dict[str, object]]:
    """What the paper prints for the rows of :func:`table6` (Table 6, and §3's split of MLA), keyed
    like it: ``params`` and, where printed, ``bytes`` and ``memory_gb`` (its "GB", which are GiB).
    Empty unless ``model`` is the paper's."""
    if not is_paper_model(model):
        return {}
    out: dict[str, dict[str, object]] = {row: dict(v) for row, v in PAPER["table6"].items()}
    out["MLA, split"] = {"params": PAPER["mla_tp_split"]}
    out["MLA, replicated"] = {"params": PAPER["mla_replicated"]}
    return {row: out[row] for row in TABLE6_ROWS if row in out}


def _rounds_to(n_bytes: int, printed: str) -> bool:
    """Whether ``n_bytes`` in GiB, rounded to the printed decimals, is the printed value."""
    places = len(printed.partition(".")[2])
    return fmt_decimal(to_unit(n_bytes, "GiB"), places) == printed


def compare_table6(part: Partition, index: int) -> dict[str, dict[str, bool]]:
    """Each printed row of :func:`printed_table6` against memlib: ``params`` and ``bytes`` equal, and
    ``memory`` (memlib's exact bytes, in GiB rounded to the printed decimals, give the printed value).
    Empty unless the model is the paper's."""
    printed = printed_table6(part.model)
    t6, b6 = table6(part, index), table6_bytes(part, index)
    out = {}
    for row, p in printed.items():
        r = {"params": t6[row] == p["params"]}
        if "bytes" in p:
            r["bytes"] = b6[row] == p["bytes"]
        if "memory_gb" in p:
            r["memory"] = _rounds_to(b6[row], p["memory_gb"])
        out[row] = r
    return out


def table6_matches(part: Partition, index: int) -> bool | None:
    """Whether every printed parameter and byte count of :func:`printed_table6` is memlib's (None for
    a model other than the paper's)."""
    rows = compare_table6(part, index)
    if not rows:
        return None
    return all(r["params"] and r.get("bytes", True) for r in rows.values())


def printed_memory_slips(part: Partition, index: int) -> list[str]:
    """The rows whose printed "GB" do not follow from their own exact bytes (none for another model)."""
    return [row for row, r in compare_table6(part, index).items() if r.get("memory") is False]


def tensor_layout(part: Partition) -> list[dict[str, object]]:
    """Each parameter tensor of one MoE layer: ``key``, ``latex``, ``block``, symbolic ``shape``, and
    per profile of :data:`PROFILE_NAMES` its ``sharding`` (``tp``, ``replicated``, ``expert``) and the
    ``per_device`` count on one device of ``part``'s configuration."""
    rows = []
    for t in decoder_layer_tensors(part.model, "moe" if part.model.has_moe else "dense"):   # a dense model's layer
        if t.kind == "buffer":
            continue
        row: dict[str, object] = {"key": t.key, "latex": t.latex, "block": t.block, "shape": t.shape}
        for name in PROFILE_NAMES:
            kind = profile(name).partition.sharding(t)
            row[name] = {"sharding": kind, "per_device": int((t.numel / shard_divisor(kind)).xreplace(part.values))}
        rows.append(row)
    return rows


def block_of(key: str) -> str:
    """The block of :data:`memlib.model.architecture.BLOCKS` a stored tensor belongs to (an MTP module's
    tensors, its embedding copy included, to ``mtp``; a tied head's copy to ``head``)."""
    return "mtp" if key.startswith("mtp.") else key.split(".")[0]


def stage_rows(part: Partition) -> list[dict[str, object]]:
    """Every pipeline stage of ``part``'s configuration under both conventions: ``stage``, decoder
    ``layers``, the ``dense`` and ``moe`` layer counts, ``first``/``last``, and per profile its
    per-device ``params`` and weight ``bytes``, their ``split`` by sharding and ``blocks`` (both in
    parameters and, as ``split_bytes`` and ``block_bytes``, bytes) and whether it holds the ``mtp``
    modules; ``difference``: megatron's parameters minus the paper's."""
    parts = {name: Partition(part.model, part.train.with_(profile=name)) for name in PROFILE_NAMES}
    m, t = part.model, part.train
    rows = []
    for i, st in enumerate(part.stages):
        kinds = [m.layer_kinds[j] for j in st.layers]
        row: dict[str, object] = {"stage": st.index, "layers": st.layers, "dense": kinds.count("dense"),
                                  "moe": kinds.count("moe"), "first": st.first, "last": st.last}
        for name, p in parts.items():
            s = p.stages[i]
            per_key = p.params(s).evaluate(p.values)
            blocks: dict[str, int] = {}
            for key, n in per_key.items():
                blocks[block_of(key)] = blocks.get(block_of(key), 0) + n
            split = {k: b.evaluate_total(p.values) for k, b in p.split(s).items()}
            params = sum(per_key.values())
            row[name] = {"params": params, "bytes": weight_bytes(t, params), "split": split,
                         "split_bytes": {k: weight_bytes(t, n) for k, n in split.items()}, "blocks": blocks,
                         "block_bytes": {k: weight_bytes(t, n) for k, n in blocks.items()}, "mtp": "mtp" in blocks}
        row["difference"] = row["megatron"]["params"] - row["paper"]["params"]
        rows.append(row)
    return rows


def largest_stages(part: Partition, index: int | None = None, profile: str = "paper") -> dict[str, object]:
    """The stages whose device stores the most parameters under ``profile``: ``stages`` (indices),
    ``params`` and ``bytes`` of one of their devices, and whether stage ``index`` is one of them
    (``includes``; None without ``index``)."""
    rows = stage_rows(part)
    top = max(r[profile]["params"] for r in rows)
    stages = [r["stage"] for r in rows if r[profile]["params"] == top]
    return {"stages": stages, "params": top, "bytes": weight_bytes(part.train, top),
            "includes": None if index is None else index in stages}


def expert_majority(part: Partition, profile: str = "paper") -> dict[int, bool]:
    """Per stage: whether the routed experts are more than half of a device's parameters."""
    return {r["stage"]: 2 * r[profile]["blocks"].get("routed_experts", 0) > r[profile]["params"]
            for r in stage_rows(part)}


def layout_rule(part: Partition) -> dict[str, object]:
    """Which rule ``part``'s layout follows: ``rule`` is ``default`` (ceil(l/PP) layers per stage, the
    remainder on the last), ``balanced`` (:func:`memlib.model.partition.balanced_layout`) or ``given``;
    ``default_fits``: whether the default rule leaves every stage a layer."""
    n, pp = part.model.num_hidden_layers, len(part.layout)
    try:
        default = default_layout(n, pp)
    except ConfigError:
        default = None
    if part.layout == default:
        rule = "default"
    elif part.layout == balanced_layout(n, pp):
        rule = "balanced"
    else:
        rule = "given"
    return {"rule": rule, "default_fits": default is not None}


def profile_comparison(part: Partition, index: int) -> dict[str, object]:
    """:func:`profile_deltas` with weight bytes (``stage_bytes``: what Megatron-Core's convention saves
    on stage ``index``; ``paper_stage_bytes``, ``megatron_stage_bytes``), the ``tensors`` of a MoE
    layer whose sharding differs, ``has_mtp`` (Megatron-Core puts MTP modules on the last stage) and
    ``last_grows`` (the last stage stores more under Megatron-Core's convention)."""
    d = profile_deltas(part, index)
    t = part.train
    differ = [r["key"] for r in tensor_layout(part) if r["paper"]["sharding"] != r["megatron"]["sharding"]]
    return {**d, "stage_bytes": weight_bytes(t, d["stage"]), "paper_stage_bytes": weight_bytes(t, d["paper_stage"]),
            "megatron_stage_bytes": weight_bytes(t, d["megatron_stage"]), "tensors": differ,
            "has_mtp": d["mtp"] > 0, "last_grows": d["megatron_last"] > d["paper_last"]}
