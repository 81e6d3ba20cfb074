"""`inloop-eval watch CKPT_DIR --config EVAL.yaml --run-dir RUN_DIR`: the command line of the watcher.

W&B (`--wandb`): the figures land at each checkpoint's training step through a custom step metric, not by
resuming the training run. `WandbLogger` defines `eval/*` against `trainer/step` and logs the step as that
key, never as W&B's own `step=`, so a figure logged minutes after training passed its step (or a restarted
watcher's, or one out of order) is drawn at its checkpoint's step and W&B never drops it with its "step
must increase" warning, which it does for a `step=` below the run's current one. Resuming the training run
by id (`--wandb-id`) puts the figures into that run itself, but W&B lets one process write a run at a time:
use it once training has finished (or logs elsewhere); by default the watcher's run is its own, grouped
with training (`--wandb-group`), its curves on the same `trainer/step` axis.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from inloop_eval.checkpoints.formats import CheckpointFormat, checkpoint_formats
from inloop_eval.config_fields import read_config_file
from inloop_eval.data.root import default_data_root
from inloop_eval.data.tokenizer_lookup import find_and_load_tokenizer
from inloop_eval.distributed import init_from_env, world
from inloop_eval.evaluators.config import EvaluatorConfig
from inloop_eval.loggers import MetricsLogger, WandbLogger
from inloop_eval.watch.allocator import map_large_blocks
from inloop_eval.watch.config import POLICIES, WatchConfig
from inloop_eval.watch.loop import Watcher
from inloop_eval.watch.summary import closing_line


def seconds(*, zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, > 0 (or >= 0 with `zero`); argparse names the flag in
    the error, so that `--settle nan` is refused at once rather than found out hours into a watch."""
    least = ">= 0" if zero else "> 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected a finite number of seconds {least}, found {text!r}")
        return value

    return parse


def titles(kept: Callable[[CheckpointFormat], bool]) -> str:
    """The titles of the checkpoint formats `kept` keeps, for the flags' help."""
    return ", ".join(fmt.title for fmt in checkpoint_formats().values() if kept(fmt)) or "no"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", metavar="CKPT_DIR", help="the folder training saves checkpoints to")
    parser.add_argument("--config", required=True, help="the evaluator YAML config used in the loop")
    parser.add_argument(
        "--run-dir", required=True, help="where metrics.jsonl, outcomes/, wandb/ and watch/ go"
    )
    parser.add_argument("--policy", choices=POLICIES, default="all", help="all (default) or latest")
    parser.add_argument(
        "--settle", type=seconds(zero=True), default=10.0, help="seconds unchanged before reading (10)"
    )
    parser.add_argument(
        "--poll", type=seconds(zero=False), default=5.0, help="seconds between scans of CKPT_DIR (5)"
    )
    parser.add_argument(
        "--events",
        metavar="INBOX",
        help="folder trainers announce finished checkpoints in (<INBOX>/<run_id>/step-<N>.ready.json, "
        "written by a trainer's ready-event hook or write_ready_event): each evaluated at once, "
        "CKPT_DIR still scanned every --poll seconds",
    )
    parser.add_argument(
        "--events-poll", type=seconds(zero=False), default=1.0, help="seconds between looks at INBOX (1)"
    )
    parser.add_argument(
        "--lease",
        type=seconds(zero=False),
        metavar="SECONDS",
        help="hold each checkpoint not yet evaluated with a lease expiring SECONDS after its last refresh, "
        "which inloop_eval's rotation helpers respect (default: no leases)",
    )
    parser.add_argument(
        "--hold-failed",
        type=seconds(zero=True),
        metavar="SECONDS",
        help="with --lease: how long a checkpoint that failed and will be tried again (once its files change, "
        "or by a restarted watcher) stays held past its failure before training may rotate it away "
        "(default: the --lease SECONDS); one that failed for good is released at once",
    )
    parser.add_argument("--once", action="store_true", help="evaluate what is there, then exit")
    parser.add_argument(
        "--until-step",
        type=int,
        help="training's last step: evaluate none past it, exit once those up to it are handled",
    )
    parser.add_argument(
        "--redo-in-loop", action="store_true", help="evaluate steps the training loop evaluated, again"
    )
    parser.add_argument("--format", choices=tuple(checkpoint_formats()), help="only this checkpoint format")
    parser.add_argument(
        "--model-builder",
        metavar="MODULE:FUNCTION",
        help=f"builds the model (required for {titles(lambda f: f.needs_builder)} checkpoints, which hold no model "
        "config; e.g. a function of your config registry)",
    )
    parser.add_argument(
        "--tokenizer", help="overrides the config's tokenizer (default: it, else one the checkpoint holds)"
    )
    parser.add_argument("--data-root", help="task data root (default $INLOOP_EVAL_DATA or the cache)")
    parser.add_argument("--device", help="torch device (default cuda if available, else cpu)")
    parser.add_argument(
        "--tp",
        type=int,
        default=1,
        help="under torchrun: build the model tensor parallel over this many ranks, each reading only its "
        f"share of the checkpoint ({titles(lambda f: 'tp' in f.sharded)} checkpoints; default 1)",
    )
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="under torchrun: shard the model with FSDP2 over the data-parallel ranks (world / tp), each "
        f"reading only its shard ({titles(lambda f: 'fsdp' in f.sharded)} checkpoints)",
    )
    parser.add_argument("--wandb", action="store_true", help="log to W&B too (offline unless $WANDB_MODE)")
    parser.add_argument("--wandb-project", default="inloop-eval", help="W&B project")
    parser.add_argument("--wandb-name", help="W&B run name (default: the run directory's name)")
    parser.add_argument("--wandb-group", help="W&B group, e.g. the training run's, to see both together")
    parser.add_argument("--wandb-id", help="resume this W&B run (the training run once it has finished)")


