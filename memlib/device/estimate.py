"""Per-device memory: everything one device of each pipeline stage holds, as named terms.

Allocated memory is parameters + gradients + optimizer states + activations; overheads (CUDA
context, communication buffers, fragmentation) are reported apart.  The *peak* is the stage whose
device needs the most.

Activations at a stage's peak come from a replay of its pipeline schedule
(:mod:`memlib.device.schedule`): at every moment a rank holds some micro-batches of each of its model
chunks, and the chunks computing then re-materialise what the recompute policy dropped (the
*recompute working set*).  The peak is the moment with the most bytes.

One path.  Every number here is a SymPy expression evaluated: :meth:`Estimate.stage_expressions`
builds a stage's terms from the partition, the precision recipe, the ledger and the schedule
replay, with any chosen symbols (TP, EP, b, s, ...) left free; :attr:`Estimate.stages` evaluates the
same terms with every symbol given, and :func:`stage_formula` returns them with some symbols kept
(for ``lambdify`` sweeps).  The two cannot disagree.

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

import itertools
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Mapping

import sympy as sp

from ..ledgers.base import Policy, Saved, element_bytes, entry_bytes, parse_policy, training_values
from ..model.profiles import act_profile
from ..core.breakdown import Breakdown, exact_int
from ..core.exact import NotCompilable, exact_function
from ..config import ConfigError, ModelConfig, TrainingConfig, show
from ..config.strategies import AttnBackend, CrossEntropyFusionImpl, Runtime
from ..config.versions import DEFAULT_VERSION, MegatronVersion, parse_version
from .overhead import Overheads
from .megatron_buffers import rerun_keeps_batches
from .peak import MIN_OFFLOADED_ELEMENTS, ChunkLoad, Framework, StagePeak, is_routed_entry, offloaded_entry, \
    persistent_terms, stage_peak
from ..model.params import by_block, values as model_values
from ..model.partition import Chunk, Partition, Stage, shard_divisor
from .schedule import Moment, check_schedule, moments
from .transient import FORWARD_CANDIDATES, Segment, candidates, embedding_backward_bytes, loss_kind, moe_copies, te_fused_softmax
from ..config.precision import Recipe
from ..model.states import P_e, P_ne, states_formula
from ..core.symbols import sym

__all__ = ["StageMemory", "Estimate", "estimate", "ALLOCATED", "stage_formula", "StageExpressions", "config_values"]

#: the byte terms that are tensors PyTorch allocates
ALLOCATED = ("parameters", "gradients", "optimizer_states", "activations")

#: EDP in terms of the other parallel sizes (Megatron-Core: DP TP CP / (EP ETP))
EDP_EXPR = sym("DP") * sym("TP") * sym("CP") / (sym("EP") * sym("ETP"))


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


@dataclass(frozen=True)
class StageExpressions:
    """A stage's terms as expressions (numbers once every symbol is substituted).

    ``chunks[c]`` is the per-entry bytes of one micro-batch through chunk ``c``; ``working[c]`` the
    bytes that chunk re-materialises while it computes; ``moments`` the candidate peak moments of
    the schedule replay."""

    stage: Stage
    states: Breakdown                      #: parameters, gradients, optimizer_states
    chunks: tuple[dict[str, sp.Expr], ...]
    working: tuple[sp.Expr, ...]
    moments: tuple[Moment, ...]

    def per_microbatch(self, c: int) -> sp.Expr:
        return sp.Add(*self.chunks[c].values())

    def candidate(self, mo: Moment) -> sp.Expr:
        """Activation bytes at moment ``mo``: the micro-batches held plus the working set of the
        chunks computing (the larger one when two compute in an overlapped step)."""
        held = sp.Add(*(n * self.per_microbatch(c) for c, n in enumerate(mo.counts)))
        return held + sp.Max(0, *(self.working[c] for c in mo.running))

    def activations(self) -> sp.Expr:
        return sp.Max(*(self.candidate(mo) for mo in self.moments))

    def breakdown(self) -> Breakdown:
        """Allocated bytes as named terms: the model states and the activations at the peak."""
        return Breakdown({**self.states, "activations": self.activations()})


_LEDGERS: dict = {}


def ledger_entries(model: ModelConfig, ap, name: str) -> list[Saved]:
    """The entries of the ledger ``name`` (``embedding``, ``layer.dense``, ``layer.moe``, ``head``, ``mtp.j``)
    of the bound activation profile ``ap``, without their bytes (a profile refuses a size it cannot bind
    here, with a :class:`~memlib.config.ConfigError`)."""
    if name.startswith("layer."):
        return ap.layer(model, name.split(".")[1])
    if name.startswith("mtp."):
        return ap.mtp(model, int(name.split(".")[1]))
    return {"embedding": ap.embedding, "head": ap.head}[name](model)


@lru_cache(maxsize=64)
def _version(text) -> MegatronVersion:
    """The Megatron-LM version of a run (``TrainingConfig.megatron_version``; None: the commit memlib pins)."""
    return parse_version(text or DEFAULT_VERSION)


def _sized(e: Saved, mv: Mapping) -> Saved:
    """``e`` with the model's sizes ``mv`` substituted in its elements and width."""
    return replace(e, elements=sp.sympify(e.elements).xreplace(mv),
                   width=None if e.width is None else sp.sympify(e.width).xreplace(mv))


