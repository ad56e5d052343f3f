"""Diagrams laid out by Graphviz (``dot``): a block as a dataflow (:func:`flow_diagram`, from
:func:`memlib.scenarios.dataflow.block_flow`) and one pipeline stage's ranks with one rank's slices
(:func:`stage_diagram`, from :func:`memlib.scenarios.static.stage_ranks` and
:func:`~memlib.scenarios.static.device_slices`).

Nothing here computes a quantity: the nodes, edges, labels, shapes and fractions are memlib's; this module
writes them as DOT, with every symbol typeset (``W^{DQ}`` as W with a superscript, from the LaTeX of memlib's
tables) and lets ``dot`` place them.  A :class:`Diagram` shows itself as SVG in the HTML book and as PDF
in the LaTeX one (``application/pdf``, which myst-nb prefers for LaTeX), both drawn by ``dot``, the SVG with
its glyphs as outlines (``-Tsvg:cairo``) so that it looks the same in every browser, offline.
:meth:`Diagram.text_sizes` reads the font size of every text ``dot`` draws from its layout, for the
legibility test (tests/report/test_figure_legibility.py).
"""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from html import escape
from math import gcd

from .figures import CATEGORY_COLORS, OKABE_ITO

__all__ = ["DOT", "FONT", "FONT_SIZE", "SMALL_SIZE", "Diagram", "latex_html", "text_html", "flow_diagram",
           "rank_row", "stage_diagram"]

#: the Graphviz layout program (Debian's ``graphviz`` package)
DOT = "dot"
#: the face every diagram is set in (fontconfig's DejaVu Sans: Graphviz's dependencies install it)
FONT = "DejaVu Sans"
#: text sizes, pt: labels, and the shapes and notes under them
FONT_SIZE = 11
SMALL_SIZE = 10
#: a script (sub-, superscript) is this fraction of its text's size (a script's script is no smaller)
SCRIPT = Fraction(4, 5)
#: ends a label's text that follows a script: Graphviz 2.43 moves such a line's last text to the next line
#: unless something follows it in the same face (a zero-width space)
_EOL = "&#8203;"
#: the fixed creation date written into every PDF (cairo writes the clock's): the same bytes every build
_PDF_DATE = b"D:20000101000000Z"


# ------------------------------------------------------------------------------------------------
# LaTeX (the subset memlib's tables use) to Graphviz's HTML-like labels
# ------------------------------------------------------------------------------------------------
_COMMANDS = {r"\odot": "⊙", r"\times": "×", r"\top": "⊤", r"\cdot": "·", r"\prime": "′", r"\,": " ",
             r"\;": " ", r"\ ": " ", r"\!": "", r"\dots": "…", r"\ldots": "…", r"\in": "∈", r"\sigma": "σ",
             r"\left": "", r"\right": ""}


def _group(s: str, i: int) -> tuple[str, int]:
    """The argument at ``s[i]``: a braced group or one character; returns it and the index after it."""
    if s[i] == "{":
        depth = 0
        for j in range(i, len(s)):
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            if depth == 0:
                return s[i + 1:j], j + 1
        raise ValueError(f"unbalanced braces in {s!r}")
    if s[i] == "\\":
        m = re.match(r"\\[A-Za-z]+|\\.", s[i:])
        return m.group(0), i + len(m.group(0))
    return s[i], i + 1


