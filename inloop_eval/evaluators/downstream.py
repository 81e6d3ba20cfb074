"""The downstream evaluator: one multiple-choice task scored by loglikelihood, `eval/downstream/<label>/...`.

One evaluation reads top to bottom: prepare the task once (documents, tokenized requests through the
request cache), this rank's share of documents, batches (planned once), forward passes, metric update,
compute (which syncs across ranks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import torch

from inloop_eval.config_fields import AtLeast, check_fields, check_label, one_of, shown
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.distributed import TaskAgreement, run_agreed, world
from inloop_eval.engine.adapters import ModelAdapter, probe_vocab_size
from inloop_eval.engine.batching import Batch, equalize_forward_calls, plan_batches
from inloop_eval.engine.scoring import PairScores, run_batches
from inloop_eval.engine.sharding import ICLMultiChoiceTaskDataset, rank_rows, shard_documents, subset_size
from inloop_eval.errors import ConfigError, ModelOutputError
from inloop_eval.evaluators.base import EvalOutput, Evaluator, Settings
from inloop_eval.keys import olmo_core_key
from inloop_eval.metrics.icl import ICLMetric
from inloop_eval.metrics.olmo import olmo_figures
from inloop_eval.metrics.registry import ALL_METRICS, needs_uncond, unknown_metrics
from inloop_eval.requests.cache import RequestCacheError, cache_path, load_table, save_table
from inloop_eval.requests.pairs import PairSet, RequestTable, build_requests
from inloop_eval.tasks import Doc, MultipleChoiceTask, get_task, load_docs

log = logging.getLogger(__name__)

EVALUATOR_TYPES = ("downstream",)


@dataclass(kw_only=True)
class TaskEvalConfig:
    """One evaluator of the list: a downstream task and how to batch it."""

    task: str
    """Task id from the registry (`inloop-eval tasks` lists them)."""
    label: str = ""
    """Name in metric keys (`eval/downstream/<label>/<metric>`): lower-case, without spaces, '/' or '..'.
    Defaults to the task id, which is then only required to be lower-case without spaces (so
    `harness:my_tasks/science.yaml` keeps its slash); set a label to get keys without colons or slashes."""
    type: str = "downstream"
    """Evaluator type: `downstream` (multiple-choice by loglikelihood)."""
    batch_tokens: Annotated[int, AtLeast(1)] = 8192
    """Token budget of one forward pass (rows x longest row, padding included)."""
    limit: Annotated[int, AtLeast(1)] | None = None
    """Evaluate only the first `limit` documents of the split."""
    metrics: list[str] | None = None
    """Figures to report instead of the task's defaults (names from `inloop_eval.metrics.registry.ALL_METRICS`)."""
    subset_num_batches: Annotated[int, AtLeast(1)] | None = None
    """Evaluate only the leading documents that fit in this many batches of `batch_tokens` (whole
    documents, in order, at least one), for cheap frequent evals. The budget is for the whole task, not
    per rank, so every world size scores the same documents; the documents left out are counted in
    `n_skipped_docs`. null: every document (up to `limit`)."""

    def __post_init__(self) -> None:
        check_fields(self, f"evaluator {shown(self.label or self.task)}")
        if not self.task:
            raise ConfigError("evaluator: `task` is required, e.g. `task: piqa`")
        if self.label and self.label != self.task:
            check_label(self.label, f"evaluator {self.task!r}")
        self.label = self.label or self.task
        if self.label != self.label.lower() or " " in self.label:
            raise ConfigError(
                f"evaluator {self.task!r}: label {self.label!r} must be lower-case without spaces "
                "(set `label:` when the task id is not)"
            )
        one_of(self.type, EVALUATOR_TYPES, f"evaluator {self.label!r}: type")
        if self.metrics is not None:
            unknown = unknown_metrics(self.metrics)
            if unknown:
                raise ConfigError(
                    f"evaluator {self.label!r}: unknown metrics {unknown}; choose from {list(ALL_METRICS)}"
                )

DEFAULT_MAX_LENGTH = 2048


@dataclass
class PreparedTask:
    """A task tokenized once per evaluator: its requests, and main + unconditional pairs in one set
    (unconditional pair u is pair `len(table) + u`)."""

    config: TaskEvalConfig
    task: MultipleChoiceTask
    max_length: int
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
    """One evaluation of a task: its figures, and this rank's raw scores (rows of the table, then the
    unconditional ids)."""

    metrics: dict[str, float]
    rows: np.ndarray
    uncond_ids: np.ndarray
    scores: PairScores


