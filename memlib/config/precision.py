"""Precision recipes: bytes per parameter of each model state, and per saved activation element.

A *recipe* is data: bytes per parameter for the stored weights, for the gradients and for each optimizer
state (master copy, moments), the bytes of a saved activation and whether Linear inputs are cached in FP8.
:data:`RECIPES` holds the published presets; :func:`recipe` parses a ``precision`` value (a preset's name,
or a spec ``BASE:FIELD=BYTES,...`` that changes one) into a :class:`Recipe`, and
:attr:`memlib.config.TrainingConfig.recipe` is that parse of the configuration's ``precision``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from .checks import ConfigError, show

__all__ = ["Recipe", "RECIPES", "recipe", "DTYPE_BYTES", "OPTIMIZER_STATES", "SPEC_FIELDS", "MAX_SPEC_CHARS"]


@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of each model state."""

    name: str
    description: str
    weights: int                               #: stored (compute) copy of the weights
    gradients: int                             #: gradient (accumulation) buffer
    optimizer: tuple[tuple[str, int], ...]     #: (state, bytes) for master copy and moments
    source: str = ""
    activations: int = 2                       #: bytes per saved activation element (bf16/fp16)
    fp8_activations: bool = False              #: Linear inputs cached in FP8 (DeepSeek-V3 report §3.3)
    #: recompute modules the recipe drops by itself, whatever the recompute policy (DeepSeek-V3 caches
    #: the MoE SwiGLU input in FP8 and recomputes its output: ``moe_act``)
    recompute: frozenset = frozenset()
    #: Megatron-LM's FP8 compute (``--fp8-format``): Transformer Engine saves each Linear's input quantized,
    #: except where Megatron keeps the bf16 original (``set_save_original_input``: the attention output W^O
    #: takes, which the attention kernel keeps anyway); the E5M6 exceptions of DeepSeek-V3 stay in bf16
    fp8_keeps_exceptions: bool = False
    #: how the FP8 activations are scaled (memlib.ledgers.base.FP8_SCALINGS): ``tile`` (1x128, fp32 scales)
    fp8_scaling: str = "tile"

    @property
    def optimizer_bytes(self) -> int:
        return sum(b for _, b in self.optimizer)

    @property
    def total_bytes(self) -> int:
        return self.weights + self.gradients + self.optimizer_bytes


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("paper", "bf16 weights, fp32 gradients, fp32 master weights, bf16 AdamW moments",
           2, 4, (("master_weights", 4), ("exp_avg", 2), ("exp_avg_sq", 2)),
           "arXiv 2502.07846 Table 7; the DeepSeek-V3 report (arXiv 2412.19437) §3.3"),
    Recipe("megatron", "bf16 weights, fp32 main gradients, fp32 master weights and AdamW moments",
           2, 4, (("master_weights", 4), ("exp_avg", 4), ("exp_avg_sq", 4)),
           "Megatron-LM distributed optimizer table: 18 bytes, or 6 + 12/d"),
    Recipe("fp16-mixed", "fp16 weights and gradients, fp32 master weights and Adam moments (the ZeRO paper's K = 12)",
           2, 2, (("master_weights", 4), ("exp_avg", 4), ("exp_avg_sq", 4)),
           "ZeRO paper (arXiv 1910.02054) §3.1: 2 + 2 + K with K = 12"),
    Recipe("megatron-fp16", "fp16 weights and gradients, fp32 main gradients, master weights and moments",
           2, 2, (("master_weights", 4), ("main_grad", 4), ("exp_avg", 4), ("exp_avg_sq", 4)),
           "Megatron-LM distributed optimizer table: 20 bytes, or 4 + 16/d"),
    Recipe("fp32", "fp32 weights, gradients and Adam moments (no master copy)",
           4, 4, (("exp_avg", 4), ("exp_avg_sq", 4)),
           "Megatron-LM distributed optimizer table: 16 bytes, or 8 + 8/d", activations=4),
    Recipe("deepseek-v3", "bf16 weights, fp32 gradients and master weights, bf16 AdamW moments, "
           "Linear inputs cached in FP8",
           2, 4, (("master_weights", 4), ("exp_avg", 2), ("exp_avg_sq", 2)),
           "the DeepSeek-V3 report (arXiv 2412.19437) §3.2.3 and §3.3", fp8_activations=True,
           recompute=frozenset({"moe_act"})),
    Recipe("megatron-fp8-param", "fp8 weights (--fp8-param-gather), fp32 main gradients, fp32 master "
           "weights and AdamW moments",
           1, 4, (("master_weights", 4), ("exp_avg", 4), ("exp_avg_sq", 4)),
           "Megatron-Core --fp8-param-gather: the bf16 weight copy is replaced by an fp8 one"),
)}


