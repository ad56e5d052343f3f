"""Megatron-LM's launch flags read as a memlib configuration (memlib.megatron.flags, ``memlib estimate
--megatron-args``): Megatron-LM's own functional tests (their model_config.yaml, copied under
tests/data/megatron/ with their source and commit), hand-written flag lists for every rule and error,
layout strings against Megatron-Core's layer numbering, the vocabulary padded by hand, a launch script,
and the command line."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from memlib import cli
from memlib.config import ConfigError, TrainingConfig
from memlib.config.strategies import AttnBackend, LoadBalancing
from memlib.megatron.layout import MegatronLayout, layout_stages, megatron_layout, parse_layout
from memlib.megatron.listexpr import moe_layer_pattern, pattern_to_hf
from memlib.megatron.flags import parse_megatron_args
from memlib.megatron.rules import pad_vocab, precision_spec
from memlib.megatron.reader import read_flags
from memlib.device.estimate import estimate
from memlib.model.partition import Partition
from memlib.config.precision import recipe
from memlib.data.reference import MEGATRON_LM_COMMIT as COMMIT

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "megatron"
MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")

#: the world size of each case.  The moe/ and gpt/ tests run on one node of 8 GPUs: Megatron-LM's
#: tests/test_utils/recipes/h100/{moe,gpt}.yaml (nodes: 1, gpus: 8) and gb200/ (nodes: 2, gpus: 4).
#: The DeepSeek-V3 proxies have no recipe at the commit: the world is a parameter, here the smallest that
#: their flags allow (EP ETP must divide DP TP CP: TP2 EP16 needs DP 8 on PP4, TP2 EP8 needs DP 4 on PP2).
WORLD = {
    "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed": 8,
    "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8": 8,
    "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental": 8,
    "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading": 8,
    "moe/gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4": 8,
    "gpt/gpt3_mcore_te_tp2_pp2_mla": 8,
    "mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release": 64,
    "mixtral/deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release": 16,
}


def fixture(case: str) -> Path:
    return DATA / (case.replace("/", "_") + ".yaml")


# the small MoE tests' model (16 layers of h 1024, 32 experts of 1024, one shared, top-4 of 4 groups / 2)
_SMALL_MOE = dict(hidden_size=1024, intermediate_size=4096, moe_intermediate_size=1024, num_attention_heads=32,
                  qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536, kv_lora_rank=512,
                  n_routed_experts=32, n_shared_experts=1, num_experts_per_tok=4, num_hidden_layers=16,
                  first_k_dense_replace=1, moe_layer_freq=1, num_nextn_predict_layers=1, tie_word_embeddings=False,
                  router_bias=True, n_group=4, topk_group=2, scoring_func="sigmoid",
                  vocab_size=51712)   # GPT-2's 50,257 padded to a multiple of 3232 * TP 2 = 6464: 8 * 6464
_PROXY = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_attention_heads=128,
              qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536, kv_lora_rank=512,
              n_routed_experts=64, n_shared_experts=1, num_experts_per_tok=8, num_hidden_layers=14,
              first_k_dense_replace=3, moe_layer_freq=1, num_nextn_predict_layers=1, tie_word_embeddings=False,
              router_bias=True, n_group=8, topk_group=4, scoring_func="sigmoid",
              vocab_size=258560)  # 256,000 padded to a multiple of 3232 * 2 = 6464: 40 * 6464
_SMALL_TRAIN = dict(dp=2, tp=2, pp=2, ep=4, etp=1, cp=1, sp=True, zero=1, precision="megatron", micro_batch=4,
                    seq_len=4096, num_microbatches=4, vpp=4, schedule="interleaved", recompute="none",
                    transformer_impl="transformer_engine", attention_backend="unfused",
                    cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native", moe_aux_loss="seq_aux_loss",
                    attention_softmax_in_fp32=False, overlap_grad_reduce=True, overlap_param_gather=True,
                    moe_a2a_overlap=False, offload_modules=[], fp8=None, fp8_recipe="delayed")
_ROPE = "--no-rope-fusion (memlib counts the fused MLA RoPE with transformer_engine)"

CASES = {
    "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed": (
        _SMALL_MOE,
        {**_SMALL_TRAIN, "layout": [2] * 8},                  # 16 layers over PP2 x VPP4, Megatron's even split
        (_ROPE,)),
    "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8": (
        _SMALL_MOE,
        {**_SMALL_TRAIN, "layout": [2] * 8, "fp8": "hybrid", "fp8_recipe": "tensorwise"},
        (_ROPE,)),
    "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental": (
        {**_SMALL_MOE, "first_k_dense_replace": 3},           # ([0]*3+[1]*13)
        {**_SMALL_TRAIN, "layout": [3, 2, 2, 2, 2, 2, 2, 1],  # Et*3|(tt|)*6tmL
         "recompute": "layernorm,mla_up_proj,mlp,moe_act", "moe_a2a_overlap": True},
        (_ROPE,)),
    "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading": (
        {**_SMALL_MOE, "first_k_dense_replace": 3, "num_hidden_layers": 15},
        {**_SMALL_TRAIN, "layout": [3, 2, 2, 2, 2, 2, 2, 0],  # Et*3|(tt|)*6mL: the last stage holds MTP and loss
         "micro_batch": 1, "num_microbatches": 4, "recompute": "layernorm,mla_up_proj,mlp,moe_act",
         "moe_a2a_overlap": True, "cross_entropy_loss_fusion": False, "overlap_grad_reduce": False,
         "overlap_param_gather": False,
         "offload_modules": ["expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear", "core_attn", "attn_proj"]},
        (_ROPE,)),
    "gpt/gpt3_mcore_te_tp2_pp2_mla": (
        # a dense MLA model: every layer dense, one placeholder expert of the FFN's width; 4 h FFN (no --swiglu);
        # GPT-2's vocabulary padded to 128 * TP 2 = 256: 197 * 256 = 50432
        dict(hidden_size=512, intermediate_size=2048, moe_intermediate_size=2048, num_attention_heads=8,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=192, kv_lora_rank=64,
             n_routed_experts=1, n_shared_experts=0, num_experts_per_tok=1, num_hidden_layers=4,
             first_k_dense_replace=4, moe_layer_freq=1, num_nextn_predict_layers=0, tie_word_embeddings=False,
             router_bias=False, n_group=1, topk_group=1, scoring_func="softmax", vocab_size=50432),
        dict(dp=2, tp=2, pp=2, ep=1, etp=1, cp=1, sp=True, zero=0, precision="megatron", micro_batch=4, seq_len=1024,
             num_microbatches=4, vpp=1, schedule="1f1b", layout=[2, 2], recompute="none",
             transformer_impl="transformer_engine", attention_backend="unfused", cross_entropy_loss_fusion=False,
             moe_aux_loss="none", attention_softmax_in_fp32=True, overlap_grad_reduce=False,
             overlap_param_gather=False, fp8=None),
        ("biases (no --disable-bias-linear)",
         "--normalization=LayerNorm (Megatron's default; memlib counts RMSNorm)",
         "no --swiglu (memlib counts a SwiGLU feed-forward)",
         "no --qk-layernorm (memlib counts MLA's latent RMSNorms)",
         "--position-embedding-type=learned_absolute (Megatron's default)")),
    "mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release": (
        _PROXY,
        dict(dp=8, tp=2, pp=4, ep=16, etp=1, cp=1, sp=True, zero=1, precision="megatron", micro_batch=1,
             seq_len=4096, num_microbatches=64, vpp=2, schedule="interleaved",
             layout=[2, 2, 2, 2, 2, 2, 1, 1],                # Et*2|(tt|)*5t|tmL: 8 stages over PP4
             recompute="none", attention_backend="auto", cross_entropy_loss_fusion=True, moe_aux_loss="seq_aux_loss",
             overlap_grad_reduce=True, overlap_param_gather=True),
        ()),
    "mixtral/deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release": (
        _PROXY,
        dict(dp=4, tp=2, pp=2, ep=8, etp=1, cp=1, sp=True, zero=1, precision="megatron", micro_batch=4, seq_len=4096,
             num_microbatches=32, vpp=1, schedule="1f1b", layout=[7, 7],   # "Et*7|t*7mL"
             recompute="none", attention_backend="auto", cross_entropy_loss_fusion=True),
        ()),
}


# ---------------------------------------------------------------------------------------------
# Megatron-LM's functional tests
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_functional_test_case(case):
    model, train, warnings = CASES[case]
    run = parse_megatron_args(fixture(case).read_text(), world_size=WORLD[case], name=case)
    got = run.model.values()
    assert {k: got[k] for k in model} == model
    cfg = run.train.values()
    assert {k: cfg[k] for k in train} == train
    assert cfg["profile"] == "megatron" and run.world_size == WORLD[case] == cfg["world_size"]
    assert run.not_modelled == warnings
    # every flag is classified once: mapped, without a memory effect, or in the warning
    flags = [f.name for f in read_flags(fixture(case).read_text())]
    named = set(run.mapped) | set(run.no_effect) | {w.split("=")[0].split(" ")[0] for w in warnings}
    assert set(flags) - named <= {"--fp8-recipe", "--overlap-param-gather", "--hidden-dropout", "--attention-dropout"}
    assert not set(run.mapped) & set(run.no_effect)
    # and the configuration runs: every stage has a positive total, in milliseconds
    est = estimate(run.model, run.train)
    assert all(s.total > 0 for s in est.stages)


def test_the_gelu_expert_case_reads():
    """A GPT MoE shell without --swiglu reads: its experts are GeLU MLPs of --moe-ffn-hidden-size (fc1 and fc2,
    2 h h_E each, no biases with --disable-bias-linear); what memlib does not count is named (the allgather
    dispatcher, a router without --moe-router-dtype)."""
    from memlib.model.architecture import model_values
    from memlib.model.params import expert_params

    case = "moe/gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4"
    run = parse_megatron_args(fixture(case).read_text(), world_size=WORLD[case])
    m = run.model
    assert (m.mlp, m.hidden_act, m.norm, m.positions, m.mlp_bias) == ("gelu", "gelu", "layernorm", "learned", False)
    assert (m.n_routed_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.hidden_size) == (8, 2, 2048, 512)
    assert expert_params(m).xreplace(model_values(m)) == 2 * 512 * 2048
    assert not run.train.bias_swiglu_fusion          # Megatron-LM turns bias-GeLU fusion off without biases
    assert run.not_modelled == ("--moe-token-dispatcher-type=allgather (Megatron's default; memlib counts alltoall)",
                                "no --moe-router-dtype (memlib counts an fp32 router)")


@pytest.mark.parametrize("case", sorted(WORLD))
def test_fixtures_are_the_files_at_the_commit(case):
    """Each fixture names its source and commit, and (where the Megatron-LM mirror is present) its body
    is that file byte for byte."""
    text = fixture(case).read_text()
    path = f"tests/functional_tests/test_cases/{case}/model_config.yaml"
    header = text.splitlines()[:4]
    assert path in header[0] and COMMIT in header[1]
    if not MIRROR.is_dir():
        pytest.skip("the Megatron-LM mirror is not on this machine (CI): the header is checked")
    source = subprocess.run(["git", "-C", str(MIRROR), "show", f"{COMMIT}:{path}"], capture_output=True,
                            text=True, check=True).stdout
    assert "\n".join(text.splitlines()[4:]) == source.rstrip("\n")


def test_the_fixture_cases_are_the_issues_list():
    assert set(WORLD) == set(CASES) | {"moe/gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4"}
    assert sorted(p.name for p in DATA.glob("*.yaml")) == sorted(fixture(c).name for c in WORLD)


# ---------------------------------------------------------------------------------------------
# a hand-written flag list, changed one rule at a time
# ---------------------------------------------------------------------------------------------
BASE = {
    "--num-layers": "4", "--hidden-size": "64", "--ffn-hidden-size": "96", "--num-attention-heads": "4",
    "--multi-latent-attention": None, "--q-lora-rank": "24", "--kv-lora-rank": "16", "--qk-head-dim": "8",
    "--qk-pos-emb-head-dim": "4", "--v-head-dim": "8", "--num-experts": "8", "--moe-ffn-hidden-size": "32",
    "--moe-router-topk": "2", "--micro-batch-size": "1", "--seq-length": "64", "--bf16": None, "--swiglu": None,
    "--normalization": "RMSNorm", "--disable-bias-linear": None, "--qk-layernorm": None,
    "--position-embedding-type": "rope", "--attention-dropout": "0.0", "--hidden-dropout": "0.0",
    "--moe-token-dispatcher-type": "alltoall", "--moe-router-dtype": "fp32", "--vocab-size": "1000",
    "--tokenizer-type": "NullTokenizer",
}


def flags(**changes) -> str:
    """The base flag list with ``changes`` (``--x-y`` as x_y; None: a switch; False: left out)."""
    d = dict(BASE)
    for k, v in changes.items():
        d["--" + k.replace("_", "-")] = v
    return " ".join(k if v is None else f"{k} {v}" for k, v in d.items() if v is not False)


def parse(world=1, **changes):
    return parse_megatron_args(flags(**changes), world_size=world)


def test_base_list_maps_to_the_expected_model_and_nothing_is_unmodelled():
    run = parse()
    m = run.model
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size, m.num_attention_heads) == (4, 64, 96, 4)
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (24, 16, 8, 4, 8)
    assert (m.n_routed_experts, m.moe_intermediate_size, m.num_experts_per_tok, m.n_shared_experts) == (8, 32, 2, 0)
    assert (m.first_k_dense_replace, m.moe_layer_freq, m.num_nextn_predict_layers) == (0, 1, 0)
    assert m.tie_word_embeddings and not m.router_bias and m.scoring_func == "softmax"
    assert m.vocab_size == 1024                          # 1000 padded to 128 (TP 1)
    assert run.not_modelled == () and run.warning() == ""
    t = run.train
    assert (t.dp, t.tp, t.pp, t.ep, t.etp, t.cp, t.zero, t.vpp, t.schedule) == (1, 1, 1, 1, 1, 1, 0, 1, "1f1b")
    assert (t.micro_batch, t.seq_len, t.num_microbatches, t.recompute, t.precision) == (1, 64, 1, "none", "megatron")
    assert t.moe_aux_loss is LoadBalancing.NONE           # Megatron's default coefficient is 0
    assert t.profile == "megatron" and not t.sp           # sequence parallelism is off at TP 1


def test_megatron_defaults():
    """Flags left out take Megatron-LM's defaults: MLA dims 128/64/128, kv rank 32, no q LoRA, top-2,
    FFN 4h (with --swiglu int(8h/3/64)*64), the MoE width the FFN's, tied embeddings."""
    run = parse(q_lora_rank=False, kv_lora_rank=False, qk_head_dim=False, qk_pos_emb_head_dim=False,
                v_head_dim=False, moe_router_topk=False, ffn_hidden_size=False, moe_ffn_hidden_size=False,
                hidden_size="1024", num_attention_heads="8")
    m = run.model
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (None, 32, 128, 64, 128)
    assert m.num_experts_per_tok == 2 and m.tie_word_embeddings
    assert m.intermediate_size == int((4 * 1024 * 2 / 3) / 64) * 64 == 2688 == m.moe_intermediate_size
    assert parse(swiglu=False, ffn_hidden_size=False).model.intermediate_size == 4 * 64


