"""`python -m benchmarks.watch_memory`: a whole `watch --once` of two OLMo-core checkpoints per layout, each rank's
peak above an import-only process's (its start-up and torchmetrics; also above the start-up alone). Here a tiny model, one process and two FSDP ranks: both steps evaluated in
each (the benchmark refuses otherwise) and a ratio per rank. No memory figure is asserted: the megabytes are
the benchmark's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def test_each_layout_runs_the_whole_watch_and_its_ranks_are_compared(data_root: Path, tmp_path: Path) -> None:
    args = ["--d-model", "64", "--layers", "1", "--limit", "2", "--layouts", "whole,fsdp"]
    args += ["--data-root", str(data_root), "--dir", str(tmp_path)]
    cmd = [sys.executable, "-m", "benchmarks.watch_memory", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    layouts = {line["layout"]: line["ranks"] for line in lines if "layout" in line}
    assert [len(layouts["whole"]), len(layouts["fsdp"])] == [1, 2]
    for rank in (rank for ranks in layouts.values() for rank in ranks):
        assert rank["watch_mib"] > rank["imports_mib"] >= rank["startup_mib"] > 0
        assert rank["imported_datasets"] is False  # the tasks' rows are read with pyarrow alone
    assert (
        len(lines[-1]["ratio_per_rank"]["fsdp"])
        == len(lines[-1]["ratio_per_rank_above_startup"]["fsdp"])
        == 2
    )
