"""The ``hf-eager`` ledger of every family beyond DeepSeek (issue 12) against transformers, to the byte.

* By hand, without torch: one tiny Llama and one tiny GPT-2, every entry worked out below; the
  single-key-value-head view case; what ``norm_topk_prob`` and ``hidden_act`` change; the one-line
  errors (a ``gpt`` config GPT-2 cannot express, an activation the ledger does not know).
* Against autograd (needs ``memlib[measure]``, skipped without it as in ``test_measure.py``): random
  small configs of each family drawn fresh on every run (the seed is printed on failure;
  ``MEMLIB_MEASURE_SEED=...`` replays it, ``MEMLIB_MEASURE_FAMILY_CONFIGS=...`` draws more than 5),
  the CLI, and the presets' parameters per transformers tensor on the meta device.
"""
from __future__ import annotations

import json
import os
import random

import pytest

from memlib.cli import main
from memlib.config import ConfigError, TrainingConfig, load_model, model_from_dict
from memlib.measure.random_configs import HF_RANDOM_FAMILIES
from memlib.measure.hf import predicted

N_CONFIGS = int(os.environ.get("MEMLIB_MEASURE_FAMILY_CONFIGS", "5"))

#: h = 16, n_h = 4, n_kv = 2, d_head = 4, h_F = 24, v = 32, two layers
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 32, "intermediate_size": 24,
         "attention_bias": True, "mlp_bias": True}
#: h = 8, n_h = 2 (d_head = 4), h_F = 4h = 32, v = 16, n_pos = 8, gelu_new (GPT2Config's default)
GPT2 = {"architectures": ["GPT2LMHeadModel"], "n_embd": 8, "n_head": 2, "n_layer": 2, "n_positions": 8,
        "vocab_size": 16}


# the extra fixture (skips without torch and transformers, fails under CI) and the seed rule of test_measure
from test_measure import _seed, extra  # noqa: E402,F401


# ------------------------------------------------------------------------------------------------
# by hand (no torch)
# ------------------------------------------------------------------------------------------------
def test_llama_ledger_by_hand():
    """b = 2, s = 3 (6 tokens): every tensor transformers' LlamaForCausalLM keeps, in bytes."""
    m = model_from_dict(LLAMA)
    rmsnorm = 6 * 16 * 4 + 6 * 4 + 6 * 16 * 2           # fp32 input, fp32 rsqrt, bf16 normalised
    attention = (rmsnorm + 6 * 16 * 2                    # the norm and its output (input of q, k, v)
                 + 6 * 4 * 4 * 2                         # RoPE'd query, n_h heads
                 + 6 * 4 * 4 * 2                         # repeat_kv's key over the n_h heads
                 + 2 * 4 * 3 * 3 * 4 + 2 * 4 * 3 * 3 * 2  # softmax in fp32 and its bf16 copy
                 + 6 * 4 * 4 * 2                         # repeat_kv's value
                 + 6 * 4 * 4 * 2)                        # context, input of o_proj
    ffn = rmsnorm + 6 * 16 * 2 + 4 * 6 * 24 * 2          # norm, its output, gate, SiLU, up, product
    p = predicted(m, 2, 3)
    assert p["regions"] == {"embedding": 6 * 8 + 2 * 3 * 4 * 2,   # token ids, cos and sin [1, s, d_head]
                            "layer.0": attention + ffn, "layer.1": attention + ffn,
                            "final_norm": rmsnorm, "head": 6 * 16 * 2,
                            "loss": 6 * 32 * 4 + 6 * 8 + 4}        # log-softmax, labels, total_weight
    assert attention + ffn == 3936


