"""`scripts/bench.py --olmo-core-labels`: OLMo-core 3.0.0's own `DownstreamEvaluator` and ours, on one OLMo-core
model in one process, evaluate the same documents, predict the same choices and report the same OLMo figures,
and each side's token count is what reached the model's embedding. No timing is asserted: the benchmark's
seconds are its output, not a property.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
LIMIT = 4


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(bench: ModuleType, data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    bench.main(
        [
            "--olmo-core-labels",
            "piqa,mmlu_stem_mc_5shot",
            "--limit",
            str(LIMIT),
            "--data-root",
            str(data_root),
            "--output",
            str(out),
        ]
    )
    return json.loads(out.read_text())


@pytest.mark.parametrize("label", ["piqa", "mmlu_stem_mc_5shot"])
def test_same_documents_predictions_and_figures(report: dict, label: str) -> None:
    c = report["comparisons"][label]
    assert c["documents"] == LIMIT and c["documents_only_one_side"] == 0
    assert c["same_predictions"] == LIMIT
    assert c["figures_missing_in_ours"] == []
    assert len(c["figure_diff"]) == 10  # OLMo's v1 and v2 of five figures for a len_norm task
    assert max(abs(v) for v in c["figure_diff"].values()) < 1e-5


def test_tokens_counted_at_the_embedding(report: dict) -> None:
    runs = report["runs"]
    assert {(r["label"], r["engine"]) for r in runs} == {
        (label, engine) for label in ("piqa", "mmlu_stem_mc_5shot") for engine in ("ours", "olmo_core")
    }
    for r in runs:
        assert r["tokens"] == r["tokens_at_embedding"] > 0
        assert r["n_docs"] == LIMIT
        # Every request forwarded at least once: never fewer tokens than each context once + continuations.
        assert r["tokens"] >= r["minimum"]
    by = {(r["label"], r["engine"]): r for r in runs}
    for label in ("piqa", "mmlu_stem_mc_5shot"):
        assert by[(label, "ours")]["minimum"] == by[(label, "olmo_core")]["minimum"]
        # OLMo-core pads every row to a multiple of 128 and forwards one row per request.
        assert by[(label, "olmo_core")]["tokens"] % 128 == 0
