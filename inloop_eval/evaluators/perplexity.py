"""The perplexity evaluator (`type: lm`): perplexity per domain label, figures `ce`, `ppl`, `bpb` under each
label (`eval/lm/<label>/<figure>`); a `documents` label (OLMo-core's padded documents) adds OLMo-core's
`olmo_ce_loss` and `olmo_ppl`, under OLMo-core's keys `eval/lm/<label>/CE loss` and `PPL` with `key_style:
olmo_core`.

One evaluation reads top to bottom: every label's sequences, this rank's share of them, token-budget batches
(as many on every rank), per-token log-probabilities in float32 summed per sequence, one metric per label
updated and synced in the config's order.
Legend: S sequences, G sequences of all labels together, B rows in a batch, T longest row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar

import numpy as np
import torch

from inloop_eval.config_fields import AtLeast, check_fields, repeated
from inloop_eval.data.perplexity.documents import LoaderSelection, loader_selection
from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.data.perplexity.domain_set import DomainSet
from inloop_eval.data.perplexity.loading import load_domains
from inloop_eval.data.perplexity.token_bytes import token_byte_lengths
from inloop_eval.data.root import home
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.distributed import TaskAgreement, TaskFailedOnAnotherRank
from inloop_eval.engine.batching import Batch, BatchShape, plan_sequence_batches
from inloop_eval.engine.evaluation import EvalContext, Share, score_share
from inloop_eval.engine.sharding import deal_longest_first
from inloop_eval.errors import ConfigError, LMDataError, ModelOutputError
from inloop_eval.evaluators.base import EvalOutput, Evaluator, Settings, check_entry_type, metric_class
from inloop_eval.keys import FAILED, PERPLEXITY
from inloop_eval.metrics.perplexity import FIGURES, padded_documents_perplexity

if TYPE_CHECKING:
    from inloop_eval.metrics.perplexity_metric import PerplexityMetric

log = logging.getLogger(__name__)

# A label's torchmetrics Metric, by path: its module is imported at the first evaluation (`metric_class`).
PERPLEXITY_METRIC = "inloop_eval.metrics.perplexity_metric.PerplexityMetric"


@dataclass(kw_only=True)
class LMEvalConfig:
    """An evaluator of type `lm`: perplexity per domain label on held-out data (`eval/lm/<label>/...`)."""

    type: str = "lm"
    """Evaluator type; always `lm` for this class."""
    domains: list[LMDomainConfig] = field(default_factory=list)
    """The domain sets, each with its label; reported in this order."""
    seq_len: Annotated[int, AtLeast(2)] = 1024
    """Tokens per sequence: memmap files are cut into sequences of this length; text documents into
    windows of at most this length. A sequence of L tokens predicts L - 1 of them."""
    batch_tokens: Annotated[int, AtLeast(1)] = 8192
    """Token budget of one forward pass (rows x longest row); at least `seq_len`."""
    max_tokens: Annotated[int, AtLeast(1)] | None = None
    """Cap on the predicted tokens of each domain (whole sequences, a fixed seeded choice); null: all."""
    cache_dir: str | None = None
    """Where tokenized text domains are cached; default `<home>/lm_cache` (`$INLOOP_EVAL_HOME`)."""
    loader_batch_instances: Annotated[int, AtLeast(1)] | None = None
    """Score only the `documents` sequences that OLMo-core's evaluation data loader reaches with this many
    sequences per global batch, as its `LMEvaluatorCallbackConfig` does: the sequences of every `documents`
    domain, end to end in config order, shuffled (`loader_seed`) and cut to whole batches. null: all."""
    loader_seed: Annotated[int, AtLeast(0)] = 0
    """With `loader_batch_instances`: the seed of OLMo-core's data loader (its order is epoch 1's shuffle)."""
    loader_max_batches: Annotated[int, AtLeast(1)] | None = None
    """With `loader_batch_instances`: the batches OLMo-core stops after (its `eval_duration`); null: all."""

    labels_name: ClassVar[str] = "lm domain labels"

    def __post_init__(self) -> None:
        check_entry_type(self, "lm evaluator")
        check_fields(self, "lm evaluator")
        if not self.domains:
            raise ConfigError(
                "lm evaluator: `domains` must list at least one domain, e.g. "
                "[{label: code, paths: [data/code/*.npy]}]"
            )
        labels = [d.label for d in self.domains]
        duplicated = repeated(labels)
        if duplicated:
            raise ConfigError(f"lm evaluator: domain labels must be unique; repeated: {duplicated}")
        if self.batch_tokens < self.seq_len:
            raise ConfigError(
                f"lm evaluator: batch_tokens ({self.batch_tokens}) must be >= seq_len ({self.seq_len}) so "
                "that a whole sequence fits in one forward pass"
            )
        self.check_loader_fields()
        for d in self.domains:
            cap = self.cap(d)
            if cap is not None and cap < self.seq_len - 1:
                raise ConfigError(
                    f"lm domain {d.label!r}: max_tokens ({cap}) must be >= seq_len - 1 ({self.seq_len - 1}), "
                    "the tokens one sequence predicts"
                )

    def check_loader_fields(self) -> None:
        """`loader_*` fields need `documents` domains, and a token cap would change what the loader reaches."""
        documents = self.documents_labels()
        if self.loader_batch_instances is None:
            if self.loader_max_batches is not None:
                raise ConfigError("lm evaluator: loader_max_batches applies with loader_batch_instances only")
            return
        if not documents:
            raise ConfigError(
                "lm evaluator: loader_batch_instances selects sequences of `documents` domains, and this "
                f"evaluator has none (formats: {sorted({d.format for d in self.domains})})"
            )
        capped = [d.label for d in self.domains if d.format == "documents" and self.cap(d) is not None]
        if capped:
            raise ConfigError(
                f"lm evaluator: max_tokens cannot cap `documents` domains {capped} with "
                "loader_batch_instances (the data loader it reproduces decides which documents are scored)"
            )

    def labels(self) -> list[str]:
        return [d.label for d in self.domains]

    def documents_labels(self) -> list[str]:
        """The labels of the `documents` domains, in order: those with the padded documents' figures."""
        return [d.label for d in self.domains if d.format == "documents"]

    def cap(self, domain: LMDomainConfig) -> int | None:
        """The token cap that applies to `domain`: its own, else the evaluator's."""
        return domain.max_tokens if domain.max_tokens is not None else self.max_tokens


