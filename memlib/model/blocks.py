"""Which optional blocks a model has, and the words that belong to each: one table.

A model is built from blocks that some models have and others lack: multi-head latent attention
(with its latents, its query compression and its RoPE split) or grouped-query attention, MoE layers, shared experts, the
router's bias buffer, MTP modules, dense-FFN layers.  :func:`model_blocks` says which of them a
model has, read from its config; :data:`VOCABULARY` lists, per block, the words (regular
expressions) that describe it, so that a text written for a model may use them only when the
model has the block (the book built for Mixtral says "grouped-query attention", never "MLA").

``paper`` is not a block of the architecture but of the book: the comparisons with the values
the paper prints, made only for the paper's model (DeepSeek-V3); whoever knows whether the model
is the paper's (:func:`memlib.paper.is_paper_model`) passes it to :func:`model_blocks`.

:data:`SYMBOLS` gives the notation symbols (:mod:`memlib.core.symbols`) that only a model with the
block has, so that a notation table lists only the model's own.
"""
from __future__ import annotations

import re

from ..config import ModelConfig

__all__ = ["BLOCK_NAMES", "VOCABULARY", "SYMBOLS", "MODULE_BLOCKS", "model_blocks", "lacking", "words_of_lacking_blocks",
           "own_modules"]

#: each optional block and what it is, in words
BLOCK_NAMES = {
    "mla": "multi-head latent attention (latent key-value and query projections)",
    "q_latent": "query compression (MLA's query latent, its norm and up-projection)",
    "rope_split": "decoupled RoPE (a RoPE part of the query and one RoPE key shared by the heads)",
    "gqa": "grouped-query (or multi-head) attention",
    "moe": "mixture-of-experts layers (router, routed experts, expert parallelism)",
    "shared_experts": "shared experts beside the routed ones",
    "router_bias": "the router's bias buffer (auxiliary-loss-free balancing)",
    "mtp": "multi-token-prediction modules",
    "dense_layers": "decoder layers with a dense FFN",
    "paper": "the paper's printed values (the book of the paper's DeepSeek-V3)",
}

#: block -> regular expressions of the words that may appear in a text only for a model with the block
VOCABULARY: dict[str, tuple[str, ...]] = {
    "mla": (r"\bMLA\b", r"multi-head latent attention", r"\blatents?\b", r"W\^\{?(?:DKV|UK|UV)\b",
            r"\bkv_b_proj\b", r"\bkv_a_proj", r"c\^\{?KV\}?", r"mla_up_proj"),
    "q_latent": (r"W\^\{?(?:DQ|UQ)\b", r"\bq_b_proj\b", r"\bq_a_proj\b", r"c\^\{?Q\}?", r"query latent",
                 r"query compression", r"d_\{?c'"),
    "rope_split": (r"decoupled RoPE", r"RoPE key", r"W\^\{?(?:QR|KR)\}?", r"d_h\^R", r"\bd\^\{?R\}?_\{?h"),
    "gqa": (r"grouped-query", r"\bGQA\b", r"key-value heads"),
    "moe": (r"\bMoE\b", r"\bexperts?\b", r"\brouter\b", r"\brouted\b", r"\ball-to-all\b",
            r"DeepSeekMoE", r"\bEDP\b", r"P_\{?e\}?(?![\w{])", r"P_\{?ne\}?"),
    "shared_experts": (r"shared experts?\b",),
    "router_bias": (r"router(?:'s|’s)? bias", r"bias buffer", r"e_score_correction_bias", r"noaux_tc"),
    "mtp": (r"\bMTP\b", r"multi-token prediction", r"n_\{MTP\}"),
    "dense_layers": (r"\bdense (?:FFN|layers?)\b", r"k_\{dense\}"),
    "paper": (r"paper(?:'s|’s) value\b", r"That is the paper(?:'s|’s)"),
}

#: block -> the registry symbols (:data:`memlib.core.symbols.REGISTRY` keys) only a model with it has
SYMBOLS: dict[str, tuple[str, ...]] = {
    "mla": ("d_h", "d_v", "d_c"),
    "q_latent": ("d_cq",),
    "rope_split": ("d_hR",),
    "gqa": ("n_kv", "d_head"),
    "moe": ("h_E", "N", "N_r", "n_g", "k_g", "EP", "ETP", "EDP", "L_moe", "P_e", "P_ne"),
    "shared_experts": ("N_s", "h_S"),
    "mtp": ("n_mtp",),
    "dense_layers": ("h_F", "k_dense"),
}


#: recompute module (Megatron-Core's ``--recompute-modules``, memlib's policies) -> the block it recomputes in, for
#: the modules that only a model with the block has (``core_attn``, ``layernorm``, ``mlp`` are every model's)
MODULE_BLOCKS = {"mla_up_proj": "mla", "moe_act": "moe", "moe": "moe", "shared_experts": "shared_experts"}


def own_modules(modules, m: ModelConfig) -> list[str]:
    """The recompute modules of ``modules`` (in their order) that act on a block ``m`` has: a module list written for
    DeepSeek-V3 (``core_attn,layernorm,mla_up_proj,moe_act``) is ``core_attn,layernorm`` for a dense GQA model."""
    own = model_blocks(m)
    return [x for x in modules if MODULE_BLOCKS.get(x, None) in own | {None}]


def model_blocks(m: ModelConfig, paper: bool = False) -> frozenset[str]:
    """The optional blocks of :data:`BLOCK_NAMES` that ``m`` has (``paper`` when its book is the
    paper's: pass :func:`memlib.paper.is_paper_model`)."""
    has = {
        "mla": m.attention == "mla",
        "q_latent": m.attention == "mla" and m.q_lora_rank is not None,
        "rope_split": m.attention == "mla" and bool(m.qk_rope_head_dim),
        "gqa": m.attention != "mla",
        "moe": m.has_moe,
        "shared_experts": m.has_shared_experts,
        "router_bias": m.has_moe and m.router_bias,
        "mtp": m.num_nextn_predict_layers > 0,
        "dense_layers": "dense" in m.layer_kinds,
        "paper": paper,
    }
    return frozenset(b for b, yes in has.items() if yes)


def lacking(m: ModelConfig, paper: bool = False) -> frozenset[str]:
    """The optional blocks ``m`` does not have."""
    return frozenset(BLOCK_NAMES) - model_blocks(m, paper)


def words_of_lacking_blocks(text: str, m: ModelConfig, paper: bool = False) -> list[tuple[str, str]]:
    """``(block, word)`` for each word of ``text`` that belongs to a block ``m`` lacks, in order."""
    found = []
    for block in sorted(lacking(m, paper)):
        for pattern in VOCABULARY[block]:
            # a word said to be absent ("no shared expert", "has no MLA", "without MTP") is not about the block
            found += [(m_.start(), block, m_.group(0)) for m_ in re.finditer(pattern, text)
                      if not re.search(r"\b(?:no|without)\s+$", text[max(0, m_.start() - 9):m_.start()], re.I)]
    return [(b, w) for _, b, w in sorted(found)]
