"""`python -m benchmarks.eval_memory`: an earlier build, exported from git, measured in a fresh process against
this checkout's. Here the earlier build is this one's own commit: each process imports the build it was
given, both measure a peak (0 or more), and their figures are the same. No memory figure is asserted beyond that: the
megabytes are the benchmark's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def test_each_build_is_measured_in_its_own_process(data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval_memory.json"
    args = ["--baseline", "HEAD", "--labels", "arc_easy_rc_5shot", "--limit", "3", "--backends", "torch"]
    args += ["--threads", "1", "--data-root", str(data_root), "--output", str(out)]
    cmd = [sys.executable, "-m", "benchmarks.eval_memory", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    earlier, this = report["runs"]
    assert (earlier["build"], this["build"]) == ("earlier", "this")
    assert Path(this["imported_from"]) == REPO / "inloop_eval"
    assert Path(earlier["imported_from"]).parent != REPO and Path(earlier["imported_from"]).name == "inloop_eval"
    # A run this small may take no page beyond what its first evaluation left resident: a peak of 0 is a
    # measurement, not a failure to measure (a negative one would be).
    assert earlier["peak_mib"] >= 0 and this["peak_mib"] >= 0
    assert earlier["tokens"] == this["tokens"] > 0
    comparison = report["comparison"]["torch"]
    assert comparison["figures_compared"] > 0 and comparison["max_figure_diff"] == 0.0
