"""Pipeline schedules: micro-batches in flight per rank and chunk, chunk placement, and the rules.

The replay's step orders are checked against orders written out by hand from the sources
(Megatron's 1F1B and interleaved schedules, DualPipe.step); its peaks against the closed forms of
the literature: GPipe keeps all M, 1F1B min(p - r, M) (Narayanan et al.), Megatron's interleaved
1F1B 2(p - r - 1) + (V - 1)p + 1 chunk-micro-batches (Korthikanti's p(1 + (p - 1)/(pV)) on rank 0,
mbridge's per-chunk rules), DualPipe p + 1 and 2x parameters (the DualPipe README's table).
"""
from __future__ import annotations

import pytest

from memlib.config import PAPER_TRAINING, ConfigError, TrainingConfig, load_model
from memlib.device.estimate import estimate
from memlib.model.partition import Partition, build_stages, resolve_layout
from memlib.device.schedule import Moment, check_schedule, in_flight, moments, replay_microbatches, steps, timeline
from memlib.model.states import model_states

import tiny as T


def stages(p, schedule="1f1b", v=1, m=None, layout=None):  # noqa: D103 - the chunks of each rank
    train = TrainingConfig(pp=p, schedule=schedule, vpp=v, num_microbatches=m)
    return train, build_stages(layout or (1,) * (p * v), train)


# ---------------------------------------------------------------------------------------------
# the replay: step orders written out by hand
# ---------------------------------------------------------------------------------------------
def ops(train, r, m=None):
    """A rank's steps as text: 'F0.2' is the forward of micro-batch 2 on chunk 0, 'F0.3+B1.1' an
    overlapped pair, 'B1.0*' a backward whose weight gradient is deferred, 'W1.0' that gradient."""
    def one(op):
        return f"{op.kind}{op.chunk}.{op.mb}" + ("*" if op.deferred else "")
    return [" +".join(one(op) for op in step).replace(" +", "+") for step in steps(train, r, m)]


def test_1f1b_by_hand():
    # rank 1 of 4 with 4 micro-batches: p - r - 1 = 2 warm-up forwards, then one forward, one backward
    train = TrainingConfig(pp=4, num_microbatches=4)
    assert ops(train, 1) == ["F0.0", "F0.1", "F0.2", "B0.0", "F0.3", "B0.1", "B0.2", "B0.3"]
    held = [mo.counts[0] for _, mo in timeline(train, 1)]
    assert held == [1, 2, 3, 3, 3, 3, 2, 1]
    assert ops(TrainingConfig(pp=4, num_microbatches=2), 0) == ["F0.0", "F0.1", "B0.0", "B0.1"]


def test_interleaved_warmup_by_hand():
    # Megatron's interleaved 1F1B, p = 2, V = 2, M = 2, rank 1: (V - 1) p = 2 warm-up forwards on
    # chunk 0 (forwards k // p mod V), then backwards from the last chunk (V - 1 - (k // p) mod V)
    train = TrainingConfig(pp=2, vpp=2, schedule="interleaved", num_microbatches=2)
    assert ops(train, 1) == ["F0.0", "F0.1", "F1.2", "B1.0", "F1.3", "B1.1", "B0.2", "B0.3"]
    # rank 0 warms up 2 (p - 1) + 2 = 4 forwards: every forward before the first backward
    assert ops(train, 0) == ["F0.0", "F0.1", "F1.2", "F1.3", "B1.0", "B1.1", "B0.2", "B0.3"]


