"""Activation ledgers: what each implementation saves for backward, per layer and around it.

A *profile* is a ledger variant (see :mod:`memlib.ledgers.base` for the machinery; :mod:`memlib.ledgers`
names every profile):

``paper``
    arXiv 2502.07846 §5, term by term: MLA 4bsh + 2bs(d_c'+d_c) + 4bs(d_h+d_h^R)n_h + 2bs d_h n_h
    + 5bn_h s^2 + 2bs d_h n_h + bsh; MoE 4bsh/2 + 4bsN + 2bsN_r + (N/EP)(3E_token h + 8E_token h_E)
    + N_s(3bsh + 8bsh_E) under SP, with E_token = bsN_r/N.  Dense layers, the embedding, the head
    and the MTP modules, which the paper does not analyse, follow the same conventions.
``megatron``
    Megatron-Core (:mod:`memlib.ledgers.megatron`).
``hf-eager``
    Hugging Face ``transformers`` in eager mode (:mod:`memlib.ledgers.hf`).

:func:`gpt_structure` is Korthikanti et al.'s dense GPT (arXiv 2205.05198) as a model of the ``gpt``
family: the paper profile's ledger of its dense layer reproduces their Table 2
(:func:`memlib.paper.activations.korthikanti_gpt_rows`), to show that the ledger is not tuned to one paper.
"""
from __future__ import annotations

from .base import ActProfile, Saved, renamed, saved as _S
from ..config import ModelConfig, model_from_dict
from ..core.symbols import sym, b, s, h, h_F, h_E, n_h, d_h, d_v, d_hR, d_cq, d_c, N, N_s, N_r, v

__all__ = ["PAPER_PROFILE", "paper_layer", "gpt_structure", "MULTI_HEAD", "common_embedding", "common_head"]


# ------------------------------------------------------------------------------------------------
# the paper's ledger (arXiv 2502.07846 §5), generalised to dense layers, embedding and head
# ------------------------------------------------------------------------------------------------
def _paper_norm(block: str, input_name: str, output_name: str) -> list[Saved]:
    """A block's pre-norm as the paper counts it: its input (the block input, kept under full
    recomputation) and its output (the next Linear's input), both SP-split."""
    bs = b * s
    return [
        _S(f"{block}.norm_input", input_name, bs * h, shard={"SP", "CP"}, keep_full=True, width=h),
        _S(f"{block}.norm_output", output_name, bs * h, shard={"SP", "CP"}, modules={"layernorm"},
           linear_input=True, width=h),
    ]


def _paper_scores() -> list[Saved]:
    """The s x s tensors of the paper's attention (Korthikanti et al.'s 5 a s^2 b): the softmax output, the
    attention-dropout mask and the dropout's output, per query head."""
    return [
        _S("attention.softmax_out", "softmax output (attention probabilities)", b * n_h * s * s,
           shard={"TP", "CP"}, modules={"core_attn"}),
        _S("attention.softmax_dropout_mask", "attention-dropout mask", b * n_h * s * s, "mask",
           shard={"TP", "CP"}, modules={"core_attn"}),
        _S("attention.softmax_dropout_out", "attention-dropout output", b * n_h * s * s,
           shard={"TP", "CP"}, modules={"core_attn"}),
    ]


