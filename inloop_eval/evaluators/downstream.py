"""The downstream evaluator (`type: downstream`): one multiple-choice task scored by loglikelihood, its
figures under its label (`eval/downstream/<label>/<figure>`).

One evaluation reads top to bottom: prepare the task once (documents, tokenized requests through the
request cache), this rank's share of documents, batches (planned once), forward passes, metric update,
compute (which syncs across ranks).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import numpy as np
import torch

from inloop_eval.config_fields import AtLeast, check_fields, check_label, shown
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.distributed import TaskAgreement, world
from inloop_eval.engine.batching import Batch, BatchShape, plan_batches
from inloop_eval.engine.evaluation import EvalContext, Share, score_share
from inloop_eval.engine.scoring import PairScores
from inloop_eval.engine.sharding import ICLMultiChoiceTaskDataset, rank_rows, shard_documents, subset_size
from inloop_eval.errors import ConfigError, ModelOutputError
from inloop_eval.evaluators.base import (
    EvalOutput,
    Evaluator,
    Settings,
    check_entry_type,
    metric_class,
)
from inloop_eval.keys import DOWNSTREAM
from inloop_eval.metrics.registry import ALL_METRICS, comparing_choices, needs_uncond, unknown_metrics
from inloop_eval.requests.cache import cache_path, read_request_cache, table_fingerprint, write_request_cache
from inloop_eval.requests.table import PairSet, RequestTable, build_requests
from inloop_eval.tasks import Doc, MultipleChoiceTask, get_task, load_docs
from inloop_eval.tasks.registry import check_task_id

if TYPE_CHECKING:
    from inloop_eval.metrics.icl_metric import ICLMetric

log = logging.getLogger(__name__)

# The task's torchmetrics Metric, by path: its module is imported at the first evaluation (`metric_class`).
ICL_METRIC = "inloop_eval.metrics.icl_metric.ICLMetric"


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
    """Evaluate only the first `limit` documents of the split (with `spread`, `limit` spread over it)."""
    spread: bool = False
    """With `limit`: the documents evaluated are evenly spaced over the whole split (every MMLU subject in
    proportion) rather than its first ones; each keeps its index and few-shot examples of a full run."""
    metrics: list[str] | None = None
    """Figures to report instead of the task's defaults (names from `inloop_eval.metrics.registry.ALL_METRICS`)."""
    subset_num_batches: Annotated[int, AtLeast(1)] | None = None
    """Evaluate only the leading documents that fit in this many batches of `batch_tokens` (whole
    documents, in order, at least one), for cheap frequent evals. The budget is for the whole task, not
    per rank, so every world size scores the same documents; the documents left out are counted in
    `n_skipped_docs`. null: every document (up to `limit`)."""

    labels_name: ClassVar[str] = "task labels"

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
        check_entry_type(self, f"evaluator {self.label!r}")
        if self.spread and self.limit is None:
            raise ConfigError(
                f"evaluator {self.label!r}: `spread: true` spreads `limit` documents over the split, but "
                "`limit` is not set (every document would be evaluated, and `spread` silently ignored); set "
                "`limit: N` (--limit N), or remove `spread`"
            )
        if self.metrics is not None:
            unknown = unknown_metrics(self.metrics)
            if unknown:
                raise ConfigError(
                    f"evaluator {self.label!r}: unknown metrics {unknown}; choose from {list(ALL_METRICS)}"
                )

    def labels(self) -> list[str]:
        return [self.label]


# The context length of a model that does not tell its own.
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
    # This rank's batches by (data-parallel size, rank, batch shape): planned once, reused.
    plans: dict[tuple[int, int, BatchShape], list[Batch]] = field(default_factory=dict)


@dataclass
class TaskResult:
    """One evaluation of a task (the `detail` of its `EvalOutput`): the metric's figures, this rank's raw
    scores (of `rows` of the table, then of the unconditional pairs `uncond_ids`), the prepared task they
    index, and every rank's unconditional loglikelihoods by id (`uncond_ll`: the ranks deal unconditional
    pairs apart from their documents, so a rank's records need the others' too)."""

    metrics: dict[str, float]
    rows: np.ndarray
    uncond_ids: np.ndarray
    scores: PairScores
    prepared: PreparedTask
    uncond_ll: dict[int, float] = field(default_factory=dict)