def test_gpt2_ledger_by_hand():
    """b = 2, s = 3: LayerNorms (bf16 input, mean and rstd on the CPU), the fused c_attn, the bf16
    softmax, gelu_new's four kept tensors and the position ids."""
    m = model_from_dict(GPT2)
    assert m.hidden_act == "gelu_new"
    layernorm = 6 * 8 * 2 + 2 * 6 * 2
    attention = layernorm + 6 * 8 * 2 + 3 * 6 * 8 * 2 + 2 * 2 * 3 * 3 * 2 + 6 * 8 * 2
    ffn = layernorm + 6 * 8 * 2 + 5 * 6 * 32 * 2          # c_fc output, 0.5 x, tanh, 1 + tanh, GeLU output
    p = predicted(m, 2, 3)
    assert p["regions"]["layer.0"] == attention + ffn == 2808
    assert p["regions"]["embedding"] == 6 * 8 + 3 * 8    # token ids and arange(s)
    gelu = predicted(model_from_dict({**GPT2, "activation_function": "gelu"}), 2, 3)
    assert p["regions"]["layer.0"] - gelu["regions"]["layer.0"] == 3 * 6 * 32 * 2   # F.gelu keeps its input only


def test_single_kv_head_keeps_the_unrepeated_key_and_value_when_b_is_1():
    m = model_from_dict({**LLAMA, "num_key_value_heads": 1})
    one = predicted(m, 1, 3)["entries"]["layer.0"]
    two = predicted(m, 2, 3)["entries"]["layer.0"]
    assert one["attention.key"] == one["attention.value"] == 3 * 1 * 4 * 2        # b s n_kv d_head, bf16
    assert two["attention.key"] == two["attention.value"] == 6 * 4 * 4 * 2        # repeated over n_h heads
    assert predicted(model_from_dict(LLAMA), 1, 3)["entries"]["layer.0"]["attention.key"] == 3 * 4 * 4 * 2


def test_norm_topk_prob_is_read_and_counted():
    q2 = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 16, "num_attention_heads": 2,
          "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 20, "num_experts": 4,
          "num_experts_per_tok": 3, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 12}
    off, on = model_from_dict(q2), model_from_dict({**q2, "norm_topk_prob": True})
    assert (off.norm_topk_prob, on.norm_topk_prob) == (False, True)           # Qwen2MoeConfig's default
    assert load_model("qwen3-30b-a3b").norm_topk_prob and load_model("mixtral-8x7b").norm_topk_prob
    extra = predicted(on, 2, 5)["regions"]["layer.0"] - predicted(off, 2, 5)["regions"]["layer.0"]
    assert extra == 10 * 4 + 10 * 3 * 4       # fp32 denominator per token, fp32 top-k before the division
    with pytest.raises(ConfigError, match="norm_topk_prob='yes' must be true or false"):
        model_from_dict({**q2, "norm_topk_prob": "yes"})


def test_gpt_is_gpt2_when_gpt2_can_express_it():
    gpt = {"model_type": "gpt", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2,
           "max_position_embeddings": 8, "vocab_size": 16, "hidden_act": "gelu_new"}
    assert predicted(model_from_dict(gpt), 2, 3)["regions"] == predicted(model_from_dict(GPT2), 2, 3)["regions"]
    for change, needle in (({"num_key_value_heads": 1}, "num_key_value_heads=1 must equal num_attention_heads=2"),
                           ({"head_dim": 2}, "head_dim=2 must be hidden_size / num_attention_heads"),
                           ({"attention_bias": False}, "attention_bias=False must be true"),
                           ({"mlp_bias": False}, "mlp_bias=False must be true")):
        with pytest.raises(ConfigError, match=needle) as exc:
            predicted(model_from_dict({**gpt, **change}), 1, 4)
        assert "GPT2LMHeadModel" in str(exc.value) and "\n" not in str(exc.value)


def test_unknown_activation_is_one_line(capsys):
    from memlib.device.estimate import estimate

    m = model_from_dict({**LLAMA, "hidden_act": "relu"})
    assert m.hidden_act == "relu"             # read, and counted by the other profiles as before
    assert estimate(m, TrainingConfig(profile="paper", ep=1, pp=1, seq_len=8)).stages
    with pytest.raises(ConfigError, match="hidden_act='relu': profile=hf-eager knows what silu"):
        estimate(m, TrainingConfig(profile="hf-eager", ep=1, pp=1, seq_len=8)).stages
    with pytest.raises(ConfigError, match="hidden_act=3 must be the name of an activation function"):
        model_from_dict({**LLAMA, "hidden_act": 3})


