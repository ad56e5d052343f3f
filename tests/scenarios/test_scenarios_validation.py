"""memlib.scenarios.validation: the model in miniature, its measurements against transformers and
Megatron-Core (exact), the grouping of ledger entries by hand on the tiny model, the one-layer views
of the presets, and the recorded GPU run's fields.

The measurements need the measure extra (torch, transformers) and megatron-core 0.19.2; without them
those tests are skipped, and under CI (``CI=true``) they fail instead."""
from __future__ import annotations

import importlib.util
import json
import os
from fractions import Fraction
from pathlib import Path

import pytest

from memlib import load_model
from memlib.config import ConfigError
from memlib.scenarios import validation as sv

import tiny as T

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def extra():
    if os.environ.get("CI", "").lower() in ("1", "true"):
        return
    pytest.importorskip("torch")
    pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mcore(extra):
    from memlib.measure.megatron import available

    if os.environ.get("CI", "").lower() in ("1", "true"):
        assert available()
        return
    if not available():
        pytest.skip("megatron-core not installed")


def tiny():
    return T.tiny(moe_intermediate_size=8)


# ------------------------------------------------------------------------------------------------
# the model in miniature
# ------------------------------------------------------------------------------------------------
KEPT = ("n_shared_experts", "num_experts_per_tok", "n_group", "topk_group", "scoring_func", "router_bias",
        "tie_word_embeddings")


@pytest.mark.parametrize("name,experts,mtp,q_lora", [
    ("deepseek-v3", 16, 1, 16),        # 8 groups, 8 per token: 2 per group, 4 groups hold 8
    ("deepseek-v2", 16, 0, 16),        # 8 groups, 6 per token: ceil(12/8) = 2 per group, 3 groups hold 6
    ("deepseek-v2-lite", 12, 0, None),  # no groups: twice the 6 per token; no q LoRA
])
def test_miniature_keeps_the_structure(name, experts, mtp, q_lora):
    m, mini = load_model(name), sv.miniature(name)
    assert all(getattr(mini, f) == getattr(m, f) for f in KEPT)
    assert (mini.n_routed_experts, mini.num_nextn_predict_layers, mini.q_lora_rank) == (experts, mtp, q_lora)
    assert mini.layer_kinds == ("dense", "moe") and mini.moe_layer_freq == 1
    assert mini.hidden_size == sv.MINIATURE["hidden_size"] == 32 and mini.vocab_size == 64
    assert mini.hidden_size % 8 == 0 and mini.moe_intermediate_size % 8 == 0     # grouped_mm strides
    assert mini.name == f"{name} in miniature"


def test_miniature_of_small_and_odd_models():
    # the tiny model has only 4 experts and 2 per token: kept (never more experts than the model has)
    assert sv.miniature(tiny()).n_routed_experts == 4
    # groups a token may use must hold its experts: 4 groups, 1 per token, 6 per token -> 6 per group
    m = T.tiny(n_routed_experts=32, num_experts_per_tok=6, n_group=4, topk_group=1)
    mini = sv.miniature(m)
    assert (mini.n_routed_experts, mini.n_group, mini.topk_group) == (24, 4, 1)
    # all dense: one dense layer; all MoE: one MoE layer
    assert sv.miniature(T.tiny(first_k_dense_replace=3)).layer_kinds == ("dense",)
    assert sv.miniature(T.tiny(first_k_dense_replace=0)).layer_kinds == ("moe",)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "llama-3-8b", "qwen3-30b-a3b"])
def test_miniature_of_another_family_keeps_its_blocks(name):
    """A GQA model's miniature is of its own family (not a DeepSeek miniature): fewer key-value heads
    than query heads kept, its MoE kind, head norms and biases; one layer; at most 2 experts per token."""
    m, mini = load_model(name), sv.miniature(name)
    kept = ("family", "attention", "mlp", "moe", "norm", "positions", "qk_norm", "qkv_bias", "o_bias", "mlp_bias",
            "tie_word_embeddings")
    assert all(getattr(mini, f) == getattr(m, f) for f in kept)
    assert (mini.hidden_size, mini.num_attention_heads, mini.num_key_value_heads, mini.head_dim) == (32, 4, 2, 8)
    assert mini.layer_kinds == (("moe",) if m.has_moe else ("dense",))
    if m.has_moe:
        assert (mini.n_routed_experts, mini.num_experts_per_tok, mini.moe_intermediate_size) == (4, 2, 16)
    one_head = sv.hf_cases(name)[2][1]
    assert (one_head.num_attention_heads, one_head.num_key_value_heads, one_head.head_dim) == (1, 1, 24)


