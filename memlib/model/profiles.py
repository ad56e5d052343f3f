"""Profiles: the implementation conventions a training configuration names (``profile``), one registry.

A :class:`Profile` holds what one implementation does with a model: its partition rules
(:class:`PartitionRules`: which tensors TP splits, which states shard over EDP, where the MTP modules sit,
read by :class:`memlib.model.partition.Partition`) and its activation profile
(:class:`memlib.ledgers.base.ActProfile`: what each layer saves for backward).  :data:`PROFILES` names
every profile; :func:`profile` parses a ``profile`` value into one, and :func:`act_profile` gives its
activation profile bound to a training configuration's kernel choices
(:func:`memlib.ledgers.bind_kernels`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config import ConfigError, ModelConfig, TrainingConfig, show
from ..core.words import join_and
from ..ledgers import bind_kernels
from ..ledgers.base import ActProfile
from ..ledgers.hf import HF_EAGER_PROFILE
from ..ledgers.megatron import MEGATRON_PROFILE
from ..ledgers.paper import PAPER_PROFILE
from .architecture import ETP_REPLICATED, Tensor
from .blocks import model_blocks

__all__ = ["PartitionRules", "Profile", "PROFILES", "profile", "act_profile"]

_PAPER_TP = {"attention.W_UQ", "attention.W_Q", "attention.W_UK", "attention.W_UV", "attention.W_O",
             # grouped-query attention: the query heads and the key-value groups, with their biases
             "attention.W_K", "attention.W_V", "attention.b_Q", "attention.b_K", "attention.b_V"}


def _paper_splits(t: Tensor) -> bool:
    """The paper's §3: W^UQ (or W^Q), W^UK, W^UV and W^O split by TP, the dense FFN and the
    vocab-parallel embedding and head too; W^QR, the down-projections and the shared experts not."""
    key = t.key.removeprefix("mtp.")
    return key in _PAPER_TP or t.block == "dense_ffn" or t.kind == "embedding"


def _every_splittable(t: Tensor) -> bool:
    """Megatron-Core: every tensor with a TP dimension is split (W^QR with W^UQ, the shared experts
    like the dense FFN)."""
    return True


@dataclass(frozen=True)
class PartitionRules:
    """A partition convention: which tensors TP splits, which states shard over EDP, where MTP sits."""

    include_mtp: bool
    #: whether a tensor that has a TP dimension (``tp_dim``) is split by TP under this convention
    tp_splits: Callable[[Tensor], bool] = _every_splittable
    #: blocks whose model states shard over EDP (the others over DP CP)
    edp_blocks: frozenset = frozenset({"routed_experts"})
    #: the MTP block is typed like the last decoder layer (Megatron-Core's get_gpt_mtp_block_spec), not
    #: like decoder layer l + j (Hugging Face's rule)
    mtp_like_last_layer: bool = False
    #: Megatron-Core's kernel choices apply (``--transformer-impl local`` with TP > 1 also splits MLA's
    #: down-projections, :data:`memlib.model.partition._LOCAL_TP`)
    megatron_kernels: bool = False

    def sharding(self, t: Tensor) -> str:
        """``"tp"``, ``"replicated"``, ``"expert"`` or ``"expert_ep"`` (an expert's output bias) for tensor ``t``."""
        if t.expert:
            return "expert_ep" if t.key.removeprefix("mtp.") in ETP_REPLICATED else "expert"
        if t.kind == "buffer" or t.tp_dim is None:
            return "replicated"
        return "tp" if self.tp_splits(t) else "replicated"


@dataclass(frozen=True)
class Profile:
    """An implementation convention: its name, what it is in words, how it lays the parameters over the
    devices and what its layers save for backward."""

    name: str
    #: what it splits, replicates and places, in the words of a model's blocks (:func:`model_blocks`)
    words: Callable[[frozenset], str]
    partition: PartitionRules
    activations: ActProfile

    def description_for(self, m: ModelConfig) -> str:
        """The convention in the words of ``m``'s own blocks (DeepSeek-V3's: the paper's own list)."""
        return self.words(frozenset(model_blocks(m)))


def _listed(items: list[str], serial: bool) -> str:
    """``a, b and c`` (:func:`memlib.core.words.join_and`); the paper's own list (an MLA or shared-expert model) is
    comma-separated."""
    return ", ".join(items) if serial else join_and(items)


def _paper_words(own: frozenset) -> str:
    mla = "mla" in own
    query = "W^UQ" if "q_latent" in own else "W^Q"        # the queries' projection, from c^Q or from h
    split = f"{query}, W^UK, W^UV, W^O" if mla else "W^Q, W^K, W^V, W^O"
    repl = (["down-projections", "W^QR"] if mla else []) + ["norms"] + (["router"] if "moe" in own else []) + (
        ["shared experts"] if "shared_experts" in own else [])
    return (f"the paper's convention (arXiv 2502.07846 §3): {split} TP-split; "
            f"{_listed(repl, mla or 'shared_experts' in own)} replicated" + ("; no MTP" if "mtp" in own else ""))


def _megatron_words(own: frozenset) -> str:
    split = (["dense FFN"] if "dense_layers" in own else []) + (
        ["shared experts"] if "shared_experts" in own else []) + ["the vocab-parallel embedding/head"]
    query = "W^UQ" if "q_latent" in own else "W^Q"
    return ("Megatron-Core: " + (f"W^QR split with {query}; " if "mla" in own else "") + f"{_listed(split, False)} TP-split"
            + ("; MTP on the last stage" if "mtp" in own else ""))


def _hf_words(own: frozenset) -> str:
    return ("transformers' ...ForCausalLM classes (eager attention): tensors split as megatron would"
            + ("; no MTP (transformers builds none)" if "mtp" in own else ""))


#: every profile, by name
PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("paper", _paper_words,
            PartitionRules(include_mtp=False, tp_splits=_paper_splits,
                           edp_blocks=frozenset({"router", "shared_experts", "routed_experts"})),
            PAPER_PROFILE),
    Profile("megatron", _megatron_words,
            PartitionRules(include_mtp=True, mtp_like_last_layer=True, megatron_kernels=True),
            MEGATRON_PROFILE),
    Profile("hf-eager", _hf_words, PartitionRules(include_mtp=False), HF_EAGER_PROFILE),
)}


def profile(name: str) -> Profile:
    """The profile called ``name``; any other value raises :class:`ConfigError` naming the known ones."""
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        raise ConfigError(f"profile={show(name)} must be one of {', '.join(PROFILES)}") from None


def act_profile(name: str, train: TrainingConfig | None = None) -> ActProfile:
    """The activation profile of the profile called ``name``, bound to ``train``'s kernel choices if given."""
    p = profile(name).activations
    return p if train is None else bind_kernels(p, train)
