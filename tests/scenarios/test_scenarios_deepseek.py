"""memlib.scenarios.deepseek: DeepSeek-V3's own recipe as a configuration of any model, the ablation
of its memory techniques, the per-rank values and the ledger, with DeepSeek-V3's peaks pinned in bytes."""
from __future__ import annotations

from dataclasses import fields

import pytest

from memlib import estimate
from memlib.config import ConfigError, model_from_dict
from memlib.device.overhead import OVERHEAD_PRESETS
from memlib.model.partition import balanced_layout
from memlib.scenarios import deepseek as ds
from memlib.device.schedule import in_flight

import tiny as T

MODELS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")


@pytest.fixture(scope="module")
def v3_rows():
    return ds.ablation("deepseek-v3", ds.deepseek_recipe("deepseek-v3"))


@pytest.fixture(scope="module")
def v3_est():
    return ds.recipe_estimate("deepseek-v3", ds.deepseek_recipe("deepseek-v3"))


# -- the recipe -----------------------------------------------------------------------------------
def test_the_recipe_of_deepseek_v3_is_the_reports_setup():
    t = ds.deepseek_recipe("deepseek-v3")
    assert (t.pp, t.schedule, t.tp, t.ep, t.etp, t.zero) == (16, "dualpipe", 1, 64, 1, 1)
    assert (t.precision, t.recompute, t.profile) == ("deepseek-v3", "deepseek", "megatron")
    assert t.world_size == 2048 and t.dp == 128 and t.edp == 2
    assert (t.micro_batch, t.seq_len) == (1, 4096)
    assert t.layout == (3,) + (4,) * 14 + (2,) and sum(t.layout) == 61
    assert t.world_size == ds.REPORT["gpus"]


def test_the_recipe_of_other_models():
    v2 = ds.deepseek_recipe("deepseek-v2")               # 60 layers, 160 experts: EP 32 (40 does not divide DP 128)
    assert (v2.pp, v2.ep, v2.dp, v2.edp) == (16, 32, 128, 4) and v2.layout == balanced_layout(60, 16)
    lite = ds.deepseek_recipe("deepseek-v2-lite")        # 27 layers, 64 experts
    assert (lite.pp, lite.ep, lite.edp) == (16, 64, 2) and lite.layout == balanced_layout(27, 16)
    for t in (v2, lite):
        assert (t.schedule, t.tp, t.zero, t.precision, t.recompute) == ("dualpipe", 1, 1, "deepseek-v3", "deepseek")
    tiny = ds.deepseek_recipe(T.tiny())                  # 3 layers: the largest even PP is 2; 4 experts
    assert (tiny.pp, tiny.ep, tiny.layout) == (2, 4, (1, 2))
    for m in ("deepseek-v2", "deepseek-v2-lite", T.tiny()):
        est = ds.recipe_estimate(m, ds.deepseek_recipe(m))
        assert len(est.stages) == ds.deepseek_recipe(m).pp and est.peak.total > 0


def test_a_one_layer_model_has_no_dualpipe_recipe():
    one = model_from_dict({**T.TINY_HF, "num_hidden_layers": 1}, name="one-layer")
    with pytest.raises(ConfigError, match="two pipeline stages"):
        ds.deepseek_recipe(one)


# -- the ablation ---------------------------------------------------------------------------------
def _changed(a, b) -> set[str]:
    return {f.name for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)}


def test_the_ablation_steps_in_order_one_change_each():
    t = ds.deepseek_recipe("deepseek-v3")
    steps = ds.ablation_steps(t)
    assert [s.key for s in steps] == ["baseline", "dualpipe", "zero1", "bf16_moments", "fp8_activations", "recompute"]
    base = steps[0].train
    assert (base.schedule, base.zero, base.precision, base.recompute) == ("1f1b", 0, "megatron", "none")
    assert _changed(base, t) == {"schedule", "zero", "precision", "recompute"}
    assert steps[-1].train == t
    expected = [{"schedule"}, {"zero"}, {"precision"}, {"precision"}, {"recompute"}]
    assert [_changed(a.train, b.train) for a, b in zip(steps, steps[1:])] == expected
    assert [s.train.precision for s in steps[2:5]] == ["megatron", "paper", "deepseek-v3"]
    assert [s.targets for s in steps] == [None, None, "states", "states", "activations", "activations"]


@pytest.mark.parametrize("model", MODELS)
def test_each_technique_never_raises_what_it_targets(model):
    """On every rank, not only on the peak device: the category a technique targets never rises."""
    t = ds.deepseek_recipe(model)
    ests = [ds.recipe_estimate(model, s.train) for s in ds.ablation_steps(t)]
    for step, prev, est in zip(ds.ablation_steps(t)[1:], ests, ests[1:]):
        if step.targets == "states":
            assert all(a.model_states <= b.model_states for a, b in zip(est.stages, prev.stages)), step.key
        elif step.targets == "activations":
            assert all(a.bytes["activations"] <= b.bytes["activations"] for a, b in zip(est.stages, prev.stages)), step.key
    rows = ds.ablation(model, t)
    assert [r["lowers_target"] for r in rows] == [None, None, True, True, True, True]


