"""Prototype of plan's step-time model (issue 23, phase 1), checked against SimuMax's 43 measured B200 runs.

    PYTHONPATH=. .venv/bin/python benchmarks/step_time_proto.py [--verbose]

A standalone script: it reads memlib (parameter counts, layouts) and changes nothing in it.  It prints

1. the baseline: today's ``memlib.plan`` cost (``step_s``) with B200 constants, pairs ordered right / wrong;
2. the new model with its one calibrated efficiency (B200): pairs right among those whose measured throughputs differ
   by >= 2 %, Spearman per model, the predicted/measured spread per group, and each row's terms (``--verbose``).

The model (per micro-batch of each pipeline stage, then the step):

* compute: the stage's training FLOPs (3 x forward: every weight's 2 FLOPs per token and parameter the token passes
  through -- the routed experts' share N_r / N --, the causal attention core s n_h (d_qk + d_v) per token and layer,
  the logits 2 h V on the last stage; recomputation adds the recomputed forward) over TP CP ranks, at the GPU's dense
  BF16 peak times ``efficiency`` (the one calibrated number);
* TP (sequence parallelism): per layer 4 collectives forward (all-gather before the column-parallel GEMMs of attention
  and MLP, reduce-scatter after the row-parallel ones) and 6 backward (their transposes, and the all-gather of each
  column-parallel GEMM's sharded input again for its weight gradient: Transformer Engine saves the sharded input under
  sequence parallelism), each of b s h / CP elements; the embedding's reduce-scatter and the head's all-gather;
* EP: dispatch and combine forward and backward (4 all-to-alls per MoE layer) of the rank's b s / (TP CP) tokens, N_r
  copies of h elements each;
* CP: (all-to-all flavour, the measured runs') Q, K, V and O forward, dQ, dK, dV, dO backward;
* PP: the activation forward and its gradient backward, b s h / (TP CP) elements, per micro-batch;
* each collective costs alpha + (n - 1)/n x bytes / (link bandwidth x eta), the link the group spans in Megatron-Core's
  rank order (tp-cp-ep-dp-pp; experts on their own ETP x EP x EDP grid), alpha and eta those NCCL reaches (SimuMax's
  nccl-tests fit on B200), none of them overlapped with computation (the runs' launch flags);
* the step: the slowest stage's micro-batch time x M x (1 + bubble) (bubble: plan's schedule formula), plus the data-
  parallel gradient reduce-scatter (fp32) and parameter all-gather (bf16) of the stage holding the most parameters (dense
  over DP CP, experts over EDP), plus the optimizer step (bytes over HBM bandwidth).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np

from memlib.config import load_model
from memlib.params import by_block, layer_params, values as model_values
from memlib.partition import default_layout

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tools" / "data" / "simumax_b200_steps.json"


# ------------------------------------------------------------------------------------------------
# hardware (vendor datasheets) and NCCL (SimuMax's measured fit)
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GPU:
    name: str
    flops: float          #: dense BF16 FLOP/s
    hbm_bw: float         #: bytes/s
    nvlink: float         #: bytes/s per GPU, one direction
    network: float        #: bytes/s per GPU across nodes, one direction
    gpus_per_node: int = 8


#: the GPUs plan knows (one direction of each link; the datasheets print NVLink as both directions together)
GPUS = {
    "A100": GPU("A100", 312e12, 2.039e12, 300e9, 25e9),
    "H100": GPU("H100", 989.5e12, 3.35e12, 450e9, 50e9),
    "H800": GPU("H800", 989.5e12, 3.35e12, 200e9, 50e9),
    "H200": GPU("H200", 989.5e12, 4.8e12, 450e9, 50e9),
    "B200": GPU("B200", 2250e12, 8.0e12, 900e9, 50e9),
}


@dataclasses.dataclass(frozen=True)
class Collective:
    eta: float            #: achieved bus bandwidth over the link's
    step_us: float        #: latency per ring step (n - 1 of them)
    fixed_us: float       #: latency per collective


#: SimuMax configs/system/b200_bf16_ceperm.json (nccl_fit on 8 B200, NVLink): efficient_factor, latency_us,
#: fixed_latency_us per operation
NCCL = {
    "all_gather": Collective(0.6735, 9.1828, 23.1049),
    "reduce_scatter": Collective(0.6731, 8.0325, 25.5604),
    "all_reduce": Collective(0.7424, 5.5183, 22.2316),
    "all2all": Collective(0.5968, 7.3039, 0.0),
    "p2p": Collective(1.0, 16.0668, 0.0),
}


def collective(op: str, nbytes: float, n: int, bw: float) -> float:
    """Seconds of one collective over ``n`` ranks of ``nbytes`` (the whole gathered / reduced tensor) on a link
    of ``bw`` bytes/s (ring: (n - 1)/n of it crosses each link; all-reduce twice)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    c = NCCL[op]
    scale = 2 if op == "all_reduce" else 1
    if op == "p2p":
        return c.step_us * 1e-6 + nbytes / (bw * c.eta)
    return (c.fixed_us + (n - 1) * scale * c.step_us) * 1e-6 + scale * (n - 1) / n * nbytes / (bw * c.eta)


