"""The diagrams: a block as a dataflow (chapter 2, :mod:`memlib.scenarios.dataflow`) and one pipeline stage's
ranks with one rank's slices (chapter 4, :func:`memlib.scenarios.static.stage_groups`, ``device_slices``).
The data are memlib's own tables (architecture, the paper's activation ledger, the partition); the drawings
are read back from Graphviz's layout of them."""
from __future__ import annotations

import html
import random
import re
import shutil
from fractions import Fraction
from functools import lru_cache

import pytest
import sympy as sp

from memlib import estimate
from memlib.core.words import number_word
from memlib.config import PRESETS, ZeroStage, load_model
from memlib.config.model import model_from_dict
from memlib.ledgers.paper import paper_layer
from memlib.model.architecture import (attention_tensors, block_kinds, block_norm_tensors, dense_ffn_tensors,
                                       moe_tensors)
from memlib.paper import paper_training
from memlib.paper.parameters import mla_widths
from memlib.report import ch02_architecture as ch02
from memlib.report import ch04_static as ch04
from memlib.report import diagrams as dg
from memlib.report.format import span
from memlib.scenarios import dataflow as df
from memlib.scenarios.static import device_coords, device_slices, stage_groups
from memlib.config.precision import recipe
from memlib.model.states import optimizer_states
from memlib.core.symbols import sym

from test_architectures import _random

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


@lru_cache(maxsize=None)
def _estimate(model):
    return estimate(model, paper_training(model))


