"""Glue: hand a chapter's values to its prose (myst-nb ``glue``), and show them when the notebook
is run in Jupyter.

In the book the cells that glue are removed (``remove-cell``) and only the prose shows the values;
run in Jupyter, every glue call also displays what it glued (a table of the values, the equation,
the table, the figure), so a reader who reruns a chapter sees its numbers.

Keys are letters, digits and ``_``, starting with a letter.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Mapping

from .format import md_table

__all__ = ["glue", "glue_values", "glue_paper", "glue_md", "glue_math", "glue_figure", "check_key",
           "glue_equations", "equation_key", "equation_label", "glue_deepseek"]

_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"glue key {key!r} must be letters, digits and '_' and start with a letter")
    return key


#: myst-nb's glue protocol (``myst_nb.ext.glue``, 1.x): a value glued without being shown has its MIME types
#: prefixed with this
GLUE_PREFIX = "application/papermill.record/"


def _myst_glue(key: str, value, display: bool, measure: bool = False) -> None:
    """What ``myst_nb.glue`` does, output for output (tests/report/test_report_glue.py compares the two): the value's
    display data, with the key in the output's metadata.  Not ``myst_nb.glue`` itself: importing
    ``myst_nb.ext.glue`` in a kernel imports nbformat, whose jsonschema compiles some 40 lark grammars
    (rfc3987-syntax) on import, about 1.5 s of every chapter's build."""
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipy_display

    mimebundle, metadata = format_display_data(value)
    if measure:                 # a figure: its smallest text as printed and as shown (tests read it back)
        from .legibility import legibility

        metadata["memlib"] = {"legibility": legibility(value, mimebundle).as_dict()}
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = dict(name=check_key(key), mime_prefix=prefix)
    ipy_display({f"{prefix}{k}": v for k, v in mimebundle.items()}, raw=True, metadata=metadata)


def glue(key: str, value: str) -> str:
    """Glue one ready-formatted string (for ``{glue:text}``) without displaying it."""
    _myst_glue(key, value, False)
    return value


def glue_values(prefix: str, values: Mapping[str, str]) -> None:
    """Glue every value under ``{prefix}_{key}`` and display them as one table (in Jupyter)."""
    from IPython.display import Markdown, display

    for key, text in values.items():
        _myst_glue(f"{prefix}_{key}", text, False)
    if values:
        display(Markdown(md_table(["glue key", "value"], [[f"`{prefix}_{k}`", v] for k, v in values.items()], "ll")))


def glue_paper(prefix: str, values: Mapping[str, str], keys: Iterable[str]) -> None:
    """Glue the values the prose compares with the paper (``{only} paper_model`` blocks): for another
    model ``values`` is empty and each of ``keys`` gets a placeholder, since Sphinx resolves the glue
    roles of a block before it drops it."""
    glue_values(prefix, {**{k: "—" for k in keys}, **values})


def glue_deepseek(prefix: str, values, est) -> None:
    """Glue ``values(est)`` (a chapter's numbers on MLA or DeepSeekMoE) where the model has those
    blocks; for another architecture the same keys (read from the paper's model) get a placeholder:
    they sit in sections marked ``{.deepseek-arch}`` or ``{only} deepseek_arch`` blocks, which that
    model's book drops (Sphinx resolves the glue roles of a block before it drops it)."""
    from ..model.architecture import is_deepseek_architecture

    if is_deepseek_architecture(est.model):
        glue_values(prefix, values(est))
        return
    glue_paper(prefix, {}, values(_paper_estimate()))


@lru_cache(maxsize=None)
def _paper_estimate():
    """The paper's model under its configuration (the keys of a chapter's DeepSeek-only values)."""
    from ..device.estimate import estimate
    from ..paper import PAPER_MODEL, paper_training

    return estimate(PAPER_MODEL, paper_training(PAPER_MODEL))


def glue_md(key: str, text: str) -> str:
    """Glue Markdown for ``{glue:md}`` (with ``:format: myst``), displayed in Jupyter."""
    from IPython.display import Markdown

    _myst_glue(key, Markdown(text), True)
    return text


def glue_math(key: str, latex: str) -> str:
    """Glue an equation for ``{glue:math}`` (LaTeX, usually :meth:`memlib.formulas.Formula.latex`)."""
    from IPython.display import Math

    _myst_glue(key, Math(latex), True)
    return latex


def glue_figure(key: str, fig) -> None:
    """Glue a figure for ``{glue:figure}`` (shown in Jupyter): a matplotlib figure (then closed) or a
    :class:`memlib.report.diagrams.Diagram` (SVG in the HTML book, PDF in the LaTeX one), with its smallest
    text as printed and as shown (:func:`memlib.report.legibility.legibility`) in the output's metadata."""
    from .diagrams import Diagram

    _myst_glue(key, fig, True, measure=True)
    if not isinstance(fig, Diagram):
        import matplotlib.pyplot as plt

        plt.close(fig)


def equation_key(name: str) -> str:
    """The glue key of the registry formula ``name``: ``states.zero1`` -> ``eq_states_zero1``."""
    return "eq_" + name.replace(".", "_")


def equation_label(name: str) -> str:
    """Its label in the book: ``states.zero1`` -> ``eq-states-zero1`` (cited as {eq}`eq-states-zero1`)."""
    return "eq-" + name.replace(".", "-").replace("_", "-")


def glue_equations(names, model, train=None) -> None:
    """Glue each registry formula of ``names`` as the book shows it (``{glue:math}`` with the key
    :func:`equation_key` and the label :func:`equation_label`): the same LaTeX ``memlib formula NAME
    --latex`` prints."""
    from ..config import load_model
    from ..formulas import FORMULAS, equation
    from ..model.blocks import model_blocks

    m = load_model(model)
    own = model_blocks(m) | {"paper"}
    for name in names:
        # the equation of a block the model lacks (MLA's without MLA, the query latent's without query compression):
        # a placeholder, in a section or an {only} block that model's book drops
        f = FORMULAS[name]
        lacks = not f.needs <= own or (name.startswith("mla.") and m.attention != "mla")
        glue_math(equation_key(name), r"\text{—}" if lacks else equation(name, m, train))
