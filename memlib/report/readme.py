"""The README's figure: the DeepSeek-V3 ablation of the book's chapter on training without TP.

``python -m memlib.report.readme [PATH]`` writes it (default ``docs/readme-figure.png``); a test
regenerates it and compares the bytes, so the committed picture cannot go stale.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import deepseek
from .core import use_style

__all__ = ["FIGURE", "write"]

FIGURE = Path(__file__).resolve().parents[2] / "docs" / "readme-figure.png"


def write(path: Path | str = FIGURE) -> Path:
    """Draw the figure and save it as PNG (deterministic: no timestamp in the metadata)."""
    import matplotlib.pyplot as plt

    use_style()
    fig = deepseek.ablation_figure("deepseek-v3")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


if __name__ == "__main__":  # pragma: no cover
    print(write(sys.argv[1] if len(sys.argv) > 1 else FIGURE))
