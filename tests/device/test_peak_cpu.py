"""memlib's transient peak (:mod:`memlib.device.transient`) against a measured Megatron-Core training step on the CPU.

One worker call (:func:`memlib.measure.step.measure_peak_many`) measures twelve small DeepSeek-style configs
(megatron-core 0.19.2, ``transformer_impl=local``, PP = 1, two iterations); each asserts memlib's
``peak_allocated - persistent`` against the measured ``max - post-step allocation`` within its stated
tolerance, and that memlib's worst candidate moment is where the measured peak is.

Why not byte-exact (per config, the tolerance says how far):

* every ledger entry counts its exact bytes, the allocator a 512-byte block per tensor (and the local
  experts keep one tensor per expert): the held activations are short by up to ~1 % at b = 1;
* the loss's 0-dim scalars (a few 512-byte blocks) are not modelled;
* under full and ``moe`` recomputation some of a step's tensors (checkpoint inputs and their gradients)
  outlive the step, so the measured post-step allocation is not the persistent memory (``full``: 120 KB,
  ``moe_rec``: 92 KB, ``full_vocab``: 64 KB); and under full recomputation the recompute moment's
  working set is an upper bound (the whole MTP block's dropped entries, some of which the block's
  backward frees before its final norm's backward).

Needs torch and megatron-core 0.19.2; skipped without them, failing under CI instead.
"""
from __future__ import annotations

import os

import pytest
import sympy as sp

from memlib.ledgers.base import Policy, saved
from memlib.config import TrainingConfig, model_from_dict
from memlib.measure.megatron import MCORE_VERSION, MISSING_MCORE, available
from memlib.device.transient import TERMS, Segment, candidates, moe_copies, te_fused_softmax

SMALL = {"hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32, "num_attention_heads": 8,
         "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "q_lora_rank": 32, "kv_lora_rank": 24,
         "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hidden_layers": 2,
         "first_k_dense_replace": 1, "vocab_size": 256, "model_type": "deepseek_v3", "n_group": 4, "topk_group": 2,
         "num_nextn_predict_layers": 1}
MOE = dict(num_attention_heads=2, n_routed_experts=16, num_experts_per_tok=8, moe_intermediate_size=128,
           hidden_size=128)

#: name, model changes, training changes, micro-batches, tolerance (relative), memlib's moment, where the
#: measured peak is (a part of its label)
CASES = [
    ("attn", {}, dict(micro_batch=2, seq_len=128), 1, 0.005, "backward_attention", "scale_mask_softmax"),
    ("moe", MOE, dict(micro_batch=2, seq_len=32), 1, 0.005, "forward_moe", "fwd:mtp.layers.0.mtp_model_layer.mlp"),
    ("vocab", dict(vocab_size=4096), dict(micro_batch=2, seq_len=32), 1, 0.006, "forward_end", "fwd:gpt"),
    ("attn_rec", {}, dict(micro_batch=2, seq_len=128, recompute="core_attn"), 1, 0.005, "backward_attention",
     "scale_mask_softmax"),
    ("nomtp", dict(num_nextn_predict_layers=0), dict(micro_batch=2, seq_len=128), 1, 0.005, "backward_attention",
     "decoder.layers.1.self_attention.core_attention.scale_mask_softmax"),
    ("dense", dict(first_k_dense_replace=2, num_nextn_predict_layers=0), dict(micro_batch=2, seq_len=64), 1, 0.006,
     "forward_end", "fwd:gpt"),
    ("mla_up", {}, dict(micro_batch=2, seq_len=64, recompute="mla_up_proj"), 1, 0.005, "forward_end", "fwd:gpt"),
    ("moe_nomtp", {**MOE, "num_nextn_predict_layers": 0}, dict(micro_batch=2, seq_len=32), 1, 0.005, "forward_moe",
     "fwd:decoder.layers.1.mlp"),
    ("m2", {}, dict(micro_batch=1, seq_len=64), 2, 0.015, "forward_end", "fwd:gpt"),
    ("moe_rec", MOE, dict(micro_batch=2, seq_len=32, recompute="moe"), 1, 0.025, "recompute",
     "mtp.layers.0.mtp_model_layer.mlp"),
    ("full_vocab", dict(vocab_size=4096), dict(micro_batch=2, seq_len=32, recompute="full"), 1, 0.02, "forward_end",
     "fwd:gpt"),
    ("full", {}, dict(micro_batch=2, seq_len=64, recompute="full"), 1, 0.21, "recompute", "mtp.layers.0"),
]


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true")


