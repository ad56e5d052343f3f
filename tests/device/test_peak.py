"""memlib.device.peak and Estimate.peaks: the prediction of max_memory_allocated, term by term.

* The rule of one rank by hand on made-up chunks and moments (held micro-batches, the transient of the
  chunks computing, offloading's prefetch and reload, the all-to-all overlap's extra layer, fragmentation).
* Which ledger entries offloading and routing touch.
* The tiny model by hand: the cross-entropy logits, the gradient pair, routing imbalance on the routed
  entries only, FP8 Linear inputs, the persistent terms as memlib.device.megatron_buffers counts them.
* The JSON: per-stage peak_allocated, peak_reserved and peak_breakdown, the top-level maxima, no key
  renamed.
* Properties over random valid configurations: the peak never holds less than the in-flight micro-batches; it never
  falls with more routing imbalance, never rises with offloading or without the overlap, never rises
  with Megatron-LM's FP8 compute.
"""
from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, given, settings

import tiny as T
from memlib.device import megatron_buffers as mb
from memlib.cli import main
from memlib.config import ConfigError, TrainingConfig, model_from_dict
from memlib.device.estimate import estimate
from memlib.device.overhead import Overheads
from memlib.model.partition import Partition
from memlib.device.peak import ChunkLoad, Framework, is_routed_entry, offloaded_entry, stage_peak
from memlib.device.schedule import Moment

from strategies import cases

