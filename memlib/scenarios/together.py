"""Putting it together (chapter 8): every stage's device under every ZeRO stage and recompute policy
against an H800 (81,559 MiB as its driver reports), what no recomputation costs, the pipeline
schedules compared, and the chapter's worked problems.

Every combination is one :func:`memlib.device.estimate.estimate` with the ``low`` overhead preset; a
combination *fits* when every stage's total, overheads included, is at most the capacity
(:data:`memlib.scenarios.overheads.CAPACITY_80GB`).  Build the grid once (:func:`grid`) and hand it
to the functions that read it.

>>> from memlib import PAPER_TRAINING, estimate
>>> g = grid(estimate("deepseek-v3", PAPER_TRAINING))
>>> g[(ZeroStage.OS, "full")].fits, g[(ZeroStage.NONE, "none")].fits, grid_counts(g)
(True, False, (8, 20))
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..ledgers.base import parse_policy
from ..config import ModelConfig, Schedule, TrainingConfig, load_model
from ..device.estimate import Estimate, StageMemory, estimate
from ..device.overhead import OVERHEAD_PRESETS, Overheads
from ..paper.activations import held_count_training
from ..model.partition import Partition
from ..config import ZeroStage
from ..device.timeline import OverTime, over_time
from .activations import MODULE_LIST, POLICIES_COMPARED, policies_compared
from .overheads import CAPACITY_80GB, base_training
from .uncertainty import judged_total

__all__ = ["CAPACITY_80GB", "OVERHEAD", "ZERO_STAGES", "MODULE_LIST", "POLICIES", "model_policies", "Outcome", "grid", "grid_counts",
           "fitting", "score_keys", "drops_scores", "no_recompute", "SCHEDULES", "MICROBATCHES_PER_STAGE", "step_training",
           "INTERLEAVED_CHUNKS", "interleaved_layout", "layout_split", "schedule_configs", "schedules", "costs_more",
           "DIAGRAM_PP", "DIAGRAM_MICROBATCHES", "diagram_configs", "memory_timeline", "first_idle",
           "schedule_counts",
           "largest_micro_batch", "policy_change", "fits_all", "held_count_grid", "routed_count_effect"]

#: the overheads of the whole chapter: the low ends of their ranges
OVERHEAD: Overheads = OVERHEAD_PRESETS["low"]

#: the ZeRO stages and recompute policies the chapter crosses (a module list last: Megatron-Core's
#: --recompute-modules with the attention core, the norms, the MLA up-projections and the experts'
#: activation function; a model's own, :func:`memlib.scenarios.activations.policies_compared`)
ZERO_STAGES = tuple(ZeroStage)
POLICIES = POLICIES_COMPARED


def model_policies(m) -> tuple[str, ...]:
    """:data:`POLICIES` for model ``m``: the module list keeps the modules of ``m``'s own blocks
    (:func:`memlib.model.blocks.own_modules`: no MLA up-projections for grouped-query attention)."""
    from ..model.blocks import own_modules

    return POLICIES[:-1] + (",".join(own_modules(MODULE_LIST.split(","), m)),)


def fits_all(est: Estimate, capacity: int = CAPACITY_80GB) -> bool:
    """Whether every stage's device of ``est`` fits ``capacity`` bytes, overheads included."""
    return all(st.total <= capacity for st in est.stages)


@dataclass(frozen=True)
class Outcome:
    """One configuration of a comparison (a cell of the ZeRO x recompute grid, or one schedule): its
    estimate, every stage's (pipeline rank's) total, the peak stage and whether every stage fits."""

    name: str                  #: its key in the comparison: the recompute policy, or the schedule
    est: Estimate
    totals: tuple[int, ...]
    peak: int
    peak_total: int
    fits: bool
    #: ``fits``, ``marginal`` or ``does not fit`` with memlib's measured errors for the model's family
    #: (:func:`memlib.scenarios.uncertainty.judged_total`): a fit inside the band is marginal
    verdict: str = ""

    @classmethod
    def of(cls, name: str, est: Estimate, capacity: int) -> "Outcome":
        pk = est.peak
        return cls(name, est, tuple(st.total for st in est.stages), pk.stage.index, pk.total, fits_all(est, capacity),
                   judged_total(est, capacity)["verdict"])

    @property
    def train(self) -> TrainingConfig:
        return self.est.train

    @property
    def zero(self) -> ZeroStage:
        return self.est.train.zero

    @property
    def peak_stage(self) -> StageMemory:
        return self.est.stages[self.peak]

    @property
    def last_rank(self) -> int:
        return len(self.totals) - 1