@pytest.mark.parametrize("preset", ["llama-3-8b", "llama-3-70b", "mixtral-8x7b", "qwen3-30b-a3b",
                                    "qwen3-235b-a22b"])
def test_presets_estimate_under_hf_eager(preset):
    """One device, no parallelism (transformers has none): the per-micro-batch bytes are the ledger's."""
    from memlib.device.estimate import estimate

    t = TrainingConfig(profile="hf-eager", ep=1, pp=1, micro_batch=1, seq_len=2048, num_microbatches=1)
    st = estimate(preset, t).stages[0]
    m = load_model(preset)
    assert st.activations["per_microbatch"] == sum(predicted(m, 1, 2048)["regions"].values())


# ------------------------------------------------------------------------------------------------
# against autograd
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", [f for f in HF_RANDOM_FAMILIES if f != "deepseek"])
def test_random_configs_of_every_family_exact(extra, family):
    from memlib.measure.hf import compare
    from memlib.measure.random_configs import random_config

    seed = _seed()
    rng = random.Random(f"{family}-{seed}")
    failures = []
    for i in range(N_CONFIGS):
        m, b, s = random_config(rng, family)
        r = compare(m, b, s, seed=i, step=(i == 0))
        if not r["exact"]:
            diff = [x for x in r["regions"] if x["difference"]] + [
                {k: r[k]} for k in ("gradients", "optimizer_states") if k in r and r[k]["difference"]]
            failures.append(f"config {i}: b={b} s={s} {m} -> {diff}")
    assert not failures, f"MEMLIB_MEASURE_SEED={seed}:\n" + "\n".join(failures)


def test_cli_measure_new_families(extra, tmp_path, capsys):
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({**LLAMA, "num_key_value_heads": 1}))
    assert main(["measure", "--model", str(path), "--micro-batch", "1", "--seq-len", "4"]) == 0
    out = capsys.readouterr().out
    assert "layer.1" in out and out.rstrip().endswith("exact")
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps(GPT2))
    assert main(["measure", "--model", str(path), "--micro-batch", "2", "--seq-len", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exact"] and data["activations"]["measured"] == data["activations"]["predicted"]
    assert data["gradients"]["difference"] == 0 and data["optimizer_states"]["difference"] == 0
    assert main(["measure", "--model", str(path), "--seq-len", "9"]) == 2      # n_pos = 8
    assert "seq_len=9 exceeds max_position_embeddings=8" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_cli_measure_refuses_full_size_presets(extra, preset, capsys):
    assert main(["measure", "--model", preset]) == 2
    err = capsys.readouterr().err.strip()
    assert "meta device" in err and "\n" not in err


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b", "gpt2-tiny", "qwen2-moe-tiny"])
def test_parameters_per_transformers_tensor(extra, model):
    """param_check names every transformers tensor (GPT-2's fused c_attn, the fused experts) for the new
    families, on the meta device."""
    from memlib.measure.hf import param_check

    if model == "gpt2-tiny":
        m = model_from_dict({**GPT2, "n_inner": 20, "tie_word_embeddings": False})
    elif model == "qwen2-moe-tiny":
        m = model_from_dict({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 16, "num_attention_heads": 2,
                             "num_key_value_heads": 1, "num_hidden_layers": 2, "vocab_size": 20, "num_experts": 4,
                             "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                             "shared_expert_intermediate_size": 12})
    else:
        m = load_model(model)
    r = param_check(m)
    assert [row for row in r["tensors"] if not row["ok"]] == []
    assert r["ok"] and r["total"]["memlib"] == r["total"]["transformers"]


def test_cli_measure_names_the_family_s_expert_width(extra, tmp_path, capsys):
    """Mixtral's expert width is its config.json's intermediate_size; grouped_mm needs multiples of 8."""
    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps({"architectures": ["MixtralForCausalLM"], "hidden_size": 16, "num_attention_heads": 2,
                                "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 20,
                                "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 12}))
    assert main(["measure", "--model", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "intermediate_size=12" in err and "multiples of 8" in err and "moe_intermediate_size" not in err
