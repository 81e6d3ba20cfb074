"""What the planner reads from run directories: each task figure's per-document values over the run's
evaluations (`outcomes/step_<N>.npz`), the evaluator config the run logged (`config.json`), and the seconds
per token its evaluations measured (`eval/seconds`, `eval/tokens_forwarded` in `metrics.jsonl`).

A task figure's values are kept on the documents every evaluation of it scored with a finite value, at the
evaluations that hold the task; an evaluation that lacks the task (it failed there) is left out of that
task's values, and said so in `RunData.notes`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inloop_eval.errors import InLoopEvalError
from inloop_eval.keys import INTERVAL_KEY, SECONDS_KEY, TOKENS_KEY
from inloop_eval.loggers.outcomes import StepOutcomes, list_steps, outcomes_directory, read_step
from inloop_eval.plan.noise import RunValues
from inloop_eval.report.runs import load_run
from inloop_eval.report.signal import SNR_FIGURES

# The figures the planner chooses among: those the report's signal-to-noise table reads (bits-per-byte twin
# included).
PLAN_FIGURES: tuple[str, ...] = SNR_FIGURES


class PlanError(InLoopEvalError):
    """Run directories, options or a config the planner cannot plan from (named in the message)."""


@dataclass
class RunData:
    """One run directory as the planner reads it.

    values: label -> figure -> `RunValues` (figures of PLAN_FIGURES with per-document values).
    config: the evaluator config the run logged (`evaluators`, `eval_interval`, ...); {} when none.
    seconds_per_token: the median over its evaluations (the first left out, where there are more: it also
        tokenizes) of eval/seconds / eval/tokens_forwarded; NaN when not logged.
    eval_seconds, eval_tokens: the medians of the same evaluations' eval/seconds and eval/tokens_forwarded.
    interval_seconds: the median of its eval/interval_seconds (the training between evaluations, logged by a
        training loop's evaluations from the second on); NaN when not logged.
    """

    path: Path
    values: dict[str, dict[str, RunValues]]
    config: dict[str, Any] = field(default_factory=dict)
    seconds_per_token: float = math.nan
    eval_seconds: float = math.nan
    eval_tokens: float = math.nan
    interval_seconds: float = math.nan
    notes: list[str] = field(default_factory=list)


def task_values(label: str, figure: str, steps: list[StepOutcomes]) -> RunValues | None:
    """The values of one task figure over the evaluations that hold it, on the documents every one of them
    scored with a finite value; None when no evaluation holds it."""
    held = [s for s in steps if label in s.tasks and figure in s.tasks[label].values]
    if not held:
        return None
    doc_id_D = held[0].tasks[label].doc_id
    for s in held[1:]:
        doc_id_D = np.intersect1d(doc_id_D, s.tasks[label].doc_id)
    rows = []
    for s in held:
        task = s.tasks[label]
        rows.append(task.values[figure][np.searchsorted(task.doc_id, doc_id_D)])
    values_KD = np.stack(rows).astype(np.float64)
    finite_D = np.isfinite(values_KD).all(0)
    return RunValues(
        np.array([s.step for s in held], dtype=np.int64), doc_id_D[finite_D], values_KD[:, finite_D]
    )


def evaluator_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluator config inside a run's logged config: the config itself when it lists `evaluators` (an
    `EvaluatorConfig` logged whole), else its `evaluation` section (the demo's); {} when neither."""
    if isinstance(config.get("evaluators"), list):
        return dict(config)
    evaluation = config.get("evaluation")
    if isinstance(evaluation, Mapping) and isinstance(evaluation.get("evaluators"), list):
        return dict(evaluation)
    return {}


def measured_rates(series: Mapping[str, list[tuple[int, float]]]) -> tuple[float, float, float]:
    """(seconds per token, seconds, tokens): medians over the evaluations logging both keys, the first left
    out where there are more (it tokenizes the tasks once); NaN when none does."""
    seconds = dict(series.get(SECONDS_KEY, []))
    tokens = dict(series.get(TOKENS_KEY, []))
    both = [(seconds[s], tokens[s]) for s in sorted(seconds) if s in tokens and tokens[s] > 0]
    both = [(a, b) for a, b in both if math.isfinite(a) and math.isfinite(b)]
    if len(both) > 1:
        both = both[1:]
    if not both:
        return math.nan, math.nan, math.nan
    seconds_E, tokens_E = np.array(both).T
    return float(np.median(seconds_E / tokens_E)), float(np.median(seconds_E)), float(np.median(tokens_E))


def median_interval(series: Mapping[str, list[tuple[int, float]]]) -> float:
    """The median of the finite eval/interval_seconds a run logged; NaN when none."""
    values = [v for _, v in series.get(INTERVAL_KEY, []) if math.isfinite(v) and v >= 0]
    return float(np.median(values)) if values else math.nan


def read_run(path: str | Path) -> RunData:
    """One run directory read (module docstring); PlanError naming it when it holds no outcomes or a step
    file that cannot be read."""
    path = Path(path)
    try:
        steps = [read_step(f) for f in list_steps(outcomes_directory(path)).values()]
    except InLoopEvalError as exc:
        raise PlanError(f"run {path}: {exc}") from exc
    labels = sorted({label for s in steps for label in s.tasks if not label.startswith("suite/")})
    values: dict[str, dict[str, RunValues]] = {}
    notes = []
    for label in labels:
        missing = [s.step for s in steps if label not in s.tasks]
        if missing:
            notes.append(f"task {label!r}: not in the outcomes of steps {missing[:10]} (left out there)")
        figures = {figure: task_values(label, figure, steps) for figure in PLAN_FIGURES}
        values[label] = {figure: v for figure, v in figures.items() if v is not None}
    config: dict[str, Any] = {}
    rates = (math.nan, math.nan, math.nan)
    interval = math.nan
    if (path / "metrics.jsonl").is_file() or any(path.glob("**/run-*.wandb")):
        history = load_run(path)
        config = evaluator_config(history.config)
        rates = measured_rates(history.series)
        interval = median_interval(history.series)
    return RunData(path, values, config, *rates, interval_seconds=interval, notes=notes)
