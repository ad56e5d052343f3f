"""``memlib plan``: every parallel configuration of N GPUs that fits, ranked by a predicted step time.

For a model, N GPUs, a capacity and a global batch, :func:`search` enumerates every parallel
configuration (DP TP PP CP EP ETP, ZeRO stage, micro-batch, recompute policy, precision, profile,
schedule, layout rule) that the library's rules allow in a :class:`Space` (by default the practical one,
:data:`SPACE_RULES`), computes each one's peak with :mod:`memlib.search.compiled`
(:func:`memlib.device.estimate.estimate`'s ``peak.total``, to the byte) and its predicted step with
:mod:`memlib.search.cost` (named terms: computation, each parallelism's exposed communication, the bubble, the
data-parallel synchronisation, the optimizer step); :func:`plan` ranks those that fit.

The derivation, with its sources (file:line), is in ``docs/derivations/plan.md``.
"""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Iterable, Mapping, Sequence

import numpy as np

from .compiled import Family, stage_signature
from ..config.strategies import CP_A2A
from ..config import (LIMITS, ConfigError, ModelConfig, Schedule, TrainingConfig, ZeroStage, check_count, load_model,
                      parse_count, show)
from ..model.profiles import profile
from ..ledgers.base import parse_policy
from ..device.estimate import config_values, estimate, ledger_entries
from ..device.overhead import Overheads
from ..model.partition import balanced_layout, default_layout
from ..device.peak import COMPUTE_CAPABILITY, Framework
from ..device.schedule import replay_size
from ..config.precision import recipe
from ..model.states import P_e, P_ne
from .cost import COST_TERMS, TIE_BAND, CostModel, rank_work, step_terms

__all__ = ["CostModel", "step_cost", "Space", "SearchSpace", "SPACE_RULES", "PRACTICAL", "FULL", "PlanResult", "Grid", "search", "plan", "FIXABLE",
           "DEFAULT_GLOBAL_BATCH", "parse_fix", "LAYOUT_RULES", "fine_grained"]

#: DeepSeek-V3's global batch (sequences of 4096 tokens) for most of its pre-training (arXiv 2412.19437 §4.2)
DEFAULT_GLOBAL_BATCH = 15360

#: the most GPUs plan searches
MAX_GPUS = 2**20

#: the knobs ``--fix`` may pin, with the option name they are given by
FIXABLE = ("dp", "tp", "pp", "ep", "etp", "cp", "zero", "b", "vpp")
LAYOUT_RULES = ("default", "balanced")


#: the practical space's rules: field of :class:`Space` -> (what it keeps, its source)
SPACE_RULES: dict[str, tuple[str, str]] = {
    "tp_in_node": ("TP at most the GPUs of a node (gpus_per_node)",
                   "Narayanan et al. 2021 (arXiv 2104.04473) §3.3, takeaway 1: tensor parallelism up to the GPUs of a "
                   "server, pipeline parallelism across servers"),
    "min_cp_tokens": ("at least min_cp_tokens tokens per CP rank (s / CP)",
                      "Megatron-LM docs/user-guide/parallelism-guide.md: context parallelism for long sequences (8K+ "
                      "tokens); features/context_parallel.md: 8K tokens over CP 2, 4K per GPU"),
    "etp1_fine_grained": ("ETP 1 for fine-grained experts (narrower than the hidden size, h_E < h)",
                          "Megatron-LM megatron/core/transformer/moe/README.md: --expert-tensor-parallel-size "
                          "recommended 1 for fine-grained MoE models (MoE Parallel Folding: better GEMM efficiency, "
                          "less communication)"),
    "megatron_zero": ("the megatron profile's ZeRO 0 and 1: Megatron-Core's DDP and distributed optimizer, whose "
                      "buffers that profile models (memlib.device.peak)",
                      "Megatron-LM megatron/training/arguments.py: --use-distributed-optimizer; ZeRO 2 and 3 only "
                      "through Megatron-FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads | "
                      "optim_grads_params)"),
}


