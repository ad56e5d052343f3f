"""Every equation the built book renders is clean TeX: no control character (a "\\t" in a
non-raw Python string becomes a TAB and eats the "t" of "\\text"), and no macro MathJax does not
know (``\\extdevice`` renders as red text).

Reads the built HTML (``make book`` first); skipped when the book is missing, unless
``MEMLIB_REQUIRE_BOOK=1`` (CI sets it).
"""
from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

from memlib.core.symbols import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
REQUIRE = os.environ.get("MEMLIB_REQUIRE_BOOK") == "1"

#: TeX macros MathJax's default TeX input knows that the book uses; anything else is a typo
KNOWN = set("""
alpha beta gamma delta epsilon lambda mu nu pi rho sigma tau phi psi omega Delta Sigma Pi Psi
frac dfrac tfrac sqrt left right big Big bigl bigr Bigl Bigr cdot cdots ldots dots times div pm mp
sum prod int lceil rceil lfloor rfloor langle rangle lvert rvert vert mid quad qquad
text textrm textit textbf mathrm mathit mathbf mathbb mathcal mathsf mathtt operatorname boldsymbol
hat tilde bar overline underline widehat widetilde vec
le leq ge geq ne neq approx equiv sim simeq propto to rightarrow leftarrow Rightarrow mapsto in notin uparrow
subset subseteq cup cap emptyset infty partial nabla forall exists min max log ln exp lim
begin end array aligned align cases matrix pmatrix bmatrix hline displaystyle textstyle scriptstyle
top prime ell vee wedge lor land neg
""".split())

CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
#: inline and display math, and the glued equations (``<div class="pasted-math math ..." id=...>``)
MATH = re.compile(r'<(span|div) class="(?:[\w-]+ )*math[^"]*"[^>]*>(.*?)</\1>', re.S)
EQNO = re.compile(r'<span class="eqno">.*?</span>|<[^>]+>', re.S)


def _pages() -> list[Path]:
    return sorted(HTML.glob("notebooks/*.html")) + sorted(HTML.glob("book/*.html")) + sorted(HTML.glob("*.html"))


def equations() -> list[tuple[str, str]]:
    out = []
    for page in _pages():
        for m in MATH.finditer(page.read_text(encoding="utf-8")):
            out.append((page.name, html.unescape(EQNO.sub("", m.group(2)))))
    return out


#: the registry's multi-letter names (DP, TP, ..., EDP)
MULTI = "|".join(sorted((n.symbol.name for n in REGISTRY if n.symbol.name.isalpha() and len(n.symbol.name) > 1),
                        key=len, reverse=True))
#: two multi-letter names with only a space (which TeX drops) between them: "CP DP" renders "CPDP"
RUN_TOGETHER = re.compile(r"(?<![A-Za-z\\])((?:\\mathrm\{)?(?:" + MULTI + r")\}?)\s*((?:\\mathrm\{)?(?:" + MULTI
                          + r")\}?)(?![A-Za-z])")


def check(tex: str) -> list[str]:
    """What is wrong with one equation's source (empty if nothing)."""
    problems = []
    for a, b in RUN_TOGETHER.findall(tex):
        problems.append(f"{a} and {b} run together")
    if CONTROL.search(tex):
        problems.append(f"control character {CONTROL.search(tex).group()!r}")
    for name in re.findall(r"\\(\\|[A-Za-z]+|.)", tex):     # "\\" is a line break, not a macro
        if name.isalpha() and name not in KNOWN:
            problems.append(f"unknown macro \\{name}")
    return problems


def test_the_check_catches_the_bugs_it_is_for():
    assert check("M^{A}_{\\text{device}}") == []
    assert check("M^{A}_{" + "\text{device}" + "}") != []          # what "\t" did: a TAB, then "ext"
    assert check("M^{A}_{\\extdevice}") == ["unknown macro \\extdevice"]
    assert check("a \\\\b") == []                                # a line break before b
    assert check("\\frac{CP DP TP}{EP ETP}") != []                 # issue 14: renders "CPDPTP/EPETP"
    assert check("\\mathrm{EP} \\mathrm{ETP}") != []
    assert check("\\frac{\\mathrm{CP}\\,\\mathrm{DP}}{\\mathrm{EP}\\,\\mathrm{ETP}}") == []


def test_every_rendered_equation_is_clean_tex():
    if not HTML.joinpath("index.html").exists():
        if REQUIRE:
            pytest.fail("the book is not built (make book)")
        pytest.skip("the book is not built (make book)")
    eqs = equations()
    assert len(eqs) > 200                     # the book has equations; an empty scan proves nothing
    bad = [(page, tex[:120], problems) for page, tex in eqs if (problems := check(tex))]
    assert not bad, bad[:10]
