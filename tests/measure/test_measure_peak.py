"""Ground truth for the transient peak: the allocation timeline of a Megatron-Core training step on the CPU.

* The tracker (memlib.measure.tracker.AllocationTracker) on hand-made PyTorch programs whose allocations are
  worked out by hand: the 512-byte blocks of the CUDA caching allocator, views and in-place ops that
  allocate nothing, tensors that exist before tracking (the baseline), autograd's saved tensors freed in
  backward, fused regions, storage resizes and zero-copy storage swaps, per-window peaks.
* Two iterations of a megatron-core training step (DistributedDataParallel, get_megatron_optimizer,
  get_forward_backward_func) on small configs in one worker process: the step returns to the bytes it
  started from; the overall max is the largest phase peak; the persistent bytes are the closed forms of
  the parameters, the grad buffer, the fp32 main parameters and Adam's states; what autograd saves at the
  end of a micro-batch's forward is, block for block, what memlib.measure.megatron measures; two runs give
  the same bytes.
* The CLI (`memlib measure --framework megatron-core --peak`) and its errors.

Needs torch (and megatron-core 0.19.2 for the step); skipped without them, failing under CI instead.
"""
from __future__ import annotations

import json
import os

import pytest

from memlib.cli import main
from memlib.config import model_from_dict

from test_measure_megatron import SMALL  # noqa: E402  (the same small DeepSeek-V3-style model)
DENSE = {"first_k_dense_replace": 2, "num_nextn_predict_layers": 0}


def small(**changes):
    return model_from_dict({**SMALL, **changes}, name="small")


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true")


@pytest.fixture(scope="module")
def torch():
    if _ci():
        import torch
        return torch
    return pytest.importorskip("torch")


from test_measure_megatron import local, mcore  # noqa: E402,F401  (mcore skips without megatron-core, fails under CI)


# ------------------------------------------------------------------------------------------------
# the tracker on hand-made programs
# ------------------------------------------------------------------------------------------------
def test_block_bytes_is_the_caching_allocators_round_size():
    from memlib.device.allocator import allocation as block_bytes

    assert [block_bytes(n) for n in (0, 1, 4, 511, 512, 513, 1024, 4000, 1 << 20)] == [
        0, 512, 512, 512, 512, 1024, 1024, 4096, 1 << 20]


def test_views_and_in_place_ops_allocate_nothing(torch):
    from memlib.measure.tracker import AllocationTracker

    with AllocationTracker(count_existing=False) as tr:
        a = torch.empty(1000)                        # 4,000 bytes: one 4,096-byte block
        assert tr.current == 4096
        v = a[10:].view(-1)
        a.add_(1)
        a.mul_(2)
        torch.add(a, 1, out=a)
        parts = torch.split(a, 100)                  # views
        assert tr.current == 4096 and len(tr.blocks) == 1
        b = a + 1                                    # a new block
        c = b.reshape(10, 100).t().contiguous()      # t() is a view, contiguous() copies
        assert tr.current == 3 * 4096
        del a, parts
        assert tr.current == 3 * 4096                # v still holds a's storage
        del v
        assert tr.current == 2 * 4096
        values, indices = torch.topk(b, 3)           # two outputs, two blocks: fp32 and int64
        assert tr.current == 2 * 4096 + 2 * 512
        del b, c, values, indices
        assert tr.current == 0
        e = torch.empty(0)                           # a 0-byte request allocates nothing
        f = torch.empty(129)                         # 516 bytes: 1,024
        assert tr.current == 1024 and tr.peak == 3 * 4096
        del e, f


def test_tensors_that_exist_before_tracking_are_the_baseline(torch):
    from memlib.measure.tracker import AllocationTracker

    w = torch.empty(100)                             # 400 bytes: 512
    with AllocationTracker() as tr:
        assert tr.baseline >= 512 and tr.current == tr.baseline
        assert tr.block_of(w).label == "baseline"
        x = torch.empty(300)                         # 1,200 bytes: 1,536
        assert tr.current == tr.baseline + 1536
        del w
        assert tr.current == tr.baseline + 1536 - 512
        del x
    with AllocationTracker(count_existing=False) as tr:
        assert tr.baseline == tr.current == 0


