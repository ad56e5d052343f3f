"""``--megatron-args`` gives the same bytes as the equivalent memlib options, for every case of the validation set.

For each functional test memlib expresses (memlib.scenarios.functional), the model its flags build is written as
a config.json of its family (where one reads it back to the same model) and the training configuration as
``memlib estimate`` options.  Every case: the options give the very configuration the flags give.  Every
DeepSeek case and every eighth other, through both command lines: the same stages to the byte, the same peak on
the same GPU (on the command line where the flags leave the framework at memlib's defaults; else with the
framework the flags build, which a launch gives and no option sets: --no-gradient-accumulation-fusion, the
environment's cuBLAS workspaces).
"""
from __future__ import annotations

import json
from dataclasses import fields, replace
from decimal import Decimal
from fractions import Fraction


from memlib.cli import main
from memlib.cli.options import _cli_training
from memlib.cli.parser import _explicit, _parser
from memlib.device.estimate import estimate
from memlib.device.overhead import Overheads
from memlib.config import FAMILIES, ModelConfig, model_from_dict
from memlib.device.peak import Framework
from memlib.scenarios import functional as fv

GPUS = {8: "A100", 9: "H100", 10: "GB200"}
NONE = Overheads(0, 0, Fraction(0))


def config_json(m: ModelConfig) -> dict | None:
    """A config.json that reads back to ``m`` (None when no family of memlib reads it so)."""
    if m.family == "deepseek" or m.attention == "mla":
        d = dict(m.values())
    else:
        fam = next((f for f in FAMILIES if (f.attention, f.mlp, f.moe, f.norm, f.positions, f.qk_norm) ==
                    (m.attention, m.mlp, m.moe, m.norm, m.positions, m.qk_norm) and f.name != "gpt2"), None)
        if fam is None:
            return None
        d = {"model_type": fam.model_types[0]}
        for field, hf, _ in fam.fields:
            if hf is None:
                continue
            value = getattr(m, field)
            if field in ("qkv_bias", "o_bias") and hf == "attention_bias":
                value = m.qkv_bias
            d[hf] = value
    for k in ("name", "source"):
        d.pop(k, None)
    try:
        back = model_from_dict(d)
    except Exception:
        return None
    same = all(getattr(back, f.name) == getattr(m, f.name) for f in fields(ModelConfig) if f.name not in ("name",
                                                                                                          "source"))
    return d if same else None


def options(train) -> list[str]:
    """``memlib estimate`` options for a training configuration."""
    v = train.values()
    out = []
    for name in ("dp", "tp", "pp", "ep", "etp", "cp", "zero", "micro_batch", "seq_len", "vpp", "num_microbatches",
                 "ddp_bucket_size"):
        if v[name] is not None:
            out += [f"--{name.replace('_', '-')}", str(int(v[name]))]
    for name in ("precision", "profile", "recompute", "schedule", "transformer_impl", "attention_backend",
                 "cross_entropy_fusion_impl", "cp_comm_type", "fp8_recipe"):
        out += [f"--{name.replace('_', '-')}", str(v[name])]
    for name in ("hidden_dropout", "attention_dropout", "routing_imbalance"):   # exact decimals, as a user types them
        out += [f"--{name.replace('_', '-')}", str(Decimal(Fraction(v[name]).numerator) / Fraction(v[name]).denominator)]
    out += ["--moe-router-load-balancing-type", v["moe_aux_loss"], "--layout", ",".join(map(str, v["layout"]))]
    if v["megatron_version"]:
        out += ["--megatron-version", v["megatron_version"]]
    if v["fp8"]:
        out += ["--fp8-format", v["fp8"]]
    if v["offload_modules"]:
        out += ["--offload-modules", ",".join(v["offload_modules"])]
    for name, flag in (("attention_softmax_in_fp32", "--attention-softmax-in-fp32"),
                       ("cross_entropy_loss_fusion", "--cross-entropy-loss-fusion"),
                       ("moe_a2a_overlap", "--overlap-moe-expert-parallel-comm"),
                       ("overlap_grad_reduce", "--overlap-grad-reduce"), ("overlap_param_gather", "--overlap-param-gather")):
        if v[name]:
            out.append(flag)
    if not v["sp"]:
        out.append("--no-sp")
    if not v["bias_swiglu_fusion"]:
        out.append("--no-bias-swiglu-fusion")
    return out


