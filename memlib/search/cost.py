"""plan's step-time model: the predicted seconds of one training step as named terms, vectorised over a search's rows.

Each pipeline rank computes its layers' training FLOPs at the GPU's dense BF16 peak times one stated efficiency and
waits for the communication that is not overlapped, each collective on the link its group spans in Megatron-Core's
rank order; the step is the slowest rank's micro-batches, the pipeline bubble, the data-parallel synchronisation and
the optimizer step.  The GPUs are their datasheets' (:data:`GPUS`), NCCL's bandwidth and latencies those measured on
B200 (:data:`NCCL`), the efficiency the one number calibrated (:data:`EFFICIENCY`, on SimuMax's measured B200 runs:
:mod:`memlib.scenarios.steps`).  Each term, with its sources, is in ``docs/derivations/plan.md``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from ..config import ConfigError, ModelConfig, Schedule, show
from ..ledgers.base import parse_policy
from ..model.params import by_block, layer_params, values as model_values

__all__ = ["GPU", "GPUS", "GPU_SOURCES", "Collective", "NCCL", "NCCL_SOURCE", "NETWORK_ETA", "EFFICIENCY",
           "TIE_BAND", "TERMS", "CostModel", "RankWork", "rank_work", "spans_nodes", "collective_s", "step_terms",
           "COST_TERMS", "layer_flops"]


@dataclass(frozen=True)
class GPU:
    """A GPU and its node, from the datasheets: dense BF16 FLOP/s; HBM, NVLink and network bytes/s per GPU, the links
    in one direction (a datasheet's NVLink figure counts both); GPUs per NVLink node."""

    name: str
    flops: float
    hbm_bw: float
    nvlink: float
    network: float
    gpus_per_node: int = 8


GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("A100", 312e12, 2.039e12, 300e9, 25e9),
    GPU("H100", 989.5e12, 3.35e12, 450e9, 50e9),
    GPU("H800", 989.5e12, 3.35e12, 200e9, 50e9),
    GPU("H200", 989.5e12, 4.8e12, 450e9, 50e9),
    GPU("B200", 2250e12, 8e12, 900e9, 50e9),
)}

GPU_SOURCES: dict[str, str] = {
    "A100": "NVIDIA A100 datasheet (SXM4 80GB: BF16 tensor 312 TFLOPS, 624 with sparsity; HBM2e 2,039 GB/s; NVLink "
            "600 GB/s); DGX A100 datasheet (8 single-port ConnectX-6, 200 Gb/s HDR InfiniBand)",
    "H100": "NVIDIA H100 datasheet (SXM5: BF16 tensor 1,979 TFLOPS with sparsity; HBM3 3.35 TB/s; NVLink 900 GB/s); "
            "DGX H100 in docs.nvidia.com's DGX BasePOD core components (8 single-port ConnectX-7, up to 400 Gb/s)",
    "H800": "NVIDIA H800 SXM5: the H100 SXM5 with NVLink 400 GB/s; the DeepSeek-V3 report (arXiv 2412.19437) "
            "§3.2.2: InfiniBand 50 GB/s per GPU across nodes",
    "H200": "NVIDIA H200 product page (SXM: BF16 tensor 1,979 TFLOPS with sparsity; 141 GB HBM3e at 4.8 TB/s; NVLink "
            "900 GB/s); DGX H200 as DGX H100 (8 ConnectX-7, 400 Gb/s)",
    "B200": "NVIDIA HGX B200 datasheet (FP16/BF16 tensor 36 PFLOPS with sparsity for 8 GPUs: 2.25 PFLOPS dense "
            "each; HBM3e 8 TB/s); DGX B200 user guide (NVLink switches 14.4 TB/s aggregate, 1.8 TB/s per GPU; 8 "
            "ConnectX-7, up to 400 Gb/s)",
}


@dataclass(frozen=True)
class Collective:
    """NCCL's price of one collective over NVLink: the bus bandwidth it reaches over the link's, the latency of each of
    its n - 1 ring steps and a fixed latency."""

    eta: float
    step_s: float
    fixed_s: float


