"""memlib.scenarios.together: the grid of ZeRO stages x recompute policies against an 80 GB card, no
recomputation, the schedules compared, the worked problems; DeepSeek-V3's numbers for the paper's
configuration, hand-worked values on the tiny model, properties, and DeepSeek-V2 and V2-Lite."""
from __future__ import annotations

from fractions import Fraction

import pytest

from memlib import TrainingConfig, estimate
from memlib.device.overhead import OVERHEAD_PRESETS
from memlib.paper import paper_training
from memlib.scenarios import together as S
from memlib.config import ZeroStage

import tiny as T

Z0, Z1, Z2, Z3 = ZeroStage
ML = S.MODULE_LIST
#: recompute policies ordered by what they drop: the second of each pair drops at least what the first does
STRONGER = [("none", "selective"), ("none", "deepseek"), ("selective", ML), ("deepseek", ML), (ML, "full"),
            ("selective", "full"), ("deepseek", "full")]


def chapter(model):
    est = estimate(model, paper_training(model))
    return est, S.grid(est)


@pytest.fixture(scope="module")
def v3():
    return chapter("deepseek-v3")


@pytest.fixture(scope="module")
def v3_runs(v3):
    return S.schedules(v3[0])


def test_grid_on_deepseek_v3(v3):
    est, g = v3
    assert len(g) == 20 and S.grid_counts(g) == (8, 20)       # 7 against 80e9 bytes; the module list fits 79.65 GiB
    assert S.fitting(g) == [(Z1, "full"), (Z1, ML), (Z2, "selective"), (Z2, "full"), (Z2, ML), (Z3, "selective"), (Z3, "full"),
                            (Z3, ML)]
    c = g[(Z1, "full")]
    assert (c.peak, c.peak_total) == (1, 56_893_303_195)                      # 52.99 GiB on stage 1
    assert g[(Z3, "none")].peak == 0 and g[(Z3, "none")].peak_total == 419_109_195_163   # 390.33 GiB
    assert g[(Z2, "selective")].peak_total == 79_615_263_950 < S.CAPACITY_80GB    # 74.15 GiB: fits, just
    assert g[(Z0, "none")].est is est                                         # the chapter's estimate serves its cell
    for (z, p), cell in g.items():
        assert cell.peak_total == max(cell.totals) == cell.totals[cell.peak]
        assert cell.fits == all(t <= S.CAPACITY_80GB for t in cell.totals)
        assert cell.est.train.zero == z and cell.est.train.recompute == p == cell.name


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2", "deepseek-v2-lite", T.tiny()],
                         ids=["v3", "v2", "v2-lite", "tiny"])
def test_more_zero_and_a_stronger_policy_never_raise_a_total(model):
    _, g = chapter(model)
    for p in S.POLICIES:
        for a, b in zip(S.ZERO_STAGES, S.ZERO_STAGES[1:]):
            assert all(y <= x for x, y in zip(g[(a, p)].totals, g[(b, p)].totals)), (p, a, b)
    for z in S.ZERO_STAGES:
        for weak, strong in STRONGER:
            assert all(y <= x for x, y in zip(g[(z, weak)].totals, g[(z, strong)].totals)), (z, weak, strong)


def test_no_recomputation_on_deepseek_v3(v3):
    _, g = v3
    v = S.no_recompute(g)
    assert (v["zero"], v["stage"], v["layers"], v["in_flight"]) == (Z3, 0, 4, 16)   # 1F1B: stage 0 holds PP
    # four layers' attention scores, softmax and dropout: 5 b n_h s^2 bytes per layer, split over TP 2
    assert v["scores"] == 4 * 5 * 1 * 128 * 4096**2 // 2 == 21_474_836_480
    assert v["per_microbatch"] == 24_677_285_888 and v["share"] == Fraction(v["scores"], v["per_microbatch"])
    assert v["held"] == 16 * v["per_microbatch"] and v["scores_held"] == 16 * v["scores"]
    assert v["without_scores"] == v["held"] - v["scores_held"] and v["held_exceeds"]
    assert v["states"] == 3_197_358_080 and v["best"] == 419_109_195_163
    assert v["n_fit"] == 0 and v["n"] == 4
    assert v["drops_scores"] == {"none": False, "selective": True, "deepseek": False, "full": True, ML: True}
    assert v["policy_fits"] == {"none": 0, "selective": 2, "deepseek": 0, "full": 3, ML: 3}
    assert v["every_fitting_drops"]


