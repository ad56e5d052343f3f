"""Measured peaks: memlib's ``peak_allocated`` beside what Megatron-LM's functional tests log.

Every case is a Megatron-LM functional test that logs ``mem-max-allocated-bytes`` and
``mem-allocated-bytes`` on the last global rank (:data:`memlib.data.reference.MEGATRON_RUNS`).  memlib reads the
test's own ``model_config.yaml`` with :func:`memlib.megatron.flags.parse_megatron_args` (the launch flags,
nothing retyped), with the world size of the test's recipe (or, for the DeepSeek-V3 proxies, derived from
the logged post-step allocation: :data:`memlib.data.reference.MEGATRON_WORLD_SIZES` says which), and predicts
the last pipeline stage's peak (:mod:`memlib.device.peak`) on the logging GPU's compute capability.

Two measured values per case:

``steady``
    the maximum at the third logged iteration: Adam's moments exist (they are created by the first
    step) and the routing is still close to its balanced start, which is what memlib assumes
    (``routing_imbalance`` 1).  The prediction's error is taken against it.
``run maximum``
    the maximum over the whole logged run, which grows as the routing becomes unbalanced.  memlib
    states the routing imbalance at which its prediction reaches it (:func:`implied_imbalance`: routed
    tokens scale linearly with the factor, so two predictions give it exactly where the peak's
    moment does not change).

A case memlib cannot express (another attention, another sharding of the model states, CUDA graphs) is
listed with its reason (:data:`NOT_EXPRESSIBLE`), never given a number.

Measurements published elsewhere: SimuMax's B200 runs of Llama-3-70B and -405B under Megatron-LM
(:data:`memlib.data.reference.SIMUMAX_B200_RUNS`) are predicted stage by stage from the launch script's flags
(:data:`SIMUMAX_ASSUMPTIONS`, :func:`published_cases`); the published Llama and Mixtral rows whose
configuration cannot be recovered are listed with the reason (:data:`PUBLISHED_NOT_USED`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from typing import Callable

from ..config import ConfigError, TrainingConfig
from ..device.estimate import Estimate, estimate
from ..megatron.flags import MegatronRun, parse_megatron_args
from ..device.megatron_buffers import FRAMEWORK_TERMS
from ..device.overhead import Overheads
from ..device.peak import StagePeak
from ..data.reference import MEGATRON_RUNS, SIMUMAX_MODELS, SIMUMAX_SETUP

__all__ = ["Case", "CASES", "NOT_EXPRESSIBLE", "GAPS", "GAP_DEFAULT", "gap_text", "TARGET", "MeasuredCase", "run_of", "measured_case",
           "measured_cases", "implied_imbalance", "summary", "not_expressible", "SIMUMAX_ASSUMPTIONS", "PublishedCase",
           "simumax_model", "published_case", "published_cases", "PUBLISHED_NOT_USED", "not_used"]

#: the accuracy the prediction aims at on every case memlib expresses (|error| against the steady peak)
TARGET = Fraction(1, 100)


@dataclass(frozen=True)
class Case:
    """One functional test and the golden-values file (one GPU platform) it is compared on."""

    name: str                 #: the test case (a key of MEGATRON_RUNS)
    file: str                 #: the golden-values file
    label: str                #: a short name for tables and figures
    issue: bool = True        #: one of the published maxima the comparison was set up on


CASES: tuple[Case, ...] = (
    Case("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "golden_values_dev_dgx_h100.json", "memory_speed"),
    Case("gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8", "golden_values_dev_dgx_h100.json", "mtp fp8"),
    Case("gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental", "golden_values_dev_dgx_h100.json",
         "selective recompute"),
    Case("gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading", "golden_values_dev_dgx_h100.json",
         "offloading"),
    Case("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release", "golden_values_dev_dgx_h100.json",
         "DeepSeek-V3 proxy, H100"),
    Case("deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release", "golden_values_dev_dgx_gb200.json",
         "DeepSeek-V3 proxy, GB200"),
    # the other MLA/MoE tests that log memory
    Case("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "golden_values_dev_dgxh100_dgxc.json",
         "memory_speed (2nd cluster)", False),
    Case("gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading",
         "golden_values_dev_dgx_h100.json", "offloading, no MTP, no overlap", False),
    Case("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm", "golden_values_dev_dgx_h100.json",
         "DeepSeek-V3 proxy, H100 (_sm)", False),
    Case("deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release_sm", "golden_values_dev_dgx_gb200.json",
         "DeepSeek-V3 proxy, GB200 (_sm)", False),
)

#: the tests memlib cannot express, and why (the first three are among the published maxima)
NOT_EXPRESSIBLE: dict[str, str] = {
    "gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4":
        "grouped-query attention (no --multi-latent-attention): memlib models MLA only",
    "gpt3_mcore_te_tp2_pp2_mla":
        "MLA in a GPT-3 shell memlib does not model: LayerNorm, biases, a GeLU MLP without SwiGLU, learned "
        "absolute position embeddings, attention dropout 0.1 (its masks), no latent RMSNorms",
    "gpt3_mcore_te_tp2_pp2_mla_1node": "the same model as gpt3_mcore_te_tp2_pp2_mla, on four GPUs",
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_resume_torch_dist_attn_cudagraph":
        "CUDA graphs of the attention (--cuda-graph-impl transformer_engine): their static memory pools are "
        "not modelled; the allocator runs without expandable segments",
    "deepseek_proxy_fsdp_ep2_fsdp2": "Megatron-FSDP (--use-megatron-fsdp) in fp32 with FP8 parameter gathers",
    "deepseek_proxy_fsdp_ep2_fsdp2_1node": "Megatron-FSDP (--use-megatron-fsdp) in fp32 with FP8 parameter gathers",
    "deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap": "Megatron-FSDP (--use-megatron-fsdp) sharding of the model states, "
                                                "with deferred weight gradients",
}


def _loss_units(c: "MeasuredCase") -> str:
    from ..core.units import fmt_decimal
    return fmt_decimal(Fraction(abs(c.dynamic_gap), c.loss_softmax), 1) if c.loss_softmax else "?"


def _proxy_gap(c: "MeasuredCase") -> str:
    from ..core.units import fmt_decimal
    held = Fraction(2 * c.loss_softmax + c.peak.transient.get("cross_entropy_logits", 0), c.loss_softmax)
    more = "less" if c.dynamic_gap < 0 else "more"
    return (f"the loss region: memlib holds the MTP head's fp32 softmax beside the main head's bf16 logits and fp32 "
            f"softmax ({fmt_decimal(held, 1)} softmax-sized buffers), as the code at this commit runs; the run holds "
            f"{_loss_units(c)} buffers' worth {more}. The regular and _sm runs of the same flags err in opposite "
            "directions: the loss region changed between the code versions that logged them; an allocation trace "
            "of the last stage would settle it")


def _moment_words(c: "MeasuredCase") -> str:
    names = {"forward_end": "the end of the last chunk's forward (the logits beside the held micro-batches)",
             "backward_attention": "the first attention backward of the chunk computing",
             "forward_moe": "the forward of the last MoE layer's experts", "recompute": "the recompute of the last layer"}
    return names.get(c.moment, c.moment or "the end of a forward")


def _te_gap(c: "MeasuredCase") -> str:
    from ..core.units import fmt_bytes
    return (f"not located in the code read: memlib's worst moment is {_moment_words(c)}, and the run holds "
            f"{fmt_bytes(c.dynamic_gap, 'GiB')} more above its post-step allocation. The native fused cross-entropy "
            "runs under torch.compile, whose handling of its in-place updates of the fp32 logits cannot be read "
            "from the source (a copy would add one fp32 logits buffer); an allocation trace of the last stage "
            "would settle it")


def _offload_gap(c: "MeasuredCase") -> str:
    from ..core.units import fmt_bytes
    return (f"offloading's timing: memlib keeps one group of each offloaded module on the GPU and reloads one "
            f"layer's groups before its backward; its worst moment is {_moment_words(c)}; the run holds "
            f"{fmt_bytes(c.dynamic_gap, 'GiB')} more (the offload manager's prefetch and the first iteration's "
            "warm-up decide how many groups are on the GPU at once, which memlib does not replay)")


#: what memlib does not count (or counts too much) where a case misses the target, by test case: findings
#: from reading the code the run executes, never a fitted constant (each a function of the case's values)
GAPS: dict[str, Callable[["MeasuredCase"], str]] = {
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed": _te_gap,
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8": _te_gap,
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental": _te_gap,
    "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading": _offload_gap,
    "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading": _offload_gap,
    "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release": _proxy_gap,
    "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release": _proxy_gap,
    "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm": _proxy_gap,
    "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release_sm": _proxy_gap,
}
GAP_DEFAULT = "not attributed yet"


def gap_text(c: "MeasuredCase") -> str:
    """What memlib does not count where ``c`` misses the target (:data:`GAPS`)."""
    f = GAPS.get(c.case.name)
    return f(c) if f is not None else GAP_DEFAULT


def not_expressible() -> list[tuple[str, str, int]]:
    """(case, reason, published maximum in bytes on its first golden-values file) for each case memlib
    cannot express."""
    out = []
    for name, why in NOT_EXPRESSIBLE.items():
        files = MEGATRON_RUNS[name]["files"]
        first = "golden_values_dev_dgx_h100.json" if "golden_values_dev_dgx_h100.json" in files else next(iter(files))
        out.append((name, why, files[first]["max_run"]))
    return out


@lru_cache(maxsize=None)
def run_of(case: Case) -> MegatronRun:
    """The case's ``model_config.yaml`` read as a memlib configuration, at the file's world size."""
    run = MEGATRON_RUNS[case.name]
    f = run["files"][case.file]
    with open(run["config_copy"], encoding="utf-8") as fh:
        text = fh.read()
    return parse_megatron_args(text, world_size=f["world_size"], name=case.name)


def _estimate(case: Case, train: TrainingConfig | None = None) -> Estimate:
    r = run_of(case)
    f = MEGATRON_RUNS[case.name]["files"][case.file]
    fw = replace(r.framework, compute_capability=f["compute_capability"])
    return estimate(r.model, train or r.train, Overheads(0, 0, Fraction(0)), framework=fw)


@dataclass(frozen=True)
class MeasuredCase:
    """One case: the logged values and memlib's prediction for the logging rank (the last stage)."""

    case: Case
    run: MegatronRun
    device: str
    world_size: int
    world_size_source: str
    post_step: int             #: the logged allocation after the optimizer step (the largest logged)
    steady: int                #: the maximum at the third logged iteration
    run_max: int               #: the maximum over the run
    run_max_at: int            #: the iteration of that maximum
    peak: StagePeak            #: memlib's prediction on the last stage
    persistent: int            #: memlib's persistent terms (the post-step account)
    framework: dict            #: memlib's framework terms of the last stage (bytes, by name)
    imbalance: Fraction | None  #: the routing imbalance at which memlib reaches the run maximum
    loss_softmax: int = 0       #: one micro-batch's fp32 cross-entropy softmax on the last stage (the ledger's)
    moment: str = ""            #: the candidate moment of the chunk computing at the peak (memlib.device.transient)

    @property
    def predicted(self) -> int:
        return self.peak.peak_allocated

    @property
    def error(self) -> Fraction:
        """(predicted - steady) / steady."""
        return Fraction(self.predicted - self.steady, self.steady)

    @property
    def error_run_max(self) -> Fraction:
        return Fraction(self.predicted - self.run_max, self.run_max)

    @property
    def within_target(self) -> bool:
        return abs(self.error) <= TARGET

    @property
    def post_step_unexplained(self) -> int:
        """Logged post-step allocation minus memlib's persistent account."""
        return self.post_step - self.persistent

    @property
    def dynamic_gap(self) -> int:
        """What the run holds above its post-step allocation at the steady peak, minus what memlib holds
        above its persistent account (activations and transient): the error that is not persistent."""
        return (self.steady - self.post_step) - (self.predicted - self.persistent)