#: the Framework fields an estimate option sets, and the option (a switch that turns the default off, or on)
FRAMEWORK_OPTIONS = {"gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
                     "rope_fusion": "--no-rope-fusion", "moe_grouped_gemm": "--no-moe-grouped-gemm",
                     "permute_fusion": "--no-moe-permute-fusion",
                     "attention_mask_in_batch": "--create-attention-mask-in-dataloader",
                     "deterministic": "--deterministic-mode", "expandable_segments": "--no-expandable-segments"}


def framework_options(fw: Framework) -> list[str]:
    """``memlib estimate`` options for the framework fields an option sets."""
    out = [flag for name, flag in FRAMEWORK_OPTIONS.items() if getattr(fw, name) != getattr(Framework(), name)]
    if fw.cublas_workspace_config is not None:
        out += ["--cublas-workspace-config", fw.cublas_workspace_config]
    if fw.token_dispatcher != Framework().token_dispatcher:
        out += ["--moe-token-dispatcher-type", fw.token_dispatcher]
    if fw.rerun_mode != Framework().rerun_mode:
        out += ["--rerun-mode", fw.rerun_mode]
    return out


def run_json(capsys, argv) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _cases():
    ok, _ = fv.validation()
    seen, out = set(), []
    for c in ok:     # one case per distinct model, configuration and GPU
        key = (c.run.model, c.run.train, c.golden.compute_capability)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def test_every_case_reads_to_the_same_bytes_as_the_options(tmp_path, capsys):
    import yaml

    checked = unrepresentable = peaks_compared = 0
    for i, c in enumerate(_cases()):
        g = c.golden
        d = config_json(c.run.model)
        if d is None:
            unrepresentable += 1
            continue
        cfg = tmp_path / f"case{i}.json"
        cfg.write_text(json.dumps(d))
        # every case: the options give the configuration the flags give (and so, estimate being a function of
        # them, the same bytes)
        argv = ["estimate", "--model", str(cfg), *options(c.run.train)]
        assert _cli_training(_parser().parse_args(argv), _explicit(argv)) == c.run.train, g.key
        checked += 1
        if i % 8 and c.family != fv.FAMILIES[0]:
            continue         # the bytes through both command lines: every DeepSeek case and every eighth other
        flags = tmp_path / f"case{i}.yaml"
        flags.write_text(yaml.safe_dump({"MODEL_ARGS": g.model_args, "ENV_VARS": g.env_vars}))
        gpu = ["--gpu", GPUS[g.compute_capability]]
        a = run_json(capsys, ["estimate", "--megatron-args", str(flags), "--world-size", str(c.world_size),
                              "--megatron-version", g.version, "--attention-backend", c.run.train.attention_backend.value,
                              *gpu])
        fw = replace(c.run.framework, compute_capability=g.compute_capability)
        b = run_json(capsys, ["estimate", "--model", str(cfg), *options(c.run.train), *framework_options(fw), *gpu])
        assert {k: v for k, v in a["config"].items() if k != "framework"} == \
            {k: v for k, v in b["config"].items() if k != "framework"}, g.key
        for sa, sb in zip(a["stages"], b["stages"]):
            assert (sa["bytes"], sa["activations"]) == (sb["bytes"], sb["activations"]), (g.key, sa["stage"])
        # the peak: on the command line where every framework field the flags set has an option, else the options'
        # training configuration with the framework the flags build (no option sets it)
        settable = ("token_dispatcher", "compute_capability", "cublas_workspace_config", *FRAMEWORK_OPTIONS)
        if replace(fw, **{k: getattr(Framework(), k) for k in settable}) == Framework():
            assert a["peak_allocated"] == b["peak_allocated"], g.key
            peaks_compared += 1
        assert estimate(model_from_dict(d), c.run.train, NONE, framework=fw).to_dict()["peak_allocated"] == \
            a["peak_allocated"], g.key
    # the families read most cases back (the others build a model no family's config.json describes, e.g. a
    # GPT shell with RoPE)
    assert checked > 2 * unrepresentable and checked >= 100, (checked, unrepresentable)
    assert peaks_compared >= 20, peaks_compared
