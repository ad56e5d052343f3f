"""The notation registry: every symbol memlib uses, defined once.

Each :class:`Notation` entry carries the SymPy symbol, its LaTeX spelling, a one-line meaning,
its unit and, for model symbols, the Hugging Face ``config.json`` field it is read from.  The
book's notation table is rendered from :data:`REGISTRY`; formulas import the symbols from here.

The paper (arXiv 2502.07846, Table 1) writes ``d_h`` for the per-head dimension.  DeepSeek's
configs distinguish the no-RoPE query/key head dimension (``qk_nope_head_dim``) from the value
head dimension (``v_head_dim``); both are 128 in DeepSeek-V3 but they are different quantities,
so memlib keeps them apart as :math:`d_h` and :math:`d_v`.  Every key is also a name of this module:
``from memlib.core.symbols import b, s, h``.

>>> SYMBOLS["h"].field
'hidden_size'
>>> sym("h").is_integer and sym("h").is_positive
True
"""
from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Optional

import sympy as sp

__all__ = ["Notation", "REGISTRY", "SYMBOLS", "sym", "model_symbols", "by_field", "latex", "MULTI_LETTER",
           "printed_width", "latex_lines"]


@dataclass(frozen=True)
class Notation:
    """One entry of the notation table."""

    key: str                 #: Python-side name, e.g. ``"d_hR"``
    latex: str               #: LaTeX spelling, e.g. ``"d_h^R"``
    meaning: str             #: one line, sentence case
    unit: str                #: ``"elements"``, ``"layers"``, ``"ranks"``, ``"bytes"``, ...
    field: Optional[str]     #: Hugging Face config field (model symbols) or CLI/config field
    kind: str                #: ``"model"``, ``"parallel"``, ``"stage"``, ``"precision"``
    symbol: sp.Symbol        #: the SymPy symbol (integer, positive where true)


def _n(key, latex, meaning, unit, field, kind, nonneg=False) -> Notation:
    # The SymPy name is the LaTeX spelling so that sympy.latex() prints the paper's notation; a
    # multi-letter name (the parallel sizes DP, TP, ...) is set upright, \mathrm{DP}, and keeps its
    # plain name in SymPy (so ``memlib formula`` prints DP), :func:`latex` typesetting it.
    name = latex
    if re.fullmatch(r"[A-Za-z]{2,}", latex):
        latex = r"\mathrm{" + latex + "}"
    if nonneg:
        s = sp.Symbol(name, integer=True, nonnegative=True)
    else:
        s = sp.Symbol(name, integer=True, positive=True)
    return Notation(key, latex, meaning, unit, field, kind, s)


