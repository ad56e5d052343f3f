"""The formula registry: every numbered equation of the book, by a stable name, and more.

Each :class:`Formula` builds its right-hand side from memlib's own functions (nothing is restated
here) for a model's *structure* (its sizes stay symbols) and, where the equation is for one
configuration, the training configuration.  The book renders every numbered equation from this
registry (:meth:`Formula.latex`), and ``memlib formula NAME`` prints exactly that equation
(``--latex`` its LaTeX; ``--expand`` the right-hand side with every named block written out, ready to
substitute); ``memlib formula --list`` gives each formula's number in the book.

A right-hand side is a SymPy expression, a :class:`~memlib.core.breakdown.Breakdown` (a sum shown term
by term in its own order), or, for the structural equations of MLA, LaTeX text.

Every formula follows the model's block kinds (:data:`memlib.config.FAMILIES`): eq. (3.1) counts the
attention the model has (MLA, or grouped-query / multi-head attention with its biases and head
norms), the MoE formulas its MoE kind (DeepSeekMoE, Mixtral and Qwen3-MoE without shared experts,
Qwen2-MoE's gated shared expert), and a block the model lacks counts 0; the left-hand side names the
block the model has (:math:`P_{\\mathrm{GQA}}` for Llama's attention).  A dense model's per-layer
formulas are those of its dense layers (:math:`L^{dense}_{st}`, the FFN in place of the MoE block).
Only the equations of MLA (``mla.*``) are MLA's alone: another attention has none of them, a
:class:`ConfigError` says so.  Named blocks
(:math:`P_{MLA}` in eq. 3.6) are symbols whose definitions are other formulas (``defs``).

>>> FORMULAS["params.total"].number
'3.6'
>>> formula("params.expert")
3*h*h_E
>>> print(equation_text("params.mla", "llama-3-8b"))
P_GQA = d_{head}*h*n_h + d_{head}*h*n_{kv} + d_{head}*h*n_{kv} + d_{head}*h*n_h
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

import sympy as sp

from .model.profiles import PROFILES, act_profile
from .ledgers.base import entry_bytes, ledger_bytes, parse_policy
from .model.architecture import attention_name, mla_equation, attention_tensors, mtp_tensors
from .core.breakdown import Breakdown
from .config import PAPER_TRAINING, ConfigError, ModelConfig, TrainingConfig, load_model, show
from .ledgers.paper import MULTI_HEAD, gpt_structure, paper_layer
from .model.params import (
    by_block, expert_params, layer_counts, layer_params, mtp_params,
    readable, tensor_counts, total_formula,
)
from .model.partition import shard_divisor
from .config import ZeroStage
from .config.precision import RECIPES
from .model.states import sharded_count, states_formula
from .paper import device_group
from .core.symbols import CP, EP, ETP, TP, b, latex, latex_lines, printed_width, s, sym
from .core.words import counted, join_and

#: a displayed equation whose right-hand side prints wider than this many characters is broken into lines of
#: about LINE_WIDTH: at 1,300 px the HTML's text column holds about 70 printed characters of an equation, the
#: PDF's about 75 (tests/book/test_book_html.py measures the HTML)
DISPLAY_WIDTH, LINE_WIDTH = 60, 45

__all__ = ["Formula", "FORMULAS", "formula", "equation", "equation_text", "book_formulas", "plain", "block_symbol",
           "token_training", "attention_token_formula", "TOKEN_EXAMPLES", "value", "value_unit"]

Rhs = Union[sp.Expr, Breakdown, str]



def block_symbol(latex: str) -> sp.Symbol:
    """A named block of a displayed equation, e.g. :math:`P_{\\mathrm{MLA}}`."""
    return sp.Symbol(latex, integer=True, nonnegative=True)


P_MLA, P_NORM = block_symbol(r"P_{\mathrm{MLA}}"), block_symbol(r"P_{\mathrm{norm}}")
P_FFN, P_MOE = block_symbol(r"P_{\mathrm{FFN}}"), block_symbol(r"P_{\mathrm{MoE}}")
P_TOTAL = block_symbol(r"P_{\mathrm{total}}")
P_SPLIT, P_REPL = block_symbol(r"P^{split}_{MLA}"), block_symbol(r"P^{repl}_{MLA}")
P_NORM_DEV, P_MOE_DEV = block_symbol(r"P_{norm}"), block_symbol(r"P_{MoE}")
P_TILDE = block_symbol(r"\tilde{P}")
#: the attention block of another kind (eq. 3.1 and 4.3, 4.4 of a GQA or MHA model)
P_ATT = {n: block_symbol(rf"P_{{\mathrm{{{n}}}}}") for n in ("GQA", "MHA")}
P_SPLIT_ATT = {n: block_symbol(rf"P^{{split}}_{{{n}}}") for n in ("GQA", "MHA")}
P_REPL_ATT = {n: block_symbol(rf"P^{{repl}}_{{{n}}}") for n in ("GQA", "MHA")}
P_FFN_DEV = block_symbol(r"P_{FFN}")
_BLOCKS = (P_MLA, P_NORM, P_FFN, P_MOE, P_TOTAL, P_SPLIT, P_REPL, P_NORM_DEV, P_MOE_DEV, P_TILDE, P_FFN_DEV,
           *P_ATT.values(), *P_SPLIT_ATT.values(), *P_REPL_ATT.values())


def _att(m: ModelConfig, mla: sp.Symbol, other: dict[str, sp.Symbol]) -> sp.Symbol:
    """The block symbol of ``m``'s attention: ``mla`` for MLA, else the one named after its kind."""
    name = attention_name(m)
    return mla if name == "MLA" else other[name]


