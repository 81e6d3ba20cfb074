"""`inloop-eval plan`'s flags: declared apart from the command (`command.py`, and `cli/calibrate.py` for
`--calibrate`), which loads torch through the engine, so that `inloop-eval plan --help` answers at once."""

from __future__ import annotations

import argparse


def positive_number(text: str) -> float:
    """A flag's value: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number above 0, found {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        nargs="*",
        metavar="RUN_DIR",
        help="run directories with per-document outcomes (outcomes/step_<N>.npz) at 2 or more evaluations "
        "(3 or more show checkpoint noise); one "
        "run: signal is its trend; several (one factor apart): the spread between them. None with --calibrate",
    )
    parser.add_argument(
        "--calibrate",
        nargs="+",
        metavar="CKPT",
        help="with no run yet: 2 or more saved model folders (those `inloop-eval evaluate --model` loads), each "
        "evaluated on --config with its outcomes kept in DIR/calibration of --out (filed under the step its "
        "folder name holds, e.g. checkpoint-1000, else under its place in this list), then planned from as a run; a "
        "task's checkpoint noise shows at 3 or more of them (from 2 it is counted as 0)",
    )
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument(
        "--budget", type=positive_number, metavar="SECONDS", help="seconds one evaluation may take"
    )
    budget.add_argument(
        "--budget-fraction",
        type=positive_number,
        metavar="F",
        help="the budget as a fraction of the training between two evaluations (the median of the runs' "
        "eval/interval_seconds, which a training loop's evaluations log), e.g. 0.05 for an evaluation that "
        "costs 5%% of the training time",
    )
    budget.add_argument(
        "--eval-fraction",
        type=positive_number,
        metavar="F",
        help="the budget as a fraction of the seconds the runs' evaluations took (the median of their "
        "eval/seconds, the first evaluation left out), e.g. 1 for the runs' own cost",
    )
    parser.add_argument(
        "--seconds-per-token",
        type=positive_number,
        metavar="X",
        help="seconds per token forwarded on the machine the plan is for (default: the runs' measured "
        "eval/seconds / eval/tokens_forwarded)",
    )
    parser.add_argument(
        "--config",
        metavar="YAML",
        help="the evaluator config the runs used (default: the one their config.json logged); with "
        "--calibrate (required): the config the checkpoints are evaluated on, its tasks those the plan chooses "
        "among (a `limit:` per task keeps the calibration short)",
    )
    parser.add_argument(
        "--tokenizer",
        help="with --calibrate: the tokenizer to evaluate with, as `inloop-eval evaluate --tokenizer` takes it "
        "(default: the config's, else each checkpoint's own)",
    )
    parser.add_argument(
        "--plain-rows",
        action="store_true",
        help="price for a model that takes input_ids only (no packed rows, no kept prefixes); default: a packing "
        "model (the reference GPT, and every framework whose adapter packs rows)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="the device type the planner's row cost model assumes, and with --calibrate the device the "
        "checkpoints are evaluated on (default cpu)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="where to write plan.yaml and plan.json (with --calibrate, the checkpoints' evaluations too: "
        "DIR/calibration)",
    )
