"""What fits, and what is fastest: every configuration of a GPU count in plan's practical space
(:data:`memlib.search.plan.PRACTICAL`), its exact peak against each GPU's capacity and its predicted step on that GPU
(:mod:`memlib.search.cost`).

One search per model and GPU count (kept for the process) gives the rows and their peaks; each GPU prices them
(:meth:`memlib.search.plan.Grid.priced`).  The GPUs are those both memlib's capacities
(:data:`memlib.device.overhead.DEVICE_MEMORY`) and the step-time model (:data:`memlib.search.cost.GPUS`) know.  For
DeepSeek-V3, its recipe is located in the same rules with its own options (:data:`RECIPE_SPACE`) on its report's
H800s, and its predicted step set against the one its report's GPU-hours imply.

>>> g = grid("deepseek-v2-lite", 64)
>>> g.searched > 0 and bool(g.fits(10**15).all())
True
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ConfigError, ModelConfig, TrainingConfig, load_model
from ..data.reference import DEEPSEEK_V3_TRAINING
from ..device.overhead import DEVICE_MEMORY
from ..paper import is_paper_model
from ..search.cost import GPUS, TERMS, TIE_BAND, CostModel
from ..search.plan import PRACTICAL, Grid, SearchSpace, search, step_cost
from .deepseek import CAPACITY as RECIPE_CAPACITY, GPU as RECIPE_GPU, deepseek_recipe

__all__ = ["SPACE", "RECIPE_SPACE", "GPU_COUNTS", "REGION_FIX", "Card", "cards", "card", "grid", "Fit", "fits",
           "Region", "region", "pareto", "fastest", "recipe_rows", "RecipeRank", "recipe_rank", "has_recipe",
           "implied_step", "Memory", "memory_buys", "FIRST_GPU", "recipe", "recipe_grid", "terms",
           "RecipeStep", "recipe_step", "best_verdict"]

#: the options searched: Megatron-LM's (the megatron profile and precision recipe, no, selective or full
#: recomputation, its 1F1B and interleaved schedules), in the practical space's rules
SPACE = dict(profiles=("megatron",), precisions=("megatron",), recomputes=("none", "selective", "full"),
             schedules=("1f1b", "interleaved"))
#: DeepSeek-V3's own options: its precision recipe and recomputation, and DualPipe beside Megatron-LM's schedules
RECIPE_SPACE = dict(SPACE, precisions=("deepseek-v3",), recomputes=("deepseek",),
                    schedules=("1f1b", "interleaved", "dualpipe"))

#: the GPU counts the chapter asks about: DeepSeek-V3's 2048 and a quarter of it
GPU_COUNTS = (2048, 512)
#: the GPU the searches are first priced on (the others reprice the same rows)
FIRST_GPU = "H100"


@dataclass(frozen=True)
class Card:
    """A GPU: its name and the capacity its driver reports."""

    name: str
    capacity: int


def cards() -> list[Card]:
    """The GPUs both :data:`~memlib.device.overhead.DEVICE_MEMORY` and :data:`~memlib.search.cost.GPUS` know, smallest
    capacity first (then by name)."""
    return sorted((Card(n, int(DEVICE_MEMORY[n])) for n in GPUS if n in DEVICE_MEMORY),
                  key=lambda c: (c.capacity, c.name))


def card(name: str) -> Card:
    return next(c for c in cards() if c.name == name)


_GRIDS: dict[tuple, Grid] = {}


def grid(model: ModelConfig | str, gpus: int, gpu: str = FIRST_GPU, options: dict | None = None) -> Grid:
    """Every configuration of ``gpus`` GPUs in the practical space with ``options`` (:data:`SPACE`), its exact peak,
    priced on ``gpu`` (kept)."""
    m = load_model(model)
    opts = SPACE if options is None else options
    key = (m, int(gpus), tuple(sorted((k, v) for k, v in opts.items())))
    if (key, gpu) not in _GRIDS:
        if (key, FIRST_GPU) not in _GRIDS:
            _GRIDS[(key, FIRST_GPU)] = search(m, gpus, SearchSpace(**opts, rules=PRACTICAL), cost=CostModel.of(FIRST_GPU))
        _GRIDS[(key, gpu)] = _GRIDS[(key, FIRST_GPU)].priced(CostModel.of(gpu))
    return _GRIDS[(key, gpu)]


def fastest(g: Grid, capacity: int, limit: int | None = None) -> np.ndarray:
    """The rows that fit ``capacity`` whose predicted step is within the tie band of the fastest one's, fastest
    first (at most ``limit``)."""
    order = g.ranking(capacity)
    if not len(order):
        return order
    step = g.cost["step_s"][order]
    tied = order[step <= (1 + TIE_BAND) * step[0]]
    return tied if limit is None else tied[:limit]


@dataclass(frozen=True)
class Fit:
    """What fits ``gpus`` GPUs of one card, and the fastest of it by the step-time model."""

    gpus: int
    card: Card
    searched: int
    fitting: int
    best: TrainingConfig | None      #: the fastest fitting configuration (None: nothing fits)
    best_layout_rule: str | None
    best_peak: int | None            #: its peak bytes
    best_step_s: float | None        #: its predicted step (seconds)
    tied: int                        #: fitting configurations within the tie band of it
    smallest_peak: int | None        #: the smallest peak of any configuration searched

    @property
    def headroom(self) -> int | None:
        return None if self.best_peak is None else self.card.capacity - self.best_peak


def fits(model: ModelConfig | str, gpus_counts=GPU_COUNTS, card_list: list[Card] | None = None) -> list[Fit]:
    """One :class:`Fit` per GPU count and card."""
    out = []
    for gpus in gpus_counts:
        for c in card_list if card_list is not None else cards():
            g = grid(model, gpus, c.name) if c.name in GPUS else grid(model, gpus)
            smallest = int(min(g.peak)) if g.searched else None
            order = g.ranking(c.capacity)
            if len(order):
                i = int(order[0])
                best, rule, peak, step = (g.train(i), str(g.labels("layout_rule")[i]), int(g.peak[i]),
                                          float(g.cost["step_s"][i]))
                tied = len(fastest(g, c.capacity))
            else:
                best = rule = peak = step = None
                tied = 0
            out.append(Fit(gpus, c, g.searched, len(order), best, rule, peak, step, tied, smallest))
    return out


def best_verdict(model: ModelConfig | str, f: Fit) -> str | None:
    """The fastest configuration of ``f`` against its card with memlib's measured errors for the model's family
    (:func:`memlib.scenarios.uncertainty.judged_total`): ``fits``, ``marginal`` (within the error of the card) or
    ``does not fit``; None where nothing fits."""
    from ..device.estimate import estimate
    from .uncertainty import judged_total

    if f.best is None:
        return None
    return judged_total(estimate(load_model(model), f.best), f.card.capacity)["verdict"]


@dataclass(frozen=True)
class Memory:
    """What a card with more memory buys over a smaller one on the same GPU count: the configurations that fit and the
    fastest predicted step on each, and on the small card's GPU priced as the large card's compute (the memory alone:
    :attr:`same_gpu_step_s`, the large capacity's fastest row priced on the small card's GPU)."""

    gpus: int
    small: Fit
    large: Fit
    same_gpu_step_s: float | None

    @property
    def memory_gain(self) -> float | None:
        """How much shorter the fastest step is with the large card's memory alone (the small card's GPU), a fraction
        of the small card's fastest step."""
        if self.small.best_step_s is None or self.same_gpu_step_s is None:
            return None
        return 1 - self.same_gpu_step_s / self.small.best_step_s

    @property
    def gain(self) -> float | None:
        """How much shorter the large card's fastest step is than the small card's (memory and GPU together)."""
        if self.small.best_step_s is None or self.large.best_step_s is None:
            return None
        return 1 - self.large.best_step_s / self.small.best_step_s

    @property
    def more_fit(self) -> int:
        return self.large.fitting - self.small.fitting


