"""The summary page, a cheat sheet: every numbered equation typeset with its value for the book's model, the
fit matrix of ZeRO stages and recompute policies, what each of DeepSeek-V3's memory techniques saves on the
peak device, and the library's side of the glossary (the profiles', recipes' and recompute policies'
definitions), formatted from :mod:`memlib.formulas`, :mod:`memlib.scenarios` and the registries.

Nothing here computes a quantity.
"""
from __future__ import annotations


from ..config import ConfigError, TrainingConfig, load_model
from ..core.units import GiB
from ..config.strategies import FP8_RECIPES, ZeroStage
from ..formulas import book_formulas, equation, value, value_unit
from ..ledgers.base import POLICIES
from ..model.blocks import model_blocks, own_modules
from ..model.profiles import PROFILES
from ..config.precision import RECIPES
from ..scenarios import deepseek as ds
from .book import equation_numbers
from .glue import equation_key
from .format import VERDICT_CELLS, display_math, fmt_bytes, fmt_count, fmt_difference, md_table, model_name, typeset

__all__ = ["equation_setting", "equations", "glossary_values", "knob_table", "knob_values"]


def _value_text(name: str, model, train: TrainingConfig | None) -> str | None:
    """The value of formula ``name`` as the page prints it (bytes also in binary units), or ``None`` where it
    has none."""
    try:
        v = value(name, model, train)
    except (ConfigError, ValueError, ZeroDivisionError):
        return None
    if value_unit(name) == "bytes":
        return f"{fmt_count(v)} bytes, {fmt_bytes(v, 'GiB' if v >= GiB else 'MiB')}"
    return fmt_count(v)


def equations(model, train: TrainingConfig | None = None) -> str:
    """Every numbered equation in the book's order, each typeset as the book displays it (unnumbered here)
    under a line with its number, what it counts, its name for ``memlib formula`` and its value in ``train``
    (default: the paper's configuration; a stage's symbols are those of the stage the paper analyses), described in
    the words of the model's blocks (:meth:`memlib.formulas.Formula.description_for`).  An equation of a block the
    model lacks (:attr:`memlib.formulas.Formula.needs`: MLA's, the query latent's without query compression, a
    dense FFN's for a model without dense layers) or of another attention is left out, as its chapter leaves it
    out, and so is one that counts nothing for the model (the attention parameters TP replicates, under
    grouped-query attention)."""
    m = load_model(model)
    own = model_blocks(m)
    numbers = equation_numbers(model if isinstance(model, str) else m.name)
    out = []
    for f in book_formulas():
        if f.attention not in (None, m.attention) or not f.needs <= own:
            continue
        number = numbers.get(equation_key(f.name)) if numbers else f.number
        if number is None:                         # its chapter leaves it out of this model's book
            continue
        try:
            tex = equation(f.name, m, train)
        except ConfigError:
            continue
        v = _value_text(f.name, m, train) if value_unit(f.name) != "latex" else None
        if v == "0":                               # a count of a block the model lacks (GQA replicates nothing)
            continue
        out.append(f"**({number})** {typeset(f.description_for(m))} (`{f.name}`)" + (f": **{v}**" if v else "")
                   + "\n\n" + display_math(tex))
    return "\n\n".join(out)


def equation_setting(model, train: TrainingConfig | None = None) -> dict[str, str]:
    """The configuration :func:`equations` evaluates in: its label, its data-parallel size, micro-batch size and
    sequence length, and the stage the paper analyses."""
    from ..formulas import default_training
    from ..paper import analysed_stage
    from ..device.estimate import Estimate

    m = load_model(model)
    t = train if train is not None else default_training(m)
    return {"label": t.label(), "dp": fmt_count(t.dp), "b": fmt_count(t.micro_batch), "s": fmt_count(t.seq_len),
            "stage": str(analysed_stage(Estimate(m, t).partition))}


def glossary_values(model="deepseek-v3") -> dict[str, str]:
    """The glossary's definitions that the library holds, in the words of ``model``'s blocks: each profile's
    convention (:meth:`memlib.model.profiles.Profile.description_for`), each recompute policy's modules (those of the
    model's blocks, :func:`memlib.model.blocks.own_modules`), the FP8 recipes' descriptions, Megatron's FP8 scaling
    recipes and the ZeRO stages' names (``gl_*`` keys for ``glue_values``-style glue)."""
    m = load_model(model)
    out = {f"profile_{k.replace('-', '_')}": typeset(p.description_for(m)) for k, p in PROFILES.items()}
    for k, p in POLICIES.items():
        modules = own_modules(sorted(p.modules), m)
        out[f"policy_{k}"] = ("every layer's input kept, the whole layer run again" if p.full
                              else "nothing" if not modules else ", ".join(f"`{x}`" for x in modules))
    for k in ("deepseek-v3", "megatron-fp8-param"):
        out[f"recipe_{k.replace('-', '_')}"] = RECIPES[k].description
    out["fp8_recipes"] = ", ".join(f"`{x}`" for x in FP8_RECIPES)
    out["zero_stages"] = "; ".join(f"ZeRO-{z.value}: {z.label}" for z in ZeroStage)
    return out


def knob_table(rows: list[dict]) -> str:
    """The ablation of :func:`memlib.scenarios.deepseek.ablation`: per technique, what it does, the peak
    device's total once it is on, what it changed, and whether the peak fits the capacity."""
    before = [None] + [r["total"] for r in rows[:-1]]
    out = [[r["label"], r["what"], fmt_bytes(r["total"]), "—" if b is None else fmt_difference(r["total"], b, signed=True),
            VERDICT_CELLS[r["verdict"]]] for r, b in zip(rows, before)]
    return md_table(["technique", "what it does", "peak device", "change", f"fits the {ds.GPU}"], out, "llrrc")


def knob_values(model) -> dict[str, str]:
    """The knob table of ``model`` under DeepSeek-V3's recipe (:func:`memlib.scenarios.deepseek.deepseek_recipe`)
    and the model's name; where the recipe does not apply to the model, a sentence saying so instead."""
    try:
        table = knob_table(ds.ablation(model, ds.deepseek_recipe(model)))
    except ConfigError as exc:
        table = f"DeepSeek-V3's recipe does not apply to {model_name(model)}: {exc}"
    return {"model": model_name(model), "table": table}