def test_saved_tensors_live_until_backward_frees_them(torch):
    """y = exp(x) keeps its result for backward; s = y.sum() keeps nothing.  Forward: y 1,024 + s 512.
    Backward: the seed ones_like(s) 512, SumBackward expands it (a view), ExpBackward computes grad * y
    (1,024, the peak: 3,072), which AccumulateGrad keeps as x.grad; ExpBackward's release frees y."""
    from memlib.measure.tracker import AllocationTracker

    x = torch.ones(256, requires_grad=True)          # before tracking, not counted
    with AllocationTracker(count_existing=False) as tr:
        y = x.exp()
        s = y.sum()
        y_block = tr.block_of(y)
        del y
        assert tr.current == 1024 + 512              # y is kept: autograd saved it
        s.backward()
        assert tr.peak == 1024 + 512 + 512 + 1024
        assert y_block.died is not None              # freed in backward
        assert tr.current == 512 + 1024              # s and x.grad
        assert tr.block_of(x.grad).bytes == 1024
        del s
        x.grad = None
        assert tr.current == 0


def test_a_fused_region_allocates_only_what_outlives_it(torch):
    from memlib.measure.tracker import AllocationTracker

    def f(x):
        return ((x * 2) + 1) * 3                     # two 1,024-byte intermediates, one at a time beside the next

    x = torch.ones(256)
    with AllocationTracker(count_existing=False) as tr:
        y = f(x)
        assert (tr.peak, tr.current) == (2048, 1024)
        del y
        tr.reset_peak()
        y = tr.fused(f, x)
        assert (tr.peak, tr.current) == (1024, 1024)
        del y
        # what autograd saves inside a region outlives it: exp's result, kept by ExpBackward
        z = tr.fused(lambda t: t.exp() * 2, x.clone().requires_grad_())   # noqa: F841 - held while the counts are read
        assert tr.current == 1024 + 1024 + 1024      # the input clone, exp's saved result, z


def test_resize_frees_and_a_storage_swap_shares_one_block(torch):
    """Megatron's output-discarding checkpoint resizes its output storage to 0 after the forward, and
    after recomputing points it at the recomputed output's data (zero-copy): one block, not two."""
    from memlib.measure.tracker import AllocationTracker

    with AllocationTracker(count_existing=False) as tr:
        a = torch.empty(256)
        a.untyped_storage().resize_(0)
        assert tr.current == 0
        a.untyped_storage().resize_(512)             # a resize allocates the new size: 512 bytes
        assert tr.current == 512
        a.untyped_storage().resize_(0)
        b = torch.ones(256)                          # the recomputed output
        tr.share(a, b)
        assert tr.current == 1024
        del b
        assert tr.current == 1024                    # a's storage still points at it
        del a
        assert tr.current == 0


def test_windows_keep_their_own_peak(torch):
    from memlib.measure.tracker import AllocationTracker

    with AllocationTracker(count_existing=False) as tr:
        tr.window("one")
        a = torch.empty(256)
        b = torch.empty(256)
        del b
        tr.window("two")
        c = torch.empty(128)
        del c
        tr.window("three")
        one, two, three = tr.windows
        assert (one.start, one.peak, one.end) == (0, 2048, 1024)
        assert (two.start, two.peak, two.end) == (1024, 1536, 1024)
        assert (three.start, three.peak) == (1024, 1024)
        assert [b.window for b in tr.blocks] == ["one", "one", "two"]
        assert [b.bytes for b in tr.alive_at(two.tick)] == [1024, 512]
        del a


