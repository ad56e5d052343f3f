"""Chapter 1, "Introduction": units, display rounding and the library's packages, formatted from
:mod:`memlib.paper.parameters`.

Every function takes the chapter's :class:`~memlib.device.estimate.Estimate` (built once in the chapter's
configuration cell); nothing here computes a quantity.
"""
from __future__ import annotations

import ast
import re
import importlib.util
import pkgutil
from pathlib import Path

from ..config import PAPER_TRAINING, ConfigError, load_model
from ..device.estimate import Estimate
from ..paper import is_paper_model
from ..paper import parameters as pp
from ..data.reference import PAPER
from ..scenarios import deepseek as ds
from ..device.overhead import DEVICE_MEMORY, DEVICE_MEMORY_SOURCES, DEVICE_PRODUCT_GB, allocatable
from ..config.precision import RECIPES
from ..core.units import to_unit
from .format import (fmt_billions, fmt_bytes, fmt_capacity, fmt_count, fmt_decimal, join_and, layer_word, md_table,
                     model_name, parallel_kinds, pct, signed_pct, span)
from .notation import chapter_notation

__all__ = ["PAPER_KEYS", "notation", "subject", "values", "paper_values", "library_table", "stages_text",
           "answer_values", "capacity_table"]

def notation(est: Estimate) -> str:
    """The symbols this chapter introduces, and one line for those of earlier chapters."""
    return chapter_notation("ch01", est.model, est.train)


def stages_text(stages: list[int]) -> str:
    """Stages as ranges: ``1–14``, ``2–13, 15``."""
    return ", ".join(span(a, b) for a, b in pp.index_runs(stages))


def subject(m) -> str:
    """What the book's question asks about, in the words of the model's kind: 'a DeepSeek-style mixture-of-experts
    model', 'a dense transformer such as Llama-3-8B' (the landing page and the introduction)."""
    return ("a DeepSeek-style mixture-of-experts model" if m.has_moe and m.attention == "mla"
            else f"a mixture-of-experts transformer such as {model_name(m)}" if m.has_moe
            else f"a dense transformer such as {model_name(m)}")


def values(est: Estimate) -> dict[str, str]:
    """The chapter's numbers: units, the largest per-device weights of the model under the
    configuration, the whole model's weights, one of its typical layers (an MoE layer where it has them) at two
    roundings, and the words that name its blocks."""
    m, t, part = est.model, est.train, est.partition
    kind, word = layer_word(m)
    u = pp.gib_and_gb()
    dev = pp.largest_device(part)
    misread = pp.misread_gib(dev["bytes"])
    model_bytes = pp.weights(pp.totals(m)["total"], t.precision)
    moe_bytes = pp.weights(pp.layer_blocks(m)[f"{kind}_layer"], t.precision)
    return {
        "model": model_name(m), "config": t.label(), "paper_config": PAPER_TRAINING.label(),
        "gib_bytes": fmt_count(u["GiB"]), "gb_bytes": fmt_count(u["GB"]),
        "gib_in_gb": fmt_decimal(u["gib_in_gb"], 4) + " GB", "gib_excess": pct(u["excess"], 1, 2),
        "bf16_bytes": fmt_count(RECIPES[t.precision].weights),
        "device_stages": stages_text(dev["stages"]),
        "device_stage_word": "stage" if len(dev["stages"]) == 1 else "stages",
        "device_params": fmt_count(dev["params"]),
        "device_bytes": fmt_count(dev["bytes"]), "device_gib": fmt_bytes(dev["bytes"], "GiB"),
        "device_gb": fmt_bytes(dev["bytes"], "GB"), "device_printed": fmt_decimal(misread["printed"], 2) + " GB",
        "misread_budget": fmt_count(misread["budget"]), "misread_shortfall": fmt_count(misread["shortfall"]),
        "misread_share": "—" if misread["shortfall_share"] is None else pct(misread["shortfall_share"], 1, 2),
        "misread_rounding": ("less what rounding up to the printed digits added" if misread["rounded_up"]
                             else "the rest from rounding down to the printed digits"),
        "model_gib": fmt_bytes(model_bytes, "GiB"), "model_gb": fmt_bytes(model_bytes, "GB"),
        "moe_layer_params": fmt_count(pp.layer_blocks(m)[f"{kind}_layer"]), "layer_word": word,
        "subject": subject(m),
        "fitted_to": join_and(["layers", "heads"] + (["experts"] if m.has_moe else [])),
        "parallel_kinds": parallel_kinds(m),
        "recipe_chapter": ("checks DeepSeek-V3's own recipe rank by rank and what each of its memory techniques saves" if is_paper_model(m)
                           else f"applies DeepSeek-V3's own recipe, without tensor parallelism, to {model_name(m)}"),
        "other_architectures": ("models without MLA or DeepSeek's MoE" if m.attention == "mla" and m.has_moe
                                else "every shipped model side by side, whatever its architecture"),
        "moe_layer_gib3": fmt_bytes(moe_bytes, "GiB", 3), "moe_layer_gib2": fmt_bytes(moe_bytes, "GiB", 2),
        "moe_layer_gb": fmt_bytes(moe_bytes, "GB", 2),
        "stage0_exact": fmt_billions(pp.stage_summary(part)["first"]),
    }


