"""The paper's inconsistencies (and the reference reconstruction's), as data beside exact values.

Each :class:`Erratum` names what a source prints, what memlib computes exactly, and why they
differ.  The printed values come from :data:`memlib.reference.PAPER` (or, for the reconstruction's
own numbers, from :data:`RECONSTRUCTION` below); the computed ones from memlib at call time.  The
static-memory and ZeRO chapters show their items; the errata chapter shows them all with
:func:`errata_table`.

The paper prints "GB"; its numbers are GiB (2**30 bytes), so the printed values are compared with
GiB and the table carries no decimal GB.

>>> from memlib.config import PAPER_TRAINING, load_model
>>> e = {x.id: x for x in errata(load_model("deepseek-v3"), PAPER_TRAINING)}
>>> e["t6-mla-gb"].printed, e["t6-mla-gb"].computed
('0.82', '0.80 GiB (859,308,032 bytes)')
"""
from __future__ import annotations

from dataclasses import dataclass

from fractions import Fraction

from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model
from ..params import activated_params, layer_params, model_params, mtp_params, per_layer_totals, values
from ..partition import Partition
from ..reference import DEEPSEEK_OFFICIAL, PAPER
from ..units import fmt_decimal, fmt_billions, fmt_bytes, fmt_count
from ..states import recipe
from . import static, zero
from .core import md_table

__all__ = ["Erratum", "RECONSTRUCTION", "SECONDARY", "errata", "errata_table", "errata_counts", "kinds_table", "KINDS"]

#: values the reference reconstruction (shared/reference/paper.md) derived itself, not printed by
#: the paper; kept so the book can show where memlib differs from them
RECONSTRUCTION = {
    "stage15_params": 2_025_930_752,   # "Stage 15: 2,025,930,752 params (3.77 GiB)", §3.4 [inferred]
}

#: statements of the transcription ("DD" in the reference) and of public summaries that the
#: reference flags as wrong; kept verbatim so the errata chapter can put them beside exact values
SECONDARY = {
    "dd_replicated_share": "26%",          # "the replicated part is about 26% of MLA parameters"
    "dd_full_moe": "2bsh + 2bsN_r",        # DD's implementation notes for the MoE block under full recompute
    "summary_v2lite_activated": "21.38B",  # reference §8: V2-Lite "activated 21.38B including the embedding"
}

#: what kind of discrepancy an item is
KINDS = {
    "unit": "unit or rounding slip",
    "rounding": "sum of rounded terms",
    "label": "mislabelled term",
    "convention": "a modelling convention, not an error",
    "omission": "a term left out",
    "accounting": "a term counted differently from what an implementation stores",
    "statement": "a rounded public statement",
    "transcription": "an error of a secondary source",
    "reading": "a figure that is right once read as its source means it",
}


@dataclass(frozen=True)
class Erratum:
    """One discrepancy: where, what is printed, what memlib computes, why."""

    id: str          #: stable identifier, e.g. ``"t8-none-total"``
    chapter: str     #: the chapter that discusses it: parameters, static, zero, activations
    source: str      #: where the printed value is (``"paper, Table 6"``, ``"reference reconstruction"``)
    kind: str        #: a key of :data:`KINDS`
    printed: str     #: the value as printed (the paper's "GB" are GiB)
    computed: str    #: memlib's exact value, formatted
    reason: str      #: one or two sentences


