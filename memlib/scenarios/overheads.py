"""Overheads on one device (chapter 7): what each preset of :mod:`memlib.device.overhead` adds to a device,
the measured gap between reserved and allocated memory, and what exact accounting does not cover.

The paper's §6 gives ranges, not formulas: 5% to 30% fragmentation and 0.8 to 2 "GB" (GiB) of
communication buffers; memlib adds a CUDA-context term and carries the three as named terms
(``none``, ``low`` and ``high`` presets).  Every function here is exact: the overhead terms of a
device are :meth:`memlib.device.overhead.Overheads.terms` of its allocated bytes, the very rule
:func:`memlib.device.estimate.estimate` applies, so one estimate serves every preset.

>>> from memlib import PAPER_TRAINING, estimate
>>> base = estimate("deepseek-v3", base_training(PAPER_TRAINING))
>>> rows = preset_terms(base.stages[1])
>>> rows["none"]["overhead"], rows["low"]["total"]
(0, 56893303195)
"""
from __future__ import annotations

from fractions import Fraction

from ..config import ModelConfig, TrainingConfig, load_model
from ..device.estimate import StageMemory
from ..device.overhead import DEVICE_MEMORY, OVERHEAD_PRESETS, overheads
from ..data.reference import MEASURED_RESERVED, NCCL_BUFFSIZE, PYTORCH_ALLOCATOR
from ..config import ZeroStage

__all__ = ["CAPACITY_GPU", "CAPACITY_80GB", "TERMS", "PRESETS", "BASE_ZERO", "BASE_RECOMPUTE", "base_training", "preset_terms",
           "spread", "widest_term", "fits", "judged_fit", "band", "band_position", "measured_ratios", "RUN_OF_MODEL",
           "MOE_RUNS", "measured_run", "measured_fragmentation", "headroom", "NOT_COVERED"]

#: an "80 GB" device (H800, H100 SXM) as its driver reports it, 81,559 MiB
#: (:data:`memlib.device.overhead.DEVICE_MEMORY`).  The one capacity chapters 7 and 8 size against
#: (:mod:`memlib.scenarios.together` imports it from here).
CAPACITY_GPU = "H800"
CAPACITY_80GB = DEVICE_MEMORY[CAPACITY_GPU]

#: the overhead terms, in memlib's order, and the presets, lowest first
TERMS = ("cuda_context", "comm_buffers", "fragmentation")
PRESETS = ("none", "low", "high")

#: the device chapter 7 adds overheads to: ZeRO-1 (the distributed optimizer) with full
#: recomputation (the paper's "AC = Full"), the rest of the chapter's configuration unchanged
BASE_ZERO, BASE_RECOMPUTE = ZeroStage.OS, "full"


def base_training(train: TrainingConfig) -> TrainingConfig:
    """``train`` with ZeRO-1 and full recomputation: chapter 7's device, and the configuration
    chapter 8 compares the pipeline schedules on."""
    return train.with_(zero=int(BASE_ZERO), recompute=BASE_RECOMPUTE)


def preset_terms(stage: StageMemory) -> dict[str, dict[str, int | Fraction]]:
    """Per preset of :data:`PRESETS`: the device's allocated bytes, each overhead term, their sum
    (``overhead``), the total and the overhead's ``share`` of the total (a Fraction)."""
    out: dict[str, dict[str, int | Fraction]] = {}
    for p in PRESETS:
        terms = OVERHEAD_PRESETS[p].terms(stage.allocated)
        overhead = sum(terms[t] for t in TERMS)
        total = stage.allocated + overhead
        out[p] = {"allocated": stage.allocated, **terms, "overhead": overhead, "total": total,
                  "share": Fraction(overhead, total)}
    return out


def spread(stage: StageMemory) -> dict[str, int]:
    """How far each term moves from the ``low`` preset to the ``high`` one, in bytes."""
    rows = preset_terms(stage)
    return {t: rows["high"][t] - rows["low"][t] for t in TERMS}


def widest_term(stage: StageMemory) -> str:
    """The term whose range decides the spread of the totals: the largest :func:`spread`."""
    s = spread(stage)
    return max(TERMS, key=lambda t: s[t])


def fits(stage: StageMemory, preset: str = "low", capacity: int = CAPACITY_80GB) -> bool:
    """Whether the device's total under ``preset`` is at most ``capacity`` bytes."""
    return preset_terms(stage)[preset]["total"] <= capacity


def judged_fit(stage: StageMemory, model: ModelConfig, preset: str = "low", capacity: int = CAPACITY_80GB) -> dict:
    """:func:`fits` read with memlib's measured errors for ``model``'s family
    (:func:`memlib.scenarios.uncertainty.verdict` on the device's allocated bytes, ``preset``'s overheads beside
    them): the ``verdict`` (fits, marginal, does not fit) and the ``band`` it was read with."""
    from .uncertainty import measured_band, verdict

    b = measured_band(model)
    return {"verdict": verdict(stage.allocated, preset_terms(stage)[preset]["overhead"], capacity, b), "band": b}


def band() -> tuple[Fraction, Fraction]:
    """The fragmentation band of the presets (the paper's §6): ``low`` and ``high`` fractions."""
    return Fraction(OVERHEAD_PRESETS["low"].fragmentation), Fraction(OVERHEAD_PRESETS["high"].fragmentation)


