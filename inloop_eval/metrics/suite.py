"""A suite average: several tasks' accuracies, each centred on its chance level, averaged over the tasks.

Per document d of task t with k_d choices, the centred value is c_d = (correct_d - 1/k_d) / (1 - 1/k_d): 0 at
chance, 1 when right, negative below chance. A task's centred accuracy is the mean of its c_d (with one number
of choices, (acc - chance) / (1 - chance)); the suite average is the plain mean over the T tasks, so a task of
100 documents weighs as much as one of 10 000. Its standard error is sqrt(sum_t se_t^2) / T (tasks scored on
independent documents), se_t the n - 1 standard error of task t's mean.

The per-document values kept for pairing (`inloop-eval compare`) are c_d * N / (T * n_t), N all documents,
n_t those of task t: their plain mean is the suite average, so pairing them compares the suite average.
Documents are keyed by (task, doc_id) (`DocumentOutcomes.doc_task`). Documents with a single choice have no
chance level to centre on and are left out.
Legend: D documents of one task, N documents of all tasks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from inloop_eval.metrics.icl import DocumentOutcomes

# The figure of a suite average, and the figure its per-document values are kept under.
CENTERED_ACC = "centered_acc"


class SuiteAverageError(ValueError):
    """A suite task without the per-document values its average needs (failed, or the figure not reported)."""


@dataclass(frozen=True)
class SuiteAverage:
    """One suite average: `value` and its `stderr`; `per_task`: each task's centred accuracy;
    `outcomes`: the per-document values (see the module docstring) under `CENTERED_ACC`."""

    value: float
    stderr: float
    per_task: dict[str, float]
    outcomes: DocumentOutcomes


def centered_values(correct_D: np.ndarray, n_choices_D: np.ndarray) -> np.ndarray:
    """[D] (correct - chance) / (1 - chance), chance = 1 / n_choices (documents of 2 or more choices)."""
    chance_D = 1.0 / np.asarray(n_choices_D, dtype=np.float64)
    return (np.asarray(correct_D, dtype=np.float64) - chance_D) / (1.0 - chance_D)


def suite_average(
    outcomes: Mapping[str, DocumentOutcomes], tasks: Sequence[str], figure: str
) -> SuiteAverage:
    """The centred average of `figure` (an accuracy-type figure, 0/1 per document) over `tasks` (labels of
    `outcomes`); SuiteAverageError naming the task when one has no per-document `figure`."""
    centred: dict[str, np.ndarray] = {}
    doc_ids: dict[str, np.ndarray] = {}
    n_choices: dict[str, np.ndarray] = {}
    for task in tasks:
        task_outcomes = outcomes.get(task)
        if task_outcomes is None or figure not in task_outcomes.values:
            why = "no outcomes (it failed)" if task_outcomes is None else f"no per-document {figure!r}"
            raise SuiteAverageError(f"suite task {task!r}: {why}")
        several_D = task_outcomes.n_choices >= 2
        centred[task] = centered_values(
            task_outcomes.values[figure][several_D], task_outcomes.n_choices[several_D]
        )
        doc_ids[task] = task_outcomes.doc_id[several_D]
        n_choices[task] = task_outcomes.n_choices[several_D]
    per_task = {task: float(c_D.mean()) if c_D.size else math.nan for task, c_D in centred.items()}
    stderr_t = [
        float(c_D.std(ddof=1) / math.sqrt(c_D.size)) if c_D.size > 1 else 0.0 for c_D in centred.values()
    ]
    n_tasks = len(tasks)
    value = float(np.mean(list(per_task.values())))
    stderr = math.sqrt(sum(s * s for s in stderr_t)) / n_tasks
    n_all = sum(c_D.size for c_D in centred.values())
    weighted = [c_D * (n_all / (n_tasks * c_D.size)) for c_D in centred.values() if c_D.size]
    pooled = DocumentOutcomes(
        doc_id=np.concatenate([doc_ids[t] for t in tasks]).astype(np.int64),
        n_choices=np.concatenate([n_choices[t] for t in tasks]).astype(np.int64),
        values={CENTERED_ACC: np.concatenate(weighted) if weighted else np.zeros(0)},
        doc_task=np.concatenate([np.full(doc_ids[t].size, t) for t in tasks]).astype(str),
    )
    return SuiteAverage(value, stderr, per_task, pooled)
