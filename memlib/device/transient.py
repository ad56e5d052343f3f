"""What is alive beyond the held activations while a chunk computes: the candidate moments of a micro-batch.

:mod:`memlib.device.peak` adds to the activations the schedule holds the *transient* bytes of a chunk computing.
This module finds them from the chunk's ledgers (every saved tensor, in the order the forward saves it,
:mod:`memlib.ledgers.megatron`) and from the order of the backward pass, as a few candidate moments of one
micro-batch; each is the bytes alive then minus that micro-batch's held activations, as named terms (the
``backward_released`` term is negative: what the backward has freed by then).  The largest candidate is
the chunk's transient.  Integers only; every rule is read from the code that runs, and checked against
:mod:`memlib.measure.step` (megatron-core 0.19.2, ``transformer_impl=local`` on the CPU,
``tests/test_peak_cpu.py``).  The Transformer Engine rules below are read from the sources only (TransformerEngine
v2.18, file:line there unless said otherwise; Megatron-LM d98e8a64dd), not measured: no GPU here.

``H`` is one residual-stream tensor ``[s/(CP TP (SP)), b, h]`` in the compute dtype (never FP8-cached; computed from
the micro-batch, the sequence and h), ``L`` the bf16 logits ``[s/CP, b, v/TP]`` of one output head, ``D`` the MTP depth
on the chunk (0 without MTP or off the last chunk).

forward_end (every chunk)
    The forward has saved everything.  On the chunk with the loss the logits of the last head computed
    are alive (the vocab-parallel cross-entropy casts them to fp32 and keeps the softmax,
    tensor_parallel/cross_entropy.py; the bf16 logits are freed when ``GPTModel.forward`` returns), with
    ``GPTModel.forward``'s ``decoder_input`` (a local until it returns, gpt_model.py) and, with MTP, the
    decoder's final hidden state that the MTP block reads (a second local): ``L + (1 + min(D, 1)) H``.
    Elsewhere the chunk's input (``decoder_input`` or the schedule's ``input_tensor``): ``H``.  A hidden
    state that a checkpoint keeps already (full recomputation: the ledger's kept ``attention.layer_input`` of
    the chunk's first layer, ``mtp.hidden_input``) is not counted twice.
backward_attention (a layer whose ledger keeps the ``[b, n_h, s, s]`` probabilities: the local or unfused
    attention)
    The first attention backward of the micro-batch, in the last layer (or MTP block) that has one.  Released
    by then: every kept entry saved after the probabilities (the rest of that layer, the later layers, the
    heads and losses; with MTP the decoder's final norm waits for the MTP block's gradient and is not).  Alive:
    megatron's local ``FusedScaleMaskSoftmax.forward_torch_softmax`` masks the scores in place
    (``attention_mask_func``: ``masked_fill_``) on a view of ``torch.baddbmm``'s result
    (dot_product_attention.py), so autograd's ``CopySlices`` (torch/csrc/autograd/functions/tensor.cpp) runs
    the mask's backward holding its incoming gradient, the base-sized result (``new_empty_strided``), the
    clone of the slice it hands to ``MaskedFillBackward`` and that one's output: ``4 P`` (``P`` the bytes of
    ``attention.softmax_out``), beside the gradient of ``v`` from the context ``bmm``'s backward (the bytes
    of ``attention.v``) and the gradients of the residual stream: the layer's (``H``), on the last chunk
    with MTP the output layer's input gradient (the concatenated ``[main; MTP]`` hidden states,
    ``(1 + D) H``, held until the decoder's final norm takes its half), off the last chunk the gradient
    received from the next stage (``H``).  What the policy dropped up to the probabilities is recomputed
    and alive (``recompute_working_set``).

    Transformer Engine's unfused attention (``transformer_impl=transformer_engine``, ``--attention-backend
    unfused``, TE v2.18 and the releases before it, where the fused softmax kernel runs: :func:`te_fused_softmax`)
    has no ``CopySlices``: ``UnfusedDotProductAttention`` (TE transformer_engine/pytorch/attention/
    dot_product_attention/backends.py:567 ``torch.baddbmm`` into a fresh tensor with ``beta=0``, :644 the
    softmax, :684 ``torch.bmm(attention_probs, v)``, :691 the context made contiguous) runs the fused
    ``ScaledMaskedSoftmax`` (softmax.py:93-116, 245: it saves only its bf16 results, :107), whose CUDA backward
    writes the scores' gradient into its incoming gradient (csrc/extensions/softmax.cpp:103-121, "Produce
    gradients in place"); dropout 0 returns its input (no node, no mask); the scores are not saved (``baddbmm``'s
    backward needs q and k only, and ``matmul_result`` needs no gradient).  The most is alive in the context
    ``bmm``'s backward (``BmmBackward0`` computes both gradients while its incoming gradient lives; its saved
    tensors go after it, autograd engine ``release_variables``): the incoming gradient of the context (``C``,
    the bytes of ``attention.context``: permute and view backward pass it on as a view), the probabilities'
    gradient (``P``) and ``v``'s (``V``), with the probabilities and ``v`` still saved (not released); the
    softmax backward then adds nothing, and ``baddbmm``'s backward holds ``P`` with dq and dk after the
    probabilities are freed (less at these sizes): ``P + V + C`` beside the residual-stream gradients above.
    What the policy dropped up to the probabilities is recomputed and alive; under ``core_attn`` the
    checkpoint's recomputed output and probabilities (``C + P``).  TE's main branch after v2.18 (commit
    0c8cf2c, torch.compile support) allocates a fresh gradient in the softmax backward instead: one ``P`` more
    there, not modelled.
forward_moe (a MoE layer with the unfused permutation and the local experts, megatron's defaults)
    The last MoE layer (or MTP block) of the chunk, when ``SequentialMLP`` concatenates its experts' outputs
    (moe/experts.py): the permuted tokens (``moe_utils.permute``'s ``index_select``, held by the token
    dispatcher until the un-permute), every expert's fc2 output and their concatenation, each the size of
    the dispatched tokens ``R`` (the bytes of ``moe.routed.fc1_input``): ``3 R``; and the residual-stream
    tensors the Python frames hold: the chunk's input, the layer's input (unless it is the chunk's first
    layer), the residual after the attention, the shared experts' output; in the MTP block the decoder's
    final hidden state, the MTP embedding and the layer's input (the ``eh_proj`` output) instead of the
    layer's input.  Not yet saved: every kept entry after that layer.

    Transformer Engine's ``GroupedLinear`` experts (``--moe-grouped-gemm``, ``TEGroupedMLP``) behind the
    all-to-all dispatcher with the fused permutation (``--moe-permute-fusion``), ETP 1, no FP8
    (:func:`moe_copies`): TE's permute, chunk sort and un-permute save only their ``row_id_map``
    (TE transformer_engine/pytorch/permutation.py:519, 808, 1250), so the token copies live in Python frames:
    ``MoELayer.forward``'s ``custom_forward`` keeps the permuted tokens (``hidden_states``,
    megatron/core/transformer/moe/moe_layer.py:663) and the all-to-all's output (``dispatched_input``, :680)
    until it returns; the sort by local expert (token_dispatcher.py:782, several local experts) is what fc1
    saves (the ledger's entry); fc2's output (experts.py:1028) lives until ``routed_experts_compute`` returns,
    while ``combine_preprocess`` sorts it back (moe_layer.py:569, token_dispatcher.py:817); the combine's
    all-to-all (token_dispatcher.py:864) then holds the sorted-back tokens and its own output: ``4 R``
    (``3 R`` with one local expert, no sorts), both the local-token side (permuted tokens, the combine's
    output) and the expert side counted at ``R`` (exact under balanced routing, an upper bound otherwise).
recompute (a policy that drops entries of the last layer or MTP block)
    Megatron-Core re-runs the dropped part at the start of that layer's backward (``CheckpointFunction``,
    ``CheckpointWithoutOutput``): its dropped entries are saved again (``recompute_working_set``) while the
    later entries are released; under ``moe`` recomputation (or full) the re-run MoE allocates its ``3 R``
    again; under full recomputation the MTP block's final RMSNorm (inside the checkpoint) runs its backward
    first: ``torch.nn.RMSNorm``'s composite backward on the CPU allocates five fp32 ``[tokens, h]``
    temporaries (5 times the bytes of its ``norm_input_fp32``).  Beside: the output layer's input gradient
    as in backward_attention.

What is not modelled: allocator block rounding (each entry counts its exact bytes; a block is a multiple of
512 bytes, :mod:`memlib.measure.step`), the loss's 0-dim scalars (a few 512-byte blocks), the router's
tensors that live across steps (they cancel against the step's end); on the TE path: the backward of the
experts and of the permutation (at most a few ``R`` while the layer's own tensors are still held: below
backward_attention wherever the ``s x s`` probabilities exist, not derived for flash/fused attention), the
loss's compiled cross-entropy (``torch.compile``: whether its in-place updates of the fp32 softmax stay in
place), what the all-to-all overlap's schedule nodes keep beyond forward_moe's copies, ETP > 1 and FP8
(the local rule's ``3 R`` is kept there), TE's torch softmax fallback (the local rule is kept there); the recompute moment is the
local rule's upper bound (every dropped entry of the last layer alive at once).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..ledgers.base import Policy, Saved

__all__ = ["Segment", "candidates", "TERMS", "te_fused_softmax", "moe_copies"]

#: the terms a candidate has (in the order the breakdown lists them); ``backward_released`` is negative
TERMS = ("recompute_working_set", "backward_gradients", "cross_entropy_logits", "offload_reload",
         "forward_transients", "backward_released")


@dataclass(frozen=True)
class Segment:
    """One ledger of a chunk in the order the forward runs it: ``entries`` key -> (bytes, entry), in the
    ledger's (forward) order, dropped ones included; ``policy`` the recompute policy it runs under."""

    name: str                 #: embedding, layer.<i>, head.norm, mtp.<j>, head
    kind: str                 #: embedding, dense, moe, mtp, head
    entries: Mapping[str, tuple[int, Saved]]
    policy: Policy

    def kept(self, e: Saved) -> bool:
        return not self.policy.drops(e)

    def find(self, local: str) -> tuple[int, int] | None:
        """(index, bytes) of the entry whose key ends with ``local`` (``attention.softmax_out``...)."""
        for i, (k, (x, e)) in enumerate(self.entries.items()):
            if k == local or k.endswith("." + local):
                return i, x
        return None

    def entry(self, index: int) -> Saved:
        return list(self.entries.values())[index][1]

    def kept_after(self, index: int) -> int:
        return sum(x for i, (x, e) in enumerate(self.entries.values()) if i > index and self.kept(e))

    def dropped_upto(self, index: int | None = None) -> int:
        return sum(x for i, (x, e) in enumerate(self.entries.values())
                   if (index is None or i <= index) and not self.kept(e) and not e.only_when)

    def kept_total(self) -> int:
        return sum(x for x, e in self.entries.values() if self.kept(e))