REGISTRY: tuple[Notation, ...] = (
    # --- model (Table 1 of the paper, plus what DeepSeek's configs add) ---------------------
    _n("h", "h", "hidden dimension", "elements", "hidden_size", "model"),
    _n("h_F", "h_F", "dense FFN intermediate dimension", "elements", "intermediate_size", "model"),
    _n("h_E", "h_E", "intermediate dimension of one expert", "elements", "moe_intermediate_size", "model"),
    _n("n_h", "n_h", "attention heads", "heads", "num_attention_heads", "model"),
    _n("d_h", "d_h", "query/key head dimension without RoPE", "elements", "qk_nope_head_dim", "model"),
    _n("d_v", "d_v", "value head dimension", "elements", "v_head_dim", "model"),
    _n("d_hR", "d_h^R", "decoupled RoPE query/key head dimension", "elements", "qk_rope_head_dim", "model"),
    _n("d_cq", "d_c'", "query compression dimension (q LoRA rank)", "elements", "q_lora_rank", "model"),
    _n("d_c", "d_c", "key-value compression dimension (KV LoRA rank)", "elements", "kv_lora_rank", "model"),
    _n("N", "N", "routed experts per MoE layer", "experts", "n_routed_experts", "model"),
    _n("N_s", "N_s", "shared experts per MoE layer", "experts", "n_shared_experts", "model"),
    _n("N_r", "N_r", "routed experts activated per token", "experts", "num_experts_per_tok", "model"),
    _n("n_g", "n_g", "expert groups of group-limited routing (1: none)", "groups", "n_group", "model"),
    _n("k_g", "k_g", "expert groups a token may route to", "groups", "topk_group", "model"),
    # grouped-query / multi-head attention (Llama, Qwen, Mixtral, GPT), shared experts of their own width,
    # learned absolute positions (the classic GPT)
    _n("n_kv", "n_{kv}", "key-value heads (query groups) of grouped-query attention", "heads",
       "num_key_value_heads", "model"),
    _n("d_head", "d_{head}", "head dimension of grouped-query attention (queries, keys and values)", "elements",
       "head_dim", "model"),
    _n("h_S", "h_S", "intermediate dimension of the shared expert (Qwen2-MoE)", "elements",
       "shared_expert_intermediate_size", "model"),
    _n("n_pos", "n_{pos}", "learned absolute position embeddings (classic GPT)", "positions",
       "max_position_embeddings", "model"),
    _n("l", "l", "decoder layers", "layers", "num_hidden_layers", "model"),
    _n("k_dense", "k_{dense}", "leading decoder layers with a dense FFN", "layers", "first_k_dense_replace", "model", nonneg=True),
    _n("v", "v", "vocabulary size", "tokens", "vocab_size", "model"),
    _n("n_mtp", "n_{MTP}", "multi-token-prediction modules", "modules", "num_nextn_predict_layers", "model", nonneg=True),
    # --- parallelism --------------------------------------------------------------------------
    _n("DP", "DP", "data-parallel size", "ranks", "dp", "parallel"),
    _n("TP", "TP", "tensor-parallel size", "ranks", "tp", "parallel"),
    _n("PP", "PP", "pipeline-parallel size (stages)", "ranks", "pp", "parallel"),
    _n("EP", "EP", "expert-parallel size", "ranks", "ep", "parallel"),
    _n("ETP", "ETP", "expert tensor-parallel size", "ranks", "etp", "parallel"),
    _n("CP", "CP", "context-parallel size", "ranks", "cp", "parallel"),
    _n("EDP", "EDP", "expert data-parallel size, DP TP CP / (EP ETP)", "ranks", None, "parallel"),
    # --- one training step ----------------------------------------------------------------------
    _n("b", "b", "micro-batch size", "sequences", "micro_batch", "training"),
    _n("s", "s", "sequence length", "tokens", "seq_len", "training"),
    _n("M", "M", "micro-batches per step and pipeline", "micro-batches", "num_microbatches", "training"),
    _n("V", "V", "virtual pipeline stages (model chunks) per device", "chunks", "vpp", "training"),
    # --- one pipeline stage ---------------------------------------------------------------------
    _n("L_dense", "L^{dense}_{st}", "dense decoder layers on the stage", "layers", None, "stage", nonneg=True),
    _n("L_moe", "L^{MoE}_{st}", "MoE decoder layers on the stage", "layers", None, "stage", nonneg=True),
    _n("P", "P", "parameters stored on one device", "parameters", None, "stage", nonneg=True),
    _n("P_ne", "P_{ne}", "non-expert parameters stored on one device", "parameters", None, "stage", nonneg=True),
    _n("P_e", "P_{e}", "routed-expert parameters stored on one device", "parameters", None, "stage", nonneg=True),
    # --- precision ------------------------------------------------------------------------------
    _n("B_w", "B_w", "bytes per stored weight", "bytes", None, "precision", nonneg=True),
    _n("B_g", "B_g", "bytes per gradient element", "bytes", None, "precision", nonneg=True),
    _n("B_o", "B_o", "optimizer-state bytes per parameter (master copy and moments)", "bytes", None, "precision", nonneg=True),
)

SYMBOLS: dict[str, Notation] = {n.key: n for n in REGISTRY}
if len(SYMBOLS) != len(REGISTRY):  # pragma: no cover - a programming error
    raise RuntimeError("duplicate key in the notation registry")


def sym(key: str) -> sp.Symbol:
    """The SymPy symbol registered under ``key``."""
    return SYMBOLS[key].symbol


def __getattr__(key: str) -> sp.Symbol:
    """The registry's symbols as names of this module (PEP 562), so that a module writes
    ``from memlib.core.symbols import b, s, h`` instead of ``b, s, h = sym("b"), sym("s"), sym("h")``.

    >>> from memlib.core.symbols import h, TP
    >>> h is sym("h") and TP is sym("TP")
    True
    """
    try:
        return SYMBOLS[key].symbol
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {key!r}") from None


def model_symbols() -> tuple[Notation, ...]:
    """Entries read from a model's ``config.json``."""
    return tuple(n for n in REGISTRY if n.kind == "model")


def by_field(field: str) -> Notation:
    """The entry whose config field is ``field``."""
    for n in REGISTRY:
        if n.field == field:
            return n
    raise KeyError(field)


#: the registry's multi-letter names (``DP``, ``ETP``, ...): their SymPy symbols -> upright LaTeX
MULTI_LETTER: dict[sp.Symbol, str] = {n.symbol: n.latex for n in REGISTRY if n.symbol.name != n.latex}

