"""memlib.device.transient: the candidate moments of a micro-batch, hand-worked on made-up chunks (whole
numbers of bytes per entry), for the cases tests/device/test_peak_cpu.py's measured steps do not reach: the ledger
walk itself, a chunk without layers, MTP on the last chunk, a chunk that is not the last, the experts' copies."""
import pytest
import sympy as sp

from memlib.device.transient import TERMS, Segment, candidates, moe_copies
from memlib.ledgers.base import Policy, saved

NONE, CORE, FULL = Policy("none"), Policy("core", frozenset({"core_attn"})), Policy("full", full=True)


def seg(name, kind, entries, policy=NONE) -> Segment:
    return Segment(name, kind, {k: (x, saved(k, k, sp.Integer(x), **kw)) for k, x, kw in entries}, policy)


#: one MoE layer: 10 + 10 (a checkpoint's input) + 7 + 100 + 6 + 10 + 20 + 30 bytes
LAYER = [("attention.norm_output", 10, {}), ("attention.layer_input", 10, dict(only_when={"full"}, keep_full=True)),
         ("attention.v", 7, {}), ("attention.softmax_out", 100, dict(modules={"core_attn"})),
         ("attention.context", 6, {}), ("moe.norm_output", 10, {}), ("moe.routed.fc1_input", 20, {}),
         ("moe.routed.act_output", 30, {})]
HEAD = seg("head", "head", [("head.loss_softmax", 50, dict(keep_full=True))])


def terms(**kw):
    return {**dict.fromkeys(TERMS, 0), **kw}


def test_the_ledger_walk():
    toy = seg("layer.0", "moe", [("a", 10, dict(modules={"core_attn"})), ("b", 20, {}),
                                 ("c", 30, dict(only_when={"full"}, keep_full=True))], CORE)
    # core_attn drops a; c is kept only by a full checkpoint
    assert [toy.kept(toy.entry(i)) for i in range(3)] == [False, True, False]
    assert (toy.kept_total(), toy.kept_after(0), toy.kept_after(1), toy.dropped_upto(), toy.dropped_upto(0)) == \
        (20, 20, 0, 10, 10)
    assert toy.find("b") == (1, 20) and toy.find("x") is None
    full = seg("layer.0", "moe", [("layer.a", 10, {}), ("layer.b", 20, {}),
                                  ("layer.c", 30, dict(only_when={"full"}, keep_full=True))], FULL)
    assert full.kept_total() == 30 and full.dropped_upto() == 30 and full.find("a") == (0, 10)


def test_a_chunk_without_layers():
    emb = seg("embedding", "embedding", [("embedding.token_ids", 4, dict(keep_full=True))])
    assert candidates([emb], H=10, L=0, mtp_depth=0, first=True, last=False, shared_experts=False) == {
        "forward_end": terms(forward_transients=10)}
    c = candidates([emb, HEAD], H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=False,
                   ce_workspace=5)
    assert c == {"forward_end": terms(cross_entropy_logits=25, cross_entropy_workspace=5, forward_transients=10)}


