r"""Tables every chapter uses: the notation recap of a chapter and its errata.

>>> print(notation_recap(["h", "DP"]))
| symbol | meaning | unit |
| :-- | :-- | :-- |
| $h$ | hidden dimension | elements |
| $\mathrm{DP}$ | data-parallel size | ranks |
"""
from __future__ import annotations

import string
from typing import Sequence


from ..paper.errata import KINDS, Erratum, Q
from ..core.symbols import REGISTRY, SYMBOLS
from .format import fmt_billions, fmt_bytes, fmt_count, join_and, md_table, pct, signed_pct

__all__ = ["attention_switch_values", "notation_recap", "notation_table", "render", "errata_rows", "errata_table", "kinds_table",
           "errata_summary", "band_text", "collapse_runs"]


def _value(n, model, train) -> str:
    if n.kind == "model" and model is not None:
        x = getattr(model, n.field)
        return "— (null)" if x is None else fmt_count(x)
    if n.kind in ("parallel", "training") and train is not None:
        x = train.edp if n.key == "EDP" else getattr(train, n.field)
        return "— (schedule default)" if x is None else fmt_count(x)
    if n.kind == "precision" and train is not None:
        rec = train.recipe
        return fmt_count({"B_w": rec.weights, "B_g": rec.gradients, "B_o": rec.optimizer_bytes}[n.key])
    return "— (one per stage)"


def _not_own(model) -> set[str]:
    """The registry symbols of the blocks ``model`` lacks, and those of the configuration fields it leaves null
    (Qwen2-MoE's shared-expert width, a classic GPT's learned positions in a DeepSeek book; none without a
    model): a notation table lists only the symbols the model's own blocks and fields give a value."""
    if model is None:
        return set()
    from ..model.blocks import SYMBOLS as OWN, lacking

    from ..config import reads_field

    unset = {n.key for n in REGISTRY if n.kind == "model" and n.field and getattr(model, n.field, None) is None}
    # a field the model's family does not have (Mixtral's n_group, a dense Llama's first_k_dense_replace) holds a
    # constant, not a dimension of the model
    foreign = {n.key for n in REGISTRY if n.kind == "model" and n.field and not reads_field(model, n.field)}
    return {k for b in lacking(model) for k in OWN.get(b, ())} | unset | foreign


def notation_recap(keys: Sequence[str], model=None, train=None) -> str:
    """A chapter's notation: the registry entries ``keys`` with meaning and unit and, when ``model``
    or ``train`` is given, their values in the chapter's configuration."""
    with_values = model is not None or train is not None
    gone = _not_own(model)
    keys = [k for k in keys if k not in gone]
    rows = []
    for k in keys:
        n = SYMBOLS[k]
        row = [f"${n.latex}$", n.meaning, n.unit]
        if with_values:
            row.append(_value(n, model, train))
        rows.append(row)
    return md_table(["symbol", "meaning", "unit"] + (["value here"] if with_values else []), rows,
                    "lll" + ("r" if with_values else ""))


def notation_table(kinds=("model", "parallel", "training", "stage", "precision"), model=None) -> str:
    """The whole registry (the notation chapter), with a model's values where given."""
    from ..config import config_field

    rows = []
    gone = _not_own(model)
    for n in REGISTRY:
        if n.kind not in kinds or n.key in gone:
            continue
        field = n.field and (n.field if model is None or n.kind != "model" else config_field(model, n.field))
        row = [f"${n.latex}$", n.meaning, n.unit, f"`{field}`" if field else "derived"]
        if model is not None:
            row.append(_value(n, model, None) if n.kind == "model" else "—")
        rows.append(row)
    return md_table(["symbol", "meaning", "unit", "config field"] + (["value"] if model is not None else []),
                    rows, "llll" + ("r" if model is not None else ""))


def _show(q: Q) -> str:
    if q.unit == "text":
        return str(q.value)
    if q.unit == "count":
        return fmt_count(q.value)
    if q.unit == "bytes":
        return f"{fmt_bytes(q.value, 'GiB', q.digits)} ({fmt_count(q.value)} bytes)"
    if q.unit in ("GiB", "MiB", "GB"):
        return fmt_bytes(q.value, q.unit, q.digits)
    if q.unit == "billions":
        return fmt_billions(q.value, q.digits)
    if q.unit == "percent":
        return pct(q.value, 1, q.digits)
    raise ValueError(f"unknown unit {q.unit!r}")


def render(template: str, values: dict[str, Q]) -> str:
    """A template with ``{name}`` fields filled from ``values``, each formatted by its unit."""
    names = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    return template.format(**{k: _show(values[k]) for k in names})


def errata_rows(items: list[Erratum], chapter: str | None = None) -> list[list[str]]:
    """One row per item; its kind by the key :func:`kinds_table` defines, not the meaning repeated on every row."""
    return [[e.id, e.source, e.kind, e.printed, render(e.computed, e.values), render(e.reason, e.values)]
            for e in items if chapter is None or e.chapter == chapter]


