"""memlib.scenarios.overheads: the overhead presets on one device, the measured reserved/allocated
gaps, the headroom for fragmentation; DeepSeek-V3's numbers for the paper's configuration, hand-worked
values, and DeepSeek-V2 and V2-Lite."""
from __future__ import annotations

from fractions import Fraction
from math import ceil
from types import SimpleNamespace

import pytest

from memlib import estimate
from memlib.device.overhead import OVERHEAD_PRESETS, overheads
from memlib.paper import analysed_stage, paper_training
from memlib.data.reference import MEASURED_RESERVED, NCCL_BUFFSIZE, PYTORCH_ALLOCATOR
from memlib.scenarios import overheads as so
from memlib.config import ZeroStage

MIB, GIB = 2**20, 2**30
CTX_LOW, COMM_LOW = 300 * MIB, ceil(Fraction(8, 10) * GIB)        # 314,572,800 and 858,993,460


def device(model: str):
    base = estimate(model, so.base_training(paper_training(model)))
    return base, base.stages[analysed_stage(base.partition)]


@pytest.fixture(scope="module")
def v3():
    return device("deepseek-v3")


def test_base_training_is_zero1_with_full_recomputation():
    t = paper_training("deepseek-v3")
    b = so.base_training(t)
    assert (b.zero, b.recompute) == (int(ZeroStage.OS), "full")
    assert b.with_(zero=t.zero, recompute=t.recompute) == t                 # nothing else changes
    assert so.CAPACITY_80GB == 81_559 * 2**20 == 85_520_809_984          # an H800 as nvidia-smi reports it


def test_presets_on_deepseek_v3(v3):
    base, st = v3
    rows = so.preset_terms(st)
    assert st.allocated == 53_066_416_128                                    # 49.42 GiB
    assert [rows[p]["total"] for p in so.PRESETS] == [53_066_416_128, 56_893_303_195, 73_281_308_263]
    assert rows["low"]["fragmentation"] == ceil(st.allocated * Fraction(5, 100)) == 2_653_320_807
    for r in rows.values():
        assert r["total"] == r["allocated"] + r["cuda_context"] + r["comm_buffers"] + r["fragmentation"]
        assert r["overhead"] == r["total"] - r["allocated"] and r["share"] == Fraction(r["overhead"], r["total"])
    assert rows["none"]["overhead"] == 0
    # the very totals estimate() gives with each preset
    for p in ("low", "high"):
        e = estimate(base.model, base.train, OVERHEAD_PRESETS[p])
        assert e.stages[analysed_stage(e.partition)].total == rows[p]["total"]
    assert rows["low"]["total"] == base.stages[1].total                     # the default overheads are low's
    assert so.widest_term(st) == "fragmentation" and so.fits(st)


def test_presets_by_hand():
    """A device of 1,000 allocated bytes: the fixed terms dominate; of one TiB, fragmentation."""
    small = SimpleNamespace(allocated=1000)
    rows = so.preset_terms(small)
    assert rows["low"] == {"allocated": 1000, "cuda_context": CTX_LOW, "comm_buffers": COMM_LOW,
                           "fragmentation": 50, "overhead": CTX_LOW + COMM_LOW + 50,
                           "total": 1000 + CTX_LOW + COMM_LOW + 50,
                           "share": Fraction(CTX_LOW + COMM_LOW + 50, 1000 + CTX_LOW + COMM_LOW + 50)}
    assert rows["high"]["fragmentation"] == 300 and rows["high"]["total"] == 1300 + 4 * GIB
    assert so.spread(small) == {"cuda_context": 2 * GIB - CTX_LOW, "comm_buffers": 2 * GIB - COMM_LOW,
                                "fragmentation": 250}
    assert so.widest_term(small) == "cuda_context"
    assert so.widest_term(SimpleNamespace(allocated=2**40)) == "fragmentation"   # 0.25 TiB of spread
    assert so.fits(small, "high", 1300 + 4 * GIB) and not so.fits(small, "high", 1299 + 4 * GIB)


def test_headroom(v3):
    _, st = v3
    h = so.headroom(st)
    assert h["room"] == 81_559 * 2**20 - st.allocated - CTX_LOW - COMM_LOW == 31_280_827_596
    assert h["max_fraction"] == Fraction(h["room"], st.allocated)                # 58.9 %
    assert h["above_band"] and h["high_fits"]
    # exact: at the largest fraction the device fills the card, one byte's worth more overflows it
    at = overheads("low", fragmentation=h["max_fraction"]).terms(st.allocated)
    assert st.allocated + sum(at.values()) == so.CAPACITY_80GB
    over = overheads("low", fragmentation=h["max_fraction"] + Fraction(1, st.allocated)).terms(st.allocated)
    assert st.allocated + sum(over.values()) > so.CAPACITY_80GB
    small = so.headroom(SimpleNamespace(allocated=1000), capacity=10**9)
    assert small["room"] == 10**9 - 1000 - CTX_LOW - COMM_LOW
    tight = so.headroom(SimpleNamespace(allocated=1000), capacity=10**6)
    assert tight["room"] < 0 and not tight["above_band"] and not tight["high_fits"]


