"""Every size a user can type is bounded before work starts, and every size memlib accepts is computed in
seconds (issue #20): a value past a bound is one line naming the field, the value and the bound (exit 2);
a value at the bound answers within the fuzz's limits (5 s a call, 10 s for ``plan``).

Each case runs as its own process (``python -m memlib``) with a timeout, so that a hang fails the test
instead of hanging the suite.
"""
from __future__ import annotations

import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HUGE = "10000000000000000000"       # 10^19: past every bound, still 20 digits
PLAN = ["plan", "--gpus", "8", "--gpu-memory", "80GB"]
V2L = ["--model", "deepseek-v2-lite"]


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _run(argv: list[str], limit: float) -> tuple[int, str, str, float]:
    """The command's exit code, output and the processor seconds it took (its own work: on a machine shared with
    other jobs its wall-clock time is theirs too; the wall clock stops a hang at three times the limit)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = _cpu()
    try:
        r = subprocess.run([sys.executable, "-m", "memlib", *argv], capture_output=True, text=True, env=env,
                           timeout=max(30.0, 3 * limit))
    except subprocess.TimeoutExpired:
        pytest.fail(f"memlib {' '.join(argv)[:200]} ran past {max(30.0, 3 * limit):.0f} s")
    return r.returncode, r.stdout, r.stderr, _cpu() - t0


def _refused(argv: list[str], *needles: str, limit: float = 5.0) -> str:
    rc, out, err, seconds = _run(argv, limit)
    assert seconds < limit, (argv, seconds)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("memlib: error: "), (argv, rc, err)
    for n in needles:
        assert n in err, (argv, err)
    return err


def _answered(argv: list[str], limit: float) -> str:
    rc, out, err, seconds = _run(argv, limit)
    assert seconds < limit, (argv[:12], seconds)
    assert "Traceback" not in err, err
    assert rc in (0, 2), (argv[:12], rc, err[-500:])
    if rc == 2:
        assert out == "" and err.count("\n") == 1, err
    return out


# ------------------------------------------------------------------------------------------------
# plan: every size bounded, named, and each bound answered in seconds
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("option,field", [("--global-batch", "global_batch"), ("--max-vpp", "max_vpp"),
                                          ("--top", "top"), ("--max-micro-batch", "max_micro_batch"),
                                          ("--seq-len", "seq_len"), ("--gpus", "gpus")])
def test_plan_sizes_past_their_bound_are_one_line(option, field):
    args = PLAN + V2L + [option, HUGE]
    if option == "--gpus":
        args = ["plan", "--gpu-memory", "80GB", "--gpus", HUGE]
    _refused(args, f"{field}={HUGE}", "exceeds")


def _bound(field: str) -> int:
    from memlib.config import LIMITS

    return LIMITS[field]


@pytest.mark.parametrize("option,field", [("--global-batch", "global_batch"), ("--max-vpp", "max_vpp"),
                                          ("--top", "top"), ("--max-micro-batch", "micro_batch")])
def test_plan_at_each_bound_answers_in_seconds(option, field):
    out = _answered(PLAN + V2L + [option, str(_bound(field)), "--json"], limit=10.0)
    assert out


def test_a_prime_global_batch_near_the_bound_answers_in_seconds():
    """B / DP's divisors are found without a loop to its square root for every split."""
    _answered(PLAN + V2L + ["--global-batch", str(_bound("global_batch") - 35), "--json"], limit=10.0)


# ------------------------------------------------------------------------------------------------
# estimate: layouts with many (empty) stages, and Megatron-Core's DDP buckets
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["E(|)*1023t*61mL", "E(|)*4095t*61mL", "E(|)*65535t*61mL",
                                    "Et*61mL(|)*1023", "E(t|)*61(|)*962mL"])
def test_layouts_of_many_empty_virtual_stages_answer_in_seconds(layout):
    """Megatron's layout grammar allows stages without layers; the replay's candidate moments are found
    without comparing every moment with every kept one (issue #20: 17 s at 1,024 chunks, MemoryError at
    65,536)."""
    _answered(["estimate", "--layout", layout, "--json"], limit=5.0)


def test_a_deep_pipeline_of_empty_stages_answers_in_seconds():
    """``--pp 30000`` with 61 one-layer stages and then empty ones (as Megatron's layouts allow)."""
    layout = ",".join(["1"] * 61 + ["0"] * (30000 - 61))
    _answered(["estimate", "--pp", "30000", "--layout", layout], limit=5.0)


@pytest.mark.parametrize("model", ["deepseek-v3", "kimi-k2"])
def test_megatron_buffers_with_many_buckets_answer_in_seconds(model):
    """The distributed optimizer's shards of every parameter under --overlap-grad-reduce's buckets (issue
    #20: 21 s for DeepSeek-V3, 48 s for Kimi-K2 with every parameter intersected with every bucket)."""
    _answered(["estimate", "--model", model, "--profile", "megatron", "--precision", "megatron", "--zero", "1",
               "--overlap-grad-reduce", "--dp", "1", "--tp", "2", "--pp", "1", "--ep", "2", "--json"], limit=5.0)


def test_shard_numels_equals_the_pairwise_intersection():
    """The linear sweep gives what intersecting every parameter range with every rank's slice of every
    bucket gives (the definition), on random layouts."""
    from memlib.device.megatron_buffers import buffer_layout, shard_numels

    rng = random.Random(20)
    for _ in range(300):
        numels = [rng.randint(1, 300) for _ in range(rng.randint(1, 30))]
        dp = rng.choice([1, 2, 3, 4, 8])
        layout = buffer_layout(numels, dp, bucket_size=rng.choice([None, 50, 200, 1000]))
        for rank in range(dp):
            owned = []
            for b0, b1 in layout.buckets:
                size = (b1 - b0) // dp
                owned.append((b0 + rank * size, b0 + (rank + 1) * size))
            want = tuple(sum(max(0, min(p1, o1) - max(p0, o0)) for o0, o1 in owned) for p0, p1 in layout.param_ranges)
            assert shard_numels(layout, dp, rank) == want


@pytest.mark.parametrize("pp,vpp,accepted", [(128, 2, True), (64, 4, True), (256, 2, False)])
def test_the_replay_bound_is_answered_in_seconds(pp, vpp, accepted, tmp_path):
    """The interleaved replay of a deep pipeline (every chunk a layer): accepted up to LIMITS' replay and computed
    in seconds there (PP 128 with V 2), refused past it in one line naming PP, VPP and the bound."""
    import json

    import tiny as T

    cfg = tmp_path / "deep.json"
    cfg.write_text(json.dumps({**T.TINY_HF, "num_hidden_layers": 512, "first_k_dense_replace": 1}))
    argv = ["estimate", "--model", str(cfg), "--pp", str(pp), "--vpp", str(vpp), "--schedule", "interleaved",
            "--dp", "1", "--tp", "1", "--ep", "1", "--json"]
    if accepted:
        assert _answered(argv, limit=5.0)
    else:
        _refused(argv, f"pp={pp} vpp={vpp}", "replay", limit=5.0)
