"""memlib.scenarios.measured: published measurements of Megatron-LM runs (SimuMax's B200 Llama-3 runs), each
prediction pinned to the byte with its error stated; the published rows not used, with their reasons.

Megatron-LM's own functional tests, the validation set, are tests/data/test_functional_tests.py.
"""
from __future__ import annotations

from fractions import Fraction

import pytest

from memlib.scenarios import measured as sm
from memlib.core.units import fmt_bytes


# ------------------------------------------------------------------------------------------------
# SimuMax's measured B200 runs of Llama-3 (published), and the published rows not used
# ------------------------------------------------------------------------------------------------
#: measured run -> (memlib's peak_allocated per stage, the measured maximum per stage) in bytes; the error
#: per stage is stated beside it (percent, rounded); the published comparison is the maximum of each
PINNED_SIMUMAX = {
    'llama3_70b_l12_tp1_pp2_dp4_mbc4_cef': ((71523665920, 67726616576), (71459614208, 67611634688)),  # +0.1 %, +0.2 %
    'llama3_70b_tp2_pp1_dp4_l12_mbc4_cef': ((65204656128,), (65154739712,)),  # +0.1 %
    'llama3_70b_l12_tp4_pp1_dp2_mbc4_cef': ((42002278400,), (41953287680,)),  # +0.1 %
    'llama3_70b_l12_tp8_pp1_dp1_mbc4_cef': ((30422458368,), (30372386304,)),  # +0.2 %
    'llama3_405b_l4_tp1_pp2_dp4_mbc4_cef': ((93064005632, 93687957504), (92997033472, 93505086464)),  # +0.1 %, +0.2 %
    'llama3_405b_l4_tp2_pp1_dp4_mbc4_cef': ((87658215424,), (87608367616,)),  # +0.1 %
    'llama3_405b_l4_tp4_pp1_dp2_mbc4_cef': ((56837826560,), (56788897280,)),  # +0.1 %
    'llama3_405b_l4_tp8_pp1_dp1_mbc4_cef': ((41468665856,), (41418589696,)),  # +0.1 %
    'llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef': ((73524316160,), (73474310656,)),  # +0.1 %
    'llama3_70b_l12_tp1_cp8_pp1_dp1_seq32768_mbc4_cef': ((112262543360,), (112215577088,)),  # +0.0 %
    'llama3_405b_l4_tp2_cp4_pp1_dp1_seq32768_mbc4_cef': ((93492619264,), (93442593280,)),  # +0.1 %
    'llama3_405b_l4_tp1_cp8_pp1_dp1_seq32768_mbc4_cef': ((149531387904,), (149482394112,)),  # +0.0 %
    'llama3_70b_l12_tp2_cp4_pp1_dp1_seq131072_mbc4_cef': ((121026357248,), (120976285184,)),  # +0.0 %
    'llama3_70b_l12_tp1_cp8_pp1_dp1_seq131072_mbc4_cef': ((158949668864,), (158900576768,)),  # +0.0 %
    'llama3_405b_l4_tp2_cp4_pp1_dp1_seq131072_mbc4_cef': ((126888429568,), (126838386176,)),  # +0.0 %
}


#: memlib's largest stage peak were the cross-entropy not fused (the assumption read from SimuMax's "_cef"
#: naming, not from its launch script): the error it would make instead, stated beside it
PINNED_SIMUMAX_UNFUSED_CE = {
    'llama3_70b_l12_tp1_pp2_dp4_mbc4_cef': 71523665920,  # +0.1 %
    'llama3_70b_tp2_pp1_dp4_l12_mbc4_cef': 66156800000,  # +1.5 %
    'llama3_70b_l12_tp4_pp1_dp2_mbc4_cef': 42444814336,  # +1.2 %
    'llama3_70b_l12_tp8_pp1_dp1_mbc4_cef': 30611238912,  # +0.8 %
    'llama3_405b_l4_tp1_pp2_dp4_mbc4_cef': 95657220096,  # +2.3 %
    'llama3_405b_l4_tp2_pp1_dp4_mbc4_cef': 88509696000,  # +1.0 %
    'llama3_405b_l4_tp4_pp1_dp2_mbc4_cef': 57196476416,  # +0.7 %
    'llama3_405b_l4_tp8_pp1_dp1_mbc4_cef': 41581948928,  # +0.4 %
    'llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef': 75428603904,  # +2.7 %
    'llama3_70b_l12_tp1_cp8_pp1_dp1_seq32768_mbc4_cef': 114298914816,  # +1.9 %
    'llama3_405b_l4_tp2_cp4_pp1_dp1_seq32768_mbc4_cef': 95195580416,  # +1.9 %
    'llama3_405b_l4_tp1_cp8_pp1_dp1_seq32768_mbc4_cef': 151500650496,  # +1.4 %
    'llama3_70b_l12_tp2_cp4_pp1_dp1_seq131072_mbc4_cef': 128643508224,  # +6.3 %
    'llama3_70b_l12_tp1_cp8_pp1_dp1_seq131072_mbc4_cef': 167095154688,  # +5.2 %
    'llama3_405b_l4_tp2_cp4_pp1_dp1_seq131072_mbc4_cef': 133700274176,  # +5.4 %
}


