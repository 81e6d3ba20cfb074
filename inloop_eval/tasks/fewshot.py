"""Few-shot prompts: k solved examples, then the document's own prompt.

A document's prompt is `description + example_1 + delimiter + ... + example_k + delimiter + context`, where an
example is a solved document of the few-shot split: its (gold) context, the target delimiter and its gold
continuation, as lm-evaluation-harness writes them. Examples come from either

- `first_n`: the first k documents of the few-shot split (as MMLU's `dev` split is used), or
- `random`: k documents drawn from a NumPy generator seeded by (`fewshot_seed`, the subset's name, the
  document's index in its split), so a document's prompt depends on nothing else: not on which other
  documents are loaded, their order, the world size, the rank, or the process (no `hash()`).

A document is never its own example: a candidate from the same split at the same index, or one that renders
to the same contexts and continuations, is skipped and the next candidate taken. A split too small for k
examples is a configuration error. Where only the skipped look-alikes are missing (an MMLU test question
that is also one of its subject's 5 `dev` questions), the document gets the k-1 others, as
lm-evaluation-harness gives it; `Doc.shots` records the number and the evaluator reports such documents as
`n_fewshot_short_docs`.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inloop_eval.errors import TaskDataError
from inloop_eval.tasks.base import Doc, MultipleChoiceTask

SAMPLERS: tuple[str, ...] = ("first_n", "random")


def render_example(task: MultipleChoiceTask, doc: Doc) -> str:
    """A solved example: the gold choice's context, the target delimiter and the gold continuation."""
    gold = doc.gold[0]
    return doc.contexts[gold] + task.target_delimiter + doc.continuations[gold]


class ExamplePool:
    """The few-shot split of one subset, rendered lazily (each candidate at most once)."""

    def __init__(
        self, task: MultipleChoiceTask, rows: Sequence[Mapping[str, Any]], subset: str | None, split: str
    ) -> None:
        self.task = task
        self.rows = rows
        self.subset = subset
        self.split = split
        self._docs: dict[int, Doc] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def doc(self, j: int) -> Doc:
        if j not in self._docs:
            try:
                self._docs[j] = self.task.make_doc(self.rows[j], j)
            except TaskDataError as exc:
                where = f"split {self.split!r}" + (f" of subset {self.subset!r}" if self.subset else "")
                raise TaskDataError(f"few-shot example {j} from {where}: {exc}") from None
        return self._docs[j]


def example_indices(
    task: MultipleChoiceTask, pool: ExamplePool, doc: Doc, local_index: int, same_split: bool
) -> list[int]:
    """Indices into `pool` of the (at most) k examples for one document (see the module docstring)."""
    k = task.num_fewshot
    n_others = len(pool) - int(same_split and local_index < len(pool))
    if n_others < k:
        raise TaskDataError(
            f"task {task.name!r} doc {doc.index}: expected {k} few-shot examples from split "
            f"{pool.split!r}, found only {n_others} other documents there; lower the shot count"
        )

    def eligible(j: int) -> bool:
        if same_split and j == local_index:
            return False
        other = pool.doc(j)
        return (other.contexts, other.continuations) != (doc.contexts, doc.continuations)

    n = len(pool)
    if task.fewshot_sampler == "first_n":
        chosen: list[int] = []
        for j in range(n):
            if len(chosen) == k:
                break
            if eligible(j):
                chosen.append(j)
    elif task.fewshot_sampler == "random":
        subset_key = zlib.crc32((pool.subset or "").encode("utf-8"))
        rng = np.random.default_rng([task.fewshot_seed, subset_key, local_index])
        size = min(n, k + 1)
        while True:
            drawn = rng.choice(n, size=size, replace=False).tolist()
            chosen = [j for j in drawn if eligible(j)][:k]
            if len(chosen) == k or size == n:
                break
            size = min(n, 2 * size)
    else:
        raise TaskDataError(
            f"task {task.name!r}: fewshot_sampler expected one of {SAMPLERS}, found {task.fewshot_sampler!r}"
        )
    return chosen


def add_fewshot(
    task: MultipleChoiceTask,
    docs: Sequence[Doc],
    raws: Sequence[Mapping[str, Any]],
    row_indices: Sequence[int],
    pool_rows: Sequence[Mapping[str, Any]],
    subset: str | None,
    *,
    same_split: bool,
) -> list[Doc]:
    """Put the description and `task.num_fewshot` examples before every context of `docs`.

    docs: documents of one subset, in any order; `raws[i]` is the row `docs[i]` was made from and
        `row_indices[i]` its index in the subset's split (which seeds its examples).
    pool_rows: the few-shot split's rows (the evaluated split itself when `same_split`).
    """
    if task.num_fewshot < 0:
        raise TaskDataError(f"task {task.name!r}: num_fewshot expected >= 0, found {task.num_fewshot}")
    split = task.split if same_split else (task.fewshot_split or task.split)
    pool = ExamplePool(task, pool_rows, subset, split)
    out: list[Doc] = []
    for doc, raw, local_index in zip(docs, raws, row_indices, strict=True):
        prefix = task.description_for(raw, subset)
        examples: list[int] = []
        if task.num_fewshot > 0:
            examples = example_indices(task, pool, doc, local_index, same_split)
            prefix += "".join(render_example(task, pool.doc(j)) + task.fewshot_delimiter for j in examples)
        if not prefix:
            out.append(doc)
            continue
        contexts = tuple(prefix + c for c in doc.contexts)
        out.append(dataclasses.replace(doc, contexts=contexts, shots=len(examples)))
    return out
