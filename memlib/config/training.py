"""How the model is trained: :class:`TrainingConfig` and its validation, and the paper's configuration.

Parallel sizes, pipeline layout and schedule, ZeRO stage, precision, activation profile, recompute
policy and kernel choices, checked once when the frozen dataclass is built.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum
from fractions import Fraction
from typing import Optional

from .checks import LIMITS, ConfigError, _bound_text, check_count, show
from .strategies import (CP_COMM_TYPES, FP8_FORMATS, FP8_RECIPES, OFFLOAD_MODULES, AttnBackend, CrossEntropyFusionImpl,
                         LoadBalancing, Runtime, Schedule, TransformerImpl, ZeroStage, parse_choice)

__all__ = ["TrainingConfig", "PAPER_TRAINING"]


@dataclass(frozen=True)
class TrainingConfig:
    """How the model is trained: parallel sizes, pipeline layout, ZeRO stage, precision, profile.

    Parallel sizes follow Megatron-Core: world = DP * TP * CP * PP, and the experts of a stage are
    laid over EP * ETP ranks with EDP = DP * TP * CP / (EP * ETP) copies.
    """

    dp: int = 1                      #: data-parallel size
    tp: int = 1                      #: tensor-parallel size
    pp: int = 1                      #: pipeline stages
    ep: int = 1                      #: expert-parallel size
    etp: int = 1                     #: expert tensor-parallel size
    cp: int = 1                      #: context-parallel size
    sp: bool = True                  #: sequence parallelism (with TP > 1)
    layout: Optional[tuple[int, ...]] = None  #: decoder layers per stage; None: the default rule
    zero: ZeroStage = ZeroStage.NONE  #: ZeRO stage 0..3 (1: optimizer states, 2: +gradients, 3: +parameters)
    precision: str = "paper"         #: precision recipe name (see memlib.model.states.RECIPES)
    profile: str = "paper"           #: implementation convention: "paper", "megatron", ...
    micro_batch: int = 1             #: b, sequences per micro-batch
    seq_len: int = 4096              #: s, tokens per sequence
    recompute: str = "none"          #: policy name or comma list of modules (memlib.ledgers.base)
    schedule: Schedule = Schedule.ONE_F_ONE_B  #: gpipe, 1f1b, interleaved, dualpipe (memlib.device.schedule)
    num_microbatches: Optional[int] = None  #: M per step; None: enough to fill the pipeline
    vpp: int = 1                     #: V, model chunks per device (interleaved schedule)
    # kernel choices of the megatron profile (Megatron-LM's command-line names and defaults)
    transformer_impl: TransformerImpl = TransformerImpl.TRANSFORMER_ENGINE  #: --transformer-impl
    attention_backend: AttnBackend = AttnBackend.AUTO                       #: --attention-backend
    attention_softmax_in_fp32: bool = False    #: --attention-softmax-in-fp32 (s x s attention only)
    bias_swiglu_fusion: bool = True            #: off with --no-bias-swiglu-fusion
    cross_entropy_loss_fusion: bool = False    #: --cross-entropy-loss-fusion
    cross_entropy_fusion_impl: CrossEntropyFusionImpl = CrossEntropyFusionImpl.NATIVE  #: --cross-entropy-fusion-impl
    moe_aux_loss: LoadBalancing = LoadBalancing.SEQ_AUX_LOSS  #: --moe-router-load-balancing-type
    cp_comm_type: str = "p2p"        #: --cp-comm-type (with CP > 1): p2p, a2a, allgather, a2a+p2p
    hidden_dropout: Fraction = Fraction(0)     #: --hidden-dropout (memlib's default 0; Megatron-LM's is 0.1)
    attention_dropout: Fraction = Fraction(0)  #: --attention-dropout (memlib's default 0; Megatron-LM's is 0.1)
    #: --megatron-version: the Megatron-LM the rules of a version apply to (memlib.megatron.versions); None: the
    #: commit memlib pins
    megatron_version: Optional[str] = None
    runtime: Runtime = Runtime.CUDA            #: where torch runs: cuda (training) or cpu (memlib's ground truth)
    # carried, validated, not (yet) in any byte count: Megatron-LM's features, by their flags
    fp8: Optional[str] = None        #: --fp8-format: ``e4m3`` or ``hybrid``; None: no FP8 compute
    fp8_recipe: str = "delayed"      #: --fp8-recipe (Megatron-LM's default, ``delayed``)
    moe_a2a_overlap: bool = False    #: --overlap-moe-expert-parallel-comm
    offload_modules: tuple[str, ...] = ()  #: --fine-grained-activation-offloading --offload-modules
    overlap_grad_reduce: bool = False      #: --overlap-grad-reduce
    overlap_param_gather: bool = False     #: --overlap-param-gather (needs overlap_grad_reduce, ZeRO >= 1)
    routing_imbalance: Fraction = Fraction(1)  #: the busiest expert's tokens over the balanced share (>= 1)
    ddp_bucket_size: Optional[int] = None  #: --ddp-bucket-size, elements per gradient bucket

    def __post_init__(self):
        for name in ("dp", "tp", "ep", "etp", "cp"):
            check_count(name, getattr(self, name), bound=LIMITS["ranks"])
        check_count("pp", self.pp, bound=LIMITS["pp"])
        check_count("vpp", self.vpp, bound=LIMITS["virtual_stages"])
        for name in ("micro_batch", "seq_len"):
            check_count(name, getattr(self, name), bound=LIMITS[name])
        check_count("num_microbatches", self.num_microbatches, bound=LIMITS["num_microbatches"], nullable=True)
        if self.pp * self.vpp > LIMITS["virtual_stages"]:
            raise ConfigError(f"pp*vpp={self.pp * self.vpp} exceeds {_bound_text(LIMITS['virtual_stages'])} "
                              f"model chunks, the largest memlib accepts")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"zero={show(self.zero)} must be one of 0, 1, 2, 3")
        object.__setattr__(self, "zero", ZeroStage(self.zero))
        try:
            object.__setattr__(self, "schedule", Schedule(self.schedule))
        except ValueError:
            raise ConfigError(f"schedule={show(self.schedule)} must be one of "
                              f"{', '.join(s.value for s in Schedule)}") from None
        if not isinstance(self.sp, bool):
            raise ConfigError(f"sp={show(self.sp)} must be true or false")
        if self.layout is not None:
            lay = tuple(self.layout)
            if len(lay) > LIMITS["virtual_stages"]:
                raise ConfigError(f"layout has {len(lay)} entries, more than {_bound_text(LIMITS['virtual_stages'])} stages")
            bound = LIMITS["num_hidden_layers"]
            if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= bound for x in lay):
                text = ",".join(map(str, lay))
                raise ConfigError(f"layout={text if len(text) <= 80 else show(text)} must be non-negative integers (layers per stage, "
                                  f"at most {_bound_text(bound)} each)")
            object.__setattr__(self, "layout", lay)
        for name, cls in (("transformer_impl", TransformerImpl), ("attention_backend", AttnBackend),
                          ("cross_entropy_fusion_impl", CrossEntropyFusionImpl), ("moe_aux_loss", LoadBalancing),
                          ("runtime", Runtime)):
            try:
                object.__setattr__(self, name, parse_choice(cls, getattr(self, name)))
            except ValueError as exc:
                raise ConfigError(f"{name}={getattr(self, name)!r} {exc}") from None
        for name in ("sp", "attention_softmax_in_fp32", "bias_swiglu_fusion", "cross_entropy_loss_fusion"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be true or false")
        self._check_carried()
        self._check_dropout_and_cp()
        impl, backend = self.transformer_impl, self.attention_backend
        if not impl.uses_te and backend.needs_te():
            raise ConfigError(f"attention_backend={backend} needs transformer_impl=transformer_engine "
                              f"(transformer_impl={impl} builds Megatron-Core's own DotProductAttention)")
        if not impl.supports_sequence_parallel and self.sp and self.tp > 1:
            raise ConfigError(f"sp=True with transformer_impl={impl} and tp={self.tp}: Megatron-Core's local "
                              f"RMSNorm (torch.nn.RMSNorm) does not support sequence parallelism; pass --no-sp")
        if not impl.uses_te and self.cp > 1:
            raise ConfigError(f"cp={self.cp} with transformer_impl={impl}: Megatron-Core's local "
                              f"DotProductAttention supports no context parallelism (only TEDotProductAttention)")

    def _check_dropout_and_cp(self) -> None:
        """Dropout probabilities, the context-parallel communication, the Megatron-LM version."""
        if self.cp_comm_type not in CP_COMM_TYPES:
            raise ConfigError(f"cp_comm_type={show(self.cp_comm_type)} must be one of {', '.join(CP_COMM_TYPES)}")
        for name in ("hidden_dropout", "attention_dropout"):
            p = getattr(self, name)
            if isinstance(p, bool) or not isinstance(p, (int, Fraction)):
                raise ConfigError(f"{name}={show(p)} must be an exact probability (an int or a Fraction), 0 <= p < 1")
            p = Fraction(p)
            if not 0 <= p < 1 or p.denominator.bit_length() > 64:
                raise ConfigError(f"{name}={p} must be a probability 0 <= p < 1")
            object.__setattr__(self, name, p)
        if self.megatron_version is not None:
            from .versions import parse_version
            object.__setattr__(self, "megatron_version", parse_version(self.megatron_version).text)

    def _check_carried(self) -> None:
        """The fields memlib carries for Megatron-LM's features (their rules are Megatron-LM's)."""
        if self.fp8 is not None and self.fp8 not in FP8_FORMATS:
            raise ConfigError(f"fp8={show(self.fp8)} must be one of {', '.join(FP8_FORMATS)} or None")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError(f"fp8_recipe={show(self.fp8_recipe)} must be one of {', '.join(FP8_RECIPES)}")
        for name in ("moe_a2a_overlap", "overlap_grad_reduce", "overlap_param_gather"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={show(getattr(self, name))} must be true or false")
        mods = self.offload_modules
        if isinstance(mods, str) or not isinstance(mods, (tuple, list)):
            raise ConfigError(f"offload_modules={show(mods)} must be a tuple of module names")
        mods = tuple(mods)
        bad = [x for x in mods if x not in OFFLOAD_MODULES]
        if bad or len(set(mods)) != len(mods):
            what = f"{show(bad[0])} is not one of {', '.join(OFFLOAD_MODULES)}" if bad else "a module is named twice"
            raise ConfigError(f"offload_modules={show(','.join(map(str, mods)), 120)}: {what}")
        if "attn_proj" in mods and "core_attn" not in mods:
            raise ConfigError("offload_modules=attn_proj needs core_attn too (the input of attn_proj is the output "
                              "of core_attn, which core_attn's backward needs)")
        object.__setattr__(self, "offload_modules", mods)
        if self.overlap_param_gather and not self.overlap_grad_reduce:
            raise ConfigError("overlap_param_gather=True needs overlap_grad_reduce=True (as in Megatron-LM)")
        if self.overlap_param_gather and self.zero < ZeroStage.OS:
            raise ConfigError(f"overlap_param_gather=True needs zero >= 1 (a sharded optimizer gathers the "
                              f"parameters; zero={self.zero.value})")
        r = self.routing_imbalance
        if isinstance(r, bool) or not isinstance(r, (int, Fraction)):
            raise ConfigError(f"routing_imbalance={show(r)} must be an exact number >= 1 (an int or a Fraction)")
        r = Fraction(r)
        if r < 1 or r.numerator.bit_length() > 64 or r.denominator.bit_length() > 64:
            raise ConfigError(f"routing_imbalance={r} must be >= 1 (the busiest expert's tokens over the "
                              f"balanced share), with numerator and denominator below 2^64")
        object.__setattr__(self, "routing_imbalance", r)
        check_count("ddp_bucket_size", self.ddp_bucket_size, bound=LIMITS["bytes"], nullable=True)

    @property
    def edp(self) -> int:
        """Expert data-parallel size (exact once :class:`memlib.model.partition.Partition` has checked
        that EP ETP divides DP TP CP)."""
        return self.dp * self.tp * self.cp // self.ep_etp

    @property
    def ep_etp(self) -> int:
        """The ranks that hold every routed expert of a layer once, EP ETP (an expert-parallel group of expert
        tensor-parallel groups)."""
        return self.ep * self.etp

    @property
    def dp_cp(self) -> int:
        """The data-parallel group of the non-expert parameters, DP CP (Megatron-Core's data-parallel group with
        context parallelism): their gradients are reduced, and ZeRO shards their states, over it."""
        return self.dp * self.cp

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.cp * self.pp

    def with_(self, **changes) -> "TrainingConfig":
        """A copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)

    def label(self) -> str:
        """The paper's shorthand, e.g. ``PP16@TP2@EP8@ETP1``."""
        parts = [f"PP{self.pp}", f"TP{self.tp}", f"EP{self.ep}", f"ETP{self.etp}"]
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        return "@".join(parts)

    def values(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["layout"] = list(self.layout) if self.layout is not None else None
        d["offload_modules"] = list(self.offload_modules)
        d["routing_imbalance"] = str(self.routing_imbalance)
        d["hidden_dropout"] = str(self.hidden_dropout)
        d["attention_dropout"] = str(self.attention_dropout)
        if self.megatron_version is None:
            from .versions import DEFAULT_VERSION
            d["megatron_version"] = DEFAULT_VERSION
        for k, x in d.items():
            if isinstance(x, Enum):
                d[k] = x.value
        d["edp"] = self.edp
        d["world_size"] = self.world_size
        return d


PAPER_TRAINING = TrainingConfig(dp=32, tp=2, pp=16, ep=8, etp=1, cp=1, sp=True, zero=0,
                                precision="paper", profile="paper")
"""The paper's Table 5 configuration, PP16@TP2@EP8@ETP1 with DP32 (EDP8)."""
