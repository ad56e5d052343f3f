"""memlib.ledgers.base, the machinery every activation ledger uses, on entries made up here: the bytes of one
entry on one device (its dtype, its parallel splits, FP8 tiles, expected row counts rounded up), what each
recompute policy drops, and the parsing of a policy.  Every byte count is worked out by hand in its comment."""
from __future__ import annotations

from dataclasses import replace

import pytest
import sympy as sp

from memlib.config import ConfigError, TrainingConfig
from memlib.core.symbols import CP, EP, ETP, TP, b, s
from memlib.ledgers.base import POLICIES, entry_bytes, ledger_bytes, parse_policy, saved, training_values
from memlib.model.states import RECIPES

#: b = 2 sequences of s = 6 tokens: 12 rows per micro-batch
T = TrainingConfig(micro_batch=2, seq_len=6)
BF16 = RECIPES["paper"]
#: the same recipe with FP8-cached Linear inputs, tile-scaled (1 x 128, fp32 scales) and MX-scaled (1 x 32, 1 byte)
FP8_TILE = replace(BF16, fp8_activations=True, fp8_scaling="tile")
FP8_MX = replace(BF16, fp8_activations=True, fp8_scaling="mx")


def at(expr, tp=1, cp=1, ep=1, etp=1, train=T):
    """The bytes on one device for these parallel sizes."""
    return sp.sympify(expr).subs({**training_values(train), TP: tp, CP: cp, EP: ep, ETP: etp})


# --- one entry's bytes ------------------------------------------------------------------------------------------
def test_the_dtype_sets_the_bytes_per_element():
    x = b * s * 10                                   # 12 rows of 10 features: 120 elements
    assert at(entry_bytes(saved("x", "x", x), T, BF16)) == 240            # bf16: 2 bytes each
    assert at(entry_bytes(saved("m", "m", x, "mask"), T, BF16)) == 120    # a mask: 1 byte each
    assert at(entry_bytes(saved("p", "p", x, "fp32"), T, BF16)) == 480
    assert at(entry_bytes(saved("i", "i", x, "int64"), T, BF16)) == 960
    assert at(entry_bytes(saved("x", "x", x), T, RECIPES["fp32"])) == 480  # the recipe's activation dtype


def test_the_parallel_splits():
    x = saved("x", "x", b * s * 8, shard=("TP", "SP", "CP"))
    # TP 2 and SP: 192 bytes / 2 / 2; CP 3: / 3 more
    assert at(entry_bytes(x, T, BF16), tp=2) == 48
    assert at(entry_bytes(x, T, BF16), tp=2, cp=3) == 16
    # without sequence parallelism SP divides nothing: 192 / 2
    assert at(entry_bytes(x, T.with_(sp=False), BF16), tp=2) == 96


def test_fp8_tiles_are_paid_whole():
    # 12 rows of 200 features: 200 one-byte elements and ceil(200 / 128) = 2 fp32 scales per row: 208 bytes a row
    x = saved("x", "x", b * s * 200, width=200, linear_input=True)
    assert at(entry_bytes(x, T, FP8_TILE)) == 12 * 208 == 2496
    # under TP 2 a row holds 100 features: one tile, 104 bytes a row
    x2 = saved("x", "x", b * s * 200, shard=("TP",), width=200, linear_input=True)
    assert at(entry_bytes(x2, T, FP8_TILE), tp=2) == 12 * 104
    # MXFP8: one byte per 32 elements, ceil(200 / 32) = 7 scales: 207 bytes a row
    assert at(entry_bytes(x, T, FP8_MX)) == 12 * 207
    # the bf16 recipe keeps it in 2 bytes an element, and a tensor that is no Linear input stays bf16 under FP8
    assert at(entry_bytes(x, T, BF16)) == 12 * 400
    assert at(entry_bytes(saved("y", "y", b * s * 200, width=200), T, FP8_TILE)) == 12 * 400