class DownstreamEvaluator(Evaluator):
    """A `type: downstream` entry: one task's metrics under `eval/downstream/<label>/<metric>`."""

    config: TaskEvalConfig

    def __init__(
        self, config: TaskEvalConfig, *, tokenizer: TokenizerLike, settings: Settings
    ) -> None:
        super().__init__(config, tokenizer=tokenizer, settings=settings)
        self.name = config.label
        self.prepared: PreparedTask | None = None

    def run(
        self, adapter: ModelAdapter, *, strict: bool, progress: Callable[[int], None] | None = None
    ) -> EvalOutput:
        max_length = adapter.max_length or DEFAULT_MAX_LENGTH

        def body(agreement: TaskAgreement) -> tuple[PreparedTask, TaskResult]:
            prepared = self.prepare(max_length, agreement)
            min_vocab = int(getattr(self.tokenizer, "vocab_size", 0) or 0)
            return prepared, evaluate(adapter, prepared, agreement, progress, min_vocab=min_vocab)

        done = run_agreed(f"task {self.config.label!r}", body, strict=strict)
        if done is None:
            return EvalOutput({f"eval/downstream/{self.config.label}/failed": 1.0})
        prepared, result = done
        metrics = dict(result.metrics)
        if "n_skipped_docs" in metrics:
            metrics["n_skipped_docs"] += prepared.dataset.n_left_out
        if prepared.n_fewshot_short_docs is not None:
            metrics["n_fewshot_short_docs"] = float(prepared.n_fewshot_short_docs)
        return EvalOutput(self.keys(prepared.task, metrics), result.scores.tokens_forwarded, result)

    def keys(self, task: MultipleChoiceTask, metrics: dict[str, float]) -> dict[str, float]:
        """`eval/downstream/<label>/<figure>`; with `key_style: olmo_core` an `olmo:` task's OLMo figures
        take OLMo-core's keys (`eval/downstream/<OLMo label> (accuracy)`)."""
        olmo = set(olmo_figures(task.olmo_metric_type)) if task.olmo_metric_type else set()
        olmo_label = self.config.task.removeprefix("olmo:")
        out: dict[str, float] = {}
        for figure, value in metrics.items():
            if figure in olmo and self.settings.key_style == "olmo_core":
                out[olmo_core_key(olmo_label, figure)] = value
            else:
                out[f"eval/downstream/{self.config.label}/{figure}"] = value
        return out

    def prepare(self, max_length: int, agreement: TaskAgreement | None = None) -> PreparedTask:
        """Load and tokenize the task once (again only for another `max_length`); later evaluations reuse
        it. Every rank joins the task's first agreement point here, even with the task already in memory."""
        agreement = agreement or TaskAgreement(self.config.label)
        if self.prepared is not None and self.prepared.max_length == max_length:
            agreement.agree()
            return self.prepared
        ev = self.config
        task = get_task(ev.task)
        metrics = tuple(ev.metrics) if ev.metrics is not None else task.metrics
        docs = load_docs(task, self.settings.data_root, limit=ev.limit)
        with_uncond = needs_uncond(metrics) or task.olmo_metric_type == "pmi_dc"
        table = self.requests(task, docs, max_length, with_uncond, agreement)
        n_docs = subset_size(table, ev.subset_num_batches, ev.batch_tokens) if ev.subset_num_batches else None
        dataset = ICLMultiChoiceTaskDataset(table, n_docs=n_docs)
        self.prepared = PreparedTask(
            ev,
            task,
            max_length,
            metrics,
            table,
            table.pairs.concat(table.uncond),
            dataset,
            count_short_fewshot(ev.label, task, docs, dataset),
        )
        return self.prepared

    def requests(
        self,
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
        limit = self.config.limit
        path = cache_path(
            task, docs, self.tokenizer, max_length=max_length, limit=limit, with_uncond=with_uncond
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


def count_short_fewshot(
    label: str, task: MultipleChoiceTask, docs: list[Doc], dataset: ICLMultiChoiceTaskDataset
) -> int | None:
    """Evaluated documents given fewer few-shot examples than asked (logged); None for zero-shot tasks."""
    if task.num_fewshot == 0:
        return None
    evaluated = set(dataset.doc_ids.tolist())
    short = [d.index for d in docs if d.index in evaluated and d.shots < task.num_fewshot]
    if short:
        log.warning(
            "task %r: documents with fewer than %d few-shot examples (the few-shot split holds no "
            "other documents to replace the ones identical to them): %d, first doc %d",
            label,
            task.num_fewshot,
            len(short),
            short[0],
        )
    return len(short)


def evaluate(
    adapter: ModelAdapter,
    prepared: PreparedTask,
    agreement: TaskAgreement,
    progress: Callable[[int], None] | None = None,
    *,
    min_vocab: int = 0,
) -> TaskResult:
    """Score this rank's share of a prepared task and compute the metric over all ranks, joining the task's
    agreement points (planning, between forward passes, before the metric sync).

    min_vocab: the tokenizer's vocabulary size; logits narrower than it are an error (`run_batches`).
    """
    rows, uncond_ids = assign_work(prepared)
    pair_ids = np.concatenate([rows, len(prepared.table) + uncond_ids])
    check_vocabulary(adapter, prepared, pair_ids, min_vocab=min_vocab)
    batches = equalize_forward_calls(plan(adapter, prepared, pair_ids), agreement)
    scores = run_batches(
        adapter,
        batches,
        len(pair_ids),
        describe=lambda p: describe_pair(prepared, int(pair_ids[p])),
        progress=progress,
        min_vocab=min_vocab,
    )
    metric = ICLMetric(prepared.metrics, prepared.task.olmo_metric_type).to(adapter.device)
    update_metric(metric, prepared.table, rows, uncond_ids, scores)
    agreement.agree()  # a rank that failed after its last forward stops every rank before the sync
    return TaskResult(metric.compute(), rows, uncond_ids, scores)


def plan(adapter: ModelAdapter, prepared: PreparedTask, pair_ids: np.ndarray) -> list[Batch]:
    """This rank's batches for `pair_ids` (its share, which world size and rank decide), planned at the
    task's first evaluation and reused by the later ones (planning a large task takes a CPU-second)."""
    key = (*world(), adapter.supports_packing, adapter.pad_to_multiple)
    if key not in prepared.plans:
        prepared.plans[key] = plan_batches(
            prepared.pairs,
            pair_ids,
            prepared.config.batch_tokens,
            packing=adapter.supports_packing,
            max_length=prepared.max_length,
            pad_to_multiple=adapter.pad_to_multiple,
        )
    return prepared.plans[key]


def assign_work(prepared: PreparedTask) -> tuple[np.ndarray, np.ndarray]:
    """This rank's request rows (its documents, by the DistributedSampler) and unconditional pairs (every
    world_size-th of those the evaluated documents need)."""
    world_size, rank = world()
    rows = rank_rows(prepared.dataset, shard_documents(prepared.dataset, world_size, rank))
    uncond_ids = prepared.dataset.uncond_ids()[rank::world_size]
    return rows, uncond_ids


def check_vocabulary(
    adapter: ModelAdapter, prepared: PreparedTask, pair_ids: np.ndarray, *, min_vocab: int = 0
) -> None:
    """Token ids the model cannot take are an error naming the first document that holds one, raised
    before the first forward: fed to the model, such an id fails inside the embedding (on CUDA a
    device-side assert that ends the process). The bound is the model's input embedding where it is
    known, else the width of its logits from a one-token probe (made on every rank alike).

    min_vocab: the tokenizer's vocabulary size, named when the probed logits are narrower.
    """
    vocab = adapter.vocab_size
    probed = vocab is None
    if vocab is None:
        vocab = probe_vocab_size(adapter)
    if prepared.pairs.max_token_id() < vocab:
        return
    for p in pair_ids:
        p = int(p)
        tokens = np.concatenate([prepared.pairs.context(p), prepared.pairs.continuation(p)])
        if not tokens.size or tokens.max() < vocab:
            continue
        top = int(tokens.max())
        if probed:
            raise ModelOutputError(
                f"{describe_pair(prepared, p)}: expected logits over at least {max(min_vocab, top + 1)} "
                f"tokens (the tokenizer's vocabulary), found {vocab}; token id {top} cannot be fed to the "
                "model; the model and the tokenizer do not match"
            )
        raise ModelOutputError(
            f"{describe_pair(prepared, p)}: token id {top} is beyond the model's "
            f"vocabulary of {vocab} (its input embedding); the tokenizer does not match the model"
        )


def read_request_cache(path: Path | None) -> RequestTable | None:
    """The cached table at `path`, or None (no path, no file, or a file that does not read back)."""
    if path is None:
        return None
    try:
        return load_table(path)
    except RequestCacheError as exc:
        log.warning("%s", exc)
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
