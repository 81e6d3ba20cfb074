"""`python -m benchmarks.prefix_sharing`: today's rows and shared prefixes planned and timed in one process,
on documents spread over each split; both ways predict the same, the kept prefixes forward fewer tokens,
never fewer than the trie minimum. No timing is asserted: the seconds are the benchmark's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO

LABELS = "olmo:arc_easy_test_mc_5shot_fast,olmo:mmlu_humanities_test_mc_5shot_fast"


def test_spread_documents_planned_and_timed_both_ways(data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "prefix_sharing.json"
    args = ["--task-set", "", "--labels", LABELS, "--limit", "8", "--wall-limit", "6", "--spread"]
    args += ["--repeats", "2", "--width", "32", "--layers", "1", "--threads", "1", "--json", str(out)]
    env = {**os.environ, "INLOOP_EVAL_DATA": str(data_root)}
    cmd = [sys.executable, "-m", "benchmarks.prefix_sharing", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    assert report["spread"] is True
    for row in report["labels"]:
        assert row["today"] >= row["shared"] >= row["trie_minimum"] > 0
    wall = report["wall"]
    assert wall["documents"] == 12 and wall["same_predictions"] == 12 and wall["max_abs_score_diff"] < 1e-4
    for way in ("today", "shared"):
        assert len(wall[way]["runs_s"]) == 2 and wall[way]["wall_s"] == min(wall[way]["runs_s"])
    assert wall["today"]["tokens"] > wall["shared"]["tokens"]