def _paper_attention(m: ModelConfig) -> list[Saved]:
    bs = b * s
    out = _paper_norm("attention", "RMSNorm input (the layer input)", "RMSNorm output, input of the down-projections")
    if m.q_lora_rank is not None:
        out.append(_S("attention.c_q", "query latent c^Q, input of W^UQ and W^QR", bs * d_cq, shard={"CP"},
                      linear_input=True, width=d_cq, note="replicated over TP: W^DQ is not split"))
    out += [
        _S("attention.c_kv", "key-value latent c^KV, input of W^UK and W^UV", bs * d_c, shard={"CP"},
           linear_input=True, width=d_c, note="replicated over TP: W^DKV is not split"),
        _S("attention.q", "queries q (no-RoPE and RoPE parts)", bs * n_h * (d_h + d_hR), shard={"TP", "CP"},
           modules={"mla_up_proj"}, width=n_h * (d_h + d_hR)),
        _S("attention.k", "keys k (no-RoPE part and the shared RoPE key, per head)", bs * n_h * (d_h + d_hR),
           shard={"TP", "CP"}, modules={"mla_up_proj"}, width=n_h * (d_h + d_hR)),
        _S("attention.v", "values v", bs * n_h * d_v, shard={"TP", "CP"}, modules={"mla_up_proj"},
           width=n_h * d_v, note="the paper writes d_h; DeepSeek's configs call this v_head_dim"),
        *_paper_scores(),
        _S("attention.context", "attention output, input of W^O", bs * n_h * d_v, shard={"TP", "CP"},
           linear_input=True, fp8_exception="E5M6", width=n_h * d_v),
        _S("attention.out_dropout_mask", "dropout mask after W^O", bs * h, "mask", shard={"SP", "CP"}),
    ]
    return out


def _paper_ffn(prefix: str, width, tokens, *, shard_w: set, shard_in: set, module: str,
               label: str, input_mask: bool, mean_rows: bool = False, gelu: bool = False) -> list[Saved]:
    """A SwiGLU FFN as the paper counts an expert: input (and its mask), gate, up, SiLU, product.
    ``mean_rows``: ``tokens`` is an expected count (routed experts), rounded up on a device.  ``gelu``: an
    expert of a model without SwiGLU (fc1, GeLU, fc2), counted alike: fc1's output and the GeLU's output."""
    out = []
    kw = {"mean_rows": mean_rows}
    if input_mask:
        out += [
            _S(f"{prefix}.input", f"{label} input", tokens * h, shard=shard_in, modules={module}, linear_input=True,
               width=h, **kw),
            _S(f"{prefix}.input_mask", f"{label} input mask", tokens * h, "mask", shard=shard_in, modules={module},
               width=h, note="the paper's 3 E_token h: input (2 bytes) and a 1-byte mask", **kw),
        ]
    if gelu:
        act = {module, "moe_act"} if prefix == "routed" else {module}
        return out + [
            _S(f"{prefix}.fc1_out", f"{label} fc1 output (GeLU input)", tokens * width, shard=shard_w,
               modules={module}, width=width, **kw),
            _S(f"{prefix}.act_out", f"{label} GeLU output, input of fc2", tokens * width, shard=shard_w, modules=act,
               linear_input=True, width=width, **kw),
        ]
    out += [
        _S(f"{prefix}.gate_out", f"{label} gate projection output (SwiGLU input)", tokens * width,
           shard=shard_w, modules={module}, width=width, **kw),
        _S(f"{prefix}.up_out", f"{label} up projection output (SwiGLU input)", tokens * width,
           shard=shard_w, modules={module}, width=width, **kw),
        _S(f"{prefix}.act_out", f"{label} SiLU output", tokens * width, shard=shard_w,
           modules={module, "moe_act"} if prefix == "routed" else {module}, width=width, **kw),
        _S(f"{prefix}.product", f"{label} SiLU(gate) * up, input of the down projection", tokens * width,
           shard=shard_w, modules={module, "moe_act"} if prefix == "routed" else {module}, linear_input=True,
           width=width, **kw),
    ]
    return out


def _paper_moe(m: ModelConfig) -> list[Saved]:
    bs = b * s
    # local experts x E_token = (N / EP)(b s N_r / N): b s N_r token copies spread over the EP ranks, a
    # mean under balanced routing, rounded up to whole tokens on a device (shard "EP", mean_rows)
    routed_tokens = bs * N_r
    out = _paper_norm("moe", "RMSNorm input (the MoE block input)", "RMSNorm output, input of the router and experts")
    out += [
        _S("moe.router_logits", "router logits", bs * N, shard={"CP"}, modules={"moe"}),
        _S("moe.router_probs", "router probabilities", bs * N, shard={"CP"}, modules={"moe"}),
        _S("moe.routing_map", "top-k routing map (which experts each token goes to)", bs * N_r, shard={"CP"},
           keep_full=True, note="kept under full recomputation so that routing is reproduced exactly"),
    ]
    out += [e for e in _paper_ffn("routed", h_E, routed_tokens, shard_w={"CP", "EP", "ETP"}, shard_in={"CP", "EP"},
                                  module="moe", label="routed experts'", input_mask=True, mean_rows=True,
                                  gelu=m.mlp == "gelu")]
    if m.n_shared_experts:
        out += _paper_ffn("shared", N_s * h_E, bs, shard_w={"CP"}, shard_in={"CP"}, module="shared_experts",
                          label="shared experts'", input_mask=True, gelu=m.mlp == "gelu")
    return [e if e.key.startswith("moe.") else renamed(e, "moe." + e.key) for e in out]


