"""Formatting: the one set of formatters the book uses, and Markdown tables.

Numbers stay exact (integers, :class:`fractions.Fraction`) until one of these turns them into text.
Every byte count names its unit; a table uses one unit family.

>>> pct(110_886_912, 429_654_016)
'25.8%'
>>> span(4, 7), span(3, 3)
('4–7', '3')
>>> layout_text((4, 4, 4, 4, 1))
'4 × 4, 1'
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Iterable, Sequence


from ..config import ModelConfig
from ..config.strategies import ZeroStage
from ..core.symbols import SYMBOLS, latex, latex_lines
from ..core.units import UNITS, GiB, MiB, fmt_billions, fmt_bytes, fmt_count, fmt_decimal
from ..core.words import counted, join_and, number_word

__all__ = ["fmt_billions", "fmt_bytes", "fmt_count", "fmt_decimal", "pct", "ratio", "span", "layout_text", "wrapped_math",
           "signed_bytes", "rounded", "fmt_difference", "md_table", "tex", "sym_tex", "math", "model_name", "MODEL_NAMES", "DASH",
           "yes_no", "join_and", "number_word", "counted", "zero_name", "fmt_exact", "fmt_number", "fmt_float", "percent", "PERCENT_SIGN", "fmt_percent", "fmt_rate", "signed_pct", "fmt_size", "fmt_capacity", "typeset", "ascii_symbols", "architecture_note"]

DASH = "–"  # en dash: ranges of layers and stages

#: display names of the shipped presets (anything else is shown by its name)
MODEL_NAMES = {"deepseek-v3": "DeepSeek-V3", "deepseek-v2": "DeepSeek-V2", "deepseek-v2-lite": "DeepSeek-V2-Lite",
               "llama-3-8b": "Llama-3-8B", "llama-3-70b": "Llama-3-70B", "llama-3.1-405b": "Llama-3.1-405B",
               "mixtral-8x7b": "Mixtral-8x7B", "mixtral-8x22b": "Mixtral-8x22B", "qwen3-30b-a3b": "Qwen3-30B-A3B",
               "qwen3-235b-a22b": "Qwen3-235B-A22B", "kimi-k2": "Kimi-K2", "moonlight-16b-a3b": "Moonlight-16B-A3B"}


#: how a table cell gives a verdict of :mod:`memlib.scenarios.uncertainty` (chapter 9's ablation, the summary)
VERDICT_CELLS = {"fits": "yes", "marginal": "marginal", "does not fit": "no"}


def model_name(m: ModelConfig | str) -> str:
    """``DeepSeek-V3`` for the preset ``deepseek-v3``; a config file by its name."""
    name = m if isinstance(m, str) else m.name
    return MODEL_NAMES.get(name, name)


#: how the book writes a percentage: the number, then the sign, no space between (``'97.4%'``); every formatter of a
#: percentage below goes through :func:`percent`
PERCENT_SIGN = "%"


def percent(x: int | Fraction | float, digits: int = 1, signed: bool = False) -> str:
    """The fraction ``x`` in percent, rounded half away from zero for display only, the one way the book writes a
    percentage: ``'25.8%'``; with ``signed`` a sign always (``'+0.4%'``, ``'−0.2%'``, a minus sign, and ``'0.0%'`` for
    what rounds to zero).

    >>> percent(Fraction(1, 8)), percent(Fraction(-1, 500), 1, signed=True), percent(Fraction(-1, 10**9), 2, True)
    ('12.5%', '−0.2%', '0.00%')
    """
    text = fmt_decimal(Fraction(x) * 100, digits)          # a "-" only where the rounded value is not zero
    if signed and any(c in "123456789" for c in text):
        text = "−" + text[1:] if text.startswith("-") else "+" + text
    return text + PERCENT_SIGN


def pct(part: int | Fraction, whole: int | Fraction, digits: int = 1) -> str:
    """``part`` as a percentage of ``whole``, rounded for display only: ``'25.8%'``."""
    return percent(Fraction(part) / Fraction(whole), digits)


def ratio(a: int | Fraction, b: int | Fraction, digits: int = 2) -> str:
    """``a / b`` as a decimal factor, ``'1.06'``."""
    return fmt_decimal(Fraction(a) / Fraction(b), digits)


def span(a: int, b: int) -> str:
    """A range of layers or stages: ``'4–7'``, or ``'3'`` for one."""
    return str(a) if a == b else f"{a}{DASH}{b}"


def layout_text(layout: Sequence[int]) -> str:
    """Layers per stage, runs collapsed: ``(4, 4, 4, 1)`` → ``'4 × 3, 1'``."""
    runs: list[list[int]] = []
    for x in layout:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return ", ".join(f"{x} × {n}" if n > 1 else str(x) for x, n in runs)


def signed_bytes(n: int, unit: str = "GiB", digits: int = 2) -> str:
    """A change in bytes with its sign: ``'+1.20 GiB'``, ``'−0.40 GiB'``."""
    body = fmt_bytes(abs(n), unit, digits)
    return ("−" if n < 0 else "+") + body


def rounded(x: int | Fraction, unit: str = "GiB", digits: int = 2) -> Fraction:
    """``x`` bytes in ``unit`` as the book prints it, exactly: rounded half away from zero to ``digits`` decimals
    (:func:`memlib.core.units.fmt_decimal`'s rounding).

    >>> rounded(int(1.005 * 2**30)), rounded(-3 * 2**29, "GiB", 0)
    (Fraction(1, 1), Fraction(-2, 1))
    """
    q = Fraction(x) / UNITS[unit] * 10**digits
    r = int(abs(q)) + (1 if abs(q) - int(abs(q)) >= Fraction(1, 2) else 0)
    return Fraction(-r if q < 0 else r, 10**digits)


def fmt_difference(a: int | Fraction, b: int | Fraction, unit: str = "GiB", digits: int = 2, signed: bool = False,
                   with_unit: bool = True) -> str:
    """``a - b`` where the book prints ``a`` and ``b`` with ``unit`` and ``digits``: the difference of the printed
    values, so that a reader who subtracts them finds the same number (53.30 GiB against 52.99 GiB is 0.31 GiB
    more, though the exact bytes differ by 0.3151 GiB).  Its magnitude, or with ``signed`` its sign too
    (``'+0.31 GiB'``, ``'−0.40 GiB'``).

    >>> a, b = 57_234_734_186, 56_896_398_137          # printed 53.30 GiB and 52.99 GiB
    >>> fmt_bytes(a - b), fmt_difference(a, b), fmt_difference(b, a, signed=True)
    ('0.32 GiB', '0.31 GiB', '−0.31 GiB')
    """
    d = rounded(a, unit, digits) - rounded(b, unit, digits)
    body = fmt_decimal(abs(d), digits) + (f" {unit}" if with_unit else "")
    return (("−" if d < 0 else "+") + body) if signed else body


def fmt_capacity(capacity: int) -> str:
    """A device's capacity as its driver reports it and in the book's unit: ``'81,559 MiB (79.65 GiB)'``.

    >>> fmt_capacity(81_559 * 2**20)
    '81,559 MiB (79.65 GiB)'
    """
    return f"{fmt_bytes(capacity, 'MiB', 0)} ({fmt_bytes(capacity, 'GiB', 2)})"


def zero_name(z: ZeroStage, short: bool = False) -> str:
    """A ZeRO stage as the book names it: ``'ZeRO-1 (os)'``, or ``'ZeRO-1'`` when ``short``.

    >>> zero_name(ZeroStage.OS_G), zero_name(ZeroStage.OS_G, short=True)
    ('ZeRO-2 (os+g)', 'ZeRO-2')
    """
    return f"ZeRO-{z.value}" if short else f"ZeRO-{z.value} ({z.label})"


def fmt_exact(x: int | Fraction, unit: str, digits: int = 2) -> str:
    """Bytes that may be a fraction (bytes per token) in ``unit``, rounded for display, without the unit.

    >>> fmt_exact(Fraction(3 * 2**10, 2), "KiB"), fmt_exact(5 * 2**20, "MiB", 0)
    ('1.50', '5')
    """
    return fmt_decimal(Fraction(x) / UNITS[unit], digits)


def fmt_number(x: int | Fraction, digits: int = 1) -> str:
    """A count that may be a mean (a Fraction): exact when whole, else ``digits`` decimals.

    >>> fmt_number(12_345), fmt_number(Fraction(7, 2)), fmt_number(Fraction(8, 2))
    ('12,345', '3.5', '4')
    """
    return fmt_count(x) if Fraction(x).denominator == 1 else fmt_decimal(Fraction(x), digits)


def fmt_float(x: float, digits: int = 2) -> str:
    """A float (a modelled time, a ratio or a correlation, never an exact count) rounded half away from zero.

    >>> fmt_float(0.125), fmt_float(2250.0, 0)
    ('0.13', '2,250')
    """
    return fmt_decimal(Fraction(x), digits)


def fmt_percent(x: float, digits: int = 0) -> str:
    """A float fraction in percent (:func:`percent`): ``'13%'``; ``'0%'`` when it rounds to nothing.

    >>> fmt_percent(0.125), fmt_percent(-0.004)
    ('13%', '0%')
    """
    return percent(Fraction(x), digits)


def fmt_rate(x: float, scale: float, digits: int = 0) -> str:
    """A datasheet rate ``x`` (FLOP/s, bytes/s) in units of ``scale``: whole units truncated as the datasheets print
    them (H100's 989.5 TFLOP/s is its '989'), decimals rounded.

    >>> fmt_rate(989.5e12, 1e12), fmt_rate(2.039e12, 1e12, 2)
    ('989', '2.04')
    """
    return fmt_count(int(x / scale)) if digits == 0 else fmt_decimal(Fraction(x / scale), digits)


def signed_pct(x: int | Fraction, digits: int = 3) -> str:
    """A signed relative error in percent (:func:`percent`): ``'+0.012%'``, ``'−0.191%'`` (``'0.000%'`` when it
    rounds to 0).

    >>> signed_pct(Fraction(12, 100_000)), signed_pct(Fraction(-191, 100_000)), signed_pct(Fraction(-1, 10**9))
    ('+0.012%', '−0.191%', '0.000%')
    """
    return percent(x, digits, signed=True)


def fmt_size(n: int, small: str = "MiB") -> str:
    """A size as a person writes it: bytes below 1 MiB when ``small`` is ``"B"``, whole MiB below 1 GiB,
    else GiB to one decimal.

    >>> fmt_size(300 * 2**20), fmt_size(2 * 2**30), fmt_size(4096, small="B"), fmt_size(20 * 2**20, small="B")
    ('300 MiB', '2.0 GiB', '4,096 B', '20 MiB')
    """
    if small == "B":
        return fmt_bytes(n, "MiB", 0) if n >= MiB else f"{fmt_count(n)} B"
    return fmt_bytes(n, "MiB", 0) if n < GiB and n % MiB == 0 else fmt_bytes(n, "GiB", 1)


def yes_no(x: bool | None) -> str:
    return "—" if x is None else ("yes" if x else "no")


#: symbols the paper derives from the registry's and writes in the text (not configuration quantities):
#: ASCII spelling -> LaTeX
DERIVED_SYMBOLS = {"E_token": "E_{token}"}

#: a weight or latent of MLA written in ASCII, ``W^QR``, ``c^KV``: typeset as ``W^{QR}``
_TENSOR_ASCII = re.compile(r"(?<![\w$\\{^])([Wc])\^([A-Z]{1,3})(?![\w{])")


def ascii_symbols() -> dict[str, str]:
    """ASCII spelling -> LaTeX of every registry symbol with a subscript, a superscript or a prime
    (``d_h^R`` -> ``d_h^R``, ``n_kv`` -> ``n_{kv}``, ``d_c'`` -> ``d_c'``), and of :data:`DERIVED_SYMBOLS`."""
    out = {}
    for n in SYMBOLS.values():
        if any(c in n.latex for c in "_^'") and "\\" not in n.latex:
            out[n.latex.replace("{", "").replace("}", "")] = n.latex
    return {**out, **DERIVED_SYMBOLS}


_SYMBOL_ASCII = None


def _symbol_pattern() -> re.Pattern:
    global _SYMBOL_ASCII
    if _SYMBOL_ASCII is None:
        keys = sorted(ascii_symbols(), key=len, reverse=True)          # d_h^R before d_h
        _SYMBOL_ASCII = re.compile(r"(?<![\w$\\{^.])(" + "|".join(re.escape(k) for k in keys) + r")(?![\w{^'])")
    return _SYMBOL_ASCII


def typeset(text: str) -> str:
    """``text`` with every symbol written in ASCII typeset as inline math from the registry (``c^KV`` ->
    ``$c^{KV}$``, ``E_token`` -> ``$E_{token}$``, ``N_r`` -> ``$N_r$``); math (``$...$``) and code (`` `...` ``)
    are left as they are.

    >>> typeset("key-value latent c^KV, input of W^UK; 3 E_token h, `N_r` and $N_r$")
    'key-value latent $c^{KV}$, input of $W^{UK}$; 3 $E_{token}$ h, `N_r` and $N_r$'
    """
    table = ascii_symbols()
    parts = re.split(r"(\$[^$]*\$|`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        p = _TENSOR_ASCII.sub(lambda m: f"${m.group(1)}^{{{m.group(2)}}}$", parts[i])
        parts[i] = _symbol_pattern().sub(lambda m: f"${table[m.group(1)]}$", p)
    return "".join(parts)


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one letter per column (``l``, ``r``, ``c``).  Symbols written in ASCII
    are typeset from the registry (:func:`typeset`)."""
    headers = [typeset(str(h)) for h in headers]
    align = align or "l" + "r" * (len(headers) - 1)
    sep = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep[a] for a in align) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(typeset(str(c)).replace("|", r"\|") for c in r) + " |")
    return "\n".join(lines)