def test_untied_embeddings_shared_experts_mtp_and_routing():
    m = parse(untie_embeddings_and_output_weights=None, moe_shared_expert_intermediate_size="64",
              mtp_num_layers="1", moe_router_score_function="sigmoid", moe_router_enable_expert_bias=None,
              moe_router_num_groups="4", moe_router_group_topk="2").model
    assert not m.tie_word_embeddings and m.n_shared_experts == 2 and m.num_nextn_predict_layers == 1
    assert m.router_bias and m.scoring_func == "sigmoid" and (m.n_group, m.topk_group) == (4, 2)
    # the number of groups alone does not turn group-limited routing on
    assert parse(moe_router_num_groups="4").model.n_group == 1


@pytest.mark.parametrize("freq,k,f", [("1", 0, 1), ("2", 0, 2), ("([0]*1+[1]*3)", 1, 1), ("[0]*2+[1]*2", 2, 1),
                                      ("[0,0,1,1]", 2, 1), ("([1]*1+[0]*1)*2", 0, 2), ("[0]*4", 4, 1)])
def test_moe_layer_freq(freq, k, f):
    m = parse(moe_layer_freq=f"'{freq}'").model
    assert (m.first_k_dense_replace, m.moe_layer_freq) == (k, f)
    assert m.layer_kinds == tuple("moe" if x else "dense" for x in moe_layer_pattern(freq, 4))


@pytest.mark.parametrize("freq,message", [
    ("'[0,1,0,1]'", r"--moe-layer-freq='0101' \(1: MoE\) is a layer pattern memlib cannot express"),
    ("'[0]*3+[1]*5'", r"gives 8 layers but --num-layers=4"),
    ("'[0]*3 + [1]'", r"may hold only digits"),
    ("'[2]*4'", r"every entry must be 0 \(dense\) or 1 \(MoE\)"),
    ("'[1]*len(\"abcd\")'", r"may hold only digits"),
    ("'([1]*4'", r"'\)' is expected"),
    ("'[1]*9999999'", r"a number of at most 6 digits"),
    ("'[1]*999999*999999'", r"grows past 65,536 layers"),
    ("0", r"must be a positive integer or a list expression"),
])
def test_moe_layer_freq_errors(freq, message):
    with pytest.raises(ConfigError, match=message):
        parse(moe_layer_freq=freq)


