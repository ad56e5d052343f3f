"""Units of memory, formatted once.

Binary (IEC) and decimal (SI) units are different: 1 GiB = 2**30 bytes, 1 GB = 10**9 bytes.
memlib keeps bytes as exact integers and converts only for display, with the unit always named.
A table uses one unit family throughout.

>>> fmt_bytes(12_500_729_856, "GiB")
'11.64 GiB'
>>> fmt_bytes(12_500_729_856, "GB")
'12.50 GB'
>>> fmt_count(671_026_404_352)
'671,026,404,352'
"""
from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["KiB", "MiB", "GiB", "UNITS", "to_unit", "fmt_bytes", "fmt_count", "fmt_billions", "fmt_decimal", "parse_bytes", "parse_number"]

#: the binary units, bytes
KiB, MiB, GiB = 2**10, 2**20, 2**30

#: bytes per unit, exact
UNITS: dict[str, int] = {
    "B": 1,
    "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": 2**40,
    "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}


def to_unit(n_bytes: int, unit: str = "GiB") -> Fraction:
    """Exact value of ``n_bytes`` in ``unit``."""
    return Fraction(int(n_bytes), UNITS[unit])


def fmt_decimal(x: Fraction, digits: int) -> str:
    """Round half away from zero to ``digits`` decimals, exactly, and format (display only)."""
    scale = 10**digits
    q = abs(x) * scale
    r = int(q) + (1 if q - int(q) >= Fraction(1, 2) else 0)
    sign = "-" if x < 0 and r else ""
    whole, frac = divmod(r, scale)
    body = f"{whole:,}"
    return sign + (body + "." + str(frac).zfill(digits) if digits else body)


def fmt_bytes(n_bytes: int, unit: str = "GiB", digits: int = 2, with_unit: bool = True) -> str:
    """``n_bytes`` formatted in ``unit`` (``"GiB"`` or ``"GB"`` ...), rounded for display only."""
    s = fmt_decimal(to_unit(n_bytes, unit), digits)
    return f"{s} {unit}" if with_unit else s


def fmt_count(n: int) -> str:
    """An exact integer with thousands separators."""
    return f"{int(n):,}"


def fmt_billions(n: int, digits: int = 2) -> str:
    """A count in billions, e.g. ``'671.03B'``."""
    return fmt_decimal(Fraction(int(n), 10**9), digits) + "B"


#: a plain decimal number: digits, an optional fraction and an optional exponent (no sign, no
#: underscores, no infinities); its length and exponent are bounded before it is converted, so a
#: number with thousands of digits is refused at once instead of being built
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
MAX_NUMBER_CHARS = 40
MAX_EXPONENT = 30


def parse_number(text: str) -> Fraction:
    """An exact, non-negative decimal number (``"0.1"``, ``"80"``, ``"1.5e9"``) or a ratio of two (``"1/20"``, as
    memlib writes a fraction in its JSON), bounded: at most 40 characters and exponents of at most 30, so that no
    input takes long to read."""
    t = text.strip()
    num, slash, den = t.partition("/")
    if slash and len(t) <= MAX_NUMBER_CHARS:
        q = parse_number(den)
        if q == 0:
            raise ValueError("has a zero denominator")
        return parse_number(num) / q
    if len(t) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(t):
        raise ValueError("is not a plain decimal number or ratio of at most 40 characters (e.g. 80, 0.1, 1.5e9, "
                         "1/20)")
    mantissa, _, exp = t.lower().partition("e")
    if exp and abs(int(exp)) > MAX_EXPONENT:
        raise ValueError(f"has an exponent beyond ±{MAX_EXPONENT}")
    return Fraction(t)


def parse_bytes(text: str, maximum: int = 2**60) -> int:
    """Parse ``"80GiB"``, ``"80 GB"``, ``"1234"`` into bytes (exact; decimals allowed; at most
    ``maximum`` bytes)."""
    t = text.strip().replace(" ", "")
    for unit in sorted(UNITS, key=len, reverse=True):
        if t.endswith(unit) and unit != "B":
            num = t[: -len(unit)]
            break
    else:
        unit, num = "B", t[:-1] if t.endswith("B") else t
    try:
        value = parse_number(num) * UNITS[unit]
    except ValueError:
        raise ValueError("cannot read a memory size from it (e.g. 80GiB, 80GB)") from None
    if value <= 0 or value.denominator != 1:
        raise ValueError("must be a positive whole number of bytes")
    if value > maximum:
        raise ValueError(f"exceeds 2^{maximum.bit_length() - 1} bytes, the largest memlib accepts")
    return int(value)
