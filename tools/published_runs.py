"""Copy SimuMax's published B200 memory measurements of Llama-3 into memlib/data/published_runs/.

Usage: ``python tools/published_runs.py /path/to/SimuMax.git`` (a clone or bare mirror holding commit
``COMMIT`` of MooreThreads/SimuMax).  It writes ``simumax_b200_llama3.json``: the Llama rows of
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
OUT = Path(__file__).resolve().parents[1] / "memlib" / "data" / "published_runs" / "simumax_b200_llama3.json"
FIELDS = ("case", "model", "parallel", "layer_num", "mbc", "cp_size", "vp_size", "kind", "status",
          "memory_source_case", "real_alloc_gib", "real_reserved_gib", "peak_memory_by_rank_mb")


def main(repo: str) -> None:
    text = subprocess.run(["git", "--git-dir", repo, "show", f"{COMMIT}:{SOURCE}"], capture_output=True, text=True,
                          check=True).stdout
    data = json.loads(text)
    rows = [{k: r[k] for k in FIELDS if k in r} for r in data["rows"] if r["case"].startswith("llama3")]
    out = {"_source": f"MooreThreads/SimuMax, {SOURCE} at commit {COMMIT}",
           "_licence": "Apache License 2.0 (SimuMax, Copyright (c) 2023-2024 Moore Threads Technology Co., Ltd)",
           "_fields": "the Llama rows, these fields only, values as the file holds them",
           "generated_at": data["generated_at"], "system_rel": data["system_rel"], "notes": data["notes"],
           "excluded": data["excluded"], "rows": rows}
    OUT.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"{len(rows)} rows -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
