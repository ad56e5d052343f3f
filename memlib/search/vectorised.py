"""Exact rationals on NumPy arrays: the arithmetic :class:`~memlib.search.compiled.ExactFunction` runs.

A value is a pair of integer arrays (numerator, denominator).  Three sets of operations run one compiled
expression: *checked* (:data:`_CHECKED`: every product's magnitude looked at, past 2^62 the operation goes
to Python integers, denominators reduced), *fast* (:data:`_FAST`: plain int64, nothing reduced) where a
*bound* (:data:`_BOUND`: the same expression run on the knobs' largest values) shows that no intermediate
integer can reach 2^62.  Nothing here knows about models; :mod:`memlib.search.compiled` compiles the
estimate's expressions onto these operations.
"""
from __future__ import annotations

import operator
from math import gcd

import numpy as np
import sympy as sp

#: magnitudes past which an int64 product could overflow: the operation goes to Python integers
_LIMIT = 2**62


def _mag(x) -> int:
    if type(x) is int:
        return abs(x)
    if isinstance(x, np.ndarray):
        # the largest |value| without an array of absolute values (ints first: no int64 negation)
        return max(int(x.max()), -int(x.min())) if x.size else 0
    return abs(int(x))


def _obj(x):
    return x.astype(object) if isinstance(x, np.ndarray) and x.dtype != object else x


def _mul(a, b):
    if type(a) is int and type(b) is int:      # Python integers: exact at any size
        return a * b
    if _mag(a) * _mag(b) >= _LIMIT:
        a, b = _obj(a), _obj(b)
    return a * b


def _add(a, b):
    if type(a) is int and type(b) is int:
        return a + b
    if _mag(a) + _mag(b) >= _LIMIT:
        a, b = _obj(a), _obj(b)
    return a + b


def _big(x):
    """A Python integer past int64's safe range as an object scalar array (NumPy would make it uint64, or
    fail, and mixing uint64 with int64 gives floats)."""
    return np.array(x, dtype=object) if type(x) is int and abs(x) >= _LIMIT else x


#: denominators are reduced (by the gcd) only past this magnitude: small ones keep every product in int64
_REDUCE_PAST = 2**16


def _reduce(n, d):
    if isinstance(n, int) and isinstance(d, int):
        g = gcd(n, d) or 1
        return n // g, d // g
    if _mag(d) < _REDUCE_PAST:
        return n, d
    n, d = _big(n), _big(d)
    g = np.gcd(n, d)
    g = np.where(g == 0, 1, g)
    return n // g, d // g


def _r_add(x, y):
    (n1, d1), (n2, d2) = x, y
    if isinstance(d2, int) and d2 == 1:
        return _add(n1, _mul(n2, d1)), d1
    if isinstance(d1, int) and d1 == 1:
        return _add(n2, _mul(n1, d2)), d2
    return _reduce(_add(_mul(n1, d2), _mul(n2, d1)), _mul(d1, d2))


def _r_mul(x, y):
    (n1, d1), (n2, d2) = x, y
    return _reduce(_mul(n1, n2), _mul(d1, d2))


def _r_inv(x):
    n, d = x
    if isinstance(n, int):
        if n == 0:
            raise ZeroDivisionError("division by zero in a compiled expression")
        return (d, n) if n > 0 else (-d, -n)
    if n.size and n.min() > 0:              # the usual case (a count of devices or tokens): one reduction
        return d, n
    if (n == 0).any():
        raise ZeroDivisionError("division by zero in a compiled expression")
    sign = np.where(n < 0, -1, 1)
    return d * sign, n * sign


def _r_cmp(x, y):
    """(left, right) integers whose comparison is that of the rationals x and y (denominators positive)."""
    (n1, d1), (n2, d2) = x, y
    return _mul(n1, d2), _mul(n2, d1)


def _r_where(c, x, y):
    if isinstance(c, (bool, np.bool_)):
        return x if c else y
    return np.where(c, _big(x[0]), _big(y[0])), np.where(c, _big(x[1]), _big(y[1]))


