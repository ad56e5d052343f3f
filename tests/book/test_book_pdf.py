"""The PDF prints: every exact count of the book appears whole in its text, no word runs off the page, the
References chapter holds the bibliography, and no page is blank.

Reads ``_build/latex/report.pdf`` and ``report.tex`` (``make pdf``) with poppler's ``pdftotext``; skipped when
the PDF or pdftotext is missing, unless ``MEMLIB_REQUIRE_BOOK=1`` (CI sets it), which turns a skip into a
failure.  The headline totals looked for are computed here from memlib, not typed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from memlib import estimate
from memlib.paper import analysed_stage, paper_training
from memlib.model.params import activated_params, model_params, values
from memlib.report.book import BOOK_MODEL
from memlib.report.format import fmt_count

ROOT = Path(__file__).resolve().parents[2]
LATEX = ROOT / "_build" / "latex"
PDF, TEX = LATEX / "report.pdf", LATEX / "report.tex"
REQUIRE = os.environ.get("MEMLIB_REQUIRE_BOOK") == "1"
PDFTOTEXT = shutil.which("pdftotext")

#: an exact count as the book prints it: three groups of digits and more (1,234,567)
COUNT = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3}){2,}(?![\d,]?\d)")
#: how far past the page's right edge less half its margin (1 in) a word may reach, pt: none
EDGE = 36.0


def _need(cond: bool, why: str) -> None:
    if not cond:
        if REQUIRE:
            pytest.fail(why)
        pytest.skip(why)


def missing(counts, text: str) -> list[str]:
    """The counts not printed whole in ``text``: a count cut short ("671,026,404,3") or run into its
    neighbour's text is missing."""
    found = set(COUNT.findall(text))
    return sorted(set(counts) - found)


def off_page(bbox_html: str, edge: float = EDGE) -> list[str]:
    """Words (page: text) that reach beyond the page's width less ``edge`` on the right, or into ``edge`` on
    the left, in ``pdftotext -bbox`` output: the PDF clips them or they run into the margin."""
    out = []
    for n, page in enumerate(re.split(r"<page ", bbox_html)[1:], 1):
        width = float(re.search(r'width="([\d.]+)"', page).group(1))
        for m in re.finditer(r'<word xMin="([\d.]+)" yMin="[\d.]+" xMax="([\d.]+)" yMax="[\d.]+">([^<]*)</word>',
                             page):
            if float(m.group(2)) > width - edge or float(m.group(1)) < edge:
                out.append(f"page {n}: {m.group(3)}")
    return out


def test_the_checks_can_fail():
    assert missing(["671,026,404,352"], "| all 671,026,404,3 | 1,249.88 |") == ["671,026,404,352"]
    assert missing(["671,026,404,352"], "has 671,026,404,352 parameters") == []
    page = ('<page width="612.000000" height="792.000000"><word xMin="72.0" yMin="1" xMax="540.0" yMax="2">ok</word>'
            '<word xMin="590.0" yMin="1" xMax="617.0" yMax="2">backw</word></page>')
    assert off_page(page) == ["page 1: backw"]


@pytest.fixture(scope="module")
def pdf_text() -> dict[str, str]:
    _need(PDF.is_file() and TEX.is_file(), "the PDF is not built (make pdf)")
    _need(PDFTOTEXT is not None, "pdftotext is not installed (apt-get install poppler-utils)")
    def run(*a):
        return subprocess.run([PDFTOTEXT, *a, str(PDF), "-"], capture_output=True, text=True, check=True).stdout

    return {"text": run(), "bbox": run("-bbox"), "pages": run("-layout").split("\f")}


def test_every_exact_count_of_the_source_is_printed_whole(pdf_text):
    tex = TEX.read_text(encoding="utf-8")
    counts = set(COUNT.findall(tex))
    assert len(counts) >= 20, "the LaTeX source prints few exact counts: is it the book?"
    assert missing(counts, pdf_text["text"]) == []


def test_the_headline_totals_are_printed_whole(pdf_text):
    if BOOK_MODEL != "deepseek-v3":
        pytest.skip("the headline totals are DeepSeek-V3's")
    est = estimate("deepseek-v3", paper_training("deepseek-v3"))
    m, vals = est.model, values(est.model)
    totals = [model_params(m).evaluate_total(vals), activated_params(m).evaluate_total(vals),
              est.stages[analysed_stage(est.partition)].parameters]
    assert missing([fmt_count(n) for n in totals], pdf_text["text"]) == []


