"""Activations: a ledger of the tensors each layer saves for its backward pass.

Every :class:`Saved` entry names one tensor ("softmax output", "c^KV latent", ...) with a symbolic
element count per micro-batch, a dtype, the parallel dimensions that divide it and the recompute
modules that drop it.  A layer's activation memory is the sum of its entries; a recompute policy
is a filter on the entries; an implementation is a *profile*, a ledger variant:

``paper``
    arXiv 2502.07846 §5, term by term (MLA: 4bsh + 2bs(d_c'+d_c) + 4bs(d_h+d_h^R)n_h + 2bs d_h n_h
    + 5bn_h s^2 + 2bs d_h n_h + bsh; the MoE formula with E_token = bsN_r/N).  Dense layers, the
    embedding and the head, which the paper does not analyse, follow the same conventions.
``megatron``
    Megatron-Core with Transformer Engine.

The profiles themselves live in :mod:`memlib.ledgers.paper`; this module holds the machinery.

Parallel divisors: ``TP`` (split by tensor parallelism), ``SP`` (split over the TP ranks when
sequence parallelism is on), ``CP`` (split by context parallelism: every token-indexed tensor),
``ETP`` (an expert's width split by expert tensor parallelism), ``EP`` (the paper's count of routed
tokens, spread over the expert-parallel ranks).  ``TP`` and ``ETP`` split a tensor's *width* (its
features, the contiguous last dimension); the others split its *rows* (tokens).

Whole bytes.  A device holds whole tensors: every entry's bytes on one device are an integer by
construction, never a fraction rounded at display time.

* Rows that are an *expected* count (``mean_rows``: the paper's routed tokens, b s N_r / EP under
  balanced routing) are rounded **up** to whole rows, the least that the busiest rank holds.
* FP8-cached Linear inputs (the ``deepseek-v3`` recipe) take one byte per element plus one fp32
  scale per 1x128 tile of each row: ⌈width/128⌉ scales per row, so a width that is not a multiple
  of 128 pays for its last, partial tile.  The E5M6 exception takes 12 bits per element, rounded
  up to whole bytes over the tensor.
* Every other division is exact because the configuration rules make it so (TP divides the heads
  and widths it splits, CP and SP divide the sequence, ETP the expert width).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

import sympy as sp

from ..core.breakdown import Breakdown
from ..config import LIMITS, ConfigError, ModelConfig, TrainingConfig, parse_count, show
from ..config.precision import Recipe
from ..core.symbols import CP, EP, ETP, TP, b, s

__all__ = [
    "Saved", "MODULES", "POLICIES", "Policy", "parse_policy", "entry_bytes", "ledger_bytes",
    "training_values", "DTYPE_BYTES", "saved", "renamed", "element_bytes", "fp8_cached", "WIDTH_DIVISORS",
    "DIVISORS", "FP8_TILE", "ActProfile",
]


#: bytes per element of the fixed dtypes; ``act`` is the recipe's activation dtype
DTYPE_BYTES = {"mask": 1, "int64": 8, "int32": 4, "fp32": 4}

#: recompute modules (Megatron-Core's --recompute-modules names)
MODULES = {
    "core_attn": "the attention core: scores, softmax, dropout (Korthikanti's selective recompute)",
    "layernorm": "RMSNorm outputs, recomputed from their inputs",
    "mla_up_proj": "MLA up-projection outputs (queries, keys, values), recomputed from the latents",
    "mlp": "the dense FFN's internals",
    "moe_act": "the experts' activation-function outputs",
    "moe": "the MoE block's internals (router, dispatch, experts)",
    "shared_experts": "the shared experts' internals",
}


@dataclass(frozen=True)
class Saved:
    """One tensor saved for backward."""

    key: str                          #: unique within its ledger, e.g. ``"attention.softmax_out"``
    name: str                         #: what it is, in words
    elements: sp.Expr                 #: elements per micro-batch before any parallel split
    dtype: str = "act"                #: ``act`` (the recipe's), ``mask``, ``fp32``, ``int64``, ``int32``
    shard: frozenset = frozenset()    #: divisors among TP, SP, CP, ETP
    modules: frozenset = frozenset()  #: recompute modules that drop it
    keep_full: bool = False           #: kept under full recomputation (a checkpointed input)
    linear_input: bool = False        #: input of a Linear: cached in FP8 by an fp8 recipe
    fp8_exception: str = ""           #: format used instead of FP8 (e.g. ``E5M6``), if any
    note: str = ""                    #: where the term comes from, or what is uncertain
    #: saved only when one of these is recomputed (module names, or ``"full"`` for a fully recomputed
    #: layer): the inputs a checkpoint keeps that nothing keeps otherwise; empty: always saved
    only_when: frozenset = frozenset()
    #: features per row (the contiguous last dimension) before any split; ``elements / width`` rows.
    #: Required for a Linear input (FP8 tiles run along it) and for ``mean_rows``
    width: sp.Expr | None = None
    mean_rows: bool = False           #: rows are an expected count: a device holds the ceiling
    #: autograd nodes that save this same tensor: one storage on the GPU, but saved-tensor hooks see each save, so
    #: fine-grained activation offloading copies it to the host and back once per save (memlib.device.peak)
    saves: int = 1

    @property
    def block(self) -> str:
        return self.key.split(".")[0]


#: divisors that split a tensor's width (features); the others split its rows (tokens)
WIDTH_DIVISORS = frozenset({"TP", "ETP"})
DIVISORS = frozenset({"TP", "SP", "CP", "ETP", "EP"})


def saved(key, name, elements, dtype="act", shard=(), modules=(), *, width=None, **kw) -> Saved:
    """Shorthand constructor of a :class:`Saved` entry (checks that it can be counted in whole bytes)."""
    if "only_when" in kw:
        kw["only_when"] = frozenset(kw["only_when"])
    e = Saved(key, name, sp.sympify(elements), dtype, frozenset(shard), frozenset(modules),
              width=None if width is None else sp.sympify(width), **kw)
    unknown = e.shard - DIVISORS
    if unknown:
        raise ValueError(f"{key}: unknown divisor(s) {sorted(unknown)}")
    if (e.linear_input or e.mean_rows) and e.width is None:
        raise ValueError(f"{key}: a Linear input or an expected row count needs its width")
    return e


def renamed(e: Saved, key: str) -> Saved:
    """``e`` under another key (e.g. prefixed with ``mtp.``)."""
    return replace(e, key=key)


# ------------------------------------------------------------------------------------------------
# recompute policies
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    """What is recomputed: a set of modules, or full recomputation of (some) layers."""

    name: str
    modules: frozenset = frozenset()
    full: bool = False
    block_layers: int | None = None   #: full-block:K, only the first K layers of each chunk

    def drops(self, e: Saved) -> bool:
        """Whether ``e`` is dropped (recomputed) in a layer this policy recomputes; an entry that only a
        checkpoint keeps (``only_when``) is dropped unless this policy recomputes what it checkpoints."""
        if e.only_when:
            return not (e.only_when & ({"full"} if self.full else self.modules))
        if self.full:
            return not e.keep_full
        return bool(e.modules & self.modules)


#: the named recompute policies, weakest first.  A stronger one drops more, so the held activations never rise
#: with it except by what its checkpoints keep that nothing else keeps: under the megatron profile core_attn
#: recomputation keeps the dataset's [b, 1, s, s] attention mask for the re-run, one per micro-batch in flight
#: (a large share of a tiny model's activations, where little else is dropped), by design.  The peak
#: (``peak_allocated``) can rise with a stronger policy more: it re-runs a layer's forward while the backward's
#: gradients are alive (the dropped entries saved again, the MoE's token copies, the frames' hidden states),
#: measured on Megatron-Core (tests/device/test_peak_cpu.py, POLICY_PAIRS; the property in tests/device/test_peak.py)
POLICIES = {
    "none": Policy("none"),
    "selective": Policy("selective", frozenset({"core_attn"})),
    "deepseek": Policy("deepseek", frozenset({"layernorm", "mla_up_proj"})),
    "full": Policy("full", full=True),
}


def parse_policy(text: str) -> Policy:
    """``none``, ``selective``, ``deepseek``, ``full``, ``full-block:K`` or a comma list of modules.

    >>> parse_policy("core_attn,layernorm").modules == {"core_attn", "layernorm"}
    True
    """
    t = text.strip()
    if t in POLICIES:
        return POLICIES[t]
    if t.startswith("full-block:"):
        k = t.split(":", 1)[1]
        try:
            n = parse_count("K", k, bound=LIMITS["num_hidden_layers"])
        except ConfigError:
            raise ConfigError(f"recompute={show(text)}: full-block:K needs a positive integer K of ASCII digits, "
                              f"at most {LIMITS['num_hidden_layers']:,}") from None
        return Policy(f"full-block:{n}", full=True, block_layers=n)
    mods = [m.strip() for m in t.split(",") if m.strip()]
    unknown = [m for m in mods if m not in MODULES]
    if unknown or not mods:
        raise ConfigError(
            f"recompute={show(text)} must be one of {', '.join(POLICIES)}, full-block:K, or a comma list of "
            f"modules from {', '.join(MODULES)}")
    return Policy(",".join(mods), frozenset(mods))


# ------------------------------------------------------------------------------------------------
# bytes of an entry
# ------------------------------------------------------------------------------------------------
#: FP8 tile: one fp32 scale per 128 consecutive elements of a row (DeepSeek-V3 report §3.3)
FP8_TILE = 128
FP8_SCALE_BYTES = 4

#: FP8 scaling granularity -> (elements per scale along a row, bytes per scale); 0: one scale per tensor
#: (a few bytes, not counted).  ``tile``: DeepSeek-V3's 1x128 fp32 tiles (report §3.3) and Megatron's
#: blockwise recipe; ``mx``: MXFP8, one E8M0 byte per 32 elements; ``tensor``: Megatron's delayed and
#: tensorwise recipes
FP8_SCALINGS = {"tile": (FP8_TILE, FP8_SCALE_BYTES), "mx": (32, 1), "tensor": (0, 0)}


def fp8_scaling(recipe: Recipe) -> tuple[int, int]:
    return FP8_SCALINGS[recipe.fp8_scaling]


def fp8_cached(e: Saved, recipe: Recipe | None) -> bool:
    """Whether ``e`` is cached in FP8 (or the E5M6 exception) under ``recipe``."""
    return (recipe is not None and recipe.fp8_activations and e.linear_input and e.dtype == "act"
            and not (recipe.fp8_keeps_exceptions and e.fp8_exception))


def element_bytes(e: Saved, recipe: Recipe | None) -> sp.Expr:
    """Bytes per element of ``e`` as stored, scale factors included (a Rational for FP8 and E5M6,
    exact when the width is a multiple of 128; :func:`entry_bytes` counts whole tiles)."""
    if e.dtype != "act":
        return sp.Integer(DTYPE_BYTES[e.dtype])
    if fp8_cached(e, recipe):
        if e.fp8_exception == "E5M6":
            return sp.Rational(3, 2)          # 12 bits per element
        tile, scale = fp8_scaling(recipe)
        return sp.Integer(1) + (sp.Rational(scale, tile) if tile else 0)
    return sp.Integer(2 if recipe is None else recipe.activations)


def _divisor(d: str, train: TrainingConfig | None) -> sp.Expr:
    if d == "SP":
        return TP if train is None or train.sp else sp.Integer(1)
    return {"TP": TP, "CP": CP, "ETP": ETP, "EP": EP}[d]


def entry_bytes(e: Saved, train: TrainingConfig | None = None, recipe: Recipe | None = None) -> sp.Expr:
    """Bytes of ``e`` on one device, symbolic in the model, b, s and the parallel sizes; an integer
    for every valid configuration (see the module docstring on whole bytes).

    ``SP`` divides by TP only when ``train.sp`` (sequence parallelism) is on."""
    if e.width is None:
        div = sp.Mul(*(_divisor(d, train) for d in e.shard))
        return e.elements * element_bytes(e, recipe) / div
    rows = e.elements / e.width          # a product over a factor of it: SymPy cancels it
    rows_dev = rows / sp.Mul(*(_divisor(d, train) for d in e.shard - WIDTH_DIVISORS))
    if e.mean_rows:
        rows_dev = sp.ceiling(rows_dev)
    width_dev = e.width / sp.Mul(*(_divisor(d, train) for d in e.shard & WIDTH_DIVISORS))
    if fp8_cached(e, recipe):
        if e.fp8_exception == "E5M6":
            return sp.ceiling(rows_dev * width_dev * sp.Rational(3, 2))
        tile, scale = fp8_scaling(recipe)
        return rows_dev * (width_dev + (scale * sp.ceiling(width_dev / tile) if tile else 0))
    return rows_dev * width_dev * element_bytes(e, recipe)


def ledger_bytes(entries: Iterable[Saved], train: TrainingConfig | None = None, recipe: Recipe | None = None,
                 policy: Policy | None = None) -> Breakdown:
    """Bytes per entry (dropped entries omitted), keyed by entry key.  Without a policy nothing is
    recomputed: entries that only a checkpoint keeps are omitted too."""
    return Breakdown([(e.key, entry_bytes(e, train, recipe)) for e in entries
                      if not (e.only_when if policy is None else policy.drops(e))])


def training_values(train: TrainingConfig) -> dict:
    """Substitution for b and s."""
    return {b: train.micro_batch, s: train.seq_len}


@dataclass(frozen=True)
class ActProfile:
    """A ledger variant: what an implementation saves."""

    name: str
    description: str
    layer: Callable[[ModelConfig, str], list[Saved]]
    embedding: Callable[[ModelConfig], list[Saved]]
    head: Callable[[ModelConfig], list[Saved]]
    mtp: Callable[[ModelConfig, int], list[Saved]]
    modules: frozenset = field(default_factory=lambda: frozenset(MODULES))
    #: parallel axes the implementation does not have (their size must be 1), e.g. transformers has
    #: no tensor, context or expert parallelism
    no_parallel: tuple[str, ...] = ()
    #: the profile for a training configuration's kernel choices (``None``: it has none)
    bind: Callable[[TrainingConfig], "ActProfile"] | None = None
    #: what a bound profile depends on (hashable): two profiles with the same name and key keep the same
    #: entries, so their byte counts can be cached
    key: tuple = ()
