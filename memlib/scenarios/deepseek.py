"""DeepSeek-V3's own training recipe as a configuration of any model, and what each of its memory
techniques does to the peak device.

The DeepSeek-V3 report (arXiv 2412.19437, §3.2–§3.3) trains on 2048 H800 GPUs (sold as 80 GB;
81,559 MiB as the driver reports): pipeline parallelism over 16 stages with the DualPipe schedule
(deepseek-ai/DualPipe), expert parallelism over 64 ranks, ZeRO-1 data parallelism and no tensor parallelism; bf16 AdamW moments
beside fp32 master weights and gradients; Linear inputs cached in FP8 (the attention output in
E5M6, the SwiGLU input in FP8 with its output recomputed); every RMSNorm and the MLA
up-projections recomputed in backward.  :func:`deepseek_recipe` is that recipe for a model: for
DeepSeek-V3 the report's setup with memlib's layout (:data:`V3_LAYOUT`, the report does not give
one), for another model the same recipe on a layout and an expert parallelism the model allows.

Everything is computed by :func:`memlib.device.estimate.estimate` under the ``megatron`` activation profile,
with the H800's capacity and (unless told otherwise) the low overhead preset, in exact integers.

>>> t = deepseek_recipe("deepseek-v3")
>>> t.label(), t.world_size, t.schedule.value, t.zero.value
('PP16@TP1@EP64@ETP1', 2048, 'dualpipe', 1)
>>> [s.key for s in ablation_steps(t)]
['baseline', 'dualpipe', 'zero1', 'bf16_moments', 'fp8_activations', 'recompute']
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ledgers.base import entry_bytes, fp8_cached
from ..config import ConfigError, ModelConfig, TrainingConfig, load_model
from ..model.profiles import act_profile
from ..device.estimate import Estimate, StageMemory, estimate
from ..device.overhead import DEVICE_MEMORY, OVERHEAD_PRESETS
from ..paper import is_paper_model, paper_training
from ..model.partition import balanced_layout
from ..config import ZeroStage
from ..config.precision import RECIPES
from .together import grid
from .uncertainty import judged

__all__ = ["GPU", "CAPACITY", "REPORT", "V3_LAYOUT", "V3_TRAIN", "CATEGORIES", "deepseek_recipe", "recipe_estimate",
           "Step", "ablation_steps", "ablation", "ablation_summary", "rank_rows", "peak", "rank_zero",
           "ledger_kind", "ledger_rows", "layer_totals", "overhead_range", "micro_batch_change", "answer",
           "attention_switch", "recipe_choices"]

#: the device of the report: H800, sold as 80 GB of HBM3; its capacity is what the driver reports
#: (:data:`memlib.device.overhead.DEVICE_MEMORY`)
GPU = "H800"
CAPACITY = DEVICE_MEMORY[GPU]

#: the report's training setup (arXiv 2412.19437 §3.2): 2048 GPUs as PP16 x DP128, EP64 over eight
#: nodes carved out of the data-parallel ranks, ZeRO-1, no TP; pre-training sequences of 4K tokens
REPORT = {"gpus": 2048, "pp": 16, "dp": 128, "tp": 1, "ep": 64, "zero": 1, "seq_len": 4096, "micro_batch": 1}

#: DeepSeek-V3's 61 layers over 16 stages (memlib's choice: the report gives no layout): the three
#: dense layers alone on stage 0 with the embedding, four layers on stages 1-14, two on stage 15
#: beside the head and the MTP module.  DualPipe puts stages 0 and 15 on rank 0.
V3_LAYOUT = (3,) + (4,) * 14 + (2,)

#: the report's configuration of DeepSeek-V3
V3_TRAIN = TrainingConfig(dp=REPORT["dp"], tp=REPORT["tp"], pp=REPORT["pp"], ep=REPORT["ep"], etp=1,
                          schedule="dualpipe", zero=REPORT["zero"], precision="deepseek-v3", recompute="deepseek",
                          profile="megatron", micro_batch=REPORT["micro_batch"], seq_len=REPORT["seq_len"],
                          layout=V3_LAYOUT)

#: the three categories a device's total is the sum of (the keys of the ablation's rows)
CATEGORIES = ("states", "activations", "overhead")


def deepseek_recipe(model: ModelConfig | str) -> TrainingConfig:
    """DeepSeek-V3's recipe for ``model``: :data:`V3_TRAIN` for DeepSeek-V3; for another model the same
    recipe (DualPipe, no TP, DP128, ZeRO-1, the ``deepseek-v3`` precision and ``deepseek``
    recomputation) on the largest even number of stages up to 16 that the layers allow, the balanced
    layout (:func:`memlib.model.partition.balanced_layout`) and EP the largest divisor of the routed
    experts not above 64 that divides DP (1 for a dense model)."""
    m = load_model(model)
    if is_paper_model(m):
        return V3_TRAIN
    pp = min(REPORT["pp"], m.num_hidden_layers)
    pp -= pp % 2                                   # DualPipe's two directions meet in the middle
    if pp < 2:
        raise ConfigError(f"num_hidden_layers={m.num_hidden_layers}: DualPipe needs at least two pipeline stages")
    dp = REPORT["dp"]
    ep = 1 if not m.has_moe else max(d for d in range(1, REPORT["ep"] + 1)
                                     if m.n_routed_experts % d == 0 and dp % d == 0)   # a dense model: EP 1
    return V3_TRAIN.with_(pp=pp, ep=ep, layout=balanced_layout(m.num_hidden_layers, pp))


def recipe_estimate(model: ModelConfig | str, train: TrainingConfig, overhead: str = "low") -> Estimate:
    """The estimate of ``train`` with the H800's capacity and the overhead preset ``overhead``."""
    return estimate(model, train, OVERHEAD_PRESETS[overhead], CAPACITY)


