"""Other architectures side by side: what MLA saves and costs in activations against grouped-query
attention, and dense against MoE models at (near) equal activated parameters, for every shipped preset.

**Per token.**  Training keeps no KV cache: a layer saves what its backward needs, and MLA's
compression of keys and values into a latent (arXiv 2405.04434) changes that only as far as the
ledger says.  :func:`attention_token` reads one attention block's ledger entries (the ``paper`` or
the ``megatron`` activation profile, :mod:`memlib.ledgers.paper`) as bytes per token on one device with no
parallelism (TP = CP = 1, sequence parallelism off) at :data:`SEQ_LEN` tokens per sequence, each entry
with its :data:`ROLES` role.  :func:`mla_split` splits an MLA block's bytes into what the compression
costs (the latents, the decoupled RoPE parts of the queries and keys) and what it can save (the
per-head queries, keys and values the up-projection recompute drops, net of what its checkpoint keeps).

**Per model.**  :func:`preset_row` gives a preset's parameters (total and activated, the embedding
counted whole), its activation bytes per token of one layer and of all its decoder layers, and the
peak device of :func:`chapter_training` (the paper's configuration adapted to the model,
:func:`memlib.paper.paper_training`).  :func:`equal_activated_pairs` pairs every dense preset with
the MoE preset whose activated parameters are nearest (within :data:`PAIR_RATIO`).

Exact: bytes per token are :class:`fractions.Fraction` (a one-element tensor per micro-batch is a
fraction of a byte per token), every other count an ``int``.

>>> [m for m in CHAPTER_PRESETS][:3]
['llama-3-8b', 'llama-3-70b', 'llama-3.1-405b']
>>> [(p.dense, p.moe) for p in equal_activated_pairs()]
[('llama-3-8b', 'mixtral-8x7b'), ('llama-3-70b', 'mixtral-8x22b')]
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Sequence

import sympy as sp

from ..ledgers.base import Saved, entry_bytes, parse_policy
from ..core.breakdown import exact_int
from ..config import PAPER_TRAINING, PRESETS, ConfigError, ModelConfig, TrainingConfig, load_model, show
from ..model.profiles import act_profile
from ..device.estimate import estimate
from ..formulas import attention_token_formula, token_training
from ..paper import paper_training
from ..model.params import activated_params, model_params, values as model_values
from ..core.symbols import sym

__all__ = ["PROFILES", "SEQ_LEN", "ROLES", "longer_context", "ROLE_NAMES", "PAIR_RATIO", "CHAPTER_PRESETS", "TokenEntry",
           "token_training", "chapter_training", "attention_token", "attention_token_formula", "role_bytes",
           "mla_split", "layer_token_bytes", "model_token_bytes", "peak_device", "preset_row", "preset_rows",
           "Pair", "equal_activated_pairs", "pair_facts", "attention_kind"]

#: the activation profiles the chapter compares
PROFILES = ("paper", "megatron")

#: tokens per sequence of every per-token number (the paper's configuration's)
SEQ_LEN = PAPER_TRAINING.seq_len

#: an MoE preset pairs with a dense one if their activated parameters differ by at most this factor
PAIR_RATIO = Fraction(2)

b, s = sym("b"), sym("s")
d_h = sym("d_h")
_PARALLEL = {sym("TP"): 1, sym("CP"): 1, sym("EP"): 1, sym("ETP"): 1}

#: what each attention entry is (by the part of its key after ``attention.``), in data-flow order
ROLES = {
    "norm_input": "block", "norm_rstd": "block", "norm_output": "block",
    "q_proj_norm_rstd": "block", "q_proj_norm_output": "block",
    "c_q": "latents", "c_q_rstd": "latents", "c_q_normed": "latents",
    "c_kv": "latents", "c_kv_rstd": "latents", "c_kv_normed": "latents", "kv_latent_with_rope_key": "latents",
    "qkv_output": "head_norms", "qk_norm_rstd": "head_norms",
    "q": "queries", "k": "keys_values", "v": "keys_values",
    "softmax_out": "core", "softmax_dropout_mask": "core", "softmax_dropout_out": "core",
    "attn_mask_type": "core", "softmax_lse": "core",
    "context": "context", "out_dropout_mask": "context",
}
#: the roles in words
ROLE_NAMES = {
    "block": "block input and its norm",
    "latents": "latents c^Q, c^KV (MLA)",
    "head_norms": "q/k head-norm inputs (Qwen3)",
    "queries": "queries",
    "keys_values": "keys and values",
    "core": "attention core (scores, softmax statistics)",
    "context": "context (input of W^O) and dropout mask",
}


def _order_key(name: str):
    m = load_model(name)
    kind = 0 if not m.has_moe else (1 if m.attention == "gqa" else 2)
    return kind, model_params(m).evaluate_total(model_values(m)), name


#: every shipped preset: dense models, then MoE models with GQA, then MLA models, each by total parameters
CHAPTER_PRESETS: tuple[str, ...] = tuple(sorted(PRESETS, key=_order_key))


def attention_kind(model: ModelConfig | str) -> str:
    """``MLA``, ``MHA`` (as many key-value heads as query heads) or ``GQA``."""
    m = load_model(model)
    if m.attention == "mla":
        return "MLA"
    return "MHA" if m.num_key_value_heads == m.num_attention_heads else "GQA"


def chapter_training(model: ModelConfig | str, profile: str = "paper") -> TrainingConfig:
    """The per-device configuration of the chapter: the paper's (PP16@TP2@EP8, DP32, ZeRO-0, no
    recompute) adapted to the model by :func:`memlib.paper.paper_training`, under ``profile``."""
    return paper_training(model).with_(profile=profile)


@dataclass(frozen=True)
class TokenEntry:
    """One saved tensor of a layer, in bytes per token."""

    key: str          #: ledger key, e.g. ``attention.c_kv``
    name: str         #: what it is, in words
    role: str         #: a :data:`ROLES` value (attention entries), else the block
    bytes: Fraction   #: bytes per token on one device
    rope: Fraction    #: of which the decoupled RoPE part (MLA queries and keys), else 0


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ConfigError(f"profile={show(profile)} must be one of {', '.join(PROFILES)} in this comparison")


def _per_token(m: ModelConfig, e: Saved, train: TrainingConfig, subs: dict | None = None) -> Fraction:
    x = entry_bytes(e, train, train.recipe).xreplace(subs or {}).xreplace(model_values(m))
    x = sp.sympify(x.xreplace({**_PARALLEL, b: train.micro_batch, s: train.seq_len}))
    return Fraction(exact_int(x), train.micro_batch * train.seq_len)


def _layer_entries(m: ModelConfig, profile: str, kind: str, policy: str) -> list[Saved]:
    _check_profile(profile)
    pol = parse_policy(policy)
    train = token_training(profile)
    return [e for e in act_profile(profile, train).layer(m, kind) if not pol.drops(e)]


@lru_cache(maxsize=256)
def _attention_token(m: ModelConfig, profile: str, policy: str, seq_len: int) -> tuple[TokenEntry, ...]:
    train = token_training(profile, seq_len)
    kind = m.layer_kinds[-1]
    out = []
    for e in _layer_entries(m, profile, kind, policy):
        if e.block != "attention":
            continue
        local = e.key.split(".", 1)[1]
        rope = Fraction(0)
        if m.attention == "mla" and local in ("q", "k"):
            rope = _per_token(m, e, train, {d_h: 0})     # the d_h^R share of [q^C; q^R] and [k^C; k^R]
        out.append(TokenEntry(e.key, e.name, ROLES[local], _per_token(m, e, train), rope))
    return tuple(out)


def attention_token(model: ModelConfig | str, profile: str = "paper", policy: str = "none",
                    seq_len: int = SEQ_LEN) -> list[TokenEntry]:
    """The attention block's saved tensors of one layer, bytes per token (one device, no parallelism,
    ``seq_len`` tokens per sequence), under the recompute ``policy``."""
    return list(_attention_token(load_model(model), profile, policy, seq_len))


def role_bytes(entries: Sequence[TokenEntry]) -> dict[str, Fraction]:
    """Bytes per token by role, in :data:`ROLE_NAMES` order (every role, 0 where absent)."""
    out = {r: Fraction(0) for r in ROLE_NAMES}
    for e in entries:
        out[e.role] += e.bytes
    return out


def token_bytes(entries: Sequence[TokenEntry]) -> Fraction:
    """Bytes per token of ``entries`` (:func:`attention_token`'s), summed."""
    return sum((e.bytes for e in entries), Fraction(0))


def mla_split(model: ModelConfig | str, profile: str = "paper", seq_len: int = SEQ_LEN) -> dict | None:
    """What MLA's compression costs and saves in one layer's attention activations, bytes per token;
    None for a model without MLA.

    ``total``: the block, nothing recomputed; ``latents``: the latents and their norms' inputs and
    statistics (tensors a block without compression does not have); ``rope``: the decoupled RoPE
    parts of the queries and keys (d_h^R per head each); ``kv_heads``: the per-head keys and values
    the attention kernel reads; ``cost``: latents + RoPE parts; ``recomputed``: the block with the
    up-projections recomputed (``mla_up_proj``); ``saves``: ``total - recomputed``, what recomputing
    from the latents drops net of what its checkpoint keeps."""
    m = load_model(model)
    if m.attention != "mla":
        return None
    none = attention_token(m, profile, "none", seq_len)
    rec = attention_token(m, profile, "mla_up_proj", seq_len)
    roles = role_bytes(none)
    total, recomputed = sum(e.bytes for e in none), sum(e.bytes for e in rec)
    rope = sum(e.rope for e in none)
    return {"total": total, "latents": roles["latents"], "rope": rope, "kv_heads": roles["keys_values"],
            "queries": roles["queries"], "cost": roles["latents"] + rope, "recomputed": recomputed,
            "saves": total - recomputed}


@lru_cache(maxsize=256)
def longer_context(model: ModelConfig | str, seq_len: int) -> dict:
    """One attention block of ``model`` at the chapter's :data:`SEQ_LEN` and at ``seq_len`` tokens per sequence, per
    profile: bytes per token (``token``, ``token_long``) and the block's bytes for one whole sequence at ``seq_len``
    (``sequence_long``, no parallelism)."""
    m = load_model(model)
    out = {}
    for p in PROFILES:
        short, long = _attention_token(m, p, "none", SEQ_LEN), _attention_token(m, p, "none", seq_len)
        out[p] = {"token": token_bytes(short), "token_long": token_bytes(long), "sequence_long": token_bytes(long) * seq_len}
    return out


def _layer_token(m: ModelConfig, profile: str, kind: str) -> Fraction:
    train = token_training(profile)
    return sum((_per_token(m, e, train) for e in _layer_entries(m, profile, kind, "none")), Fraction(0))


def layer_token_bytes(model: ModelConfig | str, profile: str = "paper", kind: str | None = None) -> Fraction:
    """Bytes per token that one decoder layer of ``kind`` saves (the model's last layer's kind by
    default: its MoE layer for an MoE model), nothing recomputed, one device, no parallelism."""
    m = load_model(model)
    kind = m.layer_kinds[-1] if kind is None else kind
    if kind not in m.layer_kinds:
        raise ConfigError(f"kind={show(kind)}: {m.name} has no {kind} layer")
    return _layer_token(m, profile, kind)


def model_token_bytes(model: ModelConfig | str, profile: str = "paper") -> Fraction:
    """Bytes per token that all decoder layers save (no embedding, head or MTP), nothing recomputed."""
    m = load_model(model)
    return sum((m.layer_kinds.count(k) * _layer_token(m, profile, k) for k in set(m.layer_kinds)), Fraction(0))


@lru_cache(maxsize=64)
def _peak(m: ModelConfig, profile: str) -> dict:
    est = estimate(m, chapter_training(m, profile))
    st = max(est.stages, key=lambda x: (x.allocated, -x.stage.index))
    return {"stage": st.stage.index, "label": est.train.label(), "parameters": st.bytes["parameters"],
            "gradients": st.bytes["gradients"], "optimizer_states": st.bytes["optimizer_states"],
            "model_states": st.model_states, "activations": st.bytes["activations"], "allocated": st.allocated}


def peak_device(model: ModelConfig | str, profile: str = "paper") -> dict:
    """The device of :func:`chapter_training` that allocates the most: ``stage``, ``label`` (the
    configuration), ``parameters``, ``gradients``, ``optimizer_states``, ``model_states``,
    ``activations`` and ``allocated`` bytes (overheads apart)."""
    _check_profile(profile)
    return dict(_peak(load_model(model), profile))


def preset_row(model: ModelConfig | str) -> dict:
    """One model's line of the chapter's table: ``name``, ``family``, ``attention`` (kind),
    ``moe`` (bool), ``total`` and ``activated`` parameters, per profile the bytes per token of one
    layer (``layer_<profile>``) and of all decoder layers (``model_<profile>``), and the peak device's
    allocated bytes (``peak_<profile>``)."""
    m = load_model(model)
    vals = model_values(m)
    row = {"name": m.name, "family": m.family, "attention": attention_kind(m), "moe": m.has_moe,
           "layers": m.num_hidden_layers, "total": model_params(m).evaluate_total(vals),
           "activated": activated_params(m).evaluate_total(vals)}
    for p in PROFILES:
        row[f"layer_{p}"] = layer_token_bytes(m, p)
        row[f"model_{p}"] = model_token_bytes(m, p)
        row[f"peak_{p}"] = peak_device(m, p)["allocated"]
    return row


def preset_rows(models: Sequence[str] = CHAPTER_PRESETS) -> list[dict]:
    """:func:`preset_row` of every model."""
    return [preset_row(m) for m in models]


@dataclass(frozen=True)
class Pair:
    """A dense preset and the MoE preset whose activated parameters are nearest to its own."""

    dense: str
    moe: str
    ratio: Fraction    #: the larger activated count over the smaller (>= 1)


def _activated(name: str) -> int:
    m = load_model(name)
    return activated_params(m).evaluate_total(model_values(m))


def equal_activated_pairs(models: Sequence[str] = CHAPTER_PRESETS, max_ratio: Fraction = PAIR_RATIO) -> list[Pair]:
    """For each dense model, the MoE model whose activated parameters are nearest to its parameters
    (the smallest ratio of the larger to the smaller; ties to the first in ``models``), if that ratio
    is at most ``max_ratio``."""
    if Fraction(max_ratio) < 1:
        raise ConfigError(f"max_ratio={show(max_ratio)} must be at least 1")
    dense = [n for n in models if not load_model(n).has_moe]
    moe = [n for n in models if load_model(n).has_moe]
    out = []
    for d in dense:
        if not moe:
            break
        a = _activated(d)
        ratios = [(Fraction(max(a, _activated(x)), min(a, _activated(x))), i, x) for i, x in enumerate(moe)]
        r, _, best = min(ratios)
        if r <= max_ratio:
            out.append(Pair(d, best, r))
    return out


def pair_facts(pair: Pair, profile: str = "megatron") -> dict[str, bool]:
    """Which model of ``pair`` keeps more: ``moe_more_per_token`` (bytes per token of all decoder
    layers) and ``moe_higher_peak`` (the peak device's allocated bytes), under ``profile``."""
    d, m = preset_row(pair.dense), preset_row(pair.moe)
    return {"moe_more_per_token": m[f"model_{profile}"] > d[f"model_{profile}"],
            "moe_higher_peak": m[f"peak_{profile}"] > d[f"peak_{profile}"]}
