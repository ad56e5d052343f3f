"""Pipeline schedules, replayed: which micro-batch each rank runs forward or backward when, and so
how many micro-batches' activations each of its model chunks holds at every moment.

One replay serves every question the report asks of a schedule: the per-chunk counts at the peak
(:func:`moments`), memory over a whole step (:func:`timeline`), and the closed forms the literature
gives, which the tests check against the replay (:func:`in_flight`).

A rank runs a sequence of *steps*; a step is one operation (``F`` forward, ``B`` backward, ``W``
deferred weight gradient) or DualPipe's overlapped forward-and-backward pair.  Activations of a
micro-batch are allocated by its forward and released by its backward (by its ``W`` when the
backward deferred its weight gradient, DualPipe's zero-bubble steps).  In a step the forwards
allocate before the backwards release: the *moment* of a step is the count of micro-batches held
per chunk at that instant, with the chunks that compute in it (whose recompute working set is
live then).

``gpipe``        all M forwards, then all M backwards;
``1f1b``         rank r of p runs p - r - 1 warm-up forwards, then one forward and one backward
                 per step (Narayanan et al. 2021): it holds min(p - r, M);
``interleaved``  Megatron-Core's interleaved 1F1B with V chunks per rank (``schedules.py``:
                 ``forward_backward_pipelining_with_interleaving``): 2 (p - r - 1) + (V - 1) p warm-up
                 forwards, forward k on chunk (k // p) mod V, backward k on chunk V - 1 - (k // p) mod V;
``dualpipe``     DeepSeek's bidirectional schedule, step by step as ``DualPipe.step`` in
                 deepseek-ai/DualPipe ``dualpipe/dualpipe.py`` (steps 1 to 8, zero-bubble weight
                 passes included).  Rank r holds the shallow model stage h = min(r, p - 1 - r) (chunk 0)
                 and the deep one p - 1 - h (chunk 1); its peak holds p - h micro-batches of the shallow
                 chunk and h + 1 of the deep one, p + 1 in all: the overlapped step's new forward is on
                 the shallow chunk.

Long steps repeat: past a number of micro-batches that depends only on p and V, more micro-batches
add moments identical to those already seen, so the replay runs that many (:func:`replay_microbatches`)
and the peak is exact for any M.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..config import LIMITS, ConfigError, Schedule, TrainingConfig

__all__ = ["Schedule", "schedule_of", "Op", "Step", "Moment", "steps", "timeline", "moments", "in_flight",
           "check_schedule", "replay_microbatches", "idle_chunks", "replay_size", "check_replay", "default_microbatches", "STEP_ORDERS"]


def schedule_of(train: TrainingConfig) -> Schedule:
    """The :class:`~memlib.config.Schedule` of ``train`` (a TrainingConfig holds one already)."""
    return Schedule(train.schedule)


@dataclass(frozen=True)
class Op:
    """One operation of a rank: ``F``, ``B`` or ``W`` of micro-batch ``mb`` on chunk ``chunk``.
    ``deferred``: a backward whose weight gradient waits for a later ``W`` (DualPipe's zero bubble)."""

    kind: str
    chunk: int
    mb: int
    deferred: bool = False


Step = tuple[Op, ...]


@dataclass(frozen=True)
class Moment:
    """Micro-batches held per chunk at the busiest instant of a step, and the chunks computing then."""

    counts: tuple[int, ...]
    running: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)


def check_schedule(train: TrainingConfig) -> None:
    """The schedule's rules on chunks and micro-batches (:meth:`memlib.config.Schedule.check`)."""
    train.schedule.check(train)


def default_microbatches(train: TrainingConfig) -> int:
    """M when ``num_microbatches`` is not given: enough to fill the pipeline (the smallest M at
    which every rank reaches its steady state)."""
    p, sch = train.pp, schedule_of(train)
    if train.num_microbatches is not None:
        return train.num_microbatches
    if sch is Schedule.DUALPIPE:
        return 2 * p
    if sch is Schedule.INTERLEAVED:
        return replay_microbatches(train.with_(num_microbatches=None), saturate=True)
    return p


