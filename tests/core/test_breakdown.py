"""memlib.core.breakdown: named terms whose sum is the total, evaluated exactly or refused.  Values worked by hand
on x = 5, y = 3."""
from __future__ import annotations

import pytest
import sympy as sp

from memlib.core.breakdown import Breakdown, exact_int

x, y = sp.symbols("x y", integer=True, positive=True)
AT = {x: 5, y: 3}


def test_a_repeated_name_adds_up_in_first_order():
    b = Breakdown([("a", 2 * x), ("b", y), ("a", 1)])          # a: 2x + 1
    assert list(b) == ["a", "b"] and b.evaluate(AT) == {"a": 11, "b": 3}
    assert b.evaluate_total(AT) == 14


def test_grouped_select_map_and_sum():
    b = Breakdown({"attention.q": x, "attention.k": y, "moe.router": x * y, "moe.experts": 2})
    assert b.grouped(lambda k: k.split(".")[0]).evaluate(AT) == {"attention": 8, "moe": 17}
    assert b.select(lambda k: k.startswith("moe.")).evaluate_total(AT) == 17
    assert b.map(lambda e: 2 * e).evaluate_total(AT) == 2 * 25
    both = b + Breakdown({"moe.experts": 3, "head": 1})
    assert both.evaluate(AT)["moe.experts"] == 5 and both.evaluate_total(AT) == 25 + 4


def test_subs_keeps_what_is_not_given():
    b = Breakdown({"a": x * y}).subs({x: 4})
    assert b["a"] == 4 * y and b.evaluate({y: 3}) == {"a": 12}


def test_an_inexact_or_unfinished_number_is_refused():
    # memlib never rounds: 5 / 2 is refused, and so is a symbol left free
    with pytest.raises(ValueError, match="5/2 is not an integer"):
        exact_int(x / 2, AT)
    with pytest.raises(ValueError, match=r"unsubstituted symbols \['y'\]"):
        Breakdown({"a": x + y}).evaluate({x: 1})
    assert exact_int(x * y / 3, AT) == 5 and type(exact_int(x, AT)) is int


def test_latex_writes_the_sum_term_by_term():
    # a zero term is left out; a negative one is subtracted, whether SymPy writes "- y" or "-3"
    assert Breakdown({"a": 2 * x, "b": -y, "c": 0, "d": -3}).latex() == "2 x - y - 3"
    assert Breakdown({}).latex() == "0" and Breakdown({}).evaluate_total() == 0


def test_lambdify_for_sweeps():
    f = Breakdown({"a": x * y, "b": x + 1}).lambdify([x, y])
    assert f(5, 3) == {"a": 15, "b": 6}
