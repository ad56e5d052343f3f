"""Architectures beyond DeepSeek (issue 12): reading every family's config.json, the presets' exact
parameter counts against transformers on the meta device, and random tiny configs of each family.

The transformers checks need torch and transformers (``memlib[measure]``); without them they are
skipped, except under ``CI=true``, where a missing architecture class fails.
"""
from __future__ import annotations

import json
import os
import random

import pytest

from memlib.config import FAMILIES, PRESETS, ConfigError, family_of, load_model, model_from_dict
from memlib.config.model import PRESET_DIR
from memlib.model.params import model_params, values

#: Hugging Face architecture -> its configuration class in transformers
HF_CONFIG = {"DeepseekV3ForCausalLM": "DeepseekV3Config", "DeepseekV2ForCausalLM": "DeepseekV2Config",
             "LlamaForCausalLM": "LlamaConfig", "Qwen3ForCausalLM": "Qwen3Config",
             "MixtralForCausalLM": "MixtralConfig", "Qwen2MoeForCausalLM": "Qwen2MoeConfig",
             "Qwen3MoeForCausalLM": "Qwen3MoeConfig", "GPT2LMHeadModel": "GPT2Config"}

#: the published totals (transformers' count, read from the model cards where they state one)
PRESET_TOTALS = {
    "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496, "llama-3.1-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704, "mixtral-8x22b": 140_630_071_296, "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-235b-a22b": 235_093_634_560, "kimi-k2": 1_026_408_209_408, "moonlight-16b-a3b": 15_960_108_544,
}


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true")