def implied_imbalance(case: Case, target: int) -> Fraction | None:
    """The routing imbalance at which memlib's peak reaches ``target`` bytes (None when the balanced
    prediction is already at or above it, or routing does not move the peak): the peak is linear in the
    factor while its moment stays, so the predictions at 1 and 2 fix it."""
    base = _estimate(case).peaks[-1].peak_allocated
    if base >= target:
        return None
    twice = _estimate(case, run_of(case).train.with_(routing_imbalance=Fraction(2))).peaks[-1].peak_allocated
    if twice <= base:
        return None
    return 1 + Fraction(target - base, twice - base)


@lru_cache(maxsize=None)
def measured_case(case: Case) -> MeasuredCase:
    runs = MEGATRON_RUNS[case.name]
    f = runs["files"][case.file]
    r = run_of(case)
    est = _estimate(case)
    pk = est.peaks[-1]
    post = f["post_step"] if isinstance(f["post_step"], int) else max(f["post_step"])
    steady = f["max_first"][-1][1]
    if steady is None:
        raise ConfigError(f"{case.name}/{case.file}: no maximum logged at the third iteration")
    return MeasuredCase(case, r, f["device"], f["world_size"], f["world_size_source"], post, steady, f["max_run"],
                        f["max_run_at"], pk, sum(pk.persistent.values()),
                        {k: v for k, v in pk.persistent.items() if k in FRAMEWORK_TERMS},
                        implied_imbalance(case, f["max_run"]),
                        est.stages[-1].activations["by_entry"].get("head.loss_softmax", 0), pk.candidate)


