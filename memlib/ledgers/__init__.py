"""Activation ledgers: the tensors each layer saves for backward, one ledger per implementation.

:mod:`~memlib.ledgers.base` holds the ledger type (``Saved``, ``Policy``, ``ActProfile``);
:mod:`~memlib.ledgers.paper` the paper's and Korthikanti's ledgers, :mod:`~memlib.ledgers.hf` what the
pinned ``transformers`` saves, :mod:`~memlib.ledgers.megatron` what Megatron-Core saves per kernel choice
(its blocks in :mod:`~memlib.ledgers.megatron_blocks`).  :func:`bind_kernels` binds an activation profile to a
training configuration's kernel choices; the registry that names the profiles is :mod:`memlib.model.profiles`.
"""
from __future__ import annotations

from ..config import ConfigError, TrainingConfig
from .base import ActProfile

__all__ = ["KERNEL_FIELDS", "bind_kernels"]


#: TrainingConfig fields that choose kernels; only a profile with ``bind`` reads them
KERNEL_FIELDS = ("transformer_impl", "attention_backend", "attention_softmax_in_fp32", "bias_swiglu_fusion",
                 "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "moe_aux_loss")


def bind_kernels(p: ActProfile, train: TrainingConfig) -> ActProfile:
    """The activation profile ``p`` bound to ``train``'s kernel choices if it has any; a kernel choice other than
    the default under a profile without any raises :class:`ConfigError`."""
    if p.bind is not None:
        return p.bind(train)
    default = TrainingConfig()
    for f in KERNEL_FIELDS:
        if getattr(train, f) != getattr(default, f):
            raise ConfigError(f"{f}={getattr(train, f)} is a kernel choice of profile=megatron "
                              f"(profile={p.name} has none)")
    return p
