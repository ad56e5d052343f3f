"""Tables, numbers and figures of the static-memory chapter (``notebooks/04_static_memory.md``).

The chapter reproduces §3 of arXiv 2502.07846: the parallel configuration (its Table 5), the
parameters one device stores under PP16@TP2@EP8@ETP1 (its Table 6) and the same count for every
pipeline stage under the two partition conventions memlib knows (``paper`` and ``megatron``).
Every number is computed here from :mod:`memlib.partition`; the notebook only glues.

The paper's Table 6 groups a device's parameters as RMSNorm / MLA / MoE.  Its "RMSNorm" row holds
all four norms of a layer (the two block norms and MLA's two latent norms, :math:`2h+d_c'+d_c`),
whereas :mod:`memlib.params` files the latent norms under ``attention``; :func:`paper_group` maps
memlib's tensor keys onto the paper's rows.

>>> from memlib.config import PAPER_TRAINING, load_model
>>> v = table6_values(load_model("deepseek-v3"), PAPER_TRAINING)
>>> v["mla_split"], v["mla_replicated"], v["rmsnorm"], v["moe"], v["total"]
(318767104, 110886912, 65536, 5820645376, 6250364928)
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ..architecture import BLOCKS, Tensor, decoder_layer_tensors
from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model
from ..partition import PROFILES, SHARDING, Partition, shard_divisor
from ..reference import PAPER
from ..states import recipe
from ..symbols import SYMBOLS, sym
from ..units import fmt_bytes, fmt_count
from .core import PALETTE, md_table, new_figure

__all__ = [
    "PAPER_TABLES", "PROFILE_NAMES", "paper_group", "GROUP_LABELS", "table5_rows", "table5",
    "parallel_equations", "tensor_table", "layer_group_formula", "device_formulas",
    "stage_groups", "table6_values", "table6", "stage_values", "stage_table", "profile_deltas",
    "experts_per_device", "GROUP_SYMBOLS", "device_total_latex", "stage_names", "share_percent",
    "problem_answers", "printed_gb", "problem_configs", "stage_figure", "weight_bytes", "layer_range",
]

#: the paper's table numbers, as names (prose cannot type digits)
PAPER_TABLES = {"config": "Table 5", "static": "Table 6", "stages": "Table 4"}

#: the two partition conventions, in the order the chapter shows them
PROFILE_NAMES = ("paper", "megatron")

#: row labels of the paper's Table 6 (and of memlib's other per-device groups)
GROUP_LABELS = {
    "rmsnorm": "RMSNorm (block and latent norms)",
    "mla_split": "MLA, split by TP",
    "mla_replicated": "MLA, replicated",
    "moe": "MoE (router, shared and routed experts)",
    "dense_ffn": "dense FFN",
    "embedding": "embedding",
    "head": "output head",
    "mtp": "MTP module",
}

_MOE_BLOCKS = ("router", "shared_experts", "routed_experts")


def paper_group(t: Tensor, sharding: str) -> str:
    """The row of the paper's Table 6 a tensor falls in (``rmsnorm``, ``mla_split``, ...)."""
    if t.key.startswith("mtp."):
        return "mtp"
    if t.kind == "norm":
        return "rmsnorm"
    block = t.block
    if block == "attention":
        return "mla_split" if sharding == "tp" else "mla_replicated"
    if block in _MOE_BLOCKS:
        return "moe"
    return block  # dense_ffn, embedding, head


def weight_bytes(n_params: int, train: TrainingConfig) -> int:
    """Bytes of ``n_params`` stored weights under ``train``'s precision recipe (B_w each)."""
    return n_params * recipe(train.precision).weights


def layer_range(layers: tuple[int, ...]) -> str:
    """``"4–7"`` for a stage's decoder layers (``"60"`` for one)."""
    return str(layers[0]) if len(layers) == 1 else f"{layers[0]}–{layers[-1]}"


# --------------------------------------------------------------------------------------------
# the parallel configuration (the paper's Table 5)
# --------------------------------------------------------------------------------------------

