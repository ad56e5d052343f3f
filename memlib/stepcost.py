"""plan's step-time model: the predicted seconds of one training step, as named terms, vectorised over a search's rows.

**What it is.**  Per micro-batch, each pipeline rank computes its layers' training FLOPs at the GPU's dense BF16 peak
times a stated efficiency and waits for the communication that is not overlapped, each collective priced on the link
its group spans in Megatron-Core's rank order; the step is the slowest rank's micro-batch time M times, the pipeline
bubble, the data-parallel synchronisation and the optimizer step.  Every term is in the result; ``step_s`` is their sum.

``compute_s``
    the slowest rank's FLOPs of the step over (peak x ``efficiency``).  A token's forward costs 2 FLOPs per parameter it
    passes through (the routed experts: N_r of N) plus the causal attention core, s n_h (d_qk + d_v) per layer (flash
    attention skips the masked half; Megatron-LM's ``num_floating_point_operations`` counts it the same way), the
    logits 2 h V on the last stage (and each MTP module's layer, projection and logits); backward costs twice the
    forward; a recompute policy adds the forward of what it recomputes.  A rank computes b s / (TP CP) tokens of each
    micro-batch (the experts' work too: with balanced routing every rank of the expert grid gets the same share).
``tp_s``
    sequence parallelism's collectives, none overlapped (Megatron-LM's default: ``--tp-comm-overlap`` is off): per
    layer four forward (all-gather before the column-parallel GEMMs of attention and MLP, reduce-scatter after the
    row-parallel ones) and six backward (their transposes, and the all-gather of each column-parallel GEMM's sharded
    input again for its weight gradient: Transformer Engine saves the sharded input); a MoE layer without shared
    experts, with ETP 1, has the attention's five; each of b s h / CP elements; without sequence parallelism an
    all-reduce forward and backward per block.
``ep_s``
    dispatch and combine, forward and backward: four all-to-alls per MoE layer of the rank's b s / (TP CP) tokens,
    N_r copies of h elements; the part to ranks of other nodes goes over the network at the same time as the rest over
    NVLink.  Overlapped with the computation by DualPipe and by ``moe_a2a_overlap`` (only its excess is charged).
``cp_s``
    context parallelism: ``p2p`` (Megatron-Core's default ring) sends the keys and values of the other CP - 1 chunks
    forward and again with their gradients backward, 2 n_kv d_h elements per token (MLA: n_h (d_qk + d_v)), overlapped
    with the attention of the chunk in hand (only the excess is charged); ``a2a`` (Ulysses) all-to-alls Q, K, V and O
    forward and their gradients backward, not overlapped.
``pp_s``
    each micro-batch's activation forward and its gradient backward, b s h / (TP CP) elements per model chunk.
``bubble``, ``bubble_s``
    the schedule's idle fraction (Narayanan et al. 2021 §2.2: (p - 1)/M, interleaved (p - 1)/(V M); DualPipe
    2 (p/2 - 1)/(3 M) from its paper's Table 2) times M mean rank micro-batch times.
``dp_s``
    the gradients' reduction and the parameters' gather over DP CP (dense) and EDP (experts), of the rank holding the
    most parameters: ZeRO 0 an all-reduce, ZeRO 1 a reduce-scatter and an all-gather once per step (exposed unless
    ``overlap_grad_reduce``: then only what exceeds the last micro-batch's backward); ZeRO 2 the reduce-scatter every
    micro-batch, ZeRO 3 also the parameters' all-gather forward and backward every micro-batch (Megatron-FSDP and
    DeepSpeed prefetch them during the computation: only the excess over the micro-batch's compute is charged).
``optimizer_s``
    the optimizer step over HBM: each parameter a rank updates reads and writes its master weight and moments, reads
    its gradient and writes its weight (the precision recipe's bytes).
``step_s``
    M x the slowest rank's micro-batch time + ``bubble_s`` + ``dp_s`` + ``optimizer_s``.

Each collective of n ranks moving B bytes (the whole gathered or reduced tensor) costs (n - 1)/n B / (link x eta) plus
(n - 1) latencies per ring step and one fixed latency, eta and the latencies those NCCL reached on B200 (SimuMax's
nccl-tests fit, :data:`NCCL`), the link NVLink while the group stays inside a node and the network otherwise
(:func:`spans_nodes`, Megatron-Core's rank order).  The GPUs' numbers are their datasheets' (:data:`GPUS`);
``efficiency`` is the one number calibrated, on SimuMax's measured B200 runs (:data:`EFFICIENCY`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from .activations import parse_policy
from .config import ConfigError, ModelConfig, Schedule, show
from .params import by_block, layer_params, values as model_values

__all__ = ["GPU", "GPUS", "GPU_SOURCES", "Collective", "NCCL", "NCCL_SOURCE", "EFFICIENCY", "CostModel", "RankWork",
           "rank_work", "spans_nodes", "collective_s", "step_terms", "COST_TERMS", "layer_flops"]


# ------------------------------------------------------------------------------------------------
# hardware
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPU:
    """One GPU and its node, from its datasheet: dense BF16 FLOP/s, HBM bytes/s, NVLink and network bytes/s per GPU
    in one direction (datasheets print NVLink's two directions together), GPUs per NVLink node."""

    name: str
    flops: float
    hbm_bw: float
    nvlink: float
    network: float
    gpus_per_node: int = 8


GPUS: dict[str, GPU] = {
    "A100": GPU("A100", 312e12, 2.039e12, 300e9, 25e9),
    "H100": GPU("H100", 989.5e12, 3.35e12, 450e9, 50e9),
    "H800": GPU("H800", 989.5e12, 3.35e12, 200e9, 50e9),
    "H200": GPU("H200", 989.5e12, 4.8e12, 450e9, 50e9),
    "B200": GPU("B200", 2250e12, 8e12, 900e9, 50e9),
}

GPU_SOURCES: dict[str, str] = {
    "A100": "NVIDIA A100 datasheet (SXM4 80GB: BF16 tensor 312 TFLOPS, 624 with sparsity; HBM2e 2,039 GB/s; NVLink "
            "600 GB/s); DGX A100 datasheet (8 single-port ConnectX-6, 200 Gb/s HDR InfiniBand)",
    "H100": "NVIDIA H100 datasheet (SXM5: BF16 tensor 1,979 TFLOPS with sparsity; HBM3 3.35 TB/s; NVLink 900 GB/s); "
            "DGX H100 (docs.nvidia.com DGX BasePOD, core components: 8 single-port ConnectX-7, up to 400 Gb/s)",
    "H800": "NVIDIA H800 SXM5 (the H100 SXM5 with NVLink 400 GB/s); DeepSeek-V3 report (arXiv 2412.19437) §3.2.2: "
            "InfiniBand 50 GB/s per GPU across nodes",
    "H200": "NVIDIA H200 product page (SXM: BF16 tensor 1,979 TFLOPS with sparsity; 141 GB HBM3e, 4.8 TB/s; NVLink "
            "900 GB/s); DGX H200 (as DGX H100: 8 ConnectX-7, 400 Gb/s)",
    "B200": "NVIDIA HGX B200 datasheet (FP16/BF16 tensor 36 PFLOPS with sparsity for 8 GPUs: 2.25 PFLOPS dense each; "
            "HBM3e 8 TB/s); DGX B200 user guide (NVLink switches 14.4 TB/s aggregate: 1.8 TB/s per GPU; 8 ConnectX-7, "
            "up to 400 Gb/s)",
}


@dataclass(frozen=True)
class Collective:
    """NCCL's cost of one collective: the bus bandwidth it reaches over the link's, its latency per ring step and its
    fixed latency."""

    eta: float
    step_s: float
    fixed_s: float


#: SimuMax's nccl-tests fit on one node of eight B200s (NVLink), used for every link and GPU
NCCL: dict[str, Collective] = {
    "all_gather": Collective(0.6735, 9.1828e-6, 23.1049e-6),
    "reduce_scatter": Collective(0.6731, 8.0325e-6, 25.5604e-6),
    "all_reduce": Collective(0.7424, 5.5183e-6, 22.2316e-6),
    "all_to_all": Collective(0.5968, 7.3039e-6, 0.0),
    "p2p": Collective(1.0, 16.0668e-6, 0.0),
}
NCCL_SOURCE = ("MooreThreads/SimuMax 4dcaae51 configs/system/b200_bf16_ceperm.json (networks.high_intra_node.op: "
               "efficient_factor, latency_us, fixed_latency_us of its nccl-tests fit) and simumax/core/config.py "
               "compute_net_op_time (ring: (n - 1)/n of the bytes, n - 1 latencies and one fixed); SimuMax's "
               "bandwidth is 900 GiB/s, 0.966 of the 900 GB/s memlib takes as the link: eta is scaled by that; p2p's "
               "fitted factor exceeds 1 and is taken as 1")
_GIB = 2**30 / 1e9
NCCL = {k: replace(c, eta=c.eta * _GIB) if k != "p2p" else c for k, c in NCCL.items()}

#: the calibrated efficiency (achieved over peak FLOP/s of the computation) per GPU: B200's fitted on SimuMax's 43
#: measured runs (the least squared log error of the step time; tests/test_stepcost.py refits it); the others have no
#: measured step here and take B200's
EFFICIENCY: dict[str, float] = {"B200": 0.385}


def efficiency(gpu: str) -> float:
    return EFFICIENCY.get(gpu, EFFICIENCY["B200"])


@dataclass(frozen=True)
class CostModel:
    """What the step-time model is priced with: a GPU (:data:`GPUS`, any field overridable), the efficiency of its
    computation, GPUs per node, the context-parallel communication and the bytes of a communicated activation."""

    gpu: GPU = GPUS["H800"]
    efficiency: float | None = None      #: None: :func:`efficiency` of the GPU's name
    cp_comm: str = "p2p"                 #: ``p2p`` (Megatron-Core's default) or ``a2a``
    act_bytes: int = 2

    def __post_init__(self):
        if self.cp_comm not in ("p2p", "a2a"):
            raise ConfigError(f"cp_comm={show(self.cp_comm)} must be p2p or a2a")
        eff = self.eff
        if not 0 < eff <= 1:
            raise ConfigError(f"efficiency={show(eff)} must be in (0, 1]")
        for name in ("flops", "hbm_bw", "nvlink", "network"):
            v = getattr(self.gpu, name)
            if not v > 0:
                raise ConfigError(f"{name}={show(v)} must be positive")
        if self.gpu.gpus_per_node < 1:
            raise ConfigError(f"gpus_per_node={self.gpu.gpus_per_node} must be a positive integer")

    @property
    def eff(self) -> float:
        return efficiency(self.gpu.name) if self.efficiency is None else self.efficiency

    @classmethod
    def of(cls, gpu: str = "H800", **overrides) -> "CostModel":
        """The model of GPU ``gpu`` with ``overrides``: GPU fields (flops, hbm_bw, nvlink, network, gpus_per_node)
        and this class's (efficiency, cp_comm)."""
        key = gpu.upper()
        if key not in GPUS:
            raise ConfigError(f"gpu={show(gpu)} must be one of {', '.join(GPUS)}")
        g = {k: v for k, v in overrides.items() if k in GPU.__dataclass_fields__ and v is not None}
        own = {k: v for k, v in overrides.items() if k not in g and v is not None}
        return cls(gpu=replace(GPUS[key], **g), **own)


# ------------------------------------------------------------------------------------------------
# Megatron-Core's rank order: the link a group spans
# ------------------------------------------------------------------------------------------------
def spans_nodes(stride, size, node: int):
    """Whether a group of ``size`` ranks ``stride`` apart leaves a node of ``node`` GPUs.  Megatron-Core numbers ranks
    TP fastest, then CP, EP, DP, PP (``order="tp-cp-ep-dp-pp"``, megatron/core/parallel_state.py
    ``initialize_model_parallel``; the experts on their own ETP x EP x EDP grid, same order): a group is a block of
    stride x size consecutive ranks, inside a node iff size is 1 or stride x size <= node (TP: stride 1; CP: TP; DP
    with CP: TP, spanning N / PP; PP: N / PP; EP: ETP; EDP: ETP EP, spanning N / PP)."""
    return (np.asarray(size) > 1) & (np.asarray(stride) * np.asarray(size) > node)


def collective_s(op: str, nbytes, n, bw):
    """Seconds of one ``op`` over ``n`` ranks (arrays) of ``nbytes``, the whole gathered (or reduced) tensor, on links of
    ``bw`` bytes/s: (n - 1)/n of the bytes (twice for an all-reduce) over bw x eta, plus the latencies."""
    c = NCCL[op]
    n = np.asarray(n, dtype=np.float64)
    k = 2.0 if op == "all_reduce" else 1.0
    t = c.fixed_s + k * (n - 1) * c.step_s + k * (n - 1) / np.maximum(n, 1) * np.asarray(nbytes) / (bw * c.eta)
    return np.where(n > 1, t, 0.0)


def _all_to_all_s(nbytes, n, stride, gpu: GPU):
    """An all-to-all of ``nbytes`` per rank over ``n`` ranks ``stride`` apart: the share for ranks of the same node over
    NVLink, the rest over the network, at the same time."""
    n = np.asarray(n, dtype=np.float64)
    local = np.minimum(n, np.maximum(gpu.gpus_per_node // np.asarray(stride), 1))    # group members per node
    c = NCCL["all_to_all"]
    intra = (local - 1) / np.maximum(n, 1) * nbytes / (gpu.nvlink * c.eta)
    inter = (n - local) / np.maximum(n, 1) * nbytes / (gpu.network * c.eta)
    return np.where(n > 1, c.fixed_s + (n - 1) * c.step_s + np.maximum(intra, inter), 0.0)


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------
def _qk_v(m: ModelConfig) -> tuple[int, int]:
    if m.qk_nope_head_dim is not None:
        return m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    return m.head_dim, m.head_dim


def layer_flops(m: ModelConfig, kind: str, s: int) -> dict[str, float]:
    """Forward FLOPs per token of one decoder layer of ``kind``: ``forward`` (2 per parameter passed, the routed experts'
    N_r / N share, plus the causal attention core), ``attention`` (the core alone) and each recompute module's."""
    v = model_values(m)
    blocks = {k: float(x.subs(v)) if hasattr(x, "subs") else float(x) for k, x in by_block(layer_params(m, kind)).items()}
    share = (m.num_experts_per_tok or 0) / (m.n_routed_experts or 1)
    dq, dv = _qk_v(m)
    core = s * m.num_attention_heads * (dq + dv)
    dense = sum(x for k, x in blocks.items() if k != "routed_experts")
    routed = blocks.get("routed_experts", 0.0) * share
    up = 0.0 if m.kv_lora_rank is None else 2.0 * (
        (m.q_lora_rank or 0) * m.num_attention_heads * dq + m.kv_lora_rank * m.num_attention_heads * (m.qk_nope_head_dim + dv))
    return {"forward": 2 * (dense + routed) + core, "attention": core, "core_attn": core, "mla_up_proj": up,
            "mlp": 2 * blocks.get("dense_ffn", 0.0), "moe": 2 * (routed + blocks.get("shared_experts", 0.0)
                                                              + blocks.get("router", 0.0)),
            "shared_experts": 2 * blocks.get("shared_experts", 0.0), "layernorm": 0.0, "moe_act": 0.0,
            "has_shared": float(blocks.get("shared_experts", 0.0) > 0)}


@dataclass(frozen=True)
class RankWork:
    """What one pipeline rank does per token of a micro-batch (its model chunks together; DualPipe's two directions
    averaged): forward FLOPs, recomputed forward FLOPs, the attention core's forward FLOPs, layers, MoE layers, TP
    collectives, model chunks (pipeline sends)."""

    forward: float
    recompute: float
    attention: float
    layers: float
    moe_layers: float
    tp_collectives: float
    chunks: int


def rank_work(m: ModelConfig, stage, schedule: Schedule, recompute: str, s: int, include_mtp: bool) -> RankWork:
    """:class:`RankWork` of a :class:`memlib.partition.Stage` (its chunks' layers; the first chunk's embedding, the last
    chunk's logits and MTP modules)."""
    pol = parse_policy(recompute)
    flops = {k: layer_flops(m, k, s) for k in set(m.layer_kinds)}
    h, vocab = m.hidden_size, m.vocab_size
    parts = []
    for c in stage.chunks:
        kinds = [m.layer_kinds[i] for i in c.layers]
        fwd = sum(flops[k]["forward"] for k in kinds)
        att = sum(flops[k]["attention"] for k in kinds)
        if pol.full:
            n_rec = len(kinds) if pol.block_layers is None else min(len(kinds), pol.block_layers)
            rec = sum(flops[k]["forward"] for k in kinds[:n_rec])
        else:
            rec = sum(flops[k][mod] for k in kinds for mod in pol.modules)
        coll = sum(10 if (k == "dense" or flops[k]["has_shared"]) else 5 for k in kinds)
        n_moe = sum(k == "moe" for k in kinds)
        if c.last:
            fwd += 2 * h * vocab
            coll += 2
            if include_mtp and m.num_nextn_predict_layers:
                kind = m.layer_kinds[-1]
                per = flops[kind]["forward"] + 2 * 2 * h * h + 2 * h * vocab
                fwd += m.num_nextn_predict_layers * per
                att += m.num_nextn_predict_layers * flops[kind]["attention"]
                coll += m.num_nextn_predict_layers * 12
                n_moe += m.num_nextn_predict_layers * (kind == "moe")
        if c.first:
            coll += 2
        parts.append((fwd, rec, att, len(kinds), n_moe, coll))
    if schedule is Schedule.DUALPIPE:        # half the micro-batches through each chunk
        avg = [sum(p[i] for p in parts) / len(parts) for i in range(6)]
        return RankWork(*avg, chunks=1)
    tot = [sum(p[i] for p in parts) for i in range(6)]
    return RankWork(*tot, chunks=len(parts))


# ------------------------------------------------------------------------------------------------
# the step
# ------------------------------------------------------------------------------------------------
COST_TERMS = ("compute_s", "tp_s", "ep_s", "cp_s", "pp_s", "bubble", "bubble_s", "dp_s", "optimizer_s", "step_s",
              "tp_bytes", "ep_bytes", "cp_bytes", "pp_bytes", "dp_bytes", "recompute")


def _bubble(schedule: Schedule, p: int, v: int, m) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    if schedule is Schedule.INTERLEAVED:
        return (p - 1) / (v * m)
    if schedule is Schedule.DUALPIPE:
        return 2 * (p / 2 - 1) / (3 * m)
    return (p - 1) / m


def step_terms(rows: Mapping[str, np.ndarray], works: Sequence[RankWork], params: Sequence[tuple], *, m: ModelConfig,
               pp: int, schedule: Schedule, vpp: int, seq_len: int, sp: bool, precision, cost: CostModel,
               overlap_grad_reduce: bool = False, moe_a2a_overlap: bool = False) -> dict[str, np.ndarray]:
    """The terms of the step (module docstring) for rows of knobs (``dp``, ``tp``, ``cp``, ``ep``, ``etp``, ``zero``,
    ``b``, ``M`` arrays) of one pipeline (``works``: each rank's :class:`RankWork`; ``params``: each rank's (dense,
    expert) parameter counts, arrays over the rows, as a device holds them before ZeRO)."""
    f = {k: np.asarray(rows[k], dtype=np.float64) for k in ("dp", "tp", "cp", "ep", "etp", "zero", "b", "M")}
    dp, tp, cp, ep, etp, z, b, M = (f[k] for k in ("dp", "tp", "cp", "ep", "etp", "zero", "b", "M"))
    g, a = cost.gpu, cost.act_bytes
    node = g.gpus_per_node
    world = dp * tp * cp * pp
    h = m.hidden_size
    rate = g.flops * cost.eff
    tok = b * seq_len / (tp * cp)                                   # tokens a rank computes per micro-batch
    nvl, net = g.nvlink, g.network
    bw_tp = np.where(spans_nodes(1, tp, node), net, nvl)
    bw_cp = np.where(spans_nodes(tp, cp, node), net, nvl)
    bw_pp = np.where(spans_nodes(world / pp, pp, node), net, nvl)
    act = b * seq_len * h * a / cp                                   # one TP collective's tensor
    if sp:
        tp_one = 0.5 * (collective_s("all_gather", act, tp, bw_tp) + collective_s("reduce_scatter", act, tp, bw_tp))
    else:
        tp_one = 0.8 * collective_s("all_reduce", act, tp, bw_tp)   # 4 all-reduces where SP has 5 collectives
    dq, dv = _qk_v(m)
    n_kv = m.num_attention_heads if m.kv_lora_rank is not None else (m.num_key_value_heads or m.num_attention_heads)
    kv_per_token = (n_kv * (dq + dv) if m.kv_lora_rank is not None else 2 * n_kv * dq) * a
    k_r = m.num_experts_per_tok or 0
    ep_bytes_layer = tok * k_r * h * a                              # one dispatch (or combine) of the rank's tokens
    a2a_ep = _all_to_all_s(ep_bytes_layer, ep, etp, g)
    overlap_ep = schedule is Schedule.DUALPIPE or moe_a2a_overlap

    per_rank = []
    for w in works:
        compute = (3 * w.forward + w.recompute) * tok / rate
        tp_s = np.where(tp > 1, w.tp_collectives * tp_one, 0.0)
        ep_s = np.where(ep > 1, w.moe_layers * 4 * a2a_ep, 0.0)
        if overlap_ep:
            ep_s = np.maximum(ep_s - compute, 0.0)
        if cost.cp_comm == "p2p":
            kv = b * seq_len * kv_per_token / tp                     # the whole sequence's K and V on one TP rank
            per_layer = collective_s("all_gather", 3 * kv, cp, bw_cp)  # K, V forward; K, V and their gradients backward
            cp_s = np.maximum(w.layers * per_layer - 3 * w.attention * tok / rate, 0.0)
        else:
            qkvo = b * seq_len / cp * (2 * m.num_attention_heads * dv + kv_per_token / a) * a / tp
            cp_s = w.layers * 2 * _all_to_all_s(qkvo, cp, tp, g)
        cp_s = np.where(cp > 1, cp_s, 0.0)
        pp_s = np.where(pp > 1, 2 * w.chunks * collective_s("p2p", tok * h * a, 2, bw_pp), 0.0)
        total = compute + tp_s + ep_s + cp_s + pp_s
        per_rank.append((total, compute, tp_s, ep_s, cp_s, pp_s, w))
    totals = np.stack([r[0] for r in per_rank])
    slow = np.argmax(totals, axis=0)
    pick = lambda j: np.stack([r[j] for r in per_rank])[slow, np.arange(len(slow))]   # noqa: E731
    t_max = pick(0)
    bubble = _bubble(schedule, pp, vpp, M)
    bubble_s = bubble * M * totals.mean(axis=0)

    # data parallelism and the optimizer step: the rank with the most parameters
    rec = precision
    edp = dp * tp * cp / (ep * etp)
    d_dense, d_exp = dp * cp, edp
    bw_d = np.where(spans_nodes(tp, d_dense, node), net, nvl)
    bw_e = np.where(spans_nodes(ep * etp, edp, node), net, nvl)
    dp_s = np.zeros_like(t_max)
    opt = np.zeros_like(t_max)
    dp_bytes = np.zeros_like(t_max)
    for (pd, pe), r in zip(params, per_rank):
        pd, pe = np.asarray(pd, dtype=np.float64), np.asarray(pe, dtype=np.float64)   # (DualPipe: both chunks)
        gb, wb = rec.gradients, rec.weights

        ar = collective_s("all_reduce", pd * gb, d_dense, bw_d) + collective_s("all_reduce", pe * gb, d_exp, bw_e)
        rs = collective_s("reduce_scatter", pd * gb, d_dense, bw_d) + collective_s("reduce_scatter", pe * gb, d_exp, bw_e)
        ag = collective_s("all_gather", pd * wb, d_dense, bw_d) + collective_s("all_gather", pe * wb, d_exp, bw_e)
        compute_mb = r[1]
        backward_mb = compute_mb * 2 / 3
        end = np.where(z == 0, ar, rs + ag)
        if overlap_grad_reduce:
            end = np.where(z == 0, np.maximum(ar - backward_mb, 0), np.maximum(rs - backward_mb, 0) + ag)
        per_mb2 = np.maximum(rs - backward_mb, 0.0)                              # ZeRO-2: every micro-batch
        per_mb3 = np.maximum(rs + 2 * ag - compute_mb, 0.0)                       # ZeRO-3
        t = np.where(z <= 1, end, np.where(z == 2, M * per_mb2 + ag, M * per_mb3))
        moved = np.where(z == 0, 2 * (pd + pe) * gb, (pd + pe) * (gb + wb)) * np.where(z >= 2, M, 1) \
            * np.where(z == 3, (gb + 2 * wb) / (gb + wb), 1)
        shard = np.where(z >= 1, pd / d_dense + pe / d_exp, pd + pe)
        o = shard * (2 * rec.optimizer_bytes + rec.gradients + rec.weights) / g.hbm_bw
        dp_s, opt, dp_bytes = np.maximum(dp_s, t), np.maximum(opt, o), np.maximum(dp_bytes, moved)

    out = {
        "compute_s": M * pick(1), "tp_s": M * pick(2), "ep_s": M * pick(3), "cp_s": M * pick(4), "pp_s": M * pick(5),
        "bubble": bubble, "bubble_s": bubble_s, "dp_s": dp_s, "optimizer_s": opt,
    }
    out["step_s"] = M * t_max + bubble_s + dp_s + opt
    # volumes (bytes a GPU sends per step on the slowest rank's collectives), for readers
    w_slow = [per_rank[i][6] for i in range(len(per_rank))]
    lay = np.array([w.tp_collectives for w in w_slow])[slow]
    moe = np.array([w.moe_layers for w in w_slow])[slow]
    nl = np.array([w.layers for w in w_slow])[slow]
    out["tp_bytes"] = np.where(tp > 1, M * lay * (tp - 1) / tp * act, 0.0)
    out["ep_bytes"] = np.where(ep > 1, M * moe * 4 * (ep - 1) / ep * ep_bytes_layer, 0.0)
    out["cp_bytes"] = np.where(cp > 1, M * nl * 3 * (cp - 1) / cp * b * seq_len * kv_per_token / tp, 0.0)
    out["pp_bytes"] = np.where(pp > 1, M * 2 * tok * h * a, 0.0)
    out["dp_bytes"] = dp_bytes
    out["recompute"] = np.array([w.recompute / (3 * w.forward) for w in w_slow])[slow]
    return out
