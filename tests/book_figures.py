"""Every figure the book glues, by its glue key, built as its chapter's notebook builds it (for one model).

Imported by the test modules (pytest puts ``tests/`` on ``sys.path``).  :func:`glued_keys` reads the keys the
notebooks glue, so that a figure added to a chapter without an entry here fails
tests/report/test_figure_legibility.py.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def glued_keys() -> dict[str, str]:
    """glue key -> notebook, of every ``glue_figure("key", ...)`` of the chapters."""
    out = {}
    for p in sorted(NOTEBOOKS.glob("*.md")):
        for key in re.findall(r"""glue_figure\(\s*["']([A-Za-z0-9_]+)["']""", p.read_text(encoding="utf-8")):
            out[key] = p.stem
    return out


def builders(model: str) -> dict:
    """glue key -> a function that builds the figure as the chapter's notebook does for ``model``."""
    from memlib import estimate
    from memlib.config import ZeroStage
    from memlib.device.timeline import over_time
    from memlib.paper import paper_training
    from memlib.report import (ch02_architecture, ch03_parameters, ch04_static, ch05_zero, ch06_activations,
                               ch07_overheads, ch08_together, ch09_deepseek, ch10_validation, ch11_measured,
                               ch12_architectures, ch13_fits)
    from memlib.scenarios.deepseek import deepseek_recipe
    from memlib.scenarios.overheads import base_training
    from memlib.scenarios.together import diagram_configs, grid, memory_timeline, schedules

    est = lru_cache(None)(lambda: estimate(model, paper_training(model)))
    ds = lru_cache(None)(lambda: estimate(model, deepseek_recipe(model)))
    runs = lru_cache(None)(lambda: schedules(est()))
    return {
        "arch_fig_attention": lambda: ch02_architecture.block_figure(est(), "attention"),
        "arch_fig_ffn": lambda: ch02_architecture.block_figure(est(), "ffn"),
        "params_fig_stages": lambda: ch03_parameters.stage_figure(est()),
        "static_fig_device": lambda: ch04_static.device_figure(est(), zero=ZeroStage.OS),
        "static_fig_stages": lambda: ch04_static.stages_figure(est()),
        "zero_fig_states": lambda: ch05_zero.states_figure(est()),
        "act_fig_flow": lambda: ch06_activations.dataflow_figure(est()),
        "act_fig_microbatch": lambda: ch06_activations.microbatch(est())[1],
        "act_fig_seqlen": lambda: ch06_activations.seqlen_figure(est()),
        "act_fig_policies": lambda: ch06_activations.policy_figure(est()),
        "ovh_fig_presets": lambda: ch07_overheads.preset_figure(estimate(model, base_training(paper_training(model)))),
        "tog_fig_grid": lambda: ch08_together.grid_figure(grid(est())),
        "tog_fig_sched": lambda: ch08_together.schedule_figure(runs()),
        "tog_fig_diagram": lambda: ch08_together.schedule_diagram(diagram_configs()),
        "tog_fig_time": lambda: ch08_together.memory_time_figure(memory_timeline(runs())),
        "ds_fig_ranks": lambda: ch09_deepseek.rank_figure(ds()),
        "ds_fig_time": lambda: ch09_deepseek.memory_time_figure(over_time(ds())),
        "ds_fig_ablation": lambda: ch09_deepseek.ablation_figure(ds()),
        "val_figure": lambda: ch10_validation.hf_figure(est()),
        "val_side_figure": lambda: ch10_validation.side_figure(est()),
        "mp_figure": lambda: ch11_measured.figure(),
        "oa_pairs_figure": lambda: ch12_architectures.pairs_figure(),
        "wf_region": lambda: ch13_fits.region_figure(model),
        "wf_pareto": lambda: ch13_fits.pareto_figure(model),
    }


@lru_cache(maxsize=None)
def figures(model: str) -> dict:
    """glue key -> the figure (built once per test session: the figures are not closed)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["figure.max_open_warning"] = 0       # every chapter's figures open at once, on purpose
    return {k: build() for k, build in builders(model).items()}