def tex(expr) -> str:
    """LaTeX of a SymPy expression (a string passes through)."""
    return expr if isinstance(expr, str) else latex(expr)


def wrapped_math(expr, width: int = 40) -> str:
    """Inline math for a table cell, a long sum broken between its terms into lines of about ``width`` printed
    characters (:func:`memlib.core.symbols.latex_lines`), so that a long formula fits its column (in the HTML
    and in the PDF) and no cell is clipped.  A short formula, or one without a sum to break, stays on one line
    (:func:`math`)."""
    lines = None if isinstance(expr, str) else latex_lines(expr, width)
    if lines is None:
        return f"${tex(expr)}$"
    return "$\\begin{aligned}&" + " \\\\ &\\quad ".join(lines) + "\\end{aligned}$"


def display_math(latex: str) -> str:
    """A displayed equation in Markdown, for a glued page that lists registry equations (the summary): the LaTeX
    comes from :func:`memlib.formulas.equation`, never built here."""
    return f"$$\n{latex}\n$$"


def sym_tex(key: str) -> str:
    """The LaTeX of the registry symbol ``key`` (``"d_hR"`` → ``d_h^R``)."""
    return latex(SYMBOLS[key].symbol)


def math(expr_or_key) -> str:
    """Inline math for a table cell or a glued phrase: ``$...$``; a registry key is looked up."""
    if isinstance(expr_or_key, str) and expr_or_key in SYMBOLS:
        return f"${sym_tex(expr_or_key)}$"
    return f"${tex(expr_or_key)}$"


