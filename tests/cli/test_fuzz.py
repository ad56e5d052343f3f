"""The command line under random and adversarial input.

Every invocation must end in one of two ways: exit 0 with output that is consistent (the JSON
parses, the stages add up), or exit 2 with nothing on stdout and one line on stderr,
``memlib: error: <field>=<value> <rule>`` (or argparse's ``argument --x: ...``); never a traceback,
never more than 5 s.  The argv and the config.json files are drawn from a seeded generator: the seed
is printed on failure, ``MEMLIB_FUZZ_SEED=...`` replays a run and ``MEMLIB_FUZZ_RUNS=...`` draws more.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memlib.cli import main
from memlib.config import PRESETS

import tiny as T

RUNS = int(os.environ.get("MEMLIB_FUZZ_RUNS", "160"))
SEED = int(os.environ.get("MEMLIB_FUZZ_SEED") or int.from_bytes(os.urandom(4), "little"))
LIMIT_S = 5.0
PLAN_LIMIT_S = 10.0

#: values that have broken parsers before, or could
NASTY = ["0", "-1", "1", "2", "3", "7", "1.5", "1e3", "1e5000", "-0", "00", "+1", " 4 ", "", " ", "x", "nan", "inf",
         "²", "٣", "1_000", "0x10", "9" * 25, "1" + "0" * 400, str(2**40 + 1), str(2**16 + 1), str(2**30),
         "80GB", "80GiB", "1e100000000", "0.1", "1/3", "-5GB", "1.5B", "NaN GB", "\x00", "é" * 3, "a" * 5000]
OPTIONS = {
    "--dp": ["1", "2", "4", "8", "16", "32", "64", "256"], "--tp": ["1", "2", "4", "8"],
    "--pp": ["1", "2", "3", "4", "8", "16"], "--ep": ["1", "2", "4", "8", "64", "256"], "--etp": ["1", "2"],
    "--cp": ["1", "2"], "--zero": ["0", "1", "2", "3"], "--micro-batch": ["1", "2"],
    "--seq-len": ["1", "64", "4096", "4095"], "--vpp": ["1", "2", "4"], "--num-microbatches": ["1", "2", "8", "32"],
    "--precision": ["paper", "megatron", "deepseek-v3", "fp32", "fp16-mixed", "megatron-fp8-param",
                    "megatron:exp_avg=bf16,exp_avg_sq=bf16", "paper:gradients=2", "megatron:exp_avg=3", "x:y"],
    "--profile": ["paper", "megatron", "hf-eager"],
    "--recompute": ["none", "selective", "deepseek", "full", "full-block:1", "full-block:2", "core_attn,mlp",
                    "moe_act", "layernorm,mla_up_proj", "full-block:²", "full-block:0", "bogus"],
    "--schedule": ["1f1b", "gpipe", "interleaved", "dualpipe", "zb-v"],
    "--layout": ["4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,1", "1,2", "0", "61", "30,31", "1,x", ",", "-1,62",
                 "Et|(tt|)*30mL", "Et*30|t*31mL", "E|t*61|L", "Et|(tt|)*99999999999"],
    "--gpu-memory": ["80GB", "80GiB", "141GB", "1TB", "1GB"], "--overhead": ["low", "high", "none", "medium"],
    "--cuda-context": ["500MiB", "2GiB"], "--comm-buffers": ["1GiB"], "--fragmentation": ["0.1", "0.3", "1", "2"],
    "--unit": ["GiB", "GB", "TB"],
}
FLAGS = ["--no-sp", "--json"]


def random_model_file(rng: random.Random, tmp: Path) -> str:
    """A config.json path: a valid random model, or an adversarial file."""
    path = tmp / f"c{rng.randrange(10**9)}.json"
    d = dict(T.TINY_HF)
    for k in list(d):
        if rng.random() < 0.5:
            d[k] = rng.choice([1, 2, 4, 8, 16, 64, 256, d[k]])
    d["first_k_dense_replace"] = rng.randint(0, d["num_hidden_layers"])
    d["num_experts_per_tok"] = rng.randint(1, d["n_routed_experts"])
    d["q_lora_rank"] = rng.choice([None, d["q_lora_rank"]])
    d["tie_word_embeddings"] = rng.random() < 0.3
    d["num_nextn_predict_layers"] = rng.choice([0, 0, 1, 2])
    kind = rng.random()
    if kind < 0.55:
        path.write_text(json.dumps(d))
    elif kind < 0.65:               # one field broken
        k = rng.choice(list(d))
        d[k] = rng.choice([0, -3, 1.5, "8", True, None, [], {}, 10**50, int("9" * 4000), 2**41])
        path.write_text(json.dumps(d))
    elif kind < 0.7:
        del d[rng.choice(list(d))]
        path.write_text(json.dumps(d))
    elif kind < 0.75:
        path.write_bytes(b"\xff\xfe" + json.dumps(d).encode("utf-16-le"))      # not UTF-8
    elif kind < 0.8:
        path.write_text("[" * 100_000 + "]" * 100_000)                         # nested too deep
    elif kind < 0.85:
        path.write_text(json.dumps(d)[: rng.randrange(1, 40)])                  # truncated
    elif kind < 0.9:
        path.write_text(json.dumps({**d, "hidden_size": "1" * 5000}).replace('"' + "1" * 5000 + '"', "1" * 5000))
    elif kind < 0.95:
        return str(tmp / ("x" * rng.choice([200, 300, 5000])))                  # no such file; too long a name
    else:
        path.write_text(json.dumps([d]))                                        # not an object
    return str(path)


#: Megatron-LM flags of a small MLA MoE model, and values to draw for each (the first is the valid one)
MEGATRON_FLAGS = {
    "--num-layers": ["4", "3", "8", "61", "0", "x"], "--hidden-size": ["64", "66", "7168"],
    "--ffn-hidden-size": ["96", "0"], "--num-attention-heads": ["4", "3", "128"],
    "--multi-latent-attention": [None, None, None, "1"], "--q-lora-rank": ["24", "0"], "--kv-lora-rank": ["16"],
    "--qk-head-dim": ["8"], "--qk-pos-emb-head-dim": ["4"], "--v-head-dim": ["8"],
    "--num-experts": ["8", "0", "6", "256"], "--moe-ffn-hidden-size": ["32", "48"], "--moe-router-topk": ["2", "9", "1"],
    "--moe-shared-expert-intermediate-size": ["32", "64", "48"],
    "--moe-layer-freq": ["'([0]*1+[1]*3)'", "2", "'[0,1,0,1]'", "'[1]*999999*999999'", "'(('"],
    "--micro-batch-size": ["1", "2", "-1"], "--seq-length": ["64", "63", "2"], "--global-batch-size": ["8", "7", "64"],
    "--bf16": [None], "--fp16": [None], "--swiglu": [None], "--normalization": ["RMSNorm", "LayerNorm", "Foo"],
    "--disable-bias-linear": [None], "--qk-layernorm": [None], "--position-embedding-type": ["rope", "none"],
    "--tokenizer-type": ["NullTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer"],
    "--vocab-size": ["1000", "129280", "0"], "--make-vocab-size-divisible-by": ["128", "3232", "1"],
    "--tensor-model-parallel-size": ["1", "2", "4"], "--pipeline-model-parallel-size": ["1", "2", "4", "3"],
    "--expert-model-parallel-size": ["1", "2", "8"], "--expert-tensor-parallel-size": ["1", "2"],
    "--context-parallel-size": ["1", "2"], "--sequence-parallel": [None], "--use-distributed-optimizer": [None],
    "--num-virtual-stages-per-pipeline-rank": ["2", "1", "3"],
    "--pipeline-model-parallel-layout": ["'Et|tt|tL'", "'Et|(t|)*2tL'", "'Et|tt|t|tmL'", "'tE|L'", "'E(t|)*99999999999L'"],
    "--decoder-first-pipeline-num-layers": ["1", "3"], "--account-for-loss-in-pipeline-split": [None],
    "--recompute-granularity": ["full", "selective", "some"], "--recompute-method": ["uniform", "block"],
    "--recompute-num-layers": ["1", "2", "0"], "--recompute-modules": ["core_attn moe_act", "'[layernorm mla_up_proj]'", "mhc"],
    "--moe-grouped-gemm": [None], "--mtp-num-layers": ["1", "0", "2"],
    "--use-precision-aware-optimizer": [None], "--exp-avg-dtype": ["bf16", "fp8", "fp64"],
    "--main-grads-dtype": ["bf16"], "--grad-reduce-in-bf16": [None], "--fp8-format": ["hybrid", "e5m2"],
    "--fp8-recipe": ["tensorwise", "delayed"], "--fp8-param-gather": [None],
    "--moe-router-load-balancing-type": ["seq_aux_loss", "sinkhorn"], "--moe-aux-loss-coeff": ["1e-4", "0", "1e999999"],
    "--attention-backend": ["auto", "flash", "local"], "--transformer-impl": ["transformer_engine", "local"],
    "--fine-grained-activation-offloading": [None], "--offload-modules": ["core_attn", "'[attn_proj]'"],
    "--lr": ["1e-4"], "--made-up-flag": ["3", None], "--tensor-model-parallel-size=2": [None],
}


#: the flags of a valid run (their first values), to which the fuzzer makes a few changes
VALID_MEGATRON = ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                  "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
                  "--v-head-dim", "--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk",
                  "--moe-shared-expert-intermediate-size", "--micro-batch-size", "--seq-length", "--bf16", "--swiglu",
                  "--normalization", "--disable-bias-linear", "--qk-layernorm", "--tokenizer-type", "--vocab-size")


def random_megatron_file(rng: random.Random, tmp: Path) -> str:
    """A Megatron-LM flag file: mostly the small model's flags, some values and flags drawn at random,
    written as a flag list, a launch script or a model_config.yaml; or an adversarial file."""
    path = tmp / f"m{rng.randrange(10**9)}.args"
    chosen = {flag: MEGATRON_FLAGS[flag][0] for flag in VALID_MEGATRON}     # a run that works
    for flag in rng.sample(sorted(MEGATRON_FLAGS), rng.choice([0, 0, 1, 1, 2, 4])):   # then a few changes
        chosen[flag] = rng.choice(MEGATRON_FLAGS[flag] + [rng.choice(NASTY)])
    kind = rng.random()
    words = [k if v is None else f"{k} {v}" for k, v in chosen.items()]
    if kind < 0.4:
        path.write_text(" ".join(words))
    elif kind < 0.7:
        path.write_text("#!/bin/bash\nARGS=(\n" + "\n".join("    " + w for w in words)
                        + "\n)\ntorchrun --nproc_per_node 4 pretrain_gpt.py ${ARGS[@]} \\\n  --log-interval 1\n")
    elif kind < 0.9:
        lines = [f"  {k}: {'true' if v is None else v}" for k, v in chosen.items() if "=" not in k]
        path.write_text("ENV_VARS:\n  A: 1\nMODEL_ARGS:\n" + "\n".join(lines) + "\n")
    elif kind < 0.95:
        path.write_bytes(rng.choice([b"MODEL_ARGS:\n  --x: [\n", b"--num-layers '4", b"\xff\xfe--x", b"--x\x00",
                                     b"MODEL_ARGS: 3\n", b"--x 1 " * 200_000]))
    else:
        return str(tmp / "missing.args")
    return str(path)


def random_argv(rng: random.Random, tmp: Path) -> list[str]:
    cmd = rng.choices(["estimate", "params", "formula", "measure", "bogus"], weights=[70, 12, 8, 6, 2])[0]
    if cmd == "estimate" and rng.random() < 0.3:            # Megatron-LM flags instead of --model
        argv = [cmd, "--megatron-args", random_megatron_file(rng, tmp)]
        if rng.random() < 0.9:
            argv += ["--world-size", "1" if rng.random() < 0.6 else rng.choice(["2", "4", "8", "16", "0", "x"])]
        for opt in rng.sample(sorted(OPTIONS), rng.choice([0, 0, 1, 2])):
            argv += [opt, rng.choice(OPTIONS[opt])]
        return argv + [f for f in FLAGS if rng.random() < 0.5]
    model = rng.choice([*PRESETS, *PRESETS, "deepseek-v9", random_model_file(rng, tmp),
                        random_model_file(rng, tmp)])
    argv = [cmd]
    if cmd == "formula":
        argv += [rng.choice(["params.total", "params.mla", "params.shared_experts", "states.zero2",
                             "activations.paper.moe", "nope", "params.expert"])]
        argv += rng.sample(["--latex"], rng.randint(0, 1))
        return argv + ["--model", model]
    if cmd == "measure":                     # argument errors only: a real measurement builds a model
        return argv + ["--model", model, "--micro-batch", rng.choice(["0", "-1", "x", "1" * 30]),
                       "--seq-len", rng.choice(NASTY)]
    argv += ["--model", model]
    if cmd == "estimate":
        for opt in rng.sample(sorted(OPTIONS), rng.randint(0, 8)):
            argv += [opt, rng.choice(OPTIONS[opt]) if rng.random() < 0.85 else rng.choice(NASTY)]
    argv += [f for f in FLAGS if rng.random() < 0.5 and (cmd == "estimate" or f == "--json")]
    return argv


def run_in_process(argv: list[str]) -> tuple[int, str, str, float]:
    """The call's exit code, output and the processor seconds it took (its own work: on a machine shared with other
    jobs its wall-clock time is theirs too)."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:           # argparse's --help; never expected here
            rc = exc.code
    return rc, out.getvalue(), err.getvalue(), time.process_time() - t0


