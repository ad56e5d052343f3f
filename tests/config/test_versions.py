"""memlib.config.versions: a Megatron-LM version and the flag rules it has (--megatron-version).

The release table was read from each release branch's sources (git merge-base --is-ancestor of the rule's commit,
and the branch's files for the cherry-picks); the dates are the commits' (git log -1 --format=%cs).
"""
from __future__ import annotations

import json

import pytest

from memlib.cli import main
from memlib.config import ConfigError, TrainingConfig
from memlib.config.versions import DEFAULT_VERSION, RELEASES, RULES, parse_version
from memlib.megatron.flags import parse_megatron_args

FLAGS = """--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
--micro-batch-size 1 --bf16 --tokenizer-type NullTokenizer --vocab-size 1000 --world-size 1"""


def test_the_rules_and_their_commits():
    assert [(r.key, r.commit, r.date) for r in RULES] == [
        ("cross_entropy_fusion_impl", "3b141a2471", "2025-04-05"),
        ("mtp_loss_in_postprocess", "d7bf5aaaa8", "2025-08-26"),
        ("mtp_loss_function", "9d71cb1cd2", "2026-02-04"),
        ("null_tokenizer_eod", "c9dfe34798", "2026-04-22"),
        ("batch_moved_in_place", "5e4fc931ba", "2026-05-21"),
        ("te_cross_entropy_refused", "168cb15d70", "2026-06-03"),
        ("rerun_iterator_copies_batch", "bf32f4415e", "2026-07-06"),
    ]


@pytest.mark.parametrize("release, te_refused, null_eod_dropped, impl_flag", [
    ("core_r0.11.0", False, False, False),
    ("core_r0.12.0", False, False, True),       # the flag came by a cherry-pick
    ("core_v0.14.0", False, False, True),
    ("core_r0.17.0", False, False, True),
    ("core_r0.18.0", False, True, True),        # branched 2026-06-01: after c9dfe34798, before 168cb15d70
    ("core_r0.19.0", True, True, True),
])
def test_releases(release, te_refused, null_eod_dropped, impl_flag):
    v = parse_version(release)
    assert (v.has("te_cross_entropy_refused"), v.has("null_tokenizer_eod"), v.has("cross_entropy_fusion_impl")) == \
        (te_refused, null_eod_dropped, impl_flag)


def test_dates_and_commits():
    assert not parse_version("2026-06-02").has("te_cross_entropy_refused")
    assert parse_version("2026-06-03").has("te_cross_entropy_refused")
    assert parse_version("be2b2cd70d@2026-05-25").rules == frozenset({"cross_entropy_fusion_impl", "null_tokenizer_eod",
                                                                     "mtp_loss_in_postprocess", "mtp_loss_function",
                                                                     "batch_moved_in_place"})
    assert parse_version("168cb15d70").text == "168cb15d70@2026-06-03"
    assert DEFAULT_VERSION == "d98e8a64dd@2026-08-22" and len(RELEASES) == 10


@pytest.mark.parametrize("version, kept", [
    ("2026-05-20", False), ("2026-05-21", True), ("6e091e1b68@2026-05-30", True), ("2026-07-05", True),
    ("2026-07-06", False), ("core_r0.17.0", False), ("core_r0.18.0", True), ("core_r0.19.0", False),
    (DEFAULT_VERSION, False),
])
def test_the_rerun_iterator_keeps_gpu_batches_between_two_commits(version, kept):
    """get_batch fills the loader's dict in place from 5e4fc931ba; RerunDataIterator saves a copy from bf32f4415e:
    core_r0.18.0 has the first only (its rerun_state_machine.py appends the dict itself), core_r0.19.0 both."""
    assert parse_version(version).rerun_iterator_keeps_gpu_batches is kept