def te_fused_softmax(batch: int, heads: int, sq: int, sk: int, half: bool) -> bool:
    """Whether Transformer Engine's ``FusedScaleMaskSoftmax`` runs its CUDA kernel for ``[batch, heads, sq,
    sk]`` scores (``is_kernel_available``, attention/dot_product_attention/softmax.py: fp16/bf16 input,
    ``16 < sk < 16384``, ``sk % 8 == 0``, ``sq > 1``, causal ``sq == sk``, ``sq % 4 == 0``, ``batch * heads %
    4 == 0`` and ``sq`` a multiple of the kernel's batches per block); otherwise its torch fallback runs."""
    if not (half and 16 < sk < 16384 and sk % 8 == 0 and sq > 1 and sq == sk and sq % 4 == 0
            and (batch * heads) % 4 == 0):
        return False
    pow2 = 1 << (sk - 1).bit_length()                 # get_batch_per_block
    warp = pow2 if pow2 < 32 else 32
    per_block = (128 // warp) * (2 if pow2 <= 128 else 1)
    return sq % per_block == 0


def moe_copies(*, te: bool, grouped_gemm: bool, dispatcher: str, permute_fusion: bool, fp8: bool, etp: int,
               local_experts: int) -> int:
    """How many tensors the size of the dispatched tokens are alive at forward_moe's moment (see the module
    docstring): 4 for TE's ``GroupedLinear`` experts behind the all-to-all dispatcher with the fused
    permutation and several local experts (3 with one), 3 otherwise (the local rule, measured; not derived
    for the other paths: ETP > 1, FP8's padded copies).  Under the all-to-all overlap
    (``--overlap-moe-expert-parallel-comm``) the same MoELayer steps run as schedule nodes, which keep each
    node's detached inputs and its output until the backward (megatron/core/pipeline_parallel/utils.py:
    ``ScheduleNode._forward``): at least these copies are alive; the rule is kept as a lower bound there."""
    if te and grouped_gemm and dispatcher == "alltoall" and permute_fusion and not fp8 and etp == 1:
        return 4 if local_experts > 1 else 3
    return 3


def _terms(**kw) -> dict[str, int]:
    out = dict.fromkeys(TERMS, 0)
    out.update({k: int(v) for k, v in kw.items()})
    return out


def candidates(segments: Sequence[Segment], *, H: int, L: int, mtp_depth: int, first: bool, last: bool,
               shared_experts: bool, fused_softmax: bool = False,
               moe_copies: int = 3) -> dict[str, dict[str, int]]:
    """The candidate moments of one micro-batch through a chunk (its ``segments`` in forward order), each
    as named terms beyond the micro-batch's held activations (see the module docstring).

    ``fused_softmax``: the ``s x s`` probabilities come from Transformer Engine's unfused attention with its
    fused scale-mask-softmax kernel (backward_attention's TE rule); ``moe_copies``: how many tensors of the
    dispatched tokens' size are alive at forward_moe's moment (3: the local experts with the unfused
    permutation; see :func:`moe_copies` for the TE grouped-GEMM experts with the fused permutation)."""
    out: dict[str, dict[str, int]] = {}
    D = mtp_depth if last else 0
    layers = [i for i, s in enumerate(segments) if s.kind in ("dense", "moe", "mtp")]

    def keeps(seg: Segment, local: str) -> bool:      # a checkpoint keeps that hidden state already
        f = seg.find(local)
        return bool(f) and seg.kept(seg.entry(f[0]))

    chunk_input = 0 if layers and keeps(segments[layers[0]], "attention.layer_input") else H
    mtp_hidden = [s for s in segments if s.kind == "mtp"]
    final_hidden = 0 if not D or (mtp_hidden and keeps(mtp_hidden[0], "mtp.hidden_input")) else H
    out["forward_end"] = _terms(cross_entropy_logits=L, forward_transients=chunk_input + final_hidden) if last \
        else _terms(forward_transients=chunk_input)
    if not layers:
        return out
    grad_hidden = H + ((1 + D) * H if D else (0 if last else H))

    def tail(i: int) -> int:
        return sum(s.kept_total() for s in segments[i + 1:])

    # backward of the first attention (the last layer with the s x s probabilities)
    att = [i for i in layers if segments[i].find("attention.softmax_out")]
    if att:
        i = att[-1]
        seg = segments[i]
        j, P = seg.find("attention.softmax_out")
        pe = seg.entry(j)
        vi = seg.find("attention.v")
        V, ve = (vi[1], seg.entry(vi[0])) if vi else (0, None)
        ci = seg.find("attention.context")
        C = ci[1] if ci else 0
        core = "core_attn" in seg.policy.modules and not seg.policy.full
        if fused_softmax:
            # TE: the context bmm's backward (dP, dV beside dC), the probabilities and v still saved; under
            # core_attn the checkpoint's recomputed output and probabilities are alive too
            released = tail(i) + seg.kept_after(j)
            grads = P + V + C + grad_hidden
            working = C + P if core else seg.dropped_upto(j)
        else:
            released = tail(i) + seg.kept_after(j) + (P if seg.kept(pe) else 0)
            grads = 4 * P + V + grad_hidden
            if core:    # CheckpointFunction.backward holds q, k, v, its recomputed output and that one's gradient
                working = C
                grads += C
            else:       # the softmax's and the bmm's backward have run: the probabilities and v are freed
                released += V if ve is not None and seg.kept(ve) else 0
                working = (seg.dropped_upto(j) - (0 if seg.kept(pe) else P)
                           - (V if ve is not None and not seg.kept(ve) else 0))
        out["backward_attention"] = _terms(backward_released=-released, backward_gradients=grads,
                                           recompute_working_set=working)
    # forward of the last MoE layer's experts
    moe = [i for i in layers if segments[i].find("moe.routed.fc1_input")]
    if moe:
        i = moe[-1]
        seg = segments[i]
        R = seg.find("moe.routed.fc1_input")[1]
        last_moe = max(n for n, k in enumerate(seg.entries) if k.startswith(("moe.", "mtp.moe.")))
        if seg.kind == "mtp":
            hidden = 5 + shared_experts
        else:
            hidden = 2 + (i != layers[0]) + shared_experts
        out["forward_moe"] = _terms(backward_released=-(tail(i) + seg.kept_after(last_moe)),
                                    forward_transients=moe_copies * R + hidden * H)
    # the recomputation of the last layer (or MTP block) at the start of its backward
    i = layers[-1]
    seg = segments[i]
    working = seg.dropped_upto()
    if working:
        last_dropped = max(n for n, (x, e) in enumerate(seg.entries.values()) if not seg.kept(e) and not e.only_when)
        fc1 = seg.find("moe.routed.fc1_input")
        remoe = 3 * fc1[1] if fc1 and not seg.kept(seg.entry(fc1[0])) else 0
        norm = seg.find("head.norm_input_fp32")
        renorm = 5 * norm[1] if norm and not seg.kept(seg.entry(norm[0])) else 0
        out["recompute"] = _terms(backward_released=-(tail(i) + seg.kept_after(last_dropped)),
                                  recompute_working_set=working, forward_transients=remoe,
                                  backward_gradients=renorm + grad_hidden)
    return out