def test_cuda_calls_are_answered_on_the_cpu(torch):
    from memlib.measure.cpu_shims import _cuda_as_cpu_mode

    with _cuda_as_cpu_mode():
        x = torch.zeros(2, device="cuda")
        assert x.device.type == "cpu" and x.cuda() is x and x.to("cuda").device.type == "cpu"
        assert x.type() == "torch.cuda.FloatTensor" and x.bfloat16().type() == "torch.cuda.BFloat16Tensor"


# ------------------------------------------------------------------------------------------------
# a megatron-core training step, several configs in one worker process
# ------------------------------------------------------------------------------------------------
CONFIGS = {
    # MoE with MTP, bf16, the distributed optimizer, two micro-batches
    "moe": (small(), local(), dict(num_microbatches=2)),
    # dense without MTP, bf16
    "dense": (small(**DENSE), local(), {}),
    # dense, fp32, full recomputation, the optimizer not distributed, torch's foreach Adam
    "dense_fp32_full": (small(**DENSE), local(precision="fp32", recompute="full"),
                        dict(distributed_optimizer=False, optimizer_impl="foreach")),
    # MoE with MTP, recomputed norms and MoE, the native fused cross-entropy, b=1 s=5
    "moe_selective": (small(), local(recompute="layernorm,moe", cross_entropy_loss_fusion=True, micro_batch=1,
                                     seq_len=5), {}),
    # the first config again: the same bytes
    "moe_again": (small(), local(), dict(num_microbatches=2)),
}


@pytest.fixture(scope="module")
def steps(mcore):
    from memlib.measure.step import PeakRequest, measure_peak_many

    reqs = [PeakRequest(m, t, activations=True, **kw) for m, t, kw in CONFIGS.values()]
    return dict(zip(CONFIGS, measure_peak_many(reqs)))


def test_each_phase_is_measured_and_the_max_is_the_largest_phase_peak(steps):
    for name, r in steps.items():
        m = r.request["num_microbatches"]
        names = [p.name for p in r.phases]
        for it in (1, 2):
            expected = ([f"{it}.zero_grad"] + [f"{it}.mb{k}.{ph}" for k in range(m) for ph in ("forward", "backward")]
                        + [f"{it}.finalize", f"{it}.optimizer"])
            assert names[names.index(f"{it}.zero_grad"):][:len(expected)] == expected, name
        for p in r.phases:
            assert p.peak.measured >= max(p.start, p.end), (name, p.name)
            assert sum(p.categories.values()) == p.peak.measured, (name, p.name)
            assert sum(p.end_categories.values()) == p.end, (name, p.name)
        assert r.max.measured == max(p.peak.measured for p in r.phases), name
        assert r.phase(r.max_phase).peak.measured == r.max.measured
        assert r.phases[0].start == r.before[0].measured


def test_the_second_step_ends_where_it_began(steps):
    """Adam's state is created in the first step; from then on a step returns every byte it takes (nothing is
    held by a reference cycle either: a gc.collect() after each step frees nothing)."""
    for name, r in steps.items():
        assert r.after[1].measured == r.before[1].measured, name
        assert r.before[1].measured == r.after[0].measured, name
        assert r.after[0].measured > r.before[0].measured, name       # the optimizer's states
        for it in r.iterations:
            assert it["after_gc"] == it["after"], name


def test_the_persistent_bytes_are_the_closed_forms(steps):
    """Parameters, the grad buffer, the fp32 main parameters and Adam's two moments, block by block: with the
    distributed optimizer the parameters and the grads are two contiguous buffers of the same padded size
    (bf16 and fp32), every main parameter and every moment its own fp32 tensor; without it every parameter is
    its own tensor and the buffer holds exactly the parameters."""
    from memlib.device.allocator import allocation as block_bytes

    for name, r in steps.items():
        p, n, numels = r.persistent, r.grad_buffer_numel, r.param_numels
        assert sum(numels) == r.param_count
        assert p["grad_buffer"] == block_bytes(4 * n), name
        each_fp32 = sum(block_bytes(4 * k) for k in numels)
        if r.request["distributed_optimizer"]:
            assert n % 64 == 0 and n >= r.param_count, name      # every parameter starts on 64 elements
            width = 2 if r.request["train"]["precision"] == "megatron" else 4
            assert p["parameters"] == block_bytes(width * n), name
            if width == 2:
                assert p["main_params"] == each_fp32, name
        else:
            assert n == r.param_count and "main_params" not in p, name
            assert p["parameters"] == each_fp32, name
        assert p["optimizer_states"] == 2 * each_fp32, name
        assert p["optimizer_step_counters"] == 512 * len(numels), name