def grid(est: Estimate, capacity: int = CAPACITY_80GB, overhead: Overheads = OVERHEAD,
         zero_stages=ZERO_STAGES, policies=None) -> dict[tuple[ZeroStage, str], Outcome]:
    """(ZeRO stage, policy) -> :class:`Outcome` for ``est``'s configuration with each ZeRO stage and
    recompute policy (the model's :func:`~memlib.scenarios.activations.policies_compared` by default; ``est``
    itself serves the combination it already is)."""
    out = {}
    for z in zero_stages:
        for p in policies or policies_compared(est.model):
            t = est.train.with_(zero=z, recompute=p)
            e = est if (t == est.train and est.overhead == overhead) else estimate(est.model, t, overhead)
            out[(ZeroStage(z), p)] = Outcome.of(p, e, capacity)
    return out


def grid_counts(g: dict) -> tuple[int, int]:
    """(combinations that fit, combinations)."""
    return sum(c.fits for c in g.values()), len(g)


def fitting(g: dict) -> list[tuple[ZeroStage, str]]:
    """The combinations that fit, in grid order."""
    return [k for k, c in g.items() if c.fits]


# ------------------------------------------------------------------------------------------------
# no recomputation
# ------------------------------------------------------------------------------------------------
def score_keys(est: Estimate) -> set[str]:
    """Ledger keys of the attention core's tensors (scores, softmax, dropout: the entries the
    ``core_attn`` recompute module drops) in ``est``'s activation profile."""
    m = est.model
    return {e.key for kind in sorted(set(m.layer_kinds)) for e in est.act_profile.layer(m, kind)
            if "core_attn" in e.modules}


def drops_scores(est: Estimate, policy: str) -> bool:
    """Whether ``policy`` drops (recomputes) every attention-core tensor of a layer."""
    pol = parse_policy(policy)
    m = est.model
    entries = [e for kind in sorted(set(m.layer_kinds)) for e in est.act_profile.layer(m, kind)
               if "core_attn" in e.modules]
    return bool(entries) and all(pol.drops(e) for e in entries)


def no_recompute(g: dict, capacity: int = CAPACITY_80GB) -> dict[str, object]:
    """What no recomputation costs, read from the grid: per ZeRO stage whether it fits; the peak
    device under the strongest ZeRO stage (its model states, the micro-batches it holds, one
    micro-batch's activations and the attention-core part of them, both as held, and the held
    activations over ``capacity``); which policies fit with some ZeRO stage and whether each drops
    the attention core."""
    zs = [z for z in ZERO_STAGES if (z, "none") in g]
    cells = [g[(z, "none")] for z in zs]
    strongest = g[(zs[-1], "none")]
    est, i = strongest.est, strongest.peak
    st = est.stages[i]
    keys = score_keys(est)
    ex = est.stage_expressions(i, est.values)
    chunks = st.activations["chunks"]
    scores = [sum(int(x) for k, x in ex.chunks[c].items() if k in keys) for c in range(len(chunks))]
    held = sum(c["per_microbatch"] * c["in_flight"] for c in chunks)
    scores_held = sum(s * c["in_flight"] for s, c in zip(scores, chunks))
    order = list(policies_compared(est.model))
    policies = sorted({p for (_, p) in g}, key=order.index)
    return {
        "zero": zs[-1], "stage": i, "layers": len(st.stage.layers),
        "in_flight": st.activations["microbatches_in_flight"], "states": st.model_states,
        "per_microbatch": st.activations["per_microbatch"], "scores": sum(scores),
        "share": Fraction(sum(scores), st.activations["per_microbatch"]),
        "held": held, "scores_held": scores_held, "without_scores": held - scores_held,
        "held_over_capacity": Fraction(held, capacity), "held_exceeds": held > capacity,
        "total": st.total,
        "fits": {c.zero: c.fits for c in cells}, "n_fit": sum(c.fits for c in cells), "n": len(cells),
        "best": min(c.peak_total for c in cells), "worst": max(c.peak_total for c in cells),
        "policy_fits": {p: sum(g[(z, p)].fits for z in zs) for p in policies},
        "drops_scores": {p: drops_scores(est, p) for p in policies},
        "every_fitting_drops": all(drops_scores(est, p) for p in policies
                                   if any(g[(z, p)].fits for z in zs)),
    }


