"""Activation ledgers: the tensors each layer saves for backward, one ledger per implementation, and their registry.

:mod:`~memlib.ledgers.base` holds the ledger type (``Saved``, ``Policy``, ``ActProfile``);
:mod:`~memlib.ledgers.paper` the paper's and Korthikanti's ledgers, :mod:`~memlib.ledgers.hf` what the
pinned ``transformers`` saves, :mod:`~memlib.ledgers.megatron` what Megatron-Core saves per kernel choice
(its blocks in :mod:`~memlib.ledgers.megatron_blocks`).  The registry here names every profile
(:data:`ACT_PROFILES`) and binds one to a training configuration's kernel choices (:func:`act_profile`).
"""
from __future__ import annotations

from ..config import ConfigError, TrainingConfig, show
from .base import ActProfile
from .hf import HF_EAGER_PROFILE
from .megatron import MEGATRON_PROFILE
from .paper import PAPER_PROFILE

__all__ = ["ACT_PROFILES", "KERNEL_FIELDS", "act_profile"]

#: every activation profile, by name
ACT_PROFILES: dict[str, ActProfile] = {p.name: p for p in (PAPER_PROFILE, MEGATRON_PROFILE, HF_EAGER_PROFILE)}


#: TrainingConfig fields that choose kernels; only a profile with ``bind`` reads them
KERNEL_FIELDS = ("transformer_impl", "attention_backend", "attention_softmax_in_fp32", "bias_swiglu_fusion",
                 "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "moe_aux_loss")


def act_profile(name: str, train: TrainingConfig | None = None) -> ActProfile:
    """The activation profile called ``name``, bound to ``train``'s kernel choices if it has any."""
    try:
        p = ACT_PROFILES[name]
    except KeyError:
        raise ConfigError(f"profile={show(name)} has no activation ledger; known: {', '.join(ACT_PROFILES)}") from None
    if train is None:
        return p
    if p.bind is not None:
        return p.bind(train)
    default = TrainingConfig()
    for f in KERNEL_FIELDS:
        if getattr(train, f) != getattr(default, f):
            raise ConfigError(f"{f}={getattr(train, f)} is a kernel choice of profile=megatron "
                              f"(profile={name} has none)")
    return p
