"""memlib.core.exact.exact_function (what estimate() evaluates its kept terms with) against SymPy's own exact
substitution, and memlib.search.compiled's distinct-row finder against a sort: random expressions and values."""
from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

from memlib.core.exact import NotCompilable, exact_function
from memlib.search.compiled import _unique_rows

b, s, TP, CP = sp.symbols("b s TP CP", positive=True, integer=True)
SYMS = (b, s, TP, CP)

EXPRESSIONS = [
    57344 * b * s / (CP * TP),
    4 * sp.ceiling(24576 * b * s / (CP * TP)),
    32 * TP * b * s * (4 * sp.ceiling(sp.Integer(32) / TP) + sp.Integer(4096) / TP) / (CP * TP),
    sp.Max(0, b * s / 3 - TP, sp.Rational(-7, 2) * CP),
    sp.Min(b, s / TP),
    sp.floor(sp.Rational(5, 3) * b - s / 7),
    sp.Piecewise((b * s, TP > 1), (s / 3, sp.And(CP >= 2, b < 3)), (7, True)),
    sp.Rational(-9, 4) * b ** 2 / TP ** 3 + 1,
    sp.Mod(b * s, TP + 2),
    sp.ceiling((135921664 + 1728053248 / TP) / (CP * b)),
]


def _exact(e, values):
    return sp.sympify(e.xreplace(dict(zip(SYMS, values))))


def test_exact_function_equals_substitution():
    f = exact_function(EXPRESSIONS, SYMS)
    rng = random.Random(13)
    for _ in range(300):
        values = (rng.randint(1, 9), rng.choice([1, 7, 999, 4096]), rng.choice([1, 2, 3, 8, 16]), rng.randint(1, 5))
        for e, got in zip(EXPRESSIONS, f(*values)):
            want = _exact(e, values)
            assert isinstance(got, (int, Fraction))
            assert sp.Rational(got.numerator, got.denominator) == want, (e, values, got, want)
            assert int(got) == int(want)          # truncation toward zero, as int() of a SymPy rational


def test_exact_function_refuses_what_it_cannot_translate():
    with pytest.raises(NotCompilable):
        exact_function([sp.sqrt(b)], SYMS)
    with pytest.raises(NotCompilable):
        exact_function([b + sp.Symbol("h")], SYMS)
    with pytest.raises(ZeroDivisionError):
        exact_function([b / (TP - 1)], SYMS)(1, 1, 1, 1)


@pytest.mark.parametrize("spread", [4, 100, 10**9])
def test_distinct_rows_by_table_and_by_sort_agree(spread):
    rng = np.random.default_rng(spread)
    cols = [rng.integers(1, spread, 5000), rng.choice([1, 2, 4, 8], 5000), rng.integers(0, 3, 5000)]
    uniq, inverse = _unique_rows(cols, ("a", "b", "c"))
    rows = np.stack([uniq["a"], uniq["b"], uniq["c"]], axis=1)
    assert len({tuple(r) for r in rows}) == len(rows)                     # distinct
    assert (rows[inverse] == np.stack(cols, axis=1)).all()                  # every row recovered
    assert len(rows) == len(np.unique(np.stack(cols, axis=1), axis=0))     # all of them