def _ffn_dev(m: ModelConfig) -> sp.Symbol:
    return P_MOE_DEV if m.has_moe else P_FFN_DEV


#: a left-hand side that names the block the model has: ``lhs`` with ``MLA`` (or ``MoE``) replaced
def _lhs_att(lhs: str) -> Callable[[ModelConfig], str]:
    return lambda m: lhs.replace("MLA", attention_name(m))


def _lhs_ffn(lhs: str) -> Callable[[ModelConfig], str]:
    return lambda m: lhs if m.has_moe else lhs.replace("MoE", "FFN")


def _group(t: str, i: int) -> int:
    """The index after the brace group that opens at ``t[i]``."""
    depth = 0
    for j in range(i, len(t)):
        depth += {"{": 1, "}": -1}.get(t[j], 0)
        if depth == 0:
            return j + 1
    return len(t)


def plain(latex: str) -> str:
    r"""A LaTeX name in plain text: ``M_{\mathrm{ZeRO\text{-}1}}`` -> ``M_ZeRO-1``,
    ``\frac{M^{A}_{\mathrm{GQA}}}{b\,s}`` -> ``(M^A_GQA)/(b s)``."""
    import re

    t = latex
    while (i := t.find("\\frac{")) >= 0:
        a = _group(t, i + 5)
        b = _group(t, a)
        t = f"{t[:i]}({t[i + 6:a - 1]})/({t[a + 1:b - 1]}){t[b:]}"
    t = re.sub(r"\\(?:mathrm|text|operatorname)\{", "{", t)
    t = t.replace("\\tilde{P}", "P~").replace("\\ ", " ").replace("\\,", " ").replace("\\", "")
    return t.replace("{", "").replace("}", "")


#: the attentions an equation can be restricted to, as an error names them
_ATTENTION_NAMES = {"mla": "multi-head latent attention", "gqa": "grouped-query (or multi-head) attention"}


@dataclass(frozen=True)
class Formula:
    """One equation: ``lhs = rhs(model, train)``."""

    name: str
    description: str
    lhs: str | Callable[[ModelConfig], str]                    #: LaTeX ("" when the rhs is a whole equation), or per model
    rhs: Callable[[ModelConfig, TrainingConfig], Rhs]
    number: str | None = None                                  #: its number in the book, if it is displayed
    defs: tuple[tuple[sp.Symbol, str], ...] = field(default=())   #: named blocks -> the formulas defining them
    order: str | None = None                                   #: SymPy's term order for the LaTeX
    #: the attention the equation is of (``mla``, ``gqa``), None for every model; MLA's structural equations
    #: (``mla.*``) are MLA's
    attention: str | None = None
    #: the model the equation is shown for when none is given
    example: str = "deepseek-v3"
    #: the optional blocks (:data:`memlib.model.blocks.BLOCK_NAMES`) a model must have for the book to show the
    #: equation (a dense FFN's count only where there are dense layers, an expert's only with MoE layers)
    needs: frozenset = frozenset()
    #: the description for a model, in the words of its own blocks (``description`` is the example's)
    describe: Callable[[ModelConfig], str] | None = None

    def description_for(self, model: ModelConfig | str | None = None) -> str:
        """What the equation counts, in the words of ``model``'s blocks (:attr:`description` for the example)."""
        return self.describe(load_model(model or self.example)) if self.describe else self.description

    def build(self, model: ModelConfig | str | None = None, train: TrainingConfig | None = None) -> Rhs:
        m = load_model(model or self.example)
        needs = self.attention or ("mla" if self.name.startswith("mla.") else None)
        if needs is not None and m.attention != needs:
            hint = " (its parameters: memlib formula params.mla)" if self.name.startswith("mla.") else ""
            raise ConfigError(f"formula={self.name} is an equation of {_ATTENTION_NAMES[needs]}; {m.name} has "
                              f"{attention_name(m)} attention{hint}")
        return self.rhs(m, train if train is not None else default_training(m))

    def lhs_for(self, model: ModelConfig | str | None = None) -> str:
        """The left-hand side for ``model`` (LaTeX): the block the model has (P_GQA, P_FFN)."""
        return self.lhs(load_model(model or self.example)) if callable(self.lhs) else self.lhs

    def expression(self, model: ModelConfig | str | None = None, train: TrainingConfig | None = None,
                   expand: bool = False) -> sp.Expr:
        """The right-hand side as one SymPy expression; ``expand`` writes the named blocks out."""
        r = self.build(model, train)
        if isinstance(r, str):
            raise ConfigError(f"formula={self.name} is an equation of the architecture, not a count: "
                              f"it has LaTeX only (memlib formula {self.name} --latex)")
        e = r.total if isinstance(r, Breakdown) else sp.sympify(r)
        if expand:
            for symbol, name in self.defs:
                for x in _variants(symbol):
                    e = e.xreplace({x: readable(FORMULAS[name].expression(model, train, expand=True))})
        return e

    def latex(self, model: ModelConfig | str | None = None, train: TrainingConfig | None = None) -> str:
        """The equation as the book displays it: on one line, or, when its right-hand side prints wider than
        :data:`DISPLAY_WIDTH` characters, broken between the terms of its sums into aligned lines of about
        :data:`LINE_WIDTH` (so that it fits the text column of the HTML and of the PDF)."""
        r = self.build(model, train)
        kw = {} if self.order is None else {"order": self.order}
        body = r if isinstance(r, str) else (r.latex(**kw) if isinstance(r, Breakdown) else latex(r, **kw))
        lhs = self.lhs_for(model)
        lines = None
        if not isinstance(r, str) and printed_width(body) > DISPLAY_WIDTH:
            terms = [e for e in r.values() if e != 0] if isinstance(r, Breakdown) else r
            lines = latex_lines(terms, LINE_WIDTH, **kw)
        if lines is None:
            return f"{lhs} = {body}" if lhs else body
        return (r"\begin{aligned}" + (f"{lhs} &= " if lhs else "&") + lines[0]
                + "".join(r" \\ &\quad " + line for line in lines[1:]) + r"\end{aligned}")

    def text(self, model: ModelConfig | str | None = None, train: TrainingConfig | None = None) -> str:
        """The equation in plain text (SymPy's string form, named blocks by plain names), as
        ``memlib formula NAME`` prints it."""
        r = self.build(model, train)
        if isinstance(r, str):
            return r
        kw = {} if self.order is None else {"order": self.order}
        names = {x: sp.Symbol(plain(x.name)) for _, x in ((0, s) for s in _BLOCKS)}
        terms = list(r.values()) if isinstance(r, Breakdown) else [sp.sympify(r)]
        body = " + ".join(sp.sstr(t.xreplace(names), **kw) for t in terms if t != 0).replace("+ -", "- ") or "0"
        lhs = self.lhs_for(model)
        return f"{plain(lhs)} = {body}" if lhs else body


