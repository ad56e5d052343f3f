"""The book's structure: three parts in the table of contents (the argument, beyond the paper, appendices) with
the chapters numbered across them; the notation said once (a page, and each chapter's new symbols only); the
"change the configuration and rerun" paragraph once; and what book/_ext does for the PDF (the parts as \\part,
the configuration cells' input left out, the bibliography's labels the citations' own).

Source-level, except the checks of the built HTML, which are skipped when the book is not built (``make book``)
unless ``MEMLIB_REQUIRE_BOOK=1``.
"""
from __future__ import annotations

import html
import importlib.util
import os
import re
from pathlib import Path

import pytest
import yaml

from memlib.core.symbols import REGISTRY
from memlib.report import notation

ROOT = Path(__file__).resolve().parents[2]
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
HTML = ROOT / "_build" / "html"
REQUIRE = os.environ.get("MEMLIB_REQUIRE_BOOK") == "1"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md"))


def _ext():
    spec = importlib.util.spec_from_file_location("memlib_book", ROOT / "book" / "_ext" / "memlib_book.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _built() -> None:
    if not (HTML / "index.html").exists():
        if REQUIRE:
            pytest.fail("the book is not built (make book)")
        pytest.skip("the book is not built (make book)")


def _text(page: Path) -> str:
    """A built page's visible text, without scripts, styles, code and typeset math."""
    s = page.read_text(encoding="utf-8")
    s = re.sub(r"<(script|style|pre|code)\b.*?</\1>", "", s, flags=re.S)
    s = re.sub(r'<(span|div) class="(?:[\w-]+ )*math[^"]*"[^>]*>.*?</\1>', "", s, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", s))


def _pages() -> list[Path]:
    return sorted(HTML.glob("notebooks/*.html")) + sorted(HTML.glob("book/*.html"))


# --- the parts -------------------------------------------------------------------------------------------------
def _files(caption_start: str) -> list[str]:
    part = next(p for p in TOC["parts"] if p["caption"].startswith(caption_start))
    return [c["file"] for c in part["chapters"]]


def test_three_parts_in_the_books_order():
    assert [p["caption"] for p in TOC["parts"]] == ["Part I: The paper and DeepSeek-V3", "Part II: Beyond the paper",
                                                   "Appendices"]
    chapters = [Path(f).name[:2] for f in _files("Part I") + _files("Part II")]
    assert chapters == [f"{i:02d}" for i in range(1, 14)]            # 1-9 the argument, 10-13 beyond it
    assert [Path(f).name[:2] for f in _files("Part II")] == ["10", "11", "12", "13"]
    assert _files("Appendices")[0] == "notebooks/14_errata"
    assert {"book/notation", "book/summary", "book/references"} <= set(_files("Appendices"))
    every = [c["file"] for p in TOC["parts"] for c in p["chapters"]]
    assert sorted(f"notebooks/{p.stem}" for p in NOTEBOOKS) == sorted(f for f in every if f.startswith("notebooks/"))
    assert TOC["defaults"]["numbered"] is True


def test_chapters_are_numbered_across_the_parts():
    """Chapter 14 is still 14 (the errata's and the equations' numbers say so), not 1 of the appendices."""
    _built()
    index = _text(HTML / "notebooks" / "14_errata.html")
    assert re.search(r"\b14\. Errata", index)
    assert re.search(r"\b10\. Validation", _text(HTML / "notebooks" / "10_validation.html"))
    sidebar = (HTML / "book" / "index.html").read_text(encoding="utf-8")
    for caption in ("Part I: The paper and DeepSeek-V3", "Part II: Beyond the paper", "Appendices"):
        assert caption in html.unescape(sidebar)


def test_part_commands():
    ext = _ext()
    assert ext.part_command("Part I: The paper and DeepSeek-V3") == r"\part{The paper and DeepSeek-V3}"
    assert ext.part_command("Appendices") == r"\part{Appendices}"


# --- the notation ------------------------------------------------------------------------------------------------
def test_the_notation_page_lists_every_symbol_once_with_where_it_is_introduced():
    page = notation.notation_page()
    rows = [r for r in page.splitlines()[2:]]
    assert len(rows) == len(REGISTRY)
    assert "| $h$ | hidden dimension | elements | `hidden_size` | {ref}`arch` |" in rows
    assert any(r.startswith("| $M$ |") and r.endswith("{ref}`ch-together` |") for r in rows)
    assert any(r.startswith("| $\\mathrm{CP}$ |") and r.endswith("{ref}`ch-static` |") for r in rows)


def test_the_notation_page_introduces_no_symbol_of_a_block_the_model_lacks():
    """Llama-3-8B's chapter 2 introduces no MLA or MoE symbol (its sections on them are dropped): its notation page
    marks them introduced by no chapter and says why; DeepSeek-V3's links them to chapter 2 and dashes GQA's."""
    llama, v3 = notation.notation_page("llama-3-8b"), notation.notation_page("deepseek-v3")
    row = lambda page, sym: next(r for r in page.splitlines() if r.startswith(f"| ${sym}$ |"))  # noqa: E731
    assert row(llama, "d_c").endswith("| — |") and row(llama, "N").endswith("| — |")
    assert row(llama, "h").endswith("{ref}`arch` |") and row(llama, "n_{kv}").endswith("{ref}`arch` |")
    assert row(v3, "d_c").endswith("{ref}`arch` |") and row(v3, "n_{kv}").endswith("| — |")
    assert "multi-head latent attention" in notation.foreign_note("llama-3-8b")
    assert "(grouped-query attention)" in notation.foreign_note("deepseek-v3")


def test_a_chapter_shows_only_the_symbols_it_introduces():
    from memlib import PAPER_TRAINING, estimate
    from memlib.report.tables import _not_own
    est = estimate("deepseek-v3", PAPER_TRAINING)
    seen: set[str] = set()
    for chapter in notation.CHAPTER_SYMBOLS:
        new = notation.new_symbols(chapter)
        assert not set(new) & seen, chapter                     # nothing listed twice in the book
        seen |= set(new)
        text = notation.chapter_notation(chapter, est.model, est.train)
        table = [line for line in text.splitlines() if line.startswith("| $")]
        # the symbols of blocks the model lacks (DeepSeek-V3: grouped-query attention's n_kv, d_head) are not shown
        assert len(table) == len([k for k in new if k not in _not_own(est.model)])
    ch08 = notation.chapter_notation("ch08", est.model, est.train)
    assert "| $M$ |" in ch08 and "| $\\mathrm{DP}$ |" not in ch08
    assert "$\\mathrm{DP}$ = 32" in ch08                            # the earlier symbols, with their values here
    assert notation.chapter_notation("ch03", est.model, est.train).startswith("This chapter introduces no symbol.")


def test_every_chapter_with_a_notation_section_links_the_notation_page():
    for path in NOTEBOOKS:
        text = path.read_text(encoding="utf-8")
        if re.search(r"^## Notation$", text, re.M):
            section = text[text.index("## Notation"):]
            section = section[:section.index("```{glue:md}")]
            assert "{ref}`notation`" in section, path.name
            assert "{ref}`arch` has them all" not in section, path.name


# --- the configuration paragraph, once ---------------------------------------------------------------------------
def _prose(text: str) -> str:
    return re.sub(r"^```\{code-cell\}.*?^```$", "", text, flags=re.S | re.M)


def test_how_to_change_the_configuration_is_said_once():
    """The introduction's "Play with the knobs" says how to change a configuration and rerun; the chapters
    link it, and repeat none of it."""
    said = [p.name for p in NOTEBOOKS if re.search(r"rerun the\s+notebook top to bottom|rerun the chapter top to bottom",
                                                   _prose(p.read_text(encoding="utf-8")))]
    assert said == ["01_introduction.md"]
    intro = (ROOT / "notebooks" / "01_introduction.md").read_text(encoding="utf-8")
    assert "(intro-knobs)=" in intro
    for path in NOTEBOOKS[1:]:
        if path.stem == "11_measured_peaks":
            continue
        assert "{ref}`intro-knobs`" in _prose(path.read_text(encoding="utf-8")), path.name


def test_the_pdf_leaves_the_hidden_inputs_out():
    from docutils import nodes

    ext = _ext()
    doc = nodes.container(classes=["cell", "tag_hide-input"])
    doc += nodes.container("", nodes.literal_block("", "MODEL = load_model(BOOK_MODEL)"), classes=["cell_input"])
    doc += nodes.container("", nodes.paragraph("", "output"), classes=["cell_output"])
    shown = nodes.container(classes=["cell"])
    shown += nodes.container("", nodes.literal_block("", "x = 1"), classes=["cell_input"])
    root = nodes.section()
    root += [doc, shown]
    assert ext.drop_hidden_inputs(root) == 1
    assert "MODEL" not in root.astext() and "output" in root.astext() and "x = 1" in root.astext()


# --- what the HTML shows -----------------------------------------------------------------------------------------
#: an en dash (or an em dash) where "--" of a command-line flag was typeset: before a lower-case option name
DASHED_FLAG = re.compile(r"[–—](?=[a-z][a-z0-9]*(?:-[a-z0-9]+)+\b)")
#: TeX left as text: "$...$" that MathJax never saw
RAW_MATH = re.compile(r"\$[^$\n]{1,200}\$")


#: a percentage written with a space (or a no-break or thin space) before its sign: the book writes "97.4%"
#: (memlib.report.format.percent), never "82 %"
SPACED_PERCENT = re.compile(r"\d[ \u00a0\u202f\u2009]%")


def test_the_text_checks_can_fail():
    assert SPACED_PERCENT.findall("errors of 82 % and 97.4%, 5\u00a0%") == ["2 %", "5\u00a0%"]
    assert DASHED_FLAG.findall("ZeRO 2 needs –use-distributed-optimizer") == ["–"]
    assert DASHED_FLAG.findall("stages 1–14, 2–3 GiB — and so on, pages 10–20") == []
    assert RAW_MATH.findall("also has $d_{h}$ = 128") == ["$d_{h}$"]


def test_no_flag_is_typeset_with_an_en_dash():
    _built()
    bad = {p.name: DASHED_FLAG.findall(_text(p)) for p in _pages()}
    assert not {k: v for k, v in bad.items() if v}
    assert "(--fp8-param-gather)" in _text(HTML / "notebooks" / "05_zero.html")    # a flag in a glued table


def test_a_percentage_is_written_one_way():
    _built()
    bad = {p.name: SPACED_PERCENT.findall(_text(p))[:3] for p in _pages()}
    assert not {k: v for k, v in bad.items() if v}
    assert re.search(r"\d%", _text(HTML / "notebooks" / "11_measured_peaks.html"))   # the style the book keeps


def test_no_raw_math_in_the_html():
    _built()
    bad = {p.name: RAW_MATH.findall(_text(p))[:3] for p in _pages()}
    assert not {k: v for k, v in bad.items() if v}


# --- the bibliography ---------------------------------------------------------------------------------------------
def test_bibliography_labels_are_the_citations_author_year_and_distinct():
    from pybtex.database import parse_file

    ext = _ext()
    bib = parse_file(str(ROOT / "book" / "references.bib"))
    labels = {k: ext.author_year_label(e) for k, e in bib.entries.items()}
    assert labels["zhang2025memory"] == "Zhang and Su, 2025"
    assert labels["deepseekv3"] == "DeepSeek-AI, 2024b"                 # alpha made "DeepSeekAI4b" of it
    assert labels["korthikanti2022"] == "Korthikanti et al., 2022"
    assert len(set(labels.values())) == len(labels)
    assert all(re.fullmatch(r"[^\\{}]+, (\d{4}[a-z]?|n\.d\.)", v) for v in labels.values()), labels


def test_the_bibliography_prints_its_labels_and_no_backslash():
    _built()
    refs = _text(HTML / "book" / "references.html")
    body = refs[refs.index("References#"):]
    assert "\\" not in body
    shown = set(re.findall(r"\[([^\]\n]+, (?:\d{4}[a-z]?|n\.d\.))\]", body))
    cited = set()
    for page in _pages():
        for group in re.findall(r"\[([^\[\]\n]+?, (?:\d{4}[a-z]?|n\.d\.))\]", _text(page)):
            cited |= set(re.findall(r"(.+?, (?:\d{4}[a-z]?|n\.d\.))(?:, |$)", group))   # [A, 2025, B, 2024]
    assert "Zhang and Su, 2025" in shown and "DeepSeek-AI, 2024b" in shown
    assert cited <= shown, cited - shown
    ids = re.findall(r"arXiv:(\d{4}\.\d{4,5})", body)
    assert ids and len(ids) == len(set(ids))                           # each arXiv id printed once


# --- the PDF's LaTeX --------------------------------------------------------------------------------------------
def test_the_latex_has_the_parts_and_no_configuration_cell():
    tex_path = ROOT / "_build" / "latex" / "report.tex"
    if not tex_path.is_file():
        if REQUIRE:
            pytest.fail("the PDF is not built (make pdf)")
        pytest.skip("the PDF is not built (make pdf)")
    tex = tex_path.read_text(encoding="utf-8")
    parts = [tex.index(r"\part{The paper and DeepSeek-V3}"), tex.index(r"\part{Beyond the paper}"),
             tex.index(r"\part{Appendices}")]
    assert parts == sorted(parts)
    assert tex.index(r"\chapter{Introduction}") > parts[0] and tex.index(r"\chapter{Errata}") > parts[2]
    assert tex.index(r"\chapter{Validation against real implementations}") > parts[1]
    assert "The configuration of this chapter" not in tex                # the hidden inputs stay out
    assert r"\renewcommand{\contentsname}{Part I" not in tex


# --- the glossary ------------------------------------------------------------------------------------------------
def glossary_terms(text: str) -> list[str]:
    """The terms of the ``{glossary}`` directives of a MyST page (the summary's MoE terms are a second one, in an
    ``{only} has_moe`` block): their unindented lines."""
    bodies = re.findall(r"^```\{glossary\}\n(.*?)^```$", text, re.S | re.M)
    return [line for body in bodies for line in body.splitlines() if line and not line[0].isspace()]


def test_the_glossary_defines_the_books_terms_once():
    terms = glossary_terms((ROOT / "book" / "summary.md").read_text(encoding="utf-8"))
    assert len(terms) == len(set(terms))
    for t in ("1F1B", "interleaved", "DualPipe", "ZeRO-k", "SP", "CP", "EP", "ETP", "EDP", "recompute policy",
              "profile", "steady peak", "FP8 recipe", "peak_allocated"):
        assert t in terms, t
    assert glossary_terms("```{glossary}\nA\n  one\n\nB\nC\n  two\n```\n") == ["A", "B", "C"]


def test_chapters_link_the_glossary():
    used = set()
    for path in NOTEBOOKS:
        used |= {re.sub(r".*<(.*)>", r"\1", t) for t in re.findall(r"\{term\}`([^`]+)`", path.read_text(encoding="utf-8"))}
    terms = set(glossary_terms((ROOT / "book" / "summary.md").read_text(encoding="utf-8")))
    assert {"SP", "1F1B", "DualPipe", "recompute policy"} <= used <= terms


def test_an_html_only_section_is_left_out_of_the_pdf():
    """A section marked ``{.html-only}`` (the reference appendix's table of every functional test) is dropped where the builder's tag
    ``html`` is not set (the LaTeX build) and kept in the HTML build; the chapter that has one says in an
    ``{only} latex`` block where the PDF's reader finds it."""
    from types import SimpleNamespace

    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.utils import new_document

    ext = _ext()

    def built(tags: set[str]) -> list[str]:
        doc = new_document("x", get_default_settings())
        for cls in ([], ["html-only"]):
            sec = nodes.section(classes=cls)
            sec += nodes.title("", "every case" if cls else "the misses")
            doc += sec
        app = SimpleNamespace(tags=SimpleNamespace(has=lambda t: t in tags, eval_condition=lambda e: e in tags))
        ext._drop_sections(app, doc)
        return [s.astext() for s in doc.findall(nodes.title)]

    assert built({"html"}) == ["the misses", "every case"]
    assert built({"latex"}) == ["the misses"]
    for path in NOTEBOOKS:
        text = path.read_text(encoding="utf-8")
        if "{.html-only}" in text:
            assert re.search(r"^`{3,4}\{only\} latex\n(?:.*\n)*?.*HTML book", text, re.M), path.name


def test_a_long_table_may_break_across_pages_but_not_in_a_box():
    """A table of more than LONG_ROWS rows is a longtable in the PDF (it breaks across pages instead of leaving
    its page's end empty), except inside an admonition, whose frame cannot hold one."""
    from docutils import nodes

    ext = _ext()

    def table(rows: int):
        body = nodes.tbody("", *[nodes.row("", nodes.entry("", nodes.paragraph("", str(i)))) for i in range(rows)])
        return nodes.table("", nodes.tgroup("", nodes.colspec(colwidth=1), body))

    assert ext.breakable(table(ext.LONG_ROWS + 1)) and not ext.breakable(table(ext.LONG_ROWS))
    boxed = table(ext.LONG_ROWS + 1)
    nodes.note("", boxed)
    assert not ext.breakable(boxed)
