"""The README's figure: the ablation of chapter 9 ("DeepSeek-V3's recipe, without tensor
parallelism") for DeepSeek-V3 under its own recipe.

``python -m memlib.report.readme [PATH]`` writes it (default ``docs/readme-figure.png``); a test
regenerates it and compares the bytes, so the committed picture cannot go stale.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..device.estimate import estimate
from ..scenarios.deepseek import deepseek_recipe
from . import ch09_deepseek
from .figures import use_style

__all__ = ["FIGURE", "MODEL", "write"]

FIGURE = Path(__file__).resolve().parents[2] / "docs" / "readme-figure.png"

#: the model the README's figure shows (whatever model the book is built for)
MODEL = "deepseek-v3"


def write(path: Path | str = FIGURE) -> Path:
    """Draw the figure and save it as PNG (deterministic: no timestamp in the metadata)."""
    import matplotlib.pyplot as plt

    use_style()
    fig = ch09_deepseek.ablation_figure(estimate(MODEL, deepseek_recipe(MODEL)))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


if __name__ == "__main__":  # pragma: no cover
    print(write(sys.argv[1] if len(sys.argv) > 1 else FIGURE))
