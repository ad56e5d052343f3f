"""docs/cli.md's option tables are the argument parser's: regenerated, the file does not change, and a new
option makes it stale."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from memlib.cli import doc
from memlib.cli.parser import _parser

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


def test_docs_cli_is_what_the_parser_gives():
    assert doc.render(TEXT) == TEXT, "docs/cli.md is stale: run `python -m memlib.cli.doc` and commit it"


def test_every_option_of_every_command_is_documented():
    tables = {m.group(1): m.group(2) for m in re.finditer(r"<!-- generated: ([\w-]+) -->\n(.*?)<!-- end generated",
                                                           TEXT, re.S)}
    for name, sub in doc.subcommands().items():
        assert f"[`memlib {name}`]" in tables["commands"]
        documented = set(re.findall(r"^\| `(-[-\w]+|\w+)", tables[name], re.M))
        given = {a.option_strings[0] if a.option_strings else a.dest for a in sub._actions if a.dest != "help"}
        assert documented == given, (name, documented ^ given)


def test_a_new_option_makes_the_reference_stale():
    p = _parser()
    doc.subcommands(p)["estimate"].add_argument("--new-knob", type=int, default=3, help="a knob nobody documented")
    again = doc.render(TEXT, p)
    assert again != TEXT and "| `--new-knob NEW_KNOB` | `3` | a knob nobody documented |" in again


def test_a_command_without_a_block_is_refused():
    text = TEXT.replace("<!-- generated: plan -->", "<!-- plan -->")
    with pytest.raises(KeyError, match="no generated block for plan"):
        doc.render(text)


def test_the_check_mode_exits_1_on_a_stale_file(tmp_path):
    stale = tmp_path / "cli.md"
    stale.write_text(TEXT.replace("| `--json` |", "| `--jsn` |", 1), encoding="utf-8")
    assert doc.main(["--check", "--path", str(stale)]) == 1
    assert doc.main(["--path", str(stale)]) == 0 and stale.read_text(encoding="utf-8") == TEXT