def _config(name, mch, tch, M):
    m = model_from_dict({**SMALL, **mch}, name=name)
    t = TrainingConfig(**{**dict(dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", precision="megatron",
                                 transformer_impl="local", zero=1, num_microbatches=M, runtime="cpu"), **tch})
    return m, t


def _measure(configs: list[tuple]) -> list:
    """Each (name, model changes, training changes, M)'s training step measured, in one worker (skipped without
    megatron-core, failing under CI instead)."""
    if _ci():
        assert available(), MISSING_MCORE
    elif not available():
        pytest.skip(f"megatron-core {MCORE_VERSION} (and torch) not installed: the training step is not measured")
    from memlib.measure.step import PeakRequest, measure_peak_many

    reqs = []
    for name, mch, tch, M in configs:
        m, t = _config(name, mch, tch, M)
        reqs.append(PeakRequest(m, t, 0, True, M, True, "fused"))
    return measure_peak_many(reqs)


@pytest.fixture(scope="module")
def measured():
    return dict(zip([c[0] for c in CASES], _measure([(n, mch, tch, M) for n, mch, tch, M, *_ in CASES])))


def _alive_beyond_persistent(r) -> int:
    """The bytes alive at the measured maximum beyond what persists across steps (the categories alive after the
    last step: buffers, states, the attention's global buffer)."""
    at = r.phase(r.max_phase).categories
    return sum(at.values()) - sum(at.get(k, 0) for k in r.persistent)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_transient_peak_matches_the_measured_step(measured, case):
    from memlib.device.estimate import estimate
    from memlib.device.overhead import overheads

    name, mch, tch, M, tol, moment, where = case
    r = measured[name]
    m, t = _config(name, mch, tch, M)
    est = estimate(m, t, overheads("none"))
    p = est.peaks[0]
    pred = p.peak_allocated - sum(p.persistent.values())
    meas = r.max.measured - r.after[-1].measured
    assert abs(pred - meas) <= tol * meas, (name, pred, meas, f"{100 * (pred / meas - 1):+.2f}%")
    assert where in r.max_label, (name, r.max_label)
    st = est.stages[0]
    ex = est._evaluated_stages[0]
    load = est.chunk_load(st.stage.chunks[0], {k: int(x) for k, x in ex.chunks[0].items()}, int(ex.working[0]))
    assert load.moment() == moment
    assert p.transient == load.transient() and set(p.transient) == set(TERMS)


# ------------------------------------------------------------------------------------------------
# the rules, hand-worked on a made-up chunk
# ------------------------------------------------------------------------------------------------
NONE, CORE, FULL = Policy("none"), Policy("core", frozenset({"core_attn"})), Policy("full", full=True)


def _seg(name, kind, entries, policy=NONE):
    out = {}
    for key, nbytes, kw in entries:
        out[key] = (nbytes, saved(key, key, sp.Integer(nbytes), **kw))
    return Segment(name, kind, out, policy)


def _layer(prefix="", policy=NONE):
    p = prefix
    return [(p + "attention.norm_output", 10, {}), (p + "attention.layer_input", 10, dict(only_when={"full"}, keep_full=True)),
            (p + "attention.v", 7, {}), (p + "attention.softmax_out", 100, dict(modules={"core_attn"})),
            (p + "attention.context", 6, {}), (p + "moe.norm_output", 10, {}),
            (p + "moe.routed.fc1_input", 20, {}), (p + "moe.routed.act_output", 30, {})]


def test_forward_end_holds_the_logits_and_the_decoder_input():
    segs = [_seg("embedding", "embedding", [("embedding.token_ids", 1, dict(keep_full=True))]),
            _seg("layer.0", "moe", _layer()), _seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])]
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True)
    assert c["forward_end"] == {**dict.fromkeys(TERMS, 0), "cross_entropy_logits": 25, "forward_transients": 10}
    # off the last chunk: only the chunk's input
    c = candidates(segs[:2], H=10, L=0, mtp_depth=0, first=True, last=False, shared_experts=True)
    assert sum(c["forward_end"].values()) == 10