def hf_count(d: dict) -> int:
    """``sum(p.numel())`` of transformers' model for the config.json ``d``, built on the meta device."""
    if _ci():
        import torch
        import transformers
    else:
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
    arch = d["architectures"][0]
    cls = getattr(transformers, HF_CONFIG[arch], None)
    if cls is None:
        if _ci():
            pytest.fail(f"transformers {transformers.__version__} lacks {HF_CONFIG[arch]}")
        pytest.skip(f"transformers {transformers.__version__} lacks {HF_CONFIG[arch]}")
    kw = {k: x for k, x in d.items() if not k.startswith("_") and k not in ("architectures", "model_type")}
    cfg = cls(**kw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def _total(m) -> int:
    return model_params(m).evaluate_total(values(m))


# ------------------------------------------------------------------------------------------------
# presets
# ------------------------------------------------------------------------------------------------
def test_every_issue_preset_ships():
    assert set(PRESET_TOTALS) <= set(PRESETS)


@pytest.mark.parametrize("preset", sorted(PRESET_TOTALS))
def test_preset_total_is_the_published_count(preset):
    m = load_model(preset)
    assert _total(m) == PRESET_TOTALS[preset]
    assert m.source and "config.json" in m.source


@pytest.mark.parametrize("preset", sorted(PRESET_TOTALS))
def test_preset_total_equals_transformers_on_meta(preset):
    d = json.loads((PRESET_DIR / f"{preset}.json").read_text())
    assert _total(load_model(preset)) == hf_count(d)


def test_families_dispatch():
    assert load_model("kimi-k2").family == "deepseek" and load_model("kimi-k2").n_routed_experts == 384
    assert load_model("llama-3-8b").attention == "gqa" and load_model("llama-3-8b").moe is None
    assert load_model("mixtral-8x7b").moe == "mixtral"
    assert family_of({"model_type": "qwen2_moe"}).name == "qwen2_moe"
    assert family_of({}).name == "deepseek"
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


# ------------------------------------------------------------------------------------------------
# bad input: one line naming field, value, rule
# ------------------------------------------------------------------------------------------------
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
         "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 50}


@pytest.mark.parametrize("change,needle", [
    ({"architectures": ["FalconForCausalLM"]}, "FalconForCausalLM"),
    ({"architectures": "LlamaForCausalLM"}, "architectures="),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 must divide num_attention_heads=8"),
    ({"num_key_value_heads": 0}, "num_key_value_heads=0"),
    ({"hidden_size": 60}, "hidden_size=60"),
    ({"attention_bias": "yes"}, "attention_bias='yes' must be true or false"),
    ({"num_attention_heads": None}, "num_attention_heads=None"),
])
def test_bad_configs_are_one_line(change, needle):
    with pytest.raises(ConfigError) as e:
        model_from_dict({**LLAMA, **change})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_fields_are_named():
    d = dict(LLAMA)
    del d["num_key_value_heads"]
    with pytest.raises(ConfigError, match="missing required field.*num_key_value_heads"):
        model_from_dict(d)


def test_partly_sparse_qwen_moe_is_refused():
    d = json.loads((PRESET_DIR / "qwen3-30b-a3b.json").read_text())
    with pytest.raises(ConfigError, match="decoder_sparse_step=2"):
        model_from_dict({**d, "decoder_sparse_step": 2})
    with pytest.raises(ConfigError, match=r"mlp_only_layers=\[0\]"):
        model_from_dict({**d, "mlp_only_layers": [0]})


# ------------------------------------------------------------------------------------------------
# random tiny configs of every family against transformers
# ------------------------------------------------------------------------------------------------
def _gqa(r: random.Random, arch: str, model_type: str) -> dict:
    n_kv = r.choice([1, 2, 4])
    n_h = n_kv * r.choice([1, 2, 3])
    d = {"architectures": [arch], "model_type": model_type, "num_attention_heads": n_h, "num_key_value_heads": n_kv,
         "num_hidden_layers": r.randint(1, 3), "vocab_size": r.randint(10, 60),
         "tie_word_embeddings": r.random() < 0.3}
    if r.random() < 0.5:
        d["head_dim"] = r.choice([2, 4, 6, 8])
        d["hidden_size"] = n_h * r.randint(1, 4)   # transformers asks n_h | h even with a head_dim
    else:
        d["hidden_size"] = n_h * r.choice([2, 4, 6])
    return d


def _random(family: str, r: random.Random) -> dict:
    if family == "llama":
        d = _gqa(r, "LlamaForCausalLM", "llama")
        d.update(intermediate_size=r.randint(4, 40), attention_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5)
    elif family == "qwen3":
        d = _gqa(r, "Qwen3ForCausalLM", "qwen3")
        d.update(intermediate_size=r.randint(4, 40), attention_bias=r.random() < 0.5, head_dim=r.choice([2, 4, 8]))
    elif family in ("mixtral", "qwen2_moe", "qwen3_moe"):
        arch = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                "qwen3_moe": "Qwen3MoeForCausalLM"}[family]
        d = _gqa(r, arch, family)
        n = r.randint(1, 8)
        d.update(num_experts_per_tok=r.randint(1, n))
        width = r.randint(2, 24)
        if family == "mixtral":
            d.update(num_local_experts=n, intermediate_size=width)
        else:
            d.update(num_experts=n, moe_intermediate_size=width, intermediate_size=r.randint(4, 40))
        if family == "qwen2_moe":
            d.update(shared_expert_intermediate_size=r.randint(2, 30), qkv_bias=r.random() < 0.7)
        if family == "qwen3_moe":
            d.update(attention_bias=r.random() < 0.5)
    elif family == "gpt2":
        n_h = r.randint(1, 4)
        d = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": n_h * r.randint(1, 6),
             "n_head": n_h, "n_layer": r.randint(1, 3), "n_positions": r.randint(4, 40),
             "vocab_size": r.randint(10, 60), "n_inner": r.choice([None, r.randint(4, 40)])}
    else:
        raise AssertionError(family)
    return d


