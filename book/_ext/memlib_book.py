"""Sphinx extension of the book: tags the build with what the model it is built for is.

``paper_model`` is set when the book is built for the paper's DeepSeek-V3 (the default); prose that
puts memlib's values beside the paper's printed ones sits in ``{only} paper_model`` blocks, so that
a book built for another model (``make book MODEL=deepseek-v2``) carries none of them.

An ``{only}`` block cannot hold a heading (Sphinx raises the section out of it, so it would stay in
every book).  A whole section that only the paper's book has is marked on its heading instead::

    {.paper-model}
    ## Errata for this chapter

and removed, with everything under it, when the tag is not set.

``html-only`` marks a section that only the HTML book prints: reference a reader looks up rather than reads (a
chapter's table of every case); the PDF leaves it out (the builder's tag ``html`` is not set there), and the
chapter says in an ``{only} latex`` block where to find it.  Like a configuration cell's input (below), it is
what paper cannot fold away.

``deepseek_arch`` is set when the model has the blocks the paper analyses (MLA, DeepSeekMoE); a
section on them is marked ``{.deepseek-arch}`` and dropped from the book of another architecture
(Llama, Mixtral, Qwen, GPT), whose chapters say in a glued note what applies instead
(``{only} not deepseek_arch``).

The chapters are executed once per build and their outputs kept (``execute_notebooks: cache``, Jupyter
Book's jupyter-cache): the PDF build and the reproducibility check reuse them.  jupyter-cache re-executes a
notebook whose code changed, not one whose library changed, so the cache lives in a folder named by
:func:`execution_key`, a hash of everything else a chapter's outputs depend on (memlib's files, the model
the book is built for, the Python and package versions): a change to any of them starts a fresh cache.
"""
import hashlib
import os
import sys
from pathlib import Path

def _tag_of(cls: str) -> str | None:
    """The tag a section class stands for (memlib.report.book.section_tag: one rule for the build and for the
    summary's equation numbers)."""
    from memlib.report.book import section_tag

    return section_tag(cls)


def _drop_sections(app, doctree) -> None:
    from docutils import nodes
    from sphinx import addnodes

    # an ``{only}`` block whose condition is false goes now, not when the page is written: a reference in it
    # to an equation of a dropped section (``{eq}`` of MLA in a GQA model's book) is then never resolved
    for node in list(doctree.findall(addnodes.only)):
        try:
            keep = app.tags.eval_condition(node["expr"])
        except Exception:                          # noqa: BLE001 - Sphinx itself reports a bad expression later
            continue
        if not keep and node.parent is not None:
            node.parent.remove(node)
    for section in list(doctree.findall(nodes.section)):
        tags = [_tag_of(c) for c in section["classes"]]
        if any(t is not None and not app.tags.has(t) for t in tags) and section.parent is not None:
            section.parent.remove(section)


#: what a chapter's outputs depend on besides its own code: memlib's sources and package data
LIBRARY = "memlib"
#: the environment variables a chapter reads (memlib.report.book.ENV) or that change what it prints
EXECUTION_ENV = ("MEMLIB_BOOK_MODEL", "MPLBACKEND", "PYTHONHASHSEED")


