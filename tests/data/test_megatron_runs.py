"""memlib.data.reference.MEGATRON_RUNS: Megatron-LM's functional-test memory logs, as the files say.

The values below were read by hand from the golden-values files at Megatron-LM commit d98e8a64dd
(tests/functional_tests/test_cases/...).  Where the mirror of Megatron-LM is on this machine
(``MEGATRON_LM_MIRROR``, default /work/.mirror/NVIDIA+Megatron-LM/repo) the copies are also compared
with the files themselves, byte for byte.
"""
from __future__ import annotations

import json
import os
import subprocess
import tomllib
from fractions import Fraction
from pathlib import Path

import pytest

from memlib.data.reference import (
    MEGATRON_LM_COMMIT, MEGATRON_RUN_SETUPS, MEGATRON_RUNS, MEGATRON_RUNS_DIR, MEGATRON_WORLD_SIZES, _exact,
)
from memlib.core.units import to_unit

ROOT = Path(__file__).resolve().parents[2]
MIRROR = Path(os.environ.get("MEGATRON_LM_MIRROR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))

ISSUE_CASES = (
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8",
    "gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental",
    "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading", "gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4",
    "gpt3_mcore_te_tp2_pp2_mla", "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release",
    "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release",
)


def run(case: str, file: str = "golden_values_dev_dgx_h100.json") -> dict:
    return MEGATRON_RUNS[case]["files"][file]


def test_every_case_of_the_issue_is_there_with_its_files():
    assert set(ISSUE_CASES) <= set(MEGATRON_RUNS)
    files = {c: sorted(MEGATRON_RUNS[c]["files"]) for c in ISSUE_CASES}
    assert files["gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed"] == [
        "golden_values_dev_dgx_h100.json", "golden_values_dev_dgxh100_dgxc.json"]
    assert files["gpt3_mcore_te_tp2_pp2_mla"] == [
        "golden_values_dev_dgx_a100.json", "golden_values_dev_dgx_gb200.json", "golden_values_dev_dgx_gb200_2nd.json",
        "golden_values_dev_dgx_h100.json", "golden_values_dev_dgx_h100_2nd.json"]
    assert len(files["gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4"]) == 6
    assert files["deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release"] == ["golden_values_dev_dgx_gb200.json"]
    for d in MEGATRON_RUNS.values():
        assert d["commit"] == MEGATRON_LM_COMMIT
        for name, f in d["files"].items():
            assert f["source"] == f"{d['source']}/{name}"
            assert f["source"].startswith("tests/functional_tests/test_cases/")


def test_spot_values_read_by_hand():
    ms = run("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed")
    assert ms["allocated"][1] == 6_632_029_696 and ms["allocated"][2] == 6_632_031_744
    assert ms["allocated"][50] == 6_632_031_744
    assert ms["max_allocated"][1] == 55_051_542_528 and ms["max_allocated"][3] == 57_920_471_040
    assert ms["max_allocated"][39] == 60_111_630_336
    assert ms["post_step"] == (6_632_029_696, 6_632_031_744)      # iteration 1 is 2 KiB lower
    assert ms["max_run"] == 60_111_630_336 and ms["max_run_at"] == 39
    dgxc = run("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "golden_values_dev_dgxh100_dgxc.json")
    assert dgxc["max_run"] == 57_961_472_000 and dgxc["max_run_at"] == 34
    fp8 = run("gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8")
    assert sorted(fp8["allocated"]) == [1, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50]     # every fifth iteration
    assert fp8["allocated"][45] == 7_321_333_248 and fp8["max_allocated"][40] == 57_578_217_472
    sel = run("gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental")
    assert sel["allocated"][10] == 6_025_470_464 and sel["max_first"][0] == (1, 45_099_868_160)
    off = run("gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading")
    assert off["allocated"][1] == 5_283_603_968 and off["allocated"][50] == 5_290_499_584
    assert len(off["post_step"]) == 44          # it creeps up about 100 KB an iteration
    mla = MEGATRON_RUNS["gpt3_mcore_te_tp2_pp2_mla"]["files"]
    assert mla["golden_values_dev_dgx_h100.json"]["post_step"] == 388_269_568
    assert mla["golden_values_dev_dgx_gb200.json"]["post_step"] == 387_483_136
    assert mla["golden_values_dev_dgx_a100.json"]["post_step"] == 355_426_816
    second = mla["golden_values_dev_dgx_h100_2nd.json"]
    assert second["second_run"] and second["max_allocated"][1] is None and second["post_step"] == 389_056_000
    e8 = run("gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4", "golden_values_lts.json")
    assert e8["device"] == "A100" and e8["allocated"][1] == 1_364_012_544 and e8["allocated"][3] == 1_364_009_472


def test_release_runs_keep_sixty_iterations_and_summarise_the_rest():
    h = run("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release")
    assert h["allocated"][1] == 33_395_402_752 and h["max_allocated"][1] == 37_005_148_160
    assert h["max_allocated"][5] == 45_113_827_328
    assert len(h["allocated"]) == 60 and max(h["allocated"]) == 295
    full = h["full_run"]
    assert full["iterations"] == [1, 47680] and full["logged"] == 9537
    assert full["allocated_min"] == 33_393_231_872 and full["allocated_max"] == 33_397_329_920
    assert full["jobs"][0] == {"first_iteration": 1, "max_allocated": 46_597_890_048, "at": 345}
    assert full["jobs"][1]["first_iteration"] == 925      # the maximum restarts with the next job
    assert h["max_run"] == 46_597_890_048 and to_unit(h["max_run"], "GiB") > Fraction(4339, 100)
    g = run("deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release", "golden_values_dev_dgx_gb200.json")
    assert g["allocated"][1] == 58_533_826_560 and g["full_run"]["allocated_min"] == 58_533_335_040
    assert g["max_run"] == 100_882_341_888 and g["max_run_at"] == 560


def test_exact_integers_only():
    assert _exact(6632031744.0) == 6_632_031_744 and type(_exact(1.0)) is int
    assert _exact("nan") is None
    with pytest.raises(ValueError):
        _exact(1.5)
    with pytest.raises(ValueError):
        _exact("inf")
    for d in MEGATRON_RUNS.values():
        for f in d["files"].values():
            assert all(v is None or type(v) is int for v in [*f["allocated"].values(), *f["max_allocated"].values()])


def test_devices_and_world_sizes():
    assert run("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed")["device"] == "H100"
    assert run("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed")["compute_capability"] == 9
    mla = MEGATRON_RUNS["gpt3_mcore_te_tp2_pp2_mla"]["files"]
    assert mla["golden_values_dev_dgx_gb200.json"]["device"] == "GB200"
    assert mla["golden_values_dev_dgx_gb200.json"]["world_size"] == 8
    assert "gb200/gpt.yaml: nodes 2 x gpus 4" in mla["golden_values_dev_dgx_gb200.json"]["world_size_source"]
    one = MEGATRON_RUNS["gpt3_mcore_te_tp2_pp2_mla_1node"]["files"]["golden_values_dev_dgx_gb200.json"]
    assert one["world_size"] == 4
    assert run("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed")["world_size_source"].endswith("nodes 1 x gpus 8")
    for case in ("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release", "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release"):
        (f,) = MEGATRON_RUNS[case]["files"].values()
        assert "derived" in f["world_size_source"] and "not in the repository" in f["world_size_source"]
    assert run("deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release")["world_size"] == 64
    assert set(MEGATRON_WORLD_SIZES) == set(MEGATRON_RUNS)


def test_the_maximum_is_a_running_maximum_that_grows():
    """Within one job the maximum never falls; iteration 1 is below the steady peak (Adam's moments are
    created at the first step, after the activations peaked); later iterations add more."""
    for case, d in MEGATRON_RUNS.items():
        for name, f in d["files"].items():
            peaks = [v for _, v in sorted(f["max_allocated"].items()) if v is not None]
            if f["full_run"] is None:
                assert peaks == sorted(peaks), (case, name)
    ms = run("gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed")
    assert to_unit(ms["max_allocated"][3], "GiB") < Fraction(5395, 100) < to_unit(ms["max_allocated"][39], "GiB")
    assert ms["max_allocated"][1] < ms["max_allocated"][2] < ms["max_allocated"][3] == ms["max_allocated"][29] < ms["max_allocated"][30]


def test_setups_are_cases_with_files():
    assert set(MEGATRON_RUN_SETUPS) <= set(MEGATRON_RUNS)
    for setup in MEGATRON_RUN_SETUPS.values():
        assert {"model", "training", "options"} <= set(setup)


def test_config_copies_carry_source_and_licence():
    for d in MEGATRON_RUNS.values():
        text = Path(d["config_copy"]).read_text(encoding="utf-8")
        assert text.startswith("# Copied verbatim from NVIDIA/Megatron-LM, " + d["config"])
        assert MEGATRON_LM_COMMIT in text.splitlines()[1] and "BSD 3-Clause" in text
    ms = (MEGATRON_RUNS_DIR / "gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed.yaml").read_text(encoding="utf-8")
    assert "  --num-virtual-stages-per-pipeline-rank: 4\n" in ms and "  --moe-grouped-gemm: true\n" in ms


def test_package_data_ships_the_copies():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data = pyproject["tool"]["setuptools"]["package-data"]["memlib"]
    assert "data/megatron_runs/*.json" in data and "data/megatron_runs/*.yaml" in data
    assert len(list(MEGATRON_RUNS_DIR.glob("*.yaml"))) == len(MEGATRON_RUNS)


def _git_show(path: str) -> str:
    return subprocess.run(["git", "-C", str(MIRROR), "show", f"{MEGATRON_LM_COMMIT}:{path}"], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.skipif(not MIRROR.exists(), reason="no Megatron-LM mirror on this machine")
def test_copies_match_the_repository():
    for case, d in MEGATRON_RUNS.items():
        yaml = Path(d["config_copy"]).read_text(encoding="utf-8")
        assert yaml.split("\n", 4)[4] == _git_show(d["config"]), case
        copy = json.loads((MEGATRON_RUNS_DIR / f"{case}.json").read_text(encoding="utf-8"))
        for name, f in d["files"].items():
            original = json.loads(_git_show(f["source"]))
            for metric, key in (("mem-allocated-bytes", "allocated"), ("mem-max-allocated-bytes", "max_allocated")):
                values = original[metric]["values"]
                kept = copy["files"][name][metric]["values"]
                assert kept == dict(list(values.items())[:len(kept)]), (case, name, metric)
                assert f[key] == {int(k): _exact(v) for k, v in kept.items()}
                if f["full_run"] is None:
                    assert len(kept) == len(values)


SIMUMAX_MIRROR = Path(os.environ.get("SIMUMAX_MIRROR", "/work/.mirror/MooreThreads+SimuMax/repo"))


@pytest.mark.skipif(not SIMUMAX_MIRROR.exists(), reason="no SimuMax mirror on this machine")
def test_simumax_copy_matches_the_repository():
    """The rows of SimuMax's B200 table are copied, not retyped (the Llama rows' memory, every row's step); the
    launchers pass the model shapes memlib.data.reference.SIMUMAX_MODELS holds."""
    from memlib.data.reference import SIMUMAX_COMMIT, SIMUMAX_MODELS, SIMUMAX_RUNS_FILE, SIMUMAX_STEPS_FILE

    def show(path):
        return subprocess.run(["git", "--git-dir", str(SIMUMAX_MIRROR), "show", f"{SIMUMAX_COMMIT}:{path}"],
                              capture_output=True, text=True, check=True).stdout
    original = {r["case"]: r for r in json.loads(show("docs/b200/b200_release_v1.2_summary.json"))["rows"]}
    for path in (SIMUMAX_RUNS_FILE, SIMUMAX_STEPS_FILE):
        copy = json.loads(path.read_text(encoding="utf-8"))
        assert SIMUMAX_COMMIT in copy["_source"] and copy["rows"]
        for row in copy["rows"]:
            assert all(original[row["case"]][k] == v for k, v in row.items()), row["case"]
    assert len(json.loads(SIMUMAX_STEPS_FILE.read_text(encoding="utf-8"))["rows"]) == len(original)
    launcher = show("simu_tools/megatron_scripts/scripts/run_pretrain_llama3.sh")
    moe = show("simu_tools/megatron_scripts/scripts/run_pretrain_deepseekv2.sh")
    for name, shape in SIMUMAX_MODELS.items():
        if name.startswith("deepseek"):
            block = (f"HIDDEN_SIZE={shape['hidden_size']}\n    export MOE_NUM_EXPERTS={shape['n_routed_experts']}\n")
            tail = (f"MOE_FFN_HIDDEN_SIZE={shape['moe_intermediate_size']}\n    FFN_HIDDEN_SIZE="
                    f"{shape['intermediate_size']}\n    VOCAB_SIZE={shape['vocab_size']}\n    TOPK="
                    f"{shape['num_experts_per_tok']}\n    MOE_SHARED_FFN_HIDDEN_SIZE="
                    f"{shape['n_shared_experts'] * shape['moe_intermediate_size']}")
            assert block in moe and tail in moe, name
            for flag, key in (("--q-lora-rank", "q_lora_rank"), ("--kv-lora-rank", "kv_lora_rank"),
                              ("--qk-head-dim", "qk_nope_head_dim"), ("--qk-pos-emb-head-dim", "qk_rope_head_dim"),
                              ("--v-head-dim", "v_head_dim")):
                assert f"{flag} {shape[key]}" in moe
            assert f"HEAD_NUM={shape['num_attention_heads']}" in moe
            continue
        block = (f"hidden_size={shape['hidden_size']}\n    ffn_hidden_size={shape['intermediate_size']}\n"
                 f"    head_num={shape['num_attention_heads']}\n    num_query_groups={shape['num_key_value_heads']}\n"
                 f"    vocab_size={shape['vocab_size']}")
        assert block in launcher
    for flag in ("--moe-expert-capacity-factor 1", "--moe-pad-expert-input-to-capacity", "--moe-grouped-gemm",
                 "MOE_LAYER_FREQ=\"([0]*1+[1]*${NUM_LAYERS_MINUS_ONE})*1\""):
        assert flag in moe
    for flag in ("--use-distributed-optimizer", "--use-flash-attn", "--sequence-parallel", "--recompute-num-layers 0",
                 "--accumulate-allreduce-grads-in-fp32", "--untie-embeddings-and-output-weights", "NullTokenizer"):
        assert flag in launcher
    assert "--cross-entropy-fusion-impl te" in show("docs/strategy.md")
