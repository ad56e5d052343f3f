"""The model: :class:`ModelConfig` (Hugging Face ``config.json`` field names), its families and presets.

A model is read from a shipped preset (``deepseek-v3``, ``llama-3-8b``, ``mixtral-8x7b``, ...) or from
any local ``config.json``; unknown fields are ignored, missing required ones are named.  The config is a
frozen dataclass; nothing in memlib mutates it.

The architecture is data: :data:`FAMILIES` lists, one entry per Hugging Face architecture, which
``architectures``/``model_type`` it matches, its block kinds (attention ``mla`` or ``gqa``, dense FFN
``swiglu`` or ``gelu``, MoE kind, norm, positions) and where each :class:`ModelConfig` field is read
from.  :mod:`memlib.model.architecture` turns the kinds into tensors.  Adding an architecture whose blocks
memlib knows is one entry of :data:`FAMILIES`.

>>> m = load_model("deepseek-v3")
>>> m.hidden_size, m.q_lora_rank, m.num_nextn_predict_layers
(7168, 1536, 1)
>>> load_model("deepseek-v2-lite").q_lora_rank is None
True
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Mapping, Optional

from .checks import LIMITS, ConfigError, check_count, show

__all__ = ["ModelConfig", "PRESETS", "load_model", "model_from_dict", "preset_names", "Family", "FAMILIES",
           "family_of", "config_field", "reads_field", "MAX_CONFIG_BYTES"]

PRESET_DIR = Path(__file__).parents[1] / "presets"


# Hugging Face field -> required? (fields whose absence would make HF fall back to a default that
# may not be the model's: they must be present, even if null)
_REQUIRED = (
    "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank",
    "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "num_hidden_layers",
    "first_k_dense_replace", "vocab_size",
)


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only model (DeepSeek-style MoE, or any entry of :data:`FAMILIES`), with Hugging Face
    ``config.json`` field names.  A field an architecture does not have is None (MLA's widths for a
    grouped-query model, the experts of a dense one); :func:`memlib.model.architecture.model_values` gives
    its symbol the value 1, which no tensor of that architecture reads."""

    hidden_size: int                 #: h
    intermediate_size: Optional[int]  #: h_F, width of the dense FFN (None: no dense layer)
    moe_intermediate_size: Optional[int]  #: h_E, width of one routed expert (None: dense model)
    num_attention_heads: int         #: n_h
    qk_nope_head_dim: Optional[int]  #: d_h (MLA)
    qk_rope_head_dim: Optional[int]  #: d_h^R (MLA)
    v_head_dim: Optional[int]        #: d_v (MLA)
    q_lora_rank: Optional[int]       #: d_c'; None: queries projected directly from h (V2-Lite)
    kv_lora_rank: Optional[int]      #: d_c (MLA)
    n_routed_experts: Optional[int]  #: N (None: dense model)
    n_shared_experts: int            #: N_s (HF builds one MLP of width h_E * N_s)
    num_experts_per_tok: Optional[int]  #: N_r (None: dense model)
    num_hidden_layers: int           #: l
    first_k_dense_replace: int       #: leading layers with a dense FFN
    vocab_size: int                  #: v
    moe_layer_freq: int = 1          #: every k-th layer after the dense ones is MoE
    num_nextn_predict_layers: int = 0  #: MTP modules (not built by HF transformers)
    tie_word_embeddings: bool = False  #: head shares the embedding matrix
    router_bias: bool = False        #: e_score_correction_bias buffer (``topk_method: noaux_tc``)
    n_group: int = 1                 #: n_g, expert groups of group-limited routing (1: none)
    topk_group: int = 1              #: k_g, groups each token may route to
    scoring_func: str = "softmax"    #: router score function: ``softmax`` (V2) or ``sigmoid`` (V3)
    # --- the block kinds (FAMILIES); the defaults are DeepSeek's ----------------------------------
    family: str = "deepseek"         #: the FAMILIES entry the config was read with
    attention: str = "mla"           #: ``mla`` or ``gqa`` (grouped-query, multi-head when n_kv = n_h)
    mlp: str = "swiglu"              #: dense FFN: ``swiglu`` (gate, up, down) or ``gelu`` (fc1, fc2)
    moe: Optional[str] = "deepseek"  #: ``deepseek``, ``mixtral``, ``qwen2_moe``, ``qwen3_moe``; None: dense model
    norm: str = "rmsnorm"            #: ``rmsnorm`` (weight) or ``layernorm`` (weight and bias)
    positions: str = "rope"          #: ``rope`` (no parameters) or ``learned`` (an n_pos x h embedding)
    num_key_value_heads: Optional[int] = None  #: n_kv (GQA)
    head_dim: Optional[int] = None   #: d_head (GQA)
    qk_norm: bool = False            #: RMSNorm of each query and key head over d_head (Qwen3)
    qkv_bias: bool = False           #: biases of the query, key and value projections
    o_bias: bool = False             #: bias of the output projection
    mlp_bias: bool = False           #: biases of the dense FFN's projections
    shared_expert_intermediate_size: Optional[int] = None  #: h_S, Qwen2-MoE's shared expert (with a sigmoid gate)
    max_position_embeddings: Optional[int] = None  #: n_pos, learned absolute positions only
    #: the FFN's activation function by transformers' name (``hidden_act``; GPT-2's ``activation_function``):
    #: no parameter depends on it, only what the ``hf-eager`` ledger says it saves
    hidden_act: str = "silu"
    #: whether the router renormalises the top-k probabilities to sum to one (Qwen-MoE's ``norm_topk_prob``;
    #: Mixtral always does): no parameter depends on it, only what the ``hf-eager`` ledger says it saves
    norm_topk_prob: bool = True
    #: the block of weights that share one fp32 scale in a published FP8 checkpoint (``quantization_config``'s
    #: ``weight_block_size`` with ``quant_method: fp8``: DeepSeek-V3 stores e4m3 matrices with one
    #: ``weight_scale_inv`` per 128 x 128 block); None: the checkpoint stores no such scales.  No training
    #: byte depends on it, only the count of the tensors that checkpoint stores
    weight_block_size: Optional[tuple[int, int]] = None
    name: str = "custom"             #: preset name or file path
    source: str = ""                 #: where the values come from

    # ------------------------------------------------------------------------------------------
    def is_moe_layer(self, i: int) -> bool:
        """HF rule: layer ``i`` is MoE iff ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``
        (never in a dense model: an MTP module after its last layer is dense too)."""
        return self.moe is not None and i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0

    @cached_property
    def layer_kinds(self) -> tuple[str, ...]:
        """``"dense"`` or ``"moe"`` for each decoder layer, in order."""
        return tuple("moe" if self.is_moe_layer(i) else "dense" for i in range(self.num_hidden_layers))

    @property
    def has_moe(self) -> bool:
        """Whether the model has MoE layers (a routed-expert kind)."""
        return self.moe is not None

    @property
    def has_shared_experts(self) -> bool:
        """Whether its MoE layers have shared experts beside the routed ones (``n_shared_experts``, or
        Qwen2-MoE's one gated shared expert)."""
        return self.has_moe and (bool(self.n_shared_experts) or self.moe == "qwen2_moe")

    def values(self) -> dict:
        """Field name -> value, for the JSON output (DeepSeek's fields only for a DeepSeek model, as before)."""
        skip = {"source", "weight_block_size"} | (set(_FAMILY_FIELDS) if self.family == "deepseek" else set())
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


