"""Published values memlib is checked against, verbatim, and the measured runs it reads as package data.

:mod:`~memlib.data.reference` holds the values as their sources print them; ``megatron_runs/``,
``published_runs/`` and ``gpu_validation_h200.json`` are data files read through the package.
"""