def _variants(symbol: sp.Symbol) -> tuple[sp.Symbol, ...]:
    """A named block and the names it takes in a model of another kind (P_MLA: P_GQA, P_MHA)."""
    for mla, other in ((P_MLA, P_ATT), (P_SPLIT, P_SPLIT_ATT), (P_REPL, P_REPL_ATT)):
        if symbol == mla:
            return (mla, *other.values())
    if symbol == P_MOE_DEV:
        return (P_MOE_DEV, P_FFN_DEV)
    return (symbol,)


def default_training(m: ModelConfig) -> TrainingConfig:
    """The configuration a per-configuration formula is shown for: the paper's (its layout adapted to
    the model by :func:`memlib.paper.paper_training`)."""
    from .paper import paper_training

    return paper_training(m)


# ------------------------------------------------------------------------------------------------
# chapter 2: the architecture
# ------------------------------------------------------------------------------------------------
def _mla_eq(label: str):
    def rhs(m: ModelConfig, t: TrainingConfig) -> str:
        try:
            return mla_equation(label, m)
        except ValueError as e:                    # the query latent's equation for a model without one
            raise ConfigError(f"formula=mla.cq: {e}") from None
    return rhs


def _mtp_input(m: ModelConfig, t: TrainingConfig) -> str:
    """The MTP module's input (DeepSeek-V3 report, Sec. 2.2), with M's shape from memlib."""
    M = next(x for x in mtp_tensors(m) if x.key == "mtp.eh_proj")
    shape = r" \times ".join(latex(d) for d in M.shape)
    return (r"h'^{k}_{i} = M_k\left[\mathrm{RMSNorm}(h^{k-1}_{i});\ \mathrm{RMSNorm}(\mathrm{Emb}(t_{i+k}))\right],"
            r"\qquad M_k \in \mathbb{R}^{" + shape + "}")


# ------------------------------------------------------------------------------------------------
# chapter 3: parameters
# ------------------------------------------------------------------------------------------------
def _layer(m: ModelConfig, kind: str) -> Breakdown:
    """One decoder layer of ``kind``, per tensor; nothing when the model has no layer of that kind."""
    return layer_params(m, kind) if kind in m.layer_kinds else Breakdown()


def _block(kind: str, block: str):
    # a block the model does not have (no shared experts, no MoE layer) has no parameters: 0, not an error
    return lambda m, t: readable(by_block(_layer(m, kind)).get(block, sp.Integer(0)))


def _any_layer(block: str):
    """A block every layer has (the attention, the norms): read from whichever kind the model has."""
    return lambda m, t: readable(by_block(layer_params(m, m.layer_kinds[0])).get(block, sp.Integer(0)))


