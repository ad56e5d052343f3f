"""How large a figure's smallest text is where a reader sees it: printed in the PDF at the text width, and
shown in the HTML book 700 px wide.

A glued figure is an image: in the HTML book a matplotlib figure is its PNG (one image pixel a CSS pixel,
scaled down to the column when wider) and a diagram its SVG (its width in pt, 4/3 CSS px to the pt); in the
PDF Sphinx's ``\\sphinxincludegraphics`` prints either at its natural size (a PNG's pixels at its dpi, a
PDF's points), scaled down to fit the text width and height when larger.  So a text of ``s`` pt prints
at ``s`` times that scale.  :func:`legibility` measures the smallest text of a figure both ways
(:class:`Legibility`); :data:`MIN_PT` is the book's floor, the same in both: 8 pt, which on a screen is
8 x 4/3 CSS px.  A matplotlib mathtext script (``$c^{KV}$``) is set at 0.7 of its text, as matplotlib sets it.

The page is Sphinx's LaTeX default: US letter with 1 in margins, a text block of :data:`TEXT_WIDTH_IN` x
:data:`TEXT_HEIGHT_IN` (tests/book/test_book_pdf.py reads them back from the PDF build's log).

>>> Legibility(pdf_pt=7.2, html_px=11.0, text="rank").ok
False
"""
from __future__ import annotations

import base64
import re
import struct
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["TEXT_WIDTH_IN", "TEXT_HEIGHT_IN", "HTML_WIDTH_PX", "MIN_PT", "MIN_PX", "CSS_PX_PER_PT", "Legibility",
           "legibility", "png_size"]

#: the PDF's text block, inches (US letter, 1 in margins: Sphinx's LaTeX defaults)
TEXT_WIDTH_IN, TEXT_HEIGHT_IN = Fraction(13, 2), Fraction(9)
#: the width the HTML book is read at, CSS px
HTML_WIDTH_PX = 700
#: the smallest text allowed, pt (in the PDF), and the same on a screen, CSS px
CSS_PX_PER_PT = Fraction(4, 3)
MIN_PT = 8
MIN_PX = MIN_PT * CSS_PX_PER_PT
#: matplotlib's mathtext sets a sub- or superscript at this fraction of its text's size
MATHTEXT_SCRIPT = 0.7


@dataclass(frozen=True)
class Legibility:
    """The smallest text of a figure: ``pdf_pt`` as printed (pt), ``html_px`` as shown 700 px wide (CSS px);
    ``text`` is that text (the smallest in the PDF)."""

    pdf_pt: float
    html_px: float
    text: str

    @property
    def ok(self) -> bool:
        return self.pdf_pt >= MIN_PT - 1e-9 and self.html_px >= float(MIN_PX) - 1e-9

    def as_dict(self) -> dict:
        return {"pdf_pt": round(self.pdf_pt, 3), "html_px": round(self.html_px, 3), "text": self.text}


def png_size(png: bytes) -> tuple[int, int, float | None]:
    """A PNG's width and height in pixels and its resolution in dots per inch (None when it has none)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    w, h = struct.unpack(">II", png[16:24])
    dpi = None
    i = 8
    while i < len(png):
        n, kind = struct.unpack(">I4s", png[i:i + 8])
        if kind == b"pHYs":
            ppu, _, unit = struct.unpack(">IIB", png[i + 8:i + 17])
            dpi = ppu * 0.0254 if unit == 1 else None
            break
        if kind == b"IDAT":
            break
        i += 12 + n
    return w, h, dpi


def _texts(fig) -> list[tuple[float, str]]:
    """(size in pt of its smallest glyphs, text) of every visible, non-empty text of a matplotlib figure."""
    from matplotlib.text import Text

    out = []
    for t in fig.findobj(Text):
        s = t.get_text()
        if not t.get_visible() or not s.strip():
            continue
        size = t.get_fontsize()
        if re.search(r"\$[^$]*[_^][^$]*\$", s):
            size *= MATHTEXT_SCRIPT
        out.append((size, s))
    return out


def _scale(width: float, height: float, unit_per_in: float) -> float:
    """The PDF's scale for an image ``width`` x ``height`` in units of ``1/unit_per_in`` inch."""
    return min(1.0, float(TEXT_WIDTH_IN) * unit_per_in / width, float(TEXT_HEIGHT_IN) * unit_per_in / height)


def _figure(fig, png: bytes | None) -> Legibility:
    if png is None:
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight", dpi=fig.dpi)
        png = buf.getvalue()
    w, h, dpi = png_size(png)
    dpi = dpi or fig.dpi
    pdf = _scale(w, h, dpi)
    html = min(1.0, HTML_WIDTH_PX / w) * dpi / 72
    size, text = min(_texts(fig))
    return Legibility(size * pdf, size * html, text)


def _diagram(d) -> Legibility:
    w, h = d.size_pt
    size, text = min(d.text_sizes())
    pdf = _scale(w, h, 72)
    html = min(1.0, HTML_WIDTH_PX / (w * float(CSS_PX_PER_PT))) * float(CSS_PX_PER_PT)
    return Legibility(size * pdf, size * html, text)


def legibility(fig, bundle: dict | None = None) -> Legibility:
    """The smallest text of ``fig`` (a matplotlib figure or a :class:`memlib.report.diagrams.Diagram`) as the
    PDF prints it and the HTML shows it; ``bundle``: its display data when already rendered (the PNG it
    glues), else it is rendered here as the book's inline backend renders it (tight, at the figure's dpi)."""
    if hasattr(fig, "text_sizes"):
        return _diagram(fig)
    png = None if bundle is None else bundle.get("image/png")
    if isinstance(png, str):
        png = base64.b64decode(png)
    return _figure(fig, png)