def test_pattern_to_hf_round_trips_every_expressible_pattern():
    """Every (k, f) Hugging Face can express comes back from its own pattern (property, n <= 9)."""
    for n in range(1, 10):
        for k in range(n + 1):
            for f in range(1, n + 1):
                pattern = tuple(int(i >= k and i % f == 0) for i in range(n))
                k2, f2 = pattern_to_hf(pattern)
                assert tuple(int(i >= k2 and i % f2 == 0) for i in range(n)) == pattern


@pytest.mark.parametrize("changes,message", [
    (dict(multi_latent_attention=False, num_experts="8", swiglu=False, moe_router_topk="1",
          moe_router_load_balancing_type="sinkhorn"), r"--moe-router-load-balancing-type=sinkhorn cannot be expressed"),
    (dict(group_query_attention=None), r"--group-query-attention=on with --multi-latent-attention"),
    (dict(hybrid_layer_pattern="M*M*"), r"hybrid \(Mamba\) models"),
    (dict(num_layers=False), r"--num-layers is required"),
    (dict(micro_batch_size=False), r"--micro-batch-size is required"),
    (dict(seq_length=False), r"--seq-length is required"),
    (dict(moe_shared_expert_intermediate_size="48"), r"--moe-shared-expert-intermediate-size=48 must be a multiple "
                                                     r"of --moe-ffn-hidden-size=32"),
    (dict(moe_router_score_function="sqrtsoftplus"), r"sqrtsoftplus cannot be expressed"),
    (dict(moe_router_enable_expert_bias=None), r"expert bias with sigmoid only"),
    (dict(moe_router_group_topk="2"), r"--moe-router-group-topk=2 needs --moe-router-num-groups"),
    (dict(moe_router_topk="1"), r"--moe-router-topk=1 with softmax scores needs --moe-router-pre-softmax"),
    (dict(hidden_size="66"), r"--hidden-size=66 must be divisible by --num-attention-heads=4"),
    (dict(num_layers="x"), r"--num-layers='x' must be a positive integer"),
    (dict(num_layers="0"), r"--num-layers=0 must be a positive integer"),
    (dict(num_layers="99999999999"), r"--num-layers=99999999999 exceeds 2\^16"),
    (dict(num_layers="$LAYERS"), r"--num-layers='\$LAYERS' is a shell variable"),
    (dict(num_layers="4 5"), r"--num-layers='4 5' takes one value, not 2"),
    (dict(bf16="x"), r"--bf16='x': the flag is a switch and takes no value"),
    (dict(fp16=None), r"--bf16=on and --fp16=on contradict each other"),
    (dict(num_experts=False, expert_model_parallel_size="2"), r"--expert-model-parallel-size=2 needs --num-experts"),
])
def test_model_errors_are_one_line(changes, message):
    with pytest.raises(ConfigError, match=message) as exc:
        parse(world=2, **changes)
    assert "\n" not in str(exc.value)


def test_structure_memlib_does_not_count_is_in_the_warning():
    """MLA with a GPT shell's blocks: memlib's MLA model has RMSNorm, SwiGLU, RoPE, no biases; dropout is counted."""
    run = parse(disable_bias_linear=False, normalization=False, swiglu=False, qk_layernorm=False,
                position_embedding_type=False, attention_dropout=False, hidden_dropout="0.1",
                moe_token_dispatcher_type=False, moe_router_dtype=False)
    assert run.not_modelled == (
        "biases (no --disable-bias-linear)", "--normalization=LayerNorm (Megatron's default; memlib counts RMSNorm)",
        "no --swiglu (memlib counts a SwiGLU feed-forward)", "no --qk-layernorm (memlib counts MLA's latent RMSNorms)",
        "--position-embedding-type=learned_absolute (Megatron's default)",
        "--moe-token-dispatcher-type=allgather (Megatron's default; memlib counts alltoall)",
        "no --moe-router-dtype (memlib counts an fp32 router)")
    assert run.warning().startswith("not modelled (7): biases (no --disable-bias-linear), ")
    assert (run.train.attention_dropout, run.train.hidden_dropout) == (Fraction(1, 10), Fraction(1, 10))


def test_dropout_defaults_are_megatrons_and_the_flags_win():
    assert (parse().train.hidden_dropout, parse().train.attention_dropout) == (0, 0)     # the base list gives 0.0
    run = parse(hidden_dropout=False, attention_dropout="0.2")
    assert (run.train.hidden_dropout, run.train.attention_dropout) == (Fraction(1, 10), Fraction(1, 5))
    over = parse_megatron_args(flags(hidden_dropout=False), world_size=1, overrides={"hidden_dropout": Fraction(0)})
    assert over.train.hidden_dropout == 0 and over.overridden["hidden_dropout"]["given"] == 0


def test_cp_comm_type():
    run = parse(world=2, context_parallel_size="2", cp_comm_type="a2a")
    assert run.train.cp_comm_type == "a2a"
    assert parse(world=2, context_parallel_size="2", cp_comm_type="all_gather all_gather").train.cp_comm_type == \
        "allgather"
    with pytest.raises(ConfigError, match="one communication type for every layer"):
        parse(world=2, context_parallel_size="2", cp_comm_type="p2p a2a")
    with pytest.raises(ConfigError, match=r"--cp-comm-type='ring' must be one of p2p, a2a, allgather, a2a\+p2p"):
        parse(world=2, context_parallel_size="2", cp_comm_type="ring")


GQA = ("--num-layers 2 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
       "--micro-batch-size 2 --bf16 --tokenizer-type NullTokenizer --vocab-size 1000 --world-size 1")


def test_models_without_mla():
    """A GPT-3 shell (LayerNorm, GeLU, learned positions, biases, tied), a Llama (GQA, SwiGLU, RMSNorm, RoPE) and a
    Mixtral (its experts, softmax after the top-k) read from their flags."""
    gpt = parse_megatron_args(GQA).model
    assert (gpt.attention, gpt.mlp, gpt.norm, gpt.positions, gpt.family) == ("gqa", "gelu", "layernorm", "learned", "gpt")
    assert (gpt.qkv_bias, gpt.o_bias, gpt.mlp_bias, gpt.tie_word_embeddings) == (True, True, True, True)
    assert (gpt.num_key_value_heads, gpt.head_dim, gpt.intermediate_size, gpt.max_position_embeddings) == (8, 64, 2048, 1024)
    llama = parse_megatron_args(GQA + " --group-query-attention --num-query-groups 2 --swiglu --normalization RMSNorm "
                                "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights"
                                " --ffn-hidden-size 1536").model
    assert (llama.attention, llama.mlp, llama.norm, llama.positions, llama.family) == ("gqa", "swiglu", "rmsnorm", "rope",
                                                                                        "llama")
    assert (llama.num_key_value_heads, llama.qkv_bias, llama.tie_word_embeddings) == (2, False, False)
    mixtral = parse_megatron_args(GQA + " --group-query-attention --num-query-groups 2 --swiglu --normalization RMSNorm "
                                  "--position-embedding-type rope --disable-bias-linear --num-experts 8 "
                                  "--moe-router-topk 2 --moe-token-dispatcher-type alltoall --moe-router-dtype fp32")
    m = mixtral.model
    assert (m.moe, m.n_routed_experts, m.num_experts_per_tok, m.first_k_dense_replace, m.family) == ("mixtral", 8, 2, 0,
                                                                                                      "mixtral")
    assert mixtral.not_modelled == ()
    assert estimate(m, mixtral.train).stages[0].total > 0


def test_biased_gelu_experts_need_the_bias_gelu_fusion_off():
    """Megatron-LM's bias-GeLU fusion is on by default where the Linears have biases; Megatron-Core's experts have
    no fused weighted GeLU, so it refuses them (with --disable-bias-linear Megatron-LM turns the fusion off)."""
    run = parse_megatron_args(GQA + " --num-experts 4")
    assert run.model.mlp_bias and run.train.bias_swiglu_fusion
    with pytest.raises(ConfigError, match=r"^bias_swiglu_fusion=True .* with GeLU experts and biases: Megatron-Core "
                                          r"fuses only SwiGLU") as exc:
        estimate(run.model, run.train).stages
    assert "\n" not in str(exc.value)
    run = parse_megatron_args(GQA + " --num-experts 4 --no-bias-gelu-fusion")
    assert not run.train.bias_swiglu_fusion and estimate(run.model, run.train).stages[0].total > 0
    assert not parse_megatron_args(GQA + " --num-experts 4 --disable-bias-linear").train.bias_swiglu_fusion