def measured_cases(issue_only: bool = False) -> list[MeasuredCase]:
    """Every case of :data:`CASES` (only the published maxima with ``issue_only``), predicted."""
    return [measured_case(c) for c in CASES if c.issue or not issue_only]


def summary(cases: list[MeasuredCase]) -> dict:
    """Counts and extremes of the errors (exact fractions)."""
    errs = [c.error for c in cases]
    return {"n": len(cases), "within": sum(c.within_target for c in cases),
            "max_abs": max(abs(e) for e in errs), "mean_abs": sum(abs(e) for e in errs) / len(errs)}


# ------------------------------------------------------------------------------------------------
# other published measurements: SimuMax's B200 runs of Llama-3; the rows not used, with the reason
# ------------------------------------------------------------------------------------------------
#: what each SimuMax run is read as, beyond its own name (model, layers, TP/PP/CP/DP, sequence length):
#: the launcher's flags (:data:`memlib.data.reference.SIMUMAX_SETUP`), each set in the TrainingConfig or the Framework
SIMUMAX_ASSUMPTIONS: tuple[tuple[str, str], ...] = (
    (f"micro-batch {SIMUMAX_SETUP['micro_batch'][0]}", "micro_batch"),
    (f"sequence {SIMUMAX_SETUP['seq_len'][0]:,} (the CP rows: the one their name gives)", "seq_len"),
    ("distributed optimizer (ZeRO 1), fp32 main gradients, bf16 weights (memlib's megatron precision); sequence "
     "parallelism where TP > 1; flash attention through Transformer Engine; no recompute (full, block, no layer); "
     "no overlap of the gradient reduction or the parameter gather", "flags"),
    ("Transformer Engine's fused cross-entropy", "cross_entropy"),
    (f"the launcher's vocabulary + 1, padded: {SIMUMAX_MODELS['llama3-70b']['vocab_size']:,} + 1 to a multiple of "
     "128 TP", "vocab"),
    (f"{SIMUMAX_SETUP['gpu'][0][0]} (compute capability {SIMUMAX_SETUP['gpu'][0][1]}), Megatron-LM "
     f"{SIMUMAX_SETUP['megatron_commit'][0][:8]}", "megatron_commit"),
    (f"rank order {SIMUMAX_SETUP['rank_order'][0]}: the stage of a rank", "rank_order"),
    (f"{SIMUMAX_SETUP['world_size'][0]} GPUs", "world_size"),
)


