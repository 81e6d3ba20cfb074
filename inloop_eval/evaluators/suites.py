"""Suite averages (`suite_average:`): each an average of chance-centred accuracies over named tasks
(`inloop_eval.metrics.suite`), computed after the tasks it averages from their per-document outcomes,
which every rank holds after the tasks' sync, so it needs no collective of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from inloop_eval.keys import FAILED, PREFIX, SUITE, figure_key, suite_outcomes_label
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.metrics.suite import CENTERED_ACC, SuiteAverageError, suite_average

log = logging.getLogger(__name__)


class SuiteSpec(Protocol):
    """What a suite average's config (`config.SuiteAverageConfig`) gives."""

    label: str
    tasks: list[str]
    figure: str


class SuiteAverages:
    """The config's suite averages; `last` holds each one's per-document outcomes of the latest `compute`, by
    its outcomes label (`keys.suite_outcomes_label`)."""

    def __init__(self, suites: Sequence[SuiteSpec], *, strict: bool) -> None:
        self.suites = list(suites)
        self.strict = strict
        self.last: dict[str, DocumentOutcomes] = {}

    def compute(self, task_outcomes: dict[str, DocumentOutcomes], prefix: str = PREFIX) -> dict[str, float]:
        """Each suite under `<prefix>/suite/<label>/centered_acc` (and `_stderr`) from the tasks' per-document
        outcomes (label -> outcomes); `failed = 1` for a suite one of whose tasks has no per-document values
        of its figure (the task failed), or raised when `strict`."""
        metrics: dict[str, float] = {}
        self.last = {}
        for suite in self.suites:
            try:
                average = suite_average(task_outcomes, suite.tasks, suite.figure)
            except SuiteAverageError as exc:
                if self.strict:
                    raise
                log.warning("suite_average %r not computed: %s", suite.label, exc)
                metrics[figure_key(SUITE, suite.label, FAILED, prefix)] = 1.0
                continue
            metrics[figure_key(SUITE, suite.label, CENTERED_ACC, prefix)] = average.value
            metrics[figure_key(SUITE, suite.label, f"{CENTERED_ACC}_stderr", prefix)] = average.stderr
            self.last[suite_outcomes_label(suite.label)] = average.outcomes
        return metrics
