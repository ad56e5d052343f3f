"""Tables fit their column: a long formula in a cell is broken into lines at the + of its sum, and the lines say
exactly what the one-line formula says (the headless-browser test in test_book_html measures the built book)."""
from __future__ import annotations

import re

import pytest
import sympy as sp

from memlib import PAPER_TRAINING, estimate
from memlib.paper import activations as pact
from memlib.core.symbols import printed_width as _printed_width
from memlib.report.format import tex, wrapped_math


def unwrap(cell: str) -> str:
    """The one-line LaTeX a wrapped cell stands for."""
    body = cell.strip("$")
    body = body.removeprefix(r"\begin{aligned}&").removesuffix(r"\end{aligned}")
    body = body.replace(r" \\ &\quad ", " ").replace(r"\Bigl(", r"\left(").replace(r"\Bigr)", r"\right)")
    return re.sub(r"\s+", " ", body.replace(r"\left(", r"\left( ").replace(r"\right)", r" \right)")).strip()


def same(a: str, b: str) -> bool:
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


b, s, h, N = sp.symbols("b s h N", positive=True)


@pytest.mark.parametrize("expr", [
    2 * b * s * sum(k * sp.Symbol(f"x_{k}") for k in range(1, 14)),       # factors times one long sum
    sum(k * b * sp.Symbol(f"y_{k}") for k in range(1, 14)) - 3 * h,         # a long sum with a negative term
    -4 * (sum(sp.Symbol(f"z_{k}") * s for k in range(1, 14))),              # a negative factor
])
def test_wrapped_lines_say_what_the_one_line_formula_says(expr):
    cell = wrapped_math(expr, 20)
    assert r"\\" in cell                                                    # it was broken
    assert same(unwrap(cell), tex(expr)), (cell, tex(expr))
    lines = cell.strip("$").split(r"\\")
    assert all(_printed_width(line) <= 20 + 12 for line in lines), lines   # a line is one term past the width at most


def test_short_formulas_and_products_stay_on_one_line():
    assert wrapped_math(4 * b * h * s) == f"${tex(4 * b * h * s)}$"
    two_sums = (b + s + h + N) * (b * s + h * N + 3 * b + 5 * s + 7 * h + 11 * N)
    assert wrapped_math(two_sums, 5) == f"${tex(two_sums)}$"               # not of the forms it breaks


def test_table10_formulas_are_broken_and_unchanged():
    est = estimate("deepseek-v3", PAPER_TRAINING)
    total = pact.table10_formulas(est)["total"]["none"]
    cell = wrapped_math(total, 30)
    assert cell.count(r"\\") >= 2 and same(unwrap(cell), tex(total))