def check_outcome(argv, rc, out, err, seconds, where):
    limit = PLAN_LIMIT_S if argv[:1] == ["plan"] else LIMIT_S
    assert seconds < limit, f"{where}: took {seconds:.1f} s: {argv}"
    assert "Traceback" not in err, f"{where}: {argv}\n{err}"
    if rc == 2:
        assert out == "", f"{where}: {argv}"
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("memlib: error: "), f"{where}: {argv}\n{err}"
        line = lines[0]
        # names the field: "<field>=<value> ..." or argparse's "argument --x: ..." / a usage line
        assert "=" in line or "argument" in line or "required" in line or "invalid choice" in line, (where, line)
        assert len(line) < 700, (where, line[:200])
        return
    assert rc == 0, f"{where}: exit {rc}: {argv}\n{err}"
    if "--json" in argv:
        data = json.loads(out)
        if argv[0] == "estimate":
            for s in data["stages"]:
                b = s["bytes"]
                assert b["total"] == sum(v for k, v in b.items() if k != "total")
                assert s["allocated"] == b["total"] - b["overhead"]
                assert all(type(v) is int and v >= 0 for v in b.values())
            assert data["peak"]["bytes"] == max(s["bytes"]["total"] for s in data["stages"])
        if argv[0] == "params":
            assert data["total"] == sum(data["components"].values())
        if argv[0] == "plan":
            assert data["searched"] >= data["fitting"] >= len(data["configs"])
            for c in data["configs"]:
                assert c["peak"] <= data["capacity"] and c["headroom"] == data["capacity"] - c["peak"]
                assert type(c["peak"]) is int and c["peak"] > 0
    else:
        assert out.strip(), f"{where}: no output: {argv}"


