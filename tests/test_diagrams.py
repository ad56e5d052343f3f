"""The block diagrams (chapter 2) and the device-slicing picture (chapter 4): the data are memlib's own
tables (architecture, the paper's activation ledger, the partition), and the figures draw exactly that
data, read back box by box."""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from functools import lru_cache

import matplotlib
import pytest
import sympy as sp
from matplotlib.colors import to_hex

from memlib import estimate
from memlib.model.architecture import attention_tensors, dense_ffn_tensors, moe_tensors
from memlib.config import ZeroStage, load_model
from memlib.ledgers.paper import paper_layer
from memlib.paper import paper_training
from memlib.report import ch02_architecture as ch02
from memlib.report import ch04_static as ch04
from memlib.report.figures import CATEGORY_COLORS, CATEGORY_LABELS
from memlib.scenarios.models import block_nodes
from memlib.scenarios.static import device_coords, device_slices
from memlib.model.states import optimizer_states, recipe
from memlib.core.symbols import sym

matplotlib.use("Agg")


@lru_cache(maxsize=None)
def _estimate(model):
    return estimate(model, paper_training(model))


def by_key(nodes):
    return {n.key: n for n in nodes}


# ------------------------------------------------------------------------------------------------
# the data
# ------------------------------------------------------------------------------------------------
def test_mla_block_of_deepseek_v3_by_hand():
    """The paper's §3 convention: W^UQ, W^UK, W^UV, W^O split by TP; W^DQ, W^DKV, W^KR, W^QR and the norms
    whole; the latents split only by CP (W^DQ and W^DKV are not split), q, k, v by TP and CP."""
    n = by_key(block_nodes("deepseek-v3", "attention"))
    assert [k for k in n if k.startswith(("attention.W", "norms."))] == [
        "norms.attn_norm", "attention.W_DQ", "attention.W_DKV", "attention.W_KR", "attention.W_UQ", "attention.W_QR",
        "attention.W_UK", "attention.W_UV", "attention.W_O"]
    for k in ("attention.W_UQ", "attention.W_UK", "attention.W_UV", "attention.W_O"):
        assert n[k].sliced_by == ("TP",), k
    for k in ("attention.W_DQ", "attention.W_DKV", "attention.W_KR", "attention.W_QR", "attention.q_norm",
              "norms.attn_norm"):
        assert n[k].sliced_by == (), k
    assert n["attention.c_kv"].sliced_by == ("CP",) and n["attention.q"].sliced_by == ("TP", "CP")
    assert n["attention.norm_input"].sliced_by == ("SP", "CP")
    b, s = sym("b"), sym("s")
    assert n["attention.c_kv"].shape == (b * s, sym("d_c"))
    assert n["attention.softmax_out"].shape == (b, sym("n_h"), s, s)
    assert n["attention.W_UQ"].shape == (sym("n_h") * sym("d_h"), sym("d_cq"))
    # Megatron-Core splits W^QR with W^UQ
    assert by_key(block_nodes("deepseek-v3", "attention", "megatron"))["attention.W_QR"].sliced_by == ("TP",)


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2-lite", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b",
                                   "qwen3-235b-a22b"])
def test_nodes_are_the_tables_tensors_in_data_flow_order(model):
    """Every weight of the block's table appears once, with the table's shape, after the activation it
    reads; every saved activation (but masks and dropout outputs) appears once with the ledger's count."""
    est = _estimate(model)
    m = est.model
    blocks = ["attention"] + (["moe"] if m.has_moe else ["dense_ffn"])
    for block in blocks:
        nodes = block_nodes(m, block)
        weights = [n for n in nodes if n.category == "parameters"]
        table = attention_tensors(m) if block == "attention" else (moe_tensors(m) if block == "moe" else None)
        if table is not None:
            assert sorted((t.key, str(t.shape)) for t in table) == sorted(
                (n.key, str(n.shape)) for n in weights if not n.key.startswith("norms."))
        check_reads(nodes)
        kind = "moe" if m.has_moe else "dense"
        ledger = {e.key: e for e in paper_layer(m, kind)}
        acts = [n for n in nodes if n.category == "activations"]
        for a in acts:
            assert sp.expand(a.numel - ledger[a.key].elements) == 0, a.key
        assert nodes[0].category == "activations"                 # data flows in from the block's input
        assert len({n.key for n in nodes}) == len(nodes)


