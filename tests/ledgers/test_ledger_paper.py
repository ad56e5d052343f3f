"""memlib.ledgers.paper beyond DeepSeek's MLA layer (whose entries tests/ledgers/test_ledger_entries.py works
out): the paper's conventions on a grouped-query layer, Qwen2-MoE's gated shared expert, the embedding, the
head and an MTP module, each in bytes worked out by hand at b = 1, s = 4 (4 tokens), bf16, 1-byte masks."""
from __future__ import annotations

from memlib import TrainingConfig
from memlib.config import model_from_dict
from memlib.core.symbols import CP, EP, ETP, TP
from memlib.ledgers.base import ledger_bytes, training_values
from memlib.ledgers.paper import PAPER_PROFILE, paper_layer
from memlib.model.params import values
from memlib.model.states import RECIPES
from tiny import tiny

T = TrainingConfig(seq_len=4)
#: h 8, n_h 2, one key-value head, d_head 4 (8 / 2); a dense FFN of width 6; vocabulary 20
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
         "num_hidden_layers": 1, "vocab_size": 20, "intermediate_size": 6}
#: the same attention; 4 experts of width 4, 2 per token; a shared expert of width 6 behind a sigmoid gate
QWEN2_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
             "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 20, "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 4, "shared_expert_intermediate_size": 6}


def nbytes(entries, m, train=T, cp=1):
    vals = {**training_values(train), **values(m), TP: 1, CP: cp, EP: 1, ETP: 1}
    return ledger_bytes(entries, train, RECIPES["paper"]).evaluate(vals)


def test_a_grouped_query_layer_by_hand():
    m = model_from_dict(LLAMA)
    got = nbytes(paper_layer(m, "dense"), m)
    assert {k: v for k, v in got.items() if k.startswith("attention.")} == {
        "attention.norm_input": 4 * 8 * 2, "attention.norm_output": 4 * 8 * 2,
        "attention.q": 4 * 2 * 4 * 2,                 # 2 query heads of 4
        "attention.k": 4 * 1 * 4 * 2, "attention.v": 4 * 1 * 4 * 2,     # one key-value head
        "attention.softmax_out": 2 * 4 * 4 * 2,       # per query head, s x s
        "attention.softmax_dropout_mask": 2 * 4 * 4, "attention.softmax_dropout_out": 2 * 4 * 4 * 2,
        "attention.context": 4 * 2 * 4 * 2, "attention.out_dropout_mask": 4 * 8}
    # norm input and output, gate, up, SiLU and product of width 6, the dropout mask after the FFN
    assert sum(v for k, v in got.items() if k.startswith("dense_ffn.")) == 64 + 64 + 4 * (4 * 6 * 2) + 32 == 352
    assert sum(got.values()) == 512 + 352


def test_context_parallelism_splits_every_token():
    # every entry of the layer is indexed by token (the s x s scores by query): CP 2 halves all of it
    m = model_from_dict(LLAMA)
    assert sum(nbytes(paper_layer(m, "dense"), m, T.with_(cp=2), cp=2).values()) == 864 // 2


def test_qwen2_moes_shared_expert_and_its_gate():
    m = model_from_dict(QWEN2_MOE)
    got = nbytes(paper_layer(m, "moe"), m)
    # the gated shared expert on the 4 tokens: input and mask, gate, up, SiLU, product of width 6, and one
    # sigmoid gate value a token
    shared = {k: v for k, v in got.items() if k.startswith("moe.shared.")}
    assert shared == {"moe.shared.input": 64, "moe.shared.input_mask": 32, "moe.shared.gate_out": 48,
                      "moe.shared.up_out": 48, "moe.shared.act_out": 48, "moe.shared.product": 48,
                      "moe.shared.gate_sigmoid": 4 * 2}
    # the routed experts: 4 tokens x 2 = 8 copies of input (16 bytes) and mask (8), and 4 tensors 4 wide
    routed = sum(v for k, v in got.items() if k.startswith("moe.routed."))
    assert routed == 8 * 16 + 8 * 8 + 4 * (8 * 4 * 2) == 448
    # norm input and output; router logits and probabilities over 4 experts; the routing map (2 a token)
    assert sum(got[k] for k in ("moe.norm_input", "moe.norm_output", "moe.router_logits", "moe.router_probs",
                                "moe.routing_map")) == 64 + 64 + 32 + 32 + 16


def test_the_embedding_and_the_head():
    m = model_from_dict(LLAMA)
    assert nbytes(PAPER_PROFILE.embedding(m), m) == {"embedding.token_ids": 4 * 8}          # int64 ids
    gpt = model_from_dict({"model_type": "gpt", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
                           "max_position_embeddings": 4, "vocab_size": 20})
    assert sum(nbytes(PAPER_PROFILE.embedding(gpt), gpt).values()) == 32 + 32        # and the position ids
    # final norm input and output; bf16 logits and fp32 softmax over v = 20
    assert nbytes(PAPER_PROFILE.head(m), m) == {"head.norm_input": 64, "head.input": 64, "head.logits": 160,
                                                "head.loss_softmax": 320}


def test_an_mtp_module_by_hand():
    m = tiny()                      # layer 3, the MTP module's, is MoE; vocabulary 10
    got = nbytes(PAPER_PROFILE.mtp(m, 0), m)
    own = {"mtp.token_ids": 32, "mtp.enorm_input": 64, "mtp.hnorm_input": 64, "mtp.eh_proj_input": 4 * 16 * 2}
    assert {k: got[k] for k in own} == own
    # its MoE layer: 720 bytes of attention and 880 of MoE (tests/ledgers/test_ledger_entries.py), then its
    # head: norm input and output, logits 4 x 10 x 2, fp32 softmax 4 x 10 x 4
    assert sum(got.values()) == 32 + 64 + 64 + 128 + 1600 + (64 + 64 + 80 + 160) == 2256
    assert got["mtp.moe.routing_map"] == 16 and got["mtp.head.loss_softmax"] == 160