def test_dualpipe_by_hand():
    """DualPipe.step of deepseek-ai/DualPipe for 4 ranks and 8 micro-batches, traced by hand from
    the source: chunk 0 is the shallow model stage of the rank, chunk 1 the deep one."""
    train = TrainingConfig(pp=4, schedule="dualpipe", num_microbatches=8)
    # rank 0 (half rank 0): step 1 two F0; step 2 F0 F1; step 3 B1 (zero bubble) W F1; step 4 the
    # overlapped pairs; step 5 B1 and a pair; step 6 B1, then B0 with zero bubble; steps 7-8 the W's
    assert ops(train, 0) == ["F0.0", "F0.1", "F0.2", "F1.0", "B1.0*", "W1.0", "F1.1", "F0.3+B1.1", "F1.2+B0.0",
                             "B1.2", "F1.3+B0.1", "B1.3", "B0.2*", "W0.2", "B0.3*", "W0.3"]
    # rank 1 (half rank 1): no step 1, two rounds of step 2, two of step 4, then step 6 with the
    # second round deferred
    assert ops(train, 1) == ["F0.0", "F1.0", "F0.1", "F1.1", "F0.2+B1.0", "F1.2+B0.0", "F0.3+B1.1", "F1.3+B0.1",
                             "B1.2", "B0.2", "B1.3*", "B0.3*", "W1.3", "W0.3"]
    # the mirror ranks run the same steps
    assert ops(train, 3) == ops(train, 0) and ops(train, 2) == ops(train, 1)
    # the peak: the overlapped step's new forward is on the shallow chunk, p - h of it and h + 1 deep
    assert max(mo.total for _, mo in timeline(train, 0)) == 5
    assert moments(train, 0) == [Moment((4, 1), (0, 1))]
    assert moments(train, 1) == [Moment((3, 2), (0, 1))]


# ---------------------------------------------------------------------------------------------
# the closed forms of the literature, against the replay
# ---------------------------------------------------------------------------------------------
def peak(train, r, m=None):
    """The moment holding the most micro-batches (the first such), from the replay."""
    return max((mo for _, mo in timeline(train, r, m)), key=lambda mo: mo.total)


@pytest.mark.parametrize("p", [1, 2, 4, 16])
@pytest.mark.parametrize("m", [1, 3, 16, 64])
def test_gpipe_keeps_every_microbatch(p, m):
    train = TrainingConfig(pp=p, schedule="gpipe", num_microbatches=m)
    for r in range(p):
        assert peak(train, r).counts == (m,) == tuple(in_flight(train, r))
        assert moments(train, r) == [Moment((m,), (0,))]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("m", [None, 1, 3, 16, 64])
def test_1f1b_replay_is_narayanans_min_p_minus_r_m(p, m):
    train = TrainingConfig(pp=p, num_microbatches=m)
    for r in range(p):
        mm = m if m is not None else p
        assert peak(train, r, mm).total == min(p - r, mm) == in_flight(train, r)[0]
        assert [mo.counts for mo in moments(train, r)] == [(min(p - r, mm),)]


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_rank0_is_korthikantis_factor(p, v):
    """Korthikanti et al.: the first rank of the interleaved schedule holds p (1 + (p - 1)/(p V))
    stages' worth of activations, p V + p - 1 chunk-micro-batches."""
    from fractions import Fraction
    train = TrainingConfig(pp=p, vpp=v, schedule="interleaved")
    top = peak(train, 0)
    assert Fraction(top.total, v) == p * (1 + Fraction(p - 1, p * v))
    assert list(top.counts) == in_flight(train, 0)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("m", [None, "p", "2p", "8p"])
def test_interleaved_replay_peaks_at_the_warmup_plus_one(p, v, m):
    mb = {None: None, "p": p, "2p": 2 * p, "8p": 8 * p}[m]
    train = TrainingConfig(pp=p, vpp=v, schedule="interleaved", num_microbatches=mb)
    for r in range(p):
        top = peak(train, r, mb)
        assert top.total == min(2 * (p - r - 1) + (v - 1) * p + 1, (mb or 10**9) * v)
        assert list(top.counts) == in_flight(train, r)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_agrees_with_mbridge_on_first_and_middle_chunks(p, v):
    """mbridge (its pipeline memory estimator): chunk 0 holds p + max(2(p - r) - 1 - p, 0), a middle chunk p.  Its
    last-chunk rule, min(2(p - r) + 1, p), counts two more than Megatron's warm-up on the ranks
    where 2(p - r) + 1 < p; the replay of Megatron's step order gives min(2(p - r) - 1, p)."""
    train = TrainingConfig(pp=p, vpp=v, schedule="interleaved")
    for r in range(p):
        counts = peak(train, r).counts
        assert counts[0] == p + max((p - r) * 2 - 1 - p, 0)
        assert all(c == p for c in counts[1:-1])
        assert counts[-1] == min(2 * (p - r) - 1, p)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("m", [None, "2p", "2p+2", "6p"])
