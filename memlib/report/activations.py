"""Tables, numbers and figures of the activations chapter (``notebooks/06_activations.md``).

The chapter reproduces §5 of arXiv 2502.07846 from the ``paper`` activation ledger
(:func:`memlib.ledgers.paper_layer`): the saved tensors of an MLA and an MoE block, the per-layer
formulas with and without the paper's TP2/SP2/EP8 split, its Tables 9 and 10 for b = 1, 2, 4, and
the recompute policies.  Korthikanti et al.'s Table 2 (arXiv 2205.05198) is reproduced from
:func:`memlib.ledgers.gpt_layer` with the same machinery, to show that the ledger is general.

The paper's printed formulas (§5.1, §5.2, Table 10, as transcribed in the project's reference)
are kept here as SymPy data, :data:`PAPER_FORMULAS`, only to be compared with the ledger.

>>> from memlib.config import PAPER_TRAINING, load_model
>>> v = stage_values(load_model("deepseek-v3"), PAPER_TRAINING)
>>> v[1]["none"]["total"], v[1]["full"]["total"]
(24671158272, 235143168)
"""
from __future__ import annotations

from fractions import Fraction

import sympy as sp

from ..activations import MODULES, POLICIES, Saved, element_bytes, entry_bytes, ledger_bytes, parse_policy
from ..breakdown import Breakdown
from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model
from ..ledgers import gpt_layer, paper_layer
from ..memory import estimate
from ..states import recipe
from ..symbols import sym
from ..units import fmt_decimal, fmt_bytes, fmt_count
from .core import PALETTE, md_table, new_figure
from .static import stage_names

__all__ = [
    "PAPER_TABLES", "BLOCK_LABELS", "POLICY_ORDER", "MODULE_LIST", "PAPER_FORMULAS", "KORTHIKANTI",
    "KORTHIKANTI_22B", "block_ledger", "ledger_table", "dataflow_figure", "layer_formula",
    "formula_lhs", "formula_checks", "formula_check_table", "table9", "stage_values", "table10_formulas",
    "table10", "korthikanti_rows", "korthikanti_table", "korthikanti_22b", "split_by_degree",
    "crossover", "microbatch_figure", "seqlen_figure", "policy_values", "policy_table", "policy_figure",
    "percent", "problem_answers", "analysed_stage", "to_mib", "summary",
]

#: the paper's table and figure numbers, as names (prose cannot type digits)
PAPER_TABLES = {"config": "Table 9", "totals": "Table 10", "flow": "Fig. 2", "korthikanti": "Table 2",
                "korthikanti_fig": "Figure 1"}

#: ledger blocks of a MoE layer and their display names
BLOCK_LABELS = {"attention": "MLA", "moe": "MoE"}

#: the named recompute policies, weakest first, and one module list
POLICY_ORDER = ("none", "selective", "deepseek", "full")
MODULE_LIST = "core_attn,layernorm,mla_up_proj,moe_act"

#: micro-batch sizes of the paper's Table 9
PAPER_MICRO_BATCHES = (1, 2, 4)

b, s = sym("b"), sym("s")
h, h_E, h_F = sym("h"), sym("h_E"), sym("h_F")
n_h, d_h, d_v, d_hR = sym("n_h"), sym("d_h"), sym("d_v"), sym("d_hR")
d_cq, d_c = sym("d_cq"), sym("d_c")
N, N_s, N_r = sym("N"), sym("N_s"), sym("N_r")
TP, CP, EP, ETP = sym("TP"), sym("CP"), sym("EP"), sym("ETP")
_PARALLEL = (TP, CP, EP, ETP)


