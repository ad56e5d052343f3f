r"""The book's notation, said once: the notation page lists every symbol of :data:`memlib.core.symbols.REGISTRY`
with the chapter that introduces it, and a chapter's notation section shows only the symbols it introduces
(with their values in its configuration), naming those of earlier chapters in one line.

Which symbols each chapter's notation section is about is listed here, in the book's order; what a symbol
means, its unit and its configuration field are the registry's.

>>> new_symbols("ch01")[:3]
['l', 'N', 'N_r']
>>> "h" in new_symbols("ch02") and "h" not in new_symbols("ch03")
True
"""
from __future__ import annotations

import re

from ..config import load_model
from ..core.symbols import REGISTRY, SYMBOLS
from ..model.blocks import BLOCK_NAMES, SYMBOLS as BLOCK_SYMBOLS, lacking
from .format import join_and, md_table, model_name
from .tables import _not_own, _value, notation_recap

__all__ = ["CHAPTERS", "CHAPTER_SYMBOLS", "chapter_notation", "earlier_line", "first_chapter", "foreign_note",
           "new_symbols", "notation_page"]

#: each chapter's label and the symbols its notation section is about, in the book's order (chapter 2's are
#: the model's: the paper's notation table, which it reproduces whole)
CHAPTERS: dict[str, str] = {
    "ch01": "intro", "ch02": "arch", "ch03": "params", "ch04": "ch-static", "ch05": "ch-zero",
    "ch06": "ch-activations", "ch07": "ch-overheads", "ch08": "ch-together", "ch09": "ch-deepseek-v3",
    "ch10": "ch-validation", "ch14": "ch-errata",
}
CHAPTER_SYMBOLS: dict[str, tuple[str, ...]] = {
    "ch01": ("l", "N", "N_r", "DP", "TP", "PP", "EP", "ETP", "b", "s", "B_w"),
    "ch02": tuple(n.key for n in REGISTRY if n.kind == "model"),
    "ch03": ("h", "h_F", "h_E", "n_h", "d_h", "d_v", "d_hR", "d_cq", "d_c", "N", "N_s", "N_r", "l", "k_dense", "v",
             "PP"),
    "ch04": ("h", "h_E", "n_h", "d_h", "d_v", "d_hR", "d_cq", "d_c", "N", "N_s", "DP", "TP", "PP", "EP", "ETP", "CP",
             "EDP", "L_moe", "P", "B_w"),
    "ch05": ("P", "P_ne", "P_e", "DP", "TP", "CP", "EP", "ETP", "EDP", "B_w", "B_g", "B_o"),
    "ch06": ("b", "s", "h", "n_h", "d_h", "d_v", "d_hR", "d_cq", "d_c", "h_E", "N", "N_s", "N_r", "TP", "CP", "EP",
             "ETP", "L_moe"),
    "ch07": ("DP", "TP", "PP", "EP", "ETP", "b", "s"),
    "ch08": ("PP", "DP", "TP", "EP", "EDP", "b", "s", "M", "V", "n_h", "B_w", "B_g", "B_o"),
    "ch09": ("PP", "DP", "TP", "EP", "EDP", "b", "s", "P", "B_w", "B_g", "B_o"),
    "ch10": ("b", "s", "h", "n_h", "d_v", "N", "N_r"),
    "ch14": ("b", "s", "n_h", "d_h", "d_v", "N", "N_r", "TP", "EP", "ETP", "EDP", "B_g", "B_o"),
}


def _earlier(chapter: str) -> set[str]:
    seen: set[str] = set()
    for c, keys in CHAPTER_SYMBOLS.items():
        if c == chapter:
            return seen
        seen |= set(keys)
    raise KeyError(chapter)


def new_symbols(chapter: str) -> list[str]:
    """The symbols ``chapter`` introduces: those of its notation section no earlier chapter's has."""
    before = _earlier(chapter)
    return [k for k in CHAPTER_SYMBOLS[chapter] if k not in before]


def first_chapter(key: str) -> str | None:
    """The chapter whose notation section introduces symbol ``key`` (``None``: no chapter's lists it)."""
    return next((c for c, keys in CHAPTER_SYMBOLS.items() if key in keys), None)


def earlier_line(chapter: str, model=None, train=None) -> str:
    """One line naming the symbols ``chapter`` uses from earlier chapters, with their values here where a
    model or a training configuration is given (empty if it uses none)."""
    before = _earlier(chapter)
    gone = _not_own(model)                  # only the symbols of blocks the model has
    keys = [k for k in CHAPTER_SYMBOLS[chapter] if k in before and k not in gone]
    if not keys:
        return ""

    def one(k: str) -> str:
        n = SYMBOLS[k]
        if model is None and train is None:
            return f"${n.latex}$"
        v = _value(n, model, train)
        return f"${n.latex}$ = {v}" if v[:1].isdigit() else f"${n.latex}$ ({v.lstrip('— ').strip('()')})"

    return "From earlier chapters, with their values here: " + ", ".join(one(k) for k in keys) + "."


def chapter_notation(chapter: str, model=None, train=None) -> str:
    """A chapter's notation section: the table of the symbols it introduces (their values in the chapter's
    configuration when given), and one line for the symbols of earlier chapters."""
    new = new_symbols(chapter)
    table = notation_recap(new, model, train) + "\n\n" if new else "This chapter introduces no symbol. "
    return f"{table}{earlier_line(chapter, model, train)}".strip()


def notation_page(model=None) -> str:
    """Every symbol of the registry: its meaning, unit, configuration field and the chapter that introduces
    it (a link), in the registry's order (the model's, the parallel sizes, a training step's, a stage's,
    the precision's).  In the book of ``model`` a symbol of a block it lacks (MLA's in a Llama book) is
    introduced by no chapter: its column says so with a dash (:func:`foreign_note`)."""
    foreign = _not_own(load_model(model)) if model is not None else set()
    rows = []
    for n in REGISTRY:
        c = None if n.key in foreign else first_chapter(n.key)
        rows.append([f"${n.latex}$", n.meaning, n.unit, f"`{n.field}`" if n.field else "derived",
                     f"{{ref}}`{CHAPTERS[c]}`" if c else "—"])
    return md_table(["symbol", "meaning", "unit", "config field", "introduced in"], rows, "lllll")


def foreign_note(model) -> str:
    """The sentence under the notation page's table on the symbols that are not ``model``'s (``''`` if all are)."""
    m = load_model(model)
    if not _not_own(m):
        return ""
    blocks = [re.sub(r" \(.*?\)", "", BLOCK_NAMES[b]) for b in BLOCK_NAMES if b in lacking(m) and BLOCK_SYMBOLS.get(b)]
    kinds = (f"to a block {model_name(m)} does not have ({join_and(blocks)}) or " if blocks else "") + \
        "to a setting its configuration leaves out"
    return (f"A symbol introduced by no chapter (—) is not one of {model_name(m)}'s: it belongs {kinds}. The book "
            f"uses such a symbol only where it sets other models beside {model_name(m)}.")
