"""PyTorch's CUDA caching allocator: its size constants and how it rounds a request.

Every count of allocated bytes in memlib (Megatron-Core's buffers, the measured steps' tracker, the
chapter on overheads) reads these, from ``c10/cuda/CUDACachingAllocator.cpp`` (``c10/core/AllocatorConfig.h``
in recent releases).

>>> allocation(0), allocation(1), allocation(512), allocation(513)
(0, 512, 512, 1024)
"""
from __future__ import annotations

from ..core.units import MiB

__all__ = ["PYTORCH_ALLOCATOR", "BLOCK", "allocation"]

#: the allocator's constants, bytes: every request rounded up to kMinBlockSize; requests up to kSmallSize
#: served from kSmallBuffer segments, those below kMinLargeAlloc from kLargeBuffer segments, larger ones
#: from segments rounded up to kRoundLarge
PYTORCH_ALLOCATOR = {"kMinBlockSize": 512, "kSmallSize": MiB, "kSmallBuffer": 2 * MiB,
                     "kLargeBuffer": 20 * MiB, "kMinLargeAlloc": 10 * MiB, "kRoundLarge": 2 * MiB}

#: ``kMinBlockSize``: every block the allocator hands out is a multiple of it
BLOCK = PYTORCH_ALLOCATOR["kMinBlockSize"]


def allocation(nbytes: int) -> int:
    """The bytes ``torch.cuda.memory_allocated`` counts for a request of ``nbytes``: rounded up to a
    multiple of :data:`BLOCK` (``round_size``); an empty tensor allocates nothing."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // BLOCK) * BLOCK
