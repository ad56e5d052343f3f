"""One engine, two speeds: :mod:`memlib.device.estimate`'s per-stage terms compiled into vectorised NumPy functions.

:func:`memlib.device.estimate.estimate` evaluates SymPy expressions for one configuration.  A search over parallel
configurations needs the same numbers for hundreds of thousands of them.  This module derives them from the
very same expressions, once:

* a :class:`Family` is what does not change while the integer knobs do: the model, the profile (and its
  kernel choices), the precision recipe, the recompute policy, sequence parallelism, the routing imbalance
  and the overheads.  It holds one :class:`~memlib.device.estimate.Estimate` and asks it for the terms of any chunk
  (:meth:`~memlib.device.estimate.Estimate.chunk_expressions`) and any stage's model states under any ZeRO stage
  (:meth:`~memlib.device.estimate.Estimate.stage_states`), the methods :meth:`~memlib.device.estimate.Estimate.stage_expressions`
  is built from.  Both are cached by the chunk's (stage's) *signature*: the kinds of its layers and whether
  it holds the embedding or the head.  The same chunk recurs across pipeline depths and layouts.
* a :class:`Pipeline` is a family laid over PP ranks by a schedule, V chunks per rank and a layout (they change
  the partition, so configurations are grouped by them); its stages' moments come from the schedule replay
  (:func:`memlib.device.schedule.moments`), per number of micro-batches M.
* every expression is compiled by :class:`ExactFunction` into NumPy operations on exact rationals (numerator and
  denominator int64 arrays): ceilings, maxima, piecewise cases and the final truncation ``int()`` are those of
  the exact evaluation, so a vectorised result equals :func:`~memlib.device.estimate.estimate`'s to the byte
  (tests/search/test_compiled.py checks it on random configurations of every kind).  The same compiled expression
  runs three ways: a *bound* run on the rows' largest knob values (Python integers) finds whether any
  intermediate integer could reach 2^62; if none can, the *fast* run uses plain int64 operations and
  reduces nothing; else the *checked* run looks at each product's magnitude, reduces denominators by their
  gcd and switches to Python integers where int64 could overflow.

The knobs are DP, TP, EP, ETP, CP, b, s (symbols of the expressions), M (the replay) and the ZeRO stage.

>>> fam = Family("deepseek-v3", TrainingConfig(profile="megatron", precision="deepseek-v3", recompute="deepseek"))
>>> pipe = fam.pipeline(pp=16, schedule="dualpipe")
>>> t = pipe.evaluate(dp=[128, 64], tp=[1, 2], ep=[64, 64], etp=[1, 1], cp=[1, 1], micro_batch=[1, 1],
...                   seq_len=[4096, 4096], zero=[1, 1], num_microbatches=[120, 240])
>>> peak, stage = t.peak()
>>> int(peak[0]) == estimate("deepseek-v3", TrainingConfig(dp=128, pp=16, ep=64, zero=1, profile="megatron",
...     precision="deepseek-v3", recompute="deepseek", schedule="dualpipe", num_microbatches=120)).peak.total
True
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Mapping, Sequence

import copy

import numpy as np
import sympy as sp

from ..config import ConfigError, ModelConfig, Schedule, TrainingConfig, ZeroStage, load_model
from ..config.strategies import CP_A2A
from ..model.profiles import act_profile, profile
from ..device.estimate import Estimate, estimate
from ..device.overhead import Overheads
from ..model.partition import Stage, build_stages, resolve_layout
from ..device.schedule import Moment, moments, replay_microbatches
from ..model.states import P_e, P_ne, states_formula
from ..core.symbols import sym
# the exact array arithmetic compiled expressions run on (package-internal)
from .vectorised import (_BOUND, _CHECKED, _FAST, _LIMIT, _RELATIONS, _Ops, _Overflow, _add, _b_add, _b_check,
                         _b_extreme, _b_mul, _big, _mag, _obj)

__all__ = ["ExactFunction", "Family", "Pipeline", "Totals", "KNOBS", "chunk_signature", "stage_signature",
           "compiled_totals"]

#: the integer knobs that are symbols of the expressions: TrainingConfig field -> symbol
KNOBS = {"dp": sym("DP"), "tp": sym("TP"), "ep": sym("EP"), "etp": sym("ETP"), "cp": sym("CP"),
         "micro_batch": sym("b"), "seq_len": sym("s")}
_BY_SYMBOL = {v: k for k, v in KNOBS.items()}

class ExactFunction:
    """An expression in the knob symbols, compiled to NumPy operations on exact rationals; called with
    integer arrays it returns ``int(expr)`` for each row (truncated toward zero, as :func:`int` truncates a
    SymPy rational), as int64 (or Python integers where int64 could overflow)."""

    def __init__(self, expr, inputs: Mapping[sp.Symbol, "ExactFunction"] | None = None):
        self.expr = sp.sympify(expr)
        #: symbols that stand for other compiled expressions (their exact rationals, not truncated), read from
        #: the rows at evaluation: :meth:`with_inputs` feeds other functions to the same compiled expression
        self.inputs = dict(inputs or {})
        syms = self.expr.free_symbols
        unknown = syms - set(_BY_SYMBOL) - set(self.inputs)
        if unknown:
            raise ConfigError(f"compiled expression keeps symbols {sorted(map(str, unknown))} that are not knobs "
                              f"({', '.join(map(str, KNOBS.values()))})")
        self._fn = self._build(self.expr)
        self.__dict__.pop("_constants", None)
        #: the knobs of the expression itself, without its inputs'
        self._own = frozenset(k for k, x in KNOBS.items() if x in syms)
        self._set_inputs(self.inputs)

    def _set_inputs(self, inputs: Mapping[sp.Symbol, "ExactFunction"]) -> None:
        self.inputs = dict(inputs)
        self._modes: dict[tuple, tuple[int, int] | None] = {}
        used = set(self._own).union(*(set(f.knobs) for f in self.inputs.values()))
        #: the knobs (TrainingConfig field names) the expression depends on, in :data:`KNOBS` order
        self.knobs: tuple[str, ...] = tuple(k for k in KNOBS if k in used)

    def with_inputs(self, inputs: Mapping[sp.Symbol, "ExactFunction"]) -> "ExactFunction":
        """The same compiled expression fed other input functions (the same symbols): nothing is compiled."""
        if set(inputs) != set(self.inputs):
            raise ValueError(f"inputs {sorted(map(str, inputs))} are not {sorted(map(str, self.inputs))}")
        new = copy.copy(self)
        new._set_inputs(inputs)
        return new

    # -- compilation ---------------------------------------------------------------------------
    def _constant(self, e) -> bool:
        """Whether ``e`` has no free symbol (each subexpression asked once: ``free_symbols`` is not kept)."""
        memo = self.__dict__.setdefault("_constants", {})
        if e not in memo:
            memo[e] = not e.is_Symbol if not e.args else all(self._constant(a) for a in e.args)
        return memo[e]

    def _build(self, e) -> Callable[[Mapping, _Ops], tuple]:
        """``e`` as a closure of (rows, operations): :data:`_CHECKED`, :data:`_FAST` or :data:`_BOUND`."""
        if not isinstance(e, sp.logic.boolalg.Boolean) and self._constant(e):
            q = sp.Rational(e)
            const = (int(q.p), int(q.q))
            bound = (abs(const[0]), const[1])
            return lambda env, ops: bound if ops is _BOUND else const
        if isinstance(e, sp.Symbol) and e in self.inputs:
            return lambda env, ops: env[e]        # the input's rationals (its bounds in the bound run)
        if isinstance(e, sp.Symbol):
            name = _BY_SYMBOL[e]
            return lambda env, ops: (env[name], 1)
        folds = {sp.Add: "add", sp.Mul: "mul", sp.Max: "max", sp.Min: "min"}
        if type(e) in folds:
            parts = [self._build(a) for a in e.args]
            attr = folds[type(e)]

            def fold(env, ops):
                op = getattr(ops, attr)
                acc = parts[0](env, ops)
                for f in parts[1:]:
                    acc = op(acc, f(env, ops))
                return acc
            return fold
        if isinstance(e, sp.Pow):
            base, k = e.args
            if not (k.is_Integer and int(k) != 0):
                raise ConfigError(f"compiled expression: power {e} is not an integer power")
            f, k = self._build(base), int(k)

            def power(env, ops):
                x = f(env, ops)
                acc = x
                for _ in range(abs(k) - 1):
                    acc = ops.mul(acc, x)
                return acc if k > 0 else ops.inv(acc)
            return power
        if isinstance(e, (sp.ceiling, sp.floor)):
            f = self._build(e.args[0])
            if isinstance(e, sp.ceiling):
                return lambda env, ops: (ops.ceil(*f(env, ops)), 1)
            return lambda env, ops: (ops.floor(*f(env, ops)), 1)
        if isinstance(e, sp.Piecewise):
            cases = [(self._build(x), self._cond(c)) for x, c in e.args]

            def piecewise(env, ops):
                x, c = cases[-1]         # memlib's Piecewise ends with (expr, True)
                acc = x(env, ops)
                for x, c in reversed(cases[:-1]):
                    acc = ops.where(c(env, ops), x(env, ops), acc)
                return acc
            return piecewise
        raise ConfigError(f"compiled expression: {type(e).__name__} ({e}) is not supported")

    def _cond(self, c) -> Callable[[Mapping, _Ops], object]:
        if c is sp.true or c == True:  # noqa: E712 - SymPy's true
            return lambda env, ops: True
        if c is sp.false or c == False:  # noqa: E712
            return lambda env, ops: False
        if isinstance(c, (sp.And, sp.Or)):
            parts = [self._cond(a) for a in c.args]
            op = np.logical_and if isinstance(c, sp.And) else np.logical_or
            if len(parts) == 1:
                return parts[0]
            return lambda env, ops: ops.land([f(env, ops) for f in parts], op)
        if isinstance(c, sp.Not):
            f = self._cond(c.args[0])
            return lambda env, ops: ops.lnot(f(env, ops))
        for cls, op in _RELATIONS.items():
            if isinstance(c, cls):
                lf, rf = self._build(c.lhs), self._build(c.rhs)
                return lambda env, ops, op=op: ops.rel(op, lf(env, ops), rf(env, ops))
        raise ConfigError(f"compiled expression: condition {c} is not supported")

    # -- evaluation ---------------------------------------------------------------------------
    def operations(self, env: Mapping[str, np.ndarray]) -> _Ops:
        """:data:`_FAST` where the bound run on these rows' largest knob values keeps every intermediate
        integer under 2^62, else :data:`_CHECKED` (kept per largest values)."""
        return _FAST if self.bound(env) is not None else _CHECKED

    def bound(self, env: Mapping[str, np.ndarray]) -> tuple[int, int] | None:
        """Bounds of |numerator| and of the denominator of :meth:`rational` on rows ``env`` (None: some
        intermediate integer could reach 2^62), from the bound run on the rows' largest knob values."""
        top = env.top(self.knobs) if isinstance(env, _Env) else \
            tuple(int(np.max(np.abs(env[k]))) if np.size(env[k]) else 0 for k in self.knobs)
        return self._bound_at(dict(zip(self.knobs, top)))

    def _bound_at(self, top: Mapping[str, int]) -> tuple[int, int] | None:
        key = tuple(top[k] for k in self.knobs)
        if key not in self._modes:
            try:
                benv = dict(top)
                for x, f in self.inputs.items():
                    benv[x] = f._bound_at(top)
                    if benv[x] is None:
                        raise _Overflow
                b = self._fn(benv, _BOUND)
                _b_check(*b)
            except _Overflow:
                b = None
            if len(self._modes) > 256:
                self._modes.clear()
            self._modes[key] = b
        return self._modes[key]

    def rational(self, env: Mapping[str, np.ndarray]) -> tuple:
        """Exact (numerator, denominator) on rows ``env`` (not reduced where no product could overflow)."""
        ops = self.operations(env)
        if not self.inputs:
            return self._fn(env, ops)
        view = _Overlay(env)
        memo = getattr(env, "memo", None)
        for x, f in self.inputs.items():
            if memo is None:
                view[x] = f.rational(env)
            else:                   # kept for the rows: a stage's counts feed each of its state terms
                if id(f) not in memo:
                    memo[id(f)] = (f, f.rational(env))     # the function is kept so that its id stays its own
                view[x] = memo[id(f)][1]
        return self._fn(view, ops)

    def __call__(self, env: Mapping[str, np.ndarray], size: int | None = None):
        n, d = self.rational(env)
        if size is None:
            size = len(next(iter(env.values())))
        return _truncate(n, d, size)