@dataclass(frozen=True)
class Space:
    """The practical search space: each rule of :data:`SPACE_RULES` on (True, or the least tokens per CP rank), or
    off (False, 1); :data:`FULL` has none.  A knob fixed by ``fix``, or ZeRO stages asked for by ``zeros``, bypass
    the rule on it."""

    tp_in_node: bool = True
    min_cp_tokens: int = 4096
    etp1_fine_grained: bool = True
    megatron_zero: bool = True

    def __post_init__(self):
        n = self.min_cp_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"min_cp_tokens={show(n)} must be a positive integer (1: no rule)")


PRACTICAL = Space()
FULL = Space(tp_in_node=False, min_cp_tokens=1, etp1_fine_grained=False, megatron_zero=False)


@dataclass(frozen=True)
class SearchSpace:
    """What one search enumerates, parsed and checked once when it is built: the sequence and the global batch, the
    profiles, precision recipes and recompute policies (by name, each checked against the library), the schedules
    (:class:`~memlib.config.Schedule`), the ZeRO stages (:class:`~memlib.config.ZeroStage`; None: every stage, the
    ``megatron`` profile's 0 and 1 under ``rules.megatron_zero``), the layout rules, the knobs pinned by ``fix``
    (:func:`parse_fix`), the largest micro-batch and V, and the practical space's ``rules`` (:class:`Space`).

    >>> s = SearchSpace(schedules=("1f1b", "interleaved"), zeros=[1, 0, 1])
    >>> s.schedules, s.zeros
    ((<Schedule.ONE_F_ONE_B: '1f1b'>, <Schedule.INTERLEAVED: 'interleaved'>), (<ZeroStage.NONE: 0>, <ZeroStage.OS: 1>))
    >>> s.stages(megatron=True), SearchSpace().stages(megatron=True)
    ((<ZeroStage.NONE: 0>, <ZeroStage.OS: 1>), (<ZeroStage.NONE: 0>, <ZeroStage.OS: 1>))
    """

    seq_len: int = 4096
    global_batch: int = DEFAULT_GLOBAL_BATCH
    profiles: tuple[str, ...] = ("megatron",)
    precisions: tuple[str, ...] = ("megatron",)
    recomputes: tuple[str, ...] = ("none", "selective", "full")
    schedules: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED, Schedule.DUALPIPE)
    zeros: tuple[ZeroStage, ...] | None = None
    layout_rules: tuple[str, ...] = LAYOUT_RULES
    fix: Mapping[str, int] = field(default_factory=dict)
    max_micro_batch: int = 16
    max_vpp: int = 4
    rules: Space = PRACTICAL

    def __post_init__(self):
        # every size bounded before any work (LIMITS): each bound is searched in seconds
        check_count("global_batch", self.global_batch, bound=LIMITS["global_batch"])
        check_count("seq_len", self.seq_len, bound=LIMITS["seq_len"])
        check_count("max_micro_batch", self.max_micro_batch, bound=LIMITS["micro_batch"])
        check_count("max_vpp", self.max_vpp, minimum=2, bound=LIMITS["max_vpp"])
        for rule in self.layout_rules:
            if rule not in LAYOUT_RULES:
                raise ConfigError(f"layout_rule={show(rule)} must be one of {', '.join(LAYOUT_RULES)}")
        if not isinstance(self.rules, Space):
            raise ConfigError("rules must be a memlib.search.plan.Space")
        fix = dict(self.fix or {})
        zeros = None
        if self.zeros is not None:
            for z in self.zeros:
                if isinstance(z, bool) or z not in (0, 1, 2, 3):
                    raise ConfigError(f"zero={show(z)} must be one of 0, 1, 2, 3")
            zeros = tuple(sorted({ZeroStage(z) for z in self.zeros}))
        for name in self.schedules:
            if name not in {s.value for s in Schedule}:
                raise ConfigError(f"schedule={show(name)} must be one of {', '.join(s.value for s in Schedule)}")
        # every name of the lists is one the library knows (a family it rejects for a model is skipped by search)
        for prof in self.profiles:
            profile(prof)
        for prec in self.precisions:
            recipe(prec)
        for rc in self.recomputes:
            parse_policy(rc)
        for key in FIXABLE:
            if key in fix:
                check_count(f"fix={key}", fix[key], minimum=0 if key == "zero" else 1)
        if "zero" in fix and fix["zero"] not in (0, 1, 2, 3):
            raise ConfigError(f"fix=zero={fix['zero']} must be one of 0, 1, 2, 3")
        schedules = tuple(Schedule(x) for x in self.schedules)
        _check_fix(fix, zeros if zeros is not None else tuple(ZeroStage), schedules, self.max_micro_batch,
                   self.max_vpp)
        for name, value in (("profiles", tuple(self.profiles)), ("precisions", tuple(self.precisions)),
                            ("recomputes", tuple(self.recomputes)), ("schedules", schedules), ("zeros", zeros),
                            ("layout_rules", tuple(self.layout_rules)), ("fix", fix)):
            object.__setattr__(self, name, value)

    def stages(self, megatron: bool) -> tuple[ZeroStage, ...]:
        """The ZeRO stages searched for a family (``megatron``: of the ``megatron`` profile): the pinned one, those
        asked for, or every stage (the megatron profile's 0 and 1 under the practical rule)."""
        if "zero" in self.fix:
            return (ZeroStage(self.fix["zero"]),)
        if self.zeros is not None:
            return self.zeros
        return tuple(z for z in ZeroStage if z <= ZeroStage.OS or not (megatron and self.rules.megatron_zero))


