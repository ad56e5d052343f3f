"""The activation ledgers without torch: the bytes of each entry of the tiny model's layers (tests/tiny.py),
worked out by hand from its sizes (h 8, n_h 2, d_h 3, d_h^R 2, d_v 5, d_c' 6, d_c 4, N 4, N_s 1, N_r 2, h_E 4,
h_F 16) at b = 1, s = 4.  The measured ground truth (tests/measure/test_measure*.py) needs torch; these do not."""
from __future__ import annotations

import pytest

from memlib import TrainingConfig
from memlib.core.symbols import CP, EP, ETP, TP
from memlib.ledgers.base import POLICIES, ledger_bytes, training_values
from memlib.ledgers.megatron import megatron_layer
from memlib.ledgers.paper import paper_layer
from memlib.model.params import values
from memlib.model.states import RECIPES
from tiny import tiny

M = tiny()
T = TrainingConfig(seq_len=4)          # b s = 4 tokens


def nbytes(entries, train=T, recipe="paper", policy=None, tp=1, ep=1):
    vals = {**training_values(train), **values(M), TP: tp, CP: 1, EP: ep, ETP: 1}
    return ledger_bytes(entries, train, RECIPES[recipe], policy).evaluate(vals)


# the paper's ledger, bf16 (2 bytes) and 1-byte masks
ATTENTION = {"attention.norm_input": 4 * 8 * 2, "attention.norm_output": 4 * 8 * 2,
             "attention.c_q": 4 * 6 * 2, "attention.c_kv": 4 * 4 * 2,
             "attention.q": 4 * 2 * (3 + 2) * 2, "attention.k": 4 * 2 * (3 + 2) * 2, "attention.v": 4 * 2 * 5 * 2,
             "attention.softmax_out": 2 * 4 * 4 * 2, "attention.softmax_dropout_mask": 2 * 4 * 4,
             "attention.softmax_dropout_out": 2 * 4 * 4 * 2, "attention.context": 4 * 2 * 5 * 2,
             "attention.out_dropout_mask": 4 * 8}
MOE = {"moe.norm_input": 64, "moe.norm_output": 64,
       "moe.router_logits": 4 * 4 * 2, "moe.router_probs": 4 * 4 * 2, "moe.routing_map": 4 * 2 * 2,
       # 8 routed token copies: input and its mask, then gate, up, SiLU and product of width h_E
       "moe.routed.input": 8 * 8 * 2, "moe.routed.input_mask": 8 * 8, "moe.routed.gate_out": 8 * 4 * 2,
       "moe.routed.up_out": 64, "moe.routed.act_out": 64, "moe.routed.product": 64,
       # the shared expert on the 4 tokens, width N_s h_E = 4
       "moe.shared.input": 4 * 8 * 2, "moe.shared.input_mask": 4 * 8, "moe.shared.gate_out": 4 * 4 * 2,
       "moe.shared.up_out": 32, "moe.shared.act_out": 32, "moe.shared.product": 32}


def test_the_paper_ledger_of_a_moe_layer():
    got = nbytes(paper_layer(M, "moe"))
    assert got == {**ATTENTION, **MOE}
    assert sum(got.values()) == 720 + 880


def test_the_paper_ledger_of_a_dense_layer():
    got = nbytes(paper_layer(M, "dense"))
    ffn = {"dense_ffn.norm_input": 64, "dense_ffn.norm_output": 64, "dense_ffn.gate_out": 4 * 16 * 2,
           "dense_ffn.up_out": 128, "dense_ffn.act_out": 128, "dense_ffn.product": 128,
           "dense_ffn.out_dropout_mask": 32}
    assert got == {**ATTENTION, **ffn}


def test_the_paper_ledger_under_recomputation():
    layer = paper_layer(M, "moe")
    # selective: the three s x s tensors (64 + 32 + 64) are recomputed
    assert sum(nbytes(layer, policy=POLICIES["selective"]).values()) == 1600 - 160
    # full: the paper keeps the input of each block (attention and MoE) and the routing map
    assert nbytes(layer, policy=POLICIES["full"]) == {"attention.norm_input": 64, "moe.norm_input": 64,
                                                      "moe.routing_map": 16}
    # deepseek: the norms' outputs and MLA's up-projections (q, k, v) are recomputed
    dropped = 64 + 64 + 80 + 80 + 80
    assert sum(nbytes(layer, policy=POLICIES["deepseek"]).values()) == 1600 - dropped


def test_the_paper_ledger_under_tensor_parallelism():
    train = T.with_(tp=2)
    got = nbytes(paper_layer(M, "moe"), train, tp=2)
    # sequence parallelism halves the norms and the dropout mask after W^O; TP halves the heads; the latents,
    # the router and the experts are not TP-split
    assert {k: got[k] for k in ATTENTION} == {
        "attention.norm_input": 32, "attention.norm_output": 32, "attention.c_q": 48, "attention.c_kv": 32,
        "attention.q": 40, "attention.k": 40, "attention.v": 40, "attention.softmax_out": 32,
        "attention.softmax_dropout_mask": 16, "attention.softmax_dropout_out": 32, "attention.context": 40,
        "attention.out_dropout_mask": 16}
    assert got["moe.router_logits"] == 32 and got["moe.routed.input"] == 128
    # without sequence parallelism the norms are whole on every TP rank
    assert nbytes(paper_layer(M, "moe"), train.with_(sp=False), tp=2)["attention.norm_input"] == 64


def test_expert_parallelism_spreads_the_routed_tokens():
    got = nbytes(paper_layer(M, "moe"), T.with_(ep=2), ep=2)
    # 8 token copies over 2 ranks: 4 each
    assert (got["moe.routed.input"], got["moe.routed.gate_out"]) == (4 * 8 * 2, 4 * 4 * 2)
    assert got["moe.shared.input"] == 64                         # the shared expert sees every token


@pytest.mark.parametrize("key, expected", [
    ("attention.norm_rstd", 4 * 4),               # TE's RMSNorm keeps an fp32 1/rms per token
    ("attention.c_q_rstd", 4 * 4), ("attention.c_kv_rstd", 4 * 4),
    ("attention.softmax_lse", 2 * 4 * 4),          # the fused attention's fp32 log-sum-exp, per head and query
    ("attention.context", 4 * 2 * 5 * 2),
    ("moe.routed.fc1_input", 8 * 8 * 2),           # the 8 dispatched token copies
    ("moe.routed.probs", 8 * 4),                   # their routing probabilities, fp32
    ("moe.routed.swiglu_input", 8 * 2 * 4 * 2),    # fc1's output: gate and up, 2 h_E wide
    ("moe.routed.act_output", 8 * 4 * 2),
    ("moe.shared.swiglu_input", 4 * 2 * 4 * 2),
])
def test_the_megatron_ledger_entries(key, expected):
    got = nbytes(megatron_layer(M, "moe"), T.with_(profile="megatron", precision="megatron"), "megatron")
    assert got[key] == expected
