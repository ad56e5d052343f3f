"""One decoder-layer block as a dataflow graph, for the book's diagrams: the values a token's hidden state
becomes (nodes) and the weights and operations that turn one into the next (edges), with what training
saves for backward and what inference caches marked on the values.

:func:`block_flow` builds the graph of a block of a model (``attention``: MLA, or grouped-query /
multi-head attention; ``moe``: router, dispatch, routed experts beside the shared ones, combine;
``dense_ffn``) from memlib's own tables:

- every weight (and bias, norm weight, router buffer) of the block is one of the
  :mod:`memlib.model.architecture` tensors, drawn on the edge it transforms, with the slicing the partition
  profile gives it (:data:`memlib.model.profiles.PROFILES`);
- every value the paper's ledger (:func:`memlib.ledgers.paper.paper_layer`) saves for backward is placed
  on exactly one value node, with the ledger's shape; masks and dropout outputs are left out (they sit
  beside the value they mask);
- the values inference keeps in its KV cache are marked: MLA's key-value latent and shared RoPE key
  (``d_c + d_h^R`` elements per token and layer, :func:`memlib.paper.parameters.mla_widths`), or the keys
  and values of grouped-query attention.

A block the model lacks raises :class:`ValueError`; a tensor of the block's table or an entry of its
ledger the graph has no place for raises :class:`KeyError` (a diagram never drops one silently).

>>> g = block_flow("deepseek-v3", "attention")
>>> [n.id for n in g.nodes if n.cached]
['c_kv', 'k_rope']
>>> sorted(k for n in g.nodes for k in n.keys)[:3]
['attention.c_kv', 'attention.c_q', 'attention.context']
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from ..config import ModelConfig, load_model
from ..core.symbols import sym
from ..ledgers.paper import paper_layer
from ..model.architecture import (Tensor, attention_tensors, block_kinds, block_norm_tensors, dense_ffn_tensors,
                                  moe_tensors)
from ..model.profiles import profile as parse_profile

__all__ = ["BLOCKS", "FlowNode", "FlowEdge", "FlowGraph", "block_flow", "ffn_block", "skipped"]

#: the blocks :func:`block_flow` draws
BLOCKS = ("attention", "moe", "dense_ffn")

#: what slices a weight on one device, by the partition's sharding kind
_WEIGHT_SLICES = {"tp": ("TP",), "expert": ("EP", "ETP"), "expert_ep": ("EP",), "replicated": ()}
#: the order the slicing sizes of a value are listed in
_SLICE_ORDER = ("TP", "ETP", "EP", "SP", "CP")
_b, _s = sym("b"), sym("s")


@dataclass(frozen=True)
class FlowNode:
    """A value (an activation of one micro-batch) or an operation of several inputs."""

    id: str
    kind: str               #: ``value``, ``op`` (an operation of several inputs) or ``io`` (the block's input/output)
    label: str = ""         #: its symbol, LaTeX (``c^{KV}``); empty when it has none
    text: str = ""          #: in words (``key-value latent``); may hold LaTeX between ``$`` and line breaks
    keys: tuple = ()        #: the ledger entries saved at this value (paper's ledger)
    shapes: tuple = ()      #: their shapes, one per key: (rows, width), or the element count's factors
    sliced_by: tuple = ()   #: the parallel sizes that split the saved value on one device (its first key's)
    cached: bool = False    #: inference's KV cache holds it
    width: sp.Expr | None = None  #: elements per token (cached values: what the cache holds per token and layer)
    group: str = ""         #: the cluster it is drawn in (:attr:`FlowGraph.groups`)

    @property
    def saved(self) -> bool:
        """Training saves it for backward (the ledger has an entry for it)."""
        return bool(self.keys)


@dataclass(frozen=True)
class FlowEdge:
    """Data flowing from ``src`` to ``dst`` through ``weights`` (architecture tensors, applied in order) and
    ``ops`` (operations without parameters, LaTeX or words)."""

    src: str
    dst: str
    weights: tuple = ()     #: :class:`memlib.model.architecture.Tensor`, in the order applied
    sliced_by: tuple = ()   #: per weight, what slices it on one device (the partition profile's)
    ops: tuple = ()         #: e.g. ``("RoPE",)``, ``("SiLU",)``, ``(r"\odot",)``
    residual: bool = False  #: the residual connection around the block


@dataclass(frozen=True)
class FlowGraph:
    """A block as a dataflow graph: nodes in data-flow order, edges, and the clusters' titles."""

    model: str
    block: str
    title: str                             #: the block in words (``multi-head latent attention (MLA)``)
    nodes: tuple
    edges: tuple
    groups: dict = field(default_factory=dict)   #: cluster id -> its title (LaTeX between ``$``)

    def node(self, id: str) -> FlowNode:
        return next(n for n in self.nodes if n.id == id)

    @property
    def weights(self) -> list[Tensor]:
        return [t for e in self.edges for t in e.weights]


