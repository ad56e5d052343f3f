"""Megatron-Core's model for a measurement request: the transformer config and the ``GPTModel`` under DDP.

:func:`_build` turns a request (:class:`~memlib.measure.megatron.Request` as JSON) into Megatron-Core's
``GPTModel`` of the local spec (any family memlib models), wrapped in ``DistributedDataParallel``, on the CPU;
:mod:`memlib.measure.megatron` measures its forward, :mod:`memlib.measure.step` a training step, and
``benchmarks/gpu_peaks.py`` builds the same model on a GPU.  Runs in the worker process only (imports
torch and megatron-core).  Sources: ``docs/derivations/measure_megatron.md``.
"""
from __future__ import annotations

from ..config import ModelConfig
from ..ledgers.base import parse_policy
from .cpu_shims import _mla_dot_product_attention

def _transformer_config(req: dict):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    m, t = req["model"], req["train"]
    kinds = _layer_kinds(m)
    moe = "moe" in kinds or (m["num_nextn_predict_layers"] and kinds[-1] == "moe")
    bf16 = t["precision"] != "fp32"
    policy = parse_policy(t["recompute"] or "none")
    kw = {}
    if policy.full:
        kw.update(recompute_granularity="full", recompute_method="uniform" if policy.block_layers is None else "block",
                  recompute_num_layers=policy.block_layers or 1)
    elif policy.modules:
        kw.update(recompute_granularity="selective", recompute_modules=sorted(policy.modules))
    gqa = m.get("attention", "mla") == "gqa"
    if moe and gqa:
        # Mixtral and Qwen3-MoE: softmax over the top-k logits (= the renormalised top-k of the softmax,
        # Qwen3-MoE's norm_topk_prob); Qwen2-MoE: the top-k of the softmax, not renormalised, and one shared
        # expert behind a sigmoid gate (--moe-shared-expert-gate)
        from ..ledgers.megatron_blocks import router_softmax_first

        qwen2 = m["moe"] == "qwen2_moe"
        kw.update(
            num_moe_experts=m["n_routed_experts"], moe_ffn_hidden_size=m["moe_intermediate_size"],
            moe_shared_expert_intermediate_size=m["shared_expert_intermediate_size"] if qwen2 else None,
            moe_shared_expert_gate=qwen2,
            moe_router_topk=m["num_experts_per_tok"], moe_layer_freq=[int(k == "moe") for k in kinds],
            moe_router_score_function="softmax", moe_router_pre_softmax=router_softmax_first(_model_config(m)),
            moe_router_dtype="fp32",
            moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
            moe_router_load_balancing_type=t["moe_aux_loss"] if t["moe_aux_loss"] != "none" else "aux_loss",
            moe_aux_loss_coeff=1e-4 if t["moe_aux_loss"] != "none" else 0.0,
            moe_permute_fusion=False, moe_router_fusion=False,
        )
    elif moe:
        sigmoid = m["scoring_func"] == "sigmoid"
        kw.update(
            num_moe_experts=m["n_routed_experts"], moe_ffn_hidden_size=m["moe_intermediate_size"],
            moe_shared_expert_intermediate_size=(m["n_shared_experts"] * m["moe_intermediate_size"]
                                                 if m["n_shared_experts"] else None),
            moe_router_topk=m["num_experts_per_tok"], moe_layer_freq=[int(k == "moe") for k in kinds],
            moe_router_score_function=m["scoring_func"], moe_router_pre_softmax=True,
            moe_router_enable_expert_bias=m["topk_method"] == "noaux_tc",
            moe_router_topk_scaling_factor=2.5 if sigmoid else None, moe_router_dtype="fp32",
            moe_router_num_groups=m["n_group"] if m["n_group"] > 1 else None,
            moe_router_group_topk=m["topk_group"] if m["n_group"] > 1 else None,
            moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
            moe_router_load_balancing_type=t["moe_aux_loss"] if t["moe_aux_loss"] != "none" else "aux_loss",
            moe_aux_loss_coeff=1e-4 if t["moe_aux_loss"] != "none" else 0.0,
            moe_permute_fusion=False, moe_router_fusion=False,
        )
    if m["num_nextn_predict_layers"]:
        kw.update(mtp_num_layers=m["num_nextn_predict_layers"], mtp_loss_scaling_factor=0.1)
    sp = t["tp"] > 1 and t["sp"]
    common = dict(
        num_layers=m["num_hidden_layers"], hidden_size=m["hidden_size"], num_attention_heads=m["num_attention_heads"],
        hidden_dropout=0.0, attention_dropout=0.0,
        bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32, pipeline_dtype=None,
        # on a GPU (benchmarks/gpu_peaks.py) the weights are created where they live, as Megatron-LM does
        use_cpu_initialization=req.get("device", "cpu") == "cpu", perform_initialization=True,
        tensor_model_parallel_size=t["tp"], expert_model_parallel_size=t["ep"],
        expert_tensor_parallel_size=t["etp"], context_parallel_size=t["cp"], sequence_parallel=sp,
        apply_rope_fusion=False, gradient_accumulation_fusion=bool(req.get("gradient_accumulation_fusion")),
        persist_layer_norm=False,
        masked_softmax_fusion=False, bias_dropout_fusion=True,
        attention_softmax_in_fp32=t["attention_softmax_in_fp32"], bias_activation_fusion=t["bias_swiglu_fusion"],
        cross_entropy_loss_fusion=t["cross_entropy_loss_fusion"],
        cross_entropy_fusion_impl=t["cross_entropy_fusion_impl"])
    if gqa:
        from megatron.core.transformer.transformer_config import TransformerConfig

        gelu = m["mlp"] == "gelu"
        # Megatron's add_bias_linear puts a bias on linear_proj, fc1 and fc2 (and the experts) together
        return TransformerConfig(
            ffn_hidden_size=m["intermediate_size"] or m["moe_intermediate_size"],
            num_query_groups=m["num_key_value_heads"], kv_channels=m["head_dim"],
            normalization="LayerNorm" if m["norm"] == "layernorm" else "RMSNorm", qk_layernorm=m["qk_norm"],
            gated_linear_unit=not gelu, activation_func=F.gelu if gelu else F.silu,
            add_bias_linear=m["o_bias"], add_qkv_bias=m["qkv_bias"], **common, **kw)
    return MLATransformerConfig(
        ffn_hidden_size=m["intermediate_size"],
        q_lora_rank=m["q_lora_rank"], kv_lora_rank=m["kv_lora_rank"],
        qk_head_dim=m["qk_nope_head_dim"], qk_pos_emb_head_dim=m["qk_rope_head_dim"], v_head_dim=m["v_head_dim"],
        normalization="RMSNorm", qk_layernorm=True, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, rope_type="yarn", rotary_scaling_factor=40, original_max_position_embeddings=4096,
        **common, **kw)


