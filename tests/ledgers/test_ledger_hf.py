"""memlib.ledgers.hf, the ``hf-eager`` ledger, without torch: every tensor transformers keeps for a DeepSeek (MLA)
layer and a Qwen3 (per-head q/k norms) layer, the embedding and the head, worked out by hand at b = 2, s = 3
(6 tokens) in bf16; and the one-line error for a model it has no ledger for.  The measured ground truth of the
same ledger (tests/measure/test_measure_families.py, against autograd) needs torch; these do not.

RMSNorm of a bf16 input of r rows and width w keeps its fp32 upcast (4 r w), one fp32 rsqrt a row (4 r) and
the bf16 normalised value (2 r w): 6 rows of width 8 are 192 + 24 + 96 = 312 bytes."""
from __future__ import annotations

import pytest

from memlib.config import ConfigError, TrainingConfig, model_from_dict
from memlib.core.symbols import CP, EP, ETP, TP
from memlib.ledgers.base import ledger_bytes, training_values
from memlib.ledgers.hf import hf_eager_layer, hf_embedding, hf_head
from memlib.model.params import values
from memlib.model.states import RECIPES

#: MLA: h 8, n_h 2, d_h 3, d_h^R 2, d_v 4, d_c' 5, d_c 6; a dense FFN of width 10; vocabulary 20
DEEPSEEK = {"hidden_size": 8, "intermediate_size": 10, "moe_intermediate_size": 4, "num_attention_heads": 2,
            "qk_nope_head_dim": 3, "qk_rope_head_dim": 2, "v_head_dim": 4, "q_lora_rank": 5, "kv_lora_rank": 6,
            "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hidden_layers": 2,
            "first_k_dense_replace": 1, "vocab_size": 20, "model_type": "deepseek_v3"}
#: GQA with per-head q/k RMSNorms: h 8, n_h 2, one key-value head, d_head 3; a dense FFN of width 6
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 3, "num_hidden_layers": 1, "vocab_size": 20, "intermediate_size": 6}


def nbytes(entries, m, micro_batch=2, seq_len=3):
    t = TrainingConfig(profile="hf-eager", micro_batch=micro_batch, seq_len=seq_len, ep=1, pp=1)
    vals = {**training_values(t), **values(m), TP: 1, CP: 1, EP: 1, ETP: 1}
    return ledger_bytes(entries, t, RECIPES["paper"]).evaluate(vals)


def test_a_deepseek_dense_layer_by_hand():
    got = nbytes(hf_eager_layer(model_from_dict(DEEPSEEK), "dense"), model_from_dict(DEEPSEEK))
    attention = (312 + 96                       # input RMSNorm, its bf16 output (read by q_a and kv_a)
                 + 6 * 5 * 4 + 24 + 6 * 5 * 2 + 6 * 5 * 2   # RMSNorm of c^Q (width 5) and c^Q itself
                 + 6 * 6 * 4 + 24 + 6 * 6 * 2 + 6 * 6 * 2   # RMSNorm of c^KV (width 6) and c^KV
                 + 2 * (6 * 2 * (3 + 2) * 2)    # query and key: 2 heads of d_h + d_h^R = 5
                 + 2 * 2 * 3 * 3 * 4            # softmax in fp32: b n_h s s
                 + 2 * 2 * 3 * 3 * 2            # and its bf16 copy
                 + 6 * 2 * 4 * 2                # values, a contiguous copy (b, s, n_h all above 1)
                 + 6 * 2 * 4 * 2)               # context, input of o_proj
    ffn = 312 + 96 + 4 * (6 * 10 * 2)           # post-attention RMSNorm and output; gate, SiLU, up, product
    assert sum(got.values()) == attention + ffn == 1632 + 888
    assert got["attention.value"] == 96 and got["attention.softmax_fp32"] == 144


def test_with_one_sequence_the_values_keep_the_whole_kv_projection():
    # b = 1: matmul folds [b, n_h] into one batch dimension, so V stays a view of kv_b_proj's output, whose
    # storage holds k_nope and V: 3 tokens x 2 heads x (3 + 4) x 2 bytes
    m = model_from_dict(DEEPSEEK)
    assert nbytes(hf_eager_layer(m, "dense"), m, micro_batch=1)["attention.value"] == 84


def test_a_qwen3_layer_by_hand():
    m = model_from_dict(QWEN3)
    got = nbytes(hf_eager_layer(m, "dense"), m)
    q_norm = 12 * 3 * 4 + 12 * 4 + 12 * 3 * 2    # over d_head on b s n_h = 12 rows: 144 + 48 + 72
    k_norm = 6 * 3 * 4 + 6 * 4 + 6 * 3 * 2       # on b s n_kv = 6 rows: 72 + 24 + 36
    assert (sum(v for k, v in got.items() if k.startswith("attention.q_norm")),
            sum(v for k, v in got.items() if k.startswith("attention.k_norm"))) == (q_norm, k_norm) == (264, 132)
    # one key-value head but b = 2: repeat_kv copies key and value over the 2 query heads
    assert got["attention.key"] == got["attention.value"] == 6 * 2 * 3 * 2
    attention = 312 + 96 + q_norm + k_norm + 72 + 72 + 144 + 72 + 72 + 72   # query, key, softmax x2, value, context
    ffn = 312 + 96 + 4 * (6 * 6 * 2)
    assert sum(got.values()) == attention + ffn == 2004


def test_the_embedding_and_the_head_by_hand():
    m = model_from_dict(DEEPSEEK)
    # int64 token ids; the RoPE cos and sin tables [1, s, d_h^R] in bf16
    assert nbytes(hf_embedding(m), m) == {"embedding.token_ids": 48, "embedding.rope_cos": 12,
                                          "embedding.rope_sin": 12}
    head = nbytes(hf_head(m), m)
    # final RMSNorm; its output; fp32 log-softmax over v = 20; int64 labels; one fp32 normaliser
    assert sum(head.values()) == 312 + 96 + 6 * 20 * 4 + 6 * 8 + 4 == 940
    # one sequence: the labels padded by one (s + 1 ids) stay alive
    assert nbytes(hf_head(m), m, micro_batch=1)["loss.labels"] == 4 * 8


def test_a_model_without_an_hf_ledger_is_one_line():
    relu = model_from_dict({**QWEN3, "hidden_act": "relu"})
    with pytest.raises(ConfigError, match="hidden_act='relu': profile=hf-eager knows what silu, swish, gelu") as e:
        hf_eager_layer(relu, "dense")
    assert "\n" not in str(e.value)
    gpt = model_from_dict({"model_type": "gpt", "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
                           "num_hidden_layers": 1, "max_position_embeddings": 4, "vocab_size": 16})
    with pytest.raises(ConfigError, match="num_key_value_heads=1 must equal num_attention_heads=2"):
        hf_head(gpt)