def _ledger_bytes(model: ModelConfig, ap, rec: Recipe, sp_on: bool, name: str) -> dict[str, tuple[sp.Expr, Saved]]:
    """Entry key -> (bytes on one device with the model's sizes substituted, the entry) for the
    ledger ``name`` (``embedding``, ``layer.dense``, ``layer.moe``, ``head``, ``mtp.j``) of the bound
    activation profile ``ap``; cached by the model, the profile's name and binding key, the precision
    and sequence parallelism, which are all the entries' bytes depend on."""
    cache_key = (model, ap.name, ap.key, rec, sp_on, name)
    if cache_key not in _LEDGERS:
        if len(_LEDGERS) > 4096:
            _LEDGERS.clear()
        train = TrainingConfig(sp=sp_on)
        entries = ledger_entries(model, ap, name)
        mv = model_values(model)
        # the model's sizes go into an entry's elements and width first: SymPy then builds its ceilings over
        # numbers and the parallel sizes only, not over the model's symbols as well (the same expressions)
        _LEDGERS[cache_key] = {e.key: (sp.sympify(entry_bytes(_sized(e, mv), train, rec).xreplace(mv)), e)
                               for e in entries}
    return _LEDGERS[cache_key]


#: what does not change with the knobs, kept for the process: the symbolic terms of a stage's states, of a
#: chunk's entries and of a stage's parameters, and the functions that evaluate them exactly (keyed by what
#: they depend on: the model, the profile, the precision, the policy, ... and the kinds of the layers)
_PROGRAMS: dict = {}
_KEY_IDS: dict = {}
_NEXT_ID = itertools.count()


def _kept_program(key, build):
    if key not in _PROGRAMS:
        if len(_PROGRAMS) > 8192:
            _PROGRAMS.clear()
            _KEY_IDS.clear()
        _PROGRAMS[key] = build()
    return _PROGRAMS[key]


def _signature(model: ModelConfig, chunks) -> tuple:
    """The kinds of each chunk's layers and whether it holds the embedding and the head: all a chunk's (a
    stage's) terms depend on besides the configuration."""
    return tuple((tuple(model.layer_kinds[i] for i in c.layers), c.first, c.last) for c in chunks)


@dataclass(frozen=True)
class _Program:
    """Named expressions and one function that evaluates them all exactly (None: substitution only)."""

    names: tuple
    exprs: tuple
    symbols: tuple
    fn: object

    @staticmethod
    def of(named: Mapping) -> "_Program":
        names, exprs = tuple(named), tuple(sp.sympify(x) for x in named.values())
        symbols = tuple(sorted(set().union(*(e.free_symbols for e in exprs)), key=str)) if exprs else ()
        try:
            fn = exact_function(exprs, symbols)
        except NotCompilable:
            fn = None
        return _Program(names, exprs, symbols, fn)

    def __call__(self, values: Mapping) -> dict:
        """The exact value of each expression (ints and Fractions; SymPy numbers where substituted)."""
        if self.fn is not None and all(x in values for x in self.symbols):
            args = [values[x] for x in self.symbols]
            return dict(zip(self.names, self.fn(*(v if type(v) is int else int(v) if getattr(v, "is_Integer", False)
                                                   else v for v in args))))
        return {k: sp.sympify(e.xreplace(values)) for k, e in zip(self.names, self.exprs)}


#: a tensor's element count with the model's sizes substituted, an exact integer (per model, by expression)
_NUMELS: dict = {}


def _stage_counts(part: Partition, st: Stage) -> dict:
    """P_ne and P_e of one device of ``st`` with the model's sizes substituted: the parameters
    (:meth:`~memlib.model.partition.Partition.params`) that shard over DP CP and over EDP, each summed per divisor
    (TP, EP ETP or none) as exact integers and only then divided by it: the same expressions as summing
    :meth:`~memlib.model.partition.Partition.params` and substituting (SymPy collects the terms over one divisor
    alike), without SymPy arithmetic on every tensor of the stage."""
    experts, mv = part.edp_keys(st), part.model_values
    sums: dict = {P_ne: {}, P_e: {}}
    if len(_NUMELS) > 64:
        _NUMELS.clear()
    numels = _NUMELS.setdefault(part.model, {})
    for t, n in part.tensors(st):
        if t.kind == "buffer":
            continue
        key = t.numel
        if key not in numels:
            v = sp.sympify(sp.sympify(key).xreplace(mv))
            if not v.is_Integer:       # a count that is not a number of the model alone: the symbolic path
                params = part.params(st)
                return {P_ne: params.select(lambda k: k not in experts).total.xreplace(mv),
                        P_e: params.select(lambda k: k in experts).total.xreplace(mv)}
            numels[key] = int(v)
        kind = part.sharding(t)
        by_div = sums[P_e if t.key in experts else P_ne]
        by_div[kind] = by_div.get(kind, 0) + n * numels[key]
    return {x: sp.Add(*(sp.Integer(c) / shard_divisor(kind) for kind, c in by_div.items()))
            for x, by_div in sums.items()}