def table5_rows(train: TrainingConfig = PAPER_TRAINING) -> list[list[str]]:
    """(quantity, symbol, memlib, paper prints) for the parallel sizes, EDP and the world size."""
    printed = PAPER["table5"]
    rows = []
    for key, name in (("dp", "DP"), ("tp", "TP"), ("pp", "PP"), ("ep", "EP"), ("etp", "ETP"),
                      ("cp", "CP"), ("edp", "EDP")):
        meaning = SYMBOLS[name].meaning.split(",")[0]
        value = train.edp if key == "edp" else getattr(train, key)
        rows.append([meaning, f"${sp.latex(sym(name))}$", fmt_count(value),
                     fmt_count(printed[key]) if key in printed else "—"])
    rows.append(["devices (world size)", "$DP\\,TP\\,CP\\,PP$", fmt_count(train.world_size), "—"])
    return rows


def table5(train: TrainingConfig = PAPER_TRAINING) -> str:
    """The paper's Table 5 as Markdown, memlib's values beside the printed ones."""
    return md_table(["quantity", "symbol", "memlib", "paper prints"], table5_rows(train), "lcrr")


def parallel_equations() -> dict[str, sp.Expr]:
    """``EDP`` and the world size as formulas in the parallel sizes (Megatron-Core's rule)."""
    DP, TP, CP, PP, EP, ETP = (sym(k) for k in ("DP", "TP", "CP", "PP", "EP", "ETP"))
    return {"EDP": DP * TP * CP / (EP * ETP), "world": DP * TP * CP * PP}


# --------------------------------------------------------------------------------------------
# how each tensor of a MoE layer is laid out
# --------------------------------------------------------------------------------------------

def _moe_layer_tensors(model: ModelConfig) -> list[Tensor]:
    return [t for t in decoder_layer_tensors(model, "moe") if t.kind != "buffer"]


