"""The parameters Megatron-Core registers on one rank, in its order, with their local shapes.

:func:`chunk_params` lists a model chunk's ``nn.Parameter`` objects as Megatron-Core's GPTModel (Transformer
Engine spec) registers them, mapped from memlib's tensors (:mod:`memlib.model.architecture`) and sharded as
:class:`~memlib.model.partition.Partition` shards them; :func:`rank_params` those of every chunk a pipeline
rank holds.  :mod:`memlib.device.megatron_buffers` lays them out in DDP's buffers.  Sources:
``docs/derivations/megatron_buffers.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import sympy as sp

from ..config import ConfigError, TrainingConfig, show
from ..core.symbols import sym
from ..model.architecture import Tensor, decoder_layer_tensors, mtp_tensors
from ..model.partition import Chunk, Partition, Stage, shard_divisor

__all__ = ["MegatronParam", "chunk_params", "rank_params"]


@dataclass(frozen=True)
class MegatronParam:
    """One ``nn.Parameter`` of a Megatron-Core model chunk, as one rank holds it."""

    name: str                 #: Megatron-Core's name within the chunk (Transformer Engine spec)
    shape: tuple[int, ...]    #: the local shape on this rank
    expert: bool = False      #: in the expert-parallel buffer (``allreduce=False``), sharded over EDP
    shared_embedding: bool = False  #: an embedding copy that gets a bucket of its own
    te_gemm: bool = False     #: the weight of a Transformer Engine GEMM module (dummy wgrad, FP8 copy)
    dummy_wgrad: bool = False  #: its fused weight-gradient accumulation returns TE's cached dummy tensor

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


h, n_h, d_v, d_cq, d_c, h_F, h_E, N_s, N = (sym(k) for k in ("h", "n_h", "d_v", "d_cq", "d_c", "h_F", "h_E",
                                                               "N_s", "N"))
d_head, h_S = sym("d_head"), sym("h_S")
TP, EP, ETP = sym("TP"), sym("EP"), sym("ETP")

#: memlib tensor keys -> (Megatron-Core parameter, its number of columns, a TE GEMM weight); tensors mapped
#: to one parameter are fused (rows stacked), in Megatron-Core's registration order (transformer_layer.py,
#: multi_latent_attention.py, moe/moe_layer.py, extensions/transformer_engine.py at MEGATRON_COMMIT).  A key
#: ``kind:key`` applies only to a layer of that kind (``dense``, ``moe``), attention kind (``mla``, ``gqa``) or
#: MoE kind (``deepseek``, ``qwen2_moe``, ...).  The grouped-query rows (attention.py SelfAttention: linear_proj,
#: then linear_qkv with the input norm fused, then the q/k layernorms; TELayerNormColumnParallelLinear registers
#: layer_norm_weight, layer_norm_bias, weight, bias) are read from megatron-core 0.19.2's code, not measured
_LAYER_PARAMS: tuple[tuple[str, tuple[str, ...], object, bool], ...] = (
    ("input_layernorm.weight", ("mla:norms.attn_norm",), None, False),
    ("self_attention.linear_proj.weight", ("mla:attention.W_O",), n_h * d_v / TP, True),
    ("self_attention.linear_proj.weight", ("gqa:attention.W_O",), n_h * d_head / TP, True),
    ("self_attention.linear_proj.bias", ("attention.b_O",), None, False),
    ("self_attention.linear_qkv.layer_norm_weight", ("gqa:norms.attn_norm",), None, False),
    ("self_attention.linear_qkv.layer_norm_bias", ("gqa:norms.attn_norm_bias",), None, False),
    ("self_attention.linear_qkv.weight", ("gqa:attention.W_Q", "attention.W_K", "attention.W_V"), h, True),
    ("self_attention.linear_qkv.bias", ("attention.b_Q", "attention.b_K", "attention.b_V"), None, False),
    ("self_attention.q_layernorm.weight", ("attention.q_head_norm",), None, False),
    ("self_attention.k_layernorm.weight", ("attention.k_head_norm",), None, False),
    ("self_attention.linear_q_proj.weight", ("mla:attention.W_Q", "attention.W_QR"), h, True),
    ("self_attention.linear_q_down_proj.weight", ("attention.W_DQ",), h, True),
    ("self_attention.linear_q_up_proj.layer_norm_weight", ("attention.q_norm",), None, False),
    ("self_attention.linear_q_up_proj.weight", ("attention.W_UQ", "attention.W_QR"), d_cq, True),
    ("self_attention.linear_kv_down_proj.weight", ("attention.W_DKV", "attention.W_KR"), h, True),
    ("self_attention.linear_kv_up_proj.layer_norm_weight", ("attention.kv_norm",), None, False),
    ("self_attention.linear_kv_up_proj.weight", ("attention.W_UK", "attention.W_UV"), d_c, True),
    # dense layer: the pre-MLP norm is fused into linear_fc1 (TELayerNormColumnParallelLinear)
    ("mlp.linear_fc1.layer_norm_weight", ("dense:norms.ffn_norm",), None, False),
    ("mlp.linear_fc1.layer_norm_bias", ("dense:norms.ffn_norm_bias",), None, False),
    ("mlp.linear_fc1.weight", ("dense_ffn.gate", "dense_ffn.up"), h, True),
    ("mlp.linear_fc1.weight", ("dense_ffn.fc1",), h, True),
    ("mlp.linear_fc1.bias", ("dense_ffn.gate_bias", "dense_ffn.up_bias"), None, False),
    ("mlp.linear_fc1.bias", ("dense_ffn.fc1_bias",), None, False),
    ("mlp.linear_fc2.weight", ("dense_ffn.down",), h_F / TP, True),
    ("mlp.linear_fc2.weight", ("dense_ffn.fc2",), h_F / TP, True),
    ("mlp.linear_fc2.bias", ("dense_ffn.down_bias",), None, False),
    ("mlp.linear_fc2.bias", ("dense_ffn.fc2_bias",), None, False),
    # MoE layer
    ("pre_mlp_layernorm.weight", ("moe:norms.ffn_norm",), None, False),
    ("pre_mlp_layernorm.bias", ("moe:norms.ffn_norm_bias",), None, False),
    ("mlp.router.weight", ("router.gate",), h, False),
    ("mlp.router.bias", ("router.bias",), None, False),
    # the experts follow the model's MLP (SwiGLU: [gate; up] and down; GeLU: fc1 and fc2); TE's GroupedLinear
    # registers weight{i} then bias{i} for each expert in turn (grouped_linear.py:1450-1477 at v2.18)
    ("mlp.experts.linear_fc1.weight{e}", ("routed_experts.gate", "routed_experts.up"), h, True),
    ("mlp.experts.linear_fc1.weight{e}", ("routed_experts.fc1",), h, True),
    ("mlp.experts.linear_fc1.bias{e}", ("routed_experts.gate_bias", "routed_experts.up_bias"), None, False),
    ("mlp.experts.linear_fc1.bias{e}", ("routed_experts.fc1_bias",), None, False),
    ("mlp.experts.linear_fc2.weight{e}", ("routed_experts.down",), h_E / ETP, True),
    ("mlp.experts.linear_fc2.weight{e}", ("routed_experts.fc2",), h_E / ETP, True),
    ("mlp.experts.linear_fc2.bias{e}", ("routed_experts.down_bias",), None, False),
    ("mlp.experts.linear_fc2.bias{e}", ("routed_experts.fc2_bias",), None, False),
    ("mlp.shared_experts.linear_fc1.weight", ("shared_experts.gate", "shared_experts.up"), h, True),
    ("mlp.shared_experts.linear_fc1.weight", ("shared_experts.fc1",), h, True),
    ("mlp.shared_experts.linear_fc1.bias", ("shared_experts.gate_bias", "shared_experts.up_bias"), None, False),
    ("mlp.shared_experts.linear_fc1.bias", ("shared_experts.fc1_bias",), None, False),
    ("mlp.shared_experts.linear_fc2.weight", ("deepseek:shared_experts.down",), N_s * h_E / TP, True),
    ("mlp.shared_experts.linear_fc2.weight", ("deepseek:shared_experts.fc2",), N_s * h_E / TP, True),
    ("mlp.shared_experts.linear_fc2.weight", ("qwen2_moe:shared_experts.down",), h_S / TP, True),
    ("mlp.shared_experts.linear_fc2.weight", ("qwen2_moe:shared_experts.fc2",), h_S / TP, True),
    ("mlp.shared_experts.linear_fc2.bias", ("shared_experts.down_bias",), None, False),
    ("mlp.shared_experts.linear_fc2.bias", ("shared_experts.fc2_bias",), None, False),
    ("mlp.shared_experts.gate_weight", ("shared_experts.gate_weight",), h, False),
)


def _local(part: Partition, t: Tensor) -> int:
    return int((t.numel / shard_divisor(part.sharding(t))).xreplace(part.values))


def _layer_params(part: Partition, prefix: str, tensors: list[Tensor], kind: str, expert_buffer: bool,
                  strip: str = "") -> list[MegatronParam]:
    by_key = {t.key.removeprefix(strip): t for t in tensors if t.kind != "buffer"}
    used: set[str] = set()
    out = []
    local_experts = int((N / EP).xreplace(part.values))
    for name, keys, cols, te in _LAYER_PARAMS:
        wanted = []
        for k in keys:
            if ":" in k:
                k_kind, k = k.split(":")
                if k_kind not in (kind, part.model.attention, part.model.moe):
                    continue
            if k in by_key and k not in used:
                wanted.append(k)
        if not wanted or wanted[0] != keys[0].split(":")[-1]:
            continue      # the parameter exists when its first tensor does (W^Q without q LoRA, W^UQ with it)
        used.update(wanted)
        numel = sum(_local(part, by_key[k]) for k in wanted)
        per = local_experts if "{e}" in name else 1
        c = 1 if cols is None else int(sp.sympify(cols).xreplace(part.values))
        if numel % (per * c):  # pragma: no cover - a wrong column count in the table
            raise ConfigError(f"megatron_buffers: {name} has {numel} elements, not a multiple of {per} x {c}")
        shapes = [(numel // per,) if cols is None else (numel // per // c, c)] * per
        made = [MegatronParam(prefix + name.format(e=e), shape, expert=expert_buffer and "{e}" in name,
                              te_gemm=te, dummy_wgrad=te) for e, shape in enumerate(shapes)]
        if "bias{e}" in name:      # each expert's bias right after its weight (TE GroupedLinear's order)
            weights = out[-per:]
            out[-per:] = [x for pair in zip(weights, made) for x in pair]
        else:
            out += made
    missing = set(by_key) - used
    if missing:  # pragma: no cover - a tensor memlib knows and this table does not
        raise ConfigError(f"megatron_buffers: no Megatron-Core parameter for {sorted(missing)}")
    return out


def _expert_buffer(train: TrainingConfig) -> bool:
    """Routed experts have a buffer of their own when EP > 1 or ETP != TP: their parameters are marked
    ``allreduce=False`` (tensor_parallel/layers.py:1033-1036) and grouped apart (param_and_grad_buffer.py:924-925)."""
    return train.ep > 1 or train.etp != train.tp


def chunk_params(part: Partition, chunk: Chunk) -> list[MegatronParam]:
    """The parameters of one model chunk on one rank, in Megatron-Core's registration order
    (gpt_model.py:174-277: embedding, decoder, MTP block, output layer).

    Their element counts are memlib's (:meth:`Partition.tensors`); the total is checked against
    :meth:`Partition.params` for the chunk."""
    m, t = part.model, part.train
    if not part.profile.megatron_kernels:
        raise ConfigError(f"profile={t.profile}: Megatron-Core's buffers need the megatron profile")
    vals = part.values
    experts = _expert_buffer(t)
    hidden, vocab_local = m.hidden_size, int((sym("v") / TP).xreplace(vals))
    pp_last_rank_chunk = chunk.last
    mtp_here = part.profile.include_mtp and m.num_nextn_predict_layers > 0 and pp_last_rank_chunk
    out: list[MegatronParam] = []
    if chunk.first or mtp_here:
        # language_module.py:270-292: a copy on a stage without the embedding (MTP, tied head) is
        # marked shared_embedding, and so is the first stage's when a copy exists elsewhere
        shared = t.pp > 1 and (not chunk.first or (not chunk.last and (m.tie_word_embeddings or mtp_here
                                                                          or m.num_nextn_predict_layers > 0)))
        out.append(MegatronParam("embedding.word_embeddings.weight", (vocab_local, hidden), shared_embedding=shared))
        if chunk.first and m.positions == "learned":   # language_model_embedding.py: torch.nn.Embedding, replicated
            out.append(MegatronParam("embedding.position_embeddings.weight", (m.max_position_embeddings, hidden)))
    cache = part.__dict__.setdefault("_megatron_layer_params", {})   # one rank's layers of a kind are alike
    for k, i in enumerate(chunk.layers):
        kind = m.layer_kinds[i]
        if kind not in cache:
            cache[kind] = _layer_params(part, "", decoder_layer_tensors(m, kind), kind, experts)
        out += [replace(x, name=f"decoder.layers.{k}." + x.name) for x in cache[kind]]
    if chunk.last:
        out.append(MegatronParam("decoder.final_layernorm.weight", (hidden,)))
        if m.norm == "layernorm":
            out.append(MegatronParam("decoder.final_layernorm.bias", (hidden,)))
    if mtp_here:
        kind = m.layer_kinds[-1]
        for j in range(m.num_nextn_predict_layers):
            p = f"mtp.layers.{j}."
            out += [MegatronParam(p + "enorm.weight", (hidden,)), MegatronParam(p + "hnorm.weight", (hidden,)),
                    MegatronParam(p + "eh_proj.weight", (hidden // t.tp, 2 * hidden), te_gemm=True,
                                  dummy_wgrad=True)]
            block = [x for x in mtp_tensors(m, j, kind) if x.key.split(".")[1] not in ("enorm", "hnorm", "eh_proj",
                                                                                        "final_norm")]
            out += _layer_params(part, p + "mtp_model_layer.", block, kind, experts, strip="mtp.")
            out.append(MegatronParam(p + "final_layernorm.weight", (hidden,)))
    if chunk.last and not (m.tie_word_embeddings and chunk.first):
        # tied: the last stage keeps its own output weight (gpt_model.py:277-293 allocates it unless the
        # stage holds the embedding); it is the shared copy unless an MTP embedding copy is (language_module.py)
        shared = m.tie_word_embeddings and not mtp_here and t.pp > 1
        out.append(MegatronParam("output_layer.weight", (vocab_local, hidden), shared_embedding=shared,
                                 dummy_wgrad=True))
    total = sum(p.numel for p in out)
    expected = part.params(chunk).evaluate_total(vals)
    if total != expected:  # pragma: no cover - the table above and memlib's tensors disagree
        raise ConfigError(f"megatron_buffers: chunk {chunk.index} has {total} parameters, memlib counts {expected}")
    return out


def rank_params(part: Partition, stage: int | Stage = -1) -> list[list[MegatronParam]]:
    """The parameters of every model chunk pipeline rank ``stage`` holds (one list per chunk)."""
    st = _stage(part, stage)
    cache = part.__dict__.setdefault("_megatron_chunk_params", {})
    for c in st.chunks:
        if c.index not in cache:
            cache[c.index] = chunk_params(part, c)
    return [cache[c.index] for c in st.chunks]


def _stage(part: Partition, stage: int | Stage) -> Stage:
    if isinstance(stage, Stage):
        return stage
    if isinstance(stage, bool) or not isinstance(stage, int) or not -part.train.pp <= stage < part.train.pp:
        raise ConfigError(f"stage={show(stage)} must be a pipeline rank in 0..{part.train.pp - 1} (or -1 for the last)")
    return part.stages[stage]
