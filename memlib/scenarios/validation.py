"""Validation (chapter 10): memlib's ledgers against implementations that train, for any model.

Three kinds of evidence, each an exact comparison:

* **Parameters** (:func:`parameter_checks`): the model, and every shipped preset, built at full size
  by Hugging Face ``transformers`` on the ``meta`` device (:func:`memlib.measure.hf.param_check`).
* **Saved activations, measured on the CPU**, on the model *in miniature* (:func:`miniature`: the
  model's structure with small widths): against the ``hf-eager`` ledger with ``transformers``
  (:func:`hf_comparisons`, :mod:`memlib.measure.hf`) and against the ``megatron`` ledger's local path
  with Megatron-Core's own modules (:func:`megatron_comparisons`, :mod:`memlib.measure.megatron`);
  and a few random small configurations (:func:`random_check`).
* **One layer of the model at full size**, evaluated from the ledgers those measurements hold
  exact: the paper's ledger beside ``hf-eager`` (:func:`layer_groups`), and the three
  implementations side by side (:func:`ground_truths`, :func:`megatron_layer_entries`), the
  Transformer Engine path read from its kernels' sources.

The GPU run of ``benchmarks/gpu_validation.py`` is data (:func:`gpu_run`): its configurations are
:data:`GPU_CONFIGS`, and memlib's weights of each give the lower bounds that relate what the caching
allocator reserved to what was allocated.

Nothing here formats: every value is an exact integer, a :class:`~fractions.Fraction`, a boolean or
a name.  The measurements need the ``measure`` extra (torch, transformers) and megatron-core.

>>> m = miniature("deepseek-v2-lite")
>>> (m.hidden_size, m.q_lora_rank, m.n_shared_experts, m.layer_kinds)
(32, None, 2, ('dense', 'moe'))
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from fractions import Fraction
from functools import lru_cache
from importlib import resources
from math import ceil
from pathlib import Path

from ..ledgers.base import entry_bytes, ledger_bytes, training_values
from ..config import PAPER_TRAINING, ConfigError, ModelConfig, TrainingConfig, load_model, model_from_dict
from ..config.versions import MCORE_VERSION
from ..model.profiles import act_profile
from ..model.params import values as param_values
from ..model.partition import parallel_values

__all__ = ["MINIATURE", "miniature", "HF_CASES", "hf_cases", "hf_comparisons", "hf_summary", "MEGATRON_CASES",
           "megatron_cases", "megatron_comparisons", "megatron_summary", "measure_all", "COLUMNS", "by_group",
           "TE_SOURCES", "RANDOM_CONFIGS", "RANDOM_SEED",
           "random_check", "parameter_checks", "versions", "analysed_kind", "GROUPS", "entry_group", "layer_entries",
           "layer_groups", "longer_sequence", "largest_difference", "SIDE_GROUPS", "megatron_group", "ground_truths",
           "megatron_layer_entries", "kernel_differences", "GPU_RESULT", "GPU_CONFIGS",
           "GPU_TABLE_SYMBOLS", "gpu_model", "gpu_run", "gpu_shared", "widths_of", "WIDTH_FIELDS", "ATTENTION_GROUP",
           "group_name"]

# ------------------------------------------------------------------------------------------------
# the model in miniature
# ------------------------------------------------------------------------------------------------
#: the widths of the miniature (small, and multiples of 8 where transformers' grouped_mm experts need
#: 16-byte strides in bf16); q_lora_rank only where the model compresses its queries
MINIATURE = {"hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_attention_heads": 4,
             "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "q_lora_rank": 16, "kv_lora_rank": 12,
             "vocab_size": 64}


def miniature(model: ModelConfig | str) -> ModelConfig:
    """``model`` in miniature: its structure with the small widths of :data:`MINIATURE`.

    Kept from the model: query compression or none, the number of shared experts, the experts per
    token, group-limited routing (groups and groups per token), the router's score function and
    bias, a tied head, MTP (at most one module); one dense layer if the model has any, then one MoE
    layer if it has any.  The routed experts are the fewest multiple of the groups that holds twice
    the experts per token (and the experts per token within the groups a token may use), never more
    than the model has."""
    m = load_model(model)
    if m.family != "deepseek":
        return _family_miniature(m)
    per_group = max(ceil(Fraction(2 * m.num_experts_per_tok, m.n_group)),
                    ceil(Fraction(m.num_experts_per_tok, m.topk_group)))
    experts = min(m.n_routed_experts, m.n_group * per_group)
    dense = 1 if m.first_k_dense_replace else 0
    moe = 1 if "moe" in m.layer_kinds else 0
    d = {**MINIATURE, "q_lora_rank": MINIATURE["q_lora_rank"] if m.q_lora_rank is not None else None,
         "n_routed_experts": experts, "n_shared_experts": m.n_shared_experts,
         "num_experts_per_tok": m.num_experts_per_tok, "n_group": m.n_group, "topk_group": m.topk_group,
         "num_hidden_layers": max(dense + moe, 1), "first_k_dense_replace": dense if moe else max(dense, 1),
         "num_nextn_predict_layers": min(m.num_nextn_predict_layers, 1), "tie_word_embeddings": m.tie_word_embeddings,
         "scoring_func": m.scoring_func, "topk_method": "noaux_tc" if m.router_bias else "greedy",
         "model_type": "deepseek_v3" if m.router_bias else "deepseek_v2"}
    return model_from_dict(d, name=f"{m.name} in miniature")


def _family_miniature(m: ModelConfig) -> ModelConfig:
    """A model of another family in miniature, its own blocks kept (attention with or without fewer
    key-value heads, biases, head norms, the FFN and MoE kind, norm, positions, tied head): the widths
    of :data:`MINIATURE` (h, the FFN, the expert, 4 query heads of 8), 2 key-value heads where the model
    has fewer than query heads, the experts per token (at most 2) and twice as many experts (at most
    the model's), one decoder layer."""
    moe = m.has_moe
    n_r = min(m.num_experts_per_tok, 2) if moe else None
    heads = MINIATURE["num_attention_heads"]
    return replace(
        m, hidden_size=MINIATURE["hidden_size"], num_attention_heads=heads,
        num_key_value_heads=heads if m.num_key_value_heads == m.num_attention_heads else 2,
        head_dim=MINIATURE["qk_nope_head_dim"],
        intermediate_size=None if m.intermediate_size is None else MINIATURE["intermediate_size"],
        moe_intermediate_size=MINIATURE["moe_intermediate_size"] if moe else None,
        n_routed_experts=min(m.n_routed_experts, 2 * n_r) if moe else None, num_experts_per_tok=n_r,
        shared_expert_intermediate_size=None if m.shared_expert_intermediate_size is None
        else MINIATURE["moe_intermediate_size"],
        max_position_embeddings=None if m.max_position_embeddings is None else MINIATURE["vocab_size"],
        num_hidden_layers=1, first_k_dense_replace=0 if moe else 1, vocab_size=MINIATURE["vocab_size"],
        name=f"{m.name} in miniature")


# ------------------------------------------------------------------------------------------------
# hf-eager against transformers
# ------------------------------------------------------------------------------------------------
#: the cases measured against transformers: (label, changes to the miniature, b, s).  b = 1 and one
#: head are the cases where V stays a view of the kv_b_proj output (the ledger's Piecewise).
HF_CASES = (
    ("the miniature", {}, 2, 16),
    ("one sequence", {}, 1, 16),
    ("one head, wider values", {"num_attention_heads": 1, "v_head_dim": 24}, 3, 8),
)


#: a case's label for a model without MLA, whose one head has no separate value width
_GQA_LABELS = {"one head, wider values": "one wider head"}


def case_label(model: ModelConfig, label: str) -> str:
    """The label of the case ``label`` of :data:`HF_CASES` for ``model``: a grouped-query model's single head is
    wider as a whole (MLA's keeps its query and key widths and widens its values)."""
    return label if model.family == "deepseek" else _GQA_LABELS.get(label, label)


def _changed(m: ModelConfig, changes: dict, label: str) -> ModelConfig:
    if not changes:
        return m
    if m.family != "deepseek":
        # grouped-query attention: one query and one key-value head, as wide as the MLA case's values
        return replace(m, num_attention_heads=changes.get("num_attention_heads", m.num_attention_heads),
                       num_key_value_heads=changes.get("num_attention_heads", m.num_key_value_heads),
                       head_dim=changes.get("v_head_dim", m.head_dim), name=f"{m.name}, {label}")
    d = {**m.values(), "topk_method": "noaux_tc" if m.router_bias else "greedy", **changes}
    d.pop("router_bias"), d.pop("name")
    return model_from_dict(d, name=f"{m.name}, {label}")


def hf_cases(model: ModelConfig | str) -> list[tuple[str, ModelConfig, int, int]]:
    """(label, model, b, s) of each of :data:`HF_CASES` for ``model``'s miniature."""
    mini = miniature(model)
    return [(case_label(mini, label), _changed(mini, changes, case_label(mini, label)), b, s)
            for label, changes, b, s in HF_CASES]


@lru_cache(maxsize=None)
def hf_comparisons(model: ModelConfig) -> tuple[dict, ...]:
    """:func:`memlib.measure.hf.compare` (backward and one AdamW step included) of each case of
    :func:`hf_cases`, with its ``label``, ``config`` (the model measured) and ``kinds`` (layer kinds)."""
    from ..measure.hf import compare

    out = []
    for label, m, b, s in hf_cases(model):
        r = compare(m, b, s)
        out.append({**r, "label": label, "config": m, "kinds": m.layer_kinds})
    return tuple(out)


def hf_summary(results) -> dict:
    """How many configurations, regions, storages and bytes were compared, how many differ, and
    ``all_exact``."""
    regions = [x for r in results for x in r["regions"]]
    return {"configs": len(results), "exact_configs": sum(1 for r in results if r["exact"]),
            "regions": len(regions), "mismatched_regions": sum(1 for x in regions if x["difference"]),
            "storages": sum(len(r["storages"]) for r in results),
            "measured_bytes": sum(r["activations"]["measured"] for r in results),
            "max_abs_difference": max((abs(x["difference"]) for x in regions), default=0),
            "all_exact": all(r["exact"] for r in results)}


#: random small configurations the chapter measures (the test suite draws more, fresh on every run)
RANDOM_CONFIGS, RANDOM_SEED = 4, 0


@lru_cache(maxsize=None)
def random_check(n: int = RANDOM_CONFIGS, seed: int = RANDOM_SEED) -> dict:
    """``n`` random small configurations (:func:`memlib.measure.random_configs.random_config`) drawn from ``seed``,
    forward pass only: how many match the ``hf-eager`` ledger exactly."""
    from ..measure.hf import compare
    from ..measure.random_configs import random_config

    rng = random.Random(seed)
    exact = 0
    for i in range(n):
        m, b, s = random_config(rng)
        exact += compare(m, b, s, seed=i, step=False)["exact"]
    return {"configs": n, "exact": exact, "seed": seed, "all_exact": exact == n}


# ------------------------------------------------------------------------------------------------
# megatron (local) against Megatron-Core
# ------------------------------------------------------------------------------------------------
#: the cases measured against Megatron-Core on the CPU, all on the miniature with b = 2, s = 16:
#: (label, training options beside transformer_impl=local on one device)
MEGATRON_CASES = (
    ("no recomputation", {}),
    ("selective recomputation, fp32 softmax", {"recompute": "selective", "attention_softmax_in_fp32": True}),
    ("full recomputation, fp32", {"recompute": "full", "precision": "fp32"}),
)
_MEGATRON_B, _MEGATRON_S = 2, 16


def megatron_cases(model: ModelConfig | str) -> list[tuple[str, ModelConfig, TrainingConfig]]:
    """(label, model, training) of each of :data:`MEGATRON_CASES` for ``model``'s miniature."""
    mini = miniature(model)
    base = dict(dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", transformer_impl="local", precision="megatron",
                micro_batch=_MEGATRON_B, seq_len=_MEGATRON_S, runtime="cpu")
    return [(label, mini, TrainingConfig(**{**base, **kw})) for label, kw in MEGATRON_CASES]


@lru_cache(maxsize=None)
def megatron_comparisons(model: ModelConfig) -> tuple[dict, ...]:
    """:func:`memlib.measure.megatron_compare.compare` of each case of :func:`megatron_cases`, in one worker
    process, with its ``label``, ``config``, ``train`` and ``kinds``."""
    from ..measure.megatron_compare import compare_many

    cases = megatron_cases(model)
    results = compare_many([(m, t) for _, m, t in cases], step=True)
    return tuple({**r, "label": label, "config": m, "train": t, "kinds": m.layer_kinds}
                 for (label, m, t), r in zip(cases, results))


def megatron_summary(results) -> dict:
    """How many configurations, blocks and storages were compared against Megatron-Core, how many
    differ, the parameter and main_grad bytes, and ``all_exact``."""
    blocks = [x for r in results for x in r["blocks"]]
    return {"configs": len(results), "exact_configs": sum(1 for r in results if r["exact"]),
            "regions": sum(len(r["regions"]) for r in results), "blocks": len(blocks),
            "mismatched_blocks": sum(1 for x in blocks if x["difference"]),
            "storages": sum(len(r["storages"]) for r in results),
            "measured_bytes": sum(r["activations"]["measured"] for r in results),
            "parameter_bytes": sum(r["parameters"]["measured"] for r in results),
            "parameter_difference": sum(abs(r["parameters"]["difference"]) for r in results),
            "main_grad_bytes": sum(r["main_grad"]["measured"] for r in results),
            "main_grad_difference": sum(abs(r["main_grad"]["difference"]) for r in results),
            "all_exact": all(r["exact"] for r in results)}


def measure_all(model: ModelConfig) -> dict:
    """Every measurement of the chapter for ``model``: Megatron-Core's worker process runs while
    transformers measures in this one (both cached: the chapter's later calls read them)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        mc = pool.submit(megatron_comparisons, model)
        hf = hf_comparisons(model)
        rc = random_check()
        return {"hf": hf, "random": rc, "megatron": mc.result()}


# ------------------------------------------------------------------------------------------------
# parameters at full size, and the versions
# ------------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def parameter_checks(model: ModelConfig) -> tuple[dict, ...]:
    """:func:`memlib.measure.hf.param_check` of ``model`` and of every other DeepSeek preset the book compares, each at full
    size on the meta device, with ``difference`` (transformers − memlib), ``tensors_differing``,
    ``is_model`` and ``block_rows`` (per memlib block: memlib, transformers, difference)."""
    from ..measure.hf import param_check
    from .models import PRESET_ORDER     # the book's DeepSeek presets (the others: tests/model/test_architectures.py)

    names = [model] + [p for p in PRESET_ORDER if p != model.name]
    out = []
    for spec in names:
        r = param_check(spec)
        blocks = [{"block": k, **v, "difference": (v["transformers"] or 0) - (v["memlib"] or 0)}
                  for k, v in r["blocks"].items()]
        out.append({**r, "difference": r["total"]["transformers"] - r["total"]["memlib"],
                    "tensors_differing": sum(1 for t in r["tensors"] if not t["ok"]), "is_model": spec is model,
                    "block_rows": blocks})
    return tuple(out)


def versions() -> dict:
    """The installed torch, transformers and megatron-core, the versions the ledgers are pinned to,
    and whether each installed one is the pinned one."""
    from importlib.metadata import version

    import torch
    import transformers

    from ..ledgers.hf import HF_VERSIONS

    got = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
           "megatron_core": version("megatron-core")}
    pinned = {**HF_VERSIONS, "megatron_core": MCORE_VERSION}
    return {"installed": got, "pinned": pinned, "same": {k: got[k] == pinned[k] for k in pinned}}


# ------------------------------------------------------------------------------------------------
# one layer of the model: the paper's ledger beside hf-eager
# ------------------------------------------------------------------------------------------------
def analysed_kind(model: ModelConfig | str) -> str:
    """The layer the chapter dissects: a MoE layer, or a dense one for a model without any."""
    return "moe" if "moe" in load_model(model).layer_kinds else "dense"


#: the group of the attention's tensors other than its scores and norms (named for MLA; :func:`group_name`)
ATTENTION_GROUP = "MLA latents and projections"

#: entry groups of the paper-against-hf-eager view, in data-flow order
GROUPS = ("RMSNorms", ATTENTION_GROUP, "attention scores", "dropout masks", "router",
          "routed experts", "shared experts", "dense FFN")


def entry_group(key: str) -> str:
    """The group of a paper or hf-eager ledger entry key (one layer)."""
    part, _, rest = key.partition(".")
    if "norm" in rest and not rest.startswith(("routed", "shared")):
        return "RMSNorms"
    if "dropout_mask" in rest and "softmax" not in rest:
        return "dropout masks"
    if part == "attention":
        return "attention scores" if any(w in rest for w in ("softmax", "probs")) else ATTENTION_GROUP
    if part == "dense_ffn":
        return "dense FFN"
    if rest.startswith("routed"):
        return "routed experts"
    if rest.startswith("shared"):
        return "shared experts"
    return "router"


def _bs(b: int | None, s: int | None) -> tuple[int, int]:
    return (PAPER_TRAINING.micro_batch if b is None else b, PAPER_TRAINING.seq_len if s is None else s)


def layer_entries(model: ModelConfig | str, kind: str = "moe", profile: str = "hf-eager", b: int | None = None,
                  s: int | None = None) -> list[dict]:
    """The entries of one decoder layer on one device without parallelism: key, name, dtype, group,
    bytes formula (SymPy) and exact bytes at ``b``, ``s`` (default: the paper's)."""
    from ..ledgers import hf as ledgers_hf  # noqa: F401  (registers hf-eager)

    m = load_model(model)
    b, s = _bs(b, s)
    t = TrainingConfig(micro_batch=b, seq_len=s, profile=profile)
    rec = t.recipe
    par = parallel_values(t)
    vals = {**param_values(m), **par, **training_values(t)}
    out = []
    for e in act_profile(profile).layer(m, kind):
        expr = entry_bytes(e, t, rec).xreplace(par)
        out.append({"key": e.key, "name": e.name, "dtype": e.dtype, "group": entry_group(e.key), "formula": expr,
                    "bytes": int(expr.xreplace(vals))})
    return out


def layer_groups(model: ModelConfig | str, kind: str = "moe", b: int | None = None,
                 s: int | None = None) -> dict[str, dict]:
    """Bytes per group of one layer under the paper's ledger and ``hf-eager``, in :data:`GROUPS`
    order, then ``total``; each with ``difference`` (hf-eager − paper) and ``ratio`` (a Fraction, or
    None where the paper counts nothing)."""
    acc: dict[str, dict[str, int]] = {}
    for profile in ("paper", "hf-eager"):
        for e in layer_entries(model, kind, profile, b, s):
            acc.setdefault(e["group"], {"paper": 0, "hf-eager": 0})[profile] += e["bytes"]
    out = {g: acc[g] for g in GROUPS if g in acc}
    out["total"] = {p: sum(v[p] for v in out.values()) for p in ("paper", "hf-eager")}
    return {g: {**v, "difference": v["hf-eager"] - v["paper"],
                "ratio": Fraction(v["hf-eager"], v["paper"]) if v["paper"] else None} for g, v in out.items()}


def longer_sequence(model: ModelConfig | str, kind: str = "moe", b: int | None = None,
                    s: int | None = None) -> dict:
    """One layer at twice the sequence length under both ledgers: totals and growth factors, the
    attention scores at 2s, the growth factor of everything else (``others_ratio``, per ledger) and
    whether no other group more than doubles (``others_at_most_double``)."""
    b, s = _bs(b, s)
    one, two = layer_groups(model, kind, b, s), layer_groups(model, kind, b, 2 * s)
    others = [g for g in one if g not in ("total", "attention scores")]
    ratio = {p: Fraction(two["total"][p], one["total"][p]) for p in ("paper", "hf-eager")}
    scores = two.get("attention scores", {"paper": 0, "hf-eager": 0})
    return {"s": s, "s2": 2 * s, "paper": one["total"]["paper"], "hf-eager": one["total"]["hf-eager"],
            "paper_s2": two["total"]["paper"], "hf_s2": two["total"]["hf-eager"], "paper_ratio": ratio["paper"],
            "hf_ratio": ratio["hf-eager"], "scores_paper_s2": scores["paper"], "scores_hf_s2": scores["hf-eager"],
            "others_ratio": {p: Fraction(sum(two[g][p] for g in others), sum(one[g][p] for g in others))
                             for p in ("paper", "hf-eager")},
            "others_at_most_double": all(two[g][p] <= 2 * one[g][p] for g in others for p in ("paper", "hf-eager"))}


def largest_difference(model: ModelConfig | str, kind: str = "moe", b: int | None = None,
                       s: int | None = None) -> dict:
    """The group where ``hf-eager`` keeps the most beyond the paper's ledger, and the whole layer's
    difference (hf-eager − paper, signed)."""
    g = layer_groups(model, kind, b, s)
    top = max((k for k in g if k != "total"), key=lambda k: g[k]["difference"])
    return {"group": top, "paper": g[top]["paper"], "hf-eager": g[top]["hf-eager"],
            "difference": g[top]["difference"], "share": Fraction(g[top]["difference"], g["total"]["difference"])
            if g["total"]["difference"] else None, "total_difference": g["total"]["difference"]}


# ------------------------------------------------------------------------------------------------
# one layer under the three implementations (hf-eager, Megatron-Core local, Megatron-Core + TE)
# ------------------------------------------------------------------------------------------------
#: entry groups of the side-by-side view, in data-flow order
SIDE_GROUPS = ("RMSNorms", ATTENTION_GROUP, "RoPE", "attention scores", "router", "dispatch",
               "routed experts", "shared experts", "dense FFN")


def megatron_group(key: str) -> str:
    """The group of a megatron or hf-eager ledger entry key (one layer)."""
    part, _, rest = key.partition(".")
    if rest.startswith("routed"):
        return "routed experts"
    if rest.startswith("shared"):
        return "shared experts"
    if part == "dense_ffn":
        return "RMSNorms" if "norm" in rest else "dense FFN"
    if part == "moe":
        if "norm" in rest:
            return "RMSNorms"
        return "dispatch" if rest.startswith("permute") else "router"
    if "norm" in rest or rest.endswith(("_fp32", "_rstd", "_normalized", "input_fp32")) and rest.startswith("c_"):
        return "RMSNorms"
    if "rope" in rest:
        return "RoPE"
    if any(w in rest for w in ("softmax", "probs")):
        return "attention scores"
    return ATTENTION_GROUP


def group_name(group: str, model: ModelConfig | str) -> str:
    """The name of ``group`` (of :data:`GROUPS` or :data:`SIDE_GROUPS`) for ``model``: the attention's group is
    its latents and projections under MLA, its projections otherwise."""
    if group == ATTENTION_GROUP and load_model(model).attention != "mla":
        return "attention projections"
    return group


#: the three columns: hf-eager and Megatron-Core local are measured (in miniature), TE read from sources
COLUMNS = ("hf-eager", "megatron-local", "megatron-te")


def _one_layer(model: ModelConfig, kind: str, profile: str, train: TrainingConfig) -> dict[str, int]:
    vals = {**param_values(model), **parallel_values(train), **training_values(train)}
    return ledger_bytes(act_profile(profile, train).layer(model, kind), train, train.recipe).evaluate(vals)


def ground_truths(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                  s: int | None = None) -> dict:
    """One decoder layer on one device under the three implementations memlib checks: Hugging Face
    eager (hf-eager), Megatron-Core's local modules (both measured exact in miniature) and
    Megatron-Core with Transformer Engine (its kernels' sources): bytes per entry and per group, the
    totals, and the groups where the local and Transformer Engine paths differ."""
    from ..ledgers import hf as ledgers_hf  # noqa: F401  (registers hf-eager)

    m = load_model(model)
    b, s = _bs(b, s)
    one = dict(dp=1, tp=1, pp=1, ep=1, etp=1, micro_batch=b, seq_len=s, precision="megatron")
    cols = {"hf-eager": _one_layer(m, kind, "hf-eager", TrainingConfig(profile="hf-eager", **one)),
            "megatron-local": _one_layer(m, kind, "megatron",
                                         TrainingConfig(profile="megatron", transformer_impl="local", runtime="cpu",
                                                        **one)),
            "megatron-te": _one_layer(m, kind, "megatron", TrainingConfig(profile="megatron", **one))}
    groups = {g: {c: 0 for c in cols} for g in SIDE_GROUPS}
    for c, entries in cols.items():
        for key, x in entries.items():
            groups[megatron_group(key)][c] += x
    groups = {g: v for g, v in groups.items() if any(v.values())}
    groups["total"] = {c: sum(e.values()) for c, e in cols.items()}
    differ = [g for g, v in groups.items() if g != "total" and v["megatron-local"] != v["megatron-te"]]
    return {"entries": cols, "groups": groups, "b": b, "s": s, "kind": kind, "local_te_differ": differ}


#: the kernels whose sources a Transformer Engine entry's note may cite, in lookup order
TE_SOURCES = ("flash_attention", "te_unfused_attention", "te_layernorm_linear", "te_rmsnorm", "te_cross_entropy",
              "te_linear")


def _source_of(note: str) -> str:
    """Where a Transformer Engine entry's bytes come from: a kernel of :data:`TE_SOURCES` (its source
    is cited in the note), or Megatron-Core's own code, ``measured`` on the CPU or ``read``."""
    from ..ledgers.megatron_blocks import KERNEL_SOURCES

    for name in TE_SOURCES:
        if KERNEL_SOURCES[name] in note:
            return name
    return "measured" if "measured" in note else "read"


def by_group(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
             s: int | None = None) -> dict[str, dict[str, int]]:
    """One layer's bytes per group of :data:`SIDE_GROUPS` (zeros included) under the paper's ledger
    and the three implementations of :func:`ground_truths`: column -> group -> bytes."""
    gt = ground_truths(model, kind, b, s)
    cols = {"paper": {e["key"]: e["bytes"] for e in layer_entries(model, kind, "paper", gt["b"], gt["s"])},
            **gt["entries"]}
    out = {c: {g: 0 for g in SIDE_GROUPS} for c in cols}
    for c, entries in cols.items():
        for key, x in entries.items():
            out[c][megatron_group(key)] += x
    return out


def megatron_layer_entries(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                           s: int | None = None) -> list[dict]:
    """Every entry of one ``megatron`` layer, local beside Transformer Engine: key, group, bytes on
    each path (None where the path keeps no such tensor) and, for Transformer Engine, ``source``:
    the kernel whose source gives it (a key of :data:`TE_SOURCES`), ``measured`` or ``read``."""
    from ..ledgers.megatron_blocks import Kernels
    from ..ledgers.megatron import megatron_layer

    m = load_model(model)
    gt = ground_truths(m, kind, b, s)
    loc, te = gt["entries"]["megatron-local"], gt["entries"]["megatron-te"]
    notes = {e.key: e.note for e in megatron_layer(m, kind, Kernels())}
    return [{"key": k, "group": megatron_group(k), "local": loc.get(k), "te": te.get(k),
             "source": _source_of(notes[k]) if k in te else None}
            for k in list(loc) + [k for k in te if k not in loc]]


def kernel_differences(model: ModelConfig | str = "deepseek-v3", kind: str = "moe", b: int | None = None,
                       s: int | None = None) -> dict[str, int]:
    """Bytes of the entries where the local and Transformer Engine paths differ, for one layer: the
    local probabilities and RoPE tables, TE's log-sum-exp, both paths' RMSNorms and the totals."""
    gt = ground_truths(model, kind, b, s)
    loc, te, g = gt["entries"]["megatron-local"], gt["entries"]["megatron-te"], gt["groups"]
    zero = {c: 0 for c in COLUMNS}
    return {"probs_local": loc.get("attention.softmax_out", 0), "lse_te": te.get("attention.softmax_lse", 0),
            "norms_local": g.get("RMSNorms", zero)["megatron-local"], "norms_te": g.get("RMSNorms", zero)["megatron-te"],
            "rope_local": loc.get("attention.rope_tables", 0), "total_hf": g["total"]["hf-eager"],
            "total_local": g["total"]["megatron-local"], "total_te": g["total"]["megatron-te"]}


# ------------------------------------------------------------------------------------------------
# the recorded GPU run (benchmarks/gpu_validation.py on one H200, committed as package data)
# ------------------------------------------------------------------------------------------------
#: the measured result of ``benchmarks/gpu_validation.py`` on one H200
GPU_RESULT = resources.files("memlib.data") / "gpu_validation_h200.json"

_GPU_BASE = {"qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "model_type": "deepseek_v3",
             "n_shared_experts": 1, "first_k_dense_replace": 1, "topk_method": "noaux_tc"}
#: the configurations of that run, as ``benchmarks/gpu_validation.py`` defines them: (name, config.json, b, s)
GPU_CONFIGS = (
    ("small", {**_GPU_BASE, "hidden_size": 512, "intermediate_size": 1408, "moe_intermediate_size": 256,
               "num_attention_heads": 8, "q_lora_rank": 256, "kv_lora_rank": 128, "n_routed_experts": 16,
               "num_experts_per_tok": 4, "num_hidden_layers": 3, "vocab_size": 8192}, 2, 1024),
    ("medium", {**_GPU_BASE, "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 512,
                "num_attention_heads": 16, "q_lora_rank": 768, "kv_lora_rank": 512, "n_routed_experts": 64,
                "num_experts_per_tok": 6, "num_hidden_layers": 4, "vocab_size": 32768}, 1, 4096),
    ("v3-widths", {**_GPU_BASE, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                   "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "n_routed_experts": 256,
                   "num_experts_per_tok": 8, "num_hidden_layers": 2, "vocab_size": 129280}, 1, 4096),
)

#: the fields that make a model's widths (everything but the number and kind of its layers)
WIDTH_FIELDS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank",
                "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "vocab_size")


def gpu_model(name: str) -> ModelConfig:
    """The model of the GPU configuration ``name``."""
    for n, cfg, _, _ in GPU_CONFIGS:
        if n == name:
            return model_from_dict(cfg, name=n)
    raise ConfigError(f"no GPU configuration {name!r}")


#: the registry symbols the GPU table gives per configuration (the rest are shared: :func:`gpu_shared`)
GPU_TABLE_SYMBOLS = ("h", "n_h", "d_cq", "d_c", "h_F", "h_E", "N", "N_r", "N_s", "v", "l", "k_dense")


def gpu_shared() -> dict[str, int]:
    """The model symbols every GPU configuration has with one value, by registry key, apart from
    those the GPU table lists per configuration (:data:`GPU_TABLE_SYMBOLS`): the rest of what
    defines each configuration."""
    from ..core.symbols import model_symbols

    models = [gpu_model(n) for n, _, _, _ in GPU_CONFIGS]
    out = {}
    for n in model_symbols():
        vals = {getattr(m, n.field) for m in models}
        if n.key not in GPU_TABLE_SYMBOLS and len(vals) == 1 and None not in vals:
            out[n.key] = int(vals.pop())
    return out


def widths_of(m: ModelConfig) -> str | None:
    """The shipped preset whose widths (:data:`WIDTH_FIELDS`) ``m`` has, or None."""
    from ..config import PRESETS

    for p in PRESETS:
        ref = load_model(p)
        if all(getattr(m, f) == getattr(ref, f) for f in WIDTH_FIELDS):
            return p
    return None


def gpu_run(path: Path = GPU_RESULT) -> dict:
    """The recorded GPU run: the device, the versions it ran (and whether each is the pinned one),
    and per configuration the recorded bytes beside memlib's.

    Each row has the run's fields (``predicted``, ``saved``, ``exact``, ``held_after_forward`` =
    allocated after the forward pass − allocated before it, ``logits``, ``peak_above_before``,
    ``transient_above_held``, ``reserved``: the allocator's reserved bytes when the forward pass
    ended) and: ``model`` (its :class:`ModelConfig`), ``predicted_now`` (memlib's ledger today) and
    ``same_prediction``; ``held_beyond_logits`` (held − saved − logits, signed); ``weights``
    (memlib's bytes of the model's parameters: bf16, the router in fp32), which were allocated
    before the forward pass and so lie outside "held"; ``allocated_after_min`` = weights + held and
    ``peak_min`` = weights + peak above before (lower bounds: "before" holds the weights and a few
    more tensors, the inputs among them); ``reserved_over_allocated_max`` = reserved −
    allocated_after_min and ``reserved_over_peak_max`` = reserved − peak_min (upper bounds).

    The run: ``cuda`` is the CUDA version PyTorch was built for (from its local version tag,
    ``2.11.0+cu130`` -> ``13.0``; None without one), ``order`` the configurations in the order they
    ran (each one built its model afresh, and the script emptied the allocator's cache after it)."""
    from ..ledgers.hf import HF_VERSIONS
    from ..measure.hf import predicted

    data = json.loads((Path(path) if isinstance(path, str) else path).read_text())
    configs = {n: (b, s) for n, _, b, s in GPU_CONFIGS}
    rows = []
    for r in data["rows"]:
        m = gpu_model(r["config"])
        if configs[r["config"]] != (r["micro_batch"], r["seq_len"]):
            raise ConfigError(f"GPU row {r['config']}: b, s = {r['micro_batch']}, {r['seq_len']}, "
                              f"not those of GPU_CONFIGS")
        pred = predicted(m, r["micro_batch"], r["seq_len"])
        now = sum(pred["regions"].values())
        w = pred["parameters"]
        rows.append({**r, "model": m, "widths_of": widths_of(m), "predicted_now": now,
                     "same_prediction": now == r["predicted"], "held_beyond_logits": r["held_minus_saved"] - r["logits"],
                     "weights": w, "allocated_after_min": w + r["held_after_forward"],
                     "peak_min": w + r["peak_above_before"],
                     "reserved_over_allocated_max": r["reserved"] - w - r["held_after_forward"],
                     "reserved_over_peak_max": r["reserved"] - w - r["peak_above_before"]})
    torch_version, _, local = data["torch"].partition("+")
    cuda = re.fullmatch(r"cu(\d+)(\d)", local)             # "cu130": built for CUDA 13.0
    return {"device": data["device"], "torch": data["torch"], "torch_version": torch_version,
            "cuda": f"{int(cuda.group(1))}.{cuda.group(2)}" if cuda else None,
            "order": [r["config"] for r in rows],
            "transformers": data["transformers"], "pinned": dict(HF_VERSIONS),
            "same_torch": torch_version == HF_VERSIONS["torch"],
            "same_transformers": data["transformers"] == HF_VERSIONS["transformers"],
            "rows": rows, "configs": len(rows), "exact": sum(1 for r in rows if r["exact"]),
            "all_exact": all(r["exact"] for r in rows), "all_same_prediction": all(r["same_prediction"] for r in rows),
            "largest": max(rows, key=lambda r: r["saved"])["config"]}
