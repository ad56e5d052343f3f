"""The command line, run as ``python -m memlib`` in a subprocess: the JSON contract, the readable
table, config.json input, and every error rule (exit code 2, one line on stderr, no traceback).
Also memlib.core.units (display formatting and parsing)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from fractions import Fraction
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from memlib import cli
from memlib.config import preset_names
from memlib.core.units import UNITS, fmt_billions, fmt_bytes, fmt_count, parse_bytes, to_unit

import tiny as T

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@lru_cache(maxsize=None)
def _spawn(args: tuple[str, ...]) -> Result:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "memlib", *args], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=120)
    return Result(r.returncode, r.stdout, r.stderr)


def _in_process(args: tuple[str, ...]) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(args))
    return Result(rc, out.getvalue(), err.getvalue())


def run(*args) -> Result:
    """``python -m memlib ARGS`` in a subprocess (each pays Python's and SymPy's start-up, about
    half a second, so the many variations below use :func:`call` instead)."""
    return _spawn(tuple(str(a) for a in args))


def call(*args) -> Result:
    """``memlib.cli.main(ARGS)`` in this process, with stdout and stderr captured."""
    return _in_process(tuple(str(a) for a in args))


def run_json(*args, runner=run) -> dict:
    r = runner(*args, "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return json.loads(r.stdout)


# ---------------------------------------------------------------------------------------------
# params
# ---------------------------------------------------------------------------------------------
def test_params_json_contract():
    d = run_json("params", "--model", "deepseek-v3")
    assert {"model", "total", "activated", "mtp", "components"} <= set(d)
    assert d["model"] == "deepseek-v3"
    for key in ("total", "activated", "mtp"):
        assert type(d[key]) is int
    assert all(type(v) is int for v in d["components"].values())
    assert sum(d["components"].values()) == d["total"] == 671_026_404_352
    assert d["activated"] == 37_552_282_624
    assert d["mtp"] == 11_610_067_968
    assert {"embedding", "attention", "routed_experts", "head"} <= set(d["components"])


@pytest.mark.parametrize("model,total", [("deepseek-v2", 235_741_434_880),
                                         ("deepseek-v2-lite", 15_706_484_224)])
def test_params_other_presets(model, total):
    d = run_json("params", "--model", model, runner=call)
    assert d["total"] == total == sum(d["components"].values())
    assert d["mtp"] == 0


def test_params_readable():
    r = run("params")
    assert r.returncode == 0 and r.stderr == ""
    assert "671,026,404,352" in r.stdout
    assert "14,848" in r.stdout   # the router-bias buffer, counted apart


# ---------------------------------------------------------------------------------------------
# estimate
# ---------------------------------------------------------------------------------------------
PAPER_ARGS = ("estimate", "--model", "deepseek-v3", "--dp", "32", "--tp", "2", "--pp", "16",
              "--ep", "8", "--etp", "1")


def test_estimate_json_contract():
    d = run_json(*PAPER_ARGS)
    assert {"model", "config", "stages", "peak"} <= set(d)
    assert d["model"] == "deepseek-v3"
    cfg = d["config"]
    assert {k: cfg[k] for k in ("dp", "tp", "pp", "ep", "etp", "cp", "zero", "precision", "profile")} == {
        "dp": 32, "tp": 2, "pp": 16, "ep": 8, "etp": 1, "cp": 1, "zero": 0, "precision": "paper",
        "profile": "paper"}
    assert cfg["layout"] == [4] * 15 + [1]           # resolved, not null
    assert cfg["edp"] == 8 and cfg["world_size"] == 1024
    assert len(d["stages"]) == 16
    for i, s in enumerate(d["stages"]):
        assert {"stage", "layers", "parameters", "bytes"} <= set(s)
        assert s["stage"] == i
        assert type(s["parameters"]) is int
        b = s["bytes"]
        assert {"parameters", "gradients", "optimizer_states", "total"} <= set(b)
        assert all(type(x) is int for x in b.values())
        assert b["total"] == sum(v for k, v in b.items() if k != "total")
    assert [s["layers"] for s in d["stages"]][:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert d["stages"][15]["layers"] == [60]
    assert d["stages"][1]["parameters"] == 6_250_364_928
    assert model_states(d["stages"][1]["bytes"]) == 87_505_108_992
    assert d["stages"][1]["activations"]["per_microbatch"] == 24_671_158_272   # the paper's §5, b = 1
    assert d["peak"]["bytes"] == max(s["bytes"]["total"] for s in d["stages"])


def model_states(b: dict) -> int:
    """Parameters + gradients + optimizer states (the paper's Table 8 quantity)."""
    return b["parameters"] + b["gradients"] + b["optimizer_states"]


def test_estimate_defaults_are_the_paper():
    # in-process with no options = the paper's configuration spelt out, in a subprocess
    assert run_json("estimate", runner=call) == run_json(*PAPER_ARGS)


@pytest.mark.parametrize("zero,total", [(1, 43_430_264_832), (2, 21_392_842_752), (3, 10_374_131_712)])
def test_estimate_zero(zero, total):
    d = run_json(*PAPER_ARGS, "--zero", zero, runner=call)
    assert d["config"]["zero"] == zero
    assert model_states(d["stages"][1]["bytes"]) == total


def test_estimate_readable_table():
    r = run(*PAPER_ARGS)
    assert r.returncode == 0 and r.stderr == ""
    assert "81.50" in r.stdout
    assert "6,250,364,928" in r.stdout
    assert "PP16@TP2@EP8@ETP1" in r.stdout
    assert "peak: stage 1" in r.stdout
    r = call(*PAPER_ARGS, "--unit", "GB")
    assert "87.51" in r.stdout and "GB" in r.stdout


def test_estimate_options_reach_the_config():
    d = run_json("estimate", "--pp", "2", "--layout", "30,31", "--precision", "megatron",
                 "--profile", "megatron", "--cp", "2", "--dp", "16", runner=call)
    assert d["config"]["layout"] == [30, 31]
    assert d["config"]["precision"] == "megatron" and d["config"]["profile"] == "megatron"
    assert d["config"]["cp"] == 2
    assert [len(s["layers"]) for s in d["stages"]] == [30, 31]


def test_config_json_path(tmp_path):
    cfg = T.write_tiny(tmp_path / "config.json")
    d = run_json("params", "--model", cfg)
    assert d["total"] == 2554           # worked by hand in test_params.py
    assert d["activated"] == 2170
    d = run_json("estimate", "--model", cfg, "--dp", "2", "--tp", "2", "--pp", "2", "--ep", "2",
                 "--etp", "1", runner=call)
    # per device, worked by hand in test_partition.py
    assert [s["parameters"] for s in d["stages"]] == [1024, 604]
    assert [s["layers"] for s in d["stages"]] == [[0, 1], [2]]
    assert model_states(d["stages"][0]["bytes"]) == 14 * 1024


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
def check_error(r: Result, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""                        # bad input never yields a number
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


ERRORS = [
    (("--ep", "7"), ["ep=7 must divide n_routed_experts=256"]),
    (("--etp", "3"), ["etp=3", "moe_intermediate_size=2048"]),
    (("--tp", "3"), ["tp=3", "num_attention_heads=128"]),
    (("--layout", ",".join(["4"] * 15 + ["0"])), ["layout=", "sums to 60", "num_hidden_layers=61"]),
    (("--layout", "4,4"), ["layout=4,4", "2 stages", "pp=16"]),
    (("--dp", "3"), ["dp*tp*cp=6", "ep*etp=8"]),
    (("--zero", "5"), ["zero", "5"]),
    (("--dp", "0"), ["dp=0", "positive integer"]),
    (("--dp", "-1"), ["dp=-1", "positive integer"]),
    (("--dp", "1.5"), ["dp", "1.5"]),
    (("--dp", "two"), ["dp", "two"]),
    (("--precision", "fp8"), ["precision='fp8'", "paper", "megatron"]),
    (("--profile", "deepspeed"), ["profile='deepspeed'", "paper", "megatron"]),
    (("--pp", "60"), ["pp=60", "num_hidden_layers=61", "stage 59 empty"]),
    (("--layout", "4,x"), ["layout", "4,x"]),
    (("--pp", "2", "--layout", "62,-1"), ["layout='62,-1'", "non-negative"]),
    (("--cp", "0"), ["cp=0", "positive integer"]),
]


@pytest.mark.parametrize("args,needles", ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_estimate_errors(args, needles):
    check_error(call("estimate", *args, "--json"), *needles)


# one rule from each place an error can come from: the partition's checks, argparse's choices and
# types, the training config, the default layout, the precision recipes
@pytest.mark.parametrize("i", [0, 6, 9, 7, 13, 11], ids=lambda i: " ".join(ERRORS[i][0]))
def test_estimate_errors_through_python_m(i):
    args, needles = ERRORS[i]
    check_error(run("estimate", *args, "--json"), *needles)


def test_unknown_preset_lists_known_presets():
    for cmd, runner in (("params", run), ("estimate", call)):
        line = check_error(runner(cmd, "--model", "deepseek-v9"), "model='deepseek-v9'")
        for name in preset_names():
            assert name in line
    assert set(preset_names()) == {"deepseek-v3", "deepseek-v2", "deepseek-v2-lite", "kimi-k2", "moonlight-16b-a3b",
                                   "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "mixtral-8x7b", "mixtral-8x22b",
                                   "qwen3-30b-a3b", "qwen3-235b-a22b"}


def test_config_file_missing_fields(tmp_path):
    data = dict(T.TINY_HF)
    del data["vocab_size"], data["kv_lora_rank"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    for cmd, runner in (("params", run), ("estimate", call)):
        check_error(runner(cmd, "--model", p), "missing", "vocab_size", "kv_lora_rank")


def test_config_file_not_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    check_error(run("params", "--model", p), "JSON", str(p))


def test_config_file_bad_value(tmp_path):
    p = T.write_tiny(tmp_path / "config.json", hidden_size=0)
    check_error(call("params", "--model", p), "hidden_size=0", "positive integer")
    p = T.write_tiny(tmp_path / "c2.json", num_experts_per_tok=9)
    check_error(call("params", "--model", p), "num_experts_per_tok=9", "n_routed_experts=4")


def test_tiny_rules_through_the_cli(tmp_path):
    p = T.write_tiny(tmp_path / "config.json")
    check_error(call("estimate", "--model", p, "--pp", "1", "--dp", "4", "--ep", "3"), "ep=3",
                "n_routed_experts=4")
    check_error(call("estimate", "--model", p, "--pp", "4", "--dp", "4"), "pp=4", "num_hidden_layers=3")


def test_missing_command_and_unknown_option():
    check_error(run(), "command")
    check_error(call("estimate", "--bogus", "1"), "--bogus")
    check_error(call("estimate", "--unit", "TB"), "--unit", "TB")


# ---------------------------------------------------------------------------------------------
# memlib.core.units
# ---------------------------------------------------------------------------------------------
def test_units_are_exact():
    assert UNITS["GiB"] == 2**30 and UNITS["GB"] == 10**9
    assert UNITS["MiB"] == 2**20 and UNITS["MB"] == 10**6
    assert to_unit(12_500_729_856, "GiB") == Fraction(12_500_729_856, 2**30)


def test_fmt_bytes_gib_vs_gb():
    n = 12_500_729_856
    assert fmt_bytes(n, "GiB") == "11.64 GiB"
    assert fmt_bytes(n, "GB") == "12.50 GB"
    assert fmt_bytes(n) == "11.64 GiB"                     # GiB by default
    assert fmt_bytes(n, "GiB", with_unit=False) == "11.64"
    assert fmt_bytes(87_505_108_992, "GiB", 1) == "81.5 GiB"
    assert fmt_bytes(1_250 * 2**30, "GiB", 0) == "1,250 GiB"
    assert fmt_bytes(0, "GB") == "0.00 GB"


def test_fmt_bytes_rounds_half_away_from_zero_exactly():
    # 1.005 GB: binary floats would give 1.00; memlib rounds the exact fraction
    assert fmt_bytes(1_005_000_000, "GB") == "1.01 GB"
    assert fmt_bytes(1_004_999_999, "GB") == "1.00 GB"
    assert fmt_bytes(1_875_000_000, "GB", 1) == "1.9 GB"   # the ZeRO paper's 1.875 -> 1.9


def test_fmt_count_and_billions():
    assert fmt_count(671_026_404_352) == "671,026,404,352"
    assert fmt_billions(671_026_404_352) == "671.03B"
    assert fmt_billions(36_625_603_584, 1) == "36.6B"


@pytest.mark.parametrize("text,n", [
    ("80GiB", 80 * 2**30), ("80 GiB", 80 * 2**30), ("80GB", 80 * 10**9), ("80 GB", 80 * 10**9),
    ("1234", 1234), ("1234B", 1234), ("1.5GiB", 3 * 2**29), ("0.5kB", 500), ("2TiB", 2 * 2**40),
    (" 141 GB ", 141 * 10**9),
])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "GiB", "abc", "80 XB", "-1GB", "0", "0.5B", "1.5", "1/0 GB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)



# ---------------------------------------------------------------------------------------------
# estimate: activations, schedules, overheads, capacity (the options added with the activations)
# ---------------------------------------------------------------------------------------------
def test_estimate_json_activations_and_overheads():
    d = run_json(*PAPER_ARGS, runner=call)
    assert "fits" not in d and "capacity" not in d
    for s in d["stages"]:
        assert "fits" not in s
        a = s["activations"]
        assert {"per_microbatch", "microbatches_in_flight", "by_entry", "chunks", "schedule_extra",
                "recompute_working_set"} <= set(a)
        assert type(a["per_microbatch"]) is int and type(a["microbatches_in_flight"]) is int
        assert sum(a["by_entry"].values()) == a["per_microbatch"]
        b = s["bytes"]
        assert {"activations", "overhead"} <= set(b)
        assert b["activations"] == sum(c["per_microbatch"] * c["in_flight"] for c in a["chunks"]) \
            + a["schedule_extra"] + a["recompute_working_set"]
        assert b["overhead"] == sum(s["overheads"].values())
        assert s["allocated"] == b["parameters"] + b["gradients"] + b["optimizer_states"] + b["activations"]
        assert b["total"] == s["allocated"] + b["overhead"]
    s1 = d["stages"][1]["activations"]
    assert (s1["per_microbatch"], s1["microbatches_in_flight"]) == (24_671_158_272, 15)
    assert [s["activations"]["microbatches_in_flight"] for s in d["stages"]] == list(range(16, 0, -1))
    assert d["config"]["overhead"] == {"cuda_context": 300 * 2**20, "comm_buffers": 858_993_460,
                                       "fragmentation": "1/20"}
    assert {k: d["config"][k] for k in ("micro_batch", "seq_len", "recompute", "schedule", "num_microbatches",
                                        "vpp", "sp")} == {
        "micro_batch": 1, "seq_len": 4096, "recompute": "none", "schedule": "1f1b", "num_microbatches": None,
        "vpp": 1, "sp": True}


def test_estimate_gpu_memory_adds_fits():
    d = run_json(*PAPER_ARGS, "--gpu-memory", "80GiB", runner=call)
    assert d["capacity"] == 80 * 2**30 and d["fits"] is False
    assert [s["fits"] for s in d["stages"]] == [False] * 15 + [True]
    assert d["peak"] == {"stage": 1, "bytes": 481_624_673_486}
    d = run_json(*PAPER_ARGS, "--gpu-memory", "80GiB", "--recompute", "full", "--zero", "1", runner=call)
    assert d["fits"] is True and all(s["fits"] for s in d["stages"])
    assert d["peak"] == {"stage": 1, "bytes": 56_893_303_195}
    d = run_json(*PAPER_ARGS, "--gpu-memory", "80GB", "--recompute", "full", "--zero", "1", runner=call)
    assert d["capacity"] == 80 * 10**9 and d["fits"] is True


def test_estimate_gpu_gives_the_driver_capacity_unless_gpu_memory_is_given():
    """--gpu H800 sizes against nvidia-smi's 81,559 MiB; an explicit --gpu-memory (decimal GB as written) wins;
    a GPU without a known capacity (GB200) adds no verdict."""
    full = ("--recompute", "full", "--zero", "1")
    d = run_json(*PAPER_ARGS, *full, "--gpu", "h800", runner=call)
    assert d["capacity"] == 81_559 * 2**20 == 85_520_809_984 and d["fits"] is True
    d = run_json(*PAPER_ARGS, *full, "--gpu", "H800", "--gpu-memory", "80GB", runner=call)
    assert d["capacity"] == 80 * 10**9
    d = run_json(*PAPER_ARGS, *full, "--gpu", "GB200", runner=call)
    assert "capacity" not in d and "fits" not in d


def test_estimate_readable_fits_and_oom():
    r = call(*PAPER_ARGS, "--gpu-memory", "80GiB")
    assert r.returncode == 0 and r.stderr == ""
    assert "in flight" in r.stdout
    assert "OOM" in r.stdout and "does NOT fit" in r.stdout and "OOM on stages 0, 1," in r.stdout
    r = call(*PAPER_ARGS, "--gpu-memory", "80GiB", "--recompute", "full", "--zero", "1")
    assert " ok" in r.stdout and "fits on every stage" in r.stdout and "OOM" not in r.stdout
    r = call(*PAPER_ARGS)
    assert "capacity" not in r.stdout and " ok" not in r.stdout and "OOM" not in r.stdout
    r = call(*PAPER_ARGS, "--schedule", "interleaved", "--vpp", "2", "--pp", "4", "--num-microbatches", "8")
    assert "(V=2)" in r.stdout and "M=8" in r.stdout


def test_estimate_new_options_reach_the_config():
    d = run_json(*PAPER_ARGS, "--micro-batch", "2", "--seq-len", "2048", "--recompute", "selective",
                 "--schedule", "gpipe", "--num-microbatches", "32", "--no-sp", runner=call)
    c = d["config"]
    assert (c["micro_batch"], c["seq_len"], c["recompute"], c["schedule"], c["num_microbatches"], c["sp"]) == (
        2, 2048, "selective", "gpipe", 32, False)
    assert all(s["activations"]["microbatches_in_flight"] == 32 for s in d["stages"])
    d = run_json(*PAPER_ARGS, "--schedule", "dualpipe", "--recompute", "full", runner=call)
    assert all(s["activations"]["microbatches_in_flight"] == 17 for s in d["stages"])
    d = run_json(*PAPER_ARGS, "--pp", "4", "--schedule", "interleaved", "--vpp", "2", runner=call)
    assert d["config"]["vpp"] == 2 and len(d["config"]["layout"]) == 8
    assert all(len(s["activations"]["chunks"]) == 2 for s in d["stages"])


@pytest.mark.parametrize("mb", ["2", "4"])
def test_estimate_micro_batch_is_linear(mb):
    d = run_json(*PAPER_ARGS, "--micro-batch", mb, runner=call)
    assert d["stages"][1]["activations"]["per_microbatch"] == int(mb) * 24_671_158_272


def test_estimate_overhead_options():
    d = run_json(*PAPER_ARGS, "--overhead", "high", runner=call)
    assert d["config"]["overhead"] == {"cuda_context": 2 * 2**30, "comm_buffers": 2 * 2**30, "fragmentation": "3/10"}
    d = run_json(*PAPER_ARGS, "--overhead", "none", runner=call)
    assert all(s["bytes"]["overhead"] == 0 and s["bytes"]["total"] == s["allocated"] for s in d["stages"])
    d = run_json(*PAPER_ARGS, "--overhead", "none", "--cuda-context", "500MiB", "--comm-buffers", "1GB",
                 "--fragmentation", "0.1", runner=call)
    assert d["config"]["overhead"] == {"cuda_context": 500 * 2**20, "comm_buffers": 10**9, "fragmentation": "1/10"}
    from math import ceil
    for s in d["stages"]:
        assert s["overheads"] == {"cuda_context": 500 * 2**20, "comm_buffers": 10**9,
                                  "fragmentation": ceil(s["allocated"] / 10)}


ACT_ERRORS = [
    (("--seq-len", "4095"), ["seq_len=4095", "cp*tp=2"]),
    (("--seq-len", "4098", "--cp", "4"), ["seq_len=4098", "cp=4"]),
    (("--micro-batch", "0"), ["micro_batch=0", "positive integer"]),
    (("--seq-len", "0"), ["seq_len=0", "positive integer"]),
    (("--gpu-memory", "80XB"), ["gpu_memory='80XB'"]),
    (("--gpu-memory", "lots"), ["gpu_memory='lots'"]),
    (("--fragmentation", "abc"), ["fragmentation='abc'", "0.1"]),
    (("--fragmentation", "1.5"), ["fragmentation=3/2", "[0, 1)"]),
    (("--fragmentation", "1/0"), ["fragmentation='1/0'"]),
    (("--cuda-context=-1GB",), ["cuda_context='-1GB'"]),
    (("--comm-buffers", "2 XB"), ["comm_buffers='2 XB'"]),
    (("--schedule", "interleaved", "--vpp", "4"), ["pp*vpp=64", "pp=16", "vpp=4", "num_hidden_layers=61",
                                                  "virtual stage 63 empty"]),
    (("--schedule", "interleaved", "--vpp", "3", "--layout", ",".join(["4"] * 15 + ["1"])),
     ["vpp=3 must divide every stage's layer count (4 does not)"]),
    (("--overhead", "medium"), ["overhead='medium'", "low", "high", "none"]),
    (("--schedule", "zb1p"), ["schedule='zb1p'", "gpipe", "1f1b", "interleaved", "dualpipe"]),
    (("--recompute", "attention"), ["recompute='attention'", "core_attn"]),
    (("--recompute", "core_attn,foo"), ["recompute='core_attn,foo'"]),
    (("--recompute", "full-block:0"), ["full-block:0", "positive integer K"]),
    (("--schedule", "gpipe"), ["schedule=gpipe", "num_microbatches"]),
    (("--schedule", "interleaved"), ["schedule=interleaved needs vpp >= 2"]),
    (("--vpp", "2"), ["vpp=2 needs schedule=interleaved"]),
    (("--pp", "4", "--schedule", "interleaved", "--vpp", "2", "--num-microbatches", "6"),
     ["num_microbatches=6", "multiple of pp=4"]),
    (("--schedule", "dualpipe", "--num-microbatches", "30"), ["num_microbatches=30", "2*pp=32"]),
    (("--schedule", "dualpipe", "--num-microbatches", "33"), ["num_microbatches=33", "even"]),
    (("--num-microbatches", "0"), ["num_microbatches=0", "positive integer"]),
    (("--vpp", "0"), ["vpp=0", "positive integer"]),
]


@pytest.mark.parametrize("args,needles", ACT_ERRORS, ids=[" ".join(a) for a, _ in ACT_ERRORS])
def test_estimate_activation_errors(args, needles):
    check_error(call(*PAPER_ARGS, *args, "--json"), *needles)


def test_estimate_activation_error_through_python_m():
    check_error(run(*PAPER_ARGS, "--recompute", "full-block:0"), "full-block:0", "positive integer K")
    check_error(run(*PAPER_ARGS, "--seq-len", "4095"), "seq_len=4095")
