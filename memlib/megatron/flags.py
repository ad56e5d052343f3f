"""Megatron-LM's own launch flags read as a memlib configuration (``memlib estimate --megatron-args``).

:func:`parse_megatron_args` reads the flags of a ``pretrain_gpt.py`` run and returns a
:class:`MegatronRun`: the :class:`~memlib.config.ModelConfig`, the
:class:`~memlib.config.TrainingConfig` (profile ``megatron``), the flags it mapped, the flags known
not to change memory, and the flags memlib does not model (one warning line).  Semantics and
defaults are Megatron-LM's at commit d98e8a64dd (``megatron/training/arguments.py``,
``megatron/core/transformer/transformer_config.py``) and megatron-core 0.19.2; a ``pretrain_gpt.py``
run is assumed (its default tokenizer is ``GPT2BPETokenizer``).

Input
    * a shell launch script: backslash continuations, ``torchrun ... pretrain_gpt.py --flag value``,
      bash arrays (``GPT_ARGS=( --num-layers 4 ... )``); variables such as ``${X}`` are left as they
      are, and a flag memlib maps whose value is one is an error (memlib does not run the shell);
    * a plain list of flags (``--flag value`` or ``--flag=value``);
    * a Megatron-LM functional test's ``model_config.yaml``: its ``MODEL_ARGS`` mapping, read as
      ``tests/functional_tests/shell_test_utils/_run_training.sh`` turns it into a command line:
      ``true`` is a switch, ``false`` leaves the flag out, ``"[a b c]"`` is a list of values.

    A script is read, not run: every flag written in it counts, inside a conditional or not, and the
    last occurrence of a flag wins, as with argparse; ``ENV_VARS`` (``NVTE_*`` variables that steer
    Transformer Engine's choice of attention kernel) are not read.  The world size is not a Megatron-LM flag
    (it is the launcher's ``WORLD_SIZE``): it comes from ``world_size=``, from a ``--world-size N``
    line of the file, or from torchrun's ``--nproc_per_node`` and ``--nnodes`` when both are numbers.

Model (Hugging Face field <- Megatron-LM flag)
    ``num_hidden_layers`` <- ``--num-layers``; ``hidden_size`` <- ``--hidden-size``;
    ``num_attention_heads`` <- ``--num-attention-heads``; ``intermediate_size`` <- ``--ffn-hidden-size``
    (default ``4h``, or with ``--swiglu`` ``int(8h/3/64)*64``); ``moe_intermediate_size`` <-
    ``--moe-ffn-hidden-size`` (default the FFN's); ``n_routed_experts`` <- ``--num-experts``;
    ``n_shared_experts`` <- ``--moe-shared-expert-intermediate-size / --moe-ffn-hidden-size`` (it must
    divide); ``num_experts_per_tok`` <- ``--moe-router-topk`` (default 2); ``first_k_dense_replace``
    and ``moe_layer_freq`` <- ``--moe-layer-freq`` (an int N: every N-th layer; or a list expression
    such as ``([0]*3+[1]*58)``, parsed, never evaluated, that must be "k dense layers, then every f-th");
    ``qk_nope_head_dim`` <- ``--qk-head-dim`` (128), ``qk_rope_head_dim`` <- ``--qk-pos-emb-head-dim``
    (64), ``v_head_dim`` <- ``--v-head-dim`` (128), ``q_lora_rank`` <- ``--q-lora-rank`` (none: queries
    projected directly), ``kv_lora_rank`` <- ``--kv-lora-rank`` (32); ``num_nextn_predict_layers`` <-
    ``--mtp-num-layers``; ``tie_word_embeddings`` unless ``--untie-embeddings-and-output-weights``;
    ``router_bias`` <- ``--moe-router-enable-expert-bias``; ``n_group``/``topk_group`` <-
    ``--moe-router-num-groups``/``--moe-router-group-topk``; ``scoring_func`` <-
    ``--moe-router-score-function`` (default softmax).  Without ``--multi-latent-attention`` the model
    cannot be expressed (memlib models MLA only).  A model without ``--num-experts`` is dense: every
    layer is dense (``first_k_dense_replace = num_hidden_layers``) and the expert fields are placeholders
    no layer uses (one expert of the FFN's width).

Vocabulary
    The tokenizer's size before padding: memlib's own ``vocab_size=`` (``memlib estimate
    --vocab-size``) if given; else the file's ``--vocab-size`` for ``NullTokenizer`` (its size) and
    ``TikTokenizer`` (default 2^17); else :data:`TOKENIZER_SIZES`.  It is then padded as
    ``megatron/core/tokenizers/utils/build_tokenizer.py`` ``vocab_size_with_padding`` does: up to a
    multiple of ``--make-vocab-size-divisible-by`` (128) times TP.  ``--padded-vocab-size`` is used as
    it is.

Parallelism
    DP = world / (TP PP CP); ETP defaults to TP; EP ETP must divide DP TP CP; M = GBS / (MBS DP).
    ``--use-distributed-optimizer`` is ZeRO-1.  Sequence parallelism only with TP > 1 (Megatron turns it
    off at TP 1).  VPP from the layout, ``--num-virtual-stages-per-pipeline-rank`` (alias
    ``--virtual-pipeline-model-parallel-size``) or ``--num-layers-per-virtual-pipeline-stage``: the
    ``interleaved`` schedule; otherwise ``1f1b``.  The decoder layers of every (virtual) stage are worked
    out as Megatron-Core does (``transformer_block.py`` ``get_num_layers_to_build``), uneven first and
    last stages and ``--account-for-embedding/loss-in-pipeline-split`` included, and passed to memlib
    as an explicit layout.

Layout strings
    ``--pipeline-model-parallel-layout`` is Megatron-Core's grammar
    (``megatron/core/transformer/pipeline_parallel_layer_layout.py``): ``E`` embedding, ``t`` decoder
    layer, ``m`` MTP layer, ``L`` loss, ``|`` between stages, ``(...)*N`` and ``x*N`` repetitions,
    commas ignored.  Its stages are the virtual stages in Megatron's order: stage ``v PP + r`` is
    virtual stage ``v`` of pipeline rank ``r``, which is memlib's order of model chunks
    (:meth:`memlib.config.Schedule.rank_chunks`), so the decoder-layer count of each stage is memlib's
    layout entry.  memlib keeps the embedding on the first stage and the head, loss and MTP modules on
    the last: a layout that puts ``E`` elsewhere, or ``L`` or ``m`` elsewhere, is refused.

Precision
    ``--bf16`` is the ``megatron`` recipe, ``--fp16`` ``megatron-fp16``, neither ``fp32``;
    ``--fp8-param-gather`` ``megatron-fp8-param``.  ``--grad-reduce-in-bf16`` (a bf16 main_grad buffer)
    and ``--use-precision-aware-optimizer`` with ``--main-grads-dtype``, ``--main-params-dtype``,
    ``--exp-avg-dtype`` and ``--exp-avg-sq-dtype`` change a preset by a recipe spec
    (:func:`memlib.model.states.recipe`), see :func:`precision_spec`.  ``--fp8-format`` and ``--fp8-recipe``
    set :attr:`~memlib.config.TrainingConfig.fp8`: Linear inputs saved in FP8, FP8 weight copies
    (:mod:`memlib.device.peak`).

Warnings and errors
    Every flag is mapped, known not to change memory (learning rate, logging, data and checkpoint
    paths, initialisation, evaluation, seeds, timeouts, ...), or not modelled: everything else,
    unknown flags included, and Megatron-LM defaults that differ from what memlib counts (biases, a
    LayerNorm, learned position embeddings, dropout, ...).  The not-modelled flags are one warning line
    (:meth:`MegatronRun.warning`).  A flag memlib maps whose value it cannot express, a missing
    required flag and flags that contradict each other raise :class:`~memlib.config.ConfigError` with
    one line.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping, Optional

from ..ledgers.base import MODULES as RECOMPUTE_MODULES
from ..config import (
    FP8_FORMATS, FP8_RECIPES, LIMITS, OFFLOAD_MODULES, ConfigError, ModelConfig, TrainingConfig, model_from_dict,
    show,
)
from ..config.strategies import AttnBackend, CrossEntropyFusionImpl, LoadBalancing, TransformerImpl
from ..device.peak import Framework
from ..model.states import DTYPE_BYTES, RECIPES, recipe
from ..core.units import parse_number

__all__ = ["MegatronRun", "Flag", "parse_megatron_args", "read_flags", "parse_layout", "layout_stages",
           "MegatronLayout", "megatron_layout", "moe_layer_pattern", "pattern_to_hf", "pad_vocab",
           "precision_spec", "TOKENIZER_SIZES", "SOURCE", "MAX_ARGS_BYTES"]

#: where the semantics come from
SOURCE = "NVIDIA/Megatron-LM at d98e8a64dd and megatron-core 0.19.2"

#: the largest flag file memlib reads (a launch script or model_config.yaml is a few kilobytes)
MAX_ARGS_BYTES = 2**20
#: the most characters a layout string may unroll to
MAX_LAYOUT_CHARS = 2**20

#: tokenizers whose vocabulary size is public: (tokenizer type, model file or None) -> (size, source)
TOKENIZER_SIZES: dict[tuple[str, Optional[str]], tuple[int, str]] = {
    ("GPT2BPETokenizer", None): (
        50257, "GPT-2's byte-level BPE: 50,257 tokens, the <|endoftext|> end-of-document token included "
               "(Radford et al. 2019, 'Language Models are Unsupervised Multitask Learners', section 2.2); "
               "Megatron-Core's HuggingFaceTokenizer adds none (vocab_size = len(tokenizer)). A --vocab-file "
               "is assumed to be GPT-2's vocab.json"),
    ("GPTSentencePieceTokenizer", "nemotron_2_256k.model"): (
        256000, "the Nemotron-4 tokenizer: 256,000 SentencePiece tokens (Nemotron-4 15B Technical Report, "
                "arXiv 2402.16819, section 2; Megatron-LM's tests/functional_tests/test_cases/gpt/"
                "gpt3_15b_8t_release trains Nemotron-4 15B's architecture with this file); Megatron-Core's "
                "SentencePieceTokenizer counts get_piece_size() and adds no token"),
}
#: tokenizer types that read their vocabulary from a SentencePiece model file (--tokenizer-model)
_SENTENCEPIECE = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")
_TIKTOKEN_DEFAULT = 2**17       # megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py


# ------------------------------------------------------------------------------------------------
# reading the flags
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Flag:
    """One flag as written: ``--name`` and the words that follow it (none for a switch)."""

    name: str
    values: tuple[str, ...]
    line: int = 0        #: 1-based line of the input (0: a YAML mapping)


_FLAG = re.compile(r"--[A-Za-z][A-Za-z0-9_.-]*(=.*)?", re.S)
_ASSIGN_ARRAY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=\((.*)", re.S)
_PROGRAMS = {"torchrun", "python", "python3", "srun", "mpirun", "deepspeed", "bash", "sh", "exec", "env",
             "nsys", "numactl", "uv", "accelerate"}
_SHELL = {"(", ")", "|", "||", "&&", ";", "&", "\\", "{", "}", "then", "do", "done", "fi", "else"}


def _structure(tok: str) -> bool:
    """A token that ends a flag's values: shell syntax, a program or script, a redirection."""
    if tok in _SHELL or tok.startswith((">", "<", "2>", "1>", "&>")):
        return True
    base = tok.rsplit("/", 1)[-1]
    return base in _PROGRAMS or base.endswith((".py", ".sh"))