#: the keys of :func:`paper_values` (glued as placeholders for another model)
PAPER_KEYS = ("paper_device", "paper_device_params", "paper_device_reading", "paper_moe_layer", "paper_moe_last_digit",
              "paper_stage0", "paper_stage0_relation")


def paper_values(est: Estimate) -> dict[str, str]:
    """The paper's printed values the prose compares with (empty unless the model is the paper's)."""
    if not is_paper_model(est.model):
        return {}
    m, t, part = est.model, est.train, est.partition
    dev = pp.largest_device(part)
    t6 = PAPER["table6"]["total"]
    moe_row = PAPER["table3"]["3-59"]
    moe_gib = pp.weights(pp.layer_blocks(m)["moe_layer"], t.precision)
    offset = pp.printed_offset(to_unit(moe_gib), moe_row["memory_gb"])
    return {
        "paper_device": t6["memory_gb"] + " GB", "paper_device_params": fmt_count(t6["params"]),
        "paper_device_reading": "the digits of GiB" if pp.rounds_to(to_unit(dev["bytes"]), t6["memory_gb"])
        else "not the digits of GiB",
        "paper_moe_layer": moe_row["memory_gb"] + " GB",
        "paper_moe_last_digit": "the same" if offset == 0 else ("rounded up" if offset > 0 else "rounded down"),
        "paper_stage0": PAPER["table4"]["0"]["params"],
        "paper_stage0_relation": ("the sum" if pp.rounds_to(pp.printed_stage_sum(pp.paper_layers_of_stage(0))["sum"],
                                                           PAPER["table4"]["0"]["params"]) else "not the sum")
        + " of its own rounded per-layer values",
    }


def _docstring_summary(module: str) -> str:
    """The first paragraph of a module's (or package's) docstring, read from its source (nothing is imported),
    with reST markup turned into Markdown: ``x`` into `x`, :class:`~a.b.C` into `C`."""
    spec = importlib.util.find_spec(f"memlib.{module}")
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    first = re.sub(r":[a-z]+:`~?([\w.]+)`", lambda mt: f"`{mt.group(1).rsplit('.', 1)[-1]}`", first)
    return first.replace("``", "`")


def _packages() -> tuple[str, ...]:
    """:data:`memlib.PACKAGES`, read from the package's source (the facade imports everything; a chapter module
    imports only what comes before it)."""
    spec = importlib.util.find_spec("memlib")
    for node in ast.parse(Path(spec.origin).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(x, "id", None) for x in node.targets] == ["PACKAGES"]:
            return ast.literal_eval(node.value)
    raise LookupError("memlib.PACKAGES")


def _submodules(package: str) -> str:
    """A package's modules by name, the chapter modules ``chNN_*`` as one range (— for a module or a package
    without submodules)."""
    spec = importlib.util.find_spec(f"memlib.{package}")
    names = [m.name for m in pkgutil.iter_modules(spec.submodule_search_locations or [])]
    chapters = [n for n in names if re.fullmatch(r"ch\d\d_\w+", n)]
    if chapters:
        rest = [n for n in names if n not in chapters]
        names = [f"{chapters[0]} … {chapters[-1]} (one per chapter)", *rest]
    return ", ".join(names) or "—"


def library_table() -> str:
    """memlib's packages in the order data flows (:data:`memlib.PACKAGES`), each with its modules and the first
    paragraph of its docstring (read from the source, not imported)."""
    rows = [[str(i), f"`memlib.{name}`", _submodules(name), _docstring_summary(name)]
            for i, name in enumerate(_packages(), 1)]
    return md_table(["step", "package", "modules", "what it holds"], rows, "clll")


def _margin(margin: int) -> str:
    return (f"{fmt_bytes(margin)} below the capacity" if margin >= 0 else f"{fmt_bytes(-margin)} over the capacity")