def latex_html(s: str, size: float = FONT_SIZE, script: bool = False) -> str:
    """``s``, LaTeX of the subset memlib's tables write (``W^{DQ}``, ``d_{c'}``, ``\\mathrm{RMSNorm}(c^{KV})``,
    ``d^{R}_{h} n_{h}``), as a Graphviz HTML-like label at ``size`` pt: scripts as ``<SUB>``/``<SUP>`` in a
    smaller face (a subscript before a superscript of the same base), ``\\mathrm``/``\\text`` as plain text,
    a few symbols as Unicode.  Anything else it does not know raises :class:`ValueError` (a label never
    shows raw LaTeX)."""
    small = _fmt(size if script else size * SCRIPT)
    out, i, scripts = [], 0, []

    def flush():
        for tag, text in sorted(scripts, key=lambda x: x[0] != "SUB"):
            out.append(f'<{tag}><FONT POINT-SIZE="{small}">{text}</FONT></{tag}>')
        scripts.clear()

    while i < len(s):
        c = s[i]
        if c in "^_":
            arg, i = _group(s, i + 1)
            scripts.append(("SUP" if c == "^" else "SUB", latex_html(arg, size if script else size * SCRIPT, True)))
            continue
        flush()
        if c == "\\":
            m = re.match(r"\\[A-Za-z]+|\\.", s[i:])
            cmd = m.group(0)
            i += len(cmd)
            if cmd in ("\\mathrm", "\\text", "\\mathit", "\\operatorname"):
                arg, i = _group(s, i)
                out.append(escape(arg))
            elif cmd in _COMMANDS:
                out.append(_COMMANDS[cmd])
            else:
                raise ValueError(f"no HTML label for the LaTeX {cmd} in {s!r}")
        elif c in "{}":
            i += 1
        elif c == "'":
            out.append("′")
            i += 1
        else:
            out.append(escape(c))
            i += 1
    flush()
    return "".join(out)


def text_html(s: str, size: float = FONT_SIZE) -> str:
    """Words with LaTeX between ``$`` (``queries $[q^{C}; q^{R}]$``) and line breaks as an HTML-like label."""
    parts = s.split("$")
    if len(parts) % 2 == 0:
        raise ValueError(f"unbalanced $ in {s!r}")
    html = "".join(latex_html(p, size) if k % 2 else escape(p).replace("\n", "<BR/>") for k, p in enumerate(parts))
    return _lines(html.split("<BR/>"))


_CLOSERS = re.compile(r"((?:</FONT>|</B>|</I>)*)$")


def _keep(line: str) -> str:
    """``line`` with a zero-width space after its last text where that text follows a script (inside the
    same face as that text, so that Graphviz keeps it on the line)."""
    closers = _CLOSERS.search(line).group(1)
    body = line[:len(line) - len(closers)]
    if ("</SUB>" in body or "</SUP>" in body) and not body.endswith(("</SUB>", "</SUP>", ">", _EOL)):
        return body + _EOL + closers
    return line


def _lines(lines) -> str:
    """Lines of a label (each kept whole, :func:`_keep`)."""
    return "<BR/>".join(_keep(line) for line in lines)


def _fmt(x) -> str:
    """A size for DOT: at most two decimals."""
    return f"{float(x):.2f}".rstrip("0").rstrip(".")


def _font(html: str, size: float, color: str | None = None, bold: bool = False) -> str:
    c = f' COLOR="{color}"' if color else ""
    inner = f"<B>{html}</B>" if bold else html
    return f'<FONT POINT-SIZE="{_fmt(size)}"{c}>{inner}</FONT>'


