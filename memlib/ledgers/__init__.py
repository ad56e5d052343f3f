"""Activation ledgers: the tensors each layer saves for backward, one ledger per implementation, and their registry.

:mod:`~memlib.ledgers.paper.base` holds the ledger type (``Saved``, ``Policy``, ``ActProfile``);
:mod:`~memlib.ledgers.paper.paper` the paper's and Korthikanti's ledgers and the profile registry,
:mod:`~memlib.ledgers.paper.hf` what the pinned ``transformers`` saves, :mod:`~memlib.ledgers.paper.megatron` what
Megatron-Core saves per kernel choice.
"""
