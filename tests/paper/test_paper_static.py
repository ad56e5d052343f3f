"""memlib.paper.static and memlib.scenarios.static: the paper's Tables 5 and 6, each tensor's layout,
every stage under both conventions and the chapter's worked problems, for the paper's configuration
(its printed values), for a tiny model worked by hand, and for DeepSeek-V2 and V2-Lite."""
from __future__ import annotations

from fractions import Fraction

import pytest

from memlib import PAPER_TRAINING, ConfigError, TrainingConfig, estimate
from memlib.paper import analysed_stage, paper_training
from memlib.paper import static as pstatic
from memlib.model.partition import Partition
from memlib.data.reference import PAPER
from memlib.scenarios import static as sstatic

import tiny as T


@pytest.fixture(scope="module")
def v3():
    return estimate("deepseek-v3", PAPER_TRAINING)


@pytest.fixture(scope="module", params=["deepseek-v2", "deepseek-v2-lite"])
def other(request):
    return estimate(request.param, paper_training(request.param))


# ------------------------------------------------------------------------------------------------
# the paper's configuration: its printed values
# ------------------------------------------------------------------------------------------------

def test_table5_is_the_papers():
    t5 = pstatic.table5(PAPER_TRAINING)
    assert list(t5) == list(pstatic.TABLE5_KEYS)
    assert {k: t5[k] for k in PAPER["table5"]} == PAPER["table5"]
    assert t5["devices"] == 32 * 2 * 1 * 16 and t5["edp"] == 32 * 2 // 8 == 8
    assert pstatic.printed_table5("deepseek-v3") == PAPER["table5"] and pstatic.printed_table5("deepseek-v2") == {}


def test_table6_and_its_bytes_are_the_papers(v3):
    t6, b6 = pstatic.table6(v3.partition, 1), pstatic.table6_bytes(v3.partition, 1)
    assert list(t6) == list(pstatic.TABLE6_ROWS)
    assert (t6["total"], t6["MLA, split"], t6["MLA, replicated"], t6["MoE"]) == (
        6_250_364_928, 318_767_104, 110_886_912, 5_820_645_376)
    assert b6["total"] == 12_500_729_856 and b6["MLA"] == 859_308_032
    assert t6["total"] == t6["non-MoE"] + t6["MoE"] and t6["non-MoE"] == t6["MLA"] + t6["RMSNorm"]
    for row, p in PAPER["table6"].items():
        assert (t6[row], b6[row]) == (p["params"], p["bytes"]), row


def test_comparison_with_the_printed_table(v3):
    part = v3.partition
    printed = pstatic.printed_table6("deepseek-v3")
    assert list(printed) == list(pstatic.TABLE6_ROWS)
    assert printed["MLA, split"] == {"params": PAPER["mla_tp_split"]}
    rows = pstatic.compare_table6(part, 1)
    assert all(r["params"] for r in rows.values()) and pstatic.table6_matches(part, 1) is True
    # 859,308,032 bytes are 0.80 GiB, printed 0.82; 10.84 and 11.64 round correctly
    assert pstatic.printed_memory_slips(part, 1) == ["MLA", "non-MoE"]
    assert rows["total"]["memory"] and rows["MoE"]["memory"] and rows["RMSNorm"]["memory"]


def test_a_wrong_count_would_not_match(v3, monkeypatch):
    """The comparison can fail: one printed count changed by one parameter."""
    bad = {**PAPER["table6"], "MoE": {**PAPER["table6"]["MoE"], "params": 5_820_645_377}}
    monkeypatch.setitem(PAPER, "table6", bad)
    assert pstatic.table6_matches(v3.partition, 1) is False


def test_shares(v3):
    sh = pstatic.shares(v3.partition, 1)
    assert sh["MoE"] == Fraction(5_820_645_376, 6_250_364_928) and sh["total"] == 1
    assert sh["tp"] + sh["replicated"] + sh["expert"] == 1
    # the routed experts: 4 layers x 32 experts x 3 h h_E
    assert sh["expert"] == Fraction(4 * 32 * 3 * 7168 * 2048, 6_250_364_928)
    assert pstatic.largest_share(v3.partition, 1) == "expert"


