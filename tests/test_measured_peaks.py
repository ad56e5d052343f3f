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
from memlib.megatron_args import parse_megatron_args
from memlib.reference import MEGATRON_RUNS
from memlib.scenarios import measured as sm

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