# --------------------------------------------------------------------------------------------
# the paper's printed formulas (data, as transcribed; the paper writes d_h for the value width)
# --------------------------------------------------------------------------------------------
def _paper_formulas() -> dict[str, sp.Expr]:
    E = b * s * N_r / N
    bs = b * s
    half = sp.Rational(1, 2)
    return {
        "mla": 4 * bs * h + 2 * bs * (d_cq + d_c) + 4 * bs * (d_h + d_hR) * n_h + 2 * bs * d_h * n_h
        + 5 * b * n_h * s**2 + 2 * bs * d_h * n_h + bs * h,
        "mla_tp": half * 4 * bs * h + 2 * bs * (d_cq + d_c) + half * 4 * bs * (d_h + d_hR) * n_h
        + half * 2 * bs * d_h * n_h + half * 5 * b * n_h * s**2 + half * 2 * bs * d_h * n_h + half * bs * h,
        "moe_ep": half * 4 * bs * h + 4 * bs * N + 2 * bs * N_r + 32 * (3 * E * h + 8 * E * h_E)
        + 1 * (3 * bs * h + 8 * bs * h_E),
        "mla_full": bs * h,
        "moe_full": bs * h + 2 * bs * N_r,
        "mla_stage": 10 * bs * h + 8 * bs * (d_cq + d_c) + 16 * bs * d_h * n_h + 8 * bs * d_hR * n_h
        + 10 * b * n_h * s**2,
        "moe_stage": 20 * bs * h + 16 * bs * N + 8 * bs * N_r + 4 * bs * N_r / N * (96 * h + 256 * h_E)
        + 32 * bs * h_E,
        "mla_stage_full": 4 * bs * h,
        "moe_stage_full": 4 * bs * h + 8 * bs * N_r,
    }


PAPER_FORMULAS = _paper_formulas()

#: where each printed formula is, and which configuration it is for
_FORMULA_ROWS = {
    "mla": ("§5.1, one layer, no parallelism", "attention", None, "none", 1),
    "mla_tp": ("§5.1, one layer, TP2 SP2", "attention", "paper", "none", 1),
    "moe_ep": ("§5.2, one layer, SP2 EP8 ETP1", "moe", "paper", "none", 1),
    "mla_full": ("§5.1, one layer, full recomputation", "attention", "paper", "full", 1),
    "moe_full": ("§5.2, one layer, full recomputation", "moe", "paper", "full", 1),
    "mla_stage": ("Table 10, MLA, AC = None", "attention", "paper", "none", "stage"),
    "moe_stage": ("Table 10, MoE, AC = None", "moe", "paper", "none", "stage"),
    "mla_stage_full": ("Table 10, MLA, AC = Full", "attention", "paper", "full", "stage"),
    "moe_stage_full": ("Table 10, MoE, AC = Full", "moe", "paper", "full", "stage"),
}


def _model(model) -> ModelConfig:
    return load_model(model)


