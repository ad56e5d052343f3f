"""Ground truth on the CPU (optional, needs torch): what PyTorch, transformers and Megatron-Core actually save and allocate.

:mod:`~memlib.measure.hf.hf` measures the Hugging Face implementation, :mod:`~memlib.measure.hf.megatron`
Megatron-Core's modules, :mod:`~memlib.measure.hf.step` the allocation timeline of a whole Megatron-Core
training step.  torch, transformers and megatron-core are imported only when a measurement runs.
"""
