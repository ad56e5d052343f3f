"""memlib: exact, symbolic GPU memory of DeepSeek-style mixture-of-experts training.

The modules follow the data: :mod:`~memlib.config` (model and training configs) →
:mod:`~memlib.architecture` (tensors and shapes) → :mod:`~memlib.params` (counts) →
:mod:`~memlib.partition` (what each device stores, per schedule) → :mod:`~memlib.states`
(precision, ZeRO) → :mod:`~memlib.megatron_buffers` (the persistent memory of one Megatron-Core rank:
DDP buffers with their padding, the distributed optimizer's shards, the framework's own buffers) →
:mod:`~memlib.activations` (the saved-tensor ledger and recompute policies) →
:mod:`~memlib.ledgers` (what each implementation saves: paper, :mod:`~memlib.ledgers_megatron`,
:mod:`~memlib.ledgers_hf`) →
:mod:`~memlib.schedule` (micro-batches in flight) → :mod:`~memlib.overhead` (named overheads) →
:mod:`~memlib.memory` (per-device totals) → :mod:`~memlib.compiled` (the same totals as vectorised
NumPy functions of the parallel sizes) → :mod:`~memlib.plan` (every configuration of N GPUs that fits,
ranked) → :mod:`~memlib.timeline` (memory over one iteration); :mod:`~memlib.megatron_args` reads Megatron-LM's own
launch flags as a model and a training configuration.  Then what reads those results:
:mod:`~memlib.reference` (published values, verbatim), :mod:`~memlib.paper` (the paper's views of
memlib's counts, its errata), :mod:`~memlib.formulas` (the registry of named formulas, every
numbered equation of the book), :mod:`~memlib.scenarios` (the named configurations and sweeps the
book runs) and :mod:`~memlib.report` (formatting, tables and figures only; one module per chapter).  :mod:`~memlib.measure` (optional, needs torch) checks the
ledgers against PyTorch and transformers, :mod:`~memlib.measure_megatron` (optional, needs torch and
megatron-core) the megatron profile against Megatron-Core.  :mod:`~memlib.symbols` (the notation),
:mod:`~memlib.kernels` (the megatron profile's kernel choices), :mod:`~memlib.breakdown` and
:mod:`~memlib.units` serve all.

Every result is a :class:`~memlib.breakdown.Breakdown` of named SymPy terms; substituting a
configuration gives exact integers.
"""
from .breakdown import Breakdown
from .config import PAPER_TRAINING, ConfigError, ModelConfig, TrainingConfig, load_model
from .memory import Estimate, estimate
from .partition import Partition
from .states import RECIPES, ZeroStage

__all__ = ["Breakdown", "ConfigError", "ModelConfig", "TrainingConfig", "PAPER_TRAINING",
           "load_model", "Partition", "RECIPES", "ZeroStage", "Estimate", "estimate"]
__version__ = "0.1.0"
