"""`python -m benchmarks.plan`'s arithmetic on made-up outcomes: the standard error fresh samples of the
documents show, and the share of pairs of runs a reading decides the right way. (The benchmark itself trains
and evaluates six models for half an hour; its figures are its output, not asserted here.)"""

from __future__ import annotations

import sys

import numpy as np
from helpers import REPO

# The benchmark modules import each other as `benchmarks.<name>`, as `python -m benchmarks.plan` runs them.
sys.path.insert(0, str(REPO))

from benchmarks.plan_checks import resampled_stderr  # noqa: E402
from benchmarks.plan_decisions import accuracy  # noqa: E402
from inloop_eval.plan.noise import RunValues  # noqa: E402


def test_fresh_samples_scatter_by_the_finite_population_standard_error():
    rng = np.random.default_rng(0)
    values_RD = rng.normal(0.0, 1.0, (3, 50)) * np.array([[1.0], [2.0], [0.5]])
    n, d = 10, values_RD.shape[1]
    expected = np.sqrt(np.mean(values_RD.var(1, ddof=1) / n * (d - n) / d))
    observed = resampled_stderr(values_RD, n, 4000, rng)
    assert abs(observed / expected - 1) < 0.05


def test_every_document_of_the_set_leaves_nothing_to_scatter():
    values_RD = np.arange(20.0).reshape(2, 10)
    assert resampled_stderr(values_RD, 10, 5, np.random.default_rng(0)) == 0.0


def two_runs(offset: float) -> list[dict[str, dict[str, RunValues]]]:
    """Two runs of one task whose bpb_gold differs by `offset` on every document at steps 10 and 20 (run 0
    lower by `offset`), with per-document noise."""
    rng = np.random.default_rng(1)
    steps_K, ids_D = np.array([10, 20]), np.arange(30)
    base_KD = 1.0 + rng.normal(0.0, 0.1, (2, 30))
    return [
        {"t": {"bpb_gold": RunValues(steps_K, ids_D, base_KD + rng.normal(0.0, 0.01, (2, 30)))}},
        {"t": {"bpb_gold": RunValues(steps_K, ids_D, base_KD + offset + rng.normal(0.0, 0.01, (2, 30)))}},
    ]


def test_a_pair_is_decided_by_the_paired_z_of_the_documents_read():
    runs, picks = two_runs(0.05), [("t", "bpb_gold", np.arange(30))]
    assert accuracy(runs, [2.0, 3.0], picks, [10, 20]) == 1.0  # run 0: lower bpb and lower held-out bpb
    assert accuracy(runs, [3.0, 2.0], picks, [10, 20]) == 0.0


def test_no_task_read_is_a_coins_toss():
    assert accuracy(two_runs(0.05), [2.0, 3.0], [], [10, 20]) == 0.5