def test_what_the_forward_saves_is_what_measure_megatron_measures(steps):
    """At the end of the first micro-batch's forward in the first iteration (the same weights and tokens as
    memlib.measure.megatron's forward), the blocks allocated in it and saved for backward are its storages,
    each rounded to its block, plus the schedule's divisor (``output_tensor /= clamp(num_tokens)`` keeps
    it).  (Under mla_up_proj recomputation the checkpoint also saves the RoPE cache, which is a tensor
    cached across steps, not an activation: those configs are left out.)"""
    from memlib.device.allocator import allocation as block_bytes

    for name, r in steps.items():
        assert r.activations and r.activations["storages"], name
        measured = sum(block_bytes(s["bytes"]) for s in r.activations["storages"])
        rows = [x for x in r.phase("1.mb0.forward").end_rows if x["category"] == "saved_activations"]
        schedule = sum(x["bytes"] for x in rows if x["region"] == "schedule")
        assert schedule == 512, name
        assert sum(x["bytes"] for x in rows) - schedule == measured, name


def test_the_max_holds_the_states_and_the_saved_activations(steps):
    from memlib.device.allocator import allocation as block_bytes

    for name, r in steps.items():
        states = sum(r.persistent.get(k, 0) for k in ("parameters", "grad_buffer", "main_params", "optimizer_states"))
        saved = sum(block_bytes(s["bytes"]) for s in r.activations["storages"])
        assert r.max.measured >= states + saved, name
        last = r.phase(f"2.mb{r.request['num_microbatches'] - 1}.forward")
        assert last.end_categories["saved_activations"] > 0
        assert r.phase("2.optimizer").peak.measured >= states


def test_two_runs_give_the_same_bytes(steps):
    a, b = steps["moe"], steps["moe_again"]
    assert a.to_json(timeline=True) == b.to_json(timeline=True)


def test_recompute_and_micro_batches_change_the_peak_where_they_should(steps):
    """Full recomputation keeps less for backward than none; a second micro-batch's forward starts from the
    first one's gradients in the grad buffer, not from its activations (freed by its backward)."""
    dense, full = steps["dense"], steps["dense_fp32_full"]
    saved = {k: r.phase("2.mb0.forward").end_categories["saved_activations"] for k, r in (("none", dense),
                                                                                          ("full", full))}
    assert saved["full"] < saved["none"] / 2
    moe = steps["moe"]
    assert moe.phase("2.mb1.forward").start == moe.phase("2.mb0.backward").end
    assert "saved_activations" not in {r["category"] for r in moe.phase("2.mb1.forward").rows
                                       if r["window"] == "2.mb0.forward"}


def test_small_blocks_hold_no_remainder(steps):
    """Without expandable segments (the step replayed through memlib.device.allocator.CachingAllocator) these
    small models' tensors all come from the small pool, which splits off every remainder of 512 bytes or more:
    the replay counts what the tracker counts, at every phase's peak and after the step."""
    for name, r in steps.items():
        fs = r.fixed_segments
        assert fs["max"] == r.max.measured and fs["end"] == r.after[-1].measured, name
        assert all(fs["peaks"][p.name] == p.peak.measured for p in r.phases), name


