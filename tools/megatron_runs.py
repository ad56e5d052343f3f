"""Copy the memory metrics of Megatron-LM's functional tests into memlib/data/megatron_runs/.

Usage: ``python tools/megatron_runs.py /path/to/Megatron-LM.git`` (a clone or bare mirror holding
commit ``COMMIT``).  For every case of ``CASES`` it writes

``<case>.yaml``
    the test's ``model_config.yaml``, verbatim, under a header naming the source and its licence;
``<case>.json``
    per golden-values file: the ``mem-allocated-bytes`` and ``mem-max-allocated-bytes`` entries as
    the file holds them (for runs longer than ``KEEP`` logged iterations, the first ``KEEP`` only,
    with the whole run summarised under ``full_run``), and the commit that last changed those values.

memlib.data.reference.MEGATRON_RUNS reads these files; nothing here runs at import time.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from memlib.data.reference import MEGATRON_LM_COMMIT as COMMIT

ROOT = "tests/functional_tests/test_cases"
KEEP = 60
OUT = Path(__file__).resolve().parents[1] / "memlib" / "data" / "megatron_runs"
METRICS = ("mem-allocated-bytes", "mem-max-allocated-bytes")

#: test-case folder -> test cases (the issue's list first, then the other MLA cases with memory metrics)
CASES = {
    "moe": ["gpt3_mcore_te_tp2_pp2_ep4_etp1_memory_speed", "gpt3_mcore_te_tp2_pp2_ep4_etp1_mtp_resume_torch_dist_fp8",
            "gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental",
            "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading", "gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4",
            "gpt3_mcore_te_tp2_pp2_ep4_etp1_resume_torch_dist_attn_cudagraph",
            "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading",
            "deepseek_proxy_fsdp_ep2_fsdp2", "deepseek_proxy_fsdp_ep2_fsdp2_1node",
            "deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap"],
    "gpt": ["gpt3_mcore_te_tp2_pp2_mla", "gpt3_mcore_te_tp2_pp2_mla_1node"],
    "mixtral": ["deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release", "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release",
                "deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm",
                "deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release_sm"],
}

HEADER = """# Copied verbatim from NVIDIA/Megatron-LM, {path}
# at commit {commit} (github.com/NVIDIA/Megatron-LM).
# Megatron-LM is licensed under the BSD 3-Clause License (see its LICENSE file); this copy is
# reference data for memlib.data.reference.MEGATRON_RUNS and is not used to run anything.
"""


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def values_since(repo: str, path: str, metrics: dict) -> str:
    """The oldest commit, walking back from COMMIT, whose file still holds the same memory values."""
    since = COMMIT
    for line in git(repo, "log", "--format=%H %cs", COMMIT, "--", path).splitlines():
        sha, day = line.split()
        try:
            old = json.loads(git(repo, "show", f"{sha}:{path}"))
        except (subprocess.CalledProcessError, json.JSONDecodeError):
            break
        if {m: old.get(m) for m in METRICS} != metrics:
            break
        since = f"{sha} ({day})"
    return since


def full_run(metrics: dict) -> dict:
    """Summary of a long run: the post-step allocation's range and the running maximum per job (the
    maximum restarts when a job resumes from a checkpoint)."""
    def ints(m: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in metrics[m]["values"].items() if isinstance(v, (int, float))}

    alloc, peak = ints("mem-allocated-bytes"), ints("mem-max-allocated-bytes")
    jobs, prev = [], None
    for it in sorted(peak):
        if prev is None or peak[it] < peak[prev]:
            jobs.append({"first_iteration": it, "max_allocated": peak[it], "at": it})
        elif peak[it] > jobs[-1]["max_allocated"]:
            jobs[-1].update(max_allocated=peak[it], at=it)
        prev = it
    return {"iterations": [min(alloc), max(alloc)], "logged": len(alloc),
            "allocated_min": min(alloc.values()), "allocated_max": max(alloc.values()), "jobs": jobs}


def main(repo: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for folder, cases in CASES.items():
        for case in cases:
            base = f"{ROOT}/{folder}/{case}"
            files = [f for f in git(repo, "ls-tree", "--name-only", COMMIT, base + "/").split() if "golden_values" in f]
            yaml = git(repo, "show", f"{COMMIT}:{base}/model_config.yaml")
            (OUT / f"{case}.yaml").write_text(HEADER.format(path=f"{base}/model_config.yaml", commit=COMMIT) + yaml)
            out = {"_source": f"NVIDIA/Megatron-LM {base}/ at commit {COMMIT} (BSD 3-Clause License): the memory "
                              f"metrics of each golden-values file, as the file holds them", "folder": folder, "files": {}}
            for f in sorted(files):
                data = json.loads(git(repo, "show", f"{COMMIT}:{f}"))
                metrics = {m: data[m] for m in METRICS}
                entry = {"values_since": values_since(repo, f, metrics)}
                n = len(metrics[METRICS[0]]["values"])
                if n > KEEP:
                    entry["full_run"] = full_run(metrics)
                    for m in METRICS:
                        keep = dict(list(metrics[m]["values"].items())[:KEEP])
                        metrics[m] = {**{k: v for k, v in metrics[m].items() if k != "values"}, "values": keep}
                entry.update(metrics)
                out["files"][Path(f).name] = entry
            (OUT / f"{case}.json").write_text(json.dumps(out, indent=1) + "\n")
            print(case, len(files))


if __name__ == "__main__":
    main(sys.argv[1])