@pytest.mark.parametrize("extra, message", [
    (" --num-experts 4 --moe-router-topk 1", "--moe-router-topk=1 with softmax scores needs --moe-router-pre-softmax"),
    (" --num-experts 4 --moe-router-topk 1 --moe-router-load-balancing-type sinkhorn", "sinkhorn cannot be expressed"),
])
def test_gelu_expert_errors(extra, message):
    """The top-1 rule is Megatron-Core's: sinkhorn routing is excepted (and then refused for itself)."""
    with pytest.raises(ConfigError, match=message):
        parse_megatron_args(GQA + extra)


@pytest.mark.parametrize("extra, message", [
    (" --squared-relu", "--squared-relu=on"),
    (" --position-embedding-type none", "--position-embedding-type=none"),
    (" --group-query-attention --num-query-groups 3", "--num-query-groups=3 must divide --num-attention-heads=8"),
    (" --position-embedding-type rope --mtp-num-layers 1", "MTP modules of MLA models"),
])
def test_models_without_mla_errors(extra, message):
    with pytest.raises(ConfigError, match=message):
        parse_megatron_args(GQA + extra)


def test_unknown_and_unmapped_flags_are_classified():
    run = parse(lr="1e-4", log_interval="1", save="/ckpt", seed="3", moe_z_loss_coeff="1e-3", made_up_flag=None,
                use_mcore_models=None, nproc_per_node="8")
    assert run.not_modelled == ("--moe-z-loss-coeff", "--made-up-flag")
    assert {"--lr", "--log-interval", "--save", "--seed", "--use-mcore-models", "--nproc-per-node"} <= set(run.no_effect)
    assert "--num-layers" in run.mapped and run.mapped["--hidden-size"] == "64" and run.mapped["--bf16"] == ""


# ---------------------------------------------------------------------------------------------
# parallelism
# ---------------------------------------------------------------------------------------------
def test_dp_is_world_over_tp_pp_cp_and_etp_defaults_to_tp():
    run = parse(world=48, tensor_model_parallel_size="2", pipeline_model_parallel_size="2",
                context_parallel_size="2", expert_model_parallel_size="4", sequence_parallel=None,
                global_batch_size="12")
    t = run.train
    assert (t.dp, t.tp, t.pp, t.cp, t.ep, t.etp) == (6, 2, 2, 2, 4, 2)   # 48 / (2*2*2); ETP = TP
    assert t.edp == 6 * 2 * 2 // (4 * 2) == 3 and t.sp and t.world_size == 48
    assert t.num_microbatches == 12 // (1 * 6) == 2


@pytest.mark.parametrize("world,changes,message", [
    (6, dict(tensor_model_parallel_size="4", sequence_parallel=None), r"world_size=6 must be divisible by tp\*pp\*cp=4"),
    (8, dict(expert_model_parallel_size="8", expert_tensor_parallel_size="2"),
     r"ep\*etp=16 \(--expert-model-parallel-size=8, --expert-tensor-parallel-size=2\) must divide dp\*tp\*cp=8"),
    (3, dict(expert_model_parallel_size="3"), r"--expert-model-parallel-size=3 must divide --num-experts=8"),
    (2, dict(tensor_model_parallel_size="2"), r"--tensor-model-parallel-size=2 with --num-experts needs "
                                              r"--sequence-parallel"),
    (4, dict(global_batch_size="6"), r"--global-batch-size=6 must be divisible by micro-batch\*dp=4"),
    (None, {}, r"^world_size=unknown: give --world-size N"),
    (4, dict(context_parallel_size="4", seq_length="60"), r"--seq-length=60 must be a multiple of 2\*cp=8"),
])
def test_parallel_errors(world, changes, message):
    with pytest.raises(ConfigError, match=message):
        parse_megatron_args(flags(**changes), world_size=world)


def test_distributed_optimizer_is_zero1_and_global_batch_defaults_to_one_step():
    t = parse(world=4, use_distributed_optimizer=None).train
    assert t.zero == 1 and t.num_microbatches == 1
    assert parse(world=4, global_batch_size="32", micro_batch_size="2").train.num_microbatches == 32 // (2 * 4)


def test_world_size_from_torchrun_and_a_file_line():
    text = "torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py " + flags(global_batch_size="16")
    assert parse_megatron_args(text).world_size == 16
    assert parse_megatron_args(flags(world_size="4")).world_size == 4
    with pytest.raises(ConfigError, match=r"--world-size=4 but torchrun's --nproc_per_node and --nnodes give 16"):
        parse_megatron_args(text + " --world-size 4")
    # the caller's world size wins, and the output says the file's was overridden
    run = parse_megatron_args(text, world_size=8)
    assert run.world_size == 8 and run.overridden == {"world_size": {"file": 16, "given": 8}}
    # a variable launcher leaves the world unknown
    with pytest.raises(ConfigError, match="world_size=unknown"):
        parse_megatron_args("torchrun --nproc_per_node $GPUS pretrain_gpt.py " + flags())


def test_virtual_stages_and_the_interleaved_schedule():
    base = dict(num_layers="8", pipeline_model_parallel_size="2", global_batch_size="4")
    t = parse(world=2, num_virtual_stages_per_pipeline_rank="2", **base).train
    assert (t.vpp, t.schedule, t.layout) == (2, "interleaved", (2, 2, 2, 2))
    assert parse(world=2, virtual_pipeline_model_parallel_size="2", **base).train.vpp == 2   # the older name
    t = parse(world=2, num_layers_per_virtual_pipeline_stage="1", **base).train            # 8 / 2 / 1 = 4
    assert (t.vpp, t.layout) == (4, (1,) * 8)
    t = parse(world=2, **base).train
    assert (t.vpp, t.schedule, t.layout) == (1, "1f1b", (4, 4))
    with pytest.raises(ConfigError, match=r"--pipeline-model-parallel-layout='?Et\|tt\|tt\|tttL'? and "
                                          r"--num-virtual-stages-per-pipeline-rank=2 contradict each other"):
        parse(world=2, pipeline_model_parallel_layout="'Et|tt|tt|tttL'", num_virtual_stages_per_pipeline_rank="2",
              **base)
    with pytest.raises(ConfigError, match=r"vpp=2\) need --pipeline-model-parallel-size > 1"):
        parse(num_virtual_stages_per_pipeline_rank="2")


def test_uneven_first_and_last_stages_and_the_embedding_in_the_split():
    base = dict(num_layers="10", pipeline_model_parallel_size="4", global_batch_size="4")
    t = parse(world=4, decoder_first_pipeline_num_layers="1", decoder_last_pipeline_num_layers="3", **base).train
    assert t.layout == (1, 3, 3, 3)
    t = parse(world=4, num_layers_in_first_pipeline_stage="4", **base).train    # the older name; 6 over 3 stages
    assert t.layout == (4, 2, 2, 2)
    t = parse(world=4, account_for_embedding_in_pipeline_split=None, account_for_loss_in_pipeline_split=None,
              **base).train                                                      # (10 + 2) / 4 = 3, ends give one up
    assert t.layout == (2, 3, 3, 2)
    with pytest.raises(ConfigError, match=r"the 9 middle layers must divide evenly over the 2 middle"):
        parse(world=3, decoder_first_pipeline_num_layers="1", **dict(base, pipeline_model_parallel_size="3",
                                                                   global_batch_size="3"))


def test_megatron_layout_by_hand():
    assert megatron_layout(16, 2, 4) == (2,) * 8
    # uneven with VPP: rank 0 holds 4 (2 per chunk), the middle 12 over 2 ranks (6: 3 per chunk), last 4
    assert megatron_layout(20, 4, 2, first=4, last=4) == (2, 3, 3, 2, 2, 3, 3, 2)
    # (6 + 2) / 2 = 4 per rank, 2 per chunk; the first chunk gives one up for the embedding, the last for the loss
    assert megatron_layout(6, 2, 2, embedding_in_split=True, loss_in_split=True) == (1, 2, 2, 1)
    with pytest.raises(ConfigError, match=r"must be divisible by pp=3"):
        megatron_layout(8, 3, 1)
    with pytest.raises(ConfigError, match=r"divisible by vpp=3"):
        megatron_layout(8, 2, 3)
    with pytest.raises(ConfigError, match=r"not a multiple of vpp=2"):
        megatron_layout(9, 3, 2, first=3)
    with pytest.raises(ConfigError, match=r"cannot be used with --account-for"):
        megatron_layout(8, 2, 1, first=3, embedding_in_split=True)


