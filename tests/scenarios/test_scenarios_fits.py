"""memlib.scenarios.fits: the GPUs, the region, the Pareto front, the fastest within the tie band, what more memory
buys and the DeepSeek-V3 recipe's rank, checked against brute force over the same search, plan and estimate."""
from __future__ import annotations

import numpy as np
import pytest

from memlib.config import ConfigError
from memlib.device.estimate import estimate
from memlib.device.overhead import DEVICE_MEMORY
from memlib.search.cost import GPUS, TIE_BAND, CostModel
from memlib.search.plan import PRACTICAL, SearchSpace, plan
from memlib.scenarios import fits as sf
from memlib.scenarios.deepseek import deepseek_recipe

SMALL = ("deepseek-v2-lite", 64)


@pytest.fixture(scope="module")
def small():
    return sf.grid(*SMALL)


def test_cards_are_the_gpus_with_a_capacity_and_a_price():
    cs = sf.cards()
    assert {c.name for c in cs} == set(GPUS) & set(DEVICE_MEMORY)
    assert [c.capacity for c in cs] == sorted(c.capacity for c in cs)
    assert all(c.capacity == DEVICE_MEMORY[c.name] and CostModel.of(c.name).gpu == GPUS[c.name] for c in cs)


def test_a_grid_priced_on_another_gpu_is_that_gpu_s_search(small):
    other = sf.grid(*SMALL, "B200")
    direct = plan(*SMALL, 10**15, SearchSpace(**sf.SPACE, rules=PRACTICAL), top=None, cost=CostModel.of("B200"))
    assert (other.peak == small.peak).all() and other.searched == direct.searched
    steps = sorted(c["cost"]["step_s"] for c in direct.configs)
    assert np.allclose(np.sort(other.cost["step_s"]), steps)


@pytest.mark.parametrize("fix", [None, {}, {"zero": 1}])
def test_region_is_the_smallest_peak_of_each_choice(small, fix):
    reg = sf.region(small, fix)
    want: dict = {}
    fixed = sf.REGION_FIX if fix is None else fix
    for i in range(small.searched):
        if any(small.column(k)[i] != v for k, v in fixed.items()):
            continue
        key = (int(small.column("tp")[i]), int(small.column("ep")[i]), int(small.column("pp")[i]))
        want[key] = min(want.get(key, int(small.peak[i])), int(small.peak[i]))
    assert reg.peak == want and want
    assert reg.pps == tuple(sorted({k[2] for k in want}))


def test_pareto_front_is_exactly_the_undominated_fitting_rows(small):
    cap = int(np.median(small.peak))
    front = sf.pareto(small, cap)
    fit = np.flatnonzero(small.fits(cap))
    peak, step = small.peak[fit], small.cost["step_s"][fit]
    undominated = []
    for j in range(len(fit)):
        dominated = np.any((peak <= peak[j]) & (step <= step[j]) & ((peak < peak[j]) | (step < step[j])))
        if not dominated:
            undominated.append((int(peak[j]), float(step[j])))
    got = [(int(small.peak[i]), float(small.cost["step_s"][i])) for i in front]
    assert len(front) > 1 and all(small.peak[i] <= cap for i in front)
    assert sorted(set(got)) == sorted(set(undominated))       # rows equal on both keep one representative
    assert [p for p, _ in got] == sorted(p for p, _ in got)


def test_the_fastest_per_card_is_plans_first_and_its_ties_are_the_band():
    model, gpus = SMALL
    (f,) = sf.fits(model, (gpus,), [sf.card("H100")])
    r = plan(model, gpus, f.card.capacity, SearchSpace(**sf.SPACE, rules=PRACTICAL), top=None, cost=CostModel.of("H100"))
    assert (f.searched, f.fitting) == (r.searched, r.fitting)
    c = r.configs[0]
    assert f.best_peak == c["peak"] and f.best_layout_rule == c["layout_rule"] and f.best_step_s == c["cost"]["step_s"]
    assert (f.best.pp, f.best.tp, f.best.ep, f.best.dp, f.best.cp, int(f.best.zero), f.best.micro_batch) == tuple(
        c["config"][k] for k in ("pp", "tp", "ep", "dp", "cp", "zero", "micro_batch"))
    assert f.tied == sum(x["tie"] for x in r.configs) == sum(
        x["cost"]["step_s"] <= (1 + TIE_BAND) * c["cost"]["step_s"] for x in r.configs)
    assert f.headroom == f.card.capacity - f.best_peak and f.smallest_peak <= f.best_peak


def test_nothing_fits_a_tiny_card():
    (f,) = sf.fits(SMALL[0], (SMALL[1],), [sf.Card("H100", 10**6)])
    assert f.fitting == 0 and f.best is None and f.headroom is None and f.tied == 0


def test_what_more_memory_buys(small):
    """The larger card fits every configuration the smaller one does and more; 'memory alone' is the larger
    capacity's fastest row priced on the smaller card's GPU, never slower than the smaller card's fastest."""
    m = sf.memory_buys(*SMALL, "H100", "H200")
    assert m.large.fitting >= m.small.fitting and m.more_fit == m.large.fitting - m.small.fitting
    order = small.ranking(sf.card("H200").capacity)
    assert m.same_gpu_step_s == float(small.cost["step_s"][order[0]]) <= m.small.best_step_s
    assert m.memory_gain == pytest.approx(1 - m.same_gpu_step_s / m.small.best_step_s)


def test_the_implied_step_by_hand():
    """180K H800 GPU-hours per trillion tokens, 15,360 sequences of 4,096 tokens a step on 2,048 GPUs."""
    assert sf.implied_step() == pytest.approx(180e3 * 3600 / 1e12 * 15360 * 4096 / 2048)


def test_the_deepseek_v3_recipe_is_located_and_ranked():
    train = deepseek_recipe("deepseek-v3")
    g = sf.recipe_grid("deepseek-v3")
    cap = DEVICE_MEMORY["H800"]
    r = sf.recipe_rank(g, train, cap)
    assert r.rank is not None and 1 <= r.rank <= r.fitting and g.cost_model.gpu.name == "H800"
    rows = sf.recipe_rows(g, train)
    assert r.index in set(rows.tolist()) and len(rows) >= 1
    t = g.train(r.index)
    assert (t.pp, t.tp, t.ep, t.dp, int(t.zero), t.micro_batch) == (train.pp, train.tp, train.ep, train.dp,
                                                                      int(train.zero), train.micro_batch)
    assert estimate("deepseek-v3", t).peak.total == r.peak <= cap
    fit = g.fits(cap)
    step, peak = g.cost["step_s"], g.peak
    better = fit & ((step < r.step_s) | ((step == r.step_s) & (peak < r.peak)))
    assert int(better.sum()) < r.rank <= int((fit & (step <= r.step_s)).sum())
    assert r.faster_and_smaller == int((fit & (step < r.step_s) & (peak < r.peak)).sum())
    assert r.tied == (r.step_s <= (1 + TIE_BAND) * float(step[r.best]))
    s = sf.recipe_step("deepseek-v3")
    assert s.recipe["step_s"] == r.step_s and s.over_report == pytest.approx(r.step_s / sf.implied_step())


def test_recipe_rows_need_the_searched_gpu_count(small):
    with pytest.raises(ConfigError, match="world_size"):
        sf.recipe_rows(small, deepseek_recipe("deepseek-v3"))


def test_only_the_paper_model_has_the_recipe():
    assert sf.has_recipe("deepseek-v3") and not sf.has_recipe("deepseek-v2-lite")
    assert sf.recipe_step("deepseek-v2-lite") is None