@dataclass(frozen=True)
class Step:
    """One step of the ablation: the configuration once a technique is switched on."""

    key: str
    label: str
    what: str
    targets: str | None     #: the category the technique exists to lower (``states``, ``activations``), or None
    train: TrainingConfig


def ablation_steps(train: TrainingConfig, m: ModelConfig | None = None) -> tuple[Step, ...]:
    """A naive baseline with ``train``'s parallel sizes and layout (1F1B, ZeRO-0, Megatron's fp32 master
    weights, gradients and moments, bf16 activations, nothing recomputed), then DualPipe, ZeRO-1, bf16
    moments, FP8 activations and the recomputation switched on in turn, ending at ``train``.  With the model
    ``m`` the steps are described in its own blocks (the MLA up-projections and the routed experts' ranks
    only where it has them; DeepSeek-V3's without it)."""
    mla, moe = (True, True) if m is None else (m.attention == "mla", m.has_moe)
    base = train.with_(schedule="1f1b", zero=0, precision="megatron", recompute="none")
    dual = base.with_(schedule=train.schedule)
    zero = dual.with_(zero=train.zero)
    return (
        Step("baseline", "naive baseline", "1F1B, ZeRO-0, fp32 master weights, gradients and AdamW moments, "
             "bf16 activations, no recomputation", None, base),
        Step("dualpipe", "+ DualPipe", "bidirectional schedule: every rank holds two model stages "
             "(rank 0: the first and the last)", None, dual),
        Step("zero1", "+ ZeRO-1", "optimizer states sharded over the data-parallel ranks"
             + (" (the EDP ranks for the routed experts)" if moe else ""), "states", zero),
        Step("bf16_moments", "+ BF16 moments", "AdamW moments in bf16 (master weights and gradients stay fp32)",
             "states", zero.with_(precision="paper")),
        Step("fp8_activations", "+ FP8 activations", "Linear inputs cached in FP8"
             + (" (the attention output in E5M6)" if mla else "")
             + (", the SwiGLU input in FP8 and the routed experts' SwiGLU output recomputed" if moe
                else " and the SwiGLU input in FP8"), "activations",
             zero.with_(precision=train.precision)),
        Step("recompute", "+ recompute norms" + (" and up-projections" if mla else ""), "RMSNorm outputs"
             + (" and the MLA up-projections" if mla else "") + " recomputed in backward: the full recipe",
             "activations", train),
    )