#: SimuMax's nccl-tests fit on eight B200s over NVLink, for every GPU's NVLink: its efficient_factor scaled by 2^30/1e9
#: (it prices in GiB/s), its latency_us and fixed_latency_us; p2p's fitted factor (1.45) taken as 1
NCCL: dict[str, Collective] = {
    "all_gather": Collective(0.6735 * 2**30 / 1e9, 9.1828e-6, 23.1049e-6),
    "reduce_scatter": Collective(0.6731 * 2**30 / 1e9, 8.0325e-6, 25.5604e-6),
    "all_reduce": Collective(0.7424 * 2**30 / 1e9, 5.5183e-6, 22.2316e-6),
    "all_to_all": Collective(0.5968 * 2**30 / 1e9, 7.3039e-6, 0.0),
    "p2p": Collective(1.0, 16.0668e-6, 0.0),
}
NCCL_SOURCE = ("MooreThreads/SimuMax 4dcaae51, configs/system/b200_bf16_ceperm.json (networks.high_intra_node.op) and "
               "simumax/core/config.py compute_net_op_time")
#: the share of a 400 Gb/s NIC that NCCL's ring reaches across nodes: 46-48 GB/s of 50 (NVIDIA/nccl-tests issue 290,
#: a maintainer's answer of 2025-03-03)
NETWORK_ETA = 0.94

#: the efficiency of the computation (achieved over peak FLOP/s) per GPU: B200's calibrated on SimuMax's 43 measured
#: runs (memlib.scenarios.steps.calibrate, the least squared log error of the steps; tests/search/test_steps.py refits it);
#: the other GPUs have no measured step in memlib and take B200's
EFFICIENCY: dict[str, float] = {"B200": 0.38}

#: configurations whose predicted steps differ by less than this fraction are shown as equals: the median error of
#: the model's ratio between two measured configurations (memlib.scenarios.steps.tie_band; the test recomputes it)
TIE_BAND = 0.05


@dataclass(frozen=True)
class CostModel:
    """What the step time is priced with: the GPU (any field overridable), the efficiency of its computation (None:
    :data:`EFFICIENCY`'s), the context-parallel communication and the bytes of a communicated activation."""

    gpu: GPU = GPUS["H100"]
    efficiency: float | None = None
    cp_comm: str = "p2p"                 #: ``p2p`` (Megatron-Core's default ring) or ``a2a`` (all-to-all)
    act_bytes: int = 2

    def __post_init__(self):
        if self.cp_comm not in ("p2p", "a2a"):
            raise ConfigError(f"cp_comm={show(self.cp_comm)} must be p2p or a2a")
        if not 0 < self.eff <= 1:
            raise ConfigError(f"efficiency={show(self.eff)} must be in (0, 1]")
        for name in ("flops", "hbm_bw", "nvlink", "network"):
            if not getattr(self.gpu, name) > 0:
                raise ConfigError(f"{name}={show(getattr(self.gpu, name))} must be positive")
        n = self.gpu.gpus_per_node
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"gpus_per_node={show(n)} must be a positive integer")

    @property
    def eff(self) -> float:
        if self.efficiency is not None:
            return self.efficiency
        return EFFICIENCY.get(self.gpu.name, EFFICIENCY["B200"])

    @classmethod
    def of(cls, gpu: str = "H100", **overrides) -> "CostModel":
        """GPU ``gpu`` of :data:`GPUS` with ``overrides`` (None: kept): its fields (flops, hbm_bw, nvlink, network,
        gpus_per_node) and this class's (efficiency, cp_comm, act_bytes)."""
        key = str(gpu).upper()
        if key not in GPUS:
            raise ConfigError(f"gpu={show(gpu)} must be one of {', '.join(GPUS)}")
        mine = {f.name for f in fields(GPU)} - {"name"}
        g = {k: v for k, v in overrides.items() if k in mine and v is not None}
        own = {k: v for k, v in overrides.items() if k not in mine and v is not None}
        return cls(gpu=replace(GPUS[key], **g), **own)

    def values(self) -> dict:
        """The model's numbers, for a JSON answer."""
        return {**{f.name: getattr(self.gpu, f.name) for f in fields(GPU)}, "efficiency": self.eff,
                "cp_comm": self.cp_comm, "tie_band": TIE_BAND}


