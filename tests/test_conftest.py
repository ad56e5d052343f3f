"""The slow lists of tests/conftest.py name tests and fixtures that exist (a renamed test would silently join
the inner loop otherwise)."""
import re
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent


def test_every_slow_module_exists():
    assert all((TESTS / m).is_file() for m in conftest.SLOW_MODULES), conftest.SLOW_MODULES


def test_every_slow_test_exists():
    for entry in conftest.SLOW_TESTS:
        module, function = entry.split("::")
        text = (TESTS / module).read_text(encoding="utf-8")
        assert re.search(rf"^def {function}\(", text, re.M), entry


def test_every_slow_fixture_exists():
    found = set()
    for path in TESTS.glob("test_*.py"):
        found |= set(re.findall(r"@pytest\.fixture[^\n]*\ndef (\w+)\(", path.read_text(encoding="utf-8")))
    assert conftest.SLOW_FIXTURES <= found, conftest.SLOW_FIXTURES - found
