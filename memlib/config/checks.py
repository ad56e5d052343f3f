"""Bad input, stopped early: the one-line error, the bounds every size is checked against, the count check.

Every configuration error memlib raises is a :class:`ConfigError` whose message names the field, its value
and the rule; :data:`LIMITS` bounds every size before any arithmetic, so that no input can make memlib
crash or hang.
"""
from __future__ import annotations

__all__ = ["ConfigError", "LIMITS", "show", "check_count", "parse_count", "ascii_digits"]


class ConfigError(ValueError):
    """Invalid model or training configuration; the message is one line naming field, value, rule."""


#: Upper bounds, checked before any arithmetic so that no input can make memlib crash or hang.
#: They are far beyond any real model or cluster: a size past them is a typo, not a configuration.
LIMITS: dict[str, int] = {
    # model (config.json): widths and counts of elements, and the loops over layers and modules
    "width": 2**40,              # hidden_size, intermediate sizes, heads, head dims, ranks, experts, vocab
    "num_hidden_layers": 2**16,
    "num_nextn_predict_layers": 2**10,
    "moe_layer_freq": 2**16,
    # training
    "ranks": 2**30,              # dp, tp, ep, etp, cp
    "pp": 2**12,                 # pipeline stages: one entry of the layout each (a stage each, in seconds)
    "virtual_stages": 2**16,     # pp * vpp model chunks
    "micro_batch": 2**30,
    "seq_len": 2**40,
    "num_microbatches": 2**30,
    # plan: the global batch (B / (DP b) micro-batches stay within num_microbatches), the interleaved schedule's
    # chunks per rank searched, the configurations listed
    # the schedule replay (interleaved, DualPipe): every rank's steps, weighted by the chunks they write
    # (memlib.device.schedule.replay_size; about three seconds of work: PP 128 with V 2 is replayed)
    "replay": 2**25,
    "global_batch": 2**30,
    "max_vpp": 2**6,
    "top": 2_000,
    "plan_stages": 2048,         # pipeline stages a search evaluates, summed over its pipelines
    # memory sizes (CLI: --gpu-memory, --cuda-context, --comm-buffers), bytes
    "bytes": 2**60,
}


def show(value, limit: int = 40) -> str:
    """``repr(value)`` for an error message, shortened when it is long (a 5,000-digit number)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…" + f" ({len(text)} characters)"


def _bound_text(bound: int) -> str:
    return f"2^{bound.bit_length() - 1}" if bound & (bound - 1) == 0 else f"{bound:,}"


def check_count(name: str, value, *, minimum: int = 1, bound: int | None = None, nullable: bool = False):
    """``value`` if it is an integer in [minimum, bound] (or None when ``nullable``), else a
    :class:`ConfigError` naming the field, the value and the rule."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if nullable:
            rule += " or null"
        raise ConfigError(f"{name}={show(value)} must be {rule}")
    if bound is not None and value > bound:
        raise ConfigError(f"{name}={show(value)} exceeds {_bound_text(bound)}, the largest memlib accepts")
    return value


#: an integer written as text has at most this many digits (every bound above is below 10^20)
MAX_DIGITS = 20


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: ``str.isdigit`` accepts other scripts' digits (``²``,
    ``١``, ``１``), and so do ``int`` and ``\\d`` in a regular expression, for some of them."""
    return bool(text) and all("0" <= c <= "9" for c in text)


def parse_count(name: str, text: str, *, minimum: int = 1, bound: int | None = None) -> int:
    """The one parser of every integer memlib reads from text (the command line, ``--fix``, a layout, a recompute
    policy, a Megatron-LM flag file): plain ASCII digits after an optional sign (a negative value is named as
    such), at most :data:`MAX_DIGITS` of them, read only then, and checked against ``minimum`` and ``bound``;
    else a :class:`ConfigError` naming ``name``, the text and the rule."""
    t = text.strip() if isinstance(text, str) else text
    if not isinstance(t, str):
        raise ConfigError(f"{name}={show(text)} must be an integer written in digits")
    body = t[1:] if t[:1] in "+-" else t
    rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if ascii_digits(body) and len(body) > MAX_DIGITS:
        raise ConfigError(f"{name}={show(text)} has {len(body)} digits, more than any size memlib accepts")
    if not ascii_digits(body):
        raise ConfigError(f"{name}={show(text)} must be {rule} (ASCII digits)")
    value = int(t)
    if value < minimum:
        raise ConfigError(f"{name}={value} must be {rule}")
    if bound is not None and value > bound:
        raise ConfigError(f"{name}={value} exceeds {_bound_text(bound)}, the largest memlib accepts")
    return value