def band_position(x: Fraction) -> str:
    """Where a fragmentation fraction sits in :func:`band`: ``below``, ``lower half``, ``upper half``
    or ``above``."""
    low, high = band()
    if x < low:
        return "below"
    if x > high:
        return "above"
    return "lower half" if x <= (low + high) / 2 else "upper half"


def measured_ratios() -> list[dict[str, object]]:
    """The measured runs of :data:`memlib.data.reference.MEASURED_RESERVED`: reserved and allocated GiB
    (exact Fractions of the printed decimals), the reserved memory beyond the allocated as a fraction
    of it (``excess``), and where that sits in the presets' fragmentation band."""
    rows = []
    for key, r in MEASURED_RESERVED["runs"].items():
        reserved, allocated = Fraction(r["reserved_gib"]), Fraction(r["allocated_gib"])
        excess = reserved / allocated - 1
        rows.append({"key": key, "model": r["model"], "parallel": r["parallel"], "reserved_gib": reserved,
                     "allocated_gib": allocated, "excess": excess, "position": band_position(excess)})
    return rows


#: the measured runs of a shipped model (a few of its layers), by preset name
RUN_OF_MODEL = {"deepseek-v3": "deepseekv3_l4_tp1_ep8_pp1_dp8_mbc4_cef",
                "deepseek-v2": "deepseekv2_tp1_ep8_pp1_dp8_l4_mbc4_cef",
                "llama-3-70b": "llama3_70b_l12_tp1_pp2_dp4_mbc4_cef"}
#: the measured runs of models with MoE layers (the others are of dense models)
MOE_RUNS = frozenset({RUN_OF_MODEL["deepseek-v3"], RUN_OF_MODEL["deepseek-v2"]})


def measured_run(model: ModelConfig | str) -> tuple[str, bool]:
    """The measured run to take a model's fragmentation from, and whether it is the model's own: its
    own run where one is published, else the run with the largest gap among those of its kind (MoE runs for a
    model with MoE layers, dense runs for a dense one: Llama-3-8B takes Llama3-70B's)."""
    m = load_model(model)
    if m.name in RUN_OF_MODEL:
        return RUN_OF_MODEL[m.name], True
    kind = [r for r in measured_ratios() if (r["key"] in MOE_RUNS) == m.has_moe]
    return max(kind or measured_ratios(), key=lambda r: r["excess"])["key"], False


def measured_fragmentation(stage: StageMemory, run: str) -> dict[str, object]:
    """The device with the ``low`` preset's fixed terms and the measured run's excess of reserved over
    allocated memory as its fragmentation fraction: the fraction, the terms, the total, and the total
    against the ``low`` preset's (``delta``)."""
    excess = next(r["excess"] for r in measured_ratios() if r["key"] == run)
    terms = overheads("low", fragmentation=excess).terms(stage.allocated)
    overhead = sum(terms[t] for t in TERMS)
    low_total = preset_terms(stage)["low"]["total"]
    total = stage.allocated + overhead
    return {"run": run, "fraction": excess, **terms, "overhead": overhead, "total": total,
            "low_total": low_total, "delta": total - low_total}


def headroom(stage: StageMemory, capacity: int = CAPACITY_80GB, preset: str = "low") -> dict[str, object]:
    """How large fragmentation may grow, with ``preset``'s fixed terms, before the device exceeds
    ``capacity``: ``room`` (bytes left for it, negative when even none is too much), ``max_fraction``
    (room over the allocated bytes, exact: fragmentation is the ceiling of fraction x allocated),
    whether that is above the band's high end, and whether the ``high`` preset fits."""
    o = OVERHEAD_PRESETS[preset]
    room = capacity - stage.allocated - o.cuda_context - o.comm_buffers
    max_fraction = Fraction(room, stage.allocated)
    return {"capacity": capacity, "room": room, "max_fraction": max_fraction,
            "above_band": max_fraction > band()[1], "high_fits": fits(stage, "high", capacity)}


_A = PYTORCH_ALLOCATOR

#: what exact accounting of tensors does not cover, each with the constants that govern it (bytes)
#: and its public source
NOT_COVERED = (
    {"key": "block_rounding", "what": "allocator block rounding",
     "constants": {"min_block": _A["kMinBlockSize"], "small_size": _A["kSmallSize"],
                   "small_buffer": _A["kSmallBuffer"], "min_large": _A["kMinLargeAlloc"],
                   "large_buffer": _A["kLargeBuffer"], "round_large": _A["kRoundLarge"]},
     "source": "PyTorch `c10/cuda/CUDACachingAllocator.cpp` (`kMinBlockSize`, `kSmallSize`, `kSmallBuffer`, "
               "`kMinLargeAlloc`, `kLargeBuffer`, `kRoundLarge`)"},
    {"key": "cached_blocks", "what": "cached but free blocks", "constants": {},
     "source": "PyTorch documentation, CUDA semantics: memory management (`PYTORCH_CUDA_ALLOC_CONF`)"},
    {"key": "nccl", "what": "NCCL buffers", "constants": {"buffsize": NCCL_BUFFSIZE},
     "source": "NCCL documentation, environment variables (`NCCL_BUFFSIZE`, `NCCL_NVLS_ENABLE`)"},
    {"key": "transient", "what": "transient peaks", "constants": {},
     "source": "not in the paper; memlib counts only what is saved between forward and backward"},
)