@dataclass
class PreparedDomains:
    """An `lm` entry's domain sets for one evaluation, in the config's order; `failed` holds the labels that
    could not be loaded this time (label -> reason)."""

    config: LMEvalConfig
    domains: list[DomainSet]
    failed: dict[str, str]


@dataclass
class Shard:
    """This rank's sequences: label index and sequence index of each, in a fixed global order."""

    domain_S: np.ndarray
    seq_S: np.ndarray


@dataclass
class DomainsResult:
    """One evaluation of an `lm` entry.

    figures: label -> {ce, ppl, bpb} over all ranks (labels without tokens are absent).
    totals: label -> (Σ nll, Σ tokens, Σ bytes) over all ranks.
    domains: the domain sets evaluated; failed: label -> reason for those the model could not take.
    shard, nll_S: this rank's sequences (indexing `domains`) and the summed NLL of each (nats, float64).
    tokens_forwarded: tokens this rank sent through the model, padding and dummies included.
    """

    figures: dict[str, dict[str, float]]
    totals: dict[str, tuple[float, int, int]]
    domains: list[DomainSet]
    failed: dict[str, str]
    shard: Shard
    nll_S: np.ndarray
    tokens_forwarded: int


class PerplexityEvaluator(Evaluator[LMEvalConfig, PreparedDomains]):
    """A `type: lm` entry: perplexity per domain label; keeps the domain sets it loaded between evaluations
    (`loaded`, label -> sequences, the same labels on every rank) and tries the others again at each."""

    kind = PERPLEXITY
    config_class = LMEvalConfig

    def __init__(self, config: LMEvalConfig, *, tokenizer: TokenizerLike, settings: Settings) -> None:
        super().__init__(config, tokenizer=tokenizer, settings=settings)
        self.name = "lm:" + ",".join(self.labels)
        self.loaded: dict[str, DomainSet] = {}

    def title(self) -> str:
        return f"lm {','.join(self.labels)}"

    def prepare(self, context: EvalContext, agreement: TaskAgreement) -> PreparedDomains:
        """The domain sets to evaluate: those loaded at an earlier evaluation, and the others loaded (for text,
        tokenized and cached) now. Every rank ends with the same
        labels: a label that failed on any rank is dropped on all (`load_domains` agrees it), logged,
        reported as failed, and tried again at the next evaluation (a file back after a file system's
        hiccup). With `strict` such a failure raises on every rank: its own error where it failed,
        TaskFailedOnAnotherRank elsewhere."""
        ev = self.config
        pending = [d.label for d in ev.domains if d.label not in self.loaded]
        errors = self.load_pending(pending) if pending else {}
        for exc in errors.values():
            log.error("in-loop lm eval: %s", exc)
        if errors and context.strict:
            agreement.failure_agreed()  # every rank raises here, so none may wait at another point
            own = [e for e in errors.values() if not isinstance(e, TaskFailedOnAnotherRank)]
            raise (own or list(errors.values()))[0]
        domains = [self.loaded[d.label] for d in ev.domains if d.label in self.loaded]
        return PreparedDomains(ev, domains, {label: str(exc) for label, exc in errors.items()})

    def load_pending(self, pending: list[str]) -> dict[str, Exception]:
        """Load (for text, tokenize and cache) the domain labels `pending` into `loaded`; returns the labels
        that failed on any rank, with the reason (the same labels on every rank)."""
        ev = self.config
        cache_dir = Path(ev.cache_dir).expanduser() if ev.cache_dir else home() / "lm_cache"
        configs = [d for d in ev.domains if d.label in pending]
        byte_table = token_byte_lengths(self.tokenizer)
        result = load_domains(configs, ev.seq_len, ev.cap, self.tokenizer, byte_table, cache_dir)
        for domain in result.domains.values():
            log.info("lm domain %r: %d sequences, %d tokens", domain.label, len(domain), domain.n_tokens)
        self.loaded.update(result.domains)
        # The `documents` labels load together (all pending or none), and are cut to the loader's share once.
        if ev.loader_batch_instances is not None and set(ev.documents_labels()) <= set(pending):
            selection = LoaderSelection(ev.loader_batch_instances, ev.loader_seed, ev.loader_max_batches)
            self.keep_loader_sequences(selection, result.errors)
        return result.errors

    def keep_loader_sequences(self, selection: LoaderSelection, errors: dict[str, Exception]) -> None:
        """Cut the loaded `documents` domains to the sequences OLMo-core's data loader reaches: all of them
        together, so that when one failed to load (every rank agreed it), the others fail with it, named in
        `errors`, and are loaded again at the next evaluation."""
        labels = self.config.documents_labels()
        failed = [label for label in labels if label in errors]
        try:
            if failed:
                raise LMDataError(
                    f"the evaluation data loader shuffles the documents of labels {labels} together, and {failed} "
                    "could not be loaded; none is evaluated this time"
                )
            kept = loader_selection([len(self.loaded[label]) for label in labels], labels, selection)
        except LMDataError as exc:
            for label in labels:
                self.loaded.pop(label, None)
                errors.setdefault(label, exc)
            return
        for label, keep in zip(labels, kept, strict=True):
            self.loaded[label] = self.loaded[label].select(keep)
            log.info("lm domain %r: %d sequences reached by the evaluation data loader", label, len(keep))

    def evaluate(self, context: EvalContext, prepared: PreparedDomains, agreement: TaskAgreement) -> EvalOutput:
        """Score this rank's share of every domain the model can take and compute each label's figures over
        the data-parallel group."""
        domains, failed = usable_domains(context, prepared)
        shard = rank_share(domains, *context.data_parallel)
        batches = plan_sequences(domains, shard, prepared.config, context.shape)
        describe = lambda p: domains[int(shard.domain_S[p])].describe(int(shard.seq_S[p]))  # noqa: E731
        scores = score_share(context, agreement, self.title(), Share(batches, len(shard.seq_S), describe))
        nll_S = -scores.ll
        padded_labels = set(prepared.config.documents_labels())
        figures, totals = domain_figures(context, domains, shard, nll_S, padded_labels)
        check_finite_labels(self.title(), domains, shard, nll_S, totals, strict=context.strict)
        result = DomainsResult(figures, totals, domains, failed, shard, nll_S, scores.tokens_forwarded)
        return EvalOutput(self.label_figures(prepared, result), result)

    def label_figures(self, prepared: PreparedDomains, result: DomainsResult) -> dict[str, dict[str, float]]:
        """Every label's figures, in the config's order: `failed = 1` for a label that could not be loaded or
        that the model cannot take, and `ce`, `ppl`, `bpb` for a label that has tokens."""
        out: dict[str, dict[str, float]] = {}
        for label in self.labels:
            figures = {FAILED: 1.0} if label in prepared.failed or label in result.failed else {}
            figures.update(result.figures.get(label, {}))
            if figures:
                out[label] = figures
        return out


