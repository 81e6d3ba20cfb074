"""`python -m benchmarks.engines`: on the same model and documents, the naive OLMo-style loop and
ai2-olmo-eval's pipeline forward our very requests and predict what ours predicts, and every engine's tokens
are what reached the model's embedding, never fewer than the minimum. No timing is asserted: the
benchmark's seconds are its output, not a property.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_benchmark

LIMIT = 4
ENGINES = ("ours", "naive", "olmo_eval")


@pytest.fixture(scope="module")
def report(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "engines.json"
    args = ("--models", "neox", "--tasks", "piqa", "--engines", ",".join(ENGINES), "--limit", str(LIMIT))
    report, printed = run_benchmark("engines", *args, "--data-root", str(data_root), output=out)
    assert "all runs" in printed
    return report


def test_baselines_predict_what_ours_predicts(report: dict) -> None:
    (c,) = report["comparisons"]
    assert (c["model"], c["task"]) == ("neox", "piqa")
    for engine in ENGINES[1:]:
        assert c[engine]["documents"] == LIMIT
        assert c[engine]["same_predictions"] == LIMIT
        assert c[engine]["max_abs_score_diff"] < 1e-3


def test_every_engine_forwards_at_least_the_minimum(report: dict) -> None:
    runs = {r["engine"]: r for r in report["runs"]}
    assert set(runs) == set(ENGINES)
    for r in runs.values():
        assert r["n_docs"] == LIMIT and r["tokens"] >= r["minimum"] > 0
    assert runs["ours"]["minimum"] == runs["naive"]["minimum"] == runs["olmo_eval"]["minimum"]
    assert runs["naive"]["tokens"] % 128 == 0  # one row per request, padded to a multiple of 128
    assert "requests whose tokens differ from ours: 0" in runs["olmo_eval"]["note"]
