"""The book rebuilt for another model (``make book MODEL=deepseek-v2``) is that model's book: it
contains none of DeepSeek-V3's totals, and its paper comparisons are gone.

Reads the books CI builds into ``_build/models/<model>/_build/html`` (``make book MODEL=...``);
skipped when they are missing, unless ``MEMLIB_REQUIRE_BOOK=1`` (CI sets it).  The DeepSeek-V3
numbers looked for are computed here from memlib, not typed.
"""
from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

from memlib import estimate
from memlib.paper import analysed_stage, paper_training
from memlib.paper import zero as pzero
from memlib.model.params import activated_params, layer_params, model_params, values
from memlib.report.format import fmt_bytes, fmt_count

ROOT = Path(__file__).resolve().parents[2]
REQUIRE = os.environ.get("MEMLIB_REQUIRE_BOOK") == "1"
MODELS = ("llama-3-8b", "mixtral-8x7b")
#: the models of another architecture among them (no MLA, no DeepSeekMoE)
OTHER_ARCHITECTURES = ("llama-3-8b", "mixtral-8x7b")


def v3_numbers() -> set[str]:
    """Exact counts (nine digits and more) and GiB totals that only DeepSeek-V3's book computes."""
    est = estimate("deepseek-v3", paper_training("deepseek-v3"))
    m, vals = est.model, values(est.model)
    i = analysed_stage(est.partition)
    counts = {model_params(m).evaluate_total(vals), activated_params(m).evaluate_total(vals),
              layer_params(m, "moe").evaluate_total(vals), est.stages[i].parameters,
              est.stages[i].activations["per_microbatch"]}
    counts |= {row["total"] for row in pzero.table8(est, i).values()}
    gib = {fmt_bytes(row["total"]) for row in pzero.table8(est, i).values()}
    return {fmt_count(n) for n in counts} | gib


def book_text(model: str) -> dict[str, str]:
    root = ROOT / "_build" / "models" / model / "_build" / "html"
    if not (root / "index.html").exists():
        if REQUIRE:
            pytest.fail(f"the {model} book is not built (make book MODEL={model})")
        pytest.skip(f"the {model} book is not built (make book MODEL={model})")
    pages = sorted(root.glob("notebooks/*.html")) + sorted(root.glob("book/*.html"))
    return {p.name: html.unescape(re.sub(r"<[^>]+>", " ", p.read_text(encoding="utf-8"))) for p in pages}


def test_the_v3_numbers_are_real_v3_numbers():
    nums = v3_numbers()
    assert "671,026,404,352" in nums and "6,250,364,928" in nums and "81.50 GiB" in nums


@pytest.mark.parametrize("model", MODELS)
def test_another_models_book_has_no_deepseek_v3_total(model):
    pages = book_text(model)
    assert len(pages) >= 11
    nums = v3_numbers()
    found = {(name, n) for name, text in pages.items() for n in nums if n in text}
    assert not found, sorted(found)[:20]


@pytest.mark.parametrize("model", MODELS)
def test_another_models_book_is_about_that_model(model):
    pages = book_text(model)
    est = estimate(model, paper_training(model))
    total = fmt_count(model_params(est.model).evaluate_total(values(est.model)))
    assert any(total in text for text in pages.values())
    assert not any(re.search(r"That is the paper[’']s value", text) for text in pages.values())


@pytest.mark.parametrize("model", MODELS)
def test_the_paper_only_sections_are_gone(model):
    """Sections marked ``{.paper-model}`` (the errata) are dropped from another model's book."""
    pages = book_text(model)
    marked = {name: [h for h in paper_sections(ROOT / "notebooks" / name.replace(".html", ".md"))]
              for name in pages if (ROOT / "notebooks" / name.replace(".html", ".md")).exists()}
    assert sum(len(h) for h in marked.values()) >= 5
    left = [(name, h) for name, heads in marked.items() for h in heads if re.search(rf"\b{re.escape(h)}\s*#", pages[name])]
    assert left == []


def paper_sections(path: Path) -> list[str]:
    """The titles of the sections a notebook marks ``{.paper-model}``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [nxt.lstrip("#").strip() for line, nxt in zip(lines, lines[1:]) if line.strip() == "{.paper-model}"]


def test_no_only_block_holds_a_heading():
    """Sphinx raises a section out of an ``{only}`` block, so it would appear in every book: a
    section only the paper's book has is marked ``{.paper-model}`` on its heading instead."""
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.md")):
        fence = None
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = re.match(r"^\s*(`{3,}|:{3,})\{only\}", line)
            if fence is None and m:
                fence = m.group(1)
            elif fence is not None and line.strip() == fence:
                fence = None
            elif fence is not None and re.match(r"^\s*#{1,6} ", line):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("model", MODELS)
