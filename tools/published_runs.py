"""Copy SimuMax's published B200 measurements into memlib/data/published_runs/.

Usage: ``python tools/published_runs.py /path/to/SimuMax.git`` (a clone or bare mirror holding commit
``COMMIT`` of MooreThreads/SimuMax).  It writes ``simumax_b200_steps.json``: every row of the table with the fields
that say what ran and what was measured (``real_ms``, the measured step; ``perf_ms``, SimuMax's prediction), read
by memlib.data.reference.SIMUMAX_B200_STEPS; and ``simumax_b200_llama3.json``: the Llama rows of
``docs/b200/b200_release_v1.2_summary.json`` (the table ``docs/b200/b200_release_v1.2_summary.md``
prints), each with the fields that say what ran and what was measured, as the file holds them
(``peak_memory_by_rank_mb``: ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` of
every rank divided by 2**20, as Megatron-LM's ``report_memory`` logs them), under a header naming the
source, its commit and its licence.  memlib.data.reference.SIMUMAX_B200_RUNS reads it; nothing here runs at
import time.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

COMMIT = "4dcaae513ba7679d56c116a17cd4a691ec41e252"
SOURCE = "docs/b200/b200_release_v1.2_summary.json"
DIR = Path(__file__).resolve().parents[1] / "memlib" / "data" / "published_runs"
#: file -> (the rows it keeps, the fields of each, what the header says of them)
OUTPUTS = {
    "simumax_b200_llama3.json": (
        lambda r: r["case"].startswith("llama3"),
        ("case", "model", "parallel", "layer_num", "mbc", "cp_size", "vp_size", "kind", "status",
         "memory_source_case", "real_alloc_gib", "real_reserved_gib", "peak_memory_by_rank_mb"),
        "the Llama rows, these fields only, values as the file holds them"),
    "simumax_b200_steps.json": (
        lambda r: True,
        ("case", "model", "parallel", "layer_num", "mbc", "vp_size", "kind", "status", "real_ms", "perf_ms",
         "rel_err_pct", "timing_rank", "steady_iterations"),
        "every row, these fields only, values as the file holds them"),
}


def main(repo: str) -> None:
    text = subprocess.run(["git", "--git-dir", repo, "show", f"{COMMIT}:{SOURCE}"], capture_output=True, text=True,
                          check=True).stdout
    data = json.loads(text)
    for name, (keep, fields, what) in OUTPUTS.items():
        rows = [{k: r[k] for k in fields if k in r} for r in data["rows"] if keep(r)]
        out = {"_source": f"MooreThreads/SimuMax, {SOURCE} at commit {COMMIT}",
               "_licence": "Apache License 2.0 (SimuMax, Copyright (c) 2023-2024 Moore Threads Technology Co., Ltd)",
               "_fields": what, "generated_at": data["generated_at"], "system_rel": data["system_rel"],
               "notes": data["notes"], "excluded": data["excluded"], "rows": rows}
        (DIR / name).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        print(f"{len(rows)} rows -> {DIR / name}")


if __name__ == "__main__":
    main(sys.argv[1])