class _Overlay(dict):
    """Rows with the rationals of a function's inputs added (keyed by their symbols)."""

    def __init__(self, base: Mapping):
        super().__init__()
        self.base = base

    def __missing__(self, key):
        return self.base[key]


class _Env(dict):
    """Rows of knobs (a dict of columns) that keep the rationals of the inputs evaluated on them
    (:attr:`ExactFunction.inputs`: a stage's parameter counts feed each of its state terms)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.memo: dict = {}
        self._top: dict[str, int] = {}

    def top(self, keys: Sequence[str]) -> tuple[int, ...]:
        """The largest |value| of each column of ``keys``."""
        for k in keys:
            if k not in self._top:
                c = self[k]
                self._top[k] = int(np.max(np.abs(c))) if np.size(c) else 0
        return tuple(self._top[k] for k in keys)


def _truncate(n, d, size: int):
    """int(n / d) on ``size`` rows (toward zero, as :func:`int` truncates a SymPy rational)."""
    if isinstance(n, int) and isinstance(d, int):
        return np.full(size, int(sp.Rational(n, d)) if d != 1 else n, dtype=np.int64 if abs(n) < _LIMIT else object)
    if not isinstance(n, np.ndarray) or n.shape != (size,):
        n = np.broadcast_to(_big(n), (size,))
    if type(d) is int and abs(d) >= _LIMIT or n.dtype != object and isinstance(d, np.ndarray) and d.dtype == object:
        n = n.astype(object)
    q = np.where(n < 0, -((-n) // d), n // d)
    if q.dtype == object and _mag(q) < _LIMIT:      # the sum passed int64 on the way, not the result
        q = q.astype(np.int64)
    return q


def _chunk_on(cache: dict, rows_key, prog: "ChunkProgram", env: Mapping, size: int):
    """``prog.evaluate`` on these rows, kept in ``cache`` with its parts' rationals (the programs are kept too, so
    that their ids stay their own)."""
    key = (rows_key, id(prog))
    if key not in cache:
        def rational(f: ExactFunction):
            k = (rows_key, "rational", id(f))
            if k not in cache:
                cache[k] = (f, f.rational(env))
            return cache[k][1]
        cache[key] = (prog, prog.evaluate(env, size, rational))
    return cache[key][1]


def _unique_rows(cols: list[np.ndarray], keys: tuple[str, ...]) -> tuple[dict, np.ndarray]:
    """The distinct rows of the columns (as a dict of columns) and each row's index among them."""
    n = len(cols[0])
    # each column as the rank of its value among the column's distinct values: a table over the values' range
    # where it is small (the knobs are small integers: no sort), else a sort
    ranks, radix = [], []
    for c in cols:
        low, high = (int(c.min()), int(c.max())) if n else (0, 0)
        if high - low <= max(4 * n, 1 << 16):
            present = np.zeros(high - low + 1, dtype=bool)
            present[c - low] = True
            index = np.cumsum(present, dtype=np.int64) - 1
            ranks.append(index[c - low])
            radix.append(int(index[-1]) + 1)
        else:
            values, rank = np.unique(c, return_inverse=True)
            ranks.append(rank.reshape(-1))
            radix.append(len(values))
    span = 1
    for r in radix:
        span *= r
    code = np.zeros(n, dtype=np.int64)
    if span <= max(4 * n, 1 << 16):
        # a mixed-radix code of each row over the ranks and a table over the codes (no sort)
        for rank, r in zip(ranks, radix):
            code = code * r + rank
        present = np.zeros(span, dtype=bool)
        present[code] = True
        index = np.cumsum(present, dtype=np.int64) - 1
        inverse = index[code]
        first = np.empty(int(index[-1]) + 1 if n else 0, dtype=np.int64)
        first[inverse] = np.arange(n, dtype=np.int64)       # some row of each code (any: they are equal)
        return {k: c[first] for k, c in zip(keys, cols)}, inverse
    bound = 1
    for rank, r in zip(ranks, radix):                # mixed radix over each column's ranks, renumbered before
        if bound * r >= _LIMIT:                      # the code could pass int64
            code, bound = np.unique(code, return_inverse=True)[1].reshape(-1), n
        code, bound = code * r + rank, bound * r
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return {k: c[first] for k, c in zip(keys, cols)}, inverse.reshape(-1)


