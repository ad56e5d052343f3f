"""What fits: every parallel configuration of a GPU count found by :func:`memlib.search.plan.search`, read against
the capacities of the cards the book sizes for.

The space searched is DeepSeek-V3's own options (:data:`SPACE`: the ``megatron`` profile, the ``deepseek-v3``
precision recipe, the ``deepseek`` recompute policy, the DualPipe schedule) with every PP, TP, CP, DP, EP, ETP,
ZeRO stage, micro-batch size and layout rule the search allows, at DeepSeek-V3's global batch and sequence
length.  One search per GPU count (kept for the process) answers every capacity: a configuration fits a card
when its exact peak (:attr:`memlib.device.estimate.Estimate.peak`, through :mod:`memlib.search.compiled`) is at most the card's
bytes.  The cards are :data:`memlib.device.overhead.DEVICE_MEMORY`'s distinct capacities.

>>> g = grid("deepseek-v3", 512)
>>> g.searched > 0 and bool(g.fits(10**15).all())
True
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ConfigError, ModelConfig, TrainingConfig, load_model
from ..device.estimate import estimate
from ..device.overhead import DEVICE_MEMORY
from ..paper import is_paper_model
from ..search.plan import Grid, search

__all__ = ["SPACE", "GPU_COUNTS", "REGION_FIX", "Card", "cards", "grid", "Fit", "fits", "Region", "region", "pareto",
           "recipe_rows", "RecipeRank", "recipe_rank", "has_recipe", "Split", "front_split"]

#: the options searched: DeepSeek-V3's (profile, precision recipe, recompute policy, schedule)
SPACE = dict(profiles=("megatron",), precisions=("deepseek-v3",), recomputes=("deepseek",), schedules=("dualpipe",))

#: the GPU counts the chapter asks about: DeepSeek-V3's 2048, a half and a quarter of it
GPU_COUNTS = (2048, 1024, 512)


@dataclass(frozen=True)
class Card:
    """One capacity of :data:`~memlib.device.overhead.DEVICE_MEMORY` and the cards that have it."""

    names: tuple[str, ...]
    capacity: int

    @property
    def label(self) -> str:
        return " / ".join(self.names)


def cards() -> list[Card]:
    """The distinct capacities of :data:`~memlib.device.overhead.DEVICE_MEMORY`, smallest first, each with its cards."""
    by_cap: dict[int, list[str]] = {}
    for name, cap in DEVICE_MEMORY.items():
        by_cap.setdefault(int(cap), []).append(name)
    return [Card(tuple(names), cap) for cap, names in sorted(by_cap.items())]


_GRIDS: dict[tuple, Grid] = {}


def grid(model: ModelConfig | str, gpus: int) -> Grid:
    """Every configuration of ``gpus`` GPUs in :data:`SPACE` with its exact peak and cost terms (kept)."""
    m = load_model(model)
    key = (m, int(gpus))
    if key not in _GRIDS:
        _GRIDS[key] = search(m, gpus, **SPACE)
    return _GRIDS[key]


@dataclass(frozen=True)
class Fit:
    """What fits ``gpus`` GPUs of one card: how many configurations, the best by the cost model."""

    gpus: int
    card: Card
    searched: int
    fitting: int
    best: TrainingConfig | None      #: the best fitting configuration (None: nothing fits)
    best_layout_rule: str | None
    best_peak: int | None            #: its peak bytes
    best_step_s: float | None        #: its estimated step time (the cost model's, seconds)
    smallest_peak: int | None        #: the smallest peak of any configuration searched

    @property
    def headroom(self) -> int | None:
        return None if self.best_peak is None else self.card.capacity - self.best_peak


def fits(model: ModelConfig | str, gpus_counts=GPU_COUNTS, card_list: list[Card] | None = None) -> list[Fit]:
    """One :class:`Fit` per GPU count and card."""
    out = []
    for gpus in gpus_counts:
        g = grid(model, gpus)
        smallest = int(min(g.peak)) if g.searched else None
        for card in card_list if card_list is not None else cards():
            order = g.ranking(card.capacity)
            if len(order):
                i = int(order[0])
                best, rule, peak, step = (g.train(i), g.labels("layout_rule")[i], int(g.peak[i]),
                                          float(g.cost["step_s"][i]))
            else:
                best = rule = peak = step = None
            out.append(Fit(gpus, card, g.searched, len(order), best, rule, peak, step, smallest))
    return out


#: the knobs the region fixes at DeepSeek-V3's choices (no context parallelism, ZeRO-1, one sequence per
#: micro-batch), so that it shows what TP, EP and PP do: with them free the smallest peak is nearly the same
#: everywhere (ZeRO-3 and a large CP shrink every device)
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
    """The rows that fit ``capacity`` and that no other fitting row beats on both peak memory and estimated step
    time (each at most, one strictly less), by ascending peak."""
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
            "zero": int(train.zero), "b": train.micro_batch, "vpp": train.vpp}
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
    layout_rule: str | None
    peak: int | None
    step_s: float | None
    faster_and_smaller: int   #: fitting rows with a smaller estimated step time and a smaller peak

    @property
    def on_front(self) -> bool:
        return self.index is not None and self.faster_and_smaller == 0


def recipe_rank(g: Grid, train: TrainingConfig, capacity: int) -> RecipeRank:
    """The rank of ``train``'s parallel configuration among the rows that fit ``capacity``."""
    order = g.ranking(capacity)
    mine = set(int(i) for i in recipe_rows(g, train))
    pos = next((k for k, i in enumerate(order) if int(i) in mine), None)
    if pos is None:
        return RecipeRank(None, len(order), None, None, None, None, 0)
    i = int(order[pos])
    fit = order
    peak = g.peak[fit]
    step = g.cost["step_s"][fit]
    beaten = int(np.count_nonzero((step < g.cost["step_s"][i]) & (peak < g.peak[i])))
    return RecipeRank(pos + 1, len(order), i, str(g.labels("layout_rule")[i]), int(g.peak[i]),
                      float(g.cost["step_s"][i]), beaten)


@dataclass(frozen=True)
class Split:
    """One configuration's peak device split into the book's categories (bytes): what :func:`memlib.device.estimate.estimate`
    gives for a row of a search."""

    train: TrainingConfig
    stage: int
    model_states: int
    activations: int
    overhead: int
    step_s: float

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.overhead


def front_split(g: Grid, rows) -> list[Split]:
    """The peak device of each of ``rows`` (e.g. :func:`pareto`'s) split into model states, activations and
    overheads by :func:`memlib.device.estimate.estimate` (its total is the row's peak)."""
    out = []
    for i in rows:
        train = g.train(int(i))
        pk = estimate(g.model, train, g.overhead).peak
        out.append(Split(train, pk.stage.index, pk.model_states, pk.bytes["activations"], pk.bytes["overhead"],
                         float(g.cost["step_s"][int(i)])))
    return out