@dataclass(frozen=True)
class PublishedCase:
    """One measured SimuMax run: the measured maximum per pipeline stage and memlib's ``peak_allocated``."""

    key: str                       #: the measured case (a key of SIMUMAX_B200_RUNS)
    label: str
    rows: tuple[str, ...]          #: the published rows that share this measurement
    train: TrainingConfig
    layers: int
    measured: tuple[int, ...]      #: per stage: the maximum over its ranks of max_memory_allocated (bytes)
    reserved: int                  #: the maximum over all ranks of max_memory_reserved (bytes)
    peaks: tuple[StagePeak, ...]   #: memlib's prediction per stage
    unfused_ce: int = 0            #: memlib's largest stage peak were the cross-entropy not fused (the one assumption
                                   #: the runs' own flags do not show)

    @property
    def error_unfused_ce(self) -> Fraction:
        return Fraction(self.unfused_ce - self.measured_max, self.measured_max)

    @property
    def measured_max(self) -> int:
        """The published value: the maximum over all ranks."""
        return max(self.measured)

    @property
    def predicted(self) -> int:
        return max(p.peak_allocated for p in self.peaks)

    @property
    def error(self) -> Fraction:
        """(memlib's largest stage peak - the measured maximum over the ranks) / the measured maximum."""
        return Fraction(self.predicted - self.measured_max, self.measured_max)

    @property
    def stage_errors(self) -> tuple[Fraction, ...]:
        return tuple(Fraction(p.peak_allocated - m, m) for p, m in zip(self.peaks, self.measured))

    @property
    def within_target(self) -> bool:
        return abs(self.error) <= TARGET


