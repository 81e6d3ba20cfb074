"""The dataset splits the built-in tasks read: what `inloop-eval data fetch` puts in a data root (the data
layer takes them as an argument, since it sits below the tasks)."""

from __future__ import annotations

from inloop_eval.tasks.native.mmlu import DATASET_PATH as MMLU_DATASET
from inloop_eval.tasks.native.mmlu import SUBJECTS as MMLU_SUBJECTS
from inloop_eval.tasks.registry import data_splits


def standard_splits() -> list[tuple[str, str | None, str]]:
    """(dataset path, dataset name, split) of every split the registered tasks read (`data_splits`), then
    MMLU's test splits, which OLMo's MMLU labels (`olmo:mmlu_*`, resolved rather than registered) read;
    without repeats."""
    mmlu_test = [(MMLU_DATASET, subject, "test") for subject in MMLU_SUBJECTS]
    return list(dict.fromkeys([*data_splits(), *mmlu_test]))
