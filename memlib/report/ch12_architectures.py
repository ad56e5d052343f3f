"""Chapter 12, "Other architectures": tables, the figure and glued values, formatted from
:mod:`memlib.scenarios.architectures` (its four equations are the formula registry's ``attention_token.*``).
Nothing here computes a quantity; the chapter compares every shipped preset whatever model the book is built
for."""
from __future__ import annotations

from fractions import Fraction

from ..config import load_model
from ..scenarios import architectures as sa
from .figures import CATEGORY_COLORS, CATEGORY_LABELS, TEXT_WIDTH, Series, new_figure, stacked_bars
from .format import fmt_billions, fmt_bytes, fmt_count, fmt_decimal, fmt_exact, md_table, model_name, ratio

__all__ = ["values", "problem_values", "PROBLEM_SEQ_LEN", "attention_table", "mla_table", "presets_table", "pairs_table", "pairs_figure",
           "TOKEN_UNIT", "MODEL_TOKEN_UNIT", "DEVICE_UNIT", "DIGITS"]

#: one unit and one precision per quantity: bytes per token of one layer in KiB, of all layers in MiB, per device in
#: GiB, each with two decimals, in the text as in the tables
TOKEN_UNIT, MODEL_TOKEN_UNIT, DEVICE_UNIT = "KiB", "MiB", "GiB"
DIGITS = 2
#: the memory categories of the figure, bottom to top
FIGURE_CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations")


def _kib(x: Fraction) -> str:
    """Bytes per token of one layer in KiB, for a cell whose header names the unit."""
    return fmt_exact(x, TOKEN_UNIT, DIGITS)


def _mib(x: Fraction) -> str:
    """Bytes per token of a whole model in MiB, for a cell whose header names the unit."""
    return fmt_exact(x, MODEL_TOKEN_UNIT, DIGITS)


def _kib_text(x: Fraction) -> str:
    return f"{_kib(x)} {TOKEN_UNIT}"


def _mib_text(x: Fraction) -> str:
    return f"{_mib(x)} {MODEL_TOKEN_UNIT}"


def _gib(n: int) -> str:
    return fmt_bytes(n, DEVICE_UNIT, DIGITS, with_unit=False)


def _gib_text(n: int) -> str:
    return fmt_bytes(n, DEVICE_UNIT, DIGITS)


def _heads(name: str) -> str:
    m = load_model(name)
    if m.attention == "mla":
        return f"{m.num_attention_heads} (latent)"
    return f"{m.num_attention_heads} / {m.num_key_value_heads}"


