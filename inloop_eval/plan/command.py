"""`inloop-eval plan RUN_DIR ... --budget SECONDS --out DIR`: the tasks, figures and documents that buy the
runs' decisions the most signal for the budget; writes `plan.yaml` (an evaluator config) and `plan.json`, and
prints the plan. (`plan --calibrate CKPT ...`, which evaluates saved models first, runs from the command line's
layer: `cli/calibrate.py`, then `plan_and_write` here.)"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.plan.flags import add_arguments
from inloop_eval.plan.output import render_table, write_plan
from inloop_eval.plan.planner import PlanRequest, make_plan

__all__ = ["add_arguments", "plan_and_write", "request_of", "run"]


def request_of(args: argparse.Namespace, runs: Sequence[Path] | None = None) -> PlanRequest:
    """The plan the command line asks for, of `runs` (default: its RUN_DIRs) with the config of `--config`
    (none where `runs` are given: they logged the config they were evaluated with)."""
    config = EvaluatorConfig.from_yaml(args.config) if args.config and runs is None else None
    return PlanRequest(
        runs=tuple(Path(p) for p in (args.run_dirs if runs is None else runs)),
        budget=args.budget,
        budget_fraction=args.budget_fraction,
        eval_fraction=args.eval_fraction,
        seconds_per_token=args.seconds_per_token,
        config=config,
        packed=not args.plain_rows,
        device_type=args.device,
    )


def plan_and_write(request: PlanRequest, out: Path) -> int:
    """Plan, write plan.yaml and plan.json into `out`, print the table and where they are."""
    result = make_plan(request)
    config_path, report_path, report = write_plan(result, out)
    print(render_table(report))
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"config: {config_path}")
    print(f"plan: {report_path}")
    return 0


def run(args: argparse.Namespace) -> int:
    """The plan of the RUN_DIRs (`plan_and_write`)."""
    return plan_and_write(request_of(args), Path(args.out))