def _lighten(hex_color: str, amount: float) -> str:
    """``hex_color`` mixed with white (``amount`` of white)."""
    rgb = [int(hex_color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02X}" for c in rgb)


# ------------------------------------------------------------------------------------------------
# the diagram: DOT source, rendered by dot
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Diagram:
    """DOT source, rendered by ``dot`` on demand: SVG for the HTML book, PDF for the LaTeX one."""

    source: str
    title: str = ""          #: the text shown where no image can be (``text/plain``)

    def render(self, fmt: str) -> bytes:
        """``dot -T<fmt>`` of the source (``svg:cairo``, ``pdf``, ``json``)."""
        exe = shutil.which(DOT)
        if exe is None:
            raise RuntimeError("Graphviz's dot is not installed (apt-get install graphviz): the book's diagrams "
                               "need it")
        r = subprocess.run([exe, f"-T{fmt}"], input=self.source.encode(), capture_output=True, timeout=60)
        if r.returncode != 0 or r.stderr.strip():
            raise RuntimeError(f"dot -T{fmt} failed: {r.stderr.decode(errors='replace').strip()}")
        return r.stdout

    @cached_property
    def svg(self) -> str:
        return self.render("svg:cairo").decode()

    @cached_property
    def pdf(self) -> bytes:
        """The PDF, its creation date fixed (the same length, so the cross-reference offsets hold)."""
        return re.sub(rb"D:\d{14}Z", _PDF_DATE, self.render("pdf"))

    @cached_property
    def layout(self) -> dict:
        return json.loads(self.render("json"))

    @property
    def size_pt(self) -> tuple[float, float]:
        """The drawing's width and height, pt (as the SVG and the PDF have it)."""
        m = re.search(r'width="([\d.]+)pt" height="([\d.]+)pt"', self.svg)
        return float(m.group(1)), float(m.group(2))

    def text_sizes(self) -> list[tuple[float, str]]:
        """(font size in pt, text) of every text ``dot`` draws: labels of nodes, edges and clusters."""
        out = []

        def walk(obj):
            for key in ("_ldraw_", "_hldraw_", "_tldraw_", "_hdraw_", "_tdraw_", "_draw_"):
                size = None
                for op in obj.get(key, []):
                    if op.get("op") == "F":
                        size = float(op["size"])
                    elif op.get("op") == "T" and op.get("text", "").strip():
                        out.append((size, op["text"]))

        lay = self.layout
        walk(lay)
        for obj in lay.get("objects", []) + lay.get("edges", []):
            walk(obj)
        return out

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"image/svg+xml": self.svg, "application/pdf": base64.b64encode(self.pdf).decode(),
                "text/plain": self.title or "diagram"}


def _graph(body: list[str], label: str = "", rankdir: str = "TB", nodesep: float = 0.15, ranksep: float = 0.28) -> str:
    head = ['digraph G {',
            f'  graph [rankdir={rankdir}, fontname="{FONT}", fontsize={FONT_SIZE}, nodesep={nodesep}, '
            f'ranksep={ranksep}, pad=0.05, margin=0, newrank=true, labelloc=b, labeljust=l{", label=<" + label + ">" if label else ""}];',
            f'  node [fontname="{FONT}", fontsize={FONT_SIZE}, margin="0.08,0.03", height=0.3];',
            f'  edge [fontname="{FONT}", fontsize={SMALL_SIZE}, arrowsize=0.6, color="#333333"];']
    return "\n".join(head + body + ["}"]) + "\n"


# ------------------------------------------------------------------------------------------------
# a block as a dataflow
# ------------------------------------------------------------------------------------------------
#: fills: a value training saves (the activations' colour, light), one it does not (white)
SAVED_FILL = _lighten(CATEGORY_COLORS["activations"], 0.55)
#: the outline of a value inference keeps in its KV cache
CACHE_COLOR = OKABE_ITO["blue"]
OP_FILL = "#EEEEEE"


def _shape_html(shape, size: float) -> str:
    from .format import tex

    return "[" + ", ".join(latex_html(tex(d), size) for d in shape) + "]"


def _value_label(n) -> str:
    head = latex_html(n.label) if n.label else ""
    words = text_html(n.text, SMALL_SIZE if head else FONT_SIZE)
    lines = [f"{_font(head, FONT_SIZE, bold=True)} {_font(words, SMALL_SIZE)}" if head else _font(words, FONT_SIZE)]
    if n.cached:
        lines.append(_font("KV cache", SMALL_SIZE, CACHE_COLOR, bold=True))
    # the shapes last: Graphviz gives a line no room for its subscripts, the node's margin does
    for shape in dict.fromkeys(n.shapes):
        count = n.shapes.count(shape)
        lines.append(_font((f"{count} × " if count > 1 else "") + _shape_html(shape, SMALL_SIZE), SMALL_SIZE, "#444444"))
    return _lines(lines)


