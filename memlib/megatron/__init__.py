"""Megatron-LM's launch flags read as a memlib configuration (``memlib estimate --megatron-args``).

:mod:`~memlib.megatron.flags` maps the flags onto a model, a training configuration and the framework's
settings.
"""