def analysed_stage(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> int:
    """The stage the paper analyses: the first MoE-only stage (stage 1 for DeepSeek-V3)."""
    return stage_names(model, train)["analysed"]


def block_ledger(model: ModelConfig | str, block: str, kind: str = "moe") -> list[Saved]:
    """The paper ledger's entries of one block (``attention`` or ``moe``) of a layer of ``kind``."""
    return [e for e in paper_layer(_model(model), kind) if e.block == block]


def _parallel_subs(train: TrainingConfig | None) -> dict:
    if train is None:
        return {x: 1 for x in _PARALLEL}
    return {TP: train.tp, CP: train.cp, EP: train.ep, ETP: train.etp}


# --------------------------------------------------------------------------------------------
# the ledger as tables and a diagram
# --------------------------------------------------------------------------------------------
_DTYPE_NAMES = {"act": "bf16", "mask": "mask", "fp32": "fp32", "int64": "int64"}


def _dtype_cell(e: Saved, train: TrainingConfig) -> str:
    return f"{element_bytes(e, recipe(train.precision))} ({_DTYPE_NAMES[e.dtype]})"


def _divisor_cell(e: Saved, train: TrainingConfig) -> str:
    names = [d for d in ("TP", "SP", "CP", "EP", "ETP") if d in e.shard]
    if not names:
        return "—"
    text = ", ".join(f"${d}$" for d in names)
    return text + (" (tokens rounded up)" if e.mean_rows else "")


def _dropped_by(e: Saved) -> str:
    mods = [f"`{m}`" for m in MODULES if m in e.modules]
    pols = [p for p in POLICY_ORDER if POLICIES[p].drops(e)]
    out = ", ".join(mods) if mods else "—"
    return out + (f" (policies: {', '.join(pols)})" if pols else " (kept by every policy)")


def _values(model: ModelConfig, train: TrainingConfig) -> dict:
    return estimate(model, train).values


def ledger_table(model: ModelConfig | str, block: str, train: TrainingConfig = PAPER_TRAINING) -> str:
    """The saved tensors of one block: name, elements, bytes per element, divisors, bytes on one
    device of the paper's configuration, which recompute modules (and named policies) drop it."""
    m = _model(model)
    vals = _values(m, train)
    rec = recipe(train.precision)
    rows = []
    for e in block_ledger(m, block):
        per_device = int(entry_bytes(e, train, rec).xreplace(vals))
        rows.append([e.name, f"${sp.latex(e.elements)}$", _dtype_cell(e, train), _divisor_cell(e, train),
                     fmt_count(per_device), _dropped_by(e), e.note or "—"])
    headers = ["saved tensor", "elements", "bytes per element", "divided by",
               "bytes per device",
               "dropped by (recompute modules)", "note"]
    return md_table(headers, rows, "llllrll")


_FLOW_CLASSES = (
    ("checkpoint", "kept under full recomputation", PALETTE[2]),
    ("core_attn", "attention core (selective)", PALETTE[3]),
    ("deepseek", "norm output, up-projections (deepseek)", PALETTE[0]),
    ("moe", "MoE internals (moe, shared_experts)", PALETTE[1]),
    ("other", "kept by every policy but full", PALETTE[5]),
)


def _flow_class(e: Saved) -> str:
    if e.keep_full:
        return "checkpoint"
    if "core_attn" in e.modules:
        return "core_attn"
    if e.modules & {"layernorm", "mla_up_proj"}:
        return "deepseek"
    if e.modules & {"moe", "shared_experts", "moe_act"}:
        return "moe"
    return "other"


def dataflow_figure(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING):
    """The data flow of one MoE layer as the ledger lists it (the paper's Fig. 2 and its MoE
    counterpart): one box per saved tensor, in order, coloured by what drops it, labelled with its
    MiB on one device of ``train``."""
    from matplotlib.patches import FancyBboxPatch, Patch

    m = _model(model)
    vals = _values(m, train)
    rec = recipe(train.precision)
    colours = {k: c for k, _, c in _FLOW_CLASSES}
    columns = [(blk, block_ledger(m, blk)) for blk in BLOCK_LABELS]
    n = max(len(entries) for _, entries in columns)
    fig, ax = new_figure(9.0, 0.42 * n + 1.2)
    for col, (blk, entries) in enumerate(columns):
        x0 = col * 1.0
        ax.text(x0 + 0.45, 0.3, f"{BLOCK_LABELS[blk]} block", ha="center", va="bottom", fontsize=10,
                fontweight="bold")
        for i, e in enumerate(entries):
            y = -i
            box = FancyBboxPatch((x0, y - 0.38), 0.9, 0.7, boxstyle="round,pad=0.0,rounding_size=0.05",
                                 facecolor=colours[_flow_class(e)], edgecolor="white", alpha=0.85)
            ax.add_patch(box)
            mib = to_mib(int(entry_bytes(e, train, rec).xreplace(vals)))
            label = e.name.split(",")[0].split(" (")[0]
            ax.text(x0 + 0.02, y - 0.03, f"{label}", ha="left", va="center", fontsize=7.5, color="black")
            ax.text(x0 + 0.88, y - 0.03, f"{mib} MiB", ha="right", va="center", fontsize=7.5, color="black")
            if i + 1 < len(entries):
                ax.annotate("", xy=(x0 + 0.45, y - 0.62), xytext=(x0 + 0.45, y - 0.38),
                            arrowprops={"arrowstyle": "->", "lw": 0.8, "color": "grey"})
    ax.set_xlim(-0.05, 1.95)
    ax.set_ylim(-n + 0.3, 0.9)
    ax.axis("off")
    handles = [Patch(color=c, label=lab) for _, lab, c in _FLOW_CLASSES]
    ax.legend(handles=handles, fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, 0.0))
    return fig


def to_mib(n: int) -> str:
    """``n`` bytes in MiB, one decimal (figure labels only)."""
    return fmt_bytes(n, "MiB", 1, with_unit=False)


# --------------------------------------------------------------------------------------------
# per-layer formulas and their check against the paper's printed ones
# --------------------------------------------------------------------------------------------
def layer_formula(model: ModelConfig | str, block: str, train: TrainingConfig | None = None,
                  policy: str = "none", symbolic_parallel: bool = False, layers=1) -> sp.Expr:
    """Bytes of one block's saved tensors per micro-batch on one device (the sum of the ledger).

    ``train=None``: no parallelism; otherwise the parallel sizes of ``train`` are substituted
    (``symbolic_parallel`` keeps TP, CP, EP, ETP as symbols, with SP on).  ``layers`` multiplies
    (the paper's Table 10 is per stage of four layers)."""
    m = _model(model)
    rec = recipe("paper" if train is None else train.precision)
    pol = parse_policy(policy)
    expr = ledger_bytes(block_ledger(m, block), train, rec, pol).total
    if not symbolic_parallel:
        expr = expr.xreplace(_parallel_subs(train))
    expr = sp.expand(layers * expr)
    return sp.factor_terms(expr) if not symbolic_parallel else sp.collect(expr, [b * s], evaluate=True)