# ---------------------------------------------------------------------------------------------
# layout strings
# ---------------------------------------------------------------------------------------------
def megatron_layer_ids(stages: tuple[str, ...], pp: int) -> dict[tuple[int, int], list[int]]:
    """Decoder layer ids per (pp rank, vpp rank), computed as Megatron-Core does it
    (pipeline_parallel_layer_layout.py at d98e8a64dd: layout[pp][vpp] = stages[vpp * PP + pp];
    get_layer_offset sums the decoder layers of every earlier virtual stage, then of the earlier ranks
    of this one)."""
    vpp = len(stages) // pp
    layout = [[stages[v * pp + r] for v in range(vpp)] for r in range(pp)]
    out = {}
    for r in range(pp):
        for v in range(vpp):
            offset = 0
            for v2 in range(v + 1):
                for r2 in range(pp if v2 < v else r):
                    offset += layout[r2][v2].count("t")
            out[(r, v)] = list(range(offset, offset + layout[r][v].count("t")))
    return out


def test_deepseek_v3_layout_pp8_vpp4():
    """The issue's layout: DeepSeek-V3's 61 layers as Et|(tt|)*30mL on PP8, four virtual stages each."""
    lay = parse_layout("Et|(tt|)*30mL")
    assert lay.stages == ("Et",) + ("tt",) * 30 + ("mL",)
    layout, vpp = layout_stages(lay, 8, 61, 1)
    assert vpp == 4 and layout == (1,) + (2,) * 30 + (0,)
    train = TrainingConfig(pp=8, vpp=4, schedule="interleaved", layout=layout, dp=32, tp=2, ep=8, num_microbatches=16,
                           profile="megatron", precision="megatron")
    part = Partition("deepseek-v3", train)
    ids = megatron_layer_ids(lay.stages, 8)
    for stage in part.stages:
        # memlib's chunk v of rank r holds the layers Megatron-Core builds on that rank's virtual stage v
        assert [list(c.layers) for c in stage.chunks] == [ids[(stage.index, v)] for v in range(4)]
    assert part.stages[0].layers == (0, 15, 16, 31, 32, 47, 48) and part.stages[0].first
    assert part.stages[7].layers == (13, 14, 29, 30, 45, 46) and part.stages[7].last   # chunk 31: MTP and loss
    assert part.stages[7].chunks[-1].layers == () and part.stages[7].chunks[-1].last


@pytest.mark.parametrize("text,pp", [("Et*3|(tt|)*6tmL", 2), ("Et*2|(tt|)*5t|tmL", 4), ("Ettt|tt|tt|tttmL", 2),
                                     ("E,t,t|t,t|(t|)*5,m,L", 4)])
def test_layout_strings_agree_with_megatron_numbering(text, pp):
    lay = parse_layout(text)
    layout, vpp = layout_stages(lay, pp, sum(x.count("t") for x in lay.stages), lay.stages[-1].count("m") or None)
    n = sum(layout)
    train = TrainingConfig(pp=pp, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b", layout=layout,
                           num_microbatches=pp * 2, profile="megatron", precision="megatron")
    import tiny as T
    part = Partition(T.tiny(num_hidden_layers=n, first_k_dense_replace=0), train)
    ids = megatron_layer_ids(lay.stages, pp)
    for stage in part.stages:
        assert [list(c.layers) for c in stage.chunks] == [ids[(stage.index, v)] for v in range(vpp)]


@pytest.mark.parametrize("text,pp,layers,mtp,message", [
    ("Et|tt|ttL", 2, 5, None, r"has 3 stages, not a multiple of pp=2"),
    ("tE|tttL", 2, 5, None, r"the embedding E must come first and the loss L last"),
    ("Et|tttt", 2, 5, None, r"the embedding E must come first and the loss L last"),
    ("EtL|ttttL", 2, 5, None, r"the embedding E must come first and the loss L last, once each"),
    ("Ett|tttmL", 2, 5, 0, r"places 1 MTP layers but --mtp-num-layers gives 0"),
    ("Ettt|tL", 2, 5, None, r"places 4 decoder layers but the model has 5"),
    ("Ett|tmt|tL", 3, 5, 1, r"decoder layers must come before the MTP layers"),
])
def test_layout_errors(text, pp, layers, mtp, message):
    with pytest.raises(ConfigError, match=message):
        layout_stages(parse_layout(text), pp, layers, mtp)


def test_memlib_refuses_ends_away_from_the_ends():
    """Megatron-Core allows an empty first stage or a standalone MTP stage; memlib keeps the embedding on
    the first stage and the head, loss and MTP on the last."""
    with pytest.raises(ConfigError, match=r"memlib keeps the embedding on the first stage .* E in stage 1"):
        layout_stages(MegatronLayout("|Ett|tt|L", ("", "Ett", "tt", "L")), 2, 4, None)
    with pytest.raises(ConfigError, match=r"m in stage 2"):
        layout_stages(parse_layout("Ett|tt|m|L"), 2, 4, 1)


@pytest.mark.parametrize("text,message", [
    ("Et|tx|L", r"'x' is not a layer"),
    ("E(t|)*9999999999L", r"the repetition 9999999999... is too large"),
    ("(t*999999|)*999", r"unrolls to more than 1,048,576 characters"),
    ("t" * 20_000, r"at most 10,000 characters"),
])
def test_layout_parse_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_layout(text)


def test_layout_flag_and_its_contradictions():
    base = dict(num_layers="4", pipeline_model_parallel_size="2", global_batch_size="4",
                pipeline_model_parallel_layout="'Et|t|t|tL'")
    t = parse(world=2, **base).train
    assert (t.layout, t.vpp, t.schedule) == ((1, 1, 1, 1), 2, "interleaved")
    with pytest.raises(ConfigError, match=r"cannot be combined with uneven first/last stages"):
        parse(world=2, decoder_first_pipeline_num_layers="1", **base)
    # a layout that places no MTP layer puts them with the loss (layouts older than 'm'); a wrong count is refused
    assert parse(world=2, mtp_num_layers="1", **base).train.layout == (1, 1, 1, 1)
    with pytest.raises(ConfigError, match=r"places 1 MTP layers but --mtp-num-layers gives 2"):
        parse(world=2, mtp_num_layers="2", **{**base, "pipeline_model_parallel_layout": "'Et|t|t|tmL'"})


# ---------------------------------------------------------------------------------------------
# recomputation
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes,policy", [
    ({}, "none"),
    (dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers="1"), "full"),
    (dict(recompute_granularity="full", recompute_method="block", recompute_num_layers="2"), "full-block:2"),
    (dict(recompute_granularity="full", recompute_method="block", recompute_num_layers="0"), "none"),
    (dict(recompute_granularity="selective"), "core_attn"),             # Megatron's default module
    (dict(recompute_activations=None), "core_attn"),
    (dict(recompute_granularity="selective", recompute_modules="mla_up_proj layernorm mla_up_proj"),
     "mla_up_proj,layernorm"),
    (dict(moe_layer_recompute=None), "core_attn,moe"),
    (dict(recompute_granularity="selective", recompute_modules="moe_act", moe_grouped_gemm=None), "moe_act"),
])
def test_recompute(changes, policy):
    assert parse(**changes).train.recompute == policy


def test_uniform_groups_of_several_layers_are_warned():
    run = parse(recompute_granularity="full", recompute_method="uniform", recompute_num_layers="2")
    assert run.train.recompute == "full"
    assert run.not_modelled == ("--recompute-num-layers=2 with uniform recompute (memlib checkpoints every "
                                "layer's input, as with 1)",)