SETTINGS = settings(max_examples=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NONE = Overheads(0, 0, Fraction(0))


def load(held, offloaded=0, working=0, gradients=0, reload=0, logits=0, layer=0) -> ChunkLoad:
    return ChunkLoad(held, offloaded, working, gradients, reload, logits, layer)


# ------------------------------------------------------------------------------------------------
# one rank by hand
# ------------------------------------------------------------------------------------------------
def test_the_worst_moment_by_hand():
    chunks = [load(100, working=7, gradients=30), load(50, gradients=20, logits=40)]
    moments = [Moment((3, 0), (0,)), Moment((2, 1), (1,))]
    p = stage_peak(0, ({"grad_buffer": 1000}, "megatron_buffers"), chunks, moments, TrainingConfig())
    # (3, 0) running chunk 0: 300 + 7 + 30 = 337; (2, 1) running chunk 1: 250 + 40 (logits beat gradients 20) = 290
    assert p.moment == moments[0] and p.activations == {"chunk0": 300}
    assert p.transient == {"recompute_working_set": 7, "backward_gradients": 30, "cross_entropy_logits": 0,
                           "cross_entropy_workspace": 0, "offload_reload": 0, "forward_transients": 0,
                           "batch_attention_mask": 0, "backward_released": 0}
    assert p.peak_allocated == 1337 and p.peak_reserved == 1337
    # the logits and the gradients are never alive together: the larger counts
    assert load(0, gradients=5, logits=9).transient()["backward_gradients"] == 0
    assert load(0, gradients=9, logits=9).transient() == {"recompute_working_set": 0, "backward_gradients": 9,
                                                          "cross_entropy_logits": 0, "cross_entropy_workspace": 0,
                                                          "offload_reload": 0, "forward_transients": 0,
                                                          "batch_attention_mask": 0, "backward_released": 0}


def test_fragmentation_is_rounded_up_on_the_peak():
    p = stage_peak(0, ({"parameters": 10}, "states"), [load(3)], [Moment((1,), (0,))], TrainingConfig(),
                   Fraction(1, 10))
    assert p.peak_allocated == 13 and p.fragmentation == 2 and p.peak_reserved == 15


def test_offloading_prefetch_and_reload_by_hand():
    # a chunk that moved 40 bytes of each micro-batch to the host; one layer's offloaded tensors are 15 bytes, 25 with
    # every saved copy (a tensor two autograd nodes save goes to the host and back twice)
    fwd = {"offload_reload": 15, "forward_transients": 4}         # the attention's forward: the layer's own, once
    bwd = {"offload_reload": 25, "backward_gradients": 4}         # its backward: the layer reloaded, every copy
    c = ChunkLoad(10, 40, 0, 0, 15, 0, candidates=(("forward_attention", fwd), ("backward_attention", bwd)),
                  prefetch=25)
    # two micro-batches in flight, one computing: the other's layer was reloaded ahead (25) through this forward
    p = stage_peak(0, ({}, "states"), [c], [Moment((2,), (0,))], TrainingConfig())
    assert p.activations == {"chunk0": 20, "offload_prefetch": 25} and p.candidate == "forward_attention"
    assert p.peak_allocated == 20 + 25 + 15 + 4
    # one micro-batch in flight: nothing else to fetch back; its backward, with its own layer's copies, is the worst
    p = stage_peak(0, ({}, "states"), [c], [Moment((1,), (0,))], TrainingConfig())
    assert p.activations == {"chunk0": 10} and p.candidate == "backward_attention"
    assert p.transient["offload_reload"] == 25 and p.peak_allocated == 10 + 25 + 4
    # the model's last chunk: its forward follows its previous micro-batch's backward, which fetched nothing for it
    p = stage_peak(0, ({}, "states"), [replace(c, last=True)], [Moment((2,), (0,))], TrainingConfig())
    assert p.activations == {"chunk0": 20} and p.peak_allocated == 20 + 25 + 4


def test_the_overlap_adds_one_layer_of_the_running_chunk():
    chunks = [load(100, layer=30), load(60, layer=45)]
    t = TrainingConfig(moe_a2a_overlap=True)
    p = stage_peak(0, ({}, "states"), chunks, [Moment((1, 1), (1,))], t)
    assert p.activations == {"chunk0": 100, "chunk1": 60, "a2a_overlap_forward": 45}


def test_no_moment_is_an_error():
    with pytest.raises(ConfigError, match="no moment"):
        stage_peak(3, ({}, "states"), [], [], TrainingConfig())


# ------------------------------------------------------------------------------------------------
# the entries the features touch
# ------------------------------------------------------------------------------------------------
def test_offloaded_entries_follow_megatrons_groups():
    assert offloaded_entry("attention.q", ("core_attn",)) and offloaded_entry("mtp.attention.q", ("core_attn",))
    assert not offloaded_entry("attention.context", ("core_attn",))      # W^O keeps it
    assert offloaded_entry("attention.context", ("core_attn", "attn_proj"))
    assert offloaded_entry("moe.routed.fc1_input", ("expert_fc1",))
    assert not offloaded_entry("moe.routed.act_output", ("expert_fc1", "moe_act"))  # fc2's input stays
    assert not offloaded_entry("head.loss_softmax", ("core_attn", "attn_norm", "qkv_linear"))
    assert is_routed_entry("moe.routed.probs") and is_routed_entry("mtp.moe.routed.fc1_input")
    assert not is_routed_entry("moe.shared.swiglu_input") and not is_routed_entry("moe.router_scores")


# ------------------------------------------------------------------------------------------------
# the tiny model by hand
# ------------------------------------------------------------------------------------------------
def tiny_train(**kw) -> TrainingConfig:
    base = dict(dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", precision="megatron", zero=1, micro_batch=2,
                seq_len=4, num_microbatches=1, schedule="1f1b")
    return TrainingConfig(**{**base, **kw})


def test_logits_on_the_last_stage_by_hand():
    # b s v bf16 = 2 * 4 * 10 * 2 = 160 bytes, beside the fp32 softmax the ledger holds
    est = estimate(T.tiny(), tiny_train(), NONE)
    ch = est.partition.stages[0].chunks[0]
    ex = est.stage_expressions(0, est.values)
    got = est.chunk_load(ch, {k: int(x) for k, x in ex.chunks[0].items()}, int(ex.working[0]))
    assert got.logits == 160
    # TP splits the vocabulary: v/TP of it, over all s tokens (the output layer gathers the SP shards)
    est2 = estimate(T.tiny(vocab_size=12, num_attention_heads=2), tiny_train(tp=2, seq_len=4), NONE)
    ex2 = est2.stage_expressions(0, est2.values)
    got2 = est2.chunk_load(est2.partition.stages[0].chunks[0], {k: int(x) for k, x in ex2.chunks[0].items()},
                           int(ex2.working[0]))
    assert got2.logits == 2 * 4 * 6 * 2


def _forward_end(train):
    est = estimate(T.tiny(), train, NONE)
    ex = est.stage_expressions(0, est.values)
    got = est.chunk_load(est.partition.stages[0].chunks[0], {k: int(x) for k, x in ex.chunks[0].items()},
                         int(ex.working[0]))
    cands = dict(got.candidates)
    assert got.transient() == max(cands.values(), key=lambda t: sum(t.values()))
    return cands["forward_end"]


def test_end_of_the_forward_by_hand():
    """One stage, no MTP: at the end of the forward the logits (b s v bf16 = 160 bytes) are alive beside
    everything saved, and the chunk's input (GPTModel's decoder_input, b s h bf16 = 128 bytes) unless a kept
    entry is that tensor: Transformer Engine's norm, and torch's fused RMSNorm on a GPU, keep the first layer's
    input itself; the CPU's composite RMSNorm keeps an fp32 copy instead."""
    te = _forward_end(tiny_train())
    assert (te["cross_entropy_logits"], te["forward_transients"], sum(te.values())) == (160, 0, 160)
    local = dict(transformer_impl="local", sp=False)
    gpu, cpu = _forward_end(tiny_train(**local)), _forward_end(tiny_train(**local, runtime="cpu"))
    assert (gpu["forward_transients"], cpu["forward_transients"]) == (0, 128)
    # the native fused cross-entropy compiled on a GPU: an fp32 buffer of the logits' elements (80 x 4 bytes);
    # eager on the CPU, and the unfused loss, none
    fused = dict(local, cross_entropy_loss_fusion=True)
    assert _forward_end(tiny_train(**fused))["cross_entropy_workspace"] == 320
    assert _forward_end(tiny_train(**fused, runtime="cpu"))["cross_entropy_workspace"] == 0
    assert gpu["cross_entropy_workspace"] == 0


def test_routing_imbalance_scales_the_routed_entries_only():
    m = T.tiny()
    a = estimate(m, tiny_train(), NONE).stages[0].activations["by_entry"]
    b = estimate(m, tiny_train(routing_imbalance=Fraction(3, 2)), NONE).stages[0].activations["by_entry"]
    assert a.keys() == b.keys()
    for k in a:
        if is_routed_entry(k):
            assert b[k] >= a[k] * Fraction(3, 2) and b[k] < a[k] * Fraction(3, 2) + 2 * 2  # rounded up per layer
        else:
            assert b[k] == a[k], k
    assert any(is_routed_entry(k) and b[k] > a[k] for k in a)


def test_megatron_fp8_caches_linear_inputs_in_fp8():
    m = T.tiny(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, q_lora_rank=128,
               kv_lora_rank=128, num_attention_heads=1, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=128)
    base = estimate(m, tiny_train(), NONE).stages[0].activations["by_entry"]
    fp8 = estimate(m, tiny_train(fp8="hybrid", fp8_recipe="tensorwise"), NONE).stages[0].activations["by_entry"]
    # fc1 input: b s N_r rows of h, bf16 -> one byte per element
    assert base["moe.routed.fc1_input"] == 2 * 2 * 4 * 2 * 128 * 2
    assert fp8["moe.routed.fc1_input"] == 2 * 2 * 4 * 2 * 128          # one per-tensor scale, not counted
    mx = estimate(m, tiny_train(fp8="hybrid", fp8_recipe="mxfp8"), NONE).stages[0].activations["by_entry"]
    assert mx["moe.routed.fc1_input"] == 2 * 2 * 4 * 2 * (128 + 4)    # an E8M0 byte per 32 elements
    assert fp8["attention.context"] == base["attention.context"]   # W^O keeps the kernel's bf16 output
    assert fp8["attention.norm_input"] == base["attention.norm_input"]  # not a Linear input


def test_persistent_terms_are_megatron_buffers_account():
    m, t = T.tiny(), tiny_train(dp=2, zero=1)
    est = estimate(m, t, NONE, framework=Framework(compute_capability=8))
    want = mb.persistent_memory(Partition(m, t), 0, **Framework(compute_capability=8).buffer_options(t, 4, 2))
    assert est.peaks[0].persistent == {k: v for k, v in want.evaluate(est.partition.values).items() if v}
    assert est.peaks[0].persistent_source == "megatron_buffers"
    # ZeRO-2, the paper's profile, and a precision whose moments are not the fp32 ones the buffers hold
    # (the paper's bf16 moments, BF16 exp_avg by a spec): memlib's own states
    for t2 in (t.with_(zero=2), t.with_(profile="paper"), t.with_(precision="paper"),
               t.with_(precision="megatron:exp_avg=bf16")):
        e2 = estimate(m, t2, NONE)
        assert e2.peaks[0].persistent == {k: e2.stages[0].bytes[k] for k in
                                          ("parameters", "gradients", "optimizer_states")}


def test_a_framework_must_be_a_framework():
    with pytest.raises(ConfigError, match="must be a memlib.device.peak.Framework"):
        estimate(T.tiny(), tiny_train(), NONE, framework={"compute_capability": 9})


# ------------------------------------------------------------------------------------------------
# the JSON
# ------------------------------------------------------------------------------------------------
OLD_STAGE_KEYS = {"stage", "layers", "parameters", "components", "bytes", "allocated", "optimizer_states",
                  "activations", "overheads"}


def test_json_adds_the_peak_and_renames_nothing(capsys):
    assert main(["estimate", "--model", "deepseek-v2-lite", "--profile", "megatron", "--precision", "megatron",
                 "--zero", "1", "--tp", "1", "--pp", "2", "--ep", "8", "--dp", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"model", "config", "stages", "peak"} <= d.keys()
    for s in d["stages"]:
        assert OLD_STAGE_KEYS <= s.keys()
        br = s["peak_breakdown"]
        parts = sum(br["persistent"].values()) + sum(br["activations"].values()) + sum(br["transient"].values())
        assert s["peak_allocated"] == parts and s["peak_reserved"] == parts + br["fragmentation"]
        assert s["peak_reserved"] >= s["peak_allocated"] >= s["allocated"] - s["bytes"]["overhead"] * 0
    assert d["peak_allocated"] == max(s["peak_allocated"] for s in d["stages"])
    assert d["peak_reserved"] == max(s["peak_reserved"] for s in d["stages"])


# ------------------------------------------------------------------------------------------------
# properties
# ------------------------------------------------------------------------------------------------
def build(case):
    d, kw = case
    return model_from_dict(d, name="random"), TrainingConfig(**kw)


def peaks(m, t) -> list[int]:
    return [p.peak_allocated for p in estimate(m, t, NONE).peaks]


@SETTINGS
@given(cases())
def test_the_peak_is_never_below_the_held_activations(case):
    m, t = build(case)
    est = estimate(m, t, NONE)
    for s, p in zip(est.stages, est.peaks):
        # every moment has a candidate with nothing released (the end of a forward): the peak holds at least
        # the micro-batches the allocated bytes hold (their working set is the estimate's bound, which the
        # peak's moments replace by what is alive then)
        held = s.bytes["activations"] - s.activations["recompute_working_set"]
        assert sum(p.activations.values()) + sum(p.transient.values()) >= held
        if p.persistent_source == "states":
            assert p.peak_allocated >= s.model_states + held


@SETTINGS
@given(cases(profiles=("megatron",)))
def test_more_routing_imbalance_never_lowers_the_peak(case):
    m, t = build(case)
    a, b = peaks(m, t), peaks(m, t.with_(routing_imbalance=Fraction(5, 4)))
    assert all(y >= x for x, y in zip(a, b))
    assert peaks(m, t.with_(routing_imbalance=Fraction(2))) >= b or all(
        z >= y for y, z in zip(b, peaks(m, t.with_(routing_imbalance=Fraction(2)))))


@SETTINGS
@given(cases(profiles=("megatron",)))
def test_offloading_never_raises_and_the_overlap_never_lowers_the_peak(case):
    """Offloading never raises the peak where every offloaded tensor is saved once (the experts' inputs):
    Megatron-Core fetches a layer back once per save, so offloading the attention probabilities that the softmax
    and P V both save can raise the peak of a chunk of few layers (test_offloading_can_raise_a_short_chunks_peak)."""
    m, t = build(case)
    assume(t.transformer_impl.uses_te if hasattr(t.transformer_impl, "uses_te") else True)
    base = peaks(m, t)
    off = peaks(m, t.with_(offload_modules=("expert_fc1", "moe_act")))
    assert all(y <= x for x, y in zip(base, off))
    over = peaks(m, t.with_(moe_a2a_overlap=True))
    assert all(y >= x for x, y in zip(base, over))


@SETTINGS
@given(cases(profiles=("megatron",), recipes=("megatron",)))
def test_megatron_fp8_never_raises_the_activations(case):
    m, t = build(case)
    try:
        fp8 = estimate(m, t.with_(fp8="hybrid"), NONE)
    except ConfigError:       # FP8 needs Transformer Engine
        assume(False)
    base = estimate(m, t, NONE)
    assert all(b.bytes["activations"] >= f.bytes["activations"] for b, f in zip(base.stages, fp8.stages))


def test_gpu_sets_the_workspaces_and_is_checked(capsys):
    args = ["estimate", "--model", "deepseek-v2-lite", "--profile", "megatron", "--precision", "megatron", "--zero", "1",
            "--tp", "1", "--pp", "2", "--ep", "8", "--dp", "8", "--json"]
    assert main(args + ["--gpu", "A100"]) == 0
    a100 = json.loads(capsys.readouterr().out)
    assert main(args + ["--gpu", "h100"]) == 0
    h100 = json.loads(capsys.readouterr().out)
    assert (a100["config"]["framework"]["compute_capability"], h100["config"]["framework"]["compute_capability"]) == (8, 9)
    ws = lambda d: d["stages"][0]["peak_breakdown"]["persistent"]["te_cublas_workspaces"]  # noqa: E731
    assert ws(a100) < ws(h100)                       # TE's workspace is 32 MiB from Hopper on, 4 MiB before
    assert main(args + ["--gpu", "X100"]) == 2
    assert capsys.readouterr().err.strip() == ("memlib: error: gpu='X100' must be one of A100, H100, H800, H200, "
                                               "B200, GB200")


@SETTINGS
@given(cases(profiles=("megatron",), policies=("none",)))
def test_a_stronger_policy_peaks_higher_only_where_it_recomputes(case):
    """Stronger recomputation (none -> selective -> full) can raise the peak, by design and measured (issue #20,
    tests/device/test_peak_cpu.py's POLICY_PAIRS): the stronger policy re-runs a layer's forward (its dropped entries, the
    MoE's copies of the dispatched tokens, the frames' residual-stream tensors) while the backward's gradients are
    alive, or its checkpoint keeps inputs nothing else keeps (the dataset's [b, 1, s, s] attention mask, kept for
    core_attn recomputation, one per micro-batch in flight).  So where the stronger
    policy's peak is higher, its worst moment is one with a recompute working set, or the excess is at most the
    masks of the micro-batches in flight."""
    m, t = build(case)
    per = {p: estimate(m, t.with_(recompute=p), NONE) for p in ("none", "selective", "full")}
    for weak, strong in (("none", "selective"), ("selective", "full"), ("none", "full")):
        mask = per[strong]._evaluated("embedding").get("embedding.attention_mask", (0, None))[0]
        for a, b in zip(per[weak].peaks, per[strong].peaks):
            if b.peak_allocated > a.peak_allocated:
                held = mask * b.moment.total            # the mask of each micro-batch in flight
                assert b.transient["recompute_working_set"] > 0 or b.peak_allocated - a.peak_allocated <= held, \
                    (weak, strong, a.peak_allocated, b.peak_allocated, b.candidate, b.transient, mask)


# ------------------------------------------------------------------------------------------------
# fine-grained activation offloading on a functional test, by hand
# ------------------------------------------------------------------------------------------------
OFFLOAD_TEST = "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading"


def offload_case(test: str = OFFLOAD_TEST):
    from memlib.scenarios.functional import cases
    return next(c for c in cases() if c.golden.test == test and "h100" in c.golden.file)


def test_offloading_fetches_a_layer_back_with_every_saved_copy():
    """Megatron-LM's functional test (MLA, 32 experts, TP 2 with SP, EP 4, micro-batch 1, s 4096, TE's unfused
    attention, every --offload-modules group): one MoE layer's offloaded tensors in MiB, each as often as autograd
    saves it.  attn_norm: the layer input 4; qkv_linear: the input norm's output 4, saved by W^DQ and W^DKV (2 x 4),
    c^Q 6 and, as memlib counts the latents, c^Q normalised 6, c^KV 2 and normalised 2; core_attn: q 24, k 24, v 16
    and the probabilities [16 heads, 4096, 4096] bf16 = 512, saved by the softmax and by P V (2 x 512); attn_proj:
    the context 16; mlp_norm: 4; expert_fc1: the dispatched tokens 8,192 x 1,024 bf16 = 16; moe_act: their fc1
    output 32.  The peak is the forward of an attention while the last layer of the next chunk to run its backward
    has been fetched back (the previous backward's last groups reload it, ``pre_reload_last_layer``)."""
    c = offload_case()
    MiB = 2 ** 20
    layer = 4 + (2 * 4 + 6 + 6 + 2 + 2) + (24 + 24 + 16 + 2 * 512) + 16 + 4 + 16 + 32
    assert c.peak.activations["offload_prefetch"] == layer * MiB == 1184 * MiB
    assert c.peak.candidate == "forward_attention"
    # the forward holds the attention's own tensors once each (the probabilities' one storage), 668 MiB
    assert c.peak.transient["offload_reload"] == (layer - 512 - 4) * MiB


def test_the_last_chunk_keeps_its_last_layer_on_the_gpu():
    """The model's last chunk (the MTP layer and the loss) runs its backward right after its forward: Megatron-Core
    keeps the last group of each offloaded module there, so that chunk offloads nothing and reloads nothing."""
    c = offload_case("gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading")
    m, t = c.run.model, c.run.train
    est = estimate(m, t, NONE, framework=c.run.framework)
    st = est.partition.stages[-1]
    ex = est._evaluated_stage(st, {})
    last = est.chunk_load(st.chunks[-1], {k: int(x) for k, x in ex.chunks[-1].items()}, int(ex.working[-1]))
    assert st.chunks[-1].last and last.offloaded == last.reload == last.prefetch == 0
    full = estimate(m, t.with_(offload_modules=()), NONE, framework=c.run.framework)
    fex = full._evaluated_stage(full.partition.stages[-1], {})
    assert last.held == sum(int(x) for x in fex.chunks[-1].values())


def test_offloading_can_raise_a_short_chunks_peak():
    """One layer a chunk, TE's unfused attention: the next micro-batch's forward runs with the other micro-batch's
    layer fetched back, its probabilities P twice, where without offloading that micro-batch held P once: offloading
    core_attn raises stage 0's peak by one P (b n_h s^2 = 8 heads x 2,048^2 bf16 = 64 MiB).  The last stage's chunk
    keeps its only layer (its backward follows its forward): unchanged."""
    m = model_from_dict({**T.TINY_HF, "num_hidden_layers": 2, "first_k_dense_replace": 0, "hidden_size": 1024,
                         "num_attention_heads": 8, "intermediate_size": 2048, "moe_intermediate_size": 512}, name="e")
    t = TrainingConfig(pp=2, num_microbatches=4, seq_len=2048, micro_batch=1, profile="megatron",
                       transformer_impl="transformer_engine", attention_backend="unfused")
    base = estimate(m, t, NONE).peaks
    off = estimate(m, t.with_(offload_modules=("core_attn", "attn_proj")), NONE).peaks
    P = 8 * 2048 * 2048 * 2
    # P twice; q, k, v and the context (2,048 x 8 x 5 = 81,920 elements, d_v = 5) are under the 1,048,576-element
    # floor below which Megatron-Core offloads nothing (min_offloaded_tensor_size): they stay
    assert off[0].activations["offload_prefetch"] == 2 * P
    assert off[0].peak_allocated > base[0].peak_allocated and off[1].peak_allocated == base[1].peak_allocated
