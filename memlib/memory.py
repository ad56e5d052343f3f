"""Per-device memory: everything one device of each pipeline stage holds, as named terms.

Allocated memory is parameters + gradients + optimizer states + activations (the micro-batches in
flight under the schedule, plus what the schedule and recomputation add at their peak); overheads
(CUDA context, communication buffers, fragmentation) are reported apart.  The *peak* is the stage
whose device needs the most.

>>> from memlib.config import PAPER_TRAINING
>>> est = estimate("deepseek-v3", PAPER_TRAINING)
>>> est.stages[1].parameters
6250364928
>>> est.stages[1].bytes["parameters"]
12500729856
>>> est.stages[1].activations["per_microbatch"]
24671158272
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .activations import Policy, ledger_bytes, parse_policy, training_values
from .ledgers import act_profile
from . import ledgers_hf  # noqa: F401  (registers the hf-eager activation profile)
from .breakdown import Breakdown
from .config import ConfigError, ModelConfig, TrainingConfig
from .overhead import Overheads
from .params import by_block
from .partition import Chunk, Partition, Stage
from .schedule import check_schedule, in_flight
from .states import model_states, optimizer_states, recipe

__all__ = ["StageMemory", "Estimate", "estimate", "ALLOCATED", "stage_formula"]

#: the byte terms that are tensors PyTorch allocates
ALLOCATED = ("parameters", "gradients", "optimizer_states", "activations")


@dataclass(frozen=True)
class StageMemory:
    """One device of one pipeline stage (rank)."""

    stage: Stage
    params: Breakdown            #: parameters stored on the device, per tensor (symbolic)
    parameters: int              #: their exact count
    bytes: dict[str, int]        #: parameters, gradients, optimizer_states, activations, overhead
    optimizer: dict[str, int]    #: optimizer-state bytes per state (master copy, moments)
    components: dict[str, int]   #: stored parameters per block (attention, routed_experts, ...)
    activations: dict            #: per_microbatch, microbatches_in_flight, extras, by_entry, chunks
    overheads: dict[str, int]    #: cuda_context, comm_buffers, fragmentation

    @property
    def model_states(self) -> int:
        """Parameters + gradients + optimizer states (the paper's Table 8 quantity)."""
        return self.bytes["parameters"] + self.bytes["gradients"] + self.bytes["optimizer_states"]

    @property
    def allocated(self) -> int:
        return sum(self.bytes[k] for k in ALLOCATED)

    @property
    def total(self) -> int:
        return self.allocated + self.bytes["overhead"]


class Estimate:
    """The memory of every stage of a model under a training configuration."""

    def __init__(self, model: ModelConfig | str, train: TrainingConfig, overhead: Overheads | None = None,
                 capacity: int | None = None):
        self.partition = Partition(model, train)
        self.model = self.partition.model
        self.train = train
        self.recipe = recipe(train.precision)
        check_schedule(train)
        self.act_profile = act_profile(train.profile, train)
        for axis in self.act_profile.no_parallel:
            if getattr(train, axis) != 1:
                raise ConfigError(f"{axis}={getattr(train, axis)} must be 1 under profile={train.profile} "
                                  f"(that implementation has no such parallelism)")
        self.policy: Policy = parse_policy(train.recompute)
        if self.recipe.recompute and not self.policy.full:
            # a recipe that recomputes by itself (deepseek-v3: the SwiGLU output) adds its modules
            self.policy = Policy(self.policy.name, self.policy.modules | self.recipe.recompute)
        unknown = sorted(self.policy.modules - self.act_profile.modules)
        if unknown:
            raise ConfigError(f"recompute={train.recompute!r}: module {unknown[0]} is not known to the "
                              f"{train.profile} profile ({', '.join(sorted(self.act_profile.modules))})")
        t = train
        if t.seq_len % t.cp:
            raise ConfigError(f"seq_len={t.seq_len} must be divisible by cp={t.cp} (context parallelism splits the sequence)")
        if t.sp and t.tp > 1 and t.seq_len % (t.cp * t.tp):
            raise ConfigError(f"seq_len={t.seq_len} must be divisible by cp*tp={t.cp * t.tp} "
                              f"(sequence parallelism splits each CP shard over the TP ranks)")
        self.overhead = overhead if overhead is not None else Overheads()
        self.capacity = capacity
        self.values = {**self.partition.values, **training_values(train)}

    # -- activations ------------------------------------------------------------------------------
    def _layer(self, kind: str, policy: Policy | None) -> dict[str, int]:
        key = (kind, policy)
        cache = self.__dict__.setdefault("_layer_cache", {})
        if key not in cache:
            ledger = self.act_profile.layer(self.model, kind)
            cache[key] = ledger_bytes(ledger, self.train, self.recipe, policy).evaluate(self.values)
        return cache[key]

    def _extra(self, name: str, ledger, policy: Policy | None = None) -> dict[str, int]:
        cache = self.__dict__.setdefault("_extra_cache", {})
        if (name, policy) not in cache:
            cache[(name, policy)] = ledger_bytes(ledger, self.train, self.recipe, policy).evaluate(self.values)
        return cache[(name, policy)]

    def chunk_activations(self, chunk: Chunk) -> tuple[dict[str, int], int]:
        """Bytes per entry of one micro-batch through ``chunk``, and the working set a recomputed
        layer re-materialises during its backward (0 without full recomputation)."""
        m, pol = self.model, self.policy
        by_entry: dict[str, int] = {}

        def add(d: dict[str, int], times: int = 1):
            for k, x in d.items():
                by_entry[k] = by_entry.get(k, 0) + times * x

        if chunk.first:
            add(self._extra("embedding", self.act_profile.embedding(m)))
        working = 0
        # what a layer keeps when it is not fully recomputed: everything but the recipe's own recompute
        base = Policy("recipe", self.recipe.recompute) if self.recipe.recompute else None
        for pos, i in enumerate(chunk.layers):
            kind = m.layer_kinds[i]
            recomputed = pol.full and (pol.block_layers is None or pos < pol.block_layers)
            if pol.full and not recomputed:
                add(self._layer(kind, base))
                continue
            add(self._layer(kind, pol))
            if recomputed:
                working = max(working, sum(self._layer(kind, base).values()) - sum(self._layer(kind, pol).values()))
        if chunk.last:
            add(self._extra("head", self.act_profile.head(m)))
            if self.partition.profile.include_mtp:
                for j in range(m.num_nextn_predict_layers):
                    # the MTP block is a decoder layer: the same recompute policy applies to it
                    add(self._extra(f"mtp{j}", self.act_profile.mtp(m, j), pol))
        return by_entry, working

    def _activations(self, st: Stage) -> dict:
        counts, extra_chunk = in_flight(self.train, st)
        chunks, by_entry, working = [], {}, 0
        for c, n in zip(st.chunks, counts):
            entries, w = self.chunk_activations(c)
            per_mb = sum(entries.values())
            chunks.append({"stage": c.index, "layers": list(c.layers), "per_microbatch": per_mb, "in_flight": n})
            for k, x in entries.items():
                by_entry[k] = by_entry.get(k, 0) + x
            working = max(working, w)
        # DualPipe's overlapped forward-and-backward step holds one more micro-batch of a chunk
        schedule_extra = max(c["per_microbatch"] for c in chunks) if extra_chunk == -2 else 0
        in_flight_bytes = sum(c["per_microbatch"] * c["in_flight"] for c in chunks)
        return {
            "per_microbatch": sum(by_entry.values()),
            "microbatches_in_flight": sum(counts) + (1 if extra_chunk == -2 else 0),
            "schedule_extra": schedule_extra,
            "recompute_working_set": working,
            "by_entry": by_entry,
            "chunks": chunks,
            "total": in_flight_bytes + schedule_extra + working,
        }

    # -- stages -----------------------------------------------------------------------------------
    @cached_property
    def stages(self) -> list[StageMemory]:
        part, out = self.partition, []
        for st in part.stages:
            params = part.params(st)
            b = model_states(part, st).evaluate()
            act = self._activations(st)
            b["activations"] = act.pop("total")
            allocated = sum(b[k] for k in ALLOCATED)
            ovh = self.overhead.terms(allocated)
            b["overhead"] = sum(ovh.values())
            out.append(StageMemory(
                stage=st,
                params=params,
                parameters=params.evaluate_total(part.values),
                bytes=b,
                optimizer=optimizer_states(part, st).evaluate(),
                components=by_block(params).evaluate(part.values),
                activations=act,
                overheads=ovh,
            ))
        return out

    @property
    def peak(self) -> StageMemory:
        """The stage whose device needs the most bytes (the first such, on a tie)."""
        return max(self.stages, key=lambda s: (s.total, -s.stage.index))

    def fits(self, stage: StageMemory) -> bool | None:
        return None if self.capacity is None else stage.total <= self.capacity

    def to_dict(self) -> dict:
        """The CLI's JSON contract (see ``memlib estimate --json``)."""
        cfg = {**self.train.values(), "layout": list(self.partition.layout),
               "overhead": {"cuda_context": self.overhead.cuda_context, "comm_buffers": self.overhead.comm_buffers,
                            "fragmentation": str(self.overhead.fragmentation)}}
        stages = []
        for s in self.stages:
            d = {
                "stage": s.stage.index,
                "layers": list(s.stage.layers),
                "parameters": s.parameters,
                "components": s.components,
                "bytes": {**s.bytes, "total": s.total},
                "allocated": s.allocated,
                "optimizer_states": s.optimizer,
                "activations": s.activations,
                "overheads": s.overheads,
            }
            if self.capacity is not None:
                d["fits"] = self.fits(s)
            stages.append(d)
        out = {"model": self.model.name, "config": cfg, "stages": stages,
               "peak": {"stage": self.peak.stage.index, "bytes": self.peak.total}}
        if self.capacity is not None:
            out["capacity"] = self.capacity
            out["fits"] = all(self.fits(s) for s in self.stages)
        return out


def stage_formula(est: "Estimate", index: int, keep=("DP", "TP", "EP", "ETP", "CP", "b", "s")) -> Breakdown:
    """Allocated bytes of one device of stage ``index`` as a formula in the symbols named by ``keep``
    (everything else substituted): model states and in-flight activations under 1F1B/GPipe.

    The layout, schedule, recompute policy and precision are those of ``est``; divisibility is the
    caller's business (use it for sweeps over valid configurations, e.g. with ``lambdify``).
    """
    import sympy as sp

    from .activations import entry_bytes
    from .states import states_formula
    from .symbols import sym

    part, t = est.partition, est.train
    st = part.stages[index]
    if len(st.chunks) != 1 or est.policy.full and est.policy.block_layers is not None:
        raise ConfigError("stage_formula covers one chunk per device (gpipe, 1f1b) and per-layer policies")
    keep_syms = {sym(k) for k in keep}
    fixed = {k: x for k, x in est.values.items() if k not in keep_syms}
    params = part.params(st)
    edp_keys = part.edp_keys(st)
    p_ne = params.select(lambda k: k not in edp_keys).total
    p_e = params.select(lambda k: k in edp_keys).total
    EDP = sym("DP") * sym("TP") * sym("CP") / (sym("EP") * sym("ETP"))
    states = states_formula(t.zero, est.recipe).map(
        lambda e: e.xreplace({sym("P_ne"): p_ne, sym("P_e"): p_e, sym("EDP"): EDP}))
    counts, _ = in_flight(t, st)
    chunk = st.chunks[0]
    m, ap = est.model, est.act_profile
    ledgers = [e for i in chunk.layers for e in ap.layer(m, m.layer_kinds[i]) if not est.policy.drops(e)]
    if chunk.first:
        ledgers += ap.embedding(m)
    if chunk.last:
        ledgers += ap.head(m)
    act = sum((entry_bytes(e, t, est.recipe) for e in ledgers), start=0) * counts[0]
    working = sp.Integer(0)
    if est.policy.full:
        working = sp.Max(0, *(sum((entry_bytes(e, t, est.recipe) for e in ap.layer(m, k) if est.policy.drops(e)),
                                  start=0) for k in {m.layer_kinds[i] for i in chunk.layers}))
    out = Breakdown({**states, "activations": act, "recompute_working_set": working})
    return out.map(lambda e: e.xreplace(fixed))


def estimate(model: ModelConfig | str, train: TrainingConfig, overhead: Overheads | None = None,
             capacity: int | None = None) -> Estimate:
    """Per-stage, per-device memory of ``model`` trained under ``train``."""
    return Estimate(model, train, overhead, capacity)