def skipped(entry) -> bool:
    """A ledger entry a diagram leaves out: a mask, or a dropout output (it sits beside the value it masks)."""
    return entry.dtype == "mask" or "dropout" in entry.key


def ffn_block(m: ModelConfig | str) -> str:
    """The block a model's FFN diagram draws: ``moe``, or ``dense_ffn`` for a model without MoE layers."""
    return "moe" if load_model(m).has_moe else "dense_ffn"


def _value_shape(e) -> tuple:
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


class _Builder:
    """Collects nodes and edges, placing ledger entries and table tensors and checking that none is left."""

    def __init__(self, m: ModelConfig, block: str, profile: str, ledger, tensors):
        self.m, self.block = m, block
        self.prof = parse_profile(profile).partition
        self.ledger = {e.key: e for e in ledger if e.key.startswith(block + ".") and not skipped(e)}
        self.tensors = {t.key: t for t in tensors}
        self.nodes: dict[str, FlowNode] = {}
        self.edges: list[FlowEdge] = []
        self.placed: set[str] = set()
        self.used: set[str] = set()
        self.groups: dict[str, str] = {}

    def has(self, key: str) -> bool:
        return key in self.tensors

    def value(self, id: str, label: str, text: str, keys=(), group: str = "", cached: bool = False,
              width=None, kind: str = "value") -> str:
        saved = tuple(k for k in keys if k in self.ledger)
        for k in saved:
            if k in self.placed:
                raise KeyError(f"ledger entry {k} placed twice")
            self.placed.add(k)
        first = self.ledger[saved[0]] if saved else None
        if width is None and first is not None and first.width is not None:
            width = first.width
        self.nodes[id] = FlowNode(id, kind, label, text, saved, tuple(_value_shape(self.ledger[k]) for k in saved),
                                  tuple(d for d in _SLICE_ORDER if first is not None and d in first.shard),
                                  cached, width, group)
        return id

    def op(self, id: str, label: str, text: str = "", group: str = "") -> str:
        self.nodes[id] = FlowNode(id, "op", label, text, group=group)
        return id

    def edge(self, src: str, dst: str, weights=(), ops=(), residual: bool = False) -> None:
        ts = []
        for key in weights:
            if key not in self.tensors:
                continue                       # an optional tensor (a bias, a norm's bias) the model lacks
            if key in self.used:
                raise KeyError(f"tensor {key} drawn twice")
            self.used.add(key)
            ts.append(self.tensors[key])
        self.edges.append(FlowEdge(src, dst, tuple(ts), tuple(_WEIGHT_SLICES[self.prof.sharding(t)] for t in ts),
                                   tuple(ops), residual))

    def graph(self, title: str) -> FlowGraph:
        left = sorted(set(self.ledger) - self.placed)
        if left:
            raise KeyError(f"no place in the {self.block} diagram for the ledger entries {', '.join(left)}: "
                           "add them to memlib.scenarios.dataflow")
        unused = sorted(set(self.tensors) - self.used)
        if unused:
            raise KeyError(f"no place in the {self.block} diagram for the tensors {', '.join(unused)}: "
                           "add them to memlib.scenarios.dataflow")
        return FlowGraph(self.m.name, self.block, title, tuple(self.nodes.values()), tuple(self.edges),
                         dict(self.groups))


def _norm_in(f: _Builder, prefix: str, norm: str, text: str) -> str:
    """The block's input (the residual stream) and its norm: returns the normalised value's id."""
    f.value("input", "", text, (f"{prefix}.norm_input",), kind="io")
    f.value("normed", "", "normalised input", (f"{prefix}.norm_output",))
    f.edge("input", "normed", (norm, norm + "_bias"))
    return "normed"


def _residual(f: _Builder, last: str, weights=()) -> str:
    """``last`` (through ``weights``) added to the block's input: the block's output; returns the sum's id."""
    f.op("add", "+", "residual add: the block's output")
    f.edge(last, "add", weights)
    f.edge("input", "add", residual=True)
    return "add"


