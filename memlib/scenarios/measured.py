"""Measured peaks published for Megatron-LM runs of Llama models: memlib's ``peak_allocated`` beside them.

SimuMax's B200 runs of Llama-3-70B and -405B under Megatron-LM (:data:`memlib.data.reference.SIMUMAX_B200_RUNS`)
are predicted stage by stage from the launch script's flags (:data:`SIMUMAX_ASSUMPTIONS`, :func:`published_cases`);
the published Llama and Mixtral rows whose configuration cannot be recovered are listed with the reason
(:data:`PUBLISHED_NOT_USED`).  Megatron-LM's own functional tests, the validation set, are
:mod:`memlib.scenarios.functional`.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from ..config import ConfigError, ModelConfig, TrainingConfig
from ..data.reference import SIMUMAX_MODELS, SIMUMAX_SETUP
from ..device.estimate import estimate
from ..device.overhead import Overheads
from ..device.peak import StagePeak
from .functional import TARGET

__all__ = ["TARGET", "SIMUMAX_ASSUMPTIONS", "PublishedCase", "simumax_model", "published_case", "published_cases",
           "PUBLISHED_NOT_USED", "not_used"]


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
    (f"context parallelism over {SIMUMAX_SETUP['cp_comm_type'][0]} (--cp-comm-type)", "cp_comm_type"),
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
    model: ModelConfig             #: the launcher's model as memlib reads it
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
    from ..megatron.rules import pad_vocab
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
                           cross_entropy_fusion_impl="te", cp_comm_type=SIMUMAX_SETUP["cp_comm_type"][0])
    model = simumax_model(run["model"], run["layers"], run["tp"])
    fw = Framework(compute_capability=SIMUMAX_SETUP["gpu"][0][1])
    est = estimate(model, train, Overheads(0, 0, Fraction(0)), framework=fw)
    unfused = estimate(model, train.with_(cross_entropy_loss_fusion=False), Overheads(0, 0, Fraction(0)), framework=fw)
    per_stage = world // run["pp"]
    measured = tuple(max(v for r, v in run["max_allocated"].items() if r // per_stage == st) for st in range(run["pp"]))
    return PublishedCase(key, _simumax_label(run), tuple(run["rows"]), train, run["layers"], measured,
                         max(run["max_reserved"].values()), tuple(est.peaks), model,
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
