"""The paper's §5 (Tables 9 and 10, the per-layer formulas of §5.1 and §5.2): the activations one
device keeps for its backward pass, as memlib's ledger of saved tensors computes them for any model
and configuration; the check of each formula the paper prints against the ledger; and Korthikanti
et al.'s Table 2 and Figure 1 (arXiv 2205.05198) from the same profile's dense layer of the ``gpt`` family
(:func:`memlib.ledgers.paper.gpt_structure`), to show that the ledger is not tuned to one paper.

The ledger is the one of the estimate's profile (``paper`` for the paper's views); the printed
formulas are data (:data:`memlib.data.reference.PAPER_ACTIVATION_FORMULAS`), compared here, never used
to compute.

>>> from memlib import PAPER_TRAINING, estimate
>>> t10 = table10(estimate("deepseek-v3", PAPER_TRAINING))
>>> t10[1]["none"]["total"], t10[1]["full"]["total"]
(24671158272, 235143168)
"""
from __future__ import annotations

from fractions import Fraction

import sympy as sp

from ..ledgers.base import MODULES, POLICIES, Saved, element_bytes, entry_bytes, ledger_bytes, parse_policy
from ..config import TrainingConfig
from ..ledgers.paper import MULTI_HEAD, gpt_structure
from ..model.profiles import act_profile
from ..device.estimate import Estimate, estimate
from ..data.reference import (
    KORTHIKANTI_MODELS, KORTHIKANTI_SYMBOLS, KORTHIKANTI_TABLE2, PAPER_ACTIVATION_FORMULAS, PAPER_TABLE9,
)
from ..config.precision import recipe
from ..core.symbols import sym
from . import analysed_stage

__all__ = ["BLOCKS", "layer_kind", "ffn_block", "layer_blocks", "POLICY_ORDER", "DIVISOR_ORDER", "RECOMPUTE_CLASSES",
           "FORMULA_SPECS", "moe_layers",
           "held_count_training", "routed_count_comparison",
           "layer_ledger", "recompute_class", "ledger_rows", "routed_tokens", "table9", "table10", "table10_facts",
           "layer_formula", "table10_formulas", "formula_checks", "formula_summary",
           "KORTHIKANTI_CONVENTION", "korthikanti_gpt_ledger", "korthikanti_gpt_block", "korthikanti_gpt_rows",
           "korthikanti_models", "korthikanti_22b"]

#: the blocks of a MoE layer the paper analyses, in its order
BLOCKS = ("attention", "moe")


def layer_kind(m) -> str:
    """The kind of decoder layer the analysis follows: ``moe`` for a model with MoE layers (the paper's),
    ``dense`` for a dense model (its every layer)."""
    return "moe" if m.has_moe else "dense"


def ffn_block(m) -> str:
    """The ledger block after the attention in :func:`layer_kind`'s layer: ``moe``, or a dense model's
    ``dense_ffn``."""
    return "moe" if m.has_moe else "dense_ffn"


def layer_blocks(m) -> tuple[str, str]:
    """The two blocks of the analysed layer, in the paper's order: the attention and :func:`ffn_block`."""
    return ("attention", ffn_block(m))

#: the named recompute policies, weakest first
POLICY_ORDER = ("none", "selective", "deepseek", "full")

#: the parallel divisors in the order the book names them
DIVISOR_ORDER = ("TP", "SP", "CP", "EP", "ETP")

#: what drops a saved tensor, the weakest named recomputation first (:func:`recompute_class`)
RECOMPUTE_CLASSES = ("selective", "deepseek", "moe", "full", "kept")

b, s, h, h_F = sym("b"), sym("s"), sym("h"), sym("h_F")
n_h, d_h, d_v = sym("n_h"), sym("d_h"), sym("d_v")
N, N_s = sym("N"), sym("N_s")
TP, CP, EP, ETP = sym("TP"), sym("CP"), sym("EP"), sym("ETP")


def _index(est: Estimate, index: int | None) -> int:
    return analysed_stage(est.partition) if index is None else index