def test_dualpipe_replay_holds_p_plus_one(p, m):
    """The DualPipe README's table: activations of PP + 1 micro-batches, on every rank, for any M."""
    mb = {None: None, "2p": 2 * p, "2p+2": 2 * p + 2, "6p": 6 * p}[m]
    train = TrainingConfig(pp=p, schedule="dualpipe", num_microbatches=mb)
    for r in range(p):
        h = min(r, p - 1 - r)
        top = peak(train, r, mb)
        assert top.total == p + 1
        assert list(top.counts) == [p - h, h + 1] == in_flight(train, r)
        assert moments(train, r) == [Moment((p - h, h + 1), (0, 1))]


@pytest.mark.parametrize("schedule,v,p", [(sch, v, p) for sch, v in (("1f1b", 1), ("interleaved", 2),
                                                                      ("interleaved", 3), ("dualpipe", 1))
                                            for p in (2, 3, 4, 6, 8) if sch != "dualpipe" or p % 2 == 0])
def test_replay_stops_where_more_microbatches_repeat(schedule, v, p):
    """moments() replays at most replay_microbatches(); the peak candidates of a full replay of many
    more micro-batches are the same (the steady state repeats)."""
    def undominated(seen):
        def dom(a, b):
            return a != b and all(x <= y for x, y in zip(a.counts, b.counts)) and set(a.running) <= set(b.running)
        return {a for a in seen if not any(dom(a, b) for b in seen)}

    for mult in (2, 5, 11):
        train = TrainingConfig(pp=p, vpp=v, schedule=schedule, num_microbatches=p * mult)
        assert replay_microbatches(train) <= p * mult
        for r in range(p):
            full = undominated({mo for _, mo in timeline(train, r, p * mult)})
            assert set(moments(train, r)) == full


def test_replay_is_bounded_for_huge_m():
    train = TrainingConfig(pp=16, schedule="dualpipe", num_microbatches=2**30)
    assert replay_microbatches(train) == 32
    assert moments(train, 0) == [Moment((16, 1), (0, 1))]


def test_dualpipe_puts_the_extra_microbatch_on_the_shallow_chunk():
    """Rank 0 of DeepSeek-V3 under DualPipe holds model stages 0 (embedding, layers 0-3) and 15
    (layer 60, the head, MTP): its peak holds 16 micro-batches of stage 0 and one of stage 15, not
    the other way round."""
    est = estimate("deepseek-v3", PAPER_TRAINING.with_(schedule="dualpipe", recompute="full", zero=1,
                                                     profile="megatron"))
    a = est.stages[0].activations
    assert [(c["stage"], c["in_flight"]) for c in a["chunks"]] == [(0, 16), (15, 1)]
    assert a["chunks"][1]["per_microbatch"] > a["chunks"][0]["per_microbatch"]      # the heavy one
    assert a["microbatches_in_flight"] == 17 and a["schedule_extra"] == 0
    held = sum(c["per_microbatch"] * c["in_flight"] for c in a["chunks"])
    assert est.stages[0].bytes["activations"] == held + a["recompute_working_set"]


def test_dualpipe_p_plus_one_in_flight_on_every_rank():
    est = estimate("deepseek-v3", PAPER_TRAINING.with_(schedule="dualpipe", recompute="full", zero=1))
    assert [s.activations["microbatches_in_flight"] for s in est.stages] == [17] * 16
    for r, s in enumerate(est.stages):
        a = s.activations
        h = min(r, 15 - r)
        assert [c["in_flight"] for c in a["chunks"]] == [16 - h, h + 1]
        assert a["schedule_extra"] == 0


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
def test_counts_reach_estimate(schedule):
    kw = {"1f1b": {}, "gpipe": dict(num_microbatches=32), "interleaved": dict(pp=4, vpp=2)}[schedule]
    est = estimate("deepseek-v3", PAPER_TRAINING.with_(schedule=schedule, recompute="full", **kw))
    p = est.train.pp
    got = [s.activations["microbatches_in_flight"] for s in est.stages]
    want = {"1f1b": [p - r for r in range(p)], "gpipe": [32] * p,
            "interleaved": [2 * (p - r - 1) + p + 1 for r in range(p)]}[schedule]
    assert got == want


