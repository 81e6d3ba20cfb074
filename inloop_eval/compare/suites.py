"""A suite average paired across two runs with weights both sides agree on.

A run stores each suite document's value as c_d * N / (T * n_t) (`metrics.suite`): c_d its centred
accuracy, N, T and n_t that run's documents, tasks and documents of task t, so that the plain mean is the
suite's macro average. Two runs that evaluated different documents (a changed `limit`) weigh the same
document differently, and pairing their stored values would report a difference where no document moved.
So each side's c_d are recovered from its own counts, and both sides are weighted again from the documents
they share: N_S / (T_S * n_t,S). The paired mean of each side is then its macro average over the shared
documents, and the difference is zero when none of them moved.

A recovered c_d must be a centred 0/1 value, 1 or -1 / (k_d - 1); a file whose values are not (a task of
the suite left without documents changes T) cannot be re-weighted and is refused.
Legend: D documents of one side, N paired documents.
"""

from __future__ import annotations

import numpy as np

from inloop_eval.keys import suite_outcomes_label
from inloop_eval.loggers.outcomes import OutcomesError
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.metrics.suite import CENTERED_ACC

# How far a recovered centred value may sit from 1 or -1 / (k - 1): float rounding of the weights only.
CENTRED_TOLERANCE = 1e-9


def is_suite_figure(label: str, figure: str, outcomes: DocumentOutcomes) -> bool:
    """Whether `figure` of `label` holds a suite average's weighted per-document values."""
    suite = label.startswith(suite_outcomes_label(""))
    return suite and figure == CENTERED_ACC and outcomes.doc_task is not None


def task_counts(task_D: np.ndarray) -> tuple[np.ndarray, int]:
    """([D] the number of documents of each document's task, the number of tasks)."""
    tasks, inverse, counts = np.unique(task_D, return_inverse=True, return_counts=True)
    return counts[inverse].astype(np.float64), len(tasks)


def centred_values(outcomes: DocumentOutcomes, where: str) -> np.ndarray:
    """[D] each document's centred accuracy c_d, from its stored c_d * N / (T * n_t); OutcomesError naming
    `where` when a value is not a centred 0/1 value."""
    n_t_D, n_tasks = task_counts(outcomes.doc_task)
    c_D = outcomes.values[CENTERED_ACC] * (n_tasks * n_t_D / len(n_t_D))
    expected_D = np.where(c_D > 0, 1.0, -1.0 / np.maximum(outcomes.n_choices - 1, 1))
    off = np.flatnonzero(~(np.abs(c_D - expected_D) <= CENTRED_TOLERANCE))
    if len(off):
        d = off[0]
        raise OutcomesError(
            f"{where}: {CENTERED_ACC} of document {str(outcomes.doc_task[d])!r} id {outcomes.doc_id[d]} is "
            f"{float(c_D[d]):.6g} once its weight N / (T n_t) is taken out, not a centred 0/1 value (1 or "
            f"{float(expected_D[d]):.6g}); the suite's weights cannot be agreed with the other run (a task of "
            "the suite without documents?), so it is not compared"
        )
    return c_D


def agreed_suite_values(
    a: DocumentOutcomes, index_a: np.ndarray, b: DocumentOutcomes, index_b: np.ndarray, where: tuple[str, str]
) -> tuple[np.ndarray, np.ndarray]:
    """([N] A's, [N] B's) suite values on the paired documents (`index_a`, `index_b`), both weighted
    N_S / (T_S n_t,S) from the paired documents; `where` names each side for errors."""
    c_a_N = centred_values(a, where[0])[index_a]
    c_b_N = centred_values(b, where[1])[index_b]
    if not len(c_a_N):
        return c_a_N, c_b_N
    n_t_N, n_tasks = task_counts(a.doc_task[index_a])
    weight_N = len(n_t_N) / (n_tasks * n_t_N)
    return c_a_N * weight_N, c_b_N * weight_N