def moe_layers(est: Estimate, index: int | None = None) -> int:
    """The analysed layers (:func:`layer_kind`) on stage ``index`` (the analysed stage by default): its MoE
    decoder layers, or a dense model's decoder layers."""
    m = est.model
    layers = est.partition.stages[_index(est, index)].layers
    return sum(1 for i in layers if m.is_moe_layer(i)) if m.has_moe else len(layers)


def layer_ledger(est: Estimate, block: str | None = None, kind: str | None = None) -> list[Saved]:
    """The saved tensors of one decoder layer of ``kind`` (:func:`layer_kind` by default) in the estimate's
    profile (of one block)."""
    entries = act_profile(est.train.profile).layer(est.model, kind or layer_kind(est.model))
    return [e for e in entries if block is None or e.block == block]


def recompute_class(e: Saved) -> str:
    """What drops ``e``, the weakest named recomputation first: ``selective`` (the attention core),
    ``deepseek`` (norm outputs, MLA up-projections), ``moe`` (the MoE internals: ``moe``,
    ``shared_experts``, ``moe_act``), ``full`` (nothing but full recomputation) or ``kept`` (a
    checkpointed input, kept by every policy)."""
    if e.keep_full:
        return "kept"
    if "core_attn" in e.modules:
        return "selective"
    if e.modules & POLICIES["deepseek"].modules:
        return "deepseek"
    if e.modules & {"moe", "shared_experts", "moe_act"}:
        return "moe"
    return "full"


def ledger_rows(est: Estimate, block: str, kind: str | None = None) -> list[dict]:
    """The saved tensors of one block with their bytes on one device of ``est`` (its b and s): key,
    name, elements (symbolic, before any split), bytes per element, dtype, divisors, whether the
    rows are a mean rounded up, exact bytes, the recompute modules and named policies that drop it,
    its :func:`recompute_class` and note."""
    rec = est.recipe
    rows = []
    for e in layer_ledger(est, block, kind):
        rows.append({
            "key": e.key, "name": e.name, "elements": e.elements, "element_bytes": element_bytes(e, rec),
            "dtype": e.dtype,
            "divisors": tuple(d for d in DIVISOR_ORDER if d in e.shard and (d != "SP" or est.train.sp)),
            "mean_rows": e.mean_rows, "bytes": int(entry_bytes(e, est.train, rec).xreplace(est.values)),
            "modules": tuple(mod for mod in MODULES if mod in e.modules),
            "policies": tuple(p for p in POLICY_ORDER if POLICIES[p].drops(e)),
            "class": recompute_class(e), "note": e.note,
        })
    return rows


