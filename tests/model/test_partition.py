"""Partition: what one device of each pipeline stage stores.

Paper Tables 4 and 6 for DeepSeek-V3 under PP16@TP2@EP8@ETP1, the megatron profile's
differences, a tiny model worked by hand along every parallel axis, and properties (monotone in
TP/EP/ETP, replication over all ranks, parts add to totals).
"""
from __future__ import annotations

import pytest

from memlib.config import PAPER_TRAINING, ConfigError, TrainingConfig, load_model
from memlib.model.params import by_block, layer_params, model_params, mtp_params, values
from memlib.model.partition import PROFILES, Partition, default_layout, resolve_layout

import tiny as T


@pytest.fixture(scope="module")
def v3():
    return load_model("deepseek-v3")


@pytest.fixture(scope="module")
def paper(v3):
    return Partition(v3, PAPER_TRAINING)


def per_device(part: Partition) -> list[int]:
    return [part.params(s).evaluate_total(part.values) for s in part.stages]


def groups(part: Partition, stage) -> dict[str, int]:
    return {k: b.evaluate_total(part.values) for k, b in part.split(stage).items()}


# ---------------------------------------------------------------------------------------------
# Paper: layout, Table 4, Table 6
# ---------------------------------------------------------------------------------------------
def test_default_layout(paper):
    assert default_layout(61, 16) == (4,) * 15 + (1,)
    assert paper.layout == (4,) * 15 + (1,)
    assert paper.stages[0].layers == (0, 1, 2, 3)
    assert paper.stages[1].layers == (4, 5, 6, 7)
    assert paper.stages[15].layers == (60,)
    assert paper.stages[0].first and not paper.stages[0].last
    assert paper.stages[15].last and not paper.stages[15].first


def test_table4_unsharded_stages(paper):
    un = [paper.params_unsharded(s).evaluate_total(paper.values) for s in paper.stages]
    assert un[0] == 14_184_415_232
    assert set(un[1:15]) == {46_029_144_064}
    # Table 4's stage 15 is layer 60 + head; memlib also counts the final norm (h = 7,168) there
    last = paper.params_unsharded(paper.stages[15]).evaluate(paper.values)
    assert un[15] - last["final_norm.weight"] == 12_433_965_056
    assert last["final_norm.weight"] == 7168
    # the stages make up the model
    assert sum(un) == 671_026_404_352


def test_table6_stage1_per_device(paper):
    st = paper.stages[1]
    assert paper.params(st).evaluate_total(paper.values) == 6_250_364_928
    per_tensor = paper.params(st).evaluate(paper.values)
    blocks = by_block(paper.params(st)).evaluate(paper.values)
    split = paper.split(st)
    # MLA's TP-split part: W^UQ, W^UK, W^UV, W^O of 4 layers over TP = 2
    tp_mla = {k: v for k, v in split["tp"].evaluate(paper.values).items() if k.startswith("attention.")}
    assert set(tp_mla) == {"attention.W_UQ", "attention.W_UK", "attention.W_UV", "attention.W_O"}
    assert sum(tp_mla.values()) == 318_767_104
    # MLA's replicated matrices: W^DQ, W^DKV, W^QR, W^KR of 4 layers
    rep_mla = {k: v for k, v in split["replicated"].evaluate(paper.values).items()
               if k.startswith("attention.W_")}
    assert set(rep_mla) == {"attention.W_DQ", "attention.W_QR", "attention.W_DKV", "attention.W_KR"}
    assert sum(rep_mla.values()) == 110_886_912
    # RMSNorms: two block norms and the two latent norms, 4 layers: (2h + d_c' + d_c) * 4
    norms = sum(v for k, v in per_tensor.items() if k.endswith("norm"))
    assert norms == 65_536
    # MoE block: router, shared expert (replicated), 32 routed experts
    moe = blocks["router"] + blocks["shared_experts"] + blocks["routed_experts"]
    assert moe == 5_820_645_376
    # non-MoE part (Table 6)
    assert 318_767_104 + 110_886_912 + 65_536 == 6_250_364_928 - moe == 429_719_552


