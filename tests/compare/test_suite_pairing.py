"""A suite average's per-document outcomes on disk and in `compare`: keyed by (task, doc_id), paired like any
figure, its paired mean the logged average."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from inloop_eval.compare.pairing import compare_steps, load_side
from inloop_eval.keys import suite_outcomes_label
from inloop_eval.loggers.outcomes import OUTCOMES_DIR, OutcomesError, read_step, write_step
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.metrics.suite import CENTERED_ACC, suite_average

LABEL = suite_outcomes_label("core")


def step_outcomes(seed: int, limit: int = 200) -> dict[str, DocumentOutcomes]:
    """Two tasks whose documents share ids 0..limit-1, and their suite average."""
    rng = np.random.default_rng(seed)
    tasks = {}
    for label, k in (("piqa", 2), ("hellaswag", 4)):
        tasks[label] = DocumentOutcomes(
            doc_id=np.arange(limit, dtype=np.int64),
            n_choices=np.full(limit, k, dtype=np.int64),
            values={"acc": (rng.random(limit) < 0.5 + seed * 0.05).astype(np.float64)},
            binary=frozenset({"acc"}),
        )
    average = suite_average(tasks, list(tasks), "acc")
    return {**tasks, LABEL: average.outcomes}, average.value


def test_suite_outcomes_read_back_with_their_tasks(tmp_path):
    outcomes, _ = step_outcomes(0)
    read = read_step(write_step(tmp_path, outcomes, 10)).tasks[LABEL]
    assert list(read.doc_task) == list(outcomes[LABEL].doc_task)
    np.testing.assert_array_equal(read.values[CENTERED_ACC], outcomes[LABEL].values[CENTERED_ACC])
    assert read_step(write_step(tmp_path, outcomes, 10)).tasks["piqa"].doc_task is None


def test_compare_pairs_the_suite_average(tmp_path):
    a, value_a = step_outcomes(0)
    b, value_b = step_outcomes(1)
    write_step(tmp_path / OUTCOMES_DIR, a, 100)
    write_step(tmp_path / OUTCOMES_DIR, b, 200)
    comparison = compare_steps(load_side(f"{tmp_path}@100"), load_side(f"{tmp_path}@200"))
    suite = comparison.tasks[LABEL]
    # Both tasks hold ids 0..199: keyed by (task, doc_id) all 400 documents pair, none collide.
    assert (suite.n_both, suite.n_only_a, suite.n_only_b) == (400, 0, 0)
    result = suite.figures[CENTERED_ACC]
    assert result.test == "paired t"
    assert result.a == pytest.approx(value_a, abs=1e-12) and result.b == pytest.approx(value_b, abs=1e-12)
    d = b[LABEL].values[CENTERED_ACC] - a[LABEL].values[CENTERED_ACC]
    assert result.diff == pytest.approx(value_b - value_a, abs=1e-12)
    assert result.stderr == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)), abs=1e-12)


def test_a_suite_over_fewer_documents_is_compared_on_the_shared_ones(tmp_path):
    a, _ = step_outcomes(0)
    b, _ = step_outcomes(0, limit=150)
    suite = compare_steps(_step(tmp_path / "a", a), _step(tmp_path / "b", b)).tasks[LABEL]
    assert (suite.n_both, suite.n_only_a, suite.n_only_b) == (300, 100, 0)
    assert "compared on the 300 documents both evaluated" in suite.note()


def _step(directory, outcomes):
    return read_step(write_step(directory, outcomes, 0))


def suite_step(copa_limit: int) -> dict[str, DocumentOutcomes]:
    """piqa (20 documents) and copa (`copa_limit` of the same 40 documents, every outcome the same whatever
    the limit), and their suite average; copa's documents past 20 are all wrong."""
    rng = np.random.default_rng(7)
    correct = {"piqa": rng.random(20) < 0.6, "copa": np.r_[rng.random(20) < 0.7, np.zeros(20, dtype=bool)]}
    limits = {"piqa": 20, "copa": copa_limit}
    tasks = {
        label: DocumentOutcomes(
            doc_id=np.arange(limits[label], dtype=np.int64),
            n_choices=np.full(limits[label], 2, dtype=np.int64),
            values={"acc": correct[label][: limits[label]].astype(np.float64)},
            binary=frozenset({"acc"}),
        )
        for label in ("piqa", "copa")
    }
    return {**tasks, LABEL: suite_average(tasks, list(tasks), "acc").outcomes}


def test_a_suite_over_a_changed_limit_is_paired_with_weights_both_runs_agree_on(tmp_path):
    """copa's limit 40 in A and 20 in B: no document moved, so the suite differs by exactly nothing, and each
    side is the macro average over the 40 documents both evaluated (A's stored weights were N / (T n_t) with
    N = 60, n_copa = 40)."""
    a, b = suite_step(copa_limit=40), suite_step(copa_limit=20)
    comparison = compare_steps(_step(tmp_path / "a", a), _step(tmp_path / "b", b))
    for label in ("piqa", "copa"):
        assert comparison.tasks[label].figures["acc"].diff == 0.0
    suite = comparison.tasks[LABEL]
    assert (suite.n_both, suite.n_only_a, suite.n_only_b) == (40, 20, 0)
    result = suite.figures[CENTERED_ACC]
    shared = suite_average(
        {label: b[label] for label in ("piqa", "copa")}, ["piqa", "copa"], "acc"
    ).value  # B holds exactly the shared documents
    assert result.a == pytest.approx(shared, abs=1e-15) and result.b == pytest.approx(shared, abs=1e-15)
    assert result.diff == pytest.approx(0.0, abs=1e-15) and result.p_value == 1.0


def test_a_suite_whose_stored_weights_do_not_follow_from_its_documents_is_refused(tmp_path):
    a = suite_step(copa_limit=40)
    a[LABEL] = dataclasses.replace(a[LABEL], values={CENTERED_ACC: a[LABEL].values[CENTERED_ACC] * 0.9})
    with pytest.raises(OutcomesError, match=r"suite/core: centered_acc of document 'piqa' id 0 is .* not a centred"):
        compare_steps(_step(tmp_path / "a", a), _step(tmp_path / "b", suite_step(copa_limit=20)))