def routed_tokens(est: Estimate, micro_batch: int | None = None) -> dict[str, int | Fraction]:
    """Routed token copies of one micro-batch: ``e_token`` = b s N_r / N per expert (balanced
    routing), ``local_experts`` = N / EP, the paper's count on one device ``paper`` =
    ceil(b s N_r / (EP CP)) (its (N/EP) E_token, rounded up to whole tokens), and ``held`` = b s N_r
    ETP / (TP CP) (with sequence parallelism; no TP without), what a device holds once the all-to-all
    has brought it the tokens its experts receive from every rank of the EP group; ``held_exceeds``:
    whether that is more than the paper's count.  All 0 for a dense model."""
    m, t = est.model, est.train
    if not m.has_moe:                                   # a dense model routes no token
        return {"copies": 0, "e_token": 0, "local_experts": 0, "paper": 0, "held": 0, "held_exceeds": False}
    bb = t.micro_batch if micro_batch is None else micro_batch
    copies = bb * t.seq_len * m.num_experts_per_tok
    held = Fraction(copies * t.etp, (t.tp if t.sp else 1) * t.cp)
    paper = -(-copies // (t.ep * t.cp))
    return {"copies": copies, "e_token": Fraction(copies, m.n_routed_experts),
            "local_experts": m.n_routed_experts // t.ep, "paper": paper,
            "held": int(held) if held.denominator == 1 else held, "held_exceeds": held > paper}


def held_count_training(est: Estimate) -> TrainingConfig:
    """``est``'s configuration with the routed-token entries of its ledger holding what a device holds after
    the all-to-all (:func:`routed_tokens` ``held``) instead of the paper's count (``paper``): the routing
    imbalance scaled by held / paper, which multiplies exactly the per-dispatched-token entries and nothing
    else.  Unchanged where the paper's count is not smaller (EP ETP <= TP)."""
    tok = routed_tokens(est)
    if not tok["held_exceeds"]:
        return est.train
    return est.train.with_(routing_imbalance=est.train.routing_imbalance * Fraction(tok["held"], tok["paper"]))


def routed_count_comparison(est: Estimate, index: int | None = None) -> dict:
    """The paper's routed-token count beside the count a device holds (the erratum ``s5-routed-tokens``),
    under ``est``'s profile and policy, for stage ``index`` (the analysed stage by default): per count
    (``paper``, ``held``) the token copies on one device, the routed entries' bytes of one MoE layer and one
    micro-batch, the stage's activations of one micro-batch, and the activations the stage holds at its peak
    (every micro-batch in flight); ``ratio``, the held copies over the paper's, and ``added``, the activations
    the stage holds beyond the paper's count.  Exact; ``held`` equals ``paper`` when EP ETP <= TP."""
    i = _index(est, index)
    tok = routed_tokens(est)
    other = estimate(est.model, held_count_training(est), est.overhead, est.capacity)
    rec = est.train.recipe
    routed = [e for e in layer_ledger(est) if e.mean_rows and e.key.startswith("moe.routed.")]
    layer = sum(int(entry_bytes(e, est.train, rec).xreplace(est.values)) for e in routed)
    out = {}
    for key, e, tokens in (("paper", est, tok["paper"]), ("held", other, tok["held"])):
        st = e.stages[i]
        # (a dense model routes no token: no routed entry, layer = 0)
        held = layer * tok["held"] // tok["paper"] if tok["paper"] else layer
        out[key] = {"tokens": tokens, "layer_routed": layer if key == "paper" else held,
                    "stage_per_microbatch": st.activations["per_microbatch"], "stage_held": st.bytes["activations"],
                    "in_flight": st.activations["microbatches_in_flight"], "total": st.total}
    out["ratio"] = Fraction(tok["held"], tok["paper"]) if tok["paper"] else Fraction(1)
    out["added"] = out["held"]["stage_held"] - out["paper"]["stage_held"]
    return out


def table9(est: Estimate, micro_batches: tuple[int, ...] = PAPER_TABLE9["micro_batch"]) -> dict:
    """The paper's Table 9 for ``est``'s model and configuration: the micro-batch sizes, s, N_r, N,
    E_token and the paper's routed tokens per device for each b, sequence parallelism, CP and the
    recompute policies compared."""
    m, t = est.model, est.train
    return {"micro_batches": tuple(micro_batches), "seq_len": t.seq_len, "N_r": m.num_experts_per_tok or 0,
            "N": m.n_routed_experts or 0, "e_token": tuple(routed_tokens(est, bb)["e_token"] for bb in micro_batches),
            "paper_tokens": tuple(routed_tokens(est, bb)["paper"] for bb in micro_batches),
            "sp": t.sp and t.tp > 1, "sp_degree": t.tp if t.sp else 1, "cp": t.cp,
            "recompute": PAPER_TABLE9["recompute"]}


def table10(est: Estimate, micro_batches: tuple[int, ...] = PAPER_TABLE9["micro_batch"],
            policies: tuple[str, ...] = PAPER_TABLE9["recompute"], index: int | None = None) -> dict:
    """The paper's Table 10 in numbers: bytes of one micro-batch through stage ``index`` on one
    device, per block of the ledger (``attention``, ``moe``, and any other block the stage holds)
    and ``total``, per micro-batch size and recompute policy (``est``'s configuration otherwise)."""
    i = _index(est, index)
    out: dict = {}
    for bb in micro_batches:
        out[bb] = {}
        for p in policies:
            c = est.train.with_(micro_batch=bb, recompute=p)
            act = (est if c == est.train else estimate(est.model, c)).stages[i].activations
            blocks: dict[str, int] = {blk: 0 for blk in layer_blocks(est.model)}
            for k, x in act["by_entry"].items():
                blocks[k.split(".")[0]] = blocks.get(k.split(".")[0], 0) + x
            out[bb][p] = {**blocks, "total": act["per_microbatch"]}
    return out


def table10_facts(est: Estimate, index: int | None = None) -> dict:
    """At the first micro-batch size of Table 9: the share of the MLA blocks without recomputation,
    whether they are most of it, and how many times less full recomputation keeps."""
    first = PAPER_TABLE9["micro_batch"][0]
    t = table10(est, (first,), ("none", "full"), index)[first]
    share = Fraction(t["none"]["attention"], t["none"]["total"])   # the attention blocks' share
    return {"micro_batch": first, "mla_share": share, "mla_most": share > Fraction(1, 2),
            "none_over_full": Fraction(t["none"]["total"], t["full"]["total"])}


def layer_formula(est: Estimate, block: str, policy: str = "none", parallel: str = "config", layers: int = 1,
                  kind: str | None = None) -> sp.Expr:
    """Bytes of one block's kept tensors per micro-batch on one device, symbolic in the model's sizes,
    b and s: ``parallel="none"`` without any parallelism (TP = CP = EP = ETP = 1, SP off),
    ``"config"`` with ``est``'s parallel sizes substituted; times ``layers``."""
    entries = layer_ledger(est, block, kind)
    pol = parse_policy(policy)
    if parallel == "none":
        expr = ledger_bytes(entries, TrainingConfig(sp=False), est.train.recipe, pol).total
        expr = expr.xreplace({TP: 1, CP: 1, EP: 1, ETP: 1})
    else:
        t = est.train
        expr = ledger_bytes(entries, t, est.recipe, pol).total.xreplace({TP: t.tp, CP: t.cp, EP: t.ep, ETP: t.etp})
    return sp.factor_terms(sp.expand(layers * expr))


def table10_formulas(est: Estimate, index: int | None = None) -> dict[str, dict[str, sp.Expr]]:
    """The paper's Table 10 as formulas: the MoE layers of stage ``index`` on one device, per block
    and their ``total``, without recomputation and with full recomputation."""
    n = moe_layers(est, index)
    blocks = layer_blocks(est.model)
    out = {blk: {p: layer_formula(est, blk, p, layers=n) for p in PAPER_TABLE9["recompute"]} for blk in blocks}
    out["total"] = {p: sp.factor_terms(sp.expand(sum(out[blk][p] for blk in blocks)))
                    for p in PAPER_TABLE9["recompute"]}
    return out


#: each printed formula (where, key): its label, block, parallelism, policy and whether it is a stage's
FORMULA_SPECS = {
    ("§5.1", "mla"): ("§5.1, MLA, one layer, no parallelism", "attention", "none", "none", False),
    ("§5.1", "mla_tp"): ("§5.1, MLA, one layer, TP and SP", "attention", "config", "none", False),
    ("§5.2", "moe_ep"): ("§5.2, MoE, one layer, SP, EP and ETP", "moe", "config", "none", False),
    ("§5.1", "mla_full"): ("§5.1, MLA, one layer, full recomputation", "attention", "config", "full", False),
    ("§5.2", "moe_full"): ("§5.2, MoE, one layer, full recomputation", "moe", "config", "full", False),
    ("Table 10", "mla"): ("Table 10, MLA, AC = None", "attention", "config", "none", True),
    ("Table 10", "moe"): ("Table 10, MoE, AC = None", "moe", "config", "none", True),
    ("Table 10", "mla_full"): ("Table 10, MLA, AC = Full", "attention", "config", "full", True),
    ("Table 10", "moe_full"): ("Table 10, MoE, AC = Full", "moe", "config", "full", True),
}


def _exact_ceilings(expr: sp.Expr, values: dict) -> bool:
    """Whether every ceiling of ``expr`` (the routed tokens: b s N_r / (EP CP) rounded up) acts on a
    whole number for every b, given the model's values and s: its argument is b times a constant."""
    for c in expr.atoms(sp.ceiling):
        arg = c.args[0].xreplace({k: v for k, v in values.items() if k != b})
        per_b = sp.simplify(arg / b)
        if per_b.free_symbols or not per_b.is_integer:
            return False
    return True


def formula_checks(est: Estimate, index: int | None = None) -> list[dict]:
    """Each formula the paper prints (:data:`memlib.data.reference.PAPER_ACTIVATION_FORMULAS`) against the
    ledger's sum for the configuration it is printed for (``est``'s parallel sizes, the stage's MoE
    layers for Table 10).  The paper writes d_h for the value width (memlib's d_v) and prints N/EP and
    N_s as numbers, so both sides are compared at the model's N and N_s; the ledger rounds the routed
    tokens up, which is exact where EP CP divides b s N_r for every b (``exact``).  ``same_formula``:
    the two are equal with the routed tokens at their mean; ``equal``: and no rounding acts."""
    m = est.model
    n = moe_layers(est, index)
    at = {N: m.n_routed_experts, N_s: m.n_shared_experts}
    out = []
    for (where, key), (label, block, parallel, policy, stage) in FORMULA_SPECS.items():
        ours = layer_formula(est, block, policy, parallel, n if stage else 1)
        printed = PAPER_ACTIVATION_FORMULAS[where][key]
        exact = _exact_ceilings(ours, est.values)
        mean = ours.replace(sp.ceiling, lambda x: x)
        diff = sp.factor_terms(sp.expand((mean.xreplace({d_v: d_h}) - printed).xreplace(at)))
        out.append({"where": where, "key": key, "label": label, "printed": printed, "memlib": ours,
                    "difference": diff, "same_formula": diff == 0, "exact": exact, "equal": diff == 0 and exact})
    return out


def formula_summary(checks: list[dict]) -> dict[str, int | bool]:
    """How many formulas there are, how many equal the ledger, whether all do, and whether no
    rounding acts in any (``exact``; rows without the flag have none)."""
    equal = sum(1 for c in checks if c["equal"])
    return {"formulas": len(checks), "equal": equal, "all_equal": equal == len(checks),
            "exact": all(c.get("exact", True) for c in checks)}


# ------------------------------------------------------------------------------------------------
# Korthikanti et al. (arXiv 2205.05198)
# ------------------------------------------------------------------------------------------------
#: each row of their Table 2: (tensor parallelism on, sequence parallelism on, recompute policy)
KORTHIKANTI_CONFIG = {
    "no parallelism": (False, False, "none"),
    "tensor parallel (baseline)": (True, False, "none"),
    "tensor + sequence parallel": (True, True, "none"),
    "tensor parallel + selective recompute": (True, False, "selective"),
    "tensor + sequence parallel + selective recompute": (True, True, "selective"),
    "full recompute": (True, False, "full"),
}

__all__ += ["KORTHIKANTI_CONFIG"]


#: how Korthikanti et al. count (their §4.1), which the paper profile's ``gpt`` block (LayerNorm, multi-head
#: attention with dropout, GeLU MLP, dropout after each block) shares: 2-byte activations, 1-byte dropout
#: masks, no LayerNorm statistics, the s x s softmax output, dropout mask and dropout output per head,
#: f = 4h, a heads of h/a each (multi-head: as many key-value heads), t = TP.  One convention differs:
#: their full recomputation checkpoints each layer once, keeping its input (2 s b h, not split over t: their
#: row assumes no sequence parallelism), where the paper profile follows arXiv 2502.07846 §5.2 and keeps
#: each block's input (the attention's and the MLP's: 4 s b h); the Korthikanti view keeps the first only
KORTHIKANTI_CONVENTION = {"activation_bytes": 2, "mask_bytes": 1, "ffn_width": "4h", "heads": "a = n_h = n_kv",
                          "head_dim": "h / a", "full_recompute_keeps": "the layer input (one checkpoint per layer)"}


def korthikanti_gpt_ledger(per_layer_checkpoint: bool = True) -> list[Saved]:
    """The layer Korthikanti et al. count: the paper profile's ledger of one dense layer of the ``gpt`` family
    (:func:`memlib.ledgers.paper.gpt_structure`), blocks ``attention`` and ``dense_ffn``.  ``per_layer_checkpoint``
    (their convention): full recomputation keeps only the layer's input, not the MLP block's input too (the
    paper profile's, ``False``)."""
    from dataclasses import replace

    layer = act_profile("paper").layer(gpt_structure(), "dense")
    if per_layer_checkpoint:
        layer = [e if e.block == "attention" else replace(e, keep_full=False) for e in layer]
    return layer


def korthikanti_gpt_block(sp_on: bool, policy: str, tp_on: bool = True, *, per_layer_checkpoint: bool = True,
                          entries: list[Saved] | None = None) -> sp.Expr:
    """Activation bytes of one dense layer of the ``gpt`` family under the paper profile (2-byte activations,
    1-byte masks: :data:`KORTHIKANTI_CONVENTION`), in Korthikanti's symbols s, b, h, a and t (t = 1 without
    tensor parallelism, f = 4h, a heads of h/a): the sum of :func:`korthikanti_gpt_ledger`, or of ``entries``
    (a part of it)."""
    a, t = KORTHIKANTI_SYMBOLS["a"], KORTHIKANTI_SYMBOLS["t"]
    layer = korthikanti_gpt_ledger(per_layer_checkpoint) if entries is None else entries
    expr = ledger_bytes(layer, TrainingConfig(sp=sp_on), recipe("paper"), parse_policy(policy)).total
    expr = expr.xreplace(MULTI_HEAD)
    return sp.expand(expr.xreplace({h_F: 4 * h, n_h: a, TP: t if tp_on else 1, CP: 1}))


def korthikanti_gpt_rows() -> list[dict]:
    """Their Table 2 from the ``gpt`` family's dense layer (:func:`korthikanti_gpt_block`): per row the
    bytes per layer divided by s b h, beside the printed coefficient, and whether the two are equal."""
    out = []
    for name, (tp_on, sp_on, policy) in KORTHIKANTI_CONFIG.items():
        coeff = sp.expand(korthikanti_gpt_block(sp_on, policy, tp_on) / (s * b * h))
        printed = KORTHIKANTI_TABLE2[name]
        out.append({"name": name, "coefficient": coeff, "printed": printed,
                    "equal": sp.expand(coeff - printed) == 0})
    return out


def korthikanti_models() -> list[dict]:
    """Their Figure 1 from the ``gpt`` family's dense layer (:func:`korthikanti_gpt_block`): the activations
    of the first pipeline rank of each model of :data:`memlib.data.reference.KORTHIKANTI_MODELS`, with tensor
    parallelism alone (``none``) and with sequence parallelism and selective recompute (``sp_selective``), in
    exact bytes (an integer where whole) beside the printed GiB.

    The first rank holds the layers of the micro-batches in flight at its peak: memlib's schedule gives
    the chunk-micro-batches (:func:`memlib.device.schedule.in_flight`: p under 1F1B, p V + p - 1 under the
    interleaved schedule, their p (1 + (p - 1)/(p V)) stages' worth), each chunk L/(p V) layers."""
    from ..device.schedule import in_flight

    a, t = KORTHIKANTI_SYMBOLS["a"], KORTHIKANTI_SYMBOLS["t"]
    out = []
    for name, c in KORTHIKANTI_MODELS.items():
        sched = dict(pp=c["p"], vpp=c["V"], schedule="interleaved") if c["V"] > 1 else dict(pp=c["p"])
        chunk_mbs = sum(in_flight(TrainingConfig(**sched), 0))
        layers = Fraction(chunk_mbs * c["L"], c["p"] * c["V"])
        vals = {h: c["h"], a: c["a"], t: c["t"], b: c["b"], s: c["s"]}
        row: dict = {"name": name, "config": c, "layers": layers}
        for key, (sp_on, policy) in {"none": (False, "none"), "sp_selective": (True, "selective")}.items():
            n = layers * Fraction(int(korthikanti_gpt_block(sp_on, policy).xreplace(vals)))
            row[key] = {"bytes": int(n) if n.denominator == 1 else n, "printed": c["gib"][key],
                        "equal": n / 2**30 == Fraction(c["gib"][key])}
        row["all_equal"] = row["none"]["equal"] and row["sp_selective"]["equal"]
        out.append(row)
    return out


def korthikanti_22b() -> dict:
    """Their 22B model (Figure 1; one pipeline stage, so its L layers of one micro-batch): its row of
    :func:`korthikanti_models`."""
    return next(r for r in korthikanti_models() if r["name"] == "22B")
