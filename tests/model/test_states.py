"""Model states: precision recipes, ZeRO stages, the paper's Table 8, the ZeRO paper's example,
Megatron's bytes-per-parameter table, a tiny model by hand, and properties."""
from __future__ import annotations

import random
from decimal import Decimal

import pytest
import sympy as sp

from memlib.core.breakdown import Breakdown
from memlib.config import PAPER_TRAINING, ConfigError, TrainingConfig, load_model
from memlib.device.estimate import estimate
from memlib.model.params import model_params, values
from memlib.model.partition import Partition
from memlib.data.reference import MEGATRON_BYTES_PER_PARAM, PAPER, ZERO_PAPER
from memlib.model.states import (
    ZeroStage, model_states, optimizer_states, recipe, sharded_count, states_formula,
)
from memlib.core.symbols import sym
from memlib.core.units import fmt_bytes

import tiny as T

P_ne, P_e, DP, CP, EDP = sym("P_ne"), sym("P_e"), sym("DP"), sym("CP"), sym("EDP")
B_w, B_g, B_o = sym("B_w"), sym("B_g"), sym("B_o")


def states(stage) -> dict:
    """The model-state terms of a stage's bytes (parameters, gradients, optimizer states)."""
    return {k: stage.bytes[k] for k in ("parameters", "gradients", "optimizer_states")}


@pytest.fixture(scope="module")
def v3():
    return load_model("deepseek-v3")


# ---------------------------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,w,g,o", [
    ("paper", 2, 4, 8),           # bf16 weights, fp32 grads, fp32 master + bf16 moments (Table 7)
    ("megatron", 2, 4, 12),
    ("fp16-mixed", 2, 2, 12),     # ZeRO paper: 2 + 2 + K, K = 12
    ("megatron-fp16", 2, 2, 16),
    ("fp32", 4, 4, 8),
])
def test_recipes_are_the_published_bytes(name, w, g, o):
    r = recipe(name)
    assert (r.weights, r.gradients, r.optimizer_bytes) == (w, g, o)
    # and they reach the states of a device: one unsharded parameter of the tiny model costs w + g + o
    est = estimate(T.tiny(), TrainingConfig(precision=name, num_microbatches=1))
    st = est.stages[0]
    assert states(st) == {"parameters": w * st.parameters, "gradients": g * st.parameters,
                          "optimizer_states": o * st.parameters}


def test_paper_recipe_matches_table7():
    r = recipe("paper")
    t7 = PAPER["table7"]
    assert r.weights == t7["weights"] and r.gradients == t7["gradients"]
    assert dict(r.optimizer) == {k: t7[k] for k in ("master_weights", "exp_avg", "exp_avg_sq")}


def test_unknown_recipe():
    with pytest.raises(ConfigError, match=r"precision='fp8' must be one of paper, megatron"):
        recipe("fp8")


# ---------------------------------------------------------------------------------------------
# Recipe specs: a preset with some of its bytes changed
# ---------------------------------------------------------------------------------------------
def test_spec_changes_only_the_named_fields():
    """megatron (2/4/12) with bf16 gradients and bf16 moments: 2 + 2 + (4 + 2 + 2) = 12 bytes."""
    r = recipe("megatron:gradients=bf16,exp_avg=2,exp_avg_sq=bf16")
    assert (r.weights, r.gradients, r.optimizer) == (2, 2, (("master_weights", 4), ("exp_avg", 2), ("exp_avg_sq", 2)))
    assert r.total_bytes == 12 and r.activations == 2
    assert r.name == "megatron:gradients=2,exp_avg=2,exp_avg_sq=2"     # canonical: byte counts
    assert recipe(r.name) == r                                       # the name reads back as the recipe


def test_spec_adds_and_removes_optimizer_states():
    """main_grad is added to megatron (an fp32 copy of bf16 gradients), master_weights removed."""
    r = recipe("megatron:gradients=2,main_grad=4")
    assert dict(r.optimizer) == {"master_weights": 4, "exp_avg": 4, "exp_avg_sq": 4, "main_grad": 4}
    assert r.total_bytes == 2 + 2 + 16
    r = recipe("megatron:master_weights=0")
    assert dict(r.optimizer) == {"exp_avg": 4, "exp_avg_sq": 4}


def test_spec_keeps_the_presets_other_properties():
    r = recipe("deepseek-v3:exp_avg=4")
    assert r.fp8_activations and r.recompute == frozenset({"moe_act"})
    assert r.optimizer_bytes == 4 + 4 + 2