def simumax_model(model: str, layers: int, tp: int):
    """The launcher's model (``SIMUMAX_MODELS``) with ``layers`` layers and Megatron-LM's padded vocabulary: a Llama,
    or a DeepSeek whose first layer is dense, without MTP (``run_pretrain_deepseekv2.sh``)."""
    from ..config import model_from_dict
    from ..megatron.flags import pad_vocab
    from ..data.reference import SIMUMAX_MODELS
    shape = dict(SIMUMAX_MODELS[model])
    shape["vocab_size"] = pad_vocab(shape["vocab_size"] + 1, 128, tp)
    if model.startswith("deepseek"):
        kind = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "first_k_dense_replace": 1,
                "scoring_func": "softmax"}
    else:
        kind = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                "attention_bias": False, "mlp_bias": False}
    return model_from_dict({**kind, "tie_word_embeddings": False, "num_hidden_layers": layers, **shape},
                           name=f"{model} ({layers} layers)")


def _simumax_label(run: dict) -> str:
    name = run["model"].replace("llama3-", "Llama-3-").upper().replace("LLAMA-3-", "Llama-3-")
    par = f"TP{run['tp']}" + (f" CP{run['cp']}" if run["cp"] > 1 else "") + (f" PP{run['pp']}" if run["pp"] > 1 else "")
    seq = f", s {run['seq_len'] // 1024}K" if run["seq_len"] != 4096 else ""
    return f"{name} L{run['layers']} {par}{seq}"