def _variants():
    """Every preset, and random tiny models of every family transformers builds (biases, LayerNorms, GeLU
    MLPs, learned positions, q/k norms, Qwen2-MoE's gated shared expert)."""
    out = [load_model(p) for p in PRESETS]
    for family in ("llama", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt2"):
        r = random.Random(f"issue-24-{family}")
        out += [model_from_dict(_random(family, r)) for _ in range(2)]
    # Megatron-LM's MoE without --swiglu: GeLU experts, biased (and the router) without --disable-bias-linear
    from dataclasses import replace
    mix = model_from_dict(_random("mixtral", random.Random("issue-22-gelu-experts")))
    out += [replace(mix, name="gelu-experts-biased", mlp="gelu", hidden_act="gelu", mlp_bias=True, o_bias=True),
            replace(mix, name="gelu-shared-experts", mlp="gelu", hidden_act="gelu", n_shared_experts=1, moe="deepseek")]
    return out


VARIANTS = _variants()


def _blocks(m):
    return ["attention", df.ffn_block(m)]


def _table(m, block):
    norm = "norms.attn_norm" if block == "attention" else "norms.ffn_norm"
    tables = {"attention": attention_tensors, "moe": moe_tensors, "dense_ffn": dense_ffn_tensors}
    return [t for t in block_norm_tensors(m) if t.key.removesuffix("_bias") == norm] + tables[block](m)


def _edges(g):
    return {(e.src, e.dst, tuple(t.key for t in e.weights)) for e in g.edges}


# ------------------------------------------------------------------------------------------------
# the data: a block as a dataflow
# ------------------------------------------------------------------------------------------------
def test_mla_of_deepseek_v3_by_hand():
    """The query branch (W^DQ and its RMSNorm into c^Q; W^UQ, and W^QR with RoPE, into q), the key-value
    branch (W^DKV and its RMSNorm into c^KV; W^UK into k, W^UV into v; W^KR with RoPE into the shared k^R,
    copied to every head's key) meet at the attention, then W^O and the residual.  Inference caches c^KV
    and k^R: d_c + d_h^R elements per token and layer, the paper's count (mla_widths)."""
    g = df.block_flow("deepseek-v3", "attention")
    a = "attention."
    assert _edges(g) >= {
        ("input", "normed", ("norms.attn_norm",)), ("normed", "c_q", (a + "W_DQ", a + "q_norm")),
        ("c_q", "q", (a + "W_UQ",)), ("c_q", "q", (a + "W_QR",)), ("normed", "c_kv", (a + "W_DKV", a + "kv_norm")),
        ("c_kv", "k", (a + "W_UK",)), ("c_kv", "v", (a + "W_UV",)), ("normed", "k_rope", (a + "W_KR",)),
        ("k_rope", "k", ()), ("q", "scores", ()), ("k", "scores", ()), ("v", "mix", ()),
        ("context", "add", (a + "W_O",)), ("input", "add", ())}
    rope = {(e.src, e.dst) for e in g.edges if "RoPE" in e.ops}
    assert rope == {("c_q", "q"), ("normed", "k_rope")}
    assert [e for e in g.edges if e.residual] == [e for e in g.edges if (e.src, e.dst) == ("input", "add")]
    cached = [n for n in g.nodes if n.cached]
    assert [n.id for n in cached] == ["c_kv", "k_rope"]
    m = load_model("deepseek-v3")
    widths = {sym("d_c"): m.kv_lora_rank, sym("d_hR"): m.qk_rope_head_dim}
    assert sum(int(n.width.xreplace(widths)) for n in cached) == mla_widths(m)["kv_cache"]
    assert not g.node("k_rope").saved and g.node("c_kv").keys == (a + "c_kv",)
    # the paper's §3 convention splits the up-projections and W^O by TP; Megatron-Core W^QR too
    split = {t.key: s for e in g.edges for t, s in zip(e.weights, e.sliced_by)}
    assert {k for k, s in split.items() if s == ("TP",)} == {a + "W_UQ", a + "W_UK", a + "W_UV", a + "W_O"}
    mg = {t.key: s for e in df.block_flow("deepseek-v3", "attention", "megatron").edges
          for t, s in zip(e.weights, e.sliced_by)}
    assert mg[a + "W_QR"] == ("TP",)


def test_mla_without_query_compression_projects_queries_from_the_input():
    g = df.block_flow("deepseek-v2-lite", "attention")
    assert ("normed", "q", ("attention.W_Q",)) in _edges(g) and ("normed", "q", ("attention.W_QR",)) in _edges(g)
    assert "c_q" not in {n.id for n in g.nodes}


@pytest.mark.parametrize("m", VARIANTS, ids=lambda m: m.name if m.name != "custom" else f"{m.family}")
def test_every_tensor_and_every_saved_entry_is_drawn_once(m):
    """Every tensor of the block's tables is on exactly one edge; every entry of the paper's ledger for the
    block but masks and dropout outputs sits on exactly one value, with the ledger's shape; data flows from
    the block's input to its residual sum, without a cycle."""
    for block in _blocks(m):
        g = df.block_flow(m, block)
        assert sorted(t.key for t in g.weights) == sorted(t.key for t in _table(m, block))
        kind = "moe" if m.has_moe else "dense"
        ledger = {e.key: e for e in paper_layer(m, kind) if e.key.startswith(block + ".") and not df.skipped(e)}
        placed = [k for n in g.nodes for k in n.keys]
        assert sorted(placed) == sorted(ledger)
        for n in g.nodes:
            for k, shape in zip(n.keys, n.shapes):
                assert sp.expand(sp.Mul(*shape) - ledger[k].elements) == 0, k
        ids = [n.id for n in g.nodes]
        assert len(set(ids)) == len(ids) and {e.src for e in g.edges} | {e.dst for e in g.edges} <= set(ids)
        # every node lies on a path from the input to the sum, and the edges have an order (no cycle)
        succ: dict[str, set] = {}
        for e in g.edges:
            succ.setdefault(e.src, set()).add(e.dst)
        reach, todo = {"input"}, ["input"]
        while todo:
            for d in succ.get(todo.pop(), ()):
                if d not in reach:
                    reach.add(d)
                    todo.append(d)
        assert reach == set(ids), set(ids) - reach
        indeg = {i: 0 for i in ids}
        for e in g.edges:
            indeg[e.dst] += 1
        ready, seen = [i for i in ids if not indeg[i]], 0
        while ready:
            i = ready.pop()
            seen += 1
            for e in g.edges:
                if e.src == i:
                    indeg[e.dst] -= 1
                    if not indeg[e.dst]:
                        ready.append(e.dst)
        assert seen == len(ids)                                   # a topological order exists: no cycle


@pytest.mark.parametrize("m", VARIANTS, ids=lambda m: m.name if m.name != "custom" else f"{m.family}")
def test_the_models_own_blocks(m):
    """Grouped-query attention caches its keys and values; RoPE only where the model has it, head norms only
    with qk_norm; an MoE layer has its router, dispatch and combine, shared experts only where it has them,
    the router's bias only with noaux_tc."""
    g = df.block_flow(m, "attention")
    ops = {o for e in g.edges for o in e.ops}
    assert ("RoPE" in ops) == (m.positions == "rope")
    if m.attention != "mla":
        assert [n.id for n in g.nodes if n.cached] == ["k", "v"]
        norms = {t.key for t in g.weights} & {"attention.q_head_norm", "attention.k_head_norm"}
        assert bool(norms) == m.qk_norm
    if m.has_moe:
        g = df.block_flow(m, "moe")
        ids = {n.id for n in g.nodes}
        assert {"dispatch", "combine", "routing", "routed_in"} <= ids
        assert ("shared" in g.groups) == block_kinds(m)["shared"] == ("shared_in" in ids)
        assert ("router.e_score_correction_bias" in {t.key for t in g.weights}) == m.router_bias
        assert ("scores", "combine", ()) in _edges(g)             # the combine weighs by the router
    else:
        with pytest.raises(ValueError, match="no MoE"):
            df.block_flow(m, "moe")


def test_a_saved_entry_with_no_place_is_an_error(monkeypatch):
    """A ledger entry the graph does not place stops the diagram (it is never dropped silently)."""
    from memlib.ledgers.base import Saved

    def more(m, kind):
        return paper_layer(m, kind) + [Saved("attention.extra", "a new saved tensor", sym("b") * sym("s"))]

    monkeypatch.setattr(df, "paper_layer", more)
    with pytest.raises(KeyError, match="attention.extra"):
        df.block_flow("deepseek-v3", "attention")


# ------------------------------------------------------------------------------------------------
# the drawing of a block
# ------------------------------------------------------------------------------------------------
def test_latex_becomes_typeset_labels():
    assert dg.latex_html("W^{DQ}", 10) == 'W<SUP><FONT POINT-SIZE="8">DQ</FONT></SUP>'
    # a subscript before a superscript of the same base; primes; a script's script no smaller
    assert dg.latex_html("d^{R}_{h}", 10) == 'd<SUB><FONT POINT-SIZE="8">h</FONT></SUB><SUP><FONT POINT-SIZE="8">R</FONT></SUP>'
    assert dg.latex_html("d_{c'}", 10) == 'd<SUB><FONT POINT-SIZE="8">c′</FONT></SUB>'
    assert dg.latex_html(r"\mathrm{RMSNorm}(c^{KV})", 10).startswith("RMSNorm(c<SUP>")
    assert dg.latex_html(r"q k^{\top}", 10) == 'q k<SUP><FONT POINT-SIZE="8">⊤</FONT></SUP>'
    with pytest.raises(ValueError, match=r"\\frac"):
        dg.latex_html(r"\frac{a}{b}")
    # every label memlib's tables give a diagram typesets: no backslash, brace or caret is left
    for m in VARIANTS:
        for block in _blocks(m):
            for t in df.block_flow(m, block).weights:
                html = dg.latex_html(t.latex)
                assert not any(c in html for c in "\\{}^_"), (t.key, html)


def _drawn(d):
    """name -> the attributes and texts ``dot`` laid out, per node and per edge."""
    lay = d.layout
    nodes = {o["name"]: o for o in lay.get("objects", []) if "nodes" not in o}
    texts = lambda o: "".join(op["text"] for k in ("_ldraw_",) for op in o.get(k, []) if op.get("op") == "T")  # noqa: E731
    return nodes, [(lay["objects"][e["tail"]]["name"], lay["objects"][e["head"]]["name"], texts(e))
                   for e in lay.get("edges", [])], texts


@needs_dot
@pytest.mark.parametrize("model", ["deepseek-v3", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_the_flow_diagram_draws_the_graph(model):
    """Read back from dot's layout: every value and operation is drawn, a saved value filled, a cached one
    outlined in the cache's colour; every edge drawn with its weights' names; the figure fits the PDF's
    text block and its smallest text is 8 pt."""
    from memlib.report.legibility import legibility

    m = load_model(model)
    for block in _blocks(m):
        g = df.block_flow(m, block)
        d = ch02.block_figure(_estimate(model), "attention" if block == "attention" else "ffn")
        nodes, edges, texts = _drawn(d)
        assert set(nodes) == {n.id for n in g.nodes}
        for n in g.nodes:
            o = nodes[n.id]
            assert ("filled" in o.get("style", "")) == (n.saved or n.kind == "op"), n.id
            assert (o.get("color") == dg.CACHE_COLOR) == n.cached, n.id
            assert n.text.split("\n")[0].split("$")[0].strip() in texts(o) or n.label, n.id
        assert len(edges) == len(g.edges)
        for e in g.edges:
            drawn = [t for s, dd, t in edges if (s, dd) == (e.src, e.dst)]
            # W^{DQ} is drawn as "W" then "DQ": every weight's name, its scripts run in, is on the edge
            names = [html.unescape(re.sub(r"<[^>]+>", "", dg.latex_html(t.latex))) for t in e.weights]
            assert any(all(n in t.replace("\u200b", "") for n in names) for t in drawn), (e.src, e.dst, names, drawn)
        w, h = d.size_pt
        assert w <= 72 * 6.5 and h <= 72 * 8.5          # printed whole, with room on its page for a caption
        assert legibility(d).ok, legibility(d)


@needs_dot
def test_a_diagram_renders_the_same_bytes_twice():
    d = ch02.block_figure(_estimate("deepseek-v3"), "attention")
    again = dg.Diagram(d.source)
    assert d.pdf == again.pdf and d.svg == again.svg
    assert d.svg.startswith("<?xml") and "<text" not in d.svg          # glyphs as outlines: the same everywhere
    bundle = d._repr_mimebundle_()
    assert set(bundle) == {"image/svg+xml", "application/pdf", "text/plain"}


@needs_dot
@pytest.mark.parametrize("figure", ["attention", "ffn", "stage"])
def test_the_pdf_is_the_size_the_measure_reads(figure):
    """The PDF the LaTeX book prints has the SVG's size (the one the legibility measure scales by): ``dot -Tpdf``
    adds a half-inch margin on every side unless the graph sets ``margin=0``, which shrank every diagram's text
    in the PDF below what the measure read (the stage diagram's 10 pt to 8 pt, its scripts below 8 pt) and made
    the MoE layer's figure taller than the page."""
    import subprocess
    import tempfile

    est = _estimate("deepseek-v3")
    d = ch04.device_figure(est, zero=ZeroStage.OS) if figure == "stage" else ch02.block_figure(est, figure)
    with tempfile.NamedTemporaryFile(suffix=".pdf") as f:
        f.write(d.pdf)
        f.flush()
        if shutil.which("pdfinfo") is None:
            pytest.skip("poppler's pdfinfo is not installed")
        info = subprocess.run(["pdfinfo", f.name], capture_output=True, text=True, check=True).stdout
    w, h = map(float, re.search(r"Page size:\s+([\d.]+) x ([\d.]+) pts", info).groups())
    assert abs(w - d.size_pt[0]) < 1 and abs(h - d.size_pt[1]) < 1, (w, h, d.size_pt)


# ------------------------------------------------------------------------------------------------
# one pipeline stage: the rank groups and one rank's slices
# ------------------------------------------------------------------------------------------------
def test_stage_groups_of_the_papers_configuration_by_hand():
    """PP16@TP2@EP8, DP32: 32 TP pairs of consecutive ranks, 8 EP groups of 8 consecutive ranks (each holds
    every routed expert once), 8 EDP groups of the ranks 8 apart (the same experts), 2 DP groups of 32."""
    g = stage_groups(paper_training("deepseek-v3"))
    assert g["tp"][:2] == [(0, 1), (2, 3)] and len(g["tp"]) == 32
    assert g["ep"][0] == tuple(range(8)) and len(g["ep"]) == 8
    assert g["edp"][1] == tuple(range(1, 64, 8)) and len(g["edp"]) == 8
    assert g["dp"] == [tuple(range(0, 64, 2)), tuple(range(1, 64, 2))]
    assert g["cp"] == [(r,) for r in range(64)] and g["etp"] == [(r,) for r in range(64)]


@pytest.mark.parametrize("sizes", [dict(tp=2, dp=32, cp=1, ep=8, etp=1), dict(tp=4, dp=4, cp=2, ep=4, etp=2),
                                   dict(tp=1, dp=8, cp=1, ep=1, etp=1)])
def test_stage_groups_partition_the_ranks_by_their_coordinates(sizes):
    """Each kind of group covers every rank once, and its ranks agree on every other coordinate and differ in
    its own."""
    t = paper_training("deepseek-v3").with_(**sizes)
    g = stage_groups(t)
    n = t.dp * t.tp * t.cp
    for name, groups in g.items():
        assert sorted(r for grp in groups for r in grp) == list(range(n)), name
        size = {"tp": t.tp, "cp": t.cp, "dp": t.dp, "etp": t.etp, "ep": t.ep, "edp": t.edp}[name]
        assert all(len(grp) == size for grp in groups), name
        for grp in groups:
            coords = [device_coords(t, r) for r in grp]
            assert len({c[name] for c in coords}) == len(grp), name


def test_device_slices_of_the_papers_configuration_by_hand():
    """PP16 TP2 EP8 DP32 under ZeRO-1: the split MLA weights 1/TP, the routed experts 1/EP (32 of 256 per
    device), optimizer states a further 1/(DP CP) or 1/EDP."""
    est = _estimate("deepseek-v3")
    d = device_slices(est, rank=5, zero=ZeroStage.OS)
    assert (d["pp"], d["ranks"], d["zero"]) == (16, 64, 1)
    assert d["coords"] == {"tp": 1, "cp": 0, "dp": 2, "etp": 0, "ep": 5, "edp": 0}
    assert d["experts"] == (160, 191) and d["experts_of_ep"][5] == (160, 191) and len(d["experts_of_ep"]) == 8
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
    want = sum(-(-int(p) // g) for g, p in groups.items()) if len(groups) == 2 else None
    if want is not None and est.train.edp != est.train.dp * est.train.cp:
        rec = recipe(est.train.with_(zero=1).precision)
        est1 = estimate(model, est.train.with_(zero=1))
        assert optimizer_states(est1.partition, st).total == want * rec.optimizer_bytes


@needs_dot
@pytest.mark.parametrize("model", ["deepseek-v3", "llama-3-8b"])
def test_the_stage_diagram_draws_every_rank_and_the_slices(model):
    """Read back from dot's layout: the pipeline's stages, every rank of the stage (the paper's 64), the
    outlined rank's families with their fractions, the routed experts over the columns where there is EP."""
    est = _estimate(model)
    d = ch04.device_figure(est, zero=ZeroStage.OS)
    s = device_slices(est, zero=ZeroStage.OS)
    nodes, _, texts = _drawn(d)
    assert set(nodes) == {"pipe", "grid", "slices"}
    pipe = [op["text"] for op in nodes["pipe"]["_ldraw_"] if op.get("op") == "T"]
    assert [str(i) for i in range(s["pp"])] == [t for t in pipe if t.isdigit()]
    grid = [op["text"] for op in nodes["grid"]["_ldraw_"] if op.get("op") == "T"]
    assert sorted(int(t) for t in grid if t.isdigit()) == list(range(s["ranks"]))
    spans = [t for t in grid if "–" in t and not t.startswith(("ranks", "EP"))]
    assert spans == ([span(a, b) for a, b in s["experts_of_ep"]] if s["experts"] else [])
    table = texts(nodes["slices"])
    for f in s["families"]:
        assert f["label"] in table
        for c in ("parameters", "gradients", "optimizer_states"):
            assert ("whole" if f[c] == 1 else str(f[c])) in table
    assert f"rank {s['rank']} holds" in table


def test_rows_of_ranks_hold_whole_groups():
    """A row is one EP group where TP divides it (the paper's 8 ranks), whole TP and EP groups otherwise;
    without EP, whole TP groups making eight ranks."""
    assert dg.rank_row(2, 8, 64) == 8 and dg.rank_row(4, 2, 512) == 4 and dg.rank_row(2, 1, 64) == 8
    assert dg.rank_row(1, 1, 4) == 4 and dg.rank_row(3, 2, 24) == 6


def test_the_groups_in_words_follow_the_rows():
    est = estimate("deepseek-v3", paper_training("deepseek-v3").with_(tp=4, ep=2))
    v = ch04.device_values(est, zero=ZeroStage.OS)
    assert "each row holds 2 of them" in v["dev_groups"]
    v = ch04.device_values(_estimate("deepseek-v3"), zero=ZeroStage.OS)
    assert "each row is one of them (8 rows)" in v["dev_groups"]
    v = ch04.device_values(_estimate("llama-3-8b"), zero=ZeroStage.OS)
    assert "EP group" not in v["dev_groups"] and v["dev_colour"] == "its TP rank"


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2-lite", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_the_captions_name_the_models_own_blocks(model):
    """The diagrams' words come from the model's blocks: no MLA, latent or shared expert where it has none."""
    v = ch02.block_values(_estimate(model))
    m = load_model(model)
    text = " ".join(v.values())
    assert ("MLA" in text) == ("latent" in text) == (m.attention == "mla")
    assert ("shared expert" in text) == bool(block_kinds(m)["shared"])
    assert ("router" in text) == m.has_moe
    if m.attention != "mla":
        assert f"{number_word(m.num_key_value_heads)} key-value heads" in text