def test_cases_are_derived_from_the_miniature():
    cases = sv.hf_cases("deepseek-v2-lite")
    assert [c[0] for c in cases] == [c[0] for c in sv.HF_CASES]
    assert cases[0][1] == sv.miniature("deepseek-v2-lite") and cases[0][2:] == (2, 16)
    one_head = cases[2][1]
    assert (one_head.num_attention_heads, one_head.v_head_dim, one_head.q_lora_rank) == (1, 24, None)
    mcases = sv.megatron_cases("deepseek-v3")
    assert all(m == sv.miniature("deepseek-v3") for _, m, _ in mcases)
    assert [(t.recompute, t.precision, t.transformer_impl.value) for _, _, t in mcases] == [
        ("none", "megatron", "local"), ("selective", "megatron", "local"), ("full", "fp32", "local")]


# ------------------------------------------------------------------------------------------------
# summaries and grouping, by hand
# ------------------------------------------------------------------------------------------------
def _row(region, p, m):
    return {"region": region, "predicted": p, "measured": m, "difference": m - p}


def test_hf_summary_counts():
    results = [{"regions": [_row("a", 5, 5), _row("b", 7, 9)], "storages": [1, 2, 3], "exact": False,
                "activations": {"measured": 14}},
               {"regions": [_row("a", 1, 1)], "storages": [1], "exact": True, "activations": {"measured": 1}}]
    s = sv.hf_summary(results)
    assert s == {"configs": 2, "exact_configs": 1, "regions": 3, "mismatched_regions": 1, "storages": 4,
                 "measured_bytes": 15, "max_abs_difference": 2, "all_exact": False}


def test_megatron_summary_counts():
    r = {"blocks": [_row("x", 3, 3), _row("y", 4, 1)], "regions": [1, 2], "storages": [0] * 5, "exact": False,
         "activations": {"measured": 4}, "parameters": {"measured": 10, "difference": -2},
         "main_grad": {"measured": 20, "difference": 0}}
    s = sv.megatron_summary([r, {**r, "exact": True}])
    assert (s["configs"], s["exact_configs"], s["blocks"], s["mismatched_blocks"], s["storages"]) == (2, 1, 4, 2, 10)
    assert (s["parameter_bytes"], s["parameter_difference"], s["main_grad_bytes"]) == (20, 4, 40)
    assert not s["all_exact"]


@pytest.mark.parametrize("key,group", [
    ("attention.norm.input_fp32", "RMSNorms"), ("attention.q_norm.rsqrt", "RMSNorms"),
    ("attention.c_kv", "MLA latents and projections"), ("attention.softmax_fp32", "attention scores"),
    ("attention.probs", "attention scores"), ("attention.out_dropout_mask", "dropout masks"),
    ("moe.router_scores", "router"), ("moe.routed.offsets", "routed experts"), ("moe.shared.act_out", "shared experts"),
    ("dense_ffn.up_out", "dense FFN")])
def test_entry_groups(key, group):
    assert sv.entry_group(key) == group


@pytest.mark.parametrize("key,group", [
    ("attention.norm_input_fp32", "RMSNorms"), ("attention.c_q_fp32", "RMSNorms"), ("attention.c_q", "MLA latents "
     "and projections"), ("attention.rope_tables", "RoPE"), ("attention.softmax_lse", "attention scores"),
    ("moe.permute_sort", "dispatch"), ("moe.routed.token_index", "routed experts"), ("moe.topk_scores", "router"),
    ("moe.routed.probs", "routed experts"), ("dense_ffn.norm_input", "RMSNorms"), ("dense_ffn.fc1_out", "dense FFN")])
def test_megatron_groups(key, group):
    assert sv.megatron_group(key) == group