class DownstreamEvaluator(Evaluator[TaskEvalConfig, PreparedTask]):
    """A `type: downstream` entry: one task's figures under its label (`eval/downstream/<label>/<figure>`)."""

    kind = DOWNSTREAM
    config_class = TaskEvalConfig

    def __init__(self, config: TaskEvalConfig, *, tokenizer: TokenizerLike, settings: Settings) -> None:
        super().__init__(config, tokenizer=tokenizer, settings=settings)
        check_task_id(config.task)  # a misspelled id stops the build on every rank, not the first evaluation
        self.name = config.label
        self._prepared: PreparedTask | None = None

    def title(self) -> str:
        return f"task {self.config.label!r}"

    def prepare(self, context: EvalContext, agreement: TaskAgreement) -> PreparedTask:
        """Load and tokenize the task once (again only for another context length); later evaluations
        reuse it (every rank alike: a rank whose preparing failed made every rank fail with it). A task fails
        whole (`strict` changes nothing here)."""
        max_length = context.max_length or DEFAULT_MAX_LENGTH
        if self._prepared is not None and self._prepared.max_length == max_length:
            return self._prepared
        ev = self.config
        task = get_task(ev.task)
        metrics = tuple(ev.metrics) if ev.metrics is not None else task.metrics
        docs = load_docs(task, self.settings.data_root, limit=ev.limit, spread=ev.spread)
        warn_single_choice(self.title(), docs, metrics)
        with_uncond = needs_uncond(metrics) or task.olmo_metric_type == "pmi_dc"
        table = self.requests(task, docs, max_length, with_uncond, agreement)
        agreement.agree_same(table_fingerprint(table), "the task's tokenized requests")
        n_docs = subset_size(table, ev.subset_num_batches, ev.batch_tokens) if ev.subset_num_batches else None
        dataset = ICLMultiChoiceTaskDataset(table, n_docs=n_docs)
        self._prepared = PreparedTask(
            ev,
            task,
            max_length,
            metrics,
            table,
            table.pairs.concat(table.uncond),
            dataset,
            count_short_fewshot(ev.label, task, docs, dataset),
        )
        return self._prepared

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

    def evaluate(self, context: EvalContext, prepared: PreparedTask, agreement: TaskAgreement) -> EvalOutput:
        """Score this rank's share of the task and compute its figures over the data-parallel group, joining
        the task's agreement points (planning, between forward passes, before the metric sync). Logits
        narrower than the tokenizer's vocabulary are an error (`run_batches`)."""
        min_vocab = int(getattr(self.tokenizer, "vocab_size", 0) or 0)
        rows, uncond_ids = rank_share(prepared, *context.data_parallel)
        pair_ids = np.concatenate([rows, len(prepared.table) + uncond_ids])
        check_vocabulary(context, prepared, pair_ids, min_vocab=min_vocab)
        batches = plan(prepared, pair_ids, context.shape, context.data_parallel)
        share = Share(batches, len(pair_ids), lambda p: describe_pair(prepared, int(pair_ids[p])), min_vocab)
        scores = score_share(context, agreement, self.title(), share)
        metric: ICLMetric = metric_class(ICL_METRIC)(
            prepared.metrics,
            prepared.task.olmo_metric_type,
            process_group=context.dp_group,
            sync_on_compute=context.data_parallel[0] > 1,  # alone, no barrier or gather to make
        )
        update_metric(metric.to(context.adapter.device), prepared.table, rows, uncond_ids, scores)
        result = TaskResult(metric.compute(), rows, uncond_ids, scores, prepared, synced_uncond_ll(metric))
        check_finite_documents(self.title(), result.metrics, strict=context.strict)
        label = self.config.label
        figures = {label: task_figures(prepared, result.metrics)}
        outcomes = {label: metric.outcomes} if metric.outcomes is not None else {}
        return EvalOutput(figures, result, {label: self.config.task}, outcomes)

    def samples(self, output: EvalOutput) -> list[dict[str, Any]]:
        """One record per request this rank scored: the texts, the loglikelihood (and its unconditional one),
        the continuation's tokens, whether it was the greedy one and whether it is gold."""
        return sample_records(output.detail) if isinstance(output.detail, TaskResult) else []


def check_finite_documents(title: str, figures: dict[str, float], *, strict: bool) -> None:
    """Say when documents were left out because their scores were not finite (NaN or inf logits): the
    figures are then over a subset of the task. With `strict` that fails the task (on every rank alike:
    the counts are synced)."""
    bad = int(figures.get("n_nonfinite_docs", 0))
    if not bad:
        return
    scored = int(figures.get("n_docs", 0))
    message = (
        f"{title}: {bad} documents had scores that are not finite (NaN or inf logits) and were left out; "
        f"its figures are over the other {scored} documents only"
    )
    if strict:
        raise ModelOutputError(message + " (strict: the task fails)")
    log.warning("%s", message)