def architecture_note(m: ModelConfig, subject: str) -> str:
    """Two sentences for the book of a model that lacks the blocks of ``subject`` (``"MLA"``,
    ``"DeepSeekMoE"`` or both, in words): which blocks it has instead (:func:`memlib.model.architecture.block_kinds`),
    and that the book describes those (for a model with DeepSeek's blocks: that every section applies).  Chapter 2
    says it once; later chapters do not repeat it."""
    from ..model.architecture import block_kinds

    k = block_kinds(m)
    if k["deepseek"]:
        return f"**{model_name(m)} has MLA and DeepSeekMoE, the blocks of the paper's model:** every section applies."
    att = {"GQA": "grouped-query attention (GQA", "MHA": "multi-head attention (MHA"}[k["attention"]]
    att += f": {fmt_count(k['n_h'])} query heads, {fmt_count(k['n_kv'])} key-value heads of {fmt_count(k['d_head'])}"
    att += ", with RMSNorms of each query and key head)" if k["qk_norm"] else ")"
    if k["moe"]:
        ffn = (f"{k['moe']} of {fmt_count(k['N'])} routed {k['ffn']} experts, {fmt_count(k['N_r'])} per token")
    else:
        ffn = f"a dense {k['ffn']} FFN in every layer"
    rest = f"{k['norm']}s, {'learned positions' if k['positions'] == 'learned' else 'RoPE'}"
    rest += ", the head tied to the embedding" if k["tied"] else ""
    # ``subject`` is not named: the sections on it are left out of this book, so they are not this book's to mention
    return (f"**{model_name(m)} has {att}, {ffn}, {rest}.** The paper's DeepSeek-V3 has other blocks; this book "
            f"describes {model_name(m)}'s own, which memlib counts with the same code.")


def layer_word(m: ModelConfig) -> tuple[str, str]:
    """The model's typical decoder layer, the one the chapters take as their example: ``("moe", "MoE layer")``
    for a model with MoE layers, ``("dense", "decoder layer")`` for a dense one."""
    return ("moe", "MoE layer") if "moe" in m.layer_kinds else ("dense", "decoder layer")


def parallel_kinds(m: ModelConfig) -> str:
    """The model-parallel dimensions that split ``m``'s weights, in words: expert parallelism only where it has
    experts."""
    return "tensor, expert and pipeline" if m.has_moe else "tensor and pipeline"
