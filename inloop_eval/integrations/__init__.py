"""Calling the evaluator from a training loop, with its cost measured and the figures logged.

The plain loop needs nothing from here (`if evaluator.should_run(step): evaluator.run(model, step=step)`);
`run_and_log` adds the wall time and tokens forwarded and hands the result to a logger. The trainer
callbacks live in `inloop_eval.integrations.hf` (Hugging Face `Trainer`) and `.lightning` (Lightning).
"""

from __future__ import annotations

import time
from typing import Any

from inloop_eval.distributed import all_reduce_sum
from inloop_eval.loggers import MetricsLogger

SECONDS_KEY = "eval/seconds"
TOKENS_KEY = "eval/tokens_forwarded"


def run_and_log(
    evaluator: Any, model: Any, step: int, logger: MetricsLogger | None = None
) -> dict[str, float]:
    """`evaluator.run(model, step=step)` plus `eval/seconds` (wall time of the call) and
    `eval/tokens_forwarded` (tokens sent through the model by all ranks, padding and dummies included), logged
    at `step`. Every rank must call it (the evaluator and the token count sync across ranks)."""
    before = snapshot_results(evaluator)
    start = time.perf_counter()
    metrics = dict(evaluator.run(model, step=step))
    metrics[SECONDS_KEY] = time.perf_counter() - start
    metrics[TOKENS_KEY] = float(all_reduce_sum(tokens_forwarded_since(evaluator, before)))
    if logger is not None:
        logger.log(metrics, step)
    return metrics


def snapshot_results(evaluator: Any) -> list[Any]:
    """The result objects the evaluator holds now (kept alive, so `is` comparisons stay meaningful)."""
    return [*getattr(evaluator, "last_results", {}).values(), *lm_results(evaluator).values()]


def lm_results(evaluator: Any) -> dict[Any, Any]:
    # Only look when the `lm` part was created: touching the cached property would create it.
    lm = vars(evaluator).get("lm")
    return getattr(lm, "last_results", {}) if lm is not None else {}


def tokens_forwarded_since(evaluator: Any, before: list[Any]) -> int:
    """This rank's tokens forwarded by the results that are new since `before` (a failed task keeps its
    previous result, which must not count again)."""
    known = {id(r) for r in before}
    total = 0
    for result in [*getattr(evaluator, "last_results", {}).values(), *lm_results(evaluator).values()]:
        if id(result) in known:
            continue
        scores = getattr(result, "scores", None)
        total += int(getattr(scores, "tokens_forwarded", None) or getattr(result, "tokens_forwarded", 0) or 0)
    return total
