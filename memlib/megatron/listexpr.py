"""``--moe-layer-freq``: an integer or a list expression such as ``([0]*3+[1]*58)``, parsed, never evaluated.

:func:`moe_layer_pattern` turns the flag into one 0 (dense) or 1 (MoE) per layer; :func:`pattern_to_hf`
into Hugging Face's ``first_k_dense_replace`` and ``moe_layer_freq`` (a pattern that is not "k dense
layers, then every f-th" is refused).
"""
from __future__ import annotations

import re

from ..config import LIMITS, ConfigError, ascii_digits, parse_count, show

__all__ = ["moe_layer_pattern", "pattern_to_hf"]


# ------------------------------------------------------------------------------------------------
# --moe-layer-freq
# ------------------------------------------------------------------------------------------------
def moe_layer_pattern(text: str, num_layers: int) -> tuple[int, ...]:
    """``--moe-layer-freq`` as one 0 (dense) or 1 (MoE) per layer: an integer N (layer i is MoE when
    i % N == 0, ``gpt_layer_specs.py``) or a list expression of Megatron's restricted grammar
    (``megatron/training/arguments.py`` ``moe_freq_type``: ``[0]*3+[1]*58``, ``([1]*3+[0]*1)*3``, a
    plain list), parsed here and never evaluated.

    >>> moe_layer_pattern("([0]*1+[1]*3)", 4)
    (0, 1, 1, 1)
    >>> moe_layer_pattern("2", 5)
    (1, 0, 1, 0, 1)
    """
    name = "--moe-layer-freq"
    t = text.strip()
    if "[" not in t:
        try:
            n = parse_count(name, t, bound=LIMITS["moe_layer_freq"])
        except ConfigError:
            raise ConfigError(f"{name}={show(t)} must be a positive integer or a list expression such as "
                              f"([0]*3+[1]*58)") from None
        return tuple(1 if i % n == 0 else 0 for i in range(num_layers))
    if re.search(r"[^,0-9\[\]()+*]", t):
        raise ConfigError(f"{name}={show(t)}: a list expression may hold only digits, commas, [ ] ( ) + and * "
                          f"(Megatron-LM's rule; no spaces)")
    pattern = _ListExpr(t, name, limit=LIMITS["num_hidden_layers"]).parse()
    if any(x not in (0, 1) for x in pattern):
        raise ConfigError(f"{name}={show(t)}: every entry must be 0 (dense) or 1 (MoE)")
    if len(pattern) != num_layers:
        raise ConfigError(f"{name}={show(t)} gives {len(pattern)} layers but --num-layers={num_layers}")
    return tuple(pattern)


class _ListExpr:
    """expr := term ('+' term)*; term := factor ('*' INT)* | INT '*' factor; factor := '[' ints ']' | '(' expr ')'."""

    def __init__(self, text: str, name: str, limit: int):
        self.t, self.i, self.name, self.limit = text, 0, name, limit

    def _fail(self, what: str):
        raise ConfigError(f"{self.name}={show(self.t)}: {what} at character {self.i + 1}")

    def parse(self) -> list[int]:
        out = self.expr(0)
        if self.i != len(self.t):
            self._fail(f"unexpected {self.t[self.i]!r}")
        return out

    def _peek(self) -> str:
        return self.t[self.i] if self.i < len(self.t) else ""

    def _int(self) -> int:
        j = self.i
        while self.i < len(self.t) and ascii_digits(self.t[self.i]):
            self.i += 1
        if j == self.i or self.i - j > 6:
            self._fail("a number of at most 6 digits is expected")
        return parse_count(self.name, self.t[j:self.i], minimum=0)

    def _times(self, items: list[int], n: int) -> list[int]:
        if len(items) * n > self.limit:
            self._fail(f"the list grows past {self.limit:,} layers")
        return items * n

    def expr(self, depth: int) -> list[int]:
        if depth > 20:
            self._fail("parentheses nested too deeply")
        out = self.term(depth)
        while self._peek() == "+":
            self.i += 1
            out = out + self.term(depth)
            if len(out) > self.limit:
                self._fail(f"the list grows past {self.limit:,} layers")
        return out

    def term(self, depth: int) -> list[int]:
        if ascii_digits(self._peek()):              # N*[...]
            n = self._int()
            if self._peek() != "*":
                self._fail("'*' is expected after a repetition count")
            self.i += 1
            return self._times(self.factor(depth), n)
        out = self.factor(depth)
        while self._peek() == "*":
            self.i += 1
            out = self._times(out, self._int())
        return out

    def factor(self, depth: int) -> list[int]:
        c = self._peek()
        if c == "(":
            self.i += 1
            out = self.expr(depth + 1)
            if self._peek() != ")":
                self._fail("')' is expected")
            self.i += 1
            return out
        if c == "[":
            self.i += 1
            items: list[int] = []
            while self._peek() != "]":
                items.append(self._int())
                if self._peek() == ",":
                    self.i += 1
                elif self._peek() != "]":
                    self._fail("',' or ']' is expected")
            self.i += 1
            return items
        self._fail("'[' or '(' is expected")
        return []


def pattern_to_hf(pattern: tuple[int, ...]) -> tuple[int, int]:
    """``(first_k_dense_replace, moe_layer_freq)`` with Hugging Face's rule (layer i is MoE iff
    i >= k and i % f == 0) giving ``pattern``; a ConfigError when no pair does.

    >>> pattern_to_hf((0, 0, 0, 1, 1, 1))
    (3, 1)
    >>> pattern_to_hf((1, 0, 1, 0))
    (0, 2)
    """
    n = len(pattern)
    ones = [i for i, x in enumerate(pattern) if x]
    if not ones:
        return n, 1
    k = ones[0]
    candidates = [ones[1] - ones[0]] if len(ones) > 1 else [f for f in (k, n) if f >= 1]
    for f in candidates:
        if all(bool(x) == (i >= k and i % f == 0) for i, x in enumerate(pattern)):
            return k, f
    text = "".join(map(str, pattern))
    raise ConfigError(f"--moe-layer-freq={show(text, 80)} (1: MoE) is a layer pattern memlib cannot "
                      f"express: it needs k dense layers, then MoE on every f-th layer (first_k_dense_replace, "
                      f"moe_layer_freq)")
