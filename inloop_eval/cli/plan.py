"""`inloop-eval plan`: run directories planned (`plan.command`); with no run yet, `plan --calibrate CKPT CKPT
... --config YAML`: each saved model evaluated as `inloop-eval evaluate --model CKPT --config YAML --outcomes
OUT/calibration --step N` evaluates it (its own functions, `cli/evaluate.py`), the figures and their seconds
logged to `OUT/calibration/metrics.jsonl` and the config to its `config.json`, then that calibration run
planned from as any run is. It sits at the command line's layer because it evaluates saved models as
`evaluate` does.

A checkpoint is filed under the step its folder's name holds as a framework names its checkpoints
(`checkpoint-1000`, `step1000`, `step-1000`) where every name holds a distinct one, else under its place in
the list (0, 1, ...). The planner reads a task's checkpoint noise from its residual around a line, which needs
the task evaluated at 3 or more checkpoints: from 2 it plans on the change between them and the per-document
noise, the checkpoint noise counted as 0 (each task's source in plan.json says so). The calibration is kept
for more checkpoints to join it.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch.distributed as dist

from inloop_eval.checkpoints.formats import checkpoint_formats
from inloop_eval.cli import evaluate_flags
from inloop_eval.cli.evaluate import SavedModelEvaluation, evaluate_saved_model, saved_model_format
from inloop_eval.distributed import all_reduce_max, init_from_env, world
from inloop_eval.errors import InLoopEvalError
from inloop_eval.loggers.jsonl import METRICS_FILE, JSONLLogger
from inloop_eval.loggers.outcomes import OUTCOMES_DIR
from inloop_eval.plan.command import plan_and_write, request_of
from inloop_eval.plan.command import run as plan_runs
from inloop_eval.plan.flags import add_arguments
from inloop_eval.plan.runs import PlanError

__all__ = ["add_arguments", "run"]

CALIBRATION_DIR = "calibration"
# Checkpoints --calibrate takes at the least (the planner's MIN_EVALUATIONS; 3 or more show checkpoint noise).
MIN_CHECKPOINTS = 2


def run(args: argparse.Namespace) -> int:
    """The plan of the RUN_DIRs, or of the --calibrate checkpoints once evaluated (module docstring)."""
    if args.calibrate is None:
        if not args.run_dirs:
            raise PlanError(
                "plan: name the run directories to plan from (RUN_DIR ...), or with no run yet the saved "
                f"checkpoints to evaluate first (--calibrate CKPT CKPT ..., {MIN_CHECKPOINTS} or more)"
            )
        return plan_runs(args)
    if args.run_dirs:
        raise PlanError(
            f"plan --calibrate: expected checkpoints only, found run directories too ({', '.join(args.run_dirs)}); "
            "plan from runs without --calibrate, or from checkpoints without RUN_DIRs"
        )
    init_from_env()
    rank = world()[1]
    calibration = calibrate(args)
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank != 0:
        return 0
    try:
        return plan_and_write(request_of(args, runs=(calibration,)), Path(args.out))
    except PlanError as exc:
        raise PlanError(
            f"{exc}. The checkpoints' evaluations are kept in {calibration}: plan from them again with "
            f"`inloop-eval plan {calibration} --budget SECONDS --out DIR` (nothing re-evaluated); more checkpoints "
            f"join them with `inloop-eval evaluate --model CKPT --config YAML --outcomes {calibration} --step N`"
        ) from exc


def calibrate(args: argparse.Namespace) -> Path:
    """Each --calibrate checkpoint evaluated on --config into OUT/calibration (module docstring), in the
    process group joined (if any; rank 0 writes); its path. Every rank checks the checkpoints, and that
    OUT/calibration holds no earlier calibration, and all agree before rank 0 writes anything."""
    checkpoints: list[str] = args.calibrate
    calibration = Path(args.out) / CALIBRATION_DIR
    agree_on_checks(lambda: check_calibration(checkpoints, args.config, calibration, Path(args.out)))
    steps = checkpoint_steps(checkpoints)
    # The table shows the figures; the evaluator's own line per step is for a training loop's log.
    logging.getLogger("inloop_eval.evaluators.orchestrator").setLevel(logging.WARNING)
    logger = JSONLLogger(calibration)
    try:
        for i, (checkpoint, step) in enumerate(zip(checkpoints, steps, strict=True)):
            if world()[1] == 0:
                print(f"calibration {i + 1} of {len(checkpoints)}: {checkpoint} as step {step}", flush=True)
            evaluation = evaluate_checkpoint(args, checkpoint, step, calibration)
            logger.log(evaluation.metrics, step)
            if i == 0:
                logger.log_config(evaluation.config.to_dict())
    finally:
        logger.finish()
    return calibration


def agree_on_checks(check: Callable[[], None]) -> None:
    """Run `check` on every rank; when it fails on any, every rank stops (none left waiting in a collective),
    the one that failed with its own error."""
    try:
        check()
    except InLoopEvalError:
        all_reduce_max(1)
        raise
    if all_reduce_max(0):
        raise PlanError(
            f"plan --calibrate (rank {world()[1]}): another rank refused the checkpoints (see its error)"
        )


def check_calibration(checkpoints: Sequence[str], config: str | None, calibration: Path, out: Path) -> None:
    """PlanError for what would stop the calibration, before anything is evaluated: the checkpoints named
    (`check_checkpoints`), an earlier calibration in OUT, a folder that holds no saved model."""
    check_checkpoints(checkpoints, config)
    check_no_earlier_calibration(calibration, out)
    for checkpoint in checkpoints:
        saved_model_format(checkpoint, "plan --calibrate:")


def check_checkpoints(checkpoints: Sequence[str], config: str | None) -> None:
    """PlanError naming the flag, what was expected and what was found: fewer than MIN_CHECKPOINTS, one named
    twice, or no --config."""
    if len(checkpoints) < MIN_CHECKPOINTS:
        raise PlanError(
            f"plan --calibrate: expected {MIN_CHECKPOINTS} or more checkpoints (saved model folders), found "
            f"{len(checkpoints)} ({', '.join(checkpoints)}); the planner reads each task's signal from the change "
            "between evaluations (and its checkpoint noise from 3 or more)"
        )
    seen: dict[Path, str] = {}
    for checkpoint in checkpoints:
        resolved = Path(checkpoint).resolve()
        if resolved in seen:
            raise PlanError(
                f"plan --calibrate: expected distinct checkpoints, found {checkpoint} named twice "
                f"(as {seen[resolved]} before); the same model evaluated twice shows no checkpoint noise"
            )
        seen[resolved] = checkpoint
    if not config:
        raise PlanError(
            "plan --calibrate: name the evaluator config to evaluate the checkpoints on with --config YAML (its "
            "tasks are those the plan chooses among)"
        )


def checkpoint_steps(checkpoints: Sequence[str]) -> list[int]:
    """The step each checkpoint's folder name holds (module docstring) where every name holds a distinct
    one; else each one's place in the list."""
    formats = checkpoint_formats().values()
    steps = [
        next((s for fmt in formats if (s := fmt.step_of(Path(c).name)) is not None), None)
        for c in checkpoints
    ]
    if None in steps or len(set(steps)) < len(steps):
        return list(range(len(checkpoints)))
    return [s for s in steps if s is not None]