def test_cli_fuzz(tmp_path):
    rng = random.Random(SEED)
    where = f"MEMLIB_FUZZ_SEED={SEED}"
    seen = {0: 0, 2: 0}
    megatron = {0: 0, 2: 0}
    for i in range(RUNS):
        argv = random_argv(rng, tmp_path)
        rc, out, err, seconds = run_in_process(argv)
        check_outcome(argv, rc, out, err, seconds, f"{where} run {i}")
        seen[rc] = seen.get(rc, 0) + 1
        if "--megatron-args" in argv:
            megatron[rc] = megatron.get(rc, 0) + 1
            if rc == 0 and "--json" in argv:
                assert "megatron_args" in json.loads(out), (where, argv)
    # the generator reaches both outcomes (so that neither check is vacuous), flag files included
    assert seen[0] > RUNS // 10 and seen[2] > RUNS // 10, (where, seen)
    assert megatron[0] and megatron[2], (where, megatron)


@pytest.mark.parametrize("argv", [
    ["estimate", "--gpu-memory", "1e5000"],
    ["estimate", "--cuda-context", "1e100000000"],
    ["estimate", "--seq-len", str(2**7200)],
    ["estimate", "--pp", "1" + "0" * 400],
    ["estimate", "--pp", "30000"],
    ["estimate", "--schedule", "interleaved", "--pp", "1", "--vpp", "1000000000", "--layout", "0"],
    ["estimate", "--recompute", "full-block:²"],
    ["estimate", "--model", "x" * 5000],
    ["estimate", "--model", "deepseek-v2", "--pp", "12", "--tp", "1", "--dp", "160", "--ep", "10", "--json"],
    ["estimate", "--model", "deepseek-v2-lite", "--pp", "3", "--tp", "1", "--dp", "1024", "--ep", "64", "--etp", "16",
     "--seq-len", "1", "--json"],
    ["estimate", "--precision", "deepseek-v3", "--model", "deepseek-v2-lite", "--pp", "1", "--tp", "1", "--dp", "8",
     "--seq-len", "33", "--json"],
])
def test_the_issues_reproducers_through_a_real_process(argv):
    """The crashes and hangs reported (issue #8), each as its own process: exit 0 or the one line."""
    def cpu() -> float:              # the process's own seconds (the machine may be shared)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime

    t0 = cpu()
    r = subprocess.run([sys.executable, "-m", "memlib", *argv], capture_output=True, text=True, timeout=60)
    check_outcome(argv, r.returncode, r.stdout, r.stderr, cpu() - t0, "reproducer")