def _category(st: StageMemory, key: str) -> int:
    return st.model_states if key == "states" else st.bytes[key]


def _largest(st: StageMemory) -> str:
    return max(CATEGORIES, key=lambda k: _category(st, k))


def ablation(model: ModelConfig | str, train: TrainingConfig, overhead: str = "low") -> list[dict]:
    """One row per step of :func:`ablation_steps`: the peak device (its rank, model states, activations,
    overheads, allocated bytes and total, the micro-batches it holds, its parameters, whether it fits
    the H800 and by how much it is below (positive) or above it), the change of the total from the
    previous step (``None`` for the first), the ``verdict`` with memlib's measured errors
    (:func:`memlib.scenarios.uncertainty.judged`) and, per rank, whether the step lowered (or kept) the
    category it targets on every rank (``None`` for a step without a target)."""
    rows: list[dict] = []
    prev: Estimate | None = None
    for step in ablation_steps(train, load_model(model)):
        est = recipe_estimate(model, step.train, overhead)
        pk = est.peak
        lowers = None
        if step.targets is not None and prev is not None:
            lowers = all(_category(a, step.targets) <= _category(b, step.targets)
                         for a, b in zip(est.stages, prev.stages))
        rows.append({
            "key": step.key, "label": step.label, "what": step.what, "targets": step.targets, "train": step.train,
            "stage": pk.stage.index, "states": pk.model_states, "activations": pk.bytes["activations"],
            "overhead": pk.bytes["overhead"], "allocated": pk.allocated, "total": pk.total,
            "microbatches": pk.activations["microbatches_in_flight"], "parameters": pk.parameters,
            "fits": est.fits(pk), "verdict": judged(est, CAPACITY)["verdict"], "margin": CAPACITY - pk.total,
            "largest": _largest(pk),
            "change": None if prev is None else pk.total - prev.peak.total,
            "magnitude": None if prev is None else abs(pk.total - prev.peak.total),
            "lowers_target": lowers,
        })
        prev = est
    return rows


def ablation_summary(rows: list[dict]) -> dict:
    """What the ablation's rows say as a whole: the first step from which every later step fits
    (``None`` if the last does not), whether only the full recipe fits, and the total the techniques
    save from the baseline to the full recipe."""
    first_fit = None
    for i in range(len(rows)):
        if all(r["fits"] for r in rows[i:]):
            first_fit = rows[i]["key"]
            break
    return {"first_fit": first_fit, "only_last_fits": rows[-1]["fits"] and not any(r["fits"] for r in rows[:-1]),
            "saved": rows[0]["total"] - rows[-1]["total"], "none_fit": not any(r["fits"] for r in rows)}


def rank_rows(est: Estimate, capacity: int = CAPACITY) -> list[dict]:
    """One row per pipeline rank: the model stages it holds (with their layers and the micro-batches of
    each in flight at the rank's peak), its parameters and the bytes of every term, its total and
    whether it fits."""
    out = []
    for st in est.stages:
        out.append({
            "rank": st.stage.index,
            "chunks": [{"stage": c["stage"], "layers": len(c["layers"]), "in_flight": c["in_flight"]}
                       for c in st.activations["chunks"]],
            "parameters": st.parameters, "weights": st.bytes["parameters"], "gradients": st.bytes["gradients"],
            "optimizer": st.bytes["optimizer_states"], "states": st.model_states,
            "activations": st.bytes["activations"], "microbatches": st.activations["microbatches_in_flight"],
            "overhead": st.bytes["overhead"], "allocated": st.allocated, "total": st.total, "fits": st.total <= capacity,
        })
    return out


