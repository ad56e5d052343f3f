"""The README's figure is what memlib draws today, byte for byte, and the README's commands exist."""
import os
import re
from pathlib import Path

from memlib.report import readme

ROOT = Path(__file__).resolve().parents[1]


def test_readme_figure_is_current(tmp_path):
    # the figure needs the book's matplotlib: skipped without it, except in CI (`make venv` installs it)
    if os.environ.get("CI", "").lower() not in ("1", "true"):
        import pytest

        pytest.importorskip("matplotlib", reason="matplotlib (the book extra) is not installed")
    os.environ.setdefault("MPLBACKEND", "Agg")
    fresh = readme.write(tmp_path / "figure.png")
    assert fresh.read_bytes() == readme.FIGURE.read_bytes(), (
        "docs/readme-figure.png is stale: run `make readme-figure` and commit it")


def test_readme_first_lines_are_the_two_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make book", "make test"]
    assert text.index("make book") < 400
    assert "docs/readme-figure.png" in text
    makefile = (ROOT / "Makefile").read_text()
    for target in ("book", "test", "pdf", "bench", "readme-figure"):
        assert re.search(rf"^{target}:", makefile, re.M), target
