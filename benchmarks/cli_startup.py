"""How long `inloop-eval` takes to answer its quick commands: each command run `--repeats` times, each time in a
fresh process (`python -m inloop_eval.cli ...`, the entry point's module), and the median wall seconds printed
with the fastest and slowest. Start-up is what these commands cost: importing what they need.

    python -m benchmarks.cli_startup [--repeats 5] [--commands 'evaluate --help' 'tasks']
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import time

DEFAULT_COMMANDS = ("--help", "evaluate --help", "tasks")
TIMEOUT_S = 120


def seconds_to_run(command: str) -> float:
    """Wall seconds of one run of `inloop-eval COMMAND` in a fresh interpreter (it must exit 0)."""
    argv = [sys.executable, "-m", "inloop_eval.cli", *shlex.split(command)]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"inloop-eval {command} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per command (default 5)")
    parser.add_argument("--commands", nargs="+", default=list(DEFAULT_COMMANDS), help="the commands, each quoted")
    args = parser.parse_args(argv)
    print(f"{'command':28s} {'median s':>9s} {'min s':>7s} {'max s':>7s}  ({args.repeats} fresh processes each)")
    for command in args.commands:
        times = [seconds_to_run(command) for _ in range(args.repeats)]
        print(f"{'inloop-eval ' + command:28s} {statistics.median(times):9.2f} {min(times):7.2f} {max(times):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
