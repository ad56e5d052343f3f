"""Generic report helpers: glue, Markdown tables, equations, the figure style.

Every number a chapter shows is formatted here (``fmt_*`` from :mod:`memlib.units`) and glued as
a ready string, so the prose never formats or computes anything.  Keys use letters, digits and
``_`` only.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Iterable, Sequence

import sympy as sp

from ..symbols import REGISTRY, SYMBOLS
from ..units import UNITS, fmt_billions, fmt_bytes, fmt_count

__all__ = [
    "glue", "glue_count", "glue_bytes", "glue_billions", "glue_math", "glue_md", "glue_table",
    "glue_figure", "md_table", "latex", "notation_rows", "notation_table", "notation_recap", "use_style",
    "PALETTE", "new_figure", "CAPACITY_80GB", "gib",
]

#: an 80 GB device (H800, H100 SXM): decimal gigabytes, as the vendors count them
CAPACITY_80GB = 80 * UNITS["GB"]


def gib(n: int) -> float:
    """Bytes in GiB as a float, for plotting only."""
    return float(Fraction(int(n), UNITS["GiB"]))

_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

#: Okabe-Ito, the colour-blind-safe palette (Okabe & Ito 2008)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


def _check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"glue key {key!r} must be letters, digits and '_' and start with a letter")
    return key


def glue(key: str, value) -> None:
    """Glue ``value`` under ``key`` without displaying it (myst-nb)."""
    from myst_nb import glue as _glue

    _glue(_check_key(key), value, display=False)


def glue_count(key: str, n: int) -> str:
    """Glue an exact count with thousands separators, e.g. ``671,026,404,352``."""
    s = fmt_count(n)
    glue(key, s)
    return s


def glue_bytes(key: str, n: int, unit: str = "GiB", digits: int = 2) -> str:
    """Glue a byte count in ``unit`` with the unit named, e.g. ``11.64 GiB``."""
    s = fmt_bytes(n, unit, digits)
    glue(key, s)
    return s


def glue_billions(key: str, n: int, digits: int = 2) -> str:
    """Glue a count in billions, e.g. ``671.03B``."""
    s = fmt_billions(n, digits)
    glue(key, s)
    return s


def latex(expr) -> str:
    """LaTeX of a SymPy expression (or a string passed through)."""
    return expr if isinstance(expr, str) else sp.latex(expr)


def glue_math(key: str, expr, lhs: str | None = None) -> str:
    """Glue an equation for ``{glue:math}``: ``lhs = expr`` when ``lhs`` is given."""
    from IPython.display import Math

    body = latex(expr)
    if lhs:
        body = f"{lhs} = {body}"
    glue(key, Math(body))
    return body


def glue_md(key: str, text: str) -> str:
    """Glue Markdown for ``{glue:md}`` (with ``:format: myst``)."""
    from IPython.display import Markdown

    glue(key, Markdown(text))
    return text


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one letter per column (``l``, ``r``, ``c``)."""
    headers = list(headers)
    align = align or "l" + "r" * (len(headers) - 1)
    sep = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep[a] for a in align) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", r"\|") for c in r) + " |")
    return "\n".join(lines)


def glue_table(key: str, headers: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """Glue a Markdown table."""
    return glue_md(key, md_table(headers, rows, align))


def glue_figure(key: str, fig) -> None:
    """Glue a matplotlib figure for ``{glue:figure}`` and close it."""
    import matplotlib.pyplot as plt

    glue(key, fig)
    plt.close(fig)


def notation_rows(kinds: Sequence[str] = ("model", "parallel", "training", "stage", "precision"), values: dict | None = None):
    """Rows (symbol, meaning, unit, config field[, value]) of the notation registry."""
    rows = []
    for n in REGISTRY:
        if n.kind not in kinds:
            continue
        row = [f"${sp.latex(n.symbol)}$", n.meaning, n.unit, f"`{n.field}`" if n.field else "derived"]
        if values is not None:
            v = values.get(n.symbol)
            row.append("—" if v is None else fmt_count(v))
        rows.append(row)
    return rows


def notation_table(kinds: Sequence[str] = ("model", "parallel", "training", "stage", "precision"), values: dict | None = None) -> str:
    """The notation table as Markdown, rendered from the registry."""
    headers = ["symbol", "meaning", "unit", "config field"] + (["value"] if values is not None else [])
    return md_table(headers, notation_rows(kinds, values), "llll" + ("r" if values is not None else ""))


def _recap_value(n, model, train) -> str:
    """The value of one registry entry under ``model`` and ``train`` (``—`` where it is per device)."""
    if n.kind == "model" and model is not None:
        x = getattr(model, n.field)
        return "— (null)" if x is None else fmt_count(x)
    if n.kind in ("parallel", "training") and train is not None:
        x = train.edp if n.key == "EDP" else getattr(train, n.field)
        return "— (schedule default)" if x is None else fmt_count(x)
    if n.kind == "precision" and train is not None:
        from ..states import recipe

        rec = recipe(train.precision)
        return fmt_count({"B_w": rec.weights, "B_g": rec.gradients, "B_o": rec.optimizer_bytes}[n.key])
    return "per device"


def notation_recap(keys: Sequence[str], model=None, train=None) -> str:
    """A chapter's notation recap: the registry entries ``keys`` (see :data:`memlib.symbols.SYMBOLS`)
    as a Markdown table of symbol, meaning and unit and, when ``model`` or ``train`` is given, the
    value in the chapter's configuration.

    >>> print(notation_recap(["h", "DP"]))
    | symbol | meaning | unit |
    | :-- | :-- | :-- |
    | $h$ | hidden dimension | elements |
    | $DP$ | data-parallel size | ranks |
    """
    with_values = model is not None or train is not None
    rows = []
    for k in keys:
        n = SYMBOLS[k]
        row = [f"${sp.latex(n.symbol)}$", n.meaning, n.unit]
        if with_values:
            row.append(_recap_value(n, model, train))
        rows.append(row)
    headers = ["symbol", "meaning", "unit"] + (["value here"] if with_values else [])
    return md_table(headers, rows, "lll" + ("r" if with_values else ""))


def use_style() -> None:
    """One figure style for the whole book: deterministic output, Okabe-Ito colours, units on axes."""
    # No matplotlib.use(...): inside a kernel the inline backend must stay, so that glued figures
    # render as images; on a machine without a display matplotlib falls back to Agg by itself.
    import matplotlib.pyplot as plt
    from cycler import cycler

    plt.rcParams.update({
        "figure.figsize": (7.0, 3.6),
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "axes.prop_cycle": cycler(color=list(PALETTE)),
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "lines.linewidth": 2,
        "font.size": 10,
        "legend.frameon": False,
        "svg.hashsalt": "memlib",
        "path.simplify": False,
    })


def new_figure(width: float = 7.0, height: float = 3.6):
    """A new (figure, axes) pair in the book style."""
    import matplotlib.pyplot as plt

    use_style()
    return plt.subplots(figsize=(width, height), layout="constrained")
