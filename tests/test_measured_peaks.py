"""memlib.scenarios.measured: every Megatron-LM functional test memlib expresses, its prediction pinned.

* Each case's ``peak_allocated`` on the logging rank, to the byte, from the test's own model_config.yaml
  (nothing retyped), and its error against the logged steady peak, stated per case: the pins change
  only when the model changes, and a change must be looked at against the measured values.
* The parts of the prediction add up, the persistent terms stay within a stated distance of the logged
  post-step allocation, the world sizes are the recipes' or derived.
* The tests memlib cannot express are refused or listed with their reason, never given a number.
"""
from __future__ import annotations

from fractions import Fraction

import pytest

from memlib.config import ConfigError
from memlib.megatron.flags import parse_megatron_args
from memlib.data.reference import MEGATRON_RUNS
from memlib.scenarios import measured as sm
from memlib.core.units import fmt_bytes

#: label -> (memlib's peak_allocated, the logged steady peak) in bytes; the error per case is stated
#: beside it (percent, rounded): where it is over the 1 % target the chapter's "Where the target is
#: missed" table names the term
PINNED = {
    'memory_speed': (55020458048, 57920471040),                         # -5.0 %
    'mtp fp8': (52918300736, 55926337536),                              # -5.4 %
    'selective recompute': (48470917696, 49175810048),                  # -1.4 %
    'offloading': (7482819892, 8217088512),                             # -8.9 %
    'DeepSeek-V3 proxy, H100': (48206678572, 45275439104),              # +6.5 %
    'DeepSeek-V3 proxy, GB200': (110520217124, 99287138304),            # +11.3 %
    'memory_speed (2nd cluster)': (55020458048, 57920647168),           # -5.0 %
    'offloading, no MTP, no overlap': (6503040820, 7095137792),         # -8.3 %
    'DeepSeek-V3 proxy, H100 (_sm)': (48206678572, 50469617664),        # -4.5 %
    'DeepSeek-V3 proxy, GB200 (_sm)': (110520217124, 120337416192),     # -8.2 %
}


@pytest.fixture(scope="module")
def cases():
    return {c.case.label: c for c in sm.measured_cases()}


def test_every_case_is_pinned(cases):
    assert set(cases) == set(PINNED)
    assert [c.label for c in sm.CASES if c.issue] == ["memory_speed", "mtp fp8", "selective recompute", "offloading",
                                                      "DeepSeek-V3 proxy, H100", "DeepSeek-V3 proxy, GB200"]


@pytest.mark.parametrize("label", sorted(PINNED))
def test_prediction_pinned(cases, label):
    c = cases[label]
    assert (c.predicted, c.steady) == PINNED[label]
    assert c.error == Fraction(c.predicted - c.steady, c.steady)
    assert c.within_target == (abs(c.error) <= Fraction(1, 100))
    p = c.peak
    assert p.peak_allocated == sum(p.persistent.values()) + sum(p.activations.values()) + sum(p.transient.values())


def test_the_logged_values_are_the_files(cases):
    c = cases["memory_speed"]
    f = MEGATRON_RUNS[c.case.name]["files"][c.case.file]
    assert c.steady == f["max_allocated"][3] == 57920471040           # 53.94 GiB at iteration 3
    assert c.run_max == 60111630336 and c.run_max_at == 39            # 55.98 GiB, the published maximum
    assert c.device == "H100" and c.world_size == 8


def test_persistent_account_stays_below_the_logged_post_step(cases):
    """The post-step allocation holds everything persistent; memlib's account of it is below, by at most
    the stated residuals (MiB): what the account does not know (the allocator, logging scalars, the last
    micro-batch's data, the flex dispatcher's buffers)."""
    for label, c in cases.items():
        left = c.post_step_unexplained
        assert 0 <= left <= 320 * 2**20, (label, left)


def test_proxy_world_sizes_are_derived(cases):
    for label in ("DeepSeek-V3 proxy, H100", "DeepSeek-V3 proxy, GB200"):
        c = cases[label]
        assert "derived from the logged post-step allocation" in c.world_size_source
    assert (cases["DeepSeek-V3 proxy, H100"].world_size, cases["DeepSeek-V3 proxy, GB200"].world_size) == (64, 32)


def test_run_maximum_and_implied_imbalance(cases):
    c = cases["memory_speed"]
    assert c.imbalance is not None and c.imbalance > 1
    # the factor reproduces the run maximum (the peak is linear in it while its moment stays)
    est = sm._estimate(c.case, c.run.train.with_(routing_imbalance=c.imbalance))
    assert abs(est.peaks[-1].peak_allocated - c.run_max) <= 4 * 2**20
    # where memlib is already above the run maximum there is no factor
    assert cases["DeepSeek-V3 proxy, GB200"].imbalance is None


def test_cases_memlib_cannot_express():
    names = [n for n, _, _ in sm.not_expressible()]
    assert "gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4" in names and "gpt3_mcore_te_tp2_pp2_mla" in names
    assert set(names).isdisjoint(c.name for c in sm.CASES)
    assert set(names) | {c.name for c in sm.CASES} == set(MEGATRON_RUNS)
    run = MEGATRON_RUNS["gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4"]
    with open(run["config_copy"], encoding="utf-8") as fh:
        with pytest.raises(ConfigError, match="MLA attention only"):
            parse_megatron_args(fh.read(), world_size=8)


def test_summary(cases):
    s = sm.summary(list(cases.values()))
    assert s["n"] == len(PINNED) and s["within"] == sum(c.within_target for c in cases.values())
    assert s["max_abs"] == max(abs(c.error) for c in cases.values())


