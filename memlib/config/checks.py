"""Bad input, stopped early: the one-line error, the bounds every size is checked against, the count check.

Every configuration error memlib raises is a :class:`ConfigError` whose message names the field, its value
and the rule; :data:`LIMITS` bounds every size before any arithmetic, so that no input can make memlib
crash or hang.
"""
from __future__ import annotations

__all__ = ["ConfigError", "LIMITS", "show", "check_count"]


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
    "pp": 2**16,                 # pipeline stages: one entry of the layout each
    "virtual_stages": 2**16,     # pp * vpp model chunks
    "micro_batch": 2**30,
    "seq_len": 2**40,
    "num_microbatches": 2**30,
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