def domain_figures(
    context: EvalContext,
    domains: list[DomainSet],
    shard: Shard,
    nll_S: np.ndarray,
    padded_labels: set[str] | frozenset[str] = frozenset(),
) -> tuple[dict[str, dict[str, float]], dict[str, tuple[float, int, int]]]:
    """Each label's figures over all ranks (labels without tokens left out) and its totals (Σ nll, Σ tokens,
    Σ bytes), from this rank's summed NLL of each of its sequences, over the data-parallel group. Every rank
    of it updates every label, zeros included, and syncs them all in one all-reduce. The labels
    `padded_labels` (padded documents) add the padded documents' figures, whose positions (Σ length over the label's sequences) every
    rank knows without a collective."""
    metric_type: type[PerplexityMetric] = metric_class(PERPLEXITY_METRIC)
    metrics: list[PerplexityMetric] = []
    for d, domain in enumerate(domains):
        mine = shard.domain_S == d
        seqs = shard.seq_S[mine]
        # synced by compute_labels, all labels in one all-reduce; alone, no collective at all
        metric = metric_type(process_group=context.dp_group, sync_on_compute=False).to(context.adapter.device)
        metric.update(
            torch.from_numpy(nll_S[mine]),
            torch.from_numpy(domain.length_S[seqs] - 1),
            torch.from_numpy(domain.bytes_S[seqs]),
        )
        metrics.append(metric)
    computed_labels = metric_type.compute_labels(metrics, context.dp_group, syncing=context.data_parallel[0] > 1)
    figures: dict[str, dict[str, float]] = {}
    totals: dict[str, tuple[float, int, int]] = {}
    for domain, computed in zip(domains, computed_labels, strict=True):
        totals[domain.label] = (computed["sum_nll"], int(computed["n_tokens"]), int(computed["n_bytes"]))
        if computed["n_tokens"] > 0:
            figures[domain.label] = {k: v for k, v in computed.items() if k in FIGURES}
        if domain.label in padded_labels:
            padded = padded_documents_perplexity(computed["sum_nll"], int(domain.length_S.sum()))
            figures.setdefault(domain.label, {}).update(padded)
    return figures, totals


