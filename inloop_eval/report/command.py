"""`inloop-eval report RUN_DIR`: one HTML page of a run's evaluations over training steps."""

from __future__ import annotations

import argparse

from inloop_eval.report.page import write_report


def main(argv: list[str] | None = None) -> int:
    """`inloop-eval report` on its own: parse `argv` (default: the command line), write the page."""
    parser = argparse.ArgumentParser(prog="inloop-eval report", description=__doc__.strip())
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The report's arguments, on its own parser or the `inloop-eval report` subparser."""
    parser.add_argument("run_dir", help="a run directory: metrics.jsonl (+ config.json), or a W&B run")
    parser.add_argument("--out", help="where to write index.html and the PNGs (default RUN_DIR/report)")
    parser.add_argument("--window", type=int, default=4, help="evaluations the divergence flag looks at")
    parser.add_argument(
        "--min-change", type=float, default=0.01, help="least move of acc and of acc_norm for the flag"
    )


def run(args: argparse.Namespace) -> int:
    """Write the page of `args.run_dir`; prints where it is."""
    path = write_report(args.run_dir, args.out, window=args.window, min_change=args.min_change)
    print(f"report: {path}")
    return 0
