"""The README's rerun steps work as written: ``make rerun CHAPTER=...`` executes a chapter and the
executed notebook shows every value the chapter glues; ``make lab`` has JupyterLab with jupytext
(the chapters are MyST markdown) in the virtual environment."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BIN = ROOT / ".venv" / "bin"
VISIBLE = ("text/markdown", "text/latex", "image/png", "text/html")


def readme_command(target: str) -> list[str]:
    """The README's ``make <target> ...`` line of the rerun section, split into arguments."""
    section = README[README.index("## Rerun a chapter"):]
    line = re.search(rf"^make {target}\b[^#\n]*", section, re.M)
    assert line, f"the README's rerun section shows no 'make {target}'"
    return line.group(0).split()


def test_the_readme_names_the_targets_of_the_makefile():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("book", "rerun", "lab"):
        assert re.search(rf"^{target}:", makefile, re.M)
        readme_command(target)


@pytest.mark.skipif(not (BIN / "jupytext").exists(), reason="no .venv (make venv)")
def test_make_rerun_as_the_readme_writes_it_shows_every_glued_value(tmp_path):
    cmd = readme_command("rerun")
    chapter = dict(a.split("=", 1) for a in cmd if "=" in a)["CHAPTER"]
    out = ROOT / "_build" / "rerun" / f"{chapter}.ipynb"
    out.unlink(missing_ok=True)
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    nb = json.loads(out.read_text(encoding="utf-8"))
    glued = shown = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or not re.search(r"^\s*glue\w*\(", "".join(cell["source"]), re.M):
            continue
        outputs = cell.get("outputs", [])
        visible = " ".join(str(o["data"][k]) if isinstance(o["data"][k], str) else "".join(o["data"][k])
                           for o in outputs for k in o.get("data", {}) if k in VISIBLE)
        assert visible, f"a glue cell shows nothing: {''.join(cell['source'])[:80]}"
        for o in outputs:
            rec = o.get("data", {}).get("application/papermill.record/text/plain")
            if rec is None:
                continue
            glued += 1
            text = rec if isinstance(rec, str) else "".join(rec)
            value = text[1:-1] if text[:1] in "'\"" and text[-1:] == text[:1] else text
            value = value.replace("\\\\", "\\").replace("\\'", "'")
            assert value in visible, f"glued but not shown: {value[:80]!r}"
            shown += 1
    assert glued >= 20 and shown == glued


def test_make_rerun_without_a_chapter_names_the_chapters():
    run = subprocess.run(["make", "-s", "rerun", "CHAPTER=no_such_chapter"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode != 0
    assert "05_zero" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.skipif(not (BIN / "jupyter").exists(), reason="no .venv (make venv)")
def test_make_lab_has_jupyterlab_with_jupytext():
    assert (BIN / "jupyter-lab").exists()
    run = subprocess.run([str(BIN / "jupyter"), "server", "extension", "list"], capture_output=True, text=True,
                         timeout=120)
    assert re.search(r"jupytext\S*\s+(\x1b\[\d+m)?enabled", run.stdout + run.stderr)


def lab_command(uid: int) -> list[str]:
    """The command ``make lab`` runs for a user of id ``uid`` (``make -n``: nothing is started)."""
    run = subprocess.run(["make", "-s", "-n", "-o", ".venv/.stamp", "lab", f"LAB_UID={uid}"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    line = next(x for x in run.stdout.splitlines() if "jupyter-lab" in x)
    return line.split()[line.split().index(next(a for a in line.split() if a.endswith("jupyter-lab"))):]


def test_make_lab_allows_root_and_only_root():
    """jupyter-lab refuses to run as root (a container's user) unless given --allow-root."""
    assert "--allow-root" in lab_command(0)
    assert "--allow-root" not in lab_command(1000)
    assert "--notebook-dir=notebooks" in lab_command(1000)


@pytest.mark.skipif(not (BIN / "jupyter-lab").exists(), reason="no .venv (make venv)")
def test_make_lab_command_is_accepted_by_jupyterlab():
    """The command line ``make lab`` builds for this user, with --show-config: jupyter-lab parses it and prints
    its configuration without starting a server."""
    cmd = lab_command(os.getuid())
    run = subprocess.run([str(ROOT / cmd[0]), *cmd[1:], "--show-config"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert ".root_dir = 'notebooks'" in run.stdout
    assert (".allow_root = True" in run.stdout) == (os.getuid() == 0)
