"""The summary page: every numbered equation with its number and meaning, the glossary of the book's
symbols, and what each of DeepSeek-V3's memory techniques saves on the peak device, formatted from
:mod:`memlib.formulas`, :mod:`memlib.core.symbols` and :mod:`memlib.scenarios.deepseek`.

Nothing here computes a quantity.
"""
from __future__ import annotations

from ..config import ConfigError
from ..formulas import book_formulas
from ..scenarios import deepseek as ds
from .format import fmt_bytes, md_table, model_name, signed_bytes
from .tables import notation_table

__all__ = ["formula_table", "glossary", "knob_table", "knob_values"]


def _number_key(number: str) -> tuple[int, ...]:
    return tuple(int(x) for x in number.split("."))


def formula_table() -> str:
    """Every equation the book numbers, in the book's order: its number, its name for ``memlib formula NAME``,
    and one line of what it counts."""
    rows = [[f"({f.number})", f"`{f.name}`", f.description]
            for f in sorted((f for f in book_formulas() if f.number), key=lambda f: _number_key(f.number))]
    return md_table(["eq.", "`memlib formula`", "what it counts"], rows, "lll")


def glossary() -> str:
    """The symbols of the book, as the notation chapter lists them."""
    return notation_table()


def knob_table(rows: list[dict]) -> str:
    """The ablation of :func:`memlib.scenarios.deepseek.ablation`: per technique, what it does, the peak
    device's total once it is on, what it changed, and whether the peak fits the capacity."""
    out = [[r["label"], r["what"], fmt_bytes(r["total"]), "—" if r["change"] is None else signed_bytes(r["change"]),
            "yes" if r["fits"] else "no"] for r in rows]
    return md_table(["technique", "what it does", "peak device", "change", f"fits the {ds.GPU}"], out, "llrrc")


def knob_values(model) -> dict[str, str]:
    """The knob table of ``model`` under DeepSeek-V3's recipe (:func:`memlib.scenarios.deepseek.deepseek_recipe`)
    and the model's name; where the recipe does not apply to the model, a sentence saying so instead."""
    try:
        table = knob_table(ds.ablation(model, ds.deepseek_recipe(model)))
    except ConfigError as exc:
        table = f"DeepSeek-V3's recipe does not apply to {model_name(model)}: {exc}"
    return {"model": model_name(model), "table": table}
