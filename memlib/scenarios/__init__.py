"""Named scenarios and sweeps the book runs: each is a function of an :class:`~memlib.device.estimate.Estimate`
(the chapter's configuration) that varies one thing and returns exact values.

Modules: :mod:`.sweeps` (one knob at a time: expert parallelism, micro-batch, sequence length,
precision recipes); the chapters' larger scenarios have their own modules.
"""
