"""`inloop-eval compare A B`: is the difference between two evaluations real? A terminal table, or `--json`.

A and B: run directories (their latest step), `run@step`, two steps of one run (`run@100 run@200`), or
`inloop-eval evaluate --outcomes` directories, in any mix. Differences are B - A.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from inloop_eval.compare.pairing import Comparison, compare_steps, load_side
from inloop_eval.errors import ConfigError, InLoopEvalError
from inloop_eval.metrics.paired import A_BETTER, B_BETTER, CANNOT_TELL, PairedResult

# ANSI colours of the verdicts on a terminal.
COLOURS = {B_BETTER: "\033[1;32m", A_BETTER: "\033[1;31m"}
RESET = "\033[0m"
HEADER = ("task", "figure", "n", "A", "B", "B - A", "95% interval", "p", "verdict", "detectable")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments, on its own parser or the `inloop-eval compare` subparser."""
    parser.add_argument("a", metavar="A", help="run directory, RUN@STEP, or an evaluate --outcomes directory")
    parser.add_argument("b", metavar="B", help="the same, compared with A (differences are B - A)")
    parser.add_argument("--figures", help="comma-separated figures to compare (default: every one both hold)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    """Compare `args.a` and `args.b` and print the table (or JSON); an error (a side that cannot be read, a
    figure no task compares) goes on to the command line's handler (one line, exit status 2), and with
    `--json` is also printed as `{"error": "..."}` on stdout."""
    figures = [f.strip() for f in args.figures.split(",") if f.strip()] if args.figures is not None else None
    try:
        if figures == []:
            raise ConfigError(
                f"--figures {args.figures!r} names no figure; name them, e.g. --figures acc,ce_gold"
            )
        comparison = compare_steps(load_side(args.a), load_side(args.b), figures)
    except InLoopEvalError as exc:
        if args.json:  # a script reading stdout gets an object it can parse, and the exit status 2
            print(json.dumps({"error": str(exc)}))
        raise
    if args.json:
        print(json.dumps(as_json(comparison), indent=1, allow_nan=False))
    else:
        print(render_table(comparison, colour=sys.stdout.isatty()))
    return 0


def finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def result_json(r: PairedResult) -> dict[str, Any]:
    return {
        "n": r.n,
        "a": finite_or_none(r.a),
        "b": finite_or_none(r.b),
        "diff": finite_or_none(r.diff),
        "stderr": finite_or_none(r.stderr),
        "ci95": [finite_or_none(r.ci95[0]), finite_or_none(r.ci95[1])],
        "p_value": finite_or_none(r.p_value),
        "test": r.test,
        "verdict": r.verdict,
        "mdd80": finite_or_none(r.mdd80),
        "ci95_disagrees_with_verdict": interval_disagrees(r),
    }


def as_json(comparison: Comparison) -> dict[str, Any]:
    """The comparison as plain JSON values (null where a number is not finite)."""
    return {
        "a": {"source": comparison.a.source, "step": comparison.a.step},
        "b": {"source": comparison.b.source, "step": comparison.b.step},
        "tasks": {
            label: {
                "n_both": task.n_both,
                "n_only_a": task.n_only_a,
                "n_only_b": task.n_only_b,
                "note": task.note(),
                "figures": {name: result_json(r) for name, r in task.figures.items()},
            }
            for label, task in comparison.tasks.items()
        },
        "tasks_only_in_a": comparison.tasks_only_in_a,
        "tasks_only_in_b": comparison.tasks_only_in_b,
    }


def interval_disagrees(r: PairedResult) -> bool:
    """The 95% interval and the verdict tell different stories: the interval excludes 0 beside "cannot tell",
    or holds 0 beside a better side. They can, because the interval is the normal approximation diff +- 1.96
    se while the verdict is the test's p (Student's t with n - 1 degrees of freedom, wider tails on few
    documents; or exact McNemar on the discordant documents)."""
    low, high = r.ci95
    if not (math.isfinite(low) and math.isfinite(high)):
        return False
    return (low > 0 or high < 0) == (r.verdict == CANNOT_TELL)


def cells(label: str, name: str, r: PairedResult) -> list[str]:
    mark = " *" if interval_disagrees(r) else ""
    return [
        label,
        name,
        str(r.n),
        f"{r.a:.4f}",
        f"{r.b:.4f}",
        f"{r.diff:+.4f}",
        f"[{r.ci95[0]:+.4f}, {r.ci95[1]:+.4f}]{mark}",
        f"{r.p_value:.3g}",
        r.verdict,
        f"{r.mdd80:.4f}",
    ]


def render_table(comparison: Comparison, *, colour: bool = False) -> str:
    """The comparison as an aligned text table, the verdicts coloured when `colour`, then the notes."""
    rows = [list(HEADER)]
    verdicts = [""]
    for label, task in comparison.tasks.items():
        for name, r in task.figures.items():
            rows.append(cells(label, name, r))
            verdicts.append(r.verdict)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = [
        f"A: {comparison.a.source} (step {comparison.a.step})",
        f"B: {comparison.b.source} (step {comparison.b.step})",
    ]
    for row, verdict in zip(rows, verdicts, strict=True):
        padded = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        if colour and verdict in COLOURS:
            padded[8] = f"{COLOURS[verdict]}{padded[8]}{RESET}"
        lines.append("  ".join(padded).rstrip())
    lines.append(
        "B - A with its 95% interval (paired on documents: diff +- 1.96 standard errors, the normal "
        "approximation); p: exact McNemar for 0/1 figures, paired t (Student's t, n - 1 degrees of freedom) "
        "otherwise; verdict at p < 0.05; detectable: the smallest difference these documents detect at "
        "80% power"
    )
    if any(interval_disagrees(r) for task in comparison.tasks.values() for r in task.figures.values()):
        lines.append(
            "*: the interval and the verdict disagree: the interval is a normal approximation, the verdict the "
            "test's p, whose tails are wider on few documents (t) or which counts only the documents that "
            "changed (McNemar); the verdict is the one to trust, and a difference this close to the line "
            "needs more documents to call"
        )
    for label, task in comparison.tasks.items():
        if task.note():
            lines.append(f"note: {label}: {task.note()}")
    for side, labels in (("A", comparison.tasks_only_in_a), ("B", comparison.tasks_only_in_b)):
        if labels:
            lines.append(f"note: tasks only in {side}, not compared: {', '.join(labels)}")
    return "\n".join(lines)