def _up_projections(model) -> str:
    """What the recipe recomputes besides the norms: MLA's up-projections, where the model has MLA."""
    return " and MLA up-projections" if load_model(model).attention == "mla" else ""


def _band_words(band) -> str:
    """How far memlib's peaks were from measured ones for models of the family, in a clause."""
    if band.n == 0:
        return f"no measured run of a {band.family} model bounds memlib's error (chapter 11)"
    return (f"memlib's peaks were {signed_pct(band.low, 2)} to {signed_pct(band.high, 2)} off {fmt_count(band.n)} "
            f"measured runs of {band.family} models (chapter 11)")


def answer_values(model) -> dict[str, str]:
    """The book's answer for ``model`` in two sentences, from :func:`memlib.scenarios.deepseek.answer`:
    whether the paper's layout fits the H800 only with recomputation (or even without it, or not even with it),
    and where DeepSeek's recipe peaks.  Every verdict is the library's; a model neither configuration applies
    to gets empty sentences (the statement is omitted, never guessed)."""
    try:
        a = ds.answer(model)
    except ConfigError:
        return {"answer_paper": "", "answer_recipe": "", "answer_gpu": ds.GPU,
                "answer_capacity": fmt_capacity(ds.CAPACITY), "answer_capacity_bytes": fmt_count(ds.CAPACITY),
                "answer_allocatable": fmt_capacity(allocatable(ds.CAPACITY)),
                "answer_sold_as": f"{DEVICE_PRODUCT_GB[ds.GPU]} GB"}
    name, cap = model_name(model), f"{a['gpu']} of {fmt_capacity(a['capacity'])}"
    own = is_paper_model(load_model(model))
    layout = f"the paper's layout, {a['paper_train'].label()}" if own else \
        f"the paper's layout fitted to this model, {a['paper_train'].label()}"
    full = (f"with ZeRO-1 and full recomputation its peak device, stage {a['paper_full_stage']}, needs "
            f"{fmt_bytes(a['paper_full_total'])}")
    if a["only_with_recompute"]:
        paper = (f"Under {layout}, {name} fits an {cap} only with recomputation: without it no ZeRO stage fits "
                 f"(the best peak is {fmt_bytes(a['none_best'])}); {full}.")
    elif a["none_fits"]:
        paper = (f"Under {layout}, {name} fits an {cap} even without recomputation (the best peak over the ZeRO "
                 f"stages is {fmt_bytes(a['none_best'])}); {full}.")
    else:
        paper = (f"Under {layout}, {name} does not fit an {cap} even with ZeRO-1 and full recomputation: {full}.")
    band = _band_words(a["recipe_band"])
    verdict = {"fits": f"{band}, and it fits even at the far end of that range",
               "marginal": f"{band}: within that range of the card, a marginal fit",
               "does not fit": "so it does not fit"}[a["recipe_verdict"]]
    whose = "DeepSeek's own recipe" if own else f"DeepSeek-V3's recipe applied to {name}"
    recipe = (f"{whose} ({a['recipe_train'].label()} with DualPipe, ZeRO-1, FP8-cached activations "
              f"and its norms{_up_projections(model)} recomputed) peaks at {fmt_bytes(a['recipe_total'])} on "
              f"rank {a['recipe_rank']}, {_margin(a['recipe_margin'])}; {verdict}.")
    return {"answer_paper": paper, "answer_recipe": recipe, "answer_gpu": a["gpu"],
            "answer_capacity": fmt_capacity(a["capacity"]), "answer_capacity_bytes": fmt_count(a["capacity"]),
            "answer_allocatable": fmt_capacity(allocatable(a["capacity"])),
            "answer_sold_as": f"{DEVICE_PRODUCT_GB[a['gpu']]} GB"}


def capacity_table() -> str:
    """Each card of :data:`memlib.device.overhead.DEVICE_MEMORY`: the driver's total in MiB, in bytes, GiB and GB, and
    where the reading is printed."""
    rows = [[gpu, f"{DEVICE_PRODUCT_GB[gpu]} GB", fmt_bytes(b, "MiB", 0), fmt_count(b), fmt_bytes(b, "GiB", 2),
             fmt_bytes(b, "GB", 2), DEVICE_MEMORY_SOURCES[gpu]] for gpu, b in DEVICE_MEMORY.items()]
    return md_table(["GPU", "sold as", "driver reports", "bytes", "GiB", "GB", "source"], rows, "lrrrrrl")
