"""The validation set: Megatron-LM's functional tests that log their peak, as the files hold them, and memlib's
prediction of each, pinned to the byte.

* The data are the files: counts, and values read by hand from the golden-values files and model_config.yaml at
  the commits named (tools/functional_tests.py wrote them from the Megatron-LM mirror; where the mirror is on this
  machine the copies are compared with it).
* Every case memlib expresses has its prediction pinned (tests/data/functional_pins.json, written by
  tools/functional_pins.py); every other case has a reason.  A change of the pins must be looked at against the
  measured values: the failure message lists the cases whose error moved.
* The families the issue names are stated: how many cases each has and how many are within 1 %.
"""
from __future__ import annotations

import json
import os
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest

from memlib.config import ConfigError
from memlib.config.versions import MEGATRON_COMMIT as FUNCTIONAL_TESTS_COMMIT
from memlib.data.functional_tests import exact, functional_tests, goldens
from memlib.scenarios import functional as fv

ROOT = Path(__file__).resolve().parents[2]
PINS = json.loads((ROOT / "tests" / "data" / "functional_pins.json").read_text(encoding="utf-8"))
MIRROR = Path(os.environ.get("MEGATRON_LM_MIRROR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))


def golden(key: str, file: str):
    return next(g for g in goldens() if g.key == key and g.file == file)


@pytest.fixture(scope="module")
def validation():
    return fv.validation()


def test_the_set_is_every_test_that_logs_its_peak():
    d = functional_tests()
    assert d["commit"] == FUNCTIONAL_TESTS_COMMIT
    assert len(d["tests"]) == 279 and len(goldens()) == 834
    folders = {}
    for t in d["tests"].values():
        folders[t["folder"]] = folders.get(t["folder"], 0) + 1
    assert folders == {"gpt": 170, "moe": 58, "t5": 13, "bert": 10, "hybrid": 10, "mixtral": 8, "nemotron": 5,
                       "mimo": 3, "multimodal-llava": 2}


def test_values_read_by_hand():
    """gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed on H100: 53.94 GiB at iteration 3, written by 11debfa7b4."""
    g = golden("moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "golden_values_dev_dgx_h100.json")
    assert g.steady == 57_920_471_040 and dict(g.max_allocated)[39] == 60_111_630_336
    assert g.post_step == 6_632_031_744 and g.world_size == 8 and g.compute_capability == 9
    assert g.values_commit.startswith("11debfa7b4") and g.values_date == "2026-01-14"
    assert g.version == "11debfa7b4@2026-01-14"


def test_the_proxies_goldens_were_written_with_te_s_loss():
    """The DeepSeek-V3 proxies' regular goldens predate 168cb15d70 and used TE's loss; the _sm ones do not."""
    h = golden("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release", "golden_values_dev_dgx_h100.json")
    assert h.values_commit.startswith("be2b2cd70d") and h.model_args["--cross-entropy-fusion-impl"] == "te"
    assert h.model_args.get("--moe-enable-deepep") is True
    g = golden("mixtral/deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release", "golden_values_dev_dgx_gb200.json")
    assert g.values_commit.startswith("f098fe8482") and g.model_args["--cross-entropy-fusion-impl"] == "te"
    sm = golden("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm", "golden_values_dev_dgx_h100.json")
    assert sm.values_date == "2026-06-18" and sm.model_args["--cross-entropy-fusion-impl"] == "native"
    assert h.world_size is None and "no recipe" in h.world_size_source


def test_world_sizes_come_from_recipes_or_the_directory_name():
    a = golden("gpt/gpt3_mcore_te_tp2_pp2", "golden_values_dev_dgx_a100.json")
    assert a.world_size == 8 and "gpt3_mr_mcore_te_tp2_pp2_dgx_a100_1N8G" in a.world_size_source
    one = golden("gpt/gpt3_mcore_te_tp2_pp2_mla_1node", "golden_values_dev_dgx_gb200.json")
    assert one.world_size == 4 and one.world_size_source.endswith("gb200/gpt-1node.yaml: nodes 1 x gpus 4")


def test_exact_integers_only():
    assert exact(6632031744.0) == 6_632_031_744 and exact("nan") is None
    with pytest.raises(ValueError):
        exact(1.5)
    for g in goldens():
        assert all(v is None or type(v) is int for _, v in g.max_allocated + g.allocated)


@pytest.mark.skipif(not MIRROR.exists(), reason="no Megatron-LM mirror on this machine")
def test_the_copies_are_the_files_at_the_commit():
    g = golden("moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "golden_values_dev_dgx_h100.json")
    path = f"tests/functional_tests/test_cases/moe/{g.test}/{g.file}"
    text = subprocess.run(["git", "--git-dir", str(MIRROR), "show", f"{FUNCTIONAL_TESTS_COMMIT}:{path}"],
                          capture_output=True, text=True, check=True).stdout
    data = json.loads(text)["mem-max-allocated-bytes"]["values"]
    assert {int(k): exact(v) for k, v in data.items()} == dict(g.max_allocated)


def test_every_case_has_a_prediction_or_a_reason(validation):
    ok, no = validation
    assert len(ok) + len(no) == len(goldens())
    assert all(n.reason and "\n" not in n.reason for n in no)
    assert {f"{n.golden.key}/{n.golden.file}" for n in no} == set(PINS["not_expressed"])
    reasons = " ".join(n.reason for n in no)
    for why in ("T5 (an encoder-decoder)", "an inference or reinforcement-learning test",
                "--moe-router-load-balancing-type=sinkhorn cannot be expressed"):
        assert why in reasons


def test_every_prediction_pinned_to_the_byte(validation):
    ok, _ = validation
    got = {f"{c.golden.key}/{c.golden.file}": c.predicted for c in ok}
    moved = {k: (PINS["expressed"].get(k), v, f"{float(Fraction(v - golden(*k.rsplit('/', 1)).steady, golden(*k.rsplit('/', 1)).steady)) * 100:+.2f} %")
             for k, v in got.items() if PINS["expressed"].get(k) != v}
    assert set(got) == set(PINS["expressed"])
    assert not moved, f"{len(moved)} predictions moved (pinned, now, error now): {list(moved.items())[:8]}"


def test_the_parts_add_up(validation):
    for c in validation[0][:40]:
        p = c.peak
        assert c.predicted == sum(p.persistent.values()) + sum(p.activations.values()) + sum(p.transient.values())
        assert c.error == Fraction(c.predicted - c.steady, c.steady)


def test_the_deepseek_cases_and_the_families(validation):
    """The stated result (not a tuning): the DeepSeek-V3 proxy on H100 within 1 %, read with the configuration and
    the Megatron-LM version that wrote its golden (TE's loss; the _sm golden was written with the native loss)."""
    ok, _ = validation
    by = {(c.golden.test, c.golden.file): c for c in ok}
    reg = by[("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release", "golden_values_dev_dgx_h100.json")]
    sm = by[("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm", "golden_values_dev_dgx_h100.json")]
    assert reg.run.train.cross_entropy_fusion_impl.value == "te" and sm.run.train.cross_entropy_fusion_impl.value == "native"
    assert reg.within_target
    assert reg.world_size == 64 and "derived" in reg.world_size_source
    s = fv.summary(ok)
    assert s["n"] == len(ok) and sum(f["n"] for f in s["families"].values()) == len(ok)


def test_a_refused_flag_is_a_reason_not_a_number():
    g = golden("moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_resume_torch_dist_attn_cudagraph", "golden_values_dev_dgx_h100.json")
    c = fv._case(g)
    assert isinstance(c, fv.NotExpressible) and "--cuda-graph-impl" in c.reason
    with pytest.raises(ConfigError):
        fv._parse(golden("moe/gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel", "golden_values_dev_dgx_h100.json"),
                  world_size=8)


def test_each_golden_names_its_container():
    """The NGC PyTorch container of the CI image that wrote each golden (docker/.ngc_version.<env>, before that
    file the build stage's matrix): the lts image was NGC 24.01 until 2025-11-06, 25.09 after."""
    assert all(g.container and g.container.startswith("nvcr.io/nvidia/pytorch:") for g in goldens())
    for g in goldens():
        if g.environment == "lts":
            assert g.container.endswith(("24.01-py3" if g.values_date < "2025-11-06" else "25.09-py3"))
    assert golden("gpt/gpt3_mcore_te_tp2_pp2", "golden_values_dev_dgx_a100.json").container.endswith("25.03-py3")
    h = golden("moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "golden_values_dev_dgx_h100.json")
    assert h.container == "nvcr.io/nvidia/pytorch:25.11-py3"


def test_the_lts_image_s_transformer_engine_runs_the_unfused_attention_when_deterministic(validation):
    """TE 1.2 (NGC 24.01) turns flash-attn 2 and cuDNN's fused attention below sm90 off under
    NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: the unfused attention's s x s probabilities are what those A100 goldens
    hold (before this rule: -18 % to -42 %; with it within 1.2 %, 33 of 36 within 1 %); the same test's non-resume twin
    asks for --attention-backend unfused."""
    ok, _ = validation
    cases = [c for c in ok if c.golden.environment == "lts" and c.golden.container.endswith("24.01-py3")
             and c.run.train.transformer_impl.uses_te and c.golden.env_vars.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") == 0
             and "--attention-backend" not in c.golden.model_args]
    assert len(cases) == 36 and all(c.run.train.attention_backend.value == "unfused" for c in cases)
    assert all(abs(c.error) < Fraction(12, 1000) for c in cases) and sum(c.within_target for c in cases) >= 33


def test_blackwell_s_cublas_workspaces_follow_the_container_s_pytorch(validation):
    """pytorch#175344 (merged 2026-02-19) gave Blackwell 32 MiB cuBLAS workspaces: GB200 goldens written in an NGC
    26.02 image or older hold the 8 MiB + 128 KiB ones (their post-step allocation was 40-48 MiB below memlib's
    account with 32 MiB); from 26.04 on, 32 MiB."""
    ok, _ = validation
    gb = [c for c in ok if c.golden.gpu == "GB200" and c.run.framework.cublas_workspace_config is None]
    old = [c for c in gb if c.golden.container < "nvcr.io/nvidia/pytorch:26.03"]
    new = [c for c in gb if c.golden.container >= "nvcr.io/nvidia/pytorch:26.03"]
    assert old and new
    ws = {c.golden.container: c.peak.persistent.get("torch_cublas_workspaces") for c in gb}
    assert {v for k, v in ws.items() if k < "nvcr.io/nvidia/pytorch:26.03"} == {2 * (8 * 2**20 + 128 * 2**10)}
    assert {v for k, v in ws.items() if k >= "nvcr.io/nvidia/pytorch:26.03"} == {2 * 32 * 2**20}
    # what stays after the step is now within 10 MiB of memlib's account for the GPT shells of those images (the
    # three TP2 PP2 runs on one node, DP 1, log 254 KiB less than the account since the pipeline input pairs count)
    assert all(-2**20 < c.post_step_gap < 10 * 2**20 for c in old if c.family == fv.FAMILIES[3])


def test_fp16_runs_skip_their_first_steps():
    """An fp16 run with a dynamic loss scale skips the steps whose gradients overflow (the scale starts at 2^32):
    Adam's moments appear after step 16 here (the post-step allocation rises by 268 MiB then), so the steady peak is
    the maximum at iteration 17, not at the third."""
    g = golden("gpt/gpt3_mcore_tp1_pp4_resume_torch_dist", "golden_values_dev_dgx_a100.json")
    assert g.dynamic_loss_scale and dict(g.allocated)[15] < dict(g.allocated)[16] == g.post_step
    assert g.steady == dict(g.max_allocated)[17] == 2_675_191_296 > dict(g.max_allocated)[3]
    bf16 = golden("gpt/gpt3_mcore_tp1_pp4", "golden_values_dev_dgx_a100.json")
    assert not bf16.dynamic_loss_scale and bf16.steady == bf16.max_allocated[2][1]


def test_the_local_attention_s_fused_softmax_on_a_gpu(validation):
    """Megatron-Core's local attention runs its fused softmax kernel on a GPU (bf16, 16 < s <= 4096, ...): the fp32
    probabilities of --attention-softmax-in-fp32 exist only in the torch path memlib measures on the CPU.  The
    local GPT shells held about one fp32 [b, n_h/TP, s, s] per layer less than memlib counted before (12 layers:
    1,536 MiB)."""
    ok, _ = validation
    local = [c for c in ok if not c.run.train.transformer_impl.uses_te]
    assert len(local) == 70 and all(c.run.train.attention_softmax_in_fp32 for c in local)
    bf16 = [c for c in local if not c.golden.dynamic_loss_scale]
    assert all(c.within_target for c in bf16)


def test_fp16_gradient_buffer_holds_fp16(validation):
    """Megatron-LM accumulates gradients in fp32 only for bf16 (megatron/training/arguments.py ``if args.bf16``:
    accumulate_allreduce_grads_in_fp32); an fp16 run's DDP buffer has the parameters' dtype
    (distributed_data_parallel.py ``grad_reduce_in_fp32 else param.dtype``), so its grad buffer is the size of its
    param buffer, and the optimizer's fp32 copies are in the logged post-step allocation only (freed by
    zero_grad before the next forward).  Counting the buffer in fp32 put these runs at +2 % (+2.8 % with the
    distributed optimizer); their bf16 twins (same model, same step) are within 0.1 %, as these are now."""
    ok, _ = validation
    fp16 = [c for c in ok if c.run.train.precision == "megatron-fp16"]
    assert len(fp16) >= 50
    for c in fp16:
        assert c.peak.persistent["grad_buffer"] == c.peak.persistent["param_buffer"], c.golden.key
    c = next(c for c in fp16 if c.golden.key.endswith("tp1_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce_param_gather")
             and c.golden.file == "golden_values_dev_dgx_a100.json")
    twin = next(c for c in ok if c.golden.key.endswith("/gpt3_mcore_tp1_pp1_dist_optimizer_overlap_grad_reduce_param_gather")
                and c.golden.file == "golden_values_dev_dgx_a100.json")
    # the twin's fp32 buffer is twice the fp16 one: the predictions differ by one param buffer's bytes
    assert twin.run.train.precision == "megatron"
    assert twin.predicted - c.predicted == c.peak.persistent["param_buffer"]
    assert abs(c.error) < Fraction(1, 1000)
    # after the step: the distributed optimizer's fp32 gradient shards beside its fp32 main-parameter shards
    assert c.step_grad_copies == c.peak.persistent["main_params"]
    assert abs(c.post_step_gap) < 2 ** 20
    # the copies are not at the peak: the gap there is the same as the bf16 twin's (a few MiB)
    assert abs(c.peak_gap - twin.peak_gap) < 2 * 2 ** 20


def test_the_batch_attention_mask_is_alive_at_the_end_of_the_forward(validation):
    """get_batch_on_this_tp_rank (megatron/training/utils.py) allocates the [b, 1, s, s] bool mask on the first and
    last stages under create_attention_mask_in_dataloader (Megatron-LM's default), and forward_step holds the batch
    until the model's forward returns: at the loss it is alive whether or not an autograd node keeps it.
    gpt3_7b_tp4_pp1_memory_speed (b 2, s 8192: 128 MiB of mask, flash attention keeps none) missed its peak by
    129.7 MiB in the activations without it (-0.22 %); with it, within 0.02 %.  Its twin without the mask in the
    data loader has no such term."""
    ok, _ = validation
    c = next(c for c in ok if c.golden.key == "gpt/gpt3_7b_tp4_pp1_memory_speed"
             and c.golden.file == "golden_values_dev_dgx_h100.json")
    assert c.peak.candidate == "forward_end" and c.peak.transient["batch_attention_mask"] == 2 * 8192 * 8192
    assert abs(c.error) < Fraction(2, 10000)
    no = [c for c in ok if "--no-create-attention-mask-in-dataloader" in c.golden.model_args]
    assert no and all(c.peak.transient["batch_attention_mask"] == 0 for c in no)


def test_misses_named_where_the_logs_name_them(validation):
    """Two groups of misses are named from the logs themselves: the resumed halves that keep more after each step
    than their first halves (what loading the checkpoint left), and the native fused cross-entropy on containers
    whose PyTorch compiles it with more fp32 buffers than memlib counts (the same test within 1 % on newer ones)."""
    ok, _ = validation
    by = {(c.golden.key.split("/")[1], c.golden.file): c for c in ok}
    ce = by[("gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion", "golden_values_lts_dgxa100_dracooci.json")]
    assert ce.missing.startswith("the native fused cross-entropy as the PyTorch of nvcr.io/nvidia/pytorch:24.01")
    assert "2.14 x the fp32 logits" in ce.missing and "25.09" in ce.missing
    resumed = by[("gpt3_mcore_te_tp2_pp2_resume_torch_dist_cp2_nondeterministic", "golden_values_dev_dgx_h100_2nd.json")]
    assert resumed.missing.startswith("loading the checkpoint: the resumed half keeps 173.7 MiB more")
    # what it keeps is Adam's two moments once more (TE's FusedAdam.load_state_dict copies the loaded ones into fresh
    # ones): 2 x 4 bytes a parameter without the distributed optimizer, 2 x 4 / DP with it; the TP 4 run keeps them
    # to the byte (65,992,704 = 2 x 4 x 16,498,176 / 2), the TP 2 PP 2 one 3 MiB more (one more run's spread)
    assert "Adam's two moments once more are 170.7 MiB" in resumed.missing
    dist = by[("gpt3_mcore_te_tp4_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce",
               "golden_values_lts_dgx_a100_2nd.json")]
    first = by[("gpt3_mcore_te_tp4_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce",
                "golden_values_lts_dgx_a100.json")]
    assert dist.golden.post_step - first.golden.post_step == 65_992_704 == \
        dist.peak.persistent["exp_avg"] + dist.peak.persistent["exp_avg_sq"]
    assert "keeps 62.9 MiB more" in dist.missing and "moments once more are 62.9 MiB" in dist.missing
    assert all(c.missing is None for c in ok if c.within_target)


def test_allocator_remainders_named_where_requests_are_not_whole_2_mib(validation):
    """The TP 4 GPT-3 shell (s 1024, b 4, h 512) asks for a 3 MiB fused QKV output every layer, which can land in a
    freed 4 MiB block and keep all of it (no functional test runs with expandable segments); at TP 1 the same
    output is 12 MiB and no request of the shell is uneven, so nothing can be held beyond it.  A miss at the peak
    where such requests exist names the mechanism; a run with expandable segments has none."""
    from dataclasses import replace

    ok, _ = validation
    by = {(c.golden.key.split("/")[1], c.golden.file): c for c in ok}
    tp4 = by[("gpt3_mcore_tp4_pp1_resume_torch", "golden_values_dev_dgx_a100.json")]
    sizes, alive = tp4.allocator_remainders
    assert sizes == (3 * 2**20,) and alive == 2 * 12     # the saved QKV output and the request, per layer
    assert not tp4.within_target and tp4.missing.startswith("the caching allocator without expandable segments")
    tp1 = next(c for c in ok if c.golden.test == "gpt3_mcore_tp1_pp1_dist_optimizer_overlap_grad_reduce_param_gather")
    assert tp1.allocator_remainders == ((), 0)
    expandable = replace(tp4, run=replace(tp4.run, framework=replace(tp4.run.framework, expandable_segments=True)))
    assert expandable.allocator_remainders == ((), 0) and expandable.missing is None
