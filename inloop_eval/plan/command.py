"""`inloop-eval plan RUN_DIR ... --budget SECONDS --out DIR`: the tasks, figures and documents that buy the
runs' decisions the most signal for the budget; writes `plan.yaml` (an evaluator config) and `plan.json`, and
prints the plan."""

from __future__ import annotations

import argparse
from pathlib import Path

from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.plan.flags import add_arguments
from inloop_eval.plan.output import render_table, write_plan
from inloop_eval.plan.planner import PlanRequest, make_plan

__all__ = ["add_arguments", "run"]


def request_of(args: argparse.Namespace) -> PlanRequest:
    """The plan the command line asks for."""
    return PlanRequest(
        runs=tuple(Path(p) for p in args.run_dirs),
        budget=args.budget,
        budget_fraction=args.budget_fraction,
        seconds_per_token=args.seconds_per_token,
        config=EvaluatorConfig.from_yaml(args.config) if args.config else None,
        packed=not args.plain_rows,
        device_type=args.device,
    )


def run(args: argparse.Namespace) -> int:
    """Plan, write plan.yaml and plan.json into `args.out`, print the table and where they are."""
    result = make_plan(request_of(args))
    config_path, report_path, report = write_plan(result, Path(args.out))
    print(render_table(report))
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"config: {config_path}")
    print(f"plan: {report_path}")
    return 0