@pytest.fixture(scope="module")
def published():
    return {c.key: c for c in sm.published_cases()}


def test_every_simumax_run_is_pinned(published):
    assert list(published) == list(PINNED_SIMUMAX)


@pytest.mark.parametrize("key", list(PINNED_SIMUMAX))
def test_simumax_prediction_pinned(published, key):
    c = published[key]
    assert (tuple(p.peak_allocated for p in c.peaks), c.measured) == PINNED_SIMUMAX[key]
    assert c.error == Fraction(max(PINNED_SIMUMAX[key][0]) - max(PINNED_SIMUMAX[key][1]), max(PINNED_SIMUMAX[key][1]))
    assert len(c.peaks) == c.train.pp and c.train.dp * c.train.tp * c.train.pp * c.train.cp == 8
    # the unfused loss holds more, never less
    assert c.unfused_ce == PINNED_SIMUMAX_UNFUSED_CE[key] and c.unfused_ce >= c.predicted


def test_simumax_values_are_the_published_ones(published):
    """The maximum over the ranks is the table's GiB (two decimals); the 31 Llama rows are 15 measured runs (the
    8 and 32 micro-batch rows repeat the 4 micro-batch run's memory); TP-only ranks agree to a MiB."""
    from memlib.data.reference import SIMUMAX_B200_RUNS
    assert sum(len(r["rows"]) for r in SIMUMAX_B200_RUNS.values()) == 31 and len(SIMUMAX_B200_RUNS) == 15
    for key, run in SIMUMAX_B200_RUNS.items():
        assert fmt_bytes(max(run["max_allocated"].values()), "GiB", 2, with_unit=False) == run["printed_alloc_gib"], key
    c = published["llama3_70b_l12_tp1_pp2_dp4_mbc4_cef"]
    assert c.measured_max == 71459614208 and c.rows[0] == c.key and len(c.rows) == 3      # 66.55 GiB


def test_simumax_model_is_the_launchers_llama():
    """80 layers at TP 1: Llama-3-70B's 70,553,706,496 parameters plus the padding of 128,257 tokens to 128,384
    (two untied [128, 8192] slices); 4-layer 405B keeps 16 key-value groups as the launcher passes them."""
    from memlib.model.params import model_params, values
    m = sm.simumax_model("llama3-70b", 80, 1)
    assert m.vocab_size == 128384 and model_params(m).evaluate_total(values(m)) == 70_553_706_496 + 2 * 128 * 8192
    assert sm.simumax_model("llama3-70b", 12, 8).vocab_size == 129024            # a multiple of 128 x 8
    assert sm.simumax_model("llama3-405b", 4, 2).num_key_value_heads == 16


def test_simumax_runs_within_the_target_on_the_published_metric(published):
    """The stated result (not a tuning): every run's maximum, and every stage of the PP 2 runs, within 0.2 %."""
    assert all(c.within_target for c in published.values())
    assert all(abs(e) < Fraction(2, 1000) for c in published.values() for e in c.stage_errors)


def test_published_rows_not_used_have_reasons():
    rows = sm.not_used()
    assert len(rows) == len(sm.PUBLISHED_NOT_USED) >= 3
    assert all(src and what and val and len(why) > 20 for src, what, val, why in rows)
    assert any("PR #482" in r[0] for r in rows) and any("mbridge" in r[0] for r in rows)
