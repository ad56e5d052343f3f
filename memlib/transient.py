"""What is alive beyond the held activations while a chunk computes: the candidate moments of a micro-batch.

:mod:`memlib.peak` adds to the activations the schedule holds the *transient* bytes of a chunk computing.
This module finds them from the chunk's ledgers (every saved tensor, in the order the forward saves it,
:mod:`memlib.ledgers_megatron`) and from the order of the backward pass, as a few candidate moments of one
micro-batch; each is the bytes alive then minus that micro-batch's held activations, as named terms (the
``backward_released`` term is negative: what the backward has freed by then).  The largest candidate is
the chunk's transient.  Integers only; every rule is read from the code that runs, and checked against
:mod:`memlib.measure_peak` (megatron-core 0.19.2, ``transformer_impl=local`` on the CPU,
``tests/test_peak_cpu.py``).

``H`` is one residual-stream tensor ``[s/TP (SP), b, h]`` in the activation dtype (the bytes of the ledger's
``attention.norm_output``), ``L`` the bf16 logits ``[s/CP, b, v/TP]`` of one output head, ``D`` the MTP depth
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
forward_moe (a MoE layer with the unfused permutation and the local experts, megatron's defaults)
    The last MoE layer (or MTP block) of the chunk, when ``SequentialMLP`` concatenates its experts' outputs
    (moe/experts.py): the permuted tokens (``moe_utils.permute``'s ``index_select``, held by the token
    dispatcher until the un-permute), every expert's fc2 output and their concatenation, each the size of
    the dispatched tokens ``R`` (the bytes of ``moe.routed.fc1_input``): ``3 R``; and the residual-stream
    tensors the Python frames hold: the chunk's input, the layer's input (unless it is the chunk's first
    layer), the residual after the attention, the shared experts' output; in the MTP block the decoder's
    final hidden state, the MTP embedding and the layer's input (the ``eh_proj`` output) instead of the
    layer's input.  Not yet saved: every kept entry after that layer.
recompute (a policy that drops entries of the last layer or MTP block)
    Megatron-Core re-runs the dropped part at the start of that layer's backward (``CheckpointFunction``,
    ``CheckpointWithoutOutput``): its dropped entries are saved again (``recompute_working_set``) while the
    later entries are released; under ``moe`` recomputation (or full) the re-run MoE allocates its ``3 R``
    again; under full recomputation the MTP block's final RMSNorm (inside the checkpoint) runs its backward
    first: ``torch.nn.RMSNorm``'s composite backward on the CPU allocates five fp32 ``[tokens, h]``
    temporaries (5 times the bytes of its ``norm_input_fp32``).  Beside: the output layer's input gradient
    as in backward_attention.

What is not modelled: allocator block rounding (each entry counts its exact bytes; a block is a multiple of
512 bytes, :mod:`memlib.measure_peak`), the loss's 0-dim scalars (a few 512-byte blocks), the router's
tensors that live across steps (they cancel against the step's end), the TE path's own temporaries (its
ledgers keep no ``s x s`` tensor and no ``norm_input_fp32``: backward_attention and the norm rule do not
apply there; forward_end, forward_moe and the release order do).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .activations import Policy, Saved

__all__ = ["Segment", "candidates", "TERMS"]

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


def _terms(**kw) -> dict[str, int]:
    out = dict.fromkeys(TERMS, 0)
    out.update({k: int(v) for k, v in kw.items()})
    return out


def candidates(segments: Sequence[Segment], *, H: int, L: int, mtp_depth: int, first: bool, last: bool,
               shared_experts: bool) -> dict[str, dict[str, int]]:
    """The candidate moments of one micro-batch through a chunk (its ``segments`` in forward order), each
    as named terms beyond the micro-batch's held activations (see the module docstring)."""
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
        released = tail(i) + seg.kept_after(j) + (P if seg.kept(pe) else 0)
        grads = 4 * P + V + grad_hidden
        if core:        # CheckpointFunction.backward holds q, k, v, its recomputed output and that one's gradient
            working = C
            grads += C
        else:           # the softmax's and the bmm's backward have run: the probabilities and v are freed
            released += V if ve is not None and seg.kept(ve) else 0
            working = seg.dropped_upto(j) - (0 if seg.kept(pe) else P) - (V if ve is not None and not seg.kept(ve) else 0)
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
                                    forward_transients=3 * R + hidden * H)
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