def _mla_terms(m: ModelConfig, t: TrainingConfig) -> Breakdown:
    return tensor_counts(attention_tensors(m))


def _moe_terms(m: ModelConfig, t: TrainingConfig) -> Breakdown | sp.Expr:
    moe = by_block(_layer(m, "moe"))
    terms = {k: readable(moe[k]) for k in ("router", "shared_experts", "routed_experts") if k in moe}
    return Breakdown(terms) if terms else sp.Integer(0)


def _total_blocks(m: ModelConfig, t: TrainingConfig) -> Breakdown:
    """Eq. (3.6): the ends, then every layer's MLA and norms, the dense FFNs, the MoE blocks."""
    n = layer_counts(m)
    att = _att(m, P_MLA, P_ATT)
    return Breakdown([("ends", _ends(m)), ("layers", (n["dense"] + n["moe"]) * (att + P_NORM)),
                      ("dense", n["dense"] * P_FFN), ("moe", n["moe"] * P_MOE)])


def _ends(m: ModelConfig) -> sp.Expr:
    from .model.architecture import embedding_tensors, head_tensors
    return tensor_counts(embedding_tensors(m)).total + tensor_counts(head_tensors(m)).total


def _activated_blocks(m: ModelConfig, t: TrainingConfig) -> Breakdown:
    n = layer_counts(m)
    if n["moe"] == 0:
        return Breakdown([("total", P_TOTAL)])                  # a dense model: every parameter is activated
    # -n_moe (N - N_r) P_expert, P_expert's factors (3 h h_E) written out as the book prints it
    expert = expert_params(m)
    c, factors = expert.as_coeff_mul()
    idle = sp.Mul(-c, n["moe"], sym("N") - sym("N_r"), *factors, evaluate=False)
    assert sp.expand(idle + n["moe"] * (sym("N") - sym("N_r")) * expert) == 0
    return Breakdown([("total", P_TOTAL), ("idle", idle)])


# ------------------------------------------------------------------------------------------------
# chapter 4: static parameters per device (the paper's Table 6 groups, a stage of MoE layers)
# ------------------------------------------------------------------------------------------------
def _device_groups(m: ModelConfig, profile: str = "paper") -> dict[str, sp.Expr]:
    """Per-device parameters of one MoE layer, grouped as the paper's Table 6 (symbolic)."""
    from .model.architecture import decoder_layer_tensors

    prof = PROFILES[profile].partition
    groups: dict[str, list] = {"mla_split": [], "mla_replicated": [], "rmsnorm": [], "moe": []}
    # a dense model's stage is of dense layers: its FFN stands in the MoE group's place
    for x in decoder_layer_tensors(m, "moe" if m.has_moe else "dense"):
        if x.kind == "buffer":
            continue
        kind = prof.sharding(x)
        g = device_group(x.key, x.kind, kind)
        groups["moe" if g == "dense_ffn" else g].append((x.numel, kind))
    out = {}
    for g, terms in groups.items():
        kinds = {k for _, k in terms}
        if g == "mla_split" and len(kinds) == 1:
            # one divisor for the whole group, kept outside the sum as the paper writes it
            (kind,) = kinds
            out[g] = sp.Mul(sp.Add(*[n for n, _ in terms]), 1 / shard_divisor(kind))
        elif g == "moe":
            out[g] = sp.collect(sp.expand(sp.Add(*[n / shard_divisor(k) for n, k in terms])), sym("h") * sym("h_E"))
        else:
            out[g] = sp.Add(*[n / shard_divisor(k) for n, k in terms])
    return out


def _device(group: str):
    def build(m: ModelConfig, t: TrainingConfig) -> sp.Expr:
        layers = sym("L_moe") if m.has_moe else sym("L_dense")
        return sp.Mul(layers, _device_groups(m, t.profile if t.profile in PROFILES else "paper")[group], evaluate=False)
    return build


def _device_total(m: ModelConfig, t: TrainingConfig) -> Breakdown:
    """Eq. (4.7): the attention's split part, its replicated part where it has one (MLA's down-projections, the
    output projection's bias; nothing of a bias-free GQA), the norms and the MoE block."""
    profile = t.profile if t.profile in PROFILES else "paper"
    repl = [("repl", _att(m, P_REPL, P_REPL_ATT))] if _device_groups(m, profile)["mla_replicated"] != 0 else []
    return Breakdown([("split", _att(m, P_SPLIT, P_SPLIT_ATT)), *repl, ("norm", P_NORM_DEV), ("moe", _ffn_dev(m))])


# ------------------------------------------------------------------------------------------------
# chapter 5: ZeRO
# ------------------------------------------------------------------------------------------------
def _zero(z: ZeroStage, recipe_name: str | None = None):
    def build(m: ModelConfig, t: TrainingConfig) -> Breakdown:
        # P = P_ne + P_e and P~ written as symbols first, then the recipe's bytes substituted
        shown = states_formula(z).map(
            lambda e: e.xreplace({sym("P_ne") + sym("P_e"): sym("P"), sharded_count(): P_TILDE}))
        if recipe_name is not None:
            rec = RECIPES[recipe_name]
            nums = {sym("B_w"): rec.weights, sym("B_g"): rec.gradients, sym("B_o"): rec.optimizer_bytes}
            shown = shown.map(lambda e: e.xreplace(nums))
        return shown
    return build