def _is_variable(tok: str) -> bool:
    return bool(re.fullmatch(r"\$\{?[A-Za-z_@*][A-Za-z0-9_]*(\[[@*]\])?\}?|\"?\$@\"?", tok))


def read_flags(text: str, name: str = "-") -> list[Flag]:
    """The flags of a launch script, a flag list or a ``model_config.yaml`` (its ``MODEL_ARGS``);
    ``name`` (the file) is what an error names."""
    where = f"megatron_args={show(name, 120)}"
    if not isinstance(text, str):
        raise ConfigError(f"{where} must be the text of a flag file, not {type(text).__name__}")
    if len(text) > MAX_ARGS_BYTES:
        raise ConfigError(f"{where}: {len(text):,} characters is more than a launch file holds "
                          f"(at most {MAX_ARGS_BYTES:,})")
    if "\x00" in text:
        raise ConfigError(f"{where}: the text holds a NUL byte; it must be a launch script, flags or YAML")
    if re.search(r"^MODEL_ARGS\s*:", text, re.M):
        return _yaml_flags(text, where)
    return _shell_flags(text, where)


def _yaml_flags(text: str, where: str) -> list[Flag]:
    import yaml   # PyYAML (pinned): a model_config.yaml is YAML

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise ConfigError(f"{where}: not valid YAML{at} ({problem})") from None
    except RecursionError:
        raise ConfigError(f"{where}: the YAML is nested too deeply to be a model_config.yaml") from None
    args = doc.get("MODEL_ARGS") if isinstance(doc, dict) else None
    if not isinstance(args, dict):
        raise ConfigError(f"{where}: MODEL_ARGS must be a mapping of flags to values (a model_config.yaml)")
    out = []
    for key, value in args.items():
        if not isinstance(key, str) or not _FLAG.fullmatch(key) or "=" in key:
            raise ConfigError(f"{where}: the MODEL_ARGS key {show(key)} must be a flag such as --num-layers")
        if value is False:
            continue                                # the flag is left out
        if value is True:
            values: tuple[str, ...] = ()
        elif value is None:
            values = ("null",)                      # what yq's tostring writes
        elif isinstance(value, (list, dict, set, tuple)):
            raise ConfigError(f"{where}: MODEL_ARGS {key}={show(value)} must be a scalar (a YAML "
                              f"{type(value).__name__} cannot be a command-line value)")
        else:
            t = str(value).strip()
            if t.startswith("[") and t.endswith("]"):
                values = tuple(t[1:-1].split())      # the runner strips the brackets; the shell splits
                if not values:
                    raise ConfigError(f"{where}: MODEL_ARGS {key}={show(t)} is an empty list")
            else:
                values = (t,)
        out.append(Flag(key, values, 0))
    return out


def _shell_flags(text: str, where: str) -> list[Flag]:
    out: list[Flag] = []
    logical, first = "", 0
    lines = text.splitlines()
    for n, raw in enumerate(lines, 1):
        if not logical:
            first = n
        if raw.endswith("\\") and not raw.endswith("\\\\"):
            logical += raw[:-1] + " "
            if n < len(lines):
                continue
        else:
            logical += raw
        out += _line_flags(logical, first, where)
        logical = ""
    return out


def _line_flags(line: str, lineno: int, where: str) -> list[Flag]:
    if "--" not in line:
        return []
    lex = shlex.shlex(line, posix=True)
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        tokens = list(lex)
    except ValueError as exc:
        raise ConfigError(f"{where}: line {lineno} cannot be split into words ({exc}): an unclosed quote?") \
            from None
    words: list[str] = []
    for tok in tokens:
        if tok.startswith("#"):
            break                                   # a comment (shell: a word that starts with #)
        mo = _ASSIGN_ARRAY.fullmatch(tok)
        if mo:                                      # NAME=( --flag ...: a bash array
            words.append("(")
            tok = mo.group(1)
            if not tok:
                continue
        if tok.endswith(")") and tok.count(")") > tok.count("("):
            words += [tok[:-1], ")"] if tok[:-1] else [")"]     # the array's closing parenthesis
            continue
        words.append(tok)
    out = []
    i = 0
    while i < len(words):
        tok = words[i]
        if not _FLAG.fullmatch(tok):
            i += 1
            continue
        name, eq, value = tok.partition("=")
        values = [value] if eq else []
        j = i + 1
        if not eq:
            while j < len(words) and not words[j].startswith("--") and not _structure(words[j]):
                values.append(words[j])
                j += 1
        out.append(Flag(name, tuple(values), lineno))
        i = j
    return out


# ------------------------------------------------------------------------------------------------
# typed access, with the one-line errors
# ------------------------------------------------------------------------------------------------
class _Flags:
    """The flags by name (the last occurrence wins), read by type; what is read counts as mapped."""

    def __init__(self, flags: list[Flag]):
        self.values: dict[str, tuple[str, ...]] = {}
        self.order: list[str] = []
        for f in flags:
            if f.name not in self.values:
                self.order.append(f.name)
            self.values[f.name] = f.values
        self.read: set[str] = set()
        #: flags of a field the caller overrides: a shell variable there is tolerated (read as absent)
        self.lenient: set[str] = set()
        self.unresolved: dict[str, str] = {}      #: such flags and their text

    def _get(self, name: str, aliases: tuple[str, ...] = ()) -> tuple[Optional[str], Optional[tuple[str, ...]]]:
        found = [(n, self.values[n]) for n in (name, *aliases) if n in self.values]
        for n, _ in found:
            self.read.add(n)
        if len(found) > 1 and len({v for _, v in found}) > 1:
            raise ConfigError(f"{found[0][0]}={' '.join(found[0][1]) or 'on'} and {found[1][0]}="
                              f"{' '.join(found[1][1]) or 'on'} are one flag under two names with different values")
        return found[0] if found else (None, None)

    def has(self, name: str, *aliases: str) -> bool:
        """Whether the flag is given (it is not marked as read)."""
        return any(n in self.values for n in (name, *aliases))

    def switch(self, name: str, *aliases: str) -> bool:
        n, v = self._get(name, aliases)
        if n is None:
            return False
        rest = [x for x in v if not _is_variable(x)]
        if rest:
            raise ConfigError(f"{n}={show(' '.join(v))}: the flag is a switch and takes no value")
        return True

    def one(self, name: str, *aliases: str) -> Optional[str]:
        n, v = self._get(name, aliases)
        if n is None:
            return None
        if len(v) != 1:
            raise ConfigError(f"{n}={show(' '.join(v))} takes one value, not {len(v)}" if v else
                              f"{n}='' takes a value (none is given)")
        t = v[0]
        if "$" in t or "`" in t:
            if n in self.lenient:
                self.unresolved[n] = t
                return None
            raise ConfigError(f"{n}={show(t)} is a shell variable or command memlib does not resolve; "
                              f"write the value (or give the memlib option that overrides it)")
        return t

    def text(self, name: str) -> Optional[str]:
        """The value as written, shell variables and all (a path memlib only reads the name of)."""
        n, v = self._get(name)
        return None if n is None else " ".join(v)

    def many(self, name: str, *aliases: str) -> Optional[tuple[str, ...]]:
        """A list flag (argparse ``nargs='+'``); one word ``[a b c]`` is Megatron's list syntax of the
        functional tests, read as its words."""
        n, v = self._get(name, aliases)
        if n is None:
            return None
        if len(v) == 1 and v[0].startswith("[") and v[0].endswith("]"):
            v = tuple(v[0][1:-1].split())
        if not v:
            raise ConfigError(f"{n}='' takes one or more values (none is given)")
        for t in v:
            if "$" in t or "`" in t:
                if n in self.lenient:
                    self.unresolved[n] = " ".join(v)
                    return None
                raise ConfigError(f"{n}={show(t)} is a shell variable or command memlib does not resolve; "
                                  f"write the value (or give the memlib option that overrides it)")
        return v

    def int(self, name: str, default: Optional[int] = None, *aliases: str, minimum: int = 1,
            bound: Optional[int] = None) -> Optional[int]:
        t = self.one(name, *aliases)
        if t is None:
            return default
        body = t[1:] if t[:1] in "+-" else t
        if not (0 < len(body) <= 20 and all("0" <= c <= "9" for c in body)):
            rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise ConfigError(f"{name}={show(t)} must be {rule}")
        x = int(t)
        if x < minimum:
            rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise ConfigError(f"{name}={t} must be {rule}")
        bound = LIMITS["width"] if bound is None else bound
        if x > bound:
            raise ConfigError(f"{name}={t} exceeds {bound:,}, the largest memlib accepts")
        return x

    def number(self, name: str, default: Fraction) -> Fraction:
        t = self.one(name)
        return default if t is None else _fraction(name, t)

    def choice(self, name: str, default: Optional[str], choices: tuple[str, ...], *aliases: str) -> Optional[str]:
        t = self.one(name, *aliases)
        if t is None:
            return default
        if t not in choices:
            raise ConfigError(f"{name}={show(t)} must be one of {', '.join(choices)}")
        return t


