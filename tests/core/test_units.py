"""memlib.core.units: exact conversions, display rounding and the parsers, on hand-worked values."""
from fractions import Fraction

import pytest

from hypothesis import example, given
from hypothesis import strategies as st

from memlib.core.units import fmt_billions, fmt_bytes, fmt_count, fmt_decimal, parse_bytes, parse_number, to_unit


def test_binary_and_decimal_units_differ():
    # 80 GiB is 85.9 GB; 80 GB is 74.5 GiB
    assert fmt_bytes(80 * 1_073_741_824, "GB", 1) == "85.9 GB"
    assert fmt_bytes(80_000_000_000, "GiB", 1) == "74.5 GiB"


def test_to_unit_is_exact():
    assert to_unit(3_221_225_472, "GiB") == 3                          # 3 x 1024^3
    assert to_unit(3_221_225_472, "MiB") == 3072 and to_unit(2**40, "TiB") == 1
    assert to_unit(2**40, "TB") == Fraction(1_099_511_627_776, 10**12)   # a TiB is 1.0995 TB
    assert to_unit(1_500_000_000, "GB") == Fraction(3, 2)
    assert to_unit(1, "KiB") == Fraction(1, 1024)


@pytest.mark.parametrize("x, digits, text", [
    (Fraction(5, 2), 0, "3"),              # half away from zero, not to even
    (Fraction(7, 2), 0, "4"),
    (Fraction(-5, 2), 0, "-3"),
    (Fraction(-1, 1000), 2, "0.00"),        # no "-0.00"
    (Fraction(1_234_567, 1000), 2, "1,234.57"),
    (Fraction(1, 8), 2, "0.13"),            # 0.125 -> 0.13
    (Fraction(2, 3), 4, "0.6667"),
    (Fraction(10**12), 0, "1,000,000,000,000"),
])
def test_fmt_decimal_rounds_half_away_from_zero(x, digits, text):
    assert fmt_decimal(x, digits) == text


def test_counts_and_billions():
    assert fmt_count(1_000) == "1,000" and fmt_count(0) == "0"
    assert fmt_billions(671_026_404_352) == "671.03B"
    assert fmt_billions(37_000_000_000, 0) == "37B"
    assert fmt_bytes(1536, "KiB", 1, with_unit=False) == "1.5"


@pytest.mark.parametrize("text, n", [
    ("80GB", 80_000_000_000), ("80 GiB", 85_899_345_920), ("1.5KiB", 1536), ("1e3", 1000), ("4096", 4096),
    ("512B", 512), ("0.5 MiB", 524_288), ("2TB", 2_000_000_000_000),
])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text, needle", [
    ("0.5B", "whole number of bytes"), ("0GB", "positive"), ("-1GB", "cannot read"), ("80XB", "cannot read"),
    ("GB", "cannot read"), ("1_000", "cannot read"),
])
def test_parse_bytes_refuses(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_bytes(text)


def test_parse_bytes_bounds_the_size():
    assert parse_bytes("1TiB", maximum=2**40) == 2**40
    with pytest.raises(ValueError, match=r"exceeds 2\^40 bytes"):
        parse_bytes("2TiB", maximum=2**40)


def test_parse_number_is_exact_and_bounded():
    assert parse_number("0.1") == Fraction(1, 10) and parse_number(".5") == Fraction(1, 2)
    assert parse_number("1.5e9") == 1_500_000_000 and parse_number("25e-2") == Fraction(1, 4)
    for bad in ("inf", "nan", "-1", "1_0", "0x10", "1" * 41, "1e31", ""):
        with pytest.raises(ValueError):
            parse_number(bad)


@given(st.fractions(min_value=-10**6, max_value=10**6, max_denominator=10**4), st.integers(0, 4))
@example(Fraction(5, 2), 0).via("a tie: 3, not 2")
@example(Fraction(-1, 8), 2).via("a tie: -0.13")
@example(Fraction(45, 100), 1).via("a tie where rounding to even would give 0.4")
def test_fmt_decimal_is_the_nearest_decimal_ties_away_from_zero(x, digits):
    """The printed number differs from x by at most half a unit of its last digit; at exactly half, it is
    the one further from zero."""
    y = Fraction(fmt_decimal(x, digits).replace(",", ""))
    half = Fraction(1, 2 * 10**digits)
    assert abs(y - x) <= half
    if abs(y - x) == half:
        assert abs(y) > abs(x)


def test_parse_number_reads_a_ratio():
    assert parse_number("1/20") == Fraction(1, 20) and parse_number("3/0.5") == 6
    with pytest.raises(ValueError, match="zero denominator"):
        parse_number("1/0")
    with pytest.raises(ValueError, match="exponent beyond ±30"):
        parse_number("1e31")