# ------------------------------------------------------------------------------------------------
# signatures: what a chunk's and a stage's expressions depend on
# ------------------------------------------------------------------------------------------------
def chunk_signature(model: ModelConfig, chunk) -> tuple:
    """The kinds of a chunk's layers, in order, and whether it holds the embedding and the head."""
    return tuple(model.layer_kinds[i] for i in chunk.layers), chunk.first, chunk.last


def stage_signature(model: ModelConfig, stage: Stage) -> tuple:
    return tuple(chunk_signature(model, c) for c in stage.chunks)


@dataclass(frozen=True)
class ChunkProgram:
    """A chunk's terms (:meth:`~memlib.device.estimate.Estimate.chunk_parts`) as compiled parts, each shared by every
    chunk that holds it: one micro-batch's saved bytes are int(sum of ``times`` x ``part``) and the recompute
    working set int(max(0, ``dropped``...)), exact rationals summed before the truncation as
    :meth:`~memlib.device.estimate.Estimate.chunk_expressions`' sum of entries is."""

    kept: tuple[tuple[int, ExactFunction], ...]
    dropped: tuple[ExactFunction, ...]

    @property
    def knobs(self) -> set[str]:
        return {k for f in [f for _, f in self.kept] + list(self.dropped) for k in f.knobs}

    def evaluate(self, env: Mapping, size: int, rational: Callable[[ExactFunction], tuple]) -> tuple:
        """(saved bytes per micro-batch, working set) on rows ``env``; ``rational(part)``: the part's exact
        rationals on these rows (kept by the caller: parts recur across chunks).  The sums run in plain int64
        where the parts' bounds show that they cannot reach 2^62."""
        ops = _CHECKED
        try:
            per, work = (0, 1), (0, 1)
            for times, f in self.kept:
                b = f.bound(env)
                if b is None:
                    raise _Overflow
                per = _b_add(per, _b_mul((times, 1), b))
            for f in self.dropped:
                b = f.bound(env)
                if b is None:
                    raise _Overflow
                work = _b_extreme(work, b)
            ops = _FAST
        except _Overflow:
            pass
        per = (0, 1)
        for times, f in self.kept:
            per = ops.add(per, ops.mul((times, 1), rational(f)))
        work = (0, 1)
        for f in self.dropped:
            work = ops.max(work, rational(f))
        return _truncate(*per, size), _truncate(*work, size)