def values(book_model: str = "deepseek-v3") -> dict[str, str]:
    """The chapter's numbers and words for its prose; ``book_model`` (the model the book is built for)
    only names it: the chapter compares every preset whatever it is."""
    v3, lite, l70 = "deepseek-v3", "deepseek-v2-lite", "llama-3-70b"
    split_p, split_m = sa.mla_split(v3, "paper"), sa.mla_split(v3, "megatron")
    l70_kv = sa.role_bytes(sa.attention_token(l70, "megatron"))["keys_values"]
    l70_m = load_model(l70)
    pairs = sa.equal_activated_pairs()
    dense = [n for n in sa.CHAPTER_PRESETS if not load_model(n).has_moe]
    unpaired = [n for n in dense if n not in {p.dense for p in pairs}]
    out = {
        "book_model": model_name(load_model(book_model)),
        "n_presets": fmt_count(len(sa.CHAPTER_PRESETS)),
        "seq_len": fmt_count(sa.SEQ_LEN),
        "config": sa.chapter_training(v3).label(),
        "config_dp": fmt_count(sa.chapter_training(v3).dp),
        "pair_ratio": fmt_decimal(sa.PAIR_RATIO, 0),
        "pairs": "; ".join(f"{model_name(p.dense)} with {model_name(p.moe)} (×{ratio(p.ratio, 1)})" for p in pairs),
        "unpaired": ", ".join(model_name(n) for n in unpaired) or "none",
        "v3": model_name(v3), "lite": model_name(lite), "l70": model_name(l70),
        "v3_kv": _kib_text(split_m["kv_heads"]), "l70_kv": _kib_text(l70_kv),
        "v3_over_l70_kv": ratio(split_m["kv_heads"], l70_kv, 1),
        "l70_n_kv": fmt_count(l70_m.num_key_value_heads), "v3_n_h": fmt_count(load_model(v3).num_attention_heads),
        "v3_latents_paper": _kib_text(split_p["latents"]), "v3_rope_paper": _kib_text(split_p["rope"]),
        "v3_cost_paper": _kib_text(split_p["cost"]), "v3_saves_paper": _kib_text(split_p["saves"]),
        "v3_latents_megatron": _kib_text(split_m["latents"]), "v3_cost_megatron": _kib_text(split_m["cost"]),
        "v3_saves_megatron": _kib_text(split_m["saves"]),
        "v3_total_megatron": _kib_text(split_m["total"]), "v3_recomputed_megatron": _kib_text(split_m["recomputed"]),
        "v3_total_paper": _kib_text(split_p["total"]),
        "v3_core_paper": _kib_text(sa.role_bytes(sa.attention_token(v3, "paper"))["core"]),
    }
    for i, p in enumerate(pairs, start=1):
        d, m = sa.preset_row(p.dense), sa.preset_row(p.moe)
        out |= {
            f"pair{i}_dense": model_name(p.dense), f"pair{i}_moe": model_name(p.moe),
            f"pair{i}_dense_act": fmt_billions(d["activated"]), f"pair{i}_moe_act": fmt_billions(m["activated"]),
            f"pair{i}_moe_total": fmt_billions(m["total"]),
            f"pair{i}_dense_token": _mib_text(d["model_megatron"]), f"pair{i}_moe_token": _mib_text(m["model_megatron"]),
            f"pair{i}_dense_peak": _gib_text(d["peak_megatron"]), f"pair{i}_moe_peak": _gib_text(m["peak_megatron"]),
        }
    facts = [sa.pair_facts(p) for p in pairs]
    if facts:
        out["pair1_token_why"] = (", since every token passes through several routed experts, each keeping its own "
                                  "intermediate tensors," if facts[0]["moe_more_per_token"] else
                                  ", though every token passes through several routed experts,")
    for i, f in enumerate(facts, start=1):
        out[f"pair{i}_token_cmp"] = "more" if f["moe_more_per_token"] else "less"
        out[f"pair{i}_peak_cmp"] = "more" if f["moe_higher_peak"] else "less"
    for i, f in enumerate(facts[1:], start=2):
        out[f"pair{i}_lead"] = ("The second pair reverses the picture" if f != facts[0]
                                else "The second pair shows the same picture")
        out[f"pair{i}_why"] = (": with expert parallelism its {} parameters are spread over more ranks than the "
                               "dense model's are".format(out[f"pair{i}_moe_total"]) if not f["moe_higher_peak"]
                               else ": its {} parameters weigh more than expert parallelism spreads them over the "
                                    "ranks".format(out[f"pair{i}_moe_total"]))
    return out


#: the worked problem's sequence length, tokens: a long-context run, eight times the chapter's
PROBLEM_SEQ_LEN = 32_768


def problem_values() -> dict[str, str]:
    """The worked problem: DeepSeek-V3's attention block at :data:`PROBLEM_SEQ_LEN` tokens per sequence, per profile
    (:func:`memlib.scenarios.architectures.longer_context`)."""
    v3 = "deepseek-v3"
    lc = sa.longer_context(v3, PROBLEM_SEQ_LEN)
    p, mg = lc["paper"], lc["megatron"]
    return {"model": model_name(v3), "s": fmt_count(sa.SEQ_LEN), "s_long": fmt_count(PROBLEM_SEQ_LEN),
            "paper": _kib_text(p["token"]), "paper_long": _kib_text(p["token_long"]),
            "paper_sequence": _gib_text(p["sequence_long"]),
            "megatron": _kib_text(mg["token"]), "megatron_long": _kib_text(mg["token_long"]),
            "megatron_word": ("stays at" if mg["token_long"] == mg["token"] else
                              "grows to" if mg["token_long"] > mg["token"] else "falls to"),
            "megatron_sequence": _gib_text(mg["sequence_long"])}


def _collapse(rows: list[list[str]]) -> list[list[str]]:
    """Rows that print the same cells after the model's name as one row naming each model ("DeepSeek-V2-Lite,
    Moonlight-16B-A3B"), in the order of their first appearance."""
    merged: dict[tuple[str, ...], list[str]] = {}
    for name, *cells in rows:
        merged.setdefault(tuple(cells), []).append(name)
    return [[", ".join(names), *cells] for cells, names in merged.items()]


def attention_table(profile: str = "megatron") -> str:
    """Attention bytes per token of one layer by role, every preset, nothing recomputed."""
    roles = list(sa.ROLE_NAMES)
    rows = []
    for n in sa.CHAPTER_PRESETS:
        entries = sa.attention_token(n, profile)
        rb = sa.role_bytes(entries)
        rows.append([model_name(n), sa.attention_kind(n), _heads(n), *[_kib(rb[r]) if rb[r] else "–" for r in roles],
                     _kib(sa.token_bytes(entries))])
    return md_table(["model", "attention", "heads (q / kv)", *sa.ROLE_NAMES.values(), f"total ({TOKEN_UNIT})"],
                    _collapse(rows),
                    "lll" + "r" * (len(roles) + 1))


