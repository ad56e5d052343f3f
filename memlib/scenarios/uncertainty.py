"""How far to trust a verdict: the errors of memlib's peaks against measured ones, for models like the one at hand.

memlib's ``megatron`` profile predicts what ``torch.cuda.max_memory_allocated()`` reports (``peak_allocated``).
Chapter 11 and chapter 10 hold it against measured training steps: whole steps on an H200
(:mod:`.gpu_steps`), SimuMax's published runs (:mod:`.measured`) and Megatron-LM's functional tests
(:mod:`.functional`).  :func:`measured_band` gathers the errors of the runs whose model is of the same family
as the one at hand (:func:`memlib.scenarios.functional.model_family`), and :func:`verdict` reads a device's peak
against a capacity with that band: a device *fits* when it fits even if the truth lies at the band's far end,
*does not fit* when it would not fit even at its near end, and is *marginal* in between.  A model of a family
no measured run covers has no band: its verdict is the prediction's alone, and says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from ..config import ModelConfig, load_model
from ..device.estimate import Estimate
from .functional import cases as functional_cases
from .functional import model_family
from .gpu_steps import gpu_steps
from .measured import published_cases

__all__ = ["Band", "THIN_BAND_RUNS", "measured_band", "verdict", "judged", "judged_total", "accounting_gap", "VERDICTS"]

#: the three verdicts, from the safest
VERDICTS = ("fits", "marginal", "does not fit")

#: a band over fewer measured runs than this is thin: its ends are the extremes of a handful of errors, not a bound
#: the next run is likely to respect, and the book says so beside every verdict read with it
THIN_BAND_RUNS = 5


@dataclass(frozen=True)
class Band:
    """The errors (predicted - measured) / measured of memlib's ``peak_allocated`` over measured runs."""

    family: str
    low: Fraction | None           #: the most negative error (memlib short of the measurement); None: no run
    high: Fraction | None          #: the most positive
    n: int                         #: the runs
    sources: tuple[tuple[str, int], ...]   #: (where the runs come from, after a count: "on an H200"; how many)

    @property
    def thin(self) -> bool:
        """Whether the band rests on too few runs to be firm (:data:`THIN_BAND_RUNS`); a band of no run is no band."""
        return 0 < self.n < THIN_BAND_RUNS

    def allocated_range(self, predicted: int) -> tuple[int, int]:
        """The measured peaks the band allows for a prediction: predicted / (1 + high) to predicted / (1 + low),
        rounded outwards to whole bytes (the prediction itself without a band)."""
        if self.n == 0:
            return predicted, predicted
        lo = Fraction(predicted) / (1 + self.high)
        hi = Fraction(predicted) / (1 + self.low)
        return int(lo), -int(-hi // 1)


def measured_band(model: ModelConfig | str) -> Band:
    """The band of errors over the measured runs of ``model``'s family (every source, every run of it)."""
    return _band(model_family(load_model(model)))


@lru_cache(maxsize=None)
def _band(fam: str) -> Band:
    sources = []
    errors: list[Fraction] = []
    gpu = [s.error for s in gpu_steps() if model_family(s.estimate.model) == fam]
    sim = [c.error for c in published_cases() if model_family(c.model) == fam]
    fun = [c.error for c in functional_cases() if c.family == fam]
    for name, errs in (("on an H200", gpu), ("from SimuMax's published runs", sim),
                       ("from Megatron-LM's functional tests", fun)):
        if errs:
            sources.append((name, len(errs)))
            errors += errs
    if not errors:
        return Band(fam, None, None, 0, ())
    return Band(fam, min(errors), max(errors), len(errors), tuple(sources))


def verdict(allocated: int, rest: int, capacity: int, band: Band) -> str:
    """``fits``, ``marginal`` or ``does not fit``: a device whose ``peak_allocated`` memlib predicts as
    ``allocated``, with ``rest`` bytes beside it (the CUDA context, communication buffers, fragmentation), against
    ``capacity``, with the measured peak anywhere in the band's range (:meth:`Band.allocated_range`)."""
    lo, hi = band.allocated_range(allocated)
    if hi + rest <= capacity:
        return VERDICTS[0]
    if lo + rest > capacity:
        return VERDICTS[2]
    return VERDICTS[1]


def judged(est: Estimate, capacity: int) -> dict:
    """The book's peak device of ``est`` (the largest total) read against ``capacity`` with the band of its
    model's family: its ``peak_allocated`` (what ``max_memory_allocated`` would report), the ``rest`` of the
    book's total beside its allocated bytes (the overheads), the ``band``, the totals at the band's ``near`` and
    ``far`` ends, and the ``verdict``."""
    pk = est.peak
    allocated = est.peak_of(pk.stage.index).peak_allocated
    rest = pk.total - pk.allocated
    band = measured_band(est.model)
    lo, hi = band.allocated_range(allocated)
    return {"peak_allocated": allocated, "rest": rest, "band": band, "near": lo + rest, "far": hi + rest,
            "verdict": verdict(allocated, rest, capacity, band)}


def accounting_gap(est: Estimate) -> dict:
    """Why the book's allocated bytes of the peak device (model states, the micro-batches held, one layer's recompute
    working set: :attr:`~memlib.device.estimate.StageMemory.allocated`) and its ``peak_allocated`` (the step-by-step
    replay :func:`judged` reads) differ, term by term: ``book`` and ``replay``, the ``states`` beside the replay's
    ``persistent`` bytes (Megatron-Core's buffers where it keeps them), the micro-batches held in each
    (``book_held``, ``replay_held``), and the book's ``working_set`` beside the replay's ``transient`` terms at its
    busiest moment (name -> bytes, those that are not zero) and their sum, ``transient_total``."""
    pk = est.peak
    sp = est.peak_of(pk.stage.index)
    working = pk.activations["recompute_working_set"]
    return {"book": pk.allocated, "replay": sp.peak_allocated, "states": pk.model_states,
            "persistent": sum(sp.persistent.values()), "book_held": pk.bytes["activations"] - working,
            "replay_held": sum(sp.activations.values()), "working_set": working,
            "transient": {k: v for k, v in sp.transient.items() if v}, "transient_total": sum(sp.transient.values())}


def judged_total(est: Estimate, capacity: int) -> dict:
    """:func:`judged` on the book's own accounting, for a comparison of many configurations: the band applied to
    the peak device's allocated bytes as the book counts them (model states and activations, its ``allocated``)
    instead of the replayed ``peak_allocated`` (a replay of every step, too slow for a grid of twenty); the
    overheads beside them as ``rest``.  The same keys as :func:`judged`, ``peak_allocated`` being that count."""
    pk = est.peak
    band = measured_band(est.model)
    rest = pk.total - pk.allocated
    lo, hi = band.allocated_range(pk.allocated)
    return {"peak_allocated": pk.allocated, "rest": rest, "band": band, "near": lo + rest, "far": hi + rest,
            "verdict": verdict(pk.allocated, rest, capacity, band)}
