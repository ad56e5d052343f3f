"""A non-editable install works: the wheel holds every file of the package, and memlib installed from it (not
from this checkout) reads its data (presets, the functional tests' goldens, the GPU runs) through the package."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    # built from a copy: a build writes build/ and *.egg-info beside the sources
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "memlib", src / "memlib", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(src)], check=True, capture_output=True, text=True)
    return next(out.glob("memlib-*.whl"))


def test_the_wheel_holds_every_file_of_the_package(wheel):
    shipped = set(zipfile.ZipFile(wheel).namelist())
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "memlib").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    assert files - shipped == set()


def test_memlib_installed_from_the_wheel_reads_its_data(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True)
    probe = ("import memlib, pathlib; from memlib import load_model; "
             "from memlib.data.functional_tests import goldens; from memlib.scenarios.gpu_steps import GPU_STEPS; "
             "from memlib.data.reference import MEGATRON_RUNS; "
             "assert pathlib.Path(memlib.__file__).is_relative_to(pathlib.Path(r'%s')); "
             "print(load_model('deepseek-v3').num_hidden_layers, len(goldens()) > 0, GPU_STEPS.is_file(), "
             "len(MEGATRON_RUNS) > 0)" % target)
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["61", "True", "True", "True"]
