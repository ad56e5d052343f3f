"""Kernel choices of the ``megatron`` profile, as types with their behaviour.

Each enum is one Megatron-LM command-line choice that changes which tensors are saved for backward;
the values are Megatron-LM's own spellings, so ``--transformer-impl local`` here means what it means
there.  The activation ledger (:mod:`memlib.ledgers.megatron`) asks these types what they keep and
never compares strings.  This module imports nothing from memlib: :mod:`memlib.config` validates
:class:`~memlib.config.TrainingConfig` fields with it.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["TransformerImpl", "AttnBackend", "CrossEntropyFusionImpl", "LoadBalancing", "parse_choice"]


class _Choice(str, Enum):
    """A command-line choice: its value is the Megatron-LM spelling."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def choices(cls) -> str:
        return ", ".join(m.value for m in cls)


class TransformerImpl(_Choice):
    """``--transformer-impl``: the modules a layer is built from."""

    TRANSFORMER_ENGINE = "transformer_engine"   #: Transformer Engine's fused norms, linears, attention, grouped GEMM
    LOCAL = "local"                             #: Megatron-Core's own modules (torch.nn.RMSNorm, DotProductAttention)

    @property
    def uses_te(self) -> bool:
        return self is TransformerImpl.TRANSFORMER_ENGINE

    @property
    def supports_sequence_parallel(self) -> bool:
        """Megatron-Core's local norm (``WrappedTorchNorm``) asserts ``not sequence_parallel``."""
        return self.uses_te


class AttnBackend(_Choice):
    """``--attention-backend`` (Megatron-Core's ``AttnBackend``): the attention kernel."""

    AUTO = "auto"        #: Transformer Engine picks (flash or cuDNN fused attention for MLA training)
    FLASH = "flash"      #: flash attention
    FUSED = "fused"      #: cuDNN fused attention
    UNFUSED = "unfused"  #: Transformer Engine's unfused attention (the s x s probabilities in memory)
    LOCAL = "local"      #: Megatron-Core's own DotProductAttention

    def keeps_scores(self, impl: TransformerImpl) -> bool:
        """Whether the ``[b, n_h, s, s]`` softmax probabilities are kept for backward."""
        return not impl.uses_te or self in (AttnBackend.UNFUSED, AttnBackend.LOCAL)

    def is_local(self, impl: TransformerImpl) -> bool:
        """Megatron-Core's ``DotProductAttention`` (the local spec's, or ``--attention-backend local``)."""
        return not impl.uses_te or self is AttnBackend.LOCAL

    def needs_te(self) -> bool:
        return self in (AttnBackend.FLASH, AttnBackend.FUSED, AttnBackend.UNFUSED)


class CrossEntropyFusionImpl(_Choice):
    """``--cross-entropy-fusion-impl``, with ``--cross-entropy-loss-fusion``."""

    NATIVE = "native"   #: Megatron-Core's fused vocab-parallel cross-entropy: keeps the fp32 softmax
    TE = "te"           #: Transformer Engine's Triton kernel: writes the gradient into the logits and keeps them

    def keeps_fp32_softmax(self, fusion: bool) -> bool:
        """Whether the loss keeps an fp32 copy of the logits (else the logits' own dtype)."""
        return not fusion or self is CrossEntropyFusionImpl.NATIVE


class LoadBalancing(_Choice):
    """``--moe-router-load-balancing-type`` (with a positive ``--moe-aux-loss-coeff``)."""

    SEQ_AUX_LOSS = "seq_aux_loss"   #: DeepSeek-V3's sequence-wise auxiliary loss
    AUX_LOSS = "aux_loss"           #: the micro-batch-wise auxiliary loss (Switch Transformer)
    NONE = "none"                   #: no auxiliary loss (expert bias only)

    @property
    def has_aux_loss(self) -> bool:
        return self is not LoadBalancing.NONE


def parse_choice(cls: type[_Choice], value):
    """``value`` (a member or its spelling) as a member of ``cls``; ``ValueError`` if it is none."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"must be one of {cls.choices()}") from None
