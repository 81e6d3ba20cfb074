"""The trainer-facing hook: `if evaluator.should_run(step): metrics = evaluator.run(model, step=step)`.

`InLoopEvaluator` only orchestrates: it builds one evaluator per entry of the config (`kinds.KINDS` maps each
entry's `type:` to its class: downstream tasks, per-domain perplexity), and at each evaluation runs them in
order on one model adapter, with training state left as it was, each handed the same `EvalContext` (the
adapter, the data-parallel group, the batch shape, the token count); then the suite averages
(`suites.SuiteAverages`) from the tasks' per-document outcomes. Keys are named by `inloop_eval.keys`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.distributed import agreed_data_parallel, check_data_parallel
from inloop_eval.engine.adapter import TokenCount
from inloop_eval.engine.families import make_adapter
from inloop_eval.engine.training_state import training_untouched
from inloop_eval.evaluators.base import EvalOutput, Evaluator
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.kinds import KINDS
from inloop_eval.evaluators.suites import SuiteAverages
from inloop_eval.keys import PREFIX, failed_labels, key_style, metric_keys
from inloop_eval.metrics.icl import DocumentOutcomes

log = logging.getLogger(__name__)


class InLoopEvaluator:
    """Runs the configured evaluators on a model and returns `{metric key: float}`.

    evaluators: one per config entry, by name (a task's label; `lm:<labels>` for a perplexity entry).
    last_outputs: each evaluator's `EvalOutput` of the latest `run`, by name.
    finished: when (`time.perf_counter`) each prefix's latest `run_and_log` ended, set there.
    """

    def __init__(self, config: EvaluatorConfig, *, tokenizer: TokenizerLike | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else config.load_tokenizer()
        built = [KINDS[e.type](e, tokenizer=self.tokenizer, settings=config) for e in config.evaluators]
        self.evaluators: dict[str, Evaluator] = {e.name: e for e in built}
        self.suites = SuiteAverages(config.suite_average, strict=config.strict)
        self.last_outputs: dict[str, EvalOutput] = {}
        self.finished: dict[str, float] = {}
        self._tokens = TokenCount()

    @classmethod
    def from_yaml(cls, path: str | Path, **kwargs: Any) -> InLoopEvaluator:
        return cls(EvaluatorConfig.from_yaml(path), **kwargs)

    def should_run(self, step: int) -> bool:
        return step % self.config.eval_interval == 0

    def run(
        self,
        model: Any,
        step: int | None = None,
        progress: Callable[[int], None] | None = None,
        *,
        prefix: str = PREFIX,
        dp_group: ProcessGroup | DeviceMesh | None = None,
    ) -> dict[str, float]:
        """Run every evaluator; returns their figures under their keys, in the config's order
        (`eval/downstream/...`, `eval/lm/...`).

        Under torch.distributed every rank calls this with its part of the model; training state is left
        as it was (`training_untouched`), and `compiler_reset` drops torch.compile's graphs afterwards.
        step: logged with the figures. progress: called with the requests of each batch scored.
        prefix: the first part of every key (`eval`; e.g. `eval/merged` for merged weights).
        dp_group: the data-parallel group, over which documents are sharded and metrics reduced, when the
            model is split across ranks (tensor, context or pipeline parallel): its ProcessGroup (OLMo-core's
            `train_module.dp_process_group`), or a DeviceMesh (its dimensions named "dp", or
            "dp_replicate"/"dp_shard"; or a one-dimensional data-parallel submesh). None: the whole world,
            every rank a data-parallel replica (DDP, FSDP); refused (ConfigError) for a model with DTensor
            parameters on a model-parallel mesh dimension. Failures are still agreed world-wide.
        """
        group = agreed_data_parallel(dp_group, self.config.agreed_settings())
        adapter = make_adapter(model, self.config.max_length)
        check_data_parallel(adapter.model, group, adapter.needs.peer_groups)
        self._tokens = TokenCount()
        context = self.config.eval_context(adapter, group, self._tokens, progress)
        try:
            with training_untouched(adapter.model):
                self.last_outputs = {name: e.run(context) for name, e in self.evaluators.items()}
        finally:
            if self.config.compiler_reset:
                torch.compiler.reset()
        if context.kernel is not None:
            log.info("%s", context.kernel.summary())
        metrics: dict[str, float] = {}
        style = key_style(self.config.key_style)
        for name, output in self.last_outputs.items():
            kind = self.evaluators[name].kind
            metrics.update(metric_keys(kind, output.figures, output.sources, style, prefix))
        metrics.update(self.suites.compute(self.task_outcomes(), prefix))
        if step is not None:
            log.info("%s", summary_line(step, metrics, self.tokens_forwarded, prefix))
        return metrics

    def task_outcomes(self) -> dict[str, DocumentOutcomes]:
        """label -> per-document outcomes of each task of the latest `run` (the same on every rank)."""
        return {label: o for output in self.last_outputs.values() for label, o in output.outcomes.items()}

    @property
    def tokens_forwarded(self) -> int:
        """Tokens this rank sent through the model in the latest `run`, padding and dummies included: every
        forward of every evaluator, those of an evaluator that then failed too, and the vocabulary probe of a
        model of unknown vocabulary."""
        return self._tokens.total

    def detail(self, name: str) -> Any:
        """The latest result object of the evaluator `name` (scores per request or sequence), or None
        when it failed or has not run."""
        output = self.last_outputs.get(name)
        return output.detail if output is not None else None

    def outcomes(self) -> dict[str, DocumentOutcomes]:
        """label -> per-document outcomes of each task of the latest `run` (the same on every rank), for
        `MetricsLogger.log_outcomes`, then each suite average's (under `keys.suite_outcomes_label`); {} when
        the config's `outcomes` is off. Failed tasks and suites have none."""
        if not self.config.outcomes:
            return {}
        return {**self.task_outcomes(), **self.suites.last}

    def samples(self, name: str | None = None) -> list[dict[str, Any]]:
        """This rank's record of each request scored in the latest `run` (texts, loglikelihoods, greedy,
        gold; see `DownstreamEvaluator.samples`), of the evaluator `name` or of all, in the config's order.
        Kinds without requests (perplexity), and evaluators that failed or have not run, have none."""
        names = list(self.last_outputs) if name is None else [name]
        return [
            record
            for n in names
            if n in self.last_outputs
            for record in self.evaluators[n].samples(self.last_outputs[n])
        ]


def summary_line(step: int, metrics: dict[str, float], tokens_forwarded: int, prefix: str = PREFIX) -> str:
    """One short log line per evaluation (the figures themselves go to the loggers): how many figures, how
    many tokens this rank forwarded, and the evaluations that failed, by name."""
    failed = failed_labels(metrics, prefix)
    line = f"step {step}: {len(metrics)} figures, {tokens_forwarded} tokens forwarded on this rank"
    return line + (f"; failed: {', '.join(failed)}" if failed else "")