def check_no_earlier_calibration(calibration: Path, out: Path) -> None:
    """PlanError when `calibration` already holds evaluations: they are planned from, never mixed with new ones
    or overwritten."""
    earlier = [calibration / name for name in (METRICS_FILE, OUTCOMES_DIR) if (calibration / name).exists()]
    if earlier:
        raise PlanError(
            f"plan --calibrate: --out {out} holds an earlier calibration ({', '.join(map(str, earlier))}); plan "
            f"from it with `inloop-eval plan {calibration} --budget SECONDS --out DIR`, or choose another --out"
        )


def evaluate_checkpoint(
    args: argparse.Namespace, checkpoint: str, step: int, calibration: Path
) -> SavedModelEvaluation:
    """`inloop-eval evaluate --model CHECKPOINT --config YAML --outcomes CALIBRATION --step STEP` (with the
    plan's --device and --tokenizer), run by evaluate's own functions; PlanError naming the checkpoint and
    the command when it fails or a file is not written."""
    argv = [
        "--model",
        checkpoint,
        "--config",
        args.config,
        "--outcomes",
        str(calibration),
        "--step",
        str(step),
    ]
    argv += ["--device", args.device, *(["--tokenizer", args.tokenizer] if args.tokenizer else [])]
    parser = argparse.ArgumentParser(prog="inloop-eval evaluate")
    evaluate_flags.add_arguments(parser)
    as_evaluated = f"evaluated as `inloop-eval evaluate {' '.join(argv)}`"
    try:
        evaluation = evaluate_saved_model(parser.parse_args(argv))
    except InLoopEvalError as exc:
        raise PlanError(f"plan --calibrate: checkpoint {checkpoint} ({as_evaluated}): {exc}") from exc
    if evaluation.not_written:
        raise PlanError(
            f"plan --calibrate: checkpoint {checkpoint} ({as_evaluated}): {'; '.join(evaluation.not_written)}"
        )
    return evaluation
