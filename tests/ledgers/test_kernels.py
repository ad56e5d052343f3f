"""The megatron profile's kernel choices: their types, their rules, and what each one changes in the
ledger, by hand on a tiny model (no torch needed; tests/measure/test_measure_megatron.py holds the local path
against megatron-core itself)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sympy as sp

from memlib.ledgers.base import Policy, ledger_bytes, parse_policy, saved
from memlib.cli import main
from memlib.config import PAPER_TRAINING, ConfigError, TrainingConfig
from memlib.config.strategies import AttnBackend, CrossEntropyFusionImpl, LoadBalancing, TransformerImpl
from memlib.ledgers import act_profile
from memlib.device.estimate import estimate
from memlib.model.params import values
from memlib.model.states import recipe

import tiny as T

b, s = sp.Symbol("b", integer=True, positive=True), sp.Symbol("s", integer=True, positive=True)


def one_device(**kw):
    return TrainingConfig(**{**dict(dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", micro_batch=2, seq_len=8,
                                    num_microbatches=1), **kw})


def layer_bytes(train, kind="moe", model=None, policy=None):
    from memlib.ledgers.base import training_values
    from memlib.model.partition import parallel_values

    m = model or T.tiny()
    ap = act_profile("megatron", train)
    vals = {**values(m), **parallel_values(train), **training_values(train)}
    return ledger_bytes(ap.layer(m, kind), train, recipe(train.precision), policy).evaluate(vals)


# ------------------------------------------------------------------------------------------------
# types and rules
# ------------------------------------------------------------------------------------------------
def test_defaults_are_megatron_lm_command_line_defaults():
    t = TrainingConfig()
    assert t.transformer_impl is TransformerImpl.TRANSFORMER_ENGINE and t.attention_backend is AttnBackend.AUTO
    assert t.attention_softmax_in_fp32 is False and t.bias_swiglu_fusion is True
    assert t.cross_entropy_loss_fusion is False and t.cross_entropy_fusion_impl is CrossEntropyFusionImpl.NATIVE
    assert t.moe_aux_loss is LoadBalancing.SEQ_AUX_LOSS
    assert TrainingConfig(transformer_impl="local").transformer_impl is TransformerImpl.LOCAL
    assert TrainingConfig().values()["attention_backend"] == "auto"


@pytest.mark.parametrize("kw,message", [
    (dict(transformer_impl="te"), "transformer_impl='te' must be one of transformer_engine, local"),
    (dict(attention_backend="sdpa"), "attention_backend='sdpa' must be one of auto, flash, fused, unfused, local"),
    (dict(cross_entropy_fusion_impl="x"), "cross_entropy_fusion_impl='x' must be one of native, te"),
    (dict(moe_aux_loss="z"), "moe_aux_loss='z' must be one of seq_aux_loss, aux_loss, none"),
    (dict(bias_swiglu_fusion=1), "bias_swiglu_fusion=1 must be true or false"),
    (dict(transformer_impl="local", attention_backend="flash"), "attention_backend=flash needs transformer_impl"),
    (dict(transformer_impl="local", tp=2), "sp=True with transformer_impl=local and tp=2"),
    (dict(transformer_impl="local", cp=2), "cp=2 with transformer_impl=local"),
])
def test_bad_kernel_choices_are_one_line(kw, message):
    with pytest.raises(ConfigError) as exc:
        TrainingConfig(**kw)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_kernel_choices_belong_to_the_megatron_profile():
    with pytest.raises(ConfigError, match="transformer_impl=local is a kernel choice of profile=megatron"):
        estimate("deepseek-v3", PAPER_TRAINING.with_(transformer_impl="local", sp=False))
    with pytest.raises(ConfigError, match="FP8 needs Transformer Engine"):
        estimate(T.tiny(), one_device(transformer_impl="local", precision="deepseek-v3"))
    with pytest.raises(ConfigError, match="moe_act only in the grouped-GEMM experts"):
        estimate(T.tiny(), one_device(transformer_impl="local", recompute="moe_act"))


def test_explicit_defaults_change_no_number():
    base = estimate("deepseek-v3", PAPER_TRAINING.with_(profile="megatron")).to_dict()
    explicit = estimate("deepseek-v3", PAPER_TRAINING.with_(
        profile="megatron", transformer_impl="transformer_engine", attention_backend="auto",
        attention_softmax_in_fp32=False, bias_swiglu_fusion=True, cross_entropy_loss_fusion=False,
        cross_entropy_fusion_impl="native", moe_aux_loss="seq_aux_loss")).to_dict()
    assert base == explicit
    # the flags only matter where they apply: the TE default keeps no s^2 tensor, so fp32 softmax changes nothing
    assert estimate("deepseek-v3", PAPER_TRAINING.with_(profile="megatron", attention_softmax_in_fp32=True)).to_dict()[
        "stages"] == base["stages"]


# ------------------------------------------------------------------------------------------------
# what each choice keeps, by hand (tiny: h 8, h_F 16, h_E 4, n_h 2, d_h 3, d_h^R 2, d_v 5, N 4, N_r 2, N_s 1)
# ------------------------------------------------------------------------------------------------
def test_attention_backends():
    bs, n, ss = 2 * 8, 2, 8 * 8
    flash = layer_bytes(one_device())
    assert flash["attention.softmax_lse"] == 4 * 2 * n * 8 and "attention.softmax_out" not in flash
    for kw in (dict(attention_backend="unfused"), dict(attention_backend="local"), dict(transformer_impl="local")):
        x = layer_bytes(one_device(**kw))
        assert x["attention.softmax_out"] == 2 * 2 * n * ss and "attention.softmax_lse" not in x, kw
    # --attention-softmax-in-fp32 adds an fp32 copy in Megatron-Core's own attention only (TE's unfused
    # kernel keeps its bf16 results), and never in fp32 training
    assert layer_bytes(one_device(transformer_impl="local", attention_softmax_in_fp32=True))[
        "attention.softmax_fp32"] == 4 * 2 * n * ss
    assert "attention.softmax_fp32" not in layer_bytes(one_device(attention_backend="unfused",
                                                                  attention_softmax_in_fp32=True))
    assert "attention.softmax_fp32" not in layer_bytes(one_device(transformer_impl="local", precision="fp32",
                                                                  attention_softmax_in_fp32=True))
    assert bs


def test_local_rmsnorm_keeps_fp32_copies_on_the_cpu():
    te = layer_bytes(one_device(), "dense")
    loc = layer_bytes(one_device(transformer_impl="local", runtime="cpu"), "dense")
    tokens, h = 2 * 8, 8
    assert te["attention.norm_input"] == 2 * tokens * h and te["attention.norm_rstd"] == 4 * tokens
    assert (loc["attention.norm_input_fp32"], loc["attention.norm_rstd"], loc["attention.norm_normalized"]) == (
        4 * tokens * h, 4 * tokens, 4 * tokens * h)
    # in fp32 training the kv norm keeps its input, a view of the [c^KV; k^R] down-projection output
    fp32 = layer_bytes(one_device(transformer_impl="local", precision="fp32", runtime="cpu"), "dense")
    assert fp32["attention.c_kv_fp32"] == 4 * tokens * (4 + 2) and loc["attention.c_kv_fp32"] == 4 * tokens * 4


def test_local_rmsnorm_on_a_gpu_keeps_its_input_and_rstd():
    """torch's fused RMSNorm (the GPU): the input itself and one fp32 1/rms per token, as TE's; the kv norm's
    input is a view of the [c^KV; k^R] down-projection output, so that storage stays whole (d_c 4, d_h^R 2)."""
    gpu = layer_bytes(one_device(transformer_impl="local"), "dense")
    tokens, h = 2 * 8, 8
    assert (gpu["attention.norm_input"], gpu["attention.norm_rstd"]) == (2 * tokens * h, 4 * tokens)
    assert "attention.norm_input_fp32" not in gpu and "attention.norm_normalized" not in gpu
    assert gpu["attention.c_kv"] == 2 * tokens * (4 + 2) and gpu["attention.c_kv_rstd"] == 4 * tokens
    assert not any(k.endswith("_normalized") or k.endswith("_fp32") for k in gpu)
    # the layer's checkpoint under full recomputation keeps that same input: no second copy (the CPU's
    # composite norm keeps an upcast copy, so there the checkpoint's input is a tensor of its own)
    full = parse_policy("full")
    assert "attention.layer_input" not in layer_bytes(one_device(transformer_impl="local", recompute="full"), "dense",
                                                      policy=full)
    assert "attention.layer_input" in layer_bytes(one_device(transformer_impl="local", recompute="full", runtime="cpu"),
                                                  "dense", policy=full)


def test_swiglu_fusion():
    tokens = 2 * 8
    for impl in ("transformer_engine", "local"):
        fused = layer_bytes(one_device(transformer_impl=impl))
        unfused = layer_bytes(one_device(transformer_impl=impl, bias_swiglu_fusion=False))
        # routed experts: SiLU(gate), up + offset, the output before the probability product: 3 h_E per copy
        assert sum(unfused.values()) - sum(fused.values()) == 2 * (3 * tokens * 2 * 4 + 2 * tokens * 4)
        dense = layer_bytes(one_device(transformer_impl=impl, bias_swiglu_fusion=False), "dense")
        assert dense["dense_ffn.silu_output"] == dense["dense_ffn.up_offset"] == 2 * tokens * 16


def test_cross_entropy_fusion():
    m, t = T.tiny(), one_device()
    from memlib.model.partition import parallel_values

    head = lambda **kw: ledger_bytes(act_profile("megatron", t.with_(**kw)).head(m), t, recipe("paper")).evaluate(  # noqa: E731
        {**values(m), **parallel_values(t), b: 2, s: 8})
    tokens, v = 16, 10
    plain, native = head(), head(cross_entropy_loss_fusion=True)
    assert plain == native and plain["head.loss_softmax"] == 4 * tokens * v
    assert plain["head.target_mask"] == tokens and plain["head.targets"] == 8 * tokens
    te = head(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    assert te["head.loss_grad"] == 2 * tokens * v and "head.loss_softmax" not in te and "head.targets" not in te


def test_aux_loss_types():
    tokens, N = 16, 4
    seq = layer_bytes(one_device())
    aux = layer_bytes(one_device(moe_aux_loss="aux_loss"))
    none = layer_bytes(one_device(moe_aux_loss="none"))
    assert seq["moe.aux_tokens_per_expert"] == 8 * 2 * N and aux["moe.aux_tokens_per_expert"] == 8 * N
    # softmax scores (tiny has no model_type: DeepSeek-V2's softmax), the counts per sequence, the loss
    assert sum(seq.values()) - sum(none.values()) == 4 * tokens * N + 8 * 2 * N + 4
    # sigmoid scores also keep their per-token normaliser, for the loss and for the top-k
    v3 = T.tiny(model_type="deepseek_v3")
    seq, none = layer_bytes(one_device(), model=v3), layer_bytes(one_device(moe_aux_loss="none"), model=v3)
    assert sum(seq.values()) - sum(none.values()) == 4 * tokens * N + 4 * tokens + 8 * 2 * N + 4
    assert seq["moe.topk_scores"] == 4 * tokens * 2 and seq["moe.topk_denominator"] == 4 * tokens


def test_checkpoint_only_entries():
    e = saved("x", "kept by a checkpoint", 7, only_when={"layernorm"})
    assert ledger_bytes([e]).total == 0                                 # no policy: nothing recomputed
    assert ledger_bytes([e], policy=parse_policy("layernorm")).total == 14
    assert ledger_bytes([e], policy=parse_policy("mlp")).total == 0
    assert ledger_bytes([e], policy=parse_policy("full")).total == 0
    f = saved("y", "a layer's checkpoint input", 3, only_when={"full"}, keep_full=True)
    assert ledger_bytes([f], policy=Policy("full", full=True)).total == 6
    assert ledger_bytes([f], policy=parse_policy("selective")).total == 0


def test_full_block_leaves_the_mtp_module_alone():
    m = T.tiny(num_nextn_predict_layers=1)
    t = one_device(transformer_impl="local", pp=1)
    none = estimate(m, t).stages[0].activations["by_entry"]
    block = estimate(m, t.with_(recompute="full-block:1")).stages[0].activations["by_entry"]
    assert {k: x for k, x in block.items() if k.startswith("mtp.")} == {
        k: x for k, x in none.items() if k.startswith("mtp.")}
    full = estimate(m, t.with_(recompute="full")).stages[0].activations["by_entry"]
    assert {k for k in full if k.startswith("mtp.") and full[k]} == {
        "mtp.token_ids", "mtp.embedding_input", "mtp.hidden_input", "mtp.head.input", "mtp.head.loss_softmax",
        "mtp.head.target_mask", "mtp.head.targets", "mtp.head.loss_mask", "mtp.head.scaled_loss",
        "mtp.head.num_tokens"}


# ------------------------------------------------------------------------------------------------
# the command line
# ------------------------------------------------------------------------------------------------
def test_estimate_kernel_flags(capsys):
    argv = ["estimate", "--profile", "megatron", "--dp", "1", "--tp", "1", "--pp", "1", "--ep", "1", "--etp", "1",
            "--model", "deepseek-v2-lite", "--seq-len", "128", "--json"]
    assert main(argv) == 0
    te = json.loads(capsys.readouterr().out)
    assert main(argv + ["--transformer-impl", "local", "--attention-softmax-in-fp32", "--no-bias-swiglu-fusion",
                        "--cross-entropy-loss-fusion", "--moe-router-load-balancing-type", "none"]) == 0
    loc = json.loads(capsys.readouterr().out)
    c = loc["config"]
    assert (c["transformer_impl"], c["attention_softmax_in_fp32"], c["bias_swiglu_fusion"],
            c["cross_entropy_loss_fusion"], c["moe_aux_loss"]) == ("local", True, False, True, "none")
    assert "attention.softmax_fp32" in loc["stages"][0]["activations"]["by_entry"]
    assert loc["stages"][0]["activations"]["per_microbatch"] > te["stages"][0]["activations"]["per_microbatch"]
    assert set(te) <= set(loc) and set(te["stages"][0]) <= set(loc["stages"][0])


def test_estimate_kernel_flag_errors(capsys):
    assert main(["estimate", "--profile", "megatron", "--transformer-impl", "local", "--attention-backend",
                 "flash"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memlib: error: attention_backend=flash needs transformer_impl=transformer_engine")
    assert err.count("\n") == 1
    assert main(["estimate", "--attention-backend", "sdpa"]) == 2
    assert "attention-backend" in capsys.readouterr().err


def test_cli_cold_start_imports_no_torch():
    code = ("import sys; from memlib.cli import main; main(['estimate', '--profile', 'megatron', '--json']); "
            "assert 'torch' not in sys.modules and 'megatron' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


# ------------------------------------------------------------------------------------------------
# the Validation chapter's side-by-side view (memlib.scenarios.validation, memlib.report.ch10_validation)
# ------------------------------------------------------------------------------------------------
def test_the_entry_table_lists_every_megatron_entry_with_its_source():
    """(The groups themselves are tested in test_scenarios_validation.)"""
    from memlib.report import ch10_validation as ch
    from memlib.scenarios import validation as v

    entries = v.ground_truths("deepseek-v3", "moe", 1, 4096)["entries"]
    est = estimate("deepseek-v3", PAPER_TRAINING.with_(micro_batch=1, seq_len=4096))
    table = ch.megatron_entry_table(est)
    keys = set(entries["megatron-local"]) | set(entries["megatron-te"])
    assert all(f"`{k}`" in table for k in keys)
    te_rows = [r for r in table.splitlines()[2:] if not r.split("|")[4].strip() == "—"]
    assert te_rows and all(r.split("|")[5].strip() for r in te_rows)                  # every TE value has a source
    assert "flash-attention" in table and "TE RMSNorm" in table and "Megatron-Core code (measured)" in table
    assert v.kernel_differences("deepseek-v3", "moe", 1, 4096)["probs_local"] == 4 * 2**30
