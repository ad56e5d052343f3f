"""memlib.paper.zero and memlib.paper.static: the paper's Tables 6 and 8 and the sharding rule, for the
paper's configuration (its printed values) and for a tiny model worked by hand."""
from __future__ import annotations

import pytest

from memlib import PAPER_TRAINING, TrainingConfig, estimate
from memlib.paper import analysed_stage, is_paper_model, moe_stages, paper_training
from memlib.paper import static as pstatic
from memlib.paper import zero as pzero
from memlib.model.partition import Partition
from memlib.data.reference import PAPER
from memlib.scenarios.sweeps import ep_sweep, recipe_change
from memlib.model.states import ZeroStage

import tiny as T


@pytest.fixture(scope="module")
def v3():
    return estimate("deepseek-v3", PAPER_TRAINING)


def test_paper_model_and_configuration():
    assert is_paper_model("deepseek-v3") and not is_paper_model("deepseek-v2")
    assert not is_paper_model(T.tiny())
    assert paper_training("deepseek-v3") is PAPER_TRAINING
    v2 = paper_training("deepseek-v2")          # 60 layers: the default layout leaves stage 15 empty
    assert v2.pp == 16 and sum(v2.layout) == 60 and min(v2.layout) >= 1
    lite = paper_training("deepseek-v2-lite")   # 27 layers, 16 heads, 64 experts
    assert sum(lite.layout) == 27 and lite.tp == 2 and lite.ep == 8
    tiny = paper_training(T.tiny())             # 3 layers, 2 heads, 4 experts: PP 3, TP 2, EP 4
    assert (tiny.pp, tiny.tp, tiny.ep) == (3, 2, 4)


def test_the_analysed_stage_is_the_first_moe_only_stage(v3):
    assert analysed_stage(v3.partition) == 1 and moe_stages(v3.partition) == list(range(1, 15))


def test_table6_is_the_papers(v3):
    t6 = pstatic.table6(v3.partition, 1)
    for row in ("RMSNorm", "MLA", "non-MoE", "MoE", "total"):
        assert t6[row] == PAPER["table6"][row]["params"], row
    assert t6["MLA, split"] == PAPER["mla_tp_split"] and t6["MLA, replicated"] == PAPER["mla_replicated"]


def test_table8_is_the_papers_exact_bytes(v3):
    t8 = pzero.table8(v3, 1)
    assert [t8[z]["total"] for z in ZeroStage] == [87_505_108_992, 43_430_264_832, 21_392_842_752, 10_374_131_712]
    assert all(r["total"] == r["parameters"] + r["gradients"] + r["optimizer_states"] for r in t8.values())
    assert pzero.printed_sum(PAPER["table8"][0]) == "81.54" and pzero.printed_sum(PAPER["table8"][1]) == "40.46"


def test_sharding_rules(v3):
    sh = pzero.sharding(v3.partition, 1)
    assert sh["paper"]["shard"] == PAPER["zero_sharded_params"]
    # Megatron moves the router and the shared expert (4 layers of N h + 3 N_s h h_E) to the DP side
    assert sh["difference"]["moved"] == 4 * (256 * 7168 + 3 * 7168 * 2048)
    assert sh["megatron"]["shard"] < sh["paper"]["shard"]
    rules = pzero.rule_totals(v3.partition, 1)
    assert rules["paper"][ZeroStage.OS] == pzero.table8(v3, 1)[ZeroStage.OS]["total"]


def test_tiny_sharding_by_hand():
    """Tiny model, one stage (PP 1), DP 2, EP 2: P_e is the two MoE layers' routed experts on one EP
    rank (2 x 384 / 2 = 384); under the paper's rule the router (2 x 32) and the shared experts
    (2 x 96) join them."""
    part = Partition(T.tiny(), TrainingConfig(dp=2, ep=2))
    sh = pzero.sharding(part, 0)
    assert sh["megatron"]["P_e"] == 384 and sh["paper"]["P_e"] == 384 + 2 * 32 + 2 * 96
    assert sh["megatron"]["P_e"] + sh["megatron"]["P_ne"] == sh["paper"]["P_e"] + sh["paper"]["P_ne"]
    assert sh["paper"]["e_div"] == 1 and sh["paper"]["ne_div"] == 2            # EDP = DP TP CP / EP = 1


def test_megatron_table_matches_its_docs():
    rows = pzero.megatron_bytes()
    assert [r["recipe"] for r in rows] == ["megatron-fp16", "megatron", "fp32"] and all(r["match"] for r in rows)
    assert pzero.megatron_per_param(pzero.RECIPES["megatron"]) == 6 + 12 / pzero.D


def test_zero_paper_example():
    ex = pzero.zero_paper_example()
    assert ex["bytes"][ZeroStage.NONE] == 16 * 7_500_000_000                    # (2 + 2 + K) Psi
    assert ex["bytes"][ZeroStage.OS_G_PARAMS] == -(-16 * 7_500_000_000 // 64)


def test_ep_sweep_and_recipe_change(v3):
    rows = ep_sweep(v3, 1)
    assert [r["ep"] for r in rows] == [1, 2, 4, 8, 16, 32, 64] and [r["edp"] for r in rows][-1] == 1
    assert rows[0]["paper"] < rows[-1]["paper"]                                 # the paper's rule rises with EP
    assert len({r["megatron"] for r in rows}) == 1                              # Megatron's does not move
    # the columns differ by the sharding rule alone: at the book's EP, Megatron's column is the rule's ZeRO-3
    # total that chapter 5's prose quotes, on the same (paper) partition
    at8 = next(r for r in rows if r["ep"] == 8)
    assert at8["megatron"] == pzero.rule_totals(v3.partition, 1)["megatron"][ZeroStage.OS_G_PARAMS] == 10_133_286_912
    # with EP = 1, EDP = 64 exceeds DP CP = 32: the paper's rule shards the router and shared expert wider
    assert rows[0]["paper"] < rows[0]["megatron"]
    r = recipe_change(v3, 1, "megatron", ZeroStage.OS)
    assert r["delta"] == r["total"] - r["base"] > 0
    sh = pzero.sharding(v3.partition, 1)["paper"]["shard"]
    assert r["delta"] == (12 - 8) * sh                                          # 4 more bytes per owned parameter
