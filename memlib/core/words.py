"""Words of a sentence, joined once: the library's messages and the book's prose list items the same way.

>>> join_and(["a", "b", "c"]), join_and(["a", "b"]), join_and(["a"]), join_and([])
('a, b and c', 'a and b', 'a', '')
"""
from __future__ import annotations

from typing import Iterable

__all__ = ["join_and"]


def join_and(items: Iterable[str]) -> str:
    """Items in a sentence: ``'a, b and c'``, ``'a and b'``, ``'a'`` (``''`` for none)."""
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)
