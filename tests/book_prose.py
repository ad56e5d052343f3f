"""The book's text for a model, rendered without Sphinx: what ``make book MODEL=...`` would print,
in a second per model instead of a minute: every chapter and the summary page.

Each notebook's code cells run in-process, in order, with :data:`memlib.report.book.BOOK_MODEL`
set to the model and memlib's glue recorded instead of displayed; then its Markdown is resolved
the way the book's build resolves it: ``{glue:text}`` roles and ``{glue:md}``/``{glue:math}``
directives replaced by what was glued, a ``{glue:figure}`` by the texts drawn in the figure (title,
axis labels, legend, tick labels), ``{only}`` blocks kept or dropped by the model's Sphinx tags
(:func:`memlib.report.book.book_tags`) and a section marked ``{.tag-name}`` on its heading dropped
with everything under it when its tag is not set (``book/_ext/memlib_book.py``).  Code cells are
not prose and are left out.

Used by tests/book/test_book_every_model.py; not a replacement for the real build (tests/book/test_book_*.py).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the chapters, then the summary page (a notebook too: its equations, fit matrix, ablation and glossary are
#: the model's like a chapter's)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md")) + [ROOT / "book" / "summary.md"]


@dataclass
class Chapter:
    name: str
    glued: dict = field(default_factory=dict)     #: key -> the text the book shows for it
    text: str = ""                                #: the chapter's prose as the book would print it
    error: str | None = None                      #: the exception its code cells raised, if any


def _shown(value) -> str:
    """What the book shows for a glued value: a string as is, Markdown and Math by their text,
    a figure by the texts drawn in it."""
    import matplotlib.figure
    import matplotlib.text

    if isinstance(value, str):
        return value
    if isinstance(value, matplotlib.figure.Figure):
        texts = [t.get_text() for t in value.findobj(matplotlib.text.Text)]
        return "\n".join(t for t in texts if t.strip())
    return str(getattr(value, "data", value))


def _run_code(name: str, cells: list[str], model: str) -> Chapter:
    import IPython.display as ipd
    import matplotlib.pyplot as plt

    import memlib.report.book as book
    import memlib.report.glue as glue

    ch = Chapter(name)
    saved = (glue._myst_glue, ipd.display, book.BOOK_MODEL, os.getcwd())

    def record(key, value, display, *args, **kwargs):   # the signature of memlib.report.glue._myst_glue
        ch.glued[key] = _shown(value)

    glue._myst_glue, ipd.display, book.BOOK_MODEL = record, (lambda *a, **k: None), model
    os.chdir(ROOT / "notebooks")
    try:
        ns: dict = {}
        for src in cells:
            exec(compile(src, name, "exec"), ns)
    except Exception as e:                         # noqa: BLE001 - the test reports it
        ch.error = f"{type(e).__name__}: {e}"
    finally:
        glue._myst_glue, ipd.display, book.BOOK_MODEL, cwd = saved
        os.chdir(cwd)
        plt.close("all")
    return ch


#: a section marked ``{.other-models}`` is about models other than the book's (measured cases, comparisons):
#: the book keeps it, and its text stands between these two lines, which :func:`own_text` leaves out
OTHER_MODELS, OPEN, CLOSE = "other-models", "<<other-models>>", "<</other-models>>"


def own_text(text: str) -> str:
    """The text about the book's own model: without the sections marked ``{.other-models}``."""
    return re.sub(re.escape(OPEN) + r".*?" + re.escape(CLOSE), "", text, flags=re.S)


_FENCE = re.compile(r"^(\s*)(`{3,}|:{3,})\{([\w:.-]+)\}\s*(.*)$")
_ROLE = re.compile(r"\{glue:(?:text|md)\}`([^`:]+)(?::myst)?`")
_XREF = re.compile(r"\{(?:ref|numref|eq|doc|cite|cite:p|cite:t|term)\}`([^`]+)`")


#: the builders' tags: a block only one edition prints (``{only} html``: a reference table the PDF leaves out;
#: ``{only} latex``: the PDF's line that says where it is) is text of the book all the same, and is checked
BUILDERS = ("html", "latex")


