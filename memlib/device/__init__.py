"""One device over a training step: the schedule replay, Megatron-Core's buffers, transient terms, the peak, overheads, the estimate.

:mod:`~memlib.device.allocator` (PyTorch's caching allocator: its constants and rounding) →
:mod:`~memlib.device.schedule` (micro-batches in flight at every moment) →
:mod:`~memlib.device.megatron_params` (the parameters one Megatron-Core rank registers) →
:mod:`~memlib.device.megatron_buffers` (the persistent buffers of one Megatron-Core rank) →
:mod:`~memlib.device.transient` and :mod:`~memlib.device.peak` (what ``max_memory_allocated`` reports) →
:mod:`~memlib.device.overhead` (named overheads, device capacities) →
:mod:`~memlib.device.estimate` (``Estimate``: every term of every stage, the JSON contract) →
:mod:`~memlib.device.timeline` (memory over one iteration).
"""