def tensor_table(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> str:
    """Each tensor of one MoE layer: shape, how each profile lays it out, and its per-device count."""
    model = load_model(model)
    vals = Partition(model, train).values
    rows = []
    for t in _moe_layer_tensors(model):
        row = [f"${t.latex}$", BLOCKS[t.block], "$" + r" \times ".join(sp.latex(d) for d in t.shape) + "$"]
        for name in PROFILE_NAMES:
            kind = PROFILES[name].sharding(t)
            per_device = t.numel / shard_divisor(kind)
            row += [SHARDING[kind], fmt_count(int(per_device.xreplace(vals)))]
        rows.append(row)
    headers = ["tensor", "block", "shape", "paper", "per device", "megatron", "per device"]
    return md_table(headers, rows, "llllrlr")


def layer_group_formula(model: ModelConfig | str, profile: str = "paper") -> dict[str, sp.Expr]:
    """Per-device parameters of one MoE layer, grouped as the paper's Table 6 (symbolic)."""
    model = load_model(model)
    prof = PROFILES[profile]
    groups: dict[str, list] = {"mla_split": [], "mla_replicated": [], "rmsnorm": [], "moe": []}
    for t in _moe_layer_tensors(model):
        kind = prof.sharding(t)
        groups[paper_group(t, kind)].append((t.numel, kind))
    out = {}
    for g, terms in groups.items():
        kinds = {k for _, k in terms}
        if g == "mla_split":
            # one divisor for the whole group, kept outside the sum as the paper writes it
            (kind,) = kinds
            out[g] = sp.Mul(sp.Add(*[n for n, _ in terms]), 1 / shard_divisor(kind))
        elif g == "moe":
            total = sp.Add(*[n / shard_divisor(k) for n, k in terms])
            out[g] = sp.collect(sp.expand(total), sym("h") * sym("h_E"))
        else:
            out[g] = sp.Add(*[n / shard_divisor(k) for n, k in terms])
    return out


#: left-hand sides of the group formulas (LaTeX)
GROUP_SYMBOLS = {
    "mla_split": r"P^{split}_{MLA}", "mla_replicated": r"P^{repl}_{MLA}",
    "rmsnorm": r"P_{norm}", "moe": r"P_{MoE}",
}


def device_total_latex() -> str:
    """The per-device total as the sum of the named groups."""
    return " + ".join(GROUP_SYMBOLS.values())


def device_formulas(model: ModelConfig | str, profile: str = "paper") -> dict[str, sp.Expr]:
    """The same groups for a stage of :math:`L^{MoE}_{st}` MoE layers, and their sum ``total``."""
    L = sym("L_moe")
    per_layer = layer_group_formula(model, profile)
    out = {g: sp.Mul(L, e, evaluate=False) for g, e in per_layer.items()}
    out["total"] = sp.Mul(L, sp.Add(*per_layer.values()), evaluate=False)
    return out


# --------------------------------------------------------------------------------------------
# exact per-device counts (the paper's Table 6) and every stage
# --------------------------------------------------------------------------------------------

def stage_groups(part: Partition, index: int) -> dict[str, int]:
    """Exact per-device parameters of stage ``index``, per group of :data:`GROUP_LABELS`."""
    st = part.stages[index]
    out: dict[str, int] = {}
    for t, n in part.tensors(st):
        if t.kind == "buffer":
            continue
        kind = part.sharding(t)
        g = paper_group(t, kind)
        count = int((n * t.numel / shard_divisor(kind)).xreplace(part.values))
        out[g] = out.get(g, 0) + count
    return out


def table6_values(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING,
                  stage: int = 1) -> dict[str, int]:
    """The rows of the paper's Table 6 for one device of ``stage`` (a MoE stage), exact."""
    part = Partition(model, train)
    g = stage_groups(part, stage)
    v = {k: g.get(k, 0) for k in ("rmsnorm", "mla_split", "mla_replicated", "moe")}
    v["mla"] = v["mla_split"] + v["mla_replicated"]
    v["non_moe"] = v["mla"] + v["rmsnorm"]
    v["total"] = sum(g.values())
    v["moe_share_percent"] = v["moe"] * 100 // v["total"]
    for k in ("rmsnorm", "mla_split", "mla_replicated", "mla", "non_moe", "moe", "total"):
        v[k + "_bytes"] = weight_bytes(v[k], train)
    return v


_T6_ROWS = (  # (memlib key, label, the paper's row or None)
    ("rmsnorm", "RMSNorm", "RMSNorm"),
    ("mla_split", "MLA, split by TP", None),
    ("mla_replicated", "MLA, replicated", None),
    ("mla", "MLA", "MLA"),
    ("non_moe", "non-MoE (RMSNorm + MLA)", "non-MoE"),
    ("moe", "MoE", "MoE"),
    ("total", "**total**", "total"),
)


def printed_gb(module: str) -> str:
    """What the paper's Table 6 prints in its "GB" (= GiB) column for ``module``."""
    return PAPER["table6"][module]["memory_gb"]


def table6(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> str:
    """The paper's Table 6: memlib's exact counts, bytes and GiB beside the paper's printed values."""
    v = table6_values(model, train, stage)
    printed = PAPER["table6"]
    rows = []
    for key, label, paper_row in _T6_ROWS:
        p = printed.get(paper_row) if paper_row else None
        rows.append([
            label, fmt_count(v[key]), fmt_count(p["params"]) if p else "—",
            fmt_count(v[key + "_bytes"]), fmt_bytes(v[key + "_bytes"], "GiB", with_unit=False),
            p["memory_gb"] if p else "—",
        ])
    headers = ["module", "parameters (memlib)", "parameters (paper)", "bytes (memlib)",
               "GiB (memlib)", "paper prints \"GB\" (= GiB)"]
    return md_table(headers, rows)


def experts_per_device(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING,
                       stage: int = 1) -> dict[str, int]:
    """Routed experts per EP rank, shared experts, their sum per layer and per stage device."""
    m = load_model(model)
    part = Partition(m, train)
    moe_layers = sum(1 for i in part.stages[stage].layers if m.is_moe_layer(i))
    routed = m.n_routed_experts // train.ep
    per_layer = routed + m.n_shared_experts
    return {"routed": routed, "shared": m.n_shared_experts, "per_layer": per_layer,
            "moe_layers": moe_layers, "per_device": per_layer * moe_layers}


def stage_values(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> dict[str, list[dict]]:
    """For each profile, each stage: layers, exact per-device parameters, bytes, and the split by sharding."""
    out = {}
    for name in PROFILE_NAMES:
        part = Partition(model, train.with_(profile=name))
        rows = []
        for st in part.stages:
            split = {k: b.evaluate_total(part.values) for k, b in part.split(st).items()}
            params = sum(split.values())
            rows.append({"stage": st.index, "layers": st.layers, "first": st.first, "last": st.last,
                         "params": params, "bytes": weight_bytes(params, train), "split": split,
                         "groups": stage_groups(part, st.index)})
        out[name] = rows
    return out


def _extras(row: dict, m: ModelConfig) -> str:
    kinds = [m.layer_kinds[i] for i in row["layers"]]
    parts = []
    if kinds.count("dense"):
        parts.append(f"{kinds.count('dense')} dense + {kinds.count('moe')} MoE")
    else:
        parts.append(f"{kinds.count('moe')} MoE")
    if row["first"]:
        parts.append("embedding")
    if row["last"]:
        parts.append("final norm, head")
    if "mtp" in row["groups"]:
        parts.append("MTP")
    return "; ".join(parts)


def stage_table(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> str:
    """Every stage under both profiles: per-device parameters and GiB of stored weights."""
    m = load_model(model)
    vals = stage_values(m, train)
    rows = []
    for p, g in zip(vals["paper"], vals["megatron"]):
        rows.append([
            str(p["stage"]), layer_range(p["layers"]), _extras(p, m) + (" (+ MTP for megatron)" if "mtp" in g["groups"] else ""),
            fmt_count(p["params"]), fmt_bytes(p["bytes"], "GiB", with_unit=False),
            fmt_count(g["params"]), fmt_bytes(g["bytes"], "GiB", with_unit=False),
            f"{g['params'] - p['params']:+,}".replace("-", "−"),
        ])
    headers = ["stage", "decoder layers", "holds", "paper: parameters", "paper: GiB",
               "megatron: parameters", "megatron: GiB", "megatron − paper (parameters)"]
    return md_table(headers, rows, "rllrrrrr")


def profile_deltas(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, stage: int = 1) -> dict[str, int]:
    """Where the two profiles differ on a MoE stage and on the last stage (exact parameter counts).

    ``wqr``: what TP-splitting W^QR saves per device; ``shared``: what TP-splitting the shared
    experts saves; ``moe_stage``: the whole difference on ``stage``; ``mtp``: the MTP module's
    parameters on a last-stage device (megatron only); ``final_norm``: the final RMSNorm (both)."""
    m = load_model(model)
    pa = Partition(m, train.with_(profile="paper"))
    me = Partition(m, train.with_(profile="megatron"))

    def key_total(part: Partition, index: int, pred) -> int:
        b = part.params(part.stages[index]).select(pred)
        return b.evaluate_total(part.values)

    last = len(pa.stages) - 1
    wqr = key_total(pa, stage, lambda k: k == "attention.W_QR") - key_total(me, stage, lambda k: k == "attention.W_QR")
    shared = (key_total(pa, stage, lambda k: k.startswith("shared_experts."))
              - key_total(me, stage, lambda k: k.startswith("shared_experts.")))
    paper_stage = key_total(pa, stage, lambda k: True)
    meg_stage = key_total(me, stage, lambda k: True)
    return {
        "wqr": wqr, "shared": shared, "moe_stage": paper_stage - meg_stage,
        "moe_stage_bytes": weight_bytes(paper_stage - meg_stage, train),
        "mtp": key_total(me, last, lambda k: k.startswith("mtp.")),
        "final_norm": key_total(pa, last, lambda k: k.startswith("final_norm.")),
        "last_paper": key_total(pa, last, lambda k: True),
        "last_megatron": key_total(me, last, lambda k: True),
        "paper_stage": paper_stage, "megatron_stage": meg_stage,
        "megatron_stage_bytes": weight_bytes(meg_stage, train),
        "last_index": last,
    }


@dataclass(frozen=True)
class Problem:
    """A worked problem's configuration and what changed."""

    train: TrainingConfig
    changed: dict


def problem_configs(train: TrainingConfig = PAPER_TRAINING) -> dict[str, Problem]:
    """The chapter's worked problems: EP doubled (same devices); TP dropped with DP doubled (same devices)."""
    return {
        "ep_double": Problem(train.with_(ep=train.ep * 2), {"ep": train.ep * 2, "edp": train.with_(ep=train.ep * 2).edp}),
        "tp_off": Problem(train.with_(tp=1, dp=train.dp * train.tp), {"tp": 1, "dp": train.dp * train.tp}),
    }


def stage_figure(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING):
    """Grouped, stacked bars: GiB of stored weights per device for each stage, both profiles,
    stacked by how the parameters are sharded (TP-split, replicated, expert-split)."""
    vals = stage_values(model, train)
    fig, ax = new_figure(8.0, 3.8)
    width = 0.4
    hatches = {"paper": "", "megatron": "//"}
    colours = {"tp": PALETTE[0], "replicated": PALETTE[1], "expert": PALETTE[2]}
    for j, name in enumerate(PROFILE_NAMES):
        rows = vals[name]
        x = [r["stage"] + (j - 0.5) * width for r in rows]
        bottom = [0.0] * len(rows)
        for kind in ("tp", "replicated", "expert"):
            h = [weight_bytes(r["split"][kind], train) / 2**30 for r in rows]
            ax.bar(x, h, width=width * 0.95, bottom=bottom, color=colours[kind], hatch=hatches[name],
                   edgecolor="white", linewidth=0.3,
                   label=f"{SHARDING[kind]} ({name})")
            bottom = [b + y for b, y in zip(bottom, h)]
    ax.set_xticks(range(len(vals["paper"])))
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("stored weights, GiB per device")
    ax.legend(ncol=2, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return fig


# --------------------------------------------------------------------------------------------
# stage names and the worked problems' answers
# --------------------------------------------------------------------------------------------

def stage_names(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> dict[str, object]:
    """The stages the chapter talks about: the analysed one (the first MoE-only stage), the range
    of MoE-only stages, the first and the last, and the decoder layers of a full MoE stage."""
    m = load_model(model)
    part = Partition(m, train)
    middle = [st for st in part.stages if not st.first and not st.last
              and all(m.is_moe_layer(i) for i in st.layers)]
    return {"analysed": middle[0].index, "moe_range": layer_range(tuple(s.index for s in middle)),
            "first": part.stages[0].index, "last": part.stages[-1].index,
            "moe_layers": len(middle[0].layers), "layout": part.layout}


def share_percent(part: int, whole: int) -> str:
    """``part`` as a percentage of ``whole``, one decimal (display only)."""
    from fractions import Fraction

    from ..units import fmt_decimal
    return fmt_decimal(Fraction(part * 100, whole), 1) + "%"


def problem_answers(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> dict[str, dict]:
    """Per-device parameters and weight bytes of the analysed stage for each worked problem,
    with the change from the base configuration (positive: more)."""
    m = load_model(model)
    stage = stage_names(m, train)["analysed"]
    base = table6_values(m, train, stage)
    out = {}
    for name, prob in problem_configs(train).items():
        v = table6_values(m, prob.train, stage)
        out[name] = {**prob.changed, "params": v["total"], "bytes": v["total_bytes"],
                     "delta_params": v["total"] - base["total"],
                     "delta_bytes": abs(v["total_bytes"] - base["total_bytes"]),
                     "experts": experts_per_device(m, prob.train, stage), "mla": v["mla"],
                     "label": prob.train.label()}
    return out
