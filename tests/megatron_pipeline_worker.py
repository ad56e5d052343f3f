"""Worker for tests/device/test_pipeline_inputs.py: Megatron-Core's 1F1B schedule over two pipeline ranks on the CPU.

``python tests/megatron_pipeline_worker.py REQUESTS OUT WORLD RANK STORE`` builds the rank's GPTModel chunk as
tests/megatron_buffers_worker.py does (megatron-core 0.19.2, local spec, bf16, gloo), runs two training steps of
``get_forward_backward_func()`` (forward_backward_pipelining_without_interleaving, its p2p communication
included; or, with ``vpp`` 2 in the request, forward_backward_pipelining_with_interleaving over two chunks a rank)
over 4 micro-batches, and writes what each chunk still holds after the step (``decoder.input_tensor`` and its
gradient) and, at the start of each forward of the last step, which inputs the rank received before the current one
are still alive.
"""
from __future__ import annotations

import gc
import json
import sys
import weakref

MICRO_BATCHES = 4


def main(argv: list[str]) -> int:
    from memlib.measure.cpu_shims import _cuda_as_cpu_mode, _init_distributed, _install_shims

    requests_path, out_path, world, rank, store = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4]
    _install_shims()
    import torch

    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.synchronize = lambda *a, **k: None        # p2p_communication.py syncs after batch_isend_irecv
    _init_distributed(world, rank, store)
    from megatron.core.pipeline_parallel import get_forward_backward_func

    import megatron_buffers_worker as w

    (req,) = json.load(open(requests_path))
    t = req["train"]
    chunks = _build_chunks(req) if t.get("vpp", 1) > 1 else [w._build(req, world, rank)[0]]
    b, s, v = t["micro_batch"], t["seq_len"], req["model"]["vocab_size"]
    g = torch.Generator().manual_seed(0)

    def batches():
        mask = (torch.tril(torch.ones(s, s)) < 0.5).unsqueeze(0).unsqueeze(0).expand(b, 1, s, s).contiguous()
        while True:
            tokens = torch.randint(0, v, (b, s + 1), generator=g)
            yield tokens[:, :-1].clone(), tokens[:, 1:].clone(), torch.arange(s).unsqueeze(0).expand(b, s), mask

    def forward_step(it, m):
        tokens, labels, pos, mask = next(it)
        out = m(tokens, pos, mask, labels=labels)
        return out, lambda o: (o.float().mean(), {"lm loss": o.float().mean().detach()})

    cores = [c.module.module for c in chunks]
    received, alive = [], []

    def pre(mod, args):
        current = mod.input_tensor
        alive.append([r() is not None and r() is not current for r in received])
        if current is not None:
            received.append(weakref.ref(current))

    for core in cores:
        core.decoder.register_forward_pre_hook(pre)
    data = [batches() for _ in chunks]
    for _ in range(2):
        received.clear()
        alive.clear()
        with _cuda_as_cpu_mode():
            get_forward_backward_func()(forward_step_func=forward_step, data_iterator=data if len(chunks) > 1
                                        else data[0], model=chunks, num_microbatches=MICRO_BATCHES, seq_length=s,
                                        micro_batch_size=b, forward_only=False)
    gc.collect()

    def info(y):
        return None if y is None else {"shape": list(y.shape), "dtype": str(y.dtype).replace("torch.", ""),
                                       "nbytes": y.untyped_storage().nbytes()}

    held = [{"input": info(c.decoder.input_tensor),
             "grad": info(None if c.decoder.input_tensor is None else c.decoder.input_tensor.grad)} for c in cores]
    json.dump({"rank": rank, "chunks": held, "alive": alive}, open(out_path, "w"))
    return 0


def _build_chunks(req: dict) -> list:
    """The rank's two model chunks of the interleaved schedule (no MTP), as megatron_buffers_worker builds one."""
    import dataclasses

    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module

    from memlib.measure.cpu_shims import _mla_dot_product_attention
    from memlib.measure.megatron_model import _transformer_config

    t, v = req["train"], req["train"]["vpp"]
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=t["pp"],
                                 virtual_pipeline_model_parallel_size=v, expert_model_parallel_size=t["ep"],
                                 expert_tensor_parallel_size=1)
    model_parallel_cuda_manual_seed(0)
    torch.manual_seed(0)
    cfg = dataclasses.replace(_transformer_config(req), pipeline_model_parallel_size=t["pp"],
                              virtual_pipeline_model_parallel_size=v, pipeline_dtype=torch.bfloat16,
                              microbatch_group_size_per_vp_stage=t["pp"])
    attention = _mla_dot_product_attention()
    chunks = []
    for i in range(v):
        spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm", vp_stage=i)
        for layer in spec.layer_specs:
            layer.submodules.self_attention.submodules.core_attention = attention
        model = GPTModel(cfg, spec, vocab_size=req["model"]["vocab_size"], max_sequence_length=t["seq_len"],
                         position_embedding_type="none", share_embeddings_and_output_weights=False, vp_stage=i,
                         pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=i),
                         post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=i))
        ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True)
        model = DistributedDataParallel(cfg, ddp, Float16Module(cfg, model))
        model.train()
        chunks.append(model)
    return chunks


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