def memory_buys(model: ModelConfig | str, gpus: int, small: str, large: str) -> Memory:
    """:class:`Memory` of ``large`` over ``small`` (card names) on ``gpus`` GPUs."""
    fs, fl = fits(model, (gpus,), [card(small), card(large)])
    g = grid(model, gpus, small)
    order = g.ranking(card(large).capacity)
    return Memory(gpus, fs, fl, float(g.cost["step_s"][order[0]]) if len(order) else None)


#: the knobs the region fixes at DeepSeek-V3's choices (no context parallelism, ZeRO-1, one sequence per
#: micro-batch), so that it shows what TP, EP and PP do
REGION_FIX = {"cp": 1, "zero": 1, "b": 1}


@dataclass(frozen=True)
class Region:
    """The smallest peak over the knobs left free (ETP, the layout rule; DP follows) for each (TP, EP, PP) the
    search holds, the others at ``fix``: ``peak[(tp, ep, pp)]`` in bytes."""

    tps: tuple[int, ...]
    eps: tuple[int, ...]
    pps: tuple[int, ...]
    peak: dict[tuple[int, int, int], int]
    fix: tuple[tuple[str, int], ...] = ()

    def line(self, tp: int, ep: int) -> tuple[list[int], list[int]]:
        """(PP sizes, smallest peaks) of one TP and EP, PP ascending (the PP sizes the search holds for them)."""
        pts = sorted((pp, v) for (t, e, pp), v in self.peak.items() if t == tp and e == ep)
        return [p for p, _ in pts], [v for _, v in pts]