def check_reads(nodes):
    """A weight reads the activation drawn last before it: its input width (last dimension) divides that
    activation's width (a per-head norm reads one head of n_h); biases and norms' biases excepted."""
    last = None
    for n in nodes:
        if n.category == "activations":
            last = n
        elif not (n.key.split(".")[1].startswith("b_") or n.key.endswith("_bias")):
            den = sp.fraction(sp.cancel(last.shape[-1] / n.shape[-1]))[1]
            assert den == 1, (n.key, n.shape, last.key, last.shape)


@pytest.mark.parametrize("change", [dict(qkv_bias=True, o_bias=True, mlp_bias=True, norm="layernorm"),
                                    dict(mlp="gelu", mlp_bias=True)])
def test_biases_layernorms_and_gelu_are_drawn(change):
    """Every weight of the variant's tables is drawn once, biases with their weights' slicing."""
    m = dataclasses.replace(load_model("llama-3-8b"), **change)
    tables = {"attention": attention_tensors(m), "dense_ffn": dense_ffn_tensors(m)}
    for block, table in tables.items():
        nodes = block_nodes(m, block)
        check_reads(nodes)
        drawn = by_key(nodes)
        assert {t.key for t in table} <= set(drawn)
        for t in table:
            if t.kind == "bias":
                assert drawn[t.key].sliced_by == (("TP",) if t.tp_dim is not None else ()), t.key


def test_no_moe_block_for_a_dense_model():
    with pytest.raises(ValueError, match="no MoE"):
        block_nodes("llama-3-8b", "moe")
    v = ch02.block_values(_estimate("llama-3-8b"))
    assert "no MLA" in v["diagram_attention"] and "no MoE" in v["diagram_ffn"]