def test_no_paper_placeholder_is_shown(model):
    """glue_paper glues "—" for a paper value another model does not have; it may only sit in a
    block that book drops, never in what it shows."""
    book_text(model)                                    # skips or fails when the book is missing
    root = ROOT / "_build" / "models" / model / "_build" / "html" / "notebooks"
    shown = [p.name for p in sorted(root.glob("*.html"))
             if '<span class="pasted-text">—</span>' in p.read_text(encoding="utf-8")]
    assert shown == []


@pytest.mark.parametrize("model", OTHER_ARCHITECTURES)
def test_another_architectures_book_says_what_applies(model):
    """A model without MLA and DeepSeekMoE: its book drops the sections marked ``{.deepseek-arch}``
    and says, in the note glued from memlib, which blocks it has instead."""
    from memlib.config import load_model
    from memlib.report.format import architecture_note

    pages = book_text(model)
    note = architecture_note(load_model(model), "MLA and DeepSeekMoE").split("**")[1]
    assert "grouped-query attention" in note
    # said once, where the blocks are introduced (chapter 2), not repeated by later chapters (issue 24)
    assert [n for n, text in pages.items() if note in re.sub(r"\s+", " ", text).replace("’", "'")] == [
        "02_architecture.html"]
    marked = {p.name: deepseek_sections(p) for p in sorted((ROOT / "notebooks").glob("*.md"))}
    assert sum(len(h) for h in marked.values()) >= 1
    left = [(name, h) for name, heads in marked.items() for h in heads
            if re.search(rf"\b{re.escape(h)}\s*#", pages.get(name.replace(".md", ".html"), ""))]
    assert left == []


def deepseek_sections(path: Path) -> list[str]:
    """The titles of the sections a notebook marks ``{.deepseek-arch}``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [nxt.lstrip("#").strip() for line, nxt in zip(lines, lines[1:]) if line.strip() == "{.deepseek-arch}"]


def test_the_book_tags_follow_the_architecture():
    from memlib.report.book import book_tags

    assert book_tags("deepseek-v3") >= {"paper_model", "deepseek_arch", "has_mtp", "has_router_bias"}
    assert book_tags("deepseek-v2-lite") == {"deepseek_arch", "has_mla", "has_rope_split", "has_moe",
                                             "has_shared_experts", "has_dense_layers", "deepseek_figures"}
    assert "deepseek_figures" in book_tags("deepseek-v3") and "deepseek_figures" not in book_tags("kimi-k2")
    assert book_tags("mixtral-8x7b") == {"has_gqa", "has_moe"}
    assert book_tags("llama-3-8b") == {"has_gqa", "has_dense_layers"}


EQNO = re.compile(r'<span class="eqno">\(([\d.]+)\)<a class="headerlink" href="#equation-([\w-]+)"')


@pytest.mark.parametrize("model", ("deepseek-v3", *MODELS))
def test_the_summary_numbers_each_equation_as_its_chapter_does(model):
    """A chapter leaves out the equations of blocks (and sections) its model lacks and Sphinx numbers what is left:
    the summary page gives each equation the number its chapter shows in that model's book (llama-3-8b:
    params.total is (3.4) there, (3.6) in the DeepSeek-V3 book), and lists no equation the book does not show."""
    from memlib.report.glue import equation_label

    root = ROOT / "_build" / "html" if model == "deepseek-v3" else ROOT / "_build" / "models" / model / "_build" / "html"
    if not (root / "index.html").exists():
        if REQUIRE:
            pytest.fail(f"the {model} book is not built (make book MODEL={model})")
        pytest.skip(f"the {model} book is not built (make book MODEL={model})")
    shown = {}
    for page in sorted(root.glob("notebooks/*.html")):
        for number, label in EQNO.findall(page.read_text(encoding="utf-8")):
            shown[label.removeprefix("equation-")] = number
    summary = html.unescape((root / "book" / "summary.html").read_text(encoding="utf-8"))
    listed = re.findall(r"\(([\d.]+)\)</strong> .*?\(<code[^>]*><span class=\"pre\">([\w.]+)</span></code>\)", summary)
    assert len(listed) > 20, len(listed)
    for number, name in listed:
        assert shown.get(equation_label(name)) == number, (model, name, number, shown.get(equation_label(name)))
    from memlib.report.book import equation_numbers
    from memlib.report.glue import equation_key
    from memlib.formulas import FORMULAS
    assert {equation_label(f.name): equation_numbers(model)[equation_key(f.name)] for f in FORMULAS.values()
            if equation_key(f.name) in equation_numbers(model)} == shown
