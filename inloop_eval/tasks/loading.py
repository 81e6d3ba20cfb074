"""Loading a task's documents: the one path for native, harness-YAML and oe-eval tasks.

For each subset of the task (in order): its split's raw rows (`MultipleChoiceTask.rows`), each made into a
checked `Doc` (`make_doc`), then the description and few-shot examples put before every prompt
(`inloop_eval.tasks.fewshot`). `limit` keeps the first documents across subsets, or with `spread` that many
documents evenly spaced over the whole split (every subset represented in proportion). A document's index
is its position in the whole split either way, and its few-shot examples are those of a full evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inloop_eval.tasks.base import Doc, MultipleChoiceTask
from inloop_eval.tasks.fewshot import add_fewshot


def spread_positions(n_docs: int, limit: int) -> np.ndarray:
    """`min(limit, n_docs)` distinct positions in [0, n_docs) evenly spaced, the first and the last included."""
    if limit >= n_docs:
        return np.arange(n_docs)
    if limit == 1:
        return np.zeros(1, dtype=np.int64)
    return (np.arange(limit) * (n_docs - 1) // (limit - 1)).astype(np.int64)  # steps >= 1: distinct


def load_docs(
    task: MultipleChoiceTask,
    data_root: str | Path | None = None,
    limit: int | None = None,
    *,
    spread: bool = False,
) -> list[Doc]:
    """Every document of the task's split (the first `limit` when given; with `spread`, `limit` evenly
    spaced over the split), as the task renders them."""
    subsets = list(task.subsets())
    picked: list[list[int]] | None = None
    rows_of: list[Sequence[Mapping[str, Any]]] | None = None
    if spread and limit is not None:
        rows_of = [task.rows(subset, task.split, data_root) for subset in subsets]
        sizes = np.array([len(rows) for rows in rows_of], dtype=np.int64)
        positions = spread_positions(int(sizes.sum()), limit)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        picked = [
            (positions[(positions >= a) & (positions < b)] - a).tolist()
            for a, b in zip(starts[:-1], starts[1:], strict=True)
        ]
    docs: list[Doc] = []
    offset = 0  # documents of the subsets before this one
    for s, subset in enumerate(subsets):
        if picked is None and limit is not None and len(docs) >= limit:
            break
        rows = rows_of[s] if rows_of is not None else task.rows(subset, task.split, data_root)
        if picked is not None:
            local = picked[s]
        else:
            local = list(range(len(rows) if limit is None else min(len(rows), limit - len(docs))))
        start, offset = offset, offset + len(rows)
        if not local:  # a subset the spread skips: no few-shot pool to read
            continue
        raws = [rows[i] for i in local]
        part = [task.make_doc(raw, start + i) for raw, i in zip(raws, local, strict=True)]
        pool, same_split = rows, True
        if task.num_fewshot > 0 and task.fewshot_split not in (None, task.split):
            pool, same_split = task.rows(subset, str(task.fewshot_split), data_root), False
        docs.extend(add_fewshot(task, part, raws, local, pool, subset, same_split=same_split))
    return docs
