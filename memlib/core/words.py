"""Words of a sentence, written once: the library's messages and the book's prose list items and spell small
counts the same way.

>>> join_and(["a", "b", "c"]), join_and(["a", "b"]), join_and(["a"]), join_and([])
('a, b and c', 'a and b', 'a', '')
>>> number_word(3), number_word(12), number_word(1234), counted(1, "module"), counted(0, "bias", "biases")
('three', '12', '1,234', 'one module', 'no biases')
"""
from __future__ import annotations

from typing import Iterable

__all__ = ["join_and", "number_word", "counted"]

_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def join_and(items: Iterable[str]) -> str:
    """Items in a sentence: ``'a, b and c'``, ``'a and b'``, ``'a'`` (``''`` for none)."""
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def number_word(n: int) -> str:
    """A count as running prose writes it: a word up to nine, digits (with thousands separators) from 10 on."""
    return _WORDS[n] if 0 <= n < len(_WORDS) else f"{n:,}"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` of ``noun`` in words: ``'no biases'``, ``'one matrix'``, ``'eight matrices'`` (``plural`` when it is
    not the noun with an s)."""
    return f"{'no' if n == 0 else number_word(n)} {noun if n == 1 else plural or noun + 's'}"