@pytest.mark.parametrize("changes,message", [
    (dict(recompute_method="uniform"), r"--recompute-method=uniform needs --recompute-granularity full"),
    (dict(recompute_granularity="selective", recompute_method="block"), r"needs --recompute-granularity full"),
    (dict(recompute_granularity="full", recompute_num_layers="1"), r"full needs --recompute-method"),
    (dict(recompute_granularity="full", recompute_method="block"), r"full needs --recompute-num-layers"),
    (dict(recompute_modules="core_attn"), r"--recompute-modules=core_attn applies with --recompute-granularity "
                                          r"selective only"),
    (dict(recompute_granularity="selective", recompute_num_layers="2"), r"--recompute-num-layers=2 applies to"),
    (dict(recompute_granularity="selective", recompute_modules="mhc"), r"--recompute-modules=mhc is not a module"),
    (dict(recompute_granularity="selective", recompute_modules="moe_act"), r"moe_act needs --moe-grouped-gemm"),
    (dict(recompute_granularity="full", recompute_activations=None), r"contradict each other"),
    (dict(recompute_granularity="sometimes"), r"--recompute-granularity='sometimes' must be one of full, selective"),
])
def test_recompute_contradictions(changes, message):
    with pytest.raises(ConfigError, match=message):
        parse(**changes)


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
def test_kernel_flags():
    t = parse(transformer_impl="local", attention_backend="local", attention_softmax_in_fp32=None,
              no_bias_swiglu_fusion=None, cross_entropy_loss_fusion=None).train
    assert (t.transformer_impl.value, t.attention_backend, t.attention_softmax_in_fp32) == ("local", AttnBackend.LOCAL, True)
    assert not t.bias_swiglu_fusion and t.cross_entropy_loss_fusion and t.cross_entropy_fusion_impl.value == "native"
    assert parse(apply_query_key_layer_scaling=None).train.attention_softmax_in_fp32   # Megatron sets it too
    with pytest.raises(ConfigError, match=r"--cross-entropy-fusion-impl=te: Megatron-LM d98e8a64dd@2026-08-22 refuses "
                                          r"it \(from 168cb15d70"):
        parse(cross_entropy_loss_fusion=None, cross_entropy_fusion_impl="te")


@pytest.mark.parametrize("changes,expected", [
    ({}, LoadBalancing.NONE),
    (dict(moe_aux_loss_coeff="1e-4"), LoadBalancing.AUX_LOSS),        # Megatron's default type is aux_loss
    (dict(moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff="1e-4"), LoadBalancing.SEQ_AUX_LOSS),
    (dict(moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff="0"), LoadBalancing.NONE),
    (dict(moe_router_load_balancing_type="none"), LoadBalancing.NONE),
    (dict(moe_router_load_balancing_type="seq_aux_loss aux_loss", moe_aux_loss_coeff="1e-3 0"),
     LoadBalancing.SEQ_AUX_LOSS),
])
def test_load_balancing(changes, expected):
    assert parse(**changes).train.moe_aux_loss is expected


@pytest.mark.parametrize("changes,message", [
    (dict(moe_router_load_balancing_type="sinkhorn"), r"sinkhorn cannot be expressed"),
    (dict(moe_router_load_balancing_type="global_aux_loss", moe_aux_loss_coeff="1e-3"), r"global_aux_loss \(with"),
    (dict(moe_router_load_balancing_type="seq_aux_loss aux_loss", moe_aux_loss_coeff="1e-3 1e-3"),
     r"seq_aux_loss aux_loss \(with"),
    (dict(moe_aux_loss_coeff="1e-3 1e-3"), r"has 2 values for 1 load-balancing types"),
    (dict(moe_aux_loss_coeff="1e99999999"), r"--moe-aux-loss-coeff='1e99999999' is not a plain decimal number"),
])
def test_load_balancing_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        parse(**changes)


def test_megatron_features():
    run = parse(fine_grained_activation_offloading=None, offload_modules="'[core_attn attn_proj]'",
                overlap_moe_expert_parallel_comm=None, ddp_bucket_size="40000000", use_distributed_optimizer=None,
                overlap_grad_reduce=None, overlap_param_gather=None)
    t = run.train
    assert t.offload_modules == ("core_attn", "attn_proj") and t.moe_a2a_overlap and t.ddp_bucket_size == 40000000
    assert t.overlap_grad_reduce and t.overlap_param_gather and t.zero == 1
    assert run.not_modelled == ()          # each is counted (memlib.device.peak), none is warned about
    assert parse(offload_modules="core_attn attn_proj", fine_grained_activation_offloading=None).train.offload_modules \
        == ("core_attn", "attn_proj")


@pytest.mark.parametrize("changes,message", [
    (dict(offload_modules="core_attn"), r"--offload-modules=core_attn applies with --fine-grained-activation"),
    (dict(fine_grained_activation_offloading=None), r"needs --offload-modules"),
    (dict(fine_grained_activation_offloading=None, offload_modules="everything"), r"--offload-modules=everything is"),
    (dict(fine_grained_activation_offloading=None, offload_modules="core_attn", transformer_impl="local"),
     r"needs --transformer-impl transformer_engine"),
    (dict(overlap_param_gather=None), r"--overlap-param-gather=on needs --overlap-grad-reduce and "
                                      r"--use-distributed-optimizer"),
])
def test_carried_feature_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        parse(**changes)


# ---------------------------------------------------------------------------------------------
# precision
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes,spec,total", [
    ({}, "megatron", 18),
    (dict(bf16=False, fp16=None), "megatron-fp16", 20),
    (dict(bf16=False), "fp32", 16),
    (dict(fp8_format="hybrid", fp8_param_gather=None, use_distributed_optimizer=None), "megatron-fp8-param", 17),
    (dict(grad_reduce_in_bf16=None), "megatron:gradients=2,main_grad=4", 2 + 2 + 16),
    # precision-aware: TE's FusedAdam keeps the 16 remainder bits of the fp32 master weights
    (dict(use_precision_aware_optimizer=None), "megatron:master_weights=2", 2 + 4 + 2 + 8),
    (dict(use_precision_aware_optimizer=None, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"),
     "megatron:master_weights=2,exp_avg=2,exp_avg_sq=2", 2 + 4 + 2 + 4),
    (dict(use_precision_aware_optimizer=None, main_grads_dtype="bf16", exp_avg_dtype="fp8", exp_avg_sq_dtype="fp16"),
     "megatron:gradients=2,master_weights=2,exp_avg=1,exp_avg_sq=2", 2 + 2 + 2 + 1 + 2),
    (dict(use_precision_aware_optimizer=None, main_params_dtype="fp16"), "megatron:master_weights=2", 16),
    # an fp8 recipe other than delayed: Megatron-Core keeps the fp32 master weights itself
    (dict(use_precision_aware_optimizer=None, fp8_format="hybrid", fp8_recipe="tensorwise"), "megatron", 18),
    # fp16 weights, an fp32 gradient buffer, no fp32 copy of it: 2 + 4 + 12
    (dict(bf16=False, fp16=None, accumulate_allreduce_grads_in_fp32=None), "megatron-fp16:gradients=4,main_grad=0", 18),
])
def test_precision(changes, spec, total):
    t = parse(**changes).train
    assert t.precision == spec and recipe(spec).total_bytes == total


@pytest.mark.parametrize("changes,message", [
    (dict(exp_avg_dtype="bf16"), r"--exp-avg-dtype=bf16 needs --use-precision-aware-optimizer"),
    (dict(fp8_param_gather=None), r"--fp8-param-gather=on needs --fp8-format"),
    (dict(fp8_param_gather=None, fp8_format="e4m3"), r"needs --use-distributed-optimizer"),
    (dict(fp8_recipe="mxfp8"), r"--fp8-recipe=mxfp8 needs --fp8-format"),
    (dict(fp8_format="e5m2"), r"--fp8-format='e5m2' must be one of e4m3, hybrid"),
    (dict(grad_reduce_in_bf16=None, bf16=False, fp16=None), r"--grad-reduce-in-bf16=on needs --bf16"),
    (dict(grad_reduce_in_bf16=None, accumulate_allreduce_grads_in_fp32=None), r"contradict each other"),
    (dict(bf16=False, use_precision_aware_optimizer=None), r"without --bf16 or --fp16 is not modelled"),
    (dict(optimizer="sgd"), r"--optimizer=sgd cannot be expressed"),
    (dict(fp8_format="e4m3", recompute_granularity="selective", recompute_modules="layernorm"),
     r"--fp8-recipe=delayed with --recompute-modules moe_act or layernorm"),
])
def test_precision_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        parse(**changes)


def test_precision_spec_is_a_recipe_name():
    spec = precision_spec(bf16=True, fp16=False, precision_aware=True, exp_avg="bf16", exp_avg_sq="bf16")
    assert recipe(spec).name == spec


def test_fp8_is_mapped():
    run = parse(fp8_format="hybrid", fp8_recipe="tensorwise")
    assert (run.train.fp8, run.train.fp8_recipe) == ("hybrid", "tensorwise")
    assert run.not_modelled == ()


# ---------------------------------------------------------------------------------------------
# vocabulary
# ---------------------------------------------------------------------------------------------
def test_padding_by_hand():
    """vocab_size_with_padding: up to a multiple of make_vocab_size_divisible_by * TP."""
    assert pad_vocab(50257, 128, 1) == 393 * 128 == 50304
    assert pad_vocab(50257, 128, 8) == 50 * 1024 == 51200
    assert pad_vocab(50257, 3232, 2) == 8 * 6464 == 51712
    assert pad_vocab(256000, 3232, 2) == 40 * 6464 == 258560
    assert pad_vocab(1024, 128, 1) == 1024                      # a multiple already: unchanged