def test_config_files_that_broke_the_reader(tmp_path):
    cases = {
        "utf16.json": b"\xff\xfe" + json.dumps(T.TINY_HF).encode("utf-16-le"),
        "deep.json": ("[" * 50_000 + "]" * 50_000).encode(),
        "digits.json": json.dumps(T.TINY_HF).replace('"hidden_size": 8', '"hidden_size": ' + "7" * 5000).encode(),
        "big.json": json.dumps({**T.TINY_HF, "hidden_size": 2**41}).encode(),
    }
    needles = {"utf16.json": "not UTF-8", "deep.json": "nested too deeply", "digits.json": "cannot read it as JSON",
               "big.json": "hidden_size=2199023255552 exceeds 2^40"}
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        rc, out, err, seconds = run_in_process(["params", "--model", str(p)])
        check_outcome(["params"], rc, out, err, seconds, name)
        assert rc == 2 and needles[name] in err, (name, err)


# ------------------------------------------------------------------------------------------------
# plan, Megatron layout strings, every family's config.json fields (issue #20)
# ------------------------------------------------------------------------------------------------
PLAN_RUNS = int(os.environ.get("MEMLIB_FUZZ_PLAN_RUNS", "14"))
SURFACE_RUNS = int(os.environ.get("MEMLIB_FUZZ_SURFACE_RUNS", "120"))
HUGE = "10000000000000000000"
NOT_ASCII = ["²", "١", "１", "٣٢", "𝟐"]