def errata_table(items: list[Erratum], chapter: str | None = None) -> str:
    """The items (of one chapter, or all); the paper's printed "GB" are GiB, which the chapter says once."""
    return md_table(["id", "where", "kind", "printed", "memlib (exact)", "why"],
                    errata_rows(items, chapter), "llllll")


def kinds_table() -> str:
    return md_table(["kind", "meaning"], [[k, one] for k, (one, _) in KINDS.items()], "ll")


def errata_summary(counts: dict[str, int]) -> str:
    """``'3 are unit or rounding slips, 4 are sums of rounded terms and 1 is a mislabelled term'``."""
    parts = [f"{fmt_count(n)} {'is' if n == 1 else 'are'} {KINDS[k][n != 1]}" for k, n in counts.items() if n]
    return join_and(parts)


def attention_switch_values(sw: dict, model=None) -> dict[str, str]:
    """Chapters 8 and 9 count the attention differently (:func:`memlib.scenarios.deepseek.attention_switch`):
    the two profiles, the attention core's bytes under each, and what the ``deepseek`` policy does under each,
    in words the library decided; with ``model``, ``paper_deepseek_sentence`` says it in one sentence whose
    "That is why" stands only where the kept scores make the policy not fit."""
    def fit(x: bool | None) -> str:
        return "—" if x is None else "fits" if x else "does not fit"

    def size(x: int | None, unit: str = "GiB") -> str:
        return "—" if x is None else fmt_bytes(x, unit)

    return {"paper_profile": sw["paper_profile"], "recipe_profile": sw["recipe_profile"] or "megatron",
            "paper_core": fmt_bytes(sw["paper_core"]), "recipe_core": size(sw["recipe_core"], "MiB"),
            "paper_deepseek": fmt_bytes(sw["paper_deepseek_total"]), "paper_deepseek_fits": fit(sw["paper_deepseek_fits"]),
            "recipe_total": size(sw["recipe_total"]), "recipe_fits": fit(sw["recipe_fits"]),
            **({} if model is None else {"paper_deepseek_sentence": _switch_sentence(sw, model)})}


def _switch_sentence(sw: dict, model) -> str:
    """What the ``deepseek`` policy does under the eager profile: it recomputes none of the attention core's
    tensors (:data:`memlib.ledgers.base.POLICIES`: the norms and MLA's up-projections), so why it does not fit, or
    that it fits all the same."""
    peak = fmt_bytes(sw["paper_deepseek_total"])
    if sw["paper_deepseek_fits"]:
        return (f"The deepseek recomputation policy recomputes none of them; it peaks at {peak} with ZeRO-1 and fits "
                f"all the same.")
    return (f"The deepseek recomputation policy recomputes none of them: that is why it peaks at {peak} with ZeRO-1 "
            f"and does not fit.")


#: what a band of few runs (:attr:`~memlib.scenarios.uncertainty.Band.thin`) is said to be, wherever it is quoted
THIN_BAND_WORDS = "too few for the band's ends to be firm"


def band_text(band) -> str:
    """A measured band in words: how far memlib's peaks were from the measured ones, on which runs, and, where they
    are few (:attr:`~memlib.scenarios.uncertainty.Band.thin`), that the band is no firm bound."""
    if band.n == 0:
        return (f"never held against a measured run of a {band.family} model, so the verdict below is the "
                f"prediction's alone")
    if len(band.sources) == 1:
        where = f"{'both' if band.n == 2 else 'all'} {band.sources[0][0]}"
    else:
        where = join_and(f"{fmt_count(n)} {name}" for name, n in band.sources)
    text = (f"off the measured peaks by {signed_pct(band.low, 2)} to {signed_pct(band.high, 2)} on "
            f"{'only ' if band.thin else ''}{fmt_count(band.n)} training steps of {band.family} models ({where})")
    return text + (f", {THIN_BAND_WORDS}" if band.thin else "")


def collapse_runs(rows: list[list[str]], first_same: int) -> list[list[str]]:
    """Table rows with consecutive rows that agree from column ``first_same`` on collapsed into one: its first
    column the span ("1–14"), each column before ``first_same`` its values in order of first appearance, the first
    and the last of them ("1 + 14 … 7 + 8") where they differ.  A table of sixteen ranks of which fourteen hold
    the same bytes reads as three rows."""
    out: list[list[str]] = []
    run: list[list[str]] = []

    def flush() -> None:
        if not run:
            return
        if len(run) == 1:
            out.append(run[0])
        else:
            head = [f"{run[0][0]}–{run[-1][0]}"]
            for k in range(1, first_same):
                seen = list(dict.fromkeys(r[k] for r in run))
                head.append(seen[0] if len(seen) == 1 else f"{seen[0]} … {seen[-1]}")
            out.append([*head, *run[0][first_same:]])
        run.clear()

    for r in rows:
        if run and r[first_same:] != run[0][first_same:]:
            flush()
        run.append(r)
    flush()
    return out