def test_other_stages_per_device(paper):
    dev = per_device(paper)
    assert dev[0] == 2_942_763_008
    assert set(dev[1:15]) == {6_250_364_928}
    assert dev[15] == 2_025_937_920
    # the reference's 2,025,930,752 left out the final norm, which is replicated on stage 15
    last = paper.params(paper.stages[15]).evaluate(paper.values)
    assert dev[15] - last["final_norm.weight"] == 2_025_930_752


def test_paper_profile_has_no_mtp(paper):
    assert not PROFILES["paper"].include_mtp
    assert not any(k.startswith("mtp.") for k in paper.params(paper.stages[15]))


# ---------------------------------------------------------------------------------------------
# Megatron profile
# ---------------------------------------------------------------------------------------------
def test_megatron_profile_differences(v3, paper):
    meg = Partition(v3, PAPER_TRAINING.with_(profile="megatron"))
    st = meg.stages[1]
    shard = {t.key: meg.sharding(t) for t, _ in meg.tensors(st)}
    assert shard["attention.W_QR"] == "tp"
    assert {shard[k] for k in ("shared_experts.gate", "shared_experts.up", "shared_experts.down")} == {"tp"}
    assert paper.sharding(next(t for t, _ in paper.tensors(st) if t.key == "attention.W_QR")) == "replicated"
    # stage 1: W^QR and the shared expert halve on TP = 2 (4 layers each)
    w_qr, shared = 12_582_912, 44_040_192
    assert meg.params(st).evaluate_total(meg.values) == 6_250_364_928 - 4 * (w_qr + shared) // 2
    # MTP on the last stage: per device, one MTP module as Megatron lays it out
    last = meg.params(meg.stages[15])
    assert any(k.startswith("mtp.") for k in last)
    mtp_dev = last.select(lambda k: k.startswith("mtp.")).evaluate_total(meg.values)
    moe_layer_dev = meg.params(st).evaluate_total(meg.values) // 4
    h, v = 7168, 129280
    # enorm + hnorm + shared-head norm (replicated) + eh_proj (2h x h, TP-split) + one MoE block
    # + the embedding copy the last stage keeps for the MTP input (v x h, vocab-parallel)
    assert mtp_dev == 3 * h + 2 * h * h // 2 + moe_layer_dev + v * h // 2
    # the rest of stage 15 matches the paper profile apart from W^QR and the shared expert
    assert last.evaluate_total(meg.values) - mtp_dev == 2_025_937_920 - (w_qr + shared) // 2
    # Megatron: only routed experts shard their states over EDP; the paper: the whole MoE block
    assert {k.split(".")[0] for k in meg.edp_keys(st)} == {"routed_experts"}
    assert {k.split(".")[0] for k in paper.edp_keys(st)} == {"router", "shared_experts", "routed_experts"}


def test_megatron_stages_add_up_to_model_plus_mtp(v3):
    meg = Partition(v3, PAPER_TRAINING.with_(profile="megatron"))
    un = sum(meg.params_unsharded(s).evaluate_total(meg.values) for s in meg.stages)
    m = values(v3)
    embedding_copy = 129280 * 7168     # the last stage's copy of the embedding for the MTP input
    assert un == model_params(v3).evaluate_total(m) + mtp_params(v3).evaluate_total(m) + embedding_copy
    # DualPipe puts the first and last stages on one rank: no copy there
    dual = Partition(v3, PAPER_TRAINING.with_(profile="megatron", schedule="dualpipe"))
    assert not any(k == "mtp.embedding_copy" for st in dual.stages for k in dual.params(st))


# ---------------------------------------------------------------------------------------------
# The tiny model by hand along each axis (see tests/tiny.py for the per-layer counts)
#   MLA TP-split part (paper): W^UQ 36 + W^UK 24 + W^UV 40 + W^O 80 = 180
#   MLA replicated part (paper): W^DQ 48 + q_norm 6 + W^QR 24 + W^DKV 32 + W^KR 16 + kv_norm 4 = 130
# ---------------------------------------------------------------------------------------------
def tiny_part(**train) -> Partition:
    return Partition(T.tiny(), TrainingConfig(**train))