#: plan's options and values to draw for each (valid ones first, then the kinds of input that broke it)
PLAN_OPTIONS = {
    "--global-batch": ["32", "64", "96", "15360", "7", "0", HUGE, str(2**30), "١٦"],
    "--seq-len": ["1024", "4096", "4095", "1", HUGE],
    "--profile": ["megatron", "paper", "megatron,paper", "hf-eager", "megatron,bogus", ",", ""],
    "--precision": ["megatron", "fp32,megatron", "megatron:exp_avg=bf16,exp_avg_sq=bf16",
                    "fp32,megatron:exp_avg=bf16,exp_avg_sq=bf16", "deepseek-v3", "megatron,bogus", "x:y=z"],
    "--recompute": ["none", "none,selective,full", "full-block:1", "deepseek", "layernorm+mla_up_proj",
                    "none,bogus", "full-block:²", "core_attn+mlp"],
    "--schedule": ["1f1b", "1f1b,gpipe", "gpipe,1f1b", "interleaved", "dualpipe", "1f1b,interleaved,dualpipe,gpipe",
                   "zb-v"],
    "--zero": ["0,1,2,3", "1", "0,1", "4", "١", "", "3,3"],
    "--layout-rule": ["default", "balanced", "default,balanced", "uneven"],
    "--fix": ["tp=1", "pp=2", "zero=3", "tp=²", "tp=١", "b=64", "vpp=2", "pp=1,tp=2", "foo=1", "tp=x", "tp=1,tp=2",
              "dp=" + HUGE],
    "--max-micro-batch": ["1", "4", "16", "0", HUGE],
    "--max-vpp": ["2", "4", "64", "1", "65", HUGE],
    "--top": ["0", "1", "10", "200", "2000", "2001", HUGE, "-1"],
    "--overhead": ["low", "high", "none", "medium"],
    "--unit": ["GiB", "GB", "TB"],
}


