"""memlib.paper.parameters and memlib.scenarios.models: the paper's Tables 2-4 and the totals for
DeepSeek-V3 (its printed values), for a tiny model worked by hand (tests/tiny.py) and for
DeepSeek-V2 and V2-Lite."""
from __future__ import annotations

from fractions import Fraction

import pytest

from memlib import PAPER_TRAINING, TrainingConfig, load_model
from memlib.formulas import formula
from memlib.paper import moe_stages, paper_training
from memlib.paper import parameters as pp
from memlib.model.params import values
from memlib.model.partition import Partition
from memlib.data.reference import PAPER
from memlib.scenarios import models as sm

import tiny as T

V3_TOTAL = 671_026_404_352


@pytest.fixture(scope="module")
def v3():
    return load_model("deepseek-v3")


@pytest.fixture(scope="module")
def v3_part(v3):
    return Partition(v3, PAPER_TRAINING)


# --------------------------------------------------------------------------------------------
# DeepSeek-V3: the paper's numbers
# --------------------------------------------------------------------------------------------
def test_v3_totals_and_blocks(v3):
    t = pp.totals(v3)
    assert t["total"] == V3_TOTAL and t["activated"] == 37_552_282_624
    assert t["activated_no_embedding"] == 36_625_603_584 == t["activated"] - t["embedding"]
    assert t["total"] == sum(t["blocks"].values())
    b = pp.layer_blocks(v3)
    assert b["mla"] == PAPER["mla_per_layer"] == 187_107_328 == b["mla_matrices"] + b["mla_latent_norms"]
    assert b["moe"] == PAPER["moe_ffn_per_layer"] == b["router"] + b["shared_experts"] + b["routed_experts"]
    assert (b["mla_matrix_count"], b["mla_norm_count"], b["mla_latent_norms"]) == (8, 2, 512 + 1536)
    assert b["moe_layer"] == 11_507_286_016 and b["layer_norms"] == 16_384 and b["expert"] == 44_040_192
    assert t["routed_share"] == Fraction(b["routed_experts"] * 58, V3_TOTAL)
    assert all(c["equal"] for c in pp.per_layer_check(v3).values())
    assert t["mtp"] == 11_610_067_968 == t["mtp_block"] + t["mtp_proj"] + t["mtp_norms"]
    assert t["mtp_block"] == b["moe_layer"] and t["mtp_proj"] == 2 * 7168 * 7168
    assert t["checkpoint"] == 684_489_830_400 == t["total"] + t["mtp"] + 2 * 129_280 * 7168
    assert (t["buffers"], t["bias_per_layer"], t["moe_layers"]) == (58 * 256, 256, 58)


def test_v3_table3(v3):
    rows = pp.layer_groups(v3)
    assert [r["key"] for r in rows] == list(k for k in PAPER["table3"] if k != "total")
    assert [r["params"] for r in rows] == [1_510_162_432, 583_483_392, 11_507_286_016, 12_433_972_224]
    assert sum(r["params"] * r["count"] for r in rows) == V3_TOTAL
    assert all(r["params"] == sum(r["terms"].values()) and r["bytes"] == 2 * r["params"] for r in rows)
    checks = {r["key"]: r for r in pp.table3_check(v3)}
    assert checks["total"]["params"] == V3_TOTAL
    wrong = [(k, c) for k, r in checks.items() for c in ("params_agree", "gib_agree") if not r[c]]
    assert wrong == [("3-59", "gib_agree")]                                   # 21.434 GiB printed 21.44
    assert pp.rounds_to(checks["3-59"]["gib_from_rounded"], PAPER["table3"]["3-59"]["memory_gb"])  # from 11.51B


def test_v3_table4(v3_part):
    rows = pp.stage_groups(v3_part)
    assert [r["key"] for r in rows] == list(PAPER["table4"])
    assert [r["params"] for r in rows] == [14_184_415_232, 46_029_144_064, 12_433_972_224]
    assert [(r["dense"], r["moe"], r["layers"]) for r in rows] == [(3, 1, (0, 3)), (0, 4, (4, 59)), (0, 1, (60, 60))]
    checks = pp.table4_check(v3_part)
    assert [(c["params_agree"], c["gib_agree"]) for c in checks] == [(False, True), (True, True), (True, True)]
    s0 = pp.printed_stage_sum(pp.paper_layers_of_stage(0))
    assert [k for k, _ in s0["terms"]] == ["0", "1-2", "1-2", "3-59"]
    assert s0["sum"] == Fraction("14.16") == pp.printed_billions(PAPER["table4"]["0"]["params"])
    st = pp.stage_summary(v3_part)
    assert st["largest"] == 46_029_144_064 and st["largest_stages"] == list(range(1, 15)) == st["moe_stages"]
    assert st["largest_are_moe_stages"] and st["sum"] == V3_TOTAL and st["dense_stages"] == [0]
    assert pp.is_paper_layout(v3_part) and pp.layout_rule(v3_part) == "default"


