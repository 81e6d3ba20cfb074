"""`python -m benchmarks.olmo_core`: OLMo-core 3.0.0's own `DownstreamEvaluator` and ours, on one OLMo-core
model in one process (on flash-attention 2, as OLMo 3 trains: built as on a GPU, OLMo-core's evaluator through a
stand-in kernel, ours through the engine's attention), evaluate the same documents, predict the same choices and report the same OLMo figures,
and each side's token count is what reached the model's embedding. No timing is asserted: the benchmark's
seconds are its output, not a property.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_benchmark

LABELS = ("piqa", "mmlu_stem_mc_5shot")
LIMIT = 4


@pytest.fixture(scope="module")
def report(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "olmo_core.json"
    args = ("--labels", ",".join(LABELS), "--limit", str(LIMIT), "--data-root", str(data_root), "--attn-backend", "flash_2")
    report, printed = run_benchmark("olmo_core", *args, output=out)
    assert "all labels" in printed
    return report


@pytest.mark.parametrize("label", LABELS)
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
        (label, engine) for label in LABELS for engine in ("ours", "olmo_core")
    }
    for r in runs:
        assert r["tokens"] == r["tokens_at_embedding"] > 0
        assert r["n_docs"] == LIMIT
        # Every request forwarded at least once: never fewer tokens than every distinct prefix of the
        # requests' own rows once; OLMo-core, which shares nothing, never fewer than each context once.
        assert r["tokens"] >= r["trie_minimum"]
        if r["engine"] == "olmo_core":
            assert r["tokens"] >= r["minimum"]
    by = {(r["label"], r["engine"]): r for r in runs}
    for label in LABELS:
        assert by[(label, "ours")]["minimum"] == by[(label, "olmo_core")]["minimum"]
        assert by[(label, "ours")]["trie_minimum"] == by[(label, "olmo_core")]["trie_minimum"]
        # OLMo-core pads every row to a multiple of 128 and forwards one row per request.
        assert by[(label, "olmo_core")]["tokens"] % 128 == 0
        # What a model taking packed rows would be sent also holds every request.
        assert by[(label, "ours")]["tokens_if_packed"] >= by[(label, "ours")]["trie_minimum"]