def check_finite_labels(
    title: str,
    domains: list[DomainSet],
    shard: Shard,
    nll_S: np.ndarray,
    totals: dict[str, tuple[float, int, int]],
    *,
    strict: bool,
) -> None:
    """Say which labels' figures are not finite because sequences' NLL was not (NaN or inf logits): their
    ce, ppl and bpb are then NaN or inf (null in `metrics.jsonl`). The totals are synced, so every rank finds
    the same labels (and with `strict` raises alike); the count of sequences is this rank's own."""
    for d, domain in enumerate(domains):
        sum_nll, n_tokens, _ = totals[domain.label]
        if n_tokens == 0 or np.isfinite(sum_nll):
            continue
        bad = int((~np.isfinite(nll_S[shard.domain_S == d])).sum())
        message = (
            f"{title}: label {domain.label!r}: the NLL of {bad} of this rank's sequences is not finite (NaN or "
            "inf logits), so its ce, ppl and bpb are not finite"
        )
        if strict:
            raise ModelOutputError(message + " (strict: the evaluation fails)")
        log.warning("%s", message)


def usable_domains(context: EvalContext, prepared: PreparedDomains) -> tuple[list[DomainSet], dict[str, str]]:
    """The domains whose token ids the model's vocabulary holds, and the others (label -> reason;
    raised when `strict`). Checked on every rank alike before any forward, as is the context length."""
    ev, max_length = prepared.config, context.max_length
    if max_length is not None and ev.seq_len > max_length:
        labels = [d.label for d in ev.domains]
        raise ConfigError(
            f"lm evaluator {labels}: seq_len {ev.seq_len} is longer than the model's context of "
            f"{max_length} tokens; lower seq_len"
        )
    vocab = context.logits_width()
    usable: list[DomainSet] = []
    failed: dict[str, str] = {}
    for domain in prepared.domains:
        if domain.max_token_id < vocab:
            usable.append(domain)
            continue
        error = LMDataError(
            f"{domain.describe(domain.max_token_seq)}: token id {domain.max_token_id} is beyond the "
            f"model's vocabulary of {vocab}; the data was tokenized for another model"
        )
        if context.strict:
            raise error
        log.error("in-loop lm eval: %s", error)
        failed[domain.label] = str(error)
    return usable, failed


