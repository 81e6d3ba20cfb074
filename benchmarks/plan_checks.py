"""The two checks of what a plan promises: each kept figure's standard error against fresh samples of its
documents, and the seconds of the plan.yaml `inloop-eval plan` writes against its budget."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.plan_decisions import Values, trim
from benchmarks.plan_runs import CHECKPOINT, MODEL, eval_config
from inloop_eval import InLoopEvaluator
from inloop_eval.evaluators.measured import run_and_log
from inloop_eval.models.gpt import GPT
from inloop_eval.plan.allocate import Allocation
from inloop_eval.plan.output import write_plan
from inloop_eval.plan.planner import PlanRequest, make_plan
from inloop_eval.plan.runs import PlanError

BUDGETS = (0.05, 0.10, 0.25)
# Calls timed after the first, their median taken: one call on a shared machine is at the mercy of its load.
TIMED_CALLS = 3


def resampled_stderr(values_RD: np.ndarray, n: int, draws: int, rng: np.random.Generator) -> float:
    """The standard error of a figure read on n of D documents, as fresh samples show it: per row (one
    checkpoint), the standard deviation of the mean over `draws` samples of n documents drawn without
    replacement; the root mean square over rows."""
    variances = []
    for row_D in values_RD:
        means = [row_D[rng.choice(len(row_D), n, replace=False)].mean() for _ in range(draws)]
        variances.append(np.var(means, ddof=1))
    return float(np.sqrt(np.mean(variances)))


def runs_stderr(
    runs: list[Values],
    label: str,
    figure: str,
    steps: list[int],
    n: int,
    draws: int,
    rng: np.random.Generator,
) -> float:
    """`resampled_stderr` of each run at `steps`, the median over runs: as the plan's `stderr` is one run's,
    its level variance the median of the runs'."""
    return float(
        np.median(
            [resampled_stderr(trim(run[label][figure], steps).values_KD, n, draws, rng) for run in runs]
        )
    )


def stderr_check(
    runs: list[Values], plan: Allocation, steps: dict[str, list[int]], draws: int, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """Each kept figure's predicted standard error against `runs_stderr` at each group of `steps` (name ->
    steps); a figure read on every document of its set has none to check (both 0)."""
    rows = []
    for task in plan.kept():
        row = {"label": task.label, "figure": task.figure, "documents": task.documents, "of": task.n_split}
        row["predicted"] = task.stderr
        for name, group in steps.items():
            observed = (
                runs_stderr(runs, task.label, task.figure, group, task.documents, draws, rng)
                if task.documents < task.n_split
                else 0.0
            )
            row[f"observed, {name}"] = observed
            row[f"ratio, {name}"] = task.stderr / observed if observed > 0 else math.nan
        rows.append(row)
    return rows


def timed_plan(
    run_dirs: list[Path], budget: float, out_dir: Path, model: torch.nn.Module, step: int, rate_now: float
) -> dict[str, Any]:
    """Plan from every run at `budget` seconds, write plan.yaml, and time it on `model` (`timed`); also
    against its planned seconds repriced at `rate_now`, the seconds per token measured beside it."""
    try:
        result = make_plan(PlanRequest(runs=tuple(run_dirs), budget=budget))
    except PlanError as exc:
        return {"budget": budget, "skipped": str(exc)}
    config_path, _, report = write_plan(result, out_dir)
    first, seconds, tokens = timed(InLoopEvaluator.from_yaml(config_path), model, step)
    repriced = report["planned_seconds"] * rate_now / result.seconds_per_token
    return {
        "budget": budget,
        "planned_seconds": report["planned_seconds"],
        "kept": len(result.allocation.kept()),
        "planned_tokens": round(report["planned_seconds"] / result.seconds_per_token),
        "tokens_forwarded": tokens,
        "first_call_seconds": first,
        "seconds": seconds,
        "planned_seconds_per_token": result.seconds_per_token,
        "seconds_per_token_now": rate_now,
        "seconds_over_budget": seconds / budget,
        "seconds_over_planned_at_rate_now": seconds / repriced,
    }


def timed(evaluator: InLoopEvaluator, model: torch.nn.Module, step: int) -> tuple[float, float, float]:
    """(the first call's seconds, which also tokenizes and which the runs' rates leave out; the median seconds
    of the TIMED_CALLS calls after it; the tokens each forwards), from `run_and_log`."""
    first = run_and_log(evaluator, model, step)["eval/seconds"]
    calls = [run_and_log(evaluator, model, step) for _ in range(TIMED_CALLS)]
    seconds = float(np.median([c["eval/seconds"] for c in calls]))
    return first, seconds, calls[-1]["eval/tokens_forwarded"]


def timing(run_dirs: list[Path], full: float, args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """`timed_plan` at each budget, on the last weights of the middle run, after the full evaluation on the
    same weights has measured the seconds per token of the machine as it is now."""
    middle = run_dirs[len(run_dirs) // 2]
    model = GPT(MODEL)
    model.load_state_dict(torch.load(middle / CHECKPOINT, weights_only=True))
    model.eval()
    full_config = eval_config(args.limit, root, Path(args.cache))
    _, seconds, tokens = timed(InLoopEvaluator(full_config), model, args.steps)
    rate_now = seconds / tokens
    out = Path(args.cache) / "plans"
    return [
        timed_plan(run_dirs, f * full, out / f"budget_{f:g}", model, args.steps, rate_now) for f in BUDGETS
    ]
