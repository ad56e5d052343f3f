"""memlib.device.allocator: the caching allocator's rounding, hand-worked."""
import pytest

from memlib.device.allocator import BLOCK, PYTORCH_ALLOCATOR, allocation


@pytest.mark.parametrize("n, counted", [(0, 0), (-3, 0), (1, 512), (511, 512), (512, 512), (513, 1024),
                                        (4000, 4096), (1 << 20, 1 << 20), (1_000_001, 1_000_448)])
def test_a_request_is_counted_in_whole_blocks(n, counted):
    assert allocation(n) == counted


def test_the_constants_are_pytorchs():
    # c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize 512, kSmallSize 1 MiB, kSmallBuffer 2 MiB,
    # kLargeBuffer 20 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB
    assert BLOCK == 512
    assert PYTORCH_ALLOCATOR == {"kMinBlockSize": 512, "kSmallSize": 1_048_576, "kSmallBuffer": 2_097_152,
                                 "kLargeBuffer": 20_971_520, "kMinLargeAlloc": 10_485_760, "kRoundLarge": 2_097_152}
