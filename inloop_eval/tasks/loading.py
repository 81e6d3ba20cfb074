"""Loading a task's documents: the one path for native, harness-YAML and oe-eval tasks.

For each subset of the task (in order): its split's raw rows (`MultipleChoiceTask.rows`), each made into a
checked `Doc` (`make_doc`), then the description and few-shot examples put before every prompt
(`inloop_eval.tasks.fewshot`). `limit` keeps the first documents across subsets.
"""

from __future__ import annotations

from pathlib import Path

from inloop_eval.tasks.base import Doc, MultipleChoiceTask
from inloop_eval.tasks.fewshot import add_fewshot


def load_docs(
    task: MultipleChoiceTask, data_root: str | Path | None = None, limit: int | None = None
) -> list[Doc]:
    """Every document of the task's split (the first `limit` when given), as the task renders them."""
    docs: list[Doc] = []
    for subset in task.subsets():
        if limit is not None and len(docs) >= limit:
            break
        rows = task.rows(subset, task.split, data_root)
        n = len(rows) if limit is None else min(len(rows), limit - len(docs))
        raws = [rows[i] for i in range(n)]
        part = [task.make_doc(raw, len(docs) + i) for i, raw in enumerate(raws)]
        pool, same_split = rows, True
        if task.num_fewshot > 0 and task.fewshot_split not in (None, task.split):
            pool, same_split = task.rows(subset, str(task.fewshot_split), data_root), False
        docs.extend(add_fewshot(task, part, raws, range(n), pool, subset, same_split=same_split))
    return docs