# ---------------------------------------------------------------------------------------------
# DualPipe: 2x parameters
# ---------------------------------------------------------------------------------------------
def _part(model, **kw):
    return Partition(model, TrainingConfig(**kw))


def _params(part):
    return [part.params(st).evaluate_total(part.values) for st in part.stages]


@pytest.mark.parametrize("model,kw", [
    ("deepseek-v3", dict(dp=32, tp=2, pp=16, ep=8)),
    ("deepseek-v3", dict(dp=8, tp=1, pp=16, ep=8, profile="megatron")),
    ("tiny", dict(dp=2, tp=2, pp=2, ep=2)),
])
def test_dualpipe_params_are_stages_r_and_mirror(model, kw):
    m = T.tiny() if model == "tiny" else load_model(model)
    one = _params(_part(m, **kw))
    dual = _params(_part(m, **kw, schedule="dualpipe"))
    p = kw["pp"]
    # DualPipe puts the first and last stages on one rank: a megatron last stage's embedding copy
    # for the MTP input is not needed there (the saving the DeepSeek-V3 report names)
    copy = 0
    if kw.get("profile") == "megatron" and m.num_nextn_predict_layers:
        copy = m.vocab_size * m.hidden_size // kw["tp"]
    ends = {0, p - 1}
    assert dual == [one[r] + one[p - 1 - r] - (copy if r in ends else 0) for r in range(p)]
    assert sum(dual) == 2 * sum(one) - 2 * copy


def test_dualpipe_uniform_layout_doubles_middle_ranks():
    """Identical layers, one per stage: a middle rank holds two stages' worth, exactly 2x."""
    m = T.tiny(num_hidden_layers=8, first_k_dense_replace=0)
    kw = dict(dp=2, tp=2, pp=8, ep=2)
    one, dual = _part(m, **kw), _part(m, **kw, schedule="dualpipe")
    p1, p2 = _params(one), _params(dual)
    assert p1[1:-1] == [p1[1]] * 6
    assert p2[1:-1] == [2 * p1[1]] * 6
    assert p2[0] == p2[-1] == p1[0] + p1[-1]
    for r in range(1, 7):
        s1 = model_states(one, one.stages[r]).evaluate()
        s2 = model_states(dual, dual.stages[r]).evaluate()
        assert {k: 2 * x for k, x in s1.items()} == s2
    # every model stage lives on two ranks
    t = next(t for t, _ in one.tensors(one.stages[1]))
    assert dual.replication(t) == 2 * one.replication(t)


# ---------------------------------------------------------------------------------------------
# interleaved layouts
# ---------------------------------------------------------------------------------------------
def test_interleaved_layout_per_rank_divisible_by_v():
    m = T.tiny(num_hidden_layers=12)
    train = TrainingConfig(pp=2, vpp=2, schedule="interleaved", layout=(8, 4))
    lay = resolve_layout(m, train)
    assert lay == (4, 2, 4, 2)
    sts = build_stages(lay, train)
    assert [len(st.layers) for st in sts] == [8, 4]
    assert [c.index for c in sts[0].chunks] == [0, 2] and [c.index for c in sts[1].chunks] == [1, 3]
    assert sts[0].layers == (0, 1, 2, 3, 6, 7, 8, 9)
    assert sts[0].first and not sts[0].last and sts[1].last and not sts[1].first


def test_interleaved_layout_all_virtual_stages():
    m = T.tiny(num_hidden_layers=12)
    train = TrainingConfig(pp=2, vpp=2, schedule="interleaved", layout=(1, 2, 3, 6))
    assert resolve_layout(m, train) == (1, 2, 3, 6)
    sts = build_stages((1, 2, 3, 6), train)
    assert [len(st.layers) for st in sts] == [4, 8]