def peak(est: Estimate, capacity: int = CAPACITY) -> dict:
    """The peak device: its rank and every rank that needs as much, its terms, the micro-batches of
    each of its model stages in flight, whether every rank fits, and the margin to the capacity
    (positive: headroom; negative: how far over it is)."""
    pk = est.peak
    chunks = pk.activations["chunks"]
    return {
        "rank": pk.stage.index, "ranks": [st.stage.index for st in est.stages if st.total == pk.total],
        "states": pk.model_states, "activations": pk.bytes["activations"], "overhead": pk.bytes["overhead"],
        "allocated": pk.allocated, "total": pk.total, "fits": pk.total <= capacity, "margin": capacity - pk.total,
        "microbatches": pk.activations["microbatches_in_flight"],
        "chunks": [{"stage": c["stage"], "layers": len(c["layers"]), "in_flight": c["in_flight"]} for c in chunks],
        "all_fit": all(st.total <= capacity for st in est.stages), "largest": _largest(pk),
    }


def rank_zero(est: Estimate) -> dict:
    """Rank 0 beside the peak device: under DualPipe it holds the first and the last model stage, so
    the embedding, the head and the model's MTP modules.  Its total and layers, the peak's, and
    whether it is the lighter (``lighter``), with the difference."""
    r0, pk = est.stages[0], est.peak
    return {"total": r0.total, "layers": len(r0.stage.layers), "peak_layers": len(pk.stage.layers),
            "fewer_layers": len(r0.stage.layers) < len(pk.stage.layers), "lighter": r0.total < pk.total,
            "difference": pk.total - r0.total, "mtp": est.model.num_nextn_predict_layers,
            "is_peak": r0.total == pk.total}


def ledger_kind(model: ModelConfig | str) -> str:
    """The layer the ledger table shows: a MoE layer if the model has one."""
    return "moe" if "moe" in load_model(model).layer_kinds else "dense"


def _plain(train: TrainingConfig) -> TrainingConfig:
    """``train`` with bf16 activations and nothing recomputed (the ledger's reference column)."""
    return train.with_(precision="paper", recompute="none")


def ledger_rows(model: ModelConfig | str, train: TrainingConfig, kind: str | None = None) -> list[dict]:
    """The activation ledger of one layer of ``kind`` (default :func:`ledger_kind`) under ``train``'s
    profile: per saved tensor, its bytes per micro-batch on one device in bf16 with nothing recomputed
    (``plain``), and under ``train``'s recipe (``recipe``: 0 when recomputed), whether the recipe
    recomputes it and how it stores it (``fp8``, ``E5M6`` or the plain dtype)."""
    m = load_model(model)
    kind = kind or ledger_kind(m)
    est = recipe_estimate(m, train)
    plain = _plain(train)
    plain_rec = RECIPES[plain.precision]
    rows = []
    for e in act_profile(train.profile).layer(m, kind):
        dropped = est.policy.drops(e)
        fmt = (e.fp8_exception or "fp8") if fp8_cached(e, est.recipe) else ("bf16" if e.dtype == "act" else e.dtype)
        rows.append({"key": e.key, "name": e.name, "plain": int(entry_bytes(e, plain, plain_rec).xreplace(est.values)),
                     "recipe": 0 if dropped else int(entry_bytes(e, train, est.recipe).xreplace(est.values)),
                     "recomputed": dropped, "format": fmt})
    return rows


def layer_totals(model: ModelConfig | str, train: TrainingConfig, kind: str | None = None) -> dict[str, int]:
    """The sums of :func:`ledger_rows`: one layer's bytes per micro-batch, plain and under the recipe."""
    rows = ledger_rows(model, train, kind)
    plain = sum(r["plain"] for r in rows)
    rec = sum(r["recipe"] for r in rows)
    return {"plain": plain, "recipe": rec, "saved": plain - rec}


