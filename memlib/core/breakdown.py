"""Breakdown: an ordered set of named SymPy terms whose sum is a total.

Every quantity memlib reports is a :class:`Breakdown`, so a total is always the sum of terms a
reader can point at.  Substituting a configuration gives exact integers; ``lambdify`` gives a
vectorised NumPy function for sweeps (floats, for figures only).

>>> from sympy import Symbol
>>> x = Symbol("x", integer=True, positive=True)
>>> b = Breakdown({"a": 2 * x, "b": x + 1})
>>> b.total
3*x + 1
>>> b.evaluate({x: 5})
{'a': 10, 'b': 6}
>>> b.evaluate_total({x: 5})
16
"""
from __future__ import annotations

from fractions import Fraction
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import sympy as sp

from .symbols import latex

__all__ = ["Breakdown", "exact_int", "exact_function", "NotCompilable"]


def exact_int(expr, values: Mapping | None = None) -> int:
    """Substitute ``values`` into ``expr`` and return the exact Python ``int``.

    Raises ``ValueError`` when the result is not an integer (a symbol left free, or a fraction):
    memlib never rounds silently.
    """
    e = sp.sympify(expr)
    if values:
        e = sp.sympify(e.xreplace(dict(values)))
    if e.free_symbols:
        raise ValueError(f"unsubstituted symbols {sorted(map(str, e.free_symbols))} in {e}")
    if not e.is_Integer:
        raise ValueError(f"{e} is not an integer")
    return int(e)


class Breakdown(Mapping):
    """An ordered mapping ``name -> SymPy expression``; its total is the sum of the terms."""

    __slots__ = ("_terms",)

    def __init__(self, terms: Mapping[str, object] | Iterable[tuple[str, object]] = ()):
        items = terms.items() if isinstance(terms, Mapping) else terms
        self._terms: dict[str, sp.Expr] = {}
        for name, expr in items:
            self._terms[name] = self._terms.get(name, sp.Integer(0)) + sp.sympify(expr)

    # Mapping protocol ---------------------------------------------------------------------
    def __getitem__(self, name: str) -> sp.Expr:
        return self._terms[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._terms)

    def __len__(self) -> int:
        return len(self._terms)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {v}" for k, v in self._terms.items())
        return f"Breakdown({{{inner}}})"

    # Algebra ------------------------------------------------------------------------------
    @property
    def total(self) -> sp.Expr:
        """The sum of all terms."""
        return sp.Add(*self._terms.values())

    def __add__(self, other: "Breakdown") -> "Breakdown":
        return Breakdown(list(self.items()) + list(other.items()))

    def scaled(self, factor) -> "Breakdown":
        """Every term multiplied by ``factor``."""
        return Breakdown({k: factor * v for k, v in self.items()})

    def map(self, fn: Callable[[sp.Expr], sp.Expr]) -> "Breakdown":
        """Apply ``fn`` to every term."""
        return Breakdown({k: fn(v) for k, v in self.items()})

    def prefixed(self, prefix: str) -> "Breakdown":
        """The same terms, each name prefixed with ``prefix``."""
        return Breakdown({prefix + k: v for k, v in self.items()})

    def select(self, predicate: Callable[[str], bool]) -> "Breakdown":
        """Only the terms whose name satisfies ``predicate``."""
        return Breakdown({k: v for k, v in self.items() if predicate(k)})

    def grouped(self, key: Callable[[str], str]) -> "Breakdown":
        """Terms summed by ``key(name)``, in order of first appearance."""
        return Breakdown([(key(k), v) for k, v in self.items()])

    def nonzero(self) -> "Breakdown":
        """Drop the terms that are identically zero."""
        return Breakdown({k: v for k, v in self.items() if v != 0})

    # Numbers ------------------------------------------------------------------------------
    def subs(self, values: Mapping) -> "Breakdown":
        """Substitute ``values`` (symbol -> number) into every term, exactly."""
        v = dict(values)
        return Breakdown({k: sp.sympify(e.xreplace(v)) for k, e in self.items()})

    def evaluate(self, values: Mapping | None = None) -> dict[str, int]:
        """Exact integer value of every term."""
        return {k: exact_int(e, values) for k, e in self.items()}

    def evaluate_total(self, values: Mapping | None = None) -> int:
        """Exact integer total."""
        return exact_int(self.total, values)

    def lambdify(self, args: Iterable[sp.Symbol]):
        """A NumPy function of ``args`` returning the dict of term values (floats, for sweeps)."""
        args = tuple(args)
        fns = {k: sp.lambdify(args, e, modules="numpy") for k, e in self.items()}

        def f(*xs):
            return {k: fn(*xs) for k, fn in fns.items()}

        return f

    def latex(self, order: str | None = None) -> str:
        """LaTeX of the total, written as the sum of the terms in order (``order``: SymPy's
        ordering of the terms inside each one, e.g. ``"old"`` for ``l - k`` rather than ``-k + l``)."""
        kw = {} if order is None else {"order": order}
        out = ""
        for e in self._terms.values():
            if e == 0:
                continue
            t = latex(e, **kw)
            if not out:
                out = t
            elif t.startswith("- "):
                out += " - " + t[2:]
            elif t.startswith("-"):
                out += " - " + t[1:]
            else:
                out += " + " + t
        return out or "0"


# ------------------------------------------------------------------------------------------------
# exact evaluation without substitution: expressions compiled to Python arithmetic on ints and Fractions
# ------------------------------------------------------------------------------------------------
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