def mla_table() -> str:
    """What MLA's compression costs and what recomputing from the latents saves, bytes per token of one
    layer, every MLA preset under both profiles."""
    rows = []
    for n in sa.CHAPTER_PRESETS:
        for p in sa.PROFILES:
            x = sa.mla_split(n, p)
            if x is None:
                continue
            rows.append([model_name(n), p, _kib(x["total"]), _kib(x["latents"]), _kib(x["rope"]),
                         _kib(x["kv_heads"]), _kib(x["saves"]), _kib(x["recomputed"])])
    return md_table(["model", "profile", "attention, nothing recomputed", "latents (cost)", "RoPE parts (cost)",
                     "per-head keys and values", "saved by recomputing the up-projections",
                     "attention, up-projections recomputed"], _collapse(rows), "llrrrrrr")


def presets_table() -> str:
    """Every preset: family, attention, parameters, bytes per token of one layer and of all layers,
    the peak device of the chapter's configuration, under both profiles."""
    rows = []
    for r in sa.preset_rows():
        rows.append([model_name(r["name"]), r["family"], r["attention"], "MoE" if r["moe"] else "dense",
                     fmt_billions(r["total"]), fmt_billions(r["activated"]),
                     _kib(r["layer_paper"]), _kib(r["layer_megatron"]),
                     _mib(r["model_megatron"]),
                     _gib(r["peak_paper"]), _gib(r["peak_megatron"])])
    # eleven columns do not fit the text column: what each model is, then what it needs, each row by model
    what = md_table(["model", "family", "attention", "FFN", "parameters", "activated"], [r[:6] for r in rows],
                    "llllrr")
    needs = md_table(["model", f"one layer, paper ({TOKEN_UNIT}/token)", f"one layer, megatron ({TOKEN_UNIT}/token)",
                      f"all layers, megatron ({MODEL_TOKEN_UNIT}/token)", f"peak device, paper ({DEVICE_UNIT})",
                      f"peak device, megatron ({DEVICE_UNIT})"], [[*r[:1], *r[6:]] for r in rows], "l" + "r" * 5)
    return what + "\n\n" + needs


def pairs_table() -> str:
    """The dense and MoE pairs at nearest activated parameters, side by side (megatron profile)."""
    rows = []
    for p in sa.equal_activated_pairs():
        for n in (p.dense, p.moe):
            r, pk = sa.preset_row(n), sa.peak_device(n, "megatron")
            # the configuration as code: it may wrap at any character, not past the text column
            rows.append([model_name(n), "MoE" if r["moe"] else "dense", fmt_billions(r["total"]),
                         fmt_billions(r["activated"]), _mib(r["model_megatron"]),
                         f"`{pk['label']}`", fmt_count(pk["stage"]), _gib(pk["model_states"]), _gib(pk["activations"]),
                         _gib(pk["allocated"])])
    return md_table(["model", "FFN", "parameters", "activated", f"activations, all layers ({MODEL_TOKEN_UNIT}/token)",
                     "parallel sizes", "peak stage", f"model states ({DEVICE_UNIT})", f"activations ({DEVICE_UNIT})",
                     f"allocated ({DEVICE_UNIT})"], rows, "llrrrlrrrr")


def pairs_figure():
    """The peak device of each model of the pairs, by memory category, under both profiles."""
    pairs = sa.equal_activated_pairs()
    names = [n for p in pairs for n in (p.dense, p.moe)]
    fig, axes = new_figure(TEXT_WIDTH, 2.25, 1, len(sa.PROFILES), sharey=True)
    for ax, prof in zip(axes, sa.PROFILES):
        peaks = [sa.peak_device(n, prof) for n in names]
        series = [Series(CATEGORY_LABELS[c], CATEGORY_COLORS[c], [pk[c] for pk in peaks]) for c in FIGURE_CATEGORIES]
        stacked_bars(ax, [model_name(n) for n in names], series, DEVICE_UNIT, digits=DIGITS, total_unit=False)
        ax.set_title(f"{prof} profile", fontsize=10)
        ax.tick_params(axis="x", rotation=20)
    axes[0].set_ylim(0, axes[0].get_ylim()[1] * 1.15)      # room for the tallest bar's label below the title
    axes[1].set_ylabel("")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=4)
    return fig
