"""What a task's evaluation costs as a function of its documents: the tokens the engine's own plan forwards
(`engine.batching.plan_batches`, shared prefixes and kept prefixes included) times the seconds per token the
runs measured (or `--seconds-per-token`).

A task's documents are tokenized once, `pool` of them spread over its split (`tasks.load_docs(spread=True)`,
through the request cache); the tokens of n documents are those of n documents spread over that pool, planned
in the batch shape of the run's model. So a 5-shot task's n documents cost less each as n grows (its shots are
forwarded once per kept prefix), and a subset's cost follows the documents it holds. Beyond the pool, a
task's tokens grow at the rate per document of the pool's last rung.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.engine.batching import BatchShape, plan_batches
from inloop_eval.evaluators.downstream import TaskEvalConfig
from inloop_eval.metrics.registry import needs_uncond
from inloop_eval.plan.allocate import DOCUMENT_LADDER, CostCurve
from inloop_eval.requests.cache import cache_path, read_request_cache, write_request_cache
from inloop_eval.requests.table import RequestTable, build_requests
from inloop_eval.tasks import MultipleChoiceTask, get_task, load_docs
from inloop_eval.tasks.loading import spread_positions

# Documents of a task tokenized to price it: enough for the ladder's common rungs, few enough to tokenize in
# seconds.
POOL_DOCUMENTS = 1000


@dataclass(frozen=True)
class CostSettings:
    """How the runs' model is evaluated: its tokenizer, task data, longest input, batch shape (`BatchShape`:
    packed rows, shared and kept prefixes) and the measured seconds per token."""

    tokenizer: TokenizerLike
    data_root: Path
    max_length: int
    shape: BatchShape
    seconds_per_token: float
    pool: int = POOL_DOCUMENTS


def split_size(task: MultipleChoiceTask, data_root: Path) -> int:
    """The documents of the task's split (every subset's)."""
    return sum(len(task.rows(subset, task.split, data_root)) for subset in task.subsets())


def with_uncond(entry: TaskEvalConfig, task: MultipleChoiceTask) -> bool:
    """Whether the entry's figures need unconditional requests (PMI), as the evaluator decides."""
    metrics = tuple(entry.metrics) if entry.metrics is not None else task.metrics
    return needs_uncond(metrics) or task.olmo_metric_type == "pmi_dc"


def task_requests(
    entry: TaskEvalConfig, settings: CostSettings, limit: int | None, spread: bool
) -> RequestTable:
    """The entry's tokenized requests for `limit` documents (spread over the split or its first ones), read
    from the request cache where an evaluation (or an earlier plan) wrote them, else tokenized and cached."""
    task = get_task(entry.task)
    docs = load_docs(task, settings.data_root, limit=limit, spread=spread)
    uncond = with_uncond(entry, task)
    path = cache_path(
        task, docs, settings.tokenizer, max_length=settings.max_length, limit=limit, with_uncond=uncond
    )
    table = read_request_cache(path)
    if table is None:
        table = build_requests(task, docs, settings.tokenizer, settings.max_length, with_uncond=uncond)
        write_request_cache(table, path)
    return table


def planned_tokens(
    table: RequestTable, doc_index_D: np.ndarray, batch_tokens: int, settings: CostSettings
) -> int:
    """Tokens the engine forwards to score the documents `doc_index_D` of `table` (their requests and the
    unconditional ones they need), padding and kept prefixes included, on one rank."""
    rows = table.rows_of_docs(doc_index_D)
    uncond = np.unique(table.uncond_id[rows])
    pair_ids = np.concatenate([rows, len(table) + uncond[uncond >= 0]])
    pairs = table.pairs.concat(table.uncond)
    batches = plan_batches(pairs, pair_ids, batch_tokens, settings.shape, max_length=settings.max_length)
    return sum(b.n_tokens for b in batches)


def tokens_by_documents(
    table: RequestTable, rungs: Sequence[int], batch_tokens: int, settings: CostSettings
) -> list[int]:
    """The tokens of n documents spread over the table's, for each n of `rungs` (each at most the table's)."""
    doc_index_D = np.unique(table.doc_id)
    return [
        planned_tokens(table, doc_index_D[spread_positions(len(doc_index_D), n)], batch_tokens, settings)
        for n in rungs
    ]


def task_cost(entry: TaskEvalConfig, settings: CostSettings) -> tuple[CostCurve, int]:
    """(the seconds of n documents of the entry's task, spread over its split; the split's documents)."""
    task = get_task(entry.task)
    n_split = split_size(task, settings.data_root)
    pool = min(n_split, settings.pool)
    table = task_requests(entry, settings, pool if pool < n_split else None, spread=pool < n_split)
    rungs = [n for n in DOCUMENT_LADDER if n < pool] + [pool]
    tokens = tokens_by_documents(table, rungs, entry.batch_tokens, settings)
    seconds = tuple(t * settings.seconds_per_token for t in tokens)
    return CostCurve(tuple(rungs), seconds), n_split


def entry_tokens(entry: TaskEvalConfig, settings: CostSettings) -> int:
    """The tokens of one evaluation of the entry as configured (its `limit` and `spread`)."""
    table = task_requests(entry, settings, entry.limit, entry.spread)
    return planned_tokens(table, np.unique(table.doc_id), entry.batch_tokens, settings)