@pytest.mark.parametrize("changes,size,padded", [
    ({}, 1000, 1024),                                                            # NullTokenizer: --vocab-size
    (dict(tokenizer_type=False, vocab_size=False), 50257, 50304),               # pretrain_gpt.py's GPT2BPETokenizer
    (dict(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="/data/utils/nemotron_2_256k.model",
          vocab_size=False, make_vocab_size_divisible_by="3232"), 256000, 258560),
    (dict(tokenizer_type="TikTokenizer", vocab_size=False), 2**17, 2**17),
    (dict(make_vocab_size_divisible_by="100"), 1000, 1000),
    (dict(padded_vocab_size="1001"), 1000, 1001),                               # used as it is
])
def test_vocabulary(changes, size, padded):
    run = parse(**changes)
    assert (run.vocab["size"], run.vocab["padded"], run.model.vocab_size) == (size, padded, padded)


def test_vocabulary_pads_with_tp_and_the_callers_size_wins():
    run = parse_megatron_args(flags(tensor_model_parallel_size="4", sequence_parallel=None), world_size=4)
    assert run.model.vocab_size == 1024                        # 1000 up to 128 * 4 = 512: 2 * 512
    run = parse_megatron_args(flags(), world_size=1, vocab_size=129280)
    assert run.model.vocab_size == 129280 and run.vocab["source"] == "given (vocab_size)"


@pytest.mark.parametrize("changes,message", [
    (dict(vocab_size=False), r"--tokenizer-type=NullTokenizer needs --vocab-size"),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="deepseek-ai/DeepSeek-V3", vocab_size=False),
     r"vocab_size is unknown for --tokenizer-type=HuggingFaceTokenizer with DeepSeek-V3: give memlib the "
     r"tokenizer's vocabulary \(memlib estimate --vocab-size N"),
    (dict(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="x.model", vocab_size=False),
     r"vocab_size is unknown for --tokenizer-type=GPTSentencePieceTokenizer with x.model"),
    (dict(no_pad_vocab_size=None), r"--no-pad-vocab-size=on without --padded-vocab-size"),
])
def test_vocabulary_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        parse(**changes)


def test_a_vocab_size_megatron_ignores_is_warned():
    run = parse(tokenizer_type="GPT2BPETokenizer")
    assert run.model.vocab_size == 50304
    assert run.not_modelled == ("--vocab-size (Megatron-LM ignores it for GPT2BPETokenizer)",)


# ---------------------------------------------------------------------------------------------
# input formats
# ---------------------------------------------------------------------------------------------
SCRIPT = r"""#!/bin/bash
# A DeepSeek-V2-Lite-like run, written like Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
DATA_PATH=$1

DISTRIBUTED_ARGS=(
    --nproc_per_node 8
    --nnodes 2
    --master_addr ${MASTER_ADDR:-localhost}
)

MODEL_ARGS=(--num-layers 27 --decoder-first-pipeline-num-layers 6 --hidden-size 2048 --ffn-hidden-size 10944 --num-attention-heads 16
    --multi-latent-attention --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
    --num-experts 64 --moe-ffn-hidden-size 1408 --moe-shared-expert-intermediate-size 2816
    --moe-router-topk 6 --moe-layer-freq "([0]*1+[1]*26)"
    --swiglu --normalization RMSNorm --qk-layernorm --disable-bias-linear --position-embedding-type rope
    --attention-dropout 0.0 --hidden-dropout 0.0 --untie-embeddings-and-output-weights)

TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 64   # a comment after the values
    --seq-length 4096 --bf16 --use-distributed-optimizer
    --moe-token-dispatcher-type alltoall --moe-router-dtype fp32 --moe-grouped-gemm
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 \
    --expert-model-parallel-size 4 \
    --data-path $DATA_PATH --vocab-size 102400 --tokenizer-type NullTokenizer \
    --save /ckpt --log-interval 1
"""


def test_a_launch_script():
    run = parse_megatron_args(SCRIPT, name="train.sh")
    m, t = run.model, run.train
    assert (m.num_hidden_layers, m.hidden_size, m.n_routed_experts, m.n_shared_experts, m.first_k_dense_replace) == (
        27, 2048, 64, 2, 1)
    assert m.q_lora_rank is None and m.vocab_size == 102400 and not m.tie_word_embeddings
    assert run.world_size == 16 and (t.dp, t.pp, t.ep, t.tp) == (4, 4, 4, 1)       # torchrun: 8 x 2
    assert (t.micro_batch, t.num_microbatches, t.recompute, t.zero) == (1, 16, "full", 1)
    assert t.layout == (6, 7, 7, 7)                        # 6 on the first rank, 21 over the other three
    assert run.not_modelled == ()
    assert {"--nproc_per_node", "--nnodes", "--master_addr", "--data-path", "--save"} <= set(run.no_effect)


def test_script_words_and_quotes():
    got = read_flags("A=(--x 1 --y \"a b\")\npython pretrain_gpt.py --z=3 --w --v -1 'two' # --ignored 5\n"
                     "--cont \\\n  7 --last")
    assert [(f.name, f.values) for f in got] == [("--x", ("1",)), ("--y", ("a b",)), ("--z", ("3",)), ("--w", ()),
                                                  ("--v", ("-1", "two")), ("--cont", ("7",)), ("--last", ())]
    with pytest.raises(ConfigError, match=r"line 1 cannot be split into words .* an unclosed quote"):
        read_flags("--x 'open")


def test_the_last_occurrence_wins_and_aliases_must_agree():
    assert parse(num_layers="4", hidden_size="64").model.num_hidden_layers == 4
    text = flags() + " --num-layers 8"
    assert parse_megatron_args(text, world_size=1).model.num_hidden_layers == 8
    with pytest.raises(ConfigError, match=r"are one flag under two names with different values"):
        parse(num_virtual_stages_per_pipeline_rank="2", virtual_pipeline_model_parallel_size="4")


def test_yaml_model_args():
    text = "ENV_VARS:\n  X: 1\nMODEL_ARGS:\n" + "".join(
        f"  {k}: {'true' if v is None else v}\n" for k, v in BASE.items()) + (
        "  --sequence-parallel: false  # false leaves the flag out\n"
        "  --recompute-granularity: selective\n"
        "  --recompute-modules: \"[layernorm mla_up_proj]\"\n"
        "  --moe-layer-freq: ([0]*2+[1]*2)\n")
    run = parse_megatron_args(text, world_size=1)
    assert run.train.recompute == "layernorm,mla_up_proj" and run.model.first_k_dense_replace == 2
    assert "--sequence-parallel" not in run.mapped


@pytest.mark.parametrize("text,message", [
    ("MODEL_ARGS: [1, 2]\n", r"MODEL_ARGS must be a mapping of flags"),
    ("MODEL_ARGS:\n  num-layers: 4\n", r"the MODEL_ARGS key 'num-layers' must be a flag"),
    ("MODEL_ARGS:\n  --x: [1, 2]\n", r"MODEL_ARGS --x=\[1, 2\] must be a scalar"),
    ("MODEL_ARGS:\n  --x: \"[]\"\n", r"is an empty list"),
    ("MODEL_ARGS:\n  --x: {\n", r"not valid YAML at line"),
])
def test_yaml_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        read_flags(text, "f.yaml")


def test_text_limits():
    with pytest.raises(ConfigError, match=r"more than a launch file holds"):
        read_flags("--x 1 " * 300_000)
    with pytest.raises(ConfigError, match=r"NUL byte"):
        read_flags("--x\x00")


# ---------------------------------------------------------------------------------------------
# overrides (the CLI's explicit options)
# ---------------------------------------------------------------------------------------------
def test_overrides_rederive_what_depends_on_them():
    text = flags(tensor_model_parallel_size="2", sequence_parallel=None, global_batch_size="8", num_layers="8",
                 pipeline_model_parallel_size="2")
    run = parse_megatron_args(text, world_size=8, overrides={"tp": 4, "pp": 1, "recompute": "full"})
    t = run.train
    assert (t.tp, t.pp, t.dp, t.num_microbatches, t.layout, t.recompute) == (4, 1, 2, 4, (8,), "full")
    assert run.model.vocab_size == 1024                                     # padded to 128 * 4
    assert run.overridden == {"tp": {"file": 2, "given": 4}, "pp": {"file": 2, "given": 1},
                              "recompute": {"file": "none", "given": "full"}}
    run = parse_megatron_args(text, overrides={"dp": 1})
    assert run.world_size == 4 and run.train.num_microbatches == 8
    run = parse_megatron_args(text, world_size=8, overrides={"layout": parse_layout("Et|tt|ttt|ttL"), "vpp": 2})
    assert (run.train.layout, run.train.vpp, run.train.schedule) == ((1, 2, 3, 2), 2, "interleaved")
    with pytest.raises(ConfigError, match=r"vpp=4 but layout=Et\|tt\|ttt\|ttL has 4 stages"):
        parse_megatron_args(text, world_size=8, overrides={"layout": parse_layout("Et|tt|ttt|ttL"), "vpp": 4})


