"""Parameter counts: exact totals of the DeepSeek presets, the paper's Table 2/3 counts, the MLA
formula symbolically, and a tiny model worked out by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest
import sympy as sp

from memlib.model.architecture import embedding_tensors, head_tensors
from memlib.core.breakdown import Breakdown
from memlib.config import load_model
from memlib.model.params import (
    activated_params, buffer_params, by_block, expert_params, layer_counts, layer_params,
    model_params, mtp_params, per_layer_totals, tensor_counts, values,
)
from memlib.data.reference import PAPER
from memlib.core.symbols import sym

import tiny as T


@pytest.fixture(scope="module")
def v3():
    return load_model("deepseek-v3")


def total(b: Breakdown, m) -> int:
    return b.evaluate_total(values(m))


# ---------------------------------------------------------------------------------------------
# Totals of the presets
# ---------------------------------------------------------------------------------------------
def test_v3_total(v3):
    # main model: embedding, 61 decoder layers, final norm, head; no MTP, no buffers
    assert total(model_params(v3), v3) == 671_026_404_352


def test_v3_activated(v3):
    assert total(activated_params(v3), v3) == 37_552_282_624
    assert total(activated_params(v3, embedding=False), v3) == 36_625_603_584
    # the difference is exactly the embedding matrix, v h (printed in Table 1 as v = 129,280, h = 7,168)
    with_, without = (activated_params(v3, embedding=e).evaluate(values(v3)) for e in (True, False))
    assert {k: x - without.get(k, 0) for k, x in with_.items() if x != without.get(k, 0)} == {
        "embedding.weight": 129_280 * 7_168}


def test_v3_mtp(v3):
    mtp = total(mtp_params(v3), v3)
    assert mtp == 11_610_067_968
    # composition: enorm h + hnorm h + eh_proj (h x 2h) + one MoE block + shared_head norm h
    h = v3.hidden_size
    moe_block = total(layer_params(v3, "moe"), v3)
    assert mtp == 2 * h + 2 * h * h + moe_block + h
    # MTP is not in the main model's total
    assert "mtp.eh_proj" not in model_params(v3)


def test_v3_router_bias_buffer_counted_apart(v3):
    buf = buffer_params(v3).evaluate(values(v3))
    assert buf == {"router.e_score_correction_bias": 58 * 256}
    assert sum(buf.values()) == 14_848
    # not part of the trained parameters
    assert not any("e_score_correction_bias" in k for k in model_params(v3))
    assert not any("e_score_correction_bias" in k for k in mtp_params(v3))


def test_v2_total():
    m = load_model("deepseek-v2")
    assert total(model_params(m), m) == 235_741_434_880
    assert buffer_params(m).evaluate(values(m)) == {}  # topk_method group_limited_greedy: no bias
    assert total(mtp_params(m), m) == 0


def test_v2_lite_total_and_direct_query_projection():
    m = load_model("deepseek-v2-lite")
    assert m.q_lora_rank is None
    assert total(model_params(m), m) == 15_706_484_224
    keys = set(layer_params(m, "moe"))
    assert {"attention.W_Q", "attention.W_QR"} <= keys
    assert not keys & {"attention.W_DQ", "attention.q_norm", "attention.W_UQ"}
    # W^Q is n_h d_h x h and W^QR n_h d_h^R x h: straight from h, no d_c'
    b = layer_params(m, "moe")
    assert b["attention.W_Q"] == sym("n_h") * sym("d_h") * sym("h")
    assert b["attention.W_QR"] == sym("n_h") * sym("d_hR") * sym("h")


# ---------------------------------------------------------------------------------------------
# Paper Table 2 (per matrix) and the per-layer counts of Table 3
# ---------------------------------------------------------------------------------------------
TABLE2 = {
    "attention.W_DQ": 11_010_048,
    "attention.W_UQ": 25_165_824,
    "attention.W_QR": 12_582_912,
    "attention.W_DKV": 3_670_016,
    "attention.W_UK": 8_388_608,
    "attention.W_KR": 458_752,
    "attention.W_UV": 8_388_608,
    "attention.W_O": 117_440_512,
    "router.gate": 1_835_008,
}


@pytest.mark.parametrize("key,count", TABLE2.items())
def test_table2_matrix(v3, key, count):
    assert layer_params(v3, "moe").evaluate(values(v3))[key] == count


def test_one_expert(v3):
    assert sp.Integer(expert_params(v3).xreplace(values(v3))) == 44_040_192
    # the routed-expert tensors of a layer are N experts of that size
    routed = by_block(layer_params(v3, "moe")).evaluate(values(v3))["routed_experts"]
    assert routed == 256 * 44_040_192


def test_moe_ffn_per_layer_gate_plus_257_experts(v3):
    blocks = by_block(layer_params(v3, "moe")).evaluate(values(v3))
    ffn = blocks["router"] + blocks["shared_experts"] + blocks["routed_experts"]
    assert ffn == PAPER["moe_ffn_per_layer"] == 11_320_164_352


def test_mla_per_layer(v3):
    assert by_block(layer_params(v3, "moe")).evaluate(values(v3))["attention"] == 187_107_328
    assert by_block(layer_params(v3, "dense")).evaluate(values(v3))["attention"] == 187_107_328
    v2 = load_model("deepseek-v2")
    assert by_block(layer_params(v2, "moe")).evaluate(values(v2))["attention"] == 149_227_520


def test_layer_counts_table3(v3):
    per_layer = per_layer_totals(v3)
    assert len(per_layer) == 61
    emb = tensor_counts(embedding_tensors()).evaluate_total(values(v3))
    head_only = tensor_counts(head_tensors(v3)).evaluate(values(v3))["head.weight"]
    assert per_layer[0] + emb == 1_510_162_432                 # layer 0 incl. embedding
    assert per_layer[1] == per_layer[2] == 583_483_392         # dense layers 1-2
    assert set(per_layer[3:]) == {11_507_286_016}              # MoE layers 3-60
    assert per_layer[60] + head_only == 12_433_965_056         # layer 60 incl. head
    # the layers, the embedding, the head and the final norm make up the model
    final_norm = tensor_counts(head_tensors(v3)).evaluate(values(v3))["final_norm.weight"]
    assert sum(per_layer) + emb + head_only + final_norm == 671_026_404_352
    assert final_norm == 7168


def test_components_add_to_totals(v3):
    for b in (model_params(v3), activated_params(v3), mtp_params(v3), layer_params(v3, "moe")):
        vals = b.evaluate(values(v3))
        assert sum(vals.values()) == b.evaluate_total(values(v3))
        grouped = by_block(b).evaluate(values(v3))
        assert sum(grouped.values()) == b.evaluate_total(values(v3))


# ---------------------------------------------------------------------------------------------
# Symbolic checks
# ---------------------------------------------------------------------------------------------
def test_mla_symbolic_expression(v3):
    h, n_h, d_h, d_v, d_hR = sym("h"), sym("n_h"), sym("d_h"), sym("d_v"), sym("d_hR")
    d_cq, d_c = sym("d_cq"), sym("d_c")
    hand = (d_cq * h + n_h * d_h * d_cq + n_h * d_hR * d_cq + d_c * h + d_hR * h
            + n_h * d_h * d_c + n_h * d_v * d_c + h * n_h * d_v + d_cq + d_c)
    mla = by_block(layer_params(v3, "moe"))["attention"]
    assert sp.expand(mla - hand) == 0
    # and the substituted number is the paper's
    assert hand.xreplace(values(v3)) == 187_107_328


def test_model_total_symbolic_shape(v3):
    """With moe_layer_freq 1 the layer counts stay symbols: k_dense dense, l - k_dense MoE."""
    n = layer_counts(v3)
    assert n == {"dense": sym("k_dense"), "moe": sym("l") - sym("k_dense")}
    tot = model_params(v3).total
    assert {sym("l"), sym("k_dense"), sym("v"), sym("N")} <= tot.free_symbols
    # d(total)/dl is one MoE layer
    moe_layer = layer_params(v3, "moe").total
    assert sp.expand(sp.diff(tot, sym("l")) - moe_layer) == 0


def test_d_h_and_d_v_stay_distinct(v3):
    b = layer_params(v3, "moe")
    assert b["attention.W_UK"] == sym("n_h") * sym("d_h") * sym("d_c")
    assert b["attention.W_UV"] == sym("n_h") * sym("d_v") * sym("d_c")
    assert b["attention.W_O"] == sym("h") * sym("n_h") * sym("d_v")
    other = replace(v3, v_head_dim=64)  # qk_nope_head_dim stays 128
    a0 = layer_params(v3, "moe").evaluate(values(v3))
    a1 = layer_params(other, "moe").evaluate(values(other))
    assert a1["attention.W_UK"] == a0["attention.W_UK"] == 128 * 128 * 512
    assert a1["attention.W_UV"] == 128 * 64 * 512 != a0["attention.W_UV"]
    assert a1["attention.W_O"] == 7168 * 128 * 64 != a0["attention.W_O"]
    assert a1["attention.W_UQ"] == a0["attention.W_UQ"]
    # changing d_h instead changes W^UQ and W^UK, not W^UV or W^O
    other = replace(v3, qk_nope_head_dim=64)
    a2 = layer_params(other, "moe").evaluate(values(other))
    assert a2["attention.W_UK"] != a0["attention.W_UK"]
    assert a2["attention.W_UQ"] != a0["attention.W_UQ"]
    assert a2["attention.W_UV"] == a0["attention.W_UV"]
    assert a2["attention.W_O"] == a0["attention.W_O"]


# ---------------------------------------------------------------------------------------------
# The tiny model, by hand (h 8, h_F 16, h_E 4, n_h 2, d_h 3, d_h^R 2, d_v 5, d_c' 6, d_c 4,
# N 4, N_s 1, N_r 2, l 3, first_k_dense_replace 1, v 10)
# ---------------------------------------------------------------------------------------------
def test_tiny_mla_by_hand():
    m = T.tiny()
    got = layer_params(m, "dense").evaluate(values(m))
    expected = {
        "attention.W_DQ": 6 * 8,          # d_c' x h
        "attention.q_norm": 6,            # d_c'
        "attention.W_UQ": 2 * 3 * 6,      # n_h d_h x d_c'
        "attention.W_QR": 2 * 2 * 6,      # n_h d_h^R x d_c'
        "attention.W_DKV": 4 * 8,         # d_c x h
        "attention.W_KR": 2 * 8,          # d_h^R x h
        "attention.kv_norm": 4,           # d_c
        "attention.W_UK": 2 * 3 * 4,      # n_h d_h x d_c
        "attention.W_UV": 2 * 5 * 4,      # n_h d_v x d_c
        "attention.W_O": 8 * 2 * 5,       # h x n_h d_v
        "norms.attn_norm": 8,             # h
        "norms.ffn_norm": 8,              # h
        "dense_ffn.gate": 16 * 8,         # h_F x h
        "dense_ffn.up": 16 * 8,           # h_F x h
        "dense_ffn.down": 8 * 16,         # h x h_F
    }
    assert got == expected
    assert sum(v for k, v in expected.items() if k.startswith("attention.")) == T.MLA == 310
    assert sum(expected.values()) == T.DENSE_LAYER == 710


def test_tiny_moe_layer_by_hand():
    m = T.tiny()
    blocks = by_block(layer_params(m, "moe")).evaluate(values(m))
    assert blocks == {
        "attention": 310,            # as in the dense layer
        "norms": 16,                 # 2 h
        "router": 4 * 8,             # N x h
        "shared_experts": 3 * 8 * 4,  # gate, up, down: 3 h (N_s h_E)
        "routed_experts": 4 * 3 * 8 * 4,  # N experts of 3 h h_E
    }
    assert sum(blocks.values()) == T.MOE_LAYER == 838


def test_tiny_model_totals_by_hand():
    m = T.tiny()
    assert total(model_params(m), m) == (
        80          # embedding v h
        + 710       # layer 0, dense
        + 2 * 838   # layers 1, 2, MoE
        + 8         # final norm h
        + 80        # head v h
    ) == 2554
    # activated: N_r = 2 of the N = 4 routed experts in each of the 2 MoE layers
    assert total(activated_params(m), m) == 2554 - 2 * (4 - 2) * (3 * 8 * 4) == 2170
    assert total(activated_params(m, embedding=False), m) == 2170 - 80
    assert per_layer_totals(m) == [710, 838, 838]
    assert total(mtp_params(m), m) == 0
    assert buffer_params(m).evaluate(values(m)) == {}


def test_tiny_tied_embeddings_drop_the_head():
    m = T.tiny(tie_word_embeddings=True)
    b = model_params(m)
    assert "head.weight" not in b and "final_norm.weight" in b
    assert total(b, m) == 2554 - 80


def test_tiny_no_shared_experts():
    m = T.tiny(n_shared_experts=0)
    b = model_params(m)
    assert not any(k.startswith("shared_experts.") for k in b)
    assert total(b, m) == 2554 - 2 * 96   # one shared MLP of 96 in each of the 2 MoE layers


def test_tiny_moe_layer_freq_2():
    m = T.tiny(moe_layer_freq=2)
    # layer 0 < first_k_dense_replace: dense; layer 1: 1 % 2 != 0: dense; layer 2: MoE
    assert m.layer_kinds == ("dense", "dense", "moe")
    assert layer_counts(m) == {"dense": 2, "moe": 1}
    assert total(model_params(m), m) == 80 + 2 * 710 + 838 + 8 + 80 == 2426


def test_tiny_without_q_lora():
    m = T.tiny(q_lora_rank=None)
    blocks = layer_params(m, "moe").evaluate(values(m))
    assert blocks["attention.W_Q"] == 2 * 3 * 8     # n_h d_h x h
    assert blocks["attention.W_QR"] == 2 * 2 * 8    # n_h d_h^R x h
    mla = by_block(layer_params(m, "moe")).evaluate(values(m))["attention"]
    # 310 - (W^DQ 48 + q_norm 6 + W^UQ 36 + W^QR 24) + (W^Q 48 + W^QR 32)
    assert mla == 310 - 114 + 80 == 276


def test_tiny_mtp_and_router_bias():
    m = T.tiny(num_nextn_predict_layers=1, topk_method="noaux_tc")
    assert m.router_bias
    # enorm 8 + hnorm 8 + eh_proj 8 x 16 + MoE block 838 (layer l + 0 = 3 is MoE) + shared-head norm 8
    assert total(mtp_params(m), m) == 8 + 8 + 128 + 838 + 8 == 990
    # bias: N = 4 per MoE layer, 2 MoE layers, counted apart
    assert buffer_params(m).evaluate(values(m)) == {"router.e_score_correction_bias": 8}
    assert total(model_params(m), m) == 2554


def test_tiny_two_mtp_modules_scale():
    m = T.tiny(num_nextn_predict_layers=2)
    assert total(mtp_params(m), m) == 2 * 990


def test_tiny_mtp_modules_typed_by_their_layer_index():
    # moe_layer_freq 2: decoder layers 0 (dense), 1 (dense: 1 % 2 != 0), 2 (MoE); MTP module 0 is
    # typed like layer 3 (dense), module 1 like layer 4 (MoE).  Own parts: 8 + 8 + 128 + 8 = 152.
    m = T.tiny(num_nextn_predict_layers=2, moe_layer_freq=2)
    dense_block = 310 + 16 + 384     # MLA + block norms + dense FFN
    moe_block = 310 + 16 + 32 + 96 + 384
    assert total(mtp_params(m), m) == 152 + dense_block + 152 + moe_block == 1852
    # Megatron-Core builds every MTP module like the last decoder layer (get_gpt_mtp_block_spec takes
    # spec.layer_specs[-1]; measured against megatron-core in tests/measure/test_measure_megatron.py): layer 2 is
    # MoE, so the megatron profile's last stage holds two MoE blocks
    from memlib.config import TrainingConfig
    from memlib.model.partition import Partition

    part = Partition(m, TrainingConfig(profile="megatron"))
    stored = part.params(part.stages[-1]).select(lambda k: k.startswith("mtp."))
    assert stored.evaluate_total(part.values) == 2 * (152 + moe_block) == 1980
