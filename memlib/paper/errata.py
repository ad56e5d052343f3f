"""The paper's inconsistencies, and those of DeepSeek's statements: what a
source prints beside what memlib computes, and why they differ.

Each :class:`Erratum` keeps the printed value verbatim (from :data:`memlib.data.reference.PAPER` and its
neighbours), memlib's exact values as :class:`Q` quantities, and its text as templates whose
``{name}`` fields name those quantities; the report formats them (``memlib.report.tables``).  The
items concern the paper's DeepSeek-V3 under the paper's configuration: for another model
:func:`errata` returns none.

>>> from memlib import PAPER_TRAINING, estimate
>>> items = {e.id: e for e in errata(estimate("deepseek-v3", PAPER_TRAINING))}
>>> items["t6-mla-gb"].printed, items["t6-mla-gb"].values["bytes"].value
('0.82', 859308032)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ..ledgers.base import ledger_bytes, parse_policy, training_values
from ..config import TrainingConfig
from ..ledgers.megatron import megatron_layer
from ..ledgers.paper import paper_layer
from ..device.estimate import Estimate
from ..model.params import activated_params, layer_params, mtp_params, per_layer_totals, values
from ..model.partition import parallel_values
from ..data.reference import DEEPSEEK_OFFICIAL, PAPER
from ..config import ZeroStage
from ..config.precision import RECIPES
from . import analysed_stage, is_paper_model
from . import static as pstatic
from . import zero as pzero

__all__ = ["Q", "Erratum", "KINDS", "errata", "counts"]


@dataclass(frozen=True)
class Q:
    """A computed quantity and how it is shown: ``count``, ``bytes`` (GiB and the exact bytes),
    ``GiB``, ``MiB``, ``billions``, ``percent`` (``digits`` decimals), or ``text``."""

    value: int | Fraction | str
    unit: str = "count"
    digits: int = 2


#: the kinds of discrepancy, and how a sentence names one and several
KINDS = {
    "unit": ("a unit or rounding slip", "unit or rounding slips"),
    "rounding": ("a sum of rounded terms", "sums of rounded terms"),
    "label": ("a mislabelled term", "mislabelled terms"),
    "convention": ("a modelling convention rather than an error", "modelling conventions rather than errors"),
    "omission": ("a term left out", "terms left out"),
    "accounting": ("a term counted differently from what an implementation stores",
                   "terms counted differently from what an implementation stores"),
    "statement": ("a rounded public statement", "rounded public statements"),
    "reading": ("a figure that is right once read as its source means it",
                "figures that are right once read as their source means them"),
}


@dataclass(frozen=True)
class Erratum:
    """One discrepancy: where, what is printed, what memlib computes (``computed``, a template over
    ``values``), and why (``reason``, likewise)."""

    id: str
    chapter: str          #: the chapter that discusses it: parameters, static, zero, activations
    source: str           #: where the printed value is
    kind: str             #: a key of :data:`KINDS`
    printed: str          #: verbatim (the paper's "GB" are GiB)
    computed: str         #: template
    reason: str           #: template
    values: dict[str, Q] = field(default_factory=dict)


def _billions(printed: str) -> int:
    return int(Fraction(printed.rstrip("B")) * 10**9)


def errata(est: Estimate) -> list[Erratum]:
    """Every item, computed for the paper's model under ``est``'s configuration; none for another
    model (its printed values are DeepSeek-V3's)."""
    if not is_paper_model(est.model):
        return []
    return _parameter_items(est) + _static_items(est) + _zero_items(est) + _activation_items(est)


def counts(items: list[Erratum]) -> dict[str, int]:
    """How many items of each kind (kinds present only)."""
    out = {k: sum(1 for e in items if e.kind == k) for k in KINDS}
    return {k: n for k, n in out.items() if n}


def _parameter_items(est: Estimate) -> list[Erratum]:
    m = est.model
    vals = values(m)
    layers = per_layer_totals(m)
    moe_layer = layer_params(m, "moe").evaluate_total(vals)
    part = est.partition
    stage0 = part.params_unsharded(part.stages[0]).evaluate_total(part.values)
    t3, t4 = PAPER["table3"], PAPER["table4"]
    off = DEEPSEEK_OFFICIAL["deepseek-v3"]
    act = activated_params(m).evaluate_total(vals)
    act_ne = activated_params(m, embedding=False).evaluate_total(vals)
    mtp = mtp_params(m).evaluate_total(vals)
    return [
        Erratum("t3-moe-layer-gb", "parameters", "paper, layer table", "unit", t3["3-59"]["memory_gb"], "{bf16}",
                "One MoE layer holds {params} parameters, {bf16_3} in bf16; the printed value is rounded up.",
                {"bf16": Q(2 * moe_layer, "bytes"), "params": Q(moe_layer), "bf16_3": Q(2 * moe_layer, "GiB", 3)}),
        Erratum("t4-stage0-params", "parameters", "paper, stage table", "rounding", t4["0"]["params"],
                "{stage0} ({stage0_exact})",
                "The printed count is the sum of the rounded per-layer counts ({l0} + two of {l1} + {moe}); the "
                "exact layers are {layers}.",
                {"stage0": Q(stage0, "billions"), "stage0_exact": Q(stage0), "l0": Q(t3["0"]["params"], "text"),
                 "l1": Q(t3["1-2"]["params"], "text"), "moe": Q(t3["3-59"]["params"], "text"),
                 "layers": Q(", ".join([f"{stage0 - sum(layers[1:4]):,} (the first, with the embedding)"]
                                       + [f"{x:,}" for x in layers[1:3]]) + f" and {layers[3]:,}", "text")}),
        Erratum("ds-activated", "parameters", "DeepSeek-V3 model card and weights documentation", "statement",
                f"{off['activated']}B and {off['activated_weights_doc']}B",
                "{act} ({act_exact}) with the embedding; {act_ne} ({act_ne_exact}) without it",
                "With the embedding matrix counted whole (a token reads one row of it) the count is {act_1}, which "
                "the model card's {card} truncates; without it, {act_ne_1}, not {doc}: the weights documentation "
                "counts {gap} more than either reading of memlib's count, which memlib cannot attribute to a tensor.",
                {"act": Q(act, "billions"), "act_exact": Q(act), "act_ne": Q(act_ne, "billions"),
                 "act_ne_exact": Q(act_ne), "act_1": Q(act, "billions", 1), "act_ne_1": Q(act_ne, "billions", 1),
                 "card": Q(off["activated"] + "B", "text"), "doc": Q(off["activated_weights_doc"] + "B", "text"),
                 "gap": Q(_billions(off["activated_weights_doc"]) - act_ne, "billions")}),
        Erratum("ds-mtp", "parameters", "DeepSeek-V3 weights documentation", "statement", f"{off['mtp']}B",
                "{mtp} ({mtp_exact}); its decoder block alone {block} ({block_exact})",
                "The stated figure matches the MTP module's decoder block alone ({block_1}), a plausible reading "
                "that DeepSeek does not document; the whole module, with its own projection and three RMSNorms, "
                "is {mtp_1}.",
                {"mtp": Q(mtp, "billions"), "mtp_exact": Q(mtp), "block": Q(moe_layer, "billions"),
                 "block_exact": Q(moe_layer), "block_1": Q(moe_layer, "billions", 1), "mtp_1": Q(mtp, "billions", 1)}),
    ]


def _static_items(est: Estimate) -> list[Erratum]:
    part = est.partition
    i = analysed_stage(part)
    t6 = pstatic.table6(part, i)
    w = RECIPES[est.train.precision].weights
    deltas = pstatic.profile_deltas(part, i)
    printed6 = PAPER["table6"]
    return [
        Erratum("t6-mla-gb", "static", "paper, Table 6", "unit", printed6["MLA"]["memory_gb"], "{bytes}",
                "The byte count is printed correctly; it is {mib}, and the printed value looks like that number "
                "divided by a thousand. Only {non_moe} + {moe} adds up to the printed total {total}.",
                {"bytes": Q(w * t6["MLA"], "bytes"), "mib": Q(w * t6["MLA"], "MiB"),
                 "non_moe": Q(w * t6["non-MoE"], "GiB"), "moe": Q(w * t6["MoE"], "GiB"),
                 "total": Q(printed6["total"]["memory_gb"], "text")}),
        Erratum("t6-nonmoe-gb", "static", "paper, Table 6", "unit", printed6["non-MoE"]["memory_gb"], "{bytes}",
                "The same slip as the MLA row: the RMSNorm weights add too little to change the value.",
                {"bytes": Q(w * t6["non-MoE"], "bytes")}),
        Erratum("s3-wqr-replicated", "static", "paper, §3.2", "convention", f"{PAPER['mla_replicated']:,}",
                "{repl} (paper's convention); {split} with W^QR split",
                "The paper keeps W^QR replicated under TP; Megatron-Core fuses it with W^UQ into one "
                "column-parallel projection, which stores {wqr} fewer parameters per device.",
                {"repl": Q(t6["MLA, replicated"]), "split": Q(t6["MLA, replicated"] - deltas["wqr"]),
                 "wqr": Q(deltas["wqr"])}),
        Erratum("s3-shared-replicated", "static", "paper, §3.3", "convention", f"{PAPER['table6']['MoE']['params']:,}",
                "{moe} (paper's convention); {split} with the shared expert split",
                "The paper replicates the shared expert on every TP rank; Megatron-Core splits it like a dense "
                "FFN, which stores {shared} fewer parameters per device.",
                {"moe": Q(t6["MoE"]), "split": Q(t6["MoE"] - deltas["shared"]), "shared": Q(deltas["shared"])}),
    ]


def _zero_items(est: Estimate) -> list[Erratum]:
    part = est.partition
    i = analysed_stage(part)
    t8 = pzero.table8(est, i)
    p8 = PAPER["table8"]
    sh = pzero.sharding(part, i)
    swap = pzero.prose_swap(est, i)
    none, os_ = t8[ZeroStage.NONE], t8[ZeroStage.OS]
    return [
        Erratum("t8-none-total", "zero", "paper, Table 8", "rounding", p8[0]["total"], "{total}",
                "The printed total is the sum of the printed, rounded terms ({pw} + {pg} + {po}); the exact terms "
                "are {w}, {g} and {o}.",
                {"total": Q(none["total"], "bytes"), "pw": Q(p8[0]["parameters"], "text"),
                 "pg": Q(p8[0]["gradients"], "text"), "po": Q(p8[0]["optimizer_states"], "text"),
                 "w": Q(none["parameters"], "GiB"), "g": Q(none["gradients"], "GiB"),
                 "o": Q(none["optimizer_states"], "GiB")}),
        Erratum("t8-os-total", "zero", "paper, Table 8", "rounding", p8[1]["total"], "{total}",
                "Again a sum of rounded terms ({pw} + {pg} + {po}).",
                {"total": Q(os_["total"], "bytes"), "pw": Q(p8[1]["parameters"], "text"),
                 "pg": Q(p8[1]["gradients"], "text"), "po": Q(p8[1]["optimizer_states"], "text")}),
        Erratum("t8-one-decimal", "zero", "paper, Table 8", "rounding",
                f"{p8[0]['gradients']} and {p8[0]['optimizer_states']}", "{g} and {o}",
                "The unsharded gradients and optimizer states are printed to one decimal, every other cell to "
                "two: this moves the two totals above.",
                {"g": Q(none["gradients"], "GiB"), "o": Q(none["optimizer_states"], "GiB")}),
        Erratum("s4-prose-swap", "zero", "paper, §4 prose (as transcribed)", "label",
                f"{p8[0]['gradients']} called optimizer states (× {swap['B_g']}); "
                f"{p8[0]['optimizer_states']} called gradients (× {swap['B_o']})",
                "gradients {g} (× {bg}); optimizer states {o} (× {bo})",
                "The prose, as a transcription of it reads, swaps the two labels; Table 7 ({bg}-byte fp32 "
                "gradients, {bo}-byte optimizer states) and Table 8 agree with memlib.",
                {"g": Q(swap["gradients"], "GiB"), "o": Q(swap["optimizer_states"], "GiB"), "bg": Q(swap["B_g"]),
                 "bo": Q(swap["B_o"])}),
        Erratum("s4-edp-rule", "zero", "paper, §4", "convention", f"{PAPER['zero_sharded_params']:,}",
                "{paper} (paper's rule); {megatron} (Megatron-Core's rule)",
                "The paper shards the router's and shared expert's states over EDP = {edp}, as the routed experts'; "
                "Megatron-Core shards them, replicated on every rank of a stage, over DP CP = {ne_div}: {diff} "
                "fewer parameters' states per device.",
                {"paper": Q(sh["paper"]["shard"]), "megatron": Q(sh["megatron"]["shard"]),
                 "edp": Q(sh["paper"]["e_div"]), "ne_div": Q(sh["paper"]["ne_div"]),
                 "diff": Q(sh["difference"]["shard"])}),
    ]


def _activation_items(est: Estimate) -> list[Erratum]:
    m, t = est.model, est.train
    part = est.partition
    stage = part.stages[analysed_stage(part)]
    moe_layers = sum(1 for i in stage.layers if m.is_moe_layer(i))
    vals = {**values(m), **parallel_values(t), **training_values(t)}
    rec = RECIPES[t.precision]
    full = parse_policy("full")
    routed = {e.key: e for e in paper_layer(m, "moe")}["moe.routed.input"]
    from ..ledgers.base import entry_bytes

    paper_tokens = int(entry_bytes(routed, t, rec).xreplace(vals)) // (rec.activations * m.hidden_size)
    held_tokens = t.micro_batch * t.seq_len * m.num_experts_per_tok * t.etp // (t.tp if t.sp else 1) // t.cp

    def stage_bytes(layer, policy=None):
        return moe_layers * ledger_bytes(layer(m, "moe"), t, rec, policy).evaluate_total(vals)

    one = TrainingConfig(sp=False)
    unsplit = {**vals, **{k: 1 for k in parallel_values(one)}}

    def latent_bytes(layer, keys):
        return sum(ledger_bytes([e for e in layer(m, "moe") if e.key in keys], one, rec).evaluate(unsplit).values())

    latents = ("attention.c_q", "attention.c_kv")
    return [
        Erratum("s5-routed-tokens", "activations", "paper, §5.2", "accounting",
                f"(N/EP) E_token = b s N_r / EP = {paper_tokens:,} routed token copies per device",
                "b s N_r ETP / TP = {held} per device (balanced routing)",
                "The paper's E_token counts one micro-batch's tokens, but EP is carved out of data parallelism: "
                "each device receives its experts' tokens from every EP rank, as many as it sends, so EP does not "
                "divide the routed activations. The paper profile keeps the paper's count, the megatron profile "
                "the stored one.",
                {"held": Q(held_tokens)}),
        Erratum("s5-full-checkpoints", "activations", "paper, §5 and Table 10, AC = Full", "convention",
                f"8 b s h + 8 b s N_r = {stage_bytes(paper_layer, full):,} bytes for {moe_layers} layers",
                "{megatron} bytes in Megatron-Core (megatron profile)",
                "The paper keeps each block's input (the attention's and the MoE's) and the routing map; "
                "Megatron-Core's full recomputation keeps one tensor per layer, its input, and recomputes the rest "
                "from it, routing included.",
                {"megatron": Q(stage_bytes(megatron_layer, full))}),
        Erratum("s5-latent-norms", "activations", "paper, §5.1", "convention",
                f"2 b s (d_c' + d_c) = {latent_bytes(paper_layer, latents):,} bytes per layer, without parallelism",
                "{megatron} bytes in Megatron-Core (megatron profile)",
                "The paper counts each latent, c^Q and c^KV, once; the latent RMSNorm keeps its input for its "
                "backward and the up-projection the norm's output for its weight gradient: an implementation "
                "holds each latent twice (plus one fp32 statistic per token).",
                {"megatron": Q(latent_bytes(megatron_layer, {f"{k}{x}" for k in latents for x in ("", "_normed")}))}),
        Erratum("s5-value-dim", "activations", "paper, §5.1", "convention", "2 b s d_h n_h (values, attention output)",
                "2 b s d_v n_h", "The paper writes d_h for the value head dimension; DeepSeek's configs keep it apart "
                "(v_head_dim). Both are the same in DeepSeek-V3, so no number changes."),
    ]
