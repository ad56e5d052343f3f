"""The shipped models side by side: their configuration fields, layer patterns, attention tensors
and totals, for the comparisons the book shows whatever model it is built for; and one block's
tensors in data-flow order with their shapes and slicing (:func:`block_nodes`), for its diagrams.

>>> PRESET_ORDER
('deepseek-v3', 'deepseek-v2', 'deepseek-v2-lite')
>>> [r["total"] for r in preset_totals()]
[671026404352, 235741434880, 15706484224]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import sympy as sp

from ..model.architecture import attention_tensors, block_norm_tensors, dense_ffn_tensors, moe_tensors
from ..config import PRESETS, ModelConfig, load_model
from ..paper import PAPER_MODEL
from ..paper.parameters import expert_counts, mtp_module, official, runs, totals
from ..ledgers.paper import paper_layer
from ..model.params import values as model_values
from ..model.partition import PROFILES
from ..core.breakdown import exact_int
from ..core.symbols import model_symbols, sym

__all__ = ["PRESET_ORDER", "EXTRA_FIELDS", "model_fields", "layer_pattern", "layer_patterns", "attention_shapes",
           "contrasting_preset", "preset_summary", "preset_totals", "presets_where", "Node", "DIAGRAM_BLOCKS",
           "block_nodes"]

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


# ------------------------------------------------------------------------------------------------
# a block's tensors in data-flow order, for the block diagrams
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """One tensor of a block diagram: a weight (from :mod:`memlib.model.architecture`, sliced as the partition
    profile says) or a saved activation (from the paper's ledger, :func:`memlib.ledgers.paper.paper_layer`)."""

    key: str                 #: the tensor's key in its table (``attention.W_UQ``, ``attention.c_kv``)
    name: str                #: a weight's LaTeX name, an activation's name from the ledger
    shape: tuple             #: symbolic shape (a weight: rows = output features; an activation: rows, width)
    sliced_by: tuple         #: the parallel sizes that split it on one device, among TP, EP, ETP, SP, CP
    category: str            #: ``"parameters"`` or ``"activations"``

    @property
    def numel(self) -> sp.Expr:
        return sp.Mul(*self.shape)


#: the blocks :func:`block_nodes` draws: block -> (its weights, the prefix of its ledger keys)
DIAGRAM_BLOCKS = {"attention": "attention.", "moe": "moe.", "dense_ffn": "dense_ffn."}

#: the activation each weight reads (the first of the candidates the ledger has)
_READS = {
    "norms.attn_norm": ("attention.norm_input",), "norms.ffn_norm": ("moe.norm_input", "dense_ffn.norm_input"),
    "attention.W_DQ": ("attention.norm_output",), "attention.W_DKV": ("attention.norm_output",),
    "attention.W_KR": ("attention.norm_output",), "attention.W_Q": ("attention.norm_output",),
    "attention.W_K": ("attention.norm_output",), "attention.W_V": ("attention.norm_output",),
    "attention.q_norm": ("attention.c_q",), "attention.W_UQ": ("attention.c_q",),
    "attention.W_QR": ("attention.c_q", "attention.norm_output"),
    "attention.kv_norm": ("attention.c_kv",), "attention.W_UK": ("attention.c_kv",),
    "attention.W_UV": ("attention.c_kv",), "attention.q_head_norm": ("attention.q",),
    "attention.k_head_norm": ("attention.k",), "attention.W_O": ("attention.context",),
    "router.gate": ("moe.norm_output",), "router.e_score_correction_bias": ("moe.router_probs",),
    "routed_experts.gate": ("moe.routed.input",), "routed_experts.up": ("moe.routed.input",),
    "routed_experts.down": ("moe.routed.product",),
    "shared_experts.gate": ("moe.shared.input",), "shared_experts.up": ("moe.shared.input",),
    "shared_experts.down": ("moe.shared.product",), "shared_experts.gate_weight": ("moe.shared.input",),
    "dense_ffn.gate": ("dense_ffn.norm_output",), "dense_ffn.up": ("dense_ffn.norm_output",),
    "dense_ffn.down": ("dense_ffn.product",), "dense_ffn.fc1": ("dense_ffn.norm_output",),
    "dense_ffn.fc2": ("dense_ffn.act_out",),
}

#: the order the slicing sizes are listed in: width first (TP, ETP), then rows (EP, SP, CP)
_b, _s = sym("b"), sym("s")
_SLICE_ORDER = ("TP", "ETP", "EP", "SP", "CP")
_WEIGHT_SLICES = {"tp": ("TP",), "expert": ("EP", "ETP"), "replicated": ()}


def _reads(key: str) -> tuple:
    """The candidates for the activation a weight reads: a bias reads what its weight reads."""
    base = key if key in _READS else key.removesuffix("_bias").replace("attention.b_", "attention.W_")
    if base not in _READS:
        raise KeyError(f"no data flow known for {key}: add it to memlib.scenarios.models._READS")
    return _READS[base]


def _activation_shape(e) -> tuple:
    """(rows, width) of a saved activation with a width, or (b s, the rest) when the rest has no s (router
    logits: [b s, N]); otherwise its element count's factors (softmax: [b, n_h, s, s])."""
    if e.width is not None:
        return (sp.factor(e.elements / e.width), e.width)
    tokens = _b * _s
    rest = sp.factor(e.elements / tokens)
    if not rest.has(_s) and not rest.has(_b):
        return (tokens, rest)
    out = []
    for f in sp.Mul.make_args(e.elements):
        base, exp = f.as_base_exp()
        out += [base] * int(exp) if exp.is_Integer and exp > 0 else [f]
    return tuple(out)


def block_nodes(m: ModelConfig | str, block: str, profile: str = "paper") -> list[Node]:
    """The tensors of one decoder-layer ``block`` (:data:`DIAGRAM_BLOCKS`: ``attention`` with its norm,
    ``moe``, ``dense_ffn`` with theirs) in data-flow order: each saved activation of the paper's ledger
    (masks and dropout outputs left out), followed by the weights that read it.  Shapes come from
    :mod:`memlib.model.architecture` and the ledger; what slices a weight from the partition ``profile``
    (TP; EP and ETP for routed experts; nothing when replicated), what slices an activation from its
    ledger entry."""
    m = load_model(m)
    if block not in DIAGRAM_BLOCKS:
        raise ValueError(f"block={block!r} must be one of {', '.join(DIAGRAM_BLOCKS)}")
    if block == "moe" and not m.has_moe:
        raise ValueError(f"{m.name} has no MoE layers")
    kind = "moe" if block == "moe" else ("moe" if block == "attention" and m.has_moe else "dense")
    norm = "norms.attn_norm" if block == "attention" else "norms.ffn_norm"
    tables = {"attention": attention_tensors, "moe": moe_tensors, "dense_ffn": dense_ffn_tensors}
    weights = [t for t in block_norm_tensors(m) if t.key.removesuffix("_bias") == norm] + tables[block](m)
    acts = [e for e in paper_layer(m, kind) if e.key.startswith(DIAGRAM_BLOCKS[block])
            and e.dtype != "mask" and "dropout" not in e.key]
    keys = {e.key for e in acts}
    readers: dict[str, list] = {e.key: [] for e in acts}
    for t in weights:
        readers[next(k for k in _reads(t.key) if k in keys)].append(t)
    prof = PROFILES[profile]
    out = []
    for e in acts:
        out.append(Node(e.key, e.name.split(",")[0].split(" (")[0], _activation_shape(e),
                        tuple(d for d in _SLICE_ORDER if d in e.shard), "activations"))
        out += [Node(t.key, f"${t.latex}$", t.shape, _WEIGHT_SLICES[prof.sharding(t)], "parameters")
                for t in readers[e.key]]
    return out
