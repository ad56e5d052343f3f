"""Overheads: memory a device needs beyond the tensors memlib counts, as named, sourced terms.

These are reported apart from the allocated bytes (parameters, gradients, optimizer states,
activations), because they are not tensors of the model and cannot be derived exactly:

``cuda_context``   CUDA context and kernels, outside PyTorch's allocator: a few hundred MiB to about
                   2 GiB, by the GPU, the driver and the libraries loaded (PyTorch's CUDA semantics
                   notes: the context is not counted by the caching allocator).
``comm_buffers``   temporary buffers of inter-GPU communication: about 0.8 to 2 (the paper's "GB",
                   i.e. GiB) per device, by the paper's §6.
``fragmentation``  allocator fragmentation: 5 % to 30 % of allocated memory, by the paper's §6.

``low`` takes the low end of every band, ``high`` the high end, ``none`` zero; each term can be set.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import ceil

from .config import ConfigError, show
from .units import UNITS

__all__ = ["Overheads", "OVERHEAD_PRESETS", "overheads", "SOURCES", "DEVICE_MEMORY"]

#: the memory of common training devices as their vendors state it, in decimal gigabytes (80 GB is
#: 74.5 GiB): the capacities the book sizes against.  ``--gpu-memory`` takes any other.
DEVICE_MEMORY = {
    "A100 80GB": 80 * UNITS["GB"],
    "H100 SXM": 80 * UNITS["GB"],
    "H800": 80 * UNITS["GB"],
    "H200": 141 * UNITS["GB"],
}

GIB, MIB = 2**30, 2**20

SOURCES = {
    "cuda_context": "300 MiB to 2 GiB outside PyTorch's caching allocator, by GPU, driver and libraries "
                    "(PyTorch docs, CUDA semantics: memory management)",
    "comm_buffers": "0.8 to 2 GiB per device for inter-GPU transfers (arXiv 2502.07846 §6)",
    "fragmentation": "5 % to 30 % of allocated memory (arXiv 2502.07846 §6)",
}


@dataclass(frozen=True)
class Overheads:
    """Overhead settings: fixed bytes and a fraction of allocated memory."""

    cuda_context: int = 300 * MIB
    comm_buffers: int = ceil(Fraction(8, 10) * GIB)
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
    "high": Overheads(2 * GIB, 2 * GIB, Fraction(30, 100)),
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
