"""memlib.scenarios.fits: the cards, the region, the Pareto front, the DeepSeek-V3 recipe's rank and the best
configuration per card, checked against brute force over the same search and against memlib.estimate."""
from __future__ import annotations

import numpy as np
import pytest

from memlib.config import ConfigError
from memlib.device.estimate import estimate
from memlib.device.overhead import DEVICE_MEMORY
from memlib.search.plan import plan
from memlib.scenarios import fits as sf
from memlib.scenarios.deepseek import deepseek_recipe

SMALL = ("deepseek-v2-lite", 64)


@pytest.fixture(scope="module")
def small():
    return sf.grid(*SMALL)


def test_cards_are_device_memory_grouped_by_capacity():
    cs = sf.cards()
    assert sorted(n for c in cs for n in c.names) == sorted(DEVICE_MEMORY)
    assert [c.capacity for c in cs] == sorted({c.capacity for c in cs})
    for c in cs:
        assert all(DEVICE_MEMORY[n] == c.capacity for n in c.names)


@pytest.mark.parametrize("fix", [None, {}, {"zero": 3}])
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


def test_the_best_per_card_is_plans_first():
    model, gpus = SMALL
    card = sf.Card(("test card",), 20 * 10**9)
    (f,) = sf.fits(model, (gpus,), [card])
    r = plan(model, gpus, card.capacity, top=1, **sf.SPACE)
    assert (f.searched, f.fitting) == (r.searched, r.fitting)
    c = r.configs[0]
    assert f.best_peak == c["peak"] and f.best_layout_rule == c["layout_rule"]
    assert (f.best.pp, f.best.tp, f.best.ep, f.best.dp, f.best.cp, int(f.best.zero), f.best.micro_batch) == tuple(
        c["config"][k] for k in ("pp", "tp", "ep", "dp", "cp", "zero", "micro_batch"))
    assert f.headroom == card.capacity - f.best_peak and f.smallest_peak <= f.best_peak


def test_nothing_fits_a_tiny_card():
    (f,) = sf.fits(SMALL[0], (SMALL[1],), [sf.Card(("tiny",), 10**6)])
    assert f.fitting == 0 and f.best is None and f.headroom is None


def test_front_split_adds_up_to_the_searched_peak(small):
    front = sf.pareto(small, int(np.median(small.peak)))
    rows = front[:: max(1, len(front) // 4)]
    for i, s in zip(rows, sf.front_split(small, rows)):
        assert s.total == int(small.peak[i]) and s.stage == int(small.stage[i])
        assert min(s.model_states, s.activations, s.overhead) > 0


def test_the_deepseek_v3_recipe_is_located_and_ranked():
    train = deepseek_recipe("deepseek-v3")
    g = sf.grid("deepseek-v3", train.world_size)
    cap = DEVICE_MEMORY["H800"]
    r = sf.recipe_rank(g, train, cap)
    assert r.rank is not None and 1 <= r.rank <= r.fitting
    rows = sf.recipe_rows(g, train)
    assert r.index in set(rows.tolist()) and len(rows) >= 1
    # its peak is estimate's, with the layout its rule gives
    t = g.train(r.index)
    assert (t.pp, t.tp, t.ep, t.dp, int(t.zero), t.micro_batch) == (train.pp, train.tp, train.ep, train.dp,
                                                                      int(train.zero), train.micro_batch)
    assert estimate("deepseek-v3", t).peak.total == r.peak <= cap
    fit = g.fits(cap)
    step, peak = g.cost["step_s"], g.peak
    better = fit & ((step < r.step_s) | ((step == r.step_s) & (peak < r.peak)))
    assert int(better.sum()) < r.rank <= int((fit & (step <= r.step_s)).sum())
    assert r.faster_and_smaller == int((fit & (step < r.step_s) & (peak < r.peak)).sum())
    assert r.on_front == (r.faster_and_smaller == 0)


def test_recipe_rows_need_the_searched_gpu_count(small):
    with pytest.raises(ConfigError, match="world_size"):
        sf.recipe_rows(small, deepseek_recipe("deepseek-v3"))


def test_only_the_paper_model_has_the_recipe():
    assert sf.has_recipe("deepseek-v3") and not sf.has_recipe("deepseek-v2-lite")