def test_spec_reaches_the_device_states():
    """A spec is a precision like a preset: the tiny model's one device pays w + g + o per parameter."""
    est = estimate(T.tiny(), TrainingConfig(precision="megatron:exp_avg=bf16,exp_avg_sq=fp8", num_microbatches=1))
    st = est.stages[0]
    assert states(st) == {"parameters": 2 * st.parameters, "gradients": 4 * st.parameters,
                          "optimizer_states": (4 + 2 + 1) * st.parameters}


@pytest.mark.parametrize("spec,message", [
    ("megatron:", r"'' must be FIELD=BYTES"),
    ("megatron:exp_avg", r"'exp_avg' must be FIELD=BYTES"),
    ("megatron:momentum=2", r"'momentum=2' must be FIELD=BYTES with FIELD one of weights"),
    ("megatron:exp_avg=3", r"exp_avg=3 must be 0, 1, 2, 4 bytes"),
    ("megatron:gradients=1", r"gradients=1 must be 2, 4 bytes"),
    ("megatron:weights=0", r"weights=0 must be 1, 2, 4 bytes"),
    ("megatron:exp_avg=fp64", r"exp_avg=fp64 must be"),
    ("megatron:exp_avg=2,exp_avg=4", r"exp_avg is set twice"),
    ("bogus:exp_avg=2", r"the base 'bogus' must be one of paper"),
    ("megatron:exp_avg=" + "2" * 300, r"longer than 200 characters"),
])
def test_spec_errors_are_one_line(spec, message):
    with pytest.raises(ConfigError, match=message) as exc:
        recipe(spec)
    assert "\n" not in str(exc.value) and str(exc.value).startswith("precision=")