def random_plan_argv(rng: random.Random, tmp: Path) -> list[str]:
    model = rng.choice([*PRESETS, random_family_file(rng, tmp, valid=True), random_model_file(rng, tmp)])
    argv = ["plan", "--model", model, "--gpus", rng.choice(["1", "2", "8", "16", "64", "256", "0", "x", HUGE, "٨"]),
            "--gpu-memory", rng.choice(["80GB", "141GB", "1TB", "1GB", "80", "eighty"])]
    for opt in rng.sample(sorted(PLAN_OPTIONS), rng.randint(0, 5)):
        argv += [opt, rng.choice(PLAN_OPTIONS[opt])]
    if rng.random() < 0.6:
        argv.append("--json")
    return argv


def random_layout_string(rng: random.Random) -> str:
    """A Megatron-LM layout string: valid pieces (stages of E, t, m, L; repetitions) and broken ones."""
    pieces = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        n = rng.choice(["0", "1", "2", "3", "30", "61", "1023", "4095", "99999999999"] + NOT_ASCII)
        if kind < 0.3:
            pieces.append(rng.choice(["E", "t", "m", "L", "tt", "Et", "mL", ""]) + "|")
        elif kind < 0.55:
            pieces.append(f"({rng.choice(['t|', '|', 'tt|', 'E|', 't'])})*{n}")
        elif kind < 0.8:
            pieces.append(f"{rng.choice('Etm|')}*{n}")
        else:
            pieces.append(rng.choice(["x", "(", ")", "*", ",", "t*", "(t|)*", "é", "\x00"]))
    text = "".join(pieces)
    if rng.random() < 0.7:
        text = "E" + text + rng.choice(["t*61mL", "mL", "L", "t*60L", ""])
    return text


def random_layout_argv(rng: random.Random) -> list[str]:
    argv = ["estimate", "--layout", random_layout_string(rng)]
    if rng.random() < 0.7:
        argv += ["--pp", rng.choice(["1", "2", "4", "16", "61", "1024", "4096", "30000"])]
    if rng.random() < 0.3:
        argv += ["--schedule", rng.choice(["1f1b", "interleaved", "dualpipe", "gpipe"])]
    if rng.random() < 0.3:
        argv += ["--model", rng.choice(PRESETS)]
    return argv + ["--json"] * (rng.random() < 0.5)


FAMILY_CONFIGS = T.FAMILY_CONFIGS
#: values that have broken config readers: booleans and floats where integers belong, strings, nulls, sizes
FIELD_VALUES = [True, False, 0, 1, 2, -1, 1.0, 0.0, 2.5, "1", "", None, [], {}, 2**40 + 1, 10**30, 3, 8, 64]


def random_family_file(rng: random.Random, tmp: Path, valid: bool = False) -> str:
    """A config.json of a random family: valid and varied in size (``valid``), or with some fields broken."""
    d = dict(FAMILY_CONFIGS[rng.choice(sorted(FAMILY_CONFIGS))])
    layers = "n_layer" if "n_layer" in d else "num_hidden_layers"
    d[layers] = rng.choice([1, 2, 4, 8, 16, 61])
    if "first_k_dense_replace" in d:
        d["first_k_dense_replace"] = rng.randint(0, d[layers])
    if not valid:
        for key in rng.sample(sorted(d), rng.choice([1, 1, 2, 3])):
            d[key] = rng.choice(FIELD_VALUES)
        if rng.random() < 0.3:
            d[rng.choice(["decoder_sparse_step", "num_nextn_predict_layers", "n_group", "topk_group", "head_dim",
                          "moe_layer_freq", "tie_word_embeddings", "mlp_only_layers"])] = rng.choice(FIELD_VALUES)
    path = tmp / f"f{rng.randrange(10**9)}.json"
    path.write_text(json.dumps(d))
    return str(path)


