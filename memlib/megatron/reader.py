"""Reading Megatron-LM's flags from a launch script, a plain list or a functional test's ``model_config.yaml``.

:func:`read_flags` returns every ``--flag value`` written in the text, in order, with where it was found;
a script is read, not run (variables are left as they are).  ``_Flags`` gives typed access to them by
name, the last occurrence winning as with argparse, with the one-line errors.  The rules are in
``docs/derivations/megatron_flags.md`` ("Input").
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from ..config import LIMITS, ConfigError, parse_count, show
from ..core.units import parse_number

__all__ = ["Flag", "read_flags", "MAX_ARGS_BYTES"]

#: the largest flag file memlib reads (a launch script or model_config.yaml is a few kilobytes)
MAX_ARGS_BYTES = 2**20


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
#: a word a flag file means as a flag though no Megatron-LM flag is spelled so (``--über-flag``, ``--x+y``):
#: read as one, so that it is warned as not modelled rather than dropped with its values
_FLAG_LIKE = re.compile(r"--[^\s=-][^\s=]*(=.*)?", re.S)
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


#: the environment variables of a launch that change device memory: PyTorch's cuBLAS workspaces and its allocator,
#: and whether Transformer Engine may pick nondeterministic attention kernels
ENV_READ = ("CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF", "NVTE_ALLOW_NONDETERMINISTIC_ALGO")


def read_env(text: str) -> dict[str, str]:
    """The :data:`ENV_READ` variables a launch sets: a ``model_config.yaml``'s ``ENV_VARS`` mapping, or a script's
    ``export NAME=value`` lines (the last one wins); the others are not read."""
    out: dict[str, str] = {}
    if isinstance(text, str) and re.search(r"^MODEL_ARGS\s*:", text, re.M):
        import yaml

        try:
            doc = yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError):
            return out
        env = doc.get("ENV_VARS") if isinstance(doc, dict) else None
        if isinstance(env, dict):
            out = {k: str(v) for k, v in env.items() if k in ENV_READ and v is not None}
        return out
    for mo in re.finditer(r"^\s*(?:export\s+)?([A-Z_]+)=(\S+)", text if isinstance(text, str) else "", re.M):
        if mo.group(1) in ENV_READ:
            out[mo.group(1)] = mo.group(2).strip("'\"")
    return out


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
    return mapping_flags(args, where)


def mapping_flags(args, where: str) -> list[Flag]:
    """The flags of a ``MODEL_ARGS`` mapping (flag -> value, as YAML reads a model_config.yaml)."""
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
            t = re.sub(r"\\+([|()])", r"\1", str(value).strip())   # the shell drops the escapes of | ( )
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
        if not _FLAG_LIKE.fullmatch(tok):
            i += 1
            continue
        name, eq, value = tok.partition("=")
        if not name.isprintable():              # named in the one-line warning: no control character
            name = ascii(name)[1:-1]
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
        return parse_count(name, t, minimum=minimum, bound=LIMITS["width"] if bound is None else bound)

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