def _paper_dense(m: ModelConfig) -> list[Saved]:
    bs = b * s
    out = _paper_norm("dense_ffn", "RMSNorm input (the FFN block input)", "RMSNorm output, input of the FFN")
    out += [renamed(e, "dense_ffn." + e.key.split(".", 1)[1])
            for e in _paper_ffn("ffn", h_F, bs, shard_w={"TP", "CP"}, shard_in={"SP", "CP"}, module="mlp",
                                label="dense FFN", input_mask=False)]
    out.append(_S("dense_ffn.out_dropout_mask", "dropout mask after the FFN", bs * h, "mask", shard={"SP", "CP"},
                  note="not in the paper, whose ledger has no dense FFN; as Korthikanti's MLP dropout mask"))
    return out


def common_embedding() -> list[Saved]:
    return [_S("embedding.token_ids", "input token ids (for the embedding's backward)", b * s, "int64",
               shard={"CP"}, keep_full=True)]


def common_head(prefix: str = "head") -> list[Saved]:
    bs = b * s
    return [
        _S(f"{prefix}.norm_input", "final RMSNorm input", bs * h, shard={"SP", "CP"}, keep_full=True, width=h),
        _S(f"{prefix}.input", "final RMSNorm output, input of the output head", bs * h, shard={"SP", "CP"},
           keep_full=True, linear_input=True, width=h),
        _S(f"{prefix}.logits", "logits", bs * v, shard={"TP", "CP"}, keep_full=True),
        _S(f"{prefix}.loss_softmax", "cross-entropy softmax of the logits, upcast to fp32", bs * v, "fp32",
           shard={"TP", "CP"}, keep_full=True, note="vocab-parallel cross-entropy keeps fp32 probabilities"),
    ]


def _paper_mtp(m: ModelConfig, j: int) -> list[Saved]:
    bs = b * s
    kind = "moe" if m.is_moe_layer(m.num_hidden_layers + j) else "dense"
    own = [
        _S("mtp.token_ids", "shifted token ids of the MTP module", bs, "int64", shard={"CP"}, keep_full=True),
        _S("mtp.enorm_input", "embedding of the shifted tokens, RMSNorm input", bs * h, shard={"SP", "CP"}, keep_full=True),
        _S("mtp.hnorm_input", "main model's final hidden state, RMSNorm input", bs * h, shard={"SP", "CP"}, keep_full=True),
        _S("mtp.eh_proj_input", "concatenated normalised inputs of the projection M", bs * 2 * h,
           shard={"SP", "CP"}, keep_full=True, linear_input=True, width=2 * h),
    ]
    block = [renamed(e, "mtp." + e.key) for e in paper_layer(m, kind)]
    return own + block + common_head("mtp.head")


def _paper_gqa(m: ModelConfig) -> list[Saved]:
    """Grouped-query (or multi-head) attention under the paper's conventions, Korthikanti's for a GPT
    layer: the norm's input and output, q (n_h heads), k and v (n_kv heads), the softmax output, the
    attention-dropout mask and output (s x s per head), the context (input of W^O), the dropout mask
    after W^O.  A LayerNorm keeps no more than an RMSNorm here (the paper counts no statistics)."""
    bs = b * s
    n_kv, d_head = sym("n_kv"), sym("d_head")
    out = _paper_norm("attention", "norm input (the layer input)", "norm output, input of W^Q, W^K and W^V")
    out += [
        _S("attention.q", "queries q", bs * n_h * d_head, shard={"TP", "CP"}, width=n_h * d_head),
        _S("attention.k", "keys k (n_kv heads)", bs * n_kv * d_head, shard={"TP", "CP"}, width=n_kv * d_head),
        _S("attention.v", "values v (n_kv heads)", bs * n_kv * d_head, shard={"TP", "CP"}, width=n_kv * d_head),
        *_paper_scores(),
        _S("attention.context", "attention output, input of W^O", bs * n_h * d_head, shard={"TP", "CP"},
           linear_input=True, width=n_h * d_head),
        _S("attention.out_dropout_mask", "dropout mask after W^O", bs * h, "mask", shard={"SP", "CP"}),
    ]
    return out


