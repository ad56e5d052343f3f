"""memlib.paper.activations and memlib.scenarios.activations: the paper's §5 (Tables 9 and 10, the
check of its printed formulas), Korthikanti et al.'s Table 2 and Figure 1 models (from the ``gpt``
family's dense layer), and the sweeps, for the paper's configuration (its numbers), for a tiny model
worked by hand, and for DeepSeek-V2 and V2-Lite."""
from __future__ import annotations

from fractions import Fraction

import pytest
import sympy as sp

from memlib import PAPER_TRAINING, TrainingConfig, estimate
from memlib.paper import activations as pa
from memlib.paper import paper_training
from memlib.paper.errata import errata
from memlib.data.reference import KORTHIKANTI_TABLE2, PAPER_ACTIVATION_FORMULAS
from memlib.scenarios import activations as sa
from memlib.core.symbols import sym

import tiny as T


@pytest.fixture(scope="module")
def v3():
    return estimate("deepseek-v3", PAPER_TRAINING)


def est_for(model, **changes):
    t = paper_training(model)
    return estimate(model, t.with_(**changes) if changes else t)


# ---------------------------------------------------------------------------------------------
# the paper's configuration
# ---------------------------------------------------------------------------------------------
def test_table10_is_the_papers_formulas_evaluated(v3):
    t10 = pa.table10(v3)
    assert list(t10) == [1, 2, 4]
    assert t10[1]["none"] == {"attention": 23_177_723_904, "moe": 1_493_434_368, "total": 24_671_158_272}
    assert t10[1]["full"]["total"] == 235_143_168
    assert [t10[b]["none"]["total"] for b in (1, 2, 4)] == [24_671_158_272, 49_342_316_544, 98_684_633_088]
    assert [t10[b]["full"]["total"] for b in (1, 2, 4)] == [235_143_168, 470_286_336, 940_572_672]
    for row in t10.values():                                     # every total a sum of named terms
        for p in row.values():
            assert p["total"] == p["attention"] + p["moe"]
    # full recomputation keeps 4 layers x (2 b s h / TP for each block input + 2 b s N_r routing map)
    assert t10[1]["full"]["total"] == 4 * (2 * 4096 * 7168 + 2 * 4096 * 8)


def test_table10_facts(v3):
    f = pa.table10_facts(v3)
    assert f["mla_share"] == Fraction(23_177_723_904, 24_671_158_272) and f["mla_most"]
    assert f["none_over_full"] == Fraction(24_671_158_272, 235_143_168)


def test_table10_formulas_evaluate_to_table10(v3):
    f = pa.table10_formulas(v3)
    t10 = pa.table10(v3)
    b = sym("b")
    for bb in (1, 2, 4):
        vals = {**v3.values, b: bb}
        for p in ("none", "full"):
            assert int(f["attention"][p].xreplace(vals)) == t10[bb][p]["attention"]
            assert int(f["moe"][p].xreplace(vals)) == t10[bb][p]["moe"]
            assert int(f["total"][p].xreplace(vals)) == t10[bb][p]["total"]


def test_every_printed_formula_equals_the_ledger(v3):
    checks = pa.formula_checks(v3)
    assert {(c["where"], c["key"]) for c in checks} == {(w, k) for w, d in PAPER_ACTIVATION_FORMULAS.items()
                                                        for k in d}
    assert all(c["equal"] and c["exact"] and c["difference"] == 0 for c in checks), \
        [c["label"] for c in checks if not c["equal"]]
    assert pa.formula_summary(checks) == {"formulas": 9, "equal": 9, "all_equal": True, "exact": True}


def test_a_wrong_printed_formula_is_found(v3, monkeypatch):
    wrong = {**PAPER_ACTIVATION_FORMULAS, "§5.1": {**PAPER_ACTIVATION_FORMULAS["§5.1"]}}
    wrong["§5.1"]["mla_full"] = 2 * sym("b") * sym("s") * sym("h")             # the unsplit input
    monkeypatch.setattr(pa, "PAPER_ACTIVATION_FORMULAS", wrong)
    checks = {(c["where"], c["key"]): c for c in pa.formula_checks(v3)}
    bad = checks[("§5.1", "mla_full")]
    assert not bad["equal"] and sp.expand(bad["difference"] + sym("b") * sym("s") * sym("h")) == 0
    assert pa.formula_summary(list(checks.values()))["equal"] == 8