def _edge_label(e) -> str:
    """The weights of an edge on one line, its operations on the next."""
    ws = ", ".join(latex_html(t.latex, SMALL_SIZE) for t in e.weights)
    ops = ", ".join(latex_html(o, SMALL_SIZE) if "\\" in o or "_" in o or "^" in o else escape(o) for o in e.ops)
    parts = [p for p in (ws, ops) if p]
    return _font(_lines(parts), SMALL_SIZE) if parts else ""


def flow_diagram(g) -> Diagram:
    """A :class:`memlib.scenarios.dataflow.FlowGraph` drawn top to bottom: its values as boxes (filled where
    training saves them, with the ledger's shapes; outlined in blue where inference caches them), operations
    of several inputs as grey ellipses, weights and one-input operations on the edges, the residual
    connection dashed, the clusters framed and titled, and a legend."""
    body = []

    def node_line(n) -> str:
        if n.kind == "op":
            text = latex_html(n.label) if n.label else text_html(n.text, SMALL_SIZE)
            size = FONT_SIZE if n.label else SMALL_SIZE
            return (f'  {n.id} [shape=ellipse, style=filled, fillcolor="{OP_FILL}", color="#777777", '
                    f'label=<{_font(_lines([text]), size)}>];')
        style = ["rounded"] + (["filled"] if n.saved else [])
        attrs = [f'shape=box, style="{",".join(style)}"', f'fillcolor="{SAVED_FILL}"' if n.saved else "",
                 f'color="{CACHE_COLOR}", penwidth=2.4' if n.cached else 'color="#555555"',
                 f"label=<{_value_label(n)}>"]
        if n.kind == "io" and not n.saved:
            attrs[0] = 'shape=box, style="rounded,dashed"'
        return f"  {n.id} [" + ", ".join(a for a in attrs if a) + "];"

    for gid, title in g.groups.items():
        members = [n for n in g.nodes if n.group == gid]
        if not members:
            continue
        body.append(f"  subgraph cluster_{gid} {{")
        body.append(f'    graph [label=<{_font(text_html(title, SMALL_SIZE), SMALL_SIZE, "#333333", bold=True)}>, '
                    f'style="rounded,dashed", color="#999999", labeljust=l, labelloc=t];')
        body += ["  " + node_line(n) for n in members]
        body.append("  }")
    body += [node_line(n) for n in g.nodes if n.group not in g.groups or not g.groups.get(n.group)]
    for e in g.edges:
        label = _edge_label(e)
        attrs = [f"label=<{label}>" if label else ""]
        if e.residual:
            attrs += ['style=dashed', 'color="#777777"']
        body.append(f"  {e.src} -> {e.dst} [" + ", ".join(a for a in attrs if a) + "];")
    legend = _legend([(SAVED_FILL, "#555555", "saved for backward"),
                      ("#FFFFFF", "#555555", "not saved") if any(not n.saved for n in g.nodes if n.kind == "value")
                      else None,
                      ("#FFFFFF", CACHE_COLOR, "inference's KV cache")
                      if any(n.cached for n in g.nodes) else None])
    return Diagram(_graph(body, legend, ranksep=0.16), g.title)


def _legend(items) -> str:
    """A key on one line: a swatch and its words per item."""
    cells = []
    for it in items:
        if it is None:
            continue
        fill, line, text = it
        cells.append(f'<TD BGCOLOR="{fill}" COLOR="{line}" BORDER="{2 if line == CACHE_COLOR else 1}" '
                     f'WIDTH="16" HEIGHT="10" FIXEDSIZE="TRUE"></TD><TD ALIGN="LEFT">{_font(escape(text), SMALL_SIZE)}</TD>')
    return f'<TABLE BORDER="0" CELLSPACING="3" CELLPADDING="1"><TR>{"".join(cells)}</TR></TABLE>'