def errata(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = PAPER_TRAINING) -> list[Erratum]:
    """All items, computed for ``model`` under ``train`` (the paper's configuration by default)."""
    m = load_model(model)
    t6 = static.table6_values(m, train)
    printed6 = PAPER["table6"]
    deltas = static.profile_deltas(m, train)
    t8 = zero.table8_values(m, train)
    printed8 = PAPER["table8"]
    shard = zero.sharding_values(m, train)
    swap = zero.prose_swap(m, train)
    tables = {**static.PAPER_TABLES, **zero.PAPER_TABLES}

    def gib(n: int) -> str:
        return fmt_bytes(n, "GiB")

    def gib_bytes(n: int) -> str:
        return f"{gib(n)} ({fmt_count(n)} bytes)"

    items = [
        Erratum(
            "t6-mla-gb", "static", f"paper, {tables['static']}", "unit", printed6["MLA"]["memory_gb"],
            gib_bytes(t6["mla_bytes"]),
            f"The byte count is printed correctly; it is {fmt_bytes(t6['mla_bytes'], 'MiB')}, and the "
            f"printed value looks like that number divided by a thousand. Only {gib(t6['non_moe_bytes'])} + {gib(t6['moe_bytes'])} adds up "
            f"to the printed total {printed6['total']['memory_gb']}."),
        Erratum(
            "t6-nonmoe-gb", "static", f"paper, {tables['static']}", "unit", printed6["non-MoE"]["memory_gb"],
            gib_bytes(t6["non_moe_bytes"]),
            "The same slip as the MLA row: the RMSNorm weights add too little to change the value."),
        Erratum(
            "t8-none-total", "zero", f"paper, {tables['zero']}", "rounding", printed8[0]["total"],
            gib_bytes(t8["total"][0]),
            f"The printed total is the sum of the printed, rounded terms "
            f"({printed8[0]['parameters']} + {printed8[0]['gradients']} + {printed8[0]['optimizer_states']}); "
            f"the exact terms are {gib(t8['parameters'][0])}, {gib(t8['gradients'][0])} and "
            f"{gib(t8['optimizer_states'][0])}."),
        Erratum(
            "t8-os-total", "zero", f"paper, {tables['zero']}", "rounding", printed8[1]["total"],
            gib_bytes(t8["total"][1]),
            f"Again a sum of rounded terms ({printed8[1]['parameters']} + {printed8[1]['gradients']} + "
            f"{printed8[1]['optimizer_states']})."),
        Erratum(
            "t8-one-decimal", "zero", f"paper, {tables['zero']}", "rounding",
            f"{printed8[0]['gradients']} and {printed8[0]['optimizer_states']}",
            f"{gib(t8['gradients'][0])} and {gib(t8['optimizer_states'][0])}",
            "The unsharded gradients and optimizer states are printed to one decimal, every other cell "
            "to two; this is what moves the two totals above."),
        Erratum(
            "s4-prose-swap", "zero", "paper, §4 prose", "label",
            f"{printed8[0]['gradients']} called optimizer states (× {swap['B_g']}); "
            f"{printed8[0]['optimizer_states']} called gradients (× {swap['B_o']})",
            f"gradients {gib(swap['gradients'])} (× {swap['B_g']}); "
            f"optimizer states {gib(swap['optimizer_states'])} (× {swap['B_o']})",
            f"The prose swaps the two labels; {tables['dtypes']} ({swap['B_g']}-byte fp32 gradients, "
            f"{swap['B_o']}-byte optimizer states) and {tables['zero']} agree with memlib."),
        Erratum(
            "s4-edp-rule", "zero", "paper, §4", "convention", fmt_count(PAPER["zero_sharded_params"]),
            f"{fmt_count(shard['paper']['shard'])} (paper's rule); {fmt_count(shard['megatron']['shard'])} "
            f"(Megatron-Core's rule)",
            f"The paper shards the router's and the shared expert's states over EDP = {shard['paper']['e_div']} "
            f"with the routed experts; they are replicated on every rank of a stage, and Megatron-Core shards "
            f"them over DP CP = {shard['paper']['ne_div']}, which leaves {fmt_count(shard['difference']['shard'])} "
            f"fewer parameters' states per device."),
        Erratum(
            "s3-wqr-replicated", "static", "paper, §3.2", "convention", fmt_count(PAPER["mla_replicated"]),
            f"{fmt_count(t6['mla_replicated'])} (paper's convention); "
            f"{fmt_count(t6['mla_replicated'] - deltas['wqr'])} with W^QR split",
            f"The paper keeps W^QR replicated under TP; Megatron-Core fuses it with W^UQ into one "
            f"column-parallel projection, which stores {fmt_count(deltas['wqr'])} fewer parameters per device."),
        Erratum(
            "s3-shared-replicated", "static", "paper, §3.3", "convention", fmt_count(PAPER["table6"]["MoE"]["params"]),
            f"{fmt_count(t6['moe'])} (paper's convention); {fmt_count(t6['moe'] - deltas['shared'])} with the "
            f"shared expert split",
            f"The paper replicates the shared expert on every TP rank; Megatron-Core splits it like a dense "
            f"FFN, which stores {fmt_count(deltas['shared'])} fewer parameters per device."),
        Erratum(
            "ref-stage15-final-norm", "static", "reference reconstruction (not the paper)", "omission",
            fmt_count(RECONSTRUCTION["stage15_params"]), fmt_count(deltas["last_paper"]),
            f"The reconstruction of the last stage leaves out the final RMSNorm "
            f"({fmt_count(deltas['final_norm'])} parameters, replicated), which sits on the last stage "
            f"with the output head."),
    ]
    return _parameter_items(m, train) + items + _activation_items(m, train)


