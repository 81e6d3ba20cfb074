"""`inloop-eval lint TASK...`: each task's choice strings and prompts checked (`tasks/lint.py`); exit 1 on
an error (with `--strict`, on a warning too)."""

from __future__ import annotations

import argparse

from inloop_eval.tasks import get_task
from inloop_eval.tasks.lint import lint_task


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_ids", nargs="+", metavar="TASK", help="task ids (see `inloop-eval tasks`)")
    parser.add_argument("--data-root", help="task data root (default $INLOOP_EVAL_DATA or the cache)")
    parser.add_argument("--limit", type=int, help="first N documents of each task")
    parser.add_argument("--strict", action="store_true", help="warnings count as errors")
    parser.add_argument("--show", type=int, default=3, help="documents listed per problem (default 3)")


def run(args: argparse.Namespace) -> int:
    """Lint each task; 1 when any has an error (or, with --strict, a warning)."""
    failed = False
    for name in args.task_ids:
        report = lint_task(get_task(name), args.data_root, args.limit)
        print(report.summary(args.show))
        failed |= bool(report.errors or (args.strict and report.warnings))
    return 1 if failed else 0
