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


# ------------------------------------------------------------------------------------------------
# the caching allocator replayed (memlib.device.allocator.CachingAllocator)
# ------------------------------------------------------------------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402

from memlib.device.allocator import CachingAllocator, segment_size, splits, unsplit_remainders_impossible  # noqa: E402

MiB = 1 << 20


def test_a_tp4_qkv_output_in_a_freed_residual_block_holds_all_of_it():
    """A GPT-3 shell layer at TP 4 (s 1024, b 4, h 512, fp16): the residual-stream transient [s, b, h] is
    4 MiB and the fused QKV output [s, b, 3h/TP] 3 MiB.  Served from the freed 4 MiB block, 1 MiB would remain:
    not more than kSmallSize, so the block is not split and memory_allocated counts 4 MiB for the 3 MiB tensor.
    With expandable segments, or at TP 2 (6 MiB from a freed 8 MiB block: 2 MiB remain), it is split."""
    residual, qkv = 4096 * 512 * 2, 4096 * 384 * 2
    assert (residual, qkv) == (4 * MiB, 3 * MiB)
    for expandable, counted in ((False, 4 * MiB), (True, 3 * MiB)):
        a = CachingAllocator(expandable_segments=expandable)
        transient, _keep = a.malloc(residual), a.malloc(residual)
        a.free(transient)            # its neighbour is alive: it stays a 4 MiB free block
        q = a.malloc(qkv)
        assert a.size_of(q) == counted
        assert a.allocated == residual + counted
    a = CachingAllocator()
    transient, _keep = a.malloc(8 * MiB), a.malloc(8 * MiB)
    a.free(transient)
    assert a.size_of(a.malloc(6 * MiB)) == 6 * MiB


def test_segments_and_splits_are_pytorchs():
    # get_allocation_size: 2 MiB up to 1 MiB, 20 MiB below 10 MiB, else rounded up to 2 MiB
    assert [segment_size(n) for n in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 99 * MiB)] == \
        [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 100 * MiB]
    # should_split: the large pool keeps a remainder of at most 1 MiB in the block; the small pool splits 512 B off
    assert not splits(4 * MiB, 3 * MiB, small=False, expandable_segments=False)
    assert splits(4 * MiB, 3 * MiB - 512, small=False, expandable_segments=False)
    assert splits(4 * MiB, 3 * MiB, small=False, expandable_segments=True)
    assert splits(2 * MiB, MiB - 512, small=True, expandable_segments=False)
    # a fresh segment for the fp16 logits of the TP 4 shell ([4096, 12672]): 99 MiB in a 100 MiB segment, unsplit
    a = CachingAllocator()
    logits = a.malloc(4096 * 12672 * 2)
    assert a.size_of(logits) == 100 * MiB and a.reserved == 100 * MiB


def test_freed_neighbours_merge():
    a = CachingAllocator()
    x, y, z = a.malloc(4 * MiB), a.malloc(4 * MiB), a.malloc(4 * MiB)
    a.free(x)
    a.free(y)                    # x and y merge into one free 8 MiB block, which a 7 MiB request splits
    w = a.malloc(7 * MiB)
    assert a.size_of(w) == 8 * MiB and a.allocated == 12 * MiB
    a.free(w)
    a.free(z)
    assert a.allocated == 0 and a.reserved == 20 * MiB
    assert a.size_of(a.malloc(19 * MiB)) == 20 * MiB      # the whole segment, merged back


_EVENTS = st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.integers(1, 24)), min_size=1, max_size=120)


def _replay(events, size_of, expandable):
    a, live, asked = CachingAllocator(expandable_segments=expandable), [], []
    for free, pick, n in events:
        if free and live:
            blk, req = live.pop(pick % len(live))
            a.free(blk)
        else:
            req = size_of(n)
            asked.append(req)
            live.append((a.malloc(req), req))
        assert a.allocated >= sum(allocation(r) for _, r in live)
        waste = a.allocated - sum(allocation(r) for _, r in live)
        if waste:
            return asked, waste
    return asked, 0


@settings(max_examples=200, deadline=None)
@given(_EVENTS)
def test_no_unsplit_remainder_when_every_large_request_is_a_multiple_of_2_mib(events):
    """Any order of requests and frees: sizes of n x 2 MiB (and small ones) never get a larger block."""
    asked, waste = _replay(events, lambda n: 2 * MiB * n if n > 4 else 1000 * n, expandable=False)
    assert unsplit_remainders_impossible(asked)
    assert waste == 0


@settings(max_examples=200, deadline=None)
@given(_EVENTS)
def test_with_expandable_segments_nothing_is_held_beyond_the_rounding(events):
    asked, waste = _replay(events, lambda n: MiB * n + 4096 * n, expandable=True)
    assert unsplit_remainders_impossible(asked, expandable_segments=True)
    assert waste == 0


def test_odd_mebibytes_can_hold_a_remainder():
    asked, waste = _replay([(False, 0, 4), (False, 0, 4), (True, 0, 1), (False, 0, 3)], lambda n: MiB * n,
                           expandable=False)
    assert not unsplit_remainders_impossible(asked)
    assert waste == MiB