def test_the_e5m6_exception_takes_twelve_bits_rounded_up_over_the_tensor():
    # b = 1, s = 3: 3 rows of 5 features, 15 elements of 1.5 bytes: 22.5, so 23 bytes
    x = saved("x", "x", b * s * 5, width=5, linear_input=True, fp8_exception="E5M6")
    assert at(entry_bytes(x, T, FP8_TILE), train=TrainingConfig(micro_batch=1, seq_len=3)) == 23


def test_an_expected_row_count_is_rounded_up_on_the_busiest_rank():
    # b s N_r = 12 x 3 = 36 routed copies over EP 8: 4.5 rows expected, 5 held; 4 features of bf16: 40 bytes
    x = saved("r", "r", b * s * 3 * 4, shard=("EP",), width=4, mean_rows=True)
    assert at(entry_bytes(x, T, BF16), ep=8) == 40
    assert at(entry_bytes(x, T, BF16), ep=4) == 9 * 8          # 36 / 4 = 9 rows exactly


def test_an_entry_that_cannot_be_counted_in_whole_bytes_is_refused():
    with pytest.raises(ValueError, match=r"x: unknown divisor\(s\) \['DP'\]"):
        saved("x", "x", b * s, shard=("DP",))
    with pytest.raises(ValueError, match="x: a Linear input or an expected row count needs its width"):
        saved("x", "x", b * s, linear_input=True)


# --- recompute policies -----------------------------------------------------------------------------------------
ENTRIES = [
    saved("a.input", "a checkpointed input", b * s, keep_full=True),
    saved("a.scores", "attention scores", b * s, modules=("core_attn",)),
    saved("a.norm", "a norm's output", b * s, modules=("layernorm",)),
    saved("a.plain", "kept unless the layer is recomputed whole", b * s),
    saved("a.mask", "kept only for core_attn's re-run", b * s, "mask", only_when=("core_attn",)),
    saved("a.ckpt", "kept only by full recomputation", b * s, only_when=("full",)),
]


@pytest.mark.parametrize("policy, kept", [
    (None, {"a.input", "a.scores", "a.norm", "a.plain"}),                  # no policy: no checkpoint's extras
    ("none", {"a.input", "a.scores", "a.norm", "a.plain"}),
    ("selective", {"a.input", "a.norm", "a.plain", "a.mask"}),            # scores dropped, the mask kept
    ("deepseek", {"a.input", "a.scores", "a.plain"}),                     # norms (and MLA up-projections) dropped
    ("core_attn,layernorm", {"a.input", "a.plain", "a.mask"}),
    ("full", {"a.input", "a.ckpt"}),                                      # only what the checkpoint keeps
    ("full-block:2", {"a.input", "a.ckpt"}),
])
def test_what_each_policy_keeps(policy, kept):
    p = None if policy is None else parse_policy(policy)
    got = ledger_bytes(ENTRIES, T, BF16, p)
    assert set(got) == kept


def test_parsing_a_policy():
    assert parse_policy(" selective ") is POLICIES["selective"]
    p = parse_policy("full-block:3")
    assert (p.full, p.block_layers, p.name) == (True, 3, "full-block:3")
    p = parse_policy("moe_act, mlp,")
    assert p.modules == {"moe_act", "mlp"} and not p.full and p.name == "moe_act,mlp"


@pytest.mark.parametrize("text, message", [
    ("attn", "recompute='attn' must be one of none, selective, deepseek, full, full-block:K, or a comma list"),
    ("core_attn,moe2", "recompute='core_attn,moe2' must be one of"),
    (",", "recompute=',' must be one of"),
    ("full-block:0", "recompute='full-block:0': full-block:K needs a positive integer K of ASCII digits, at most 65,536"),
    ("full-block:x", "recompute='full-block:x': full-block:K needs a positive integer K"),
    ("full-block:65537", "recompute='full-block:65537': full-block:K needs"),
])
def test_a_bad_policy_is_one_line(text, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse_policy(text)
    assert "\n" not in str(e.value)
