"""Chapter 14, "Errata": every item of :mod:`memlib.paper.errata`, by chapter, formatted."""
from __future__ import annotations

from ..device.estimate import Estimate
from ..paper.errata import counts, errata
from .format import fmt_count
from .tables import errata_summary, errata_table, kinds_table

__all__ = ["CHAPTERS", "PAPER_KEYS", "values", "table", "kinds"]

#: the keys of :func:`values` (placeholders for another model, whose book has no item)
PAPER_KEYS = ("n_all", "summary")

#: the chapters the items belong to, in the book's order
CHAPTERS = ("parameters", "static", "zero", "activations")


def values(est: Estimate) -> dict[str, str]:
    items = errata(est)
    return {"n_all": fmt_count(len(items)), "summary": errata_summary(counts(items))} if items else {}


def table(est: Estimate, chapter: str) -> str:
    return errata_table(errata(est), chapter)


def kinds() -> str:
    return kinds_table()
