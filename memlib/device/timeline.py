"""Memory over time: one training iteration replayed step by step on every pipeline rank, each step
placed on a common clock, with the bytes the rank has allocated during it.

:func:`memlib.device.schedule.timeline` gives each rank's steps and the micro-batches it holds per model
chunk in each.  Two things are added here:

* **a clock** (:func:`clock`): each rank runs its steps in order, each as soon as the rank is free
  and the step's inputs exist: a forward waits for the same micro-batch's forward on the pipeline
  stage before it, a backward for the same micro-batch's backward on the stage after it.  An
  operation lasts :data:`DURATION` slots (a forward 1, a backward 2, a backward whose weight
  gradient is deferred 1 and that weight gradient 1, the usual unit costs of the zero-bubble
  literature) for a whole pipeline stage, 1/V of that for a chunk of the interleaved schedule; an
  overlapped forward-and-backward pair lasts the sum.  The clock only places the
  steps: the memory of a step does not depend on it.
* **memory** (:func:`memory_over_time`): during a step a rank holds its model states, the
  activations of the micro-batches the schedule's moment counts (per chunk, the per-micro-batch bytes
  :func:`memlib.device.estimate.estimate` computed) and the recompute working set of the chunk computing (the
  larger one in an overlapped pair); after the step it holds what the step's backwards did not
  release, nothing computing.  The largest value during a step is exactly the estimate's activations
  at the stage's peak (the tests check it for every schedule).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..config import Schedule, TrainingConfig
from .estimate import Estimate
from .schedule import Op, Step, default_microbatches, steps, timeline

__all__ = ["DURATION", "Slot", "MemoryStep", "position", "microbatch", "op_duration", "duration", "clock", "makespan",
           "memory_over_time", "peak_step", "releases", "OverTime", "over_time"]

#: slots an operation lasts: ``B*`` is a backward whose weight gradient is deferred to a ``W``
DURATION = {"F": 1, "B": 2, "B*": 1, "W": 1}


def _kind(op: Op) -> str:
    return "B*" if op.kind == "B" and op.deferred else op.kind


def op_duration(train: TrainingConfig, op: Op) -> int | Fraction:
    """Slots ``op`` lasts: :data:`DURATION` for a whole pipeline stage; an interleaved chunk is 1/V of
    a stage, and lasts 1/V as long."""
    d = DURATION[_kind(op)]
    return Fraction(d, train.vpp) if Schedule(train.schedule) is Schedule.INTERLEAVED else d


def duration(train: TrainingConfig, step: Step) -> int | Fraction:
    """Slots one step lasts: the sum of its operations (an overlapped pair runs both)."""
    return sum(op_duration(train, op) for op in step)


def position(train: TrainingConfig, rank: int, chunk: int) -> tuple[int, int]:
    """(direction, pipeline position) of ``chunk`` of ``rank``: where a micro-batch through it sits in
    its pipeline.  One direction except under DualPipe, whose direction 0 runs model stage s on rank
    s and direction 1 on rank PP - 1 - s; interleaved chunk c of rank r is virtual stage c PP + r."""
    p = train.pp
    stage = train.schedule.rank_chunks(rank, p, train.vpp)[chunk]
    if Schedule(train.schedule) is Schedule.DUALPIPE:
        return (0 if stage == rank else 1), stage
    return 0, stage


def microbatch(train: TrainingConfig, op: Op) -> int:
    """The micro-batch ``op`` runs (within its direction).  The interleaved replay numbers its
    operations k = 0, 1, ... over all chunks; Megatron-Core runs micro-batch
    (k // (PP V)) PP + k mod PP there."""
    if Schedule(train.schedule) is Schedule.INTERLEAVED:
        p, v = train.pp, train.vpp
        return (op.mb // (p * v)) * p + op.mb % p
    return op.mb


@dataclass(frozen=True)
class Slot:
    """One step of one rank placed on the clock: it runs from ``start`` to ``end`` (slots)."""

    rank: int
    index: int        #: the step's index in the rank's steps
    ops: Step
    start: int | Fraction
    end: int | Fraction


def clock(train: TrainingConfig, m: int | None = None) -> list[list[Slot]]:
    """Every rank's steps of one iteration of ``m`` micro-batches (default
    :func:`~memlib.device.schedule.default_microbatches`) placed on the clock, rank by rank."""
    m = default_microbatches(train) if m is None else m
    p = train.pp
    last = p * (train.vpp if Schedule(train.schedule) is Schedule.INTERLEAVED else 1) - 1
    orders = [steps(train, r, m) for r in range(p)]
    done: dict[tuple, int] = {}          # (kind, direction, micro-batch, position) -> end
    free = [0] * p
    out: list[list[Slot]] = [[] for _ in range(p)]

    def key(r: int, op: Op, kind: str) -> tuple:
        d, s = position(train, r, op.chunk)
        return kind, d, microbatch(train, op), s

    def needs(r: int, op: Op) -> tuple | None:
        kind, d, mb, s = key(r, op, op.kind)
        if kind == "F" and s > 0:
            return "F", d, mb, s - 1
        if kind == "B" and s < last:
            return "B", d, mb, s + 1
        return None

    while any(len(out[r]) < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while len(out[r]) < len(orders[r]):
                step = orders[r][len(out[r])]
                deps = [n for n in (needs(r, op) for op in step) if n is not None]
                if any(n not in done for n in deps):
                    break
                start = max([free[r]] + [done[n] for n in deps])
                end = start + duration(train, step)
                for op in step:
                    if op.kind in ("F", "B"):
                        done[key(r, op, op.kind)] = end
                out[r].append(Slot(r, len(out[r]), step, start, end))
                free[r] = end
                moved = True
        if not moved:  # pragma: no cover - every schedule's dependencies can be met
            raise AssertionError(f"{train.schedule}: the pipeline deadlocks")
    return out


def makespan(train: TrainingConfig, m: int | None = None) -> int | Fraction:
    """Slots from the first forward to the last step of any rank."""
    return max(s[-1].end for s in clock(train, m) if s)


def releases(step: Step, chunks: int) -> tuple[int, ...]:
    """Micro-batches per chunk whose activations ``step`` frees: a backward that does not defer its
    weight gradient, or that weight gradient."""
    out = [0] * chunks
    for op in step:
        if (op.kind == "B" and not op.deferred) or op.kind == "W":
            out[op.chunk] += 1
    return tuple(out)


@dataclass(frozen=True)
class MemoryStep:
    """One step of one rank with its memory: exact bytes on one device of the rank."""

    slot: Slot
    counts: tuple[int, ...]      #: micro-batches held per chunk during the step
    running: tuple[int, ...]     #: chunks computing
    states: int                  #: parameters + gradients + optimizer states
    held: int                    #: activations of the micro-batches held during the step
    working: int                 #: recompute working set of the chunk computing
    held_after: int              #: activations held once the step's backwards released theirs

    @property
    def activations(self) -> int:
        return self.held + self.working

    @property
    def microbatches(self) -> int:
        """Micro-batches held during the step, all chunks."""
        return sum(self.counts)

    @property
    def allocated(self) -> int:
        """Model states and activations during the step (overheads apart)."""
        return self.states + self.activations

    @property
    def allocated_after(self) -> int:
        return self.states + self.held_after


def memory_over_time(est: Estimate, m: int | None = None) -> list[list[MemoryStep]]:
    """Every rank's steps of one iteration of ``m`` micro-batches (default
    :func:`~memlib.device.schedule.default_microbatches`) with the bytes its device holds during and after
    each, from the estimate's per-chunk bytes of one micro-batch and recompute working sets."""
    m = default_microbatches(est.train) if m is None else m
    slots = clock(est.train, m)
    out = []
    for st, rank_slots in zip(est.stages, slots):
        chunks = st.activations["chunks"]
        per = [c["per_microbatch"] for c in chunks]
        work = [c["recompute_working_set"] for c in chunks]
        rows = []
        for slot, (step, mo) in zip(rank_slots, timeline(est.train, st.stage.index, m)):
            if step != slot.ops:  # pragma: no cover - the clock places the replay's own steps
                raise AssertionError("clock and replay disagree")
            after = [n - k for n, k in zip(mo.counts, releases(step, len(chunks)))]
            rows.append(MemoryStep(
                slot, mo.counts, mo.running, st.model_states,
                held=sum(n * x for n, x in zip(mo.counts, per)),
                working=max([0] + [work[c] for c in mo.running]),
                held_after=sum(n * x for n, x in zip(after, per))))
        out.append(rows)
    return out


def peak_step(rows: list[MemoryStep]) -> MemoryStep:
    """The first step of a rank at which its allocated bytes are largest."""
    top = max(r.allocated for r in rows)
    return next(r for r in rows if r.allocated == top)


@dataclass(frozen=True)
class OverTime:
    """One iteration of every rank with its memory, and where each rank peaks."""

    train: TrainingConfig
    microbatches: int
    rows: list[list[MemoryStep]]       #: per rank, its steps with their memory
    peaks: list[MemoryStep]            #: per rank, its first step with the most allocated bytes
    peak_rank: int                     #: the rank whose peak is largest (the first such)
    length: int | Fraction             #: slots from the first forward to the end of the last step

    @property
    def peak(self) -> MemoryStep:
        return self.peaks[self.peak_rank]


def over_time(est: Estimate, m: int | None = None) -> OverTime:
    """:func:`memory_over_time` of ``est`` with every rank's peak step and the largest of them."""
    m = default_microbatches(est.train) if m is None else m
    rows = memory_over_time(est, m)
    peaks = [peak_step(r) for r in rows]
    top = max(p.allocated for p in peaks)
    return OverTime(est.train, m, rows, peaks, next(i for i, p in enumerate(peaks) if p.allocated == top),
                    max(r[-1].slot.end for r in rows))
