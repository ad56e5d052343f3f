"""Megatron-LM's launch flags read as a memlib configuration (``memlib estimate --megatron-args``).

:mod:`~memlib.megatron.reader` (the flags of a launch script, a list or a ``model_config.yaml``) →
:mod:`~memlib.megatron.listexpr` (``--moe-layer-freq`` list expressions, parsed, never evaluated) →
:mod:`~memlib.megatron.layout` (``--pipeline-model-parallel-layout`` and Megatron-Core's default split) →
:mod:`~memlib.megatron.tables` (what is known of a flag before a run: no memory effect, MoE only, overridable) and
:mod:`~memlib.megatron.rules` (the vocabulary padding, the precision recipe of the mixed-precision flags) →
:mod:`~memlib.megatron.model_flags` (the model's fields) →
:mod:`~memlib.megatron.flags` (the mapping onto a model, a training configuration and the framework's
settings).  How each flag maps, with its sources: ``docs/derivations/megatron_flags.md``.
"""