def test_mtp_on_the_last_chunk():
    mtp = seg("mtp.0", "mtp", [("mtp.enorm_output", 10, {}), ("mtp.hnorm_output", 10, {})])
    c = candidates([seg("layer.0", "moe", LAYER), mtp, HEAD], H=10, L=25, mtp_depth=1, first=True, last=True,
                   shared_experts=True)
    # the chunk's input and the final hidden state the MTP block reads (nothing of the block keeps it)
    assert c["forward_end"] == terms(cross_entropy_logits=25, forward_transients=20)
    # the residual gradient of the layer, plus (1 + D) H received from the main and the MTP losses
    att = c["backward_attention"]
    assert att["backward_gradients"] == 4 * 100 + 7 + 30
    # released: the MTP block's 20 and the head's 50, after the probabilities 6 + 10 + 20 + 30, the probabilities
    # and v themselves
    assert att["backward_released"] == -(70 + 66 + 100 + 7)
    # the experts of the first layer: three copies of the tokens, the layer input, its residual and the shared
    # experts' output (the chunk's input is that layer's input)
    assert c["forward_moe"] == terms(forward_transients=3 * 20 + 3 * 10, backward_released=-70)
    assert "recompute" not in c                      # nothing recomputed
    # an MTP block that keeps its hidden input holds the final hidden state already
    kept = seg("mtp.0", "mtp", [("mtp.hidden_input", 10, dict(keep_full=True)), ("mtp.enorm_output", 10, {})])
    c = candidates([seg("layer.0", "moe", LAYER), kept, HEAD], H=10, L=25, mtp_depth=1, first=True, last=True,
                   shared_experts=False)
    assert c["forward_end"]["forward_transients"] == 10
    assert c["forward_moe"]["forward_transients"] == 3 * 20 + 2 * 10


def test_a_middle_chunk_under_full_recomputation():
    c = candidates([seg("layer.4", "moe", LAYER, FULL)], H=10, L=0, mtp_depth=0, first=False, last=False,
                   shared_experts=True)
    # the checkpoint keeps the chunk's input
    assert c["forward_end"] == terms()
    # everything but the checkpoint's input is recomputed (10 + 7 + 100 + 6 + 10 + 20 + 30); the experts run again
    # (3 R) and the re-run's frames hold the shared experts' output and the residual after the attention (2 H); the
    # gradient of the layer's output arrives from the next stage beside the residual's (2 H)
    assert c["recompute"] == terms(recompute_working_set=183, forward_transients=60 + 20, backward_gradients=20)
    # the attention's backward: of what was recomputed before the probabilities, the norm's output is alive (the
    # probabilities and v have been consumed)
    assert c["backward_attention"]["recompute_working_set"] == 10
    # the probabilities' four s x s tensors, v's gradient, 2 H as above, and the output's gradient that the
    # layer's checkpoint holds through its backward (H)
    assert c["backward_attention"]["backward_gradients"] == 4 * 100 + 7 + 20 + 10


@pytest.mark.parametrize("kw, copies", [
    (dict(), 4), (dict(local_experts=1), 3), (dict(fp8=True), 3), (dict(etp=2), 3), (dict(dispatcher="flex"), 3),
    (dict(grouped_gemm=False), 3), (dict(permute_fusion=False), 3), (dict(te=False), 3),
])
def test_the_dispatched_tokens_copies(kw, copies):
    base = dict(te=True, grouped_gemm=True, dispatcher="alltoall", permute_fusion=True, fp8=False, etp=1,
                local_experts=8)
    assert moe_copies(**{**base, **kw}) == copies


def test_the_batch_mask_once():
    """The data loader's attention mask is alive at the end of the forward (forward_step holds the batch), counted
    there as its own term, unless a ledger keeps it already (the local attention's masked_fill, a checkpoint)."""
    emb = seg("embedding", "embedding", [("embedding.token_ids", 4, dict(keep_full=True))])
    c = candidates([emb, HEAD], H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=False, batch_mask=64)
    assert c["forward_end"] == terms(cross_entropy_logits=25, forward_transients=10, batch_attention_mask=64)
    kept = seg("embedding", "embedding", [("embedding.attention_mask", 64, dict(keep_full=True))])
    c = candidates([kept, HEAD], H=10, L=25, mtp_depth=0, first=True, last=True, shared_experts=False, batch_mask=64)
    assert c["forward_end"]["batch_attention_mask"] == 0
    # a stage in the middle reads no batch: estimate passes 0 there; a first stage's chunk counts it too
    c = candidates([emb], H=10, L=0, mtp_depth=0, first=True, last=False, shared_experts=False, batch_mask=64)
    assert c["forward_end"] == terms(forward_transients=10, batch_attention_mask=64)