@pytest.mark.parametrize("family", ["llama", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt2"])
def test_random_tiny_configs_match_transformers(family):
    r = random.Random(f"issue-12-{family}")
    for _ in range(6):
        d = _random(family, r)
        assert _total(model_from_dict(d)) == hf_count(d), d


def test_gpt_convention_is_gpt2s_blocks():
    """memlib's ``gpt`` config (Megatron's classic GPT) counts what GPT-2 has: LayerNorms with biases,
    biased QKV/proj/fc1/fc2, learned positions, tied head."""
    r = random.Random("issue-12-gpt")
    for _ in range(4):
        n_h = r.randint(1, 4)
        h, layers, pos, v, f = n_h * r.randint(1, 6), r.randint(1, 3), r.randint(4, 40), r.randint(10, 60), r.randint(4, 40)
        gpt = {"model_type": "gpt", "hidden_size": h, "num_attention_heads": n_h, "num_hidden_layers": layers,
               "max_position_embeddings": pos, "vocab_size": v, "intermediate_size": f}
        gpt2 = {"architectures": ["GPT2LMHeadModel"], "n_embd": h, "n_head": n_h, "n_layer": layers,
                "n_positions": pos, "vocab_size": v, "n_inner": f}
        m = model_from_dict(gpt)
        assert _total(m) == hf_count(gpt2)
        # and by hand: 12 h^2 + 13 h per layer with f = 4h; here 4 h^2 + 2 h f + 9 h + f
        assert _total(m) == v * h + pos * h + layers * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h


# ------------------------------------------------------------------------------------------------
# partition, states and activations of the new blocks
# ------------------------------------------------------------------------------------------------
from memlib.config import TrainingConfig  # noqa: E402
from memlib.model.partition import Partition  # noqa: E402


def _device_params(model, **kw) -> list[int]:
    p = Partition(model, TrainingConfig(**kw))
    return [p.params(st).evaluate_total(p.values) for st in p.stages]


def test_gqa_tp_splits_query_heads_and_kv_groups():
    m = load_model("llama-3-8b")
    (one,) = _device_params(m, tp=1, ep=1, pp=1)
    (two,) = _device_params(m, tp=2, ep=1, pp=1, dp=1)
    h, n_h, n_kv, d, l = 4096, 32, 8, 128, 32
    # everything but the norms is TP-split under megatron: (W^Q, W^K, W^V, W^O, FFN, embedding, head) / 2
    norms = (2 * l + 1) * h
    assert two == (one - norms) // 2 + norms
    assert one == 8_030_261_248
    # the attention of one layer by hand
    p = Partition(m, TrainingConfig(tp=2, ep=1, pp=1, profile="megatron"))
    att = p.params(p.stages[0]).select(lambda k: k.startswith("attention.")).evaluate_total(p.values)
    assert att == l * (2 * n_h * d * h + 2 * n_kv * d * h) // 2


def test_gqa_tp_above_kv_heads():
    m = load_model("llama-3-70b")          # 8 key-value heads
    with pytest.raises(ConfigError, match="tp=16 must divide num_key_value_heads=8 under the paper profile"):
        Partition(m, TrainingConfig(tp=16, ep=1, pp=1))
    # Megatron-Core replicates a group over tp / n_kv ranks; its fused QKV weight stays evenly split
    p = Partition(m, TrainingConfig(tp=16, ep=1, pp=1, profile="megatron"))
    att = p.params(p.stages[0]).select(lambda k: k.startswith("attention.W_K")).evaluate_total(p.values)
    assert att == 80 * 8 * 128 * 8192 // 16
    odd = model_from_dict({**LLAMA, "hidden_size": 96, "num_attention_heads": 12, "num_key_value_heads": 4})
    with pytest.raises(ConfigError, match="tp=6 must divide num_key_value_heads=4 or be a multiple"):
        Partition(odd, TrainingConfig(tp=6, ep=1, pp=1, profile="megatron"))


def test_dense_model_refuses_expert_parallelism():
    with pytest.raises(ConfigError, match="ep=2 needs routed experts"):
        Partition(load_model("llama-3-8b"), TrainingConfig(tp=1, ep=2, dp=2, pp=1))


def test_mixtral_ep_splits_the_experts():
    m = load_model("mixtral-8x7b")
    p = Partition(m, TrainingConfig(tp=2, ep=4, pp=2, dp=4, profile="megatron"))
    for st in p.stages:
        routed = p.params(st).select(lambda k: k.startswith("routed_experts.")).evaluate_total(p.values)
        assert routed == 16 * 8 * 3 * 4096 * 14336 // 4
    with pytest.raises(ConfigError, match="ep=16 must divide n_routed_experts=8"):
        Partition(m, TrainingConfig(tp=1, ep=16, dp=16, pp=1))


def test_qwen2_moe_shared_expert_and_gate():
    d = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100, "num_experts": 4,
         "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 48}
    m = model_from_dict(d)
    p = Partition(m, TrainingConfig(tp=2, ep=2, dp=2, pp=1, profile="megatron"))
    b = p.params(p.stages[0]).evaluate(p.values)
    assert b["shared_experts.gate"] == 2 * 48 * 64 // 2 and b["shared_experts.gate_weight"] == 2 * 64
    assert b["attention.b_K"] == 2 * 2 * 16 // 2        # qkv_bias: TP-split with its weight


@pytest.mark.parametrize("preset,kw", [
    ("mixtral-8x7b", dict(tp=2, ep=4, pp=2, dp=4)),
    ("llama-3-8b", dict(tp=2, ep=1, pp=2, dp=2)),
    ("qwen3-30b-a3b", dict(tp=4, ep=8, pp=4, dp=8)),
    ("llama-3-70b", dict(tp=8, ep=1, pp=8, dp=1, recompute="selective")),
])
@pytest.mark.parametrize("profile", ["megatron", "paper"])
def test_estimate_runs_for_the_new_blocks(preset, kw, profile):
    from memlib.device.estimate import estimate

    est = estimate(preset, TrainingConfig(profile=profile, **kw))
    assert est.stages and all(int(s.total) > 0 for s in est.stages)
    assert all(p.peak_allocated > 0 for p in est.peaks)    # megatron: Megatron-Core's buffers of every rank


def test_gpt_and_qwen2_moe_estimates():
    from memlib.device.estimate import estimate

    gpt = model_from_dict({"model_type": "gpt", "hidden_size": 256, "num_attention_heads": 8, "num_hidden_layers": 4,
                           "max_position_embeddings": 512, "vocab_size": 1000})
    q2 = model_from_dict({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
                          "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100, "num_experts": 4,
                          "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 48})
    for m, kw in ((gpt, dict(tp=2, ep=1, pp=2, dp=1)), (q2, dict(tp=2, ep=2, pp=1, dp=2))):
        for profile in ("megatron", "paper"):
            est = estimate(m, TrainingConfig(profile=profile, seq_len=128, **kw))
            assert all(int(s.total) > 0 for s in est.stages)
            assert all(p.peak_allocated > 0 for p in est.peaks)


def test_paper_gqa_ledger_by_hand():
    """MHA (n_kv = n_h) under the paper profile is Korthikanti's attention, 11 s b h + 5 a s^2 b bytes, plus its
    LayerNorm's input (2 s b h, which their 34 s b h counts apart)."""
    from memlib.ledgers.base import ledger_bytes, training_values
    from memlib.ledgers.paper import paper_layer

    m = model_from_dict({"model_type": "gpt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                         "max_position_embeddings": 32, "vocab_size": 100})
    bb, ss = 2, 16
    train = TrainingConfig(tp=1, ep=1, pp=1, micro_batch=bb, seq_len=ss)
    from memlib.model.partition import parallel_values
    vals = {**values(m), **training_values(train), **parallel_values(train)}
    att = {k: x for k, x in ledger_bytes(paper_layer(m, "dense"), train).evaluate(vals).items()
           if k.startswith("attention.")}
    sbh, a = ss * bb * 64, 4
    assert sum(att.values()) == 13 * sbh + 5 * a * ss * ss * bb


def test_hf_eager_names_what_transformers_cannot_build():
    """Every family has an hf-eager ledger; a gpt config GPT-2 cannot express (grouped-query attention) is a
    one-line error naming the field."""
    from memlib.device.estimate import estimate

    assert estimate("llama-3-8b", TrainingConfig(profile="hf-eager", ep=1, pp=1)).stages
    gqa = model_from_dict({"model_type": "gpt", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "num_hidden_layers": 2, "max_position_embeddings": 32, "vocab_size": 100})
    with pytest.raises(ConfigError, match="num_key_value_heads=2 must equal num_attention_heads=4"):
        estimate(gqa, TrainingConfig(profile="hf-eager", ep=1, pp=1)).stages


def test_megatron_ledger_tp_above_kv_heads_is_refused():
    from memlib.device.estimate import estimate

    with pytest.raises(ConfigError, match="tp=16 > num_key_value_heads=8"):
        estimate("llama-3-70b", TrainingConfig(profile="megatron", tp=16, ep=1, pp=1)).stages


# ------------------------------------------------------------------------------------------------
# GeLU experts: a Megatron-LM MoE without --swiglu (the GPT MoE functional tests)
# ------------------------------------------------------------------------------------------------
def _gelu_moe(bias: bool, **kw):
    """h = 16 (4 heads of 4, MHA), N = 4 experts of h_E = 8, top-2, one layer, v = 32, LayerNorm, learned positions:
    the flag reader's model of ``--num-experts 4`` without ``--swiglu``."""
    from dataclasses import replace

    mix = model_from_dict({"architectures": ["MixtralForCausalLM"], "hidden_size": 16, "num_attention_heads": 4,
                           "num_key_value_heads": 4, "head_dim": 4, "num_hidden_layers": 1, "vocab_size": 32,
                           "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 8}, name="gelu-moe")
    return replace(mix, **{"mlp": "gelu", "hidden_act": "gelu", "norm": "layernorm", "positions": "learned",
                            "max_position_embeddings": 16, "mlp_bias": bias, "o_bias": bias, "qkv_bias": bias, **kw})


def test_gelu_experts_parameters_by_hand():
    """A GeLU expert is fc1 (h_E x h) and fc2 (h x h_E): 2 h h_E = 256, not SwiGLU's 3 h h_E; with biases (Megatron's
    add_bias_linear) 8 + 16 more, and the router a bias of N.  On EP 2 x ETP 2 each device holds a quarter of the
    weights and of fc1's bias, and half of fc2's bias (an expert's output bias is replicated over ETP)."""
    from memlib.model.params import expert_params, layer_params

    m, plain = _gelu_moe(True), _gelu_moe(False)
    vals = values(m)
    assert expert_params(plain).xreplace(vals) == 2 * 16 * 8 == 256
    assert expert_params(m).xreplace(vals) == 256 + 8 + 16 == 280
    moe = layer_params(m, "moe").evaluate(vals)
    assert {k: x for k, x in moe.items() if k.startswith(("router", "routed"))} == {
        "router.gate": 4 * 16, "router.bias": 4, "routed_experts.fc1": 4 * 8 * 16, "routed_experts.fc1_bias": 4 * 8,
        "routed_experts.fc2": 4 * 16 * 8, "routed_experts.fc2_bias": 4 * 16}
    p = Partition(m, TrainingConfig(tp=2, ep=2, etp=2, dp=2, pp=1, profile="megatron", bias_swiglu_fusion=False))
    dev = p.params(p.stages[0]).evaluate(p.values)
    assert (dev["routed_experts.fc1"], dev["routed_experts.fc1_bias"], dev["routed_experts.fc2"],
            dev["routed_experts.fc2_bias"]) == (512 // 4, 32 // 4, 512 // 4, 64 // 2)
    assert p.sharding(next(t for t, _ in p.tensors(p.stages[0]) if t.key == "routed_experts.fc2_bias")) == "expert_ep"
    swiglu = Partition(_gelu_moe(True, mlp="swiglu", hidden_act="silu"), TrainingConfig(
        tp=2, ep=2, etp=2, dp=2, pp=1, profile="megatron")).params(p.stages[0]).evaluate(p.values)
    assert (swiglu["routed_experts.gate"], swiglu["routed_experts.down_bias"]) == (512 // 4, 64 // 2)


def test_gelu_experts_megatron_parameters_in_grouped_linear_order():
    """Megatron-Core (TE spec, TEGroupedMLP) registers the router's weight and bias, then each local expert's fc1
    weight and bias in turn (TE GroupedLinear: weight{i}, bias{i}), then fc2's."""
    from memlib.device.megatron_params import rank_params

    p = Partition(_gelu_moe(True), TrainingConfig(tp=1, ep=2, etp=1, dp=2, pp=1, profile="megatron",
                                                    bias_swiglu_fusion=False))
    got = [(x.name.removeprefix("decoder.layers.0.mlp."), x.shape, x.expert) for x in rank_params(p)[0]
           if ".mlp." in x.name]
    assert got == [("router.weight", (4, 16), False), ("router.bias", (4,), False),
                   ("experts.linear_fc1.weight0", (8, 16), True), ("experts.linear_fc1.bias0", (8,), True),
                   ("experts.linear_fc1.weight1", (8, 16), True), ("experts.linear_fc1.bias1", (8,), True),
                   ("experts.linear_fc2.weight0", (16, 8), True), ("experts.linear_fc2.bias0", (16,), True),
                   ("experts.linear_fc2.weight1", (16, 8), True), ("experts.linear_fc2.bias1", (16,), True)]


def test_gelu_experts_activations_by_hand():
    """b = 2, s = 5, top-2: 20 dispatched copies.  megatron: fc1's output (the GeLU's input), the GeLU's output (kept
    by its product with the fp32 probabilities) and the cast product fc2 keeps, 20 x 8 x 2 = 320 bytes each; TE's
    moe_act recompute keeps only the first.  paper: fc1's output and the GeLU's output (SwiGLU's gate, up, SiLU and
    product are four).  hf-eager: transformers has no GeLU-expert MoE, a one-line refusal."""
    from memlib.device.estimate import estimate
    from memlib.ledgers.base import ledger_bytes, parse_policy, training_values
    from memlib.ledgers.megatron import megatron_layer
    from memlib.ledgers.megatron_blocks import Kernels
    from memlib.ledgers.paper import paper_layer
    from memlib.model.partition import parallel_values

    m = _gelu_moe(False)
    for recompute, kept in (("none", {"gelu_input": 320, "gelu_output": 320, "act_output": 320}),
                            ("moe_act", {"gelu_input": 320})):
        train = TrainingConfig(tp=1, ep=1, pp=1, micro_batch=2, seq_len=5, profile="megatron", recompute=recompute,
                               bias_swiglu_fusion=False)
        vals = {**values(m), **training_values(train), **parallel_values(train)}
        got = ledger_bytes(megatron_layer(m, "moe", Kernels.of(train)), train,
                           policy=parse_policy(recompute)).evaluate(vals)
        assert {k.removeprefix("moe.routed."): x for k, x in got.items()
                if k.startswith("moe.routed.") and k not in ("moe.routed.fc1_input", "moe.routed.probs") and x} == kept
    train = TrainingConfig(tp=1, ep=1, pp=1, micro_batch=2, seq_len=5)
    vals = {**values(m), **training_values(train), **parallel_values(train)}
    paper = ledger_bytes(paper_layer(m, "moe"), train).evaluate(vals)
    assert {k: x for k, x in paper.items() if k.startswith("moe.routed.")} == {
        "moe.routed.input": 20 * 16 * 2, "moe.routed.input_mask": 20 * 16, "moe.routed.fc1_out": 320,
        "moe.routed.act_out": 320}
    with pytest.raises(ConfigError, match=r"^mlp=gelu with MoE layers: transformers' MoE classes") as exc:
        estimate(m, TrainingConfig(profile="hf-eager", ep=1, pp=1, seq_len=8)).stages
    assert "\n" not in str(exc.value)