def _zero_lhs(z: ZeroStage) -> str:
    return r"M_{\mathrm{ZeRO\text{-}" + str(z.value) + "}}"


# ------------------------------------------------------------------------------------------------
# chapter 6: activations (the paper's ledger, one layer, one micro-batch)
# ------------------------------------------------------------------------------------------------
def _act(block: str, where: str, policy: str = "none"):
    def build(m: ModelConfig, t: TrainingConfig) -> sp.Expr:
        # a dense model's layer: its FFN block in the MoE block's place
        kind, blk = ("moe", block) if m.has_moe else ("dense", "dense_ffn" if block == "moe" else block)
        entries = [e for e in paper_layer(m, kind) if e.block == blk]
        pol = parse_policy(policy)
        if where == "unsplit":
            expr = ledger_bytes(entries, TrainingConfig(sp=False), RECIPES["paper"], pol).total
            return sp.factor_terms(sp.expand(expr.xreplace({TP: 1, CP: 1, EP: 1, ETP: 1})))
        expr = ledger_bytes(entries, t, t.recipe, pol).total
        if where == "device":
            return sp.collect(sp.expand(expr), [b * s], evaluate=True)
        subs = {TP: t.tp, CP: t.cp, EP: t.ep, ETP: t.etp}
        return sp.factor_terms(sp.expand(expr.xreplace(subs)))
    return build


def _act_lhs(block: str, where: str, policy: str = "none") -> Callable[[ModelConfig], str]:
    def lhs(m: ModelConfig) -> str:
        # the paper's A (attention) and E (experts); a dense model's FFN is F
        letter = "A" if block == "attention" else ("E" if m.has_moe else "F")
        if where == "unsplit":
            return f"M^{{{letter}}}"
        if where == "device":
            return rf"M^{{{letter}}}_{{\text{{device}}}}"
        return f"M^{{{letter}}}_{{{'2' if policy == 'full' else '1'}}}"
    return lhs


def _gpt(policy: str, sp_on: bool):
    """Korthikanti et al.'s dense GPT layer: the paper profile's dense layer of the ``gpt`` family
    (:func:`~memlib.ledgers.paper.gpt_structure`, multi-head), whatever the model, without context parallelism."""
    def build(m: ModelConfig, t: TrainingConfig) -> sp.Expr:
        expr = ledger_bytes(paper_layer(gpt_structure(), "dense"), TrainingConfig(sp=sp_on), RECIPES["paper"],
                            parse_policy(policy)).total
        return sp.expand(expr.xreplace({**MULTI_HEAD, CP: 1}))
    return build


# ------------------------------------------------------------------------------------------------
# the registry
# ------------------------------------------------------------------------------------------------
def _f(name, description, lhs, rhs, number=None, defs=(), order=None, attention=None, example="deepseek-v3",
       needs=(), describe=None) -> Formula:
    """A formula; ``describe(model)`` words its description for any model, ``description`` is the example's."""
    if describe is not None:
        description = describe(load_model(example))
    return Formula(name, description, lhs, rhs, number, tuple(defs), order, attention, example, frozenset(needs),
                   describe)


# ------------------------------------------------------------------------------------------------
# descriptions in the words of a model's own blocks
# ------------------------------------------------------------------------------------------------
def _attention_parts(m: ModelConfig) -> str:
    """``MLA: eight matrices and two latent norms``, ``GQA: four matrices``: the attention's tensors by kind."""
    kinds = [t.kind for t in attention_tensors(m)]
    norm = "latent norm" if m.attention == "mla" else "head norm"
    parts = [counted(kinds.count(k), noun, plural) for k, noun, plural in
             (("matrix", "matrix", "matrices"), ("bias", "bias", "biases"), ("norm", norm, None)) if kinds.count(k)]
    return f"{attention_name(m)}: {join_and(parts)}"


def _experts(m: ModelConfig, local: bool = False) -> str:
    """``router, shared and routed experts``, or ``router and routed experts`` without shared experts."""
    from .model.blocks import model_blocks

    routed = "the local routed experts" if local else "routed experts"
    return (f"router, shared and {routed}" if "shared_experts" in model_blocks(m) else f"router and {routed}")


def _left_out(m: ModelConfig) -> str:
    """What the main model's count leaves out: `` (no MTP, no buffers)`` for a model with both."""
    from .model.blocks import model_blocks

    own = model_blocks(m)
    out = (["no MTP"] if "mtp" in own else []) + (["no buffers"] if "router_bias" in own else [])
    return f" ({', '.join(out)})" if out else ""


def _stage(m: ModelConfig) -> str:
    return "MoE" if m.has_moe else "dense"


def _ffn(m: ModelConfig) -> str:
    return "MoE" if m.has_moe else "FFN"