#: ModelConfig fields that only the FAMILIES readers set (left out of a DeepSeek model's JSON)
_FAMILY_FIELDS = ("family", "attention", "mlp", "moe", "norm", "positions", "num_key_value_heads", "head_dim",
                  "qk_norm", "qkv_bias", "o_bias", "mlp_bias", "shared_expert_intermediate_size",
                  "max_position_embeddings", "hidden_act", "norm_topk_prob")


def config_field(m: ModelConfig, field: str) -> str | None:
    """The ``config.json`` field ``m``'s family reads the :class:`ModelConfig` attribute ``field`` from: the attribute's
    own name for a DeepSeek config (memlib's fields are DeepSeek's), the family's name for it otherwise (Mixtral's
    ``num_local_experts`` for ``n_routed_experts``); None where the family reads no field for it (Mixtral has no
    ``n_group``, Llama no ``first_k_dense_replace``: the value is a constant, not the model's).

    >>> config_field(load_model("mixtral-8x7b"), "moe_intermediate_size"), config_field(load_model("llama-3-8b"), "n_group")
    ('intermediate_size', None)
    """
    return _family_fields(m).get(field, field if m.family == "deepseek" else None)


def _family_fields(m: ModelConfig) -> dict[str, str | None]:
    """ModelConfig attribute -> the config.json field ``m``'s family reads it from (None: derived or constant), for
    a non-DeepSeek family; empty for DeepSeek's (read by :func:`_deepseek_from_dict` under its own names)."""
    fam = next(f for f in FAMILIES if f.name == m.family)
    return {f: hf for f, hf, _ in fam.fields}