def test_v3_devices_and_figure(v3_part):
    dev = pp.largest_device(v3_part)
    assert dev["params"] == PAPER["table6"]["total"]["params"] and dev["bytes"] == PAPER["table6"]["total"]["bytes"]
    assert dev["stages"] == list(range(1, 15))
    blocks = pp.stage_block_weights(v3_part)
    assert [sum(b.values()) for b in blocks] == [2 * n for n in pp.stage_counts(v3_part)]
    assert pp.routed_largest(v3_part) == {"routed_largest": 16, "moe_stages": 16}
    # under Megatron's profile the last stage holds the MTP module too, and the figure shows it
    me = Partition("deepseek-v3", PAPER_TRAINING.with_(profile="megatron"))
    last = pp.stage_block_weights(me)[-1]
    assert last["mtp"] > 0 and sum(last.values()) == 2 * pp.stage_counts(me)[-1]


def test_v3_statements(v3):
    rows = {(r["statement"], r["quantity"]): r for r in pp.official_rows(v3)}
    assert list(dict.fromkeys(r["statement"] for r in pp.official_rows(v3))) == [
        "total", "activated", "activated_weights_doc", "mtp", "checkpoint"]
    assert rows[("total", "total")]["rounds"]
    card = rows[("activated", "activated")]
    assert card["truncates"] and not card["rounds"]                            # 37.55B -> "37"
    doc = rows[("activated_weights_doc", "activated_no_embedding")]
    assert doc["closest"] and not doc["rounds"] and doc["difference"] == 36_700_000_000 - 36_625_603_584
    assert rows[("mtp", "mtp_block")]["rounds"] and not rows[("mtp", "mtp")]["rounds"]
    assert not rows[("checkpoint", "checkpoint")]["rounds"]                     # 684.49B, printed 685


def test_printed_value_helpers():
    m = pp.matches_printed(2_453_000_000, "2.4")
    assert m["truncates"] and not m["rounds"] and m["digits"] == 1 and m["difference"] == -53_000_000
    assert pp.rounds_to(Fraction("1249.88"), "1250") and not pp.rounds_to(Fraction("21.434"), "21.44")
    assert pp.printed_offset(Fraction("21.434"), "21.44") == Fraction("0.01")
    assert pp.printed_billions("14.16B") == Fraction(354, 25) and pp.printed_billions("671") == 671
    u = pp.gib_and_gb()
    assert u["excess"] == Fraction(2**30 - 10**9, 10**9) and u["gib_in_gb"] == Fraction(2**30, 10**9)
    mis = pp.misread_gib(12_500_729_856)                                       # "11.64 GB"
    assert mis["printed"] == Fraction("11.64") and mis["budget"] == 11_640_000_000
    assert mis["shortfall"] == 12_500_729_856 - 11_640_000_000
    assert mis["shortfall_share"] == Fraction(mis["shortfall"], 11_640_000_000)
    assert pp.misread_gib(1000)["shortfall_share"] is None                      # printed "0.00"
    assert pp.runs("aabbba") == [("a", 0, 1), ("b", 2, 4), ("a", 5, 5)]
    assert pp.index_runs([0, 2, 3, 4, 7]) == [(0, 0), (2, 4), (7, 7)] and pp.index_runs([]) == []
    assert pp.row_key(3, 59) == "3-59" and pp.row_key(0, 0) == "0"


