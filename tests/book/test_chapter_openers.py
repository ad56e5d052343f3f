"""Every chapter opens the same way (issue 14): the title; a paragraph "**What this chapter answers.**";
an answer box (``:::{admonition} The answer``) whose result is glued from memlib; the configuration
cell, which says how to rerun the chapter; then the sections. Source-level: reads notebooks/*.md.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md"))
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", re.S | re.M)
BOX = re.compile(r"^:::\{admonition\} The answer\n(.*?)^:::$", re.S | re.M)


def opener_problems(text: str, stem: str) -> list[str]:
    """What is missing or out of order in the opener of one chapter's source (empty if nothing)."""
    title = re.search(r"^# \S", text, re.M)
    if not title:
        return ["no title"]
    first_section = re.search(r"^## ", text[title.start():], re.M)
    head = text[title.start(): title.start() + first_section.start()] if first_section else text[title.start():]
    problems = []
    # the first prose after the title (code cells and labels aside) is the question
    prose = CELL.sub("", head.split("\n", 1)[1])
    first = next((line for line in prose.splitlines() if line.strip() and not re.match(r"^\(.*\)=$", line)), "")
    if not first.startswith("**What this chapter answers.**"):
        problems.append(f"the first paragraph is not '**What this chapter answers.**' but {first[:60]!r}")
    box = BOX.search(head)
    if not box:
        problems.append("no answer box ':::{admonition} The answer' before the first section")
    elif "{glue:" not in box.group(1):
        problems.append("the answer box glues nothing from memlib")
    config = [m for m in CELL.finditer(head) if "# The configuration of this chapter" in m.group(1)]
    if not config:
        problems.append("no configuration cell before the first section")
    else:
        cell = config[0]
        if ":tags: [hide-input]" not in cell.group(1):
            problems.append("the configuration cell is not shown (hide-input)")
        if box and cell.start() < box.end():
            problems.append("the configuration cell comes before the answer box")
        for needed in (f"make rerun CHAPTER={stem}", "make lab", "MODEL="):
            if needed == "MODEL=" and "BOOK_MODEL" not in cell.group(1):
                continue                      # a chapter with no model to change (measured runs)
            if needed not in cell.group(1):
                problems.append(f"the configuration cell does not say {needed!r}")
        # nothing the chapter glues is computed before its configuration
        before = [m for m in CELL.finditer(head) if m.start() < cell.start() and "glue" in m.group(1)
                  and "import" not in m.group(1)]
        if before:
            problems.append("a cell glues values before the configuration cell")
    return problems


def test_every_chapter_is_checked():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(1, len(NOTEBOOKS) + 1)]
    assert len(NOTEBOOKS) >= 14


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_chapter_opener(path: Path):
    assert opener_problems(path.read_text(encoding="utf-8"), path.stem) == []


GOOD = """# Title

```{code-cell} ipython3
:tags: [remove-cell]

from memlib.report import ch99 as ch
```

**What this chapter answers.** A question?

:::{admonition} The answer
:class: important

It is {glue:text}`x_answer`.
:::

```{code-cell} ipython3
:tags: [hide-input]

# The configuration of this chapter: `make rerun CHAPTER=99_x`, `make lab`, `MODEL=...`.
MODEL = load_model(BOOK_MODEL)
```

## First section
"""


def test_the_check_accepts_the_opener_and_sees_each_fault():
    assert opener_problems(GOOD, "99_x") == []
    assert opener_problems(GOOD.replace("**What this chapter answers.** A question?", "A question?"), "99_x")
    assert opener_problems(GOOD.replace("It is {glue:text}`x_answer`.", "It is big."), "99_x")
    assert opener_problems(GOOD.replace("The answer", "Takeaway"), "99_x")
    assert opener_problems(GOOD.replace("# The configuration of this chapter", "# setup"), "99_x")
    assert opener_problems(GOOD.replace("`make rerun CHAPTER=99_x`, ", ""), "99_x")
    assert opener_problems(GOOD.replace("`MODEL=...`", ""), "99_x")
    moved = GOOD.replace("## First section\n", "").replace("**What", "## First section\n\n**What")
    assert opener_problems(moved, "99_x")


def test_every_chapter_of_the_argument_ends_with_a_worked_problem_glued_from_memlib():
    """Chapters 1-13 each pose a practitioner's question and answer it in a dropdown with glued values (issue 24:
    chapter 12 had none); the errata chapter is reference, not argument."""
    missing = {}
    for path in sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[01]*.md")):
        if path.stem.startswith("14_"):
            continue
        text = path.read_text(encoding="utf-8")
        section = text.split("\n## Worked problem", 1)[1] if "\n## Worked problem" in text else ""
        answer = re.split(r"```\{dropdown\} Answer|:::\{admonition\} Answer\n:class: dropdown", section, maxsplit=1)
        if "**Problem" not in section or len(answer) < 2 or "{glue:" not in answer[1]:
            missing[path.stem] = "no problem" if "**Problem" not in section else "no answer with a glued value"
    assert not missing, missing