def _fraction(name: str, t: str) -> Fraction:
    try:
        return parse_number(t)          # bounded: an exponent of 10^9 is refused, not computed
    except ValueError as exc:
        raise ConfigError(f"{name}={show(t)} {exc}") from None


# ------------------------------------------------------------------------------------------------
# --moe-layer-freq
# ------------------------------------------------------------------------------------------------
def moe_layer_pattern(text: str, num_layers: int) -> tuple[int, ...]:
    """``--moe-layer-freq`` as one 0 (dense) or 1 (MoE) per layer: an integer N (layer i is MoE when
    i % N == 0, ``gpt_layer_specs.py``) or a list expression of Megatron's restricted grammar
    (``megatron/training/arguments.py`` ``moe_freq_type``: ``[0]*3+[1]*58``, ``([1]*3+[0]*1)*3``, a
    plain list), parsed here and never evaluated.

    >>> moe_layer_pattern("([0]*1+[1]*3)", 4)
    (0, 1, 1, 1)
    >>> moe_layer_pattern("2", 5)
    (1, 0, 1, 0, 1)
    """
    name = "--moe-layer-freq"
    t = text.strip()
    if "[" not in t:
        if not (0 < len(t) <= 6 and all("0" <= c <= "9" for c in t)) or int(t) < 1:
            raise ConfigError(f"{name}={show(t)} must be a positive integer or a list expression such as "
                              f"([0]*3+[1]*58)")
        n = int(t)
        return tuple(1 if i % n == 0 else 0 for i in range(num_layers))
    if re.search(r"[^,\d\[\]()+*]", t):
        raise ConfigError(f"{name}={show(t)}: a list expression may hold only digits, commas, [ ] ( ) + and * "
                          f"(Megatron-LM's rule; no spaces)")
    pattern = _ListExpr(t, name, limit=LIMITS["num_hidden_layers"]).parse()
    if any(x not in (0, 1) for x in pattern):
        raise ConfigError(f"{name}={show(t)}: every entry must be 0 (dense) or 1 (MoE)")
    if len(pattern) != num_layers:
        raise ConfigError(f"{name}={show(t)} gives {len(pattern)} layers but --num-layers={num_layers}")
    return tuple(pattern)


class _ListExpr:
    """expr := term ('+' term)*; term := factor ('*' INT)* | INT '*' factor; factor := '[' ints ']' | '(' expr ')'."""

    def __init__(self, text: str, name: str, limit: int):
        self.t, self.i, self.name, self.limit = text, 0, name, limit

    def _fail(self, what: str):
        raise ConfigError(f"{self.name}={show(self.t)}: {what} at character {self.i + 1}")

    def parse(self) -> list[int]:
        out = self.expr(0)
        if self.i != len(self.t):
            self._fail(f"unexpected {self.t[self.i]!r}")
        return out

    def _peek(self) -> str:
        return self.t[self.i] if self.i < len(self.t) else ""

    def _int(self) -> int:
        j = self.i
        while self.i < len(self.t) and self.t[self.i].isdigit():
            self.i += 1
        if j == self.i or self.i - j > 6:
            self._fail("a number of at most 6 digits is expected")
        return int(self.t[j:self.i])

    def _times(self, items: list[int], n: int) -> list[int]:
        if len(items) * n > self.limit:
            self._fail(f"the list grows past {self.limit:,} layers")
        return items * n

    def expr(self, depth: int) -> list[int]:
        if depth > 20:
            self._fail("parentheses nested too deeply")
        out = self.term(depth)
        while self._peek() == "+":
            self.i += 1
            out = out + self.term(depth)
            if len(out) > self.limit:
                self._fail(f"the list grows past {self.limit:,} layers")
        return out

    def term(self, depth: int) -> list[int]:
        if self._peek().isdigit():                  # N*[...]
            n = self._int()
            if self._peek() != "*":
                self._fail("'*' is expected after a repetition count")
            self.i += 1
            return self._times(self.factor(depth), n)
        out = self.factor(depth)
        while self._peek() == "*":
            self.i += 1
            out = self._times(out, self._int())
        return out

    def factor(self, depth: int) -> list[int]:
        c = self._peek()
        if c == "(":
            self.i += 1
            out = self.expr(depth + 1)
            if self._peek() != ")":
                self._fail("')' is expected")
            self.i += 1
            return out
        if c == "[":
            self.i += 1
            items: list[int] = []
            while self._peek() != "]":
                items.append(self._int())
                if self._peek() == ",":
                    self.i += 1
                elif self._peek() != "]":
                    self._fail("',' or ']' is expected")
            self.i += 1
            return items
        self._fail("'[' or '(' is expected")
        return []


def pattern_to_hf(pattern: tuple[int, ...]) -> tuple[int, int]:
    """``(first_k_dense_replace, moe_layer_freq)`` with Hugging Face's rule (layer i is MoE iff
    i >= k and i % f == 0) giving ``pattern``; a ConfigError when no pair does.

    >>> pattern_to_hf((0, 0, 0, 1, 1, 1))
    (3, 1)
    >>> pattern_to_hf((1, 0, 1, 0))
    (0, 2)
    """
    n = len(pattern)
    ones = [i for i, x in enumerate(pattern) if x]
    if not ones:
        return n, 1
    k = ones[0]
    candidates = [ones[1] - ones[0]] if len(ones) > 1 else [f for f in (k, n) if f >= 1]
    for f in candidates:
        if all(bool(x) == (i >= k and i % f == 0) for i, x in enumerate(pattern)):
            return k, f
    text = "".join(map(str, pattern))
    raise ConfigError(f"--moe-layer-freq={show(text, 80)} (1: MoE) is a layer pattern memlib cannot "
                      f"express: it needs k dense layers, then MoE on every f-th layer (first_k_dense_replace, "
                      f"moe_layer_freq)")


# ------------------------------------------------------------------------------------------------
# pipeline layouts
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MegatronLayout:
    """A ``--pipeline-model-parallel-layout`` string and its stages (each a string of E, t, m, L)."""

    text: str
    stages: tuple[str, ...]

    def __str__(self) -> str:
        return self.text


def parse_layout(text: str, name: str = "--pipeline-model-parallel-layout") -> MegatronLayout:
    """Megatron-Core's layout grammar, unrolled as ``PipelineParallelLayerLayout.parse_str_to_list``
    does (commas dropped, then ``(...)*N``, then ``x*N``, each one pass), with a bound on the size.

    >>> parse_layout("Et|(tt|)*2mL").stages
    ('Et', 'tt', 'tt', 'mL')
    """
    if not isinstance(text, str) or len(text) > 10_000:
        raise ConfigError(f"{name}={show(text)} must be a layout string of at most 10,000 characters")
    s = text.replace(",", "")
    total = [len(s)]

    def unroll(mo) -> str:
        digits = mo.group(2)
        if len(digits) > 9:
            raise ConfigError(f"{name}={show(text)}: the repetition {digits[:12]}... is too large")
        n = int(digits)
        total[0] += len(mo.group(1)) * n
        if total[0] > MAX_LAYOUT_CHARS:
            raise ConfigError(f"{name}={show(text)} unrolls to more than {MAX_LAYOUT_CHARS:,} characters")
        return mo.group(1) * n

    s = re.sub(r"\(([^)]+)\)\*(\d+)", unroll, s)
    s = re.sub(r"(.)\*(\d+)", unroll, s)
    stages = tuple(s.split("|"))
    for st in stages:
        bad = [c for c in st if c not in "EtmL"]
        if bad:
            raise ConfigError(f"{name}={show(text)}: {bad[0]!r} is not a layer (E embedding, t decoder layer, "
                              f"m MTP layer, L loss; | between stages, (...)*N and x*N repeat)")
    return MegatronLayout(text, stages)


def layout_stages(lay: MegatronLayout, pp: int, num_layers: int, mtp_layers: Optional[int],
                  name: str = "--pipeline-model-parallel-layout") -> tuple[tuple[int, ...], int]:
    """memlib's layout (decoder layers per virtual stage, in order) and VPP, from a Megatron layout:
    Megatron-Core's checks (``validate_layer_layout``), then memlib's placement of the ends.
    ``mtp_layers=None`` accepts a layout without MTP layers or with any count."""
    text = lay.text if len(lay.text) <= 80 else show(lay.text)
    st = lay.stages
    if len(st) % pp:
        raise ConfigError(f"{name}={text} has {len(st)} stages, not a multiple of pp={pp}")
    vpp = len(st) // pp
    flat = "".join(st)
    if not flat or flat[0] != "E" or flat[-1] != "L" or flat.count("E") != 1 or flat.count("L") != 1:
        raise ConfigError(f"{name}={text}: the embedding E must come first and the loss L last, once each")
    if flat.count("t") != num_layers:
        raise ConfigError(f"{name}={text} places {flat.count('t')} decoder layers but the model has {num_layers}")
    m = flat.count("m")
    if mtp_layers is not None and m != mtp_layers:
        raise ConfigError(f"{name}={text} places {m} MTP layers but --mtp-num-layers gives {mtp_layers}")
    if m and "t" in flat[flat.index("m"):]:
        raise ConfigError(f"{name}={text}: decoder layers must come before the MTP layers")
    if "E" not in st[0] or "L" not in st[-1] or any("m" in x for x in st[:-1]):
        raise ConfigError(f"{name}={text}: memlib keeps the embedding on the first stage and the head, loss and MTP "
                          f"layers on the last ({len(st)} stages: E in stage {_where(st, 'E')}, L in stage "
                          f"{_where(st, 'L')}" + (f", m in stage {_where(st, 'm')}" if m else "") + ")")
    return tuple(x.count("t") for x in st), vpp


def _where(stages: tuple[str, ...], c: str) -> str:
    return ",".join(str(i) for i, x in enumerate(stages) if c in x) or "none"


