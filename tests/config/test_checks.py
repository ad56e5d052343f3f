"""memlib.config.checks: the one integer check and the one integer parser every input goes through, and the
shortened value an error message shows.  Each case is an input and the one line it must give."""
from __future__ import annotations

import pytest

from memlib.config.checks import ConfigError, ascii_digits, check_count, parse_count, show


@pytest.mark.parametrize("value, kw, message", [
    (0, {}, "n=0 must be a positive integer"),
    (-3, dict(minimum=0), "n=-3 must be an integer >= 0"),
    (True, {}, "n=True must be a positive integer"),                  # a bool is not a count
    (2.0, {}, "n=2.0 must be a positive integer"),                    # nor is a float, even a whole one
    ("4", {}, "n='4' must be a positive integer"),                    # nor text
    (None, {}, "n=None must be a positive integer"),
    (0, dict(nullable=True), "n=0 must be a positive integer or null"),
    (1025, dict(bound=1024), "n=1025 exceeds 2\\^10, the largest memlib accepts"),
    (1001, dict(bound=1000), "n=1001 exceeds 1,000, the largest"),   # a bound that is no power of two
])
def test_check_count_refuses_with_one_line(value, kw, message):
    with pytest.raises(ConfigError, match=message) as e:
        check_count("n", value, **kw)
    assert "\n" not in str(e.value)


def test_check_count_accepts_its_range():
    assert check_count("n", 1) == 1 and check_count("n", 1024, bound=1024) == 1024
    assert check_count("n", 0, minimum=0) == 0 and check_count("n", None, nullable=True) is None


@pytest.mark.parametrize("text, kw, value", [
    ("7", {}, 7), (" 12 ", {}, 12), ("+5", {}, 5), ("0", dict(minimum=0), 0), ("-2", dict(minimum=-4), -2),
    ("00010", {}, 10), ("1" + "0" * 19, {}, 10**19),                  # 20 digits: the most read
])
def test_parse_count_reads_plain_digits(text, kw, value):
    assert parse_count("n", text, **kw) == value


@pytest.mark.parametrize("text, kw, message", [
    ("0", {}, "n=0 must be a positive integer"),
    ("-1", dict(minimum=0), "n=-1 must be an integer >= 0"),          # a negative value named as such
    ("2.5", {}, "n='2.5' must be a positive integer \\(ASCII digits\\)"),
    ("1e3", {}, "n='1e3' must be a positive integer"),
    ("1_000", {}, "n='1_000' must be a positive integer"),
    ("\u0663", {}, "must be a positive integer \\(ASCII digits\\)"),  # Arabic-Indic three: int() would read it
    ("\uff11", {}, "must be a positive integer \\(ASCII digits\\)"),  # fullwidth one
    ("", {}, "n='' must be a positive integer"),
    ("1" * 21, {}, "has 21 digits, more than any size memlib accepts"),
    ("65", dict(bound=64), "n=65 exceeds 2\\^6, the largest memlib accepts"),
    (7, {}, "n=7 must be an integer written in digits"),             # not text at all
])
def test_parse_count_refuses_with_one_line(text, kw, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse_count("n", text, **kw)
    assert "\n" not in str(e.value)


def test_ascii_digits_only():
    assert ascii_digits("0123456789")
    assert not any(ascii_digits(t) for t in ("", "²", "\u0661", "\uff11", "1 ", "-1", "1.0"))


def test_show_shortens_a_long_value():
    assert show(12) == "12" and show("ab") == "'ab'"
    # 50 characters of repr (48 letters and 2 quotes) at the limit 40: 39 of them, an ellipsis, the length
    assert show("x" * 48) == "'" + "x" * 38 + "…" + " (50 characters)"
    assert show(2**200) == "<an integer of 201 bits>"                 # never printed in full
    assert show(2**127) == str(2**127)                                  # 128 bits: still printed