def _mla(f: _Builder, m: ModelConfig) -> None:
    a = "attention."
    x = _norm_in(f, "attention", "norms.attn_norm", "layer input")
    rope = ("RoPE",) if m.positions == "rope" else ()
    f.groups.update(query="query branch", kv="key-value branch", core="attention")
    if f.has(a + "W_DQ"):                  # queries compressed into a latent
        f.value("c_q", "c^{Q}", "query latent", (a + "c_q",), group="query")
        f.edge(x, "c_q", (a + "W_DQ", a + "q_norm"))
        q_in, q_w, qr_w = "c_q", a + "W_UQ", a + "W_QR"
    else:                                  # queries projected from the input (DeepSeek-V2-Lite)
        q_in, q_w, qr_w = x, a + "W_Q", a + "W_QR"
    f.value("c_kv", "c^{KV}", "key-value latent", (a + "c_kv",), group="kv", cached=True,
            width=f.tensors[a + "kv_norm"].shape[0])
    f.edge(x, "c_kv", (a + "W_DKV", a + "kv_norm"))
    f.value("k_rope", "k^{R}", "RoPE key,\nshared by the heads", group="kv", cached=True,
            width=f.tensors[a + "W_KR"].shape[0])
    f.edge(x, "k_rope", (a + "W_KR",), ops=rope)
    f.value("q", "q", "queries $[q^{C}; q^{R}]$", (a + "q",), group="query")
    f.edge(q_in, "q", (q_w,))
    f.edge(q_in, "q", (qr_w,), ops=rope)
    f.value("k", "k", "keys $[k^{C}; k^{R}]$", (a + "k",), group="kv")
    f.edge("c_kv", "k", (a + "W_UK",))
    f.edge("k_rope", "k", ops=("copy to every head",))
    f.value("v", "v^{C}", "values", (a + "v",), group="kv")
    f.edge("c_kv", "v", (a + "W_UV",))
    _core(f)


def _gqa(f: _Builder, m: ModelConfig) -> None:
    a = "attention."
    x = _norm_in(f, "attention", "norms.attn_norm", "layer input")
    rope = ("RoPE",) if m.positions == "rope" else ()
    f.groups.update(core="attention")
    f.value("q", "q", "queries", (a + "q",))
    f.edge(x, "q", (a + "W_Q", a + "b_Q", a + "q_head_norm"), ops=rope)
    f.value("k", "k", "keys", (a + "k",), cached=True)
    f.edge(x, "k", (a + "W_K", a + "b_K", a + "k_head_norm"), ops=rope)
    f.value("v", "v", "values", (a + "v",), cached=True)
    f.edge(x, "v", (a + "W_V", a + "b_V"))
    _core(f)


def _core(f: _Builder) -> None:
    """softmax(q k^T) v, then W^O and the residual."""
    a = "attention."
    f.op("scores", r"\mathrm{softmax}(q k^{\top})", group="core")
    f.edge("q", "scores")
    f.edge("k", "scores")
    f.value("probs", "", "attention probabilities", (a + "softmax_out",), group="core")
    f.edge("scores", "probs")
    f.op("mix", r"\cdot\, v", group="core")
    f.edge("probs", "mix")
    f.edge("v", "mix")
    f.value("context", "o", "attention output", (a + "context",), group="core")
    f.edge("mix", "context")
    _residual(f, "context", (a + "W_O", a + "b_O"))


def _swiglu(f: _Builder, prefix: str, src: str, names: tuple, group: str) -> str:
    """A SwiGLU FFN from ``src``: one value holding its gate and up outputs, SiLU(gate) and their product (the
    down projection's input); returns its id.  ``names``: the gate, up, down tensors' keys."""
    gate, up, _ = names
    keys = tuple(f"{prefix}.{k}" for k in ("gate_out", "up_out", "act_out", "product"))
    f.value(f"{group}_swiglu", "", "SwiGLU: $g$, $u$,\n$\\mathrm{SiLU}(g)$, $\\mathrm{SiLU}(g) \\odot u$", keys,
            group=group)
    f.edge(src, f"{group}_swiglu", (gate, up, gate + "_bias", up + "_bias"))
    return f"{group}_swiglu"


def _expert_mlp(f: _Builder, m: ModelConfig, prefix: str, src: str, tensors: str, group: str) -> tuple[str, tuple]:
    """An expert of the model's MLP kind from ``src`` (SwiGLU, or fc1 and GeLU): its last value's id and the
    output projection's tensors (the weight and its bias)."""
    if m.mlp == "gelu":
        f.value(f"{group}_gelu", "", "fc1 output $a$, $\\mathrm{GeLU}(a)$",
                (f"{prefix}.fc1_out", f"{prefix}.act_out"), group=group)
        f.edge(src, f"{group}_gelu", (f"{tensors}.fc1", f"{tensors}.fc1_bias"))
        return f"{group}_gelu", (f"{tensors}.fc2", f"{tensors}.fc2_bias")
    last = _swiglu(f, prefix, src, tuple(f"{tensors}.{k}" for k in ("gate", "up", "down")), group)
    return last, (f"{tensors}.down", f"{tensors}.down_bias")


