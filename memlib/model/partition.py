"""Partition: which parameters each device stores, per pipeline stage.

A :class:`Partition` lays the model over PP stages (a layout of decoder layers per stage; the
embedding on the first stage; the final norm, the head and the MTP modules on the last), and
splits each tensor by how it shards:

* **TP-split**: the tensor's output (or input) features are divided over TP ranks;
* **replicated**: every TP rank holds the whole tensor;
* **expert-split**: the N routed experts are divided over EP ranks and each expert's width h_E
  over ETP ranks.

The profiles (:mod:`memlib.model.profiles`, their :class:`~memlib.model.profiles.PartitionRules`) say which
tensors are TP-split:

``paper``
    arXiv 2502.07846 §3: W^UQ, W^UK, W^UV, W^O split; W^DQ, W^DKV, W^QR, W^KR, all RMSNorms, the
    router and the shared experts replicated; no MTP.  The paper does not say how the dense FFN
    and the embedding/head are laid out (it analyses MoE stages only); memlib splits them by TP
    (vocab-parallel embedding and head), as Megatron-Core does.
``megatron``
    Megatron-Core: W^QR is split with W^UQ (one column-parallel ``linear_q_up_proj``), the
    shared experts are TP-split like the dense FFN, and the MTP modules sit on the last stage.

The data-parallel sizes follow Megatron: world = DP TP CP PP and EDP = DP TP CP / (EP ETP).

Grouped-query attention (any non-MLA family): TP splits the query heads (W^Q, W^O by n_h) and the
key-value groups (W^K, W^V by their width n_kv d_head).  Under ``paper`` and ``hf-eager`` TP must divide
n_kv: each rank holds whole groups.  Under ``megatron`` TP may also be a multiple of n_kv, as
Megatron-Core allows (transformer_config.py: "num_query_groups must be a multiple or divisor of
tensor_model_parallel_size"): its fused ``linear_qkv`` weight is still split evenly over the TP ranks
(what each stores is exact), and in the forward pass each rank all-gathers it and computes one whole
key-value group, replicated over TP / n_kv ranks (attention.py).  Biases of column-parallel Linears
split with their weight; the output projection's and fc2's biases are replicated.  A dense model takes
no EP or ETP > 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from math import ceil

import sympy as sp

from .architecture import (
    Tensor, decoder_layer_tensors, embedding_tensors, head_tensors, mtp_embedding_copy, mtp_tensors,
    tied_head_copy,
)
from ..core.breakdown import Breakdown
from ..config import ConfigError, ModelConfig, TrainingConfig, load_model
from .params import values as model_values
from .profiles import profile
from ..core.symbols import SYMBOLS, sym

__all__ = ["Stage", "Partition", "resolve_layout", "default_layout", "balanced_layout",
           "parallel_values", "shard_divisor", "SHARDING", "Chunk", "build_stages"]

TP, EP, ETP = sym("TP"), sym("EP"), sym("ETP")

#: how a tensor is laid over the ranks of a stage, with the divisor of its element count
SHARDING = {"tp": "split by TP", "replicated": "replicated", "expert": "split by EP and ETP",
            "expert_ep": "split by EP, replicated over ETP"}

#: Megatron-Core's local spec (transformer_impl=local) builds MLA's down-projections as ColumnParallelLinear
#: (then gathers their outputs): W^DQ split over d_c', the fused [W^DKV; W^KR] over d_c + d_h^R
_LOCAL_TP = {"attention.W_DQ": sym("d_cq"), "attention.W_DKV": sym("d_c") + sym("d_hR"),
             "attention.W_KR": sym("d_c") + sym("d_hR")}


def shard_divisor(kind: str) -> sp.Expr:
    """Divisor of a tensor's element count on one device."""
    return {"tp": TP, "replicated": sp.Integer(1), "expert": EP * ETP, "expert_ep": EP}[kind]


def parallel_values(train: TrainingConfig) -> dict:
    """Substitution symbol -> value for the parallel symbols."""
    return {sym("DP"): train.dp, sym("TP"): train.tp, sym("PP"): train.pp, sym("EP"): train.ep,
            sym("ETP"): train.etp, sym("CP"): train.cp, sym("EDP"): train.edp}


def default_layout(num_layers: int, pp: int) -> tuple[int, ...]:
    """The documented default: ceil(l/PP) decoder layers on each stage, the remainder on the last.

    For DeepSeek-V3 on 16 stages this is the paper's layout, fifteen stages of 4 and one of 1.

    >>> default_layout(61, 16)
    (4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 1)
    >>> default_layout(8, 4)
    (2, 2, 2, 2)
    """
    per = ceil(num_layers / pp)
    last = num_layers - per * (pp - 1)
    if last < 1:
        raise ConfigError(
            f"pp={pp} with num_hidden_layers={num_layers}: the default layout (ceil(l/pp)={per} layers "
            f"per stage, the remainder on the last) leaves stage {pp - 1} empty; give --layout")
    return (per,) * (pp - 1) + (last,)


