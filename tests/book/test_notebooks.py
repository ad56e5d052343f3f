"""Tests for the report's notebooks (MyST-markdown notebooks in notebooks/*.md).

(a) execution: every notebook runs top to bottom in a fresh python3 kernel (cwd = notebooks/);
(b) thin-notebook lint: code cells only call memlib and display results; all arithmetic,
    symbols and function definitions live in memlib, not in the notebooks;
(c) prose lint: no number is typed by hand in the prose of notebooks/*.md and book/*.md;
    numbers reach the text through {glue:text} (or math), so they always match memlib.

The lints parse text only (no kernel) and run in milliseconds.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.md"))
PROSE_FILES = NOTEBOOKS + sorted((ROOT / "book").glob("*.md"))
KERNEL_TIMEOUT_S = 300


def _ids(paths):
    return [p.relative_to(ROOT).as_posix() for p in paths]


# ---------------------------------------------------------------------------------------------
# Allow-lists (the only place to extend them).
# ---------------------------------------------------------------------------------------------

# (b) Numeric literals other than 0, 1, 2 may appear in a code cell only inside the value of a
# keyword argument with one of these names: presentation settings, never quantities of the model.
ALLOWED_NUMERIC_LITERALS = {0, 1, 2}
PRESENTATION_KEYWORDS = frozenset(
    {
        "figsize", "dpi", "width", "height", "alpha", "lw", "linewidth", "linewidths",
        "ls", "markersize", "ms", "markeredgewidth", "mew", "fontsize", "labelsize",
        "titlesize", "rotation", "ncol", "ncols", "nrows", "bbox_to_anchor", "pad", "labelpad",
        "borderpad", "framealpha", "handlelength", "columnspacing", "capsize", "zorder",
        "wspace", "hspace", "s", "size", "aspect",
    }
)

# (b) Names that mean symbolic maths is being done in the notebook instead of in memlib.
FORBIDDEN_NAMES = frozenset({"sympy", "sp", "symbols", "Symbol", "Symbols"})
FORBIDDEN_MODULES = ("sympy",)

# (c) Tokens that legitimately contain digits in prose. Each entry is a regular expression;
# matches are blanked before looking for digits.
PROSE_DIGIT_ALLOWLIST = [
    r"DeepSeek-V[23](?:\.\d)?(?:-Lite)?",         # model names: DeepSeek-V2, DeepSeek-V3, -V2-Lite
    r"\bV[23](?:-Lite)?\b",                       # V2, V3, V2-Lite
    r"\bZeRO-[0-3](?:/[0-3])*\b",                 # ZeRO-0/1/2/3, ZeRO-1/2
    r"\b(?:fp|FP|bf|BF|tf|TF)(?:8|16|32)\b",      # number formats fp8, BF16, FP32, TF32
    r"\b(?:E4M3|E5M2)\b",                         # FP8 sub-formats
    r"\b1F1B\b",                                  # pipeline schedule
    r"\b[Rr]ank 0\b",                              # the first pipeline rank, by its name
    r"\b(?:A100|A800|H100|H800|H200|H20|B200|GB200)\b",  # GPU names
    r"(?:arXiv[: ]?\s*)?\b\d{2}(?:0[1-9]|1[0-2])\.\d{4,5}(?:v\d+)?\b",  # arXiv ids: 2502.07846
    r"§\s?\d+(?:\.\d+)*",                         # section references: §3.2
    r"\b(?:Tables?|Fig\.|Figures?)\s\d+(?:(?:,\s|\sand\s)\d+)*",  # a cited work's Table 8, Tables 7 and 8
    r"(?<=[(,])\s?(?:19[5-9]\d|20[0-3]\d)[a-z]?(?=\s?[),;])",  # citation years: (2025), "et al., 2020"
    r"(?<=\bet al\. )(?:19[5-9]\d|20[0-3]\d)[a-z]?\b",          # "Zhang et al. 2025"
]
_PROSE_ALLOW_RE = re.compile("|".join(f"(?:{p})" for p in PROSE_DIGIT_ALLOWLIST))

# (c) Directives whose body is not prose (dropped whole). Other directives (note, admonition,
# figure, glue:figure, table, ...) keep their body, which is linted.
NON_PROSE_DIRECTIVES = frozenset(
    {
        "code-cell", "raw-cell", "code", "code-block", "sourcecode", "literalinclude",
        "math", "glue:math", "glue:any", "bibliography", "raw", "eval-rst", "toctree",
        "tableofcontents", "csv-table",
    }
)


# ---------------------------------------------------------------------------------------------
# MyST parsing helpers
# ---------------------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")


@dataclass
class CodeCell:
    path: Path
    line: int  # 1-based line of the first source line
    source: str


def _strip_front_matter(lines: list[str]) -> list[str]:
    """Blank the YAML front matter (keeps line numbers)."""
    if lines and lines[0].strip() == "---":
        for i in range(1, len(lines)):
            if lines[i].strip() == "---":
                return [""] * (i + 1) + lines[i + 1 :]
    return lines


def _directive_name(info: str) -> str | None:
    m = re.match(r"\s*\{([^}]+)\}", info)
    return m.group(1).strip() if m else None


def code_cells(path: Path) -> list[CodeCell]:
    """The {code-cell} blocks of a MyST-markdown notebook, without their option lines."""
    lines = _strip_front_matter(path.read_text(encoding="utf-8").splitlines())
    cells: list[CodeCell] = []
    i = 0
    while i < len(lines):
        m = _FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group("fence")
        close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if _directive_name(m.group("info")) == "code-cell":
            body = lines[i + 1 : j]
            start = i + 2
            # options: a leading `---` yaml block or leading `:key: value` lines
            if body and body[0].strip() == "---":
                k = 1
                while k < len(body) and body[k].strip() != "---":
                    k += 1
                body, start = body[k + 1 :], start + k + 1
            while body and re.match(r"^\s*:[\w-]+:", body[0]):
                body, start = body[1:], start + 1
            cells.append(CodeCell(path, start, "\n".join(body)))
        i = j + 1
    return cells


# ---------------------------------------------------------------------------------------------
# (b) thin-notebook lint
# ---------------------------------------------------------------------------------------------

_ARITH_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)


def _is_str(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    # "a" + "b" + "c": the left operand is itself a string concatenation
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _is_str(node.left) and _is_str(node.right)


def lint_code(source: str) -> list[tuple[int, str]]:
    """Problems in one code cell as (line within the cell, message)."""
    # IPython magics / shell escapes are not Python syntax
    source = "\n".join("" if re.match(r"^\s*[%!]", ln) else ln for ln in source.split("\n"))
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [(exc.lineno or 1, f"syntax error: {exc.msg}")]

    problems: list[tuple[int, str]] = []

    # literals that sit inside an allowed presentation keyword argument
    allowed_literals: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in PRESENTATION_KEYWORDS:
            allowed_literals.update(id(sub) for sub in ast.walk(node.value))

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 1)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            kind = {ast.Lambda: "lambda", ast.ClassDef: "class"}.get(type(node), "def")
            problems.append((line, f"`{kind}` in a notebook: put it in memlib"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    problems.append((line, f"imports {alias.name}: symbolic maths belongs in memlib"))
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                problems.append((line, f"imports from {node.module}: symbolic maths belongs in memlib"))
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            problems.append((line, f"uses `{node.id}`: symbolic maths belongs in memlib"))
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES - {"sp"}:
            problems.append((line, f"uses `.{node.attr}`: symbolic maths belongs in memlib"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, _ARITH_OPS):
            if not (isinstance(node.op, ast.Add) and _is_str(node.left) and _is_str(node.right)):
                problems.append((line, f"arithmetic `{type(node.op).__name__}` in a notebook: compute it in memlib"))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, _ARITH_OPS):
            problems.append((line, f"arithmetic `{type(node.op).__name__}=` in a notebook: compute it in memlib"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float, complex))
            and not isinstance(node.value, bool)
            and node.value not in ALLOWED_NUMERIC_LITERALS
            and id(node) not in allowed_literals
        ):
            problems.append((line, f"numeric literal {node.value!r}: take numbers from memlib / presets"))
    return sorted(set(problems))


# ---------------------------------------------------------------------------------------------
# (c) prose lint
# ---------------------------------------------------------------------------------------------


def _blank_keep_newlines(m: re.Match) -> str:
    return "\n" * m.group(0).count("\n")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) for the prose of a MyST file, with everything that is not prose removed."""
    lines = _strip_front_matter(text.splitlines())

    # fenced blocks: drop the body of non-prose directives and plain code fences; for other
    # directives drop the fence and option lines but keep the body (it is prose).
    out: list[str] = []
    stack: list[tuple[str, int]] = []  # open prose directives: (fence char, length)
    i = 0
    while i < len(lines):
        line = lines[i]
        if stack:
            ch, n = stack[-1]
            if re.match(rf"^\s*{re.escape(ch)}{{{n},}}\s*$", line):
                stack.pop()
                out.append("")
                i += 1
                continue
        m = _FENCE_RE.match(line)
        if m:
            fence, info = m.group("fence"), m.group("info")
            name = _directive_name(info)
            if name is None or name in NON_PROSE_DIRECTIVES:
                close = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
                j = i + 1
                while j < len(lines) and not close.match(lines[j]):
                    j += 1
                out.extend([""] * (min(j, len(lines) - 1) - i + 1))
                i = j + 1
                continue
            stack.append((fence[0], len(fence)))
            out.append("")
            i += 1
            # a leading `---` yaml option block of the directive
            if i < len(lines) and lines[i].strip() == "---":
                j = i + 1
                while j < len(lines) and lines[j].strip() != "---":
                    j += 1
                out.extend([""] * (j - i + 1))
                i = j + 1
            continue
        out.append(line)
        i += 1

    text = "\n".join(out)
    # multi-line constructs first, keeping line numbers
    text = re.sub(r"<!--.*?-->", _blank_keep_newlines, text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$(?:[ \t]*\([^)\n]*\))?", _blank_keep_newlines, text, flags=re.S)
    text = re.sub(r"\\begin\{(\w+\*?)\}.*?\\end\{\1\}", _blank_keep_newlines, text, flags=re.S)

    result = []
    for n, line in enumerate(text.split("\n"), start=1):
        if re.match(r"^\s*\(.*\)=\s*$", line):           # labels (name)=
            continue
        if re.match(r"^\s*:[\w-]+:(\s.*)?$", line):       # directive options :label: ...
            continue
        if re.match(r"^\s*\+\+\+", line):                 # MyST notebook cell breaks (+ metadata)
            continue
        line = re.sub(r"\{[\w:.+-]+\}`[^`]*`", " ", line)  # roles: {glue:text}`..`, {cite}`..`, {eq}`..`
        line = re.sub(r"``.*?``|`[^`]*`", " ", line)      # inline code
        line = line.replace(r"\$", " ")
        line = re.sub(r"\$[^$]+\$", " ", line)            # inline math
        line = re.sub(r"\]\([^)]*\)", "]", line)          # link targets
        line = re.sub(r"<https?://[^>]*>|https?://\S+", " ", line)  # URLs
        line = re.sub(r"\[\^[^\]]+\]", " ", line)         # footnote references
        line = re.sub(r"^\s*#+\s", "", line)              # heading markers
        line = _PROSE_ALLOW_RE.sub(" ", line)
        result.append((n, line))
    return result