# ------------------------------------------------------------------------------------------------
# the links
# ------------------------------------------------------------------------------------------------
def spans_nodes(stride, size, node: int):
    """Whether a group of ``size`` ranks ``stride`` apart leaves a node of ``node`` GPUs: Megatron-Core numbers the
    ranks TP fastest, then CP, EP, DP, PP (megatron/core/parallel_state.py, ``order="tp-cp-ep-dp-pp"``; the experts on
    their ETP x EP x EDP grid in the same order), so a group is a block of stride x size consecutive ranks."""
    return (np.asarray(size) > 1) & (np.asarray(stride) * np.asarray(size) > node)


def collective_s(op: str, nbytes, n, bw, inter=False):
    """Seconds of ``op`` over ``n`` ranks of ``nbytes`` (the whole gathered or reduced tensor) on links of ``bw`` bytes/s
    (``inter``: across nodes): (n - 1)/n of the bytes (twice for an all-reduce) at bw x eta, plus the latencies."""
    c = NCCL[op]
    n = np.asarray(n, dtype=np.float64)
    k = 2.0 if op == "all_reduce" else 1.0
    eta = np.where(inter, NETWORK_ETA, c.eta)
    t = c.fixed_s + k * (n - 1) * c.step_s + k * (n - 1) / np.maximum(n, 1) * np.asarray(nbytes) / (bw * eta)
    return np.where(n > 1, t, 0.0)


def _on_link(gpu: GPU, stride, size):
    """(bytes/s, across nodes) of a group's link."""
    inter = spans_nodes(stride, size, gpu.gpus_per_node)
    return np.where(inter, gpu.network, gpu.nvlink), inter