# ------------------------------------------------------------------------------------------------
# pipeline schedules
# ------------------------------------------------------------------------------------------------
#: the schedules compared, in order
SCHEDULES = tuple(Schedule)
#: the micro-batches of one step per pipeline stage, M = 2 PP for every schedule compared (GPipe holds all of them;
#: the others reach their peak with fewer and keep it), and the interleaved schedule's chunks
MICROBATCHES_PER_STAGE = 2
INTERLEAVED_CHUNKS = 2
#: the schedule diagrams: a small pipeline, so that every operation can be read, with M = 2 PP as well
DIAGRAM_PP = 4
DIAGRAM_MICROBATCHES = MICROBATCHES_PER_STAGE * DIAGRAM_PP


def diagram_configs(pp: int = DIAGRAM_PP, m: int = DIAGRAM_MICROBATCHES) -> dict[Schedule, TrainingConfig]:
    """The four schedules of :data:`SCHEDULES` on ``pp`` ranks with ``m`` micro-batches (interleaved:
    :data:`INTERLEAVED_CHUNKS` chunks per rank), for drawing their operations."""
    return {s: TrainingConfig(pp=pp, schedule=s, num_microbatches=m,
                              vpp=INTERLEAVED_CHUNKS if s is Schedule.INTERLEAVED else 1) for s in SCHEDULES}


def interleaved_layout(model: ModelConfig | str, train: TrainingConfig,
                       vpp: int = INTERLEAVED_CHUNKS) -> tuple[int, ...]:
    """Decoder layers per virtual stage for the interleaved schedule on ``train``'s PP ranks: as even as
    possible, the lighter virtual stages the first (it also holds the embedding) and the last ones
    (the head).  A model with fewer layers than virtual stages leaves those stages without a decoder
    layer (Megatron-Core's pipeline layouts allow empty stages).  Checked by building the partition.

    >>> lay = interleaved_layout("deepseek-v3", TrainingConfig(pp=16))
    >>> lay[:3], lay[-3:], sum(lay)
    ((1, 2, 2), (2, 1, 1), 61)
    """
    m = load_model(model)
    n, layers = train.pp * vpp, m.num_hidden_layers
    base, extra = divmod(layers, n)
    light = n - extra                   # virtual stages that get ``base`` layers: the first, then the last ones
    sizes = [base + 1] * n
    if light:
        sizes[0] = base
        for i in range(n - light + 1, n):
            sizes[i] = base
    layout = tuple(sizes)
    Partition(m, train.with_(schedule=Schedule.INTERLEAVED, vpp=vpp, layout=layout, num_microbatches=None))
    return layout


def layout_split(layout: tuple[int, ...]) -> str:
    """How a model's layers fall on the (virtual) stages of ``layout``: ``"empty"`` (some stage holds none),
    ``"even"`` (every stage the same) or ``"uneven"``.

    >>> layout_split((1, 2, 2, 1)), layout_split((3, 3)), layout_split((0, 1, 1, 0))
    ('uneven', 'even', 'empty')
    """
    return "empty" if min(layout) == 0 else ("even" if min(layout) == max(layout) else "uneven")


def step_training(train: TrainingConfig) -> TrainingConfig:
    """``train`` with the chapter's M = :data:`MICROBATCHES_PER_STAGE` PP micro-batches per step, the M of every
    schedule it compares (:func:`schedule_configs`)."""
    return train.with_(num_microbatches=MICROBATCHES_PER_STAGE * train.pp)


