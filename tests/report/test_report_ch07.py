"""The overheads chapter's module: every table and value for DeepSeek-V3, V2 and V2-Lite; no DeepSeek-V3
number in another model's chapter; the words it glues agree with its tables."""
from __future__ import annotations

import re

import pytest

from memlib import estimate
from memlib.paper import paper_training
from memlib.report import ch07_overheads as ch
from memlib.scenarios.overheads import CAPACITY_80GB, base_training

MODELS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")


def chapter(model: str):
    train = paper_training(model)
    return estimate(model, train), estimate(model, base_training(train))


def parts(model: str) -> dict[str, object]:
    est, base = chapter(model)
    return {"notation": ch.notation(est), "values": ch.values(base), "sources": ch.sources_table(),
            "presets": ch.preset_table(base), "measured": ch.measured_table(), "measured_values": ch.measured_values(),
            "not_covered": ch.not_covered_table(), "problems": ch.problem_values(base)}


def text(p: dict) -> str:
    return "\n".join(v if isinstance(v, str) else "\n".join(v.values()) for v in p.values())


@pytest.fixture(scope="module")
def chapters():
    return {m: parts(m) for m in MODELS}


def v3_numbers(p: dict) -> set[str]:
    """DeepSeek-V3's headline numbers, read from its own chapter."""
    v, q = p["values"], p["problems"]
    nums = {v[k] for k in ("allocated", "allocated_bytes", "low_overhead", "high_overhead", "low_total", "high_total",
                           "high_share", "low_share", "widest_high")}
    nums |= {q["p1_frag"], q["p1_total"]}
    rows = [r for r in p["presets"].splitlines() if r.startswith("| `")]
    nums |= {c.strip().strip("*") for r in rows for c in r.split("|")[-3:-1]}      # the totals, GiB and bytes
    return nums


def test_deepseek_v3_chapter(chapters):
    p = chapters["deepseek-v3"]
    v = p["values"]
    assert (v["stage"], v["zero"], v["allocated"], v["low_total"], v["high_total"]) == \
        ("1", "ZeRO-1", "49.42 GiB", "52.99 GiB", "68.25 GiB")
    assert v["widest"] == "fragmentation" and v["fits"] == "fits"
    assert "56,893,303,195" in p["presets"] and "73,281,308,263" in p["presets"]
    assert p["problems"]["p2_answer"].startswith("Up to 58.9% of the allocated memory, above")  # 48.5 % against 80e9 bytes


def test_no_internal_source_is_cited(chapters):
    for p in chapters.values():
        t = text(p)
        assert "peers" not in t and "reconstruction" not in t and "calculator notes" not in t
        assert "github.com/pytorch/pytorch/pull/86509" in p["sources"] and "SimuMax" in p["measured_values"]["source"]


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_another_models_chapter_has_no_deepseek_v3_number(chapters, model):
    nums = v3_numbers(chapters["deepseek-v3"])
    assert "52.99 GiB" in nums and "53,066,416,128" in nums
    t = text(chapters[model])
    assert not [n for n in nums if n in t]


def _row(table: str, name: str) -> list[str]:
    row = next(r for r in table.splitlines() if r.startswith(f"| `{name}`"))
    return [c.strip().strip("*") for c in row.split("|")[1:-1]]


@pytest.mark.parametrize("model", MODELS)
def test_the_words_agree_with_the_tables(chapters, model):
    p = chapters[model]
    v, q = p["values"], p["problems"]
    low, high = _row(p["presets"], "low"), _row(p["presets"], "high")
    low_bytes, high_bytes = (int(r[-1].replace(",", "")) for r in (low, high))
    assert v["low_total"] == low[-2] + " GiB" and v["high_total"] == high[-2] + " GiB"
    assert (v["fits"] == "fits") == (low_bytes <= CAPACITY_80GB)
    assert ("fits under any overhead" in q["p2_answer"]) == (high_bytes <= CAPACITY_80GB)
    # the term that decides the spread has the largest high - low of the table (GiB, two decimals)
    spreads = {t: float(h) - float(lo) for t, lo, h in zip(ch.TERM_LABELS, low[2:5], high[2:5])}
    assert v["widest"] == ch.TERM_PHRASES[max(spreads, key=spreads.get)]
    shares = [float(x) for x in re.findall(r"([\d.]+)%\s*\|\s*$", p["measured"], flags=re.M)]
    assert shares and all(5 <= s <= 17.5 for s in shares) and "lower half" in p["measured_values"]["where"]


def test_the_figure_draws():
    import matplotlib

    matplotlib.use("Agg")
    _, base = chapter("deepseek-v3")
    fig = ch.preset_figure(base)
    assert len(fig.axes[0].patches) == 3 * 7                 # 3 presets x (4 allocated categories + 3 terms)