#: bytes per element of the dtype names a recipe spec may use
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int16": 2, "fp8": 1}
#: the optimizer states a recipe spec may set (bytes per parameter; 0 removes one)
OPTIMIZER_STATES = ("master_weights", "main_grad", "exp_avg", "exp_avg_sq")
#: what a recipe spec may set, with the byte counts each accepts
SPEC_FIELDS = {"weights": (1, 2, 4), "gradients": (2, 4), "activations": (2, 4),
               **{name: (0, 1, 2, 4) for name in OPTIMIZER_STATES}}
MAX_SPEC_CHARS = 200


def recipe(name: str) -> Recipe:
    """The recipe called ``name``: a preset of :data:`RECIPES`, or a *spec* that changes one.

    A spec is ``BASE:FIELD=BYTES,FIELD=BYTES,...``: the preset ``BASE`` with each named field set to a
    byte count or a dtype (``fp32`` 4, ``bf16`` and ``fp16`` 2, ``int16`` 2, ``fp8`` 1).  The fields are
    ``weights``, ``gradients``, ``activations`` and the optimizer states ``master_weights``,
    ``main_grad``, ``exp_avg`` and ``exp_avg_sq`` (0 removes a state; one the preset lacks is added).
    The recipe's name is the spec written canonically (byte counts, in the order given), so that
    ``recipe(r.name) == r``.

    >>> r = recipe("megatron:gradients=bf16,exp_avg=2,exp_avg_sq=2")
    >>> r.name, r.weights, r.gradients, r.optimizer
    ('megatron:gradients=2,exp_avg=2,exp_avg_sq=2', 2, 2, (('master_weights', 4), ('exp_avg', 2), ('exp_avg_sq', 2)))
    """
    if isinstance(name, str) and name in RECIPES:
        return RECIPES[name]
    if isinstance(name, str) and ":" in name:
        return _spec_recipe(name)
    raise ConfigError(f"precision={show(name)} must be one of {', '.join(RECIPES)}, or a spec "
                      f"BASE:FIELD=BYTES,... (e.g. megatron:exp_avg=bf16,exp_avg_sq=bf16)")


def _spec_value(text: str, field: str, value: str) -> int:
    allowed = SPEC_FIELDS[field]
    v = value.strip()
    if v in DTYPE_BYTES:
        n = DTYPE_BYTES[v]
    elif v and len(v) <= 2 and all("0" <= c <= "9" for c in v):
        n = int(v)
    else:
        n = None
    if n not in allowed:
        shown = show(v)[1:-1] if v else "''"
        raise ConfigError(f"precision={show(text, 120)}: {field}={shown} must be "
                          f"{', '.join(map(str, allowed))} bytes or a dtype of that size "
                          f"({', '.join(f'{d} {b}' for d, b in DTYPE_BYTES.items() if b in allowed)})")
    return n


@lru_cache(maxsize=256)
def _spec_recipe(text: str) -> Recipe:
    if len(text) > MAX_SPEC_CHARS:
        raise ConfigError(f"precision={show(text)} is longer than {MAX_SPEC_CHARS} characters, more than a "
                          f"recipe spec needs")
    base_name, _, body = text.partition(":")
    base_name = base_name.strip()
    if base_name not in RECIPES:
        raise ConfigError(f"precision={show(text, 120)}: the base {show(base_name)} must be one of "
                          f"{', '.join(RECIPES)}")
    base = RECIPES[base_name]
    changes: dict[str, int] = {}
    for item in body.split(","):
        field, eq, value = item.partition("=")
        field = field.strip()
        if not eq or field not in SPEC_FIELDS:
            raise ConfigError(f"precision={show(text, 120)}: {show(item.strip())} must be FIELD=BYTES with FIELD "
                              f"one of {', '.join(SPEC_FIELDS)}")
        if field in changes:
            raise ConfigError(f"precision={show(text, 120)}: {field} is set twice")
        changes[field] = _spec_value(text, field, value)
    optimizer = dict(base.optimizer)
    for field in OPTIMIZER_STATES:
        if field in changes:
            optimizer[field] = changes[field]
    optimizer = tuple((k, b) for k, b in optimizer.items() if b)
    name = f"{base_name}:" + ",".join(f"{k}={b}" for k, b in changes.items())
    return replace(base, name=name,
                   description=f"{base.description}; changed: " + ", ".join(f"{k} {b} bytes" for k, b in changes.items()),
                   weights=changes.get("weights", base.weights), gradients=changes.get("gradients", base.gradients),
                   activations=changes.get("activations", base.activations), optimizer=optimizer,
                   source=f"{base.source} (the {base_name} preset, changed by the spec)")