def megatron_layout(num_layers: int, pp: int, vpp: int, first: Optional[int] = None, last: Optional[int] = None,
                    embedding_in_split: bool = False, loss_in_split: bool = False) -> tuple[int, ...]:
    """Decoder layers per virtual stage (memlib's order: chunk v of rank r is entry v PP + r) as
    Megatron-Core builds them without a layout string (``transformer_block.py``
    ``get_num_layers_to_build``, checked as ``TransformerConfig.__post_init__`` checks them).

    >>> megatron_layout(8, 2, 2)
    (2, 2, 2, 2)
    >>> megatron_layout(10, 4, 1, first=1, last=3)
    (1, 3, 3, 3)
    >>> megatron_layout(6, 2, 1, embedding_in_split=True, loss_in_split=True)
    (3, 3)
    """
    uneven = first is not None or last is not None
    if uneven and (embedding_in_split or loss_in_split):
        raise ConfigError(f"--decoder-first/last-pipeline-num-layers={first}/{last} cannot be used with "
                          f"--account-for-embedding/loss-in-pipeline-split (Megatron-Core refuses the pair)")
    per_rank: list[int]
    if uneven:
        if pp == 1:
            raise ConfigError(f"--decoder-first/last-pipeline-num-layers need pp > 1 (pp={pp})")
        middle_layers = num_layers - (first or 0) - (last or 0)
        middle_stages = pp - (first is not None) - (last is not None)
        if middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
            raise ConfigError(f"--num-layers={num_layers} with first={first} and last={last} on pp={pp}: "
                              f"{middle_layers} layers left for {middle_stages} middle stages")
        if middle_stages and middle_layers % middle_stages:
            raise ConfigError(f"--num-layers={num_layers}: the {middle_layers} middle layers must divide evenly "
                              f"over the {middle_stages} middle pipeline stages")
        mid = middle_layers // middle_stages if middle_stages else 0
        per_rank = [mid] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
        for r, k in enumerate(per_rank):
            if k % vpp:
                raise ConfigError(f"pipeline rank {r} has {k} layers, not a multiple of vpp={vpp} "
                                  f"(Megatron-Core splits each rank's layers evenly over its virtual stages)")
    else:
        n = num_layers + embedding_in_split + loss_in_split
        if n % pp:
            extra = " (with the embedding/loss counted as layers)" if embedding_in_split or loss_in_split else ""
            raise ConfigError(f"--num-layers={num_layers}{extra} must be divisible by pp={pp} (Megatron-LM's "
                              f"even split; or give --pipeline-model-parallel-layout or uneven first/last stages)")
        if (n // pp) % vpp:
            raise ConfigError(f"--num-layers={num_layers}: the {n // pp} layers of each pipeline rank must be "
                              f"divisible by vpp={vpp}")
        per_rank = [n // pp] * pp
    out = [per_rank[r] // vpp for _ in range(vpp) for r in range(pp)]
    if embedding_in_split:
        out[0] -= 1
    if loss_in_split:
        out[-1] -= 1
    if min(out) < 0:
        raise ConfigError(f"--num-layers={num_layers} on pp={pp}, vpp={vpp}: a stage that holds the embedding "
                          f"or the loss has no decoder layer to give up for it")
    return tuple(out)


# ------------------------------------------------------------------------------------------------
# vocabulary and precision
# ------------------------------------------------------------------------------------------------
def pad_vocab(size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding (``megatron/core/tokenizers/utils/build_tokenizer.py``
    ``vocab_size_with_padding``): up to a multiple of ``divisible_by * tp``.

    >>> pad_vocab(50257, 128, 1), pad_vocab(50257, 3232, 2), pad_vocab(256000, 3232, 2)
    (50304, 51712, 258560)
    """
    multiple = divisible_by * tp
    return -(-size // multiple) * multiple


_DTYPE_FLAGS = {"--main-grads-dtype": ("fp32", "bf16"), "--main-params-dtype": ("fp32", "fp16"),
                "--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"), "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8")}


def precision_spec(*, bf16: bool, fp16: bool, fp8_param_gather: bool = False, grad_reduce_in_bf16: bool = False,
                   accumulate_in_fp32: bool = False, precision_aware: bool = False, main_grads: str = "fp32",
                   main_params: str = "fp32", exp_avg: str = "fp32", exp_avg_sq: str = "fp32",
                   fp8: Optional[str] = None, fp8_recipe: str = "delayed") -> str:
    """The memlib precision (a preset or a recipe spec) of Megatron's mixed-precision flags.

    * the preset: ``megatron`` (bf16), ``megatron-fp16``, ``megatron-fp8-param`` (bf16 with
      ``--fp8-param-gather``), ``fp32`` (neither);
    * the main_grad buffer is bf16 with ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16``
      (``gradients=2``); without the precision-aware optimizer the distributed optimizer then copies
      each shard to fp32 for the step (``main_grad=4``, an optimizer state, as the ``megatron-fp16``
      preset counts it);
    * ``--use-precision-aware-optimizer`` hands the gradient buffer to Transformer Engine's FusedAdam
      (no fp32 copy) with moments of ``--exp-avg(-sq)-dtype``; its master weights are
      ``--main-params-dtype``, and with bf16 weights and fp32 master weights FusedAdam keeps only the
      16 remainder bits (``store_param_remainders``, on by default: ``master_weights=2``) where it
      manages them (``megatron/core/optimizer/__init__.py``: not for an FP8 recipe other than delayed).

    >>> precision_spec(bf16=True, fp16=False)
    'megatron'
    >>> precision_spec(bf16=True, fp16=False, precision_aware=True, exp_avg="bf16", exp_avg_sq="bf16")
    'megatron:master_weights=2,exp_avg=2,exp_avg_sq=2'
    >>> precision_spec(bf16=True, fp16=False, grad_reduce_in_bf16=True)
    'megatron:gradients=2,main_grad=4'
    """
    if bf16 and fp16:
        raise ConfigError("--bf16=on and --fp16=on contradict each other: give one")
    if not precision_aware and (main_grads, main_params, exp_avg, exp_avg_sq) != ("fp32",) * 4:
        flag = next(f for f, v in zip(_DTYPE_FLAGS, (main_grads, main_params, exp_avg, exp_avg_sq)) if v != "fp32")
        value = dict(zip(_DTYPE_FLAGS, (main_grads, main_params, exp_avg, exp_avg_sq)))[flag]
        raise ConfigError(f"{flag}={value} needs --use-precision-aware-optimizer (Megatron-Core keeps fp32 otherwise)")
    if not (bf16 or fp16):
        for flag, on in (("--fp8-param-gather", fp8_param_gather), ("--grad-reduce-in-bf16", grad_reduce_in_bf16),
                         ("--use-precision-aware-optimizer", precision_aware)):
            if on:
                raise ConfigError(f"{flag}=on without --bf16 or --fp16 is not modelled (an fp32 run)")
        return "fp32"
    if fp16:
        if fp8_param_gather or grad_reduce_in_bf16:
            flag = "--fp8-param-gather" if fp8_param_gather else "--grad-reduce-in-bf16"
            raise ConfigError(f"{flag}=on with --fp16 is not modelled (use --bf16)")
        base, changes = "megatron-fp16", {}
        grads = 4 if accumulate_in_fp32 else 2
        if accumulate_in_fp32:
            changes.update(gradients=4, main_grad=0)
        if precision_aware:
            changes.update(gradients=grads, main_grad=0, master_weights=DTYPE_BYTES[main_params],
                           exp_avg=DTYPE_BYTES[exp_avg], exp_avg_sq=DTYPE_BYTES[exp_avg_sq])
    else:
        base = "megatron-fp8-param" if fp8_param_gather else "megatron"
        grads = 2 if (grad_reduce_in_bf16 or main_grads == "bf16") else 4
        changes = {}
        if precision_aware:
            te_managed = main_params != "fp32" or fp8 is None or fp8_recipe == "delayed"
            master = 2 if main_params == "fp16" or (te_managed and not fp8_param_gather) else 4
            changes.update(gradients=grads, master_weights=master, exp_avg=DTYPE_BYTES[exp_avg],
                           exp_avg_sq=DTYPE_BYTES[exp_avg_sq])
        elif grads == 2:
            changes.update(gradients=2, main_grad=4)
    rec = RECIPES[base]
    current = {"gradients": rec.gradients, **dict(rec.optimizer)}
    changes = {k: b for k, b in changes.items() if current.get(k, 0) != b}
    return base if not changes else recipe(base + ":" + ",".join(f"{k}={b}" for k, b in changes.items())).name


# ------------------------------------------------------------------------------------------------
# classification of the flags memlib does not map
# ------------------------------------------------------------------------------------------------
#: prefixes of flags that do not change device memory (optimisation schedule, logging, data, checkpoints)
NO_EFFECT_PREFIXES = (
    "--lr", "--min-lr", "--log-", "--logging-", "--tensorboard", "--wandb-", "--save", "--load", "--eval-",
    "--exit-", "--data-", "--train-", "--valid-", "--test-", "--split", "--ckpt-", "--dist-ckpt-", "--timing-",
    "--distributed-timeout", "--one-logger", "--straggler", "--rerun-", "--adam-", "--sgd-", "--weight-decay",
    "--start-weight-decay", "--end-weight-decay", "--clip-grad", "--init-method", "--seed", "--no-load-",
    "--no-save-", "--finetune", "--async-save", "--use-persistent-ckpt-worker", "--auto-detect-ckpt-format",
    "--use-checkpoint-", "--override-opt-param-scheduler", "--use-dist-ckpt", "--no-check-for-nan",
    "--check-for-nan", "--manual-gc", "--num-workers", "--no-mmap-bin-files", "--mmap-bin-files", "--mock-data",
    "--per-split-data-args-path", "--tokenizer-", "--vocab-file", "--merge-file", "--enable-ft-package",
    "--ft-", "--heartbeat", "--profile", "--use-pytorch-profiler", "--record-memory-history",
)
#: flags that do not change device memory
NO_EFFECT = {
    "--use-mcore-models", "--distributed-backend", "--mtp-loss-scaling-factor", "--norm-epsilon", "--rotary-base",
    "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--rotary-interleaved",
    "--moe-router-topk-scaling-factor", "--moe-router-bias-update-rate", "--use-flash-attn",
    "--apply-layernorm-1p", "--no-bias-gelu-fusion", "--max-position-embeddings", "--kv-channels",
    "--world-size", "--local-rank", "--rank", "--dataloader-type", "--no-persist-layer-norm",
    "--moe-per-layer-logging", "--moe-z-loss-coeff-logging", "--make-vocab-size-divisible-by",
}
#: torchrun's own flags: the launcher, not the model
LAUNCHER = {
    "--nproc_per_node", "--nproc-per-node", "--nnodes", "--node_rank", "--node-rank", "--master_addr",
    "--master-addr", "--master_port", "--master-port", "--rdzv_id", "--rdzv-id", "--rdzv_backend",
    "--rdzv-backend", "--rdzv_endpoint", "--rdzv-endpoint", "--rdzv_conf", "--rdzv-conf", "--standalone",
    "--max_restarts", "--max-restarts", "--monitor_interval", "--monitor-interval", "--start_method",
    "--start-method", "--role", "--tee", "--redirects", "--log_dir", "--log-dir", "--local-ranks-filter",
    "--local_ranks_filter", "--run_path", "--no_python", "--no-python", "--module",
}


def _no_effect(name: str, dense: bool) -> bool:
    return (name in NO_EFFECT or name in LAUNCHER or name.startswith(NO_EFFECT_PREFIXES)
            or (dense and name.startswith("--moe-")))


# ------------------------------------------------------------------------------------------------
# the result
# ------------------------------------------------------------------------------------------------
#: overrides applied where the file's values are derived, not on the result
_EARLY = ("dp", "tp", "pp", "ep", "etp", "cp", "micro_batch", "seq_len", "num_microbatches", "layout", "vpp")
#: TrainingConfig fields an override may set (the CLI's explicit options)
OVERRIDABLE = ("dp", "tp", "pp", "ep", "etp", "cp", "sp", "layout", "zero", "precision", "profile", "micro_batch",
               "seq_len", "recompute", "schedule", "num_microbatches", "vpp", "transformer_impl", "attention_backend",
               "attention_softmax_in_fp32", "bias_swiglu_fusion", "cross_entropy_loss_fusion",
               "cross_entropy_fusion_impl", "moe_aux_loss", "fp8", "fp8_recipe", "moe_a2a_overlap", "offload_modules",
               "overlap_grad_reduce", "overlap_param_gather", "routing_imbalance", "ddp_bucket_size")


@dataclass(frozen=True)
class MegatronRun:
    """A Megatron-LM run read from its flags."""

    model: ModelConfig
    train: TrainingConfig
    world_size: int
    vocab: dict                       #: tokenizer, size (before padding), padded, divisible_by, source
    mapped: dict                      #: flag -> its value as written ("" for a switch), flags memlib turned into fields
    no_effect: tuple[str, ...]        #: flags known not to change device memory
    not_modelled: tuple[str, ...]     #: the warning list: flags (and Megatron defaults) memlib does not count
    overridden: dict = field(default_factory=dict)   #: field -> {"file": value, "given": value}
    #: how the framework is built (memlib.device.peak.Framework: fusions, grouped GEMM, dispatcher), from the flags
    framework: Framework = field(default_factory=Framework)

    def warning(self) -> str:
        """One line naming what memlib does not model ("" when nothing)."""
        if not self.not_modelled:
            return ""
        return f"not modelled ({len(self.not_modelled)}): " + ", ".join(self.not_modelled)

    def values(self) -> dict:
        """For the JSON output."""
        return {"model": self.model.values(), "config": self.train.values(), "framework": self.framework.values(),
                "world_size": self.world_size,
                "vocab": dict(self.vocab), "mapped": dict(self.mapped), "no_memory_effect": list(self.no_effect),
                "not_modelled": list(self.not_modelled),
                "overridden": {k: {"file": _plain(v["file"]), "given": _plain(v["given"])}
                               for k, v in self.overridden.items()}}


def _plain(x):
    if isinstance(x, (bool, int, str)) or x is None:
        return x
    if isinstance(x, (tuple, list)):
        return [_plain(y) for y in x]
    return str(x)


# ------------------------------------------------------------------------------------------------
# the mapping
# ------------------------------------------------------------------------------------------------
def parse_megatron_args(text: str, world_size: Optional[int] = None, vocab_size: Optional[int] = None,
                        overrides: Optional[Mapping] = None, name: str = "megatron") -> MegatronRun:
    """Read Megatron-LM flags (a launch script, a flag list or a ``model_config.yaml``).

    ``world_size`` is the number of GPUs (needed unless the file implies it or ``overrides`` gives
    ``dp``); ``vocab_size`` the tokenizer's vocabulary before padding (overrides the file's);
    ``overrides`` maps :class:`~memlib.config.TrainingConfig` fields to values that replace the
    file's (the CLI's explicit options): TP, PP, CP, EP and ETP before anything is derived from them
    (DP, the padded vocabulary, the layout), the rest on the result."""
    over = dict(overrides or {})
    unknown = sorted(set(over) - set(OVERRIDABLE))
    if unknown:
        raise ConfigError(f"overrides={show(unknown)}: only TrainingConfig fields {', '.join(OVERRIDABLE)} may be given")
    check_world = world_size
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                   or not 1 <= world_size <= LIMITS["ranks"] * LIMITS["pp"]):
        raise ConfigError(f"world_size={show(world_size)} must be a positive integer")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                   or not 1 <= vocab_size <= LIMITS["width"]):
        raise ConfigError(f"vocab_size={show(vocab_size)} must be a positive integer")
    return _Mapper(read_flags(text, name), check_world, vocab_size, over, name).run()


#: the flags behind each overridable field (a shell variable in them is tolerated when the field is given)
_FIELD_FLAGS = {
    "tp": ("--tensor-model-parallel-size",), "pp": ("--pipeline-model-parallel-size",),
    "cp": ("--context-parallel-size",), "ep": ("--expert-model-parallel-size",),
    "etp": ("--expert-tensor-parallel-size",), "micro_batch": ("--micro-batch-size",),
    "seq_len": ("--seq-length",), "num_microbatches": ("--global-batch-size",),
    "dp": ("--world-size", "--global-batch-size"),
    "layout": ("--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
               "--decoder-last-pipeline-num-layers", "--num-layers-in-first-pipeline-stage",
               "--num-layers-in-last-pipeline-stage"),
    "vpp": ("--num-virtual-stages-per-pipeline-rank", "--virtual-pipeline-model-parallel-size",
            "--num-layers-per-virtual-pipeline-stage"),
    "recompute": ("--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules"),
    "transformer_impl": ("--transformer-impl",), "attention_backend": ("--attention-backend",),
    "cross_entropy_fusion_impl": ("--cross-entropy-fusion-impl",), "fp8": ("--fp8-format",),
    "fp8_recipe": ("--fp8-recipe",), "ddp_bucket_size": ("--ddp-bucket-size",),
    "moe_aux_loss": ("--moe-router-load-balancing-type", "--moe-aux-loss-coeff"),
    "offload_modules": ("--offload-modules",),
    "precision": ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"),
}


class _Mapper:
    def __init__(self, flags: list[Flag], world_size, vocab_size, overrides: dict, name: str):
        self.f = _Flags(flags)
        for fld in overrides:
            self.f.lenient.update(_FIELD_FLAGS.get(fld, ()))
        if world_size is not None:
            self.f.lenient.add("--world-size")
        self.world_arg, self.vocab_arg, self.over, self.name = world_size, vocab_size, overrides, name
        self.notes: list[str] = []          # not modelled, with a reason
        self.flagged: set[str] = set()      # flags read but not modelled
        self.overridden: dict = {}

    # -- helpers ---------------------------------------------------------------------------------
    def not_modelled(self, flag: str, entry: Optional[str] = None) -> None:
        """``flag`` (given, read) is not modelled; ``entry`` is the warning text (default the flag)."""
        self.flagged.add(flag)
        self.notes.append(entry or flag)

    def carried(self, entry: str) -> None:
        """A mapped flag whose memory memlib does not count (the field is carried): a warning entry."""
        self.notes.append(entry)

    def override(self, fld: str, file_value):
        if fld in self.over:
            given = self.over[fld]
            text = [self.f.unresolved[x] for x in _FIELD_FLAGS.get(fld, ()) if x in self.f.unresolved]
            if text:
                file_value = text[0]
            if given != file_value:
                self.overridden[fld] = {"file": file_value, "given": given}
            return given
        return file_value

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> MegatronRun:
        f = self.f
        if f.has("--hybrid-layer-pattern", "--hybrid-override-pattern"):
            raise ConfigError(f"--hybrid-layer-pattern={show(f.text('--hybrid-layer-pattern') or f.text('--hybrid-override-pattern'))}: "
                              f"hybrid (Mamba) models cannot be expressed; memlib models DeepSeek-style MLA transformers")
        if not f.switch("--multi-latent-attention"):
            raise ConfigError("--multi-latent-attention=off: memlib models MLA attention only (DeepSeek-V2/V3); "
                              "a GQA or multi-head attention model cannot be expressed yet")
        if f.switch("--group-query-attention"):
            raise ConfigError("--group-query-attention=on with --multi-latent-attention: Megatron-LM refuses the pair")
        model, dense = self.model_fields()
        par = self.parallel(model, dense)
        train_kw = {**par, **self.recompute(), **self.kernels(dense), **self.precision(par["zero"])}
        model = self.vocabulary(model, par["tp"])
        self.structure(dense)
        train_kw = self.apply_overrides(train_kw)
        try:
            train = TrainingConfig(profile="megatron", **train_kw)
        except TypeError as exc:
            raise ConfigError(f"megatron_args={show(self.name, 120)}: {exc}") from None
        m = model_from_dict(model, name=self.name, source=f"Megatron-LM flags ({SOURCE})")
        no_effect, unmodelled = [], []
        for flag in f.order:
            if flag in f.read:
                continue                    # mapped, or not modelled with its own note
            (no_effect if _no_effect(flag, dense) else unmodelled).append(flag)
        mapped = {x: " ".join(f.values[x]) for x in f.order if x in f.read and x not in self.flagged}
        fw = Framework(gradient_accumulation_fusion=not f.has("--no-gradient-accumulation-fusion"),
                       rope_fusion=not f.has("--no-rope-fusion"), moe_grouped_gemm=f.has("--moe-grouped-gemm"),
                       token_dispatcher=" ".join(f.values.get("--moe-token-dispatcher-type", ("allgather",))),
                       permute_fusion=f.has("--moe-permute-fusion"))
        return MegatronRun(m, train, self.world, self.vocab, mapped, tuple(no_effect),
                           tuple(self.notes + unmodelled), self.overridden, fw)

    # -- the model -------------------------------------------------------------------------------
    def model_fields(self) -> tuple[dict, bool]:
        f = self.f
        layers = f.int("--num-layers", None, bound=LIMITS["num_hidden_layers"])
        hidden = f.int("--hidden-size")
        heads = f.int("--num-attention-heads")
        for flag, v in (("--num-layers", layers), ("--hidden-size", hidden), ("--num-attention-heads", heads)):
            if v is None:
                raise ConfigError(f"{flag} is required (Megatron-LM requires it)")
        if "--kv-channels" not in f.values and hidden % heads:
            raise ConfigError(f"--hidden-size={hidden} must be divisible by --num-attention-heads={heads} "
                              f"(Megatron-LM's rule when --kv-channels is not given)")
        swiglu = f.switch("--swiglu")
        ffn = f.int("--ffn-hidden-size", (hidden // 24) * 64 if swiglu else 4 * hidden)
        if ffn < 1:
            raise ConfigError(f"--hidden-size={hidden}: Megatron's default FFN width int(8h/3/64)*64 is 0; "
                              f"give --ffn-hidden-size")
        experts = f.int("--num-experts", None, minimum=0)
        dense = not experts
        m = {
            "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": ffn,
            "qk_nope_head_dim": f.int("--qk-head-dim", 128), "qk_rope_head_dim": f.int("--qk-pos-emb-head-dim", 64),
            "v_head_dim": f.int("--v-head-dim", 128), "q_lora_rank": f.int("--q-lora-rank", None),
            "kv_lora_rank": f.int("--kv-lora-rank", 32),
            "num_nextn_predict_layers": f.int("--mtp-num-layers", 0, minimum=0, bound=LIMITS["num_nextn_predict_layers"]),
            "tie_word_embeddings": not f.switch("--untie-embeddings-and-output-weights"),
        }
        if dense:
            m.update(moe_intermediate_size=ffn, n_routed_experts=1, n_shared_experts=0, num_experts_per_tok=1,
                     first_k_dense_replace=layers, moe_layer_freq=1)
            return m, True
        moe_ffn = f.int("--moe-ffn-hidden-size", ffn)
        shared = f.int("--moe-shared-expert-intermediate-size", None)
        if shared is not None and shared % moe_ffn:
            raise ConfigError(f"--moe-shared-expert-intermediate-size={shared} must be a multiple of "
                              f"--moe-ffn-hidden-size={moe_ffn} (memlib counts shared experts of the routed width)")
        topk = f.int("--moe-router-topk", 2)
        pattern = moe_layer_pattern(f.one("--moe-layer-freq") or "1", layers)
        k, freq = pattern_to_hf(pattern)
        score = f.choice("--moe-router-score-function", "softmax", ("softmax", "sigmoid", "sqrtsoftplus"))
        if score == "sqrtsoftplus":
            raise ConfigError("--moe-router-score-function=sqrtsoftplus cannot be expressed (memlib: softmax or sigmoid)")
        bias = f.switch("--moe-router-enable-expert-bias")
        if bias and score != "sigmoid":
            raise ConfigError(f"--moe-router-enable-expert-bias with --moe-router-score-function={score}: Megatron-Core "
                              f"allows the expert bias with sigmoid only")
        groups = f.int("--moe-router-num-groups", None)
        group_topk = f.int("--moe-router-group-topk", None)
        if group_topk and not groups:
            raise ConfigError(f"--moe-router-group-topk={group_topk} needs --moe-router-num-groups (Megatron-Core's rule)")
        pre_softmax = f.switch("--moe-router-pre-softmax")      # sigmoid scores: it changes nothing
        if topk == 1 and score == "softmax" and not pre_softmax:
            raise ConfigError("--moe-router-topk=1 with softmax scores needs --moe-router-pre-softmax (Megatron-Core's rule)")
        if score == "softmax" and pre_softmax:
            self.not_modelled("--moe-router-pre-softmax")
        m.update(moe_intermediate_size=moe_ffn, n_routed_experts=experts,
                 n_shared_experts=0 if shared is None else shared // moe_ffn, num_experts_per_tok=topk,
                 first_k_dense_replace=k, moe_layer_freq=freq,
                 n_group=groups if group_topk else 1, topk_group=group_topk or 1, scoring_func=score)
        m["topk_method"] = "noaux_tc" if bias else "greedy"
        f.switch("--moe-grouped-gemm")      # TE's grouped GEMM: what memlib's ledger assumes for the experts
        return m, False

    def vocabulary(self, m: dict, tp: int) -> dict:
        f = self.f
        tok = f.choice("--tokenizer-type", "GPT2BPETokenizer", (
            "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
            "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
            "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"))
        model_file = f.text("--tokenizer-model")
        f.text("--vocab-file"), f.text("--merge-file")
        divisible = f.int("--make-vocab-size-divisible-by", 128)
        padded_flag = f.int("--padded-vocab-size", None)
        no_pad = f.switch("--no-pad-vocab-size", "--disable-pad-vocab-size")
        file_size = f.int("--vocab-size", None)
        if f.has("--tokenizer-special-tokens"):
            self.not_modelled("--tokenizer-special-tokens", "--tokenizer-special-tokens (tokens added to the vocabulary)")
        if f.int("--vocab-extra-ids", 0, minimum=0):
            self.not_modelled("--vocab-extra-ids")
        vocab = {"tokenizer": tok, "model_file": model_file, "divisible_by": divisible}
        size, source = None, ""
        if self.vocab_arg is not None:
            size, source = self.vocab_arg, "given (vocab_size)"
        elif tok in ("NullTokenizer", "TikTokenizer"):
            size = file_size if file_size is not None else (_TIKTOKEN_DEFAULT if tok == "TikTokenizer" else None)
            source = f"--vocab-size ({tok})" if file_size is not None else f"{tok}'s default"
            if size is None and padded_flag is None:
                raise ConfigError("--tokenizer-type=NullTokenizer needs --vocab-size (its vocabulary)")
        else:
            base = model_file.rsplit("/", 1)[-1] if model_file else None
            key = (tok, base if tok in _SENTENCEPIECE else None)
            if file_size is not None:
                self.not_modelled("--vocab-size", f"--vocab-size (Megatron-LM ignores it for {tok})")
            if key in TOKENIZER_SIZES:
                size, source = TOKENIZER_SIZES[key]
            elif padded_flag is None:
                what = f"{tok} with {base}" if base else tok
                raise ConfigError(f"vocab_size is unknown for --tokenizer-type={what}: give memlib the tokenizer's "
                                  f"vocabulary (memlib estimate --vocab-size N; memlib pads it as Megatron does)")
        if padded_flag is not None:
            padded, source = padded_flag, (source + "; " if source else "") + "--padded-vocab-size, used as it is"
        elif no_pad:
            raise ConfigError("--no-pad-vocab-size=on without --padded-vocab-size leaves Megatron-LM without a model "
                              "vocabulary size; give --padded-vocab-size")
        else:
            padded = pad_vocab(size, divisible, tp)
        vocab.update(size=size, padded=padded, source=source)
        self.vocab = vocab
        return {**m, "vocab_size": padded}

    def structure(self, dense: bool) -> None:
        """Megatron defaults (and flags) that build what memlib does not count."""
        f = self.f
        if not f.switch("--disable-bias-linear"):
            self.notes.append("biases (no --disable-bias-linear)")
        if f.switch("--add-qkv-bias"):
            self.not_modelled("--add-qkv-bias")
        norm = f.choice("--normalization", "LayerNorm", ("LayerNorm", "RMSNorm"))
        if norm != "RMSNorm":
            if f.has("--normalization"):
                self.not_modelled("--normalization", "--normalization=LayerNorm (memlib counts RMSNorm)")
            else:
                self.notes.append("--normalization=LayerNorm (Megatron's default; memlib counts RMSNorm)")
        if not f.has("--swiglu"):
            self.notes.append("no --swiglu (memlib counts a SwiGLU feed-forward)")
        if not f.switch("--qk-layernorm"):
            self.notes.append("no --qk-layernorm (memlib counts MLA's latent RMSNorms)")
        pos = f.choice("--position-embedding-type", "learned_absolute",
                       ("learned_absolute", "rope", "yarn", "mrope", "relative", "none"))
        if pos in ("learned_absolute", "mrope", "relative"):
            entry = f"--position-embedding-type={pos}" + ("" if f.has("--position-embedding-type") else
                                                          " (Megatron's default)")
            if f.has("--position-embedding-type"):
                self.not_modelled("--position-embedding-type", entry)
            else:
                self.notes.append(entry)
        for flag in ("--attention-dropout", "--hidden-dropout"):
            p = f.number(flag, Fraction(1, 10))
            if p:
                if f.has(flag):
                    self.not_modelled(flag, f"{flag}={f.values[flag][0]} (memlib counts no dropout mask)")
                else:
                    self.notes.append(f"{flag}=0.1 (Megatron's default; memlib counts no dropout mask)")
        if not dense:
            dispatcher = f.choice("--moe-token-dispatcher-type", "allgather", ("allgather", "alltoall", "flex"))
            if dispatcher != "alltoall":
                if f.has("--moe-token-dispatcher-type"):
                    self.not_modelled("--moe-token-dispatcher-type",
                                      f"--moe-token-dispatcher-type={dispatcher} (memlib counts alltoall)")
                else:
                    self.notes.append("--moe-token-dispatcher-type=allgather (Megatron's default; memlib counts "
                                      "alltoall)")
            rdtype = f.choice("--moe-router-dtype", None, ("fp32", "fp64"))
            if rdtype != "fp32":
                if f.has("--moe-router-dtype"):
                    self.not_modelled("--moe-router-dtype", f"--moe-router-dtype={rdtype} (memlib counts fp32)")
                else:
                    self.notes.append("no --moe-router-dtype (memlib counts an fp32 router)")
        if f.switch("--no-rope-fusion") and self.impl.uses_te:
            self.not_modelled("--no-rope-fusion", "--no-rope-fusion (memlib counts the fused MLA RoPE with "
                                                  "transformer_engine)")

    # -- parallelism -----------------------------------------------------------------------------
    def parallel(self, m: dict, dense: bool) -> dict:
        f, ranks = self.f, LIMITS["ranks"]
        tp = self.override("tp", f.int("--tensor-model-parallel-size", 1, bound=ranks))
        pp = self.override("pp", f.int("--pipeline-model-parallel-size", 1, bound=LIMITS["pp"]))
        cp = self.override("cp", f.int("--context-parallel-size", 1, bound=ranks))
        ep = self.override("ep", f.int("--expert-model-parallel-size", 1, bound=ranks))
        etp = self.override("etp", f.int("--expert-tensor-parallel-size", tp, bound=ranks))
        if dense and ep > 1:
            raise ConfigError(f"--expert-model-parallel-size={ep} needs --num-experts (Megatron-LM's rule)")
        if not dense and m["n_routed_experts"] % ep:
            raise ConfigError(f"--expert-model-parallel-size={ep} must divide --num-experts={m['n_routed_experts']}")
        self.world = self._world(tp, pp, cp)
        dp = self.world // (tp * pp * cp)
        if (dp * tp * cp) % (ep * etp):
            raise ConfigError(f"ep*etp={ep * etp} (--expert-model-parallel-size={ep}, --expert-tensor-parallel-size="
                              f"{etp}) must divide dp*tp*cp={dp * tp * cp} (world size {self.world})")
        sp = f.switch("--sequence-parallel") and tp > 1
        if not dense and tp > 1 and not sp and "sp" not in self.over:
            raise ConfigError(f"--tensor-model-parallel-size={tp} with --num-experts needs --sequence-parallel "
                              f"(Megatron-Core's MoE layer refuses TP without it in training)")
        zero = 1 if f.switch("--use-distributed-optimizer") else 0
        mbs = self.override("micro_batch", f.int("--micro-batch-size", None, bound=LIMITS["micro_batch"]))
        if mbs is None:
            raise ConfigError("--micro-batch-size is required (Megatron-LM requires it)")
        seq = self.override("seq_len", f.int("--seq-length", None, bound=LIMITS["seq_len"]))
        if seq is None:
            raise ConfigError("--seq-length is required (memlib needs the sequence length)")
        if cp > 1 and seq % (2 * cp):
            raise ConfigError(f"--seq-length={seq} must be a multiple of 2*cp={2 * cp} (Megatron-LM's rule)")
        gbs = f.int("--global-batch-size", mbs * dp, bound=LIMITS["num_microbatches"] * LIMITS["micro_batch"])
        if f.has("--rampup-batch-size"):
            self.not_modelled("--rampup-batch-size", "--rampup-batch-size (memlib takes the final global batch)")
        if "num_microbatches" in self.over:
            mb = self.override("num_microbatches", None)
        else:
            if gbs % (mbs * dp):
                raise ConfigError(f"--global-batch-size={gbs} must be divisible by micro-batch*dp={mbs * dp} "
                                  f"(--micro-batch-size={mbs}, dp={dp})")
            mb = gbs // (mbs * dp)
        layout, vpp = self.pipeline(m["num_hidden_layers"], pp, m["num_nextn_predict_layers"])
        out = {"dp": dp, "tp": tp, "pp": pp, "ep": ep, "etp": etp, "cp": cp, "sp": sp, "zero": zero,
               "micro_batch": mbs, "seq_len": seq, "num_microbatches": mb, "vpp": vpp, "layout": layout,
               "schedule": "interleaved" if vpp > 1 else "1f1b",
               "overlap_grad_reduce": f.switch("--overlap-grad-reduce"),
               "overlap_param_gather": f.switch("--overlap-param-gather"),
               "ddp_bucket_size": f.int("--ddp-bucket-size", None, bound=LIMITS["bytes"])}
        if out["overlap_param_gather"] and not (out["overlap_grad_reduce"] and zero):
            raise ConfigError("--overlap-param-gather=on needs --overlap-grad-reduce and --use-distributed-optimizer "
                              "(Megatron-LM's rule)")
        return out

    def _world(self, tp: int, pp: int, cp: int) -> int:
        f = self.f
        model_ranks = tp * pp * cp
        if "dp" in self.over:
            dp = self.over["dp"]
            world = dp * model_ranks
            if self.world_arg is not None and self.world_arg != world:
                raise ConfigError(f"world_size={self.world_arg} but dp={dp} gives dp*tp*pp*cp={world}")
            self.overridden["dp"] = {"file": None, "given": dp}      # the file's DP needs the world size
            return world
        file_world = f.int("--world-size", None, bound=LIMITS["ranks"] * LIMITS["pp"])
        launcher = None
        nproc = f.values.get("--nproc_per_node") or f.values.get("--nproc-per-node")
        nnodes = f.values.get("--nnodes")
        number = re.compile(r"[0-9]{1,6}")
        if (nproc and len(nproc) == 1 and number.fullmatch(nproc[0])
                and (not nnodes or (len(nnodes) == 1 and number.fullmatch(nnodes[0])))):
            launcher = int(nproc[0]) * (int(nnodes[0]) if nnodes else 1) or None     # torchrun's own count
        if file_world is not None and launcher is not None and file_world != launcher:
            raise ConfigError(f"--world-size={file_world} but torchrun's --nproc_per_node and --nnodes give {launcher}")
        implied = file_world if file_world is not None else launcher
        world = self.world_arg if self.world_arg is not None else implied
        if world is None:
            raise ConfigError("world_size=unknown: give --world-size N, the number of GPUs (the flags do not say "
                              "how many there are)")
        if self.world_arg is not None and implied is not None and implied != self.world_arg:
            self.overridden["world_size"] = {"file": implied, "given": self.world_arg}
        if world % model_ranks:
            raise ConfigError(f"world_size={world} must be divisible by tp*pp*cp={model_ranks} "
                              f"(tp={tp}, pp={pp}, cp={cp})")
        return world

    def pipeline(self, layers: int, pp: int, mtp: int) -> tuple[tuple[int, ...], int]:
        """The layout and VPP of the file, or of the CLI's ``layout`` and ``vpp`` where given."""
        layout, vpp = self._file_pipeline(layers, pp, mtp)
        given_layout, given_vpp = self.over.get("layout"), self.over.get("vpp")
        if isinstance(given_layout, MegatronLayout):
            lay, lvpp = layout_stages(given_layout, pp, layers, mtp or None, name="layout")
            if given_vpp is not None and given_vpp != lvpp:
                raise ConfigError(f"vpp={given_vpp} but layout={given_layout} has {len(lay)} stages: vpp={lvpp} "
                                  f"on pp={pp}")
            new = (lay, lvpp)
        elif given_layout is not None:
            new = (tuple(given_layout), given_vpp or vpp)
        elif given_vpp is not None and given_vpp != vpp:
            if self.f.has("--pipeline-model-parallel-layout"):
                raise ConfigError(f"vpp={given_vpp} contradicts --pipeline-model-parallel-layout (vpp={vpp} on "
                                  f"pp={pp}); give a layout too")
            if given_vpp > 1 and pp == 1:
                raise ConfigError(f"vpp={given_vpp} needs pp > 1")
            new = (megatron_layout(layers, pp, given_vpp, *self._uneven), given_vpp)
        else:
            return layout, vpp
        for fld, file_value, value in (("layout", layout, new[0]), ("vpp", vpp, new[1])):
            if _plain(file_value) != _plain(value):
                self.overridden[fld] = {"file": file_value, "given": value}
        return new

    def _file_pipeline(self, layers: int, pp: int, mtp: int) -> tuple[tuple[int, ...], int]:
        f = self.f
        text = f.one("--pipeline-model-parallel-layout")
        nvs = f.int("--num-virtual-stages-per-pipeline-rank", None, "--virtual-pipeline-model-parallel-size")
        nlpvs = f.int("--num-layers-per-virtual-pipeline-stage", None)
        first = f.int("--decoder-first-pipeline-num-layers", None, "--num-layers-in-first-pipeline-stage")
        last = f.int("--decoder-last-pipeline-num-layers", None, "--num-layers-in-last-pipeline-stage")
        emb = f.switch("--account-for-embedding-in-pipeline-split")
        loss = f.switch("--account-for-loss-in-pipeline-split")
        self._uneven = (first, last, emb, loss)
        given = [n for n, v in (("--pipeline-model-parallel-layout", text),
                                ("--num-virtual-stages-per-pipeline-rank", nvs),
                                ("--num-layers-per-virtual-pipeline-stage", nlpvs)) if v is not None]
        if len(given) > 1:
            raise ConfigError(f"{given[0]}={f.text(given[0])} and {given[1]}={f.text(given[1])} contradict each "
                              f"other: Megatron-LM takes one of them")
        if text is not None:
            if first is not None or last is not None or emb or loss:
                raise ConfigError(f"--pipeline-model-parallel-layout={text} cannot be combined with uneven first/last "
                                  f"stages or --account-for-embedding/loss-in-pipeline-split (Megatron-Core refuses it)")
            layout, vpp = layout_stages(parse_layout(text), pp, layers, mtp or None)
        else:
            if nlpvs is not None:
                if first is not None or last is not None:
                    raise ConfigError(f"--num-layers-per-virtual-pipeline-stage={nlpvs} with uneven first/last stages: "
                                      f"Megatron-LM asks for --num-virtual-stages-per-pipeline-rank instead")
                n = layers + emb + loss
                if n % pp or (n // pp) % nlpvs:
                    raise ConfigError(f"--num-layers-per-virtual-pipeline-stage={nlpvs} must divide the "
                                      f"{n / pp:g} layers of each of the pp={pp} pipeline ranks")
                vpp = (n // pp) // nlpvs
            else:
                vpp = nvs or 1
            if vpp > 1 and pp == 1:
                raise ConfigError(f"virtual pipeline stages (vpp={vpp}) need --pipeline-model-parallel-size > 1")
            layout = megatron_layout(layers, pp, vpp, first, last, emb, loss)
        return layout, vpp

    # -- recomputation ---------------------------------------------------------------------------
    def recompute(self) -> dict:
        f = self.f
        gran = f.choice("--recompute-granularity", None, ("full", "selective"))
        if f.switch("--recompute-activations"):
            if gran == "full":
                raise ConfigError("--recompute-activations (selective) and --recompute-granularity=full contradict "
                                  "each other")
            gran = "selective"
        method = f.choice("--recompute-method", None, ("uniform", "block"))
        num = f.int("--recompute-num-layers", None, minimum=0, bound=LIMITS["num_hidden_layers"])
        modules = f.many("--recompute-modules")
        moe_layer = f.switch("--moe-layer-recompute")
        if moe_layer:
            if gran == "full":
                raise ConfigError("--moe-layer-recompute with --recompute-granularity=full: Megatron-Core refuses it")
            gran = "selective"
        if f.switch("--distribute-saved-activations"):
            self.not_modelled("--distribute-saved-activations")
        if method is not None and gran != "full":
            raise ConfigError(f"--recompute-method={method} needs --recompute-granularity full "
                              f"(granularity: {gran or 'none'})")
        if modules is not None and gran != "selective":
            raise ConfigError(f"--recompute-modules={' '.join(modules)} applies with --recompute-granularity selective "
                              f"only (granularity: {gran or 'none'})")
        if gran == "full":
            if method is None:
                raise ConfigError("--recompute-granularity=full needs --recompute-method uniform or block")
            if num is None:
                raise ConfigError("--recompute-granularity=full needs --recompute-num-layers")
            if method == "block":
                return {"recompute": f"full-block:{num}" if num else "none"}
            if num < 1:
                raise ConfigError("--recompute-num-layers=0 with --recompute-method=uniform: it must be at least 1")
            if num > 1:
                self.not_modelled("--recompute-num-layers", f"--recompute-num-layers={num} with uniform recompute "
                                  f"(memlib checkpoints every layer's input, as with 1)")
            return {"recompute": "full"}
        if gran == "selective":
            if num is not None:
                raise ConfigError(f"--recompute-num-layers={num} applies to --recompute-granularity full only "
                                  f"(Megatron-Core refuses it with selective)")
            mods = list(dict.fromkeys(modules or ("core_attn",)))
            if moe_layer and "moe" not in mods:
                mods.append("moe")
            bad = [x for x in mods if x not in RECOMPUTE_MODULES]
            if bad:
                raise ConfigError(f"--recompute-modules={bad[0]} is not a module memlib models "
                                  f"({', '.join(RECOMPUTE_MODULES)})")
            if "moe_act" in mods and not f.switch("--moe-grouped-gemm"):
                raise ConfigError("--recompute-modules=moe_act needs --moe-grouped-gemm (Megatron-Core's rule)")
            return {"recompute": ",".join(mods)}
        if num is not None:
            raise ConfigError(f"--recompute-num-layers={num} without --recompute-granularity full has no effect: "
                              f"give the granularity")
        return {"recompute": "none"}

    # -- kernels ---------------------------------------------------------------------------------
    def kernels(self, dense: bool) -> dict:
        f = self.f
        impl = f.choice("--transformer-impl", "transformer_engine", ("transformer_engine", "local",
                                                                     "inference_optimized"))
        if impl == "inference_optimized":
            raise ConfigError("--transformer-impl=inference_optimized is for inference; memlib models training")
        self.impl = TransformerImpl(impl)
        backend = f.choice("--attention-backend", "auto", tuple(x.value for x in AttnBackend))
        fusion = f.switch("--cross-entropy-loss-fusion")
        ce_impl = f.choice("--cross-entropy-fusion-impl", "native", ("native", "te"))
        if fusion and ce_impl == "te":
            raise ConfigError("--cross-entropy-loss-fusion with --cross-entropy-fusion-impl=te: Megatron-LM at "
                              "d98e8a64dd refuses it (use native)")
        if fusion and f.switch("--deterministic-mode"):
            raise ConfigError("--deterministic-mode=on with --cross-entropy-loss-fusion: Megatron-LM refuses the pair")
        softmax_fp32 = f.switch("--attention-softmax-in-fp32") | f.switch("--apply-query-key-layer-scaling")
        out = {"transformer_impl": impl, "attention_backend": backend, "attention_softmax_in_fp32": softmax_fp32,
               "bias_swiglu_fusion": not f.switch("--no-bias-swiglu-fusion"), "cross_entropy_loss_fusion": fusion,
               "cross_entropy_fusion_impl": ce_impl, "moe_a2a_overlap": f.switch("--overlap-moe-expert-parallel-comm")}
        offload = f.switch("--fine-grained-activation-offloading")
        mods = f.many("--offload-modules")
        if mods is not None and not offload:
            raise ConfigError(f"--offload-modules={' '.join(mods)} applies with --fine-grained-activation-offloading only")
        if offload:
            if mods is None:
                raise ConfigError("--fine-grained-activation-offloading=on needs --offload-modules (Megatron-Core's rule)")
            if impl != "transformer_engine":
                raise ConfigError(f"--fine-grained-activation-offloading=on needs --transformer-impl transformer_engine "
                                  f"(--transformer-impl={impl})")
            bad = [x for x in mods if x not in OFFLOAD_MODULES]
            if bad:
                raise ConfigError(f"--offload-modules={bad[0]} is not one of {', '.join(OFFLOAD_MODULES)}")
            out["offload_modules"] = tuple(dict.fromkeys(mods))
        out["moe_aux_loss"] = LoadBalancing.NONE if dense else self.load_balancing()
        return out

    def load_balancing(self) -> LoadBalancing:
        f = self.f
        types = f.many("--moe-router-load-balancing-type") or ("aux_loss",)
        coeffs = [_fraction("--moe-aux-loss-coeff", c) for c in (f.many("--moe-aux-loss-coeff") or ("0",))]
        choices = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none")
        for t in types:
            if t not in choices:
                raise ConfigError(f"--moe-router-load-balancing-type={show(t)} must be one of {', '.join(choices)}")
        if len(coeffs) not in (1, len(types)):
            raise ConfigError(f"--moe-aux-loss-coeff={' '.join(map(str, coeffs))} has {len(coeffs)} values for "
                              f"{len(types)} load-balancing types")
        coeff = coeffs * len(types) if len(coeffs) == 1 else coeffs
        active = [t for t, c in zip(types, coeff) if c > 0 and t != "none"]
        if "sinkhorn" in types:
            raise ConfigError("--moe-router-load-balancing-type=sinkhorn cannot be expressed (memlib: seq_aux_loss, "
                              "aux_loss or none)")
        if not active:
            return LoadBalancing.NONE
        if len(active) > 1 or active[0] not in ("seq_aux_loss", "aux_loss"):
            raise ConfigError(f"--moe-router-load-balancing-type={' '.join(active)} (with a positive "
                              f"--moe-aux-loss-coeff) cannot be expressed (memlib: one of seq_aux_loss, aux_loss)")
        return LoadBalancing(active[0])

    # -- precision -------------------------------------------------------------------------------
    def precision(self, zero: int) -> dict:
        f = self.f
        bf16, fp16 = f.switch("--bf16"), f.switch("--fp16")
        fp8 = f.choice("--fp8-format", None, FP8_FORMATS)
        fp8_recipe = f.choice("--fp8-recipe", "delayed", FP8_RECIPES)
        if f.has("--fp8-recipe") and fp8 is None:
            raise ConfigError(f"--fp8-recipe={fp8_recipe} needs --fp8-format (Megatron-LM ignores it otherwise)")
        fp8_param = f.switch("--fp8-param-gather")
        if fp8_param and fp8 is None:
            raise ConfigError("--fp8-param-gather=on needs --fp8-format")
        if fp8_param and zero < 1:
            raise ConfigError("--fp8-param-gather=on needs --use-distributed-optimizer (Megatron-LM's rule)")
        pao = f.switch("--use-precision-aware-optimizer")
        dtypes = {flag: f.choice(flag, "fp32", choices) for flag, choices in _DTYPE_FLAGS.items()}
        grad_bf16 = f.switch("--grad-reduce-in-bf16")
        acc32 = f.switch("--accumulate-allreduce-grads-in-fp32")
        if grad_bf16 and acc32:
            raise ConfigError("--grad-reduce-in-bf16=on and --accumulate-allreduce-grads-in-fp32=on contradict each other")
        if grad_bf16 and not bf16:
            raise ConfigError("--grad-reduce-in-bf16=on needs --bf16")
        if acc32 and bf16 and dtypes["--main-grads-dtype"] != "fp32":
            raise ConfigError(f"--accumulate-allreduce-grads-in-fp32=on needs --main-grads-dtype fp32 (--main-grads-dtype={dtypes['--main-grads-dtype']})")
        if f.switch("--optimizer-cpu-offload"):
            self.not_modelled("--optimizer-cpu-offload", "--optimizer-cpu-offload (memlib keeps the optimizer states "
                                                         "on the GPU)")
        opt = f.choice("--optimizer", "adam", ("adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"))
        if opt != "adam":
            raise ConfigError(f"--optimizer={opt} cannot be expressed: memlib's recipes are Adam's (two moments)")
        spec = precision_spec(bf16=bf16, fp16=fp16, fp8_param_gather=fp8_param, grad_reduce_in_bf16=grad_bf16,
                              accumulate_in_fp32=acc32, precision_aware=pao,
                              main_grads=dtypes["--main-grads-dtype"], main_params=dtypes["--main-params-dtype"],
                              exp_avg=dtypes["--exp-avg-dtype"], exp_avg_sq=dtypes["--exp-avg-sq-dtype"],
                              fp8=fp8, fp8_recipe=fp8_recipe)
        if fp8 is not None:
            mods = self.f.values.get("--recompute-modules", ())
            if fp8_recipe == "delayed" and self.f.values.get("--recompute-granularity") == ("selective",) and (
                    "moe_act" in mods or "layernorm" in mods):
                raise ConfigError("--fp8-recipe=delayed with --recompute-modules moe_act or layernorm: Megatron-Core "
                                  "refuses it")
        return {"precision": spec, "fp8": fp8, "fp8_recipe": fp8_recipe}

    # -- the CLI's explicit options --------------------------------------------------------------
    def apply_overrides(self, kw: dict) -> dict:
        out = dict(kw)
        for fld in OVERRIDABLE:
            if fld in self.over and fld not in _EARLY:
                self._set(out, fld, self.over[fld])
        return out

    def _set(self, out: dict, fld: str, given) -> None:
        file_value = out.get(fld)
        if _plain(file_value) != _plain(given):
            self.overridden[fld] = {"file": file_value, "given": given}
        out[fld] = given
