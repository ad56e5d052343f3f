"""Pipeline layouts: Megatron-Core's ``--pipeline-model-parallel-layout`` grammar and its default split of layers.

:func:`parse_layout` reads a layout string (``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L``
loss, ``|`` between stages, repetitions), :func:`layout_stages` turns it into memlib's decoder layers per
(virtual) stage, and :func:`megatron_layout` works out Megatron-Core's own split when no layout is given
(``transformer_block.py`` ``get_num_layers_to_build``).  The rules are in
``docs/derivations/megatron_flags.md`` ("Parallelism", "Layout strings").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..config import ConfigError, parse_count, show

__all__ = ["MegatronLayout", "parse_layout", "layout_stages", "megatron_layout", "MAX_LAYOUT_CHARS"]

#: the most characters a layout string may unroll to
MAX_LAYOUT_CHARS = 2**20


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
        n = parse_count(name, digits, minimum=0)
        total[0] += len(mo.group(1)) * n
        if total[0] > MAX_LAYOUT_CHARS:
            raise ConfigError(f"{name}={show(text)} unrolls to more than {MAX_LAYOUT_CHARS:,} characters")
        return mo.group(1) * n

    s = re.sub(r"\(([^)]+)\)\*([0-9]+)", unroll, s)      # ASCII digits: \d matches other scripts' too
    s = re.sub(r"(.)\*([0-9]+)", unroll, s)
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
    if mtp_layers is not None and m != mtp_layers and m:   # none placed: they go with the loss (older layouts)
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
