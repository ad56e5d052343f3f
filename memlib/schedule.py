"""Pipeline schedules: how many micro-batches' activations each pipeline rank holds at its peak.

Counts are per *chunk* (model stage held by the rank), in micro-batches:

``gpipe``        every rank keeps all M micro-batches (all forwards before any backward);
``1f1b``         rank r of p keeps min(p - r, M) (Narayanan et al. 2021);
``interleaved``  Megatron's interleaved 1F1B with V chunks per rank: the warm-up runs
                 2 (p - r - 1) + (V - 1) p forwards, the peak holds one more, each assigned to chunk
                 (k // p) mod V; rank 0 then holds p (1 + (p - 1)/(p V)) stage-micro-batches;
``dualpipe``     DeepSeek's bidirectional schedule: rank r holds model stages r' = min(r, p-1-r) and
                 p - 1 - r'; after its warm-up it keeps p - r' - 1 micro-batches of the first and
                 r' + 1 of the second, and an overlapped forward-and-backward step adds one more
                 forward before the backward frees one: p + 1 in all (the DualPipe README's table).
                 The counts follow the step structure of deepseek-ai/DualPipe ``dualpipe.py``.
"""
from __future__ import annotations

from .config import ConfigError, TrainingConfig
from .partition import Stage

__all__ = ["in_flight", "check_schedule"]


def check_schedule(train: TrainingConfig) -> None:
    """Rules on the number of micro-batches per schedule (chunk layout rules live in the partition)."""
    m, p = train.num_microbatches, train.pp
    if train.schedule == "gpipe" and m is None:
        raise ConfigError("schedule=gpipe keeps every micro-batch: give num_microbatches")
    if train.schedule == "interleaved" and m is not None and m % p:
        raise ConfigError(f"num_microbatches={m} must be a multiple of pp={p} for schedule=interleaved")
    if train.schedule == "dualpipe" and m is not None and (m < 2 * p or m % 2):
        raise ConfigError(f"num_microbatches={m} must be even and at least 2*pp={2 * p} for schedule=dualpipe")


def in_flight(train: TrainingConfig, stage: Stage) -> tuple[list[int], int]:
    """Micro-batches held per chunk of ``stage`` at its peak, and the index of the chunk whose
    one extra micro-batch DualPipe's overlapped step adds (-1: none; -2: whichever is larger).

    >>> from memlib.config import TrainingConfig
    >>> from memlib.partition import Stage
    >>> in_flight(TrainingConfig(pp=4), Stage(1, (), False, False))
    ([3], -1)
    """
    p, r, m = train.pp, stage.index, train.num_microbatches
    if train.schedule == "gpipe":
        return [m], -1
    if train.schedule == "1f1b":
        return [p - r if m is None else min(p - r, m)], -1
    if train.schedule == "interleaved":
        v = train.vpp
        n = 2 * (p - r - 1) + (v - 1) * p + 1
        if m is not None:
            n = min(n, m * v)
        counts = [0] * v
        for k in range(n):
            counts[(k // p) % v] += 1
        return counts, -1
    if train.schedule == "dualpipe":
        half = min(r, p - 1 - r)
        return [p - half - 1, half + 1], -2
    raise ConfigError(f"schedule={train.schedule!r} is unknown")  # pragma: no cover - checked earlier