def test_backward_attention_releases_what_was_saved_after_the_probabilities():
    segs = [_seg("layer.0", "moe", _layer()), _seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])]
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True)["backward_attention"]
    # released: head 50 + after the probabilities 6 + 10 + 20 + 30 + the probabilities 100 and v 7
    assert c["backward_released"] == -(50 + 66 + 100 + 7)
    # CopySlices' four s x s tensors, v's gradient, the layer's residual gradient (last chunk, no MTP)
    assert c["backward_gradients"] == 4 * 100 + 7 + 10
    assert c["recompute_working_set"] == 0
    # core_attn recomputation: the checkpoint keeps v; its recomputed output and that one's gradient are alive
    segs[0] = _seg("layer.0", "moe", _layer(), CORE)
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True)["backward_attention"]
    assert c["backward_released"] == -(50 + 66)
    assert c["backward_gradients"] == 4 * 100 + 7 + 10 + 6 and c["recompute_working_set"] == 6


def test_forward_moe_holds_three_copies_of_the_dispatched_tokens():
    segs = [_seg("layer.0", "dense", _layer()[:5]), _seg("layer.1", "moe", _layer()),
            _seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])]
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True)["forward_moe"]
    # chunk input + layer input + residual + shared experts' output; the head is not saved yet
    assert c["forward_transients"] == 3 * 20 + 4 * 10 and c["backward_released"] == -50


def test_full_recompute_saves_the_dropped_part_again():
    segs = [_seg("layer.0", "moe", _layer(), FULL), _seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])]
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True)
    # everything but the checkpoint's input is dropped: 10 + 7 + 100 + 6 + 10 + 20 + 30
    assert c["recompute"]["recompute_working_set"] == 183
    # the re-run experts' 3 R, the shared experts' output and the residual after the attention (2 H)
    assert c["recompute"]["forward_transients"] == 60 + 2 * 10
    assert c["recompute"]["backward_released"] == -50
    # the checkpoint keeps the decoder input: forward_end does not count it again
    assert c["forward_end"]["forward_transients"] == 0
    # moe recomputation re-runs the MoE only: its checkpoint keeps the residual, the shared experts' output is alive
    moe = Policy("moe", frozenset({"moe"}))
    ent = [(k, x, dict(modules={"moe"}) if k.startswith("moe.routed") else kw) for k, x, kw in _layer()]
    segs = [_seg("layer.0", "moe", ent, moe), _seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])]
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True)
    assert c["recompute"]["recompute_working_set"] == 50 and c["recompute"]["forward_transients"] == 60 + 10


def test_an_earlier_recomputed_layer_has_its_own_backward_moment():
    """full-block:1: the first layer is recomputed, the last is not; the first layer's attention backward holds its
    recompute working set and its checkpoint's output gradient after the last layer was released, more than the
    last layer's (measured: the block pair's peak is the first layer's, POLICY_PAIRS)."""
    segs = [_seg("layer.0", "moe", _layer(), FULL), _seg("layer.1", "moe", _layer()),
            _seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])]
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True)["backward_attention"]
    # released: the last layer's 183 kept and the head's 50; alive: 4 P, v's gradient, the residual gradient and
    # the checkpoint's output gradient; recomputed up to the probabilities, less them and v: the norm output 10
    assert (c["backward_released"], c["backward_gradients"], c["recompute_working_set"]) == (-233, 427, 10)