# ------------------------------------------------------------------------------------------------
# Megatron-Core's rank order: which link each group spans
# ------------------------------------------------------------------------------------------------
def spans_nodes(stride: int, size: int, node: int) -> bool:
    """Whether a group of ``size`` ranks ``stride`` apart (a block of stride x size consecutive ranks) leaves a node
    of ``node`` GPUs."""
    return stride * size > node


def link(hw: GPU, stride: int, size: int) -> float:
    return hw.network if spans_nodes(stride, size, hw.gpus_per_node) else hw.nvlink


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------
def layer_parts(m) -> dict:
    """Parameters per block of each layer kind (exact integers)."""
    v = model_values(m)
    out = {}
    for kind in set(m.layer_kinds):
        b = by_block(layer_params(m, kind))
        out[kind] = {k: int(x.subs(v)) if hasattr(x, "subs") else int(x) for k, x in b.items()}
    return out


def qk_v(m) -> tuple[int, int]:
    if m.qk_nope_head_dim is not None:
        return m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    return m.head_dim, m.head_dim


def layer_fwd_flops(m, parts: dict, kind: str, s: int) -> float:
    """Forward FLOPs per token of one layer: 2 per parameter the token passes (routed experts: N_r / N of them) and
    the causal attention core (flash attention skips the masked half: s n_h (d_qk + d_v))."""
    p = parts[kind]
    dense = sum(x for k, x in p.items() if k != "routed_experts")
    routed = p.get("routed_experts", 0) * (m.num_experts_per_tok or 0) / (m.n_routed_experts or 1)
    dq, dv = qk_v(m)
    return 2 * (dense + routed) + s * m.num_attention_heads * (dq + dv)


# ------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    tp: int
    pp: int
    ep: int
    cp: int
    dp: int
    b: int
    s: int
    M: int
    etp: int = 1
    zero: int = 1
    grad_bytes: int = 4
    param_bytes: int = 2
    optimizer_bytes_per_param: int = 30   # fp32 master, moments read+write, fp32 grad read, bf16 param write
    cp_comm: str = "a2a"

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp


OPTIONS = {"mean_bubble": False, "memory": 0}
_ACT = {}


def act_bytes(m, c: Config, kinds, first: bool, last: bool) -> float:
    """Bytes of the activations one micro-batch saves on a rank of a stage of these layers (memlib's ledgers)."""
    key = (m, c, tuple(kinds), first, last)
    if key not in _ACT:
        import sympy as sp
        from memlib.config import TrainingConfig
        from memlib.memory import estimate
        t = TrainingConfig(dp=c.dp, tp=c.tp, pp=1, ep=c.ep, etp=c.etp, cp=c.cp, sp=c.tp > 1, zero=1, precision="megatron",
                           profile="megatron", micro_batch=c.b, seq_len=c.s)
        est = estimate(m, t)
        tot = 0
        for k in kinds:
            kept, _ = est.part_expressions("layer." + k, est.policy)
            tot += int(sp.sympify(kept).xreplace(est.values))
        _ACT[key] = tot
    return _ACT[key]