# ------------------------------------------------------------------------------------------------
# chapter 12: the attention's activation bytes per token
# ------------------------------------------------------------------------------------------------
def token_training(profile: str = "paper", seq_len: int = PAPER_TRAINING.seq_len) -> TrainingConfig:
    """The configuration of the per-token numbers: one sequence of ``seq_len`` tokens on one device, no
    parallelism (TP = CP = EP = 1, sequence parallelism off), the paper's precision."""
    return TrainingConfig(profile=profile, sp=False, micro_batch=1, seq_len=seq_len)


def attention_token_formula(model: ModelConfig | str, profile: str = "paper") -> sp.Expr:
    """The attention block's bytes per token of one layer as an expression of the model's sizes and the
    sequence length s (one device, no parallelism, nothing recomputed): the ledger's entries summed and
    divided by the b s tokens."""
    m = load_model(model)
    train = token_training(profile)
    pol = parse_policy("none")
    entries = [e for e in act_profile(profile, train).layer(m, m.layer_kinds[-1]) if not pol.drops(e)]
    total = sp.Add(*(entry_bytes(e, train, train.recipe) for e in entries if e.block == "attention"))
    return sp.expand(sp.sympify(total.xreplace({TP: 1, CP: 1, EP: 1, ETP: 1})) / (b * s))


def _token(profile: str):
    return lambda m, t: attention_token_formula(m, profile)


#: the left-hand sides of the per-token equations, by attention
_TOKEN_LHS = {"gqa": r"\frac{M^{A}_{\mathrm{GQA}}}{b\,s}", "mla": r"\frac{M^{A}_{\mathrm{MLA}}}{b\,s}"}
#: the model each per-token equation is shown for: every GQA model without per-head q/k norms and every MLA
#: model with query compression has the same expression
TOKEN_EXAMPLES = {"gqa": "llama-3-8b", "mla": "deepseek-v3"}