def test_no_recomputation_on_the_tiny_model_by_hand():
    """Tiny model, the paper's configuration fitted to it: PP 3 (one layer per stage), TP 2, 1F1B. One
    layer's attention core is 5 b n_h s^2 / TP = 5 x 2 x 4096^2 / 2 bytes; stage 0 holds PP = 3."""
    _, g = chapter(T.tiny())
    v = S.no_recompute(g)
    per_layer = 5 * 1 * 2 * 4096**2 // 2
    assert v["scores"] == v["layers"] * per_layer == 83_886_080
    assert v["scores_held"] == v["in_flight"] * per_layer * v["layers"]
    assert v["in_flight"] == 3 - v["stage"]


def test_interleaved_layouts():
    assert S.interleaved_layout("deepseek-v3", TrainingConfig(pp=16)) == (1,) + (2,) * 29 + (1, 1)
    assert S.interleaved_layout("deepseek-v2", TrainingConfig(pp=16)) == (1,) + (2,) * 28 + (1, 1, 1)
    # 27 layers over 32 virtual stages: the first keeps only the embedding, the last four no decoder layer
    assert S.interleaved_layout("deepseek-v2-lite", TrainingConfig(pp=16)) == (0,) + (1,) * 27 + (0,) * 4
    # the tiny model's 3 layers: over 2 x 2 virtual stages, and over 1 x 2
    assert S.interleaved_layout(T.tiny(), TrainingConfig(pp=2)) == (0, 1, 1, 1)
    assert S.interleaved_layout(T.tiny(), TrainingConfig(pp=1)) == (1, 2)
    for m, pp in (("deepseek-v3", 16), ("deepseek-v2-lite", 16), (T.tiny(), 2)):
        lay = S.interleaved_layout(m, TrainingConfig(pp=pp))
        assert len(lay) == 2 * pp and min(lay) >= 0 and max(lay) - min(lay) <= 1


def test_schedules_on_deepseek_v3(v3_runs):
    r = v3_runs
    assert list(r) == list(S.SCHEDULES)
    got = {k: (x.peak, x.peak_total, x.fits) for k, x in r.items()}
    assert got == {"gpipe": (15, 79_354_093_300, True), "1f1b": (1, 56_893_303_195, True),
                   "interleaved": (2, 58_498_155_316, True), "dualpipe": (1, 102_988_881_921, False)}
    assert {x.train.num_microbatches for x in r.values()} == {32} and r["interleaved"].train.vpp == 2   # one M: 2 PP
    assert r["dualpipe"].peak_stage.model_states == 2 * r["1f1b"].peak_stage.model_states   # two model stages
    assert r["1f1b"].peak_total == S.grid(estimate("deepseek-v3", paper_training("deepseek-v3")),
                                          zero_stages=(Z1,), policies=("full",))[(Z1, "full")].peak_total
    assert S.costs_more(r) == {"gpipe": True, "1f1b": False, "interleaved": True, "dualpipe": True}
    assert S.schedule_counts(r) == (3, 4)


def test_problems_on_deepseek_v3(v3):
    est, g = v3
    b = S.largest_micro_batch(est)
    assert (b["b"], b["total"], b["stage"]) == (3, 77_129_220_916, 1)      # 71.83 GiB
    assert (b["next"], b["next_total"]) == (4, 87_247_179_777)             # 81.26 GiB: over
    assert b["grew_most"] == "working" and b["growth"]["states"] == 0
    sel = S.policy_change(g, "selective")
    assert (sel["fits"], sel["excess"], sel["room"]) == (False, 17_233_747_150, -17_233_747_150)
    assert (sel["other"], sel["other_total"], sel["other_fits"]) == (Z3, 68_045_617_358, True)


