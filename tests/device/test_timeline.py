"""Memory over time: the clock that places every rank's steps, and the bytes a device holds at each.

The clock is checked against the iteration lengths the literature gives with forward 1, backward 2
and weight gradient 1 slot: (M + p - 1)(F + B) for GPipe and 1F1B, + (p - 1)(F + B)/V for
interleaved 1F1B with V chunks of 1/V of a stage (Narayanan et al. 2021), and DualPipe's
M (F + B) + (p/2 - 1)(F&B + B - 3W) (the bubble of the DualPipe README's table).  The memory is
checked against ``estimate``: the largest allocated bytes over the iteration are the stage's peak,
exactly, for every schedule, and the micro-batches held there are the closed-form counts of
:func:`memlib.device.schedule.in_flight`.
"""
from __future__ import annotations

from fractions import Fraction

import pytest

from memlib import estimate
from memlib.config import TrainingConfig
from memlib.paper import paper_training
from memlib.scenarios.deepseek import deepseek_recipe
from memlib.device.schedule import in_flight, steps
from memlib.device.timeline import DURATION, clock, duration, makespan, memory_over_time, peak_step, position, releases

F, B, W = DURATION["F"], DURATION["B"], DURATION["W"]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (4, 4), (4, 8), (4, 13), (8, 16), (16, 16)])
def test_gpipe_and_1f1b_take_m_plus_p_minus_one_slots(schedule, p, m):
    assert makespan(TrainingConfig(pp=p, schedule=schedule, num_microbatches=m)) == (m + p - 1) * (F + B)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 2, 16), (4, 3, 8), (8, 2, 16)])
def test_interleaved_bubble_is_one_vth(p, v, m):
    t = TrainingConfig(pp=p, vpp=v, schedule="interleaved", num_microbatches=m)
    assert makespan(t) == m * (F + B) + Fraction((p - 1) * (F + B), v)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12), (8, 16), (8, 20), (16, 32)])