def lint_prose(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in prose_lines(text) if re.search(r"\d", line)]


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes(path: Path) -> None:
    """Runs the notebook top to bottom.  Under CI (``MEMLIB_REQUIRE_BOOK=1``) the book build that ran
    just before already executed every notebook with errors fatal; there the test checks that the
    build produced this chapter's page from this notebook instead of executing it a second time."""
    import os

    if os.environ.get("MEMLIB_REQUIRE_BOOK") == "1":
        page = ROOT / "_build" / "html" / "notebooks" / (path.stem + ".html")
        assert page.exists(), f"{page} was not built"
        assert page.stat().st_mtime >= path.stat().st_mtime, f"{page} is older than {path}"
        text = page.read_text(encoding="utf-8")
        assert "Traceback" not in text and 'class="output traceback' not in text
        return
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    nb = jupytext.read(path)
    client = nbclient.NotebookClient(
        nb,
        timeout=KERNEL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_thin(path: Path) -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{cell.line + line - 1}: {msg}"
        for cell in code_cells(path)
        for line, msg in lint_code(cell.source)
    ]
    assert not problems, "notebook code must only call memlib:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", PROSE_FILES, ids=_ids(PROSE_FILES))
def test_prose_has_no_hand_typed_numbers(path: Path) -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{n}: {line}" for n, line in lint_prose(path.read_text(encoding="utf-8"))
    ]
    assert not problems, (
        "digits in prose: use {glue:text} (or math), or extend PROSE_DIGIT_ALLOWLIST:\n" + "\n".join(problems)
    )