def rank_share(domains: list[DomainSet], dp_size: int, dp_rank: int) -> Shard:
    """This rank's sequences of every label (`sharding.deal_longest_first` over the data-parallel group; the
    ranks of one model-parallel group, which share a data-parallel rank, get the same)."""
    domain_G = np.concatenate([np.full(len(d), i, dtype=np.int64) for i, d in enumerate(domains)] or [[]])
    seq_G = np.concatenate([np.arange(len(d), dtype=np.int64) for d in domains] or [[]])
    length_G = np.concatenate([d.length_S for d in domains] or [[]])
    mine = deal_longest_first(length_G, dp_size, dp_rank)
    return Shard(domain_G[mine].astype(np.int64), seq_G[mine].astype(np.int64))


def plan_sequences(domains: list[DomainSet], shard: Shard, config: LMEvalConfig, shape: BatchShape) -> list[Batch]:
    """This rank's batches of whole sequences (`batching.plan_sequence_batches`), at most `batch_tokens`
    padded tokens each, widths rounded to the batch shape's multiple but not past `seq_len`;
    `Batch.pair_N` indexes the shard's sequences."""
    length_S = np.array(
        [domains[d].length_S[s] for d, s in zip(shard.domain_S, shard.seq_S, strict=True)], dtype=np.int64
    )
    return plan_sequence_batches(
        length_S,
        lambda p: domains[int(shard.domain_S[p])].sequence(int(shard.seq_S[p])),
        config.batch_tokens,
        max_length=config.seq_len,
        pad_to_multiple=shape.width_multiple,
    )
