"""memlib's ``peak_allocated`` against Megatron-Core training steps measured on an H200 (issue 25).

``benchmarks/gpu_peaks.py`` ran each case on the GPU and committed what the CUDA caching allocator
reported (memlib/data/gpu_peaks/measured_h200.json); here, on the CPU, ``memlib estimate`` with the case's
own ``memlib_args`` must come within 0.5 % of ``torch.cuda.max_memory_allocated()`` of the steady
iteration, and the loss region's measured multiples of the logits must be memlib's rules.  The error of
each case is stated in its assertion message.
"""
from __future__ import annotations

import contextlib
import io
import json
from fractions import Fraction

import pytest

from memlib.cli import main
from memlib.scenarios import gpu_steps as gs

STEPS = {s.name: s for s in gs.gpu_steps()}
DATA = json.loads(gs.GPU_STEPS.read_text())
TARGET = Fraction(5, 1000)


def _cli(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["estimate", *args, "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("case", DATA["cases"], ids=[c["name"] for c in DATA["cases"]])
def test_estimate_within_half_a_percent_of_the_gpu(case, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])        # memlib_args name the model file from the root
    got = _cli(case["memlib_args"])
    step = STEPS[case["name"]]
    # the command line and the scenario the book renders are one prediction, to the byte
    assert got["peak_allocated"] == step.predicted
    err = Fraction(got["peak_allocated"] - case["max_memory_allocated"], case["max_memory_allocated"])
    assert abs(err) <= TARGET, f"{case['name']}: {float(err):+.3%} (predicted {got['peak_allocated']:,}, " \
                               f"measured {case['max_memory_allocated']:,})"


@pytest.mark.parametrize("case", DATA["cases"], ids=[c["name"] for c in DATA["cases"]])
def test_memlib_args_describe_what_ran(case):
    """The recorded request (what the GPU script built) and memlib's inputs agree on every field both have."""
    ran, cfg = case["request"]["train"], case["config"]["train"]
    for field in ("micro_batch", "seq_len", "recompute", "precision", "transformer_impl", "attention_backend",
                  "cross_entropy_loss_fusion", "tp", "ep", "etp", "cp"):
        assert ran[field] == cfg.get(field, ran[field]), field
    assert case["request"]["num_microbatches"] == cfg["num_microbatches"]
    assert case["request"]["gradient_accumulation_fusion"] is case["config"]["framework"]["gradient_accumulation_fusion"]
    assert case["iterations"][-1]["max_allocated"] == case["max_memory_allocated"]


def test_the_gpus_rules_decide_the_last_percent():
    """Under the CPU's rules (torch's composite RMSNorm, the cross-entropy eager) the same cases miss by up to
    about 12 %: the rules memlib changed for the GPU are what bring every case within the target."""
    s = gs.summary()
    assert s["max_abs"] <= TARGET < Fraction(1, 10) < s["cpu_max_abs"]


def test_loss_region_in_units_of_the_logits():
    """The loss alone (logits L bytes, bf16): the native fused cross-entropy compiled by Inductor holds the fp32
    softmax (2 L) afterwards, peaks 4 L above the logits in its forward (the softmax and Inductor's fp32 buffer)
    and 3 L above what it held in its backward (a clone of the softmax and the bf16 gradient); the unfused loss
    2 L, 2 L and 1 L.  memlib's entries for the loss chunk of a case with the same kind of loss give the same
    multiples (to within the few KiB of the targets and masks)."""
    r = gs.loss_region()
    step = STEPS["ds-none-native"]
    t = step.peak.transient
    L = t["cross_entropy_logits"]
    ex = step.estimate.stage_expressions(0, step.estimate.values)
    softmax = int(ex.chunks[0]["head.loss_softmax"])
    rules = {"native": (Fraction(softmax, L), Fraction(softmax + t["cross_entropy_workspace"], L),
                        Fraction(t["cross_entropy_workspace"] + L, L)),
             "unfused": (Fraction(softmax, L), Fraction(softmax, L), Fraction(1))}
    assert rules["native"] == (2, 4, 3)
    for impl, (held, fwd, bwd) in rules.items():
        got = r[impl]
        for name, want, measured in (("held", held, got["held"]), ("forward", fwd, got["forward_peak"]),
                                     ("backward", bwd, got["backward_peak"])):
            assert abs(measured - want) <= Fraction(1, 1000), (impl, name, float(measured))


def test_what_outlives_the_step_is_named():
    """After the step the allocation is memlib's persistent bytes within a few hundred KiB (loss and router
    scalars), except under full recomputation with MoE layers, where each checkpoint's input and its gradient
    of the last micro-batch stay alive until the next forward reaches that layer (not modelled: the next
    step's peak frees them first, so the peak is unchanged)."""
    for s in STEPS.values():
        moe_full = s.recompute == "full" and s.model_name != "llama-gqa"
        if moe_full:
            assert s.outlived > 100 * 2**20, s.name
        else:
            assert 0 <= s.outlived < 2**20, (s.name, s.outlived)
