"""`inloop-eval evaluate`'s flags: declared apart from the command (`evaluate.py`), which loads torch, so that
`inloop-eval evaluate --help` answers at once."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a saved model's folder (e.g. save_pretrained's)")
    parser.add_argument(
        "--tokenizer",
        help="tokenizers JSON file, a tokenizer directory, or a repository fetched or in the local hub "
        "cache (default: --model)",
    )
    parser.add_argument("--tasks", help="comma-separated task ids (see `inloop-eval tasks`)")
    parser.add_argument(
        "--config", help="YAML evaluator config; --tasks, --limit and --batch-tokens override it"
    )
    parser.add_argument("--limit", type=int, help="first N documents of each task")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="with --limit (or a config's limits): the N documents evenly spaced over each split, not its first "
        "N (the config's `spread: true`)",
    )
    parser.add_argument("--batch-tokens", type=int, help="token budget of one forward pass (default 8192)")
    parser.add_argument("--max-length", type=int, help="longest input in tokens (default: the model's)")
    parser.add_argument("--data-root", help="task data root (default $INLOOP_EVAL_DATA or the cache)")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--output", help="write the metrics and the config as JSON here (rank 0)")
    parser.add_argument("--samples", help="write one JSON line per request here (rank 0)")
    parser.add_argument(
        "--outcomes",
        metavar="DIR",
        help="write per-document outcomes to DIR/outcomes/step_<STEP>.npz (rank 0), for `inloop-eval compare`",
    )
    parser.add_argument("--step", type=step_number, help="with --outcomes: the step to file them under (0)")
    parser.add_argument("--strict", action="store_true", help="stop at the first failing task")


def step_number(text: str) -> int:
    """`--step`'s value: a training step, a whole number >= 0 (a negative one names no step file)."""
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a step, a whole number >= 0, found {text!r}")
    return int(text)