def _moe(f: _Builder, m: ModelConfig) -> None:
    p = "moe."
    k = block_kinds(m)
    x = _norm_in(f, "moe", "norms.ffn_norm", "block input")
    f.groups.update(router="router")
    f.value("scores", "", "router logits and probabilities", (p + "router_logits", p + "router_probs"),
            group="router")
    f.edge(x, "scores", ("router.gate", "router.bias"), ops=(r"\mathrm{" + m.scoring_func + "}",))
    choice = [r"\text{top-}N_{r}"]
    if m.n_group > 1:
        choice.append(r"\text{in }k_{g}\text{ of }n_{g}\text{ groups}")
    f.value("routing", "", "routing map", (p + "routing_map",), group="router")
    f.edge("scores", "routing", ("router.e_score_correction_bias",), ops=tuple(choice))
    f.groups["routed"] = r"routed experts $i$ ($N_{r}$ of $N$ per token)"
    f.op("dispatch", "", "dispatch (all-to-all over EP)")
    f.edge(x, "dispatch")
    f.edge("routing", "dispatch")
    f.value("routed_in", "", "dispatched tokens", (p + "routed.input",), group="routed")
    f.edge("dispatch", "routed_in")
    last, down = _expert_mlp(f, m, p + "routed", "routed_in", "routed_experts", "routed")
    f.op("combine", "", "combine (all-to-all back),\nweighted by the router probabilities")
    f.edge(last, "combine", down)
    f.edge("scores", "combine")
    add = _residual(f, "combine")
    if k["shared"]:                       # the shared experts' output joins the same sum
        f.groups["shared"] = "shared expert" if m.moe == "qwen2_moe" else r"shared experts ($N_{s}$)"
        f.value("shared_in", "", "every token", (p + "shared.input",), group="shared")
        f.edge(x, "shared_in")
        last_s, down_s = _expert_mlp(f, m, p + "shared", "shared_in", "shared_experts", "shared")
        if f.has("shared_experts.gate_weight"):     # Qwen2-MoE: the shared expert's output scaled by a sigmoid gate
            f.value("shared_gate", "", "shared expert's gate", (p + "shared.gate_sigmoid",), group="shared")
            f.edge("shared_in", "shared_gate", ("shared_experts.gate_weight",), ops=(r"\mathrm{sigmoid}",))
            f.op("scale_shared", r"\times", group="shared")
            f.edge(last_s, "scale_shared", down_s)
            f.edge("shared_gate", "scale_shared")
            f.edge("scale_shared", add)
        else:
            f.edge(last_s, add, down_s)


def _dense(f: _Builder, m: ModelConfig) -> None:
    d = "dense_ffn."
    x = _norm_in(f, "dense_ffn", "norms.ffn_norm", "block input")
    if m.mlp == "gelu":
        f.value("ffn_act", "", "fc1 output $a$, $\\mathrm{GeLU}(a)$", (d + "gelu_input", d + "act_out"))
        f.edge(x, "ffn_act", (d + "fc1", d + "fc1_bias"))
        _residual(f, "ffn_act", (d + "fc2", d + "fc2_bias"))
        return
    last = _swiglu(f, "dense_ffn", x, (d + "gate", d + "up", d + "down"), "ffn")
    _residual(f, last, (d + "down",))


def block_flow(m: ModelConfig | str, block: str, profile: str = "paper") -> FlowGraph:
    """The dataflow graph of one decoder-layer ``block`` of ``m`` (:data:`BLOCKS`), its weights sliced as the
    partition ``profile`` says, its saved values those of the paper's ledger (of an MoE layer for a model with
    MoE layers)."""
    m = load_model(m)
    if block not in BLOCKS:
        raise ValueError(f"block={block!r} must be one of {', '.join(BLOCKS)}")
    if block == "moe" and not m.has_moe:
        raise ValueError(f"{m.name} has no MoE layers")
    kind = "moe" if (block == "moe" or (block == "attention" and m.has_moe)) else "dense"
    norm = "norms.attn_norm" if block == "attention" else "norms.ffn_norm"
    tables = {"attention": attention_tensors, "moe": moe_tensors, "dense_ffn": dense_ffn_tensors}
    tensors = [t for t in block_norm_tensors(m) if t.key.removesuffix("_bias") == norm] + tables[block](m)
    f = _Builder(m, block, profile, paper_layer(m, kind), tensors)
    kinds = block_kinds(m)
    if block == "attention":
        (_mla if m.attention == "mla" else _gqa)(f, m)
        title = ("multi-head latent attention (MLA)" if m.attention == "mla" else
                 {"GQA": "grouped-query attention (GQA)", "MHA": "multi-head attention (MHA)"}[kinds["attention"]])
    elif block == "moe":
        _moe(f, m)
        title = "MoE layer"
    else:
        _dense(f, m)
        title = f"dense FFN ({kinds['ffn']})"
    return f.graph(title)
