"""memlib: exact, symbolic GPU memory of DeepSeek-style mixture-of-experts training.

The packages follow the data, in the order of :data:`PACKAGES`: each imports only those before it
(``tests/test_layering.py`` checks it), and each package's docstring says what it holds (chapter 1
tabulates them).

Every result is a :class:`~memlib.core.breakdown.Breakdown` of named SymPy terms; substituting a
configuration gives exact integers.
"""
from .core.breakdown import Breakdown
from .config import PAPER_TRAINING, ConfigError, ModelConfig, TrainingConfig, load_model
from .device.estimate import Estimate, estimate
from .model.partition import Partition
from .config import ZeroStage
from .config.precision import RECIPES

__all__ = ["Breakdown", "ConfigError", "ModelConfig", "TrainingConfig", "PAPER_TRAINING",
           "load_model", "Partition", "RECIPES", "ZeroStage", "Estimate", "estimate"]
__version__ = "0.1.0"

#: memlib's packages (and its one top-level module, ``formulas``) in the order data flows: from the leaves
#: (units, symbols, the Breakdown type) through configuration, activation ledgers, model, one device, the
#: search, Megatron-LM's flags and the published data, to the paper's views, the formula registry, the
#: optional measurements, the book's scenarios and report, and the command line
PACKAGES = ("core", "config", "ledgers", "model", "device", "search", "megatron", "data", "paper", "formulas",
            "measure", "scenarios", "report", "cli")
