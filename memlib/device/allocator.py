"""PyTorch's CUDA caching allocator: its size constants and how it rounds a request.

Every count of allocated bytes in memlib (Megatron-Core's buffers, the measured steps' tracker, the
chapter on overheads) reads these, from ``c10/cuda/CUDACachingAllocator.cpp`` (``c10/core/AllocatorConfig.h``
in recent releases).

>>> allocation(0), allocation(1), allocation(512), allocation(513)
(0, 512, 512, 1024)
"""
from __future__ import annotations

import bisect

from ..core.units import MiB

__all__ = ["PYTORCH_ALLOCATOR", "BLOCK", "allocation", "segment_size", "splits", "CachingAllocator",
           "unsplit_remainders_impossible"]

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


# ------------------------------------------------------------------------------------------------
# the caching allocator's blocks, replayed
# ------------------------------------------------------------------------------------------------
def segment_size(nbytes: int) -> int:
    """The segment ``cudaMalloc`` gets for a request that no cached block fits (``get_allocation_size``):
    ``kSmallBuffer`` up to ``kSmallSize``, ``kLargeBuffer`` below ``kMinLargeAlloc``, else rounded up to
    ``kRoundLarge``.

    >>> [segment_size(n) // MiB for n in (1, MiB, MiB + 1, 10 * MiB - 512, 10 * MiB - 1, 99 * MiB)]
    [2, 2, 20, 20, 10, 100]
    """
    n = allocation(nbytes)
    if n <= PYTORCH_ALLOCATOR["kSmallSize"]:
        return PYTORCH_ALLOCATOR["kSmallBuffer"]
    if n < PYTORCH_ALLOCATOR["kMinLargeAlloc"]:
        return PYTORCH_ALLOCATOR["kLargeBuffer"]
    r = PYTORCH_ALLOCATOR["kRoundLarge"]
    return -(-n // r) * r


def splits(block: int, nbytes: int, *, small: bool, expandable_segments: bool) -> bool:
    """Whether a free block of ``block`` bytes chosen for a request is split (``should_split``): in the small
    pool, or with expandable segments, when at least ``kMinBlockSize`` remains; in the large pool without them
    only when more than ``kSmallSize`` remains: the request is then handed the whole block, and
    ``memory_allocated`` counts all of it."""
    rest = block - allocation(nbytes)
    if small or expandable_segments:
        return rest >= BLOCK
    return rest > PYTORCH_ALLOCATOR["kSmallSize"]


class _Block:
    __slots__ = ("ptr", "size", "free", "prev", "next", "small")

    def __init__(self, ptr: int, size: int, small: bool):
        self.ptr, self.size, self.free, self.small = ptr, size, True, small
        self.prev = self.next = None


class CachingAllocator:
    """PyTorch's CUDA caching allocator on one stream, as ``memory_allocated`` sees it: every request rounded
    (``round_size``), served from the smallest cached free block of its pool that fits (``get_free_block``:
    blocks ordered by size, then address) or from a new segment (:func:`segment_size`), the block split when
    :func:`splits` says so, a freed block merged with its free neighbours in its segment
    (``try_merge_blocks``).  Sources: c10/cuda/CUDACachingAllocator.cpp (``malloc``, ``alloc_found_block``,
    ``free_block``).  Not modelled: several streams, ``max_split_size_mb``, ``roundup_power2_divisions``,
    releasing cached segments on an out-of-memory retry, CUDA graph pools.

    >>> a = CachingAllocator()
    >>> x = a.malloc(4 * MiB); y = a.malloc(4 * MiB); a.free(x)
    >>> q = a.malloc(3 * MiB)          # the freed 4 MiB block: 1 MiB would remain, so it is not split
    >>> a.allocated // MiB, a.size_of(q) // MiB
    (8, 4)
    """

    def __init__(self, expandable_segments: bool = False):
        self.expandable_segments = expandable_segments
        self.allocated = self.peak = self.reserved = 0
        self._free: dict[bool, list] = {True: [], False: []}     # per pool: sorted (size, ptr, block)
        self._next_ptr = 0

    def _insert(self, b: _Block) -> None:
        bisect.insort(self._free[b.small], (b.size, b.ptr, b))

    def _take(self, b: _Block) -> None:
        pool = self._free[b.small]
        del pool[bisect.bisect_left(pool, (b.size, b.ptr), key=lambda e: e[:2])]

    def malloc(self, nbytes: int) -> _Block:
        """Allocate ``nbytes`` (> 0); the block it is served from (a handle for :meth:`free`)."""
        size = allocation(nbytes)
        small = size <= PYTORCH_ALLOCATOR["kSmallSize"]
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1), key=lambda e: e[:2])
        if i < len(pool):
            b = pool.pop(i)[2]
        else:
            seg = segment_size(size)
            b = _Block(self._next_ptr, seg, small)
            self._next_ptr += seg
            self.reserved += seg
        if splits(b.size, size, small=small, expandable_segments=self.expandable_segments):
            rest = _Block(b.ptr + size, b.size - size, small)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next, b.size = rest, size
            self._insert(rest)
        b.free = False
        self.allocated += b.size
        self.peak = max(self.peak, self.allocated)
        return b

    def free(self, b: _Block) -> None:
        """Return ``b``'s block to its pool, merged with its free neighbours."""
        self.allocated -= b.size
        b.free = True
        if b.prev is not None and b.prev.free:
            b = self._merge(b.prev, b, cached=b.prev)
        if b.next is not None and b.next.free:
            b = self._merge(b, b.next, cached=b.next)
        self._insert(b)

    def _merge(self, first: _Block, second: _Block, cached: _Block) -> _Block:
        """``second`` merged into the adjacent ``first`` before it; ``cached``, the one of them in its pool's free
        list, leaves it."""
        self._take(cached)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    @staticmethod
    def size_of(b: _Block) -> int:
        """The bytes ``memory_allocated`` counts for the allocation ``b``."""
        return b.size


def unsplit_remainders_impossible(sizes, *, expandable_segments: bool = False) -> bool:
    """Whether no request of ``sizes`` (bytes) can ever be handed more than its rounded size, whatever the order
    of requests and frees: with expandable segments, or when every request of the large pool (above
    ``kSmallSize``) is a multiple of ``kRoundLarge``.  Then every segment, split and merged block of the large
    pool is a multiple of 2 MiB, so a remainder is 0 or at least 2 MiB and is split off (:func:`splits`);
    otherwise a request can land in a cached block up to 1 MiB larger than itself and hold all of it.

    >>> unsplit_remainders_impossible([4 * MiB, 6 * MiB, 2 * MiB, 16 * MiB, 4096])
    True
    >>> unsplit_remainders_impossible([4 * MiB, 3 * MiB])
    False
    """
    if expandable_segments:
        return True
    r = PYTORCH_ALLOCATOR["kRoundLarge"]
    return all(allocation(n) % r == 0 for n in sizes if allocation(n) > PYTORCH_ALLOCATOR["kSmallSize"])
