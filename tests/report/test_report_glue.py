"""memlib's glue emits what ``myst_nb.glue`` emits, output for output, without importing myst_nb in the kernel."""
from __future__ import annotations

import subprocess
import sys

import IPython.display
import pytest

from memlib.report import glue as g


def _displays(monkeypatch, call):
    """The (args, kwargs) of every display() that ``call`` makes, whichever module it reached display through."""
    import myst_nb.ext.glue as mg

    seen = []
    fake = lambda *a, **k: seen.append((a, k))  # noqa: E731
    monkeypatch.setattr(IPython.display, "display", fake)
    monkeypatch.setattr(mg, "ipy_display", fake)
    call()
    return seen


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [1, 0])
    return fig


@pytest.mark.parametrize("display", [False, True])
@pytest.mark.parametrize("make", [lambda: "1.5 GiB", lambda: IPython.display.Markdown("| a |\n|---|\n| 1 |"),
                                  lambda: IPython.display.Math(r"\frac{a}{b}"), _figure],
                         ids=["text", "markdown", "math", "figure"])
def test_same_output_as_myst_nb(monkeypatch, make, display):
    from myst_nb import glue as myst_glue

    value = make()
    ours = _displays(monkeypatch, lambda: g._myst_glue("some_key", value, display))
    theirs = _displays(monkeypatch, lambda: myst_glue("some_key", value, display=display))
    assert len(ours) == 1 and ours == theirs
    bundle = ours[0][0][0]
    assert all(k.startswith(g.GLUE_PREFIX) != display for k in bundle)   # hidden values only are prefixed


def test_prefix_is_myst_nbs():
    from myst_nb.ext.glue import GLUE_PREFIX

    assert g.GLUE_PREFIX == GLUE_PREFIX


def test_bad_key_rejected():
    with pytest.raises(ValueError, match="glue key"):
        g.glue("1bad", "x")


def test_glue_does_not_import_nbformat():
    """The reason memlib glues by itself: nbformat (through jsonschema) costs a kernel about 1.5 s."""
    code = "from memlib.report.glue import glue_md, glue\nglue('a', 'x'); glue_md('b', '*y*')\nimport sys\n" \
           "print('nbformat' in sys.modules, 'myst_nb' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == ["False", "False"]
