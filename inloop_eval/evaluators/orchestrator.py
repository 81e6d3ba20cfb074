"""The trainer-facing hook: `if evaluator.should_run(step): metrics = evaluator.run(model, step=step)`.

`InLoopEvaluator` only orchestrates: it builds one evaluator per entry of the config (`kinds.KINDS` maps each
entry's `type:` to its class: downstream tasks, per-domain perplexity), and at each evaluation runs them in
order on one model adapter, with training state left as it was, and names their figures' keys
(`metric_keys`, through `inloop_eval.keys`). After them it computes the config's suite averages
(`suite_average:`, `inloop_eval.metrics.suite`) from the tasks' per-document outcomes, which every rank holds
after the sync, so the averages need no collective of their own.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from inloop_eval.data.root import default_data_root
from inloop_eval.data.tokenizer import TokenizerLike
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.distributed import check_data_parallel, evaluating_over, resolve_data_parallel
from inloop_eval.engine.adapters import make_adapter
from inloop_eval.engine.training_state import training_untouched
from inloop_eval.errors import ConfigError
from inloop_eval.evaluators.base import EvalOutput, Evaluator
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.evaluators.kinds import KINDS
from inloop_eval.keys import (
    FAILED,
    PREFIX,
    SUITE,
    failed_labels,
    figure_key,
    olmo_core_figure_key,
    suite_outcomes_label,
)
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.metrics.suite import CENTERED_ACC, SuiteAverageError, suite_average

log = logging.getLogger(__name__)


class InLoopEvaluator:
    """Runs the configured evaluators on a model and returns `{metric key: float}`.

    evaluators: one per config entry, by name (a task's label; `lm:<labels>` for a perplexity entry).
    last_outputs: each evaluator's `EvalOutput` of the latest `run`, by name.
    """

    def __init__(self, config: EvaluatorConfig, *, tokenizer: TokenizerLike | None = None) -> None:
        self.config = config
        if tokenizer is None:
            if not config.tokenizer:
                raise ConfigError("evaluator: set `tokenizer:` in the config or pass tokenizer=")
            root = Path(config.data_root).expanduser() if config.data_root else default_data_root()
            tokenizer = find_and_load_tokenizer(config.tokenizer, root)
        self.tokenizer = tokenizer
        built = [KINDS[entry.type](entry, tokenizer=tokenizer, settings=config) for entry in config.evaluators]
        self.evaluators: dict[str, Evaluator] = {e.name: e for e in built}
        self.last_outputs: dict[str, EvalOutput] = {}
        self.last_suites: dict[str, DocumentOutcomes] = {}
        """Each suite average's per-document outcomes of the latest `run`, by its outcomes label."""
        self._tokens_forwarded = 0
        self.last_dp_group: ProcessGroup | None = None
        """The data-parallel group of the latest `run` (None: the world)."""

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
        group = resolve_data_parallel(dp_group)
        self.last_dp_group = group
        adapter = make_adapter(model, self.config.max_length)
        check_data_parallel(adapter.model, group, adapter.model_parallel_groups)
        multiple = math.lcm(self.config.pad_to_multiple, adapter.sequence_multiple)
        if multiple > 1:
            adapter.pad_to_multiple = multiple
        outputs: dict[str, EvalOutput] = {}
        # An adapter passed in keeps its counts across runs: this run's tokens are the difference.
        tokens_before = adapter.tokens_probed + adapter.tokens_scored
        try:
            with training_untouched(adapter.model), evaluating_over(group):
                for name, evaluator in self.evaluators.items():
                    outputs[name] = evaluator.run(adapter, strict=self.config.strict, progress=progress)
        finally:
            if self.config.compiler_reset:
                torch.compiler.reset()
        self.last_outputs = outputs
        self._tokens_forwarded = adapter.tokens_probed + adapter.tokens_scored - tokens_before
        metrics: dict[str, float] = {}
        for name, output in outputs.items():
            metrics.update(metric_keys(self.evaluators[name].kind, output, self.config.key_style, prefix))
        metrics.update(self.suite_metrics(prefix))
        if step is not None:
            log.info("%s", summary_line(step, metrics, self.tokens_forwarded, prefix))
        return metrics

    def suite_metrics(self, prefix: str = PREFIX) -> dict[str, float]:
        """Each suite average of the latest `run` under `<prefix>/suite/<label>/centered_acc` (and `_stderr`),
        its per-document values kept in `last_suites`; `failed = 1` for a suite one of whose tasks has no
        per-document values of its figure (the task failed), or raised when `strict`."""
        task_outcomes = {
            label: o for output in self.last_outputs.values() for label, o in output.outcomes.items()
        }
        metrics: dict[str, float] = {}
        self.last_suites = {}
        for suite in self.config.suite_average:
            try:
                average = suite_average(task_outcomes, suite.tasks, suite.figure)
            except SuiteAverageError as exc:
                if self.config.strict:
                    raise
                log.warning("suite_average %r not computed: %s", suite.label, exc)
                metrics[figure_key(SUITE, suite.label, FAILED, prefix)] = 1.0
                continue
            metrics[figure_key(SUITE, suite.label, CENTERED_ACC, prefix)] = average.value
            metrics[figure_key(SUITE, suite.label, f"{CENTERED_ACC}_stderr", prefix)] = average.stderr
            self.last_suites[suite_outcomes_label(suite.label)] = average.outcomes
        return metrics

    @property
    def tokens_forwarded(self) -> int:
        """Tokens this rank sent through the model in the latest `run`, padding and dummies included: every
        forward of every evaluator, those of an evaluator that then failed too, and the vocabulary probe of a
        model of unknown vocabulary."""
        return self._tokens_forwarded

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
        tasks = {label: o for output in self.last_outputs.values() for label, o in output.outcomes.items()}
        return {**tasks, **self.last_suites}

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


def metric_keys(kind: str, output: EvalOutput, key_style: str, prefix: str = PREFIX) -> dict[str, float]:
    """The figures of one evaluator of kind `kind` under their keys: `<prefix>/<kind>/<label>/<figure>`;
    with `key_style: olmo_core`, the OLMo figures of an `olmo:` task under OLMo-core's key instead
    (`<prefix>/downstream/<OLMo label> (<words>)`), and those of a `documents` perplexity label under its
    `LMEvaluator`'s (`<prefix>/lm/<label>/CE loss`)."""
    metrics: dict[str, float] = {}
    for label, figures in output.figures.items():
        olmo = output.olmo.get(label) if key_style == "olmo_core" else None
        for figure, value in figures.items():
            if olmo is not None and figure in olmo.figures:
                metrics[olmo_core_figure_key(kind, olmo.label, figure, prefix)] = value
            else:
                metrics[figure_key(kind, label, figure, prefix)] = value
    return metrics


def summary_line(step: int, metrics: dict[str, float], tokens_forwarded: int, prefix: str = PREFIX) -> str:
    """One short log line per evaluation (the figures themselves go to the loggers): how many figures, how
    many tokens this rank forwarded, and the evaluations that failed, by name."""
    failed = failed_labels(metrics, prefix)
    line = f"step {step}: {len(metrics)} figures, {tokens_forwarded} tokens forwarded on this rank"
    return line + (f"; failed: {', '.join(failed)}" if failed else "")
