"""The slow lists of tests/conftest.py name tests and fixtures that exist (a renamed test would silently join
the inner loop otherwise), and the file names they key on are unique across the test folders."""
import re
from collections import Counter
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent
#: every test module, by the file name the slow lists use
MODULES = {p.name: p for p in TESTS.rglob("test_*.py")}


def test_every_test_module_name_is_unique():
    counts = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [name for name, n in counts.items() if n > 1], counts.most_common(3)


def test_every_slow_module_exists():
    assert conftest.SLOW_MODULES <= MODULES.keys(), conftest.SLOW_MODULES - MODULES.keys()


def test_every_slow_test_exists():
    for entry in conftest.SLOW_TESTS:
        module, function = entry.split("::")
        text = MODULES[module].read_text(encoding="utf-8")
        assert re.search(rf"^def {function}\(", text, re.M), entry


def test_every_slow_fixture_exists():
    found = set()
    for path in MODULES.values():
        found |= set(re.findall(r"@pytest\.fixture[^\n]*\ndef (\w+)\(", path.read_text(encoding="utf-8")))
    assert conftest.SLOW_FIXTURES <= found, conftest.SLOW_FIXTURES - found


def test_every_test_folder_is_importable():
    """A test module imports another by its file name from any folder (conftest.TEST_FOLDERS on sys.path)."""
    import sys
    assert {p.parent for p in MODULES.values()} <= {Path(s) for s in sys.path if s}
