"""The caching allocator's unsplit remainders on a GPT-3 shell, measured on the CPU and replayed.

Megatron-LM's functional tests run without ``expandable_segments``; then PyTorch's caching allocator hands a
request the whole cached block when at most 1 MiB of it would remain (``should_split``), and
``max_memory_allocated`` counts all of it.  This benchmark runs the training step of the functional tests'
GPT-3 shell (hidden 512, 8 heads, 12 layers, s 1024, b 4, the vocabulary padded to 128 TP) with Megatron-Core's
local implementation on the CPU at TP 1, 2 and 4 (one process per tensor-parallel rank, joined by gloo; the
last rank reported), records every allocation (:mod:`memlib.measure.step`) and replays them through
:class:`memlib.device.allocator.CachingAllocator` with and without expandable segments: what the last
iteration's peak holds above the allocation after its step, both ways, and the difference.  Beside it, what
the golden values of ``gpt3_mcore_tp1_pp1*`` and ``gpt3_mcore_tp4_pp1*`` hold at their peak beyond memlib's
account (``peak_gap``, memlib.scenarios.functional).

The CPU runs the same Python as the GPU with eager stand-ins for the fused kernels (LayerNorm, the masked
softmax, the compiled bias-dropout-add), and megatron-core 0.19.2 instead of the test's commit: the
sequence of requests, so the replayed remainders, approximate the GPU's.  About five minutes on two cores.
"""
from __future__ import annotations

import statistics
import sys

from memlib.config import TrainingConfig
from memlib.config.model import model_from_dict
from memlib.core.units import MiB

#: --make-vocab-size-divisible-by 128 times TP applied to the GPT-2 vocabulary (50,257 tokens)
PADDED_VOCAB = {1: 50304, 2: 50432, 4: 50688}


def step(tp: int, layers: int):
    """The measured step (:class:`memlib.measure.step.PeakResult`) of the last tensor-parallel rank."""
    from memlib.measure.megatron import measure_many
    from memlib.measure.step import PeakRequest, result_of

    model = model_from_dict({"model_type": "gpt", "hidden_size": 512, "num_attention_heads": 8,
                             "num_key_value_heads": 8, "num_hidden_layers": layers, "vocab_size": PADDED_VOCAB[tp],
                             "max_position_embeddings": 1024, "intermediate_size": 2048}, name="gpt3-shell")
    train = TrainingConfig(tp=tp, sp=False, micro_batch=4, seq_len=1024, transformer_impl="local", dp=1,
                           profile="megatron", precision="megatron", zero=0, runtime="cpu", num_microbatches=1)
    req = PeakRequest(model, train, 0, True, num_microbatches=1, distributed_optimizer=False, iterations=3)
    # measure_peak_many runs one process; a tensor-parallel step needs TP of them (the worker is the same)
    raws = measure_many([req], world=tp, worker="memlib.measure.step", timeout=3600)
    return result_of(req, raws[0] if tp == 1 else raws[0][-1])


def above_step(r) -> tuple[int, int]:
    """(as counted with expandable segments, as counted without): the last iteration's peak minus what is
    allocated after its step."""
    last = len(r.after)
    exact = max(p.peak.measured for p in r.phases if p.iteration == last) - r.after[-1].measured
    fs = r.fixed_segments
    fixed = max(v for k, v in fs["peaks"].items() if k.startswith(f"{last}.")) - fs["end"]
    return exact, fixed


def observed(tp: int) -> list[float]:
    """The functional tests' peak gaps (MiB) of the local GPT-3 shell at TP ``tp``, PP 1."""
    from memlib.scenarios import functional as fv

    return [c.peak_gap / MiB for c in fv.cases() if c.golden.test.startswith(f"gpt3_mcore_tp{tp}_pp1")
            and not c.run.train.transformer_impl.uses_te]


def golden_groups() -> None:
    """The GPT-3 shells of the functional tests (none with expandable segments) grouped by TP, PP, CP and
    implementation: their QKV output, whether it is a multiple of 2 MiB, and what they hold at the peak beyond
    memlib's account."""
    from collections import defaultdict

    from memlib.scenarios import functional as fv

    groups = defaultdict(list)
    for c in fv.cases():
        if c.family != fv.FAMILIES[3] or c.run.framework.expandable_segments:
            continue
        t = c.run.train
        key = (t.tp, t.pp, t.cp, "TE" if t.transformer_impl.uses_te else "local", fv.fused_qkv_bytes(c.run.model, t))
        groups[key].append(c.peak_gap / MiB)
    print("Megatron-LM's functional tests, GPT-3 shells without expandable segments: the QKV output and the peak "
          "gap (MiB; what the run holds at its peak beyond memlib's account)")
    print(f"{'TP':>3} {'PP':>3} {'CP':>3} {'impl':>6} {'QKV output':>11} {'x 2 MiB':>8} {'files':>6} {'median':>8}  range")
    for (tp, pp, cp, impl, q), gaps in sorted(groups.items()):
        print(f"{tp:>3} {pp:>3} {cp:>3} {impl:>6} {q / MiB:11.3f} {'yes' if q % (2 * MiB) == 0 else 'no':>8} "
              f"{len(gaps):>6} {statistics.median(gaps):8.2f}  {min(gaps):.2f} .. {max(gaps):.2f}")
    print()


def main(layers: int = 12) -> None:
    golden_groups()
    print(f"GPT-3 shell, {layers} layers, local implementation, CPU step replayed through the caching allocator "
          f"(MiB above the allocation after the step, last of 3 iterations)")
    print(f"{'TP':>3} {'expandable':>11} {'fixed segments':>15} {'held remainders':>16}   "
          f"functional tests' peak gap (median, range, files)")
    for tp in (1, 2, 4):
        exact, fixed = above_step(step(tp, layers))
        gaps = observed(tp)
        seen = (f"{statistics.median(gaps):6.2f}  {min(gaps):6.2f} .. {max(gaps):6.2f}  ({len(gaps)})" if gaps
                else "(no local test)")
        print(f"{tp:>3} {exact / MiB:11.3f} {fixed / MiB:15.3f} {(fixed - exact) / MiB:16.3f}   {seen}")


if __name__ == "__main__":
    from results import recorded   # benchmarks/results.py: writes benchmarks/results/allocator_replay.md

    with recorded("allocator_replay"):
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