class Family:
    """The compiled terms of one (model, profile, precision, recompute policy, kernel options, sequence
    parallelism, routing imbalance, overheads); the parallel sizes, b, s, M, ZeRO, PP, V, the schedule and
    the layout of ``train`` do not matter here (they are the knobs and the pipelines)."""

    def __init__(self, model: ModelConfig | str, train: TrainingConfig, overhead: Overheads | None = None):
        self.model = load_model(model)
        self.train = train
        self.overhead = overhead if overhead is not None else Overheads()
        base = self.canonical(train)
        if not train.transformer_impl.uses_te and profile(train.profile).partition.megatron_kernels:
            raise ConfigError("transformer_impl=local: the compiled evaluator covers transformer_engine only "
                              "(the local modules split MLA's down-projections only when TP > 1)")
        #: the estimate whose methods give every expression
        self.base: Estimate = estimate(self.model, base, self.overhead)
        #: the activation profile's binding may depend on whether TP > 1 (the megatron profile's RoPE key is
        #: gathered under sequence parallelism): one estimate per binding, the same but for its profile
        self._variants: dict[bool, Estimate] = {False: self.base}
        wide = act_profile(train.profile, base.with_(tp=2))
        if wide.key != self.base.act_profile.key:
            est = copy.copy(self.base)
            est.act_profile = wide
            self._variants[True] = est
        self._chunks: dict[tuple, ChunkProgram] = {}
        self._states: dict[tuple, dict[str, ExactFunction]] = {}
        self._counts: dict[tuple, dict[sp.Symbol, ExactFunction]] = {}
        self._parts: dict[tuple, tuple[ExactFunction, ExactFunction]] = {}
        self._formulas: dict[int, object] = {}
        self._pipelines: dict[tuple, Pipeline] = {}

    @staticmethod
    def canonical(train: TrainingConfig) -> TrainingConfig:
        """``train`` with the knobs and the pipeline set to fixed values: what a family depends on.  With the
        all-to-all CP communication whether CP > 1 is part of it (the ledgers' ``cp_a2a`` output exists only then,
        memlib.ledgers.megatron_blocks): CP 2 stands for every CP > 1."""
        cp = 2 if train.cp > 1 and train.cp_comm_type in CP_A2A else 1
        return train.with_(dp=1, tp=1, pp=1, ep=1, etp=1, cp=cp, layout=None, vpp=1, schedule="1f1b",
                           num_microbatches=None, seq_len=cp, micro_batch=1)

    _CACHE: dict = {}

    @classmethod
    def of(cls, model: ModelConfig | str, train: TrainingConfig, overhead: Overheads | None = None) -> "Family":
        """The family of ``train`` (kept: a later search reuses every compiled program)."""
        m = load_model(model)
        key = (m, cls.canonical(train), overhead if overhead is not None else Overheads())
        if key not in cls._CACHE:
            if len(cls._CACHE) > 64:
                cls._CACHE.clear()
            cls._CACHE[key] = cls(m, train, overhead)
        return cls._CACHE[key]

    def variants(self, tp: np.ndarray) -> list[tuple[bool, np.ndarray | None]]:
        """(variant, mask of the rows it serves; None: all) for rows with these TP sizes."""
        if len(self._variants) == 1:
            return [(False, None)]
        wide = tp > 1
        return [(v, wide == v) for v in (False, True) if (wide == v).any()]

    def chunk_program(self, chunk, wide: bool = False) -> ChunkProgram:
        key = (chunk_signature(self.model, chunk), wide)
        if key not in self._chunks:
            est = self._variants[wide]
            kept, dropped = est.chunk_parts(chunk)
            self._chunks[key] = ChunkProgram(tuple((n, self._part(est, wide, name, p)[0]) for n, name, p in kept),
                                             tuple(self._part(est, wide, name, p)[1] for name, p in dropped))
        return self._chunks[key]

    def _part(self, est: Estimate, wide: bool, name: str, policy) -> tuple[ExactFunction, ExactFunction]:
        """The compiled bytes a ledger's kept and dropped entries take (:meth:`~memlib.device.estimate.Estimate.part_expressions`)."""
        key = (wide, name, policy)
        if key not in self._parts:
            self._parts[key] = tuple(ExactFunction(x) for x in est.part_expressions(name, policy))
        return self._parts[key]

    def states_program(self, stage: Stage, zero: ZeroStage) -> dict[str, ExactFunction]:
        """The terms of :meth:`~memlib.device.estimate.Estimate.stage_states`: :func:`memlib.model.states.states_formula`
        compiled once per ZeRO stage, its counts P_ne and P_e (:meth:`~memlib.device.estimate.Estimate.stage_counts`)
        once per stage signature, and the one fed into the other (no SymPy ceilings over each stage's sums)."""
        sig = stage_signature(self.model, stage)
        key = (sig, zero)
        if key not in self._states:
            counts = self.base.stage_counts(stage)
            self.counts_program(stage)
            if zero not in self._formulas:
                edp = {sym("EDP"): counts[sym("EDP")]}
                terms = states_formula(zero, self.base.recipe).map(lambda e: e.xreplace(edp))
                self._formulas[zero] = {k: ExactFunction(x, self._counts[sig]) for k, x in terms.items()}
            self._states[key] = {k: f.with_inputs(self._counts[sig]) for k, f in self._formulas[zero].items()}
        return self._states[key]

    def counts_program(self, stage: Stage) -> dict[sp.Symbol, ExactFunction]:
        """P_ne and P_e of a stage's device (:meth:`~memlib.device.estimate.Estimate.stage_counts`), compiled once per
        stage signature."""
        sig = stage_signature(self.model, stage)
        if sig not in self._counts:
            counts = self.base.stage_counts(stage)
            self._counts[sig] = {x: ExactFunction(counts[x]) for x in (P_ne, P_e)}
        return self._counts[sig]

    def pipeline(self, pp: int = 1, schedule: Schedule | str = "1f1b", vpp: int = 1,
                 layout: Sequence[int] | None = None) -> "Pipeline":
        key = (pp, Schedule(schedule), vpp, None if layout is None else tuple(layout))
        if key not in self._pipelines:
            self._pipelines[key] = Pipeline(self, *key)
        return self._pipelines[key]