def test_tiny_no_parallelism():
    p = tiny_part()
    assert per_device(p) == [2554]   # the whole model on one device


def test_tiny_tp2_pp2_ep2():
    p = tiny_part(dp=2, tp=2, pp=2, ep=2)
    assert p.layout == (2, 1)        # default: ceil(3/2) = 2, remainder 1 on the last stage
    # per device, paper profile:
    #   embedding 80/2 = 40
    #   dense layer: MLA 180/2 + 130 = 220, norms 16, dense FFN 384/2 = 192       -> 428
    #   MoE layer:   MLA 220, norms 16, router 32, shared 96, routed 384/2 = 192  -> 556
    #   final norm 8, head 80/2 = 40
    assert per_device(p) == [40 + 428 + 556, 556 + 8 + 40] == [1024, 604]
    assert groups(p, p.stages[0]) == {
        "tp": 40 + 90 + 192 + 90,           # embedding, MLA split (2 layers), dense FFN
        "replicated": 130 + 16 + 130 + 16 + 32 + 96,
        "expert": 192,
    }


def test_tiny_tp2_megatron():
    p = tiny_part(dp=2, tp=2, pp=2, ep=2, profile="megatron")
    # megatron: W^QR split too (MLA (180 + 24)/2 + 106 = 208), shared experts 96/2 = 48
    #   dense layer 208 + 16 + 192 = 416; MoE layer 208 + 16 + 32 + 48 + 192 = 496
    assert per_device(p) == [40 + 416 + 496, 496 + 8 + 40]
    # with an MTP module on the last stage: enorm 8 + hnorm 8 + eh_proj 128/2 + MoE block 496
    # + shared-head norm 8 + the embedding copy for the MTP input 80/2
    p = Partition(T.tiny(num_nextn_predict_layers=1), TrainingConfig(dp=2, tp=2, pp=2, ep=2, profile="megatron"))
    assert per_device(p) == [952, 544 + 8 + 8 + 64 + 496 + 8 + 40]


def test_tiny_tp_only():
    p = tiny_part(dp=1, tp=2)
    # embedding 40 + dense 428 + 2 MoE layers (220 + 16 + 32 + 96 + routed 384 whole) + 8 + 40
    assert per_device(p) == [40 + 428 + 2 * (220 + 16 + 32 + 96 + 384) + 8 + 40]


def test_tiny_ep_axis():
    for ep, routed in ((1, 384), (2, 192), (4, 96)):
        p = tiny_part(dp=4, ep=ep)
        # only the routed experts shrink: 2 MoE layers of N/EP experts each
        assert per_device(p) == [2554 - 2 * 384 + 2 * routed], ep


def test_tiny_etp_axis():
    for etp, routed in ((1, 384), (2, 192), (4, 96)):
        p = tiny_part(dp=4, etp=etp)
        # each expert's width h_E = 4 splits over ETP
        assert per_device(p) == [2554 - 2 * 384 + 2 * routed], etp
    p = tiny_part(dp=4, ep=2, etp=2)
    assert per_device(p) == [2554 - 2 * 384 + 2 * 96]


def test_tiny_pp_layouts():
    p = tiny_part(pp=2, layout=(1, 2))
    assert [s.layers for s in p.stages] == [(0,), (1, 2)]
    assert per_device(p) == [80 + 710, 2 * 838 + 8 + 80]
    p = tiny_part(pp=3)
    assert p.layout == (1, 1, 1)
    assert per_device(p) == [80 + 710, 838, 838 + 8 + 80]


def test_tiny_cp_has_no_effect_on_params():
    base = per_device(tiny_part(dp=2, tp=2, pp=2, ep=2))
    assert per_device(tiny_part(dp=1, tp=2, pp=2, ep=2, cp=2)) == base
    assert per_device(tiny_part(dp=2, tp=2, pp=2, ep=2, cp=4)) == base