def test_rounding_that_acts_is_not_equal():
    """DeepSeek-V2 (N_r = 6) with s = 4098 over EP = 8: b s N_r / EP = 3073.5 b, rounded up; the
    printed (mean) formulas can then not be equal, whatever else holds."""
    e = est_for("deepseek-v2", seq_len=4098)
    checks = {(c["where"], c["key"]): c for c in pa.formula_checks(e)}
    assert not checks[("§5.2", "moe_ep")]["exact"] and not checks[("§5.2", "moe_ep")]["equal"]
    assert checks[("§5.1", "mla")]["exact"]                                     # no routed tokens there
    assert not pa.formula_summary(list(checks.values()))["exact"]


def test_table9_and_routed_tokens(v3):
    t9 = pa.table9(v3)
    assert t9["micro_batches"] == (1, 2, 4) and t9["seq_len"] == 4096 and (t9["N_r"], t9["N"]) == (8, 256)
    assert t9["e_token"] == (128, 256, 512) and t9["paper_tokens"] == (4096, 8192, 16384)
    assert t9["sp"] and t9["sp_degree"] == 2 and t9["cp"] == 1
    r = pa.routed_tokens(v3)
    assert (r["paper"], r["held"], r["local_experts"], r["e_token"]) == (4096, 16384, 32, 128)
    assert r["held_exceeds"]
    # the erratum "s5-routed-tokens" says the same
    item = {e.id: e for e in errata(v3)}["s5-routed-tokens"]
    assert item.chapter == "activations" and item.values["held"].value == r["held"]
    assert f"{r['paper']:,}" in item.printed


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2", "deepseek-v2-lite"])
def test_the_ledger_rows_are_what_the_estimate_sums(model):
    e = est_for(model)
    rows = {blk: pa.ledger_rows(e, blk) for blk in pa.BLOCKS}
    layer = sum(r["bytes"] for blk in pa.BLOCKS for r in rows[blk])
    assert pa.moe_layers(e) * layer == pa.table10(e, (1,), ("none",))[1]["none"]["total"]
    routed = {r["key"]: r for r in rows["moe"]}["moe.routed.input"]
    assert routed["mean_rows"] and routed["divisors"] == ("CP", "EP")
    assert routed["bytes"] == pa.routed_tokens(e)["paper"] * e.model.hidden_size * 2
    classes = {r["key"]: r["class"] for blk in pa.BLOCKS for r in rows[blk]}
    assert classes["attention.softmax_out"] == "selective" and classes["attention.norm_input"] == "kept"
    assert classes["attention.q"] == "deepseek" and classes["moe.routing_map"] == "kept"
    assert classes["moe.routed.gate_out"] == "moe" and classes["attention.context"] == "full"


# ---------------------------------------------------------------------------------------------
# Korthikanti et al. (arXiv 2205.05198), from the gpt family's dense layer (h_F = 4h, n_h = a, TP = t)
# ---------------------------------------------------------------------------------------------
KA, KT = sp.Symbol("a", positive=True), sp.Symbol("t", positive=True)


def _k_same(x, y):
    return sp.expand(x - y) == 0