def test_tensor_layout(v3):
    rows = {r["key"]: r for r in pstatic.tensor_layout(v3.partition)}
    assert rows["attention.W_QR"]["paper"] == {"sharding": "replicated", "per_device": 128 * 64 * 1536}
    assert rows["attention.W_QR"]["megatron"] == {"sharding": "tp", "per_device": 128 * 64 * 1536 // 2}
    assert rows["routed_experts.up"]["paper"] == {"sharding": "expert", "per_device": 32 * 2048 * 7168}
    assert rows["shared_experts.down"]["paper"]["sharding"] == "replicated"
    assert "router.e_score_correction_bias" not in rows                       # a buffer, not a parameter
    # one MoE layer of the paper's column, times 4 layers, is Table 6's total
    assert 4 * sum(r["paper"]["per_device"] for r in rows.values()) == 6_250_364_928


def test_every_stage(v3):
    rows = pstatic.stage_rows(v3.partition)
    assert [r["stage"] for r in rows] == list(range(16))
    assert all(r["paper"]["params"] == 6_250_364_928 for r in rows[1:15])
    assert all(r["megatron"]["params"] == 6_137_118_720 for r in rows[1:15])
    first, last = rows[0], rows[-1]
    assert (first["dense"], first["moe"], first["first"]) == (3, 1, True)
    assert (last["moe"], last["last"], last["paper"]["mtp"], last["megatron"]["mtp"]) == (1, True, False, True)
    assert (first["paper"]["params"], last["paper"]["params"], last["megatron"]["params"]) == (
        2_942_763_008, 2_025_937_920, 4_046_647_296)
    for r in rows:
        for p in pstatic.PROFILE_NAMES:
            v = r[p]
            assert v["params"] == sum(v["split"].values()) == sum(v["blocks"].values())
            assert v["bytes"] == 2 * v["params"] == sum(v["block_bytes"].values()) == sum(v["split_bytes"].values())
        assert r["difference"] == r["megatron"]["params"] - r["paper"]["params"]
    assert pstatic.largest_stages(v3.partition, 1) == {"stages": list(range(1, 15)), "params": 6_250_364_928,
                                                       "bytes": 12_500_729_856, "includes": True}
    assert [s for s, yes in pstatic.expert_majority(v3.partition).items() if not yes] == [0]
    assert pstatic.layout_rule(v3.partition) == {"rule": "default", "default_fits": True}


def test_profile_comparison(v3):
    pc = pstatic.profile_comparison(v3.partition, 1)
    assert (pc["wqr"], pc["shared"], pc["stage"]) == (25_165_824, 88_080_384, 113_246_208)
    assert pc["stage"] == pc["wqr"] + pc["shared"] and pc["stage_bytes"] == 2 * pc["stage"]
    assert pc["megatron_stage_bytes"] == 12_274_237_440 and pc["paper_stage_bytes"] == 12_500_729_856
    assert pc["tensors"] == ["attention.W_QR", "shared_experts.gate", "shared_experts.up", "shared_experts.down"]
    assert pc["has_mtp"] and pc["last_grows"] and pc["mtp"] == 2_049_020_928 and pc["final_norm"] == 7168


def test_worked_problems(v3):
    assert sstatic.next_ep(v3) == 16
    ep = sstatic.more_ep(v3)
    assert (ep["ep"], ep["edp"], ep["label"], ep["params"]) == (16, 4, "PP16@TP2@EP16@ETP1", 3_431_792_640)
    assert ep["experts"]["per_device"] == 4 * (16 + 1)
    # half the routed experts: 4 layers x 16 experts x 3 h h_E fewer
    assert ep["saved_params"] == 4 * 16 * 3 * 7168 * 2048 and ep["saved_bytes"] == 2 * ep["saved_params"]
    tp = sstatic.no_tp(v3)
    assert (tp["tp"], tp["dp"], tp["label"]) == (1, 64, "PP16@TP1@EP8@ETP1")
    assert tp["extra_params"] == PAPER["mla_tp_split"] and tp["mla"] == 748_421_120
    assert tp["changed"] == ["mla_split"] and tp["only_mla"]
    assert tp["mla_share"] == Fraction(748_421_120, 6_569_132_032)


def test_no_tp_on_a_dense_model():
    """Llama-3-8B's stage 0 (2 layers and the embedding): TP split every matrix, so without it the attention, the
    dense FFN and the embedding all double; only the block norms (4 of h = 4,096) stay."""
    est = estimate("llama-3-8b", paper_training("llama-3-8b"))
    tp = sstatic.no_tp(est, 0)
    assert tp["changed"] == ["mla_split", "dense_ffn", "embedding"] and not tp["only_mla"]
    norms = 4 * 4096
    assert tp["params"] == 961_560_576 and tp["extra_params"] == (961_560_576 - norms) // 2
    assert tp["growth"] == Fraction(961_560_576, 961_560_576 - (961_560_576 - norms) // 2)


# ------------------------------------------------------------------------------------------------
# the tiny model, by hand
# ------------------------------------------------------------------------------------------------

def test_tiny_table6_by_hand():
    """Tiny model (tests/tiny.py) on three stages (one layer each), TP 2, EP 2, DP 2: stage 1 holds
    the MoE layer 1.  Paper convention: MLA split (W^UQ 36 + W^UK 24 + W^UV 40 + W^O 80) / 2 = 90;
    replicated W^DQ 48 + W^QR 24 + W^DKV 32 + W^KR 16 = 120; norms q 6 + kv 4 + 2 h 16 = 26;
    MoE router 32 + shared 96 + routed 384 / 2 = 320."""
    part = Partition(T.tiny(), TrainingConfig(dp=2, tp=2, ep=2, pp=3))
    t6 = pstatic.table6(part, 1)
    assert (t6["MLA, split"], t6["MLA, replicated"], t6["RMSNorm"], t6["MoE"]) == (90, 120, 26, 320)
    assert t6["total"] == 556 and pstatic.table6_bytes(part, 1)["total"] == 2 * 556
    rows = pstatic.stage_rows(part)
    assert rows[1]["paper"]["params"] == 556
    assert rows[1]["paper"]["split"] == {"tp": 90, "replicated": 120 + 26 + 32 + 96, "expert": 192}
    # stage 0: the dense layer 0 and the vocabulary-parallel embedding (v h / TP)
    b0 = rows[0]["paper"]["blocks"]
    assert (b0["embedding"], b0["dense_ffn"], b0["attention"], b0["norms"]) == (40, 192, 90 + 120 + 10, 16)
    # stage 2: the MoE layer 2, the final norm (replicated) and the head (v h / TP)
    b2 = rows[2]["paper"]["blocks"]
    assert (b2["final_norm"], b2["head"], rows[2]["paper"]["params"]) == (8, 40, 556 + 8 + 40)
    # the embedding copy for the MTP modules would go to the last stage: the tiny model has none
    assert not rows[2]["megatron"]["mtp"]
    # Megatron splits W^QR (24 -> 12) and the shared experts (96 -> 48)
    pc = pstatic.profile_comparison(part, 1)
    assert (pc["wqr"], pc["shared"], pc["stage"]) == (12, 48, 60)
    assert not pc["has_mtp"] and not pc["last_grows"] and pc["megatron_last"] == 556 + 48 - 60
    assert pstatic.shares(part, 1)["expert"] == Fraction(192, 556)
    assert pstatic.largest_share(part, 1) == "replicated"                    # 274 of 556
    assert pstatic.printed_table6(part.model) == {} and pstatic.compare_table6(part, 1) == {}
    assert pstatic.table6_matches(part, 1) is None and pstatic.printed_memory_slips(part, 1) == []


def test_tiny_largest_stage_and_layout():
    part = Partition(T.tiny(), TrainingConfig(dp=2, pp=3, ep=2))
    rows = pstatic.stage_rows(part)
    assert [(r["dense"], r["moe"]) for r in rows] == [(1, 0), (0, 1), (0, 1)]
    # stage 0: the dense layer 710 and the embedding 80; stage 1: 838 - 384 / 2; stage 2: that, the final norm and head
    assert [r["paper"]["params"] for r in rows] == [790, 646, 734]
    assert pstatic.largest_stages(part, 1) == {"stages": [0], "params": 790, "bytes": 2 * 790, "includes": False}
    assert pstatic.expert_majority(part) == {0: False, 1: False, 2: False}
    assert pstatic.layout_rule(part) == {"rule": "default", "default_fits": True}
    five = T.tiny(num_hidden_layers=5)
    # default (3, 2); balanced (2, 3); anything else is given
    for layout, rule in (((3, 2), "default"), ((2, 3), "balanced"), ((4, 1), "given")):
        p = Partition(five, TrainingConfig(dp=2, pp=2, ep=2, layout=layout))
        assert pstatic.layout_rule(p) == {"rule": rule, "default_fits": True}, layout
    # 60 layers on 16 stages: the default rule leaves the last empty, paper_training balances them
    v2 = Partition("deepseek-v2", paper_training("deepseek-v2"))
    assert pstatic.layout_rule(v2) == {"rule": "balanced", "default_fits": False}


def test_tiny_next_ep():
    assert sstatic.next_ep(estimate(T.tiny(), TrainingConfig(dp=4, ep=2))) == 4     # 4 experts, 4 ranks
    with pytest.raises(ConfigError):
        sstatic.next_ep(estimate(T.tiny(), TrainingConfig(dp=2, ep=2)))              # only 2 ranks
    assert sstatic.next_ep(estimate(T.tiny(n_routed_experts=6), TrainingConfig(dp=6, ep=2))) == 3


# ------------------------------------------------------------------------------------------------
# other models: DeepSeek-V2 and V2-Lite
# ------------------------------------------------------------------------------------------------

def test_other_models_have_no_printed_values(other):
    part = other.partition
    i = analysed_stage(part)
    assert pstatic.printed_table5(other.model) == {} and pstatic.printed_table6(other.model) == {}
    assert pstatic.compare_table6(part, i) == {} and pstatic.table6_matches(part, i) is None
    assert pstatic.table6(part, i)["total"] != PAPER["table6"]["total"]["params"]


def test_deepseek_v2():
    est = estimate("deepseek-v2", paper_training("deepseek-v2"))
    part = est.partition
    t6 = pstatic.table6(part, 1)
    # stage 1 holds 3 MoE layers; h 5120, h_E 1536, 160 experts, 2 shared, 128 heads, d_c' 1536, d_c 512
    h, he, n, ns = 5120, 1536, 160, 2
    assert t6["MoE"] == 3 * (n * h + 3 * ns * h * he + 3 * (n // 8) * h * he) == 1_559_592_960
    assert t6["MLA, split"] == 3 * 128 * (128 * 1536 + 128 * 512 + 128 * 512 + h * 128) // 2 == 188_743_680
    assert t6["total"] == 1_818_562_560
    big = pstatic.largest_stages(part, 1)
    assert big["stages"] == list(range(2, 14)) and big["includes"] is False              # 4 layers, not 3
    pc = pstatic.profile_comparison(part, 1)
    assert not pc["has_mtp"] and not pc["last_grows"] and pc["mtp"] == 0
    ep, tp = sstatic.more_ep(est), sstatic.no_tp(est)
    assert (ep["ep"], ep["experts"]["routed"], ep["experts"]["per_device"]) == (16, 10, 3 * 12)
    assert tp["extra_params"] == t6["MLA, split"] and tp["only_mla"]


def test_deepseek_v2_lite():
    est = estimate("deepseek-v2-lite", paper_training("deepseek-v2-lite"))
    part = est.partition
    t6 = pstatic.table6(part, 1)
    # one MoE layer; no query compression (W^Q split, W^QR replicated), h 2048, h_E 1408, 64 experts, 2 shared
    h = 2048
    assert t6["MLA, split"] == 16 * (128 * h + 128 * 512 + 128 * 512 + 128 * h) // 2 == 5_242_880
    assert t6["MLA, replicated"] == 512 * h + 16 * 64 * h + 64 * h == 3_276_800
    assert t6["RMSNorm"] == 512 + 2 * h and t6["total"] == 95_162_880
    keys = [r["key"] for r in pstatic.tensor_layout(part)]
    assert "attention.W_Q" in keys and "attention.W_DQ" not in keys
    big = pstatic.largest_stages(part, 1)
    assert big["stages"] == [15] and big["params"] == 200_022_528                       # the head's stage
    assert [s for s, yes in pstatic.expert_majority(part).items() if not yes] == [0, 15]