# ---------------------------------------------------------------------------------------------
# Validation (ConfigError in-process; the CLI side is in test_cli.py)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("train,needle", [
    (dict(dp=8, ep=3), "ep=3 must divide n_routed_experts=4"),
    (dict(dp=8, etp=3), "etp=3 must divide moe_intermediate_size=4"),
    (dict(dp=2, tp=4), "tp=4 must divide num_attention_heads=2"),
    (dict(dp=1, ep=2), "dp*tp*cp=1 must be divisible by ep*etp=2"),
    (dict(pp=2, layout=(1, 1)), "layout=1,1 sums to 2 but num_hidden_layers=3"),
    (dict(pp=2, layout=(3,)), "layout=3 has 1 stages but pp=2"),
    (dict(pp=3, layout=None, profile="nope"), "profile='nope'"),
])
def test_tiny_rules(train, needle):
    with pytest.raises(ConfigError, match=needle.replace("*", r"\*")):
        tiny_part(**train)


def test_tp_must_divide_every_split_dimension():
    # vocabulary 9 is not divisible by TP = 2; the paper profile splits the embedding by TP
    with pytest.raises(ConfigError, match=r"tp=2 must divide vocab_size=9 \(embedding.weight"):
        Partition(T.tiny(vocab_size=9), TrainingConfig(tp=2))
    # the megatron profile also splits the shared experts (width N_s h_E), the paper profile
    # replicates them: an odd shared width fails under megatron only
    m = T.tiny(moe_intermediate_size=3, n_shared_experts=1)
    Partition(m, TrainingConfig(tp=2))
    with pytest.raises(ConfigError, match=r"tp=2 must divide \S*moe_intermediate_size\S*=3 \(shared_experts"):
        Partition(m, TrainingConfig(tp=2, profile="megatron"))


def test_default_layout_empty_stage():
    with pytest.raises(ConfigError, match="leaves stage 59 empty"):
        default_layout(61, 60)
    assert default_layout(8, 4) == (2, 2, 2, 2)
    assert default_layout(3, 1) == (3,)


def test_resolve_layout_explicit(v3):
    lay = (5,) + (4,) * 14 + (0,)
    assert resolve_layout(v3, PAPER_TRAINING.with_(layout=lay)) == lay


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize("profile", ["paper", "megatron"])
def test_params_never_rise_with_tp(v3, profile):
    prev = None
    for tp in divisors(128):  # every TP that divides n_h = 128 (and h_F, v, N_s h_E, h)
        dev = per_device(Partition(v3, PAPER_TRAINING.with_(tp=tp, dp=8, profile=profile)))
        if prev is not None:
            assert all(a <= b for a, b in zip(dev, prev)), tp
            assert dev != prev, tp  # and something shrinks
        prev = dev


@pytest.mark.parametrize("profile", ["paper", "megatron"])
def test_params_never_rise_with_ep_or_etp(v3, profile):
    prev = None
    for ep in divisors(256):
        dev = per_device(Partition(v3, PAPER_TRAINING.with_(ep=ep, dp=128, profile=profile)))
        if prev is not None:
            assert all(a <= b for a, b in zip(dev, prev)), ep
            assert dev[1] < prev[1], ep
        prev = dev
    prev = None
    for etp in divisors(2048)[:8]:  # 1..128
        dev = per_device(Partition(v3, PAPER_TRAINING.with_(etp=etp, ep=2, dp=128, profile=profile)))
        if prev is not None:
            assert all(a <= b for a, b in zip(dev, prev)), etp
            assert dev[1] < prev[1], etp
        prev = dev


def test_tiny_params_never_rise_exhaustive():
    m = T.tiny()
    for profile in ("paper", "megatron"):
        for tp in divisors(2):
            for ep in divisors(4):
                for etp in divisors(4):
                    t = TrainingConfig(dp=16, tp=tp, ep=ep, etp=etp, pp=2, profile=profile)
                    dev = per_device(Partition(m, t))
                    for field, bigger in (("tp", 2 * tp), ("ep", 2 * ep), ("etp", 2 * etp)):
                        try:
                            other = Partition(m, t.with_(**{field: bigger}))
                        except ConfigError:
                            continue
                        assert all(a <= b for a, b in zip(per_device(other), dev)), (profile, field, t)