def overhead_range(model: ModelConfig | str, train: TrainingConfig) -> dict:
    """The peak device under the low and the high overhead presets: totals, and whether each fits."""
    out = {}
    for preset in ("low", "high"):
        est = recipe_estimate(model, train, preset)
        out[preset] = {"total": est.peak.total, "fits": est.fits(est.peak), "margin": CAPACITY - est.peak.total,
                       "rank": est.peak.stage.index}
    return out


#: the saved tensors whose recomputation the recipe's wording concerns: norm outputs and SwiGLU outputs (by key)
_NORM_OUTPUTS = ("norm_output", "_normed")
_SWIGLU_OUTPUTS = ("act_output",)


def recipe_choices(model: ModelConfig | str, train: TrainingConfig) -> dict:
    """What the recipe's one-line description leaves open, as ``train`` resolves it for ``model``: over the
    layer kinds the model has, the norm outputs and SwiGLU outputs the recompute policy re-makes
    (``recomputed``) and those it keeps (``kept``), each as (layer kind, the ledger's name of the tensor); the
    E5M6 tensors (``e5m6``: names; 12 bits an element, no scale counted); and, under DualPipe, what the peak
    rank's (``peak_rank``) optimizer states would shrink by if ZeRO sharded them over both mirrored copies of a
    stage, twice the data-parallel ranks, instead of over each copy's own (``mirror_saving``, bytes; 0 without
    DualPipe or ZeRO)."""
    m = load_model(model)
    out: dict = {"recomputed": [], "kept": [], "e5m6": []}
    for kind in dict.fromkeys(m.layer_kinds):
        for r in ledger_rows(m, train, kind):
            if r["key"].endswith(_NORM_OUTPUTS + _SWIGLU_OUTPUTS):
                out["recomputed" if r["recomputed"] else "kept"].append((kind, r["name"]))
            if r["format"] == "E5M6" and r["name"] not in out["e5m6"]:
                out["e5m6"].append(r["name"])
    est = recipe_estimate(m, train)
    i, saving = est.peak.stage.index, 0
    if train.schedule.parameter_copies > 1 and train.zero >= 1:
        wide = recipe_estimate(m, train.with_(dp=train.dp * train.schedule.parameter_copies))
        saving = est.stages[i].bytes["optimizer_states"] - wide.stages[i].bytes["optimizer_states"]
    out["mirror_saving"], out["peak_rank"] = saving, i
    return out


def micro_batch_change(model: ModelConfig | str, train: TrainingConfig, micro_batch: int) -> dict:
    """``train`` with ``micro_batch`` sequences per micro-batch: the new peak device (its rank, total,
    activations and model states), the same rank's activations and model states before the change,
    whether every rank's model states are unchanged (they do not depend on b), whether the new peak
    fits, and its margin to the capacity (positive: headroom; negative: how far over)."""
    before = recipe_estimate(model, train)
    est = recipe_estimate(model, train.with_(micro_batch=micro_batch))
    pk = est.peak
    same = before.stages[pk.stage.index]
    return {"micro_batch": micro_batch, "rank": pk.stage.index, "total": pk.total,
            "activations": pk.bytes["activations"], "activations_before": same.bytes["activations"],
            "states": pk.model_states, "states_before": same.model_states,
            "states_unchanged": all(a.model_states == b.model_states for a, b in zip(est.stages, before.stages)),
            "fits": est.fits(pk), "margin": CAPACITY - pk.total, "excess": abs(CAPACITY - pk.total)}