def warn_single_choice(title: str, docs: list[Doc], metrics: tuple[str, ...]) -> None:
    """Say when documents have a single choice under figures that compare choices: those figures are
    perfect on them whatever the model does (`inloop-eval lint` lists them as errors)."""
    single = sum(1 for d in docs if d.n_choices < 2)
    comparing = comparing_choices(metrics)
    if single and comparing:
        log.warning(
            "%s: %d of %d documents have a single choice, so %s are perfect on them whatever the model does "
            "(`inloop-eval lint` lists them)",
            title,
            single,
            len(docs),
            comparing,
        )


def task_figures(prepared: PreparedTask, computed: dict[str, float]) -> dict[str, float]:
    """The metric's figures with what preparing counted: documents left out by `subset_num_batches` in
    `n_skipped_docs`, and documents given fewer few-shot examples than asked."""
    figures = dict(computed)
    if "n_skipped_docs" in figures:
        figures["n_skipped_docs"] += prepared.dataset.n_left_out
    if prepared.n_fewshot_short_docs is not None:
        figures["n_fewshot_short_docs"] = float(prepared.n_fewshot_short_docs)
    return figures




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


def plan(
    prepared: PreparedTask, pair_ids: np.ndarray, shape: BatchShape, data_parallel: tuple[int, int]
) -> list[Batch]:
    """This rank's batches for `pair_ids` (its share, which the data-parallel size and rank decide), in the
    batch `shape` the adapter needs, planned at the task's first evaluation and reused by the later ones
    (planning a large task takes a CPU-second)."""
    key = (*data_parallel, shape)
    if key not in prepared.plans:
        prepared.plans[key] = plan_batches(
            prepared.pairs, pair_ids, prepared.config.batch_tokens, shape, max_length=prepared.max_length
        )
    return prepared.plans[key]


def rank_share(prepared: PreparedTask, dp_size: int, dp_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's request rows (its documents, by the DistributedSampler over the data-parallel group of
    `dp_size` ranks) and unconditional pairs (every dp_size-th of those the evaluated documents need); the
    ranks of one model-parallel group, which share a data-parallel rank, get the same."""
    rows = rank_rows(prepared.dataset, shard_documents(prepared.dataset, dp_size, dp_rank))
    uncond_ids = prepared.dataset.uncond_ids()[dp_rank::dp_size]
    return rows, uncond_ids


def check_vocabulary(
    context: EvalContext, prepared: PreparedTask, pair_ids: np.ndarray, *, min_vocab: int = 0
) -> None:
    """Token ids the model cannot take are an error naming the first document that holds one, raised
    before the first forward: fed to the model, such an id fails inside the embedding (on CUDA a
    device-side assert that ends the process). The bound is the model's input embedding where it is
    known, else the width of its logits from a one-token probe (made on every rank alike).

    min_vocab: the tokenizer's vocabulary size, named when the probed logits are narrower.
    """
    probed = context.adapter.vocab_size is None
    vocab = context.logits_width()
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


def synced_uncond_ll(metric: ICLMetric) -> dict[int, float]:
    """Every rank's unconditional loglikelihoods by id, as the metric's latest `compute` synced them."""
    if metric.uncond_U is None:
        return {}
    uncond_id_U, ll_U = metric.uncond_U
    return dict(zip(uncond_id_U.tolist(), ll_U.tolist(), strict=True))


def sample_records(result: TaskResult) -> list[dict[str, Any]]:
    """One record per request of `result` (this rank's), in the order scored, each with its unconditional
    loglikelihood wherever a rank scored it."""
    table = result.prepared.table
    n = len(result.rows)
    own = dict(zip(result.uncond_ids.tolist(), result.scores.ll[n:].tolist(), strict=True))
    uncond_ll = result.uncond_ll | own
    records = []
    for i, row in enumerate(result.rows.tolist()):
        uid = int(table.uncond_id[row])
        records.append(
            {
                "task": result.prepared.config.label,
                "doc_id": int(table.doc_id[row]),
                "cont_id": int(table.cont_id[row]),
                "context": table.context_text[row],
                "continuation": table.continuation_text[row],
                "ll": float(result.scores.ll[i]),
                "ll_uncond": uncond_ll.get(uid) if uid >= 0 else None,
                "n_tokens": int(table.pairs.cont_len[row]),
                "is_greedy": bool(result.scores.greedy[i]),
                "gold": bool(table.is_gold[row]),
            }
        )
    return records
