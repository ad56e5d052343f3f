"""Ground truth on the CPU (optional, needs torch): what PyTorch, transformers and Megatron-Core actually save and allocate.

:mod:`~memlib.measure.hf` measures the Hugging Face implementation, :mod:`~memlib.measure.megatron`
Megatron-Core's modules (built by :mod:`~memlib.measure.megatron_model`, run on the CPU with
:mod:`~memlib.measure.cpu_shims`, set beside the ledger by :mod:`~memlib.measure.megatron_compare`),
:mod:`~memlib.measure.step` the allocation timeline of a whole Megatron-Core training step (recorded by
:mod:`~memlib.measure.tracker`); :mod:`~memlib.measure.random_configs` draws the random small
configurations they are checked on.  torch, transformers and megatron-core are imported only when a
measurement runs.
"""
