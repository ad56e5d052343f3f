"""Persistent memory of one rank under Megatron-Core's DDP and distributed optimizer, exactly.

What a Megatron-LM rank still holds after ``optimizer.step()`` (the ``mem-allocated-bytes`` its
functional tests log, :data:`memlib.data.reference.MEGATRON_RUNS`): the model states in DDP's padded
contiguous buffers and the distributed optimizer's shards (:func:`model_state_memory`), and the
framework's own buffers (:func:`framework_memory`), every tensor rounded as PyTorch's caching allocator
rounds it (:func:`memlib.device.allocator.allocation`).  :func:`persistent_memory` is what :mod:`memlib.device.peak` adds for
the ``megatron`` profile.

The derivation, with its sources (file:line), is in ``docs/derivations/megatron_buffers.md``.
"""
from __future__ import annotations

import inspect
import math
import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterable, Optional, Sequence

from ..core.breakdown import Breakdown
from ..config import ConfigError, ModelConfig, TrainingConfig, show
from ..config.strategies import Schedule
from ..config.versions import DEFAULT_VERSION, parse_version
from ..model.partition import Partition, Stage
from ..core.units import MiB
from .allocator import PYTORCH_ALLOCATOR, allocation
from .megatron_params import MegatronParam, _stage, rank_params
from .schedule import default_microbatches

__all__ = [
    "TE_COMMIT",
    "BufferLayout", "buffer_layout", "shard_numels", "default_bucket_size", "Buffer", "buffers_of", "rank_buffers",
    "fresh_segment_slack", "STATE_TERMS", "states_of", "model_state_memory",
    "te_cublas_workspace_bytes", "torch_cublas_workspace_bytes", "FRAMEWORK_TERMS", "framework_tensors",
    "framework_memory", "persistent_memory", "Derivation", "derive_data_parallel_size",
]

#: Transformer Engine snapshot (2.20.0 dev) the TE references point at
TE_COMMIT = "d0067d0da6cb01811b8072a7d304f0e00344ce2b"


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={show(value)} must be true or false")
    return value