def test_largest_micro_batch_is_a_linear_scan_on_the_tiny_model():
    est = estimate(T.tiny(), paper_training(T.tiny()))
    none = OVERHEAD_PRESETS["none"]
    base = S.base_training(est.train)
    peaks = [estimate(T.tiny(), base.with_(micro_batch=b), none).peak.total for b in range(1, 12)]
    assert peaks == sorted(peaks) and len(set(peaks)) == len(peaks)         # a device's bytes grow with b
    for cap_b in (1, 5, 8):
        cap = peaks[cap_b - 1]                                              # the card holds b = cap_b exactly
        got = S.largest_micro_batch(est, capacity=cap, overhead=none)
        assert (got["b"], got["next"], got["total"]) == (cap_b, cap_b + 1, cap)
    assert S.largest_micro_batch(est, capacity=peaks[0] - 1, overhead=none)["b"] == 0


@pytest.mark.parametrize("model, counts, z1_full, runs_fit, sel_fits", [
    ("deepseek-v2", (12, 20), (2, 27_518_525_236), (4, 4), True),
    ("deepseek-v2-lite", (20, 20), (15, 4_866_603_681), (4, 4), True),
])
def test_other_models(model, counts, z1_full, runs_fit, sel_fits):
    est, g = chapter(model)
    assert S.grid_counts(g) == counts
    assert (g[(Z1, "full")].peak, g[(Z1, "full")].peak_total) == z1_full
    r = S.schedules(est)
    assert S.schedule_counts(r) == runs_fit and r["dualpipe"].fits
    assert S.policy_change(g, "selective")["fits"] is sel_fits
    v = S.no_recompute(g)
    if model == "deepseek-v2":
        assert v["n_fit"] == 0 and v["every_fitting_drops"] and v["stage"] == 2 and v["in_flight"] == 14
    else:                                              # small enough to keep every score: no recomputation fits
        assert v["n_fit"] == 4 and not v["every_fitting_drops"] and not v["held_exceeds"]
        assert not S.costs_more(r)["interleaved"]      # and interleaving is cheaper than 1F1B here


def test_routed_count_effect_on_deepseek_v3(v3):
    """With the routed tokens a device holds (4x the paper's count under EP8, TP2), 5 of 20 combinations fit,
    not 8: selective recomputation stops fitting with ZeRO-2 and ZeRO-3, the module list with ZeRO-1; ZeRO-1
    with full recomputation grows by one recomputed layer's routed working set."""
    _, g = v3
    held = S.held_count_grid(g)
    eff = S.routed_count_effect(g, held)
    assert (eff["fit_paper"], eff["fit_held"], eff["n"]) == (8, 5, 20)
    assert eff["lost"] == [(Z1, ML), (Z2, "selective"), (Z3, "selective")]
    assert (eff["paper_total"], eff["held_total"]) == (56_893_303_195, 57_382_149_326) and eff["held_fits"]
    for k in g:                                                       # more tokens never lower a total
        assert held[k].peak_total >= g[k].peak_total


def test_first_idle_is_the_working_set_released_after_the_warm_up(v3_runs):
    """1F1B on the paper's configuration: after its warm-up forwards every rank but the last waits for its
    first backward.  While it waits its memory drops by the working set of its chunk, which the estimate
    counts for every step that computes, and it keeps the saved activations of the micro-batches its
    forwards saved (a forward frees none)."""
    ot = S.memory_timeline(v3_runs)
    est = v3_runs["1f1b"].est
    pp = est.train.pp
    for r in range(pp):
        idle = S.first_idle(ot, r)
        if r == pp - 1:                         # the last rank turns each forward round at once: it never waits
            assert idle is None
            continue
        chunk = est.stages[r].activations["chunks"][0]
        assert idle["released"] == 0 and idle["drop"] == idle["working"] == chunk["recompute_working_set"] > 0
        warm = [row for row in ot.rows[r] if row.slot.end <= idle["start"]]
        assert all(row.slot.ops[0].kind == "F" for row in warm) and idle["start"] == warm[-1].slot.end
        assert idle["held"] == len(warm) * chunk["per_microbatch"]
        assert idle["end"] > idle["start"]
    assert S.first_idle(ot) == S.first_idle(ot, ot.peak_rank)
