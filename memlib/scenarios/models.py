"""The shipped models side by side: their configuration fields, layer patterns, attention tensors
and totals, for the comparisons the book shows whatever model it is built for (a block's dataflow, for
its diagrams, is :mod:`memlib.scenarios.dataflow`).

>>> PRESET_ORDER
('deepseek-v3', 'deepseek-v2', 'deepseek-v2-lite')
>>> [r["total"] for r in preset_totals()]
[671026404352, 235741434880, 15706484224]
"""
from __future__ import annotations

from typing import Sequence

from ..model.architecture import attention_tensors
from ..config import PRESETS, ModelConfig, load_model
from ..paper import PAPER_MODEL
from ..paper.parameters import expert_counts, mtp_module, official, runs, totals
from ..model.params import values as model_values
from ..core.breakdown import exact_int
from ..core.symbols import model_symbols

__all__ = ["PRESET_ORDER", "EXTRA_FIELDS", "model_fields", "layer_pattern", "layer_patterns", "attention_shapes",
           "contrasting_preset", "preset_summary", "preset_totals", "presets_where"]

#: the DeepSeek presets the book compares, the paper's model first (the other architectures' presets,
#: Llama, Mixtral, Qwen, Kimi-K2, Moonlight, are not part of these comparisons)
PRESET_ORDER: tuple[str, ...] = (PAPER_MODEL,) + tuple(p for p in PRESETS if p != PAPER_MODEL
                                                       and p.startswith("deepseek-"))

#: configuration fields that set the structure but have no symbol
EXTRA_FIELDS = ("moe_layer_freq", "tie_word_embeddings", "router_bias")


def _models(models: Sequence[str | ModelConfig]) -> list[ModelConfig]:
    return [load_model(m) for m in models]


def model_fields(models: Sequence[str | ModelConfig] = PRESET_ORDER) -> list[dict]:
    """Every model symbol's configuration field, then :data:`EXTRA_FIELDS`, with its value in each
    model (``None`` where the field is null): ``symbol`` (the registry key, or None), ``field``,
    ``values``."""
    ms = _models(models)
    rows = [{"symbol": n.key, "field": n.field, "values": [getattr(m, n.field) for m in ms]} for n in model_symbols()]
    rows += [{"symbol": None, "field": f, "values": [getattr(m, f) for m in ms]} for f in EXTRA_FIELDS]
    return rows


def layer_pattern(m: ModelConfig | str) -> dict:
    """Which decoder layers are dense and which MoE: ``layers``, ``dense``, ``moe``, ``runs``
    ((kind, first, last) per run of one kind) and ``mtp`` (MTP modules)."""
    m = load_model(m)
    kinds = m.layer_kinds
    return {"layers": len(kinds), "dense": kinds.count("dense"), "moe": kinds.count("moe"), "runs": runs(kinds),
            "mtp": m.num_nextn_predict_layers}


def layer_patterns(models: Sequence[str | ModelConfig] = PRESET_ORDER) -> list[tuple[ModelConfig, dict]]:
    """:func:`layer_pattern` of each model."""
    return [(m, layer_pattern(m)) for m in _models(models)]


def attention_shapes(models: Sequence[str | ModelConfig]) -> list[dict]:
    """The MLA tensors of the models, one row per tensor key in the order of the first model's
    attention (a tensor only another model has, W^Q, comes where the query projection does):
    ``key``, ``tensor`` (the first model's that has it) and ``shapes`` (per model: (tensor, numeric
    shape), or None where the model has no such tensor)."""
    ms = _models(models)
    per = [{t.key: t for t in attention_tensors(m)} for m in ms]
    keys: list[str] = []
    for d in per:
        keys += [k for k in d if k not in keys]
    order = [t.key for t in attention_tensors(ms[0])]
    anchor = next((k for k in ("attention.W_UQ", "attention.W_Q") if k in order), order[0])
    keys.sort(key=lambda k: order.index(k) if k in order else order.index(anchor))
    rows = []
    for k in keys:
        shapes = []
        for m, d in zip(ms, per):
            t = d.get(k)
            vals = model_values(m)
            shapes.append(None if t is None else (t, tuple(exact_int(x, vals) for x in t.shape)))
        rows.append({"key": k, "tensor": next(d[k] for d in per if k in d), "shapes": shapes})
    return rows


def contrasting_preset(m: ModelConfig | str, order: Sequence[str] = ("deepseek-v2-lite", "deepseek-v2",
                                                                       "deepseek-v3")) -> str | None:
    """The first shipped preset of ``order`` whose queries are projected the other way (compressed
    through d_c', or directly from h): the model the chapter sets beside ``m``; None if none is."""
    m = load_model(m)
    for name in order:
        if (load_model(name).q_lora_rank is None) != (m.q_lora_rank is None):
            return name
    return None


def preset_summary(m: ModelConfig | str) -> dict:
    """A model's structure in the numbers the book quotes: its configuration fields (``h``, ``n_h``,
    ``l``, ``k_dense``, ``N``, ``N_s``, ``N_r``, ``d_cq``), ``q_compression``, ``router_bias``,
    ``mtp`` (modules), :func:`~memlib.paper.parameters.expert_counts` and ``mtp_module`` (one
    module's own parameters)."""
    m = load_model(m)
    return {"name": m.name, "h": m.hidden_size, "n_h": m.num_attention_heads, "l": m.num_hidden_layers,
            "k_dense": m.first_k_dense_replace, "N": m.n_routed_experts, "N_s": m.n_shared_experts,
            "N_r": m.num_experts_per_tok, "d_cq": m.q_lora_rank, "q_compression": m.q_lora_rank is not None,
            "router_bias": m.router_bias, "mtp": m.num_nextn_predict_layers, **expert_counts(m),
            "mtp_module": mtp_module(m)["total"]}


def preset_totals(models: Sequence[str | ModelConfig] = PRESET_ORDER) -> list[dict]:
    """Per model: its :func:`~memlib.paper.parameters.totals`, ``model`` (its name) and ``official``
    (what DeepSeek states for it, in billions as printed; empty where nothing)."""
    return [{"model": m.name, **totals(m), "official": official(m)} for m in _models(models)]


def presets_where(predicate, models: Sequence[str | ModelConfig] = PRESET_ORDER) -> list[str]:
    """The names of the models whose configuration satisfies ``predicate``."""
    return [m.name for m in _models(models) if predicate(m)]