# --------------------------------------------------------------------------------------------
# the tiny model, by hand
# --------------------------------------------------------------------------------------------
def test_tiny_blocks_by_hand():
    b = pp.layer_blocks(T.tiny())
    assert b["mla"] == T.MLA and b["mla_latent_norms"] == 6 + 4 and b["mla_matrices"] == T.MLA - 10
    assert (b["norms"], b["layer_norms"], b["dense_ffn"]) == (T.NORMS, T.NORMS + 10, T.DENSE_FFN)
    assert (b["router"], b["shared_experts"], b["routed_experts"]) == (T.ROUTER, T.SHARED, T.ROUTED)
    assert b["expert"] == 3 * 8 * 4 and b["moe"] == T.ROUTER + T.SHARED + T.ROUTED
    assert (b["dense_layer"], b["moe_layer"]) == (T.DENSE_LAYER, T.MOE_LAYER)
    assert (b["embedding"], b["head"], b["final_norm"]) == (T.EMBEDDING, T.HEAD, T.FINAL_NORM)
    # without q compression: W^Q (6 x 8) and W^QR (4 x 8) read h directly, one latent norm
    nq = pp.layer_blocks(T.tiny(q_lora_rank=None))
    assert nq["mla"] == 48 + 32 + 32 + 16 + 4 + 24 + 40 + 80
    assert (nq["mla_matrix_count"], nq["mla_norm_count"]) == (7, 1)
    w = pp.mla_widths(T.tiny())
    assert (w["qk"], w["rope_share"], w["kv_cache"], w["mha_kv"]) == (5, Fraction(2, 5), 6, 2 * 5 + 2 * 5)
    assert pp.expert_counts(T.tiny()) == {"dense_layers": 1, "moe_layers": 2, "routed": 8, "shared": 2}


def test_tiny_tensor_rows_by_hand():
    rows = {r["tensor"].key: r for r in pp.tensor_rows(T.tiny())}
    assert rows["attention.W_UQ"]["shape"] == (6, 6) and rows["attention.W_UQ"]["count"] == 36
    gate = rows["routed_experts.gate"]
    assert gate["shape"] == (4, 4, 8) and gate["count"] == 128 and gate["per_expert"] == 32
    assert rows["embedding.weight"]["count"] == T.EMBEDDING and rows["head.weight"]["count"] == T.HEAD
    assert not any(r["buffer"] for r in rows.values())
    biased = {r["tensor"].key: r for r in pp.tensor_rows(T.tiny(topk_method="noaux_tc"))}
    assert biased["router.e_score_correction_bias"]["buffer"] and biased["router.e_score_correction_bias"]["count"] == 4


