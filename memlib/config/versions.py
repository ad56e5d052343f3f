"""Megatron-LM versions: what a launch flag meant in the version that ran it (``--megatron-version``).

A flag's meaning can change between Megatron-LM versions, and a launch script, or a functional test's
golden values, belongs to the version that ran it.  :data:`RULES` lists the rules memlib knows changed,
each with the main-branch commit that changed it and the release branches that have the change;
:func:`parse_version` reads a version as

* a release: ``core_r0.14.0`` (the release branch) or ``core_v0.14.0`` (a tag of it); the rules are those
  the branch has (read from each branch's sources, cherry-picks included, not from its date);
* a date of the main branch, ``2026-05-25`` (a commit's date, ``git log -1 --format=%cs``): a rule
  applies from its commit's date on;
* a commit and its date, ``be2b2cd70d@2026-05-25`` (memlib cannot look a commit up; the date places it);
  or one of the commits of :data:`KNOWN_COMMITS` alone.

Without a version memlib assumes :data:`DEFAULT_VERSION`, the commit its Megatron-LM semantics are read at.
Each rule's sources are in ``docs/issue22-findings.md``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

from .checks import ConfigError, show

__all__ = ["Rule", "RULES", "RELEASES", "KNOWN_COMMITS", "DEFAULT_VERSION", "MEGATRON_COMMIT", "MEGATRON_COMMIT_DATE",
           "MCORE_VERSION", "MegatronVersion", "parse_version",
           "ContainerRules", "NGC_TRANSFORMER_ENGINE", "NGC_BLACKWELL_CUBLAS_32MIB", "container_rules"]


@dataclass(frozen=True)
class Rule:
    """A rule of Megatron-LM that changed at ``commit`` (on the main branch, on ``date``)."""

    key: str
    commit: str
    date: str
    subject: str
    before: str       #: what holds in the versions before the commit
    after: str        #: what holds from the commit on


#: the rules that changed, oldest first
RULES: tuple[Rule, ...] = (
    Rule("cross_entropy_fusion_impl", "3b141a2471", "2025-04-05",
         "Add output-discarding recomputation method to reduce activation memory",
         "--cross-entropy-loss-fusion runs Megatron-Core's native kernel; there is no --cross-entropy-fusion-impl",
         "--cross-entropy-fusion-impl native (default) or te chooses the fused kernel"),
    Rule("mtp_loss_in_postprocess", "d7bf5aaaa8", "2025-08-26",
         "feat(MoE): Support Expert Parallel A2A Overlapping - (03) Support EP A2A overlap for interleaved PP and MTP",
         "the MTP block computes each MTP head's logits and loss inside its own forward",
         "GPTModel._postprocess computes the MTP heads' logits and losses in a loop before the main head: its local "
         "mtp_logits (the last MTP head's bf16 logits) stays referenced through the main output layer and loss"),
    Rule("mtp_loss_function", "9d71cb1cd2", "2026-02-04", 'Reapply "Add MTP support for hybrid models (#2363)"',
         "the MTP loop is inline in GPTModel._postprocess",
         "process_mtp_loss (multi_token_prediction.py) runs the loop: its MTP logits are freed when it returns, "
         "before the main head"),
    Rule("null_tokenizer_eod", "c9dfe34798", "2026-04-22", "Enable NullTokenizer for pretraining to reduce I/O access",
         "NullTokenizer adds one end-of-document token: --vocab-size N gives N + 1 tokens before padding",
         "NullTokenizer has --vocab-size tokens (its end-of-document token is the last of them)"),
    Rule("batch_moved_in_place", "5e4fc931ba", "2026-05-21",
         "refactor(data): consolidate get_batch and enable PP for SFT THD",
         "get_batch_on_this_tp_rank copies the loader's micro-batch to the GPU into a new dict: the micro-batches "
         "RerunDataIterator saves for a rerun stay on the host",
         "get_batch moves the loader's dict to the GPU in place (pretrain_gpt.py): RerunDataIterator, which saves "
         "every micro-batch of the step unless --rerun-mode disabled, keeps them on the GPU until the next step"),
    Rule("te_cross_entropy_refused", "168cb15d70", "2026-06-03", "Disable TE cross entropy loss fusion",
         "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te runs Transformer Engine's kernel",
         "Megatron-LM refuses --cross-entropy-fusion-impl te with --cross-entropy-loss-fusion (validate_args)"),
    Rule("rerun_iterator_copies_batch", "bf32f4415e", "2026-07-06",
         "Fix inter-document masking crash and NaNs with TP > 1 and micro_batch_size > 1",
         "RerunDataIterator saves the loader's dict itself",
         "RerunDataIterator saves a shallow copy of it (copy.copy): the GPU tensors get_batch puts in the loader's "
         "dict are not saved"),
)

#: release branch -> the rules of RULES it has (read from each branch's sources: core_r0.12.0 has the
#: --cross-entropy-fusion-impl flag by a cherry-pick though it branched before 3b141a2471)
RELEASES: dict[str, frozenset[str]] = {
    "core_r0.10.0": frozenset(), "core_r0.11.0": frozenset(),
    **{f"core_r0.{n}.0": frozenset({"cross_entropy_fusion_impl"}) for n in range(12, 14)},
    **{f"core_r0.{n}.0": frozenset({"cross_entropy_fusion_impl", "mtp_loss_in_postprocess"}) for n in range(14, 17)},
    "core_r0.17.0": frozenset({"cross_entropy_fusion_impl", "mtp_loss_in_postprocess", "mtp_loss_function"}),
    "core_r0.18.0": frozenset({"cross_entropy_fusion_impl", "mtp_loss_in_postprocess", "mtp_loss_function",
                               "null_tokenizer_eod", "batch_moved_in_place"}),
    "core_r0.19.0": frozenset({"cross_entropy_fusion_impl", "mtp_loss_in_postprocess", "mtp_loss_function",
                               "null_tokenizer_eod", "batch_moved_in_place", "te_cross_entropy_refused",
                               "rerun_iterator_copies_batch"}),
}

#: the Megatron-LM commit memlib reads (its flags' semantics, Megatron-Core's buffers, the functional tests'
#: goldens), and its date
MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
MEGATRON_COMMIT_DATE = "2026-08-22"
#: the megatron-core release memlib's Megatron-Core ledgers are measured and read against (the Makefile pins it)
MCORE_VERSION = "0.19.2"

#: commits memlib knows by name: the pin and the commits of RULES (commit -> its date)
KNOWN_COMMITS: dict[str, str] = {MEGATRON_COMMIT[:10]: MEGATRON_COMMIT_DATE, **{r.commit: r.date for r in RULES}}

#: the version memlib assumes when none is given: the Megatron-LM commit its flag semantics are read at
DEFAULT_VERSION = f"{MEGATRON_COMMIT[:10]}@{MEGATRON_COMMIT_DATE}"

_RELEASE = re.compile(r"core_[rv]0\.(\d{1,3})\.\d{1,3}(rc\d{1,3})?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_COMMIT = re.compile(r"[0-9a-f]{7,40}")


@dataclass(frozen=True)
class MegatronVersion:
    """A Megatron-LM version as memlib reads it: its text and the rules it has."""

    text: str
    rules: frozenset[str]

    def has(self, key: str) -> bool:
        """Whether the change of rule ``key`` is in this version."""
        if key not in {r.key for r in RULES}:
            raise KeyError(key)   # pragma: no cover - a programming error
        return key in self.rules

    @property
    def mtp_logits_through_main_loss(self) -> bool:
        """Whether the last MTP head's bf16 logits stay referenced through the main head's output layer and loss
        (GPTModel._postprocess's inline MTP loop: from d7bf5aaaa8 until 9d71cb1cd2; core_r0.14.0 to core_r0.16.0)."""
        return self.has("mtp_loss_in_postprocess") and not self.has("mtp_loss_function")

    @property
    def rerun_iterator_keeps_gpu_batches(self) -> bool:
        """Whether RerunDataIterator's saved micro-batches are the GPU batches get_batch made in the loader's dict
        (from 5e4fc931ba until bf32f4415e; core_r0.18.0)."""
        return self.has("batch_moved_in_place") and not self.has("rerun_iterator_copies_batch")


def _date(text: str, what: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"megatron_version={show(what)}: {text} is not a date (YYYY-MM-DD)") from None


def _by_date(day: date) -> frozenset[str]:
    return frozenset(r.key for r in RULES if day >= date.fromisoformat(r.date))


def parse_version(text) -> MegatronVersion:
    """``text`` (a release, a main-branch date, ``commit@date`` or a known commit) as a version.

    >>> sorted(parse_version("core_r0.14.0").rules)
    ['cross_entropy_fusion_impl', 'mtp_loss_in_postprocess']
    >>> parse_version("2026-06-03").has("te_cross_entropy_refused")
    True
    >>> parse_version("be2b2cd70d@2026-05-25").has("null_tokenizer_eod")
    True
    """
    if not isinstance(text, str) or not text or len(text) > 80:
        raise ConfigError(f"megatron_version={show(text)} must be a release (core_r0.14.0), a date (YYYY-MM-DD) "
                          f"or a commit with its date (abc1234@YYYY-MM-DD)")
    t = text.strip()
    m = _RELEASE.fullmatch(t)
    if m:
        branch = f"core_r0.{int(m.group(1))}.0"
        if branch not in RELEASES:
            known = ", ".join(RELEASES)
            raise ConfigError(f"megatron_version={show(t)}: memlib knows the rules of the releases {known}; give "
                              f"the date of the release's commit instead (YYYY-MM-DD)")
        return MegatronVersion(t, RELEASES[branch])
    if _DATE.fullmatch(t):
        return MegatronVersion(t, _by_date(_date(t, t)))
    commit, at, day = t.partition("@")
    if _COMMIT.fullmatch(commit.lower()):
        if at:
            if not _DATE.fullmatch(day):
                raise ConfigError(f"megatron_version={show(t)}: after '@' comes the commit's date (YYYY-MM-DD)")
            return MegatronVersion(f"{commit.lower()}@{day}", _by_date(_date(day, t)))
        known = [c for c in KNOWN_COMMITS if c.startswith(commit.lower()[:10]) or commit.lower().startswith(c)]
        if known:
            return MegatronVersion(f"{known[0]}@{KNOWN_COMMITS[known[0]]}", _by_date(_date(KNOWN_COMMITS[known[0]], t)))
        raise ConfigError(f"megatron_version={show(t)}: memlib cannot look the commit up; give it with its date, "
                          f"{commit}@YYYY-MM-DD (git log -1 --format=%cs {commit})")
    raise ConfigError(f"megatron_version={show(t)} must be a release (core_r0.14.0), a date (YYYY-MM-DD) or a commit "
                      f"with its date (abc1234@YYYY-MM-DD)")


# ------------------------------------------------------------------------------------------------
# the software around Megatron-LM: the NGC PyTorch container a run's image is built on
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContainerRules:
    """What memlib reads from the NGC PyTorch container a run was built on (``nvcr.io/nvidia/pytorch:YY.MM-py3``).

    ``te_version``
        the container's own Transformer Engine where the run used it and it decides a kernel memlib counts
        differently: NGC 24.01, the ``lts`` image of Megatron-LM's CI until 2025-11-06 (that image installs no
        TE of its own: docker/Dockerfile.ci.lts, pyproject.toml's ``lts`` extra), holds TE 1.2.x (TE v1.3 was
        tagged on 2024-02-02, after that container); ``None``: a TE from 1.3 on (the ``dev`` image installs
        its own, ``transformer-engine[pytorch]>=2.6`` in pyproject.toml).
    ``blackwell_cublas_32mib``
        whether its PyTorch has pytorch#175344 (merged 2026-02-19: 32 MiB cuBLAS workspaces on Blackwell):
        containers from 26.03 on; 26.02 and earlier take their PyTorch from before the merge (a container's
        PyTorch is a snapshot that precedes its month's release).
    """

    image: str
    te_version: tuple[int, int] | None
    blackwell_cublas_32mib: bool


_NGC = re.compile(r"nvcr\.io/nvidia/pytorch:(\d{2})\.(\d{2})-py3")
#: NGC PyTorch containers (YY, MM) whose own Transformer Engine memlib's rules need (see ContainerRules)
NGC_TRANSFORMER_ENGINE = {(24, 1): (1, 2)}
#: the first NGC PyTorch container whose PyTorch has pytorch#175344
NGC_BLACKWELL_CUBLAS_32MIB = (26, 3)


def container_rules(image: str | None) -> ContainerRules:
    """The :class:`ContainerRules` of an NGC PyTorch container; ``None`` (or another image) is today's software.

    >>> container_rules("nvcr.io/nvidia/pytorch:24.01-py3").te_version
    (1, 2)
    >>> container_rules("nvcr.io/nvidia/pytorch:26.02-py3").blackwell_cublas_32mib
    False
    >>> container_rules(None).blackwell_cublas_32mib
    True
    """
    m = _NGC.fullmatch((image or "").strip())
    if not m:
        return ContainerRules(image or "", None, True)
    ym = (int(m.group(1)), int(m.group(2)))
    return ContainerRules(image, NGC_TRANSFORMER_ENGINE.get(ym), ym >= NGC_BLACKWELL_CUBLAS_32MIB)
