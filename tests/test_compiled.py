"""The compiled, vectorised evaluator (memlib.compiled) equals estimate() to the byte."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memlib.compiled import ExactFunction, Family, compiled_totals
from memlib.config import ConfigError, TrainingConfig, model_from_dict
from memlib.memory import estimate
from memlib.overhead import OVERHEAD_PRESETS, Overheads
from memlib.symbols import sym

from strategies import cases

SETTINGS = settings(max_examples=60, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(cases(), st.sampled_from(sorted(OVERHEAD_PRESETS)), st.integers(0, 3), st.integers(1, 4))
def test_vectorised_equals_estimate_to_the_byte(case, preset, other_zero, other_b):
    """Every kind of configuration (profiles, precisions, policies, all four schedules, MTP, ZeRO 0-3):
    one pipeline evaluates the drawn configuration and variants of it in one call, each row equal to
    estimate()'s allocated and total bytes of every stage."""
    d, kw = case
    m = model_from_dict(d, name="random")
    ovh = OVERHEAD_PRESETS[preset]
    base = TrainingConfig(**kw)
    trains = [base, base.with_(zero=other_zero), base.with_(micro_batch=other_b, zero=other_zero)]
    fam = Family(m, base, ovh)
    pipe = fam.pipeline(base.pp, base.schedule, base.vpp, base.layout)
    tot = pipe.evaluate_configs(trains)
    peak, stage = tot.peak()
    for i, t in enumerate(trains):
        est = estimate(m, t, ovh)
        assert [s.allocated for s in est.stages] == [int(x) for x in tot.allocated[:, i]]
        assert [s.total for s in est.stages] == [int(x) for x in tot.total[:, i]]
        assert (est.peak.total, est.peak.stage.index) == (int(peak[i]), int(stage[i]))


@pytest.mark.parametrize("kw", [
    dict(dp=128, pp=16, ep=64, zero=1, profile="megatron", precision="deepseek-v3", recompute="deepseek",
         schedule="dualpipe", num_microbatches=120),
    dict(dp=32, tp=2, pp=16, ep=8),
    dict(dp=32, tp=2, pp=8, ep=8, zero=2, recompute="selective", profile="megatron", precision="megatron",
         schedule="interleaved", vpp=2, layout=(4,) * 15 + (1,)),
    dict(dp=16, tp=2, pp=4, ep=8, etp=2, cp=2, zero=3, recompute="full-block:2", precision="fp32", schedule="gpipe",
         num_microbatches=7, micro_batch=3),
])
def test_deepseek_v3_configurations(kw):
    t = TrainingConfig(**kw)
    est = estimate("deepseek-v3", t)
    tot = compiled_totals("deepseek-v3", t)
    assert [s.total for s in est.stages] == [int(x) for x in tot.total[:, 0]]


def test_exact_function_rounds_like_int():
    tp, b = sym("TP"), sym("b")
    f = ExactFunction(sp.ceiling(7 * b / tp) + sp.Rational(5, 3) * b / tp + sp.Max(b, 3 * tp - 4)
                      + sp.Piecewise((b, sp.StrictGreaterThan(tp, 1)), (0, True)))
    rows = [(b_, t_) for b_ in range(1, 7) for t_ in (1, 2, 3, 4, 8)]
    got = f({"micro_batch": np.array([r[0] for r in rows]), "tp": np.array([r[1] for r in rows])})
    want = [int(f.expr.xreplace({b: b_, tp: t_})) for b_, t_ in rows]
    assert list(map(int, got)) == want


def test_exact_function_leaves_int64_before_it_overflows():
    s = sym("s")
    f = ExactFunction(s ** 3 * 10**6 / 7)
    got = f({"seq_len": np.array([2**20, 3])})
    assert [int(x) for x in got] == [(2**60 * 10**6) // 7, (27 * 10**6) // 7]


def test_a_symbol_that_is_no_knob_is_named():
    with pytest.raises(ConfigError, match="not knobs"):
        ExactFunction(sym("h") * sym("b"))


def test_fragmentation_rounds_up_like_overheads():
    ovh = Overheads(0, 0, Fraction(1, 3))
    t = TrainingConfig(dp=8, tp=1, pp=2, ep=8, zero=1)
    est = estimate("deepseek-v2-lite", t, ovh)
    tot = compiled_totals("deepseek-v2-lite", t, ovh)
    assert [s.total for s in est.stages] == [int(x) for x in tot.total[:, 0]]