def test_interleaved_default_layout():
    m = load_model("deepseek-v3")
    lay = resolve_layout(m, TrainingConfig(pp=4, vpp=2, schedule="interleaved"))
    assert lay == (8,) * 7 + (5,)


@pytest.mark.parametrize("layout,needle", [
    ((7, 5), "vpp=2 must divide every stage's layer count (7 does not)"),
    ((4, 4, 4), "3 stages but pp*vpp=4"),
    ((2, 2, 2, 2), "sums to 8 but num_hidden_layers=12"),
])
def test_interleaved_layout_errors(layout, needle):
    m = T.tiny(num_hidden_layers=12)
    with pytest.raises(ConfigError) as exc:
        resolve_layout(m, TrainingConfig(pp=2, vpp=2, schedule="interleaved", layout=layout))
    assert needle in str(exc.value)


# ---------------------------------------------------------------------------------------------
# schedule rules
# ---------------------------------------------------------------------------------------------
def tiny8(**kw):
    base = dict(dp=2, tp=2, pp=2, ep=2, seq_len=64)
    return estimate(T.tiny(num_hidden_layers=8), TrainingConfig(**{**base, **kw}))


@pytest.mark.parametrize("kw,needle", [
    (dict(schedule="interleaved"), "schedule=interleaved needs vpp >= 2"),
    (dict(schedule="interleaved", vpp=1), "needs vpp >= 2 model chunks per device (vpp=1)"),
    (dict(vpp=2), "vpp=2 needs schedule=interleaved (schedule=1f1b)"),
    (dict(vpp=2, schedule="dualpipe"), "vpp=2 needs schedule=interleaved"),
    (dict(vpp=2, schedule="interleaved", layout=(3, 5)), "vpp=2 must divide every stage's layer count"),
    (dict(vpp=4, schedule="interleaved", layout=(2, 6)), "vpp=4 must divide"),
    (dict(schedule="gpipe"), "schedule=gpipe keeps every micro-batch: give num_microbatches"),
    (dict(schedule="dualpipe", pp=1, layout=None), "pp=1 must be even for schedule=dualpipe"),
    (dict(schedule="dualpipe", num_microbatches=2), "num_microbatches=2 must be even and at least 2*pp=4"),
    (dict(schedule="dualpipe", num_microbatches=5), "num_microbatches=5 must be even"),
    (dict(schedule="interleaved", vpp=2, num_microbatches=3), "num_microbatches=3 must be a multiple of pp=2"),
    (dict(schedule="zb-v"), "schedule='zb-v' must be one of gpipe, 1f1b, interleaved, dualpipe"),
])
def test_schedule_errors(kw, needle):
    with pytest.raises(ConfigError) as exc:
        tiny8(**kw)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_dualpipe_odd_pp():
    with pytest.raises(ConfigError, match="pp=3 must be even"):
        estimate("deepseek-v3", PAPER_TRAINING.with_(schedule="dualpipe", pp=3, layout=(20, 20, 21)))


@pytest.mark.parametrize("kw", [
    dict(schedule="gpipe", num_microbatches=1),
    dict(schedule="dualpipe", num_microbatches=4),
    dict(schedule="dualpipe"),
    dict(schedule="interleaved", vpp=2, num_microbatches=2),
    dict(schedule="interleaved", vpp=2),
    dict(schedule="interleaved", vpp=2, layout=(4, 4)),
    dict(schedule="1f1b", num_microbatches=1),
])
def test_schedule_accepted(kw):
    est = tiny8(**kw)
    assert all(s.bytes["activations"] > 0 for s in est.stages)


def test_check_schedule_alone():
    check_schedule(TrainingConfig(pp=4, schedule="interleaved", vpp=2))           # M unknown: fine
    check_schedule(TrainingConfig(pp=4, schedule="dualpipe", num_microbatches=8))
    with pytest.raises(ConfigError):
        check_schedule(TrainingConfig(pp=4, schedule="dualpipe", num_microbatches=6))
