"""What megatron-core needs to run on the CPU, installed at run time in the measuring process only.

Stand-ins for ``triton`` and Apex's fused weight-gradient kernel, ``torch.compile`` set aside while
megatron-core is imported, CUDA devices, streams, events and RNG state mapped to the CPU, and the few
fixes of megatron-core 0.19.2's CPU paths; megatron-core's files are not edited.  Each workaround and
its reason is listed in ``docs/derivations/measure_megatron.md`` ("What is worked around on the CPU").
:mod:`memlib.measure.step` runs compiled functions and the checkpoint's storage swap through
:data:`_FUSED_HOOK` and :data:`_SHARE_HOOK`.
"""
from __future__ import annotations

import sys

_SHIMMED = False
#: how a compiled (``jit_fuser``) function runs when set: ``hook(fn, *args, **kwargs)``; None runs it eagerly.
#: :mod:`memlib.measure.step` counts it as one fused region.
_FUSED_HOOK = None
#: how ``CheckpointWithoutOutput``'s zero-copy storage swap runs when set: ``hook(dst, src)``; None copies.
_SHARE_HOOK = None


def _compiled(fn):
    """What ``torch.compile(fn)`` is while megatron-core is imported: ``fn``, run eagerly (through
    :data:`_FUSED_HOOK` when it is set)."""
    import functools

    @functools.wraps(fn)
    def run(*args, **kwargs):
        hook = _FUSED_HOOK
        return fn(*args, **kwargs) if hook is None else hook(fn, *args, **kwargs)

    return run


def _triton_stand_in():
    """A module that lets ``import triton`` and ``@triton.jit`` succeed; nothing in it runs."""
    import types

    class _Anything:
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            if len(a) == 1 and callable(a[0]) and not k:
                return a[0]
            return _Anything()

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Anything()

    def _getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    triton = types.ModuleType("triton")
    triton.__path__ = []
    triton.__version__ = "0.0.0"
    triton.jit = lambda fn=None, **k: fn if fn is not None else (lambda f: f)
    triton.autotune = triton.heuristics = lambda *a, **k: (lambda f: f)
    triton.Config = _Anything
    triton.cdiv = lambda a, b: -(-a // b)
    language = types.ModuleType("triton.language")
    language.__getattr__ = _getattr
    triton.language = language
    return {"triton": triton, "triton.language": language}


def _wgrad_gemm_accum(total_input, grad_output, main_grad):
    """``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_*``'s effect: ``main_grad += grad_output^T total_input``,
    one GEMM accumulating into ``main_grad`` (counted as a fused region: it allocates nothing)."""

    def gemm():
        main_grad.add_(grad_output.t().to(main_grad.dtype) @ total_input.to(main_grad.dtype))

    hook = _FUSED_HOOK
    gemm() if hook is None else hook(gemm)


def _grad_accum_fusion_stand_in():
    """Apex's ``fused_weight_gradient_mlp_cuda`` (gradient accumulation fusion), on the CPU."""
    import types

    module = types.ModuleType("fused_weight_gradient_mlp_cuda")
    module.wgrad_gemm_accum_fp32 = module.wgrad_gemm_accum_fp16 = _wgrad_gemm_accum
    return {"fused_weight_gradient_mlp_cuda": module}


def _install_shims() -> None:
    """Import megatron-core and make it run on the CPU (see the module docstring)."""
    global _SHIMMED
    if _SHIMMED:
        return
    import contextlib
    import warnings

    import torch

    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|absl|TE|deprecated|DEPRECATED).*")
    warnings.filterwarnings("ignore", category=UserWarning, module="megatron")
    warnings.filterwarnings("ignore", category=FutureWarning)
    stand_in = {**_triton_stand_in(), **_grad_accum_fusion_stand_in()}
    saved_compile = torch.compile
    sys.modules.update(stand_in)
    torch.compile = lambda fn=None, **k: _compiled(fn) if fn is not None else _compiled
    try:
        import megatron.core  # noqa: F401
        import megatron.core.models.gpt  # noqa: F401
        import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401
        import megatron.core.distributed  # noqa: F401
    finally:
        torch.compile = saved_compile
        for name in stand_in:
            sys.modules.pop(name, None)

    class _Event:
        def __init__(self, *a, **k):
            pass

        def record(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def wait(self, *a, **k):
            pass

        def query(self):
            return True

    class _Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a):
            pass

        def wait_event(self, *a):
            pass

        def record_event(self, *a):
            return _Event()

        def synchronize(self):
            pass

    stream = _Stream()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.Stream, torch.cuda.Event = _Stream, _Event
    torch.cuda.current_stream = lambda *a, **k: stream
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: None

    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda *a, **k: None

    def share_storage(dst, src):        # the C++ extension's effect: dst's storage holds src's data
        if _SHARE_HOOK is not None:
            return _SHARE_HOOK(dst, src)
        dst.untyped_storage().resize_(src.untyped_storage().nbytes())
        dst.untyped_storage().copy_(src.untyped_storage())

    mrandom._get_share_storage = lambda: share_storage
    original_init = mrandom.CheckpointWithoutOutput.__init__

    def checkpoint_init(self, fp8=False):
        original_init(self, fp8)
        self.fp8 = bool(fp8)           # 0.19.2 reads `fp8 is not None`: False would mean fp8

    mrandom.CheckpointWithoutOutput.__init__ = checkpoint_init

    from megatron.core.transformer.moe import token_dispatcher

    def to_host(tensor, as_numpy=False, record_stream=False):
        # the alltoall dispatcher copies its split sizes to the host (as numpy arrays) for the all-to-all;
        # megatron-core only does so for CUDA tensors, and gloo's all_to_all_single wants them as a sequence
        if torch.is_tensor(tensor) and as_numpy:
            return tensor.numpy()
        return tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host
    _SHIMMED = True


def _init_distributed(world: int, rank: int, store: str | None) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if world == 1:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)


def _mla_dot_product_attention():
    """The local ``DotProductAttention``, taking MLA's key and value head dimensions."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kw):
            super().__init__(*args, **kw)
            if v_channels is not None:
                self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    return MLADotProductAttention


# ------------------------------------------------------------------------------------------------
# CUDA calls answered on the CPU
# ------------------------------------------------------------------------------------------------
def _cuda_as_cpu_mode(on_result=None):
    """A TorchFunctionMode in which ``device="cuda"``, ``Tensor.cuda()`` and ``Tensor.to("cuda")`` mean the
    CPU, and ``Tensor.type()`` names the CUDA type (the optimizers check for ``torch.cuda.BFloat16Tensor``);
    ``on_result(result)`` sees what every call returns."""
    import torch
    from torch.overrides import TorchFunctionMode

    def cuda(d) -> bool:
        return (isinstance(d, str) and d.startswith("cuda")) or (isinstance(d, torch.device) and d.type == "cuda")

    class _CudaAsCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name if name.startswith("torch.cuda.") else "torch.cuda." + name.split(".", 1)[1]
            if cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
            if func is torch.Tensor.to:
                args = tuple("cpu" if cuda(a) else a for a in args)
            out = func(*args, **kwargs)
            if on_result is not None:
                on_result(out)
            return out

    return _CudaAsCpu()
