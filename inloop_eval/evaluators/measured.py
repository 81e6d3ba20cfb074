"""An evaluation as a training loop or a trainer hook calls it: when (`EvalSchedule`: never twice at one step),
and run with its cost measured and the figures handed to a logger (`run_and_log`: `eval/seconds`,
`eval/tokens_forwarded`, in a training loop `eval/interval_seconds`, each task's per-document outcomes). Beside the orchestrator, below both the trainer
hooks (`inloop_eval.integrations`) and the checkpoint watcher (`inloop_eval.watch`), which call it alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from inloop_eval.distributed import all_reduce_sum, resolve_data_parallel
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.keys import PREFIX, interval_key, seconds_key, tokens_key


class FigureLogger(Protocol):
    """What `run_and_log` hands the figures to: any logger of `inloop_eval.loggers` (a `MetricsLogger`); one
    without `log_outcomes` is handed no outcomes."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...


class EvalSchedule:
    """When a trainer callback evaluates: at a step the evaluator's `should_run` accepts (or any step the
    callback asks for, e.g. before the first or after the last), but never twice at one step (trainers call
    several hooks at one step: a step's end and the training's end, a resumed run's start)."""

    def __init__(self, evaluator: InLoopEvaluator) -> None:
        self.evaluator = evaluator
        self.last_step: int | None = None

    def due(self, step: int, *, forced: bool = False) -> bool:
        """Whether to evaluate at `step`: `should_run(step)` (whatever it says when `forced`), and `step` not
        evaluated yet. True records `step` as evaluated."""
        if step == self.last_step or not (forced or self.evaluator.should_run(step)):
            return False
        self.last_step = step
        return True


def run_and_log(
    evaluator: InLoopEvaluator,
    model: Any,
    step: int,
    logger: FigureLogger | None = None,
    *,
    prefix: str = PREFIX,
    dp_group: ProcessGroup | DeviceMesh | None = None,
    progress: Callable[[int], None] | None = None,
    in_training: bool = True,
) -> dict[str, float]:
    """`evaluator.run(model, step=step, prefix=prefix, dp_group=dp_group, progress=progress)` plus `eval/seconds` (wall time of
    the call) and `eval/tokens_forwarded`, logged at `step`, with each task's per-document outcomes
    (`logger.log_outcomes`, unless the config's `outcomes` is off). Every rank must call it (the evaluator
    and the token count sync across ranks).

    `eval/tokens_forwarded` counts the tokens of every batch sent through the model once, padding and dummies
    included: the sum over the data-parallel group. The ranks of a model-parallel group (tensor or context
    parallel peers) forward the same batches together, so it is not summed over them: each batch counts
    once, whatever the parallelism, and the figure is that of one process forwarding the same batches.
    prefix: the first part of every key (`eval`; `eval/merged` for OLMo-core's merged weights).
    dp_group: the data-parallel group of a model split over ranks (`InLoopEvaluator.run`'s); None: the world.
    progress: called with the requests of each batch scored (`InLoopEvaluator.run`'s).
    in_training: whether evaluations of this evaluator take turns with training (a training loop's hook):
        from the second under one prefix on, `eval/interval_seconds` is the wall time since the previous one
        ended (what `inloop-eval plan --budget-fraction` reads); a watcher of checkpoints passes False."""
    start = time.perf_counter()
    previous = evaluator.finished.get(prefix)
    group = resolve_data_parallel(dp_group)
    metrics = dict(evaluator.run(model, step=step, prefix=prefix, dp_group=group, progress=progress))
    metrics[seconds_key(prefix)] = time.perf_counter() - start
    metrics[tokens_key(prefix)] = float(all_reduce_sum(evaluator.tokens_forwarded, group))
    if in_training and previous is not None:
        metrics[interval_key(prefix)] = start - previous
    if logger is not None:
        logger.log(metrics, step)
        outcomes = evaluator.outcomes()
        # A logger written before `log_outcomes` existed (not a MetricsLogger subclass) has none.
        if outcomes and hasattr(logger, "log_outcomes"):
            logger.log_outcomes(outcomes, step)
    evaluator.finished[prefix] = time.perf_counter()
    return metrics