@lru_cache(maxsize=None)
def published_case(key: str) -> PublishedCase:
    """memlib's prediction for the SimuMax run ``key`` (the launcher's flags, read as SIMUMAX_ASSUMPTIONS)."""
    from ..device.peak import Framework
    from ..data.reference import SIMUMAX_B200_RUNS, SIMUMAX_SETUP
    run = SIMUMAX_B200_RUNS[key]
    world = SIMUMAX_SETUP["world_size"][0]
    if run["tp"] * run["pp"] * run["cp"] * run["dp"] != world:
        raise ConfigError(f"{key}: TP PP CP DP = {run['tp'] * run['pp'] * run['cp'] * run['dp']} must be {world}")
    train = TrainingConfig(dp=run["dp"], tp=run["tp"], pp=run["pp"], cp=run["cp"], sp=run["tp"] > 1, zero=1,
                           precision="megatron", profile="megatron", micro_batch=SIMUMAX_SETUP["micro_batch"][0],
                           seq_len=run["seq_len"], num_microbatches=run["micro_batches"], cross_entropy_loss_fusion=True,
                           cross_entropy_fusion_impl="te")
    model = simumax_model(run["model"], run["layers"], run["tp"])
    fw = Framework(compute_capability=SIMUMAX_SETUP["gpu"][0][1])
    est = estimate(model, train, Overheads(0, 0, Fraction(0)), framework=fw)
    unfused = estimate(model, train.with_(cross_entropy_loss_fusion=False), Overheads(0, 0, Fraction(0)), framework=fw)
    per_stage = world // run["pp"]
    measured = tuple(max(v for r, v in run["max_allocated"].items() if r // per_stage == st) for st in range(run["pp"]))
    return PublishedCase(key, _simumax_label(run), tuple(run["rows"]), train, run["layers"], measured,
                         max(run["max_reserved"].values()), tuple(est.peaks),
                         max(p.peak_allocated for p in unfused.peaks))


def published_cases() -> list[PublishedCase]:
    """Every measured SimuMax run, predicted (in the order of the published table)."""
    from ..data.reference import SIMUMAX_B200_RUNS
    return [published_case(k) for k in SIMUMAX_B200_RUNS]


def _pr482_rows() -> list[str]:
    from ..data.reference import PR482_LLAMA2_7B as P
    return [f"MBS {r[0]}, DP {r[2]}, PP {r[3]}, TP {r[4]}" for r in P["rows"]]


#: published measured rows of Llama and Mixtral runs that memlib is not compared on, and why: their
#: configuration cannot be recovered from what was published (source, rows, published values, reason)
PUBLISHED_NOT_USED: tuple[tuple[str, str, str, str], ...] = (
    ("Megatron-LM PR #482 (Llama-2 7B, H800)", "4 rows of the README table",
     "69.1, 55.7, 49.8, 28.8 (\"GB\")",
     "the sequence length, the normalization, whether the distributed optimizer, flash attention and sequence "
     "parallelism were on, and the code (the 2023 legacy GPT model, not Megatron-Core) are not stated; the unit "
     "\"GB\" of max_memory_allocated is not defined, nor which rank is reported"),
    ("Megatron-LM PR #482, a review comment", "DP 8, PP 2, TP 1 on two nodes", "\"0:69.1, 1:a\"",
     "the second stage's value is not given; the configuration as above is not stated"),
    ("mbridge memory estimator (Mixtral-8x2B, 4 layers)", "4 rows (TP 1, 2; MBS 1, 2)",
     "Allocated 7.61, 7.96, 13.41, 13.81; Real 6.6, 8, 11.2, 13.8 (\"GB\")",
     "the model config it names (model_configs/test_small.yaml) is not in the repository: heads, key-value "
     "groups, top-k and the expert parallel size are unknown; the launch flags (distributed optimizer, "
     "recompute, dispatcher) are not given; the two measured columns are not defined"),
    ("SimuMax, A100-PCIe (Llama-3 8B and 70B)", "24 rows (docs/FULL_RESULTS.md)", "errors only",
     "the table publishes SimuMax's memory error only, not the measured memory (its chart, assets/A100-Pcie.png, "
     "shows performance), nor the Megatron-LM version or the flags of those runs"),
    ("SimuMax, B200, interleaved pipeline (Llama-3-70B, PP 4, VPP 2)", "4 rows (excluded list)", "none",
     "excluded from the published table by its authors; no measured value is published"),
)


def not_used() -> list[tuple[str, str, str, str]]:
    """:data:`PUBLISHED_NOT_USED` (source, rows, published values, reason)."""
    return list(PUBLISHED_NOT_USED)
