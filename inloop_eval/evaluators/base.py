"""What every kind of evaluator is: built from its config entry, prepared once, evaluated at each evaluation,
and answering with bare figure names per label (`EvalOutput`). The orchestrator
(`inloop_eval.evaluators.orchestrator.InLoopEvaluator`) only loops over them and names the figures' keys
(`inloop_eval.keys`); `inloop_eval.evaluators.kinds` maps each config `type:` to its evaluator class.

What one evaluation hands every evaluator is in the open, in one `EvalContext` (`engine/evaluation.py`): the
model's adapter, the data-parallel group documents are sharded and metrics reduced over, the batch shape the
planner must honour, the count of tokens forwarded, `strict` and the progress callback. Nothing is read from a
global. Every kind deals its work to this rank, plans it, and scores it through the one call
`engine.evaluation.score_share` (equalize, run, agree), so a kind is only what it scores and plans and how it
reduces the scores.

What a kind promises, and the orchestrator relies on:
- `run` is called by every rank, with the same config, in the same order as the other evaluators; it makes
  the same collectives on every rank, and its figures are the same on every rank (synced).
- The agreement's points are the skeleton's (`run`): one after `prepare`, then those of `score_share`
  (planning, between forwards, after the last) and the last; a kind joins more only where it exchanges a
  value every rank needs in the same place (whether rank 0 wrote the request cache, a fingerprint), never to
  balance another path's count (`inloop_eval.distributed`).
- A failure raised by either step, on any rank, is agreed by all ranks in `run` (`run_agreed`): all report
  `failed = 1` for each of the entry's labels, or all raise when `strict`. A kind whose labels may fail one
  by one (perplexity domains) reports `failed = 1` for those labels itself and raises them when `strict`.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from inloop_eval.config_fields import shown
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.distributed import TaskAgreement, run_agreed
from inloop_eval.engine.evaluation import EvalContext
from inloop_eval.errors import ConfigError
from inloop_eval.keys import FAILED
from inloop_eval.metrics.icl import DocumentOutcomes


class Settings(Protocol):
    """What an evaluator reads of the whole evaluator config (`EvaluatorConfig`)."""

    data_root: str | None


class KindConfig(Protocol):
    """What every kind's config class (an entry of the config's `evaluators:` list) has.

    type: the `type:` that selects the kind in YAML; the default of the class's `type` field (`entry_type`).
    labels_name: what its labels are, in the error naming repeated ones (e.g. "lm domain labels").
    """

    type: str
    labels_name: ClassVar[str]

    def labels(self) -> list[str]:
        """The labels the entry reports under (`<prefix>/<kind>/<label>/...`), in order."""
        ...


def entry_type(config_class: type) -> str:
    """The `type:` that selects `config_class` in a config: the default of its `type` field (the default
    `inloop_eval.config_fields` builds a mapping by)."""
    return next(f.default for f in dataclasses.fields(config_class) if f.name == "type")


def metric_class(path: str) -> type:
    """The class at import path `path` (`package.module.Class`), its module imported now. A kind names its
    torchmetrics `Metric` by path and builds it in `evaluate`, so that importing and building evaluators
    load no torchmetrics (whose package import pulls in transformers, `scipy.signal` and matplotlib where
    installed: seconds per process); the first evaluation does."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def check_entry_type(config: Any, where: str) -> None:
    """ConfigError unless the entry `config`'s `type` is its class's own (`entry_type`); `where` names the
    entry. (A mapping read from a config is built into the class its `type:` selects; this catches a class
    built directly with another type.)"""
    expected = entry_type(type(config))
    if config.type != expected:
        raise ConfigError(f"{where}: type must be {expected!r}, found {shown(config.type)}")


@dataclass
class EvalOutput:
    """One evaluator's answer to one evaluation, in bare figure names.

    figures: label -> {figure: value}, labels in the entry's order, the same on every rank (synced); a
        label whose evaluation failed holds `{keys.FAILED: 1.0}`.
    detail: the evaluator's own result object (scores per request or per sequence), None after a failure.
    sources: label -> what it measures, for a key style to name its figures by (a downstream label's task
        id); a label absent measures itself.
    outcomes: label -> the per-document values its figures are the means of (the same on every rank), for
        the kinds that keep them (downstream tasks).
    """

    figures: dict[str, dict[str, float]]
    detail: Any = None
    sources: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, DocumentOutcomes] = field(default_factory=dict)


ConfigT = TypeVar("ConfigT", bound=KindConfig)
PreparedT = TypeVar("PreparedT")


class Evaluator(Generic[ConfigT, PreparedT]):
    """One entry of the config's `evaluators:` list. A kind sets `kind` and `config_class`, and implements
    `prepare` and `evaluate`; `run` is the same for every kind.

    config: the entry; settings: the whole evaluator config (data root, ...).
    name: unique among the entries (a task's label; for other kinds, their own).
    labels: the labels the entry reports, in order.
    """

    kind: ClassVar[str]
    """The second part of its keys (`keys.DOWNSTREAM`, `keys.PERPLEXITY`)."""
    config_class: ClassVar[type]
    """Its config entry class; its `type` field's default selects it in a config."""
    name: str

    def __init__(self, config: ConfigT, *, tokenizer: TokenizerLike, settings: Settings) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.settings = settings
        self.labels: tuple[str, ...] = tuple(config.labels())

    def prepare(self, context: EvalContext, agreement: TaskAgreement) -> PreparedT:
        """What the evaluation needs that does not change between evaluations (documents, tokenized
        requests), loaded once and reused; `run` joins an agreement point after it on every rank. The adapter's
        context length decides how requests are cut; `context.strict` raises a failure of one label rather
        than reporting it (kinds whose labels fail one by one)."""
        raise NotImplementedError

    def evaluate(self, context: EvalContext, prepared: PreparedT, agreement: TaskAgreement) -> EvalOutput:
        """Score this rank's share of `prepared` and compute the figures over all ranks of the data-parallel
        group, joining the same agreement points on every rank."""
        raise NotImplementedError

    def run(self, context: EvalContext) -> EvalOutput:
        """Prepare and evaluate once. Under torch.distributed every rank calls this; a failure on any rank is
        agreed by all (`inloop_eval.distributed.run_agreed`): all report `failed = 1` for every label, or all
        raise when `strict`."""

        def body(agreement: TaskAgreement) -> EvalOutput:
            prepared = self.prepare(context, agreement)
            agreement.agree()  # prepared on every rank: a failure in preparing stops all before any forward
            return self.evaluate(context, prepared, agreement)

        output = run_agreed(self.title(), body, strict=context.strict)
        if output is None:
            return EvalOutput({label: {FAILED: 1.0} for label in self.labels})
        return output

    def title(self) -> str:
        """The entry as logs and errors name it, e.g. `task 'piqa'`."""
        return self.name

    def samples(self, output: EvalOutput) -> list[dict[str, Any]]:
        """This rank's record of each request scored in `output` (this evaluator's latest answer), for
        `inloop-eval evaluate --samples`; [] for a kind without per-request records."""
        return []