def test_no_table_cell_runs_into_its_neighbour():
    # LaTeX reports a line wider than its box (a cell's count or formula wider than the column) as an
    # overfull hbox; a few points are a character's overhang, more is text printed over the next cell
    _need(PDF.is_file() and (LATEX / "report.log").is_file(), "the PDF is not built (make pdf)")
    log = (LATEX / "report.log").read_text(encoding="utf-8", errors="replace")
    wide = [float(w) for w in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    assert "Output written on report" in log, "the log of an unfinished run"
    over = [w for w in wide if w > 12.0]
    assert not over, f"{len(over)} lines run past their box, the widest by {max(over)} pt"


def test_no_word_runs_off_the_page(pdf_text):
    off = off_page(pdf_text["bbox"])
    assert not off, f"{len(off)} words beyond the text block's margin: " + "; ".join(off[:20])


def test_no_blank_page_and_the_references_hold_the_bibliography(pdf_text):
    pages = pdf_text["pages"][:-1] if not pdf_text["pages"][-1].strip() else pdf_text["pages"]
    blank = [i + 1 for i, p in enumerate(pages) if len([ln for ln in p.splitlines() if ln.strip()]) <= 2]
    assert blank == [], f"blank pages: {blank}"
    starts = [p for p in pages if re.search(r"^\s*REFERENCES\s*$", p, re.M)]
    assert len(starts) == 1, "no (or more than one) References chapter"
    assert re.search(r"^\s*\[[^\]]+\]\s+\S", starts[0], re.M), "the References chapter's first page has no entry"
    # a chapter (or a running header) of its own called Bibliography, after an empty References chapter
    assert not re.search(r"^\s*Bibliography(\s+\d+)?\s*$", pdf_text["text"], re.M), "a Bibliography chapter"


def test_the_text_block_is_the_one_figures_are_measured_against():
    """The PDF's text block, as its build's log states it, is memlib.report.legibility's: a figure that prints
    at its natural size there keeps its fonts' sizes (tests/report/test_figure_legibility.py)."""
    from memlib.report.legibility import TEXT_HEIGHT_IN, TEXT_WIDTH_IN

    log = LATEX / "report.log"
    _need(log.is_file(), "the PDF is not built (make pdf)")
    m = re.search(r"memlib text block: ([\d.]+)pt by ([\d.]+)pt", log.read_text(encoding="utf-8", errors="replace"))
    assert m, "the preamble of _config.yml no longer states the text block"
    tex_pt = 72.27                                   # TeX points per inch
    assert abs(float(m.group(1)) - float(TEXT_WIDTH_IN) * tex_pt) < 0.5
    assert abs(float(m.group(2)) - float(TEXT_HEIGHT_IN) * tex_pt) < 0.5


def test_every_figure_and_its_caption_fit_a_page():
    """No float taller than the text block (LaTeX's "Float too large for page"): such a figure runs into the
    page's bottom margin, its caption off the page."""
    log = LATEX / "report.log"
    _need(log.is_file(), "the PDF is not built (make pdf)")
    too_large = re.findall(r"Float too large for page by [\d.]+pt on input line \d+",
                           log.read_text(encoding="utf-8", errors="replace"))
    assert not too_large, too_large


# --- the page budget (issue 24): Part I at most 60 pages, the whole PDF at most 95, at Sphinx's default page ---------
PART_I_MAX, PDF_MAX = 60, 95
#: the first chapter of Part I and of Part II (_toc.yml)
PART_I_FIRST, PART_II_FIRST = 1, 10
TOC_LINE = re.compile(r"\\contentsline\s*\{(part|chapter)\}\{(?:\\numberline\s*\{([^}]*)\})?(.*?)\}\{(\d+)\}")


def toc_starts(toc: str) -> tuple[dict[int, int], list[int]]:
    """The first page of each numbered chapter and of each part, from LaTeX's ``report.toc``."""
    chapters, parts = {}, []
    for kind, number, _title, page in TOC_LINE.findall(toc):
        if kind == "chapter" and number.isdigit():
            chapters[int(number)] = int(page)
        elif kind == "part":
            parts.append(int(page))
    return chapters, parts


def part_one_pages(toc: str) -> int:
    """Pages from Part I's first chapter (or its part page) to the page before Part II's part page (or its first
    chapter)."""
    chapters, parts = toc_starts(toc)
    first, nxt = chapters[PART_I_FIRST], chapters[PART_II_FIRST]
    start = max([p for p in parts if p <= first], default=first)
    end = max([p for p in parts if p <= nxt], default=nxt)
    return end - start


def test_the_page_budget_reads_the_contents():
    toc = ("\\contentsline {part}{I\\hspace {1em}The paper}{1}{part.1}%\n"
           "\\contentsline {chapter}{\\numberline {1}Introduction}{2}{chapter.1}%\n"
           "\\contentsline {chapter}{\\numberline {9}DeepSeek}{50}{chapter.9}%\n"
           "\\contentsline {part}{II\\hspace {1em}Beyond}{58}{part.2}%\n"
           "\\contentsline {chapter}{\\numberline {10}Validation}{59}{chapter.10}%\n")
    assert part_one_pages(toc) == 57
    assert part_one_pages(toc.replace("{58}{part.2}", "{61}{part.2}").replace("{59}{chapter.10}", "{62}{chapter.10}")) == 60


def test_the_book_keeps_its_page_budget():
    """Issue 24: the argument (Part I, chapters 1-9) in at most 60 PDF pages, the whole PDF in at most 95, with the
    body's font and margins unchanged (test_the_text_block_is_the_one_figures_are_measured_against)."""
    toc = LATEX / "report.toc"
    _need(PDF.is_file() and toc.is_file(), "the PDF is not built (make pdf)")
    pdfinfo = shutil.which("pdfinfo")
    _need(pdfinfo is not None, "pdfinfo is not installed (apt-get install poppler-utils)")
    info = subprocess.run([pdfinfo, str(PDF)], capture_output=True, text=True, check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    part_one = part_one_pages(toc.read_text(encoding="utf-8", errors="replace"))
    assert part_one <= PART_I_MAX and pages <= PDF_MAX, (
        f"Part I takes {part_one} pages (budget {PART_I_MAX}), the PDF {pages} (budget {PDF_MAX})")


def test_a_part_opens_on_its_first_chapters_page():
    """A part is a banner over its first chapter (the preamble's \\part), not a page holding only its title: each
    part's page in the contents is the page of the chapter that follows it, and the patch of \\chapter took."""
    toc, log = LATEX / "report.toc", LATEX / "report.log"
    _need(toc.is_file() and log.is_file(), "the PDF is not built (make pdf)")
    lines = TOC_LINE.findall(toc.read_text(encoding="utf-8", errors="replace"))
    parts = [(int(page), int(lines[i + 1][3])) for i, (kind, _n, _t, page) in enumerate(lines) if kind == "part"]
    assert len(parts) == 3 and all(part == chapter for part, chapter in parts), parts
    assert "chapter not patched" not in log.read_text(encoding="utf-8", errors="replace")