def random_family_argv(rng: random.Random, tmp: Path) -> list[str]:
    model = random_family_file(rng, tmp, valid=rng.random() < 0.3)
    cmd = rng.choice(["params", "estimate", "estimate"])
    argv = [cmd, "--model", model]
    if cmd == "estimate":
        argv += ["--dp", "1", "--pp", rng.choice(["1", "2"]), "--ep", rng.choice(["1", "2"]),
                 "--profile", rng.choice(["paper", "megatron", "hf-eager"]), "--tp", rng.choice(["1", "2"])]
    return argv + ["--json"] * (rng.random() < 0.7)


MEGATRON_EXTRA = ["--über-flag 3", "--moe-made-up-flag 2", "--x+y 1", "--flag\u00e9", "--num-layers ١", "--moe-router-topk 2",
                  "--pipeline-model-parallel-layout 'Et*٣L'", "--moe-layer-freq '[1]*٤'"]


def random_megatron_extra_argv(rng: random.Random, tmp: Path) -> list[str]:
    """The valid small run of random_megatron_file, dense or MoE, with flags memlib does not know added."""
    chosen = {flag: MEGATRON_FLAGS[flag][0] for flag in VALID_MEGATRON}
    if rng.random() < 0.5:                       # a dense model: no --num-experts
        for flag in ("--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk", "--moe-shared-expert-intermediate-size"):
            chosen.pop(flag)
    words = [k if v is None else f"{k} {v}" for k, v in chosen.items()] + rng.sample(MEGATRON_EXTRA, rng.randint(1, 3))
    path = tmp / f"x{rng.randrange(10**9)}.args"
    path.write_text(" ".join(words))
    return ["estimate", "--megatron-args", str(path), "--world-size", "1"] + ["--json"] * (rng.random() < 0.5)


def _campaign(draw, runs: int, tmp_path, name: str) -> dict:
    rng = random.Random(f"{SEED}-{name}")
    where = f"MEMLIB_FUZZ_SEED={SEED} ({name})"
    seen: dict = {}
    for i in range(runs):
        argv = draw(rng, tmp_path)
        rc, out, err, seconds = run_in_process(argv)
        check_outcome(argv, rc, out, err, seconds, f"{where} run {i}")
        seen[rc] = seen.get(rc, 0) + 1
    return seen


def test_plan_fuzz(tmp_path):
    """``memlib plan`` under random and hostile options: exit 0 with consistent JSON (every listed peak within the
    capacity) or the one line, within 10 s; never a traceback."""
    seen = _campaign(random_plan_argv, PLAN_RUNS, tmp_path, "plan")
    assert set(seen) <= {0, 2}, seen


def test_layout_string_fuzz(tmp_path):
    seen = _campaign(lambda rng, tmp: random_layout_argv(rng), SURFACE_RUNS // 2, tmp_path, "layout")
    assert seen.get(2) and set(seen) <= {0, 2}, seen


def test_family_config_fuzz(tmp_path):
    """Config files of every family with fields broken (booleans and floats for integers, strings, nulls, huge
    sizes) or valid and varied: read, or refused in one line."""
    seen = _campaign(random_family_argv, SURFACE_RUNS, tmp_path, "families")
    assert seen.get(0) and seen.get(2) and set(seen) <= {0, 2}, seen


def test_megatron_unknown_flag_fuzz(tmp_path):
    """A valid Megatron-LM run with flags memlib does not know (or integers in other digits) added: every unknown
    flag is in the warning (never dropped), a non-ASCII integer is refused."""
    rng = random.Random(f"{SEED}-megatron-extra")
    for i in range(SURFACE_RUNS // 4):
        argv = random_megatron_extra_argv(rng, tmp_path)
        rc, out, err, seconds = run_in_process(argv)
        check_outcome(argv, rc, out, err, seconds, f"MEMLIB_FUZZ_SEED={SEED} (megatron extra) run {i}")
        text = Path(argv[2]).read_text()
        if rc == 0:
            for flag in ("--über-flag", "--moe-made-up-flag", "--x+y"):
                if flag in text:
                    assert flag in err, (argv, text, err)
