"""The output head and the input embedding of the watcher's `--fsdp` layout of an OLMo-core model, split by rows
(the vocabulary) over two data-parallel ranks that each pass their own inputs: every rank's targets scored as
by a float64 log-softmax over the whole weight (within 1e-5; greedy flags equal), a rank with nothing to score
joining its peer's collectives, and every rank's token ids embedded exactly as by the whole weight. The worker is
tests/support/workers/vocabulary_rows_checks.py."""

from __future__ import annotations

import math

import pytest
from workers.launch import REPO, launch, read_ranks

CHECKS = ["head", "head_with_an_empty_rank", "embedding"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("vocabulary_rows")
    worker = REPO / "tests" / "support" / "workers" / "vocabulary_rows_checks.py"
    launch(2, [str(worker), "--data-root", str(out), "--out", str(out), "--checks", ",".join(CHECKS)], timeout=180)
    return read_ranks(out, 2)


@pytest.mark.parametrize("check", ["head", "head_with_an_empty_rank"])
def test_each_ranks_targets_are_scored_over_the_whole_vocabulary(ranks, check) -> None:
    for rank, result in enumerate(ranks):
        scored = result[check]
        assert len(scored["logp"]) == len(scored["reference_logp"])
        for found, expected in zip(scored["logp"], scored["reference_logp"], strict=True):
            assert math.isclose(found, expected, rel_tol=1e-5, abs_tol=1e-5), (rank, found, expected)
        assert scored["greedy"] == scored["reference_greedy"], rank
    assert len(ranks[0]["head"]["logp"]) != len(ranks[1]["head"]["logp"])  # each rank its own inputs
    assert ranks[0]["head_with_an_empty_rank"]["logp"] and not ranks[1]["head_with_an_empty_rank"]["logp"]


def test_each_ranks_token_ids_are_embedded_as_by_the_whole_weight(ranks) -> None:
    for result in ranks:
        assert result["embedding"]["embedded"] == result["embedding"]["reference"]
    assert len(ranks[0]["embedding"]["embedded"]) != len(ranks[1]["embedding"]["embedded"])