@pytest.fixture(scope="module")
def shells(mcore):
    """Two GPT-3 shells at 4,096 tokens a micro-batch (bf16): hidden 512, 2 layers, b 8, s 512, every large
    activation a multiple of 2 MiB (the residual stream 4 MiB); hidden 384, 4 layers, b 4, s 1024 (the residual
    stream 3 MiB)."""
    from memlib.measure.step import PeakRequest, measure_peak_many

    def gpt(h, layers, s):
        return model_from_dict({"model_type": "gpt", "hidden_size": h, "num_attention_heads": 8,
                                "num_key_value_heads": 8, "num_hidden_layers": layers, "vocab_size": 1000,
                                "max_position_embeddings": s, "intermediate_size": 4 * h}, name=f"gpt{h}")

    reqs = [PeakRequest(gpt(512, 2, 512), local(micro_batch=8, seq_len=512), distributed_optimizer=False),
            PeakRequest(gpt(384, 4, 1024), local(micro_batch=4, seq_len=1024))]
    return dict(zip((512, 384), measure_peak_many(reqs)))


def test_odd_mebibyte_tensors_hold_cached_remainders(shells):
    """The caching allocator's should_split: a large request served from a cached block at most 1 MiB larger
    holds all of it.  Measured above the allocation after the step (the parameters' own blocks, 1.5 MiB and
    3 MiB matrices, hold their remainders from the start): with a 4 MiB residual stream the activations hold
    nothing more; with a 3 MiB one the peak holds whole MiBs more than its tensors."""
    def held(r):
        fs = r.fixed_segments
        return (fs["max"] - fs["end"]) - (r.max.measured - r.after[-1].measured)

    assert held(shells[512]) == 0
    assert held(shells[384]) > 0 and held(shells[384]) % (1 << 20) == 0, held(shells[384])


def test_text_report(steps):
    from memlib.measure.step import format_text

    text = format_text(steps["moe"])
    assert "mb1 backward peak" in text and "optimizer peak" in text and "max over the 2 iterations" in text
    assert f"{steps['moe'].max.measured:,}" in text and "top 10 moments of iteration 2" in text


def test_cli_measure_peak_json(mcore, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL, **DENSE}))
    assert main(["measure", "--framework", "megatron-core", "--peak", "--model", str(path), "--micro-batch", "1",
                 "--seq-len", "4", "--num-microbatches", "2", "--recompute", "selective", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["request"]["num_microbatches"] == 2 and data["request"]["train"]["recompute"] == "selective"
    assert data["after"][1]["measured"] == data["before"][1]["measured"]
    assert data["max"]["predicted"] is None
    assert {p["phase"] for p in data["phases"]} == {"zero_grad", "forward", "backward", "finalize", "optimizer"}
    assert data["top_moments"][0]["peak"] == max(p["peak"]["measured"] for p in data["phases"] if p["iteration"] == 2)


# ------------------------------------------------------------------------------------------------
# the CLI's errors (no megatron-core needed)
# ------------------------------------------------------------------------------------------------
def test_peak_options_are_checked_before_anything_runs(capsys, tmp_path, monkeypatch):
    import memlib.measure.megatron as mm

    monkeypatch.setattr(mm, "require", lambda: None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL))
    for argv, message in ((["--framework", "megatron-core", "--num-microbatches", "2"],
                           "num_microbatches=2 applies to --peak only"),
                          (["--framework", "megatron-core", "--adam", "foreach"], "adam=foreach applies to --peak only"),
                          (["--framework", "megatron-core", "--peak", "--no-step"], "step=False"),
                          (["--framework", "megatron-core", "--peak", "--num-microbatches", "0"],
                           "num_microbatches=0 must be a positive integer"),
                          (["--peak"], "peak=True applies to framework=megatron-core only")):
        if argv == ["--peak"]:
            import memlib.measure.hf as me
            monkeypatch.setattr(me, "require", lambda: None)
        assert main(["measure", "--model", str(path), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("memlib: error: ") and message in err and err.count("\n") == 1, err
