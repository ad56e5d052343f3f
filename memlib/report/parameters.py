"""Tables, equations, figure data and facts for the first three chapters (introduction,
architecture and notation, parameters).

The chapters call these functions and glue what they return; every sum, ratio and comparison
with a published value is made here, never in a notebook.  Counts stay exact integers until they
are formatted (:mod:`memlib.units`); the paper's printed values come verbatim from
:data:`memlib.reference.PAPER` and are shown *beside* memlib's, never used to compute.

The paper's "GB" are GiB (2**30 bytes): its columns are labelled GiB here, and a table never mixes
binary and decimal units.

>>> f = parameter_facts()
>>> f["v3_total"], f["v3_activated"]
('671,026,404,352', '37,552,282,624')
>>> stage_rows = stage_table_rows(v3_partition())
>>> [r[0] for r in stage_rows]
['0', '1–14', '15', 'all']
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Sequence

import sympy as sp

from ..architecture import (
    BLOCKS, MLA_EQUATIONS, attention_tensors, decoder_layer_tensors, dense_ffn_tensors,
    embedding_tensors, head_tensors, moe_tensors, mtp_tensors,
)
from ..breakdown import Breakdown
from ..config import PAPER_TRAINING, ModelConfig, TrainingConfig, load_model
from ..params import (
    activated_params, buffer_params, by_block, expert_params, layer_params, model_params, mtp_params,
    tensor_counts, values,
)
from ..partition import Partition, Stage
from ..reference import DEEPSEEK_OFFICIAL, PAPER, PAPER_UNIT_NOTE
from ..states import RECIPES
from ..symbols import model_symbols, sym
from ..units import UNITS, fmt_decimal, fmt_billions, fmt_bytes, fmt_count
from .core import PALETTE, glue, md_table

__all__ = [
    "MODELS", "MODEL_NAMES", "V3", "glue_facts", "partition", "v3_partition", "weight_bytes",
    # introduction
    "intro_facts", "library_table",
    # architecture
    "architecture_facts", "model_fields_table", "layer_pattern_table", "attention_table",
    "mla_equations", "mtp_equation", "mtp_table",
    # parameters
    "parameter_facts", "matrix_table", "block_equations", "total_equations", "layer_table",
    "layer_table_rows", "stage_table", "stage_table_rows", "totals_table", "StageBars",
    "stage_block_bars",
]

V3 = "deepseek-v3"
MODELS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")
MODEL_NAMES = {"deepseek-v3": "DeepSeek-V3", "deepseek-v2": "DeepSeek-V2", "deepseek-v2-lite": "DeepSeek-V2-Lite"}
DASH = "–"  # en dash for ranges


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------

def glue_facts(prefix: str, facts: dict[str, str]) -> None:
    """Glue every ready-formatted string of ``facts`` under ``{prefix}_{key}``."""
    for key, text in facts.items():
        glue(f"{prefix}_{key}", text)


def weight_bytes(n: int, recipe: str = "paper") -> int:
    """Bytes of ``n`` stored weights under a precision recipe (bf16: 2 bytes each)."""
    return int(n) * RECIPES[recipe].weights


def _gib(n_params: int, digits: int = 2, with_unit: bool = True) -> str:
    """bf16 weights of ``n_params`` parameters in GiB."""
    return fmt_bytes(weight_bytes(n_params), "GiB", digits, with_unit)


def _pct(num: int, den: int, digits: int = 1) -> str:
    return fmt_decimal(Fraction(int(num) * 100, int(den)), digits) + "%"


def _range(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}{DASH}{b}"


def _tex(expr) -> str:
    return sp.latex(expr)


def _shape_tex(shape: Sequence) -> str:
    return "$[" + ", ".join(_tex(d) for d in shape) + "]$"


def _shape_num(shape: Sequence, vals: dict) -> str:
    return "[" + ", ".join(fmt_count(sp.sympify(d).xreplace(vals)) for d in shape) + "]"


def _count(expr, vals: dict) -> int:
    return Breakdown({"x": expr}).evaluate_total(vals)


def _printed_billions(s: str) -> int:
    """A printed count such as ``"14.16B"`` as an integer (for differences only)."""
    return int(Fraction(s.rstrip("B")) * 10**9)


def partition(m: ModelConfig | str | None = None, train: TrainingConfig = PAPER_TRAINING) -> Partition:
    """``m`` (DeepSeek-V3 by default) under ``train`` (the paper's PP16@TP2@EP8@ETP1, DP32)."""
    return Partition(load_model(m or V3), train)


def v3_partition() -> Partition:
    """DeepSeek-V3 under the paper's PP16@TP2@EP8@ETP1, DP32 configuration."""
    return partition(V3, PAPER_TRAINING)


def _name(m: ModelConfig) -> str:
    return MODEL_NAMES.get(m.name, m.name)


def _stated(off: dict, key: str) -> str:
    """A figure DeepSeek states for the model, in billions, or a dash where it states none."""
    x = off.get(key)
    return "— (not stated)" if x is None else x + "B"


# ---------------------------------------------------------------------------------------------
# Chapter 1: introduction
# ---------------------------------------------------------------------------------------------

def intro_facts(m: ModelConfig | str | None = None, train: TrainingConfig = PAPER_TRAINING) -> dict[str, str]:
    """Units, the paper's headline per-device figure in GiB and GB, rounding examples (computed for
    ``m`` under ``train``; the paper's printed values beside them are DeepSeek-V3's)."""
    m = load_model(m or V3)
    vals = values(m)
    part = partition(m, train)
    busiest = max(part.stages, key=lambda s: part.params(s).evaluate_total(part.values))
    dev = part.params(busiest).evaluate_total(part.values)
    same = [s.index for s in part.stages
            if part.params(s).evaluate_total(part.values) == dev]
    moe = layer_params(m, "moe").evaluate_total(vals)
    total = model_params(m).evaluate_total(vals)
    stage0 = part.params_unsharded(part.stages[0]).evaluate_total(part.values)
    paper_moe = PAPER["table3"]["3-59"]["memory_gb"]
    return {
        "gib_bytes": fmt_count(UNITS["GiB"]),
        "gb_bytes": fmt_count(UNITS["GB"]),
        "gib_in_gb": fmt_bytes(UNITS["GiB"], "GB", 4),
        "gib_excess": _pct(UNITS["GiB"] - UNITS["GB"], UNITS["GB"], 2),
        "bf16_bytes": str(RECIPES["paper"].weights),
        "config": train.label(),
        "device_stages": _range(min(same), max(same)),
        "device_params": fmt_count(dev),
        "device_bytes": fmt_count(weight_bytes(dev)),
        "device_gib": fmt_bytes(weight_bytes(dev), "GiB"),
        "device_gb": fmt_bytes(weight_bytes(dev), "GB"),
        "paper_device": PAPER["table6"]["total"]["memory_gb"] + " GB",
        "model_gib": fmt_bytes(weight_bytes(total), "GiB"),
        "model_gb": fmt_bytes(weight_bytes(total), "GB"),
        "moe_layer_params": fmt_count(moe),
        "moe_layer_gib3": _gib(moe, 3),
        "moe_layer_gib2": _gib(moe, 2),
        "paper_moe_layer": paper_moe + " GB",
        "stage0_exact": fmt_billions(stage0),
        "paper_stage0": PAPER["table4"]["0"]["params"],
        "paper_unit_note": PAPER_UNIT_NOTE,
    }


#: the accounting pipeline, in the order data flows, then the modules every step uses
_PIPELINE = ("config", "architecture", "params", "partition", "states", "memory", "report")
_SERVICE = ("symbols", "breakdown", "units", "reference")


def library_table() -> str:
    """The modules of memlib with the first line of each docstring."""
    rows = []
    for i, name in enumerate(_PIPELINE + _SERVICE):
        mod = importlib.import_module(f"memlib.{name}")
        first = (mod.__doc__ or "").strip().splitlines()[0]
        role = "pipeline step" if name in _PIPELINE else "used by every step"
        step = str(i + 1) if name in _PIPELINE else "—"
        rows.append([step, f"`memlib.{name}`", role, first])
    return md_table(["step", "module", "kind", "what it does"], rows, "clll")


# ---------------------------------------------------------------------------------------------
# Chapter 2: architecture and notation
# ---------------------------------------------------------------------------------------------

def _field_value(m: ModelConfig, field: str) -> str:
    x = getattr(m, field)
    if x is None:
        return "— (null)"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return fmt_count(x)


def model_fields_table(models: Iterable[str] = MODELS) -> str:
    """Every model symbol with its config field and its value in each model."""
    ms = [load_model(n) for n in models]
    rows = [[f"${_tex(n.symbol)}$", f"`{n.field}`"] + [_field_value(m, n.field) for m in ms]
            for n in model_symbols()]
    rows.append(["", "`moe_layer_freq`"] + [_field_value(m, "moe_layer_freq") for m in ms])
    rows.append(["", "`tie_word_embeddings`"] + [_field_value(m, "tie_word_embeddings") for m in ms])
    rows.append(["$b^{G}$", "router bias buffer (`topk_method: noaux_tc`)"]
                + [_field_value(m, "router_bias") for m in ms])
    return md_table(["symbol", "config field"] + [MODEL_NAMES.get(m.name, m.name) for m in ms], rows,
                    "ll" + "r" * len(ms))


def _runs(kinds: Sequence[str]) -> list[tuple[str, int, int]]:
    """Consecutive runs (kind, first, last) of a layer-kind sequence."""
    runs: list[tuple[str, int, int]] = []
    for i, k in enumerate(kinds):
        if runs and runs[-1][0] == k:
            runs[-1] = (k, runs[-1][1], i)
        else:
            runs.append((k, i, i))
    return runs


def layer_pattern_table(models: Iterable[str] = MODELS) -> str:
    """Which decoder layers are dense and which MoE, per model."""
    rows = []
    for n in models:
        m = load_model(n)
        kinds = m.layer_kinds
        pattern = ", ".join(f"{'dense' if k == 'dense' else 'MoE'} {_range(a, b)}" for k, a, b in _runs(kinds))
        rows.append([MODEL_NAMES.get(n, n), fmt_count(len(kinds)), fmt_count(kinds.count("dense")),
                     fmt_count(kinds.count("moe")), pattern, fmt_count(m.num_nextn_predict_layers)])
    return md_table(["model", "layers $l$", "dense", "MoE", "layer indices", "MTP modules"], rows, "lrrrlr")


def attention_table(models: Sequence[str | ModelConfig] = ("deepseek-v3", "deepseek-v2-lite")) -> str:
    """The MLA tensors of each model: symbolic shape = numeric shape, and the HF parameter."""
    ms = [load_model(n) for n in models]
    per = [{t.key: t for t in attention_tensors(m)} for m in ms]
    keys: list[str] = []
    for d in per:
        keys += [k for k in d if k not in keys]
    order = [t.key for t in attention_tensors(ms[0])]
    keys.sort(key=lambda k: order.index(k) if k in order else order.index("attention.W_UQ"))
    rows = []
    for k in keys:
        t0 = next(d[k] for d in per if k in d)
        row = [f"${t0.latex}$", f"`{t0.hf}`"]
        for m, d in zip(ms, per):
            t = d.get(k)
            row.append("—" if t is None else f"{_shape_tex(t.shape)} = {_shape_num(t.shape, values(m))}")
        rows.append(row)
    return md_table(["tensor", "Hugging Face parameter"] + [_name(m) for m in ms], rows, "l" * (2 + len(ms)))


def mla_equations() -> list[tuple[str, str]]:
    """(glue-key suffix, LaTeX) for each MLA equation; the suffix is the label with ``_``."""
    return [(label.replace("-", "_"), tex) for label, tex in MLA_EQUATIONS]


def mtp_equation(m: ModelConfig | None = None) -> str:
    """The MTP module's input (DeepSeek-V3 report, its Sec. 2.2), with M's shape from memlib."""
    m = m or load_model(V3)
    M = next(t for t in mtp_tensors(m) if t.key == "mtp.eh_proj")
    shape = r" \times ".join(_tex(d) for d in M.shape)
    return (r"h'^{k}_{i} = M_k\left[\mathrm{RMSNorm}(h^{k-1}_{i});\ \mathrm{RMSNorm}(\mathrm{Emb}(t_{i+k}))\right],"
            r"\qquad M_k \in \mathbb{R}^{" + shape + "}")


def mtp_table(m: ModelConfig | None = None) -> str:
    """The tensors of one MTP module, with the decoder block summed into one row."""
    m = m or load_model(V3)
    vals = values(m)
    own, block = [], Breakdown()
    for t in mtp_tensors(m):
        if t.kind == "buffer":
            continue
        if t.key.count(".") == 1:
            own.append(t)
        else:
            block = block + Breakdown({t.key: t.numel})
    rows = [[f"${t.latex}$", f"`{t.hf}`", _shape_tex(t.shape), fmt_count(_count(t.numel, vals))] for t in own[:3]]
    kind = "MoE" if m.is_moe_layer(m.num_hidden_layers) else "dense"
    rows.append([f"one {kind} decoder block", "`mlp.*`, `self_attn.*`, norms", "as a decoder layer",
                 fmt_count(block.evaluate_total(vals))])
    rows += [[f"${t.latex}$", f"`{t.hf}`", _shape_tex(t.shape), fmt_count(_count(t.numel, vals))] for t in own[3:]]
    rows.append(["embedding $W^{E}$, head $W^{head}$", "shared with the main model", "", "not counted again"])
    rows.append(["**total (own parameters)**", "", "", f"**{fmt_count(mtp_params(m).evaluate_total(vals))}**"])
    return md_table(["tensor", "Hugging Face parameter", "shape", "parameters"], rows, "lllr")


def architecture_facts(m: ModelConfig | str | None = None) -> dict[str, str]:
    """Numbers the architecture chapter quotes: of ``m`` (DeepSeek-V3 by default; keys without a model
    prefix, and ``v3_*``), and of DeepSeek-V2 and V2-Lite (``v2_*``, ``lite_*``) for comparison."""
    v3, lite, v2 = load_model(m or V3), load_model("deepseek-v2-lite"), load_model("deepseek-v2")
    vals3, valsl = values(v3), values(lite)
    qk = _count(sym("d_h") + sym("d_hR"), vals3)
    f = {
        "d_h": fmt_count(v3.qk_nope_head_dim),
        "d_v": fmt_count(v3.v_head_dim),
        "d_hR": fmt_count(v3.qk_rope_head_dim),
        "d_c": fmt_count(v3.kv_lora_rank),
        "d_cq": "— (null)" if v3.q_lora_rank is None else fmt_count(v3.q_lora_rank),
        "h": fmt_count(v3.hidden_size),
        "n_h": fmt_count(v3.num_attention_heads),
        "l": fmt_count(v3.num_hidden_layers),
        "k_dense": fmt_count(v3.first_k_dense_replace),
        "moe_layers": fmt_count(v3.layer_kinds.count("moe")),
        "N": fmt_count(v3.n_routed_experts),
        "N_s": fmt_count(v3.n_shared_experts),
        "N_r": fmt_count(v3.num_experts_per_tok),
        "n_mtp": fmt_count(v3.num_nextn_predict_layers),
        "qk_width": fmt_count(qk),
        "rope_share": _pct(v3.qk_rope_head_dim, qk, 1),
        "kv_cache_width": fmt_count(_count(sym("d_c") + sym("d_hR"), vals3)),
        "mha_kv_width": fmt_count(_count(sym("n_h") * (sym("d_h") + sym("d_hR") + sym("d_v")), vals3)),
        "mtp_own": fmt_billions(mtp_params(v3).evaluate_total(vals3)),
        "lite_n_h": fmt_count(lite.num_attention_heads),
        "lite_l": fmt_count(lite.num_hidden_layers),
        "lite_k_dense": fmt_count(lite.first_k_dense_replace),
        "lite_moe_layers": fmt_count(lite.layer_kinds.count("moe")),
        "lite_N": fmt_count(lite.n_routed_experts),
        "lite_N_s": fmt_count(lite.n_shared_experts),
        "lite_routed_total": fmt_count(lite.layer_kinds.count("moe") * lite.n_routed_experts),
        "lite_wq": fmt_count(_count(next(t.numel for t in attention_tensors(lite) if t.key == "attention.W_Q"), valsl)),
        "v3_routed_total": fmt_count(v3.layer_kinds.count("moe") * v3.n_routed_experts),
        "v2_k_dense": fmt_count(v2.first_k_dense_replace),
        "v2_N": fmt_count(v2.n_routed_experts),
        "v2_N_s": fmt_count(v2.n_shared_experts),
        "v2_h": fmt_count(v2.hidden_size),
    }
    return f


# ---------------------------------------------------------------------------------------------
# Chapter 3: parameters
# ---------------------------------------------------------------------------------------------

_BLOCK_ORDER = ("embedding", "attention", "norms", "dense_ffn", "router", "shared_experts", "routed_experts",
                "final_norm", "head")


def matrix_table(m: ModelConfig | None = None) -> str:
    """The paper's matrix table (its Table 2), extended to every tensor: block, tensor, symbolic
    shape, the model's shape and the element count (routed experts: all N of one layer, and one)."""
    m = m or load_model(V3)
    vals = values(m)
    tensors = (embedding_tensors() + attention_tensors(m) + [t for t in decoder_layer_tensors(m, "dense")
               if t.block == "norms"] + dense_ffn_tensors() + moe_tensors(m) + head_tensors(m))
    rows = []
    for t in tensors:
        block = BLOCKS.get(t.block, t.block)
        if t.kind == "buffer":
            block += " (buffer, not trained)"
        count = fmt_count(_count(t.numel, vals))
        if t.expert:
            one = fmt_count(_count(sp.Mul(*t.shape[1:]), vals))
            count = f"{count} ({one} per expert)"
        rows.append([block, f"${t.latex}$", _shape_tex(t.shape), _shape_num(t.shape, vals), count])
    return md_table(["block", "tensor", "shape", MODEL_NAMES.get(m.name, m.name), "parameters"], rows, "llllr")


def _block_of(b: Breakdown, block: str) -> sp.Expr:
    return by_block(b).get(block, sp.Integer(0))


def _mla(m: ModelConfig) -> Breakdown:
    return tensor_counts(attention_tensors(m))


def block_equations(m: ModelConfig | None = None) -> dict[str, tuple[str, str]]:
    """Per-layer symbolic counts as ``key -> (lhs, rhs)`` LaTeX: MLA, norms, dense FFN, MoE, layers."""
    m = m or load_model(V3)
    moe = layer_params(m, "moe")
    dense = layer_params(m, "dense")
    return {
        "mla": (r"P_{\mathrm{MLA}}", _mla(m).latex()),
        "norms": (r"P_{\mathrm{norm}}", _tex(_block_of(moe, "norms"))),
        "dense_ffn": (r"P_{\mathrm{FFN}}", _tex(_block_of(dense, "dense_ffn"))),
        "moe": (r"P_{\mathrm{MoE}}", " + ".join(_tex(_block_of(moe, k)) for k in ("router", "shared_experts", "routed_experts"))),
        "expert": (r"P_{\mathrm{expert}}", _tex(expert_params(m))),
    }


def total_equations(m: ModelConfig | None = None) -> dict[str, tuple[str, str]]:
    """Model totals in terms of the per-layer blocks; checked against :func:`memlib.params`."""
    m = m or load_model(V3)
    h, l, k = sym("h"), sym("l"), sym("k_dense")
    N, N_r, h_E = sym("N"), sym("N_r"), sym("h_E")
    P_mla, P_norm = sp.Symbol(r"P_{\mathrm{MLA}}"), sp.Symbol(r"P_{\mathrm{norm}}")
    P_ffn, P_moe = sp.Symbol(r"P_{\mathrm{FFN}}"), sp.Symbol(r"P_{\mathrm{MoE}}")
    moe_b, dense_b = layer_params(m, "moe"), layer_params(m, "dense")
    defs = {
        P_mla: _mla(m).total, P_norm: _block_of(moe_b, "norms"), P_ffn: _block_of(dense_b, "dense_ffn"),
        P_moe: sum((_block_of(moe_b, x) for x in ("router", "shared_experts", "routed_experts")), sp.Integer(0)),
    }
    emb = tensor_counts(embedding_tensors()).total + tensor_counts(head_tensors(m)).total
    total = emb + l * (P_mla + P_norm) + k * P_ffn + (l - k) * P_moe
    saved = (l - k) * 3 * (N - N_r) * h * h_E
    checks = [(total, model_params(m).total), (total - saved, activated_params(m).total)]
    for mine, lib in checks:  # the display form must be memlib's count, exactly
        if sp.expand(mine.xreplace(defs) - lib) != 0:
            raise AssertionError("total_equations disagrees with memlib.params")
    lk = r"\left(" + _tex(l) + " - " + _tex(k) + r"\right)"
    return {
        "total": (r"P_{\mathrm{total}}", _tex(emb) + " + " + _tex(l) + r"\left(" + _tex(P_mla) + " + "
                  + _tex(P_norm) + r"\right) + " + _tex(k) + " " + _tex(P_ffn) + " + " + lk + " " + _tex(P_moe)),
        "activated": (r"P_{\mathrm{act}}", r"P_{\mathrm{total}} - 3 " + lk + r"\left(" + _tex(N) + " - "
                      + _tex(N_r) + r"\right) " + _tex(h) + " " + _tex(h_E)),
    }


def _layer_groups(m: ModelConfig) -> list[tuple[int, int, tuple]]:
    """Consecutive layers with the same contents: (first, last, signature)."""
    n = m.num_hidden_layers
    sig = [(k, i == 0, i == n - 1) for i, k in enumerate(m.layer_kinds)]
    groups: list[tuple[int, int, tuple]] = []
    for i, s in enumerate(sig):
        if groups and groups[-1][2] == s:
            groups[-1] = (groups[-1][0], i, s)
        else:
            groups.append((i, i, s))
    return groups


def _components(kind: str, first: bool, last: bool) -> str:
    parts = (["embedding"] if first else []) + ["MLA", "dense FFN" if kind == "dense" else "router + experts",
                                                  "norms"] + (["final norm", "head"] if last else [])
    return " + ".join(parts)


def _paper_row(table: str, key: str, label: str) -> dict | None:
    return PAPER[table].get(label.replace(DASH, "-"))


def layer_table_rows(m: ModelConfig | None = None) -> list[list[str]]:
    """Rows of the per-layer table: layers, contents, exact count each, bf16 GiB each, the paper's
    printed count and GiB (DeepSeek-V3 only), and the model total."""
    m = m or load_model(V3)
    vals = values(m)
    paper = m.name == V3
    emb = tensor_counts(embedding_tensors()).evaluate_total(vals)
    head = tensor_counts(head_tensors(m)).evaluate_total(vals)
    rows = []
    for a, b, (kind, first, last) in _layer_groups(m):
        n = layer_params(m, kind).evaluate_total(vals) + (emb if first else 0) + (head if last else 0)
        label = _range(a, b)
        row = [label, _components(kind, first, last), fmt_count(n), _gib(n, with_unit=False)]
        if paper:
            p = _paper_row("table3", "layers", label)
            row += [p["params"], p["memory_gb"]] if p else ["", ""]
        rows.append(row)
    total = model_params(m).evaluate_total(vals)
    row = ["all", "", fmt_count(total), _gib(total, with_unit=False)]
    if paper:
        p = _paper_row("table3", "layers", "total")
        row += [p["params"], p["memory_gb"]]
    rows.append(row)
    return rows


def layer_table(m: ModelConfig | None = None) -> str:
    m = m or load_model(V3)
    headers = ["layers", "contents", "parameters (each)", "bf16 GiB (each)"]
    if m.name == V3:
        headers += ["paper: parameters", "paper: GiB (printed “GB”)"]
    return md_table(headers, layer_table_rows(m), "llrrrr"[: len(headers)])


def _stage_signature(part: Partition, st: Stage) -> tuple:
    kinds = [part.model.layer_kinds[i] for i in st.layers]
    return (st.first, st.last, kinds.count("dense"), kinds.count("moe"))


def _stage_contents(part: Partition, st: Stage) -> str:
    first, last, nd, nm = _stage_signature(part, st)
    parts = (["embedding"] if first else []) + ([f"{nd} dense"] if nd else []) + ([f"{nm} MoE"] if nm else []) \
        + (["final norm", "head"] if last else [])
    return " + ".join(parts)


def _stage_groups(part: Partition) -> list[list[Stage]]:
    groups: list[list[Stage]] = []
    for st in part.stages:
        if groups and _stage_signature(part, groups[-1][-1]) == _stage_signature(part, st):
            groups[-1].append(st)
        else:
            groups.append([st])
    return groups


def stage_table_rows(part: Partition | None = None) -> list[list[str]]:
    """Rows of the per-stage table (the paper's Table 4): stages, layers, contents, exact count
    per stage (before any TP/EP split), bf16 GiB, and the paper's printed values."""
    part = part or v3_partition()
    paper = part.model.name == V3 and part.train == PAPER_TRAINING
    rows = []
    for g in _stage_groups(part):
        n = part.params_unsharded(g[0]).evaluate_total(part.values)
        label = _range(g[0].index, g[-1].index)
        layers = f"{g[0].layers[0]}{DASH}{g[-1].layers[-1]}" if len(g) > 1 or len(g[0].layers) > 1 else str(g[0].layers[0])
        each = _stage_contents(part, g[0]) + (" (each)" if len(g) > 1 else "")
        row = [label, layers, each, fmt_count(n), _gib(n, with_unit=False)]
        if paper:
            p = _paper_row("table4", "stage", label)
            row += [p["params"], p["memory_gb"]] if p else ["", ""]
        rows.append(row)
    total = sum(part.params_unsharded(s).evaluate_total(part.values) for s in part.stages)
    row = ["all", _range(0, part.model.num_hidden_layers - 1), "", fmt_count(total), _gib(total, with_unit=False)]
    if paper:
        row += ["", ""]
    rows.append(row)
    return rows


def stage_table(part: Partition | None = None) -> str:
    part = part or v3_partition()
    headers = ["stage", "layers", "contents", "parameters per stage", "bf16 GiB per stage"]
    if part.model.name == V3 and part.train == PAPER_TRAINING:
        headers += ["paper: parameters", "paper: GiB (printed “GB”)"]
    return md_table(headers, stage_table_rows(part), "lllrrrr"[: len(headers)])


def totals_table(models: Iterable[str | ModelConfig] = MODELS) -> str:
    """Total and activated parameters of each model, beside what DeepSeek states (billions)."""
    rows = []
    for n in models:
        m = load_model(n)
        vals = values(m)
        off = DEEPSEEK_OFFICIAL.get(m.name, {})
        mtp = mtp_params(m).evaluate_total(vals)
        buf = buffer_params(m).evaluate_total(vals)
        rows.append([
            _name(m),
            fmt_count(model_params(m).evaluate_total(vals)),
            fmt_billions(model_params(m).evaluate_total(vals)),
            _stated(off, "total"),
            fmt_billions(activated_params(m).evaluate_total(vals)),
            fmt_billions(activated_params(m, embedding=False).evaluate_total(vals)),
            " / ".join(x + "B" for x in (off.get("activated"), off.get("activated_weights_doc")) if x),
            fmt_billions(mtp) if mtp else "—",
            fmt_count(buf) if buf else "—",
        ])
    return md_table(["model", "total (exact)", "total", "DeepSeek: total", "activated, with embedding",
                     "activated, without embedding", "DeepSeek: activated", "MTP (own)", "router-bias buffer"],
                    rows, "lrrrrrrrr")


def parameter_facts(m: ModelConfig | str | None = None, train: TrainingConfig = PAPER_TRAINING) -> dict[str, str]:
    """Every number the parameters chapter quotes, for ``m`` (DeepSeek-V3 by default) under ``train``.

    Keys named ``v3_*`` are the chapter's model; ``paper_*`` are the paper's printed values and
    ``*_official*`` what DeepSeek states for the model (DeepSeek-V3's in the book)."""
    m = load_model(m or V3)
    vals = values(m)
    total = model_params(m).evaluate_total(vals)
    act = activated_params(m).evaluate_total(vals)
    act_ne = activated_params(m, embedding=False).evaluate_total(vals)
    blocks = by_block(model_params(m)).evaluate(vals)
    moe_layer = layer_params(m, "moe")
    mla = _mla(m).evaluate_total(vals)
    mla_matrices = tensor_counts([t for t in attention_tensors(m) if t.kind == "matrix"]).evaluate_total(vals)
    moe_ffn = sum(by_block(moe_layer).evaluate(vals)[k] for k in ("router", "shared_experts", "routed_experts"))
    mtp = mtp_params(m)
    mtp_total = mtp.evaluate_total(vals)
    mtp_block = mtp.select(lambda k: k.count(".") > 1).evaluate_total(vals)
    mtp_proj = mtp.select(lambda k: k == "mtp.eh_proj").evaluate_total(vals)
    emb = blocks["embedding"]
    head = blocks["head"]
    stored_mtp = mtp_total + emb + head
    part = partition(m, train)
    st_counts = [part.params_unsharded(s).evaluate_total(part.values) for s in part.stages]
    biggest = max(st_counts)
    off = DEEPSEEK_OFFICIAL.get(m.name, {})
    doc = off.get("activated_weights_doc")
    lite, v2 = load_model("deepseek-v2-lite"), load_model("deepseek-v2")
    vl, v2v = values(lite), values(v2)
    lite_act = activated_params(lite).evaluate_total(vl)
    lite_act_ne = activated_params(lite, embedding=False).evaluate_total(vl)
    lite_emb = tensor_counts(embedding_tensors()).evaluate_total(vl)
    stage0 = st_counts[0]
    paper_stage0 = _paper_row("table4", "stage", "0")["params"]
    paper_l0 = _paper_row("table3", "layers", "0")["params"]
    paper_l12 = _paper_row("table3", "layers", "1-2")["params"]
    paper_moe = _paper_row("table3", "layers", "3-59")["params"]
    paper_moe_gb = _paper_row("table3", "layers", "3-59")["memory_gb"]
    l0 = layer_params(m, "dense").evaluate_total(vals) + emb
    l1 = layer_params(m, "dense").evaluate_total(vals)
    moe_n = moe_layer.evaluate_total(vals)
    final_norm = blocks["final_norm"]
    return {
        "v3_total": fmt_count(total),
        "v3_total_b": fmt_billions(total),
        "v3_total_gib": _gib(total),
        "v3_activated": fmt_count(act),
        "v3_activated_b": fmt_billions(act),
        "v3_activated_ne": fmt_count(act_ne),
        "v3_activated_ne_b": fmt_billions(act_ne),
        "v3_official_total": _stated(off, "total"),
        "v3_official_activated": _stated(off, "activated"),
        "v3_official_activated_doc": _stated(off, "activated_weights_doc"),
        "v3_activated_share": _pct(act, total, 1),
        "v3_activated_doc_gap": "—" if doc is None else fmt_billions(_printed_billions(doc) - act_ne),
        "embedding": fmt_count(emb),
        "embedding_b": fmt_billions(emb),
        "embedding_gib": _gib(emb),
        "routed_share": _pct(blocks["routed_experts"], total, 1),
        "routed": fmt_billions(blocks["routed_experts"]),
        "mla_layer": fmt_count(mla),
        "mla_matrices": fmt_count(mla_matrices),
        "mla_latent_norms": fmt_count(mla - mla_matrices),
        "paper_mla_layer": fmt_count(PAPER["mla_per_layer"]),
        "expert": fmt_count(_count(expert_params(m), vals)),
        "router": fmt_count(by_block(moe_layer).evaluate(vals)["router"]),
        "moe_ffn": fmt_count(moe_ffn),
        "paper_moe_ffn": fmt_count(PAPER["moe_ffn_per_layer"]),
        "moe_layer": fmt_count(moe_n),
        "moe_layer_gib3": _gib(moe_n, 3),
        "paper_moe_layer": paper_moe,
        "paper_moe_layer_gb": paper_moe_gb,
        "layer0": fmt_billions(l0),
        "paper_layer0": paper_l0,
        "layer1": fmt_billions(l1),
        "paper_layer1": paper_l12,
        "norms_layer": fmt_count(by_block(moe_layer).evaluate(vals)["norms"] + mla - mla_matrices),
        "final_norm": fmt_count(final_norm),
        "stage0": fmt_count(stage0),
        "stage0_b": fmt_billions(stage0),
        "paper_stage0": paper_stage0,
        "stage0_sum_rounded": fmt_billions(sum(_printed_billions(x) for x in
                                               (paper_l0, paper_l12, paper_l12, paper_moe))),
        "stage_max": fmt_count(biggest),
        "stage_max_b": fmt_billions(biggest),
        "stage_max_gib": _gib(biggest),
        "stage_max_n": fmt_count(st_counts.count(biggest)),
        "stage_last": fmt_count(st_counts[-1]),
        "pp": fmt_count(train.pp),
        "config": train.label(),
        "mtp_own": fmt_count(mtp_total),
        "mtp_own_b": fmt_billions(mtp_total),
        "mtp_block_b": fmt_billions(mtp_block),
        "mtp_proj": fmt_count(mtp_proj),
        "mtp_official": _stated(off, "mtp"),
        "mtp_stored_b": fmt_billions(stored_mtp),
        "checkpoint_b": fmt_billions(total + stored_mtp),
        "checkpoint_official": _stated(off, "checkpoint"),
        "router_bias": fmt_count(buffer_params(m).evaluate_total(vals)),
        "router_bias_per_layer": fmt_count(m.n_routed_experts),
        "moe_layers": fmt_count(m.layer_kinds.count("moe")),
        "v2_total": fmt_count(model_params(v2).evaluate_total(v2v)),
        "v2_total_b": fmt_billions(model_params(v2).evaluate_total(v2v)),
        "v2_official_total": DEEPSEEK_OFFICIAL["deepseek-v2"]["total"] + "B",
        "lite_total": fmt_count(model_params(lite).evaluate_total(vl)),
        "lite_total_b": fmt_billions(model_params(lite).evaluate_total(vl)),
        "lite_official_total": DEEPSEEK_OFFICIAL["deepseek-v2-lite"]["total"] + "B",
        "lite_act_b": fmt_billions(lite_act),
        "lite_act_ne_b": fmt_billions(lite_act_ne),
        "lite_emb_b": fmt_billions(lite_emb),
        "lite_official_act": DEEPSEEK_OFFICIAL["deepseek-v2-lite"]["activated"] + "B",
        "tie_saving": fmt_count(head),
        "tie_saving_gib": _gib(head),
        "tie_saving_share": _pct(head, total, 2),
        "bf16_bytes": str(RECIPES[train.precision].weights),
    }


@dataclass(frozen=True)
class StageBars:
    """Stacked-bar data: one series per block, heights in GiB of bf16 weights (floats, figure only)."""

    x: list[int]
    series: list[dict]
    xlabel: str
    ylabel: str
    ymax: float  #: top of the y axis, with headroom above the tallest bar


_FIG_GROUPS = (  # figure legend entry -> (blocks it sums, Okabe-Ito colour index)
    ("embedding", ("embedding",), 2), ("MLA", ("attention",), 1), ("RMSNorms", ("norms", "final_norm"), 6),
    ("dense FFN", ("dense_ffn",), 3), ("router", ("router",), 4), ("shared experts", ("shared_experts",), 5),
    ("routed experts", ("routed_experts",), 0), ("output head", ("head",), 7),
)


def stage_block_bars(part: Partition | None = None, unit: str = "GiB") -> StageBars:
    """Per-stage parameters (whole stage, before TP/EP) by block, as bf16 GiB, for a stacked bar."""
    part = part or v3_partition()
    per = [by_block(part.params_unsharded(s)).evaluate(part.values) for s in part.stages]
    bottoms = [0.0] * len(per)
    series = []
    for label, blocks, colour in _FIG_GROUPS:
        heights = [float(Fraction(weight_bytes(sum(p.get(b, 0) for b in blocks)), UNITS[unit])) for p in per]
        if not any(heights):
            continue
        series.append({"label": label, "color": PALETTE[colour], "heights": heights,
                       "bottoms": list(bottoms)})
        bottoms = [a + b for a, b in zip(bottoms, heights)]
    return StageBars(x=[s.index for s in part.stages], series=series, xlabel="pipeline stage",
                     ylabel=f"bf16 weights per stage ({unit})", ymax=max(bottoms) * 1.08)