def test_device_slices_of_the_papers_configuration_by_hand():
    """PP16 TP2 EP8 DP32 under ZeRO-1: the split MLA weights 1/TP, the routed experts 1/EP (32 of 256 per
    device), optimizer states a further 1/(DP CP) or 1/EDP."""
    est = _estimate("deepseek-v3")
    d = device_slices(est, rank=5, zero=ZeroStage.OS)
    assert (d["pp"], d["ranks"], d["zero"]) == (16, 64, 1)
    assert d["coords"] == {"tp": 1, "cp": 0, "dp": 2, "etp": 0, "ep": 5, "edp": 0}
    assert d["experts"] == (160, 191)
    f = {(x["block"], x["sharding"]): x for x in d["families"]}
    assert f[("attention", "tp")]["parameters"] == Fraction(1, 2)
    assert f[("attention", "tp")]["optimizer_states"] == Fraction(1, 64)
    assert f[("attention", "replicated")]["optimizer_states"] == Fraction(1, 32)
    assert f[("routed_experts", "expert")]["parameters"] == Fraction(1, 8)
    assert f[("routed_experts", "expert")]["optimizer_states"] == Fraction(1, 64)
    assert all(x["gradients"] == x["parameters"] for x in d["families"])            # ZeRO-1 keeps gradients
    assert device_slices(est, rank=5)["families"][0]["optimizer_states"] == d["families"][0]["parameters"]


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2-lite", "llama-3-8b"])
def test_device_slices_add_up_to_the_partition_and_the_states(model):
    """Share x elements summed over the families is what memlib's partition stores on the device, and
    the ZeRO-1 optimizer-state count (ceilings per group) is what memlib.model.states counts."""
    est = _estimate(model)
    part = est.partition
    d = device_slices(est, zero=ZeroStage.OS)
    st = part.stages[d["stage"]]
    assert sum(x["parameters"] * x["elements"] for x in d["families"]) == part.params(st).evaluate_total(part.values)
    groups: dict[int, Fraction] = {}
    for x in d["families"]:
        groups[x["zero_group"]] = groups.get(x["zero_group"], 0) + x["parameters"] * x["elements"]
    # the expert and non-expert groups each rounded up to whole elements, as ZeRO pads them
    want = sum(-(-int(p) // g) for g, p in groups.items()) if len(groups) == 2 else None
    if want is not None and est.train.edp != est.train.dp * est.train.cp:
        rec = recipe(est.train.with_(zero=1).precision)
        est1 = estimate(model, est.train.with_(zero=1))
        assert optimizer_states(est1.partition, st).total == want * rec.optimizer_bytes


def test_device_coords_cover_every_rank_once():
    t = paper_training("deepseek-v3")
    coords = [device_coords(t, r) for r in range(t.dp * t.tp * t.cp)]
    assert len({(c["tp"], c["cp"], c["dp"]) for c in coords}) == len(coords)
    assert len({(c["etp"], c["ep"], c["edp"]) for c in coords}) == len(coords)


# ------------------------------------------------------------------------------------------------
# the figures, read back
# ------------------------------------------------------------------------------------------------
def drawn_boxes(fig):
    ax = fig.axes[0]
    boxes = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("node:")}
    texts = {t.get_gid(): t.get_text() for t in ax.texts if (t.get_gid() or "").startswith("text:")}
    arrows = [p for p in ax.patches if (p.get_gid() or "").startswith("arrow:")]
    return ([(to_hex(boxes[f"node:{i}"].get_facecolor(), keep_alpha=False), texts[f"text:{i}"])
             for i in range(len(boxes))], arrows, ax)


@pytest.mark.parametrize("model", ["deepseek-v3", "llama-3-8b"])
@pytest.mark.parametrize("block", ["attention", "ffn"])
def test_block_figure_draws_the_nodes(model, block):
    est = _estimate(model)
    fig = ch02.block_figure(est, block)
    drawn, arrows, ax = drawn_boxes(fig)
    b = block if block == "attention" else ("moe" if est.model.has_moe else "dense_ffn")
    nodes = block_nodes(est.model, b)
    assert len(drawn) == len(nodes) and len(arrows) == len(nodes) - 1
    for (color, text), n in zip(drawn, nodes):
        name, shape, sliced, cat = ch02.block_node_text(n)
        assert color == CATEGORY_COLORS[n.category].lower()
        assert text.splitlines() == [name, shape, f"sliced by: {sliced}"]
        assert sliced == (", ".join(n.sliced_by) or "none")
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert legend == {CATEGORY_LABELS["parameters"], CATEGORY_LABELS["activations"]}
    fig.canvas.draw()                                   # every name and shape typesets
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("model", ["deepseek-v3", "llama-3-8b"])
def test_device_figure_draws_the_slices(model):
    est = _estimate(model)
    fig = ch04.device_figure(est, zero=ZeroStage.OS)
    d = device_slices(est, zero=ZeroStage.OS)
    grid, bars = fig.axes[0], fig.axes[1]
    outline = [p.get_gid() for p in grid.patches if (p.get_gid() or "").startswith("device:")]
    assert outline == [f"device:{d['stage']}:{d['rank']}"]
    assert grid.images[0].get_array().shape == (d["pp"], d["ranks"])
    for c in bars.containers:
        key = next(k for k, v in CATEGORY_LABELS.items() if v == c.get_label())
        assert [p.get_width() for p in c.patches] == [float(f[key]) for f in d["families"]]
        assert to_hex(c.patches[0].get_facecolor(), keep_alpha=False) == CATEGORY_COLORS[key].lower()
    labels = [t.get_text() for t in bars.get_yticklabels()]
    assert labels == [f["label"] for f in d["families"]]
    assert ("MLA" in " ".join(labels)) == (est.model.attention == "mla")
    assert all(v for v in ch04.device_values(est, zero=ZeroStage.OS).values())
    fig.canvas.draw()
    matplotlib.pyplot.close(fig)