def balanced_layout(num_layers: int, stages: int) -> tuple[int, ...]:
    """Layers spread as evenly as possible: every stage gets floor(l / n) or one more, and the
    stages with one fewer are the ends, first and last alternately (they also hold the embedding
    and the head).

    >>> balanced_layout(61, 16)
    (3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3)
    >>> balanced_layout(60, 16)
    (3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3)
    """
    if not 1 <= stages <= num_layers:
        raise ConfigError(f"pp={stages} with num_hidden_layers={num_layers}: every stage needs at least one layer")
    base, extra = divmod(num_layers, stages)
    light = stages - extra                        # stages that get base layers, taken from the ends
    order = [i // 2 if i % 2 == 0 else stages - 1 - i // 2 for i in range(stages)]   # 0, n-1, 1, n-2, ...
    ends = set(order[:light])
    return tuple(base if i in ends else base + 1 for i in range(stages))




def resolve_layout(m: ModelConfig, train: TrainingConfig) -> tuple[int, ...]:
    """Decoder layers per *model stage*, checked, or the default.

    There are PP model stages, or PP V with the interleaved schedule: there the layout may list
    all PP V virtual stages, or PP entries each divisible by V (every chunk of rank r then gets
    ``layout[r] / V`` layers)."""
    t = train
    t.schedule.check(t)      # the schedule's rules on the model chunks per device, before any layout
    n_virtual = t.pp * t.vpp
    if t.layout is None:
        if t.vpp == 1:
            return default_layout(m.num_hidden_layers, n_virtual)
        try:
            return default_layout(m.num_hidden_layers, n_virtual)
        except ConfigError:
            per = ceil(m.num_hidden_layers / n_virtual)
            raise ConfigError(
                f"pp*vpp={n_virtual} (pp={t.pp}, vpp={t.vpp}) with num_hidden_layers={m.num_hidden_layers}: the "
                f"default layout (ceil(l/(pp*vpp))={per} layers per virtual stage, the remainder on the last) "
                f"leaves virtual stage {n_virtual - 1} empty; give --layout") from None
    lay = t.layout
    text = ",".join(map(str, lay))
    if t.vpp > 1 and len(lay) == t.pp:
        bad = [x for x in lay if x % t.vpp]
        if bad:
            raise ConfigError(f"layout={text}: vpp={t.vpp} must divide every stage's layer count ({bad[0]} does not)")
        lay = tuple(lay[r] // t.vpp for _ in range(t.vpp) for r in range(t.pp))
    elif len(lay) != n_virtual:
        what = f"pp*vpp={n_virtual}" if t.vpp > 1 else f"pp={t.pp}"
        raise ConfigError(f"layout={text} has {len(lay)} stages but {what}")
    if sum(lay) != m.num_hidden_layers:
        raise ConfigError(f"layout={text} sums to {sum(lay)} but num_hidden_layers={m.num_hidden_layers}")
    return lay


@dataclass(frozen=True)
class Chunk:
    """A model stage (virtual stage with the interleaved schedule): consecutive decoder layers."""

    index: int
    layers: tuple[int, ...]
    first: bool     #: holds the embedding
    last: bool      #: holds the final norm, the head (and the MTP modules)


@dataclass(frozen=True)
class Stage:
    """One pipeline rank (a device of the stage): the model chunks it holds.

    With 1F1B and GPipe a rank holds one chunk, model stage ``index``; with the interleaved schedule
    V chunks (virtual stages r, PP + r, ...); with DualPipe two (stages r and PP - 1 - r)."""

    index: int
    layers: tuple[int, ...]
    first: bool
    last: bool
    chunks: tuple[Chunk, ...] = ()


def build_stages(layout: tuple[int, ...], train: TrainingConfig) -> list[Stage]:
    """Model chunks from ``layout``, assigned to the PP ranks by the schedule."""
    train.schedule.check(train)
    p, v = train.pp, train.vpp
    starts = [0, *accumulate(layout)][:-1]          # the first layer of each chunk (a running sum: linear)
    n = len(layout)
    chunks = [Chunk(i, tuple(range(s0, s0 + k)), i == 0, i == n - 1) for i, (s0, k) in enumerate(zip(starts, layout))]
    per_rank = [tuple(chunks[c] for c in train.schedule.rank_chunks(r, p, v)) for r in range(p)]
    return [
        Stage(r, tuple(i for c in cs for i in c.layers), any(c.first for c in cs), any(c.last for c in cs), cs)
        for r, cs in enumerate(per_rank)
    ]


def _field_text(expr: sp.Expr) -> str:
    """``n_shared_experts*moe_intermediate_size`` for N_s*h_E: config field names, not symbols."""
    names = {n.symbol: sp.Symbol(n.field) for n in SYMBOLS.values() if n.field}
    return str(expr.xreplace(names))


#: what a partition computes from the model, the profile and the kinds of a stage's layers only (kept)
_KEPT: dict = {}


def _keep(key, value) -> None:
    if len(_KEPT) > 8192:
        _KEPT.clear()
    _KEPT[key] = value


class Partition:
    """A model laid over a training configuration; checks every divisibility rule on creation."""

    def __init__(self, model: ModelConfig | str, train: TrainingConfig):
        self.model = load_model(model)
        self.train = train
        #: the profile's partition rules (:class:`memlib.model.profiles.PartitionRules`)
        self.profile = profile(train.profile).partition
        m = self.model
        self.layout = resolve_layout(m, train)
        self.stages = build_stages(self.layout, train)
        self._check()
        self.model_values = model_values(m)
        self.values = {**self.model_values, **parallel_values(train)}

    # ------------------------------------------------------------------------------------------
    def _check(self) -> None:
        m, t = self.model, self.train
        if not m.has_moe:
            for name in ("ep", "etp"):
                if getattr(t, name) != 1:
                    raise ConfigError(f"{name}={getattr(t, name)} needs routed experts, and {m.name} is a dense model "
                                      f"(no MoE layers): use {name}=1")
        elif m.n_routed_experts % t.ep:
            raise ConfigError(f"ep={t.ep} must divide n_routed_experts={m.n_routed_experts}")
        elif m.moe_intermediate_size % t.etp:
            raise ConfigError(f"etp={t.etp} must divide moe_intermediate_size={m.moe_intermediate_size}")
        if (t.dp * t.tp * t.cp) % (t.ep * t.etp):
            raise ConfigError(f"dp*tp*cp={t.dp * t.tp * t.cp} must be divisible by ep*etp={t.ep * t.etp} "
                              f"(each expert group spans EP*ETP of a stage's ranks)")
        if m.num_attention_heads % t.tp:
            raise ConfigError(f"tp={t.tp} must divide num_attention_heads={m.num_attention_heads}")
        if m.attention == "gqa" and m.num_key_value_heads % t.tp:
            kv = m.num_key_value_heads
            if not self.profile.megatron_kernels:
                raise ConfigError(f"tp={t.tp} must divide num_key_value_heads={kv} under the {t.profile} profile "
                                  f"(each rank holds whole key-value groups; the megatron profile replicates a group "
                                  f"over tp/num_key_value_heads ranks, as Megatron-Core does)")
            if t.tp % kv:
                raise ConfigError(f"tp={t.tp} must divide num_key_value_heads={kv} or be a multiple of it "
                                  f"(Megatron-Core's rule: transformer_config.py)")
        if self._local_tp and ("moe" in m.layer_kinds or (self.profile.include_mtp and m.num_nextn_predict_layers
                                                          and m.layer_kinds[-1] == "moe")):
            raise ConfigError(f"tp={t.tp} with transformer_impl=local and MoE layers: Megatron-Core requires sequence "
                              f"parallelism for MoE with TP (moe_layer.py), which its local RMSNorm does not support")
        for dim, size, key in self._tp_dims():
            if size % t.tp:
                raise ConfigError(f"tp={t.tp} must divide {_field_text(dim)}={size} "
                                  f"({key} is split by TP under the {t.profile} profile"
                                  + (" with transformer_impl=local)" if self._local_tp else ")"))

    def _signature(self, stage: Stage | Chunk) -> tuple:
        chunks = stage.chunks if isinstance(stage, Stage) else (stage,)
        return tuple((tuple(self.model.layer_kinds[i] for i in c.layers), c.first, c.last) for c in chunks)

    def _tp_dims(self) -> list[tuple]:
        """(width, its size, the first tensor it splits) of every width TP splits on some stage (kept: it
        depends on the model, the profile, the local modules and the layers of each stage only)."""
        key = ("tp_dims", self.model, self.train.profile, self._local_tp,
               tuple(self._signature(st) for st in self.stages))
        if key not in _KEPT:
            seen, out = set(), []
            mv = model_values(self.model)
            for stage in self.stages:
                for tensor, _ in self.tensors(stage):
                    dim = self._tp_dim(tensor)
                    if self.sharding(tensor) != "tp" or dim in seen:
                        continue
                    seen.add(dim)
                    out.append((dim, int(dim.xreplace(mv)), tensor.key))
            _keep(key, out)
        return _KEPT[key]

    def tensors(self, stage: Stage | Chunk) -> list[tuple[Tensor, int]]:
        """The tensors stored on ``stage`` (all its chunks) with how many times each occurs."""
        key = ("tensors", self.model, self.train.profile, self._signature(stage))
        if key not in _KEPT:
            _keep(key, self._tensors(stage))
        return list(_KEPT[key])

    def _tensors(self, stage: Stage | Chunk) -> list[tuple[Tensor, int]]:
        chunks = stage.chunks if isinstance(stage, Stage) else (stage,)
        m = self.model
        out: list[tuple[Tensor, int]] = []
        for chunk in chunks:
            if chunk.first:
                out += [(t, 1) for t in embedding_tensors(m)]
            kinds = [m.layer_kinds[i] for i in chunk.layers]
            for kind in ("dense", "moe"):
                n = kinds.count(kind)
                if n:
                    out += [(t, n) for t in decoder_layer_tensors(m, kind)]
            if chunk.last:
                out += [(t, 1) for t in head_tensors(m)]
                if m.tie_word_embeddings and not any(c.first for c in chunks):
                    # the stage that computes the logits needs the shared weight: Megatron-Core keeps a
                    # copy there (shared_embedding_or_output_weight) and all-reduces its gradient with
                    # the embedding's; where one rank holds both ends (PP 1, DualPipe) there is none
                    out += [(t, 1) for t in tied_head_copy()]
                if self.profile.include_mtp and m.num_nextn_predict_layers:
                    kind = m.layer_kinds[-1] if self.profile.mtp_like_last_layer else None
                    for j in range(m.num_nextn_predict_layers):
                        out += [(t, 1) for t in mtp_tensors(m, j, kind)]
                    if not any(c.first for c in chunks):
                        # the MTP modules embed the shifted tokens: a stage without the embedding keeps
                        # its own copy (Megatron-Core builds one where mtp_process; DualPipe's placement
                        # of the first and last stages on one rank is what saves it in DeepSeek-V3)
                        out += [(t, 1) for t in mtp_embedding_copy()]
        return out

    @property
    def _local_tp(self) -> bool:
        """Megatron-Core's local modules with TP > 1 (they split MLA's down-projections too)."""
        return self.profile.megatron_kernels and not self.train.transformer_impl.uses_te and self.train.tp > 1

    def _tp_dim(self, tensor: Tensor):
        key = tensor.key.removeprefix("mtp.")
        return _LOCAL_TP[key] if self._local_tp and key in _LOCAL_TP else tensor.tp_dim

    def sharding(self, tensor: Tensor) -> str:
        if self._local_tp and tensor.key.removeprefix("mtp.") in _LOCAL_TP:
            return "tp"
        return self.profile.sharding(tensor)

    def params(self, stage: Stage, *, buffers: bool = False) -> Breakdown:
        """Parameters stored on one device of ``stage``, per tensor (symbolic; layer counts exact)."""
        key = ("params", self.model, self.train.profile, self._local_tp, self._signature(stage), buffers)
        if key not in _KEPT:
            _keep(key, self._params(stage, buffers))
        return _KEPT[key]

    def _params(self, stage: Stage, buffers: bool) -> Breakdown:
        return Breakdown([
            (t.key, n * t.numel / shard_divisor(self.sharding(t)))
            for t, n in self.tensors(stage) if (t.kind == "buffer") == buffers
        ])

    def params_unsharded(self, stage: Stage) -> Breakdown:
        """Parameters of the whole stage before any TP/EP/ETP split (the paper's Table 4)."""
        return Breakdown([(t.key, n * t.numel) for t, n in self.tensors(stage) if t.kind != "buffer"])

    def split(self, stage: Stage) -> dict[str, Breakdown]:
        """Per-device parameters grouped by sharding: ``tp``, ``replicated``, ``expert`` (the experts' output
        biases, split by EP only, among them)."""
        groups: dict[str, list] = {"tp": [], "replicated": [], "expert": []}
        for t, n in self.tensors(stage):
            if t.kind == "buffer":
                continue
            kind = self.sharding(t)
            groups["expert" if kind == "expert_ep" else kind].append((t.key, n * t.numel / shard_divisor(kind)))
        return {k: Breakdown(v) for k, v in groups.items()}

    def edp_keys(self, stage: Stage) -> set[str]:
        """Keys of the tensors whose states shard over EDP rather than DP CP.

        Megatron: the routed experts.  The paper (§4) shards the whole MoE block over EDP, the
        router and the shared expert included; that is how its Table 8 comes out."""
        blocks = self.profile.edp_blocks
        return {t.key for t, _ in self.tensors(stage)
                if t.key.removeprefix("mtp.").split(".")[0] in blocks}

    def replication(self, tensor: Tensor) -> int:
        """How many copies of ``tensor`` all ranks together hold (ZeRO 0); DualPipe keeps every
        model stage on two ranks."""
        t = self.train
        ranks_per_stage = t.dp * t.tp * t.cp * t.schedule.parameter_copies
        return ranks_per_stage // int(shard_divisor(self.sharding(tensor)).xreplace(self.values))
