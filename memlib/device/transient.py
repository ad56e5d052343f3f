"""What is alive beyond the held activations while a chunk computes: the candidate moments of a micro-batch.

:mod:`memlib.device.peak` adds to the activations the schedule holds the *transient* bytes of a chunk
computing.  This module finds them from the chunk's ledgers (every saved tensor, in the order the forward
saves it) and from the order of the backward pass, as a few candidate moments of one micro-batch
(:func:`candidates`); each is the bytes alive then minus that micro-batch's held activations, as named
terms.  The largest candidate is the chunk's transient.  Integers only; every rule is read from the code
that runs and checked against :mod:`memlib.measure.step` on the CPU; the Transformer Engine rules are read
from its sources (TransformerEngine v2.18, Megatron-LM d98e8a64dd), not measured.

The derivation, with its sources (file:line), is in ``docs/derivations/transient.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..ledgers.base import Policy, Saved

__all__ = ["Segment", "candidates", "TERMS", "FORWARD_CANDIDATES", "te_fused_softmax", "moe_copies", "FORWARD_LOSSES", "loss_kind",
           "embedding_backward_bytes"]

#: the terms a candidate has (in the order the breakdown lists them); ``backward_released`` is negative
#: the candidate moments that run a forward (the others run a backward)
FORWARD_CANDIDATES = frozenset({"forward_end", "forward_moe", "forward_attention"})

TERMS = ("recompute_working_set", "backward_gradients", "cross_entropy_logits", "cross_entropy_workspace",
         "offload_reload", "forward_transients", "batch_attention_mask", "backward_released")


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
        for i, (k, (x, _)) in enumerate(self.entries.items()):
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


#: the bf16 logits ``L`` the loss region holds at the end of the forward beyond the loss's saved tensors: the logits
#: themselves until ``GPTModel.forward`` returns (the vocab-parallel cross-entropy, unfused or native, keeps an
#: fp32 softmax of them instead), none with Transformer Engine's loss (2.5 to 2.17: it overwrites the logits with
#: their gradient and keeps them, transformer_engine/pytorch/cross_entropy.py:53,62 at v2.16, so they are its
#: saved tensor, the ledger's ``loss_grad``, already).  The loss's own backward allocates nothing larger than the
#: moment after it for the unfused and TE losses (the unfused one casts its in-place fp32 gradient to one bf16 L;
#: TE scales the kept logits in place); the native fused loss compiled by Inductor adds its fp32 buffer
#: (``cross_entropy_workspace``, 2 L) to that moment, forward and backward alike
FORWARD_LOSSES = {"unfused": 1, "native": 1, "te": 0}


def loss_kind(fusion: bool, impl: str) -> str:
    """The :data:`FORWARD_LOSSES` entry of ``--cross-entropy-loss-fusion`` and ``--cross-entropy-fusion-impl``."""
    return "unfused" if not fusion else ("te" if impl == "te" else "native")


def embedding_backward_bytes(*, tokens: int, hidden: int, vocab: int, weight_bytes: int, act_bytes: int,
                             deterministic: bool) -> int:
    """What the word embedding's backward allocates on the first stage: the incoming gradient made contiguous
    (it arrives as a transposed view of the ``[s, b, h]`` gradient, and with TP > 1 through the masked rows'
    ``index_put`` backward: two full ``[b s/CP, h]`` tensors alive), the dense ``[v/TP, h]`` gradient in the
    weight's dtype, and (PyTorch aten/src/ATen/native/cuda/Embedding.cu ``embedding_dense_backward_cuda``,
    EmbeddingBackwardKernel.cu ``embedding_backward_cuda_kernel``) past 3,072 indices the radix sort's two int64
    index vectors, four more of ``numel`` entries and the fp32 ``[numel, h]`` partial sums; under
    ``--deterministic-mode`` (``weight[masked_input]``) ``index_put_`` with accumulation: the sort's two vectors,
    no partial sums.  ``tokens`` = b s/CP indices."""
    dense = vocab * hidden * weight_bytes
    grads = 2 * tokens * hidden * act_bytes
    if deterministic:
        return dense + grads + 2 * 8 * tokens
    if tokens <= 3072:
        return dense + grads
    return dense + grads + 6 * 8 * tokens + 4 * tokens * hidden


def _loss_backward(segments: Sequence[Segment], *, L: int, head_grad: int, head_scatter: int,
                   head_wgrad: int) -> dict[str, dict[str, int]]:
    """The output layer's backward, right after the loss's: the loss's saved tensors are freed, the logits' bf16
    gradient ``L`` lives (for TE the kept logits themselves) while the output layer computes its input gradient
    ``[s/CP, b, h]`` (megatron/core/tensor_parallel/layers.py:683), reduce-scatters it with sequence parallelism
    into a new ``[s/(CP TP), b, h]`` (:703-708) and, without gradient-accumulation fusion, computes its dense
    ``[v/TP, h]`` weight gradient (``grad_output.t().matmul(total_input)``)."""
    head = [s for s in segments if s.kind == "head" and s.find("head.input")]
    if not head:
        return {}
    seg = head[-1]
    saved = sum(x for k, (x, e) in seg.entries.items() if k.endswith((".loss_softmax", ".loss_grad")))
    return {"backward_output_layer": _terms(backward_released=-saved,
                                            backward_gradients=L + head_grad + head_scatter + head_wgrad)}


def candidates(segments: Sequence[Segment], *, H: int, L: int, mtp_depth: int, first: bool, last: bool,
               shared_experts: bool, fused_softmax: bool = False,
               moe_copies: int = 3, loss: str = "unfused", head_grad: int = 0, head_scatter: int = 0,
               head_wgrad: int = 0, embedding_backward: int = 0, ce_workspace: int = 0,
               mtp_logits: int = 0, batch_mask: int = 0) -> dict[str, dict[str, int]]:
    """The candidate moments of one micro-batch through a chunk (its ``segments`` in forward order), each
    as named terms beyond the micro-batch's held activations (see the module docstring).

    ``mtp_logits``: the last MTP head's bf16 logits where the Megatron-LM version keeps them referenced through
    the main head's loss (:attr:`memlib.config.versions.MegatronVersion.mtp_logits_through_main_loss`), else 0.

    ``ce_workspace``: the fp32 buffer of the logits' size that Inductor's compiled native cross-entropy
    allocates beside the saved softmax on the loss chunk (0 elsewhere): in the forward ``exp(x - max)``
    before it is written back into the softmax, in the backward a clone of the softmax; both moments hold
    the same bytes (``forward_end``).

    ``fused_softmax``: the ``s x s`` probabilities come from Transformer Engine's unfused attention with its
    fused scale-mask-softmax kernel (backward_attention's TE rule); ``moe_copies``: how many tensors of the
    dispatched tokens' size are alive at forward_moe's moment (3: the local experts with the unfused
    permutation; see :func:`moe_copies` for the TE grouped-GEMM experts with the fused permutation).

    ``batch_mask``: the micro-batch's attention mask where the data loader builds it, on a chunk that reads the
    batch (the first and the last pipeline stage): ``forward_step`` (pretrain_gpt.py) holds the batch get_batch
    returned until the model's forward returns, so the mask is alive at ``forward_end`` even where no autograd node
    keeps it; counted there unless a segment's ledger keeps it already (``embedding.attention_mask``).

    ``loss`` (the chunk with the loss): how the cross-entropy keeps the logits (:data:`FORWARD_LOSSES`);
    ``head_grad``, ``head_scatter``, ``head_wgrad``: the output layer's input gradient ``[s/CP, b, h]``, its
    sequence-parallel reduce-scatter output (0 without SP) and its dense weight gradient (0 with gradient-accumulation
    fusion); ``embedding_backward`` (the chunk with the embedding): the bytes the embedding's backward allocates
    (:func:`embedding_backward_bytes`)."""
    if loss not in FORWARD_LOSSES:
        raise ValueError(f"loss={loss!r} must be one of {', '.join(FORWARD_LOSSES)}")   # pragma: no cover
    out: dict[str, dict[str, int]] = {}
    D = mtp_depth if last else 0
    layers = [i for i, s in enumerate(segments) if s.kind in ("dense", "moe", "mtp")]

    def keeps(seg: Segment, *local: str) -> bool:     # a kept entry (a checkpoint, a norm) is that tensor already
        for name in local:
            f = seg.find(name)
            if f and seg.kept(seg.entry(f[0])):
                return True
        return False

    # the chunk's input is its first layer's input, which a checkpoint or a norm that keeps its input holds
    chunk_input = 0 if layers and keeps(segments[layers[0]], "attention.layer_input", "attention.norm_input") else H
    mtp_hidden = [s for s in segments if s.kind == "mtp"]
    final_hidden = 0 if not D or (mtp_hidden and keeps(mtp_hidden[0], "mtp.hidden_input", "mtp.hnorm.norm_input",
                                                       "mtp.hnorm_input")) else H
    # TE's loss overwrites the logits with their gradient and keeps them: they are the ledger's loss_grad already
    mask_kept = any(seg.find("embedding.attention_mask") and seg.kept(seg.entry(seg.find("embedding.attention_mask")[0]))
                    for seg in segments)
    mask = 0 if mask_kept else batch_mask
    out["forward_end"] = _terms(cross_entropy_logits=FORWARD_LOSSES[loss] * L + (mtp_logits if D else 0),
                                cross_entropy_workspace=ce_workspace,
                                forward_transients=chunk_input + final_hidden, batch_attention_mask=mask) if last \
        else _terms(forward_transients=chunk_input, batch_attention_mask=mask)
    if last and head_grad:
        out.update(_loss_backward(segments, head_grad=head_grad, head_scatter=head_scatter, head_wgrad=head_wgrad,
                                  L=L))
    if first and embedding_backward:
        emb = [s for s in segments if s.kind == "embedding"]
        others = sum(s.kept_total() for s in segments if s.kind != "embedding")
        if emb:
            out["backward_embedding"] = _terms(backward_released=-others, backward_gradients=embedding_backward)
    if not layers:
        return out
    grad_hidden = H + ((1 + D) * H if D else (0 if last else H))

    # what every segment after i keeps (the later layers', the heads' and losses' entries), as suffix sums
    after = [0] * (len(segments) + 1)
    for n in range(len(segments) - 1, -1, -1):
        after[n] = after[n + 1] + segments[n].kept_total()

    def tail(i: int) -> int:
        return after[i + 1]

    def last_of_each(indices: Sequence[int]) -> list[int]:
        """The last of ``indices`` of each distinct (ledger, policy), latest first: an earlier layer of the same
        ledger and policy has the same moment with more released after it (the later layers' entries).  Under
        full-block:K the last recomputed layer is not the chunk's last: its moments are candidates too."""
        seen, out = set(), []
        for i in reversed(indices):
            key = (id(segments[i].entries), segments[i].policy)
            if key not in seen:
                seen.add(key)
                out.append(i)
        return out

    def worst(cands: list[dict[str, int]]) -> dict[str, int]:
        """The candidate with the most bytes (the first such: the latest layer)."""
        return max(cands, key=lambda c: sum(c.values()))

    att = [i for i in layers if segments[i].find("attention.softmax_out")]
    if att and fused_softmax:
        # forward of the last attention with the s x s probabilities, Transformer Engine's unfused attention: its
        # raw scores (matmul_result, [b n_h, s, s]) stay referenced until the function returns, beside the
        # probabilities, while P V writes its [b n_h, s, d_v] output and .permute().contiguous() copies it
        # into the context linear_proj keeps (attention/dot_product_attention/backends.py
        # UnfusedDotProductAttention._forward)
        i = att[-1]
        seg = segments[i]
        P = seg.find("attention.softmax_out")[1]
        ci = seg.find("attention.context")
        if ci and seg.kept(seg.entry(ci[0])):
            out["forward_attention"] = _terms(backward_released=-(tail(i) + seg.kept_after(ci[0]) + ci[1]),
                                              forward_transients=P + 2 * ci[1])

    # backward of the first attention of a layer with the s x s probabilities
    def backward_attention(i: int) -> dict[str, int]:
        seg = segments[i]
        j, P = seg.find("attention.softmax_out")
        pe = seg.entry(j)
        vi = seg.find("attention.v") or seg.find("attention.v_repeated")   # GQA: v repeated to every head
        V, ve = (vi[1], seg.entry(vi[0])) if vi else (0, None)
        ci = seg.find("attention.context")
        C = ci[1] if ci else 0
        # grouped-query attention repeats k to every head inside the attention: under core_attn the repeat is
        # re-run, and the repeated k stays saved by Q K^T until that bmm's backward, after this moment
        ki = seg.find("attention.k_repeated")
        K = ki[1] if ki and not seg.kept(seg.entry(ki[0])) else 0
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
                working = C + K
                grads += C
            else:       # the softmax's and the bmm's backward have run: the probabilities and v are freed
                released += V if ve is not None and seg.kept(ve) else 0
                if seg.policy.full:   # the layer's CheckpointFunction.backward holds its output's gradient
                    grads += H
                working = (seg.dropped_upto(j) - (0 if seg.kept(pe) else P)
                           - (V if ve is not None and not seg.kept(ve) else 0))
        return _terms(backward_released=-released, backward_gradients=grads, recompute_working_set=working)

    if att:
        out["backward_attention"] = worst([backward_attention(i) for i in last_of_each(att)])

    # backward of a layer's dense MLP, at its activation's backward (the first backward op of a layer that keeps
    # its activation's input and output), for the last layer of each distinct ledger and policy
    def backward_mlp(i: int) -> dict[str, int] | None:
        seg = segments[i]
        act = seg.find("dense_ffn.act_output")
        act_in = seg.find("dense_ffn.swiglu_input") or seg.find("dense_ffn.gelu_input")
        if not (act and act_in and seg.kept(seg.entry(act[0])) and seg.kept(seg.entry(act_in[0]))):
            return None
        j, A = act
        return _terms(backward_released=-(tail(i) + seg.kept_after(j) + A), backward_gradients=H + A + act_in[1])

    mlp = [c for c in (backward_mlp(i) for i in last_of_each(layers)) if c is not None]
    if mlp:
        out["backward_mlp"] = worst(mlp)

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
    # the recomputation of a layer (or MTP block) at the start of its backward
    def recompute(i: int) -> dict[str, int] | None:
        seg = segments[i]
        working = seg.dropped_upto()
        if not working:
            return None
        last_dropped = max(n for n, (x, e) in enumerate(seg.entries.values()) if not seg.kept(e) and not e.only_when)
        fc1 = seg.find("moe.routed.fc1_input")
        remoe = 3 * fc1[1] if fc1 and not seg.kept(seg.entry(fc1[0])) else 0
        if remoe and seg.kind != "mtp":   # the re-run forward's frames hold residual-stream tensors, as
            # forward_moe's do: the shared experts' output, and under full recomputation the residual after the
            # attention (the checkpoint's input is a kept entry already); measured for decoder layers
            remoe += (shared_experts + (1 if seg.policy.full else 0)) * H
        norm = seg.find("head.norm_input_fp32")
        renorm = 5 * norm[1] if norm and not seg.kept(seg.entry(norm[0])) else 0
        return _terms(backward_released=-(tail(i) + seg.kept_after(last_dropped)),
                      recompute_working_set=working, forward_transients=remoe,
                      backward_gradients=renorm + grad_hidden)

    rec = [c for c in (recompute(i) for i in last_of_each(layers)) if c is not None]
    if rec:
        out["recompute"] = worst(rec)
    return out
