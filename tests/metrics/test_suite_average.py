"""The suite average: each task centred on chance, averaged over tasks, against a plain NumPy recomputation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.metrics.suite import CENTERED_ACC, SuiteAverageError, suite_average


def task_outcomes(
    rng: np.random.Generator, n: int, choices: list[int], first_id: int = 0
) -> DocumentOutcomes:
    n_choices = rng.choice(choices, size=n).astype(np.int64)
    correct = (rng.random(n) < 0.6).astype(np.float64)
    return DocumentOutcomes(
        doc_id=np.arange(first_id, first_id + n, dtype=np.int64),
        n_choices=n_choices,
        values={"acc": correct, "acc_norm": 1.0 - correct},
        binary=frozenset({"acc", "acc_norm"}),
    )


@pytest.fixture
def outcomes() -> dict[str, DocumentOutcomes]:
    rng = np.random.default_rng(0)
    return {
        "piqa": task_outcomes(rng, 40, [2]),
        "hellaswag": task_outcomes(rng, 300, [4]),
        "mixed": task_outcomes(rng, 77, [2, 3, 5]),
    }


def numpy_reference(
    outcomes: dict[str, DocumentOutcomes], tasks: list[str], figure: str
) -> tuple[float, float]:
    means, variances = [], []
    for task in tasks:
        o = outcomes[task]
        chance = 1.0 / o.n_choices
        centred = (o.values[figure] - chance) / (1.0 - chance)
        means.append(centred.mean())
        variances.append(centred.var(ddof=1) / len(centred))
    return float(np.mean(means)), float(np.sqrt(np.sum(variances)) / len(tasks))


@pytest.mark.parametrize("figure", ["acc", "acc_norm"])
def test_average_equals_a_numpy_recomputation(outcomes, figure):
    tasks = ["piqa", "hellaswag", "mixed"]
    average = suite_average(outcomes, tasks, figure)
    value, stderr = numpy_reference(outcomes, tasks, figure)
    assert average.value == pytest.approx(value, abs=1e-12)
    assert average.stderr == pytest.approx(stderr, abs=1e-12)
    o = outcomes["piqa"]
    assert average.per_task["piqa"] == pytest.approx(2 * o.values[figure].mean() - 1, abs=1e-12)


def test_the_mean_of_the_per_document_values_is_the_average(outcomes):
    average = suite_average(outcomes, ["piqa", "hellaswag", "mixed"], "acc")
    pooled = average.outcomes
    assert pooled.values[CENTERED_ACC].mean() == pytest.approx(average.value, abs=1e-12)
    assert len(pooled.doc_id) == 40 + 300 + 77
    assert list(pooled.doc_task[:40]) == ["piqa"] * 40
    # Documents of different tasks share ids; (task, doc_id) tells them apart.
    assert len(set(zip(pooled.doc_task, pooled.doc_id, strict=True))) == len(pooled.doc_id)


def test_a_task_at_chance_centres_on_zero_and_a_perfect_one_on_one():
    perfect = DocumentOutcomes(np.arange(4), np.array([2, 3, 4, 5]), {"acc": np.ones(4)})
    half = DocumentOutcomes(np.arange(4), np.full(4, 2), {"acc": np.array([1.0, 0.0, 1.0, 0.0])})
    average = suite_average({"perfect": perfect, "half": half}, ["perfect", "half"], "acc")
    assert average.per_task == {"perfect": 1.0, "half": 0.0}
    assert average.value == 0.5


def test_single_choice_documents_are_left_out():
    o = DocumentOutcomes(np.arange(3), np.array([1, 2, 2]), {"acc": np.array([1.0, 1.0, 0.0])})
    average = suite_average({"t": o}, ["t"], "acc")
    assert average.value == 0.0 and list(average.outcomes.doc_id) == [1, 2]
    assert math.isfinite(average.stderr)


@pytest.mark.parametrize(
    ("tasks", "figure", "message"),
    [(["gone"], "acc", "'gone': no outcomes"), (["piqa"], "acc_pmi", "no per-document 'acc_pmi'")],
)
def test_a_task_without_the_figure_is_named(outcomes, tasks, figure, message):
    with pytest.raises(SuiteAverageError, match=message):
        suite_average(outcomes, tasks, figure)