def schedule_configs(est: Estimate) -> dict[Schedule, TrainingConfig]:
    """The four schedules on ``est``'s configuration, each with the same M = 2 PP micro-batches per step: GPipe,
    1F1B, interleaved 1F1B with V = 2 and :func:`interleaved_layout`, DualPipe."""
    t = est.train
    m = step_training(t).num_microbatches
    return {
        Schedule.GPIPE: t.with_(schedule=Schedule.GPIPE, num_microbatches=m),
        Schedule.ONE_F_ONE_B: t.with_(schedule=Schedule.ONE_F_ONE_B, num_microbatches=m),
        Schedule.INTERLEAVED: t.with_(schedule=Schedule.INTERLEAVED, vpp=INTERLEAVED_CHUNKS, num_microbatches=m,
                                      layout=interleaved_layout(est.model, t)),
        Schedule.DUALPIPE: t.with_(schedule=Schedule.DUALPIPE, num_microbatches=m),
    }


def schedules(est: Estimate, capacity: int = CAPACITY_80GB, overhead: Overheads = OVERHEAD) -> dict[Schedule, Outcome]:
    """Each schedule of :data:`SCHEDULES` on :func:`~memlib.scenarios.overheads.base_training` of
    ``est``'s configuration (ZeRO-1, full recomputation), with ``overhead``."""
    base = estimate(est.model, base_training(est.train), overhead)
    out = {}
    for name, t in schedule_configs(base).items():
        e = base if t == base.train else estimate(est.model, t, overhead)
        out[name] = Outcome.of(name, e, capacity)
    return out


def memory_timeline(runs: dict[Schedule, Outcome], name: Schedule = Schedule.ONE_F_ONE_B) -> OverTime:
    """One iteration of schedule ``name`` of the comparison, every rank's memory at every step
    (:func:`memlib.device.timeline.over_time`, with the comparison's M micro-batches)."""
    return over_time(runs[name].est)


def first_idle(ot: OverTime, rank: int | None = None) -> dict | None:
    """The first stretch of one iteration in which rank ``rank`` (the peak rank by default) computes nothing
    (after its warm-up forwards, waiting for its first backward in 1F1B), and what its memory drops by there:
    ``start`` and ``end`` (slots), ``drop`` (allocated bytes during the step before it less those after it),
    ``working`` (the recompute working set of the chunk that step computed, held only while a chunk computes)
    and ``released`` (saved activations the step freed: none after a forward), so ``drop = working +
    released``; and ``held`` (the saved activations the rank keeps through the stretch).  None when the rank
    never waits."""
    r = ot.peak_rank if rank is None else rank
    rows = ot.rows[r]
    for a, b in zip(rows, rows[1:]):
        if b.slot.start > a.slot.end:
            return {"rank": r, "start": a.slot.end, "end": b.slot.start, "drop": a.allocated - a.allocated_after,
                    "working": a.working, "released": a.held - a.held_after, "held": a.held_after}
    return None


def costs_more(runs: dict[str, Outcome], than: str = "1f1b") -> dict[str, bool]:
    """Whether each schedule's peak device needs more than ``than``'s."""
    return {name: r.peak_total > runs[than].peak_total for name, r in runs.items()}


def schedule_counts(runs: dict[str, Outcome]) -> tuple[int, int]:
    """(schedules with which every stage fits, schedules)."""
    return sum(r.fits for r in runs.values()), len(runs)


# ------------------------------------------------------------------------------------------------
# worked problems
# ------------------------------------------------------------------------------------------------
def _peak_bytes(est: Estimate, i: int) -> dict[str, int]:
    st = est.stages[i]
    a = st.activations
    held = sum(c["per_microbatch"] * c["in_flight"] for c in a["chunks"])
    return {"held": held, "working": a["recompute_working_set"], "states": st.model_states,
            "overhead": st.bytes["overhead"], "total": st.total}