@dataclass(frozen=True)
class Totals:
    """Per-stage bytes of N configurations: arrays of shape (stages, N)."""

    allocated: np.ndarray
    total: np.ndarray

    def peak(self) -> tuple[np.ndarray, np.ndarray]:
        """The peak ``total`` of each configuration and its stage (the first such, as
        :attr:`memlib.device.estimate.Estimate.peak`)."""
        idx = np.argmax(self.total, axis=0)
        return self.total[idx, np.arange(self.total.shape[1])], idx


class Pipeline:
    """A family over PP ranks: the stages of (PP, schedule, V, layout), with their programs."""

    def __init__(self, family: Family, pp: int, schedule: Schedule, vpp: int, layout: tuple | None):
        self.family = family
        m = family.model
        # a number of micro-batches valid for the schedule's checks (the replay takes each M apart)
        m0 = {Schedule.GPIPE: 1, Schedule.DUALPIPE: 2 * pp, Schedule.INTERLEAVED: pp}.get(schedule)
        self.train = family.base.train.with_(pp=pp, schedule=schedule, vpp=vpp, layout=layout, num_microbatches=m0)
        self.layout = resolve_layout(m, self.train)
        self.stages: list[Stage] = build_stages(self.layout, self.train)
        self._moments: dict[tuple[int, int | None], list[Moment]] = {}

    def replay(self, ms: np.ndarray) -> np.ndarray:
        """The micro-batches the replay runs (:func:`memlib.device.schedule.replay_microbatches`) for each M of
        ``ms`` (-1: the schedule's default, kept as -1): the activations depend on M through it only."""
        if self.train.schedule is Schedule.GPIPE:
            return ms
        return np.where(ms < 0, -1, np.minimum(ms, self._saturation))

    @cached_property
    def _saturation(self) -> int:
        return replay_microbatches(self.train, saturate=True)

    @cached_property
    def replay_rule(self) -> tuple:
        """How :meth:`replay` maps M to the micro-batches the replay runs: every M (GPipe), or M capped at the
        schedule's saturation.  Pipelines of one rule give equal replays for equal rows: part of every cache
        key of values computed from them."""
        if self.train.schedule is Schedule.GPIPE:
            return ("every",)
        return ("capped", self._saturation)

    def moments(self, rank: int, m: int | None) -> list[Moment]:
        """The replay's candidate moments of ``rank`` with M = ``m`` micro-batches (they depend on M only
        through the micro-batches the replay runs, :func:`memlib.device.schedule.replay_microbatches`)."""
        key = (rank, None if m is None else int(self.replay(np.asarray([m]))[0]))
        if key not in self._moments:
            self._moments[key] = moments(self.train.with_(num_microbatches=m), rank)
        return self._moments[key]

    def evaluate(self, *, zero, num_microbatches=None, cache: dict | None = None, **knobs) -> Totals:
        """Allocated and total bytes of every stage for rows of knobs (arrays of equal length; ``seq_len``,
        ``micro_batch``, ``dp``, ``tp``, ``ep``, ``etp``, ``cp``; ``zero`` 0..3; ``num_microbatches``: M, or
        None for the schedule's default).  ``cache``: a dict kept by the caller for these very rows, so that
        pipelines over the same rows evaluate each chunk's and stage's program once."""
        allocated = None
        for r, row in enumerate(self._allocated(zero, num_microbatches, cache, knobs)):
            if allocated is None:
                allocated = np.zeros((len(self.stages), len(row)), dtype=np.int64)
            if row.dtype == object and allocated.dtype != object:
                allocated = allocated.astype(object)
            allocated[r] = row
        return Totals(allocated, self._total(allocated))

    def peak(self, *, zero, num_microbatches=None, cache: dict | None = None, **knobs) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`evaluate`'s ``Totals.peak()`` (the peak total of each row and its first stage), without the
        stages x rows arrays: the largest allocated bytes so far and their stage, kept stage by stage (the total
        rises strictly with the allocated bytes, so both peak at the same first stage)."""
        best = where = None
        for r, row in enumerate(self._allocated(zero, num_microbatches, cache, knobs)):
            if best is None:            # (each row is a new array: kept as it is)
                best, where = row, np.zeros(len(row), dtype=np.int64)
                continue
            if row.dtype == object and best.dtype != object:
                best = best.astype(object)
            higher = row > best
            best = np.where(higher, row, best) if best.dtype == object or row.dtype == object else \
                np.maximum(best, row, out=best)
            where[higher] = r
        return self._total(best), where

    def _total(self, allocated: np.ndarray) -> np.ndarray:
        """Total bytes from allocated bytes: plus the CUDA context and the communication buffers, and the
        fragmentation (rounded up), as :class:`~memlib.device.overhead.Overheads` does."""
        ov = self.family.overhead
        frag = ov.fragmentation
        if allocated.dtype != object and _mag(allocated) * max(frag.numerator, 1) + int(ov.cuda_context) + \
                int(ov.comm_buffers) >= _LIMIT:
            allocated = allocated.astype(object)
        return allocated + int(ov.cuda_context) + int(ov.comm_buffers) + \
            (-((-allocated * frag.numerator) // frag.denominator))

    def _allocated(self, zero, num_microbatches, cache: dict | None, knobs: Mapping):
        """The allocated bytes of each stage in turn, an array over the rows."""
        env = {k: np.asarray(knobs[k], dtype=np.int64) for k in KNOBS}
        n = len(env["dp"])
        if cache is None:               # within this call: each knob subset's distinct rows found once
            cache = {}
        zero = np.broadcast_to(np.asarray(zero, dtype=np.int64), (n,))
        if num_microbatches is None or np.ndim(num_microbatches) == 0:
            num_microbatches = [num_microbatches] * n
        if isinstance(num_microbatches, np.ndarray) and num_microbatches.dtype.kind in "iu":
            ms = num_microbatches.astype(np.int64, copy=False)
        else:
            ms = np.asarray([-1 if x is None else x for x in num_microbatches], dtype=np.int64)
        fam = self.family
        # rows keyed by the replay their M gives (a longer M only repeats moments): one M of each stands for it
        reps = self.replay(ms)
        # (the counts are not used: np.unique without them imports numpy.ma, about 12 ms in a fresh process)
        zs = tuple(ZeroStage(z) for z in np.unique(zero, return_counts=True)[0])

        # the model states depend on the knobs of their programs and on ZeRO only: evaluated once per distinct
        # row of those (a search's rows differ mostly in b and M, which they do not depend on)
        sprogs = [{z: fam.states_program(st, z) for z in zs} for st in self.stages]
        skeys = tuple(k for k in KNOBS if any(k in f.knobs for row in sprogs for prog in row.values()
                                               for f in prog.values()))
        sukey = ("state rows", skeys)
        if sukey not in cache:
            uenv, inverse = _unique_rows([env[k] for k in skeys], skeys) if skeys else ({}, np.zeros(n, dtype=np.int64))
            cache[sukey] = (_Env(uenv), inverse)
        s_env, s_inverse = cache[sukey]
        s_n = len(s_env[skeys[0]]) if skeys else 1
        zpos = np.searchsorted(np.asarray(zs, dtype=np.int64), zero)       # each row's ZeRO among zs

        for r, st in enumerate(self.stages):
            skey = (sukey, "states", stage_signature(fam.model, st), zs)
            if skey not in cache:
                table = []                  # per ZeRO stage of zs: the states of each distinct row
                for z in zs:
                    prog = sprogs[r][z]
                    part = prog["parameters"](s_env, s_n)
                    for k in ("gradients", "optimizer_states"):
                        part = _add(part, prog[k](s_env, s_n))
                    table.append(part)
                cache[skey] = np.stack(table) if all(t.dtype != object for t in table) else \
                    np.stack([t.astype(object) for t in table])
            states = cache[skey][zpos, s_inverse]

            # the activations depend on the chunk programs' knobs and on M's replay only
            progs = [[(wide, fam.chunk_program(c, wide)) for wide in fam._variants] for c in st.chunks]
            akeys = tuple(k for k in KNOBS if k == "tp" and len(fam._variants) > 1 or any(
                k in pr.knobs for row in progs for _, pr in row))
            # the rows' distinct values of those knobs and of the replay their M gives: the replay depends on the
            # pipeline's rule (GPipe holds all M, the others cap it), so the rule is part of the key
            ukey = ("activation rows", akeys, self.replay_rule)
            if ukey not in cache:
                uenv, inverse = _unique_rows([env[k] for k in akeys] + [reps], akeys + ("R",))
                cache[ukey] = (uenv, inverse)
            uenv, inverse = cache[ukey]
            un = len(uenv["R"])
            per, work = [], []
            for row in progs:
                p = w = None
                for wide, mask in fam.variants(uenv["tp"] if "tp" in uenv else np.ones(un, dtype=np.int64)):
                    prog = dict(row)[wide]
                    pv, wv = _chunk_on(cache, ukey, prog, uenv, un)
                    p = pv if mask is None or p is None else np.where(mask, pv, p)
                    w = wv if mask is None or w is None else np.where(mask, wv, w)
                per.append(p)
                work.append(w)
            act = None
            u_reps = uenv["R"]
            replays = np.unique(u_reps, return_counts=True)[0]
            for rv in replays.tolist():
                moments_r = self.moments(r, None if rv < 0 else rv)
                # int64 holds every candidate unless the largest could pass 2^62: then exact Python integers
                bound = sum(max(mo.counts[c] for mo in moments_r) * _mag(per[c]) for c in range(len(per))) + \
                    max([_mag(x) for x in work] + [0])
                pw = [_obj(x) for x in per] if bound >= _LIMIT else per
                ww = [_obj(x) for x in work] if bound >= _LIMIT else work
                best = None
                for mo in moments_r:
                    v = sum(k * pw[c] for c, k in enumerate(mo.counts))
                    if mo.running:
                        w = ww[mo.running[0]]
                        for c in mo.running[1:]:
                            w = np.maximum(w, ww[c])
                        v = v + np.maximum(w, 0)
                    best = v if best is None else np.maximum(best, v)
                act = best if act is None else np.where(u_reps == rv, best, act)
            yield _add(states, act[inverse])

    def evaluate_configs(self, trains: Sequence[TrainingConfig]) -> Totals:
        """:meth:`evaluate` on training configurations (their knobs; each must match this pipeline)."""
        knobs = {k: [getattr(t, k) for t in trains] for k in KNOBS}
        return self.evaluate(zero=[t.zero for t in trains],
                             num_microbatches=[t.num_microbatches for t in trains], **knobs)


def compiled_totals(model, train: TrainingConfig, overhead: Overheads | None = None) -> Totals:
    """One configuration through the compiled path (for checks against :func:`~memlib.device.estimate.estimate`)."""
    fam = Family(model, train, overhead)
    pipe = fam.pipeline(train.pp, train.schedule, train.vpp, train.layout)
    return pipe.evaluate_configs([train])

