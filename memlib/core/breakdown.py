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

from typing import Callable, Iterable, Iterator, Mapping

import sympy as sp

from .symbols import latex

__all__ = ["Breakdown", "exact_int"]


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

    def map(self, fn: Callable[[sp.Expr], sp.Expr]) -> "Breakdown":
        """Apply ``fn`` to every term."""
        return Breakdown({k: fn(v) for k, v in self.items()})

    def select(self, predicate: Callable[[str], bool]) -> "Breakdown":
        """Only the terms whose name satisfies ``predicate``."""
        return Breakdown({k: v for k, v in self.items() if predicate(k)})

    def grouped(self, key: Callable[[str], str]) -> "Breakdown":
        """Terms summed by ``key(name)``, in order of first appearance."""
        return Breakdown([(key(k), v) for k, v in self.items()])

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