def _check_int(name: str, value, allowed: Iterable[int] | None = None, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={show(value)} must be an integer >= {minimum}")
    if allowed is not None and value not in allowed:
        raise ConfigError(f"{name}={show(value)} must be one of {', '.join(map(str, allowed))}")
    return value



# ------------------------------------------------------------------------------------------------
# the contiguous buffers and their shards
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BufferLayout:
    """Where each parameter sits in one DDP buffer (element offsets), and its buckets."""

    param_ranges: tuple[tuple[int, int], ...]   #: (start, end) of each parameter, in the given order
    buckets: tuple[tuple[int, int], ...]        #: (start, end) of each bucket, padded
    numel: int                                  #: elements allocated (with padding)
    numel_unpadded: int                         #: elements of the parameters themselves

    @property
    def padding(self) -> int:
        return self.numel - self.numel_unpadded


def _pad(x: int, d: int) -> int:
    return -(-x // d) * d


def buffer_layout(numels: Sequence[int], data_parallel_size: int, *, bucket_size: Optional[int] = None,
                  distributed_optimizer: bool = True, shared_embedding: Sequence[bool] | None = None,
                  pad_buckets_for_high_nccl_busbw: bool = False) -> BufferLayout:
    """The layout of one DDP buffer holding parameters of ``numels`` (registration order).

    Parameters are placed in reverse (backward) order.  With the distributed optimizer
    (distrib_optimizer.py:506-588): each parameter starts on a multiple of 64 elements
    (param_layout.py:24-26); a bucket closes once it holds ``bucket_size`` elements or at a
    ``shared_embedding`` parameter, which gets a bucket of its own; every bucket end is padded to a
    multiple of lcm(DP, 128), or lcm(DP, 128, 2^16) with ``pad_buckets_for_high_nccl_busbw``
    (param_layout.py:29-42).  Without it (param_and_grad_buffer.py:954-1001) nothing is padded.

    >>> buffer_layout([100, 30], 2, distributed_optimizer=False).numel
    130
    >>> buffer_layout([10, 20, 30], 2, shared_embedding=[True, False, False]).buckets
    ((0, 128), (128, 256))
    """
    dp = _check_int("data_parallel_size", data_parallel_size)
    if bucket_size is not None:
        _check_int("bucket_size", bucket_size)
    flags = list(shared_embedding) if shared_embedding is not None else [False] * len(numels)
    if len(flags) != len(numels):
        raise ConfigError(f"shared_embedding has {len(flags)} entries for {len(numels)} parameters")
    ranges: list[tuple[int, int]] = [(0, 0)] * len(numels)
    buckets: list[tuple[int, int]] = []
    if not distributed_optimizer:
        start = bucket_start = 0
        for i in reversed(range(len(numels))):
            end = start + numels[i]
            ranges[i] = (start, end)
            start = end
            if bucket_size is not None and end - bucket_start >= bucket_size:
                buckets.append((bucket_start, end))
                bucket_start = end
        if start > bucket_start or not buckets:
            buckets.append((bucket_start, start))
        return BufferLayout(tuple(ranges), tuple(buckets), start, start)
    divisor = math.lcm(dp, 128, 2**16) if pad_buckets_for_high_nccl_busbw else math.lcm(dp, 128)
    start = bucket_start = 0
    in_bucket = 0

    def close(end: int) -> int:
        padded = _pad(end, divisor)
        buckets.append((bucket_start, padded))
        return padded

    end = 0
    for i in reversed(range(len(numels))):
        start = _pad(start, 64)
        if flags[i] and in_bucket:
            bucket_start = close(start)
            start, in_bucket = bucket_start, 0
        end = start + numels[i]
        ranges[i] = (start, end)
        in_bucket += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or flags[i]:
            bucket_start = close(end)
            start, in_bucket = bucket_start, 0
        else:
            start = end
    if in_bucket:
        close(end)
    # numel_unpadded: the parameters' own elements (Megatron-Core's own numel_unpadded counts the 64-element
    # alignment gaps as used; memlib counts them as padding)
    return BufferLayout(tuple(ranges), tuple(buckets), buckets[-1][1] if buckets else 0, sum(numels))


def shard_numels(layout: BufferLayout, data_parallel_size: int, rank: int) -> tuple[int, ...]:
    """Elements of each parameter that data-parallel rank ``rank`` owns: the ``rank``-th of
    ``data_parallel_size`` equal slices of every bucket (distrib_optimizer.py:200-256 and 134-197).

    >>> shard_numels(buffer_layout([100, 30], 2), 2, 1)
    (36, 0)
    """
    dp = _check_int("data_parallel_size", data_parallel_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < dp:
        raise ConfigError(f"rank={show(rank)} must be a data-parallel rank in 0..{dp - 1}")
    starts, ends = [], []
    for b0, b1 in layout.buckets:
        if (b1 - b0) % dp:
            raise ConfigError(f"bucket of {b1 - b0} elements is not divisible by data_parallel_size={dp}")
        size = (b1 - b0) // dp
        starts.append(b0 + rank * size)
        ends.append(b0 + (rank + 1) * size)
    # the owned slices are disjoint and in buffer order: the elements owned below x are a running sum over the
    # slices that start below x (found by bisection), so each parameter range costs two look-ups, not one
    # intersection per bucket
    below = [0, *accumulate(e - s for s, e in zip(starts, ends))]

    def owned_below(x: int) -> int:
        k = bisect_right(starts, x)               # slices starting at or below x
        return below[k] - (max(0, ends[k - 1] - x) if k else 0)

    return tuple(owned_below(p1) - owned_below(p0) for p0, p1 in layout.param_ranges)


def default_bucket_size(data_parallel_size: int, *, overlap_grad_reduce: bool, bucket_size: Optional[int] = None,
                        pp_rank: int = 0, chunk_index: int = 0) -> Optional[int]:
    """The bucket size Megatron-LM gives one model chunk's DDP: ``--ddp-bucket-size`` or
    max(4e7, 1e6 DP) elements with ``--overlap-grad-reduce``, else one bucket (training.py:2179-2194);
    one bucket too on pipeline ranks after the first and for chunks after the first (training.py:
    2503-2515).

    >>> default_bucket_size(64, overlap_grad_reduce=True)
    64000000
    >>> default_bucket_size(8, overlap_grad_reduce=True, pp_rank=1) is None
    True
    """
    if not overlap_grad_reduce or pp_rank > 0 or chunk_index > 0:
        return None
    return bucket_size if bucket_size is not None else max(40_000_000, 1_000_000 * data_parallel_size)


@dataclass(frozen=True)
class Buffer:
    """One DDP buffer of one model chunk on one rank."""

    chunk: int                          #: position of the model chunk on the rank
    group: str                          #: ``"dense"`` (sharded over DP CP) or ``"expert"`` (over EDP)
    params: tuple[MegatronParam, ...]   #: in registration order
    layout: BufferLayout
    data_parallel_size: int
    rank: int                           #: this rank's position in that group
    owned: tuple[int, ...]              #: elements of each parameter in this rank's optimizer shard


def _check_rank(name: str, r, n: int) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n:
        raise ConfigError(f"{name}={show(r)} must be in 0..{n - 1}")
    return r


def buffers_of(chunks: Sequence[Sequence[MegatronParam]], *, data_parallel_size: int,
               expert_data_parallel_size: Optional[int] = None, dp_rank: Optional[int] = None,
               edp_rank: Optional[int] = None, pp_rank: int = 0, distributed_optimizer: bool = True,
               overlap_grad_reduce: bool = False, bucket_size: Optional[int] = None,
               pad_buckets_for_high_nccl_busbw: bool = False) -> tuple[Buffer, ...]:
    """The DDP buffers of a rank holding the model ``chunks`` (each a list of :class:`MegatronParam`):
    per chunk a dense buffer over ``data_parallel_size`` (DP CP) ranks and an expert buffer over
    ``expert_data_parallel_size`` (EDP) ranks, laid out by :func:`buffer_layout` with the bucket size
    Megatron-LM gives the chunk (:func:`default_bucket_size`); ``dp_rank`` and ``edp_rank`` (default:
    the last, as on the rank that logs) pick the optimizer shard."""
    _check_flag("distributed_optimizer", distributed_optimizer)
    _check_flag("overlap_grad_reduce", overlap_grad_reduce)
    _check_flag("pad_buckets_for_high_nccl_busbw", pad_buckets_for_high_nccl_busbw)
    dp = _check_int("data_parallel_size", data_parallel_size)
    edp = _check_int("expert_data_parallel_size", dp if expert_data_parallel_size is None else expert_data_parallel_size)
    dp_rank = _check_rank("dp_rank", dp - 1 if dp_rank is None else dp_rank, dp)
    edp_rank = _check_rank("edp_rank", edp - 1 if edp_rank is None else edp_rank, edp)
    out = []
    for ci, params in enumerate(chunks):
        for group, size, rank in (("dense", dp, dp_rank), ("expert", edp, edp_rank)):
            ps = tuple(p for p in params if p.expert == (group == "expert"))
            if not ps:
                continue
            bsize = default_bucket_size(size, overlap_grad_reduce=overlap_grad_reduce, bucket_size=bucket_size,
                                        pp_rank=pp_rank, chunk_index=ci)
            lay = buffer_layout([p.numel for p in ps], size, bucket_size=bsize,
                                distributed_optimizer=distributed_optimizer,
                                shared_embedding=[p.shared_embedding for p in ps],
                                pad_buckets_for_high_nccl_busbw=pad_buckets_for_high_nccl_busbw)
            owned = shard_numels(lay, size, rank) if distributed_optimizer else tuple(p.numel for p in ps)
            out.append(Buffer(ci, group, ps, lay, size, rank, owned))
    return tuple(out)


def rank_buffers(part: Partition, stage: int | Stage = -1, *, dp_rank: Optional[int] = None,
                 edp_rank: Optional[int] = None, distributed_optimizer: bool = True, overlap_grad_reduce: bool = False,
                 bucket_size: Optional[int] = None, pad_buckets_for_high_nccl_busbw: bool = False
                 ) -> tuple[Buffer, ...]:
    """The DDP buffers of pipeline rank ``stage`` of ``part`` (default: the last, which logs the metrics)."""
    t = part.train
    st = _stage(part, stage)
    return buffers_of(rank_params(part, st), data_parallel_size=t.dp * t.cp, expert_data_parallel_size=t.edp,
                      dp_rank=dp_rank, edp_rank=edp_rank, pp_rank=st.index, distributed_optimizer=distributed_optimizer,
                      overlap_grad_reduce=overlap_grad_reduce, bucket_size=bucket_size,
                      pad_buckets_for_high_nccl_busbw=pad_buckets_for_high_nccl_busbw)


# ------------------------------------------------------------------------------------------------
# model states
# ------------------------------------------------------------------------------------------------
#: the caching allocator without expandable segments: requests of at least kMinLargeAlloc bytes get a
#: segment rounded up to kRoundLarge, and the block is not split when at most kSmallSize would remain
_MIN_LARGE_ALLOC, _ROUND_LARGE, _SMALL_SIZE = (PYTORCH_ALLOCATOR[k] for k in ("kMinLargeAlloc", "kRoundLarge", "kSmallSize"))


def fresh_segment_slack(nbytes: int) -> int:
    """Bytes the caching allocator counts beyond the request when, without expandable segments, a
    request of at least 10 MiB gets a fresh segment (rounded up to 2 MiB) that it does not split because
    at most 1 MiB would remain (c10/cuda/CUDACachingAllocator.cpp ``get_allocation_size``,
    ``should_split``).  A cached block reused instead may leave more or less.

    >>> fresh_segment_slack(51_642_368), fresh_segment_slack(25_821_184), fresh_segment_slack(4 * MiB)
    (786432, 0, 0)
    """
    a = allocation(nbytes)
    if a < _MIN_LARGE_ALLOC:
        return 0
    rest = _pad(a, _ROUND_LARGE) - a
    return rest if rest <= _SMALL_SIZE else 0


#: the model-state terms, in the order :func:`model_state_memory` lists them
STATE_TERMS = ("param_buffer", "param_buffer_padding", "grad_buffer", "grad_buffer_padding", "main_params",
               "exp_avg", "exp_avg_sq", "allocator_rounding", "allocator_slack")


def states_of(buffers: Sequence[Buffer], *, distributed_optimizer: bool = True, grad_dtype_bytes: int = 4,
              param_dtype_bytes: int = 2, expandable_segments: bool = True) -> Breakdown:
    """The model-state bytes of :func:`buffers_of`'s buffers: see :func:`model_state_memory`."""
    _check_int("grad_dtype_bytes", grad_dtype_bytes, (2, 4))
    _check_int("param_dtype_bytes", param_dtype_bytes, (1, 2, 4))
    _check_flag("expandable_segments", expandable_segments)
    terms = dict.fromkeys(STATE_TERMS, 0)
    asked: list[int] = []

    def alloc(nbytes: int) -> int:
        asked.append(nbytes)
        return allocation(nbytes)

    for buf in buffers:
        lay = buf.layout
        grad = alloc(grad_dtype_bytes * lay.numel)
        terms["grad_buffer"] += grad_dtype_bytes * lay.numel_unpadded
        terms["grad_buffer_padding"] += grad - grad_dtype_bytes * lay.numel_unpadded
        if distributed_optimizer:
            pbuf = alloc(param_dtype_bytes * lay.numel)
            terms["param_buffer"] += param_dtype_bytes * lay.numel_unpadded
            terms["param_buffer_padding"] += pbuf - param_dtype_bytes * lay.numel_unpadded
        else:
            terms["param_buffer"] += param_dtype_bytes * lay.numel_unpadded
            terms["allocator_rounding"] += sum(alloc(param_dtype_bytes * p.numel) - param_dtype_bytes * p.numel
                                               for p in buf.params)
        for key in ("main_params", "exp_avg", "exp_avg_sq"):
            terms[key] += 4 * sum(buf.owned)
            terms["allocator_rounding"] += sum(alloc(4 * n) - 4 * n for n in buf.owned)
    if not expandable_segments:
        terms["allocator_slack"] = sum(fresh_segment_slack(n) for n in asked)
    return Breakdown(terms)


def model_state_memory(part: Partition, stage: int | Stage = -1, *, dp_rank: Optional[int] = None,
                       edp_rank: Optional[int] = None, distributed_optimizer: bool = True,
                       grad_dtype_bytes: int = 4, param_dtype_bytes: int = 2, overlap_grad_reduce: bool = False,
                       bucket_size: Optional[int] = None, pad_buckets_for_high_nccl_busbw: bool = False,
                       expandable_segments: bool = True) -> Breakdown:
    """Bytes of the model states one rank holds after ``optimizer.step()``, as allocated.

    Terms: ``param_buffer`` and ``grad_buffer`` (the parameters' own elements), their
    ``param_buffer_padding`` and ``grad_buffer_padding`` (alignment and bucket-end padding), the
    optimizer's ``main_params``, ``exp_avg`` and ``exp_avg_sq`` (fp32, one tensor per parameter
    shard); ``allocator_rounding`` is the rounding of those separate tensors (and of the parameters
    without the distributed optimizer) up to :data:`memlib.device.allocator.BLOCK`; ``allocator_slack`` (only with
    ``expandable_segments=False``) what :func:`fresh_segment_slack` adds to each large tensor.

    Sources (MEGATRON_COMMIT): buffers param_and_grad_buffer.py:1180-1194 (param_data bf16 only with
    the distributed optimizer; grad_data fp32 when ``grad_reduce_in_fp32``, which Megatron-LM sets
    for bf16 unless ``--grad-reduce-in-bf16``, arguments.py:1205-1216); main-parameter shards
    distrib_optimizer.py:445 (``shard_model_param.clone().float()``); Adam's moments one per
    parameter (TE transformer_engine/pytorch/optimizers/fused_adam.py:393-452 at TE_COMMIT).
    Without the distributed optimizer the parameters stay separate tensors and
    Float16OptimizerWithFloat16Params keeps a whole fp32 copy of each (megatron/core/optimizer/optimizer.py).
    """
    bufs = rank_buffers(part, stage, dp_rank=dp_rank, edp_rank=edp_rank, distributed_optimizer=distributed_optimizer,
                        overlap_grad_reduce=overlap_grad_reduce, bucket_size=bucket_size,
                        pad_buckets_for_high_nccl_busbw=pad_buckets_for_high_nccl_busbw)
    return states_of(bufs, distributed_optimizer=distributed_optimizer, grad_dtype_bytes=grad_dtype_bytes,
                     param_dtype_bytes=param_dtype_bytes, expandable_segments=expandable_segments)


# ------------------------------------------------------------------------------------------------
# framework buffers
# ------------------------------------------------------------------------------------------------
def te_cublas_workspace_bytes(compute_capability: int) -> int:
    """One Transformer Engine cuBLAS workspace: 32 MiB + 1 KiB from Hopper on, 4 MiB before
    (TE transformer_engine/pytorch/cpp_extensions/gemm.py:40-46 at TE_COMMIT; the + 1 KiB since TE
    commit aee5a82, 2025-10-01, 256 B before it).

    >>> te_cublas_workspace_bytes(9), te_cublas_workspace_bytes(8)
    (33555456, 4194304)
    """
    return 32 * MiB + 1024 if compute_capability >= 9 else 4 * MiB


def cublas_workspace_pairs(text: str) -> list[tuple[int, int]]:
    """The ``(KiB, count)`` pairs of a ``CUBLAS_WORKSPACE_CONFIG`` value (``:SIZE:COUNT`` repeated).

    >>> cublas_workspace_pairs(":4096:8:16:8")
    [(4096, 8), (16, 8)]
    """
    if not isinstance(text, str) or not re.fullmatch(r"(:[0-9]+:[0-9]+)+", text.strip()):
        raise ConfigError(f"cublas_workspace_config={show(text)} must be :SIZE:COUNT pairs (KiB), e.g. :4096:8")
    return [(int(a), int(b)) for a, b in re.findall(r":([0-9]+):([0-9]+)", text)]


def torch_cublas_workspace_bytes(compute_capability: int, cublas_workspace_config: Optional[str] = None,
                                 minor: int = 0, blackwell_32mib: bool = True) -> int:
    """PyTorch's cuBLAS workspace, one per (handle, stream): ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT``
    pairs in KiB, summed SIZE x COUNT), else 32 MiB on Hopper and Blackwell (major 9, 10, 12) and 4096 KiB x 2 +
    16 KiB x 8 elsewhere (aten/src/ATen/cuda/CublasHandlePool.cpp, ``parseChosenWorkspaceSize``: "32MiB for Hopper
    and Blackwell").  Blackwell's 32 MiB came with pytorch#175344 (merged 2026-02-19); ``blackwell_32mib=False``
    is a PyTorch from before it, which gave 32 MiB to Hopper (major 9) only.

    >>> torch_cublas_workspace_bytes(9), torch_cublas_workspace_bytes(8), torch_cublas_workspace_bytes(8, ":4096:8")
    (33554432, 8519680, 33554432)
    >>> torch_cublas_workspace_bytes(10), torch_cublas_workspace_bytes(10, blackwell_32mib=False)
    (33554432, 8519680)
    """
    _check_flag("blackwell_32mib", blackwell_32mib)
    if cublas_workspace_config is not None:
        return sum(a * 1024 * b for a, b in cublas_workspace_pairs(cublas_workspace_config))
    big = (9, 10, 12) if blackwell_32mib else (9,)
    return 4096 * 8 * 1024 if compute_capability in big else 4096 * 1024 * 2 + 16 * 1024 * 8


#: the framework terms, in the order :func:`framework_memory` lists them
FRAMEWORK_TERMS = ("te_cublas_workspaces", "torch_cublas_workspaces", "te_dummy_wgrads",
                   "global_memory_buffer", "rope_caches", "router_buffers", "token_dispatcher_state",
                   "fp8_weight_copies", "pipeline_input_tensors", "rerun_saved_batches", "optimizer_flags")

#: Megatron-Core's ``min_offloaded_tensor_size`` default: smaller saved tensors stay on the GPU
MIN_OFFLOADED_ELEMENTS = 1024 * 1024

#: --rerun-mode's values (megatron/training/config/resilience_config.py)
RERUN_MODES = ("disabled", "validate_results", "report_stats")


def rerun_keeps_batches(train: TrainingConfig, rerun_mode: str = "validate_results",
                        data_loading_rank: bool = True) -> bool:
    """Whether the rank keeps every micro-batch of the step on the GPU until the next step (the persistent term
    ``rerun_saved_batches``): a rank that reads the data loader (TP rank 0), RerunDataIterator saving the step's
    micro-batches (``--rerun-mode`` not disabled), in a Megatron-LM whose get_batch fills the saved dict itself
    (:attr:`memlib.config.versions.MegatronVersion.rerun_iterator_keeps_gpu_batches`)."""
    if rerun_mode not in RERUN_MODES:
        raise ConfigError(f"rerun_mode={show(rerun_mode)} must be one of {', '.join(RERUN_MODES)}")
    _check_flag("data_loading_rank", data_loading_rank)
    return (data_loading_rank and rerun_mode != "disabled"
            and parse_version(train.megatron_version or DEFAULT_VERSION).rerun_iterator_keeps_gpu_batches)


def framework_tensors(part: Partition, stage: int | Stage = -1, *, compute_capability: int = 9,
                      gradient_accumulation_fusion: bool = True, rope_fusion: bool = True, fp8: Optional[str] = None,
                      fp8_recipe: str = "delayed", moe_grouped_gemm: bool = True, token_dispatcher: str = "alltoall",
                      permute_fusion: bool = True, cublas_workspace_config: Optional[str] = None,
                      torch_cublas_handles: int = 2, original_max_position_embeddings: int = 4096,
                      param_dtype_bytes: int = 2, blackwell_cublas_32mib: bool = True,
                      attention_mask_in_batch: bool = False, rerun_mode: str = "validate_results",
                      data_loading_rank: bool = True) -> list[tuple[str, str, int]]:
    """The persistent tensors of one rank besides the model states, as (term, tensor, bytes asked for):
    :func:`framework_memory` sums them as allocated.  See there for the terms and their sources."""
    m, t = part.model, part.train
    cc = _check_int("compute_capability", compute_capability, minimum=7)
    for name, value in (("gradient_accumulation_fusion", gradient_accumulation_fusion), ("rope_fusion", rope_fusion),
                        ("moe_grouped_gemm", moe_grouped_gemm), ("permute_fusion", permute_fusion)):
        _check_flag(name, value)
    if fp8 not in (None, "hybrid", "e4m3"):
        raise ConfigError(f"fp8={show(fp8)} must be null, hybrid or e4m3")
    if fp8 is not None and fp8_recipe not in ("delayed", "tensorwise"):
        raise ConfigError(f"fp8_recipe={show(fp8_recipe)} must be delayed or tensorwise (the recipes memlib "
                          f"sizes; blockwise and mxfp8 keep other scale layouts)")
    if token_dispatcher not in ("alltoall", "allgather", "flex"):
        raise ConfigError(f"token_dispatcher={show(token_dispatcher)} must be alltoall, allgather or flex")
    _check_int("torch_cublas_handles", torch_cublas_handles, minimum=0)
    _check_int("original_max_position_embeddings", original_max_position_embeddings)
    _check_int("param_dtype_bytes", param_dtype_bytes)
    st = _stage(part, stage)
    params = [p for chunk in rank_params(part, st) for p in chunk]
    uses_te = t.transformer_impl.uses_te          # the local spec builds no Transformer Engine module
    te = [p for p in params if p.te_gemm] if uses_te else []
    mtp_here = st.last and part.profile.include_mtp and m.num_nextn_predict_layers > 0
    mla_modules = len(st.layers) + (m.num_nextn_predict_layers if mtp_here else 0)
    moe_layers = sum(m.layer_kinds[i] == "moe" for i in st.layers) + (
        m.num_nextn_predict_layers if mtp_here and m.layer_kinds[-1] == "moe" else 0)
    out: list[tuple[str, str, int]] = []
    ws = te_cublas_workspace_bytes(cc)
    if te:
        out.append(("te_cublas_workspaces", "TE GEMM workspace", ws))
    if moe_layers and moe_grouped_gemm and uses_te:
        out += [("te_cublas_workspaces", f"TE grouped-GEMM workspace, stream {i}", ws) for i in range(4)]
    out += [("torch_cublas_workspaces", f"PyTorch cuBLAS workspace, handle {i}",
             torch_cublas_workspace_bytes(cc, cublas_workspace_config, blackwell_32mib=blackwell_cublas_32mib))
            for i in range(torch_cublas_handles)]
    if gradient_accumulation_fusion:
        shapes = sorted({p.shape for p in params if p.dummy_wgrad})
        out += [("te_dummy_wgrads", f"dummy wgrad {s[0]}x{s[1]} bf16", 2 * math.prod(s)) for s in shapes]
    # one "mpu" GlobalMemoryBuffer per dtype, grown to the largest tensor asked of it (in the activation dtype,
    # the parameters' under Float16Module): the output layer's sequence-parallel all-gather and the local
    # DotProductAttention's baddbmm input
    mpu = []
    if st.last and t.sp and t.tp > 1:
        mpu.append(("output layer's SP all-gather [s, b, h]", t.micro_batch * (t.seq_len // t.cp) * m.hidden_size))
    if t.attention_backend.is_local(t.transformer_impl) and (st.layers or mtp_here):
        heads = m.num_attention_heads // t.tp
        mpu.append((f"DotProductAttention's baddbmm input [b n_h/TP, s, s] ({heads} heads)",
                    t.micro_batch * heads * t.seq_len * t.seq_len))
    if mpu:
        what, numel = max(mpu, key=lambda r: r[1])
        out.append(("global_memory_buffer", f"GlobalMemoryBuffer 'mpu': {what}", param_dtype_bytes * numel))
    d_r, s = m.qk_rope_head_dim, t.seq_len // t.cp
    rows = s if rope_fusion else original_max_position_embeddings
    if m.attention != "mla":
        mla_modules = 0
    if m.attention == "gqa" and m.positions == "rope":
        # gpt_model.py builds one RotaryEmbedding per model chunk: inv_freq [d_head/2] fp32 and the
        # lru_cache-d forward [s, 1, 1, d_head] fp32 (rotary_pos_embedding.py; read from code, not measured)
        for c in st.chunks:
            out += [("rope_caches", f"chunk {c.index}: RotaryEmbedding inv_freq [{m.head_dim // 2}] fp32",
                     4 * (m.head_dim // 2)),
                    ("rope_caches", f"chunk {c.index}: lru_cache-d forward [{s}, {m.head_dim}] fp32",
                     4 * s * m.head_dim)]
    for i in range(mla_modules):
        out += [("rope_caches", f"MLA module {i}: cos_cached [{rows}, {d_r}] bf16", 2 * rows * d_r),
                ("rope_caches", f"MLA module {i}: sin_cached [{rows}, {d_r}] bf16", 2 * rows * d_r),
                ("rope_caches", f"MLA module {i}: lru_cache-d forward [{s}, {d_r}] fp32", 4 * s * d_r)]
        out += [("rope_caches", f"MLA module {i}: {name} [{d_r // 2}] fp32", 4 * (d_r // 2))
                for name in ("inv_freq", "inv_freq_extra", "inv_freq_inter")]
    n, k = m.n_routed_experts, m.num_experts_per_tok
    if m.router_bias:
        for i in range(moe_layers):
            out += [("router_buffers", f"MoE layer {i}: expert_bias [{n}] fp32", 4 * n),
                    ("router_buffers", f"MoE layer {i}: local_tokens_per_expert [{n}] bf16", 2 * n)]
    tokens = t.micro_batch * t.seq_len // (t.tp * t.cp) if t.sp and t.tp > 1 else t.micro_batch * t.seq_len // t.cp
    if token_dispatcher == "alltoall":
        for i in range(moe_layers):
            out += [("token_dispatcher_state", f"MoE layer {i}: probs [{tokens}, {n}] fp32", 4 * tokens * n),
                    ("token_dispatcher_state", f"MoE layer {i}: routing_map [{tokens}, {n}] bool", tokens * n)]
            if permute_fusion:
                out += [("token_dispatcher_state", f"MoE layer {i}: row_id_map [{tokens}, {2 * n + 1}] int32",
                         4 * tokens * (2 * n + 1)),
                        ("token_dispatcher_state", f"MoE layer {i}: sort_input_by_local_experts [{n}] int64", 8 * n),
                        ("token_dispatcher_state", f"MoE layer {i}: restore_output_by_local_experts [{n}] int64",
                         8 * n)]
            else:
                out.append(("token_dispatcher_state", f"MoE layer {i}: permutation indices [{tokens * k}] int64",
                            8 * tokens * k))
    if fp8 is not None:
        for p in te:
            out += [("fp8_weight_copies", f"{p.name} fp8", p.numel), ("fp8_weight_copies", f"{p.name} fp8 transpose",
                                                                       p.numel),
                    ("fp8_weight_copies", f"{p.name} scale_inv fp32", 4)]
    if t.pp > 1 and t.schedule is not Schedule.DUALPIPE:
        # each model chunk fed by the previous pipeline stage keeps the last micro-batch's received tensor
        # (TransformerBlock.set_input_tensor stores it, transformer/transformer_block.py:463) and, the backward
        # done, its gradient (schedules.py:561 retain_grad, a leaf's .grad) until its next forward: a pair of
        # [s/CP/(TP with SP), b, h] in the pipeline dtype, the parameters' (p2p_communication.py:335-349,
        # the shape: schedules.py:2137-2143)
        rows = t.seq_len // t.cp // (t.tp if t.sp and t.tp > 1 else 1)
        numel = rows * t.micro_batch * m.hidden_size
        shape = f"[{rows}, {t.micro_batch}, {m.hidden_size}]"
        # offloading attn_norm frees the storage of the first layer's input, the received tensor, once it is on
        # the host (transformer_layer.py:761-762 forced_released_tensors=[residual];
        # fine_grained_activation_offload.py:1246 resize_(0), for tensors of MIN_OFFLOADED_ELEMENTS and more)
        freed = "attn_norm" in t.offload_modules and numel >= MIN_OFFLOADED_ELEMENTS
        for c in st.chunks:
            if c.first:
                continue
            if not (freed and c.layers):
                out.append(("pipeline_input_tensors", f"chunk {c.index}: received input {shape}",
                            param_dtype_bytes * numel))
            out.append(("pipeline_input_tensors", f"chunk {c.index}: its gradient {shape}", param_dtype_bytes * numel))
    if (st.first or st.last or mtp_here) and rerun_keeps_batches(t, rerun_mode, data_loading_rank):
        # RerunDataIterator saves each micro-batch the loader yields (rerun_state_machine.py: saved_microbatches,
        # dropped by advance() at the next step) and get_batch moves that very dict to the GPU (pretrain_gpt.py
        # ``batch[key] = batch[key].cuda()``), CP-sliced in place (get_batch_on_this_cp_rank); a pipeline stage
        # drops what it does not use first (get_batch_on_this_tp_rank: the last stage tokens and position_ids, the
        # first labels and loss_mask): the GPT dataset's int64 tokens, labels, position_ids, fp32 loss_mask,
        # bool [b, 1, s/CP, s] attention mask (core/datasets/gpt_dataset.py)
        rows = t.seq_len // t.cp
        keys = {"tokens": 8, "labels": 8, "loss_mask": 4, "position_ids": 8}
        if part.train.pp > 1 and not mtp_here:
            drop = ("labels", "loss_mask") if st.first else ("tokens", "position_ids")
            keys = {k: v for k, v in keys.items() if k not in drop}
        batch = [(f"{k} [{t.micro_batch}, {rows}]", n * t.micro_batch * rows) for k, n in keys.items()]
        if attention_mask_in_batch:
            batch.append((f"attention_mask [{t.micro_batch}, 1, {rows}, {t.seq_len}]", t.micro_batch * rows * t.seq_len))
        for i in range(default_microbatches(t)):
            out += [("rerun_saved_batches", f"micro-batch {i}: {name}", nbytes) for name, nbytes in batch]
    out.append(("optimizer_flags", "FusedAdam _dummy_overflow_buf int32", 4))
    return out


def framework_memory(part: Partition, stage: int | Stage = -1, **options) -> Breakdown:
    """Persistent buffers of one rank besides the model states, as allocated, by term (:data:`FRAMEWORK_TERMS`):
    Transformer Engine's and PyTorch's cuBLAS workspaces, TE's dummy weight gradients, the "mpu" global memory
    buffer, the RoPE caches, the router's buffers, the token dispatcher's state, FP8 weight copies, the optimizer's
    flags.  Options: see :func:`framework_tensors`.  Each term with its source (``file:line`` at MEGATRON_COMMIT,
    TE files at TE_COMMIT), and what is not counted: ``docs/derivations/megatron_buffers.md`` ("The framework
    terms one by one").
    """
    terms = dict.fromkeys(FRAMEWORK_TERMS, 0)
    for term, _, nbytes in framework_tensors(part, stage, **options):
        terms[term] += allocation(nbytes)
    return Breakdown(terms)


def persistent_memory(part: Partition, stage: int | Stage = -1, **options) -> Breakdown:
    """:func:`model_state_memory` and :func:`framework_memory` of one rank together (the keyword
    options go to whichever takes them)."""
    ms_keys = set(inspect.signature(model_state_memory).parameters) - {"part", "stage"}
    fw_keys = set(inspect.signature(framework_tensors).parameters) - {"part", "stage"}
    unknown = set(options) - ms_keys - fw_keys
    if unknown:
        raise ConfigError(f"persistent_memory: unknown option(s) {', '.join(sorted(unknown))}")
    ms = model_state_memory(part, stage, **{k: v for k, v in options.items() if k in ms_keys})
    fw = framework_memory(part, stage, **{k: v for k, v in options.items() if k in fw_keys})
    return ms + fw


# ------------------------------------------------------------------------------------------------
# deriving the data-parallel size from a logged allocation
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Derivation:
    """The data-parallel size whose account comes closest to a logged post-step allocation."""

    dp: int
    world_size: int
    residual: int                         #: logged - account at ``dp``, bytes
    table: tuple[tuple[int, int, int], ...]   #: (dp, account, logged - account) for every candidate


def derive_data_parallel_size(model: ModelConfig, train: TrainingConfig, logged: int,
                              candidates: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                              **options) -> Derivation:
    """The DP of ``candidates`` (those the partition accepts) for which :func:`persistent_memory`
    of the last pipeline rank is closest to ``logged`` without exceeding it.

    The optimizer-state shards scale as 12/DP bytes per parameter, so neighbouring candidates are
    GiBs apart on a large model, while everything the account leaves out is positive (allocated
    memory the account does not know); the largest account at or below the logged value wins.
    This derives the world size, world = DP TP CP PP; it does not measure it."""
    _check_int("logged", logged)
    rows = []
    for dp in candidates:
        try:
            part = Partition(model, train.with_(dp=dp))
        except ConfigError:
            continue
        total = persistent_memory(part, -1, **options).evaluate_total()
        rows.append((dp, total, logged - total))
    below = [r for r in rows if r[2] >= 0]
    if not below:
        raise ConfigError(f"logged={logged:,} is below the account of every candidate DP "
                          f"({', '.join(str(r[0]) for r in rows) or 'none valid'})")
    best = min(below, key=lambda r: r[2])
    return Derivation(best[0], train.with_(dp=best[0]).world_size, best[2], tuple(rows))