def test_korthikanti_table2_rows_by_hand():
    """Each row of their Table 2 typed by hand (not from memlib.data.reference), against the one path."""
    s, b, h = sym("s"), sym("b"), sym("h")
    a, t = KA, KT
    gpt = pa.korthikanti_gpt_block
    assert _k_same(gpt(False, "none", tp_on=False), s * b * h * (34 + 5 * a * s / h))
    assert _k_same(gpt(True, "none", tp_on=False), s * b * h * (34 + 5 * a * s / h))     # SP with TP = 1: the same
    assert _k_same(gpt(False, "none"), s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert _k_same(gpt(True, "none"), s * b * h * (34 / t + 5 * a * s / (h * t)))
    assert _k_same(gpt(False, "selective"), s * b * h * (10 + 24 / t))
    assert _k_same(gpt(True, "selective"), 34 * s * b * h / t)
    assert _k_same(gpt(False, "full"), 2 * s * b * h)
    assert _k_same(gpt(True, "full"), 2 * s * b * h / t)                                # the kept input is SP-split


def test_korthikanti_decomposition():
    """Attention 11sbh + 5as^2b, MLP 19sbh, two LayerNorm inputs 4sbh (Korthikanti et al. 2022, section 4.1)."""
    s, b, h = sym("s"), sym("b"), sym("h")
    led = pa.korthikanti_gpt_ledger()
    assert {e.block for e in led} == {"attention", "dense_ffn"}
    ln_inputs = [e for e in led if e.key in ("attention.norm_input", "dense_ffn.norm_input")]
    attn = [e for e in led if e.block == "attention" and e not in ln_inputs]
    mlp = [e for e in led if e.block == "dense_ffn" and e not in ln_inputs]
    assert len(ln_inputs) == 2 and len(attn) + len(mlp) + 2 == len(led)
    assert _k_same(pa.korthikanti_gpt_block(False, "none", False, entries=ln_inputs), 4 * s * b * h)
    assert _k_same(pa.korthikanti_gpt_block(False, "none", False, entries=attn), 11 * s * b * h + 5 * KA * s**2 * b)
    assert _k_same(pa.korthikanti_gpt_block(False, "none", False, entries=mlp), 19 * s * b * h)


def test_the_gpt_registry_formulas_are_korthikantis_rows():
    """``memlib formula activations.gpt.*`` are Table 2's rows (printed values) in memlib's symbols, for any model."""
    from memlib.formulas import formula

    s, b, h, h_F, n_h, TP = sym("s"), sym("b"), sym("h"), sym("h_F"), sym("n_h"), sym("TP")
    subs = {h_F: 4 * h, n_h: KA, TP: KT}
    for name, row in (("activations.gpt.layer", "tensor parallel (baseline)"),
                      ("activations.gpt.layer_sp", "tensor + sequence parallel"),
                      ("activations.gpt.selective_sp", "tensor + sequence parallel + selective recompute")):
        for model in ("deepseek-v3", "llama-3-8b"):
            assert _k_same(formula(name, model).xreplace(subs), s * b * h * KORTHIKANTI_TABLE2[row]), (name, model)


def test_korthikanti_22b(monkeypatch):
    k = pa.korthikanti_22b()
    assert k["name"] == "22B" and k["layers"] == 48
    # 48 layers x s b h (10 + 24/8 + 5 a s/(h t)) and 48 x 34 s b h / 8
    sbh = 2048 * 4 * 6144
    assert k["none"]["bytes"] == 48 * sbh * 13 + 48 * 5 * 64 * 2048 * 2048 * 4 // 8 == 63_619_203_072
    assert k["sp_selective"]["bytes"] == 48 * 34 * sbh // 8 == 10_267_656_192
    assert k["none"]["equal"] and k["sp_selective"]["equal"] and k["all_equal"]
    # a wrong printed row is found
    monkeypatch.setattr(pa, "KORTHIKANTI_TABLE2", {**KORTHIKANTI_TABLE2, "full recompute": sp.Integer(1)})
    assert [r["name"] for r in pa.korthikanti_gpt_rows() if not r["equal"]] == ["full recompute"]


def test_korthikanti_table2_from_the_gpt_block(monkeypatch):
    """Their Table 2 comes out of the gpt family's dense block (paper profile: 2-byte activations, 1-byte
    masks, f = 4h, a heads of h/a), every row symbolically equal; full recomputation keeps the layer input
    (their per-layer checkpoint), where the paper profile's block checkpoints keep the MLP input too."""
    a, t = sp.Symbol("a", positive=True), sp.Symbol("t", positive=True)
    s, b, h = sym("s"), sym("b"), sym("h")
    rows = {r["name"]: r for r in pa.korthikanti_gpt_rows()}
    assert list(rows) == list(KORTHIKANTI_TABLE2) and all(r["equal"] for r in rows.values())
    # the rows by hand: attention 11 sbh + 5 a s^2 b, MLP 19 sbh, two LayerNorm inputs 4 sbh
    assert sp.expand(rows["no parallelism"]["coefficient"] - (34 + 5 * a * s / h)) == 0
    assert sp.expand(rows["tensor parallel (baseline)"]["coefficient"] - (10 + 24 / t + 5 * a * s / (h * t))) == 0
    assert rows["full recompute"]["coefficient"] == 2
    assert sp.expand(pa.korthikanti_gpt_block(False, "full", per_layer_checkpoint=False) - 4 * s * b * h) == 0
    assert sp.expand(pa.korthikanti_gpt_block(False, "none", tp_on=False)
                     - (34 * s * b * h + 5 * a * s * s * b)) == 0
    assert pa.KORTHIKANTI_CONVENTION["activation_bytes"] == 2 and pa.KORTHIKANTI_CONVENTION["mask_bytes"] == 1
    monkeypatch.setattr(pa, "KORTHIKANTI_TABLE2", {**KORTHIKANTI_TABLE2, "tensor + sequence parallel": 34 / t})
    assert [r["name"] for r in pa.korthikanti_gpt_rows() if not r["equal"]] == ["tensor + sequence parallel"]


def test_korthikanti_published_models_from_the_gpt_block(monkeypatch):
    """Figure 1's activations of the first pipeline rank of their 22B, 175B, 530B and 1T models (GiB as
    printed, Calculon's transcription), exact from the gpt block and memlib's schedule: 48, 124 = 8 x 12
    (1 + 7/24), 139 = 105 (1 + 34/105) and 128 layer-micro-batches."""
    from memlib.data.reference import KORTHIKANTI_MODELS

    rows = {r["name"]: r for r in pa.korthikanti_models()}
    assert list(rows) == ["22B", "175B", "530B", "1T"] and all(r["all_equal"] for r in rows.values())
    assert {k: r["layers"] for k, r in rows.items()} == {"22B": 48, "175B": 124, "530B": 139, "1T": 128}
    # 175B by hand: s b h (10 + 24/8 + 5 x 96 x 2048 / (12288 x 8)) = 23 s b h per layer, no SP
    sbh = 2048 * 1 * 12288
    assert rows["175B"]["none"]["bytes"] == 124 * 23 * sbh == 71_772_930_048
    assert rows["175B"]["sp_selective"]["bytes"] == 124 * 34 * sbh // 8
    bad = {**KORTHIKANTI_MODELS, "1T": {**KORTHIKANTI_MODELS["1T"], "gib": {"none": "131.5", "sp_selective": "26.5625"}}}
    monkeypatch.setattr(pa, "KORTHIKANTI_MODELS", bad)
    assert [r["name"] for r in pa.korthikanti_models() if not r["all_equal"]] == ["1T"]


# ---------------------------------------------------------------------------------------------
# the tiny model, by hand (h 8, n_h 2, d_h 3, d_h^R 2, d_v 5, d_c' 6, d_c 4, h_E 4, N 4, N_s 1, N_r 2)
# ---------------------------------------------------------------------------------------------
#: one MoE layer, b = 1, s = 4, no parallelism, 2-byte activations and 1-byte masks
TINY_MLA = (2 * 32 + 2 * 32          # RMSNorm input and output, b s h = 32 elements each
            + 2 * 4 * 6 + 2 * 4 * 4  # latents c^Q (d_c' = 6), c^KV (d_c = 4)
            + 2 * 2 * 4 * 2 * 5      # q and k, n_h (d_h + d_h^R) = 10 per token
            + 2 * 4 * 2 * 5          # v, n_h d_v = 10 per token
            + 2 * 32 + 32 + 2 * 32   # softmax output, dropout mask, dropout output: b n_h s^2 = 32
            + 2 * 4 * 2 * 5          # attention output
            + 32)                    # dropout mask after W^O
TINY_MOE = (2 * 32 + 2 * 32          # RMSNorm input and output
            + 2 * 16 + 2 * 16        # router logits and probabilities, b s N = 16
            + 2 * 8                  # routing map, b s N_r = 8
            + 8 * (2 * 8 + 8)        # routed input and mask: b s N_r = 8 tokens of width h
            + 4 * 2 * 8 * 4          # gate, up, SiLU, product: 8 tokens of width h_E
            + 4 * (2 * 8 + 8)        # shared input and mask: 4 tokens
            + 4 * 2 * 4 * 4)         # shared gate, up, SiLU, product (N_s h_E = 4 wide)


def tiny_est(**train):
    return estimate(T.tiny(), TrainingConfig(pp=3, micro_batch=1, seq_len=4, **train))


def test_tiny_by_hand_without_parallelism():
    assert (TINY_MLA, TINY_MOE) == (720, 880)
    e = tiny_est()
    assert pa.moe_layers(e) == 1 and e.partition.stages[1].layers == (1,)
    t10 = pa.table10(e, (1, 2), ("none", "full"))
    assert t10[1]["none"] == {"attention": TINY_MLA, "moe": TINY_MOE, "total": TINY_MLA + TINY_MOE}
    assert t10[2]["none"]["total"] == 2 * (TINY_MLA + TINY_MOE)
    assert t10[1]["full"]["total"] == 2 * 32 + 2 * 32 + 2 * 8                   # two block inputs, routing map
    r = pa.routed_tokens(e)
    assert (r["copies"], r["paper"], r["held"], r["e_token"], r["local_experts"]) == (8, 8, 8, 2, 4)
    assert not r["held_exceeds"]                                                # no EP: the same tokens


def test_tiny_by_hand_with_tp_sp_and_ep():
    """TP 2 with SP, EP 4: the h-wide norm tensors and masks halve, the per-head ones halve, the
    latents, router and shared expert stay whole; the routed experts see 8 / 4 = 2 token copies."""
    e = tiny_est(tp=2, dp=2, ep=4)
    mla = 32 + 32 + 48 + 32 + 40 + 40 + 40 + 32 + 16 + 32 + 40 + 16
    moe = 32 + 32 + 32 + 32 + 16 + 2 * (2 * 8 + 8) + 4 * 2 * 2 * 4 + 4 * (2 * 8 + 8) + 4 * 2 * 4 * 4
    assert (mla, moe) == (400, 480)
    assert pa.table10(e, (1,), ("none",))[1]["none"] == {"attention": mla, "moe": moe, "total": mla + moe}
    r = pa.routed_tokens(e)
    assert (r["paper"], r["held"], r["local_experts"]) == (2, 4, 1)             # EP does not divide the held


def test_tiny_routed_tokens_are_rounded_up():
    """N_r = 3, s = 2, EP 4: b s N_r / EP = 1.5 tokens, a device holds 2."""
    e = estimate(T.tiny(num_experts_per_tok=3), TrainingConfig(pp=3, tp=2, dp=2, ep=4, seq_len=2))
    r = pa.routed_tokens(e)
    assert (r["paper"], r["e_token"], r["held"]) == (2, Fraction(3, 2), 3)
    routed = {x["key"]: x for x in pa.ledger_rows(e, "moe")}["moe.routed.input"]
    assert routed["bytes"] == 2 * 8 * 2
    assert not pa.formula_summary(pa.formula_checks(e))["exact"]


def test_tiny_sequence_split_and_crossover():
    """One MoE layer, b = 1, no parallelism: the scores are 10 s^2 bytes, the rest 360 s (MLA 140 s,
    MoE 220 s), so they are equal at s = 36."""
    e = tiny_est()
    split = sa.layer_split(e)
    assert (split["quadratic"], split["linear"], split["tensors"]) == (160, 1440, 3)
    assert split["share"] == Fraction(1, 10) and not split["dominates"]
    assert sa.crossover(e) == {"s": 36, "s_mean": 36}
    assert sa.layer_split(e, 36)["quadratic"] == sa.layer_split(e, 36)["linear"] == 10 * 36**2
    assert sa.layer_split(e, 64)["dominates"]
    rows = sa.seqlen_sweep(e, lo=2, hi=4, per_octave=2)
    assert [r["seq_len"] for r in rows] == [4, 6, 8, 12, 16]
    assert all(r["quadratic"] == 10 * r["seq_len"] ** 2 and r["linear"] == 360 * r["seq_len"] for r in rows)


def test_tiny_policies_and_schedule():
    e = tiny_est()
    rows = {r["policy"]: r for r in sa.policy_comparison(e)}
    assert rows["none"]["layer"] == TINY_MLA + TINY_MOE and rows["none"]["working"] == 0
    assert rows["full"]["layer"] == 144 and rows["full"]["working"] == TINY_MLA + TINY_MOE - 144
    assert rows["selective"]["working"] == 160                                  # the scores
    for r in rows.values():
        assert r["in_flight"] == 2                                              # stage 1 of 3 under 1F1B
        assert r["held"] == r["in_flight"] * r["per_microbatch"] and r["total"] == r["held"] + r["working"]
    ch = sa.seq_len_change(e)
    assert ch["seq_len"] == 8 and ch["per_microbatch_ratio"] == 2
    # working set at s = 8: 10 s^2 + 360 s - 144 s/4 (the kept part, linear)
    assert ch["new"]["working"] == 10 * 64 + 360 * 8 - 144 * 2


# ---------------------------------------------------------------------------------------------
# the paper's configuration: sweeps and policies
# ---------------------------------------------------------------------------------------------
def test_crossover_and_scores(v3):
    c = sa.crossover(v3)
    assert c == {"s": 610, "s_mean": Fraction(12193, 20)}
    assert sa.layer_split(v3, 610)["quadratic"] >= sa.layer_split(v3, 610)["linear"]
    assert sa.layer_split(v3, 609)["quadratic"] < sa.layer_split(v3, 609)["linear"]
    split = sa.layer_split(v3)
    assert split["quadratic"] == 10 * 128 * 4096**2 // 4 and split["tensors"] == 3 and split["dominates"]
    assert split["total"] == 24_671_158_272 // 4


def test_policy_comparison(v3):
    rows = {r["policy"]: r for r in sa.policy_comparison(v3)}
    assert list(rows) == list(sa.POLICIES_COMPARED)
    assert rows["none"]["total"] == 15 * 24_671_158_272 and rows["none"]["in_flight"] == 15
    assert rows["full"]["per_microbatch"] == 235_143_168 and rows["full"]["working"] == 6_109_003_776
    assert rows["selective"]["working"] == 10 * 128 * 4096**2 // 2 // 2      # one layer's scores, TP 2
    for r in rows.values():
        assert r["total"] == r["held"] + r["working"]
    assert rows["full"]["total"] < rows[sa.MODULE_LIST]["total"] < rows["selective"]["total"] \
        < rows["deepseek"]["total"] < rows["none"]["total"]


def test_microbatch_sweep(v3):
    sweep = sa.microbatch_sweep(v3, (1, 2, 3), ("none", "full"))
    assert [r["per_microbatch"] for r in sweep["none"]] == [24_671_158_272 * b for b in (1, 2, 3)]
    assert sa.microbatch_facts(sweep) == {"proportional": True, "same_order": True}
    bad = {"none": [{"b": 1, "per_microbatch": 5}, {"b": 2, "per_microbatch": 11}],
           "full": [{"b": 1, "per_microbatch": 6}, {"b": 2, "per_microbatch": 10}]}
    assert sa.microbatch_facts(bad) == {"proportional": False, "same_order": False}


def test_longer_sequence_under_full_recomputation(v3):
    ch = sa.seq_len_change(v3)
    assert ch["seq_len"] == 8192 and ch["base"]["working"] == 6_109_003_776
    assert ch["new"] == {"per_microbatch": 470_286_336, "in_flight": 15, "held": 15 * 470_286_336,
                         "working": 22_955_425_792, "total": 15 * 470_286_336 + 22_955_425_792}
    assert ch["held_ratio"] == 2 and ch["working_ratio"] == Fraction(22_955_425_792, 6_109_003_776)
    assert ch["working_dominates"]


# ---------------------------------------------------------------------------------------------
# DeepSeek-V2 and V2-Lite
# ---------------------------------------------------------------------------------------------
def test_deepseek_v2_lite_by_hand():
    """One MoE layer on stage 1 (h 2048, n_h 16, d_h 128, d_h^R 64, d_v 128, no q LoRA, d_c 512,
    N 64, N_s 2, N_r 6, h_E 1408), TP 2 with SP, EP 8, b 1, s 4096."""
    e = est_for("deepseek-v2-lite")
    bs = 4096
    mla = (2 * bs * 2048 + 2 * bs * 512 + 2 * bs * 16 * 192 + bs * 16 * 128 + 5 * 16 * bs * bs // 2
           + bs * 16 * 128 + bs * 2048 // 2)
    tokens = -(-bs * 6 // 8)
    moe = (2 * bs * 2048 + 4 * bs * 64 + 2 * bs * 6 + tokens * (3 * 2048 + 8 * 1408)
           + 3 * bs * 2048 + 8 * 2 * bs * 1408)       # the shared experts' input is kept once for both
    assert (mla, moe) == (738_197_504, 188_792_832)
    t10 = pa.table10(e)
    assert t10[1]["none"] == {"attention": mla, "moe": moe, "total": 926_990_336}
    assert t10[1]["full"]["total"] == 2 * bs * 2048 // 2 * 2 + 2 * bs * 6 == 16_826_368
    assert pa.routed_tokens(e)["paper"] == tokens == 3072 and pa.routed_tokens(e)["held"] == 12_288
    assert sa.crossover(e)["s"] == 1563


def test_deepseek_v2():
    e = est_for("deepseek-v2")
    t10 = pa.table10(e)
    assert pa.moe_layers(e) == 3
    assert t10[1]["none"] == {"attention": 17_320_378_368, "moe": 879_378_432, "total": 18_199_756_800}
    assert t10[1]["full"]["total"] == 3 * (2 * 4096 * 5120 + 2 * 4096 * 6) == 125_976_576
    assert pa.routed_tokens(e)["paper"] == 3072 and pa.routed_tokens(e)["e_token"] == Fraction(768, 5)
    assert sa.crossover(e)["s"] == 533
    # the paper's printed formulas are DeepSeek-V3's: the MoE rows differ for V2 (N/EP = 20, not 32)
    checks = {(c["where"], c["key"]): c for c in pa.formula_checks(e)}
    assert not checks[("§5.2", "moe_ep")]["equal"] and checks[("§5.1", "mla")]["equal"]
    assert errata(e) == []


def test_routed_count_comparison_on_deepseek_v3(v3):
    """The erratum s5-routed-tokens in bytes: a routed token copy of DeepSeek-V3 saves 2h (input) + h (its
    mask) + 4 x 2 h_E (gate, up, activation, product) = 37,888 bytes; a device of stage 1 holds 16,384 copies
    per MoE layer and micro-batch, not the paper's 4,096, over its four MoE layers."""
    per_copy = 2 * 7168 + 7168 + 4 * 2 * 2048
    c = pa.routed_count_comparison(v3)
    assert (c["paper"]["tokens"], c["held"]["tokens"]) == (4096, 16384)
    assert c["paper"]["layer_routed"] == 4096 * per_copy == 155_189_248
    assert c["held"]["layer_routed"] == 16384 * per_copy == 620_756_992
    assert c["held"]["stage_per_microbatch"] - c["paper"]["stage_per_microbatch"] == 4 * 12288 * per_copy
    assert c["held"]["stage_held"] - c["paper"]["stage_held"] == 15 * 4 * 12288 * per_copy      # 15 in flight
    assert c["held"]["total"] > c["paper"]["total"]
    assert pa.held_count_training(v3).routing_imbalance == 4 and v3.train.routing_imbalance == 1


def test_routed_counts_agree_when_ep_does_not_exceed_tp():
    est = est_for("deepseek-v3", ep=2)                    # EP ETP = TP: the two counts are one
    assert pa.held_count_training(est) == est.train
    c = pa.routed_count_comparison(est)
    assert c["paper"] == c["held"]
