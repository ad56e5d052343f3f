"""Megatron-LM's functional tests that log ``mem-max-allocated-bytes``: memlib's validation set, as the files hold it.

``functional_tests.json.gz`` is written by ``tools/functional_tests.py`` from a Megatron-LM mirror at the commit
memlib pins (:data:`memlib.config.versions.MEGATRON_COMMIT`): every test directory under ``tests/functional_tests/test_cases/``
whose golden values log the allocator's peak, with its ``model_config.yaml`` (``MODEL_ARGS`` and ``ENV_VARS``),
the recipe entries that list it, and per golden-values file the memory metrics per logged step, the commit that
wrote those values (and the test's ``model_config.yaml`` then, where it differs), the NGC PyTorch container the CI
image was built on then, and the world size (a recipe's nodes x gpus, the test's directory name when the values
were written, or ``None``: no recipe gives it).

:func:`functional_tests` reads it once.  :func:`goldens` flattens it into one :class:`Golden` per file: the
values are exact integers (``None`` where a file has ``"nan"``); the steady peak is the maximum at the third
logged iteration, or for fp16 runs with a dynamic loss scale (whose first steps are skipped) the first one after
Adam's moments were created.  Nothing here interprets the runs: :mod:`memlib.scenarios.measured` predicts them.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

__all__ = ["FUNCTIONAL_TESTS_FILE", "PLATFORMS", "Golden", "functional_tests", "goldens",
           "exact"]

FUNCTIONAL_TESTS_FILE = Path(__file__).with_name("functional_tests.json.gz")

#: GPU platform of a golden-values file name -> (GPU, CUDA compute capability major)
PLATFORMS = {
    "dgx_a100": ("A100", 8), "dgxa100_dracooci": ("A100", 8), "dgxa100_dracooci-ord": ("A100", 8),
    "dgx_h100": ("H100", 9), "dgxh100_dgxc": ("H100", 9), "dgx_gb200": ("GB200", 10),
}


def exact(value) -> Optional[int]:
    """A logged value of integer value as an ``int`` (``None`` for ``"nan"``); anything else is an error."""
    if isinstance(value, str):
        if value.lower() == "nan":
            return None
        raise ValueError(f"unexpected entry {value!r}")
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return int(value)           # a float of integer value is that integer exactly
    raise ValueError(f"{value!r} is not an integer")


@lru_cache(maxsize=1)
def functional_tests() -> dict:
    """The whole file (``tests``: ``<folder>/<name>`` -> test)."""
    with gzip.open(FUNCTIONAL_TESTS_FILE, "rt", encoding="utf-8") as fh:
        return json.load(fh)


@dataclass(frozen=True)
class Golden:
    """One golden-values file of one test: what ran and what it logged on the last global rank."""

    key: str                      #: ``<folder>/<test>``
    folder: str
    test: str
    file: str                     #: ``golden_values_<environment>_<platform>[_2nd].json``
    environment: str              #: ``dev`` or ``lts`` (the CI container)
    platform: str
    second_run: bool              #: the resumed half of a checkpoint-resume test
    test_type: str
    model_args: dict              #: MODEL_ARGS of model_config.yaml when the values were written
    env_vars: dict                #: ENV_VARS then
    world_size: Optional[int]
    world_size_source: str
    values_commit: str            #: the commit that wrote these values (full hash)
    values_date: str              #: its date, YYYY-MM-DD
    container: Optional[str]      #: the NGC PyTorch container the CI image was built on then
    allocated: tuple              #: (iteration, mem-allocated-bytes) in order, after each optimizer step
    max_allocated: tuple          #: (iteration, mem-max-allocated-bytes): the allocator's running maximum

    @property
    def gpu(self) -> str:
        return PLATFORMS.get(self.platform, ("?", 0))[0]

    @property
    def compute_capability(self) -> int:
        return PLATFORMS.get(self.platform, ("?", 0))[1]

    @property
    def version(self) -> str:
        """The Megatron-LM version that wrote the values (memlib.config.versions: commit@date)."""
        return f"{self.values_commit[:10]}@{self.values_date}"

    @property
    def dynamic_loss_scale(self) -> bool:
        """An fp16 run with dynamic loss scaling (``--fp16`` without ``--loss-scale``): its first steps overflow
        and are skipped until the scale has come down from 2^32, so Adam's moments are created late."""
        return bool(self.model_args.get("--fp16")) and self.model_args.get("--loss-scale") is None

    @property
    def steady(self) -> Optional[int]:
        """The allocator's maximum at the third logged iteration, once the optimizer's moments exist (None when
        there is no such iteration).  For a run with a dynamic loss scale: at the first logged iteration after the
        post-step allocation has reached its largest value (the step that created the moments); the maximum
        is a running one, so the skipped steps before it count nowhere above it."""
        after = dict(self.allocated)
        rows = [(after.get(i), m) for i, m in self.max_allocated if m is not None]
        first = 2
        if self.dynamic_loss_scale and any(a is not None for a, _ in rows):
            top = max(a for a, _ in rows if a is not None)
            first = max(first, next(i for i, (a, _) in enumerate(rows) if a == top) + 1)
        return rows[first][1] if len(rows) > first else None

    @property
    def post_step(self) -> Optional[int]:
        """The largest allocation logged after a step."""
        vals = [v for _, v in self.allocated if v is not None]
        return max(vals) if vals else None

    @property
    def run_max(self) -> Optional[int]:
        vals = [v for _, v in self.max_allocated if v is not None]
        return max(vals) if vals else None


def _series(metric: dict) -> tuple:
    return tuple(sorted((int(k), exact(v)) for k, v in metric["values"].items()))


@lru_cache(maxsize=1)
def goldens() -> tuple[Golden, ...]:
    """Every golden-values file of every test, in the file's order."""
    out = []
    for key, t in functional_tests()["tests"].items():
        for name, g in t["goldens"].items():
            out.append(Golden(
                key, t["folder"], t["name"], name, g["environment"], g["platform"], g["second_run"], t["test_type"],
                g["model_args_at_values"] or t["model_args"] or {}, g["env_vars_at_values"] or t["env_vars"] or {},
                g["world_size"], g["world_size_source"], g["values_commit"]["sha"], g["values_commit"]["date"],
                g.get("container"),
                _series(g["mem-allocated-bytes"]), _series(g["mem-max-allocated-bytes"])))
    return tuple(out)
