"""``memlib formula``: the book's numbered equations and memlib's other formulas, by name."""
from __future__ import annotations


from ..core.symbols import latex


def _formula(args) -> int:
    import sympy as sp

    from ..formulas import FORMULAS, book_formulas, equation, equation_text, formula

    if args.name is None or args.list:
        width = max(map(len, FORMULAS))
        shown = book_formulas()
        rest = sorted((f for f in FORMULAS.values() if not f.number), key=lambda f: f.name)
        for f in shown + rest:
            number = f"({f.number})" if f.number else "—"
            print(f"{number:>7}  {f.name:<{width}}  {f.description}")
        return 0
    if args.expand:
        expr = formula(args.name, args.model)
        print(latex(expr) if args.latex else sp.sstr(expr))
    else:
        print(equation(args.name, args.model) if args.latex else equation_text(args.name, args.model))
    return 0