def test_each_zero_stage_shards_one_more_state():
    """ZeRO-1 shards the optimizer states, ZeRO-2 the gradients too, ZeRO-3 the parameters too
    (Rajbhandari et al.): on the tiny model with DP = 2 and no experts split (EP = ETP = 1, so EDP =
    DP), a sharded state is the full one halved (1,786 non-expert and 768 expert parameters, both even)."""
    full = None
    got = {}
    for z in ZeroStage:
        st = estimate(T.tiny(), TrainingConfig(dp=2, zero=int(z), num_microbatches=1)).stages[0]
        got[z.label] = states(st)
        full = full or states(st)
    q = {k: x // 2 for k, x in full.items()}
    assert full["parameters"] == 2 * 2554
    assert got == {
        "none": full,
        "os": {**full, "optimizer_states": q["optimizer_states"]},
        "os+g": {"parameters": full["parameters"], "gradients": q["gradients"],
                 "optimizer_states": q["optimizer_states"]},
        "os+g+params": q,
    }


# ---------------------------------------------------------------------------------------------
# The formula
# ---------------------------------------------------------------------------------------------
def test_states_formula_symbolic():
    full, shard = P_ne + P_e, sp.ceiling(P_ne / (DP * CP)) + sp.ceiling(P_e / EDP)
    assert sp.simplify(sharded_count() - shard) == 0
    expected = {
        0: (B_w * full, B_g * full, B_o * full),
        1: (B_w * full, B_g * full, B_o * shard),
        2: (B_w * full, B_g * shard, B_o * shard),
        3: (B_w * shard, B_g * shard, B_o * shard),
    }
    for z, (w, g, o) in expected.items():
        f = states_formula(z)
        assert list(f) == ["parameters", "gradients", "optimizer_states"]
        assert sp.expand(f["parameters"] - w) == 0, z
        assert sp.expand(f["gradients"] - g) == 0, z
        assert sp.expand(f["optimizer_states"] - o) == 0, z


# ---------------------------------------------------------------------------------------------
# Paper Table 8
# ---------------------------------------------------------------------------------------------
TABLE8 = {
    0: (12_500_729_856, 25_001_459_712, 50_002_919_424, 87_505_108_992, "81.50"),
    1: (12_500_729_856, 25_001_459_712, 5_928_075_264, 43_430_264_832, "40.45"),
    2: (12_500_729_856, 2_964_037_632, 5_928_075_264, 21_392_842_752, "19.92"),
    3: (1_482_018_816, 2_964_037_632, 5_928_075_264, 10_374_131_712, "9.66"),
}


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_table8(v3, zero):
    est = estimate(v3, PAPER_TRAINING.with_(zero=zero))
    s = est.stages[1]
    w, g, o, tot, gib = TABLE8[zero]
    assert states(s) == {"parameters": w, "gradients": g, "optimizer_states": o}
    assert sum(states(s).values()) == tot
    assert fmt_bytes(tot, "GiB") == f"{gib} GiB"
    # stages 1-14 are identical, and they are the peak
    assert {sum(states(x).values()) for x in est.stages[1:15]} == {tot}


def test_table8_printed_terms_round_from_exact(v3):
    """The paper's per-term GB (GiB) values are the exact bytes rounded; its totals are sums of
    rounded terms (81.54, 40.46), memlib's are the exact totals rounded (81.50, 40.45)."""
    for zero, row in PAPER["table8"].items():
        w, g, o, _, _ = TABLE8[zero]
        for key, exact in (("parameters", w), ("gradients", g), ("optimizer_states", o)):
            printed = Decimal(row[key])
            digits = -printed.as_tuple().exponent
            assert Decimal(fmt_bytes(exact, "GiB", digits, with_unit=False)) == printed, (row, key)


def test_sharded_count_741009408(v3):
    part = Partition(v3, PAPER_TRAINING)
    st = part.stages[1]
    params = part.params(st)
    experts = part.edp_keys(st)
    ne = params.select(lambda k: k not in experts).evaluate_total(part.values)
    e = params.select(lambda k: k in experts).evaluate_total(part.values)
    assert (ne, e) == (429_719_552, 5_820_645_376)    # non-MoE over DP = 32, MoE over EDP = 8
    n = sharded_count().xreplace({**part.values, P_ne: ne, P_e: e})
    assert n == 741_009_408 == PAPER["zero_sharded_params"]
    # optimizer states at ZeRO 1 are 8 bytes of each sharded parameter: master 4, moments 2 + 2
    opt = optimizer_states(Partition(v3, PAPER_TRAINING.with_(zero=1)), st).evaluate()
    assert opt == {"master_weights": 4 * n, "exp_avg": 2 * n, "exp_avg_sq": 2 * n}


# ---------------------------------------------------------------------------------------------
# Published references
# ---------------------------------------------------------------------------------------------
def test_zero_paper_example():
    """ZeRO (arXiv 1910.02054) Fig. 1: Psi = 7.5B, N_d = 64, K = 12, fp16 mixed precision."""
    rec = recipe("fp16-mixed")
    assert rec.optimizer_bytes == ZERO_PAPER["k"]
    subs = {P_ne: ZERO_PAPER["psi"], P_e: 0, DP: ZERO_PAPER["n_d"], CP: 1, EDP: 1}
    for zero, printed in ZERO_PAPER["gb"].items():
        n = states_formula(zero, rec).evaluate_total(subs)
        assert Decimal(fmt_bytes(n, "GB", 1, with_unit=False)) == Decimal(printed), zero
    # exactly: 16 Psi; 4 Psi + 12 Psi/64; 2 Psi + 14 Psi/64; 16 Psi/64
    psi = ZERO_PAPER["psi"]
    assert [states_formula(z, rec).evaluate_total(subs) for z in range(4)] == [
        16 * psi, 4 * psi + 12 * psi // 64, 2 * psi + 14 * psi // 64, 16 * psi // 64]


@pytest.mark.parametrize("name", sorted(MEGATRON_BYTES_PER_PARAM))
def test_megatron_bytes_per_param_symbolic(name):
    """Megatron's distributed-optimizer table: b bytes/param, or fixed + n/d with it (ZeRO 1)."""
    whole, (fixed, num) = MEGATRON_BYTES_PER_PARAM[name]
    rec = recipe(name)
    d = DP
    k = sp.Symbol("k", integer=True, positive=True)   # P_ne = k d: divisible, ceiling vanishes
    subs = {P_ne: k * d, P_e: 0, CP: 1}
    z0 = states_formula(0, rec).total.xreplace(subs)
    z1 = states_formula(1, rec).total.xreplace(subs)
    assert sp.simplify(z0 / (k * d) - whole) == 0
    assert sp.simplify(z1 / (k * d) - (fixed + sp.Integer(num) / d)) == 0
    # and numerically, including a P that d does not divide (the shard rounds up)
    for dd in (1, 2, 3, 8, 64, 1000):
        p = 7_000_000 * dd
        v = {P_ne: p, P_e: 0, DP: dd, CP: 1, EDP: 1}
        assert states_formula(0, rec).evaluate_total(v) == whole * p
        assert states_formula(1, rec).evaluate_total(v) == fixed * p + num * p // dd
    v = {P_ne: 10, P_e: 0, DP: 3, CP: 1, EDP: 1}
    assert states_formula(1, rec).evaluate_total(v) == fixed * 10 + num * 4   # ceil(10/3) = 4


# ---------------------------------------------------------------------------------------------
# The tiny model by hand (one stage, TP 1, EP 2, DP 4: EDP 2)
#   per device: embedding 80 + dense layer 710 + 2 MoE layers (310 + 16 + 32 + 96 + 384/2) = 1292
#               + final norm 8 + head 80 = 2170
#   paper profile: P_e = router + shared + routed = 2 * (32 + 96 + 192) = 640, P_ne = 1530
#   sharded: ceil(1530 / 4) = 383 (382.5 rounds up) + 640 / 2 = 320 -> 703
# ---------------------------------------------------------------------------------------------
TINY_PAPER = {
    0: {"parameters": 2 * 2170, "gradients": 4 * 2170, "optimizer_states": 8 * 2170},
    1: {"parameters": 2 * 2170, "gradients": 4 * 2170, "optimizer_states": 8 * 703},
    2: {"parameters": 2 * 2170, "gradients": 4 * 703, "optimizer_states": 8 * 703},
    3: {"parameters": 2 * 703, "gradients": 4 * 703, "optimizer_states": 8 * 703},
}


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_tiny_zero_stages_by_hand(zero):
    est = estimate(T.tiny(), TrainingConfig(dp=4, ep=2, zero=zero))
    (s,) = est.stages
    assert s.parameters == 2170
    assert states(s) == TINY_PAPER[zero]
    # CP joins DP for non-expert states: DP 2 x CP 2 shards like DP 4
    est_cp = estimate(T.tiny(), TrainingConfig(dp=2, cp=2, ep=2, zero=zero))
    assert states(est_cp.stages[0]) == TINY_PAPER[zero]


def test_tiny_megatron_profile_shards_only_routed_experts_over_edp():
    # megatron: P_e = routed only = 2 * 192 = 384; P_ne = 2170 - 384 = 1786
    # sharded: ceil(1786 / 4) = 447 + 384 / 2 = 192 -> 639
    est = estimate(T.tiny(), TrainingConfig(dp=4, ep=2, zero=3, profile="megatron"))
    assert states(est.stages[0]) == {"parameters": 2 * 639, "gradients": 4 * 639, "optimizer_states": 8 * 639}
    est = estimate(T.tiny(), TrainingConfig(dp=4, ep=2, zero=1, precision="megatron", profile="megatron"))
    assert states(est.stages[0]) == {"parameters": 2 * 2170, "gradients": 4 * 2170, "optimizer_states": 12 * 639}
    assert est.stages[0].optimizer == {"master_weights": 4 * 639, "exp_avg": 4 * 639, "exp_avg_sq": 4 * 639}


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------
def _totals(model, train) -> list[int]:
    return [sum(states(s).values()) for s in estimate(model, train).stages]


SETUPS = [
    ("deepseek-v3", PAPER_TRAINING),
    ("deepseek-v3", PAPER_TRAINING.with_(profile="megatron", precision="megatron")),
    ("deepseek-v3", TrainingConfig(dp=4, tp=4, pp=4, ep=4, etp=2, cp=2, precision="fp16-mixed")),
    ("tiny", TrainingConfig(dp=3, tp=2, pp=2, ep=2)),
    ("tiny", TrainingConfig(dp=4, tp=1, pp=3, ep=2, etp=2, cp=3, profile="megatron", precision="fp32", seq_len=4095)),
]


def _m(name):
    return T.tiny() if name == "tiny" else load_model(name)


@pytest.mark.parametrize("name,train", SETUPS)
def test_bytes_never_rise_with_zero_stage(name, train):
    prev = None
    for zero in range(4):
        tot = _totals(_m(name), train.with_(zero=zero))
        if prev is not None:
            assert all(a <= b for a, b in zip(tot, prev)), zero
        prev = tot


@pytest.mark.parametrize("name,train", SETUPS)
def test_states_parts_add_to_total(name, train):
    for zero in range(4):
        est = estimate(_m(name), train.with_(zero=zero))
        for s in est.stages:
            assert s.total == sum(s.bytes.values())  # every named term, activations and overhead too
            assert sum(s.optimizer.values()) == s.bytes["optimizer_states"]
            assert sum(s.components.values()) == s.parameters
        d = est.to_dict()
        for st in d["stages"]:
            b = st["bytes"]
            assert b["total"] == sum(x for k, x in b.items() if k != "total")
        assert d["peak"]["bytes"] == max(st["bytes"]["total"] for st in d["stages"])


@pytest.mark.parametrize("profile", ["paper", "megatron"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_bytes_never_rise_with_tp(v3, profile, zero):
    prev = None
    for tp in (1, 2, 4, 8, 16):
        tot = _totals(v3, PAPER_TRAINING.with_(tp=tp, dp=8, zero=zero, profile=profile))
        if prev is not None:
            assert all(a <= b for a, b in zip(tot, prev)), tp
        prev = tot


@pytest.mark.parametrize("profile,zeros", [("paper", (0, 1, 2)), ("megatron", (0, 1, 2, 3))])
def test_bytes_never_rise_with_ep(v3, profile, zeros):
    for zero in zeros:
        prev = None
        for ep in (1, 2, 4, 8, 16, 32, 64):
            tot = _totals(v3, PAPER_TRAINING.with_(ep=ep, zero=zero, profile=profile))
            if prev is not None:
                assert all(a <= b for a, b in zip(tot, prev)), (zero, ep)
            prev = tot


def test_paper_profile_zero3_rises_with_ep(v3):
    """Known exception (reported): the paper's §4 shards the router and the shared expert over
    EDP = DP TP CP / (EP ETP), so at ZeRO 3 their shard grows with EP while every other term
    stays put.  EP 8 -> 16 (DP 32, TP 2: DP TP = 64) adds (router + shared) x (16 - 8) / 64
    parameters of 14 bytes each on a stage-1 device."""
    e8 = estimate(v3, PAPER_TRAINING.with_(zero=3))
    e16 = estimate(v3, PAPER_TRAINING.with_(zero=3, ep=16))
    c = e8.stages[1].components
    router_shared = c["router"] + c["shared_experts"]
    assert router_shared == 4 * (1_835_008 + 44_040_192)
    rise = sum(states(e16.stages[1]).values()) - sum(states(e8.stages[1]).values())
    assert rise == 14 * router_shared * (16 - 8) // 64 == 321_126_400


# ---------------------------------------------------------------------------------------------
# lambdify agrees with the exact evaluation
# ---------------------------------------------------------------------------------------------
def test_lambdify_agrees_with_evaluate_states():
    rng = random.Random(2502_07846)
    args = (P_ne, P_e, DP, CP, EDP, B_w, B_g, B_o)
    for zero in range(4):
        f = states_formula(zero)
        fn = f.lambdify(args)
        for _ in range(50):
            xs = (rng.randint(0, 10**9), rng.randint(0, 10**9), rng.randint(1, 64), rng.randint(1, 4),
                  rng.randint(1, 64), rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 16))
            exact = f.evaluate(dict(zip(args, xs)))
            approx = fn(*xs)
            assert set(approx) == set(exact)
            for k in exact:
                assert approx[k] == pytest.approx(exact[k], rel=1e-12, abs=0), (zero, k, xs)


def test_lambdify_agrees_with_evaluate_params(v3):
    b = model_params(v3)
    syms = sorted(b.total.free_symbols, key=str)
    fn = b.lambdify(syms)
    rng = random.Random(7)
    for _ in range(20):
        vals = {s: rng.randint(1, 300) for s in syms}
        vals[sym("k_dense")] = rng.randint(0, 5)
        vals[sym("l")] = vals[sym("k_dense")] + rng.randint(1, 60)
        exact = b.evaluate(vals)
        approx = fn(*(vals[s] for s in syms))
        for k in exact:
            assert approx[k] == pytest.approx(exact[k], rel=1e-12), k
    # at the DeepSeek-V3 values it gives the total
    approx = fn(*(values(v3)[s] for s in syms))
    assert sum(approx.values()) == pytest.approx(671_026_404_352, rel=1e-12)


def test_model_states_integer_terms(v3):
    part = Partition(v3, PAPER_TRAINING)
    b = model_states(part, part.stages[1])
    assert isinstance(b, Breakdown)
    vals = b.evaluate()
    assert all(type(x) is int for x in vals.values())
    assert b.evaluate_total() == 87_505_108_992