def _only(expr: str, tags: set[str]) -> bool:
    """Sphinx's ``{only}`` expression: tags joined by ``and``, ``or``, ``not`` and parentheses; true when it
    holds in the HTML or in the PDF build of the book."""
    words = re.findall(r"\w+|[()]", expr)

    def holds(builder: str) -> bool:
        py = " ".join(w if w in ("and", "or", "not", "(", ")") else str(w in tags | {builder}) for w in words)
        return bool(eval(py))                      # noqa: S307 - built only from True/False/and/or/not

    return any(holds(b) for b in BUILDERS)


def _resolve(lines: list[str], glued: dict, tags: set[str]) -> list[str]:
    """The lines the book prints: directives resolved, ``{only}`` blocks filtered (recursively)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, fence, kind, arg = m.groups()
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        body = [ln for ln in lines[i + 1:j] if not re.match(r"^\s*:[\w-]+:", ln)]
        i = j + 1
        if kind == "code-cell":
            continue
        if kind == "only":
            if _only(arg, tags):
                out += _resolve(body, glued, tags)
            continue
        if kind in ("glue:md", "glue:math", "glue:figure", "glue:text", "glue"):
            out += [glued.get(arg.strip(), f"<<unglued {arg.strip()}>>")] + _resolve(body, glued, tags)
            continue
        out += ([arg] if arg else []) + _resolve(body, glued, tags)
    return out


def _drop_sections(lines: list[str], tags: set[str]) -> list[str]:
    """Drop each section whose heading is marked ``{.tag-name}`` when ``tag_name`` is not set."""
    out: list[str] = []
    drop_level, start, code, other_level = None, None, False, None
    for n, line in enumerate(lines):
        if re.match(r"^`{3,}\{code-cell\}", line) or (code and line.strip().startswith("```")):
            code = not code                        # a comment in a code cell is no heading
        h = None if code else re.match(r"^(#{1,6}) ", line)
        if h and drop_level is not None and n != start and len(h.group(1)) <= drop_level:
            drop_level = None
        mark = None if code else re.match(r"^\{((?:\s*\.[\w-]+)+)\s*\}\s*$", line)
        classes = re.findall(r"\.([\w-]+)", mark.group(1)) if mark else []
        if h and other_level is not None and len(h.group(1)) <= other_level and out and out[-1] != OPEN:
            out.append(CLOSE)
            other_level = None
        if mark:
            k = next((i for i in range(n + 1, len(lines)) if lines[i].strip()), None)
            heading = re.match(r"^(#{1,6}) ", lines[k]) if k is not None else None
            level = len(heading.group(1)) if heading else None
            if level is not None and drop_level is not None and level <= drop_level:
                drop_level = None                  # its heading ends the dropped section before it
            if level is not None and any(c != OTHER_MODELS and c.replace("-", "_") not in tags for c in classes):
                if drop_level is None:
                    drop_level, start = level, k
            elif OTHER_MODELS in classes and drop_level is None and level is not None:
                # kept, between sentinels: its subject is not the book's model
                if other_level is not None:
                    out.append(CLOSE)
                other_level = level
                out.append(OPEN)
            continue
        if drop_level is None:
            out.append(line)
    return out + ([CLOSE] if other_level is not None else [])


def render(path: Path, model: str, tags: set[str]) -> Chapter:
    import jupytext

    nb = jupytext.read(path)
    ch = _run_code(path.name, [c.source for c in nb.cells if c.cell_type == "code"], model)
    src = path.read_text(encoding="utf-8").split("---\n", 2)[-1]          # without the front matter
    lines = _resolve(_drop_sections(src.splitlines(), tags), ch.glued, tags)
    text = "\n".join(lines)
    text = _ROLE.sub(lambda m: ch.glued.get(m.group(1), f"<<unglued {m.group(1)}>>"), text)
    text = _XREF.sub(lambda m: m.group(1), text)
    ch.text = text
    return ch


@lru_cache(maxsize=None)
def book(model: str) -> tuple[Chapter, ...]:
    """Every chapter of ``model``'s book, rendered (cached: the tests of one model share it)."""
    import matplotlib

    matplotlib.use("Agg")
    from memlib.report.book import book_tags

    tags = book_tags(model)
    return tuple(render(p, model, tags) for p in NOTEBOOKS)
