"""The paper's §2 (Tables 2, 3 and 4): parameters per tensor, per layer, per pipeline stage and per
model, for any model and layout; the totals and activated counts beside DeepSeek's statements; MTP;
and the checks of the paper's printed values (DeepSeek-V3 only).

Every function returns exact integers (or :class:`~fractions.Fraction` shares); each total is the
sum of the named terms it returns beside it.  Rows of the paper's tables are keyed by the labels of
:data:`memlib.data.reference.PAPER` (``"3-59"``, ``"1-14"``).

>>> from memlib import PAPER_TRAINING, load_model
>>> from memlib.model.partition import Partition
>>> m = load_model("deepseek-v3")
>>> totals(m)["total"], layer_blocks(m)["mla"]
(671026404352, 187107328)
>>> [(r["key"], r["params"]) for r in stage_groups(Partition(m, PAPER_TRAINING))]
[('0', 14184415232), ('1-14', 46029144064), ('15', 12433972224)]
"""
from __future__ import annotations

from fractions import Fraction
from math import floor
from typing import Hashable, Sequence

import sympy as sp

from ..model.architecture import (
    Tensor, attention_tensors, block_norm_tensors, dense_ffn_tensors, embedding_tensors, head_tensors, moe_tensors,
    mtp_tensors,
)
from ..core.breakdown import Breakdown, exact_int
from ..config import ModelConfig, load_model
from ..model.params import (
    activated_params, buffer_params, by_block, expert_params, fp8_scales, layer_params, model_params, mtp_params,
)
from ..model.params import values as model_values
from ..model.partition import Partition, Stage, balanced_layout, default_layout
from ..data.reference import DEEPSEEK_OFFICIAL, PAPER
from ..config.precision import RECIPES
from ..core.units import UNITS, fmt_decimal
from . import PAPER_MODEL, is_paper_model, moe_stages

__all__ = [
    "weights", "model_tensors", "tensor_rows", "layer_blocks", "mla_widths", "gqa_widths", "expert_counts", "runs", "row_key",
    "layer_groups", "stage_groups", "stage_counts", "stage_summary", "STATEMENT_COUNTS", "largest_device",
    "layout_rule", "FIGURE_BLOCKS",
    "stage_block_weights", "routed_largest", "mtp_module", "totals", "official", "matches_printed",
    "official_rows", "printed_billions", "rounds_to", "per_layer_check", "printed_offset", "index_runs", "table3_check",
    "table4_check", "printed_stage_sum",
    "gib_from_billions", "gib_and_gb", "misread_gib", "paper_layers_of_stage", "is_paper_layout",
]


# ------------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------------
def weights(n: int, precision: str = "paper") -> int:
    """Bytes of ``n`` stored weights under a precision recipe (``paper``: bf16, 2 bytes each)."""
    return int(n) * RECIPES[precision].weights


def runs(seq: Sequence[Hashable]) -> list[tuple[Hashable, int, int]]:
    """Consecutive runs of equal items as ``(item, first index, last index)``.

    >>> runs(["dense", "dense", "moe", "moe", "moe"])
    [('dense', 0, 1), ('moe', 2, 4)]
    """
    out: list[tuple[Hashable, int, int]] = []
    for i, x in enumerate(seq):
        if out and out[-1][0] == x:
            out[-1] = (x, out[-1][1], i)
        else:
            out.append((x, i, i))
    return out


def index_runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive integers as ``(first, last)`` runs: stages 1 to 14 and 16 are ``[(1, 14), (16, 16)]``.

    >>> index_runs([1, 2, 3, 5])
    [(1, 3), (5, 5)]
    """
    xs = list(indices)
    return [(xs[a], xs[z]) for _, a, z in runs([x - k for k, x in enumerate(xs)])]


def row_key(first: int, last: int) -> str:
    """The label of a row of the paper's Tables 3 and 4: ``"3-59"``, or ``"0"`` for one."""
    return str(first) if first == last else f"{first}-{last}"


# ------------------------------------------------------------------------------------------------
# per tensor (the paper's Table 2, extended to every tensor)
# ------------------------------------------------------------------------------------------------
def model_tensors(m: ModelConfig) -> list[Tensor]:
    """One of each tensor of the main model, in the order of the tables: embedding, MLA, the block
    norms, the dense FFN (if the model has dense layers), the MoE block (if it has MoE layers), the
    final norm and the head."""
    kinds = set(m.layer_kinds)
    dense = dense_ffn_tensors(m) if "dense" in kinds else []
    moe = moe_tensors(m) if "moe" in kinds else []
    return embedding_tensors(m) + attention_tensors(m) + block_norm_tensors(m) + dense + moe + head_tensors(m)