def largest_micro_batch(est: Estimate, capacity: int = CAPACITY_80GB,
                        overhead: Overheads = OVERHEAD) -> dict[str, object]:
    """The largest micro-batch ``b`` with which :func:`~memlib.scenarios.overheads.base_training` of
    ``est``'s configuration fits ``capacity`` (0 when even b = 1 does not), found by doubling and
    bisection (a device's bytes never fall as b grows); its peak, and the peak at b + 1 with what grew
    there (held micro-batches, the recompute working set, overheads) against the same stage at b."""
    t = base_training(est.train)

    def run(b: int) -> Estimate:
        return estimate(est.model, t.with_(micro_batch=b), overhead)

    cache: dict[int, Estimate] = {}

    def ok(b: int) -> bool:
        if b not in cache:
            cache[b] = run(b)
        return fits_all(cache[b], capacity)

    if not ok(1):
        lo, hi = 0, 1
    else:
        lo, hi = 1, 2
        while ok(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:              # lo fits, hi does not
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    over = cache[hi] if hi in cache else run(hi)
    j = over.peak.stage.index
    after = _peak_bytes(over, j)
    out = {"b": lo, "next": hi, "next_total": over.peak.total, "next_stage": j, "next_bytes": after}
    if lo:
        fit = cache[lo]
        before = _peak_bytes(fit, j)
        growth = {k: after[k] - before[k] for k in ("held", "working", "states", "overhead")}
        judged = judged_total(fit, capacity)         # the fit read with memlib's measured errors
        out.update({"total": fit.peak.total, "stage": fit.peak.stage.index, "growth": growth,
                    "grew_most": max(growth, key=lambda k: growth[k]), "verdict": judged["verdict"],
                    "band": judged["band"]})
    return out


def policy_change(g: dict, policy: str, zero: ZeroStage = ZeroStage.OS, other: ZeroStage = ZeroStage.OS_G_PARAMS,
                  capacity: int = CAPACITY_80GB) -> dict[str, object]:
    """``policy`` with ZeRO stage ``zero`` read from the grid: its peak, whether it fits, by how much it
    is over ``capacity`` (``excess``) or under it (``room``, the same with the other sign); and the same
    policy with ZeRO stage ``other``."""
    a, b = g[(zero, policy)], g[(other, policy)]
    return {"zero": zero, "other": other, "total": a.peak_total, "stage": a.peak, "fits": a.fits, "verdict": a.verdict,
            "excess": a.peak_total - capacity, "room": capacity - a.peak_total,
            "other_total": b.peak_total, "other_stage": b.peak, "other_fits": b.fits}


# ------------------------------------------------------------------------------------------------
# the routed-token count (the erratum s5-routed-tokens)
# ------------------------------------------------------------------------------------------------
def held_count_grid(g: dict, capacity: int = CAPACITY_80GB, overhead: Overheads = OVERHEAD) -> dict:
    """The grid ``g`` again with the routed-token entries holding what a device holds after the all-to-all
    instead of the paper's count (:func:`memlib.paper.activations.held_count_training`)."""
    est = next(iter(g.values())).est
    zs = sorted({z for z, _ in g})
    policies = [p for p in policies_compared(est.model) if (zs[0], p) in g]
    base = estimate(est.model, held_count_training(est), overhead)
    return grid(base, capacity, overhead, zs, policies)


def routed_count_effect(g: dict, held: dict, key: tuple = (ZeroStage.OS, "full")) -> dict[str, object]:
    """The grid under the paper's count (``g``) beside the grid under the held count (``held``): the
    combinations that fit under each, those that fit only under the paper's count, and the peak of ``key``
    (ZeRO-1 with full recomputation by default) under each, with its stage and the difference."""
    lost = [k for k in g if g[k].fits and not held[k].fits]
    return {"fit_paper": grid_counts(g)[0], "fit_held": grid_counts(held)[0], "n": len(g), "lost": lost,
            "key": key, "paper_total": g[key].peak_total, "held_total": held[key].peak_total,
            "paper_stage": g[key].peak, "held_stage": held[key].peak, "held_fits": held[key].fits,
            "paper_fits": g[key].fits,
            "difference": held[key].peak_total - g[key].peak_total}