def _billions(n: int) -> str:
    return f"{fmt_billions(n)} ({fmt_count(n)})"


def _printed_gap(printed: str, n: int) -> str:
    """How far a printed count in billions lies above ``n``, in billions."""
    return fmt_billions(int(Fraction(printed) * 10**9) - n, 2)


def _parameter_items(m: ModelConfig, train: TrainingConfig = PAPER_TRAINING) -> list[Erratum]:
    vals = values(m)
    layers = per_layer_totals(m)
    moe_layer = layer_params(m, "moe").evaluate_total(vals)
    part = Partition(m, train)
    stage0 = part.params_unsharded(part.stages[0]).evaluate_total(part.values)
    t3 = PAPER["table3"]
    t4 = PAPER["table4"]
    mla_matrices = sum(x for k, x in layer_params(m, "moe").evaluate(vals).items()
                       if k.startswith("attention.W_"))
    replicated = sum(x for k, x in layer_params(m, "moe").evaluate(vals).items()
                     if k in ("attention.W_DQ", "attention.W_DKV", "attention.W_QR", "attention.W_KR"))
    share = fmt_decimal(Fraction(100 * replicated, mla_matrices), 1) + "%"
    t6 = static.table6_values(m, train)
    device_share = fmt_decimal(Fraction(100 * t6["mla_replicated"], t6["mla_replicated"] + t6["mla_split"]), 1) + "%"
    lite = load_model("deepseek-v2-lite")
    v2 = load_model("deepseek-v2")
    lite_act = activated_params(lite).evaluate_total(values(lite))
    v2_act = activated_params(v2).evaluate_total(values(v2))
    off = DEEPSEEK_OFFICIAL["deepseek-v3"]
    total = model_params(m).evaluate_total(vals)
    act = activated_params(m).evaluate_total(vals)
    act_ne = activated_params(m, embedding=False).evaluate_total(vals)
    mtp = mtp_params(m).evaluate_total(vals)
    mtp_block = layer_params(m, "moe").evaluate_total(vals)
    return [
        Erratum(
            "t3-moe-layer-gb", "parameters", "paper, layer table", "unit", t3["3-59"]["memory_gb"],
            f"{fmt_bytes(2 * moe_layer, 'GiB')} ({fmt_count(2 * moe_layer)} bytes)",
            f"One MoE layer holds {fmt_count(moe_layer)} parameters, {fmt_bytes(2 * moe_layer, 'GiB', 3)} in bf16; "
            f"the printed value is rounded up."),
        Erratum(
            "t4-stage0-params", "parameters", "paper, stage table", "rounding", t4["0"]["params"], _billions(stage0),
            f"The printed count is the sum of the rounded per-layer counts ({t3['0']['params']} + two of "
            f"{t3['1-2']['params']} + {t3['3-59']['params']}); the exact layers are "
            f"{', '.join(fmt_count(x) for x in layers[:4])} (the first with the embedding added in the table)."),
        Erratum(
            "dd-replicated-share", "parameters", "the paper's transcription (DD)", "reading",
            SECONDARY["dd_replicated_share"],
            f"{device_share} of one TP{train.tp} device's MLA parameters ({fmt_count(t6['mla_replicated'])} of "
            f"{fmt_count(t6['mla_replicated'] + t6['mla_split'])}); {share} of the unsplit matrices "
            f"({fmt_count(replicated)} of {fmt_count(mla_matrices)})",
            "The figure is the share on one device: tensor parallelism halves the split matrices but not the "
            "replicated ones (the down-projections and W^QR), so these weigh more there than in the model."),
        Erratum(
            "ref-v2lite-activated", "parameters", "the project's reference notes", "transcription",
            SECONDARY["summary_v2lite_activated"], _billions(lite_act),
            f"The figure quoted for DeepSeek-V2-Lite is DeepSeek-V2's ({_billions(v2_act)}); V2-Lite's own count is "
            f"the one shown, and DeepSeek states {DEEPSEEK_OFFICIAL['deepseek-v2-lite']['activated']}B."),
        Erratum(
            "ds-activated", "parameters", "DeepSeek-V3 model card and weights documentation", "statement",
            f"{off['activated']}B and {off['activated_weights_doc']}B",
            f"{_billions(act)} with the embedding; {_billions(act_ne)} without it",
            f"With the embedding matrix counted whole (a token reads one row of it) the count is "
            f"{fmt_billions(act, 1)}, which the model card's {off['activated']}B truncates; without it, "
            f"{fmt_billions(act_ne, 1)}, not {off['activated_weights_doc']}B: the weights documentation counts "
            f"{_printed_gap(off['activated_weights_doc'], act_ne)} more than either reading of memlib's count, which "
            f"memlib cannot attribute to a tensor."),
        Erratum(
            "ds-mtp", "parameters", "DeepSeek-V3 weights documentation", "statement", f"{off['mtp']}B",
            f"{_billions(mtp)}; its decoder block alone {_billions(mtp_block)}",
            f"The stated figure is the MTP module's decoder block ({fmt_billions(mtp_block, 1)}); the whole "
            f"module, with its own projection and three RMSNorms, is {fmt_billions(mtp, 1)}."),
        Erratum(
            "ds-checkpoint", "parameters", "DeepSeek-V3 model card", "statement", f"{off['checkpoint']}B",
            _billions(total + mtp + 2 * m.vocab_size * m.hidden_size),
            "The checkpoint stores the main model, the MTP module and the MTP layer's own copies of the "
            "embedding and head; the sum is shown (FP8 scale tensors and buffers not counted)."),
    ]