# ------------------------------------------------------------------------------------------------
# the Transformer Engine rules (read from the sources, not measured), hand-worked on the same chunk
# ------------------------------------------------------------------------------------------------
def test_te_backward_attention_is_the_context_bmms_backward():
    segs = [_seg("layer.0", "moe", _layer()), _seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])]
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True,
                   fused_softmax=True)["backward_attention"]
    # released: head 50 + after the probabilities 6 + 10 + 20 + 30; the probabilities and v are still saved
    assert c["backward_released"] == -(50 + 66)
    # dP, dV and the context's incoming gradient dC, the layer's residual gradient (last chunk, no MTP)
    assert c["backward_gradients"] == 100 + 7 + 6 + 10
    assert c["recompute_working_set"] == 0
    # core_attn: the checkpoint's recomputed output and probabilities are alive beside the same gradients
    segs[0] = _seg("layer.0", "moe", _layer(), CORE)
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True,
                   fused_softmax=True)["backward_attention"]
    assert c["backward_released"] == -(50 + 66)
    assert c["backward_gradients"] == 100 + 7 + 6 + 10 and c["recompute_working_set"] == 6 + 100
    # mla_up_proj drops v: it is recomputed before the core attention's backward and alive
    up = Policy("up", frozenset({"mla_up_proj"}))
    ent = [(k, x, dict(modules={"mla_up_proj"}) if k == "attention.v" else kw) for k, x, kw in _layer()]
    segs[0] = _seg("layer.0", "moe", ent, up)
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True,
                   fused_softmax=True)["backward_attention"]
    assert c["recompute_working_set"] == 7 and c["backward_released"] == -(50 + 66)
    # off the last chunk with MTP depth 0: the gradient received from the next stage as well
    c = candidates(segs[:1], H=10, L=0, mtp_depth=0, first=True, last=False, shared_experts=True,
                   fused_softmax=True)["backward_attention"]
    assert c["backward_gradients"] == 100 + 7 + 6 + 2 * 10 and c["backward_released"] == -66


def test_te_fused_softmax_runs_where_its_kernel_is_available():
    assert te_fused_softmax(4, 16, 4096, 4096, True)          # the measured runs: b = 4, 32 heads over TP 2
    assert te_fused_softmax(1, 16, 4096, 4096, True)          # MBS 1: 16 heads, a multiple of 4
    assert not te_fused_softmax(1, 2, 4096, 4096, True)       # b * heads not a multiple of 4
    assert not te_fused_softmax(4, 16, 16384, 16384, True)    # sk must be below 16384
    assert not te_fused_softmax(4, 16, 4100, 4100, True)      # sk a multiple of 8
    assert not te_fused_softmax(4, 16, 4096, 4096, False)     # fp16/bf16 only
    assert not te_fused_softmax(4, 16, 2048, 4096, True)      # causal: sq == sk
    assert te_fused_softmax(4, 4, 64, 64, True)               # 8 rows a block at sk = 64


def test_te_grouped_experts_with_the_fused_permutation_hold_four_copies():
    te = dict(te=True, grouped_gemm=True, dispatcher="alltoall", permute_fusion=True, fp8=False, etp=1)
    assert moe_copies(**te, local_experts=8) == 4
    assert moe_copies(**te, local_experts=1) == 3                     # no sorts by local expert
    for k, v in (("te", False), ("grouped_gemm", False), ("permute_fusion", False), ("dispatcher", "flex"),
                 ("fp8", True), ("etp", 2)):
        assert moe_copies(**{**te, k: v}, local_experts=8) == 3       # the local rule
    segs = [_seg("layer.0", "dense", _layer()[:5]), _seg("layer.1", "moe", _layer()),
            _seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])]
    c = candidates(segs, H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=True,
                   moe_copies=4)["forward_moe"]
    assert c["forward_transients"] == 4 * 20 + 4 * 10 and c["backward_released"] == -50


# ------------------------------------------------------------------------------------------------
# a stronger recompute policy whose peak is higher: measured so too
# ------------------------------------------------------------------------------------------------
#: name, model changes, training changes, the weaker policy, the stronger one (it recomputes all the weaker does):
#: the configurations where memlib predicts the stronger policy's peak above the weaker one's (issue #20)
POLICY_PAIRS = [
    ("moe_fp32_softmax", {**MOE, "num_nextn_predict_layers": 0},
     dict(micro_batch=1, seq_len=512, attention_softmax_in_fp32=True), "selective", "full"),
    ("moe_deepseek", {**MOE, "num_nextn_predict_layers": 0}, dict(micro_batch=2, seq_len=32), "deepseek", "full"),
    ("block", dict(num_nextn_predict_layers=0), dict(micro_batch=2, seq_len=128), "full-block:1", "full"),
]