@pytest.mark.parametrize("text, message", [
    ("foo", "must be a release"), ("core_r0.3.0", "memlib knows the rules of the releases"),
    ("abc1234", "cannot look the commit up"), ("abc1234@2026-13-01", "is not a date"), ("", "must be a release"),
])
def test_errors_are_one_line(text, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse_version(text)
    assert "\n" not in str(e.value)


def test_te_loss_is_read_as_its_version_read_it():
    te = FLAGS + " --cross-entropy-loss-fusion --cross-entropy-fusion-impl te"
    with pytest.raises(ConfigError, match="refuses it .* core_r0.18.0 and older accept it"):
        parse_megatron_args(te)
    run = parse_megatron_args(te, overrides={"megatron_version": "core_r0.14.0"})
    assert run.train.cross_entropy_fusion_impl.value == "te" and run.train.megatron_version == "core_r0.14.0"
    with pytest.raises(ConfigError, match="has no such flag"):
        parse_megatron_args(te, overrides={"megatron_version": "core_r0.11.0"})


def test_null_tokenizer_adds_its_token_before_c9dfe34798():
    """--vocab-size 1000 is 1001 tokens before the change (padded to 1024 either way at 128 x TP 1) and 1000 after;
    at 1024 the extra token crosses a multiple: 1025 pads to 1152."""
    old = parse_megatron_args(FLAGS.replace("1000", "1024"), overrides={"megatron_version": "core_r0.17.0"})
    new = parse_megatron_args(FLAGS.replace("1000", "1024"), overrides={"megatron_version": "core_r0.18.0"})
    assert (old.vocab["size"], old.model.vocab_size) == (1025, 1152)
    assert (new.vocab["size"], new.model.vocab_size) == (1024, 1024)


def test_the_json_config_states_the_version():
    assert TrainingConfig().values()["megatron_version"] == DEFAULT_VERSION
    assert TrainingConfig(megatron_version="core_v0.14.0").values()["megatron_version"] == "core_v0.14.0"


def test_cli(capsys):
    assert main(["estimate", "--model", "llama-3-8b", "--profile", "megatron", "--precision", "megatron", "--dp", "8",
                 "--tp", "1", "--pp", "1", "--ep", "1", "--etp", "1", "--megatron-version", "core_r0.14.0",
                 "--cp-comm-type", "a2a", "--hidden-dropout", "0.1", "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)["config"]
    assert (cfg["megatron_version"], cfg["cp_comm_type"], cfg["hidden_dropout"], cfg["attention_dropout"]) == \
        ("core_r0.14.0", "a2a", "1/10", "0")
    assert main(["estimate", "--model", "llama-3-8b", "--megatron-version", "yesterday"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_container_rules():
    """The NGC PyTorch container of a run: its own Transformer Engine (24.01: TE 1.2.x, TE v1.3 being tagged on
    2024-02-02) and whether its PyTorch has pytorch#175344 (merged 2026-02-19)."""
    from memlib.config.versions import container_rules

    old = container_rules("nvcr.io/nvidia/pytorch:24.01-py3")
    assert old.te_version == (1, 2) and not old.blackwell_cublas_32mib
    assert container_rules("nvcr.io/nvidia/pytorch:25.09-py3").te_version is None
    assert not container_rules("nvcr.io/nvidia/pytorch:26.02-py3").blackwell_cublas_32mib
    assert container_rules("nvcr.io/nvidia/pytorch:26.04-py3").blackwell_cublas_32mib
    assert container_rules(None).blackwell_cublas_32mib and container_rules("my/image:1").te_version is None


def test_te_1_2_runs_the_unfused_attention_when_deterministic_below_hopper():
    from memlib.ledgers.megatron import te_attention_backend

    assert te_attention_backend(8, deterministic=True, dropout=True, te_version=(1, 2)).value == "unfused"
    assert te_attention_backend(8, deterministic=False, dropout=True, te_version=(1, 2)).value == "flash"
    assert te_attention_backend(9, deterministic=True, dropout=True, te_version=(1, 2)).value == "fused"
    assert te_attention_backend(8, deterministic=True, dropout=True).value == "flash"


def test_blackwell_cublas_workspaces_by_pytorch():
    from memlib.device.megatron_buffers import torch_cublas_workspace_bytes
    from memlib.device.peak import Framework

    assert torch_cublas_workspace_bytes(10) == 32 * 2**20
    assert torch_cublas_workspace_bytes(10, blackwell_32mib=False) == 8 * 2**20 + 128 * 2**10
    assert torch_cublas_workspace_bytes(9, blackwell_32mib=False) == 32 * 2**20
    assert torch_cublas_workspace_bytes(10, ":4096:8", blackwell_32mib=False) == 32 * 2**20
    assert Framework().blackwell_cublas_32mib
    with pytest.raises(ConfigError):
        torch_cublas_workspace_bytes(10, blackwell_32mib="no")


@pytest.mark.parametrize("version, kept", [
    ("core_r0.13.0", False), ("core_r0.14.0", True), ("core_r0.16.0", True), ("core_r0.17.0", False),
    ("2025-08-25", False), ("11debfa7b4@2026-01-14", True), ("2026-02-04", False), (DEFAULT_VERSION, False),
])
def test_the_mtp_logits_through_the_main_loss(version, kept):
    """GPTModel._postprocess's inline MTP loop (d7bf5aaaa8 to 9d71cb1cd2; core_r0.14.0 to core_r0.16.0) keeps the
    last MTP head's logits referenced through the main head's loss: one more L at the loss stage's forward end."""
    assert parse_version(version).mtp_logits_through_main_loss is kept


def test_the_mtp_logits_rule_in_the_peak():
    from fractions import Fraction

    from memlib.config import model_from_dict
    from memlib.device.estimate import estimate
    from memlib.device.overhead import Overheads

    m = model_from_dict({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
                         "moe_intermediate_size": 128, "num_attention_heads": 4, "qk_nope_head_dim": 32,
                         "qk_rope_head_dim": 16, "v_head_dim": 32, "q_lora_rank": 64, "kv_lora_rank": 64,
                         "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                         "num_hidden_layers": 2, "first_k_dense_replace": 1, "vocab_size": 8192,
                         "num_nextn_predict_layers": 1, "tie_word_embeddings": False}, name="tiny-mtp")
    t = TrainingConfig(dp=1, tp=1, pp=1, ep=1, etp=1, sp=False, precision="megatron", profile="megatron",
                       micro_batch=1, seq_len=1024, num_microbatches=1)
    none = Overheads(0, 0, Fraction(0))
    new = estimate(m, t, none).peak_of(0)
    old = estimate(m, t.with_(megatron_version="core_r0.15.0"), none).peak_of(0)
    assert old.transient["cross_entropy_logits"] - new.transient["cross_entropy_logits"] == 1024 * 8192 * 2
    assert old.peak_allocated - new.peak_allocated == 1024 * 8192 * 2


def test_the_pins_are_the_ones_the_build_installs_and_the_tools_read():
    """One constant per fact: the megatron-core release the Makefile installs is MCORE_VERSION, the commit the
    functional tests were read at (tools/functional_tests.py) is MEGATRON_COMMIT, and the version assumed without
    --megatron-version is that commit at its date."""
    import re
    from pathlib import Path

    from memlib.config.versions import DEFAULT_VERSION, MCORE_VERSION, MEGATRON_COMMIT, MEGATRON_COMMIT_DATE
    from memlib.data.functional_tests import functional_tests

    root = Path(__file__).resolve().parents[2]
    assert re.search(r"^MCORE := megatron-core==(\S+)$", (root / "Makefile").read_text(), re.M).group(1) == MCORE_VERSION
    assert functional_tests()["commit"] == MEGATRON_COMMIT
    assert DEFAULT_VERSION == f"{MEGATRON_COMMIT[:10]}@{MEGATRON_COMMIT_DATE}"