FORMULAS: dict[str, Formula] = {f.name: f for f in (
    # chapter 2
    _f("mla.cq", "MLA: the compressed query latent", "", _mla_eq("mla-cq"), "2.1", needs=("mla", "q_latent")),
    _f("mla.q", "MLA: queries, no-RoPE and RoPE parts", "", _mla_eq("mla-q"), "2.2", needs=("mla",)),
    _f("mla.ckv", "MLA: the compressed key-value latent", "", _mla_eq("mla-ckv"), "2.3", needs=("mla",)),
    _f("mla.k", "MLA: keys, with the RoPE key shared by every head", "", _mla_eq("mla-k"), "2.4", needs=("mla",)),
    _f("mla.v", "MLA: values", "", _mla_eq("mla-v"), "2.5", needs=("mla",)),
    _f("mla.o", "MLA: attention output and the output projection", "", _mla_eq("mla-o"), "2.6", needs=("mla",)),
    _f("mtp.input", "the input of MTP module k: its projection M of two normalised vectors", "", _mtp_input, "2.7", needs=("mtp",)),
    # chapter 3
    _f("params.mla", "", _lhs_att(r"P_{\mathrm{MLA}}"), _mla_terms, "3.1",
       describe=lambda m: f"attention parameters of one layer ({_attention_parts(m)})"),
    _f("params.norms", "block norm parameters of one layer", r"P_{\mathrm{norm}}", _any_layer("norms"), "3.2"),
    _f("params.dense_ffn", "dense FFN parameters of one layer", r"P_{\mathrm{FFN}}", _block("dense", "dense_ffn"),
       "3.3", needs=("dense_layers",)),
    _f("params.moe", "", r"P_{\mathrm{MoE}}", _moe_terms, "3.4", needs=("moe",),
       describe=lambda m: f"{_experts(m)} of one MoE layer"),
    _f("params.expert", "parameters of one expert (a SwiGLU of width h_E)", r"P_{\mathrm{expert}}",
       lambda m, t: expert_params(m), "3.5", needs=("moe",)),
    _f("params.total", "", r"P_{\mathrm{total}}", _total_blocks,
       "3.6", [(P_MLA, "params.mla"), (P_NORM, "params.norms"), (P_FFN, "params.dense_ffn"), (P_MOE, "params.moe")],
       "old", describe=lambda m: f"parameters of the main model{_left_out(m)}"),
    _f("params.activated", "parameters activated per token (embedding counted whole)", r"P_{\mathrm{act}}",
       _activated_blocks, "3.7", [(P_TOTAL, "params.total")], "old"),
    _f("params.router", "router parameters of one MoE layer", r"P_{\mathrm{router}}", _block("moe", "router"), needs=("moe",)),
    _f("params.shared_experts", "shared-expert parameters of one MoE layer", r"P_{\mathrm{shared}}",
       _block("moe", "shared_experts"), needs=("shared_experts",)),
    _f("params.routed_experts", "routed-expert parameters of one MoE layer", r"P_{\mathrm{routed}}",
       _block("moe", "routed_experts"), needs=("moe",)),
    _f("params.moe_layer", "all parameters of one MoE decoder layer", r"P_{\mathrm{MoE\ layer}}",
       lambda m, t: readable(_layer(m, "moe").total), needs=("moe",)),
    _f("params.dense_layer", "all parameters of one dense decoder layer", r"P_{\mathrm{dense\ layer}}",
       lambda m, t: readable(_layer(m, "dense").total), needs=("dense_layers",)),
    _f("params.mtp", "parameters of the MTP modules (embedding and head shared)", r"P_{\mathrm{MTP}}",
       lambda m, t: readable(mtp_params(m).total), needs=("mtp",)),
    _f("params.readable_total", "parameters of the main model, every block written out", r"P_{\mathrm{total}}",
       lambda m, t: total_formula(m)),
    # chapter 4
    _f("parallel.edp", "expert data-parallel size: the copies of each expert over a stage's ranks", r"\mathrm{EDP}",
       lambda m, t: sym("DP") * sym("TP") * sym("CP") / (sym("EP") * sym("ETP")), "4.1", needs=("moe",)),
    _f("parallel.devices", "devices: data, tensor, context and pipeline parallelism", r"\text{devices}",
       lambda m, t: sym("DP") * sym("TP") * sym("CP") * sym("PP"), "4.2"),
    _f("static.mla_split", "", _lhs_att(r"P^{split}_{MLA}"), _device("mla_split"), "4.3",
       describe=lambda m: f"attention parameters split by TP on one device of a stage of {_stage(m)} layers"),
    _f("static.mla_replicated", "attention parameters replicated over TP, one device", _lhs_att(r"P^{repl}_{MLA}"),
       _device("mla_replicated"), "4.4", needs=("mla",)),   # chapter 4 shows it for MLA only ({only} has_mla)
    _f("static.norms", "", r"P_{norm}", _device("rmsnorm"), "4.5",
       describe=lambda m: "norm parameters (" + ("block, latent and head" if m.attention == "mla" else "block and head")
       + " norms), one device"),
    _f("static.moe", "", _lhs_ffn(r"P_{MoE}"), _device("moe"), "4.6",
       describe=lambda m: f"MoE parameters ({_experts(m, local=True)}), one device" if m.has_moe
       else "FFN parameters, one device"),
    _f("static.device", "", "P", _device_total, "4.7",
       [(P_SPLIT, "static.mla_split"), (P_REPL, "static.mla_replicated"), (P_NORM_DEV, "static.norms"),
        (P_MOE_DEV, "static.moe")], describe=lambda m: f"parameters one device of a stage of {_stage(m)} layers stores"),
    # chapter 5
    _f("states.sharded", "parameters one device owns once ZeRO shards them", r"\tilde{P}",
       lambda m, t: sharded_count(m.has_moe), "5.1"),
    *(_f(f"states.zero{z.value}", f"model-state bytes of one device under ZeRO-{z.value}", _zero_lhs(z), _zero(z),
         f"5.{z.value + 2}", [(P_TILDE, "states.sharded")]) for z in ZeroStage),
    _f("states.zero1_paper", "ZeRO-1 with the paper's recipe (2, 4 and 8 bytes per parameter)",
       _zero_lhs(ZeroStage.OS), _zero(ZeroStage.OS, "paper"), "5.6", [(P_TILDE, "states.sharded")]),
    # chapter 6
    _f("activations.paper.mla_unsplit", "", _act_lhs("attention", "unsplit"), _act("attention", "unsplit"), "6.1",
       describe=lambda m: f"{attention_name(m)} activation bytes of one layer per micro-batch, no parallelism"),
    _f("activations.paper.moe_unsplit", "", _act_lhs("moe", "unsplit"), _act("moe", "unsplit"), "6.2",
       describe=lambda m: f"{_ffn(m)} activation bytes of one layer per micro-batch, no parallelism"),
    _f("activations.paper.mla", "", _act_lhs("attention", "device"), _act("attention", "device"), "6.3",
       describe=lambda m: f"{attention_name(m)} activation bytes of one layer per micro-batch on one device"),
    _f("activations.paper.moe", "", _act_lhs("moe", "device"), _act("moe", "device"), "6.4",
       describe=lambda m: f"{_ffn(m)} activation bytes of one layer per micro-batch on one device"),
    _f("activations.paper.mla_config", "", _act_lhs("attention", "config"), _act("attention", "config"), "6.5",
       describe=lambda m: f"{attention_name(m)} activation bytes of one layer, the configuration's sizes "
       "substituted"),
    _f("activations.paper.moe_config", "", _act_lhs("moe", "config"), _act("moe", "config"), "6.6",
       describe=lambda m: f"{_ffn(m)} activation bytes of one layer, the configuration's sizes substituted"),
    _f("activations.paper.mla_full", "", _act_lhs("attention", "config", "full"),
       _act("attention", "config", "full"), "6.7",
       describe=lambda m: f"{attention_name(m)} activation bytes kept under full recomputation"),
    _f("activations.paper.moe_full", "", _act_lhs("moe", "config", "full"), _act("moe", "config", "full"), "6.8",
       describe=lambda m: f"{_ffn(m)} activation bytes kept under full recomputation"),
    _f("activations.gpt.layer", "dense GPT layer activation bytes, TP without SP (Korthikanti et al.)",
       r"M_{\mathrm{GPT}}", _gpt("none", False)),
    _f("activations.gpt.layer_sp", "dense GPT layer activation bytes, TP with SP (Korthikanti et al.)",
       r"M_{\mathrm{GPT}}", _gpt("none", True)),
    _f("activations.gpt.selective_sp", "dense GPT layer, TP + SP + selective recomputation",
       r"M_{\mathrm{GPT}}", _gpt("selective", True)),
    # chapter 9
    _f("states.deepseek_v3", "ZeRO-1 model states with DeepSeek-V3's recipe (bf16 moments)",
       _zero_lhs(ZeroStage.OS), _zero(ZeroStage.OS, "deepseek-v3"), "9.1", [(P_TILDE, "states.sharded")]),
    # chapter 12
    *(_f(f"attention_token.{att}{suffix}", f"activation bytes per token of one {att.upper()} attention block, "
         f"{profile} profile, nothing recomputed", _TOKEN_LHS[att], _token(profile), f"12.{i}", attention=att,
         example=TOKEN_EXAMPLES[att])
      for i, (att, profile, suffix) in enumerate((("gqa", "paper", ""), ("mla", "paper", ""),
                                                   ("gqa", "megatron", "_megatron"), ("mla", "megatron", "_megatron")),
                                                  start=1)),
)}