def test_layer_groups_by_hand():
    """The tiny model's MoE layer (n_h 2, N 4, N_r 2) at b 2, s 8: the scores are 6 b n_h s^2 under
    hf-eager (fp32 softmax output + bf16 probabilities) and 5 b n_h s^2 under the paper's ledger
    (probabilities, 1-byte dropout mask, dropout output); the paper's output-dropout mask is b s h."""
    g = sv.layer_groups(tiny(), "moe", 2, 8)
    assert g["attention scores"]["hf-eager"] == 6 * 2 * 2 * 64 == 1536
    assert g["attention scores"]["paper"] == 5 * 2 * 2 * 64 == 1280
    assert g["dropout masks"] == {"paper": 128, "hf-eager": 0, "difference": -128, "ratio": Fraction(0)}
    # the router under hf-eager: fp32 input copy 4bsh, scores 4bsN, int64 indices 8bsN_r, denominator 4bs,
    # weights 4bsN_r
    assert g["router"]["hf-eager"] == 4 * 16 * 8 + 4 * 16 * 4 + 8 * 16 * 2 + 4 * 16 + 4 * 16 * 2 == 1216
    for p in ("paper", "hf-eager"):
        assert g["total"][p] == sum(v[p] for k, v in g.items() if k != "total") == sum(
            e["bytes"] for e in sv.layer_entries(tiny(), "moe", p, 2, 8))
    assert g["total"]["ratio"] == Fraction(12624, 8576)
    assert list(g)[:-1] == [x for x in sv.GROUPS if x in g]


def test_longer_sequence_and_largest_difference_by_hand():
    ls = sv.longer_sequence(tiny(), "moe", 2, 8)
    assert ls["scores_hf_s2"] == 6 * 2 * 2 * 256 and ls["scores_paper_s2"] == 5 * 2 * 2 * 256
    assert ls["others_ratio"]["paper"] == 2                 # every other paper entry is linear in s
    # hf-eager: the experts' N int32 offsets (16 bytes) do not grow
    others = 12624 - 1536
    assert ls["others_ratio"]["hf-eager"] == Fraction(2 * others - 16, others) and ls["others_at_most_double"]
    assert ls["hf_ratio"] > 2 and ls["paper_ratio"] > 2
    top = sv.largest_difference(tiny(), "moe", 2, 8)
    assert (top["group"], top["difference"], top["total_difference"]) == ("RMSNorms", 2240, 4048)
    assert top["share"] == Fraction(2240, 4048)


def test_largest_difference_of_the_presets_is_the_scores():
    """hf-eager keeps 6 bytes per score element (fp32 softmax output, bf16 probabilities), the paper 5
    (probabilities, 1-byte dropout mask, dropout output): one byte more for each of b n_h s^2."""
    for name in ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite"):
        top = sv.largest_difference(name, "moe", 1, 4096)
        assert top["group"] == "attention scores"
        assert top["difference"] == load_model(name).num_attention_heads * 4096 ** 2


def test_analysed_kind():
    assert sv.analysed_kind("deepseek-v3") == "moe" and sv.analysed_kind(T.tiny(first_k_dense_replace=3)) == "dense"


# ------------------------------------------------------------------------------------------------
# one layer, three implementations
# ------------------------------------------------------------------------------------------------
def test_ground_truths_and_by_group():
    gt = sv.ground_truths("deepseek-v3", "moe", 1, 4096)
    groups, entries = gt["groups"], gt["entries"]
    for col, e in entries.items():
        assert groups["total"][col] == sum(e.values()) == sum(x[col] for g, x in groups.items() if g != "total")
    n_h, s = 128, 4096
    assert groups["attention scores"]["megatron-local"] == 2 * n_h * s * s          # bf16 probabilities
    assert groups["attention scores"]["megatron-te"] == 4 * n_h * s                  # fp32 log-sum-exp
    assert gt["local_te_differ"] == ["RMSNorms", "MLA latents and projections", "RoPE", "attention scores"]
    bg = sv.by_group("deepseek-v3", "moe", 1, 4096)
    assert list(bg) == ["paper", *sv.COLUMNS]
    assert sum(bg["paper"].values()) == sv.layer_groups("deepseek-v3", "moe", 1, 4096)["total"]["paper"]
    for c in sv.COLUMNS:
        assert sum(bg[c].values()) == groups["total"][c]
    kd = sv.kernel_differences("deepseek-v3", "moe", 1, 4096)
    assert kd["probs_local"] == 2 * n_h * s * s == 4 * 2**30 and kd["lse_te"] == 4 * n_h * s
    assert kd["total_hf"] == groups["total"]["hf-eager"] == sv.layer_groups(
        "deepseek-v3", "moe", 1, 4096)["total"]["hf-eager"]