@pytest.fixture(scope="module")
def measured_pairs():
    res = _measure([(name, mch, {**tch, "recompute": policy}, 1) for name, mch, tch, weak, strong in POLICY_PAIRS
                    for policy in (weak, strong)])
    return {c[0]: (res[2 * i], res[2 * i + 1]) for i, c in enumerate(POLICY_PAIRS)}


@pytest.mark.parametrize("pair", POLICY_PAIRS, ids=[c[0] for c in POLICY_PAIRS])
def test_a_stronger_policy_peaks_higher_where_measured_so(measured_pairs, pair):
    """Where memlib's peak under a stronger policy exceeds a weaker one's, the measured steps' maxima do too,
    by about as much: the stronger policy re-runs a layer's forward (its dropped entries saved again, the MoE's
    copies of the dispatched tokens, the frames' hidden states) while the backward's gradients are alive.  Each
    side is checked: the stronger one's re-run was 2.5-3 H short (issue #20), and the weaker full-block:1 lacked
    its first layer's attention backward (only the chunk's last layer had one), where its measured peak is."""
    from memlib.device.estimate import estimate
    from memlib.device.overhead import overheads

    name, mch, tch, weak, strong = pair
    pred, meas = [], []
    for policy, r in zip((weak, strong), measured_pairs[name]):
        m, t = _config(name, mch, {**tch, "recompute": policy}, 1)
        p = estimate(m, t, overheads("none")).peaks[0]
        pred.append(p.peak_allocated - sum(p.persistent.values()))
        meas.append(_alive_beyond_persistent(r))
    d_pred, d_meas = pred[1] - pred[0], meas[1] - meas[0]
    assert d_pred > 0 and d_meas > 0, (name, d_pred, d_meas)
    # each side within 2.5 % (the loss's scalars, block rounding, the re-run router's temporaries and, under
    # deepseek, the hidden states its layernorm checkpoints keep, counted twice at forward_moe)
    for p, x in zip(pred, meas):
        assert abs(p - x) <= 0.025 * x, (name, pred, meas)
    # the stronger policy's recompute re-runs the forward's residual-stream tensors (issue #20: 2.5 to 3 H short)
    assert abs(d_pred - d_meas) <= 0.03 * meas[1], (name, d_pred, d_meas, pred, meas)


# ------------------------------------------------------------------------------------------------
# grouped-query attention under core_attn recomputation (Llama-style), against the CPU's allocator count
# ------------------------------------------------------------------------------------------------
GQA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 256,
       "tie_word_embeddings": False, "max_position_embeddings": 512}


def test_gqa_core_attention_backward_matches_the_measured_step():
    """At the first attention backward under core_attn recomputation, grouped-query attention has two more
    [s, b, n_h d_head] tensors alive than MLA: the gradient of v repeated to every head (the context bmm's
    backward) and the repeated k, re-made by the recomputation and saved by Q K^T until its own backward.
    memlib's moment lists both (the H200's Llama-style case agreed to 0.000 % with them, -0.19 % without)."""
    if _ci():
        assert available(), MISSING_MCORE
    elif not available():
        pytest.skip(f"megatron-core {MCORE_VERSION} (and torch) not installed: the training step is not measured")
    from memlib.device.estimate import estimate
    from memlib.device.overhead import overheads
    from memlib.measure.step import PeakRequest, measure_peak_many

    m = model_from_dict(GQA, name="gqa")
    t = TrainingConfig(dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", precision="megatron", zero=1,
                       transformer_impl="local", micro_batch=2, seq_len=128, num_microbatches=1,
                       recompute="selective", runtime="cpu")
    r = measure_peak_many([PeakRequest(m, t, 0, True, 1, True, "fused")])[0]
    p = estimate(m, t, overheads("none")).peaks[0]
    pred = p.peak_allocated - sum(p.persistent.values())
    meas = r.max.measured - r.after[-1].measured
    assert p.candidate == "backward_attention" and "scale_mask_softmax" in r.max_label
    # within the allocator's 512-byte rounding of the held tensors (an H is 32 KiB here)
    assert abs(pred - meas) <= 0.005 * meas, (pred, meas, f"{100 * (pred / meas - 1):+.2f}%")