def test_an_overridden_flag_may_be_a_variable():
    text = flags(tensor_model_parallel_size="${TP}")
    with pytest.raises(ConfigError, match=r"--tensor-model-parallel-size='\$\{TP\}' is a shell variable"):
        parse_megatron_args(text, world_size=1)
    run = parse_megatron_args(text, world_size=1, overrides={"tp": 1})
    assert run.train.tp == 1 and run.overridden == {"tp": {"file": "${TP}", "given": 1}}


# ---------------------------------------------------------------------------------------------
# TrainingConfig's carried fields
# ---------------------------------------------------------------------------------------------
def test_carried_fields_reach_the_json_and_leave_the_states_alone():
    """The Megatron-LM features change the activations and the peak (tests/device/test_peak.py), never the model
    states; the JSON carries them."""
    import tiny as T
    base = estimate(T.tiny(), TrainingConfig(num_microbatches=1, zero=1, profile="megatron"))
    carried = estimate(T.tiny(), TrainingConfig(
        num_microbatches=1, zero=1, profile="megatron", fp8="hybrid", fp8_recipe="mxfp8", moe_a2a_overlap=True,
        offload_modules=("core_attn", "attn_proj"), overlap_grad_reduce=True, overlap_param_gather=True,
        routing_imbalance=Fraction(5, 4), ddp_bucket_size=10**6))
    assert [s.model_states for s in carried.stages] == [s.model_states for s in base.stages]
    d = carried.to_dict()["config"]
    assert d["routing_imbalance"] == "5/4" and d["offload_modules"] == ["core_attn", "attn_proj"] and d["fp8"] == "hybrid"


@pytest.mark.parametrize("kw,message", [
    (dict(fp8="e5m2"), r"fp8='e5m2' must be one of e4m3, hybrid or None"),
    (dict(fp8_recipe="fast"), r"fp8_recipe='fast' must be one of tensorwise, delayed"),
    (dict(offload_modules=("everything",)), r"'everything' is not one of attn_norm"),
    (dict(offload_modules=("core_attn", "core_attn")), r"a module is named twice"),
    (dict(offload_modules="core_attn"), r"must be a tuple of module names"),
    (dict(offload_modules=("attn_proj",)), r"attn_proj needs core_attn too"),
    (dict(overlap_param_gather=True, zero=1), r"overlap_param_gather=True needs overlap_grad_reduce=True"),
    (dict(overlap_param_gather=True, overlap_grad_reduce=True), r"needs zero >= 1"),
    (dict(routing_imbalance=1.5), r"routing_imbalance=1.5 must be an exact number"),
    (dict(routing_imbalance=Fraction(3, 4)), r"routing_imbalance=3/4 must be >= 1"),
    (dict(ddp_bucket_size=0), r"ddp_bucket_size=0 must be a positive integer"),
    (dict(moe_a2a_overlap="yes"), r"moe_a2a_overlap='yes' must be true or false"),
])
def test_carried_field_errors(kw, message):
    with pytest.raises(ConfigError, match=message):
        TrainingConfig(**kw)


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------
def call(*argv, stdin: str | None = None):
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    try:
        if stdin is not None:
            sys.stdin = io.StringIO(stdin)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main([str(a) for a in argv])
    finally:
        sys.stdin = old
    return rc, out.getvalue(), err.getvalue()


def test_cli_reads_a_model_config_yaml():
    case = "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed"
    rc, out, err = call("estimate", "--megatron-args", fixture(case), "--world-size", 8, "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["config"]["profile"] == "megatron" and data["config"]["vpp"] == 4
    assert data["megatron_args"]["model"]["vocab_size"] == 51712 and data["megatron_args"]["world_size"] == 8
    assert data["megatron_args"]["not_modelled"] == list(CASES[case][2])
    assert {"model", "config", "stages", "peak"} <= set(data)              # the contract's keys stay
    assert err.splitlines() == ["memlib: warning: not modelled (1): " + ", ".join(CASES[case][2])]
    assert data["peak_allocated"] == max(s["peak_allocated"] for s in data["stages"])


def test_cli_text_output_names_the_overrides():
    case = "moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed"
    rc, out, err = call("estimate", "--megatron-args", fixture(case), "--world-size", 8, "--tp", 1,
                        "--recompute", "full", "--precision", "megatron:exp_avg=bf16")
    assert rc == 0
    first = out.splitlines()[0]
    assert first.startswith(f"Megatron-LM flags {fixture(case)}: ") and "world size 8" in first
    assert "overridden: tp=1 (file: 2), precision=megatron:exp_avg=bf16 (file: megatron), recompute=full (file: none)" \
        in first
    assert "PP2@TP1@EP4@ETP1 · DP4" in out.splitlines()[1]


def test_cli_reads_standard_input():
    rc, out, err = call("estimate", "--megatron-args", "-", "--world-size", 1, "--json", stdin=flags())
    assert rc == 0 and json.loads(out)["megatron_args"]["mapped"]["--num-layers"] == "4" and err == ""


@pytest.mark.parametrize("argv,message", [
    (("--world-size", 8, "--ep", 3), r"^memlib: error: --expert-model-parallel-size=3 must divide --num-experts=8"),
    (("--model", "deepseek-v3"), r"model: --megatron-args gives the model; leave --model out"),
])
def test_cli_errors_are_one_line(argv, message):
    rc, out, err = call("estimate", "--megatron-args", fixture("moe/gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4"), *argv)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1
    assert __import__("re").search(message, err.strip()), err


def test_cli_file_errors(tmp_path):
    missing = tmp_path / "nope.sh"
    rc, out, err = call("estimate", "--megatron-args", missing)
    assert rc == 2 and "cannot read it" in err and len(err.splitlines()) == 1
    bad = tmp_path / "bad.sh"
    bad.write_bytes(b"--num-layers \xff\xfe")
    rc, out, err = call("estimate", "--megatron-args", bad)
    assert rc == 2 and "is not UTF-8 text" in err
    rc, out, err = call("estimate", "--world-size", 8)
    assert rc == 2 and err.strip() == "memlib: error: world_size=8 applies with --megatron-args only"


def test_cli_layout_accepts_a_megatron_layout_string():
    rc, out, err = call("estimate", "--layout", "Et|(tt|)*30mL", "--pp", 8, "--dp", 64, "--json")
    assert rc == 0
    cfg = json.loads(out)["config"]
    assert cfg["vpp"] == 4 and cfg["schedule"] == "interleaved" and cfg["layout"] == [1] + [2] * 30 + [0]
    rc, out, err = call("estimate", "--layout", "Et|(tt|)*30mL", "--pp", 8, "--vpp", 2)
    assert rc == 2 and "vpp=2 but layout=Et|(tt|)*30mL has 32 stages: vpp=4 on pp=8" in err
    rc, out, err = call("estimate", "--layout", "Et|(tt|)*30mmL", "--pp", 8)
    assert rc == 2 and "places 2 MTP layers but the model has 1" in err


def test_cli_new_options_reach_the_configuration():
    rc, out, err = call("estimate", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8", "--overlap-grad-reduce",
                        "--overlap-param-gather", "--zero", 1, "--offload-modules", "core_attn,attn_proj",
                        "--overlap-moe-expert-parallel-comm", "--routing-imbalance", "1.25", "--ddp-bucket-size",
                        40000000, "--json")
    assert rc == 0, err
    cfg = json.loads(out)["config"]
    assert (cfg["fp8"], cfg["fp8_recipe"], cfg["overlap_grad_reduce"], cfg["overlap_param_gather"]) == (
        "hybrid", "mxfp8", True, True)
    assert cfg["offload_modules"] == ["core_attn", "attn_proj"] and cfg["moe_a2a_overlap"]
    assert cfg["routing_imbalance"] == "5/4" and cfg["ddp_bucket_size"] == 40000000


def test_cli_through_a_real_process(tmp_path):
    """``python -m memlib`` with the launch script: the warning on stderr, the table on stdout."""
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT + "  --moe-expert-capacity-factor 1.0\n")
    r = subprocess.run([sys.executable, "-m", "memlib", "estimate", "--megatron-args", str(script)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["memlib: warning: not modelled (1): --moe-expert-capacity-factor"]
    assert "world size 16" in r.stdout.splitlines()[0] and "peak: stage" in r.stdout