def test_deepseek_v3_ablation_peaks_exactly(v3_rows):
    """The peak device after each step (rank 1 throughout), low overhead preset, bytes."""
    assert [r["stage"] for r in v3_rows] == [1] * 6
    assert [r["total"] for r in v3_rows] == [150_673_907_556, 197_415_294_444, 165_234_192_876, 162_213_530_296,
                                             120_425_443_615, 75_824_220_856]
    assert [r["states"] for r in v3_rows] == [29_459_349_504, 58_918_699_008, 28_270_030_848, 25_393_209_344,
                                              25_393_209_344, 25_393_209_344]
    assert [r["activations"] for r in v3_rows] == [112_921_927_920, 127_978_184_976, 127_978_184_976,
                                                   127_978_184_976, 88_180_007_184, 45_702_652_176]
    assert [r["overhead"] for r in v3_rows] == [8_292_630_132, 10_518_410_460, 8_985_977_052, 8_842_135_976,
                                                6_852_227_087, 4_728_359_336]
    assert [r["fits"] for r in v3_rows] == [False] * 5 + [True]
    assert [r["microbatches"] for r in v3_rows] == [15] + [17] * 5          # 1F1B: p - r; DualPipe: p + 1
    assert v3_rows[1]["parameters"] == 2 * v3_rows[0]["parameters"]         # rank 1 holds stages 1 and 14
    assert v3_rows[-1]["total"] == 75_824_220_856 and v3_rows[-1]["margin"] == ds.CAPACITY - 75_824_220_856


@pytest.mark.parametrize("model", MODELS)
def test_every_total_is_the_sum_of_its_terms(model):
    rows = ds.ablation(model, ds.deepseek_recipe(model))
    for prev, r in zip([None] + rows, rows):
        assert r["total"] == r["states"] + r["activations"] + r["overhead"] == r["allocated"] + r["overhead"]
        assert r["fits"] == (r["total"] <= ds.CAPACITY) and r["margin"] == ds.CAPACITY - r["total"]
        assert r["change"] == (None if prev is None else r["total"] - prev["total"])
        assert r[r["largest"]] == max(r[k] for k in ds.CATEGORIES)
    s = ds.ablation_summary(rows)
    assert s["saved"] == rows[0]["total"] - rows[-1]["total"]


def test_ablation_summary_by_hand():
    def rows(*fits):
        return [{"key": f"s{i}", "fits": f, "total": 10 - i} for i, f in enumerate(fits)]
    assert ds.ablation_summary(rows(False, False, True)) == {"first_fit": "s2", "only_last_fits": True, "saved": 2,
                                                             "none_fit": False}
    assert ds.ablation_summary(rows(True, False, True, True))["first_fit"] == "s2"
    assert ds.ablation_summary(rows(True, True))["first_fit"] == "s0"
    assert not ds.ablation_summary(rows(True, True))["only_last_fits"]
    s = ds.ablation_summary(rows(False, True, False))
    assert s["first_fit"] is None and not s["none_fit"] and not s["only_last_fits"]
    assert ds.ablation_summary(rows(False, False))["none_fit"]


# -- ranks ----------------------------------------------------------------------------------------
def test_deepseek_v3_ranks(v3_est):
    pk = ds.peak(v3_est)
    assert pk["rank"] == 1 and pk["ranks"] == list(range(1, 15)) and pk["total"] == 75_824_220_856
    assert pk["fits"] and pk["all_fit"] and pk["margin"] == ds.CAPACITY - 75_824_220_856
    assert [(c["stage"], c["layers"], c["in_flight"]) for c in pk["chunks"]] == [(1, 4, 15), (14, 4, 2)]
    r0 = ds.rank_zero(v3_est)
    assert r0["total"] == 67_745_896_504 and r0["layers"] == 5 and r0["peak_layers"] == 8 and r0["mtp"] == 1
    assert r0["lighter"] and not r0["is_peak"] and r0["difference"] == 75_824_220_856 - 67_745_896_504


@pytest.mark.parametrize("model", MODELS)
def test_rank_rows_follow_the_dualpipe_replay(model):
    """Rank r holds the shallow stage h = min(r, p - 1 - r) and the deep one p - 1 - h, with p - h and
    h + 1 micro-batches in flight at its peak (the replay's counts, memlib.device.schedule.in_flight)."""
    t = ds.deepseek_recipe(model)
    est = ds.recipe_estimate(model, t)
    rows = ds.rank_rows(est)
    p = t.pp
    for r in rows:
        h = min(r["rank"], p - 1 - r["rank"])
        assert [c["stage"] for c in r["chunks"]] == [h, p - 1 - h]
        assert [c["in_flight"] for c in r["chunks"]] == in_flight(t, r["rank"]) == [p - h, h + 1]
        assert r["microbatches"] == p + 1
        assert r["states"] == r["weights"] + r["gradients"] + r["optimizer"]
        assert r["total"] == r["states"] + r["activations"] + r["overhead"] and r["fits"] == (r["total"] <= ds.CAPACITY)
    assert rows[ds.peak(est)["rank"]]["total"] == max(r["total"] for r in rows)
    assert all(rows[r]["total"] == rows[p - 1 - r]["total"] for r in range(p))   # same two stages