def test_megatron_layer_entries_name_a_source_for_every_te_value():
    rows = sv.megatron_layer_entries("deepseek-v2-lite", "moe", 1, 4096)
    gt = sv.ground_truths("deepseek-v2-lite", "moe", 1, 4096)
    assert {r["key"] for r in rows} == set(gt["entries"]["megatron-local"]) | set(gt["entries"]["megatron-te"])
    assert all((r["te"] is None) == (r["source"] is None) for r in rows)
    sources = {r["source"] for r in rows if r["source"]}
    assert sources <= set(sv.TE_SOURCES) | {"measured", "read"}
    assert {"flash_attention", "te_rmsnorm", "measured"} <= sources
    lse = next(r for r in rows if r["key"] == "attention.softmax_lse")
    assert (lse["local"], lse["source"]) == (None, "flash_attention")


# ------------------------------------------------------------------------------------------------
# measurements (torch, transformers, megatron-core)
# ------------------------------------------------------------------------------------------------
def test_hf_comparisons_of_a_miniature_are_exact(extra):
    m = load_model("deepseek-v2-lite")
    rs = sv.hf_comparisons(m)
    assert [r["label"] for r in rs] == [c[0] for c in sv.HF_CASES]
    assert all(r["exact"] and r["activations"]["difference"] == 0 for r in rs)
    assert [(r["micro_batch"], r["seq_len"]) for r in rs] == [(c[2], c[3]) for c in sv.HF_CASES]
    s = sv.hf_summary(rs)
    assert s["all_exact"] and s["mismatched_regions"] == 0 and s["configs"] == len(sv.HF_CASES)
    assert s["measured_bytes"] == sum(r["activations"]["predicted"] for r in rs)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "llama-3-8b"])
def test_hf_comparisons_of_another_familys_miniature_are_exact(extra, name):
    rs = sv.hf_comparisons(load_model(name))
    assert all(r["exact"] and r["activations"]["difference"] == 0 for r in rs), [r["label"] for r in rs]


def test_random_check(extra):
    r = sv.random_check(2, 3)
    assert r == {"configs": 2, "exact": 2, "seed": 3, "all_exact": True}


def test_parameter_checks(extra):
    m = load_model("deepseek-v2-lite")
    pc = sv.parameter_checks(m)
    assert pc[0]["model"] == "deepseek-v2-lite" and pc[0]["is_model"] and not any(r["is_model"] for r in pc[1:])
    assert {r["model"] for r in pc} == {"deepseek-v3", "deepseek-v2", "deepseek-v2-lite"}
    assert all(r["ok"] and r["difference"] == 0 and r["tensors_differing"] == 0 for r in pc)
    assert sum(x["memlib"] for x in pc[0]["block_rows"]) == pc[0]["total"]["memlib"] == 15_706_484_224
    v = sv.versions()
    assert v["pinned"] == {"torch": "2.13.0", "transformers": "5.24.0", "megatron_core": "0.19.2"}
    assert v["same"] == {k: v["installed"][k] == v["pinned"][k] for k in v["pinned"]}


def test_megatron_comparisons_of_a_miniature_are_exact(mcore):
    m = load_model("deepseek-v3")          # MTP, q LoRA, sigmoid routing with bias and groups
    rs = sv.megatron_comparisons(m)
    assert [r["label"] for r in rs] == [c[0] for c in sv.MEGATRON_CASES]
    assert all(r["exact"] for r in rs), [r.get("error") for r in rs]
    s = sv.megatron_summary(rs)
    assert s["all_exact"] and s["mismatched_blocks"] == 0 and s["parameter_difference"] == 0
    assert any(r["region"].startswith("mtp.") for r in rs[0]["regions"])
    both = sv.measure_all(m)                 # cached: the same results
    assert both["megatron"] is rs and both["hf"] is sv.hf_comparisons(m)


