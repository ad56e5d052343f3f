"""Overheads: memory a device needs beyond the tensors memlib counts, as named, sourced terms.

These are reported apart from the allocated bytes (parameters, gradients, optimizer states,
activations), because they are not tensors of the model and cannot be derived exactly:

``cuda_context``   CUDA context and kernels, outside PyTorch's allocator: a few hundred MiB to about
                   2 GiB, by the GPU, the driver and the libraries loaded (PyTorch's CUDA semantics
                   notes: the context is not counted by the caching allocator).
``comm_buffers``   temporary buffers of inter-GPU communication: about 0.8 to 2 (the paper's "GB",
                   i.e. GiB) per device, by the paper's §6.
``fragmentation``  allocator fragmentation: 5% to 30% of allocated memory, by the paper's §6.

``low`` takes the low end of every band, ``high`` the high end, ``none`` zero; each term can be set.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import ceil

from ..config import ConfigError, show
from ..core.units import GiB, MiB

__all__ = ["Overheads", "OVERHEAD_PRESETS", "overheads", "SOURCES", "DEVICE_MEMORY", "DEVICE_MEMORY_SOURCES", "DEVICE_PRODUCT_GB",
           "device_memory", "allocatable"]

#: the memory of common training devices as the driver reports it (``nvidia-smi``'s total, in MiB of
#: 2**20 bytes), in bytes: the capacities the book sizes against, keyed by the names ``--gpu`` takes.
#: The vendors' "80 GB" is a rounded marketing figure: an H100 SXM reports 81,559 MiB, 79.65 GiB.  The
#: CUDA context is not part of it for PyTorch: it is one of the overheads (:class:`Overheads`), so what
#: PyTorch's allocator can hold is :func:`allocatable`.  ``--gpu-memory`` takes any other capacity.
DEVICE_MEMORY = {
    "A100": 81_920 * MiB,     # A100 80GB (SXM4): 81,920 MiB
    "H100": 81_559 * MiB,     # H100 80GB HBM3 (SXM5): 81,559 MiB
    "H800": 81_559 * MiB,     # H800 (SXM5): the H100 SXM's 80 GB HBM3 part, taken as the same total
    "H200": 143_771 * MiB,    # H200 141GB HBM3e: 143,771 MiB
    "B200": 183_359 * MiB,    # B200: 183,359 MiB
}

#: the same devices' memory as their product names state it, in decimal GB (a rounded marketing size, not a
#: capacity: an "80 GB" H100 reports more than 80e9 bytes and less than 80 GiB)
DEVICE_PRODUCT_GB = {"A100": 80, "H100": 80, "H800": 80, "H200": 141, "B200": 180}

#: where each capacity of :data:`DEVICE_MEMORY` is printed (public nvidia-smi / NVML readings)
DEVICE_MEMORY_SOURCES = {
    "A100": "nvidia-smi of an A100 80GB, in a public table of NVML capacities (thundergolfer.com)",
    "H100": "nvidia-smi of an H100 80GB, in a public table of NVML capacities (thundergolfer.com)",
    "H800": "no public reading found: the H800 SXM has the H100 SXM's 80 GB of HBM3, taken as the same total",
    "H200": "nvidia-smi of an H200, in a public table of NVML capacities (thundergolfer.com)",
    "B200": "nvidia-smi of eight B200s, driver 580.95.05 (NVIDIA/TensorRT-LLM issue 10278)",
}


SOURCES = {
    "cuda_context": "300 MiB to 2 GiB outside PyTorch's caching allocator, by GPU, driver and libraries "
                    "(PyTorch docs, CUDA semantics: memory management)",
    "comm_buffers": "0.8 to 2 GiB per device for inter-GPU transfers (arXiv 2502.07846 §6)",
    "fragmentation": "5% to 30% of allocated memory (arXiv 2502.07846 §6)",
}


@dataclass(frozen=True)
class Overheads:
    """Overhead settings: fixed bytes and a fraction of allocated memory."""

    cuda_context: int = 300 * MiB
    comm_buffers: int = ceil(Fraction(8, 10) * GiB)
    fragmentation: Fraction = Fraction(5, 100)

    def terms(self, allocated: int) -> dict[str, int]:
        """Named overhead bytes for a device with ``allocated`` bytes (fragmentation rounded up)."""
        return {
            "cuda_context": int(self.cuda_context),
            "comm_buffers": int(self.comm_buffers),
            "fragmentation": ceil(self.fragmentation * allocated),
        }


OVERHEAD_PRESETS = {
    "low": Overheads(),
    "high": Overheads(2 * GiB, 2 * GiB, Fraction(30, 100)),
    "none": Overheads(0, 0, Fraction(0)),
}


def overheads(preset: str = "low", **changes) -> Overheads:
    """A preset with some terms replaced."""
    try:
        base = OVERHEAD_PRESETS[preset]
    except KeyError:
        raise ConfigError(f"overhead={show(preset)} must be one of {', '.join(OVERHEAD_PRESETS)}") from None
    vals = {k: getattr(base, k) for k in ("cuda_context", "comm_buffers", "fragmentation")}
    for k, x in changes.items():
        if x is None:
            continue
        if k == "fragmentation":
            x = Fraction(x)
            if not 0 <= x < 1:
                raise ConfigError(f"fragmentation={x} must be a fraction in [0, 1)")
        elif int(x) < 0:
            raise ConfigError(f"{k}={x} must not be negative")
        vals[k] = x
    return Overheads(**vals)


def device_memory(gpu: str) -> int:
    """The capacity of ``gpu`` (a key of :data:`DEVICE_MEMORY`, any case) in bytes, as the driver reports it."""
    try:
        return DEVICE_MEMORY[str(gpu).upper()]
    except KeyError:
        raise ConfigError(f"gpu={show(gpu)} must be one of {', '.join(DEVICE_MEMORY)} "
                          f"for a known capacity (or give --gpu-memory)") from None


def allocatable(capacity: int, ovh: Overheads = OVERHEAD_PRESETS["low"]) -> int:
    """What PyTorch's allocator can hold on a device of ``capacity`` bytes: the capacity less the CUDA
    context of ``ovh`` (which lives outside the allocator)."""
    return int(capacity) - int(ovh.cuda_context)
