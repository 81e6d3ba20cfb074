"""ICLMetric on one process and on two and three gloo processes against the NumPy reference
(tests/support/metric_tester.py): ranks holding different numbers of rows, a rank with no rows that updates
with empty tensors and one that never updates (torchmetrics would send its empty list state as float32
beside the others' int64 rows). And the tester's own failure modes: it catches a metric that does not sync,
and raises when its processes cannot start."""

from __future__ import annotations

import functools

import pytest
from metric_tester import MetricTesterError, check_metric, random_case

from inloop_eval.metrics.formats import MC_METRICS, PARTIAL_METRICS
from inloop_eval.metrics.icl_metric import ICLMetric
from inloop_eval.metrics.registry import ALL_METRICS

CASES = [
    random_case("all_metrics", 1, ALL_METRICS),
    random_case("letter_keys", 2, MC_METRICS, n_docs=25),
    random_case("partial", 3, PARTIAL_METRICS, n_docs=12),
    random_case("one_rank_without_rows", 4, ALL_METRICS, n_docs=9, empty_last_rank=True),
    random_case("a_rank_that_never_updates", 6, ALL_METRICS, n_docs=9, empty_last_rank=True, update_when_empty=False),
    random_case("a_single_document", 5, ("acc", "brier"), n_docs=1),
]


def test_icl_metric_matches_the_reference_on_one_two_and_three_processes():
    check_metric(CASES, world_sizes=(1, 2, 3))


def test_tester_catches_a_metric_that_does_not_sync():
    unsynced = functools.partial(ICLMetric, sync_on_compute=False)
    check_metric(CASES[:1], world_sizes=(1,), factory=unsynced)  # alone, syncing changes nothing
    with pytest.raises(AssertionError, match="world size 2 rank"):
        check_metric(CASES[:1], world_sizes=(2,), factory=unsynced)


def test_tester_fails_loudly_when_its_processes_cannot_start():
    with pytest.raises(MetricTesterError, match="failed to run"):
        check_metric(CASES[:1], world_sizes=(2,), backend="no-such-backend")