# --- the lints themselves --------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import sympy",
        "import sympy as sp",
        "from sympy import symbols",
        "x = sp.Symbol('x')",
        "a, b = symbols('a b')",
        "def f():\n    return 0",
        "f = lambda: 0",
        "y = a * b",
        "y = a + 1",
        "y = a - b",
        "y = a / b",
        "y = a // b",
        "y = a % b",
        "y = a ** b",
        "y = 'a' + b",
        "y = '%d' % b",
        "y += 1",
        "m = cfg(hidden=7168)",
        "m = memlib.estimate(dp=32)",
        "x = 0.5",
        "x = v[3]",
    ],
)
def test_code_lint_rejects(source: str) -> None:
    assert lint_code(source), source


@pytest.mark.parametrize(
    "source",
    [
        "from myst_nb import glue\nglue('k', 'ok', display=False)",
        "import memlib\nr = memlib.estimate(memlib.preset('deepseek-v3'))",
        "s = 'a' + 'b' + f'{x:.3e}'",
        "fig, ax = plt.subplots(figsize=(6.4, 3.5), dpi=150)",
        "ax.bar(x, y, width=0.8, alpha=0.7)\nax.legend(ncol=3, fontsize=8, bbox_to_anchor=(1.02, 1))",
        "x = v[0]\ny = v[-1]\nz = v[2]",
        "%matplotlib inline\nx = 1",
    ],
)
def test_code_lint_accepts(source: str) -> None:
    assert not lint_code(source), lint_code(source)


