"""The README is a front door: the two commands first, the figure memlib draws today, a few commands, links to
the references (which exist), and no reference material or measured figure of its own."""
import os
import re
from pathlib import Path

from memlib.report import readme

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")

#: a duration typed into prose: "0.7-1.0 s", "about 6 s", "45 s", "13.3 s wall", "0.96 ms", "2 minutes"
TIMING = re.compile(r"\b\d+(?:[.,]\d+)*(?:\s*[-–]\s*\d+(?:[.,]\d+)*)?\s*(?:ms|µs|s|sec|seconds?|min|minutes?|hours?)"
                    r"(?![-\w=])")


def test_readme_figure_is_current(tmp_path, monkeypatch):
    # the figure needs the book's matplotlib: skipped without it, except in CI (`make venv` installs it)
    if os.environ.get("CI", "").lower() not in ("1", "true"):
        import pytest

        pytest.importorskip("matplotlib", reason="matplotlib (the book extra) is not installed")
    # for this test only: a backend left in os.environ would reach a book built later in this process
    # (tests/book/test_book_reproducible.py), whose execution key includes MPLBACKEND: it would execute the
    # chapters again under Agg, which shows no figure
    monkeypatch.setenv("MPLBACKEND", os.environ.get("MPLBACKEND", "Agg"))
    fresh = readme.write(tmp_path / "figure.png")
    assert fresh.read_bytes() == readme.FIGURE.read_bytes(), (
        "docs/readme-figure.png is stale: run `make readme-figure` and commit it")


def test_readme_first_lines_are_the_two_commands():
    block = re.search(r"```\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make book", "make test"]
    assert README.index("make book") < 400
    assert "docs/readme-figure.png" in README
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("book", "test", "test-fast", "lint", "pdf", "bench", "readme-figure"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    for target in re.findall(r"`make ([\w-]+)", README):
        assert re.search(rf"^{target}:", makefile, re.M), f"the README names `make {target}`, which is no target"


def test_readme_is_short_and_points_to_the_references():
    lines = README.splitlines()
    assert len(lines) <= 120, f"the README has {len(lines)} lines: reference material goes to docs/"
    assert "| option |" not in README and "--transformer-impl" not in README, "the CLI reference is docs/cli.md"
    assert "docs/cli.md" in README
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        assert (ROOT / target).exists(), f"the README links {target}, which does not exist"


def test_the_readme_commands_parse():
    from memlib.cli.parser import _parser

    block = README[README.index("## Three commands"):]
    block = re.search(r"```\n(.*?)```", block, re.S).group(1)
    commands = [line.split() for line in block.splitlines() if line.startswith("memlib ")]
    assert len(commands) == 3
    for argv in commands:
        _parser().parse_args(argv[1:])


def test_no_typed_timings_in_the_readmes():
    """Durations are measured by the benchmarks, which write them to benchmarks/results/; the READMEs link there."""
    for name in ("README.md", "benchmarks/README.md", "docs/cli.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        prose = re.sub(r"```.*?```", " ", text, flags=re.S)
        found = TIMING.findall(prose)
        assert not found, f"{name} types timings {found[:5]}: link benchmarks/results/ instead"


def test_the_timing_pattern_finds_typed_timings():
    typed = ("answers in about 0.7-1.0 s from a shell", "a clean build takes about 45 s", "13.3 s wall (9.1 s CPU)",
             "after the first call: 0.96 ms", "in 2 minutes")
    assert all(TIMING.search(t) for t in typed)
    assert not any(TIMING.search(t) for t in ("2^30 bytes", "80GB", "DP32, TP2", "Python 3.11", "--top 10",
                                               "section 6's overheads", "ZeRO-1 (os)", "b=1, s=4096"))