def run(args: argparse.Namespace) -> int:
    """Build the watcher from the arguments and run it: 0 when it exits with every checkpoint it met
    evaluated (or done before), 1 when one failed (the others evaluated; its reason printed)."""
    init_from_env()
    map_large_blocks()  # models loaded and dropped one after another: their memory goes back (`allocator`)
    config = WatchConfig(
        checkpoint_dir=args.checkpoint_dir,
        run_dir=args.run_dir,
        policy=args.policy,
        settle_s=args.settle,
        poll_s=args.poll,
        events_dir=args.events,
        events_poll_s=args.events_poll,
        lease_s=args.lease,
        hold_failed_s=args.hold_failed,
        once=args.once,
        until_step=args.until_step,
        redo_in_loop=args.redo_in_loop,
        format=args.format,
        model_builder=args.model_builder,
        device=args.device,
        tp=args.tp,
        fsdp=args.fsdp,
    )
    evaluator_config = EvaluatorConfig.from_dict(read_config_file(args.config), args.config)
    evaluator_config.data_root = args.data_root or evaluator_config.data_root
    tokenizer = None
    if args.tokenizer:
        root = Path(evaluator_config.data_root or default_data_root()).expanduser()
        tokenizer = find_and_load_tokenizer(args.tokenizer, root)
        evaluator_config.tokenizer = args.tokenizer
    loggers: list[MetricsLogger] = []
    if args.wandb:
        resume = {"id": args.wandb_id, "resume": "allow"} if args.wandb_id else {}
        loggers.append(
            WandbLogger(
                project=args.wandb_project,
                name=args.wandb_name or Path(args.run_dir).name,
                dir=args.run_dir,
                config={"evaluation": evaluator_config, "watch": config},
                group=args.wandb_group,
                **resume,
            )
        )
    try:
        watcher = Watcher(config, evaluator_config, tokenizer=tokenizer, loggers=loggers)
        if world()[1] == 0:
            print(f"watch: {args.checkpoint_dir} -> run directory {watcher.run_dir}", flush=True)
        steps = watcher.run()
    finally:
        for logger in loggers:
            logger.finish()
    if world()[1] == 0:
        print(closing_line(steps, watcher.planner.before or {}, watcher.failures), flush=True)
    if world()[0] > 1 and os.environ.get("RANK") is not None:
        dist.destroy_process_group()
    return 1 if watcher.failures else 0