def _picker(cmp, keep_first):
    """max (``operator.ge``) or min (``operator.le``) of two rationals compared by ``cmp``."""
    def pick(x, y):
        a, b = cmp(x, y)
        return _r_where(keep_first(a, b), x, y)
    return pick


_r_max, _r_min = _picker(_r_cmp, operator.ge), _picker(_r_cmp, operator.le)


def _floor_div(n, d):
    return n // d


def _ceil_div(n, d):
    return -((-n) // d)


_RELATIONS = {sp.Eq: np.equal, sp.Ne: np.not_equal, sp.StrictGreaterThan: np.greater,
              sp.GreaterThan: np.greater_equal, sp.StrictLessThan: np.less, sp.LessThan: np.less_equal}


# three ways to run one compiled expression: checked (every product's magnitude looked at, denominators reduced),
# fast (plain int64 operations, nothing reduced) where a bound (the same expression run on the knobs' largest
# values) shows that no intermediate integer can reach 2^62, and that bound itself
def _f_add(x, y):
    (n1, d1), (n2, d2) = x, y
    if type(d2) is int and d2 == 1:
        return n1 + n2 * d1, d1
    if type(d1) is int and d1 == 1:
        return n2 + n1 * d2, d2
    return n1 * d2 + n2 * d1, d1 * d2


def _f_mul(x, y):
    return x[0] * y[0], x[1] * y[1]


def _f_cmp(x, y):
    return x[0] * y[1], y[0] * x[1]


_f_max, _f_min = _picker(_f_cmp, operator.ge), _picker(_f_cmp, operator.le)


class _Overflow(Exception):
    """An intermediate integer of the bound run could reach 2^62: the checked run is needed."""


def _b_check(*xs: int) -> None:
    for x in xs:
        if x >= _LIMIT:
            raise _Overflow


def _b_add(x, y):
    (n1, d1), (n2, d2) = x, y
    a, b, d = n1 * d2, n2 * d1, d1 * d2
    _b_check(a, b, a + b, d)
    return a + b, d


def _b_mul(x, y):
    n, d = x[0] * y[0], x[1] * y[1]
    _b_check(n, d)
    return n, d


def _b_cmp(x, y):
    a, b = x[0] * y[1], y[0] * x[1]
    _b_check(a, b)
    return a, b


def _b_where(c, x, y):
    return max(x[0], y[0]), max(x[1], y[1])


def _b_extreme(x, y):
    _b_cmp(x, y)
    return _b_where(None, x, y)


class _Ops:
    def __init__(self, name, add, mul, max_, min_, inv, cmp, where, ceil, floor, rel, land, lnot):
        self.name, self.add, self.mul, self.max, self.min, self.inv = name, add, mul, max_, min_, inv
        self.cmp, self.where, self.ceil, self.floor, self.rel, self.land, self.lnot = \
            cmp, where, ceil, floor, rel, land, lnot


def _land(values, op):
    return op.reduce([np.asarray(v) for v in values])


_CHECKED = _Ops("checked", _r_add, _r_mul, _r_max, _r_min, _r_inv, _r_cmp, _r_where, _ceil_div, _floor_div,
                lambda op, x, y: op(*_r_cmp(x, y)), _land, np.logical_not)
_FAST = _Ops("fast", _f_add, _f_mul, _f_max, _f_min, _r_inv, _f_cmp, _r_where, _ceil_div, _floor_div,
             lambda op, x, y: op(*_f_cmp(x, y)), _land, np.logical_not)
#: on (bound of |numerator|, bound of the denominator) for the knobs' largest values: |ceil(n/d)| <= |n| + 1
_BOUND = _Ops("bound", _b_add, _b_mul, _b_extreme, _b_extreme, lambda x: (x[1], max(x[0], 1)), _b_cmp, _b_where,
              lambda n, d: n + 1, lambda n, d: n + 1, lambda op, x, y: _b_cmp(x, y) and None,
              lambda values, op: None, lambda v: None)
