"""Every numbered equation of the book is rendered from the formula registry, under its number.

Parses the chapters in the table of contents' order: each ``{glue:math}`` directive must glue the
key of a registry formula (``eq_<name>``) under that formula's label (``eq-<name>``), and the
formulas of a chapter must come in the order of their numbers in the registry (chapter N's k-th
equation is N.k), so that ``memlib formula --list`` gives each equation's number in the book.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from memlib.formulas import FORMULAS, book_formulas
from memlib.report.glue import equation_key, equation_label

ROOT = Path(__file__).resolve().parents[2]
DIRECTIVE = re.compile(r"```\{glue:math\} (\S+)\n:label: (\S+)")


def chapters() -> list[Path]:
    """The book's chapters in the table of contents' order, across its parts."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [ROOT / (c["file"] + ".md") for part in toc["parts"] for c in part["chapters"]]


def test_every_book_equation_is_a_registry_formula_under_its_number():
    by_key = {equation_key(f.name): f for f in FORMULAS.values()}
    seen = []
    for number, path in enumerate(chapters(), start=1):
        found = DIRECTIVE.findall(path.read_text(encoding="utf-8"))
        for k, (key, label) in enumerate(found, start=1):
            assert key in by_key, f"{path.name}: {key} is not a registry formula's key"
            f = by_key[key]
            assert label == equation_label(f.name), (path.name, key, label)
            assert f.number == f"{number}.{k}", f"{path.name}: {f.name} is ({number}.{k}) in the book, not {f.number}"
            seen.append(f.name)
    assert seen == [f.name for f in book_formulas()], "a numbered formula the book does not display"


def test_the_glue_calls_glue_every_displayed_formula():
    """Each chapter glues the formulas it displays through glue_equations (one source)."""
    for path in chapters():
        text = path.read_text(encoding="utf-8")
        keys = {key for key, _ in DIRECTIVE.findall(text)}
        glued = set()
        for call in re.findall(r"glue_equations\(\[(.*?)\]", text, re.S):
            glued |= {equation_key(n) for n in re.findall(r'"([a-z0-9_.]+)"', call)}
        assert keys <= glued, (path.name, keys - glued)
        assert "glue_math(" not in text, f"{path.name} glues an equation by hand"


def test_no_display_equation_is_built_outside_the_registry():
    """A displayed equation is a registry formula glued with glue_equations; no report module builds a ``$$``
    block for glue_md (which the checks above would not see)."""
    for path in sorted((ROOT / "memlib" / "report").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name == "format.py":      # display_math sets a registry equation (the summary's list) in $$
            text = text.replace('f"$$\\n{latex}\\n$$"', "")
        assert "$$" not in text, f"{path.name} builds a display equation by hand"
