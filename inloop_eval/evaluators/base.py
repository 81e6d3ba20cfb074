"""What every kind of evaluator is: built from its config entry, run on a model adapter, and answering with
`EvalOutput`. The orchestrator (`inloop_eval.evaluators.orchestrator.InLoopEvaluator`) only loops over them; a new kind of
evaluation is one new module with a config class and an `Evaluator` subclass, and one entry in the
orchestrator's table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.engine.adapters import ModelAdapter


class Settings(Protocol):
    """What an evaluator reads of the whole evaluator config (`EvaluatorConfig`)."""

    data_root: str | None
    key_style: str


@dataclass
class EvalOutput:
    """One evaluator's answer to one evaluation.

    metrics: `{key: float}`, the same on every rank (synced); a failure is `<prefix>/<label>/failed = 1`.
    tokens_forwarded: tokens this rank sent through the model, padding and dummy batches included.
    detail: the evaluator's own result object (scores per request or per sequence), None after a failure.
    """

    metrics: dict[str, float]
    tokens_forwarded: int = 0
    detail: Any = None


class Evaluator:
    """One entry of the config's `evaluators:` list.

    config: the entry; settings: the whole evaluator config (data root, key style, ...).
    name: unique among the entries (a task's label; for other kinds, their own).
    Subclasses keep what they loaded between evaluations, and make the same collectives on every rank.
    """

    name: str

    def __init__(self, config: Any, *, tokenizer: TokenizerLike, settings: Settings) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.settings = settings

    def run(
        self, adapter: ModelAdapter, *, strict: bool, progress: Callable[[int], None] | None = None
    ) -> EvalOutput:
        """Evaluate the model once. Under torch.distributed every rank calls this; a failure on any rank is
        agreed by all (`inloop_eval.distributed.run_agreed`): all report it in the metrics, or all raise when
        `strict`."""
        raise NotImplementedError
