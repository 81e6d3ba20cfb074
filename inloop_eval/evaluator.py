"""The trainer-facing hook: `if evaluator.should_run(step): metrics = evaluator.run(model, step=step)`.

One task's evaluation reads top to bottom: this rank's share of documents, batches, forward passes,
metric update, compute (which syncs across ranks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inloop_eval.adapters import ModelAdapter, make_adapter
from inloop_eval.batching import Batch, equalize_forward_calls, plan_batches
from inloop_eval.config import EvaluatorConfig, LMEvalConfig, TaskEvalConfig
from inloop_eval.distributed import TaskAgreement, TaskFailedOnAnotherRank, world
from inloop_eval.errors import ConfigError, ModelOutputError
from inloop_eval.lm_evaluator import LMEvaluator
from inloop_eval.metrics.icl import ICLMetric, needs_uncond
from inloop_eval.pairs import PairSet, RequestTable, build_requests
from inloop_eval.request_cache import RequestCacheError, cache_path, load_table, save_table
from inloop_eval.safety import training_untouched
from inloop_eval.scoring import PairScores, run_batches
from inloop_eval.sharding import ICLMultiChoiceTaskDataset, rank_rows, shard_documents, subset_size
from inloop_eval.tasks import Doc, MultipleChoiceTask, get_task, load_docs
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
    # Evaluated documents given fewer few-shot examples than asked (see `tasks.fewshot`); None: zero-shot.
    n_fewshot_short_docs: int | None = None
    # This rank's batches by (world size, rank, packing, pad_to_multiple): planned once, reused.
    plans: dict[tuple[int, int, bool, int], list[Batch]] = field(default_factory=dict)


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
        """Evaluate every configured task; returns `eval/downstream/<label>/<metric>` -> float.

        Under torch.distributed every rank calls this with its part of the model; training state is left
        as it was (`training_untouched`), and `compiler_reset` drops torch.compile's graphs afterwards.
        """
        adapter = make_adapter(model, self.config.max_length)
        if self.config.pad_to_multiple > 1:
            adapter.pad_to_multiple = self.config.pad_to_multiple
        out: dict[str, float] = {}
        try:
            with training_untouched(adapter.model):
                for ev in self.config.evaluators:
                    if isinstance(ev, LMEvalConfig):
                        out.update(self.run_lm(adapter, ev, progress))
                        continue
                    out.update(self.run_task(adapter, ev, progress))
        finally:
            if self.config.compiler_reset:
                torch.compiler.reset()
        if step is not None:
            log.info("step %d: %s", step, {k: round(v, 4) for k, v in out.items()})
        return out

    @cached_property
    def lm(self) -> LMEvaluator:
        """Runs the `type: lm` entries and keeps their loaded domain sets and last results."""
        return LMEvaluator(self.tokenizer)

    def run_lm(
        self, adapter: ModelAdapter, ev: LMEvalConfig, progress: Callable[[int], None] | None = None
    ) -> dict[str, float]:
        """A domain-perplexity entry: `eval/lm/<label>/<ce|ppl|bpb>` (see `inloop_eval.lm_evaluator`)."""
        return self.lm.run(adapter, ev, strict=self.config.strict, progress=progress)

    def run_task(
        self, adapter: ModelAdapter, ev: TaskEvalConfig, progress: Callable[[int], None] | None = None
    ) -> dict[str, float]:
        """One task's metrics under its keys. A failure on any rank is agreed by every rank (see
        `inloop_eval.distributed`): all report `failed = 1`, or all raise when strict."""
        prefix = f"eval/downstream/{ev.label}"
        agreement = TaskAgreement(ev.label)
        try:
            prepared = self.prepare(ev, adapter.max_length or DEFAULT_MAX_LENGTH, agreement)
            result = self.evaluate(adapter, prepared, agreement, progress)
            agreement.agree(last=True)
        except TaskFailedOnAnotherRank as exc:
            if self.config.strict:
                raise
            log.error("in-loop eval of task %r failed: %s", ev.label, exc)
            return {f"{prefix}/failed": 1.0}
        except Exception as exc:
            agreement.report_failure()
            if self.config.strict:
                raise
            log.error("in-loop eval of task %r failed: %s: %s", ev.label, type(exc).__name__, exc)
            return {f"{prefix}/failed": 1.0}
        self.last_results[ev.label] = result
        metrics = dict(result.metrics)
        if "n_skipped_docs" in metrics:
            metrics["n_skipped_docs"] += prepared.dataset.n_left_out
        if prepared.n_fewshot_short_docs is not None:
            metrics["n_fewshot_short_docs"] = float(prepared.n_fewshot_short_docs)
        return {f"{prefix}/{k}": v for k, v in metrics.items()}

    def prepare(
        self, ev: TaskEvalConfig, max_length: int, agreement: TaskAgreement | None = None
    ) -> PreparedTask:
        """Load and tokenize a task once per evaluator; later evaluations reuse it. Every rank joins the
        task's first agreement point here, even with the task already in memory."""
        agreement = agreement or TaskAgreement(ev.label)
        key = (ev.label, max_length)
        if key in self._prepared:
            agreement.agree()
            return self._prepared[key]
        task = get_task(ev.task)
        metrics = tuple(ev.metrics) if ev.metrics is not None else task.metrics
        docs = load_docs(task, self.config.data_root, limit=ev.limit)
        table = self.requests(ev, task, docs, max_length, needs_uncond(metrics), agreement)
        n_docs = subset_size(table, ev.subset_num_batches, ev.batch_tokens) if ev.subset_num_batches else None
        dataset = ICLMultiChoiceTaskDataset(table, n_docs=n_docs)
        n_short = None
        if task.num_fewshot > 0:
            evaluated = set(dataset.doc_ids.tolist())
            short = [d.index for d in docs if d.index in evaluated and d.shots < task.num_fewshot]
            n_short = len(short)
            if short:
                log.warning(
                    "task %r: documents with fewer than %d few-shot examples (the few-shot split holds no "
                    "other documents to replace the ones identical to them): %d, first doc %d",
                    ev.label,
                    task.num_fewshot,
                    n_short,
                    short[0],
                )
        self._prepared[key] = PreparedTask(
            ev, task, metrics, table, table.pairs.concat(table.uncond), dataset, n_short
        )
        return self._prepared[key]

    def requests(
        self,
        ev: TaskEvalConfig,
        task: MultipleChoiceTask,
        docs: list[Doc],
        max_length: int,
        with_uncond: bool,
        agreement: TaskAgreement,
    ) -> RequestTable:
        """The task's tokenized requests: rank 0 reads the request cache, or tokenizes and writes it; the
        other ranks wait at the agreement point, then read the file (or tokenize for themselves when they
        cannot: no shared file system, no fingerprint to key the cache by)."""
        _, rank = world()
        path = cache_path(
            task, docs, self.tokenizer, max_length=max_length, limit=ev.limit, with_uncond=with_uncond
        )
        table = None
        if rank == 0:
            table = read_request_cache(path)
            if table is None:
                table = build_requests(task, docs, self.tokenizer, max_length, with_uncond=with_uncond)
                write_request_cache(table, path)
        written = agreement.agree(int(rank == 0 and path is not None and path.is_file()))
        if table is None and written:
            table = read_request_cache(path)
        if table is None:
            table = build_requests(task, docs, self.tokenizer, max_length, with_uncond=with_uncond)
        return table

    def evaluate(
        self,
        adapter: ModelAdapter,
        prepared: PreparedTask,
        agreement: TaskAgreement,
        progress: Callable[[int], None] | None = None,
    ) -> TaskResult:
        """Score this rank's share of a prepared task and compute the metric over all ranks, joining the
        task's agreement points (planning, between forward passes, before the metric sync)."""
        rows, uncond_ids = self.assign_work(prepared)
        pair_ids = np.concatenate([rows, len(prepared.table) + uncond_ids])
        self.check_vocabulary(adapter, prepared, pair_ids)
        batches = equalize_forward_calls(self.plan(adapter, prepared, pair_ids), agreement)
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
        agreement.agree()  # a rank that failed after its last forward stops every rank before the sync
        return TaskResult(metric.compute(), rows, uncond_ids, scores)

    def plan(self, adapter: ModelAdapter, prepared: PreparedTask, pair_ids: np.ndarray) -> list[Batch]:
        """This rank's batches for `pair_ids` (its share, which world size and rank decide), planned at the
        task's first evaluation and reused by the later ones (planning a large task takes a CPU-second)."""
        key = (*world(), adapter.supports_packing, adapter.pad_to_multiple)
        if key not in prepared.plans:
            prepared.plans[key] = plan_batches(
                prepared.pairs,
                pair_ids,
                prepared.config.batch_tokens,
                packing=adapter.supports_packing,
                max_length=adapter.max_length or DEFAULT_MAX_LENGTH,
                pad_to_multiple=adapter.pad_to_multiple,
            )
        return prepared.plans[key]

    def assign_work(self, prepared: PreparedTask) -> tuple[np.ndarray, np.ndarray]:
        """This rank's request rows (its documents, by the DistributedSampler) and unconditional pairs
        (every world_size-th of those the evaluated documents need)."""
        world_size, rank = world()
        rows = rank_rows(prepared.dataset, shard_documents(prepared.dataset, world_size, rank))
        uncond_ids = prepared.dataset.uncond_ids()[rank::world_size]
        return rows, uncond_ids

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


def read_request_cache(path: Path | None) -> RequestTable | None:
    """The cached table at `path`, or None (no path, no file, or a file that does not read back)."""
    if path is None:
        return None
    try:
        return load_table(path)
    except RequestCacheError as exc:
        log.warning("%s; tokenizing again", exc)
        return None


def write_request_cache(table: RequestTable, path: Path | None) -> None:
    """Cache `table` at `path`; a cache that cannot be written is logged, never fatal."""
    if path is None:
        return
    try:
        save_table(table, path)
    except OSError as exc:
        log.warning("request cache %s not written (%s); every rank tokenizes for itself", path, exc)


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
        is_greedy=t(scores.greedy[:n]),
    )
    metric.update_uncond(t(uncond_ids), t(scores.ll[n:]))