@pytest.mark.parametrize(
    "text",
    [
        "The model has 671B parameters.",
        "# Chapter 3",
        ":::{note}\nUse 8 GPUs.\n:::",
        "A hidden size of 7168 and 2048 experts.",
        "Sequence length 4K.",
    ],
)
def test_prose_lint_rejects(text: str) -> None:
    assert lint_prose(text), text


def test_prose_lint_accepts() -> None:
    text = "\n".join(
        [
            "---",
            "kernelspec: {name: python3}",
            "---",
            "(sec-zero-3)=",
            "# ZeRO-3 and DeepSeek-V3",
            "DeepSeek-V2, DeepSeek-V2-Lite, V3, ZeRO-0/1/2/3, BF16 weights, fp32 master copies, FP8 (E4M3), 1F1B.",
            "See §3.2 of {cite}`zhang2025memory` (arXiv:2502.07846; Zhang and Su, 2025) on H800 and H100.",
            "Total {glue:text}`total_gib:.1f` GiB, eq. {eq}`eq-total`, {numref}`fig-1`, {math}`2 b s h`.",
            "Inline $16 \\Psi$ and `code 123` and [a link](https://example.org/x1).",
            "$$",
            "M = 2 \\Psi + 12 \\Psi",
            "$$ (eq-total)",
            "```{code-cell} ipython3",
            "x = 123",
            "```",
            "```{math}",
            ":label: eq-2",
            "a = 4 b",
            "```",
            ":::{figure} fig.png",
            ":name: fig-1",
            ":width: 80%",
            "A caption without numbers.",
            ":::",
        ]
    )
    assert not lint_prose(text), lint_prose(text)