# -- the ledger -----------------------------------------------------------------------------------
def test_the_ledger_of_a_deepseek_v3_layer(v3_est):
    t = v3_est.train
    rows = ds.ledger_rows("deepseek-v3", t)
    tot = ds.layer_totals("deepseek-v3", t)
    assert tot == {"plain": 1_886_750_728, "recipe": 661_686_276, "saved": 1_886_750_728 - 661_686_276}
    # rank 1's shallow chunk is model stage 1, four MoE layers: its micro-batch is four ledgers
    assert 4 * tot["recipe"] == v3_est.stages[1].activations["chunks"][0]["per_microbatch"]
    assert all(r["recipe"] == 0 for r in rows if r["recomputed"])
    assert all(r["recipe"] <= r["plain"] for r in rows)
    fmt = {r["key"]: r["format"] for r in rows}
    assert "E5M6" in fmt.values() and "fp8" in fmt.values()
    assert any(r["recomputed"] for r in rows) and any(not r["recomputed"] for r in rows)


def test_ledger_kind():
    assert ds.ledger_kind("deepseek-v3") == "moe"
    assert ds.ledger_kind(model_from_dict({**T.TINY_HF, "first_k_dense_replace": 3})) == "dense"


# -- overheads and the worked problem -------------------------------------------------------------
def test_the_overhead_range_of_deepseek_v3():
    o = ds.overhead_range("deepseek-v3", ds.deepseek_recipe("deepseek-v3"))
    assert o["low"]["total"] == 75_824_220_856 and o["low"]["fits"]
    high = estimate("deepseek-v3", ds.V3_TRAIN, OVERHEAD_PRESETS["high"]).peak.total
    assert o["high"]["total"] == high > o["low"]["total"] and not o["high"]["fits"]


def test_two_sequences_per_micro_batch():
    p = ds.micro_batch_change("deepseek-v3", ds.V3_TRAIN, 2)
    assert p["rank"] == 1 and p["states_unchanged"] and p["states"] == p["states_before"] == 25_393_209_344
    # about twice: every token-indexed tensor doubles; a few per-layer constants of Megatron-Core's
    # (the attention mask type kept by a checkpoint) do not
    assert p["activations_before"] == 45_702_652_176 and p["activations_before"] < p["activations"]
    assert p["activations"] <= 2 * p["activations_before"]
    assert not p["fits"] and p["excess"] == -p["margin"] == p["total"] - ds.CAPACITY
    lite = ds.micro_batch_change("deepseek-v2-lite", ds.deepseek_recipe("deepseek-v2-lite"), 2)
    assert lite["fits"] and lite["states_unchanged"]


def test_answer_on_deepseek_v3_and_v2_lite():
    """The book's answer: the paper's layout fits only with recomputation (ZeRO-1 + full on stage 1) and the
    recipe's peak, both against the one capacity of chapters 7-9 (the H800's 81,559 MiB)."""
    from memlib.scenarios import overheads as so
    assert ds.CAPACITY == so.CAPACITY_80GB == 81_559 * 2**20
    a = ds.answer("deepseek-v3")
    assert a["only_with_recompute"] and not a["none_fits"] and a["paper_full_fits"]
    assert (a["paper_full_stage"], a["paper_full_total"]) == (1, 56_893_303_195)          # 52.99 GiB
    assert a["none_best"] == 419_109_195_163                                             # ZeRO-3: 390.33 GiB
    assert a["recipe_train"] == ds.V3_TRAIN and a["recipe_total"] == 75_824_220_856 and a["recipe_fits"]
    assert a["recipe_margin"] == 81_559 * 2**20 - 75_824_220_856 > 0
    lite = ds.answer("deepseek-v2-lite")
    assert lite["none_fits"] and not lite["only_with_recompute"]


def test_attention_switch_between_chapters_8_and_9():
    """Chapter 8's eager attention keeps 5 b n_h s^2 bytes per layer (scores, softmax, dropout output in bf16,
    the mask in one byte) split over TP2; chapter 9's fused attention keeps one fp32 log-sum-exp per query and
    head. The deepseek policy does not fit the first and fits in the recipe."""
    sw = ds.attention_switch("deepseek-v3")
    assert (sw["paper_profile"], sw["recipe_profile"]) == ("paper", "megatron")
    assert sw["paper_core"] == 5 * 128 * 4096**2 // 2 == 5_368_709_120
    assert sw["recipe_core"] == 4 * 128 * 4096 == 2_097_152
    assert not sw["paper_deepseek_fits"] and sw["paper_deepseek_total"] == 415_078_790_760
    assert sw["recipe_fits"] and sw["recipe_total"] == 75_824_220_856
    one = T.tiny(num_hidden_layers=1, first_k_dense_replace=0)             # no DualPipe on one layer
    sw1 = ds.attention_switch(one)
    assert sw1["recipe_total"] is None and sw1["paper_core"] > 0