#: a multi-letter upright name next to another factor: "\mathrm{CP} \mathrm{DP}", "b \mathrm{DP}"
_AFTER = re.compile(r"(\\mathrm\{[A-Za-z]{2,}\}) (?=[A-Za-z]|\\(?!left|right|cdot|times|quad|qquad)[A-Za-z])")
_BEFORE = re.compile(r"([A-Za-z}]) (?=\\mathrm\{[A-Za-z]{2,}\})")


def latex(expr, **kw) -> str:
    r"""The LaTeX of a SymPy expression as the book prints it: the one LaTeX printer of memlib.

    Registry symbols take their spelling from the registry (multi-letter names upright), and a
    multi-letter name is kept apart from its neighbouring factors by a thin space, so that
    ``CP DP TP`` does not read as one word; ``kw`` go to :func:`sympy.latex`.

    >>> latex(sym("CP") * sym("DP") * sym("TP") / (sym("EP") * sym("ETP")))
    '\\frac{\\mathrm{CP}\\,\\mathrm{DP}\\,\\mathrm{TP}}{\\mathrm{EP}\\,\\mathrm{ETP}}'
    >>> latex(sym("b") * sym("s") * sym("h") / sym("TP"))
    '\\frac{b h s}{\\mathrm{TP}}'
    """
    names = {**MULTI_LETTER, **kw.pop("symbol_names", {})}
    t = sp.latex(expr, symbol_names=names, **kw)
    return _BEFORE.sub(r"\1\\,", _AFTER.sub(r"\1\\,", t))


def printed_width(tex: str) -> int:
    """About how many characters ``tex`` prints as: its letters, digits and operators, no commands or braces."""
    return len(re.sub(r"\\[a-zA-Z]+|[{}_^\\\s]", "", tex))


def _after(t: str) -> str:
    """A term's LaTeX as it follows another in a sum: its sign before it (``+ t``, ``- t``)."""
    return f"- {t[1:].lstrip()}" if t.startswith("-") else f"+ {t}"


def _pieces(expr, **kw) -> list[str]:
    r"""The pieces a sum breaks into, in the order the printer prints it: a sum's terms, and a product of one sum
    and other factors (``c (t_1 + t_2)``) opened around its own terms (``c \Bigl(t_1``, ``+ t_2\Bigr)``), one
    level deep; an expression that is neither is one piece."""
    def product(e) -> list[str]:
        sums = [a for a in sp.Mul.make_args(e) if isinstance(a, sp.Add)]
        if not isinstance(e, sp.Mul) or len(sums) != 1:
            return [latex(e, **kw)]
        head = latex(sp.Mul(*[a for a in sp.Mul.make_args(e) if a is not sums[0]]), **kw)
        head = {"1": "", "-1": "-"}.get(head, head)
        inner = [latex(t, **kw) for t in sums[0].as_ordered_terms()]
        inner = [inner[0]] + [_after(t) for t in inner[1:]]
        inner[0] = rf"{head} \Bigl(" + inner[0]
        inner[-1] += r"\Bigr)"
        return inner
    terms = expr.as_ordered_terms() if isinstance(expr, sp.Add) else [expr]
    out: list[str] = []
    for t in terms:
        sub = product(t)
        out += sub if not out else [_after(sub[0])] + sub[1:]
    return out


def latex_lines(exprs, width: int, **kw) -> list[str] | None:
    r"""The LaTeX of ``exprs`` (an expression, or the terms of a sum given one by one) in lines of about ``width``
    printed characters, broken between the terms of its sums (:func:`printed_width`); None when it fits on one
    line or has no sum to break.  The caller sets the lines in an ``aligned`` environment.

    >>> a, b, c = sym("b"), sym("s"), sym("h")
    >>> latex_lines(a * b * (c + 2 * a + 3 * b), 8)
    ['b s \\Bigl(2 b + h', '+ 3 s\\Bigr)']
    """
    exprs = list(exprs) if isinstance(exprs, (list, tuple)) else [exprs]
    pieces: list[str] = []
    for e in exprs:
        p = _pieces(e, **kw)
        pieces += p if not pieces else [_after(p[0])] + p[1:]
    if len(pieces) < 2 or printed_width(" ".join(pieces)) <= width:
        return None
    lines, line = [], ""
    for t in pieces:
        if line and printed_width(line + t) > width:
            lines.append(line)
            line = ""
        line = f"{line} {t}".strip()
    lines.append(line)
    return lines