def replay_microbatches(train: TrainingConfig, saturate: bool = False) -> int:
    """How many micro-batches the replay runs: M, or fewer where more would only repeat moments
    already seen (1F1B: p; interleaved: the smallest multiple of p past every warm-up plus a full
    period of p V; DualPipe: 2 p)."""
    p, v, sch = train.pp, train.vpp, schedule_of(train)
    m = train.num_microbatches
    if sch is Schedule.GPIPE:
        return m
    if sch is Schedule.ONE_F_ONE_B:
        sat = p
    elif sch is Schedule.DUALPIPE:
        sat = 2 * p
    else:
        warm = 2 * (p - 1) + (v - 1) * p
        sat = p * (-(-(warm + 1 + p * v) // (p * v)) + 1)   # ceil to a multiple of p, one period more
    return sat if m is None or saturate else min(m, sat)


# ------------------------------------------------------------------------------------------------
# the step order of each schedule
# ------------------------------------------------------------------------------------------------
def _gpipe(p: int, r: int, m: int) -> Iterator[Step]:
    for k in range(m):
        yield (Op("F", 0, k),)
    for k in range(m):
        yield (Op("B", 0, k),)


def _one_f_one_b(p: int, r: int, m: int) -> Iterator[Step]:
    warm = min(p - r - 1, m)
    for k in range(warm):
        yield (Op("F", 0, k),)
    for k in range(m - warm):
        yield (Op("F", 0, warm + k),)
        yield (Op("B", 0, k),)
    for k in range(m - warm, m):
        yield (Op("B", 0, k),)


def _interleaved(p: int, r: int, m: int, v: int) -> Iterator[Step]:
    total = m * v
    warm = min(2 * (p - r - 1) + (v - 1) * p, total)

    def f(k: int) -> Op:
        return Op("F", (k // p) % v, k)

    def b(k: int) -> Op:
        return Op("B", v - 1 - (k // p) % v, k)

    for k in range(warm):
        yield (f(k),)
    for k in range(total - warm):
        yield (f(warm + k),)
        yield (b(k),)
    for k in range(total - warm, total):
        yield (b(k),)


def _dualpipe(p: int, r: int, m: int) -> Iterator[Step]:
    """``DualPipe.step`` of deepseek-ai/DualPipe, rank ``r``: phase 0 is the shallow chunk (model
    stage h), phase 1 the deep one (p - 1 - h), for either half of the ranks."""
    half, h, mh = p // 2, min(r, p - 1 - r), m // 2
    nf, nb = [0, 0], [0, 0]          # next micro-batch per phase (each phase has M/2)
    wq: list[Op] = []                # deferred weight gradients, first in first out

    def F(ph: int) -> Op:
        nf[ph] += 1
        return Op("F", ph, nf[ph] - 1)

    def B(ph: int, zb: bool = False) -> Op:
        nb[ph] += 1
        op = Op("B", ph, nb[ph] - 1, deferred=zb)
        if zb:
            wq.append(op)
        return op

    def W() -> Op:
        op = wq.pop(0)
        return Op("W", op.chunk, op.mb)

    for _ in range((half - h - 1) * 2):              # step 1: nF0
        yield (F(0),)
    for _ in range(h + 1):                           # step 2: nF0F1
        yield (F(0),)
        yield (F(1),)
    for _ in range(half - h - 1):                    # step 3: nB1W1F1 (zero bubble)
        yield (B(1, True),)
        yield (W(),)
        yield (F(1),)
    for _ in range(mh - p + h + 1):                  # step 4: nF0B1F1B0 (overlapped pairs)
        yield (F(0), B(1))
        yield (F(1), B(0))
    for _ in range(half - h - 1):                    # step 5: nB1F1B0
        yield (B(1),)
        yield (F(1), B(0))
    zb = False
    for i in range(h + 1):                           # step 6: nB1B0, the second half with zero bubble
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        yield (B(1, zb),)
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        yield (B(0, zb),)
    for _ in range(half - h - 1):                    # step 7: nWB0 (zero bubble)
        yield (W(),)
        yield (B(0, True),)
    for _ in range(h + 1):                           # step 8: nW
        yield (W(),)
    if wq:  # pragma: no cover - the replay mirrors the source's assertion
        raise AssertionError("DualPipe replay left weight gradients queued")


#: each schedule's step order: (pp, rank, micro-batches, vpp) -> steps
STEP_ORDERS = {
    Schedule.GPIPE: lambda p, r, m, v: _gpipe(p, r, m),
    Schedule.ONE_F_ONE_B: lambda p, r, m, v: _one_f_one_b(p, r, m),
    Schedule.INTERLEAVED: _interleaved,
    Schedule.DUALPIPE: lambda p, r, m, v: _dualpipe(p, r, m),
}


def steps(train: TrainingConfig, rank: int, m: int | None = None) -> list[Step]:
    """The steps of ``rank`` in one training iteration of ``m`` micro-batches (default: the replay's)."""
    m = replay_microbatches(train) if m is None else m
    return list(STEP_ORDERS[train.schedule](train.pp, rank, m, train.vpp))


def _chunks(train: TrainingConfig) -> int:
    return len(train.schedule.rank_chunks(0, train.pp, train.vpp))


def _walk(train: TrainingConfig, rank: int, m: int | None = None) -> Iterator[tuple[Step, list[int], tuple]]:
    """Each step of ``rank`` with the micro-batches held per chunk after its forwards allocated and before
    its backwards released (the one list, updated in place: a caller copies what it keeps) and the chunks
    computing."""
    held = [0] * _chunks(train)
    for step in steps(train, rank, m):
        for op in step:
            if op.kind == "F":
                held[op.chunk] += 1
        if len(step) == 1:
            op = step[0]
            yield step, held, (op.chunk,) if op.kind != "W" else ()
        else:
            yield step, held, tuple(sorted({op.chunk for op in step if op.kind in ("F", "B")}))
        for op in step:
            if (op.kind == "B" and not op.deferred) or op.kind == "W":
                held[op.chunk] -= 1
    if any(held):  # pragma: no cover - every schedule releases what it allocated
        raise AssertionError(f"replay of rank {rank} ends holding {held}")


def _held(train: TrainingConfig, rank: int, m: int | None = None) -> Iterator[tuple[Step, tuple, tuple]]:
    """:func:`_walk` with the held counts as tuples (:func:`timeline` makes them moments)."""
    for step, held, running in _walk(train, rank, m):
        yield step, tuple(held), running


def timeline(train: TrainingConfig, rank: int, m: int | None = None) -> list[tuple[Step, Moment]]:
    """Each step of ``rank`` with its moment: the micro-batches held per chunk after the step's
    forwards allocated and before its backwards released, and the chunks computing."""
    return [(step, Moment(counts, running)) for step, counts, running in _held(train, rank, m)]


def idle_chunks(train: TrainingConfig, rank: int) -> frozenset[int]:
    """The chunks of ``rank`` (positions in the replay's numbering) that hold nothing: no layer in an explicit
    layout, neither the first model stage (the embedding) nor the last (the head, the MTP modules).  Their
    micro-batches weigh nothing and each computes the same (it passes the hidden state on), so any of them
    stands for the others in a moment."""
    lay = train.layout
    if lay is None:
        return frozenset()
    sch = schedule_of(train)
    last = len(lay) - 1
    return frozenset(i for i, c in enumerate(sch.rank_chunks(rank, train.pp, train.vpp))
                     if c < len(lay) and lay[c] == 0 and c not in (0, last))


#: a replayed step's cost in written counts (:func:`replay_size`)
STEP_WEIGHT = 64


def replay_size(train: TrainingConfig) -> int:
    """The work of replaying every rank of ``train``'s pipeline, in chunk-steps: each replayed rank's steps times
    :data:`STEP_WEIGHT` plus its chunks that hold something (a step costs about as much as writing that many
    counts; each step writes the counts of those chunks).  0 for GPipe and 1F1B (closed forms)."""
    sch = schedule_of(train)
    if sch in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
        return 0
    p, v, m = train.pp, train.vpp, replay_microbatches(train)
    if sch is Schedule.INTERLEAVED:
        ranks = range(p)
        per = 2 * m * v                                  # one forward and one backward of each chunk-micro-batch
    else:                                                 # DualPipe: ranks r and p - 1 - r run the same steps
        ranks = range(p // 2)
        per = 3 * p + m
    chunks = len(sch.rank_chunks(0, p, v))
    return sum(per * (STEP_WEIGHT + chunks - len(idle_chunks(train, r))) for r in ranks)


def check_replay(train: TrainingConfig) -> None:
    """The replay's work (:func:`replay_size`) within :data:`~memlib.config.LIMITS`' ``replay``: past it, a
    one-line error naming PP, VPP and the bound (every accepted pipeline is replayed in seconds)."""
    size = replay_size(train)
    if size > LIMITS["replay"]:
        raise ConfigError(f"pp={train.pp} vpp={train.vpp}: the {train.schedule} replay of its "
                          f"{replay_microbatches(train)} micro-batches on every rank is {size:,} chunk-steps, more "
                          f"than {LIMITS['replay']:,} that memlib replays (fewer stages, chunks per rank or "
                          f"micro-batches)")


def moments(train: TrainingConfig, rank: int) -> list[Moment]:
    """The distinct moments of ``rank`` that can be its peak: none of them holds at most as much as
    another in every chunk while computing a subset of its chunks (any positive chunk sizes; the chunks that
    hold nothing, :func:`idle_chunks`, counted as one)."""
    sch = schedule_of(train)
    if sch is Schedule.GPIPE:          # monotone: the last forward and the first backward hold all M
        return [Moment((train.num_microbatches,), (0,))]
    if sch is Schedule.ONE_F_ONE_B:    # one chunk: the steady state holds the most, min(p - r, M) (in_flight)
        return [Moment((min(train.pp - rank, replay_microbatches(train)),), (0,))]
    # the replay depends on the schedule, PP, V, the micro-batches it runs, the rank and its idle chunks: kept
    if sch is Schedule.DUALPIPE:      # ranks r and p - 1 - r run the same steps (DualPipe's h = min(r, p-1-r))
        rank = min(rank, train.pp - 1 - rank)
    idle = idle_chunks(train, rank)
    key = (sch, train.pp, train.vpp, replay_microbatches(train), rank, idle)
    if key not in _MOMENTS:
        _check_replay_once(train)
        if len(_MOMENTS) > 4096:
            _MOMENTS.clear()
        _MOMENTS[key] = tuple(_moments(train, rank, idle))
    return list(_MOMENTS[key])


_MOMENTS: dict = {}
_CHECKED: dict = {}


def _check_replay_once(train: TrainingConfig) -> None:
    key = (train.schedule, train.pp, train.vpp, replay_microbatches(train), train.layout)
    if key not in _CHECKED:
        if len(_CHECKED) > 4096:
            _CHECKED.clear()
        check_replay(train)
        _CHECKED[key] = True


#: the rows of counts compared at once by the dominance filter (a block of candidates times its pool)
_BLOCK = 1 << 22


def _moments(train: TrainingConfig, rank: int, idle: frozenset[int] = frozenset()) -> list[Moment]:
    # each distinct moment of :func:`timeline` as its counts on the chunks that hold something and its computing
    # chunks, an idle one (IDLE) for any of them: of the moments alike so, the one holding the most stands for them
    live = tuple(c for c in range(_chunks(train)) if c not in idle)
    project = (lambda held: tuple(held)) if not idle else \
        (lambda held: tuple(held[c] for c in live))
    runs: dict[tuple, tuple] = {}           # computing chunks -> their key (idle ones as IDLE)
    best: dict[tuple, tuple[int, tuple, tuple]] = {}
    for _, held, running in _walk(train, rank):
        run = runs.get(running)
        if run is None:
            run = runs[running] = tuple(c for c in running if c not in idle) + \
                ((_IDLE,) if any(c in idle for c in running) else ())
        key = (project(held), run)
        cur = best.get(key)
        if cur is None or (idle and sum(held) > cur[0]):
            best[key] = (sum(held), tuple(held), running)
    keys = list(best)
    # a moment is dominated when another holds at least as much in every chunk while computing a superset of its
    # chunks: compared within the moments whose computing chunks include its own, as blocks of NumPy rows
    counts = np.array([k[0] for k in keys], dtype=np.int64).reshape(len(keys), len(live))
    groups: dict[frozenset, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(frozenset(k[1]), []).append(i)
    dominated = np.zeros(len(keys), dtype=bool)
    for run, members in groups.items():
        pool = counts[[j for other, js in groups.items() if run <= other for j in js]]
        step = max(1, _BLOCK // max(1, len(pool) * max(1, len(live))))
        for start in range(0, len(members), step):
            block = members[start:start + step]
            ge = (pool[None, :, :] >= counts[block][:, None, :]).all(axis=2)
            dominated[block] = ge.sum(axis=1) >= 2          # itself, and another
    kept = [Moment(best[k][1], best[k][2]) for k, d in zip(keys, dominated) if not d]
    return sorted(kept, key=lambda mo: (-mo.total, mo.counts, mo.running))


_IDLE = -1


def in_flight(train: TrainingConfig, rank: int) -> list[int]:
    """The closed forms the literature gives for the micro-batches a rank holds at its peak, per
    chunk (the replay is the source; these are tested against it):

    gpipe M; 1F1B min(p - r, M); interleaved the warm-up forwards plus one, each on chunk
    (k // p) mod V (rank 0 then holds p (1 + (p - 1)/(p V)) stage-micro-batches); DualPipe
    p - h on the shallow chunk and h + 1 on the deep one (p + 1: its README's table).

    >>> from memlib.config import TrainingConfig
    >>> in_flight(TrainingConfig(pp=4), 1)
    [3]
    >>> in_flight(TrainingConfig(pp=4, schedule="dualpipe"), 0)
    [4, 1]
    """
    p, r, m, sch = train.pp, rank, train.num_microbatches, schedule_of(train)
    if sch is Schedule.GPIPE:
        return [m]
    if sch is Schedule.ONE_F_ONE_B:
        return [p - r if m is None else min(p - r, m)]
    if sch is Schedule.INTERLEAVED:
        v = train.vpp
        n = 2 * (p - r - 1) + (v - 1) * p + 1
        if m is not None:
            n = min(n, m * v)
        counts = [0] * v
        for k in range(n):
            counts[(k // p) % v] += 1
        return counts
    h = min(r, p - 1 - r)
    return [p - h, h + 1]