def reads_field(m: ModelConfig, field: str) -> bool:
    """Whether ``m``'s family has the :class:`ModelConfig` attribute ``field`` at all (from its config, derived or
    constant): Mixtral has no group-limited routing (``n_group``), a dense Llama no ``first_k_dense_replace``.

    >>> reads_field(load_model("mixtral-8x7b"), "n_group"), reads_field(load_model("deepseek-v3"), "n_group")
    (False, True)
    """
    return m.family == "deepseek" or field in _family_fields(m)


def _or_default(d: Mapping, key: str, default: int):
    """An optional integer field: its value, or ``default`` when it is absent or null (a false or a 0.0 is not
    absent: the field's check refuses it, as every integer field refuses a boolean or a float)."""
    x = d.get(key)
    return default if x is None else x


def _int_field(d: Mapping, key: str, *, minimum: int = 1, nullable: bool = False):
    return check_count(key, d[key], minimum=minimum, nullable=nullable, bound=LIMITS.get(key, LIMITS["width"]))


def model_from_dict(d: Mapping, name: str = "custom", source: str = "") -> ModelConfig:
    """Build a :class:`ModelConfig` from a ``config.json`` mapping, validating every field.

    The architecture is found by :func:`family_of` (``architectures``, then ``model_type``; a config
    with neither is read as DeepSeek's, as memlib always has)."""
    fam = family_of(d, name)
    m = _read_family(fam, d, name, source) if fam.name != "deepseek" else _deepseek_from_dict(d, name, source)
    block = _fp8_weight_block(d.get("quantization_config"))
    return m if block is None else replace(m, weight_block_size=block)


def _fp8_weight_block(q) -> tuple[int, int] | None:
    """``quantization_config.weight_block_size`` of a block-FP8 checkpoint (``quant_method: fp8``), validated;
    None without one (another quantization method stores no such per-block scales)."""
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise ConfigError(f"quantization_config={show(q)} must be an object")
    if q.get("quant_method") != "fp8" or q.get("weight_block_size") is None:
        return None
    block = q["weight_block_size"]
    if not isinstance(block, list) or len(block) != 2:
        raise ConfigError(f"quantization_config.weight_block_size={show(block)} must be two integers (rows, columns)")
    return tuple(check_count("quantization_config.weight_block_size", x, bound=LIMITS["width"]) for x in block)


