"""Strategies as types: the pipeline schedule, the ZeRO stage and the ``megatron`` profile's kernel choices.

:class:`Schedule` and :class:`ZeroStage` carry their rules.  Each kernel enum is one Megatron-LM
command-line choice that changes which tensors are saved for backward;
the values are Megatron-LM's own spellings, so ``--transformer-impl local`` here means what it means
there.  The activation ledger (:mod:`memlib.ledgers.megatron`) asks these types what they keep and
never compares strings.  :class:`~memlib.config.training.TrainingConfig` validates its fields with
these types.
"""
from __future__ import annotations

from enum import Enum, IntEnum, StrEnum

from .checks import ConfigError

__all__ = ["TransformerImpl", "AttnBackend", "CrossEntropyFusionImpl", "LoadBalancing", "Runtime", "parse_choice",
           "Schedule", "ZeroStage", "FP8_FORMATS", "FP8_RECIPES", "OFFLOAD_MODULES", "CP_COMM_TYPES"]


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


class Runtime(_Choice):
    """Where the model's PyTorch code runs, which decides what some of torch's own kernels save.

    On a GPU ``torch.rms_norm`` dispatches to its fused kernel (``_fused_rms_norm``: it keeps its input and
    one fp32 ``1/rms`` per row) and Megatron-Core's ``jit_fuser`` functions are compiled by Inductor
    (``torch.compile``); on the CPU the norm is torch's composite (it keeps an fp32 copy of its input and
    the normalised fp32 values) and memlib's ground truth runs the ``jit_fuser`` functions eagerly
    (:mod:`memlib.measure.megatron`).  Only the ``megatron`` profile's local modules
    (``--transformer-impl local``) differ; Transformer Engine's kernels are the same either way.
    """

    CUDA = "cuda"   #: a GPU: what training runs on (memlib's default)
    CPU = "cpu"     #: the CPU: memlib's measured ground truth (megatron-core on the CPU)


def parse_choice(cls: type[_Choice], value):
    """``value`` (a member or its spelling) as a member of ``cls``; ``ValueError`` if it is none."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"must be one of {cls.choices()}") from None


#: --fp8-format and --fp8-recipe choices (Megatron-LM's megatron/training/arguments.py at d98e8a64dd)
FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
#: --cp-comm-type choices (Megatron-LM's megatron/training/arguments.py at d98e8a64dd; default p2p): how the
#: context-parallel attention exchanges keys and values (TE's AttnFuncWithCPAndKVP2P, AttnFuncWithCPAndQKVOA2A,
#: AttnFuncWithCPAndKVAllGather; a2a+p2p is the hierarchical one)
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")
#: the CP communications whose attention runs an all-to-all (TE's AttnFuncWithCPAndQKVOA2A keeps one more output)
CP_A2A = ("a2a", "a2a+p2p")
#: --offload-modules choices for an MLA model (Megatron-Core's TransformerConfig at d98e8a64dd)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act",
                   "fused_group_mlp")


class Schedule(StrEnum):
    """A pipeline schedule: which model chunks a rank holds, and the rules it sets (the step order is
    :mod:`memlib.device.schedule`'s replay).  The value is the CLI name."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    DUALPIPE = "dualpipe"

    @property
    def parameter_copies(self) -> int:
        """Copies of every model stage over the pipeline ranks (DualPipe keeps two)."""
        return 2 if self is Schedule.DUALPIPE else 1

    def chunks(self, pp: int, vpp: int) -> int:
        """Model chunks (stages) of the model: PP, or PP V virtual stages (interleaved)."""
        return pp * vpp if self is Schedule.INTERLEAVED else pp

    def rank_chunks(self, rank: int, pp: int, vpp: int) -> tuple[int, ...]:
        """The model chunks rank ``rank`` holds, in the order the replay numbers them: one (GPipe, 1F1B);
        V, virtual stages r, PP + r, ... (interleaved); two, the shallow stage min(r, PP - 1 - r) and
        its mirror (DualPipe)."""
        if self is Schedule.INTERLEAVED:
            return tuple(c * pp + rank for c in range(vpp))
        if self is Schedule.DUALPIPE:
            h = min(rank, pp - 1 - rank)
            return (h, pp - 1 - h)
        return (rank,)

    def check(self, train) -> None:
        """The rules on chunks and micro-batches of ``train`` (a :class:`~memlib.config.training.TrainingConfig`;
        one-line errors)."""
        p, v, m = train.pp, train.vpp, train.num_microbatches
        if self is Schedule.INTERLEAVED:
            if v < 2:
                raise ConfigError(f"schedule=interleaved needs vpp >= 2 model chunks per device (vpp={v})")
            if m is not None and m % p:
                raise ConfigError(f"num_microbatches={m} must be a multiple of pp={p} for schedule=interleaved")
        elif v != 1:
            raise ConfigError(f"vpp={v} needs schedule=interleaved (schedule={self})")
        if self is Schedule.DUALPIPE:
            if p % 2:
                raise ConfigError(f"pp={p} must be even for schedule=dualpipe (two directions meet in the middle)")
            if m is not None and (m < 2 * p or m % 2):
                raise ConfigError(f"num_microbatches={m} must be even and at least 2*pp={2 * p} for schedule=dualpipe")
        if self is Schedule.GPIPE and m is None:
            raise ConfigError("schedule=gpipe keeps every micro-batch: give num_microbatches")


class ZeroStage(IntEnum):
    """ZeRO stages, ordered: a higher stage shards more (Rajbhandari et al., arXiv 1910.02054)."""

    NONE = 0          #: nothing sharded
    OS = 1            #: optimizer states sharded (ZeRO-1, Megatron's distributed optimizer)
    OS_G = 2          #: + gradients (ZeRO-2)
    OS_G_PARAMS = 3   #: + parameters (ZeRO-3, FSDP)

    @property
    def label(self) -> str:
        return ("none", "os", "os+g", "os+g+params")[self.value]

    def shards(self, state: str) -> bool:
        """Whether this stage shards ``state`` (``optimizer_states``, ``gradients``, ``parameters``)."""
        return self >= {"optimizer_states": ZeroStage.OS, "gradients": ZeroStage.OS_G,
                        "parameters": ZeroStage.OS_G_PARAMS}[state]