def step_time(m, c: Config, hw: GPU, eff: float) -> dict:
    parts = layer_parts(m)
    h, s, b = m.hidden_size, c.s, c.b
    L = m.num_hidden_layers
    lay = default_layout(L, c.pp)
    kinds = m.layer_kinds
    tok = b * s / (c.tp * c.cp)             # tokens a rank computes per micro-batch
    act = b * s * h * 2 / c.cp              # bytes of one TP collective (the gathered tensor)
    tp_bw = link(hw, 1, c.tp)
    cp_bw = link(hw, c.tp, c.cp)
    ep_bw = link(hw, c.etp, c.ep)
    pp_bw = link(hw, c.world // c.pp, c.pp)
    dq, dv = qk_v(m)
    n_kv = m.num_key_value_heads or m.num_attention_heads

    def tp_coll(n: int) -> float:     # n collectives, half all-gathers half reduce-scatters
        if c.tp == 1:
            return 0.0
        return n / 2 * (collective("all_gather", act, c.tp, tp_bw) + collective("reduce_scatter", act, c.tp, tp_bw))

    stages = []
    start = 0
    for r, n in enumerate(lay):
        ks = kinds[start:start + n]
        start += n
        fwd = sum(layer_fwd_flops(m, parts, k, s) for k in ks) * tok
        if r == c.pp - 1:
            fwd += 2 * h * m.vocab_size * tok
        compute = 3 * fwd / (hw.flops * eff)
        if OPTIONS["memory"]:
            compute += OPTIONS["memory"] * act_bytes(m, c, ks, r == 0, r == c.pp - 1) / hw.hbm_bw
        tp = tp_coll(10 * n + (1 if r == 0 else 0) * 2 + (1 if r == c.pp - 1 else 0) * 2)
        n_moe = sum(k == "moe" for k in ks)
        ep = n_moe * 4 * collective("all2all", tok * (m.num_experts_per_tok or 0) * h * 2 * c.ep / c.ep, c.ep, ep_bw) \
            if c.ep > 1 else 0.0
        if c.cp > 1:
            # a2a CP: Q, K, V before and O after attention forward; dO, dQ, dK, dV backward
            qkvo = b * s / c.cp * (2 * m.num_attention_heads * dv + 2 * n_kv * dq) / c.tp * 2
            cp = n * 2 * collective("all2all", qkvo * c.cp, c.cp, cp_bw) / c.cp * c.cp
        else:
            cp = 0.0
        pp = 2 * collective("p2p", tok * h * 2, 2, pp_bw) if c.pp > 1 else 0.0
        stages.append({"compute": compute, "tp": tp, "ep": ep, "cp": cp, "pp": pp,
                       "total": compute + tp + ep + cp + pp, "layers": n})
    slow = max(stages, key=lambda x: x["total"])
    bubble = (c.pp - 1) / c.M
    mean = sum(x["total"] for x in stages) / len(stages)
    pipe = slow["total"] * c.M + bubble * c.M * (mean if OPTIONS["mean_bubble"] else slow["total"])
    # data parallelism: the stage with the most parameters
    per_layer_dense = {k: sum(x for kk, x in p.items() if kk != "routed_experts") for k, p in parts.items()}
    per_layer_exp = {k: p.get("routed_experts", 0) for k, p in parts.items()}
    dp_s = opt = 0.0
    start = 0
    edp = c.dp * c.tp * c.cp // (c.ep * c.etp)
    for r, n in enumerate(lay):
        ks = kinds[start:start + n]
        start += n
        dense = sum(per_layer_dense[k] for k in ks) + (h * m.vocab_size if r == 0 else 0) \
            + (h * m.vocab_size if r == c.pp - 1 else 0)
        exp = sum(per_layer_exp[k] for k in ks)
        psi_d, psi_e = dense / c.tp, exp / (c.ep * c.etp)
        dbw = link(hw, c.tp, c.dp * c.cp)
        ebw = link(hw, c.etp * c.ep, edp)
        t = (collective("reduce_scatter", psi_d * c.grad_bytes, c.dp * c.cp, dbw)
             + collective("all_gather", psi_d * c.param_bytes, c.dp * c.cp, dbw)
             + collective("reduce_scatter", psi_e * c.grad_bytes, edp, ebw)
             + collective("all_gather", psi_e * c.param_bytes, edp, ebw))
        o = (psi_d / (c.dp * c.cp) + psi_e / edp) * c.optimizer_bytes_per_param / hw.hbm_bw
        dp_s, opt = max(dp_s, t), max(opt, o)
    step = pipe + dp_s + opt
    return {"step_s": step, "pipe": pipe, "bubble": bubble, "dp": dp_s, "optimizer": opt,
            **{f"stage_{k}": slow[k] * c.M for k in ("compute", "tp", "ep", "cp", "pp")}}


# ------------------------------------------------------------------------------------------------
# the measured set
# ------------------------------------------------------------------------------------------------
def load():
    return json.loads(DATA.read_text())


def proxy(data: dict, name: str, layers: int):
    """The launcher's model with ``layers`` layers (DeepSeek: the first dense, no MTP; Llama: the launcher's shapes,
    vocabulary padded as Megatron pads it)."""
    spec = data["models"][name]
    m = load_model(spec["preset"])
    over = {k: v for k, v in spec.items() if k != "preset" and hasattr(m, k)}
    if name.startswith("llama"):
        from memlib.scenarios.measured import simumax_model
        return simumax_model(name, layers, 1)
    return dataclasses.replace(m, **over, num_hidden_layers=layers, num_nextn_predict_layers=0,
                               name=f"{name} ({layers} layers)")


def config(r: dict) -> Config:
    return Config(tp=r["tp"], pp=r["pp"], ep=r["ep"], cp=r["cp"], dp=r["dp"], b=r["micro_batch"], s=r["seq_len"],
                  M=r["mbc"])


def tokens(r: dict) -> int:
    return r["global_batch"] * r["seq_len"]


def group_key(r: dict):
    return (r["model"], r["mbc"], r["seq_len"])


def pairs(rows, predicted, threshold=0.0):
    """(right, wrong) over the pairs of a group whose measured throughputs differ by at least ``threshold``."""
    groups = {}
    for r, p in zip(rows, predicted):
        groups.setdefault(group_key(r), []).append((tokens(r) / (r["real_ms"] / 1e3), tokens(r) / p, r["case"]))
    right, wrong, bad = 0, 0, []
    for rs in groups.values():
        for a, b in itertools.combinations(rs, 2):
            if max(a[0], b[0]) / min(a[0], b[0]) - 1 < threshold:
                continue
            if (a[0] - b[0]) * (a[1] - b[1]) > 0:
                right += 1
            else:
                wrong += 1
                bad.append((a[2], b[2]))
    return right, wrong, bad


def spearman(x, y) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def baseline(data) -> tuple[int, int]:
    from memlib.plan import CostModel, search
    cm = CostModel(flops=2.25e15, nvlink=900e9, network=50e9)
    steps = []
    for r in data["rows"]:
        m = proxy(data, r["model"], r["layer_num"])
        fix = {k: r[k] for k in ("tp", "pp", "ep", "cp", "dp")} | {"etp": 1, "b": 1, "zero": 1}
        g = search(m, 8, seq_len=r["seq_len"], global_batch=r["global_batch"], recomputes=("none",),
                   schedules=("1f1b",), zeros=(1,), layout_rules=("default",), fix=fix, cost=cm)
        steps.append(float(g.cost["step_s"][0]))
    right, wrong, _ = pairs(data["rows"], steps)
    return right, wrong


def predict(data, eff: float, hw: GPU = GPUS["B200"]):
    out = []
    for r in data["rows"]:
        m = proxy(data, r["model"], r["layer_num"])
        out.append(step_time(m, config(r), hw, eff))
    return out


def calibrate(data, hw: GPU = GPUS["B200"]) -> float:
    """The efficiency that minimises the squared log error of the step times over every row (golden section)."""
    meas = np.log([r["real_ms"] / 1e3 for r in data["rows"]])

    def loss(e):
        return float(np.sum((np.log([p["step_s"] for p in predict(data, e, hw)]) - meas) ** 2))
    lo, hi = 0.1, 1.0
    g = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if loss(a) < loss(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def report(data, eff: float, verbose: bool):
    rows = data["rows"]
    pred = predict(data, eff)
    steps = [p["step_s"] for p in pred]
    right, wrong, bad = pairs(rows, steps, 0.02)
    print(f"new model, efficiency {eff:.3f}: {right} of {right + wrong} pairs (measured throughputs >= 2 % apart) "
          f"in the measured order; wrong: {bad}")
    r_all, w_all, _ = pairs(rows, steps)
    print(f"  all pairs: {r_all} right, {w_all} wrong")
    for model in sorted({r["model"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["model"] == model]
        meas = [tokens(rows[i]) / rows[i]["real_ms"] for i in idx]
        prd = [tokens(rows[i]) / steps[i] for i in idx]
        print(f"  {model}: Spearman {spearman(meas, prd):.3f} over {len(idx)} rows")
    groups = {}
    for r, p in zip(rows, steps):
        groups.setdefault(group_key(r), []).append(p / (r["real_ms"] / 1e3))
    spread = {k: max(v) / min(v) for k, v in groups.items()}
    worst = max(spread, key=spread.get)
    print(f"  predicted/measured step: {min(min(v) for v in groups.values()):.3f} .. "
          f"{max(max(v) for v in groups.values()):.3f}; largest spread within a group {spread[worst]:.3f} {worst}")
    if verbose:
        for r, p in zip(rows, pred):
            terms = " ".join(f"{k} {v * 1e3:7.1f}" for k, v in p.items() if k not in ("bubble",))
            print(f"  {r['case'][:52]:52s} meas {r['real_ms']:8.1f} ratio {p['step_s'] * 1e3 / r['real_ms']:.3f} {terms}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--efficiency", type=float, default=None)
    ap.add_argument("--mean-bubble", action="store_true")
    ap.add_argument("--memory", type=float, default=0)
    args = ap.parse_args()
    data = load()
    OPTIONS.update(mean_bubble=args.mean_bubble, memory=args.memory)
    right, wrong = baseline(data)
    print(f"baseline (memlib.plan today, B200 constants): {right} of {right + wrong} pairs in the measured order")
    eff = args.efficiency or calibrate(data)
    report(data, eff, args.verbose)


if __name__ == "__main__":
    main()
