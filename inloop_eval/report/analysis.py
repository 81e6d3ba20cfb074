"""What the report says of each task: its curves, and the flags and notes beside them.

- *diverging*: over the last `window` evaluations, the fitted trends of acc and acc_norm have opposite signs
  and each moves by at least `min_change` and by at least its standard error (when logged). Length
  normalisation then reorders the choices against the raw loglikelihood: a change in how the probability
  mass is spread over the continuation's tokens (output sharpness, a format effect), not in capability.
- *letter keys*: tasks whose choices all have the same length (`*_mc` letter keys, WinoGrande's shared
  continuation) have acc_norm identical to acc by construction; they do not report it, and the page says so.
  A task that reports acc_norm equal to acc at every evaluation is flagged too.
- *not finite*: a figure that was NaN or infinite at some evaluation (logged as `null`).
- *subset*: `n_nonfinite_docs` > 0: documents whose scores were not finite (NaN logits) were left out, so the
  task's figures at that evaluation are over the other documents only.
- *chance* (on the plots): a task's chance accuracy, the mean over its documents of 1 / n_choices, read from
  the run's latest per-document outcomes (`chance_levels`); unknown for a run that saved none.
- *noise* (a note): the standard deviation of the last `NOISE_EVALUATIONS` values of each curve around their
  straight-line trend (how much the figure jumps between checkpoints), beside its binomial standard error (how
  much it would move on other documents); `inloop-eval compare` says whether a given difference is real.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inloop_eval.errors import InLoopEvalError
from inloop_eval.loggers.base import CURVE_METRICS
from inloop_eval.loggers.outcomes import OutcomesError, list_steps, outcomes_directory, read_step
from inloop_eval.report.runs import RunHistory, Series, shown_numbers
from inloop_eval.tasks import get_task

# The start of each flag the page's summary counts.
DIVERGING = "diverging"
NONFINITE = "not a finite number"
SUBSET = "subset"
# Evaluations the noise around the trend is measured over.
NOISE_EVALUATIONS = 6


def fitted_change(points: Series) -> float:
    """The least-squares trend of `points` times their step span: how much the line moves over them."""
    if len(points) < 2:
        return 0.0
    steps = np.array([s for s, _ in points], dtype=np.float64)
    values = np.array([v for _, v in points], dtype=np.float64)
    span = steps[-1] - steps[0]
    if span <= 0 or not np.isfinite(values).all():
        return 0.0
    slope = np.polyfit(steps, values, 1)[0]
    return float(slope * span)


def trend_noise(points: Series, n: int = NOISE_EVALUATIONS) -> float | None:
    """Standard deviation of the last `n` values of `points` around their least-squares line (n - 2 degrees
    of freedom); None with fewer than 3 finite values."""
    last = [(s, v) for s, v in points if math.isfinite(v)][-n:]
    if len(last) < 3:
        return None
    steps = np.array([s for s, _ in last], dtype=np.float64)
    values = np.array([v for _, v in last], dtype=np.float64)
    residuals = values - np.polyval(np.polyfit(steps, values, 1), steps)
    return float(np.sqrt((residuals**2).sum() / (len(last) - 2)))


def noise_note(curves: Mapping[str, Series], stderr: Mapping[str, Series]) -> str | None:
    """'noise around the trend' of each curve with enough evaluations, beside its last standard error, saying
    over how many evaluations it was measured (at most NOISE_EVALUATIONS: as many as there are)."""
    parts, counts = [], []
    for name, points in curves.items():
        noise = trend_noise(points)
        if noise is None:
            continue
        counts.append(min(NOISE_EVALUATIONS, sum(math.isfinite(v) for _, v in points)))
        last_stderr = stderr.get(name, [])
        beside = f" (binomial stderr {last_stderr[-1][1]:.3f})" if last_stderr else ""
        parts.append(f"{name} {noise:.3f}{beside}")
    if not parts:
        return None
    if len(set(counts)) > 1:  # curves with different evaluations: each says its own count
        parts = [f"{part} over {n}" for part, n in zip(parts, counts, strict=True)]
        return "noise: sd of the last evaluations around their trend: " + ", ".join(parts)
    return f"noise: sd of the last {counts[0]} evaluations around their trend: " + ", ".join(parts)


def divergence(
    acc: Series,
    acc_norm: Series,
    window: int = 4,
    min_change: float = 0.01,
    acc_stderr: Series | None = None,
    acc_norm_stderr: Series | None = None,
) -> str | None:
    """A sentence when, over the last `window` evaluations both report, acc and acc_norm trend in opposite
    directions, each by at least `min_change` and by at least its standard error at the last of them (when
    logged: with few documents, a move within the noise is not a signal); None otherwise."""
    common = sorted(set(dict(acc)) & set(dict(acc_norm)))[-window:]
    if len(common) < 2:
        return None
    a, n = dict(acc), dict(acc_norm)
    d_acc = fitted_change([(s, a[s]) for s in common])
    d_norm = fitted_change([(s, n[s]) for s in common])
    need_acc = max(min_change, dict(acc_stderr or []).get(common[-1], 0.0))
    need_norm = max(min_change, dict(acc_norm_stderr or []).get(common[-1], 0.0))
    if d_acc * d_norm >= 0 or abs(d_acc) < need_acc or abs(d_norm) < need_norm:
        return None
    return (
        f"acc and acc_norm move in opposite directions over the last {len(common)} evaluations "
        f"(steps {common[0]}-{common[-1]}: acc {d_acc:+.3f}, acc_norm {d_norm:+.3f}): a change in output "
        "sharpness or format rather than capability"
    )


def identical(acc: Series, acc_norm: Series) -> bool:
    """acc_norm equals acc at every evaluation both report (at least one)."""
    a, n = dict(acc), dict(acc_norm)
    common = set(a) & set(n)
    return bool(common) and all(a[s] == n[s] for s in common)


def nonfinite_steps(figures: Mapping[str, Series]) -> dict[str, list[int]]:
    """figure -> the steps at which it was NaN or infinite, for the figures that ever were."""
    out = {name: [s for s, v in points if not math.isfinite(v)] for name, points in sorted(figures.items())}
    return {name: steps for name, steps in out.items() if steps}


def nonfinite_flags(figures: Mapping[str, Series]) -> list[str]:
    """Flags for the figures of one task or domain that were not finite numbers, and for its documents left
    out because their scores were not (`n_nonfinite_docs` > 0): its figures then cover a subset."""
    flags = []
    bad = nonfinite_steps(figures)
    if bad:
        where = "; ".join(
            f"{name} at step{'s' if len(steps) > 1 else ''} {shown_numbers(steps)}"
            for name, steps in bad.items()
        )
        flags.append(f"{NONFINITE} (NaN or infinite, logged as null): {where}")
    dropped = [(s, v) for s, v in figures.get("n_nonfinite_docs", []) if v > 0]
    if dropped:
        step, count = dropped[-1]
        kept = dict(figures.get("n_docs", [])).get(step, math.nan)
        over = f"the other {kept:.0f}" if math.isfinite(kept) else "the others"
        at = f"at {len(dropped)} evaluations, first at step {dropped[0][0]}; " if len(dropped) > 1 else ""
        flags.append(
            f"{SUBSET}: {at}at step {step} {count:.0f} document(s) whose scores were not finite (NaN logits) "
            f"were left out, and the figures are over {over} only"
        )
    return flags


@dataclass
class TaskView:
    """What the page shows for one task."""

    label: str
    task_id: str
    curves: dict[str, Series]
    stderr: dict[str, Series]
    flags: list[str]
    notes: list[str]
    plot: str = ""


def task_ids(config: Mapping[str, Any]) -> dict[str, str]:
    """label -> task id, from an evaluator config (top level or under `evaluation`)."""
    evaluation = config.get("evaluation", config)
    entries = evaluation.get("evaluators", []) if isinstance(evaluation, Mapping) else []
    out = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping) and entry.get("task"):
            out[str(entry.get("label") or entry["task"])] = str(entry["task"])
    return out


def chance_levels(run_dir: str | Path) -> dict[str, float]:
    """label -> chance accuracy (mean of 1 / n_choices over its documents) from the run's latest outcomes
    file; {} when the run saved none or it cannot be read (the plots then draw no chance line)."""
    try:
        steps = list_steps(outcomes_directory(Path(run_dir)))
        latest = read_step(steps[max(steps)]) if steps else None
    except OutcomesError:
        return {}
    if latest is None:
        return {}
    out = {}
    for label, task in latest.tasks.items():
        n_choices_D = np.asarray(task.n_choices, dtype=np.float64)
        if n_choices_D.size and (n_choices_D > 0).all():
            out[label] = float(np.mean(1.0 / n_choices_D))
    return out


def length_norm_is_noop(task_id: str) -> bool | None:
    """What the registry says of `task_id`; None for a task it does not know."""
    try:
        return bool(get_task(task_id).length_norm_is_noop)
    except InLoopEvalError:
        return None


def task_views(history: RunHistory, window: int = 4, min_change: float = 0.01) -> list[TaskView]:
    """Curves, flags and notes for every task in the history."""
    ids = task_ids(history.config)
    views = []
    for label, metrics in history.tasks().items():
        task_id = ids.get(label, label)
        curves = {m: metrics[m] for m in CURVE_METRICS if m in metrics}
        stderr = {m: metrics[f"{m}_stderr"] for m in curves if f"{m}_stderr" in metrics}
        flags: list[str] = []
        notes: list[str] = []
        if "failed" in metrics and any(v > 0 for _, v in metrics["failed"]):
            failed_at = [s for s, v in metrics["failed"] if v > 0]
            flags.append(f"failed at {len(failed_at)} evaluation(s), first at step {failed_at[0]}")
        noop = length_norm_is_noop(task_id)
        if "acc" in curves and "acc_norm" in curves:
            sentence = divergence(
                curves["acc"],
                curves["acc_norm"],
                window,
                min_change,
                stderr.get("acc"),
                stderr.get("acc_norm"),
            )
            if sentence:
                flags.append(f"{DIVERGING}: {sentence}")
            if identical(curves["acc"], curves["acc_norm"]):
                why = " by construction (letter keys / shared continuation)" if noop else ""
                flags.append(f"identical: acc_norm equals acc at every evaluation{why}")
        elif "acc" in curves and noop:
            notes.append(
                "letter keys / shared continuation: every choice has the same length, so acc_norm would equal "
                "acc by construction; it is not reported"
            )
        flags += nonfinite_flags(metrics)
        noise = noise_note(curves, stderr)
        if noise:
            notes.append(noise)
        views.append(TaskView(label, task_id, curves, stderr, flags, notes))
    return views
