"""Worker for tests/device/test_pipeline_inputs.py: Megatron-Core's 1F1B schedule over two pipeline ranks on the CPU.

``python tests/megatron_pipeline_worker.py REQUESTS OUT WORLD RANK STORE`` builds the rank's GPTModel chunk as
tests/megatron_buffers_worker.py does (megatron-core 0.19.2, local spec, bf16, gloo), runs two training steps of
``get_forward_backward_func()`` (forward_backward_pipelining_without_interleaving, its p2p communication
included) over 4 micro-batches, and writes what the model still holds after the step
(``decoder.input_tensor`` and its gradient) and, at the start of each forward of the last step, which inputs the
rank received before the current one are still alive.
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
    model, cfg = w._build(req, world, rank)
    t = req["train"]
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

    core = model.module.module
    received, alive = [], []

    def pre(mod, args):
        current = core.decoder.input_tensor
        alive.append([r() is not None and r() is not current for r in received])
        if current is not None:
            received.append(weakref.ref(current))

    core.decoder.register_forward_pre_hook(pre)
    data = batches()
    for _ in range(2):
        received.clear()
        alive.clear()
        with _cuda_as_cpu_mode():
            get_forward_backward_func()(forward_step_func=forward_step, data_iterator=data, model=[model],
                                        num_microbatches=MICRO_BATCHES, seq_length=s, micro_batch_size=b,
                                        forward_only=False)
    gc.collect()
    x = core.decoder.input_tensor

    def info(y):
        return None if y is None else {"shape": list(y.shape), "dtype": str(y.dtype).replace("torch.", ""),
                                       "nbytes": y.untyped_storage().nbytes()}

    json.dump({"rank": rank, "input": info(x), "grad": info(None if x is None else x.grad), "alive": alive},
              open(out_path, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
