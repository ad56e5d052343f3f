"""The exact compiler: SymPy expressions translated into Python arithmetic on ints and Fractions.

:func:`exact_function` turns expressions of some symbols into one Python function of those symbols
that returns the same exact values a substitution would (``int`` where a value is whole, ``Fraction``
where not), without SymPy at call time; an expression it does not translate raises
:class:`NotCompilable`, and the caller substitutes instead.  A :class:`~memlib.core.breakdown.Breakdown`
is the data; this is how its terms are evaluated fast.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Callable, Sequence

import sympy as sp

__all__ = ["exact_function", "NotCompilable"]


class NotCompilable(Exception):
    """An expression :func:`exact_function` does not translate (the caller substitutes instead)."""


def _q(n, d):
    """n / d exactly: an int where it divides, else a Fraction (``int / int`` would be a float)."""
    if type(n) is int and type(d) is int:
        if d == 0:
            raise ZeroDivisionError("division by zero in an exact expression")
        return n // d if n % d == 0 else Fraction(n, d)
    return n / d


def _ceil(x):
    return -((-x) // 1)


_RELATION_OPS = {"==": "==", "!=": "!=", ">": ">", ">=": ">=", "<": "<", "<=": "<="}


class _Source:
    def __init__(self, symbols: Sequence[sp.Symbol]):
        self.args = {s: f"x{i}" for i, s in enumerate(symbols)}
        self.consts: dict[str, object] = {}

    def const(self, q: sp.Rational) -> str:
        if q.q == 1:
            return repr(int(q.p))
        name = f"c{len(self.consts)}"
        self.consts[name] = Fraction(int(q.p), int(q.q))
        return name

    def expr(self, e) -> str:
        if e.is_Rational:
            return self.const(e)
        if e.is_Symbol:
            if e not in self.args:
                raise NotCompilable(f"symbol {e} has no value")
            return self.args[e]
        if e.is_Add:
            return "(" + " + ".join(self.expr(a) for a in e.args) + ")"
        if e.is_Mul:
            num, den = [], []
            for a in e.args:
                if a.is_Rational:
                    if a.p != 1:
                        num.append(repr(int(a.p)))
                    if a.q != 1:
                        den.append(repr(int(a.q)))
                elif a.is_Pow and a.exp.is_Integer and a.exp < 0:
                    k = -int(a.exp)
                    den.append(self.expr(a.base) + ("" if k == 1 else f" ** {k}"))
                else:
                    num.append(self.expr(a))
            n = "(" + " * ".join(num) + ")" if num else "1"
            return f"_q({n}, {' * '.join(den)})" if den else n
        if e.is_Pow:
            if not (e.exp.is_Integer and e.exp != 0):
                raise NotCompilable(f"power {e}")
            k = int(e.exp)
            return f"({self.expr(e.base)} ** {k})" if k > 0 else f"_q(1, {self.expr(e.base)} ** {-k})"
        if isinstance(e, sp.ceiling):
            return f"_ceil({self.expr(e.args[0])})"
        if isinstance(e, sp.floor):
            return f"(({self.expr(e.args[0])}) // 1)"
        if isinstance(e, (sp.Max, sp.Min)):
            return ("max(" if isinstance(e, sp.Max) else "min(") + ", ".join(self.expr(a) for a in e.args) + ")"
        if isinstance(e, sp.Mod):
            return f"({self.expr(e.args[0])} % {self.expr(e.args[1])})"
        if isinstance(e, sp.Piecewise):
            out = self.expr(e.args[-1][0]) if e.args[-1][1] == sp.true else "_no_case()"
            last = e.args[:-1] if e.args[-1][1] == sp.true else e.args
            for x, c in reversed(last):
                out = f"({self.expr(x)} if {self.cond(c)} else {out})"
            return out
        raise NotCompilable(f"{type(e).__name__}: {e}")

    def cond(self, c) -> str:
        if c == sp.true:
            return "True"
        if c == sp.false:
            return "False"
        if isinstance(c, sp.And):
            return "(" + " and ".join(self.cond(a) for a in c.args) + ")"
        if isinstance(c, sp.Or):
            return "(" + " or ".join(self.cond(a) for a in c.args) + ")"
        if isinstance(c, sp.Not):
            return f"(not {self.cond(c.args[0])})"
        if isinstance(c, sp.core.relational.Relational) and c.rel_op in _RELATION_OPS:
            return f"({self.expr(c.lhs)} {_RELATION_OPS[c.rel_op]} {self.expr(c.rhs)})"
        raise NotCompilable(f"condition {c}")


def _no_case():
    raise ValueError("no case of a piecewise expression holds")


def exact_function(exprs: Sequence, symbols: Sequence[sp.Symbol]) -> Callable[..., tuple]:
    """One Python function of ``symbols`` (positional numbers) returning the exact value of each of ``exprs``
    (an ``int`` or a :class:`~fractions.Fraction`): the arithmetic an exact substitution does (rationals,
    ceilings, floors, maxima, piecewise cases), without building SymPy objects, so that evaluating an
    expression costs microseconds.  Raises :class:`NotCompilable` for what it does not translate."""
    src = _Source(symbols)
    body = ", ".join(src.expr(sp.sympify(e)) for e in exprs)
    code = f"def _f({', '.join(src.args.values())}):\n    return ({body}{',' if len(exprs) == 1 else ''})\n"
    ns = {"_q": _q, "_ceil": _ceil, "Fraction": Fraction, "_no_case": _no_case, **src.consts}
    exec(compile(code, "<memlib exact_function>", "exec"), ns)
    return ns["_f"]