def tensor_rows(m: ModelConfig) -> list[dict]:
    """The paper's Table 2 for every tensor of ``m``: the tensor, its numeric shape, its element
    count, the count of one expert (routed experts, stacked along N) and whether it is a buffer."""
    vals = model_values(m)
    rows = []
    for t in model_tensors(m):
        rows.append({
            "tensor": t, "shape": tuple(exact_int(d, vals) for d in t.shape), "count": exact_int(t.numel, vals),
            "per_expert": exact_int(sp.Mul(*t.shape[1:]), vals) if t.expert else None,
            "buffer": t.kind == "buffer",
        })
    return rows


# ------------------------------------------------------------------------------------------------
# per layer (eqs. 3.1-3.5 evaluated)
# ------------------------------------------------------------------------------------------------
def layer_blocks(m: ModelConfig) -> dict[str, int]:
    """Exact counts of one layer's blocks and of the model's ends:

    ``mla`` = ``mla_matrices`` + ``mla_latent_norms`` (eq. 3.1; ``mla_matrix_count`` matrices and
    ``mla_norm_count`` latent norms); ``norms`` (the two block RMSNorms, eq. 3.2); ``layer_norms`` =
    ``norms`` + ``mla_latent_norms`` (every RMSNorm of a layer); ``dense_ffn`` (eq. 3.3); ``router``,
    ``shared_experts``, ``routed_experts`` and their sum ``moe`` (eq. 3.4, the paper's "MoE FFN");
    ``expert`` (eq. 3.5); ``dense_layer`` = ``mla`` + ``norms`` + ``dense_ffn``; ``moe_layer`` = ``mla``
    + ``norms`` + ``moe``; ``embedding``, ``final_norm`` and ``head`` (0 when tied)."""
    vals = model_values(m)
    att = attention_tensors(m)
    mla_matrices = sum(exact_int(t.numel, vals) for t in att if t.kind == "matrix")
    mla_norms = sum(exact_int(t.numel, vals) for t in att if t.kind == "norm")
    # a kind the model has no layer of (a dense model's MoE block, Mixtral's dense FFN) counts 0
    moe = by_block(layer_params(m, "moe")).evaluate(vals) if "moe" in m.layer_kinds else {}
    dense = by_block(layer_params(m, "dense")).evaluate(vals) if "dense" in m.layer_kinds else {}
    norms = by_block(layer_params(m, m.layer_kinds[0])).evaluate(vals)["norms"]
    ends = by_block(Breakdown([(t.key, t.numel) for t in embedding_tensors(m) + head_tensors(m)])).evaluate(vals)
    out = {
        "mla": mla_matrices + mla_norms, "mla_matrices": mla_matrices, "mla_latent_norms": mla_norms,
        "mla_matrix_count": sum(1 for t in att if t.kind == "matrix"),
        "mla_norm_count": sum(1 for t in att if t.kind == "norm"),
        "norms": norms, "layer_norms": norms + mla_norms, "dense_ffn": dense.get("dense_ffn", 0),
        "router": moe.get("router", 0), "shared_experts": moe.get("shared_experts", 0),
        "routed_experts": moe.get("routed_experts", 0),
        "expert": exact_int(expert_params(m), vals),
        "embedding": ends["embedding"], "final_norm": ends["final_norm"], "head": ends.get("head", 0),
    }
    out["moe"] = out["router"] + out["shared_experts"] + out["routed_experts"]
    out["dense_layer"] = out["mla"] + out["norms"] + out["dense_ffn"]
    out["moe_layer"] = out["mla"] + out["norms"] + out["moe"]
    return out


def mla_widths(m: ModelConfig) -> dict[str, int | Fraction]:
    """MLA's widths per token and layer: ``qk`` = d_h + d_h^R (a query head's dot product),
    ``rope_share`` = d_h^R / qk; ``kv_cache`` = d_c + d_h^R (what inference caches); ``mha_kv`` =
    n_h (d_h + d_h^R) + n_h d_v (keys and values of multi-head attention with the same heads)."""
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    keys = m.num_attention_heads * qk
    vals = m.num_attention_heads * m.v_head_dim
    return {"qk": qk, "rope_share": Fraction(m.qk_rope_head_dim, qk), "kv_cache": m.kv_lora_rank + m.qk_rope_head_dim,
            "mha_keys": keys, "mha_values": vals, "mha_kv": keys + vals}