def _substituted(e: sp.Basic, rep: Mapping) -> sp.Basic:
    """``e.xreplace(rep)``, but for ceilings and floors, which are rebuilt unevaluated (SymPy's evaluation of
    a rounding over a symbolic sum asks its assumptions system for bounds: milliseconds a call)."""
    if e in rep:
        return rep[e]
    if not e.args:
        return e
    args = tuple(_substituted(a, rep) for a in e.args)
    if args == e.args:
        return e
    if isinstance(e, (sp.ceiling, sp.floor)) and args[0].free_symbols:
        return e.func(*args, evaluate=False)
    return e.func(*args)


def _as_int(x) -> int:
    """An exact value that must be an integer (as :func:`memlib.core.breakdown.exact_int` requires)."""
    if isinstance(x, int):
        return x
    return exact_int(x)


class Estimate:
    """The memory of every stage of a model under a training configuration."""

    def __init__(self, model: ModelConfig | str, train: TrainingConfig, overhead: Overheads | None = None,
                 capacity: int | None = None, framework: Framework | None = None):
        if framework is not None and not isinstance(framework, Framework):
            raise ConfigError(f"framework={show(framework)} must be a memlib.device.peak.Framework")
        self.framework = framework if framework is not None else Framework()
        self.partition = Partition(model, train)
        self.model = self.partition.model
        self.train = train
        self.recipe = train.recipe
        #: the recipe the saved activations follow: Megatron-LM's FP8 compute (``fp8``) caches Linear inputs
        #: in FP8 whatever the weights' precision
        self.act_recipe = self.recipe if train.fp8 is None or self.recipe.fp8_activations else \
            replace(self.recipe, fp8_activations=True, fp8_keeps_exceptions=True,
                    fp8_scaling={"mxfp8": "mx", "blockwise": "tile"}.get(train.fp8_recipe, "tensor"))
        check_schedule(train)
        self.act_profile = act_profile(train.profile, train)
        for axis in self.act_profile.no_parallel:
            if getattr(train, axis) != 1:
                raise ConfigError(f"{axis}={getattr(train, axis)} must be 1 under profile={train.profile} "
                                  f"(that implementation has no such parallelism)")
        self.policy: Policy = parse_policy(train.recompute)
        #: what a layer that is not fully recomputed drops: the recipe's own recompute (deepseek-v3:
        #: the SwiGLU output), and a module policy's modules
        self.base = Policy("recipe", self.recipe.recompute)
        if self.recipe.recompute and not self.policy.full:
            self.policy = Policy(self.policy.name, self.policy.modules | self.recipe.recompute)
        unknown = sorted(self.policy.modules - self.act_profile.modules)
        if unknown:
            raise ConfigError(f"recompute={show(train.recompute)}: module {unknown[0]} is not known to the "
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

    # -- ledgers, symbolic in the training and parallel symbols --------------------------------
    def _ledger(self, name: str, build) -> dict[str, tuple[sp.Expr, Saved]]:
        """Bytes of every entry of a ledger, model values substituted (cached for the model, the
        profile, the precision and sequence parallelism: nothing else changes them)."""
        return _ledger_bytes(self.model, self.act_profile, self.act_recipe, self.train.sp, name)

    @staticmethod
    def _kept(ledger, policy: Policy) -> dict[str, sp.Expr]:
        return {k: x for k, (x, e) in ledger.items() if not policy.drops(e)}

    def _scaled(self, key: str, x: sp.Expr) -> sp.Expr:
        """``x`` bytes of entry ``key`` on the busiest rank: routed-token entries scaled by the routing
        imbalance (whole bytes, rounded up)."""
        r = self.train.routing_imbalance
        if r != 1 and is_routed_entry(key):
            return sp.ceiling(sp.Rational(r.numerator, r.denominator) * x)
        return x

    def _dropped(self, ledger, policy: Policy) -> sp.Expr:
        """What ``policy`` re-materialises of ``ledger`` (its recompute working set): the entries it drops,
        not those that only a checkpoint keeps (``only_when``), which are never recomputed and, when the
        policy has no such checkpoint, do not exist."""
        return sp.Add(*(self._scaled(k, x) for k, (x, e) in ledger.items() if policy.drops(e) and not e.only_when))

    def chunk_parts(self, chunk: Chunk) -> tuple[list[tuple[int, str, Policy]], list[tuple[str, Policy]]]:
        """What one micro-batch through ``chunk`` is made of: ``(times, ledger, policy)``, the entries of
        ``ledger`` that ``policy`` keeps, ``times`` over (in the order :meth:`chunk_expressions` adds them),
        and ``(ledger, policy)``, the ledgers whose dropped entries the chunk re-materialises, one at a time."""
        m, pol = self.model, self.policy
        kept: list[tuple[int, str, Policy]] = []
        dropped: list[tuple[str, Policy]] = []
        if chunk.first:
            kept.append((1, "embedding", pol))
        kinds = [m.layer_kinds[i] for i in chunk.layers]
        if pol.full and pol.block_layers is not None:
            groups = [(kinds[:pol.block_layers], pol), (kinds[pol.block_layers:], self.base)]
        else:
            groups = [(kinds, pol)]
        for group, p in groups:
            for kind in ("dense", "moe"):
                n = group.count(kind)
                if n:
                    kept.append((n, f"layer.{kind}", p))
                    dropped.append((f"layer.{kind}", p))
        if chunk.last:
            kept.append((1, "head", pol))
            if self.partition.profile.include_mtp:
                for j in range(m.num_nextn_predict_layers):
                    # the MTP block is a decoder layer: the same recompute policy applies to it
                    kept.append((1, f"mtp.{j}", pol))
                    dropped.append((f"mtp.{j}", pol))
        return kept, dropped

    def part_expressions(self, name: str, policy: Policy) -> tuple[sp.Expr, sp.Expr]:
        """The bytes of the entries of ledger ``name`` that ``policy`` keeps (summed, as the busiest rank holds
        them) and of those it drops: the parts of :meth:`chunk_parts`."""
        led = self._ledger(name, None)
        return sp.Add(*(self._scaled(k, x) for k, x in self._kept(led, policy).items())), self._dropped(led, policy)

    def chunk_expressions(self, chunk: Chunk) -> tuple[dict[str, sp.Expr], sp.Expr]:
        """Bytes per entry of one micro-batch through ``chunk`` and the working set it re-materialises
        while computing: the most that one of its layers (or MTP blocks) drops under the policy.
        Symbolic in b, s and the parallel sizes; the same rule for every policy."""
        by_entry: dict[str, sp.Expr] = {}
        kept, dropped = self.chunk_parts(chunk)
        for times, name, p in kept:
            for k, x in self._kept(self._ledger(name, None), p).items():
                by_entry[k] = by_entry.get(k, 0) + times * self._scaled(k, x)
        drops = [self._dropped(self._ledger(name, None), p) for name, p in dropped]
        working = sp.Max(0, *drops) if drops else sp.Integer(0)
        return by_entry, working

    def saved_tensors(self, index: int) -> list[tuple[str, int, int]]:
        """Each tensor one micro-batch saves on stage ``index``, as it asks the allocator for it:
        ``(entry key, bytes, how many)`` per ledger and chunk (a layer's entries once per layer of the chunk)."""
        out = []
        for chunk in self.partition.stages[index].chunks:
            for times, name, p in self.chunk_parts(chunk)[0]:
                for k, x in self._kept(self._ledger(name, None), p).items():
                    out.append((k, int(sp.sympify(self._scaled(k, x)).xreplace(self.values)), times))
        return out

    # -- the one path ------------------------------------------------------------------------------
    def stage_counts(self, st: Stage) -> dict:
        """What :func:`memlib.model.states.states_formula` is written in, for one device of ``st``: P_ne and P_e
        (the parameters that shard over DP CP and over EDP), symbolic in TP, EP and ETP, and EDP in terms of
        the parallel sizes; kept per stage signature (every ZeRO stage asks for the same counts)."""
        kept = self.__dict__.setdefault("_stage_counts", {})
        sig = _signature(self.model, st.chunks)
        if sig not in kept:
            kept[sig] = {**_stage_counts(self.partition, st), sym("EDP"): EDP_EXPR}
        return kept[sig]

    def stage_states(self, st: Stage, zero: int | None = None, evaluate: bool = True) -> Breakdown:
        """Parameters, gradients and optimizer states of one device of ``st`` (any stage built from
        this partition's model and profile) under ZeRO stage ``zero`` (default: the configuration's),
        symbolic in the parallel sizes DP, TP, EP, ETP and CP.

        ``evaluate=False``: the sharded counts' ceilings are left as SymPy builds them from the formula,
        unsimplified.  Their values are the same (a ceiling of the same rational), found without SymPy's
        simplification of a ceiling over a sum, which takes about 10 ms a stage: the form to compile
        (:func:`memlib.core.exact.exact_function`, :class:`memlib.search.compiled.ExactFunction`), not to print."""
        mv = self.partition.model_values
        counts = self.stage_counts(st)
        z = self.train.zero if zero is None else zero
        if not evaluate:
            return states_formula(z, self.recipe).map(lambda e: _substituted(_substituted(e, counts), mv))
        return states_formula(z, self.recipe).map(lambda e: e.xreplace(counts).xreplace(mv))

    def stage_expressions(self, index: int, subs: Mapping | None = None) -> StageExpressions:
        """The terms of stage ``index`` with ``subs`` substituted (all symbols: exact integers)."""
        part, t = self.partition, self.train
        st = part.stages[index]
        states = self.stage_states(st)
        chunks, working = [], []
        for c in st.chunks:
            entries, w = self.chunk_expressions(c)
            chunks.append(entries)
            working.append(w)
        ex = StageExpressions(st, states, tuple(chunks), tuple(working), tuple(moments(t, index)))
        if subs:
            s = dict(subs)
            ex = StageExpressions(
                st, states.map(lambda e: sp.sympify(e.xreplace(s))),
                tuple({k: sp.sympify(x.xreplace(s)) for k, x in ch.items()} for ch in ex.chunks),
                tuple(sp.sympify(w.xreplace(s)) for w in ex.working), ex.moments)
        return ex

    def _activations(self, ex: StageExpressions) -> dict:
        """The peak moment's activations of evaluated expressions, as the JSON reports them."""
        per_chunk = [int(sum(ch.values())) for ch in ex.chunks]
        working = [int(w) for w in ex.working]

        def value(mo: Moment) -> int:
            return sum(n * x for n, x in zip(mo.counts, per_chunk)) + max([0] + [working[c] for c in mo.running])

        peak = max(ex.moments, key=value)          # the first of equal candidates (most micro-batches)
        by_entry: dict[str, int] = {}
        for ch in ex.chunks:
            for k, x in ch.items():
                by_entry[k] = by_entry.get(k, 0) + int(x)
        st = ex.stage
        return {
            "per_microbatch": sum(by_entry.values()),
            "microbatches_in_flight": peak.total,
            # kept for the JSON contract: the replay's chunk counts include DualPipe's overlapped step
            "schedule_extra": 0,
            "recompute_working_set": max([0] + [working[c] for c in peak.running]),
            "by_entry": by_entry,
            "chunks": [{"stage": c.index, "layers": list(c.layers), "per_microbatch": per_chunk[i],
                        "in_flight": peak.counts[i], "recompute_working_set": working[i]}
                       for i, c in enumerate(st.chunks)],
            "total": value(peak),
        }

    # -- stages -----------------------------------------------------------------------------------
    # -- the same terms, evaluated through kept programs ------------------------------------------
    def _keys(self) -> tuple[int, int, int]:
        """Small ids of what a stage's states, its parameters and a chunk's entries depend on besides the
        layers (hashing the model once per estimate, not once per lookup)."""
        if "_key_ids" not in self.__dict__:
            part, t = self.partition, self.train
            params = (self.model, t.profile, part._local_tp)
            states = params + (self.recipe,)
            chunks = (self.model, self.act_profile.name, self.act_profile.key, self.act_recipe, self.policy,
                      self.base, t.routing_imbalance, t.sp, part.profile.include_mtp)
            ids = []
            for k in (states, params, chunks):
                if k not in _KEY_IDS:
                    _KEY_IDS[k] = next(_NEXT_ID)       # never reused: an id names one key for the process
                ids.append(_KEY_IDS[k])
            self._key_ids = tuple(ids)
        return self._key_ids

    def _evaluated_stage(self, st: Stage, memo: dict) -> StageExpressions:
        """:meth:`stage_expressions` of ``st`` with every symbol given, evaluated by the kept programs of its
        terms (each distinct chunk once per estimate)."""
        skey, _, ckey = self._keys()
        z = self.train.zero
        sig = _signature(self.model, st.chunks)
        key = ("states", skey, sig, z)
        if key not in memo:
            prog = _kept_program(key, lambda: _Program.of(self.stage_states(st, evaluate=False)))
            vals = prog(self.values)
            memo[key] = Breakdown(vals)
            memo[("states_int",) + key[1:]] = {k: int(x) for k, x in vals.items()}
        chunks, working = [], []
        for c in st.chunks:
            k = ("chunk", ckey, _signature(self.model, (c,)))
            if k not in memo:
                def build(c=c):
                    entries, w = self.chunk_expressions(c)
                    return _Program.of({**{("entry", n): x for n, x in entries.items()}, ("working",): w})
                vals = _kept_program(k, build)(self.values)
                memo[k] = ({n[1]: x for n, x in vals.items() if n[0] == "entry"}, vals[("working",)])
            entries, w = memo[k]
            chunks.append(entries)
            working.append(w)
        return StageExpressions(st, memo[key], tuple(chunks), tuple(working), tuple(moments(self.train, st.index)))

    def _stage_params(self, st: Stage) -> tuple[Breakdown, int, dict[str, int]]:
        """The parameters of ``st``'s device (symbolic), their exact count and their count per block."""
        part = self.partition
        key = ("params", self._keys()[1], _signature(self.model, st.chunks))

        def build():
            params = part.params(st)
            blocks = by_block(params)
            return params, _Program.of({("total",): params.total, **{("block", k): x for k, x in blocks.items()}})
        params, prog = _kept_program(key, build)
        vals = prog(part.values)
        return (params, _as_int(vals[("total",)]),
                {k[1]: _as_int(x) for k, x in vals.items() if k[0] == "block"})

    # -- stages -----------------------------------------------------------------------------------
    @cached_property
    def stages(self) -> list[StageMemory]:
        part, out = self.partition, []
        self._evaluated_stages = {}
        memo: dict = {}
        for st in part.stages:
            ex = self._evaluated_stages[st.index] = self._evaluated_stage(st, memo)
            params, parameters, components = self._stage_params(st)
            b = dict(memo[("states_int", self._keys()[0], _signature(self.model, st.chunks), self.train.zero)])
            act = self._activations(ex)
            b["activations"] = act.pop("total")
            allocated = sum(b[k] for k in ALLOCATED)
            ovh = self.overhead.terms(allocated)
            b["overhead"] = sum(ovh.values())
            out.append(StageMemory(
                stage=st,
                params=params,
                parameters=parameters,
                bytes=b,
                optimizer={name: n * b["optimizer_states"] // self.recipe.optimizer_bytes
                           for name, n in self.recipe.optimizer},
                components=components,
                activations=act,
                overheads=ovh,
            ))
        return out

    # -- the peak the allocator reports ---------------------------------------------------------
    def _evaluated(self, name: str) -> dict[str, tuple[int, Saved]]:
        """Every entry of ledger ``name`` for one layer (or block) on one device, evaluated (routed
        entries on the busiest rank), dropped ones included."""
        cache = self.__dict__.setdefault("_evaluated_cache", {})
        if name not in cache:
            led = self._ledger(name, None)
            cache[name] = {k: (int(self._scaled(k, x).xreplace(self.values)), e) for k, (x, e) in led.items()}
        return cache[name]

    def chunk_load(self, chunk: Chunk, entries: Mapping[str, int], working: int) -> ChunkLoad:
        """What one micro-batch through ``chunk`` keeps on the GPU (``entries``: its evaluated by-entry
        bytes) and what the chunk needs while it computes (:class:`memlib.device.peak.ChunkLoad`)."""
        m, t = self.model, self.train
        names = [f"layer.{k}" for k in sorted({m.layer_kinds[i] for i in chunk.layers})]
        if chunk.last and self.partition.profile.include_mtp:
            names += [f"mtp.{j}" for j in range(m.num_nextn_predict_layers)]
        layers = {n: self._evaluated(n) for n in names}
        mods = t.offload_modules
        off_keys: set[str] = set()
        reload = prefetch = 0
        mine_of: dict[str, set[str]] = {}
        for n, led in layers.items():
            mine = mine_of[n] = {k for k, (x, e) in led.items() if mods and offloaded_entry(k, mods)
                                 and x >= MIN_OFFLOADED_ELEMENTS * element_bytes(e, self.act_recipe)}
            off_keys |= mine
            reload = max(reload, sum(led[k][0] for k in mine))
            # reloaded ahead of its backward, once per save (fine_grained_activation_offload.py: tensor_push tags
            # every save, bulk_offload_group copies each to the host, bulk_reload_group each back)
            prefetch = max(prefetch, sum(led[k][0] * led[k][1].saves for k in mine))
        offloaded = sum(entries.get(k, 0) for k in off_keys)
        if chunk.last and off_keys:
            # the model's last chunk runs its backward right after its forward (the last pipeline stage), so
            # ``should_bulk_offload`` keeps the last group of each module name on the GPU: its last offloading
            # layer stays (megatron/core/pipeline_parallel/fine_grained_activation_offload.py at 4e85d74ae9,
            # ChunkOffloadHandler.should_bulk_offload, ``next_backward_chunk is self``)
            order = [f"layer.{m.layer_kinds[i]}" for i in chunk.layers] + [n for n in names if n.startswith("mtp.")]
            kept: dict[str, int] = {}
            kept_layers: set[str] = set()
            for mod in mods:
                for n in reversed(order):
                    got = {k for k in mine_of[n] if offloaded_entry(k, (mod,))}
                    if got:        # (what the policy recomputes is not among the chunk's entries)
                        kept.update({k: layers[n][k][0] for k in got if k in entries})
                        kept_layers.add(n)
                        break
            offloaded -= sum(kept.values())
            if not offloaded:          # its only offloading layer is kept: nothing leaves, nothing is reloaded
                reload = prefetch = 0
            # an offloaded layer comes back after the kept one's backward has freed all it saved
            kept_total = sum(x for n in kept_layers for k, (x, e) in layers[n].items()
                             if not self.policy.drops(e) and not k.startswith("mtp.head."))
        else:
            kept_total = 0
        # one layer's forward (the all-to-all overlap runs a layer of the next micro-batch's forward while the
        # current one's backward frees layer by layer): its kept, not offloaded, saved tensors
        layer_held = max([sum(x for k, (x, e) in led.items() if k not in off_keys and not self.policy.drops(e)
                              and not e.only_when and not k.startswith("mtp.head."))
                          for led in layers.values()] or [0])
        logits = 0
        if chunk.last:        # [s/CP, b, v/TP] in the compute dtype (the output layer gathers the SP shards)
            vocab = int(self.partition.values[sym("v")])
            logits = -(-t.micro_batch * t.seq_len // t.cp) * -(-vocab // t.tp) * self.recipe.activations
        cands = self._candidates(chunk, logits)
        if reload:
            # a backward moment holds the layer it runs, reloaded ahead with every saved copy (``prefetch``: the
            # previous layer's group starts fetch it back, bulk_reload); the forward of an attention holds the
            # layer's own saved tensors (one copy each) until its groups commit.  Behind a kept last layer the
            # backward moment is either the kept layer's (nothing reloaded) or an earlier one's, with the kept
            # layer's tensors freed by then: the larger
            def backward(d: dict[str, int]) -> dict[str, int]:
                if not kept_total:
                    return {**d, "offload_reload": prefetch}
                behind = {**d, "offload_reload": prefetch, "backward_released": d["backward_released"] - kept_total}
                return behind if sum(behind.values()) > sum(d.values()) else d
            cands = {k: d if k in ("forward_end", "forward_moe") else
                     {**d, "offload_reload": reload} if k in FORWARD_CANDIDATES else backward(d)
                     for k, d in cands.items()}
        return ChunkLoad(held=sum(entries.values()) - offloaded, offloaded=offloaded, working=working,
                         gradients=0, reload=reload, logits=logits, layer=layer_held,
                         candidates=tuple(cands.items()), prefetch=prefetch, last=chunk.last)

    def _candidates(self, chunk: Chunk, logits: int) -> dict[str, dict[str, int]]:
        """The candidate moments of one micro-batch through ``chunk`` (:func:`memlib.device.transient.candidates`):
        its ledgers in forward order, evaluated."""
        m, pol = self.model, self.policy
        segs: list[Segment] = []
        if chunk.first:
            segs.append(Segment("embedding", "embedding", self._evaluated("embedding"), pol))
        for n, i in enumerate(chunk.layers):
            p = self.base if pol.full and pol.block_layers is not None and n >= pol.block_layers else pol
            segs.append(Segment(f"layer.{i}", m.layer_kinds[i], self._evaluated(f"layer.{m.layer_kinds[i]}"), p))
        depth = m.num_nextn_predict_layers if chunk.last and self.partition.profile.include_mtp else 0
        if chunk.last:
            head = self._evaluated("head")
            if depth:         # the decoder's final norm runs before the MTP block, the output layer after
                norm = {k: v for k, v in head.items() if k.startswith("head.norm_")}
                segs.append(Segment("head.norm", "head", norm, pol))
                for j in range(depth):
                    segs.append(Segment(f"mtp.{j}", "mtp", self._evaluated(f"mtp.{j}"), pol))
                head = {k: v for k, v in head.items() if k not in norm}
            segs.append(Segment("head", "head", head, pol))
        t, fw = self.train, self.framework
        # one residual-stream tensor [s/(CP TP (SP)), b, h] in the compute dtype (never FP8-cached)
        tokens = -(-t.micro_batch * t.seq_len // (t.cp * (t.tp if t.sp else 1)))
        H = tokens * m.hidden_size * self.recipe.activations
        te = t.transformer_impl.uses_te
        fused_softmax = (te and t.attention_backend is AttnBackend.UNFUSED
                         and te_fused_softmax(t.micro_batch, m.num_attention_heads // t.tp, -(-t.seq_len // t.cp),
                                              -(-t.seq_len // t.cp), self.act_recipe.activations == 2))
        copies = moe_copies(te=te, grouped_gemm=fw.moe_grouped_gemm, dispatcher=fw.token_dispatcher,
                            permute_fusion=fw.permute_fusion, fp8=self.act_recipe.fp8_activations, etp=t.etp,
                            local_experts=max(1, (m.n_routed_experts or 0) // t.ep))
        extra: dict = {}
        mcore = self.partition.profile.megatron_kernels     # the Megatron-Core implementation (megatron profile)
        if mcore:       # the loss's and the output layer's backward; the embedding's backward
            act, vocab = self.recipe.activations, int(self.partition.values[sym("v")])
            full = t.micro_batch * -(-t.seq_len // t.cp)          # tokens of a micro-batch on a CP rank
            extra["loss"] = loss_kind(t.cross_entropy_loss_fusion, t.cross_entropy_fusion_impl.value)
            if chunk.last:
                extra.update(head_grad=full * m.hidden_size * act, head_scatter=H if t.sp and t.tp > 1 else 0,
                             head_wgrad=0 if fw.gradient_accumulation_fusion
                             else -(-vocab // t.tp) * m.hidden_size * self.recipe.weights)
            if chunk.first:
                extra["embedding_backward"] = embedding_backward_bytes(
                    tokens=full, hidden=m.hidden_size, vocab=-(-vocab // t.tp), weight_bytes=self.recipe.weights,
                    act_bytes=act, deterministic=fw.deterministic)
        # the batch's attention mask get_batch_on_this_tp_rank allocates on the first and last stages
        # (megatron/training/utils.py: torch.empty((micro_batch_size, 1, seq_length, seq_length), dtype=torch.bool)
        # under create_attention_mask_in_dataloader; get_batch_on_this_cp_rank keeps s/CP of its rows)
        # (a rank whose RerunDataIterator keeps the step's micro-batches holds it in rerun_saved_batches instead)
        extra["batch_mask"] = (t.micro_batch * -(-t.seq_len // t.cp) * t.seq_len
                               if mcore and fw.attention_mask_in_batch
                               and (chunk.first or chunk.last)
                               and not rerun_keeps_batches(t, fw.rerun_mode, fw.data_loading_rank) else 0)
        # the native fused cross-entropy compiled by Inductor (jit_fuser is torch.compile on a GPU): one fp32
        # buffer of the logits' elements beside the saved softmax (measured on an H200, memlib/data/gpu_peaks)
        compiled_ce = (chunk.last and mcore and t.runtime is Runtime.CUDA
                       and t.cross_entropy_loss_fusion and t.cross_entropy_fusion_impl is CrossEntropyFusionImpl.NATIVE)
        extra["ce_workspace"] = logits // self.recipe.activations * 4 if compiled_ce else 0
        if (chunk.last and mcore and depth
                and _version(t.megatron_version).mtp_logits_through_main_loss):
            extra["mtp_logits"] = logits
        return candidates(segs, H=H, L=logits, mtp_depth=depth, first=chunk.first, last=chunk.last,
                          shared_experts=bool(m.n_shared_experts), fused_softmax=fused_softmax, moe_copies=copies,
                          **extra)

    @cached_property
    def peaks(self) -> list[StagePeak]:
        """The prediction of ``torch.cuda.max_memory_allocated()`` on every stage's device
        (:mod:`memlib.device.peak`)."""
        return [self._stage_peak(st, self._evaluated_stages[st.index], mem.bytes)
                for st, mem in zip(self.partition.stages, self.stages)]

    def peak_of(self, index: int) -> StagePeak:
        """``peaks[index]`` without evaluating the other stages (the validation set predicts the last stage)."""
        if "peaks" in self.__dict__:
            return self.peaks[index]
        st = self.partition.stages[index]
        memo: dict = {}
        ex = self._evaluated_stage(st, memo)
        return self._stage_peak(st, ex, memo[("states_int", self._keys()[0], _signature(self.model, st.chunks),
                                             self.train.zero)])

    def _stage_peak(self, st: Stage, ex: StageExpressions, states: Mapping[str, int]) -> StagePeak:
        part, rec = self.partition, self.recipe
        # the DDP buffer holds gradients in the parameters' dtype unless accumulate_allreduce_grads_in_fp32, which
        # Megatron-LM sets for bf16 only (megatron/training/arguments.py, ``if args.bf16``; the buffer's dtype:
        # megatron/core/distributed/distributed_data_parallel.py ``grad_reduce_in_fp32 else param.dtype``): a
        # recipe's ``main_grad`` is the optimizer's fp32 copy (``.float()``), not the buffer
        grad_bytes = rec.gradients
        loads = [self.chunk_load(c, {k: int(x) for k, x in ex.chunks[i].items()}, int(ex.working[i]))
                 for i, c in enumerate(st.chunks)]
        held = {k: states[k] for k in ("parameters", "gradients", "optimizer_states")}
        pers = persistent_terms(part, st.index, held, self.framework, grad_bytes, rec.weights, rec.optimizer)
        return stage_peak(st.index, pers, loads, ex.moments, self.train, self.overhead.fragmentation)

    @property
    def peak(self) -> StageMemory:
        """The stage whose device needs the most bytes (the first such, on a tie)."""
        return max(self.stages, key=lambda s: (s.total, -s.stage.index))

    def fits(self, stage: StageMemory) -> bool | None:
        return None if self.capacity is None else stage.total <= self.capacity

    def to_dict(self) -> dict:
        """The CLI's JSON contract (see ``memlib estimate --json``)."""
        cfg = config_values(self.train, self.partition.layout, self.framework, self.overhead)
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
            pk = self.peaks[s.stage.index].to_dict()
            d["peak_allocated"], d["peak_reserved"] = pk["peak_allocated"], pk["peak_reserved"]
            d["peak_breakdown"] = pk["breakdown"]
            stages.append(d)
        out = {"model": self.model.name, "config": cfg, "stages": stages,
               "peak": {"stage": self.peak.stage.index, "bytes": self.peak.total},
               "peak_allocated": max(p.peak_allocated for p in self.peaks),
               "peak_reserved": max(p.peak_reserved for p in self.peaks)}
        if self.capacity is not None:
            out["capacity"] = self.capacity
            out["fits"] = all(self.fits(s) for s in self.stages)
        return out


def config_values(train: TrainingConfig, layout, framework: Framework, overhead: Overheads) -> dict:
    """The ``config`` of the JSON contract: the training configuration, the resolved layout, the framework
    and the overheads."""
    return {**train.values(), "layout": list(layout), "framework": framework.values(),
            "overhead": {"cuda_context": overhead.cuda_context, "comm_buffers": overhead.comm_buffers,
                         "fragmentation": str(overhead.fragmentation)}}


def stage_formula(est: Estimate, index: int, keep=("DP", "TP", "EP", "ETP", "CP", "b", "s")) -> Breakdown:
    """Allocated bytes of one device of stage ``index`` as named terms, a formula in the symbols
    named by ``keep`` (everything else substituted): the very expressions :attr:`Estimate.stages`
    evaluates, so that substituting the kept symbols gives ``estimate``'s numbers exactly.

    The layout, schedule, recompute policy and precision are those of ``est``; divisibility is the
    caller's business (use it for sweeps over valid configurations, e.g. with ``lambdify``).
    """
    keep_syms = {sym(k) for k in keep}
    fixed = {k: x for k, x in est.values.items() if k not in keep_syms}
    return est.stage_expressions(index, fixed).breakdown()


def estimate(model: ModelConfig | str, train: TrainingConfig, overhead: Overheads | None = None,
             capacity: int | None = None, framework: Framework | None = None) -> Estimate:
    """Per-stage, per-device memory of ``model`` trained under ``train`` (``framework``: how the
    framework around it is built, for the peak the allocator reports; see :mod:`memlib.device.peak`)."""
    return Estimate(model, train, overhead, capacity, framework)
