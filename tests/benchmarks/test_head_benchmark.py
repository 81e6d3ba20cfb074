"""`python -m benchmarks.head`: the head's arithmetic timed against the two-pass computation it replaced, in
one process, on tied and random logits; both give the same flags and log-probabilities bit for bit (the
benchmark fails otherwise). With `--evaluation`, a `PlanOnly` evaluation by this build and by an earlier one
exported from git (here this checkout's own commit), each in its own process: both forward the same tokens
and report the same figures. No timing is asserted: the seconds are the benchmark's output."""

from __future__ import annotations

from pathlib import Path

from helpers import REPO, run_benchmark


def test_both_ways_score_the_same_and_are_timed(tmp_path: Path) -> None:
    args = ["--vocab", "3000", "--positions", "40", "--targets", "3", "--batches", "2", "--repeats", "1"]
    report, printed = run_benchmark("head", *args, output=tmp_path / "head.json", timeout=300)
    assert [r["kind"] for r in report["kinds"]] == ["ties", "random"] and report["threads"] == 1
    for row in report["kinds"]:
        assert row["same_scores"] and row["chunks"] == 2 and row["targets_per_chunk"] == 120
        assert row["greedy_targets"] == 40  # one a position: the argmax, first of tied ids
        assert row["two_pass_s"] > 0 and row["this_build_s"] > 0 and row["ratio"] > 0
    assert printed.count("same scores") == 2


def test_each_build_evaluates_in_its_own_process_with_the_same_tokens_and_figures(
    data_root: Path, tmp_path: Path
) -> None:
    args = ["--evaluation", "--baseline", "HEAD", "--labels", "arc_easy_test_mc_5shot_fast", "--limit", "2"]
    args += ["--threads", "1", "--data-root", str(data_root)]
    report, printed = run_benchmark("head", *args, output=tmp_path / "head_eval.json", timeout=300)
    baseline, this = report["runs"]["baseline"], report["runs"]["this"]
    assert Path(this["imported_from"]) == REPO / "inloop_eval"
    exported = Path(baseline["imported_from"])
    assert exported.parent != REPO and exported.name == "inloop_eval"
    assert report["tasks"] == ["olmo:arc_easy_test_mc_5shot_fast"] and report["limit"] == 2
    assert report["same_tokens"] and baseline["tokens"] == this["tokens"] > 0
    assert report["same_figures"] and report["max_figure_diff"] <= 1e-9
    assert report["figures_compared"] == len(baseline["metrics"]) > 0
    assert baseline["metrics"]["eval/downstream/olmo:arc_easy_test_mc_5shot_fast/n_docs"] == 2
    assert baseline["seconds"] > 0 and this["seconds"] > 0 and report["ratio"] > 0
    assert "tokens equal" in printed