def gqa_widths(m: ModelConfig) -> dict[str, int]:
    """Grouped-query attention's widths per token and layer: ``kv_cache`` = 2 n_kv d_head (the keys and values
    inference caches), ``mha_kv`` = 2 n_h d_head (the same with one key-value head per query head) and ``group`` =
    n_h / n_kv, the query heads each key-value head serves."""
    return {"kv_cache": 2 * m.num_key_value_heads * m.head_dim, "mha_kv": 2 * m.num_attention_heads * m.head_dim,
            "group": m.num_attention_heads // m.num_key_value_heads}


def expert_counts(m: ModelConfig) -> dict[str, int]:
    """Layers by kind and experts in the whole model: ``dense_layers``, ``moe_layers``, ``routed``
    (``moe_layers`` x N), ``shared`` (``moe_layers`` x N_s)."""
    kinds = m.layer_kinds
    n_moe = kinds.count("moe")
    return {"dense_layers": kinds.count("dense"), "moe_layers": n_moe, "routed": n_moe * (m.n_routed_experts or 0),
            "shared": n_moe * m.n_shared_experts}


# ------------------------------------------------------------------------------------------------
# per layer group (the paper's Table 3) and per stage (its Table 4)
# ------------------------------------------------------------------------------------------------
def layer_groups(m: ModelConfig, precision: str = "paper") -> list[dict]:
    """The paper's Table 3 for ``m``: consecutive decoder layers with the same contents. Per row:
    ``first``, ``last``, ``count`` (layers), ``kind``, ``embedding`` and ``head`` (whether the row's
    layer carries the model's ends), ``terms`` (the layer, and the embedding, final norm and head
    where carried), ``params`` (each layer: their sum), ``bytes`` (its weights) and ``key`` (the
    paper's row label)."""
    b = layer_blocks(m)
    n = m.num_hidden_layers
    rows = []
    for (kind, first, last), a, z in runs([(k, i == 0, i == n - 1) for i, k in enumerate(m.layer_kinds)]):
        terms = {"layer": b[f"{kind}_layer"]}
        if first:
            terms["embedding"] = b["embedding"]
        if last:
            terms["final_norm"] = b["final_norm"]
            terms["head"] = b["head"]
        params = sum(terms.values())
        rows.append({"first": a, "last": z, "count": z - a + 1, "kind": kind, "embedding": first, "head": last,
                     "terms": terms, "params": params, "bytes": weights(params, precision), "key": row_key(a, z)})
    return rows


def _stage_signature(part: Partition, st: Stage) -> tuple:
    kinds = [part.model.layer_kinds[i] for i in st.layers]
    return (st.first, st.last, kinds.count("dense"), kinds.count("moe"))


def stage_counts(part: Partition) -> list[int]:
    """Parameters of each whole pipeline stage, before any TP/EP split (the paper's Table 4)."""
    return [part.params_unsharded(st).evaluate_total(part.values) for st in part.stages]


def stage_groups(part: Partition) -> list[dict]:
    """The paper's Table 4: consecutive pipeline stages with the same contents. Per row: ``first``,
    ``last`` (stages), ``stages`` (how many), ``layers`` (the first and last layer of the group),
    ``dense`` and ``moe`` (layers of each kind per stage), ``embedding``, ``head``, ``params`` (each
    stage, before TP/EP), ``bytes`` (its weights) and ``key`` (the paper's row label)."""
    counts = stage_counts(part)
    sigs = [_stage_signature(part, st) + (counts[st.index],) for st in part.stages]
    rows = []
    for (first, last, nd, nm, params), a, z in runs(sigs):
        layers = sorted(i for st in part.stages[a:z + 1] for i in st.layers)
        rows.append({"first": a, "last": z, "stages": z - a + 1, "layers": (layers[0], layers[-1]), "dense": nd,
                     "moe": nm, "embedding": first, "head": last, "params": params,
                     "bytes": weights(params, part.train.precision), "key": row_key(a, z)})
    return rows


def largest_device(part: Partition) -> dict:
    """The device that stores the most parameters (TP/EP split): ``params``, ``bytes`` (its weights),
    ``stages`` (every stage whose devices store that many) and ``per_stage`` (each stage's count)."""
    per = [part.params(st).evaluate_total(part.values) for st in part.stages]
    top = max(per)
    return {"params": top, "bytes": weights(top, part.train.precision),
            "stages": [i for i, x in enumerate(per) if x == top], "per_stage": per}


def layout_rule(part: Partition) -> str:
    """Which rule gave the layout: ``default`` (ceil(l/PP) layers per stage, the remainder on the
    last), ``balanced`` (:func:`memlib.model.partition.balanced_layout`) or ``given``."""
    m, t = part.model, part.train
    if t.vpp == 1:
        try:
            if part.layout == default_layout(m.num_hidden_layers, t.pp):
                return "default"
        except Exception:
            pass
        if 1 <= t.pp <= m.num_hidden_layers and part.layout == balanced_layout(m.num_hidden_layers, t.pp):
            return "balanced"
    return "given"


def stage_summary(part: Partition) -> dict:
    """The stage table in a few numbers: ``largest`` and ``largest_stages``, ``first`` and ``last``
    (stage 0 and the last stage), ``moe_stages`` (the stages of MoE layers only, which the paper
    analyses), ``largest_are_moe_stages``, ``dense_stages`` (the stages that hold dense layers) and
    ``sum`` (of every stage: the main model under a one-chunk schedule)."""
    counts = stage_counts(part)
    top = max(counts)
    largest = [i for i, x in enumerate(counts) if x == top]
    moe = moe_stages(part)
    m = part.model
    return {"largest": top, "largest_bytes": weights(top, part.train.precision), "largest_stages": largest,
            "first": counts[0], "last": counts[-1], "moe_stages": moe, "largest_are_moe_stages": largest == moe,
            "dense_stages": [st.index for st in part.stages if any(not m.is_moe_layer(i) for i in st.layers)],
            "sum": sum(counts)}


#: the blocks of the stage figure, in stacking order (``norms`` includes the final norm, ``head`` a
#: tied head's copy, ``mtp`` everything of the MTP modules)
FIGURE_BLOCKS = ("embedding", "attention", "norms", "dense_ffn", "router", "shared_experts", "routed_experts",
                 "head", "mtp")


def _figure_block(key: str) -> str:
    block = key.split(".")[0]
    if block == "mtp":
        return "mtp"
    return {"final_norm": "norms"}.get(block, block)


def stage_block_weights(part: Partition) -> list[dict[str, int]]:
    """Bytes of weights of each whole stage (before TP/EP) per block of :data:`FIGURE_BLOCKS`."""
    out = []
    for st in part.stages:
        per = part.params_unsharded(st).grouped(_figure_block).evaluate(part.values)
        out.append({b: weights(per.get(b, 0), part.train.precision) for b in FIGURE_BLOCKS})
    return out


def routed_largest(part: Partition) -> dict[str, int]:
    """In how many of the stages that hold an MoE layer the routed experts are the largest block
    (``routed_largest``), of ``moe_stages`` such stages."""
    m = part.model
    n = k = 0
    for st, per in zip(part.stages, stage_block_weights(part)):
        if any(m.is_moe_layer(i) for i in st.layers):
            n += 1
            k += per["routed_experts"] == max(per.values())
    return {"routed_largest": k, "moe_stages": n}


# ------------------------------------------------------------------------------------------------
# MTP and the model's totals
# ------------------------------------------------------------------------------------------------
def mtp_module(m: ModelConfig, j: int = 0) -> dict:
    """One MTP module's own parameters (DeepSeek-V3 report, §2.2), whether or not ``m`` has one:
    ``kind`` of its decoder block, the tensors of its own (``own``: (tensor, count) for the norms
    and the projection M), ``block`` (its decoder block) and ``total`` = the sum of both."""
    vals = model_values(m)
    tensors = [t for t in mtp_tensors(m, j) if t.kind != "buffer"]
    own = [(t, exact_int(t.numel, vals)) for t in tensors if t.key.count(".") == 1]
    block = sum(exact_int(t.numel, vals) for t in tensors if t.key.count(".") > 1)
    kind = "moe" if m.is_moe_layer(m.num_hidden_layers + j) else "dense"
    return {"kind": kind, "own": own, "block": block, "total": block + sum(n for _, n in own)}


def totals(m: ModelConfig) -> dict[str, int | Fraction]:
    """The model's counts (exact): ``total`` (main model: no MTP, no buffers) by block (``blocks``),
    ``routed`` (the routed experts) and ``routed_share``; ``activated`` (embedding counted whole),
    ``activated_no_embedding``, ``activated_share``; ``embedding``, ``head``, ``final_norm``; the MTP
    modules (``mtp_modules``; ``mtp`` = ``mtp_block`` + ``mtp_proj`` + ``mtp_norms``); ``mtp_copies``
    (the embedding and head a published checkpoint stores again with each MTP module),
    ``mtp_stored`` = ``mtp`` + ``mtp_copies`` and ``checkpoint`` = ``total`` + ``mtp_stored``; ``fp8_scales``
    (:func:`memlib.model.params.fp8_scales`: 0 unless the published checkpoint is block-FP8) and ``stored``, every
    element that checkpoint stores: ``checkpoint``, the scales and the buffers of the main model and the MTP
    modules; ``buffers``
    (the router's bias, main model only;
    ``bias_per_layer`` entries in each of ``moe_layers`` layers); ``tie_saving`` (what tying the head
    to the embedding would remove: the head, 0 when tied) and its share of ``total``."""
    vals = model_values(m)
    blocks = by_block(model_params(m)).evaluate(vals)
    total = model_params(m).evaluate_total(vals)
    act = activated_params(m).evaluate_total(vals)
    act_ne = activated_params(m, embedding=False).evaluate_total(vals)
    mtp = mtp_params(m)
    mtp_block = mtp.select(lambda k: k.count(".") > 1).evaluate_total(vals)
    mtp_proj = mtp.select(lambda k: k == "mtp.eh_proj").evaluate_total(vals)
    mtp_norms = mtp.select(lambda k: k in ("mtp.enorm", "mtp.hnorm", "mtp.final_norm")).evaluate_total(vals)
    n_mtp = m.num_nextn_predict_layers
    copies = n_mtp * (blocks["embedding"] + blocks.get("head", 0))
    mtp_total = mtp_block + mtp_proj + mtp_norms
    head = blocks.get("head", 0)
    buffers = buffer_params(m).evaluate_total(vals)
    mtp_buffers = sum(exact_int(t.numel, vals) for j in range(n_mtp) for t in mtp_tensors(m, j) if t.kind == "buffer")
    scales = fp8_scales(m)
    return {
        "total": total, "blocks": blocks, "routed": blocks.get("routed_experts", 0),
        "routed_share": Fraction(blocks.get("routed_experts", 0), total),
        "activated": act, "activated_no_embedding": act_ne, "activated_share": Fraction(act, total),
        "embedding": blocks["embedding"], "head": blocks.get("head", 0), "final_norm": blocks["final_norm"],
        "mtp_modules": n_mtp, "mtp": mtp_total, "mtp_block": mtp_block, "mtp_proj": mtp_proj, "mtp_norms": mtp_norms,
        "mtp_copies": copies, "mtp_stored": mtp_total + copies, "checkpoint": total + mtp_total + copies,
        "fp8_scales": scales, "stored": total + mtp_total + copies + scales + buffers + mtp_buffers,
        "buffers": buffers, "moe_layers": m.layer_kinds.count("moe"),
        "bias_per_layer": m.n_routed_experts if m.router_bias else 0,
        "tie_saving": head, "tie_saving_share": Fraction(head, total),
    }


# ------------------------------------------------------------------------------------------------
# DeepSeek's statements
# ------------------------------------------------------------------------------------------------
def official(m: ModelConfig | str) -> dict[str, str]:
    """What DeepSeek states for the model (model cards, reports, weights documentation), in billions
    as printed: the preset's entry of :data:`memlib.data.reference.DEEPSEEK_OFFICIAL`, DeepSeek-V3's for a
    configuration equal to it, nothing for another model."""
    m = load_model(m)
    if m.name in DEEPSEEK_OFFICIAL:
        return dict(DEEPSEEK_OFFICIAL[m.name])
    return dict(DEEPSEEK_OFFICIAL[PAPER_MODEL]) if is_paper_model(m) else {}


def printed_billions(printed: str) -> Fraction:
    """A printed count in billions (``"14.16B"``, ``"671"``) as an exact number of billions."""
    return Fraction(printed.rstrip("B").replace(",", ""))


def _decimals(printed: str) -> int:
    s = printed.rstrip("B").replace(",", "")
    return len(s.split(".")[1]) if "." in s else 0


def rounds_to(x: Fraction, printed: str) -> bool:
    """Whether ``x`` rounded (half away from zero) to the decimals of ``printed`` is ``printed``."""
    return Fraction(fmt_decimal(x, _decimals(printed)).replace(",", "")) == printed_billions(printed)


def printed_offset(x: Fraction, printed: str) -> Fraction:
    """``printed`` minus ``x`` rounded to the decimals of ``printed``: 0 where they agree, one unit
    of the last digit (0.01) where the printed value is that much higher."""
    return printed_billions(printed) - Fraction(fmt_decimal(x, _decimals(printed)).replace(",", ""))


def matches_printed(count: int, printed: str) -> dict:
    """A count beside a printed figure in billions: the ``printed`` value (billions), its ``digits``,
    whether the count ``rounds`` or ``truncates`` to it, and ``difference`` = printed - count
    (parameters the statement has beyond the count; negative: fewer)."""
    p = printed_billions(printed)
    d = _decimals(printed)
    x = Fraction(count, 10**9)
    return {"printed": p, "digits": d, "rounds": rounds_to(x, printed),
            "truncates": Fraction(floor(x * 10**d), 10**d) == p, "difference": int(p * 10**9) - count}


#: what each of DeepSeek's statements is about: the counts of :func:`totals` it is set beside
STATEMENT_COUNTS = {
    "total": ("total",),
    "activated": ("activated", "activated_no_embedding"),
    "activated_weights_doc": ("activated", "activated_no_embedding"),
    "mtp": ("mtp", "mtp_block"),
    "checkpoint": ("checkpoint", "stored"),
}


def official_rows(m: ModelConfig | str) -> list[dict]:
    """DeepSeek's statements for ``m`` beside memlib's counts: per statement and candidate count
    (:data:`STATEMENT_COUNTS`), the ``statement``, ``printed`` text, the ``quantity`` (a key of
    :func:`totals`), the ``count``, :func:`matches_printed` and ``closest`` (the candidate of the
    statement with the smallest |difference|)."""
    m = load_model(m)
    t = totals(m)
    rows = []
    stated = official(m)
    for statement in (k for k in STATEMENT_COUNTS if k in stated):
        printed = stated[statement]
        cands = [{"statement": statement, "printed_text": printed, "quantity": q, "count": t[q],
                  **matches_printed(t[q], printed)} for q in STATEMENT_COUNTS[statement]]
        best = min(abs(c["difference"]) for c in cands)
        rows += [{**c, "closest": abs(c["difference"]) == best} for c in cands]
    return rows


# ------------------------------------------------------------------------------------------------
# the paper's printed Tables 3 and 4 (DeepSeek-V3)
# ------------------------------------------------------------------------------------------------
def per_layer_check(m: ModelConfig) -> dict[str, dict]:
    """The paper's per-layer counts of §2 (MLA; router and experts, its "MoE FFN") beside memlib's:
    per block, ``count``, ``printed`` (None for another model) and ``equal``."""
    b = layer_blocks(m)
    paper = is_paper_model(m)
    out = {}
    for block, key in (("mla", "mla_per_layer"), ("moe", "moe_ffn_per_layer")):
        printed = PAPER[key] if paper else None
        out[block] = {"count": b[block], "printed": printed, "equal": printed == b[block]}
    return out


def gib_from_billions(count: int, digits: int = 2, precision: str = "paper") -> Fraction:
    """GiB of the weights of ``count`` parameters rounded first to ``digits`` decimals of billions
    (how a table computed from rounded counts gets its memory column)."""
    rounded = Fraction(fmt_decimal(Fraction(count, 10**9), digits).replace(",", ""))
    return Fraction(weights(int(rounded * 10**9), precision), UNITS["GiB"])


def _check(key: str, params: int, n_bytes: int, printed: dict | None) -> dict:
    row = {"key": key, "params": params, "bytes": n_bytes, "printed": printed}
    if printed is None:
        return {**row, "params_agree": None, "gib_agree": None}
    return {**row, "params_agree": rounds_to(Fraction(params, 10**9), printed["params"]),
            "gib_agree": rounds_to(Fraction(n_bytes, UNITS["GiB"]), printed["memory_gb"])}


def table3_check(m: ModelConfig, precision: str = "paper") -> list[dict]:
    """Each row of :func:`layer_groups` and the model total beside the paper's printed Table 3 row of
    the same label (``printed``: None where it prints none, or for another model): whether the count
    and the GiB round to the printed digits (``params_agree``, ``gib_agree``), and the GiB of the
    count rounded to two decimals of billions first (``gib_from_rounded``)."""
    paper = is_paper_model(m)
    rows = [{**_check(r["key"], r["params"], r["bytes"], PAPER["table3"].get(r["key"]) if paper else None),
             "gib_from_rounded": gib_from_billions(r["params"], 2, precision)} for r in layer_groups(m, precision)]
    t = totals(m)["total"]
    rows.append({**_check("total", t, weights(t, precision), PAPER["table3"]["total"] if paper else None),
                 "gib_from_rounded": gib_from_billions(t, 2, precision)})
    return rows


def table4_check(part: Partition) -> list[dict]:
    """Each row of :func:`stage_groups` beside the paper's printed Table 4 row of the same label
    (``printed``: None where there is none, or for another model); as :func:`table3_check`."""
    paper = is_paper_model(part.model)
    return [_check(r["key"], r["params"], r["bytes"], PAPER["table4"].get(r["key"]) if paper else None)
            for r in stage_groups(part)]


def paper_layers_of_stage(index: int) -> tuple[int, ...]:
    """The decoder layers of stage ``index`` in the paper's own layout (DeepSeek-V3 under
    PP16@TP2@EP8@ETP1)."""
    from ..config import PAPER_TRAINING

    return Partition(PAPER_MODEL, PAPER_TRAINING).stages[index].layers


def is_paper_layout(part: Partition) -> bool:
    """Whether ``part`` lays its layers over the stages as the paper does (DeepSeek-V3's 61 layers
    over PP16: fifteen stages of four, one of one)."""
    from ..config import PAPER_TRAINING

    return part.layout == Partition(PAPER_MODEL, PAPER_TRAINING).layout


def printed_stage_sum(layers: Sequence[int]) -> dict:
    """The sum of the paper's printed Table 3 counts of ``layers`` (each layer's row): ``terms``
    (row label, printed text) per layer and their ``sum`` in billions, exact."""
    ranges = [(k, tuple(int(x) for x in k.split("-"))) for k in PAPER["table3"] if k != "total"]
    terms = []
    for i in layers:
        key = next(k for k, r in ranges if r[0] <= i <= r[-1])
        terms.append((key, PAPER["table3"][key]["params"]))
    return {"terms": terms, "sum": sum((printed_billions(p) for _, p in terms), Fraction(0))}


# ------------------------------------------------------------------------------------------------
# units: the paper prints GiB under the label "GB"
# ------------------------------------------------------------------------------------------------
def gib_and_gb() -> dict[str, int | Fraction]:
    """A GiB and a GB in bytes, a GiB in GB (``gib_in_gb``) and how much larger, as a share, a size
    in GiB reads when written in GB (``excess`` = (GiB - GB) / GB)."""
    gib, gb = UNITS["GiB"], UNITS["GB"]
    return {"GiB": gib, "GB": gb, "gib_in_gb": Fraction(gib, gb), "difference": gib - gb,
            "excess": Fraction(gib - gb, gb)}


def misread_gib(n_bytes: int, digits: int = 2) -> dict[str, int | Fraction]:
    """``n_bytes`` printed in GiB to ``digits`` decimals (``printed``) and read as decimal GB: the
    bytes that reading budgets (``budget``), the ``shortfall`` = ``n_bytes`` - ``budget``, its share
    of the budget (``shortfall_share``; None for a budget of zero) and whether the printed digits round the
    GiB up (``rounded_up``)."""
    printed = Fraction(fmt_decimal(Fraction(n_bytes, UNITS["GiB"]), digits).replace(",", ""))
    budget = int(printed * UNITS["GB"])
    shortfall = n_bytes - budget
    return {"printed": printed, "budget": budget, "shortfall": shortfall,
            "shortfall_share": Fraction(shortfall, budget) if budget else None,
            "rounded_up": printed * UNITS["GiB"] > n_bytes}
