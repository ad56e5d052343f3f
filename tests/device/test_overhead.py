"""memlib.device.overhead: the named overheads and the device capacities, hand-worked."""
from fractions import Fraction

import pytest

from memlib.config import ConfigError
from memlib.device.overhead import (DEVICE_MEMORY, DEVICE_MEMORY_SOURCES, DEVICE_PRODUCT_GB, OVERHEAD_PRESETS,
                                    allocatable, device_memory, overheads)


def test_the_low_preset_on_one_gib_allocated():
    # 300 MiB; 0.8 GiB = 858,993,459.2 bytes rounded up; 5 % of 1,073,741,824 = 53,687,091.2 rounded up
    assert OVERHEAD_PRESETS["low"].terms(1_073_741_824) == {
        "cuda_context": 314_572_800, "comm_buffers": 858_993_460, "fragmentation": 53_687_092}


def test_the_high_and_none_presets():
    assert OVERHEAD_PRESETS["high"].terms(1_000_000_000) == {
        "cuda_context": 2_147_483_648, "comm_buffers": 2_147_483_648, "fragmentation": 300_000_000}
    assert OVERHEAD_PRESETS["high"].terms(1001)["fragmentation"] == 301          # 300.3 rounded up
    assert OVERHEAD_PRESETS["none"].terms(10**15) == {"cuda_context": 0, "comm_buffers": 0, "fragmentation": 0}
    assert overheads().terms(1000) == {"cuda_context": 314_572_800, "comm_buffers": 858_993_460,
                                       "fragmentation": 50}                       # the default is the low preset


def test_fragmentation_rounds_up():
    third = overheads("none", fragmentation=Fraction(1, 3))
    assert (third.terms(10)["fragmentation"], third.terms(9)["fragmentation"]) == (4, 3)    # 3.33 up, 3 exact
    assert overheads("none", fragmentation="0.05").terms(21)["fragmentation"] == 2       # 1.05 up


def test_a_preset_with_terms_replaced():
    o = overheads("none", cuda_context=512, fragmentation="0.1")
    assert o.terms(1001) == {"cuda_context": 512, "comm_buffers": 0, "fragmentation": 101}   # 100.1 rounded up
    assert overheads("high", comm_buffers=None) == OVERHEAD_PRESETS["high"]                  # None: not given
    assert overheads("low", fragmentation=Fraction(0)).terms(7)["fragmentation"] == 0
    assert overheads("high", cuda_context=500 * 2**20, fragmentation=0).terms(10**9) == {
        "cuda_context": 524_288_000, "comm_buffers": 2_147_483_648, "fragmentation": 0}


@pytest.mark.parametrize("kw, needle", [
    (dict(preset="medium"), "overhead='medium' must be one of low, high, none"),
    (dict(fragmentation=1), r"fragmentation=1 must be a fraction in \[0, 1\)"),
    (dict(fragmentation="-0.1"), "fragmentation=-1/10"),
    (dict(cuda_context=-1), "cuda_context=-1 must not be negative"),
    (dict(comm_buffers=-5), "comm_buffers=-5 must not be negative"),
])
def test_bad_overheads_are_named(kw, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        overheads(**kw)
    assert "\n" not in str(e.value)


def test_device_capacities_are_the_drivers_mib():
    # nvidia-smi's totals (public readings, DEVICE_MEMORY_SOURCES): 81,559 MiB for an H100 and an H800, 143,771 MiB
    # for an H200, 183,359 MiB for a B200; an A100 80GB is exactly 80 GiB
    assert device_memory("H100") == 85_520_809_984 == device_memory("h100") == device_memory("H800")
    assert device_memory("H200") == 150_754_820_096
    assert device_memory("B200") == 192_265_846_784 and device_memory("A100") == 85_899_345_920
    assert set(DEVICE_MEMORY) == set(DEVICE_MEMORY_SOURCES) == set(DEVICE_PRODUCT_GB)
    with pytest.raises(ConfigError, match="gpu='V100' must be one of A100, H100"):
        device_memory("V100")


def test_an_80_gb_card_holds_more_than_80e9_bytes():
    for gpu, gb in DEVICE_PRODUCT_GB.items():
        assert DEVICE_MEMORY[gpu] > gb * 10**9, gpu
    assert DEVICE_MEMORY["H100"] < 80 * 2**30          # and, for the H100, less than 80 GiB


def test_what_the_allocator_can_hold_excludes_the_cuda_context():
    assert allocatable(85_520_809_984) == 85_520_809_984 - 314_572_800 == 85_206_237_184
    assert allocatable(10**9, OVERHEAD_PRESETS["none"]) == 10**9