# ------------------------------------------------------------------------------------------------
# the recorded GPU run
# ------------------------------------------------------------------------------------------------
def test_the_committed_gpu_result_is_of_the_gpu_configs():
    """The benchmark runs :data:`GPU_CONFIGS`; its committed result names the same configurations,
    micro-batches and sequence lengths, in order."""
    spec = importlib.util.spec_from_file_location("gpu_validation", ROOT / "benchmarks" / "gpu_validation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.CONFIGS is sv.GPU_CONFIGS
    rows = json.loads(sv.GPU_RESULT.read_text())["rows"]
    assert [(r["config"], r["micro_batch"], r["seq_len"]) for r in rows] == [(n, b, s) for n, _, b, s in sv.GPU_CONFIGS]


def test_gpu_run_fields():
    run = sv.gpu_run()
    assert (run["device"], run["torch"], run["torch_version"], run["transformers"]) == (
        "NVIDIA H200", "2.11.0+cu130", "2.11.0", "5.24.0")
    assert run["pinned"]["torch"] == "2.13.0" and not run["same_torch"] and run["same_transformers"]
    assert (run["configs"], run["exact"], run["all_exact"], run["largest"]) == (3, 3, True, "v3-widths")
    assert run["all_same_prediction"]            # today's hf-eager ledger predicts what the run recorded
    big = next(r for r in run["rows"] if r["config"] == "v3-widths")
    assert big["widths_of"] == "deepseek-v3" and big["model"].layer_kinds == ("dense", "moe")
    assert (big["saved"], big["reserved"], big["held_after_forward"]) == (33_078_871_052, 84_160_806_912,
                                                                           34_137_901_568)
    # the weights: bf16 parameters, the router's N h weights in fp32
    from memlib.model.params import model_params, values

    m = big["model"]
    n = model_params(m).evaluate_total(values(m))
    router = m.n_routed_experts * m.hidden_size
    assert big["weights"] == 2 * n + 2 * router
    assert big["allocated_after_min"] == big["weights"] + big["held_after_forward"]
    assert big["peak_min"] == big["weights"] + big["peak_above_before"]
    assert big["reserved_over_peak_max"] == big["reserved"] - big["peak_min"] > 0
    assert big["reserved_over_allocated_max"] > big["reserved_over_peak_max"]
    assert big["held_beyond_logits"] == -31_244
    assert [r["widths_of"] for r in run["rows"]] == [None, None, "deepseek-v3"]
    assert run["cuda"] == "13.0" and run["order"] == ["small", "medium", "v3-widths"]


def test_gpu_shared_is_what_no_table_column_gives():
    # every GPU config shares DeepSeek-V3's head dimensions (qk_nope 128, v 128, rope 64), no group-limited
    # routing and no MTP module; the table's columns are not repeated
    assert sv.gpu_shared() == {"d_h": 128, "d_v": 128, "d_hR": 64, "n_g": 1, "k_g": 1, "n_mtp": 0}
    assert not set(sv.gpu_shared()) & set(sv.GPU_TABLE_SYMBOLS)


def test_gpu_run_cuda_from_the_build_tag(tmp_path):
    data = json.loads(sv.GPU_RESULT.read_text())
    for tag, cuda in (("2.11.0+cu130", "13.0"), ("2.6.0+cu124", "12.4"), ("2.6.0", None)):
        p = tmp_path / "run.json"
        p.write_text(json.dumps({**data, "torch": tag}))
        assert sv.gpu_run(p)["cuda"] == cuda


def test_gpu_run_refuses_a_row_that_is_not_its_configuration(tmp_path):
    data = json.loads(sv.GPU_RESULT.read_text())
    data["rows"][0]["micro_batch"] = 7
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="not those of GPU_CONFIGS"):
        sv.gpu_run(path)
    with pytest.raises(ConfigError):
        sv.gpu_model("large")