def test_dualpipe_bubble_is_the_readmes(p, m):
    t = TrainingConfig(pp=p, schedule="dualpipe", num_microbatches=m)
    assert makespan(t) == m * (F + B) + (p // 2 - 1) * ((F + B) + B - 3 * W)


CONFIGS = [TrainingConfig(pp=4, schedule="gpipe", num_microbatches=8),
           TrainingConfig(pp=4, schedule="1f1b", num_microbatches=8),
           TrainingConfig(pp=4, vpp=2, schedule="interleaved", num_microbatches=8),
           TrainingConfig(pp=4, schedule="dualpipe", num_microbatches=8),
           TrainingConfig(pp=6, schedule="dualpipe", num_microbatches=14)]


@pytest.mark.parametrize("train", CONFIGS, ids=lambda t: f"{t.schedule}-{t.pp}")
def test_clock_places_the_replay_in_order_after_its_inputs(train):
    slots = clock(train)
    m = train.num_microbatches
    ends = {}
    for r, rank in enumerate(slots):
        assert [s.ops for s in rank] == steps(train, r, m)
        for a, b in zip(rank, rank[1:]):
            assert a.end <= b.start                            # one step at a time
        for s in rank:
            assert s.end - s.start == duration(train, s.ops)
    # a forward starts after the forward before it in the pipeline ended; a backward after the one after it
    from memlib.device.timeline import microbatch
    for r, rank in enumerate(slots):
        for s in rank:
            for op in s.ops:
                ends[(op.kind, *position(train, r, op.chunk), microbatch(train, op))] = (s.start, s.end)
    for (kind, d, pos, mb), (start, _) in ends.items():
        if kind == "F" and pos > 0:
            assert ends[("F", d, pos - 1, mb)][1] <= start
        if kind == "B" and ("B", d, pos + 1, mb) in ends:
            assert ends[("B", d, pos + 1, mb)][1] <= start


def test_releases():
    from memlib.device.schedule import Op
    step = (Op("F", 0, 3), Op("B", 1, 0))
    assert releases(step, 2) == (0, 1)
    assert releases((Op("B", 0, 0, deferred=True),), 1) == (0,)
    assert releases((Op("W", 1, 0),), 2) == (0, 1)


ESTIMATES = {
    "v2lite-gpipe": ("deepseek-v2-lite", TrainingConfig(pp=4, dp=4, ep=4, schedule="gpipe", num_microbatches=8)),
    "v2lite-1f1b": ("deepseek-v2-lite", TrainingConfig(pp=4, dp=4, ep=4, num_microbatches=12)),
    "v2lite-1f1b-none": ("deepseek-v2-lite", TrainingConfig(pp=4, dp=4, ep=4, recompute="none")),
    "v2lite-1f1b-full": ("deepseek-v2-lite", TrainingConfig(pp=4, dp=4, ep=4, recompute="full")),
    "v2lite-interleaved": ("deepseek-v2-lite", TrainingConfig(pp=4, dp=4, ep=4, vpp=2, schedule="interleaved",
                                                              num_microbatches=8, layout=(4, 4, 4, 4, 4, 4, 2, 1))),
    "v2lite-dualpipe": ("deepseek-v2-lite", TrainingConfig(pp=4, dp=4, ep=4, schedule="dualpipe", recompute="full")),
    "v3-paper": ("deepseek-v3", paper_training("deepseek-v3").with_(recompute="full", zero=1)),
    "v3-paper-selective": ("deepseek-v3", paper_training("deepseek-v3").with_(recompute="selective")),
    "v3-recipe": ("deepseek-v3", deepseek_recipe("deepseek-v3")),
}


@pytest.mark.parametrize("name", ESTIMATES)
def test_peak_over_time_is_the_estimates_peak(name):
    model, train = ESTIMATES[name]
    est = estimate(model, train)
    mot = memory_over_time(est)
    assert len(mot) == train.pp
    for r, rows in enumerate(mot):
        st = est.stages[r]
        assert max(x.activations for x in rows) == st.bytes["activations"]
        assert max(x.allocated for x in rows) == st.allocated
        pk = peak_step(rows)
        assert pk.allocated == st.allocated and all(x.allocated < pk.allocated for x in rows[:pk.slot.index])
        assert all(x.states == st.model_states for x in rows)
        # the most micro-batches held at once are the closed form's, chunk by chunk
        most = max(sum(x.counts) for x in rows)
        assert most == sum(in_flight(est.train, r))
        assert tuple(in_flight(est.train, r)) in {x.counts for x in rows if sum(x.counts) == most}
        # nothing is held before the first step or after the last
        assert rows[-1].held_after == 0 and rows[-1].allocated_after == st.model_states
        # after a step nothing is computing: never more than during it
        assert all(x.held_after <= x.held for x in rows)


def test_memory_of_one_step_by_hand():
    """1F1B, 4 ranks, 4 micro-batches, rank 1: it holds 1, 2, 3, 3, 3, 3, 2, 1 micro-batches during its
    steps and 1, 2, 3, 2, 3, 2, 1, 0 after them; the working set counts only while it computes."""
    est = estimate("deepseek-v2-lite", TrainingConfig(pp=4, dp=4, ep=4, num_microbatches=4, recompute="full"))
    rows = memory_over_time(est)[1]
    a = est.stages[1].activations["chunks"][0]
    per, work = a["per_microbatch"], a["recompute_working_set"]
    assert [x.held for x in rows] == [n * per for n in (1, 2, 3, 3, 3, 3, 2, 1)]
    assert [x.held_after for x in rows] == [n * per for n in (1, 2, 3, 2, 3, 2, 1, 0)]
    assert all(x.working == work for x in rows) and work > 0


def test_over_time_names_the_peak_rank():
    from memlib.device.timeline import over_time
    est = estimate("deepseek-v3", paper_training("deepseek-v3").with_(recompute="full", zero=1))
    ot = over_time(est)
    assert ot.microbatches == est.train.pp and ot.length == makespan(est.train)
    assert [p.allocated for p in ot.peaks] == [s.allocated for s in est.stages]
    assert ot.peak_rank == max(range(est.train.pp), key=lambda r: (est.stages[r].allocated, -r))
    assert ot.peak is ot.peaks[ot.peak_rank]
