"""A printed difference is the difference of the printed values (issue 24: "+0.32 GiB" beside 53.30 and 52.99 GiB,
"0.46 GiB more" from 52.99 to 53.44 GiB): :func:`memlib.report.format.fmt_difference`, everywhere a chapter prints
one, checked on the chapters' own glued values."""
from __future__ import annotations

import re
from fractions import Fraction

from hypothesis import given, strategies as st

from memlib import estimate
from memlib.paper import paper_training
from memlib.report import ch07_overheads as ch7, ch08_together as ch8, ch09_deepseek as ch9, summary
from memlib.report.format import fmt_bytes, fmt_difference
from memlib.scenarios import deepseek as ds, together as tg
from memlib.scenarios.overheads import base_training

NUMBER = re.compile(r"([+−-]?)([\d,]+\.\d+)")


def number(text: str) -> Fraction:
    """The first decimal number of ``text``, exactly, with its sign (``'+0.31 GiB'``, ``'−7.52'``)."""
    sign, digits = NUMBER.search(text).groups()
    x = Fraction(digits.replace(",", ""))
    return -x if sign in "−-" and sign else x


@given(st.integers(0, 2**45), st.integers(0, 2**45), st.sampled_from(["GiB", "MiB"]), st.integers(1, 3))
def test_the_printed_difference_is_the_difference_of_the_printed_values(a, b, unit, digits):
    d = fmt_difference(a, b, unit, digits, signed=True)
    assert d.endswith(f" {unit}") and d[0] in "+−"
    assert number(d) == number(fmt_bytes(a, unit, digits)) - number(fmt_bytes(b, unit, digits))
    assert fmt_difference(a, b, unit, digits) == d[1:]          # the magnitude, without its sign


def test_the_exact_difference_can_round_otherwise():
    # the case the helper exists for: the bytes differ by 0.3151 GiB, the printed values by 0.31
    a, b = 57_234_734_186, 56_896_398_137
    assert (fmt_bytes(a), fmt_bytes(b), fmt_bytes(a - b)) == ("53.30 GiB", "52.99 GiB", "0.32 GiB")
    assert fmt_difference(a, b, signed=True) == "+0.31 GiB"


def test_chapter_7_measured_fragmentation():
    base = estimate("deepseek-v3", base_training(paper_training("deepseek-v3")))
    p = ch7.problem_values(base)
    assert number(p["p1_delta"]) == number(p["p1_total"]) - number(p["p1_low_total"])


def test_chapter_8_routed_tokens_held():
    g = tg.grid(estimate("deepseek-v3", paper_training("deepseek-v3")))
    v = ch8.routed_values(tg.routed_count_effect(g, tg.held_count_grid(g)))
    assert number(v["difference"]) == number(v["held_total"]) - number(v["paper_total"])


def test_chapter_9_margins_rank_0_and_the_ablation():
    est = estimate("deepseek-v3", ds.deepseek_recipe("deepseek-v3"))
    v, a = ch9.values(est), ch9.ablation_values(est)
    cap = number(v["cap_gib"])
    assert number(v["peak_margin"]) == cap - number(v["peak"])
    assert number(a["final_margin"]) == cap - number(a["final"])
    diff = re.search(r"needs ([\d.]+ GiB), ([\d.]+ GiB) less than the peak", v["rank0_sentence"])
    assert number(diff.group(2)) == number(v["peak"]) - number(diff.group(1))
    assert number(v["layer_saved"]) == number(v["layer_plain"]) - number(v["layer_recipe"])
    rows = [r.split("|")[1:-1] for r in ch9.ablation_table(est).splitlines()[2:]]
    totals = [number(r[6].strip("* ")) for r in rows]
    changes = [r[7].strip() for r in rows]
    assert changes[0] == "—"
    assert [number(c) for c in changes[1:]] == [t - s for s, t in zip(totals, totals[1:])]
    # the summary's copy of the ablation prints the same changes
    knob = [r.split("|")[1:-1] for r in summary.knob_values("deepseek-v3")["table"].splitlines()[2:]]
    assert [number(r[3]) for r in knob[1:]] == [number(c) for c in changes[1:]]
