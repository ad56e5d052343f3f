"""Worker for tests/device/test_megatron_buffers.py: Megatron-Core's DDP buffers and retained state on the CPU.

``python tests/megatron_buffers_worker.py REQUESTS OUT [WORLD RANK STORE]`` builds, per request, the
rank's GPTModel chunk (local spec, bf16, megatron-core 0.19.2, with memlib.measure.megatron's CPU
stand-ins), wraps it in ``DistributedDataParallel`` with the distributed optimizer's layout, and
writes for every buffer the parameters (name, numel, (start, end) in the buffer, elements this rank's
optimizer shard owns, computed by ``DistributedOptimizer._build_gbuf_range_map``), the buckets and the
padded size.  With ``forward`` it then runs one training forward and backward pass and lists the tensors
the model's modules still hold as attributes or buffers (not parameters or DDP buffers).
"""
from __future__ import annotations

import dataclasses
import json
import sys


def _build(req: dict, world: int, rank: int):
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    from memlib.measure.cpu_shims import _mla_dot_product_attention
    from memlib.measure.megatron_model import _transformer_config

    t, d = req["train"], req["ddp"]
    destroy_moe_metrics_tracker()
    MTPLossLoggingHelper.tracker.clear()
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=t["pp"],
                                 expert_model_parallel_size=t["ep"], expert_tensor_parallel_size=1)
    model_parallel_cuda_manual_seed(0)
    torch.manual_seed(0)
    cfg = dataclasses.replace(_transformer_config(req), pipeline_model_parallel_size=t["pp"],
                              pipeline_dtype=torch.bfloat16 if t["pp"] > 1 else None)
    spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    attention = _mla_dot_product_attention()
    for layer in spec.layer_specs:
        layer.submodules.self_attention.submodules.core_attention = attention
    mtp = get_gpt_mtp_block_spec(cfg, spec, use_transformer_engine=False) if req["model"]["num_nextn_predict_layers"] else None
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    model = GPTModel(cfg, spec, vocab_size=req["model"]["vocab_size"], max_sequence_length=max(t["seq_len"], 2),
                     mtp_block_spec=mtp, position_embedding_type="none", pre_process=first, post_process=last,
                     share_embeddings_and_output_weights=req["model"]["tie_word_embeddings"])
    model = Float16Module(cfg, model)
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True,
                                        overlap_grad_reduce=d["overlap_grad_reduce"], bucket_size=d["bucket_size"])
    model = DistributedDataParallel(cfg, ddp, model)
    model.train()
    return model, cfg


def _buffers(model) -> list[dict]:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    names = {p: n for n, p in model.module.module.named_parameters()}
    out = []
    for group, buffers in (("dense", model.buffers), ("expert", model.expert_parallel_buffers)):
        for buf in buffers:
            ranges = DistributedOptimizer._build_gbuf_range_map(buf)
            owned = {}
            for bucket_map in next(iter(ranges.values())):
                for p, r in bucket_map["param_map"].items():
                    owned[p] = owned.get(p, 0) + r["param"].size
            params = []
            for p in buf.params:     # registration order
                start, end, bucket = buf.param_index_map[p]
                params.append({"name": names[p], "numel": p.numel(), "start": start, "end": end, "bucket": bucket,
                               "owned": owned.get(p, 0), "shared_embedding": bool(getattr(p, "shared_embedding", False))})
            out.append({"group": group, "numel": buf.numel, "numel_unpadded": buf.numel_unpadded,
                        "grad_bytes": buf.grad_data.numel() * buf.grad_data.element_size(),
                        "param_bytes": buf.param_data.numel() * buf.param_data.element_size(),
                        "dp": buf.data_parallel_group.size(), "dp_rank": buf.data_parallel_group.rank(),
                        "buckets": [list(x) for x in buf.bucket_indices], "params": params})
    return out


def _retained(model, req: dict) -> list[dict]:
    """One forward and backward pass; then the tensors the modules hold besides parameters and buffers of DDP."""
    import gc

    import torch

    t = req["train"]
    b, s, v = t["micro_batch"], t["seq_len"], req["model"]["vocab_size"]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, v, (b, s + 1), generator=g)
    ids, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    pos = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
    mask = (torch.tril(torch.ones(s, s)) < 0.5).unsqueeze(0).unsqueeze(0).expand(b, 1, s, s).contiguous()
    loss_mask = torch.ones(b, s)
    out = model(ids, pos, mask, labels=labels, loss_mask=loss_mask)
    (out.float().view(-1) * loss_mask.view(-1)).sum().backward()
    del out
    gc.collect()
    core = model.module.module
    owned = {p.untyped_storage().data_ptr() for p in core.parameters()}
    for buf in model.buffers + model.expert_parallel_buffers:
        owned.add(buf.grad_data.untyped_storage().data_ptr())
        owned.add(buf.param_data.untyped_storage().data_ptr())
    found = []

    def add(where, x):
        if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in owned and x.numel():
            found.append({"where": where, "shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
                          "nbytes": x.untyped_storage().nbytes()})

    for name, mod in core.named_modules():
        for key, value in vars(mod).items():
            if key == "_buffers":
                for bk, bv in value.items():
                    add(f"{name}.{bk}", bv)
            elif key not in ("_parameters", "_modules"):
                add(f"{name}.{key}", value)
                if type(value).__name__.endswith("TokenDispatcher"):
                    for dk, dv in vars(value).items():
                        add(f"{name}.{key}.{dk}", dv)
    from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as yarn

    found.append({"where": "yarn.forward.lru_cache", "entries": yarn.YarnRotaryEmbedding.forward.cache_info().currsize})
    return found


def main(argv: list[str]) -> int:
    from memlib.measure.cpu_shims import _init_distributed, _install_shims

    requests_path, out_path = argv[0], argv[1]
    world, rank, store = (int(argv[2]), int(argv[3]), argv[4]) if len(argv) > 2 else (1, 0, None)
    _install_shims()
    import torch

    # a stage that keeps a copy of the embedding all-reduces it from the first stage after moving it
    # with .cuda() (language_module.py:300-308): on the CPU the tensor stays where it is
    torch.Tensor.cuda = lambda self, *a, **k: self
    _init_distributed(world, rank, store)
    with open(requests_path) as f:
        requests = json.load(f)
    results = []
    for req in requests:
        model, _ = _build(req, world, rank)
        res = {"rank": rank, "buffers": _buffers(model)}
        if req.get("forward"):
            res["retained"] = _retained(model, req)
        results.append(res)
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