def region(g: Grid, fix=None) -> Region:
    """The smallest peak of each (TP, EP, PP) of a search over the rows with the knobs of ``fix`` (default
    :data:`REGION_FIX`; ``{}``: none fixed) at its values (exact integers)."""
    fix = dict(REGION_FIX if fix is None else fix)
    sel = np.ones(g.searched, dtype=bool)
    for k, v in fix.items():
        sel &= g.column(k) == v
    tp, ep, pp = g.column("tp")[sel], g.column("ep")[sel], g.column("pp")[sel]
    peaks = g.peak[sel]
    keys = np.stack([tp, ep, pp], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    best = np.full(len(uniq), np.iinfo(np.int64).max, dtype=np.int64) if peaks.dtype != object else \
        np.full(len(uniq), None, dtype=object)
    if peaks.dtype == object:
        for k, p in zip(inverse.reshape(-1), peaks):
            best[k] = p if best[k] is None else min(best[k], p)
    else:
        np.minimum.at(best, inverse.reshape(-1), peaks)
    peak = {(int(a), int(b), int(c)): int(v) for (a, b, c), v in zip(uniq, best)}
    return Region(tuple(sorted({k[0] for k in peak})), tuple(sorted({k[1] for k in peak})),
                  tuple(sorted({k[2] for k in peak})), peak, tuple(sorted(fix.items())))


def pareto(g: Grid, capacity: int) -> np.ndarray:
    """The rows that fit ``capacity`` and that no other fitting row beats on both peak memory and predicted step
    (each at most, one strictly less), by ascending peak."""
    idx = np.flatnonzero(g.fits(capacity))
    if not len(idx):
        return idx
    peak = g.peak[idx]
    step = g.cost["step_s"][idx]
    order = np.lexsort((step, peak if peak.dtype != object else np.array([int(p) for p in peak], dtype=object)))
    out, best = [], None
    for j in order:
        if best is None or step[j] < best:
            out.append(idx[j])
            best = step[j]
    return np.array(out, dtype=np.int64)


def has_recipe(model: ModelConfig | str) -> bool:
    """Whether the chapter locates DeepSeek-V3's own recipe (only for the paper's model: the recipe is DeepSeek-V3's)."""
    return is_paper_model(load_model(model))


def recipe_rows(g: Grid, train: TrainingConfig) -> np.ndarray:
    """The rows of a search with ``train``'s parallel configuration (PP, TP, CP, DP, EP, ETP, ZeRO, b, schedule,
    V, precision, recompute), whatever their layout rule."""
    if train.world_size != g.gpus:
        raise ConfigError(f"world_size={train.world_size} of the recipe must be the search's gpus={g.gpus}")
    want = {"pp": train.pp, "tp": train.tp, "cp": train.cp, "dp": train.dp, "ep": train.ep, "etp": train.etp,
            "zero": train.zero, "b": train.micro_batch, "vpp": train.vpp}
    ok = np.ones(g.searched, dtype=bool)
    for k, v in want.items():
        ok &= g.column(k) == v
    for k, v in (("schedule", train.schedule.value), ("precision", train.precision), ("recompute", train.recompute)):
        ok &= g.labels(k) == v
    return np.flatnonzero(ok)


@dataclass(frozen=True)
class RecipeRank:
    """Where a recipe's parallel configuration stands among the configurations that fit one capacity."""

    rank: int | None          #: 1-based, by :meth:`memlib.search.plan.Grid.ranking` (None: it does not fit)
    fitting: int
    index: int | None         #: its row (the best ranked of its layout rules)
    best: int | None          #: the fastest fitting row
    layout_rule: str | None
    peak: int | None
    step_s: float | None
    tied: bool                #: within the tie band of the fastest
    faster_and_smaller: int   #: fitting rows with a shorter predicted step and a smaller peak

    @property
    def on_front(self) -> bool:
        return self.index is not None and self.faster_and_smaller == 0


def recipe_rank(g: Grid, train: TrainingConfig, capacity: int) -> RecipeRank:
    """The rank of ``train``'s parallel configuration among the rows that fit ``capacity``."""
    order = g.ranking(capacity)
    mine = set(int(i) for i in recipe_rows(g, train))
    pos = next((k for k, i in enumerate(order) if int(i) in mine), None)
    best = int(order[0]) if len(order) else None
    if pos is None:
        return RecipeRank(None, len(order), None, best, None, None, None, False, 0)
    i = int(order[pos])
    step = g.cost["step_s"][order]
    beaten = int(np.count_nonzero((step < g.cost["step_s"][i]) & (g.peak[order] < g.peak[i])))
    return RecipeRank(pos + 1, len(order), i, best, str(g.labels("layout_rule")[i]), int(g.peak[i]),
                      float(g.cost["step_s"][i]), bool(g.cost["step_s"][i] <= (1 + TIE_BAND) * step[0]), beaten)


def terms(g: Grid, i: int) -> dict[str, float]:
    """Row ``i``'s step-time terms (seconds; ``bubble`` a fraction)."""
    return {k: float(x[int(i)]) for k, x in g.cost.items()}


def recipe_grid(model: ModelConfig | str) -> Grid:
    """The recipe's GPU count in :data:`RECIPE_SPACE`, priced on its report's GPU."""
    return grid(model, deepseek_recipe(model).world_size, RECIPE_GPU, RECIPE_SPACE)


def recipe(model: ModelConfig | str) -> RecipeRank:
    """Where DeepSeek-V3's recipe stands on its report's GPUs (:data:`memlib.scenarios.deepseek.CAPACITY`)."""
    return recipe_rank(recipe_grid(model), deepseek_recipe(model), RECIPE_CAPACITY)


def implied_step() -> float:
    """The step DeepSeek-V3's report implies (seconds): its H800 GPU-hours per trillion tokens x the tokens of a step
    (its global batch of sequences) over its GPUs (:data:`memlib.data.reference.DEEPSEEK_V3_TRAINING`)."""
    r = DEEPSEEK_V3_TRAINING
    per_token = r["gpu_hours_per_trillion_tokens"] * 3600 / 1e12
    return per_token * r["global_batch"] * r["seq_len"] / r["gpus"]


@dataclass(frozen=True)
class RecipeStep:
    """DeepSeek-V3's recipe priced on its report's GPUs beside the fastest configuration of the same options, and the
    step its report's GPU-hours imply."""

    rank: RecipeRank
    recipe: dict            #: its terms
    best: dict              #: the fastest fitting configuration's terms
    best_train: TrainingConfig
    implied_s: float
    one_f_one_b: dict       #: its terms under 1F1B (the same ranks, no DualPipe overlap)

    @property
    def over_report(self) -> float:
        """Predicted over implied step."""
        return self.recipe["step_s"] / self.implied_s

    def largest_difference(self) -> str:
        """The term (of :data:`memlib.search.cost.TERMS`) in which the recipe and the fastest differ most."""
        return max(TERMS, key=lambda k: abs(self.recipe[k] - self.best[k]))

    def largest_term(self) -> str:
        """The recipe's largest term."""
        return max(TERMS, key=lambda k: self.recipe[k])


def recipe_step(model: ModelConfig | str) -> RecipeStep | None:
    """:class:`RecipeStep` of DeepSeek-V3 (None for another model, or where the recipe does not fit)."""
    if not has_recipe(model):
        return None
    g = recipe_grid(model)
    r = recipe_rank(g, deepseek_recipe(model), RECIPE_CAPACITY)
    if r.index is None:
        return None
    train = g.train(r.index)
    plain = step_cost(g.model, train.with_(schedule="1f1b"), g.cost_model, g.overhead)
    return RecipeStep(r, terms(g, r.index), terms(g, r.best), g.train(r.best), implied_step(), plain)