CONFIGS = [
    ("deepseek-v3", PAPER_TRAINING),
    ("deepseek-v3", PAPER_TRAINING.with_(profile="megatron")),
    ("deepseek-v3", TrainingConfig(dp=4, tp=4, pp=4, ep=4, etp=2, cp=2)),
    ("deepseek-v2-lite", TrainingConfig(dp=2, tp=2, pp=3, ep=4, etp=1, profile="megatron")),
    ("tiny", TrainingConfig(dp=2, tp=2, pp=2, ep=2)),
    ("tiny", TrainingConfig(dp=3, tp=2, pp=3, ep=2, cp=2, profile="megatron")),
    ("tiny-mtp", TrainingConfig(dp=1, tp=2, pp=2, ep=2, etp=2, cp=2, profile="megatron")),
]


def _model(name):
    if name == "tiny":
        return T.tiny()
    if name == "tiny-mtp":
        return T.tiny(num_nextn_predict_layers=1, topk_method="noaux_tc")
    return load_model(name)


@pytest.mark.parametrize("name,train", CONFIGS)
def test_stored_parameters_over_all_ranks(name, train):
    """Summed over all ranks, stored parameters (ZeRO 0) = sum over tensors of count x replication."""
    p = Partition(_model(name), train)
    t = train
    stored = sum(c * t.dp * t.tp * t.cp for c in per_device(p))
    via_replication = 0
    by_hand = 0
    for st in p.stages:
        for tensor, n in p.tensors(st):
            if tensor.kind == "buffer":
                continue
            count = int((n * tensor.numel).xreplace(p.values))
            via_replication += count * p.replication(tensor)
            kind = p.sharding(tensor)
            # independent: TP-split tensors live once per DP*CP rank group, replicated ones on
            # every rank, experts once per expert-data-parallel group
            copies = {"tp": t.dp * t.cp, "replicated": t.dp * t.tp * t.cp,
                      "expert": t.dp * t.tp * t.cp // (t.ep * t.etp)}[kind]
            by_hand += count * copies
    assert stored == via_replication == by_hand
    assert t.edp * t.ep * t.etp == t.dp * t.tp * t.cp


@pytest.mark.parametrize("name,train", CONFIGS)
def test_parts_add_to_totals(name, train):
    p = Partition(_model(name), train)
    m = p.model
    unsharded = 0
    for st in p.stages:
        b = p.params(st)
        terms = b.evaluate(p.values)
        assert sum(terms.values()) == b.evaluate_total(p.values)
        assert sum(groups(p, st).values()) == b.evaluate_total(p.values)
        assert sum(by_block(b).evaluate(p.values).values()) == b.evaluate_total(p.values)
        unsharded += p.params_unsharded(st).evaluate_total(p.values)
    expect = model_params(m).evaluate_total(values(m))
    if p.profile.include_mtp:
        expect += mtp_params(m).evaluate_total(values(m))
        if m.num_nextn_predict_layers and len(p.stages) > 1:
            expect += m.vocab_size * m.hidden_size     # the last stage's embedding copy for MTP
    assert unsharded == expect
    # every decoder layer sits on exactly one stage
    assert sorted(i for st in p.stages for i in st.layers) == list(range(m.num_hidden_layers))


def test_layer_types_follow_the_config():
    p = Partition(T.tiny(moe_layer_freq=2), TrainingConfig(pp=3))
    kinds = [{t.block for t, _ in p.tensors(s)} for s in p.stages]
    assert "dense_ffn" in kinds[0] and "routed_experts" not in kinds[0]
    assert "dense_ffn" in kinds[1] and "routed_experts" not in kinds[1]
    assert "routed_experts" in kinds[2] and "dense_ffn" not in kinds[2]
    one_moe = layer_params(T.tiny(), "moe").evaluate_total(values(T.tiny()))
    assert per_device(p)[2] == one_moe + 8 + 80
