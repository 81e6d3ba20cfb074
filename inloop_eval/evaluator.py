"""The trainer-facing hook: `if evaluator.should_run(step): metrics = evaluator.run(model, step=step)`.

One task's evaluation reads top to bottom: this rank's share of documents, batches, forward passes,
metric update, compute (which syncs across ranks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from inloop_eval.adapters import ModelAdapter, make_adapter
from inloop_eval.batching import Batch, dummy_batch, plan_batches
from inloop_eval.config import EvaluatorConfig, TaskEvalConfig
from inloop_eval.dataset import ICLMultiChoiceTaskDataset, rank_rows, shard_documents
from inloop_eval.distributed import all_reduce_max, world
from inloop_eval.errors import ConfigError, ModelOutputError
from inloop_eval.metrics.icl import ICLMetric
from inloop_eval.requests import PairSet, RequestTable, build_requests
from inloop_eval.safety import training_untouched
from inloop_eval.scoring import PairScores, run_batches
from inloop_eval.tasks import MultipleChoiceTask, get_task, load_docs
from inloop_eval.tokenizer import TokenizerLike, load_tokenizer

log = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 2048


@dataclass
class PreparedTask:
    """A task tokenized once per evaluator: its requests, and main + unconditional pairs in one set
    (unconditional pair u is pair `len(table) + u`)."""

    config: TaskEvalConfig
    task: MultipleChoiceTask
    metrics: tuple[str, ...]
    table: RequestTable
    pairs: PairSet
    dataset: ICLMultiChoiceTaskDataset


@dataclass
class TaskResult:
    """One task's figures, and this rank's raw scores (rows of the table, then unconditional ids)."""

    metrics: dict[str, float]
    rows: np.ndarray
    uncond_ids: np.ndarray
    scores: PairScores


class InLoopEvaluator:
    """Runs the configured downstream tasks on a model and returns `{metric key: float}`."""

    def __init__(self, config: EvaluatorConfig, *, tokenizer: TokenizerLike | None = None) -> None:
        self.config = config
        if tokenizer is None:
            if not config.tokenizer:
                raise ConfigError("evaluator: set `tokenizer:` in the config or pass tokenizer=")
            tokenizer = load_tokenizer(config.tokenizer)
        self.tokenizer = tokenizer
        self._prepared: dict[tuple[str, int], PreparedTask] = {}
        self.last_results: dict[str, TaskResult] = {}

    @classmethod
    def from_yaml(cls, path: str, **kwargs: Any) -> InLoopEvaluator:
        return cls(EvaluatorConfig.from_yaml(path), **kwargs)

    def should_run(self, step: int) -> bool:
        return step % self.config.eval_interval == 0

    def run(
        self, model: Any, step: int | None = None, progress: Callable[[int], None] | None = None
    ) -> dict[str, float]:
        """Evaluate every configured task; returns `eval/downstream/<label>/<metric>` -> float."""
        adapter = make_adapter(model, self.config.max_length)
        out: dict[str, float] = {}
        with training_untouched(adapter.model):
            for ev in self.config.evaluators:
                out.update(self.run_task(adapter, ev, progress))
        if step is not None:
            log.info("step %d: %s", step, {k: round(v, 4) for k, v in out.items()})
        return out

    def run_task(
        self, adapter: ModelAdapter, ev: TaskEvalConfig, progress: Callable[[int], None] | None = None
    ) -> dict[str, float]:
        """One task's metrics under its keys; failures are reported, not raised, unless strict."""
        prefix = f"eval/downstream/{ev.label}"
        try:
            prepared = self.prepare(ev, adapter.max_length or DEFAULT_MAX_LENGTH)
            result = self.evaluate(adapter, prepared, progress)
        except Exception as exc:
            if self.config.strict:
                raise
            log.error("in-loop eval of task %r failed: %s: %s", ev.label, type(exc).__name__, exc)
            return {f"{prefix}/failed": 1.0}
        self.last_results[ev.label] = result
        return {f"{prefix}/{k}": v for k, v in result.metrics.items()}

    def prepare(self, ev: TaskEvalConfig, max_length: int) -> PreparedTask:
        """Load and tokenize a task once; later evaluations reuse it."""
        key = (ev.label, max_length)
        if key not in self._prepared:
            task = get_task(ev.task)
            metrics = tuple(ev.metrics) if ev.metrics is not None else task.metrics
            docs = load_docs(task, self.config.data_root, limit=ev.limit)
            table = build_requests(task, docs, self.tokenizer, max_length, with_uncond="acc_pmi" in metrics)
            pairs = table.pairs.concat(table.uncond)
            self._prepared[key] = PreparedTask(
                ev, task, metrics, table, pairs, ICLMultiChoiceTaskDataset(table)
            )
        return self._prepared[key]

    def evaluate(
        self, adapter: ModelAdapter, prepared: PreparedTask, progress: Callable[[int], None] | None = None
    ) -> TaskResult:
        """Score this rank's share of a prepared task and compute the metric over all ranks."""
        rows, uncond_ids = self.assign_work(prepared)
        pair_ids = np.concatenate([rows, len(prepared.table) + uncond_ids])
        self.check_vocabulary(adapter, prepared, pair_ids)
        batches = self.equalize_forward_calls(
            plan_batches(prepared.pairs, pair_ids, prepared.config.batch_tokens)
        )
        scores = run_batches(
            adapter,
            batches,
            len(pair_ids),
            describe=lambda p: describe_pair(prepared, int(pair_ids[p])),
            progress=progress,
            min_vocab=getattr(self.tokenizer, "vocab_size", 0),
        )
        metric = ICLMetric(prepared.metrics).to(adapter.device)
        update_metric(metric, prepared.table, rows, uncond_ids, scores)
        return TaskResult(metric.compute(), rows, uncond_ids, scores)

    def assign_work(self, prepared: PreparedTask) -> tuple[np.ndarray, np.ndarray]:
        """This rank's request rows (its documents) and unconditional pairs (every world_size-th)."""
        world_size, rank = world()
        rows = rank_rows(prepared.dataset, shard_documents(prepared.dataset, world_size, rank))
        uncond_ids = np.arange(len(prepared.table.uncond), dtype=np.int64)[rank::world_size]
        return rows, uncond_ids

    def equalize_forward_calls(self, batches: list[Batch]) -> list[Batch]:
        """Pad with dummy forwards so every rank makes the same number of model calls."""
        n = all_reduce_max(len(batches))
        return batches + [dummy_batch() for _ in range(n - len(batches))]

    def check_vocabulary(self, adapter: ModelAdapter, prepared: PreparedTask, pair_ids: np.ndarray) -> None:
        """Token ids the model cannot embed are an error naming the first document that holds one."""
        vocab = adapter.vocab_size
        if vocab is None or prepared.pairs.max_token_id() < vocab:
            return
        for p in pair_ids:
            p = int(p)
            tokens = np.concatenate([prepared.pairs.context(p), prepared.pairs.continuation(p)])
            if tokens.size and tokens.max() >= vocab:
                raise ModelOutputError(
                    f"{describe_pair(prepared, p)}: token id {int(tokens.max())} is beyond the model's "
                    f"vocabulary of {vocab}; the tokenizer does not match the model"
                )


def describe_pair(prepared: PreparedTask, p: int) -> str:
    table = prepared.table
    if p < len(table):
        return f"task {table.task!r} doc {int(table.doc_id[p])} choice {int(table.cont_id[p])}"
    return f"task {table.task!r} unconditional request {p - len(table)}"


def update_metric(
    metric: ICLMetric, table: RequestTable, rows: np.ndarray, uncond_ids: np.ndarray, scores: PairScores
) -> None:
    """Feed this rank's scores (always, even when empty: every rank must gather the same states)."""
    n = len(rows)
    t = torch.from_numpy
    metric.update(
        doc_id=t(table.doc_id[rows]),
        cont_id=t(table.cont_id[rows]),
        n_choices=t(table.n_choices[rows]),
        is_gold=t(table.is_gold[rows]),
        ll=t(scores.ll[:n]),
        uncond_id=t(table.uncond_id[rows]),
        n_tokens=t(table.pairs.cont_len[rows]),
        n_chars=t(table.n_chars[rows]),
        n_bytes=t(table.n_bytes[rows]),
    )
    metric.update_uncond(t(uncond_ids), t(scores.ll[n:]))
