"""`inloop-eval tasks [PATTERN]`: the registered task ids with their format and metrics (those matching
PATTERN), or one task described (`--describe TASK`)."""

from __future__ import annotations

import argparse
import fnmatch

from inloop_eval.cli.describe import describe_task
from inloop_eval.tasks import get_task, task_names
from inloop_eval.tasks.olmo.labels import olmo_task_ids

GLOB_CHARACTERS = "*?["


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pattern",
        nargs="?",
        metavar="PATTERN",
        help="only the ids containing PATTERN (e.g. mmlu), or matching it when it has * ? [ (e.g. 'arc_*_mc')",
    )
    parser.add_argument(
        "--describe", metavar="TASK", help="show TASK's settings and a rendered example request"
    )
    parser.add_argument("--doc", type=int, default=0, help="with --describe: which document (default 0)")
    parser.add_argument("--data-root", help="task data root (default $INLOOP_EVAL_DATA or the cache)")


def matches(task_id: str, pattern: str) -> bool:
    """Whether `task_id` contains `pattern`, or matches it as a shell-style pattern when it has * ? or [
    (case-insensitive either way)."""
    task_id, pattern = task_id.lower(), pattern.lower()
    if any(c in pattern for c in GLOB_CHARACTERS):
        return fnmatch.fnmatchcase(task_id, pattern)
    return pattern in task_id


def run(args: argparse.Namespace) -> int:
    """Describe one task, or list the ids (those matching the pattern), then how many and how to filter."""
    if args.describe:
        print(describe_task(get_task(args.describe), args.data_root, args.doc))
        return 0
    print(
        "Every id also takes a shot count (arc_easy_rc_5shot); oe_eval:<task>:<variant> reads OLMo's files; "
        "olmo:<label> is OLMo's in-loop task of that label."
    )
    ids = [*task_names(), *olmo_task_ids()]
    shown = [name for name in ids if args.pattern is None or matches(name, args.pattern)]
    for name in shown:
        task = get_task(name)
        note = (
            "  (letter keys / shared continuation: length normalisation is a no-op, not reported)"
            if task.length_norm_is_noop
            else ""
        )
        print(f"{name:48s} {task.prompt_format:8s} {','.join(task.metrics)}{note}")
        if task.format_source:
            print(f"{'':48s} format: {task.format_source}")
    print(count_line(len(shown), len(ids), args.pattern))
    return 0


def count_line(shown: int, total: int, pattern: str | None) -> str:
    """How many ids were listed, and how to list fewer (or others)."""
    if pattern is None:
        return f"{total} tasks; `inloop-eval tasks PATTERN` lists those whose id contains PATTERN (e.g. mmlu)"
    return (
        f"{shown} of {total} tasks match {pattern!r} (ids containing it, or matching it when it has * ? [); "
        "`inloop-eval tasks` lists all"
    )
