"""`inloop-eval report RUN_DIR`: one HTML page of a run's evaluations over training steps;
`inloop-eval report RUN_A RUN_B ...`: one page comparing the runs (`report.comparison`)."""

from __future__ import annotations

import argparse

from inloop_eval.report.comparison import write_comparison
from inloop_eval.report.page import write_report


def main(argv: list[str] | None = None) -> int:
    """`inloop-eval report` on its own: parse `argv` (default: the command line), write the page."""
    parser = argparse.ArgumentParser(prog="inloop-eval report", description=__doc__.strip())
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The report's arguments, on its own parser or the `inloop-eval report` subparser."""
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="a run directory: metrics.jsonl (+ config.json), or a W&B run; two or more: a page comparing them "
        "(curves, paired verdicts per step from their outcomes, signal-to-noise per task)",
    )
    parser.add_argument(
        "--out",
        help="where to write index.html and the PNGs (default RUN_DIR/report; for runs compared RUN_A/comparison)",
    )
    parser.add_argument("--window", type=int, default=4, help="evaluations the divergence flag looks at")
    parser.add_argument(
        "--min-change", type=float, default=0.01, help="least move of acc and of acc_norm for the flag"
    )


def run(args: argparse.Namespace) -> int:
    """Write the page of `args.run_dirs` (one run, or the runs compared); prints where it is."""
    if len(args.run_dirs) > 1:
        path = write_comparison(args.run_dirs, args.out)
    else:
        path = write_report(args.run_dirs[0], args.out, window=args.window, min_change=args.min_change)
    print(f"report: {path}")
    return 0