def answer(model: ModelConfig | str, overhead: str = "low") -> dict:
    """The book's answer in one place, for ``model``: the paper's layout (:func:`memlib.paper.paper_training`)
    under every ZeRO stage without recomputation (whether any fits, the smallest peak) and with ZeRO-1 and
    full recomputation (the peak, its stage, whether it fits); DeepSeek's recipe (:func:`deepseek_recipe`):
    its peak, rank, whether it fits and the verdict with memlib's measured errors (``recipe_band``,
    :func:`memlib.scenarios.uncertainty.judged`); both against the H800's capacity (the two capacities are one:
    chapters 7-8 and 9 size against the same device).  ``only_with_recompute`` is True when no ZeRO stage
    fits without recomputation and ZeRO-1 with full recomputation fits.

    >>> a = answer("deepseek-v3")
    >>> a["only_with_recompute"], a["paper_full_total"], a["recipe_fits"]
    (True, 56893303195, True)
    """
    m = load_model(model)
    est = estimate(m, paper_training(m), OVERHEAD_PRESETS[overhead])
    g = grid(est, CAPACITY, OVERHEAD_PRESETS[overhead], policies=("none", "full"))
    none = [g[(z, "none")] for z in ZeroStage]
    full = g[(ZeroStage.OS, "full")]
    rec_train = deepseek_recipe(m)
    rec = recipe_estimate(m, rec_train, overhead)
    return {
        "gpu": GPU, "capacity": CAPACITY, "paper_train": est.train,
        "none_fits": any(c.fits for c in none), "none_best": min(c.peak_total for c in none),
        "paper_full_total": full.peak_total, "paper_full_stage": full.peak, "paper_full_fits": full.fits,
        "only_with_recompute": full.fits and not any(c.fits for c in none),
        "recipe_train": rec_train, "recipe_total": rec.peak.total, "recipe_rank": rec.peak.stage.index,
        "recipe_fits": all(st.total <= CAPACITY for st in rec.stages), "recipe_margin": CAPACITY - rec.peak.total,
        "recipe_verdict": judged(rec, CAPACITY)["verdict"], "recipe_band": judged(rec, CAPACITY)["band"],
    }


def _core_attention_bytes(est: Estimate) -> int:
    """Bytes one layer's attention core (the entries the ``core_attn`` recompute module drops) saves for one
    micro-batch on one device of ``est``: a MoE layer's if the model has one."""
    kind = ledger_kind(est.model)
    return sum(int(entry_bytes(e, est.train, est.recipe).xreplace(est.values))
               for e in est.act_profile.layer(est.model, kind) if "core_attn" in e.modules)


def attention_switch(model: ModelConfig | str, overhead: str = "low") -> dict:
    """What changes between chapter 8 and chapter 9 besides the parallel layout: the activation profile.
    Chapter 8 counts the paper's eager attention (the ``paper`` profile: scores, softmax and dropout of
    b n_h s^2 elements kept for backward); chapter 9 counts Megatron-Core with Transformer Engine's fused
    attention (the ``megatron`` profile: no s^2 tensor, only softmax statistics).  Per profile the attention
    core's bytes of one layer and micro-batch on one device, and DeepSeek's ``deepseek`` recomputation (which
    keeps the attention core) with ZeRO-1 on the paper's layout (its peak, whether it fits) and in the
    recipe (its peak, whether it fits; the recipe's entries are None where it does not apply to the model)."""
    m = load_model(model)
    paper_est = estimate(m, paper_training(m), OVERHEAD_PRESETS[overhead])
    cell = grid(paper_est, CAPACITY, OVERHEAD_PRESETS[overhead], (ZeroStage.OS,), ("deepseek",))[
        (ZeroStage.OS, "deepseek")]
    out = {"paper_profile": paper_est.train.profile, "paper_core": _core_attention_bytes(paper_est),
           "paper_deepseek_total": cell.peak_total, "paper_deepseek_fits": cell.fits, "recipe_profile": None,
           "recipe_core": None, "recipe_total": None, "recipe_fits": None}
    try:
        rec = recipe_estimate(m, deepseek_recipe(m), overhead)
    except ConfigError:             # the recipe does not apply to the model: its half stays None
        return out
    return {**out, "recipe_profile": rec.train.profile, "recipe_core": _core_attention_bytes(rec),
            "recipe_total": rec.peak.total, "recipe_fits": all(st.total <= CAPACITY for st in rec.stages)}