def _lookup(name: str) -> Formula:
    try:
        return FORMULAS[name]
    except KeyError:
        raise ConfigError(f"formula={show(name)} is unknown: `memlib formula --list` lists the {len(FORMULAS)} "
                          f"formulas") from None


def formula(name: str, model: str | ModelConfig | None = None, train: TrainingConfig | None = None,
            expand: bool = True) -> sp.Expr:
    """The right-hand side of ``name`` for the structure of ``model`` as one expression (the named
    blocks written out unless ``expand=False``)."""
    return _lookup(name).expression(model, train, expand=expand)


def equation(name: str, model: str | ModelConfig | None = None, train: TrainingConfig | None = None) -> str:
    """The LaTeX of ``name`` exactly as the book displays it."""
    return _lookup(name).latex(model, train)


def equation_text(name: str, model: str | ModelConfig | None = None, train: TrainingConfig | None = None) -> str:
    """The equation ``name`` in plain text (what ``memlib formula NAME`` prints)."""
    return _lookup(name).text(model, train)


def book_formulas() -> list[Formula]:
    """The formulas the book displays, in the order of their numbers."""
    def key(f: Formula):
        return tuple(int(x) for x in f.number.split("."))
    return sorted((f for f in FORMULAS.values() if f.number), key=key)


def value_unit(name: str) -> str:
    """What :func:`value` of formula ``name`` counts: ``"bytes"`` (model states, activations) or ``"count"``
    (parameters, ranks, devices); ``"latex"`` for an equation of the architecture, which has no value."""
    f = _lookup(name)
    if f.name.startswith(("mla.", "mtp.")):
        return "latex"
    return "bytes" if f.name.startswith(("states.", "activations.")) and f.name != "states.sharded" else "count"


def value(name: str, model: str | ModelConfig = "deepseek-v3", train: TrainingConfig | None = None) -> int:
    """The right-hand side of formula ``name`` as an exact integer: every symbol replaced by its value in
    ``model`` and ``train`` (default: the paper's configuration), a stage's symbols (its layers, P, P_ne, P_e)
    by those of one device of the stage the paper analyses (:func:`memlib.paper.analysed_stage`), the
    precision's bytes by ``train``'s recipe.  ``ConfigError`` for an equation of the architecture.

    >>> value("params.expert")                  # 3 h h_E = 3 x 7168 x 2048
    44040192
    """
    from .device.estimate import Estimate
    from .paper import analysed_stage

    m = load_model(model)
    t = train if train is not None else default_training(m)
    e = _lookup(name).expression(m, t, expand=True)
    est = Estimate(m, t)
    part = est.partition
    st = part.stages[analysed_stage(part)]
    rec = t.recipe
    counts = est.stage_counts(st)
    rep = {**part.values, sym("b"): t.micro_batch, sym("s"): t.seq_len, sym("EDP"): t.edp,
           sym("B_w"): rec.weights, sym("B_g"): rec.gradients, sym("B_o"): rec.optimizer_bytes,
           sym("L_moe"): sum(1 for i in st.layers if m.is_moe_layer(i)),
           sym("L_dense"): sum(1 for i in st.layers if not m.is_moe_layer(i))}
    pne, pe = (sp.sympify(counts[x]).xreplace(rep) for x in (sym("P_ne"), sym("P_e")))
    rep.update({sym("P_ne"): pne, sym("P_e"): pe, sym("P"): pne + pe})
    v = sp.sympify(e.xreplace(rep))
    if not v.is_Integer:
        raise ValueError(f"formula={name} is not a whole number in this configuration: {v}")
    return int(v)