def _all_to_all_s(nbytes, n, stride, gpu: GPU):
    """An all-to-all of ``nbytes`` per rank over ``n`` ranks ``stride`` apart: the share for ranks of the rank's node
    over NVLink while the rest crosses the network."""
    n = np.asarray(n, dtype=np.float64)
    local = np.minimum(n, np.maximum(gpu.gpus_per_node // np.asarray(stride), 1))
    c = NCCL["all_to_all"]
    intra = (local - 1) / np.maximum(n, 1) * nbytes / (gpu.nvlink * c.eta)
    inter = (n - local) / np.maximum(n, 1) * nbytes / (gpu.network * NETWORK_ETA)
    return np.where(n > 1, c.fixed_s + (n - 1) * c.step_s + np.maximum(intra, inter), 0.0)


# ------------------------------------------------------------------------------------------------
# the work of a rank
# ------------------------------------------------------------------------------------------------
def _qk_v(m: ModelConfig) -> tuple[int, int]:
    if m.qk_nope_head_dim is not None:
        return m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    return m.head_dim, m.head_dim


@lru_cache(maxsize=256)
def layer_flops(m: ModelConfig, kind: str, s: int) -> dict[str, float]:
    """Forward FLOPs per token of a decoder layer of ``kind``: ``forward`` (2 per parameter passed, the routed experts'
    N_r / N of theirs, plus the causal attention core s n_h (d_qk + d_v)), ``attention`` (the core) and each recompute
    module's (``core_attn``, ``mla_up_proj``, ``mlp``, ``moe``, ``shared_experts``; ``layernorm``, ``moe_act``:
    element-wise, 0)."""
    blocks = {k: float(x) for k, x in by_block(layer_params(m, kind)).evaluate(model_values(m)).items()}
    dq, dv = _qk_v(m)
    core = float(s * m.num_attention_heads * (dq + dv))
    routed = blocks.get("routed_experts", 0.0) * (m.num_experts_per_tok or 0) / (m.n_routed_experts or 1)
    dense = sum(x for k, x in blocks.items() if k != "routed_experts")
    up = 0.0 if m.kv_lora_rank is None else 2.0 * m.num_attention_heads * (
        (m.q_lora_rank or 0) * dq + m.kv_lora_rank * (m.qk_nope_head_dim + dv))
    shared = blocks.get("shared_experts", 0.0)
    return {"forward": 2 * (dense + routed) + core, "attention": core, "core_attn": core, "mla_up_proj": up,
            "mlp": 2 * blocks.get("dense_ffn", 0.0), "moe": 2 * (routed + shared + blocks.get("router", 0.0)),
            "shared_experts": 2 * shared, "layernorm": 0.0, "moe_act": 0.0}


@dataclass(frozen=True)
class RankWork:
    """What one pipeline rank does per token of a micro-batch (its chunks together; DualPipe's two directions
    averaged): forward FLOPs, recomputed forward FLOPs, the attention core's forward FLOPs, decoder layers, MoE layers,
    tensor-parallel collectives and pipeline sends (model chunks)."""

    forward: float
    recompute: float
    attention: float
    layers: float
    moe_layers: float
    tp_collectives: float
    chunks: float


def rank_work(m: ModelConfig, stage, schedule: Schedule, recompute: str, s: int, include_mtp: bool) -> RankWork:
    """The :class:`RankWork` of a pipeline rank (a :class:`memlib.model.partition.Stage`): its chunks' layers, the
    first chunk's embedding, the last chunk's logits (2 h V) and MTP modules (a layer, the 2h x h projection, the
    logits).  Sequence parallelism's collectives: ten per layer (five for the attention, five for the MLP or shared
    experts; a MoE layer without shared experts has the attention's five), two for the embedding, two for the head."""
    pol = parse_policy(recompute)
    per = {k: layer_flops(m, k, s) for k in set(m.layer_kinds)}
    h, vocab = m.hidden_size, m.vocab_size
    parts = []
    for c in stage.chunks:
        kinds = [m.layer_kinds[i] for i in c.layers]
        fwd = sum(per[k]["forward"] for k in kinds)
        att = sum(per[k]["attention"] for k in kinds)
        if pol.full:
            k_rec = kinds if pol.block_layers is None else kinds[:pol.block_layers]
            rec = sum(per[k]["forward"] for k in k_rec)
        else:
            rec = sum(per[k][mod] for k in kinds for mod in pol.modules)
        coll = sum(10 if k == "dense" or per[k]["shared_experts"] else 5 for k in kinds)
        moe = sum(k == "moe" for k in kinds)
        n = len(kinds)
        if c.first:
            coll += 2
        if c.last:
            fwd += 2 * h * vocab
            coll += 2
            if include_mtp:
                for _ in range(m.num_nextn_predict_layers):
                    kind = m.layer_kinds[-1]
                    fwd += per[kind]["forward"] + 2 * 2 * h * h + 2 * h * vocab
                    att += per[kind]["attention"]
                    coll += 12
                    moe += kind == "moe"
                    n += 1
        parts.append((fwd, rec, att, n, moe, coll))
    cols = [sum(p[i] for p in parts) for i in range(6)]
    if schedule is Schedule.DUALPIPE:           # each micro-batch through one of the rank's two chunks
        return RankWork(*(x / len(parts) for x in cols), chunks=1)
    return RankWork(*cols, chunks=len(parts))


# ------------------------------------------------------------------------------------------------
# the step
# ------------------------------------------------------------------------------------------------
#: the terms that add up to ``step_s``, each in words
TERMS: dict[str, str] = {
    "compute_s": "the slowest pipeline rank's training FLOPs (the forward, twice it backward, what is recomputed) at "
                 "the GPU's dense BF16 peak times the efficiency",
    "tp_s": "tensor (sequence) parallelism's all-gathers and reduce-scatters, ten per layer, not overlapped",
    "ep_s": "expert parallelism's four all-to-alls per MoE layer, beyond what DualPipe or the MoE overlap hides",
    "cp_s": "context parallelism's exchange of keys and values, beyond what the attention hides",
    "pp_s": "the pipeline's sends of activations forward and their gradients backward",
    "bubble_s": "the schedule's idle time: its bubble fraction of the ranks' mean micro-batch time",
    "dp_s": "the gradients' reduction and the parameters' gather over the data-parallel ranks (ZeRO 2 and 3: every "
            "micro-batch)",
    "optimizer_s": "the optimizer step, its states read and written over HBM",
}

COST_TERMS = ("compute_s", "tp_s", "ep_s", "cp_s", "pp_s", "bubble", "bubble_s", "dp_s", "optimizer_s", "step_s",
              "recompute", "tp_bytes", "ep_bytes", "cp_bytes", "pp_bytes", "dp_bytes")


def _bubble(schedule: Schedule, p: int, v: int, m) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    if schedule is Schedule.INTERLEAVED:
        return (p - 1) / (v * m)
    if schedule is Schedule.DUALPIPE:
        return 2 * (p / 2 - 1) / (3 * m)
    return (p - 1) / m


def step_terms(rows: Mapping[str, np.ndarray], works: Sequence[RankWork], params: Sequence[tuple], *,
               m: ModelConfig, pp: int, schedule: Schedule, vpp: int, seq_len: int, sp: bool, precision,
               cost: CostModel, overlap_grad_reduce: bool = False, moe_a2a_overlap: bool = False,
               ranks: Sequence[int] | None = None) -> dict:
    """The step's terms (:data:`COST_TERMS`, arrays) for rows of one pipeline: ``rows`` the knobs ``dp``, ``tp``, ``cp``,
    ``ep``, ``etp``, ``zero``, ``b``, ``M`` (arrays); ``works`` each distinct rank's :class:`RankWork`, ``params`` its
    (dense, expert) parameters as a device holds them before ZeRO (arrays over the rows), ``ranks`` how many pipeline
    ranks it stands for (None: one each); ``precision`` the recipe."""
    dp, tp, cp, ep, etp, z, b, M = (np.asarray(rows[k], dtype=np.float64)
                                    for k in ("dp", "tp", "cp", "ep", "etp", "zero", "b", "M"))
    g, a, h = cost.gpu, cost.act_bytes, m.hidden_size
    rate = g.flops * cost.eff
    world = dp * tp * cp * pp
    tok = b * seq_len / (tp * cp)                                  # tokens a rank computes per micro-batch
    act = b * seq_len * h * a / cp                                  # the tensor of one TP collective
    bw_tp, in_tp = _on_link(g, 1, tp)
    if sp:
        tp_one = 0.5 * (collective_s("all_gather", act, tp, bw_tp, in_tp)
                        + collective_s("reduce_scatter", act, tp, bw_tp, in_tp))
    else:                                   # an all-reduce where sequence parallelism has 2.5 collectives
        tp_one = 0.4 * collective_s("all_reduce", act, tp, bw_tp, in_tp)
    dq, dv = _qk_v(m)
    mla = m.kv_lora_rank is not None
    n_kv = m.num_attention_heads if mla else (m.num_key_value_heads or m.num_attention_heads)
    kv_token = n_kv * (dq + dv) if mla else 2 * n_kv * dq          # key and value elements per token
    ep_tokens = tok * (m.num_experts_per_tok or 0) * h * a          # one dispatch (or combine) of a rank's tokens
    a2a_ep = _all_to_all_s(ep_tokens, ep, etp, g)
    bw_cp, in_cp = _on_link(g, tp, cp)
    bw_pp, in_pp = _on_link(g, world / pp, np.full_like(dp, pp))
    hide_ep = schedule is Schedule.DUALPIPE or moe_a2a_overlap

    ranks_t = []
    for w in works:
        compute = (3 * w.forward + w.recompute) * tok / rate
        tp_s = np.where(tp > 1, w.tp_collectives * tp_one, 0.0)
        ep_s = np.where(ep > 1, w.moe_layers * 4 * a2a_ep, 0.0)
        if hide_ep:
            ep_s = np.maximum(ep_s - compute, 0.0)
        if cost.cp_comm == "p2p":     # K, V forward; K, V and their gradients backward; hidden behind the attention
            ring = collective_s("all_gather", 3 * b * seq_len * kv_token * a / tp, cp, bw_cp, in_cp)
            cp_s = np.maximum(w.layers * ring - 3 * w.attention * tok / rate, 0.0)
        else:                         # Q, K, V and O forward, their gradients backward
            qkvo = b * seq_len / cp * (2 * m.num_attention_heads * dv + kv_token) * a / tp
            cp_s = w.layers * 2 * _all_to_all_s(qkvo, cp, tp, g)
        cp_s = np.where(cp > 1, cp_s, 0.0)
        pp_s = 2 * w.chunks * collective_s("p2p", tok * h * a, np.full_like(dp, pp), bw_pp, in_pp)
        ranks_t.append(np.stack([compute + tp_s + ep_s + cp_s + pp_s, compute, tp_s, ep_s, cp_s, pp_s]))
    per = np.stack(ranks_t)                                         # (distinct ranks, terms, rows)
    slow = np.argmax(per[:, 0], axis=0)
    cols = np.arange(per.shape[2])
    at = per[slow, :, cols].T                                       # the slowest rank's terms
    bubble = _bubble(schedule, pp, vpp, M)
    weight = np.ones(len(works)) if ranks is None else np.asarray(ranks, dtype=np.float64)
    mean = np.tensordot(weight / weight.sum(), per[:, 0], axes=1)
    out = {"compute_s": M * at[1], "tp_s": M * at[2], "ep_s": M * at[3], "cp_s": M * at[4], "pp_s": M * at[5],
           "bubble": bubble, "bubble_s": bubble * M * mean}

    # data parallelism (the dense gradients over DP CP, the experts' over EDP) and the optimizer step: the rank with
    # the most of them
    edp = world / pp / (ep * etp)
    bw_d, in_d = _on_link(g, tp, dp * cp)
    bw_e, in_e = _on_link(g, ep * etp, edp)
    gb, wb = precision.gradients, precision.weights
    dp_s = opt = moved = np.zeros_like(dp)
    for (pd, pe), r in zip(params, per):
        pd, pe = np.asarray(pd, dtype=np.float64), np.asarray(pe, dtype=np.float64)

        def both(op, nb):
            return collective_s(op, pd * nb, dp * cp, bw_d, in_d) + collective_s(op, pe * nb, edp, bw_e, in_e)
        ar, rs, ag = both("all_reduce", gb), both("reduce_scatter", gb), both("all_gather", wb)
        backward = r[1] * 2 / 3                                     # one micro-batch's backward
        if overlap_grad_reduce:
            end = np.where(z == 0, np.maximum(ar - backward, 0.0), np.maximum(rs - backward, 0.0) + ag)
        else:
            end = np.where(z == 0, ar, rs + ag)
        zero2 = M * np.maximum(rs - backward, 0.0) + ag             # gradients reduce-scattered every micro-batch
        zero3 = M * np.maximum(rs + 2 * ag - r[1], 0.0)              # and the parameters gathered forward and backward
        t = np.where(z <= 1, end, np.where(z == 2, zero2, zero3))
        vol = (pd + pe) * np.select([z == 0, z == 1, z == 2], [2 * gb, gb + wb, M * gb + wb], M * (gb + 2 * wb))
        held = np.where(z >= 1, pd / (dp * cp) + pe / edp, pd + pe)
        o = held * (2 * precision.optimizer_bytes + gb + wb) / g.hbm_bw
        dp_s, opt, moved = np.maximum(dp_s, t), np.maximum(opt, o), np.maximum(moved, vol)
    out["dp_s"], out["optimizer_s"] = dp_s, opt
    out["step_s"] = M * at[0] + out["bubble_s"] + dp_s + opt
    # what the slowest rank moves per step (bytes), and its recomputed share, for readers
    w = [works[i] for i in slow]
    pick = lambda name: np.array([getattr(x, name) for x in w], dtype=np.float64)   # noqa: E731
    out["recompute"] = pick("recompute") / (3 * pick("forward"))
    out["tp_bytes"] = np.where(tp > 1, M * pick("tp_collectives") * (tp - 1) / tp * act, 0.0)
    out["ep_bytes"] = np.where(ep > 1, M * pick("moe_layers") * 4 * (ep - 1) / ep * ep_tokens, 0.0)
    out["cp_bytes"] = np.where(cp > 1, M * pick("layers") * 3 * (cp - 1) / cp * b * seq_len * kv_token * a / tp, 0.0)
    out["pp_bytes"] = np.where(pp > 1, M * 2 * pick("chunks") * tok * h * a, 0.0)
    out["dp_bytes"] = np.where(world / pp > 1, moved, 0.0)
    return out
