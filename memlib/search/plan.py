"""``memlib plan``: every parallel configuration of N GPUs that fits, ranked by a stated cost model.

For a model, N GPUs, a capacity and a global batch, :func:`search` enumerates every parallel
configuration (DP TP PP CP EP ETP, ZeRO stage, micro-batch, recompute policy, precision, profile,
schedule, layout rule) that the library's rules allow, computes each one's peak with
:mod:`memlib.search.compiled` (:func:`memlib.device.estimate.estimate`'s ``peak.total``, to the byte) and
keeps those that fit; :func:`plan` ranks them by an estimated step time built from named terms (the
pipeline bubble, communication, recomputation), each stated so that a reader can re-rank.

The derivation, with its sources (file:line), is in ``docs/derivations/plan.md``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..ledgers.base import parse_policy
from .compiled import Family
from ..config import ConfigError, ModelConfig, Schedule, TrainingConfig, load_model, show
from ..device.estimate import config_values, estimate, ledger_entries
from ..device.overhead import Overheads
from ..model.params import activated_params, by_block, model_params, values as model_values
from ..model.partition import balanced_layout, default_layout
from ..device.peak import Framework
from ..model.states import recipe

__all__ = ["CostModel", "PlanResult", "Grid", "search", "plan", "FIXABLE", "DEFAULT_GLOBAL_BATCH", "parse_fix", "LAYOUT_RULES"]

#: DeepSeek-V3's global batch (sequences of 4096 tokens) for most of its pre-training (arXiv 2412.19437 §4.2)
DEFAULT_GLOBAL_BATCH = 15360

#: the knobs ``--fix`` may pin, with the option name they are given by
FIXABLE = ("dp", "tp", "pp", "ep", "etp", "cp", "zero", "b", "vpp")
LAYOUT_RULES = ("default", "balanced")


@dataclass(frozen=True)
class CostModel:
    """The constants of the cost model (module docstring)."""

    flops: float = 989e12             #: dense BF16 FLOP/s of one GPU (H800/H100 SXM)
    nvlink: float = 400e9             #: bytes/s per GPU inside a node (H800 NVLink: 400 GB/s)
    network: float = 50e9             #: bytes/s per GPU across nodes (400 Gb/s InfiniBand)
    gpus_per_node: int = 8
    act_bytes: int = 2                #: bytes of a communicated activation element


@dataclass
class PlanResult:
    model: str
    gpus: int
    capacity: int
    searched: int
    fitting: int
    configs: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"model": self.model, "gpus": self.gpus, "capacity": self.capacity, "searched": self.searched,
                "fitting": self.fitting, "configs": self.configs}


_COST_NAMES = ("bubble", "recompute", "tp_bytes", "ep_bytes", "cp_bytes", "dp_bytes", "pp_bytes", "compute_s",
               "comm_s", "step_s")


@dataclass
class Grid:
    """Every configuration a search went through, as arrays (one row each): the knobs ``rows`` (columns
    :data:`Grid.COLUMNS`), the group of each row (``groups[g]``: family, PP, schedule, V, layout rule and
    layout), its exact peak bytes and peak stage, and its cost terms (floats, the cost model's)."""

    model: ModelConfig
    gpus: int
    seq_len: int
    global_batch: int
    overhead: Overheads
    groups: list
    rows: np.ndarray
    group: np.ndarray
    peak: np.ndarray
    stage: np.ndarray
    cost: dict

    COLUMNS = ("dp", "tp", "cp", "ep", "etp", "zero", "b", "M")

    @property
    def searched(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> np.ndarray:
        """A knob of every row: a column of ``rows``, or ``pp``, ``vpp`` (from the row's group)."""
        if name in self.COLUMNS:
            return self.rows[:, self.COLUMNS.index(name)]
        j = {"pp": 1, "vpp": 3}[name]
        return np.array([g[j] for g in self.groups], dtype=np.int64)[self.group]

    def labels(self, name: str) -> np.ndarray:
        """A named choice of every row: ``schedule``, ``layout_rule``, ``recompute``, ``precision``, ``profile``."""
        if name == "schedule":
            per = [g[2].value for g in self.groups]
        elif name == "layout_rule":
            per = [g[4] for g in self.groups]
        else:
            per = [getattr(g[0].train, name) for g in self.groups]
        return np.array(per, dtype=object)[self.group] if per else np.zeros(0, dtype=object)

    def fits(self, capacity: int) -> np.ndarray:
        """Which rows' peak stage fits ``capacity`` bytes (exact integers)."""
        if self.peak.dtype == object:
            return np.array([int(p) <= capacity for p in self.peak], dtype=bool)
        if capacity >= 2**63:
            return np.ones(len(self.peak), dtype=bool)
        return self.peak <= capacity

    def ranking(self, capacity: int | None = None, top: int | None = None) -> np.ndarray:
        """Indices of the rows that fit ``capacity`` (None: every row), best first: by the estimated step time,
        then by peak memory (then by search order); the first ``top`` only (None: all)."""
        idx = np.arange(len(self.rows)) if capacity is None else np.flatnonzero(self.fits(capacity))
        if top is not None and 0 < top < len(idx):
            # only rows whose step time is at most the top-th smallest can be among the first top (ties kept)
            step = self.cost["step_s"][idx]
            idx = idx[step <= np.partition(step, top - 1)[top - 1]]
        elif top is not None and top <= 0:
            return idx[:0]
        order = np.lexsort((idx, self.peak[idx].astype(np.float64), self.cost["step_s"][idx]))
        return idx[order] if top is None else idx[order][:top]

    def train(self, i: int) -> TrainingConfig:
        """Row ``i`` as a training configuration (its estimate has the row's peak)."""
        fam, pp, sch, v, rule, lay = self.groups[int(self.group[i])]
        dp, tp, cp, ep, etp, z, b, M = (int(x) for x in self.rows[i])
        return fam.train.with_(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, zero=z, micro_batch=b,
                               num_microbatches=M, schedule=sch, vpp=v, layout=lay, seq_len=self.seq_len)

    def config(self, i: int, capacity: int) -> dict:
        """Row ``i`` as ``plan`` lists it: the configuration, its layout rule, peak, peak stage, headroom, cost."""
        fam, pp, sch, v, rule, lay = self.groups[int(self.group[i])]
        pipe = fam.pipeline(pp, sch, v, lay)
        peak = int(self.peak[i])
        return {"config": config_values(self.train(i), pipe.layout, Framework(), self.overhead),
                "layout_rule": rule, "peak": peak, "peak_stage": int(self.stage[i]), "headroom": int(capacity - peak),
                "cost": {k: float(x[i]) for k, x in self.cost.items()}}


def parse_fix(items: Iterable[str]) -> dict[str, int]:
    """``["tp=1,pp=16", "zero=1"]`` -> ``{"tp": 1, "pp": 16, "zero": 1}`` (one-line errors)."""
    out: dict[str, int] = {}
    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            key, eq, value = part.partition("=")
            key = key.strip().lower().replace("micro_batch", "b")
            if not eq or key not in FIXABLE:
                raise ConfigError(f"fix={show(part)} must be KEY=VALUE with KEY one of {', '.join(FIXABLE)}")
            v = value.strip()
            if not v.isdigit() or len(v) > 12:
                raise ConfigError(f"fix={show(part)}: {key}={show(v)} must be a non-negative integer")
            if key in out and out[key] != int(v):
                raise ConfigError(f"fix={show(part)}: {key} is fixed twice ({out[key]} and {v})")
            out[key] = int(v)
    return out


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _valid(fn) -> bool:
    try:
        fn()
        return True
    except ConfigError:
        return False


@dataclass(frozen=True)
class _Axes:
    """The values of each axis that pass the library's single-axis rules."""

    tp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    etp: tuple[int, ...]


def _ledgers(est):
    """``est`` with the entries of its activation ledgers listed for every chunk (a ledger may refuse a size: a
    GQA model with TP above its key-value heads under the megatron profile; their bytes do not depend on TP
    and are derived by the family, once per binding)."""
    m = est.model
    names = ["embedding", "head"] + [f"layer.{k}" for k in sorted(set(m.layer_kinds))]
    if est.partition.profile.include_mtp:
        names += [f"mtp.{j}" for j in range(m.num_nextn_predict_layers)]
    for name in names:
        ledger_entries(m, est.act_profile, name)
    return est


def _axes(model: ModelConfig, train: TrainingConfig, gpus: int) -> _Axes:
    """Each of TP, CP, EP, ETP alone, checked by building an Estimate and its ledgers (the library's rules)."""
    divs = _divisors(gpus)
    s = train.seq_len
    tp = tuple(t for t in divs if _valid(lambda: _ledgers(estimate(model, train.with_(tp=t, dp=1, seq_len=s * t)))))
    cp = tuple(c for c in divs if s % c == 0 and _valid(lambda: estimate(model, train.with_(cp=c, dp=1))))
    ep = tuple(e for e in _divisors(model.n_routed_experts or 1) if e <= gpus and _valid(
        lambda: estimate(model, train.with_(ep=e, dp=e))))
    etp = tuple(x for x in divs if _valid(lambda: estimate(model, train.with_(etp=x, dp=x))))
    return _Axes(tp, cp, ep, etp)


def _qkv_width(m: ModelConfig) -> int:
    """The widths of one head's query-key and value: d_h + d_h^R + d_v (MLA), 2 d_head (GQA)."""
    if m.qk_nope_head_dim is not None:
        return m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim
    return 2 * m.head_dim


def _flops(model: ModelConfig, s: int) -> dict:
    """Forward FLOPs per token of the whole model and of each recompute module (module docstring)."""
    m, v = model, model_values(model)
    n_moe = sum(k == "moe" for k in m.layer_kinds)
    n_dense = m.num_hidden_layers - n_moe
    attn_core = 2 * s * m.num_attention_heads * _qkv_width(m)
    up = 0 if m.kv_lora_rank is None else \
        2 * ((m.q_lora_rank or 0) * m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
             + m.kv_lora_rank * m.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim))
    h_e, k_e = m.moe_intermediate_size or 0, m.num_experts_per_tok or 0
    fwd = 2 * activated_params(m).evaluate_total(v) + m.num_hidden_layers * attn_core
    return {"forward": fwd, "core_attn": m.num_hidden_layers * attn_core, "mla_up_proj": m.num_hidden_layers * up,
            "mlp": n_dense * 6 * m.hidden_size * (m.intermediate_size or 0),
            "moe": n_moe * 6 * m.hidden_size * h_e * (k_e + (m.n_shared_experts or 0)),
            "shared_experts": n_moe * 6 * m.hidden_size * h_e * (m.n_shared_experts or 0),
            "layernorm": 0, "moe_act": 0, "n_moe": n_moe}


def _recompute_fraction(policy_name: str, flops: dict, layers: int, chunks: int) -> float:
    pol = parse_policy(policy_name)
    if pol.full:
        share = 1.0 if pol.block_layers is None else min(1.0, pol.block_layers * chunks / layers)
        return share / 3
    return sum(flops.get(mod, 0) for mod in pol.modules) / (3 * flops["forward"])


def _bubble(schedule: Schedule, p: int, v: int, m: np.ndarray) -> np.ndarray:
    m = m.astype(float)
    if schedule is Schedule.INTERLEAVED:
        return (p - 1) / (v * m)
    if schedule is Schedule.DUALPIPE:
        return 2 * (p / 2 - 1) / (3 * m)
    return (p - 1) / m


def _schedule_variants(schedules: Sequence[str], pp: int, layers: int, max_vpp: int, fix: Mapping) -> list:
    out = []
    for name in schedules:
        sch = Schedule(name)
        if sch is Schedule.INTERLEAVED:
            if pp < 2:
                continue
            for v in range(2, max_vpp + 1):
                if pp * v <= layers and fix.get("vpp", v) == v:
                    out.append((sch, v))
        elif fix.get("vpp", 1) == 1:
            if sch is Schedule.DUALPIPE and (pp < 2 or pp % 2):
                continue
            out.append((sch, 1))
    return out


def _layouts(layers: int, stages: int, rules: Sequence[str]) -> list[tuple[str, tuple | None]]:
    out, seen = [], set()
    for rule in rules:
        try:
            lay = default_layout(layers, stages) if rule == "default" else balanced_layout(layers, stages)
        except ConfigError:
            continue
        if lay in seen:
            continue
        seen.add(lay)
        out.append((rule, None if rule == "default" else lay))
    return out


def _progress(total: int, enabled: bool):
    """A progress bar over the search's groups on stderr (tqdm, a dependency: imported only when one is shown)."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="group", leave=False)


def search(model: ModelConfig | str, gpus: int, *, seq_len: int = 4096,
         global_batch: int = DEFAULT_GLOBAL_BATCH, profiles: Sequence[str] = ("megatron",),
         precisions: Sequence[str] = ("megatron",), recomputes: Sequence[str] = ("none", "selective", "full"),
         schedules: Sequence[str] = ("1f1b", "interleaved", "dualpipe"), zeros: Sequence[int] = (0, 1, 2, 3),
         layout_rules: Sequence[str] = LAYOUT_RULES, fix: Mapping[str, int] | None = None,
         max_micro_batch: int = 16, max_vpp: int = 4, overhead: Overheads | None = None,
         cost: CostModel = CostModel(), progress: bool = False) -> "Grid":
    """Every valid configuration of ``gpus`` GPUs (module docstring), each with its exact peak and its cost
    terms: a :class:`Grid`, whatever the capacity."""
    m = load_model(model)
    fix = dict(fix or {})
    overhead = overhead if overhead is not None else Overheads()
    for name, value, rule in (("gpus", gpus, "a positive integer"), ("global_batch", global_batch, "a positive integer"),
                              ("seq_len", seq_len, "a positive integer"), ("max_micro_batch", max_micro_batch, "a positive integer"),
                              ("max_vpp", max_vpp, "an integer >= 2")):
        if isinstance(value, bool) or not isinstance(value, int) or value < (2 if name == "max_vpp" else 1):
            raise ConfigError(f"{name}={show(value)} must be {rule}")
    if gpus > 2**20:
        raise ConfigError(f"gpus={gpus} exceeds 2^20, the largest plan searches")
    for rule in layout_rules:
        if rule not in LAYOUT_RULES:
            raise ConfigError(f"layout_rule={show(rule)} must be one of {', '.join(LAYOUT_RULES)}")
    for z in zeros:
        if z not in (0, 1, 2, 3):
            raise ConfigError(f"zero={show(z)} must be one of 0, 1, 2, 3")
    for name in schedules:
        if name not in {s.value for s in Schedule}:
            raise ConfigError(f"schedule={show(name)} must be one of {', '.join(s.value for s in Schedule)}")
    for key in ("dp", "tp", "pp", "ep", "etp", "cp", "b", "vpp"):
        if key in fix and fix[key] < 1:
            raise ConfigError(f"fix={key}={fix[key]} must be a positive integer")
    if "zero" in fix:
        if fix["zero"] not in (0, 1, 2, 3):
            raise ConfigError(f"fix=zero={fix['zero']} must be one of 0, 1, 2, 3")
        zeros = (fix["zero"],)
    zeros = tuple(sorted(set(zeros)))

    # families: (profile, precision, recompute); the ones the library rejects are skipped
    families, first_error = [], None
    for prof in profiles:
        for prec in precisions:
            for rc in recomputes:
                try:
                    t = TrainingConfig(profile=prof, precision=prec, recompute=rc, seq_len=seq_len)
                    fam = Family.of(m, t, overhead)
                    axes = _axes(m, t, gpus)
                except ConfigError as exc:
                    first_error = first_error or exc
                    continue
                families.append((fam, axes))
    if not families:
        raise first_error
    flops = _flops(m, seq_len)
    counts = by_block(model_params(m)).evaluate(model_values(m))
    p_expert = counts.get("routed_experts", 0)
    p_dense = sum(counts.values()) - p_expert
    n_moe = flops["n_moe"]

    # parallel rows per PP: (dp, tp, cp, ep, etp, zero, b, M)
    zs = np.asarray(zeros, dtype=np.int64)

    def rows_for(pp: int, axes: _Axes, sp_on: bool):
        rest = gpus // pp
        out = []            # blocks of rows: every ZeRO stage by every micro-batch size of one parallel split
        for tp in axes.tp:
            if rest % tp or fix.get("tp", tp) != tp:
                continue
            for cp in axes.cp:
                if (rest // tp) % cp or fix.get("cp", cp) != cp:
                    continue
                if sp_on and tp > 1 and seq_len % (cp * tp):
                    continue
                dp = rest // (tp * cp)
                if fix.get("dp", dp) != dp or global_batch % dp:
                    continue
                per_dp = global_batch // dp
                bs = np.asarray([b for b in _divisors(per_dp) if b <= max_micro_batch and fix.get("b", b) == b],
                                dtype=np.int64)
                zb = np.stack([np.repeat(zs, len(bs)), np.tile(bs, len(zs))], axis=1)
                tail = np.column_stack([zb, per_dp // zb[:, 1]])
                heads = [(dp, tp, cp, ep, etp) for ep in axes.ep if fix.get("ep", ep) == ep
                         for etp in sorted({1, tp}) if etp in axes.etp and fix.get("etp", etp) == etp
                         and (dp * tp * cp) % (ep * etp) == 0]
                if heads and len(tail):          # every (EP, ETP) of this split by every (ZeRO, b, M)
                    head = np.repeat(np.asarray(heads, dtype=np.int64), len(tail), axis=0)
                    out.append(np.concatenate([head, np.tile(tail, (len(heads), 1))], axis=1))
        return np.concatenate(out) if out else np.zeros((0, 8), dtype=np.int64)

    pps = [p for p in _divisors(gpus) if p <= m.num_hidden_layers and fix.get("pp", p) == p]
    groups = []
    for fam, axes in families:
        for pp in pps:
            rows = rows_for(pp, axes, fam.train.sp)
            if not len(rows):
                continue
            for sch, v in _schedule_variants(schedules, pp, m.num_hidden_layers, max_vpp, fix):
                for rule, lay in _layouts(m.num_hidden_layers, pp * v, layout_rules):
                    groups.append((fam, pp, sch, v, rule, lay, rows))

    bar = _progress(len(groups), progress)
    parts = []      # (rows, peak, stage, group index) of every searched row
    caches: dict[tuple, dict] = {}      # per family, PP and the schedule's rule on M: the same rows
    for gi, (fam, pp, sch, v, rule, lay, rows) in enumerate(groups):
        if bar is not None:
            bar.update(1)
        M = rows[:, 7]
        ok = np.ones(len(rows), dtype=bool)
        if sch is Schedule.INTERLEAVED:
            ok &= M % pp == 0
        elif sch is Schedule.DUALPIPE:
            ok &= (M % 2 == 0) & (M >= 2 * pp)
        r = rows[ok]
        if not len(r):
            continue
        pipe = fam.pipeline(pp, sch, v, lay)
        cache = caches.setdefault((id(fam), pp, sch if sch in (Schedule.INTERLEAVED, Schedule.DUALPIPE) else None), {})
        peak, stage = pipe.peak(dp=r[:, 0], tp=r[:, 1], cp=r[:, 2], ep=r[:, 3], etp=r[:, 4], zero=r[:, 5],
                                micro_batch=r[:, 6], num_microbatches=r[:, 7], seq_len=np.full(len(r), seq_len),
                                cache=cache)
        parts.append((r, peak, stage, gi))
    if bar is not None:
        bar.close()

    names = _COST_NAMES
    grid = Grid(m, gpus, seq_len, global_batch, overhead, [g[:6] for g in groups],
                rows=np.zeros((0, 8), dtype=np.int64), group=np.zeros(0, dtype=np.int64),
                peak=np.zeros(0, dtype=np.int64), stage=np.zeros(0, dtype=np.int64),
                cost={k: np.zeros(0) for k in names})
    if not parts:
        return grid
    grid.rows = np.concatenate([p[0] for p in parts])
    grid.group = np.concatenate([np.full(len(p[0]), p[3], dtype=np.int64) for p in parts])
    grid.peak = np.concatenate([p[1] for p in parts])
    grid.stage = np.concatenate([p[2] for p in parts])
    grid.cost = {k: np.empty(len(grid.rows)) for k in names}
    start = 0
    for r, peak, stage, gi in parts:            # each group's terms written into its slice of the columns
        fam, pp, sch, v, rule, lay = groups[gi][:6]
        terms = _cost_terms(r, pp, sch, v, fam, flops, p_dense, p_expert, n_moe, m, seq_len, global_batch, gpus, cost)
        for k in names:
            grid.cost[k][start:start + len(r)] = terms[k]
        start += len(r)
    return grid


def plan(model: ModelConfig | str, gpus: int, capacity: int, *, top: int | None = 10, **options) -> PlanResult:
    """Every valid configuration of ``gpus`` GPUs (:func:`search`, ``options`` its keywords), those whose peak
    stage fits ``capacity`` bytes, the best ``top`` of them (None: all) by the cost model (module docstring)."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise ConfigError(f"top={show(top)} must be a non-negative integer (or None: every configuration)")
    grid = search(model, gpus, **options)
    fits = grid.fits(capacity)
    result = PlanResult(grid.model.name, gpus, capacity, grid.searched, int(fits.sum()))
    order = grid.ranking(capacity, top)
    for i in order:
        result.configs.append(grid.config(int(i), capacity))
    return result


def _cost_terms(r, pp, sch, v, fam, flops, p_dense, p_expert, n_moe, m, s, gb, gpus, cost: CostModel) -> dict:
    dp, tp, cp, ep, etp, z, b, M = (r[:, j].astype(np.float64) for j in range(8))
    layers = m.num_hidden_layers
    bubble = _bubble(sch, pp, v, r[:, 7])
    rec = _recompute_fraction(fam.train.recompute, flops, layers, pp * v)
    recompute = np.full(len(r), rec)
    a = cost.act_bytes
    h = m.hidden_size
    layer_mb = M * layers / pp                        # layer-micro-batches one GPU runs per step
    tp_bytes = np.where(tp > 1, layer_mb * 8 * (tp - 1) / tp * b * s / cp * h * a, 0.0)
    ep_bytes = M * n_moe / pp * 4 * (b * s / (cp * tp)) * (m.num_experts_per_tok or 0) * h * a * (ep - 1) / ep
    copies = 2 if sch is Schedule.DUALPIPE else 1
    g = recipe(fam.train.precision).gradients
    psi_dense = copies * p_dense / (pp * tp)
    psi_exp = copies * p_expert / (pp * ep * etp)
    d_ne, edp = dp * cp, dp * tp * cp / (ep * etp)
    k = np.where(z >= 3, 3.0, 2.0)
    dp_bytes = k * ((d_ne - 1) / d_ne * psi_dense + (edp - 1) / edp * psi_exp) * g
    kv = m.num_attention_heads * _qkv_width(m)
    cp_bytes = np.where(cp > 1, layer_mb * 2 * (cp - 1) / cp * b * s * kv / tp * a, 0.0)
    pp_bytes = np.where(pp > 1, 2 * M * (v if sch is Schedule.INTERLEAVED else 1) * b * s * h / (cp * tp) * a, 0.0)
    compute_s = np.full(len(r), 3 * flops["forward"] * gb * s / (gpus * cost.flops))
    node = cost.gpus_per_node
    comm_s = (tp_bytes / np.where(tp <= node, cost.nvlink, cost.network)
              + ep_bytes / np.where(ep * etp * tp <= node, cost.nvlink, cost.network)
              + cp_bytes / np.where(cp * tp <= node, cost.nvlink, cost.network)
              + dp_bytes / cost.network + pp_bytes / cost.network)
    step_s = compute_s * (1 + recompute) * (1 + bubble) + comm_s
    return {"bubble": bubble, "recompute": recompute, "tp_bytes": tp_bytes, "ep_bytes": ep_bytes, "cp_bytes": cp_bytes,
            "dp_bytes": dp_bytes, "pp_bytes": pp_bytes, "compute_s": compute_s, "comm_s": comm_s, "step_s": step_s}

