"""plan's step-time model against measured steps: SimuMax's 43 Megatron-LM runs on one node of eight B200s.

Each run (:data:`memlib.data.reference.SIMUMAX_B200_STEPS`) is predicted by :func:`memlib.search.plan.step_cost` from
its launcher's flags (:data:`memlib.data.reference.SIMUMAX_SETUP`: ZeRO-1, sequence parallelism, no recomputation, no
overlap, CP by all-to-all) with the model the launcher built (:func:`memlib.scenarios.measured.simumax_model`).  The
rows of a *group* share the model, the micro-batches per step and the sequence and differ in TP, PP, EP and CP, hence
in DP and the global batch: they are compared by throughput (tokens per second).  :func:`calibrate` fits the one
efficiency (:data:`memlib.search.cost.EFFICIENCY` holds B200's); :func:`validation` gives the figures the issue asks
for: pairs in the measured order, Spearman per model, the spread of predicted/measured within each group;
:func:`tie_band` the median error of the predicted ratio of two configurations (:data:`memlib.search.cost.TIE_BAND`).

>>> v = validation()
>>> v.right + v.wrong == len(v.pairs(0.02)) and v.right >= 35
True
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..config import TrainingConfig
from ..data.reference import SIMUMAX_B200_STEPS, SIMUMAX_SETUP
from ..search.cost import EFFICIENCY, CostModel
from ..search.plan import step_cost
from .measured import simumax_model

__all__ = ["Row", "predict", "calibrate", "Validation", "validation", "tie_band", "THRESHOLD", "GPU", "ModelFit",
           "by_model"]

#: the pairs counted: measured throughputs at least this far apart (closer ones are within the runs' noise)
THRESHOLD = 0.02
#: the GPU of the runs
GPU = SIMUMAX_SETUP["gpu"][0][0]


@dataclass(frozen=True)
class Row:
    """One measured run and its prediction."""

    run: dict
    terms: dict

    @property
    def group(self) -> tuple:
        return self.run["model"], self.run["micro_batches"], self.run["seq_len"]

    @property
    def tokens(self) -> int:
        return self.run["global_batch"] * self.run["seq_len"]

    @property
    def measured_s(self) -> float:
        return self.run["measured_ms"] / 1e3

    @property
    def predicted_s(self) -> float:
        return self.terms["step_s"]

    @property
    def measured_tps(self) -> float:
        return self.tokens / self.measured_s

    @property
    def predicted_tps(self) -> float:
        return self.tokens / self.predicted_s

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s


def train_of(run: dict) -> TrainingConfig:
    """The run's configuration, as its launcher set it."""
    return TrainingConfig(dp=run["dp"], tp=run["tp"], pp=run["pp"], ep=run["ep"], etp=1, cp=run["cp"], sp=run["tp"] > 1,
                          zero=1, precision="megatron", profile="megatron", micro_batch=run["micro_batch"],
                          seq_len=run["seq_len"], num_microbatches=run["micro_batches"], recompute="none",
                          cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")


def _cost(efficiency: float | None) -> CostModel:
    return CostModel.of(GPU, efficiency=efficiency, cp_comm="a2a")


def predict(efficiency: float | None = None) -> list[Row]:
    """Every run predicted (``efficiency``: None, the calibrated one)."""
    return [Row(run, _terms(i, efficiency)) for i, run in enumerate(SIMUMAX_B200_STEPS)]


@lru_cache(maxsize=None)
def _terms(i: int, efficiency: float | None) -> dict:
    run = SIMUMAX_B200_STEPS[i]
    return step_cost(simumax_model(run["model"], run["layers"], run["tp"]), train_of(run), _cost(efficiency))


def calibrate() -> float:
    """The efficiency with the least squared log error of the predicted steps over every run (golden-section search
    on [0.1, 1], to 1e-4)."""
    meas = np.log([r["measured_ms"] / 1e3 for r in SIMUMAX_B200_STEPS])

    def loss(e: float) -> float:
        return float(np.sum((np.log([x.predicted_s for x in predict(e)]) - meas) ** 2))
    lo, hi = 0.1, 1.0
    g = (math.sqrt(5) - 1) / 2
    while hi - lo > 1e-4:
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if loss(a) < loss(b) else (a, hi)
    return (lo + hi) / 2


def _spearman(x, y) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


@dataclass(frozen=True)
class Validation:
    """The model against the measured runs: the rows, and what the issue's targets read from them."""

    rows: tuple[Row, ...]
    efficiency: float

    def groups(self) -> dict[tuple, list[Row]]:
        out: dict[tuple, list[Row]] = {}
        for r in self.rows:
            out.setdefault(r.group, []).append(r)
        return out

    def pairs(self, threshold: float = 0.0) -> list[tuple[Row, Row, bool]]:
        """Each pair of a group whose measured throughputs differ by at least ``threshold``, and whether the model
        orders it as measured."""
        out = []
        for rs in self.groups().values():
            for a, b in itertools.combinations(rs, 2):
                if max(a.measured_tps, b.measured_tps) / min(a.measured_tps, b.measured_tps) - 1 < threshold:
                    continue
                out.append((a, b, (a.measured_tps - b.measured_tps) * (a.predicted_tps - b.predicted_tps) > 0))
        return out

    @property
    def right(self) -> int:
        return sum(ok for *_, ok in self.pairs(THRESHOLD))

    @property
    def wrong(self) -> int:
        return sum(not ok for *_, ok in self.pairs(THRESHOLD))

    @property
    def counted(self) -> int:
        """The pairs whose measured throughputs are at least THRESHOLD apart: :attr:`right` + :attr:`wrong`."""
        return len(self.pairs(THRESHOLD))

    def ranges(self) -> dict[str, float]:
        """What the chapter quotes of the whole validation: the lowest Spearman of a model, the largest spread within
        a group, the lowest and highest predicted/measured step of a run."""
        return {"spearman_low": min(self.spearman().values()), "spread_high": max(self.spread().values()),
                "ratio_low": min(r.ratio for r in self.rows), "ratio_high": max(r.ratio for r in self.rows)}

    def spearman(self) -> dict[str, float]:
        """Spearman's rank correlation of predicted and measured throughput over each model's runs."""
        out = {}
        for model in dict.fromkeys(r.run["model"] for r in self.rows):
            rs = [r for r in self.rows if r.run["model"] == model]
            out[model] = _spearman([r.measured_tps for r in rs], [r.predicted_tps for r in rs])
        return out

    def spread(self) -> dict[tuple, float]:
        """Within each group, the largest predicted/measured ratio over the smallest."""
        return {k: max(r.ratio for r in rs) / min(r.ratio for r in rs) for k, rs in self.groups().items()}


@lru_cache(maxsize=None)
def validation(efficiency: float | None = None) -> Validation:
    """The runs predicted with ``efficiency`` (None: the calibrated B200 one)."""
    eff = EFFICIENCY[GPU] if efficiency is None else efficiency
    return Validation(tuple(predict(efficiency)), eff)


def tie_band(v: Validation | None = None) -> float:
    """The median, over every pair of a group, of |predicted ratio of their steps per token / measured ratio - 1|."""
    v = v or validation()
    errs = [abs(math.exp(abs(math.log((a.predicted_tps / b.predicted_tps) / (a.measured_tps / b.measured_tps)))) - 1)
            for a, b, _ in v.pairs(0.0)]
    return float(np.median(errs))


@dataclass(frozen=True)
class ModelFit:
    """The validation's figures for one model's runs."""

    model: str
    layers: int
    runs: int
    right: int                #: its pairs (measured throughputs >= THRESHOLD apart) in the measured order
    pairs: int
    spearman: float
    low: float                #: the smallest and largest predicted/measured step
    high: float
    spread: float             #: the largest within-group spread of predicted/measured


def by_model(v: Validation | None = None) -> list[ModelFit]:
    """:class:`ModelFit` per model, in the table's order."""
    v = v or validation()
    rho, spread = v.spearman(), v.spread()
    out = []
    for model in rho:
        rows = [r for r in v.rows if r.run["model"] == model]
        counted = [ok for a, b, ok in v.pairs(THRESHOLD) if a.run["model"] == model]
        out.append(ModelFit(model, rows[0].run["layers"], len(rows), sum(counted), len(counted), rho[model],
                            min(r.ratio for r in rows), max(r.ratio for r in rows),
                            max(x for k, x in spread.items() if k[0] == model)))
    return out