def execution_key(root: Path) -> str:
    """A hash of what the chapters' outputs depend on beyond their code: every file of memlib (its sources,
    presets and data), the model the book is built for (a config.json path by its content), the environment
    variables of :data:`EXECUTION_ENV`, the Python version and every installed distribution's version."""
    from importlib import metadata

    h = hashlib.sha256()
    for path in sorted((root / LIBRARY).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name in EXECUTION_ENV:
        h.update(f"{name}={os.environ.get(name, '')}\0".encode())
    model = Path(os.environ.get("MEMLIB_BOOK_MODEL") or "")
    if model.suffix == ".json" and model.is_file():
        h.update(model.read_bytes())
    h.update(sys.version.encode())
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    h.update("\n".join(dists).encode())
    return h.hexdigest()[:16]


#: a folder for the executed chapters instead of the keyed one (benchmarks/book_build.py: a fresh one, so that
#: every chapter is executed)
CACHE_ENV = "MEMLIB_BOOK_CACHE"


def _execution_cache(app, config) -> None:
    """Keep the executed chapters in ``_build/.jupyter_cache/<execution_key>`` of the source folder, whatever
    the output folder (a second build into another folder reuses them), or in ``$MEMLIB_BOOK_CACHE``."""
    root = Path(app.srcdir)
    if not config.nb_execution_cache_path:
        config.nb_execution_cache_path = (os.environ.get(CACHE_ENV)
                                          or str(root / "_build" / ".jupyter_cache" / execution_key(root)))


def setup(app):
    from memlib.report.book import book_tags

    for tag in book_tags():
        app.tags.add(tag)
    app.connect("config-inited", _execution_cache)
    # before the table of contents and the labels are collected from the doctree (priority 500)
    app.connect("doctree-read", _drop_sections, priority=100)
    app.connect("doctree-resolved", _latex_table_widths)
    app.connect("builder-inited", _latex_contents_name)
    app.connect("doctree-resolved", _latex_parts)
    app.connect("doctree-resolved", _latex_hidden_inputs)
    _register_bibliography_style()
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# --- PDF tables: column widths from their content ------------------------------------------------------------
# Sphinx sets a table of more than 30 rows as a longtable of ``l`` columns (which never wrap, so a wide one runs
# off the page and the PDF clips it) and a shorter one as a tabulary (which may squeeze a column below a long
# exact count, which then runs into the next cell).  For the LaTeX builder every table gets column widths from
# its content instead: a column is never narrower than its widest unbreakable item (a 15-digit count, a formula
# line, a word), the rest of the line is shared by how much text each column holds, and a table whose items do
# not fit at \footnotesize is set smaller (\scriptsize, then \tiny).

#: the text width of the PDF (letterpaper, Sphinx's 1in margins) and the space between two columns, pt
TEXT_WIDTH, COLUMN_GAP = 469.75, 12.0
#: the table font sizes tried, pt, and their LaTeX names (10pt class)
TABLE_SIZES = ((8.0, r"\footnotesize"), (7.0, r"\scriptsize"), (5.0, r"\tiny"))


def _em(ch: str, mono: bool) -> float:
    """Width of a character in em: FreeSerif's figures are 0.5 em, its lower case about 0.45 em (0.47 leaves
    room for the sans-serif headers), FreeMono's every character 0.6 em."""
    if mono:
        return 0.6
    if ch.isdigit():
        return 0.5
    if ch in ",.;:'’|!()[] ":
        return 0.3
    if ch.isupper():
        return 0.72
    return 0.47


def _math_widths(latex: str) -> list[float]:
    """Widths (em) of each line of inline math (a wrapped formula has several): a letter or figure about
    0.55 em (a capital 0.75), a binary operator with its spaces 1.2 em, a sub- or superscript 0.4 em."""
    import re

    out = []
    for line in re.split(r"\\\\", latex):
        line = re.sub(r"\\(left|right|bigl|bigr|quad|begin|end|frac|mathrm|operatorname)\b|\{aligned\}|&", "", line)
        ops = len(re.findall(r"[+=<>]|(?<!\{)-|\\(times|cdot|leq|geq|le|ge)\b", line))
        scripts = "".join(re.findall(r"[_^]\{([^{}]*)\}|[_^](\w)", line) and
                          [a or b for a, b in re.findall(r"[_^]\{([^{}]*)\}|[_^](\w)", line)])
        body = re.sub(r"[_^]\{[^{}]*\}|[_^]\w", "", line)
        body = re.sub(r"\\[a-zA-Z]+|[{}+=<>\s-]", "", body)
        letters = sum(0.75 if c.isupper() else 0.55 for c in body)
        out.append(letters + 0.4 * len(re.sub(r"\\[a-zA-Z]+|[{}\s]", "", scripts)) + 1.2 * ops)
    return out


def _cell_items(entry) -> tuple[list[float], float]:
    """The widths (em) of a cell's unbreakable items and of its whole text on one line."""
    import re

    from docutils import nodes

    items: list[float] = []

    def width(text: str, mono: bool, bold: bool) -> float:
        return sum(_em(c, mono) for c in text) * (1.08 if bold else 1.0)

    def walk(node, mono=False, bold=False):
        if isinstance(node, nodes.math):
            items.extend(w * (1.08 if bold else 1.0) for w in _math_widths(node.astext()))
            return
        if isinstance(node, nodes.Text):
            text = str(node)
            # inline code may break after _ and - (the LaTeX preamble lets it), words at spaces
            parts = re.split(r"(?<=[_\-/])|\s+", text) if mono else text.split()
            items.extend(width(p, mono, bold) for p in parts if p)
            return
        mono = mono or isinstance(node, nodes.literal)
        bold = bold or isinstance(node, nodes.strong)
        for child in node.children:
            walk(child, mono, bold)

    walk(entry)
    whole = sum(items) + 0.3 * max(len(items) - 1, 0)
    return items, whole


def _column_widths(table) -> tuple[list[float], str] | None:
    """Widths (pt, the gap included) of ``table``'s columns filling the text width, and the font size."""
    from docutils import nodes

    groups = list(table.findall(nodes.tgroup))
    if len(groups) != 1:
        return None
    n = int(groups[0]["cols"])
    least, natural = [0.0] * n, [0.0] * n
    for row in groups[0].findall(nodes.row):
        entries = [e for e in row.children if isinstance(e, nodes.entry)]
        if len(entries) != n or any(e.get("morecols") or e.get("morerows") for e in entries):
            return None
        for i, e in enumerate(entries):
            items, whole = _cell_items(e)
            least[i] = max(least[i], max(items, default=0.0))
            natural[i] = max(natural[i], whole)
    for size, name in TABLE_SIZES:
        room = TEXT_WIDTH - n * COLUMN_GAP
        lo, hi = [x * size for x in least], [x * size for x in natural]
        if sum(lo) <= room or size == TABLE_SIZES[-1][0]:
            spare = max(room - sum(lo), 0.0)
            extra = [h - l for h, l in zip(hi, lo)]
            if sum(hi) <= room:                    # everything on one line: share the rest by the text held
                widths = [h + (room - sum(hi)) * h / (sum(hi) or 1) for h in hi]
            else:                                  # the widest items, and the rest by how much more text there is
                widths = [l + spare * x / (sum(extra) or 1) for l, x in zip(lo, extra)]
            return [w + COLUMN_GAP for w in widths], name
    return None


#: a table of more rows than this may break across pages (a longtable): set whole, a table of 20 rows that does not
#: fit below the text before it moves to the next page and leaves the rest of its page empty
LONG_ROWS = 12


def breakable(table) -> bool:
    """Whether ``table`` is set as a longtable, which breaks across pages: more than :data:`LONG_ROWS` body rows,
    and not inside an admonition (LaTeX's framed boxes cannot hold one)."""
    from docutils import nodes

    rows = sum(len(body.children) for body in table.findall(nodes.tbody))
    return rows > LONG_ROWS and not any(isinstance(a, (nodes.Admonition, nodes.sidebar, nodes.topic))
                                        for a in _ancestors(table))


def _latex_table_widths(app, doctree, docname) -> None:
    if app.builder.format != "latex":
        return
    from docutils import nodes

    for table in list(doctree.findall(nodes.table)):
        got = _column_widths(table)
        if got is None:
            continue
        widths, size = got
        specs = list(table.findall(nodes.colspec))
        for spec, w in zip(specs, widths):
            spec["colwidth"] = max(1, round(w * 10))
        if "colwidths-given" not in table["classes"]:
            table["classes"].append("colwidths-given")
        if breakable(table) and "longtable" not in table["classes"]:
            table["classes"].append("longtable")
        if size != TABLE_SIZES[0][1] and table.parent is not None:
            i = table.parent.index(table)
            table.parent.insert(i + 1, nodes.raw("", r"\renewcommand{\memlibtablefont}{\footnotesize}", format="latex"))
            table.parent.insert(i, nodes.raw("", rf"\renewcommand{{\memlibtablefont}}{{{size}}}", format="latex"))


# --- PDF parts: the table of contents' parts (_toc.yml) as LaTeX \part --------------------------------------------
# Sphinx's LaTeX builder inlines the root document's toctrees one after another and drops their captions (and
# takes the first caption for the name of the table of contents).  The book's parts are set as \part instead,
# numbered by LaTeX ("Part I: The paper and DeepSeek-V3" becomes Part I, "The paper and DeepSeek-V3"; the
# appendices Part III).  The chapters keep their numbers across the parts, as in the HTML.

PART_PREFIX = r"^Part [IVX]+:\s*"


def part_command(caption: str) -> str:
    r"""The LaTeX that opens the part ``caption``, without the "Part N:" that LaTeX numbers itself."""
    import re

    return rf"\part{{{re.sub(PART_PREFIX, '', caption)}}}"


def _latex_contents_name(app) -> None:
    if app.builder.format == "latex":
        app.builder.get_contentsname = lambda indexfile: "Contents"


def _latex_parts(app, doctree, docname) -> None:
    if app.builder.format != "latex" or docname != app.config.root_doc:
        return
    from docutils import nodes
    from sphinx import addnodes

    captions = [t.get("caption") for t in app.env.get_doctree(docname).findall(addnodes.toctree)]
    wrappers = [n for n in doctree.findall(nodes.compound) if "toctree-wrapper" in n["classes"]
                and not any("toctree-wrapper" in a.get("classes", []) for a in _ancestors(n))]
    for wrapper, caption in zip(wrappers, captions):
        if caption:
            wrapper.parent.insert(wrapper.parent.index(wrapper), nodes.raw("", part_command(caption), format="latex"))


def _ancestors(node):
    node = node.parent
    while node is not None:
        yield node
        node = node.parent


# --- PDF: a cell's hidden input is left out -------------------------------------------------------------------
# A chapter's configuration cell is tagged hide-input: the HTML shows it folded, under a toggle; paper has no
# toggle, so the PDF leaves the input out (the chapter's text says what the configuration is, and the
# introduction's "Play with the knobs" how to change it).


def drop_hidden_inputs(doctree) -> int:
    """Remove the input of every cell tagged ``hide-input`` (or ``remove-input``) from ``doctree``; the number
    removed."""
    from docutils import nodes

    removed = 0
    for cell in list(doctree.findall(nodes.container)):
        if not {"tag_hide-input", "tag_remove-input"} & set(cell.get("classes", [])):
            continue
        for child in list(cell.findall(nodes.container)):
            if "cell_input" in child.get("classes", []) and child.parent is not None:
                child.parent.remove(child)
                removed += 1
    return removed


def _latex_hidden_inputs(app, doctree, docname) -> None:
    if app.builder.format == "latex":
        drop_hidden_inputs(doctree)


# --- the bibliography's labels: the citations' own "[Author, year]" ----------------------------------------------
# The text cites author-year (``bibtex_reference_style: author_year``: "[Zhang and Su, 2025]"); pybtex's alpha
# labels in the list ("[ZS25]", and "[DeepSeekAI4a]" for a year of 2024a) would not match them.  The list is
# labelled with the very string the text shows, and sorted by it.

#: the formatting style registered for ``bibtex_default_style``
BIB_STYLE = "memlib_author_year"


def _last(person) -> str:
    """A person's last name as the citation prints it: braces of a corporate name dropped."""
    return " ".join(person.prelast_names + person.last_names).replace("{", "").replace("}", "")


def author_year_label(entry) -> str:
    """``"Author, year"`` as sphinxcontrib-bibtex's author_year citations print it: one author, two joined by
    "and", three or more as the first "et al."; the year as written (2024a), or "n.d."."""
    names = [_last(p) for p in entry.persons.get("author", [])]
    if not names:
        who = entry.key
    elif len(names) <= 2:
        who = " and ".join(names)
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


def _register_bibliography_style() -> None:
    from pybtex.plugin import register_plugin
    from pybtex.style.formatting.unsrt import Style as UnsrtStyle
    from pybtex.style.labels import BaseLabelStyle
    from pybtex.style.sorting import BaseSortingStyle

    class Labels(BaseLabelStyle):
        def format_labels(self, sorted_entries):
            return (author_year_label(e) for e in sorted_entries)

    class Sorting(BaseSortingStyle):
        def sorting_key(self, entry):
            return (author_year_label(entry).casefold(), str(entry.fields.get("title", "")).casefold())

    class Style(UnsrtStyle):
        default_label_style = Labels
        default_sorting_style = Sorting

    register_plugin("pybtex.style.formatting", BIB_STYLE, Style, force=True)