def _deepseek_from_dict(d: Mapping, name: str, source: str) -> ModelConfig:
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ConfigError(f"model config {name} is missing required field(s): {', '.join(missing)}")
    kw = {k: _int_field(d, k) for k in _REQUIRED if k not in ("q_lora_rank", "n_shared_experts", "first_k_dense_replace")}
    kw["q_lora_rank"] = _int_field(d, "q_lora_rank", nullable=True)
    kw["n_shared_experts"] = _int_field(d, "n_shared_experts", minimum=0)
    kw["first_k_dense_replace"] = _int_field(d, "first_k_dense_replace", minimum=0)
    kw["moe_layer_freq"] = _int_field({"moe_layer_freq": d.get("moe_layer_freq", 1)}, "moe_layer_freq")
    kw["num_nextn_predict_layers"] = _int_field(
        {"num_nextn_predict_layers": _or_default(d, "num_nextn_predict_layers", 0)}, "num_nextn_predict_layers", minimum=0)
    tie = d.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ConfigError(f"tie_word_embeddings={show(tie)} must be true or false")
    kw["tie_word_embeddings"] = tie
    topk = d.get("topk_method")
    kw["router_bias"] = topk == "noaux_tc" or (topk is None and d.get("model_type") == "deepseek_v3")
    kw["n_group"] = _int_field({"n_group": _or_default(d, "n_group", 1)}, "n_group")
    kw["topk_group"] = _int_field({"topk_group": _or_default(d, "topk_group", 1)}, "topk_group")
    if kw["n_routed_experts"] % kw["n_group"]:
        raise ConfigError(f"n_group={kw['n_group']} must divide n_routed_experts={kw['n_routed_experts']}")
    if kw["topk_group"] > kw["n_group"]:
        raise ConfigError(f"topk_group={kw['topk_group']} must not exceed n_group={kw['n_group']}")
    if kw["n_group"] > 1 and kw["topk_group"] * (kw["n_routed_experts"] // kw["n_group"]) < kw["num_experts_per_tok"]:
        raise ConfigError(f"topk_group={kw['topk_group']} groups of n_routed_experts/n_group="
                          f"{kw['n_routed_experts'] // kw['n_group']} experts must hold num_experts_per_tok="
                          f"{kw['num_experts_per_tok']} (group-limited routing picks experts from those groups only)")
    scoring = d.get("scoring_func") or ("sigmoid" if d.get("model_type") == "deepseek_v3" else "softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise ConfigError(f"scoring_func={scoring!r} must be softmax or sigmoid")
    kw["scoring_func"] = scoring
    if kw["num_experts_per_tok"] > kw["n_routed_experts"]:
        raise ConfigError(
            f"num_experts_per_tok={kw['num_experts_per_tok']} must not exceed n_routed_experts={kw['n_routed_experts']}")
    if kw["first_k_dense_replace"] > kw["num_hidden_layers"]:
        raise ConfigError(
            f"first_k_dense_replace={kw['first_k_dense_replace']} must not exceed num_hidden_layers={kw['num_hidden_layers']}")
    return ModelConfig(**kw, name=name, source=source)


# ------------------------------------------------------------------------------------------------
# architectures: one table entry each
# ------------------------------------------------------------------------------------------------
class _Required:
    def __repr__(self):
        return "REQUIRED"


#: a field the config.json must hold (transformers would otherwise fall back to a default of its own)
REQUIRED = _Required()


def _head_dim(kw: dict) -> int:
    """h / n_h, the head dimension transformers derives when ``head_dim`` is absent or null."""
    h, n = kw["hidden_size"], kw["num_attention_heads"]
    if h % n:
        raise ConfigError(f"head_dim=null needs num_attention_heads={n} to divide hidden_size={h} "
                          f"(the head dimension is then hidden_size / num_attention_heads)")
    return h // n


@dataclass(frozen=True)
class Family:
    """One architecture: the configs it reads, its block kinds, and where each field comes from.

    ``fields`` lists (ModelConfig field, config.json field, default): the default is :data:`REQUIRED`
    (the field must be present), a constant, or a function of the fields read before it; a config.json
    field of None means the value is the constant default whatever the file says.  Block kinds are the
    keys of :mod:`memlib.model.architecture`'s tables."""

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    attention: str
    mlp: str = "swiglu"
    moe: Optional[str] = None
    norm: str = "rmsnorm"
    positions: str = "rope"
    qk_norm: bool = False
    fields: tuple = ()
    source: str = ""


def _gqa_fields(head_dim=_head_dim, kv=REQUIRED, tie=False) -> tuple:
    return (
        ("hidden_size", "hidden_size", REQUIRED),
        ("num_attention_heads", "num_attention_heads", REQUIRED),
        ("num_key_value_heads", "num_key_value_heads", kv),
        ("head_dim", "head_dim", head_dim),
        ("num_hidden_layers", "num_hidden_layers", REQUIRED),
        ("vocab_size", "vocab_size", REQUIRED),
        ("tie_word_embeddings", "tie_word_embeddings", tie),
    )


def _moe_fields(experts: str, width: str) -> tuple:
    return (("n_routed_experts", experts, REQUIRED), ("moe_intermediate_size", width, REQUIRED),
            ("num_experts_per_tok", "num_experts_per_tok", REQUIRED))


_ATTENTION_BIAS = (("qkv_bias", "attention_bias", False), ("o_bias", "attention_bias", False))
_SILU = (("hidden_act", "hidden_act", "silu"),)

#: every architecture memlib reads, in the order :func:`family_of` tries them
FAMILIES: tuple[Family, ...] = (
    Family("deepseek", ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"), ("deepseek_v3", "deepseek_v2", "kimi_k2"),
           "mla", "swiglu", "deepseek",
           source="transformers DeepseekV3/V2 (MLA, shared + routed experts, group-limited routing); configs "
                  "that reuse them (Kimi-K2, Moonlight); read by _deepseek_from_dict"),
    Family("llama", ("LlamaForCausalLM",), ("llama",), "gqa", "swiglu",
           fields=_gqa_fields() + (("intermediate_size", "intermediate_size", REQUIRED),) + _ATTENTION_BIAS
           + (("mlp_bias", "mlp_bias", False),) + _SILU,
           source="transformers LlamaForCausalLM: GQA (attention_bias on q, k, v, o), SwiGLU (mlp_bias), RMSNorm"),
    Family("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), "gqa", "swiglu", qk_norm=True,
           fields=_gqa_fields(head_dim=128) + (("intermediate_size", "intermediate_size", REQUIRED),) + _ATTENTION_BIAS
           + _SILU,
           source="transformers Qwen3ForCausalLM: GQA with q/k RMSNorms over head_dim (Qwen3Config's head_dim "
                  "default is 128)"),
    Family("mixtral", ("MixtralForCausalLM",), ("mixtral",), "gqa", "swiglu", "mixtral",
           fields=_gqa_fields() + _moe_fields("num_local_experts", "intermediate_size") + _SILU
           + (("norm_topk_prob", None, True),),
           source="transformers MixtralForCausalLM: GQA without biases, top-k of N experts of width "
                  "intermediate_size, no shared expert"),
    Family("qwen2_moe", ("Qwen2MoeForCausalLM",), ("qwen2_moe",), "gqa", "swiglu", "qwen2_moe",
           fields=_gqa_fields() + _moe_fields("num_experts", "moe_intermediate_size")
           + (("shared_expert_intermediate_size", "shared_expert_intermediate_size", REQUIRED),
              ("qkv_bias", "qkv_bias", True), ("intermediate_size", "intermediate_size", None),
              ("norm_topk_prob", "norm_topk_prob", False)) + _SILU,
           source="transformers Qwen2MoeForCausalLM: GQA with q, k, v biases (qkv_bias), routed experts and one "
                  "shared expert of width shared_expert_intermediate_size behind a sigmoid gate; norm_topk_prob (default "
                  "false) renormalises the top-k probabilities"),
    Family("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), "gqa", "swiglu", "qwen3_moe", qk_norm=True,
           fields=_gqa_fields() + _moe_fields("num_experts", "moe_intermediate_size") + _ATTENTION_BIAS
           + (("intermediate_size", "intermediate_size", None), ("norm_topk_prob", "norm_topk_prob", False)) + _SILU,
           source="transformers Qwen3MoeForCausalLM: GQA with q/k RMSNorms, routed experts, no shared expert; "
                  "norm_topk_prob (default false) renormalises the top-k probabilities"),
    Family("gpt", ("GPTForCausalLM",), ("gpt",), "gqa", "gelu", None, "layernorm", "learned",
           fields=_gqa_fields(kv=lambda kw: kw["num_attention_heads"], tie=True)
           + (("intermediate_size", "intermediate_size", lambda kw: 4 * kw["hidden_size"]),
              ("max_position_embeddings", "max_position_embeddings", REQUIRED),
              ("qkv_bias", "attention_bias", True), ("o_bias", "attention_bias", True), ("mlp_bias", "mlp_bias", True),
              ("hidden_act", "hidden_act", "gelu")),
           source="memlib's convention for Megatron's classic GPT (model_type gpt): LayerNorm with bias, "
                  "GeLU MLP of width intermediate_size (default 4 hidden_size; hidden_act, default gelu), biases on every Linear "
                  "(attention_bias, mlp_bias, default true), learned absolute positions "
                  "(max_position_embeddings, required), tied embeddings by default (Megatron's "
                  "share_embeddings_and_output_weights); num_key_value_heads defaults to num_attention_heads"),
    Family("gpt2", ("GPT2LMHeadModel",), ("gpt2",), "gqa", "gelu", None, "layernorm", "learned",
           fields=(("hidden_size", "n_embd", REQUIRED), ("num_attention_heads", "n_head", REQUIRED),
                   ("num_key_value_heads", None, lambda kw: kw["num_attention_heads"]),
                   ("head_dim", None, _head_dim), ("num_hidden_layers", "n_layer", REQUIRED),
                   ("vocab_size", "vocab_size", REQUIRED), ("tie_word_embeddings", "tie_word_embeddings", True),
                   ("intermediate_size", "n_inner", lambda kw: 4 * kw["hidden_size"]),
                   ("max_position_embeddings", "n_positions", REQUIRED),
                   ("qkv_bias", None, True), ("o_bias", None, True), ("mlp_bias", None, True),
                   ("hidden_act", "activation_function", "gelu_new")),
           source="transformers GPT2LMHeadModel: the same blocks as the classic GPT under GPT-2's field names "
                  "(activation_function, default gelu_new)"),
)

_INT_NULLABLE = {"intermediate_size"}
_BOOL_FIELDS = {"tie_word_embeddings", "qkv_bias", "o_bias", "mlp_bias", "norm_topk_prob"}
_STR_FIELDS = {"hidden_act"}


def family_of(d: Mapping, name: str = "custom") -> Family:
    """The :data:`FAMILIES` entry for a config.json: by its first ``architectures`` entry, else by its
    ``model_type``; a config with neither is DeepSeek's (memlib's original input)."""
    archs = d.get("architectures")
    mtype = d.get("model_type")
    if archs is not None and (not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs)):
        raise ConfigError(f"architectures={show(archs)} must be a non-empty list of class names")
    if mtype is not None and not isinstance(mtype, str):
        raise ConfigError(f"model_type={show(mtype)} must be a string")
    if archs:
        for f in FAMILIES:
            if archs[0] in f.architectures:
                return f
    if mtype is not None:
        for f in FAMILIES:
            if mtype in f.model_types:
                return f
    if archs is None and mtype is None:
        return FAMILIES[0]
    known = ", ".join(a for f in FAMILIES for a in f.architectures)
    what = f"architectures={show(archs, 80)}" if archs else f"model_type={show(mtype)}"
    raise ConfigError(f"{what} of model config {name} is not an architecture memlib knows ({known})")


def _read_family(fam: Family, d: Mapping, name: str, source: str) -> ModelConfig:
    """A non-DeepSeek config.json read by its family's field table, every value validated."""
    missing = [hf for _, hf, default in fam.fields if default is REQUIRED and hf not in d]
    if missing:
        raise ConfigError(f"model config {name} ({fam.name}) is missing required field(s): {', '.join(missing)}")
    kw: dict = {}
    for field, hf, default in fam.fields:
        x = d.get(hf) if hf is not None else None
        if x is None:
            if hf is not None and hf in d and default is REQUIRED:
                raise ConfigError(f"{hf}=None must be a positive integer ({fam.name})")
            x = default(kw) if callable(default) else default
        if field in _BOOL_FIELDS:
            if not isinstance(x, bool):
                raise ConfigError(f"{hf}={show(x)} must be true or false")
        elif field in _STR_FIELDS:
            if not isinstance(x, str) or not x:
                raise ConfigError(f"{hf}={show(x)} must be the name of an activation function (a string)")
        elif x is not None or field not in _INT_NULLABLE:
            x = check_count(hf or field, x, bound=LIMITS.get(field, LIMITS["width"]))
        kw[field] = x
    h, n_h, n_kv = kw["hidden_size"], kw["num_attention_heads"], kw["num_key_value_heads"]
    if n_h % n_kv:
        raise ConfigError(f"num_key_value_heads={n_kv} must divide num_attention_heads={n_h} (each key-value "
                          f"head serves a group of query heads)")
    l = kw["num_hidden_layers"]
    if fam.moe is not None:
        if kw["num_experts_per_tok"] > kw["n_routed_experts"]:
            raise ConfigError(f"num_experts_per_tok={kw['num_experts_per_tok']} must not exceed the "
                              f"{kw['n_routed_experts']} experts")
        step, only = _or_default(d, "decoder_sparse_step", 1), d.get("mlp_only_layers", [])
        check_count("decoder_sparse_step", step, bound=LIMITS["num_hidden_layers"])
        if step != 1:
            raise ConfigError(f"decoder_sparse_step={show(step)}: memlib reads MoE models whose every layer is "
                              f"sparse (decoder_sparse_step 1)")
        if only:
            raise ConfigError(f"mlp_only_layers={show(only)}: memlib reads MoE models whose every layer is sparse "
                              f"(mlp_only_layers empty)")
        first_dense = 0
    else:
        first_dense = l
    if fam.positions == "learned" and kw.get("max_position_embeddings") is None:  # pragma: no cover - table error
        raise ConfigError(f"max_position_embeddings is required for learned positions ({fam.name})")
    return ModelConfig(
        hidden_size=h, intermediate_size=kw.get("intermediate_size"),
        moe_intermediate_size=kw.get("moe_intermediate_size"), num_attention_heads=n_h,
        qk_nope_head_dim=None, qk_rope_head_dim=None, v_head_dim=None, q_lora_rank=None, kv_lora_rank=None,
        n_routed_experts=kw.get("n_routed_experts"), n_shared_experts=0,
        num_experts_per_tok=kw.get("num_experts_per_tok"), num_hidden_layers=l, first_k_dense_replace=first_dense,
        vocab_size=kw["vocab_size"], tie_word_embeddings=kw["tie_word_embeddings"],
        scoring_func="softmax", family=fam.name, attention=fam.attention, mlp=fam.mlp, moe=fam.moe, norm=fam.norm,
        positions=fam.positions, num_key_value_heads=n_kv, head_dim=kw["head_dim"], qk_norm=fam.qk_norm,
        qkv_bias=kw.get("qkv_bias", False), o_bias=kw.get("o_bias", False), mlp_bias=kw.get("mlp_bias", False),
        shared_expert_intermediate_size=kw.get("shared_expert_intermediate_size"),
        max_position_embeddings=kw.get("max_position_embeddings"), hidden_act=kw["hidden_act"],
        norm_topk_prob=kw.get("norm_topk_prob", True), name=name, source=source)


def preset_names() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


PRESETS = tuple(preset_names())


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for names the file system cannot hold (too long, a NUL byte)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


#: the largest config.json memlib reads (a real one is a few kilobytes)
MAX_CONFIG_BYTES = 2**20


def load_model(spec: str | Path | ModelConfig) -> ModelConfig:
    """A preset name (``deepseek-v3``) or a path to a Hugging Face ``config.json``."""
    if isinstance(spec, ModelConfig):
        return spec
    text = str(spec)
    preset = PRESET_DIR / f"{text.lower()}.json"
    if text and "/" not in text and _is_file(preset):
        path, name = preset, text.lower()
    else:
        path, name = Path(text), text
        if not _is_file(path):
            raise ConfigError(
                f"model={show(text, 300)} is neither a known preset ({', '.join(preset_names())}) nor a config.json file")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"model={show(text, 300)}: {path.stat().st_size:,} bytes is more than a config.json "
                              f"holds (at most {MAX_CONFIG_BYTES:,})")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"model={show(text, 300)}: the file is not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise ConfigError(f"model={show(text, 300)}: the JSON is nested too deeply to be a config.json") from None
    except (OSError, ValueError) as exc:   # json.JSONDecodeError, and ints past Python's digit limit
        detail = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        raise ConfigError(f"model={show(text, 300)}: cannot read it as JSON ({exc.__class__.__name__}: "
                          f"{show(detail, 120)[1:-1] if len(detail) > 120 else detail})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model={show(text, 300)}: the file must hold a JSON object")
    source = data.get("_source", str(path))
    return model_from_dict(data, name=name, source=source if isinstance(source, str) else str(path))
