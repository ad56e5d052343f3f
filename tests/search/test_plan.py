"""memlib plan: the search, its exactness against estimate(), the DeepSeek-V3 recipe, the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from memlib.cli import main
from memlib.config import ConfigError, TrainingConfig
from memlib.device.estimate import estimate
from memlib.device.overhead import Overheads
from memlib.search.plan import FULL, PRACTICAL, SearchSpace, parse_fix, plan, search

ROOT = Path(__file__).resolve().parents[2]
GB = 10**9
DS_OPTIONS = dict(profiles=("megatron",), precisions=("deepseek-v3",), recomputes=("deepseek",),
                  schedules=("dualpipe",))
DS_SPACE = SearchSpace(**DS_OPTIONS)


def _train(cfg: dict) -> TrainingConfig:
    keys = ("dp", "tp", "pp", "ep", "etp", "cp", "sp", "zero", "precision", "profile", "micro_batch", "seq_len",
            "recompute", "schedule", "num_microbatches", "vpp")
    return TrainingConfig(**{k: cfg[k] for k in keys}, layout=tuple(cfg["layout"]))


def _is_recipe(c: dict) -> bool:
    cf = c["config"]
    return (cf["pp"], cf["tp"], cf["ep"], cf["etp"], cf["cp"], cf["zero"], cf["schedule"], cf["precision"],
            cf["recompute"], cf["micro_batch"]) == (16, 1, 64, 1, 1, 1, "dualpipe", "deepseek-v3", "deepseek", 1)


def test_the_deepseek_v3_recipe_is_found_and_ranked():
    r = plan("deepseek-v3", 2048, 80 * GB, DS_SPACE, top=None)
    assert r.fitting == len(r.configs) > 0
    ranks = [i for i, c in enumerate(r.configs, 1) if _is_recipe(c)]
    assert ranks, "PP16 DualPipe TP1 EP64 ZeRO-1 is not among the fitting configurations"
    best = r.configs[ranks[0] - 1]
    est = estimate("deepseek-v3", _train(best["config"]))
    assert best["peak"] == est.peak.total and best["peak_stage"] == est.peak.stage.index
    assert best["headroom"] == 80 * GB - best["peak"]
    print(f"DeepSeek-V3 recipe: rank {ranks[0]} of {r.fitting} fitting ({r.searched} searched)")


@pytest.mark.parametrize("gpus,cap", [(1024, 80), (512, 141)])
def test_every_listed_peak_equals_estimate(gpus, cap):
    r = plan("deepseek-v3", gpus, cap * GB, DS_SPACE, top=8)
    assert r.configs
    for c in r.configs:
        est = estimate("deepseek-v3", _train(c["config"]))
        assert (c["peak"], c["peak_stage"]) == (est.peak.total, est.peak.stage.index)
        assert c["peak"] <= cap * GB
        assert list(est.partition.layout) == c["config"]["layout"]
        assert set(c["config"]) == set(est.to_dict()["config"])


def test_a_small_full_search_is_exact_and_complete():
    """deepseek-v2-lite on 16 GPUs, every schedule and policy: the listed peaks are estimate's, the
    ranking is by step time, and the counts add up."""
    r = plan("deepseek-v2-lite", 16, 40 * GB, SearchSpace(recomputes=("none", "full"), global_batch=64), top=None,
             overhead=Overheads())
    assert r.searched >= r.fitting == len(r.configs) > 0
    steps = [c["cost"]["step_s"] for c in r.configs]
    assert steps == sorted(steps)
    for c in r.configs[:: max(1, len(r.configs) // 25)]:
        est = estimate("deepseek-v2-lite", _train(c["config"]))
        assert c["peak"] == est.peak.total
        assert set(c["cost"]) >= {"bubble", "recompute", "tp_bytes", "ep_bytes", "dp_bytes", "pp_bytes", "step_s"}


def test_fix_pins_the_knobs():
    r = plan("deepseek-v3", 2048, 80 * GB, SearchSpace(**DS_OPTIONS, fix=parse_fix(["tp=1,pp=16", "zero=1"])), top=None)
    assert r.configs and all((c["config"]["tp"], c["config"]["pp"], c["config"]["zero"]) == (1, 16, 1)
                             for c in r.configs)


@pytest.mark.parametrize("items,match", [(["tp=x"], "tp='x'"), (["foo=1"], "foo=1"), (["tp=1,tp=2"], "fixed twice")])
def test_fix_errors_name_the_field(items, match):
    with pytest.raises(ConfigError, match=match):
        parse_fix(items)


def test_cli_json_peaks_equal_memlib_estimate(capsys):
    args = ["plan", "--gpus", "2048", "--gpu-memory", "80GB", "--precision", "deepseek-v3", "--recompute", "deepseek",
            "--schedule", "dualpipe", "--top", "3", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"model", "gpus", "capacity", "searched", "fitting", "cost_model", "space", "configs"}
    assert data["capacity"] == 80 * GB and data["gpus"] == 2048
    c = data["configs"][0]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "memlib", *c["estimate_args"], "--json"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout)
    assert out["peak"] == {"stage": c["peak_stage"], "bytes": c["peak"]}


def test_every_listed_configuration_round_trips_into_estimate(capsys):
    """Each configuration ``plan`` lists carries the ``memlib estimate`` flags of its every field (the fragmentation
    written as "1/20" included): they give back its peak, its stage and its configuration."""
    args = ["plan", "--model", "deepseek-v2-lite", "--gpus", "16", "--global-batch", "64", "--gpu", "B200",
            "--schedule", "1f1b,interleaved,dualpipe", "--recompute", "none,full", "--zero", "0,1,3",
            "--overhead", "high", "--space", "full", "--top", "12", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["configs"]) == 12
    assert {c["config"]["overhead"]["fragmentation"] for c in data["configs"]} == {"3/10"}
    for c in data["configs"]:
        assert main([*c["estimate_args"], "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["peak"] == {"stage": c["peak_stage"], "bytes": c["peak"]}
        assert out["config"] == c["config"]


def test_practical_space_rules_and_their_switches():
    """The practical space: TP within a node, >= 4096 tokens per CP rank, ETP 1 for fine-grained experts, the
    megatron profile's ZeRO 0 and 1; the full space has what each rule leaves out; a fixed knob bypasses its rule."""
    kw = dict(seq_len=8192, global_batch=64, recomputes=("none",), schedules=("1f1b",), layout_rules=("default",))
    practical = search("deepseek-v2-lite", 32, SearchSpace(**kw))
    full = search("deepseek-v2-lite", 32, SearchSpace(**kw, rules=FULL))
    col = practical.column
    assert col("tp").max() <= 8 and (8192 // col("cp")).min() >= 4096
    assert set(col("etp")) == {1} and set(col("zero")) == {0, 1}
    assert full.column("tp").max() == 16 and (8192 // full.column("cp")).min() < 4096
    assert set(full.column("etp")) > {1} and set(full.column("zero")) == {0, 1, 2, 3}
    assert practical.searched < full.searched
    fixed = search("deepseek-v2-lite", 32, SearchSpace(**kw, fix={"tp": 16}, zeros=(3,)))
    assert set(fixed.column("tp")) == {16} and set(fixed.column("zero")) == {3}
    dense = search("llama-3-8b", 16, SearchSpace(**kw))       # no experts: the ETP rule has nothing to say
    assert set(dense.column("etp")) == set(dense.column("tp")) | {1} or set(dense.column("etp")) == {1}
    assert search("deepseek-v2-lite", 32, SearchSpace(**kw, rules=replace(PRACTICAL, min_cp_tokens=1024))).column("cp").max() == 8


@pytest.mark.parametrize("args,message", [
    (["--gpus", "0", "--gpu-memory", "80GB"], "gpus=0 must be a positive integer"),
    (["--gpus", "64", "--gpu-memory", "eighty"], "gpu_memory="),
    (["--gpus", "64", "--gpu-memory", "80GB", "--zero", "4"], "zero='4' must be one of 0, 1, 2, 3"),
    (["--gpus", "64", "--gpu-memory", "80GB", "--schedule", "zigzag"], "schedule='zigzag'"),
    (["--gpus", "64", "--gpu-memory", "80GB", "--precision", "fp7"], "precision='fp7'"),
    (["--gpus", "64", "--gpu-memory", "80GB", "--fix", "pp=x"], "fix='pp=x'"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memlib: error: ") and message in err


def test_cli_table(capsys):
    assert main(["plan", "--model", "deepseek-v2-lite", "--gpus", "8", "--gpu-memory", "80GB", "--global-batch", "32",
                 "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "searched" in out and "step s" in out and len(out.splitlines()) == 6


def test_the_top_rows_are_the_head_of_the_whole_ranking():
    """ranking(capacity, top) keeps only rows that can be among the first ``top`` (by step time, ties kept):
    its answer is the first ``top`` rows of the whole ranking, ties on the step time included."""
    grid = search("deepseek-v2-lite", 16, SearchSpace(seq_len=2048, global_batch=64, recomputes=("none", "full")))
    cap = int(np.percentile(grid.peak.astype(np.float64), 60))
    whole = grid.ranking(cap)
    for top in (1, 2, 5, 37, len(whole), len(whole) + 3):
        assert list(grid.ranking(cap, top)) == list(whole[:top])
    assert len(grid.ranking(cap, 0)) == 0
    with pytest.raises(ConfigError, match="top=-1 must be a non-negative integer"):
        plan("deepseek-v2-lite", 16, cap, top=-1)


def test_the_process_ends_after_its_whole_output():
    """``python -m memlib plan`` ends without the interpreter's teardown (memlib.cli.run): the JSON is still
    whole when it is larger than a pipe's buffer, so is the table printed line by line, and bad input still exits 2 with its one line."""
    # block-buffered output, as in a pipe without PYTHONUNBUFFERED: what is not flushed before the end is lost
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "memlib", "plan", "--model", "deepseek-v2-lite", "--gpus", "16",
            "--gpu-memory", "80GB", "--global-batch", "64"]
    r = subprocess.run(base + ["--top", "400", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and len(r.stdout) > 2**16
    data = json.loads(r.stdout)
    assert len(data["configs"]) == 400
    table = subprocess.run(base + ["--top", "400"], capture_output=True, text=True, env=env)    # line by line
    assert table.returncode == 0 and len(table.stdout.splitlines()) == 403 and table.stdout.endswith("\n")
    bad = subprocess.run(base + ["--zero", "5"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "zero='5'" in bad.stderr


def _on_a_terminal(args: list[str]) -> tuple[int, str]:
    """``python -m memlib ARGS`` with its stderr on a pseudo-terminal: (exit code, what reached the terminal)."""
    import pty

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    import fcntl
    import struct
    import termios

    main_fd, tty_fd = pty.openpty()
    fcntl.ioctl(tty_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))    # 24 x 100 (a new pty is 0 x 0)
    proc = subprocess.Popen([sys.executable, "-m", "memlib", *args], stdout=subprocess.DEVNULL, stderr=tty_fd,
                            env=env)
    os.close(tty_fd)
    seen = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:         # the terminal closed with the process
            break
        if not chunk:
            break
        seen += chunk
    os.close(main_fd)
    return proc.wait(), seen.decode(errors="replace")


def test_a_progress_bar_on_a_terminal_only():
    """The search shows tqdm's bar over its groups on stderr when stderr is a terminal, and none with --json."""
    args = ["plan", "--model", "deepseek-v2-lite", "--gpus", "16", "--gpu-memory", "80GB", "--global-batch", "64"]
    code, err = _on_a_terminal(args)
    assert code == 0 and "group" in err and "%" in err
    code, err = _on_a_terminal(args + ["--json"])
    assert code == 0 and "group" not in err
