"""Megatron-Core training steps measured on one GPU, against memlib's ``peak_allocated``.

``benchmarks/gpu_peaks.py`` ran each case (its model, training configuration and framework, as memlib's
inputs in the result's ``config``) on an H200 and recorded ``torch.cuda.max_memory_allocated()``, the
allocation after the optimizer step and a memory history reduced to the blocks alive at the peak; the result
is package data (``memlib/data/gpu_peaks/measured_h200.json``).  This module predicts each case with memlib,
for the GPU and, to show what the GPU's kernels change, with the CPU's rules (``runtime=cpu``), and reads the
loss region's measurement in units of the logits.  Nothing here is measured again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from functools import cache, cached_property
from importlib import resources

from ..config import TrainingConfig, load_model
from ..config.strategies import Runtime
from ..device.estimate import Estimate, estimate
from ..device.overhead import overheads
from ..device.peak import COMPUTE_CAPABILITY, Framework

__all__ = ["GPU_STEPS", "GpuStep", "gpu_steps", "gpu_environment", "loss_region", "summary", "ROUNDING"]

#: the measured run (package data)
GPU_STEPS = resources.files("memlib.data") / "gpu_peaks" / "measured_h200.json"


@cache
def _data() -> dict:
    return json.loads(GPU_STEPS.read_text())


def _model(name: str):
    return load_model(str(resources.files("memlib.data") / "gpu_peaks" / f"{name}.json"))


@dataclass(frozen=True)
class GpuStep:
    """One measured case and memlib's predictions of it."""

    name: str
    config: dict                 #: memlib's inputs: model, train, framework, overhead, gpu
    measured: int                #: max_memory_allocated of the second (steady) iteration, bytes
    reserved: int                #: max_memory_reserved of that iteration
    after_step: int              #: allocated after the optimizer step
    first_iteration: int         #: max_memory_allocated of the first iteration (Adam's moments created there)
    trace: dict                  #: the peak's live blocks, grouped by where they were allocated

    def _estimate(self, runtime: Runtime) -> Estimate:
        c = self.config
        train = TrainingConfig(**{**c["train"], "runtime": runtime})
        fw = Framework(compute_capability=COMPUTE_CAPABILITY[c["gpu"]], **c["framework"])
        return estimate(_model(c["model"]), train, overheads(c["overhead"]), framework=fw)

    @cached_property
    def estimate(self) -> Estimate:
        """memlib's estimate of the case as it ran (``runtime=cuda``)."""
        return self._estimate(Runtime.CUDA)

    @cached_property
    def cpu_estimate(self) -> Estimate:
        """The same case under the CPU's rules (torch's composite RMSNorm, the cross-entropy run eagerly)."""
        return self._estimate(Runtime.CPU)

    @property
    def peak(self):
        return self.estimate.peaks[0]

    @property
    def predicted(self) -> int:
        return self.peak.peak_allocated

    @property
    def difference(self) -> int:
        """memlib's peak less the measured one, bytes (signed)."""
        return self.predicted - self.measured

    @property
    def error(self) -> Fraction:
        return Fraction(self.difference, self.measured)

    @property
    def cpu_predicted(self) -> int:
        return self.cpu_estimate.peaks[0].peak_allocated

    @property
    def cpu_error(self) -> Fraction:
        return Fraction(self.cpu_predicted - self.measured, self.measured)

    @property
    def persistent(self) -> int:
        """memlib's persistent bytes (buffers, optimizer shards, framework tensors)."""
        return sum(self.peak.persistent.values())

    @property
    def outlived(self) -> int:
        """What the allocation after the step holds beyond memlib's persistent bytes (signed)."""
        return self.after_step - self.persistent

    @property
    def norm_bytes(self) -> int:
        """What one micro-batch's saved tensors shrink by with torch's fused RMSNorm on the GPU (the CPU's
        composite keeps fp32 copies): the held bytes under the CPU's rules minus the GPU's."""
        def held(est: Estimate) -> int:
            return sum(est.stages[0].activations["by_entry"].values())
        return held(self.cpu_estimate) - held(self.estimate)

    @property
    def attention_buffer(self) -> int:
        """The local attention's persistent 'mpu' buffer in memlib's prediction."""
        return self.peak.persistent.get("global_memory_buffer", 0)

    @property
    def loss_workspace(self) -> int:
        """Inductor's fp32 buffer beside the compiled cross-entropy's softmax, at the peak (0 if not there)."""
        return self.peak.transient.get("cross_entropy_workspace", 0)

    @property
    def measured_site(self) -> str:
        """Where the allocator's peak was reached, from the frames of the allocation that reached it: ``loss``
        (the cross-entropy), ``recomputation`` (a checkpoint's backward, which re-runs its forward first),
        ``backward`` (autograd's engine, no Python frame) or the innermost Megatron-Core function."""
        frames = self.trace["peak_frames"]
        if any("cross_entropy" in f for f in frames):
            return "loss"
        if any("tensor_parallel/random.py" in f for f in frames):
            return "recomputation"
        if not frames:
            return "backward"
        return next((f for f in frames if f.startswith("megatron/")), frames[0])

    @property
    def model_name(self) -> str:
        return self.config["model"]

    @property
    def recompute(self) -> str:
        return self.config["train"]["recompute"]

    @property
    def fused_loss(self) -> bool:
        return bool(self.config["train"].get("cross_entropy_loss_fusion"))