def _activation_items(m: ModelConfig, train: TrainingConfig) -> list[Erratum]:
    from ..activations import ledger_bytes, parse_policy, training_values
    from ..ledgers import megatron_layer, paper_layer
    from ..partition import parallel_values

    b_, s_, n_r = train.micro_batch, train.seq_len, m.num_experts_per_tok
    paper_tokens = -(-b_ * s_ * n_r // train.ep)
    vals = {**values(m), **parallel_values(train), **training_values(train)}
    rec = recipe(train.precision)
    moe_layers = static.stage_names(m, train)["moe_layers"]
    full = parse_policy("full")

    def stage_bytes(layer, policy=None, t=train):
        return moe_layers * ledger_bytes(layer(m, "moe"), t, rec, policy).evaluate_total(vals)

    one = TrainingConfig(sp=False)
    unsplit = {**vals, **{k: 1 for k in parallel_values(one)}}
    latents = ("attention.c_q", "attention.c_kv")
    paper_lat = sum(ledger_bytes([e for e in paper_layer(m, "moe") if e.key in latents], one, rec)
                    .evaluate(unsplit).values())
    meg_keys = {f"{k}{x}" for k in latents for x in ("", "_normed")}
    meg_lat = sum(ledger_bytes([e for e in megatron_layer(m, "moe") if e.key in meg_keys], one, rec)
                  .evaluate(unsplit).values())
    held_tokens = b_ * s_ * n_r * train.etp // (train.tp if train.sp else 1)
    return [
        Erratum(
            "s5-routed-tokens", "activations", "paper, §5.2", "accounting",
            f"(N/EP) E_token = b s N_r / EP = {fmt_count(paper_tokens)} routed token copies per device",
            f"b s N_r ETP / TP = {fmt_count(held_tokens)} per device (balanced routing)",
            "The paper's E_token counts the tokens of one micro-batch; expert parallelism is carved out of "
            "data parallelism, so the all-to-all brings each device the tokens its experts receive from "
            "every rank of the EP group, as many as it sends. EP does not divide the routed activations; "
            "the paper profile keeps the paper's count, the megatron profile the stored one."),
        Erratum(
            "dd-full-moe", "activations", "the paper's transcription (DD)", "transcription",
            SECONDARY["dd_full_moe"], f"b s h + 2 b s N_r with SP = TP = {train.tp}",
            "The transcription's notes give the MoE block's full-recomputation term without sequence "
            "parallelism; the paper's configuration halves the layer input."),
        Erratum(
            "s5-full-checkpoints", "activations", "paper, §5 and Table 10, AC = Full", "convention",
            f"8 b s h + 8 b s N_r = {fmt_count(stage_bytes(paper_layer, full))} bytes for {moe_layers} layers",
            f"{fmt_count(stage_bytes(megatron_layer, full))} bytes in Megatron-Core (megatron profile)",
            "The paper keeps each block's input, the attention's and the MoE's, and the routing map; "
            "Megatron-Core's full recomputation checkpoints one tensor per layer, the layer's input, and "
            "recomputes the rest from it, routing included."),
        Erratum(
            "s5-latent-norms", "activations", "paper, §5.1", "convention",
            f"2 b s (d_c' + d_c) = {fmt_count(paper_lat)} bytes per layer, without parallelism",
            f"{fmt_count(meg_lat)} bytes in Megatron-Core (megatron profile)",
            "The paper counts each latent, c^Q and c^KV, once; the latent RMSNorm keeps its input for its own "
            "backward and the up-projection keeps the norm's output for its weight gradient, so an "
            "implementation holds each latent twice (plus one fp32 statistic per token)."),
        Erratum(
            "s5-value-dim", "activations", "paper, §5.1", "convention", "2 b s d_h n_h (values, attention output)",
            "2 b s d_v n_h", "The paper writes d_h for the value head dimension; DeepSeek's configs keep it "
            "apart (v_head_dim). Both are the same in DeepSeek-V3, so no number changes."),
    ]


def errata_counts(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = PAPER_TRAINING) -> dict[str, str]:
    """How many items there are, in all and of each kind (formatted for glue), and ``summary``: a
    sentence that names every kind present with its count (they add up to ``all``)."""
    items = errata(model, train)
    out = {"all": fmt_count(len(items))}
    counts = {k: sum(1 for e in items if e.kind == k) for k in KINDS}
    for k, n in counts.items():
        out[k] = fmt_count(n)
    parts = [f"{fmt_count(n)} {'is' if n == 1 else 'are'} {_KIND_PHRASE[k][n != 1]}" for k, n in counts.items() if n]
    out["summary"] = (", ".join(parts[:-1]) + " and " + parts[-1]) if len(parts) > 1 else "".join(parts)
    return out


#: each kind in a sentence, singular and plural
_KIND_PHRASE = {
    "unit": ("a unit or rounding slip", "unit or rounding slips"),
    "rounding": ("a sum of rounded terms", "sums of rounded terms"),
    "label": ("a mislabelled term", "mislabelled terms"),
    "convention": ("a modelling convention rather than an error", "modelling conventions rather than errors"),
    "omission": ("a term left out", "terms left out"),
    "accounting": ("a term counted differently from what an implementation stores",
                   "terms counted differently from what an implementation stores"),
    "statement": ("a rounded public statement", "rounded public statements"),
    "transcription": ("an error of a secondary source", "errors of a secondary source"),
    "reading": ("a figure that is right once read as its source means it",
                "figures that are right once read as their source means them"),
}


def kinds_table() -> str:
    """The kinds of discrepancy, as a Markdown table."""
    return md_table(["kind", "meaning"], [[k, v] for k, v in KINDS.items()], "ll")


def errata_table(chapter: str | None = None, model: ModelConfig | str = "deepseek-v3",
                 train: TrainingConfig = PAPER_TRAINING) -> str:
    """The items (of one chapter, or all) as a Markdown table; printed "GB" values are GiB."""
    rows = [[e.id, e.source, KINDS[e.kind], e.printed, e.computed, e.reason]
            for e in errata(model, train) if chapter is None or e.chapter == chapter]
    return md_table(["id", "where", "kind", "printed (\"GB\" = GiB)", "memlib (exact)", "why"], rows, "llllll")
