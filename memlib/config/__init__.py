"""Configurations: the model (Hugging Face ``config.json`` field names), the training setup and its strategies.

:mod:`~memlib.config.checks` (the one-line :class:`ConfigError`, the bounds) →
:mod:`~memlib.config.model` (:class:`ModelConfig`, the families, presets, :func:`load_model`) →
:mod:`~memlib.config.strategies` (:class:`Schedule`, :class:`ZeroStage`, the kernel choices),
:mod:`~memlib.config.precision` (the precision recipes, :func:`~memlib.config.precision.recipe`) and
:mod:`~memlib.config.versions` (Megatron-LM versions and the rules that changed between them) →
:mod:`~memlib.config.training` (:class:`TrainingConfig`, the paper's configuration).  Both configs are
frozen dataclasses; nothing in memlib mutates them.  Bad input raises :class:`ConfigError` with one
line that names the field, its value and the rule.  The names below are the package's API.
"""
from __future__ import annotations

from .checks import LIMITS, ConfigError, ascii_digits, check_count, parse_count, show
from .model import (FAMILIES, config_field, reads_field, MAX_CONFIG_BYTES, PRESETS, Family, ModelConfig, family_of, load_model, model_from_dict,
                    preset_names)
from .strategies import CP_COMM_TYPES, FP8_FORMATS, FP8_RECIPES, OFFLOAD_MODULES, Schedule, ZeroStage
from .training import PAPER_TRAINING, TrainingConfig

__all__ = [
    "ConfigError", "ModelConfig", "TrainingConfig", "PRESETS", "load_model", "model_from_dict",
    "preset_names", "LIMITS", "show", "check_count", "parse_count", "ascii_digits", "Schedule", "ZeroStage",
    "FP8_FORMATS", "FP8_RECIPES", "OFFLOAD_MODULES", "CP_COMM_TYPES", "Family", "FAMILIES", "family_of", "config_field", "reads_field",
    "PAPER_TRAINING", "MAX_CONFIG_BYTES",
]
