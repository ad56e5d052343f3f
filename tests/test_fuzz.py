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

#: values that have broken parsers before, or could
NASTY = ["0", "-1", "1", "2", "3", "7", "1.5", "1e3", "1e5000", "-0", "00", "+1", " 4 ", "", " ", "x", "nan", "inf",
         "²", "٣", "1_000", "0x10", "9" * 25, "1" + "0" * 400, str(2**40 + 1), str(2**16 + 1), str(2**30),
         "80GB", "80GiB", "1e100000000", "0.1", "1/3", "-5GB", "1.5B", "NaN GB", "\x00", "é" * 3, "a" * 5000]
OPTIONS = {
    "--dp": ["1", "2", "4", "8", "16", "32", "64", "256"], "--tp": ["1", "2", "4", "8"],
    "--pp": ["1", "2", "3", "4", "8", "16"], "--ep": ["1", "2", "4", "8", "64", "256"], "--etp": ["1", "2"],
    "--cp": ["1", "2"], "--zero": ["0", "1", "2", "3"], "--micro-batch": ["1", "2"],
    "--seq-len": ["1", "64", "4096", "4095"], "--vpp": ["1", "2", "4"], "--num-microbatches": ["1", "2", "8", "32"],
    "--precision": ["paper", "megatron", "deepseek-v3", "fp32", "fp16-mixed", "megatron-fp8-param"],
    "--profile": ["paper", "megatron", "hf-eager"],
    "--recompute": ["none", "selective", "deepseek", "full", "full-block:1", "full-block:2", "core_attn,mlp",
                    "moe_act", "layernorm,mla_up_proj", "full-block:²", "full-block:0", "bogus"],
    "--schedule": ["1f1b", "gpipe", "interleaved", "dualpipe", "zb-v"],
    "--layout": ["4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,1", "1,2", "0", "61", "30,31", "1,x", ",", "-1,62"],
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


def random_argv(rng: random.Random, tmp: Path) -> list[str]:
    cmd = rng.choices(["estimate", "params", "formula", "measure", "bogus"], weights=[70, 12, 8, 6, 2])[0]
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
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:           # argparse's --help; never expected here
            rc = exc.code
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def check_outcome(argv, rc, out, err, seconds, where):
    assert seconds < LIMIT_S, f"{where}: took {seconds:.1f} s: {argv}"
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
    else:
        assert out.strip(), f"{where}: no output: {argv}"


def test_cli_fuzz(tmp_path):
    rng = random.Random(SEED)
    where = f"MEMLIB_FUZZ_SEED={SEED}"
    seen = {0: 0, 2: 0}
    for i in range(RUNS):
        argv = random_argv(rng, tmp_path)
        rc, out, err, seconds = run_in_process(argv)
        check_outcome(argv, rc, out, err, seconds, f"{where} run {i}")
        seen[rc] = seen.get(rc, 0) + 1
    # the generator reaches both outcomes (so that neither check is vacuous)
    assert seen[0] > RUNS // 10 and seen[2] > RUNS // 10, (where, seen)


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
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "memlib", *argv], capture_output=True, text=True, timeout=60)
    check_outcome(argv, r.returncode, r.stdout, r.stderr, time.perf_counter() - t0, "reproducer")


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
