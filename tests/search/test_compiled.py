"""The compiled, vectorised evaluator (memlib.search.compiled) equals estimate() to the byte."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memlib.search.compiled import ExactFunction, Family, compiled_totals
from memlib.config import ConfigError, TrainingConfig, model_from_dict
from memlib.device.estimate import estimate
from memlib.device.overhead import OVERHEAD_PRESETS, Overheads
from memlib.core.symbols import sym

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
    # the search's path: the running peak, stage by stage, without the stages x rows arrays
    knobs = {k: [getattr(t, k) for t in trains] for k in ("dp", "tp", "ep", "etp", "cp", "micro_batch", "seq_len")}
    run_peak, run_stage = pipe.peak(zero=[int(t.zero) for t in trains],
                                    num_microbatches=[t.num_microbatches for t in trains], **knobs)
    assert list(map(int, run_peak)) == list(map(int, peak)) and list(map(int, run_stage)) == list(map(int, stage))
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


def test_a_pipeline_past_int64_stays_exact():
    """DeepSeek-V3 with s = 2^20, b = 64 and M = 4096 under GPipe holds about 1,300 EiB a stage: past int64, so
    the checked path with Python integers; still estimate()'s bytes to the byte, on both of the search's paths."""
    t = TrainingConfig(dp=8, tp=2, pp=4, ep=8, seq_len=2**20, micro_batch=64, schedule="gpipe",
                       num_microbatches=4096)
    est = estimate("deepseek-v3", t)
    tot = compiled_totals("deepseek-v3", t)
    assert max(s.total for s in est.stages) > 2**63
    assert [s.total for s in est.stages] == [int(x) for x in tot.total[:, 0]]
    pipe = Family("deepseek-v3", t).pipeline(4, "gpipe")
    peak, stage = pipe.peak(zero=[t.zero], num_microbatches=[4096], dp=[8], tp=[2], ep=[8], etp=[1], cp=[1],
                            micro_batch=[64], seq_len=[2**20])
    assert (int(peak[0]), int(stage[0])) == (est.peak.total, est.peak.stage.index)


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


_SYMS = [sym("TP"), sym("EP"), sym("b"), sym("s")]
_NAMES = {sym("TP"): "tp", sym("EP"): "ep", sym("b"): "micro_batch", sym("s"): "seq_len"}


@st.composite
def _expressions(draw, depth=3):
    """Expressions of the kinds memlib compiles (sums, products, integer powers, ceilings, maxima,
    piecewise cases) with constants up to 2^40: some of them pass 2^62 on the way, most do not."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.booleans()):
            return draw(st.sampled_from(_SYMS))
        return sp.Rational(draw(st.integers(-2**40, 2**40)), draw(st.sampled_from([1, 3, 7, 2**20 + 1])))
    kind = draw(st.sampled_from(["add", "mul", "inv", "ceil", "max", "case"]))
    a, c = draw(_expressions(depth - 1)), draw(_expressions(depth - 1))
    if kind == "add":
        return a + c
    if kind == "mul":
        return a * c
    if kind == "inv":
        return a / draw(st.sampled_from(_SYMS)) ** draw(st.integers(1, 2))
    if kind == "ceil":
        return sp.ceiling(a)
    if kind == "max":
        return sp.Max(a, c)
    return sp.Piecewise((a, sp.StrictGreaterThan(draw(st.sampled_from(_SYMS)), 2)), (c, True))


@settings(max_examples=300, deadline=None, derandomize=False, suppress_health_check=[HealthCheck.too_slow])
@given(_expressions(), st.lists(st.tuples(st.integers(1, 64), st.integers(1, 256), st.integers(1, 16),
                                          st.integers(1, 2**22)), min_size=1, max_size=6))
@example(sp.Integer(9223372037880199860) / sym("TP"), [(1, 1, 1, 1)])          # a constant past int64:
@example(sp.Integer(9223372037880199860) / (1048577 * sym("TP")), [(1, 1, 1, 1)])  # no uint64, no float
def test_fast_int64_path_only_where_its_bound_holds(expr, rows):
    """Whichever path :meth:`ExactFunction.operations` picks (plain int64 where the bound run on the rows'
    largest knobs keeps every intermediate under 2^62, else the checked one), each row is int() of the
    SymPy value: a bound that let an int64 wrap would show here as a wrong number."""
    f = ExactFunction(expr)
    env = {_NAMES[x]: np.array([r[i] for r in rows], dtype=np.int64) for i, x in enumerate(_SYMS)}
    got = f(env, len(rows))
    want = [int(expr.xreplace(dict(zip(_SYMS, r)))) for r in rows]
    assert [int(x) for x in got] == want


def test_the_bound_sends_a_large_product_to_the_checked_path():
    from memlib.search.compiled import _CHECKED, _FAST
    s = sym("s")
    f = ExactFunction(s ** 3 * 10**6 / 7)
    assert f.operations({"seq_len": np.array([2**20])}) is _CHECKED
    assert f.operations({"seq_len": np.array([2**10])}) is _FAST


def test_a_chunk_sums_its_parts_exactly_past_int64():
    """A chunk's parts summed in int64 where their bounds allow it, else exactly: both give int(sum)."""
    from memlib.search.compiled import ChunkProgram
    s, tp = sym("s"), sym("TP")
    parts = [s ** 3 * 10**6 / (7 * tp), sp.ceiling(s * 5 / (3 * tp)) + s / 11]
    prog = ChunkProgram(kept=((3, ExactFunction(parts[0])), (2, ExactFunction(parts[1]))),
                        dropped=(ExactFunction(parts[1]), ExactFunction(parts[0] / 5)))
    for seq in ([2**20, 4096], [4096, 7]):
        env = {"seq_len": np.array(seq), "tp": np.array([3, 1])}
        per, work = prog.evaluate(env, 2, lambda f: f.rational(env))
        for i, (x, t) in enumerate(zip(seq, (3, 1))):
            v = {s: x, tp: t}
            assert int(per[i]) == int(3 * parts[0].xreplace(v) + 2 * parts[1].xreplace(v))
            assert int(work[i]) == int(max(parts[1].xreplace(v), parts[0].xreplace(v) / 5))