def formula_lhs(block: str, parallel: bool, policy: str = "none", stage: bool = False, device: bool = False) -> str:
    """LaTeX names in the paper's style: M^A (MLA), M^E (MoE); subscript 1 with the split, 2 full;
    ``device``: the per-device form with the parallel sizes left symbolic."""
    letter = "A" if block == "attention" else "E"
    if device:
        return f"M^{{{letter}}}_{{\text{{device}}}}"
    if not parallel:
        return f"M^{{{letter}}}"
    sub = "2" if policy == "full" else "1"
    return ("4" if stage else "") + f"M^{{{letter}}}_{{{sub}}}"


def formula_checks(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> list[dict]:
    """Each printed formula of the paper against the ledger's sum, for the configuration it is
    printed for; the paper's d_h for the value width is memlib's d_v (equal in DeepSeek-V3)."""
    m = _model(model)
    layers = stage_names(m, train)["moe_layers"]
    out = []
    for key, (where, block, cfg, policy, times) in _FORMULA_ROWS.items():
        t = train if cfg == "paper" else None
        mult = layers if times == "stage" else 1
        ours = layer_formula(m, block, t, policy, layers=mult)
        printed = PAPER_FORMULAS[key]
        # the paper prints N/EP = 32 local experts and N_s = 1 as numbers: compare at the model's N, N_s
        at = {N: m.n_routed_experts, N_s: m.n_shared_experts}
        diff = sp.expand((ours.xreplace({d_v: d_h}) - printed).xreplace(at))
        out.append({"key": key, "where": where, "printed": printed, "memlib": ours, "match": diff == 0,
                    "difference": diff})
    return out


def formula_check_table(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> str:
    rows = [[c["where"], f"${sp.latex(sp.factor_terms(sp.expand(c['printed'])))}$", "yes" if c["match"] else
             f"**no**: ${sp.latex(c['difference'])}$"] for c in formula_checks(model, train)]
    return md_table(["printed formula", "as printed (expanded)", "ledger sum equal (with $d_v = d_h$ and the model's $N$, $N_s$)"],
                    rows, "lll")


# --------------------------------------------------------------------------------------------
# the paper's Tables 9 and 10
# --------------------------------------------------------------------------------------------
def table9(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> str:
    """The paper's Table 9 (configuration of the activation analysis), from memlib's values."""
    m = _model(model)
    e_token = [Fraction(bb * train.seq_len * m.num_experts_per_tok, m.n_routed_experts)
               for bb in PAPER_MICRO_BATCHES]
    rows = [
        ["$b$", "micro-batch size", " / ".join(map(str, PAPER_MICRO_BATCHES))],
        ["$s$", "sequence length", fmt_count(train.seq_len)],
        ["$N_r$", "routed experts per token", str(m.num_experts_per_tok)],
        ["$N$", "routed experts per layer", str(m.n_routed_experts)],
        ["$E_{token} = b s N_r / N$", "tokens per expert (balanced load)", " / ".join(fmt_count(int(x)) for x in e_token)],
        ["$SP$", "sequence parallelism", f"on, degree {train.tp} (= $TP$)" if train.sp else "off"],
        ["$CP$", "context parallelism", str(train.cp)],
        ["AC", "activation checkpointing (recompute policy)", "none or full"],
    ]
    return md_table(["symbol", "meaning", "value"], rows, "lll")


def stage_values(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING,
                 micro_batches=PAPER_MICRO_BATCHES, policies=("none", "full"), stage: int | None = None) -> dict:
    """Exact activation bytes of one micro-batch on one device of ``stage`` (the analysed stage by
    default), split into MLA and MoE, per micro-batch size and policy."""
    m = _model(model)
    stage = analysed_stage(m, train) if stage is None else stage
    out: dict = {}
    for bb in micro_batches:
        out[bb] = {}
        for p in policies:
            st = estimate(m, train.with_(micro_batch=bb, recompute=p)).stages[stage]
            by = st.activations["by_entry"]
            blocks = {blk: sum(x for k, x in by.items() if k.split(".")[0] == blk) for blk in BLOCK_LABELS}
            out[bb][p] = {**blocks, "total": st.activations["per_microbatch"],
                          "working": st.activations["recompute_working_set"]}
    return out


def table10_formulas(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> str:
    """The paper's Table 10 as formulas: a stage of four MoE layers, per device, both policies."""
    m = _model(model)
    layers = stage_names(m, train)["moe_layers"]
    rows = []
    tot = {}
    for blk, label in BLOCK_LABELS.items():
        cells = [label]
        for p in ("none", "full"):
            f = layer_formula(m, blk, train, p, layers=layers)
            tot[p] = tot.get(p, 0) + f
            cells.append(f"${sp.latex(f)}$")
        rows.append(cells)
    rows.append(["total"] + [f"${sp.latex(sp.factor_terms(sp.expand(tot[p])))}$" for p in ("none", "full")])
    return md_table(["block", "AC = none", "AC = full"], rows, "lll")


def table10(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> str:
    """Table 10 with numbers: one micro-batch through the analysed stage, exact bytes and GiB."""
    v = stage_values(model, train)
    rows = []
    for bb, row in v.items():
        none, full = row["none"], row["full"]
        rows.append([str(bb), fmt_count(none["attention"]), fmt_count(none["moe"]), fmt_count(none["total"]),
                     fmt_bytes(none["total"], "GiB", with_unit=False), fmt_count(full["total"]),
                     fmt_bytes(full["total"], "GiB", 3, with_unit=False)])
    headers = ["$b$", "MLA, none (bytes)", "MoE, none (bytes)", "total, none (bytes)", "total, none (GiB)",
               "total, full (bytes)", "total, full (GiB)"]
    return md_table(headers, rows, "rrrrrrr")


# --------------------------------------------------------------------------------------------
# Korthikanti et al., Table 2, from gpt_layer()
# --------------------------------------------------------------------------------------------
_a, _t, _L = sp.Symbol("a", positive=True), sp.Symbol("t", positive=True), sp.Symbol("L", positive=True)

#: Korthikanti et al. (arXiv 2205.05198) Table 2: activation bytes over L layers / (s b h L)
KORTHIKANTI = {
    "no parallelism": 34 + 5 * _a * s / h,
    "tensor parallel (baseline)": 10 + 24 / _t + 5 * _a * s / (h * _t),
    "tensor + sequence parallel": 34 / _t + 5 * _a * s / (h * _t),
    "tensor parallel + selective recompute": 10 + 24 / _t,
    "tensor + sequence parallel + selective recompute": 34 / _t,
    "full recompute": sp.Integer(2),
}

#: configuration of each row: (TP symbolic?, sequence parallel on?, policy)
_KORTHIKANTI_CFG = {
    "no parallelism": (False, False, "none"),
    "tensor parallel (baseline)": (True, False, "none"),
    "tensor + sequence parallel": (True, True, "none"),
    "tensor parallel + selective recompute": (True, False, "selective"),
    "tensor + sequence parallel + selective recompute": (True, True, "selective"),
    "full recompute": (True, False, "full"),
}

#: Korthikanti et al.'s Figure 1, the 22B model (as Calculon's validation transcribes it; GiB)
KORTHIKANTI_22B = {"name": "22B", "h": 6144, "a": 64, "L": 48, "t": 8, "b": 4, "s": 2048,
                   "gib": {"none": "59.25", "sp_selective": "9.5625"}}


def korthikanti_rows() -> list[dict]:
    """Per technique: the ledger's sum over L layers divided by s b h L, with f = 4h and a = n_h."""
    out = []
    for name, (tp, sp_on, policy) in _KORTHIKANTI_CFG.items():
        train = TrainingConfig(sp=sp_on)
        expr = ledger_bytes(gpt_layer(), train, recipe("paper"), parse_policy(policy)).total
        expr = expr.xreplace({h_F: 4 * h, n_h: _a, TP: _t if tp else 1, CP: 1})
        coeff = sp.expand(expr / (s * b * h))
        out.append({"name": name, "coefficient": coeff, "printed": KORTHIKANTI[name],
                    "match": sp.expand(coeff - KORTHIKANTI[name]) == 0})
    return out


def korthikanti_table() -> str:
    rows = [[r["name"], f"$sbhL\\left({sp.latex(r['coefficient'])}\\right)$",
             f"$sbhL\\left({sp.latex(r['printed'])}\\right)$", "yes" if r["match"] else "**no**"]
            for r in korthikanti_rows()]
    return md_table(["technique", "memlib, from the GPT ledger", "Korthikanti et al.", "equal"], rows, "llll")


def korthikanti_22b() -> dict:
    """Korthikanti's 22B model (their Figure 1): activations with no recompute under TP, and with
    SP and selective recompute, from the GPT ledger; exact bytes and GiB beside the printed GiB."""
    c = KORTHIKANTI_22B
    out = {"config": c}
    for key, (sp_on, policy) in {"none": (False, "none"), "sp_selective": (True, "selective")}.items():
        train = TrainingConfig(sp=sp_on)
        expr = ledger_bytes(gpt_layer(), train, recipe("paper"), parse_policy(policy)).total
        vals = {h: c["h"], h_F: 4 * c["h"], n_h: c["a"], TP: c["t"], CP: 1, b: c["b"], s: c["s"]}
        n = int(c["L"] * expr.xreplace(vals))
        out[key] = {"bytes": n, "gib": fmt_bytes(n, "GiB", 4), "printed": c["gib"][key],
                    "match": Fraction(n, 2**30) == Fraction(c["gib"][key])}
    return out


# --------------------------------------------------------------------------------------------
# sweeps: micro-batch and sequence length
# --------------------------------------------------------------------------------------------
def split_by_degree(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> Breakdown:
    """One MoE layer on one device of ``train``: its bytes split into the terms quadratic in s
    (the attention scores) and the rest, symbolic in b and s."""
    m = _model(model)
    vals = {k: v for k, v in _values(m, train).items() if k not in (b, s)}
    bd = ledger_bytes(paper_layer(m, "moe"), train, recipe(train.precision)).subs(vals)
    return Breakdown([("quadratic" if sp.degree(e, s) == 2 else "linear", e) for e in bd.values()])


def crossover(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> dict:
    """The sequence length at which the s^2 terms of a MoE layer equal all the others, and the
    share of the s^2 terms at ``train.seq_len``."""
    bd = split_by_degree(model, train)
    quad = sp.expand(bd["quadratic"] / (b * s**2))
    lin = sp.expand(bd["linear"] / (b * s))
    s_star = sp.Rational(lin, quad)
    at = {b: train.micro_batch, s: train.seq_len}
    q, total = int(bd["quadratic"].xreplace(at)), bd.evaluate_total(at)
    return {"s": Fraction(int(s_star.p), int(s_star.q)), "s_text": fmt_count(round(Fraction(int(s_star.p), int(s_star.q)))),
            "quadratic": q, "total": total, "share": percent(q, total)}


def percent(part: int, whole: int, digits: int = 1) -> str:
    """``part`` as a percentage of ``whole`` (display only)."""
    return fmt_decimal(Fraction(part * 100, whole), digits) + " %"


def microbatch_figure(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, max_b: int = 8):
    """Activations of the analysed stage against the micro-batch size, per policy: one micro-batch
    (left) and everything 1F1B holds at the stage's peak (right), GiB per device."""
    m = _model(model)
    stage = analysed_stage(m, train)
    bs = list(range(1, max_b + 1))
    fig, axes = new_figure(9.0, 3.6)
    fig.clf()
    ax1, ax2 = fig.subplots(1, 2)
    for colour, p in zip(PALETTE, POLICY_ORDER + (MODULE_LIST,)):
        one, held = [], []
        for bb in bs:
            st = estimate(m, train.with_(micro_batch=bb, recompute=p)).stages[stage]
            one.append(float(Fraction(st.activations["per_microbatch"], 2**30)))
            held.append(float(Fraction(st.bytes["activations"], 2**30)))
        label = p if p in POLICIES else "module list"
        ax1.plot(bs, one, marker="o", color=colour, label=label)
        ax2.plot(bs, held, marker="o", color=colour, label=label)
    ax1.set_ylabel("one micro-batch, GiB per device")
    ax2.set_ylabel(f"held at the {train.schedule.upper()} peak, GiB per device")
    for ax in (ax1, ax2):
        ax.set_xlabel("micro-batch size b (sequences)")
        ax.set_yscale("log")
    ax2.legend(fontsize=8)
    return fig


def seqlen_figure(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING, lo: int = 8, hi: int = 17):
    """One MoE layer, one micro-batch, one device: the s^2 terms, the others and their sum against
    the sequence length (powers of two from 2**lo to 2**hi), with the crossover marked."""
    import numpy as np

    bd = split_by_degree(model, train)
    f = bd.lambdify([b, s])
    xs = np.logspace(lo, hi, 200, base=2)
    ys = f(train.micro_batch, xs)
    gib = float(2**30)
    fig, ax = new_figure(7.0, 3.8)
    ax.plot(xs, ys["quadratic"] / gib, color=PALETTE[3], label="attention scores (terms in $s^2$)")
    ax.plot(xs, ys["linear"] / gib, color=PALETTE[0], label="all other saved tensors (terms in $s$)")
    ax.plot(xs, (ys["quadratic"] + ys["linear"]) / gib, color=PALETTE[7], ls="--", label="total")
    c = crossover(model, train)
    x_c = float(c["s"])
    y_c = float(f(train.micro_batch, x_c)["linear"]) / gib
    ax.axvline(x_c, color="grey", lw=1, ls=":")
    ax.annotate(f"crossover s = {c['s_text']}", (x_c, y_c), xytext=(8, -14), textcoords="offset points",
                fontsize=8)
    ax.axvline(train.seq_len, color=PALETTE[2], lw=1, ls="-.")
    ax.annotate(f"paper's s = {fmt_count(train.seq_len)}", (train.seq_len, y_c),
                xytext=(6, 20), textcoords="offset points", fontsize=8, color=PALETTE[2])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length s (tokens)")
    ax.set_ylabel("one MoE layer, GiB per device")
    ax.legend(fontsize=8)
    return fig


# --------------------------------------------------------------------------------------------
# recompute policies side by side
# --------------------------------------------------------------------------------------------
def policy_values(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING,
                  policies=POLICY_ORDER + (MODULE_LIST,)) -> list[dict]:
    """Per policy: one MoE layer's kept bytes (one device, one micro-batch) and the analysed stage
    under ``train.schedule``: per micro-batch, in flight, working set, total activations."""
    m = _model(model)
    stage = analysed_stage(m, train)
    vals = _values(m, train)
    out = []
    for p in policies:
        pol = parse_policy(p)
        layer = ledger_bytes(paper_layer(m, "moe"), train, recipe(train.precision), pol).evaluate_total(vals)
        st = estimate(m, train.with_(recompute=p)).stages[stage]
        a = st.activations
        out.append({"policy": p, "layer": layer, "per_microbatch": a["per_microbatch"],
                    "in_flight": a["microbatches_in_flight"], "working": a["recompute_working_set"],
                    "held": a["per_microbatch"] * a["microbatches_in_flight"], "total": st.bytes["activations"],
                    "modules": (", ".join(f"`{x}`" for x in sorted(pol.modules)) or "nothing") if not pol.full
                    else "every layer, from its input"})
    return out


def policy_table(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> str:
    rows = []
    for r in policy_values(model, train):
        rows.append([f"`{r['policy']}`", r["modules"], fmt_count(r["layer"]), fmt_bytes(r["layer"], "GiB", 3, with_unit=False),
                     fmt_bytes(r["per_microbatch"], "GiB", 3, with_unit=False), str(r["in_flight"]),
                     fmt_bytes(r["held"], "GiB", with_unit=False), fmt_bytes(r["working"], "GiB", with_unit=False),
                     f"**{fmt_bytes(r['total'], 'GiB', with_unit=False)}**"])
    headers = ["policy", "recomputes", "one MoE layer (bytes)", "one MoE layer (GiB)", "stage, one micro-batch (GiB)",
               "micro-batches in flight", "in flight (GiB)", "recompute working set (GiB)", "stage total (GiB)"]
    return md_table(headers, rows, "llrrrrrrr")


def policy_figure(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING):
    """Stacked horizontal bars per policy: micro-batches in flight and the recompute working set,
    GiB per device of the analysed stage."""
    rows = policy_values(model, train)
    fig, ax = new_figure(7.0, 3.0)
    y = list(range(len(rows)))
    held = [float(Fraction(r["held"], 2**30)) for r in rows]
    work = [float(Fraction(r["working"], 2**30)) for r in rows]
    ax.barh(y, held, color=PALETTE[0], label="micro-batches in flight")
    ax.barh(y, work, left=held, color=PALETTE[3], label="recompute working set")
    for yi, r, x in zip(y, rows, [a + w for a, w in zip(held, work)]):
        ax.annotate(fmt_bytes(r["total"], "GiB"), (x, yi), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_xlim(0, 1.18 * max(a + w for a, w in zip(held, work)))
    ax.set_yticks(y, [r["policy"] if r["policy"] in POLICIES else "module list" for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("activations, GiB per device")
    ax.legend(fontsize=8, loc="lower right")
    return fig


# --------------------------------------------------------------------------------------------
# worked problems
# --------------------------------------------------------------------------------------------
def problem_answers(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> dict:
    """Doubling the sequence length under full recomputation: what the analysed stage holds."""
    m = _model(model)
    stage = analysed_stage(m, train)
    base = estimate(m, train.with_(recompute="full")).stages[stage].activations
    longer = train.with_(recompute="full", seq_len=2 * train.seq_len)
    new = estimate(m, longer).stages[stage]
    a = new.activations
    return {"seq_len": longer.seq_len, "per_microbatch": a["per_microbatch"], "in_flight": a["microbatches_in_flight"],
            "held": a["per_microbatch"] * a["microbatches_in_flight"], "working": a["recompute_working_set"],
            "total": new.bytes["activations"], "base_working": base["recompute_working_set"],
            "working_ratio": fmt_decimal(Fraction(a["recompute_working_set"], base["recompute_working_set"]), 2),
            "held_ratio": fmt_decimal(Fraction(a["per_microbatch"], base["per_microbatch"]), 2)}


# --------------------------------------------------------------------------------------------
# the numbers the chapter's prose quotes
# --------------------------------------------------------------------------------------------
def summary(model: ModelConfig | str, train: TrainingConfig = PAPER_TRAINING) -> dict[str, str]:
    """Ready strings for the prose: configuration, Table 10 totals, crossover, policies."""
    m = _model(model)
    names = stage_names(m, train)
    stage = names["analysed"]
    v = stage_values(m, train)
    b1 = v[PAPER_MICRO_BATCHES[0]]
    pol = {r["policy"]: r for r in policy_values(m, train)}
    c = crossover(m, train)
    first = PAPER_MICRO_BATCHES[0]
    flow = {e.key: e for e in paper_layer(m, "moe")}
    vals = _values(m, train)
    rec = recipe(train.precision)
    scores = sum(int(entry_bytes(e, train, rec).xreplace(vals)) for e in flow.values() if "core_attn" in e.modules)
    mla = b1["none"]["attention"]
    return {
        "label": train.label(), "stage": str(stage), "moe_range": names["moe_range"],
        "layers": str(names["moe_layers"]), "seq_len": fmt_count(train.seq_len), "b_first": str(first),
        "ledger_b": fmt_count(train.micro_batch),
        "micro_batches": ", ".join(map(str, PAPER_MICRO_BATCHES[:-1])) + f" and {PAPER_MICRO_BATCHES[-1]}",
        "tp": str(train.tp), "ep": str(train.ep), "etp": str(train.etp),
        "none_bytes": fmt_count(b1["none"]["total"]), "none_gib": fmt_bytes(b1["none"]["total"], "GiB"),
        "full_bytes": fmt_count(b1["full"]["total"]), "full_gib": fmt_bytes(b1["full"]["total"], "GiB", 3),
        "full_mib": fmt_bytes(b1["full"]["total"], "MiB"),
        "mla_share": percent(mla, b1["none"]["total"]),
        "scores_layer": fmt_bytes(scores, "GiB"), "scores_share": c["share"],
        "crossover": c["s_text"],
        "in_flight": str(pol["none"]["in_flight"]), "schedule": train.schedule.upper(),
        **{f"{k}_total": fmt_bytes(r["total"], "GiB") for k, r in pol.items() if k in POLICIES},
        "list_total": fmt_bytes(pol[MODULE_LIST]["total"], "GiB"), "module_list": MODULE_LIST,
        "full_held": fmt_bytes(pol["full"]["held"], "GiB"), "full_working": fmt_bytes(pol["full"]["working"], "GiB"),
        "ratio_none_full": fmt_decimal(Fraction(b1["none"]["total"], b1["full"]["total"]), 0),
    }