# ------------------------------------------------------------------------------------------------
# one pipeline stage: its ranks and one rank's slices
# ------------------------------------------------------------------------------------------------
def _pick(n: int, keep: set[int], limit: int) -> list[int | None]:
    """Indices 0..n-1 to draw, at most about ``limit`` of them: all if they fit, else the first few, those of
    ``keep`` and the last, a ``None`` where some are left out."""
    if n <= limit:
        return list(range(n))
    shown = sorted(set(range(max(limit - len(keep) - 2, 1))) | keep | {n - 1})
    out: list[int | None] = []
    for i in shown:
        if out and out[-1] is not None and i != out[-1] + 1:
            out.append(None)
        out.append(i)
    return out


#: at most about this many rows, and ranks in a row, are drawn; the rest are elided
MAX_ROWS, MAX_RANKS = 8, 10


def rank_row(tp: int, ep: int, ranks: int) -> int:
    """How many consecutive ranks :func:`stage_diagram` draws in a row, given the sizes of the TP groups and
    of the expert-parallel groups (EP ETP): whole groups of both; without expert parallelism (``ep`` 1)
    doubled up to at least eight ranks where the stage has them."""
    row = tp * ep // gcd(tp, ep)
    while ep == 1 and row < 8 and ranks % (2 * row) == 0:
        row *= 2
    return row


def ep_groups_per_row(tp: int, ep: int, ranks: int) -> int:
    """How many whole expert-parallel groups (of ``ep`` = EP ETP ranks) one row of :func:`stage_diagram` holds."""
    return rank_row(tp, ep, ranks) // ep