# ------------------------------------------------------------------------------------------------
# SimuMax's measured B200 runs of Llama-3 (published), and the published rows not used
# ------------------------------------------------------------------------------------------------
#: measured run -> (memlib's peak_allocated per stage, the measured maximum per stage) in bytes; the error
#: per stage is stated beside it (percent, rounded); the published comparison is the maximum of each
PINNED_SIMUMAX = {
    'llama3_70b_l12_tp1_pp2_dp4_mbc4_cef': ((71003834368, 68594051072), (71459614208, 67611634688)),  # -0.6 %, +1.5 %
    'llama3_70b_tp2_pp1_dp4_l12_mbc4_cef': ((65613862912,), (65154739712,)),  # +0.7 %
    'llama3_70b_l12_tp4_pp1_dp2_mbc4_cef': ((42148292608,), (41953287680,)),  # +0.5 %
    'llama3_70b_l12_tp8_pp1_dp1_mbc4_cef': ((30437400576,), (30372386304,)),  # +0.2 %
    'llama3_405b_l4_tp1_pp2_dp4_mbc4_cef': ((92141520896, 94421174272), (92997033472, 93505086464)),  # -0.9 %, +1.0 %
    'llama3_405b_l4_tp2_pp1_dp4_mbc4_cef': ((88000313344,), (87608367616,)),  # +0.4 %
    'llama3_405b_l4_tp4_pp1_dp2_mbc4_cef': ((56916731904,), (56788897280,)),  # +0.2 %
    'llama3_405b_l4_tp8_pp1_dp1_mbc4_cef': ((41416499200,), (41418589696,)),  # -0.0 %
    'llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef': ((73587492864,), (73474310656,)),  # +0.2 %
    'llama3_70b_l12_tp1_cp8_pp1_dp1_seq32768_mbc4_cef': ((112458889216,), (112215577088,)),  # +0.2 %
    'llama3_405b_l4_tp2_cp4_pp1_dp1_seq32768_mbc4_cef': ((93690013696,), (93442593280,)),  # +0.3 %
    'llama3_405b_l4_tp1_cp8_pp1_dp1_seq32768_mbc4_cef': ((149996169216,), (149482394112,)),  # +0.3 %
    'llama3_70b_l12_tp2_cp4_pp1_dp1_seq131072_mbc4_cef': ((121429272576,), (120976285184,)),  # +0.4 %
    'llama3_70b_l12_tp1_cp8_pp1_dp1_seq131072_mbc4_cef': ((159885260800,), (158900576768,)),  # +0.6 %
    'llama3_405b_l4_tp2_cp4_pp1_dp1_seq131072_mbc4_cef': ((127828215808,), (126838386176,)),  # +0.8 %
}


#: memlib's largest stage peak were the cross-entropy not fused (the assumption read from SimuMax's "_cef"
#: naming, not from its launch script): the error it would make instead, stated beside it
PINNED_SIMUMAX_UNFUSED_CE = {
    'llama3_70b_l12_tp1_pp2_dp4_mbc4_cef': 71003834368,                  # -0.6 % (the head's stage is not the peak)
    'llama3_70b_tp2_pp1_dp4_l12_mbc4_cef': 66140284928,                  # +1.5 %
    'llama3_70b_l12_tp4_pp1_dp2_mbc4_cef': 42411522048,                  # +1.1 %
    'llama3_70b_l12_tp8_pp1_dp1_mbc4_cef': 30569558016,                  # +0.6 %
    'llama3_405b_l4_tp1_pp2_dp4_mbc4_cef': 95472932864,                  # +2.1 %
    'llama3_405b_l4_tp2_pp1_dp4_mbc4_cef': 88526735360,                  # +1.0 %
    'llama3_405b_l4_tp4_pp1_dp2_mbc4_cef': 57179961344,                  # +0.7 %
    'llama3_405b_l4_tp8_pp1_dp1_mbc4_cef': 41548656640,                  # +0.3 %
    'llama3_70b_l12_tp2_cp4_pp1_dp1_seq32768_mbc4_cef': 74640336896,     # +1.6 %
    'llama3_70b_l12_tp1_cp8_pp1_dp1_seq32768_mbc4_cef': 113510647808,    # +1.2 %
    'llama3_405b_l4_tp2_cp4_pp1_dp1_seq32768_mbc4_cef': 94742857728,     # +1.4 %
    'llama3_405b_l4_tp1_cp8_pp1_dp1_seq32768_mbc4_cef': 151047927808,    # +1.0 %
    'llama3_70b_l12_tp2_cp4_pp1_dp1_seq131072_mbc4_cef': 125640648704,   # +3.9 %
    'llama3_70b_l12_tp1_cp8_pp1_dp1_seq131072_mbc4_cef': 164092295168,   # +3.3 %
    'llama3_405b_l4_tp2_cp4_pp1_dp1_seq131072_mbc4_cef': 132039591936,   # +4.1 %
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
    """The stated result (not a tuning): every run's maximum within 1 %; per stage, the last stage of the
    70B PP 2 run is over it (memlib holds more there than the run)."""
    assert all(c.within_target for c in published.values())
    c = published["llama3_70b_l12_tp1_pp2_dp4_mbc4_cef"]
    assert c.stage_errors[1] > sm.TARGET


def test_published_rows_not_used_have_reasons():
    rows = sm.not_used()
    assert len(rows) == len(sm.PUBLISHED_NOT_USED) >= 3
    assert all(src and what and val and len(why) > 20 for src, what, val, why in rows)
    assert any("PR #482" in r[0] for r in rows) and any("mbridge" in r[0] for r in rows)
