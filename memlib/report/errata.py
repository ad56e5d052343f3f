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

from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model
from ..reference import PAPER
from ..units import fmt_bytes, fmt_count
from . import static, zero
from .core import md_table

__all__ = ["Erratum", "RECONSTRUCTION", "errata", "errata_table", "KINDS"]

#: values the reference reconstruction (shared/reference/paper.md) derived itself, not printed by
#: the paper; kept so the book can show where memlib differs from them
RECONSTRUCTION = {
    "stage15_params": 2_025_930_752,   # "Stage 15: 2,025,930,752 params (3.77 GiB)", §3.4 [inferred]
}

#: what kind of discrepancy an item is
KINDS = {
    "unit": "unit or rounding slip",
    "rounding": "sum of rounded terms",
    "label": "mislabelled term",
    "convention": "a modelling convention, not an error",
    "omission": "a term left out",
}


@dataclass(frozen=True)
class Erratum:
    """One discrepancy: where, what is printed, what memlib computes, why."""

    id: str          #: stable identifier, e.g. ``"t8-none-total"``
    chapter: str     #: ``"static"`` or ``"zero"``: the chapter that discusses it
    source: str      #: where the printed value is (``"paper, Table 6"``, ``"reference reconstruction"``)
    kind: str        #: a key of :data:`KINDS`
    printed: str     #: the value as printed (the paper's "GB" are GiB)
    computed: str    #: memlib's exact value, formatted
    reason: str      #: one or two sentences


def errata(model: ModelConfig | str = "deepseek-v3", train: TrainingConfig = PAPER_TRAINING) -> list[Erratum]:
    """All items, computed for ``model`` under ``train`` (the paper's configuration by default)."""
    m = load_model(model)
    t6 = static.table6_values(m, train)
    printed6 = {r["module"]: r for r in PAPER["table6"]}
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
            "s3-shared-replicated", "static", "paper, §3.3", "convention", fmt_count(PAPER["table6"][3]["params"]),
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
    return items


def errata_table(chapter: str | None = None, model: ModelConfig | str = "deepseek-v3",
                 train: TrainingConfig = PAPER_TRAINING) -> str:
    """The items (of one chapter, or all) as a Markdown table; printed "GB" values are GiB."""
    rows = [[f"`{e.id}`", e.source, KINDS[e.kind], e.printed, e.computed, e.reason]
            for e in errata(model, train) if chapter is None or e.chapter == chapter]
    return md_table(["id", "where", "kind", "printed (\"GB\" = GiB)", "memlib (exact)", "why"], rows, "llllll")