def stage_diagram(groups: dict, slices: dict, families: list, words: dict) -> Diagram:
    """One pipeline stage's ranks and what one of them holds, under the pipeline's stages.

    ``groups``: :func:`memlib.scenarios.static.stage_groups` of the run; ``slices``: the rank's
    :func:`~memlib.scenarios.static.device_slices`; ``families``: its tensor families as the table shows them
    (label, then one formatted fraction per column of ``words["slice_columns"]``); ``words``: the titles
    (``stage``, ``grid``, ``rank``, ``columns``, ``slice_columns``; ``row`` and ``ep_row``: formats with
    ``{index}``, ``{first}`` and ``{last}``, for a row of ranks and for a row that is one expert-parallel
    group; ``experts``: the routed experts of each EP index), already formatted.

    The ranks are drawn in rows of consecutive ranks: one expert-parallel group per row where there is
    expert parallelism (a column then holds the same routed experts, its EDP group, titled with them),
    else whole TP groups making at least eight ranks; TP groups framed; a rank's colour is its EP index
    (its TP rank without expert parallelism).  The rank of ``slices`` is outlined, and its table of
    slices sits below."""
    palette = [OKABE_ITO[k] for k in ("sky", "orange", "green", "yellow", "blue", "vermillion", "purple")] + ["#999999"]
    rank, stage = slices["rank"], slices["stage"]
    tp_len, ep_len = len(groups["tp"][0]), len(groups["ep"][0]) * len(groups["etp"][0])
    n = slices["ranks"]
    expert = ep_len > 1
    row_len = rank_row(tp_len, ep_len, n)
    color = slices["ep_of_rank"] if expert else slices["tp_of_rank"]
    cell = 40                                   # a rank's cell, pt: room for "224–255" in the column titles
    body = []
    # the pipeline: one cell per stage, this one marked
    cells = "".join(
        f'<TD PORT="s{i}" BGCOLOR="{"#333333" if i == stage else "#FFFFFF"}">'
        f'{_font(str(i), SMALL_SIZE, "#FFFFFF" if i == stage else "#333333")}</TD>'
        for i in range(slices["pp"]))
    body.append(f'  pipe [shape=plaintext, label=<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="2">'
                f'<TR><TD COLSPAN="{slices["pp"]}" BORDER="0">{_font(escape(words["stage"]), SMALL_SIZE)}</TD></TR>'
                f'<TR>{cells}</TR></TABLE>>];')
    # the stage's ranks
    per_row = row_len // tp_len
    cols = _pick(per_row, {rank % row_len // tp_len}, max(3, MAX_RANKS // tp_len))
    rows_shown = _pick(n // row_len, {rank // row_len}, MAX_ROWS)
    gap = f'<TD BORDER="0" WIDTH="16">{_font("…", FONT_SIZE)}</TD>'

    def group_cell(inner: str, frame: bool) -> str:
        return (f'<TD BORDER="{1 if frame else 0}" CELLPADDING="1" COLOR="#333333"><TABLE BORDER="0" CELLBORDER="1" '
                f'CELLSPACING="0" CELLPADDING="3" COLOR="#FFFFFF"><TR>{inner}</TR></TABLE></TD>')

    rows = []
    if expert:
        head = []
        for c in cols:
            if c is None:
                head.append(gap)
                continue
            head.append(group_cell("".join(
                f'<TD WIDTH="{cell}" BORDER="0">{_font(escape(words["experts"][color[r]]), SMALL_SIZE)}</TD>'
                for r in range(c * tp_len, (c + 1) * tp_len)), False))
        rows.append(f'<TR><TD BORDER="0" ALIGN="RIGHT">{_font(escape(words["columns"]), SMALL_SIZE)}</TD>'
                    f'{"".join(head)}</TR>')
    for row in rows_shown:
        if row is None:
            rows.append(f'<TR><TD BORDER="0"></TD><TD BORDER="0" COLSPAN="{len(cols)}">{_font("⋮", FONT_SIZE)}</TD></TR>')
            continue
        tds = []
        for c in cols:
            if c is None:
                tds.append(gap)
                continue
            first = row * row_len + c * tp_len
            tds.append(group_cell("".join(
                f'<TD WIDTH="{cell}" BGCOLOR="{_lighten(palette[color[r] % len(palette)], 0.45)}"'
                + (' BORDER="3" COLOR="#000000"' if r == rank else "")
                + f'>{_font(str(r), FONT_SIZE, bold=r == rank)}</TD>' for r in range(first, first + tp_len)), tp_len > 1))
        fmt = words["ep_row"] if expert and row_len == ep_len else words["row"]
        title = fmt.format(index=row, first=row * row_len, last=(row + 1) * row_len - 1)
        rows.append(f'<TR><TD BORDER="0" ALIGN="RIGHT">{_font(escape(title), SMALL_SIZE)}</TD>{"".join(tds)}</TR>')
    body.append(f'  grid [shape=plaintext, label=<<TABLE BORDER="0" CELLSPACING="2" CELLPADDING="0">'
                f'<TR><TD COLSPAN="{len(cols) + 1}">{_font(escape(words["grid"]), SMALL_SIZE, bold=True)}</TD></TR>'
                f'{"".join(rows)}</TABLE>>];')
    # the rank's slices
    head = "".join(f'<TD ALIGN="RIGHT">{_font(_lines([escape(x) for x in h.split(chr(10))]), SMALL_SIZE, bold=True)}</TD>'
                   for h in words["slice_columns"])
    trs = "".join(f'<TR><TD ALIGN="LEFT">{_font(escape(f[0]), SMALL_SIZE)}</TD>'
                  + "".join(f'<TD ALIGN="RIGHT">{_font(escape(x), SMALL_SIZE)}</TD>' for x in f[1:]) + "</TR>"
                  for f in families)
    body.append(f'  slices [shape=plaintext, label=<<TABLE BORDER="3" COLOR="#000000" CELLBORDER="0" CELLSPACING="0" '
                f'CELLPADDING="3"><TR><TD ALIGN="LEFT" COLSPAN="{len(words["slice_columns"]) + 1}">'
                f'{_font(escape(words["rank"]), SMALL_SIZE, bold=True)}</TD></TR>'
                f'<TR><TD ALIGN="LEFT" VALIGN="BOTTOM">{_font("tensor family", SMALL_SIZE, bold=True)}</TD>{head}</TR>'
                f'{trs}</TABLE>>];')
    body.append(f'  pipe:s{stage}:s -> grid:n;')
    body.append('  grid -> slices [style=invis];')
    return Diagram(_graph(body, ranksep=0.2), words["grid"])