def test_tiny_layers_stages_and_totals_by_hand():
    m = T.tiny()
    rows = pp.layer_groups(m)
    assert [(r["key"], r["params"]) for r in rows] == [
        ("0", T.DENSE_LAYER + T.EMBEDDING), ("1", T.MOE_LAYER), ("2", T.MOE_LAYER + T.FINAL_NORM + T.HEAD)]
    total = T.DENSE_LAYER + 2 * T.MOE_LAYER + T.EMBEDDING + T.FINAL_NORM + T.HEAD
    t = pp.totals(m)
    assert total == 2554 and t["total"] == total
    assert t["activated"] == total - 2 * (T.ROUTED // 2)                       # N_r / N = 2 / 4 of the routed experts
    assert t["activated_no_embedding"] == t["activated"] - T.EMBEDDING
    assert t["routed_share"] == Fraction(2 * T.ROUTED, total) and t["mtp"] == t["mtp_copies"] == t["buffers"] == 0
    assert t["checkpoint"] == total and t["tie_saving"] == T.HEAD
    assert pp.table3_check(m)[0]["printed"] is None                            # not the paper's model
    assert pp.per_layer_check(m)["mla"] == {"count": T.MLA, "printed": None, "equal": False}
    part = Partition(m, paper_training(m))                                     # PP 3: one layer per stage
    assert [(r["key"], r["params"]) for r in pp.stage_groups(part)] == [(r["key"], r["params"]) for r in rows]
    st = pp.stage_summary(part)
    assert st["largest_stages"] == [2] and st["moe_stages"] == [1] == moe_stages(part)
    assert not st["largest_are_moe_stages"] and st["sum"] == total and st["dense_stages"] == [0]
    assert pp.layout_rule(part) == "default" and not pp.is_paper_layout(part)
    assert pp.layout_rule(Partition(m, TrainingConfig(pp=2, layout=(1, 2)))) == "balanced"    # default: (2, 1)
    assert pp.layout_rule(Partition(T.tiny(num_hidden_layers=5), TrainingConfig(pp=2, layout=(4, 1)))) == "given"


def test_tiny_mtp_bias_and_tying_by_hand():
    mtp = T.tiny(num_nextn_predict_layers=1)
    mod = pp.mtp_module(mtp)                                                   # typed like layer 3: MoE
    assert mod["kind"] == "moe" and mod["block"] == T.MOE_LAYER
    assert [n for _, n in mod["own"]] == [8, 8, 8 * 16, 8] and mod["total"] == T.MOE_LAYER + 3 * 8 + 128
    t = pp.totals(mtp)
    assert (t["mtp"], t["mtp_block"], t["mtp_proj"], t["mtp_norms"]) == (mod["total"], T.MOE_LAYER, 128, 24)
    assert t["mtp_copies"] == T.EMBEDDING + T.HEAD and t["checkpoint"] == 2554 + mod["total"] + 160
    assert pp.mtp_module(T.tiny())["total"] == mod["total"] and pp.totals(T.tiny())["mtp"] == 0
    bias = pp.totals(T.tiny(topk_method="noaux_tc"))
    assert (bias["buffers"], bias["bias_per_layer"]) == (2 * 4, 4) and bias["total"] == 2554
    tied = pp.totals(T.tiny(tie_word_embeddings=True))
    assert tied["total"] == 2554 - T.HEAD and tied["tie_saving"] == 0 and pp.official(T.tiny()) == {}


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2", "deepseek-v2-lite", "tiny"])
def test_the_books_equations_are_the_totals(name):
    """Eqs. (3.6) and (3.7), expanded, give the totals of the tables (the chapter says a test checks)."""
    m = T.tiny() if name == "tiny" else load_model(name)
    t = pp.totals(m)
    assert formula("params.total", m).xreplace(values(m)) == t["total"]
    assert formula("params.activated", m).xreplace(values(m)) == t["activated"]
    assert sum(r["params"] * r["count"] for r in pp.layer_groups(m)) == t["total"]


# --------------------------------------------------------------------------------------------
# DeepSeek-V2 and V2-Lite
# --------------------------------------------------------------------------------------------
def test_v2_and_lite_totals():
    v2, lite = pp.totals(load_model("deepseek-v2")), pp.totals(load_model("deepseek-v2-lite"))
    assert (v2["total"], v2["activated"], v2["activated_no_embedding"]) == (235_741_434_880, 21_375_800_320,
                                                                           20_851_512_320)
    assert (lite["total"], lite["mtp"], lite["buffers"]) == (15_706_484_224, 0, 0)
    assert pp.layer_blocks(load_model("deepseek-v2-lite"))["mla_matrix_count"] == 7
    rows = {(r["statement"], r["quantity"]): r for r in pp.official_rows("deepseek-v2-lite")}
    ne = rows[("activated", "activated_no_embedding")]
    assert ne["closest"] and ne["truncates"] and not ne["rounds"]             # 2.45B, stated "2.4"
    assert rows[("total", "total")]["rounds"] and not rows[("activated", "activated")]["closest"]
    assert [r["quantity"] for r in pp.official_rows("deepseek-v2")] == ["total", "activated", "activated_no_embedding"]


def test_v2_and_lite_stages():
    v2 = Partition("deepseek-v2", paper_training("deepseek-v2"))
    st = pp.stage_summary(v2)
    assert st["largest_stages"] == list(range(2, 14)) and not st["largest_are_moe_stages"]
    assert st["sum"] == 235_741_434_880 and pp.layout_rule(v2) == "balanced" and not pp.is_paper_layout(v2)
    assert [r["key"] for r in pp.stage_groups(v2)] == ["0", "1", "2-13", "14", "15"]
    assert all(c["printed"] is None for c in pp.table4_check(v2))
    lite = Partition("deepseek-v2-lite", paper_training("deepseek-v2-lite"))
    assert pp.largest_device(lite)["stages"] == [15] and pp.stage_summary(lite)["sum"] == 15_706_484_224


# --------------------------------------------------------------------------------------------
# memlib.scenarios.models
# --------------------------------------------------------------------------------------------
def test_presets_side_by_side():
    assert sm.PRESET_ORDER == ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")
    fields = {r["field"]: r["values"] for r in sm.model_fields()}
    assert fields["hidden_size"] == [7168, 5120, 2048] and fields["q_lora_rank"] == [1536, 1536, None]
    assert fields["router_bias"] == [True, False, False] and list(fields)[-3:] == list(sm.EXTRA_FIELDS)
    assert sm.layer_pattern("deepseek-v3")["runs"] == [("dense", 0, 2), ("moe", 3, 60)]
    assert sm.layer_pattern(T.tiny()) == {"layers": 3, "dense": 1, "moe": 2, "runs": [("dense", 0, 0), ("moe", 1, 2)],
                                          "mtp": 0}
    assert [r["total"] for r in sm.preset_totals()] == [V3_TOTAL, 235_741_434_880, 15_706_484_224]
    assert sm.preset_totals()[2]["official"] == {"total": "15.7", "activated": "2.4"}
    assert sm.presets_where(lambda m: m.router_bias) == ["deepseek-v3"]
    assert sm.contrasting_preset("deepseek-v3") == "deepseek-v2-lite" == sm.contrasting_preset("deepseek-v2")
    assert sm.contrasting_preset("deepseek-v2-lite") == "deepseek-v2"
    s = sm.preset_summary("deepseek-v2-lite")
    assert (s["moe_layers"], s["routed"], s["q_compression"], s["mtp"]) == (26, 26 * 64, False, 0)


def test_attention_shapes():
    rows = sm.attention_shapes(["deepseek-v3", "deepseek-v2-lite"])
    keys = [r["key"] for r in rows]
    assert keys.index("attention.W_Q") == keys.index("attention.W_UQ") + 1 and len(keys) == 11
    wq = rows[keys.index("attention.W_Q")]
    assert wq["shapes"][0] is None and wq["shapes"][1][1] == (16 * 128, 2048)
    assert rows[0]["shapes"][0][1] == (1536, 7168) and rows[0]["shapes"][1] is None


# ------------------------------------------------------------------------------------------------
# what DeepSeek-V3's published checkpoint stores: FP8 matrices with block scales
# ------------------------------------------------------------------------------------------------
#: the bytes of deepseek-ai/DeepSeek-V3's safetensors files as their headers list them (91,991 tensors: e4m3
#: matrices, bf16 embeddings, heads, norms, routers and MTP projection, fp32 scales and router biases), printed by
#: simpx/model-inspect's README ("Total Parameters Size: 688,574,839,360 bytes")
V3_CHECKPOINT_BYTES = 688_574_839_360


def test_v3_checkpoint_holds_fp8_matrices_their_block_scales_and_buffers(v3):
    """DeepSeek's "685B" counts what the files store: memlib's parameters round to 684B; with one fp32 scale per
    128 x 128 block of each quantised matrix and the router-bias buffers, 684.53B, which rounds to 685B.  The
    bytes, each tensor at its stored format, equal the published files' to the byte."""
    from memlib.model.architecture import decoder_layer_tensors
    from memlib.model.params import FP8_BLOCKS
    from memlib.model.params import values as model_values
    from memlib.core.breakdown import exact_int

    t = pp.totals(v3)
    vals = model_values(v3)
    fp8 = sum(exact_int(x.numel, vals) for kind in list(v3.layer_kinds) + ["moe"]
              for x in decoder_layer_tensors(v3, kind) if x.kind == "matrix" and x.block in FP8_BLOCKS)
    fp32 = t["fp8_scales"] + 59 * 256                       # the scales, the router's bias in 58 + 1 MoE layers
    bf16 = t["checkpoint"] - fp8
    assert fp8 + 2 * bf16 + 4 * fp32 == V3_CHECKPOINT_BYTES
    assert t["stored"] == t["checkpoint"] + fp32 == 684_531_386_000
    rows = {r["quantity"]: r for r in pp.official_rows(v3) if r["statement"] == "checkpoint"}
    assert rows["stored"]["rounds"] and rows["stored"]["closest"] and not rows["checkpoint"]["rounds"]


def test_fp8_scales_by_hand():
    """One scale per started block of each stored matrix, fused matrices as one: a DeepSeek-style layer with
    h = 200 and 100 x 100 blocks."""
    from memlib.config import model_from_dict
    from memlib.model.params import fp8_scales

    d = dict(hidden_size=200, intermediate_size=300, moe_intermediate_size=150, num_attention_heads=2,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=None, kv_lora_rank=40,
             n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, num_hidden_layers=2,
             first_k_dense_replace=1, vocab_size=1000, num_nextn_predict_layers=0,
             quantization_config={"quant_method": "fp8", "weight_block_size": [100, 100]})
    m = model_from_dict(d)
    # attention: q_proj [2*(16+8)=48, 200] -> 1 x 2; kv_a [40+8, 200] -> 1 x 2; kv_b [2*(16+16)=64, 40] -> 1 x 1;
    # o_proj [200, 32] -> 2 x 1: 2 + 2 + 1 + 2 = 7 a layer
    # dense FFN: gate, up [300, 200] -> 3 x 2 each, down [200, 300] -> 2 x 3: 18
    # MoE: the router stays bf16; shared expert (width 150): [150, 200] -> 2 x 2 twice, [200, 150] -> 2 x 2: 12;
    # each of 4 routed experts the same 12: 48
    assert fp8_scales(m) == (7 + 18) + (7 + 12 + 48)
    assert fp8_scales(model_from_dict({**d, "quantization_config": {"quant_method": "bitsandbytes"}})) == 0
    assert fp8_scales(model_from_dict({k: v for k, v in d.items() if k != "quantization_config"})) == 0