def _paper_gelu(m: ModelConfig) -> list[Saved]:
    """The classic GPT MLP as Korthikanti et al. count it: norm input and output, GeLU input and output
    (h_F wide), dropout mask."""
    bs = b * s
    out = _paper_norm("dense_ffn", "norm input (the FFN block input)", "norm output, input of fc1")
    out += [
        _S("dense_ffn.gelu_input", "GeLU input (fc1 output)", bs * h_F, shard={"TP", "CP"}, modules={"mlp"}),
        _S("dense_ffn.act_out", "GeLU output, input of fc2", bs * h_F, shard={"TP", "CP"}, modules={"mlp"},
           linear_input=True, width=h_F),
        _S("dense_ffn.out_dropout_mask", "dropout mask after the FFN", bs * h, "mask", shard={"SP", "CP"}),
    ]
    return out


def _paper_qwen2_shared(m: ModelConfig) -> list[Saved]:
    """Qwen2-MoE's shared expert (width h_S) like the paper's shared experts, and its sigmoid gate."""
    bs = b * s
    out = _paper_ffn("shared", sym("h_S"), bs, shard_w={"CP"}, shard_in={"CP"}, module="shared_experts",
                     label="shared expert's", input_mask=True)
    out.append(_S("shared.gate_sigmoid", "the shared expert's sigmoid gate, one per token", bs, shard={"CP"},
                  modules={"shared_experts"}))
    return [renamed(e, "moe." + e.key) for e in out]


def paper_layer(m: ModelConfig, kind: str) -> list[Saved]:
    """The paper profile's ledger of one decoder layer of ``kind``."""
    att = _paper_attention(m) if m.attention == "mla" else _paper_gqa(m)
    if kind == "moe":
        return att + _paper_moe(m) + (_paper_qwen2_shared(m) if m.moe == "qwen2_moe" else [])
    return att + (_paper_gelu(m) if m.mlp == "gelu" else _paper_dense(m))


def _paper_embedding(m: ModelConfig) -> list[Saved]:
    out = common_embedding()
    if m.positions == "learned":
        out.append(_S("embedding.position_ids", "position ids (for the learned position embedding's backward)",
                      b * s, "int64", shard={"CP"}, keep_full=True))
    return out


#: the paper's ledger as a profile
PAPER_PROFILE = ActProfile(
    "paper", "arXiv 2502.07846 §5: eager attention with dropout, bf16, every intermediate kept",
    paper_layer, _paper_embedding, lambda m: common_head(), _paper_mtp)


# ------------------------------------------------------------------------------------------------
# Korthikanti et al. (arXiv 2205.05198): their dense GPT layer is the ``gpt`` family's
# ------------------------------------------------------------------------------------------------
def gpt_structure() -> ModelConfig:
    """A model of the ``gpt`` family (LayerNorm, multi-head attention with dropout, a GeLU MLP): the layer
    Korthikanti et al. count (their §4.1).  Its dense layer's ledger (:func:`paper_layer`) is symbolic in
    h, n_h, n_kv, d_head and h_F, so the sizes here only choose the family."""
    return model_from_dict({"model_type": "gpt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
                            "max_position_embeddings": 8, "vocab_size": 8}, name="gpt")


#: Korthikanti et al.'s multi-head attention in the ``gpt`` family's symbols: n_kv = n_h heads of h / n_h
MULTI_HEAD = {sym("n_kv"): n_h, sym("d_head"): h / n_h}