def test_band_and_measured_runs():
    assert so.band() == (Fraction(5, 100), Fraction(30, 100))
    pos = [so.band_position(Fraction(p, 100)) for p in (4, 5, 17)] + [so.band_position(Fraction(35, 200))]
    assert pos == ["below", "lower half", "lower half", "lower half"]            # 17.5 % is the middle
    assert [so.band_position(Fraction(p, 100)) for p in (18, 30, 31)] == ["upper half", "upper half", "above"]
    rows = {r["key"]: r for r in so.measured_ratios()}
    assert set(rows) == set(MEASURED_RESERVED["runs"])
    ds = rows[so.RUN_OF_MODEL["deepseek-v3"]]
    assert ds["excess"] == Fraction(11018, 10430) - 1 and ds["position"] == "lower half"      # 5.6 %
    assert rows[so.RUN_OF_MODEL["deepseek-v2"]]["excess"] == Fraction(4879, 4563) - 1       # 6.9 %
    assert rows["llama3_70b_l12_tp1_pp2_dp4_mbc4_cef"]["excess"] == Fraction(7088, 6655) - 1  # 6.5 %


def test_measured_fragmentation(v3):
    _, st = v3
    assert so.measured_run("deepseek-v3") == (so.RUN_OF_MODEL["deepseek-v3"], True)
    m = so.measured_fragmentation(st, so.RUN_OF_MODEL["deepseek-v3"])
    f = Fraction(11018, 10430) - 1
    assert m["fraction"] == f and m["fragmentation"] == ceil(f * st.allocated)
    assert m["total"] == st.allocated + CTX_LOW + COMM_LOW + m["fragmentation"] == 57_231_646_117
    assert m["delta"] == m["total"] - 56_893_303_195 > 0                    # 5.6 % is above the low 5 %


def test_the_measured_run_of_another_model():
    assert so.measured_run("deepseek-v2") == (so.RUN_OF_MODEL["deepseek-v2"], True)
    # no published run of V2-Lite: the MoE run with the largest gap, V2's 6.9 % against V3's 5.6 %
    assert so.measured_run("deepseek-v2-lite") == (so.RUN_OF_MODEL["deepseek-v2"], False)
    # a dense model takes the dense run (Llama3-70B, 6.5 %), not DeepSeek-V2's larger 6.9 %
    assert so.measured_run("llama-3-8b") == (so.RUN_OF_MODEL["llama-3-70b"], False)
    assert so.measured_run("llama-3-70b") == (so.RUN_OF_MODEL["llama-3-70b"], True)


def test_not_covered_constants_are_the_references():
    rows = {r["key"]: r for r in so.NOT_COVERED}
    c = rows["block_rounding"]["constants"]
    assert (c["min_block"], c["round_large"], c["large_buffer"]) == (512, 2 * MIB, 20 * MIB)
    assert c["small_size"] == PYTORCH_ALLOCATOR["kSmallSize"] == MIB
    assert rows["nccl"]["constants"]["buffsize"] == NCCL_BUFFSIZE == 4 * MIB
    assert all(r["source"] for r in so.NOT_COVERED)


@pytest.mark.parametrize("model, allocated, low_total, widest", [
    ("deepseek-v2", 20_449_952_768, 22_646_016_667, "fragmentation"),
    ("deepseek-v2-lite", 1_822_306_432, 3_086_988_014, "cuda_context"),
])
def test_other_models(model, allocated, low_total, widest):
    _, st = device(model)
    rows = so.preset_terms(st)
    assert st.allocated == allocated and rows["low"]["total"] == low_total
    assert so.widest_term(st) == widest and so.fits(st) and so.headroom(st)["high_fits"]


def test_a_fit_inside_the_measured_band_is_marginal(v3):
    """DeepSeek-V3's device (49.42 GiB allocated, 52.99 GiB with the low overheads) on a card one byte larger than
    that total fits by the prediction, but memlib's DeepSeek-style peaks were up to 4.19 % short of measured
    ones: read with that band it is marginal; on the H800 it fits even at the band's far end (55.1 GiB)."""
    base, st = v3
    total = so.preset_terms(st)["low"]["total"]
    assert so.fits(st, "low", total + 1)
    assert so.judged_fit(st, base.model, "low", total + 1)["verdict"] == "marginal"
    assert so.judged_fit(st, base.model, "low")["verdict"] == "fits"
    assert so.judged_fit(st, base.model, "low", st.allocated)["verdict"] == "does not fit"