@dataclass
class PlanResult:
    model: str
    gpus: int
    capacity: int
    searched: int
    fitting: int
    configs: list[dict] = field(default_factory=list)
    cost_model: dict = field(default_factory=dict)      #: :meth:`memlib.search.cost.CostModel.values`
    space: dict = field(default_factory=dict)           #: the :class:`Space`'s rules

    def to_dict(self) -> dict:
        return {"model": self.model, "gpus": self.gpus, "capacity": self.capacity, "searched": self.searched,
                "fitting": self.fitting, "cost_model": self.cost_model, "space": self.space, "configs": self.configs}


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
    cost_model: CostModel
    space: Space
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

    def priced(self, cost: CostModel) -> "Grid":
        """The same rows and peaks with the cost terms of another :class:`~memlib.search.cost.CostModel` (another
        GPU: its peaks are the same bytes)."""
        out = replace(self, cost_model=cost, cost={k: np.empty(self.searched) for k in COST_TERMS})
        for gi in np.unique(self.group):
            idx = np.flatnonzero(self.group == gi)
            fam, pp, sch, v, rule, lay = self.groups[int(gi)]
            terms = _group_cost(fam, fam.pipeline(pp, sch, v, lay), self.rows[idx], self.seq_len, cost)
            for k in COST_TERMS:
                out.cost[k][idx] = terms[k]
        return out

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
        fw = Framework(compute_capability=COMPUTE_CAPABILITY[self.cost_model.gpu.name])
        return {"config": config_values(self.train(i), pipe.layout, fw, self.overhead),
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
            try:
                n = parse_count(key, value, minimum=0)
            except ConfigError as exc:
                raise ConfigError(f"fix={show(part)}: {exc}") from None
            if key in out and out[key] != n:
                raise ConfigError(f"fix={show(part)}: {key} is fixed twice ({out[key]} and {n})")
            out[key] = n
    return out


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in increasing order (trial division to its square root: ``n`` is at most a bounded
    count, :data:`~memlib.config.LIMITS`)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


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


def _check_fix(fix: Mapping[str, int], zeros: Sequence[ZeroStage], schedules: Sequence[Schedule],
               max_micro_batch: int, max_vpp: int) -> None:
    """A pinned knob outside what the other options search is an error naming both (it would otherwise
    replace the list, or leave nothing to search)."""
    if "zero" in fix and fix["zero"] not in zeros:
        raise ConfigError(f"fix=zero={fix['zero']} contradicts zero={','.join(map(str, zeros))}: pin a stage "
                          f"of the list (or list it)")
    if "b" in fix and fix["b"] > max_micro_batch:
        raise ConfigError(f"fix=b={fix['b']} exceeds max_micro_batch={max_micro_batch}")
    if "vpp" in fix:
        v = fix["vpp"]
        if v > 1 and Schedule.INTERLEAVED not in schedules:
            raise ConfigError(f"fix=vpp={v} needs the interleaved schedule, not among schedule={','.join(schedules)}")
        if v > max_vpp:
            raise ConfigError(f"fix=vpp={v} exceeds max_vpp={max_vpp}")
        if v == 1 and all(x is Schedule.INTERLEAVED for x in schedules):
            raise ConfigError(f"fix=vpp=1 contradicts schedule={','.join(schedules)} (V >= 2 chunks per rank)")


def _schedule_variants(schedules: Sequence[Schedule], pp: int, layers: int, max_vpp: int, fix: Mapping) -> list:
    out = []
    for sch in schedules:
        if sch is Schedule.INTERLEAVED:
            if pp < 2:
                continue
            # only pp * v <= layers can give every chunk a layer: the loop ends there
            for v in range(2, min(max_vpp, layers // pp) + 1):
                if fix.get("vpp", v) == v:
                    out.append((sch, v))
        elif fix.get("vpp", 1) == 1:
            if sch is Schedule.DUALPIPE and (pp < 2 or pp % 2):
                continue
            out.append((sch, 1))
    # a pipeline whose replay memlib refuses (LIMITS' replay: too many stages and chunks) is not searched
    return [(sch, v) for sch, v in out
            if replay_size(TrainingConfig(pp=pp, vpp=v, schedule=sch)) <= LIMITS["replay"]]


def fine_grained(m: ModelConfig) -> bool:
    """Whether ``m``'s routed experts are fine-grained, narrower than the hidden size (h_E < h): the experts the
    practical space keeps at ETP 1."""
    return m.has_moe and (m.moe_intermediate_size or 0) < m.hidden_size


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


def search(model: ModelConfig | str, gpus: int, space: SearchSpace = SearchSpace(), *, overhead: Overheads | None = None,
           cost: CostModel = CostModel(), progress: bool = False) -> "Grid":
    """Every valid configuration of ``gpus`` GPUs in ``space`` (:class:`SearchSpace`; module docstring), each with its
    exact peak and its cost terms (:mod:`memlib.search.cost`): a :class:`Grid`, whatever the capacity."""
    m = load_model(model)
    overhead = overhead if overhead is not None else Overheads()
    check_count("gpus", gpus, bound=MAX_GPUS)
    if not isinstance(space, SearchSpace) or not isinstance(cost, CostModel):
        raise ConfigError("space must be a memlib.search.plan.SearchSpace and cost a memlib.search.cost.CostModel")
    fix, seq_len, global_batch, rules = space.fix, space.seq_len, space.global_batch, space.rules

    # families: (profile, precision, recompute); the ones the library rejects are skipped
    families, first_error = [], None
    for prof in space.profiles:
        for prec in space.precisions:
            for rc in space.recomputes:
                try:
                    t = TrainingConfig(profile=prof, precision=prec, recompute=rc, seq_len=seq_len,
                                       cp_comm_type=cost.cp_comm)
                    fam = Family.of(m, t, overhead)
                    axes = _axes(m, t, gpus)
                    wide = tuple(c for c in axes.cp if c > 1)
                    if t.cp_comm_type in CP_A2A and wide:
                        # the all-to-all's extra attention output exists only with CP > 1: those rows get the
                        # family built at CP > 1 (Family.canonical), the others this one
                        families.append((Family.of(m, t.with_(cp=wide[0], seq_len=seq_len), overhead),
                                         replace(axes, cp=wide)))
                        axes = replace(axes, cp=tuple(c for c in axes.cp if c == 1))
                except ConfigError as exc:
                    first_error = first_error or exc
                    continue
                families.append((fam, axes))
    if not families:
        raise first_error
    # the practical space's rules (Space), each bypassed by the knob's fix
    node = cost.gpu.gpus_per_node
    tp_max = node if rules.tp_in_node and "tp" not in fix else gpus
    min_cp_tokens = rules.min_cp_tokens if "cp" not in fix else 1
    etp_one = rules.etp1_fine_grained and fine_grained(m) and "etp" not in fix

    # parallel rows per PP: (dp, tp, cp, ep, etp, zero, b, M)
    def rows_for(pp: int, axes: _Axes, sp_on: bool, zeros_here: tuple[ZeroStage, ...]):
        zs = np.asarray(zeros_here, dtype=np.int64)
        rest = gpus // pp
        out = []            # blocks of rows: every ZeRO stage by every micro-batch size of one parallel split
        for tp in axes.tp:
            if rest % tp or fix.get("tp", tp) != tp or tp > tp_max:
                continue
            for cp in axes.cp:
                if (rest // tp) % cp or fix.get("cp", cp) != cp or (cp > 1 and seq_len // cp < min_cp_tokens):
                    continue
                if sp_on and tp > 1 and seq_len % (cp * tp):
                    continue
                dp = rest // (tp * cp)
                if fix.get("dp", dp) != dp or global_batch % dp:
                    continue
                per_dp = global_batch // dp
                bs = np.asarray([b for b in _divisors(per_dp) if b <= space.max_micro_batch and fix.get("b", b) == b],
                                dtype=np.int64)
                zb = np.stack([np.repeat(zs, len(bs)), np.tile(bs, len(zs))], axis=1)
                tail = np.column_stack([zb, per_dp // zb[:, 1]])
                heads = [(dp, tp, cp, ep, etp) for ep in axes.ep if fix.get("ep", ep) == ep
                         for etp in ((1,) if etp_one else sorted({1, tp})) if etp in axes.etp
                         and fix.get("etp", etp) == etp
                         and (dp * tp * cp) % (ep * etp) == 0]
                if heads and len(tail):          # every (EP, ETP) of this split by every (ZeRO, b, M)
                    head = np.repeat(np.asarray(heads, dtype=np.int64), len(tail), axis=0)
                    out.append(np.concatenate([head, np.tile(tail, (len(heads), 1))], axis=1))
        return np.concatenate(out) if out else np.zeros((0, 8), dtype=np.int64)

    pps = [p for p in _divisors(gpus) if p <= m.num_hidden_layers and fix.get("pp", p) == p]
    groups = []
    for fam, axes in families:
        zeros_here = space.stages(profile(fam.train.profile).partition.megatron_kernels)
        for pp in pps:
            rows = rows_for(pp, axes, fam.train.sp, zeros_here)
            if not len(rows):
                continue
            for sch, v in _schedule_variants(space.schedules, pp, m.num_hidden_layers, space.max_vpp, fix):
                for rule, lay in _layouts(m.num_hidden_layers, pp * v, space.layout_rules):
                    groups.append((fam, pp, sch, v, rule, lay, rows))
    # the search's work grows with the pipeline stages it evaluates (each over its rows): bounded before it starts
    stages = sum(g[1] for g in groups)
    if stages > LIMITS["plan_stages"]:
        raise ConfigError(f"gpus={gpus}: the search holds {len(groups):,} pipelines of {stages:,} stages in all, more "
                          f"than {LIMITS['plan_stages']:,} that plan evaluates in seconds; pin pp (fix pp=N) or search "
                          f"fewer schedules, layout rules, policies, precisions or profiles")

    bar = _progress(len(groups), progress)
    parts = []      # (rows, peak, stage, group index) of every searched row
    caches: dict[tuple, dict] = {}      # per family, PP and the schedule's rule on M: the same rows
    for gi, (fam, pp, sch, v, _rule, lay, rows) in enumerate(groups):
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

    names = COST_TERMS
    grid = Grid(m, gpus, seq_len, global_batch, overhead, cost, rules, [g[:6] for g in groups],
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
    for r, _, _, gi in parts:            # each group's terms written into its slice of the columns
        fam, pp, sch, v, _rule, lay = groups[gi][:6]
        terms = _group_cost(fam, fam.pipeline(pp, sch, v, lay), r, seq_len, cost)
        for k in names:
            grid.cost[k][start:start + len(r)] = terms[k]
        start += len(r)
    return grid


def plan(model: ModelConfig | str, gpus: int, capacity: int, space: SearchSpace = SearchSpace(), *,
         top: int | None = 10, **options) -> PlanResult:
    """Every valid configuration of ``gpus`` GPUs in ``space`` (:func:`search`, ``options`` its other keywords:
    overhead, cost, progress), those whose peak stage fits ``capacity`` bytes, the best ``top`` of them (None: all)
    by the cost model (module docstring)."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise ConfigError(f"top={show(top)} must be a non-negative integer (or None: every configuration)")
    if top is not None:
        check_count("top", top, minimum=0, bound=LIMITS["top"])
    grid = search(model, gpus, space, **options)
    fits = grid.fits(capacity)
    result = PlanResult(grid.model.name, gpus, capacity, grid.searched, int(fits.sum()),
                        cost_model=grid.cost_model.values(), space=asdict(grid.space))
    order = grid.ranking(capacity, top)
    for i in order:
        c = grid.config(int(i), capacity)
        c["tie"] = bool(c["cost"]["step_s"] <= (1 + TIE_BAND) * float(grid.cost["step_s"][order[0]]))
        result.configs.append(c)
    return result


def step_cost(model: ModelConfig | str, train: TrainingConfig, cost: CostModel = CostModel(),
              overhead: Overheads | None = None) -> dict[str, float]:
    """The step-time terms of one configuration (as :func:`search` prices each of its rows)."""
    m = load_model(model)
    fam = Family.of(m, train, overhead)
    pipe = fam.pipeline(train.pp, train.schedule, train.vpp, train.layout)
    if train.num_microbatches is None:
        raise ConfigError("num_microbatches=None: the step time needs the micro-batches per step")
    row = np.array([[train.dp, train.tp, train.cp, train.ep, train.etp, train.zero, train.micro_batch,
                     train.num_microbatches]], dtype=np.int64)
    return {k: float(v[0]) for k, v in _group_cost(fam, pipe, row, train.seq_len, cost).items()}


_WORKS: dict[tuple, list] = {}       #: each pipeline's ranks' work (memlib.search.cost.RankWork), kept


def _group_cost(fam: Family, pipe, r: np.ndarray, seq_len: int, cost: CostModel) -> dict:
    """The step-time terms (:func:`memlib.search.cost.step_terms`) of a group's rows: each rank's work (kept with the
    pipeline) and its parameters, the stage's P_ne and P_e of :meth:`~memlib.device.estimate.Estimate.stage_counts`
    compiled once per stage signature and evaluated on the rows' distinct (TP, EP, ETP)."""
    t = fam.train
    key = (fam.model, t.recompute, fam.base.partition.profile.include_mtp, seq_len, pipe.train.pp,
           pipe.train.schedule, pipe.train.vpp, tuple(pipe.layout))
    if key not in _WORKS:
        if len(_WORKS) > 4096:
            _WORKS.clear()
        distinct: dict = {}                 # ranks of the same layers do the same work: one each
        for st in pipe.stages:
            distinct.setdefault(stage_signature(fam.model, st), []).append(st)
        _WORKS[key] = [(rank_work(fam.model, sts[0], pipe.train.schedule, t.recompute, seq_len, key[2]), sts[0],
                        len(sts)) for sts in distinct.values()]
    knobs = {"tp": r[:, 1], "ep": r[:, 3], "etp": r[:, 4]}
    keys, inverse = np.unique(np.stack([knobs["tp"], knobs["ep"], knobs["etp"]], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    n = len(keys)
    env = {"dp": np.ones(n, dtype=np.int64), "tp": keys[:, 0], "ep": keys[:, 1], "etp": keys[:, 2],
           "cp": np.ones(n, dtype=np.int64), "micro_batch": np.ones(n, dtype=np.int64),
           "seq_len": np.full(n, seq_len, dtype=np.int64)}
    params = []
    for _, st, _ in _WORKS[key]:
        progs = fam.counts_program(st)
        params.append(tuple(np.asarray(progs[x](env, n), dtype=np.float64)[inverse] for x in (P_ne, P_e)))
    rows = dict(zip(("dp", "tp", "cp", "ep", "etp", "zero", "b", "M"), r.T))
    return step_terms(rows, [w for w, _, _ in _WORKS[key]], params, ranks=[k for _, _, k in _WORKS[key]], m=fam.model, pp=pipe.train.pp, schedule=pipe.train.schedule,
                      vpp=pipe.train.vpp, seq_len=seq_len, sp=t.sp, precision=fam.base.recipe, cost=cost,
                      overlap_grad_reduce=t.overlap_grad_reduce, moe_a2a_overlap=t.moe_a2a_overlap)
