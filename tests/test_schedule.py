"""Pipeline schedules: micro-batches in flight per rank and chunk, chunk placement, and the rules.

GPipe keeps all M, 1F1B min(p - r, M) (Narayanan et al.), Megatron's interleaved 1F1B
2(p - r - 1) + (V - 1)p + 1 chunk-micro-batches (Korthikanti's p(1 + (p - 1)/(pV)) on rank 0,
mbridge's per-chunk rules), DualPipe p + 1 and 2x parameters (the DualPipe README's table).
"""
from __future__ import annotations

import pytest

from memlib.config import PAPER_TRAINING, ConfigError, TrainingConfig, load_model
from memlib.memory import estimate
from memlib.partition import Partition, build_stages, resolve_layout
from memlib.schedule import check_schedule, in_flight
from memlib.states import model_states

import tiny as T


def stages(p, schedule="1f1b", v=1, m=None, layout=None):
    train = TrainingConfig(pp=p, schedule=schedule, vpp=v, num_microbatches=m)
    return train, build_stages(layout or (1,) * (p * v), train)


# ---------------------------------------------------------------------------------------------
# in-flight counts
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2, 4, 16])
@pytest.mark.parametrize("m", [1, 3, 16, 64])
def test_gpipe_keeps_every_microbatch(p, m):
    train, sts = stages(p, "gpipe", m=m)
    assert [in_flight(train, st) for st in sts] == [([m], -1)] * p


@pytest.mark.parametrize("p", [1, 2, 4, 16])
@pytest.mark.parametrize("m", [None, 1, 3, 16, 64])
def test_1f1b(p, m):
    train, sts = stages(p, "1f1b", m=m)
    got = [in_flight(train, st) for st in sts]
    want = [([p - r if m is None else min(p - r, m)], -1) for r in range(p)]
    assert got == want
    if m is None:
        assert got[0] == ([p], -1) and got[-1] == ([1], -1)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_rank0_is_korthikantis_factor(p, v):
    train, sts = stages(p, "interleaved", v=v)
    counts, extra = in_flight(train, sts[0])
    assert extra == -1 and len(counts) == v
    assert sum(counts) == p * v + p - 1
    # in stage units (one chunk is 1/V of a stage): p (1 + (p - 1)/(p V))
    from fractions import Fraction
    assert Fraction(sum(counts), v) == p * (1 + Fraction(p - 1, p * v))


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("m", [None, "p", "2p", "8p"])
def test_interleaved_per_rank(p, v, m):
    mb = {None: None, "p": p, "2p": 2 * p, "8p": 8 * p}[m]
    train, sts = stages(p, "interleaved", v=v, m=mb)
    for r, st in enumerate(sts):
        counts, _ = in_flight(train, st)
        n = 2 * (p - r - 1) + (v - 1) * p + 1
        if mb is not None:
            n = min(n, mb * v)
        assert sum(counts) == n, r
        # forwards run p micro-batches per chunk in turn: chunk (k // p) mod V
        assert counts == [sum(1 for k in range(n) if (k // p) % v == c) for c in range(v)]


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_agrees_with_mbridge_on_first_and_middle_chunks(p, v):
    """mbridge (peers.md §3): chunk 0 holds p + max(2(p - r) - 1 - p, 0), a middle chunk p.  Its
    last-chunk rule, min(2(p - r) + 1, p), counts two more than Megatron's warm-up on the ranks
    where 2(p - r) + 1 < p; memlib follows Megatron's warm-up: min(2(p - r) - 1, p)."""
    train, sts = stages(p, "interleaved", v=v)
    for r, st in enumerate(sts):
        counts, _ = in_flight(train, st)
        assert counts[0] == p + max((p - r) * 2 - 1 - p, 0)
        assert all(c == p for c in counts[1:-1])
        assert counts[-1] == min(2 * (p - r) - 1, p)


def test_interleaved_by_hand():
    train, sts = stages(4, "interleaved", v=2)
    # rank 0: 11 forwards = 4 on chunk 0, 4 on chunk 1, 3 more on chunk 0
    assert [in_flight(train, st)[0] for st in sts] == [[7, 4], [5, 4], [4, 3], [4, 1]]
    train, sts = stages(4, "interleaved", v=2, m=4)
    assert [in_flight(train, st)[0] for st in sts] == [[4, 4], [4, 4], [4, 3], [4, 1]]


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_dualpipe_counts(p):
    train, sts = stages(p, "dualpipe")
    for r, st in enumerate(sts):
        counts, extra = in_flight(train, st)
        half = min(r, p - 1 - r)
        assert counts == [p - half - 1, half + 1] and extra == -2
        assert sum(counts) == p


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_dualpipe_chunks(p):
    train, sts = stages(p, "dualpipe", layout=tuple(range(1, p + 1)))
    for r, st in enumerate(sts):
        assert {c.index for c in st.chunks} == {r, p - 1 - r}
        assert st.first == st.last == (r in (0, p - 1))
    assert sts[0].chunks[0].index == 0 and sts[-1].chunks[0].index == 0


def test_dualpipe_p_plus_one_in_flight_on_every_rank():
    est = estimate("deepseek-v3", PAPER_TRAINING.with_(schedule="dualpipe", recompute="full", zero=1))
    assert [s.activations["microbatches_in_flight"] for s in est.stages] == [17] * 16
    for s in est.stages:
        a = s.activations
        assert sum(c["in_flight"] for c in a["chunks"]) == 16
        assert a["schedule_extra"] == max(c["per_microbatch"] for c in a["chunks"])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
def test_counts_reach_estimate(schedule):
    kw = {"1f1b": {}, "gpipe": dict(num_microbatches=32), "interleaved": dict(pp=4, vpp=2)}[schedule]
    est = estimate("deepseek-v3", PAPER_TRAINING.with_(schedule=schedule, recompute="full", **kw))
    p = est.train.pp
    got = [s.activations["microbatches_in_flight"] for s in est.stages]
    want = {"1f1b": [p - r for r in range(p)], "gpipe": [32] * p,
            "interleaved": [2 * (p - r - 1) + p + 1 for r in range(p)]}[schedule]
    assert got == want
    for s in est.stages:
        assert [c["in_flight"] for c in s.activations["chunks"]] == in_flight(est.train, s.stage)[0]


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