def gpu_steps() -> list[GpuStep]:
    """Every measured case, in the order it ran."""
    out = []
    for c in _data()["cases"]:
        first = c["iterations"][0]
        out.append(GpuStep(c["name"], c["config"], c["max_memory_allocated"], c["max_memory_reserved"],
                           c["after_step"], first["max_allocated"], c["trace"]))
    return out


def gpu_environment() -> dict:
    """The GPU, its driver and the versions that ran (as the result records them)."""
    return dict(_data()["environment"])


def loss_region() -> dict:
    """The loss alone on logits ``[s, b, v]`` bf16 (L bytes), per implementation (``native``: Megatron-Core's
    fused cross-entropy, compiled; ``unfused``): what the forward holds afterwards, its peak above the logits
    and the backward's peak above what the forward held, each in units of L (exact fractions)."""
    r = _data()["loss_region"]
    L = r["logits_bytes"]
    out = {"seq_len": r["seq_len"], "micro_batch": r["micro_batch"], "vocab_size": r["vocab_size"], "logits": L}
    for impl in ("native", "unfused"):
        x = r[impl]
        out[impl] = {"held": Fraction(x["held_after_forward"], L), "forward_peak": Fraction(x["forward_peak_above_logits"], L),
                     "backward_peak": Fraction(x["backward_peak_above_held"], L)}
    return out


#: an error at most this (absolute) is called exact to the allocator's rounding: a few small tensors
ROUNDING = Fraction(1, 10_000)


def summary(steps: list[GpuStep] | None = None) -> dict:
    """The cases' errors: the largest absolute under the GPU's rules and under the CPU's (with the cases they
    belong to), how many are within :data:`ROUNDING`, the others (the misses), and the cases whose allocation
    after the step holds more than memlib's persistent bytes (by a MiB or more)."""
    steps = gpu_steps() if steps is None else steps
    worst = max(steps, key=lambda s: abs(s.error))
    cpu_worst = max(steps, key=lambda s: abs(s.cpu_error))
    return {"n": len(steps), "max_abs": abs(worst.error), "worst": worst.name,
            "smallest": min(s.measured for s in steps), "largest": max(s.measured for s in steps),
            "cpu_max_abs": abs(cpu_worst.cpu_error), "cpu_worst": cpu_worst.name,
            "rounding": ROUNDING, "n_rounding": sum(abs(s.error) <= ROUNDING for s in steps),
            "misses": [s for s in steps if abs(s.error) > ROUNDING],
            "outliving": [s for s in steps if s.outlived >= 2**20]}