def _model_config(m: dict) -> ModelConfig:
    """The :class:`ModelConfig` a request's model dict was made from (a non-DeepSeek family's)."""
    from dataclasses import fields

    names = {f.name for f in fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in m.items() if k in names})


def m_kind(req: dict) -> str:
    """The attention kind of a request's model (``mla`` for DeepSeek's, which names none)."""
    return req["model"].get("attention", "mla")


def _layer_kinds(m: dict) -> list[str]:
    freq, k = m["moe_layer_freq"], m["first_k_dense_replace"]
    return ["moe" if i >= k and i % freq == 0 else "dense" for i in range(m["num_hidden_layers"])]


def _build(req: dict, ddp_options: dict | None = None):
    """Megatron-Core's GPTModel for the request, wrapped as Megatron-LM wraps it (``ddp_options``: more
    ``DistributedDataParallelConfig`` fields)."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.tensor_parallel import ColumnParallelLinear, model_parallel_cuda_manual_seed
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    m, t = req["model"], req["train"]
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

    destroy_moe_metrics_tracker()       # per-layer loss trackers are sized by the first model's layers
    MTPLossLoggingHelper.tracker.clear()
    # the auxiliary losses' backward scales are class attributes that the schedule sets (shape [1]): each model
    # starts from megatron-core's initial values
    MoEAuxLossAutoScaler.main_loss_backward_scale = None
    MTPLossAutoScaler.main_loss_backward_scale = torch.tensor(1.0)
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=t["tp"], context_parallel_size=t["cp"],
                                 expert_model_parallel_size=t["ep"], expert_tensor_parallel_size=t["etp"])
    model_parallel_cuda_manual_seed(req["seed"])
    torch.manual_seed(req["seed"])
    cfg = _transformer_config(req)
    mla = m.get("attention", "mla") == "mla"
    spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=cfg.normalization)
    if mla:
        attention = _mla_dot_product_attention()
        for layer in spec.layer_specs:
            sub = layer.submodules.self_attention.submodules
            sub.core_attention = attention
            if m["q_lora_rank"] is None:
                sub.q_layernorm = IdentityOp         # no query latent, so no query latent norm
    mtp = get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False) if m["num_nextn_predict_layers"] else None
    if mla and m["q_lora_rank"] is None:
        MLASelfAttention._resolve_qk_norm_config = _plain_q_proj(MLASelfAttention._resolve_qk_norm_config,
                                                                 ColumnParallelLinear)
    learned = m.get("positions") == "learned"
    positions = "none" if mla else ("learned_absolute" if learned else "rope")
    n_pos = m["max_position_embeddings"] if learned else max(t["seq_len"], 2)
    model = GPTModel(cfg, spec, vocab_size=m["vocab_size"], max_sequence_length=n_pos,
                     mtp_block_spec=mtp, position_embedding_type=positions,
                     share_embeddings_and_output_weights=m["tie_word_embeddings"])
    if req.get("device", "cpu") == "cuda":
        model.cuda(torch.cuda.current_device())     # megatron/training/training.py get_model: before Float16Module
    if cfg.bf16:
        model = Float16Module(cfg, model)
    ddp = DistributedDataParallelConfig(**{"grad_reduce_in_fp32": True, "use_distributed_optimizer": False,
                                           **(ddp_options or {})})
    model = DistributedDataParallel(cfg, ddp, model)
    model.train()
    return model, cfg


def _plain_q_proj(resolve, linear):
    """Without q LoRA, build ``linear_q_proj`` as a plain column-parallel Linear (as transformers does):
    the local spec would ask for Transformer Engine's fused norm + linear there."""
    if getattr(resolve, "_memlib_plain_q_proj", False):
        return resolve
    from megatron.core.transformer.identity_op import IdentityOp

    def patched(self, submodules):
        if self.config.q_lora_rank is None:
            return dict(linear_q_proj=linear, linear_q_up_proj=IdentityOp,
                        linear_kv_up_proj=submodules.linear_kv_up_proj or linear,
                        q_layernorm=IdentityOp, kv_layernorm=submodules.kv_layernorm)
        return resolve(self, submodules)

    patched._memlib_plain_q_proj = True
    return patched
