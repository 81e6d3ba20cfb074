"""Calling the evaluator from a training loop, with its cost measured and the figures logged.

The plain loop needs nothing from here (`if evaluator.should_run(step): evaluator.run(model, step=step)`);
`run_and_log` adds the wall time and tokens forwarded and hands the result to a logger. The trainer
callbacks live in `inloop_eval.integrations.hf` (Hugging Face `Trainer`) and `.lightning` (Lightning).
"""

from __future__ import annotations

import time
from typing import Any

from inloop_eval.distributed import all_reduce_sum
from inloop_eval.evaluators.orchestrator import InLoopEvaluator
from inloop_eval.keys import SECONDS_KEY, TOKENS_KEY
from inloop_eval.loggers import MetricsLogger

__all__ = ["SECONDS_KEY", "TOKENS_KEY", "run_and_log"]  # the keys are importable from here, as before


def run_and_log(
    evaluator: InLoopEvaluator, model: Any, step: int, logger: MetricsLogger | None = None
) -> dict[str, float]:
    """`evaluator.run(model, step=step)` plus `eval/seconds` (wall time of the call) and
    `eval/tokens_forwarded` (tokens sent through the model by all ranks, padding and dummies included), logged
    at `step`. Every rank must call it (the evaluator and the token count sync across ranks)."""
    start = time.perf_counter()
    metrics = dict(evaluator.run(model, step=step))
    metrics[SECONDS_KEY] = time.perf_counter() - start
    metrics[TOKENS_KEY] = float(all_reduce_sum(evaluator.tokens_forwarded))
    if logger is not None:
        logger.log(metrics, step)
    return metrics
