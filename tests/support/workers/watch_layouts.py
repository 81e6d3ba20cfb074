"""The watcher in sharded layouts on a real OLMo-core `Trainer`'s checkpoints, in one process group (2 ranks,
gloo); run by the launcher:

    python tests/support/workers/watch_layouts.py --save DIR --config EVAL.yaml --run-root DIR --out DIR \
        [--kill-at STEP]

With `--kill-at`: the watcher, FSDP over 2 ranks, evaluates the checkpoints of `--save` into
`<run-root>/fsdp` and every rank kills itself (SIGKILL) when it starts reading step STEP (its model builder
does it): a whole job killed mid-run. Without: the watcher FSDP over 2 ranks continues `<run-root>/fsdp`
(a restarted job), then one tensor parallel over 2 ranks evaluates every checkpoint into `<run-root>/tp2`,
then one FSDP over 2 ranks evaluates a copy of step 2 (`<run-root>/rewritten-save`) into
`<run-root>/rewritten` while rank 0 rewrites one of its shards in place under its shard reader (truncated
once the reader has it open, written back whole once the reader is done with it). Every rank writes
`<out>/rank<r>.json`: per watcher, the steps it evaluated, what it read of each checkpoint (`ShardRead`s) and
what failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from olmo_core.data import TokenizerConfig

from inloop_eval.checkpoints.shard_reads import ShardReader
from inloop_eval.watch import WatchConfig
from workers.olmo_core_train import model_config
from workers.watch_once import watch_once

# Layout name -> WatchConfig layout fields.
LAYOUTS: dict[str, dict[str, Any]] = {"fsdp": {"fsdp": True}, "tp2": {"tp": 2}}
KILL_AT_ENV = "WATCH_TEST_KILL_AT"
REWRITE: list[bool] = []  # [whether the next read rewrites its shard], once the reader is patched


def olmo_core_config_killed_at_a_step() -> Any:
    """The tiny OLMo-core model's config (`--model-builder`); the rank calling it SIGKILLs itself, once, when
    `$WATCH_TEST_KILL_AT` (`STEP:MARKER_DIR`) names the step whose checkpoint it is asked for: the watcher
    calls the builder for each checkpoint, after recording it started."""
    step, _, markers = os.environ[KILL_AT_ENV].partition(":")
    calls = Path(markers) / f"rank{dist.get_rank()}.calls"
    calls.write_text(str(int(calls.read_text()) + 1 if calls.exists() else 1))
    if int(calls.read_text()) == int(step):
        os.kill(os.getpid(), signal.SIGKILL)
    return model_config(TokenizerConfig.gpt_neox_olmo_dolma_v1_5())


def olmo_core_config_rewriting_a_shard() -> Any:
    """The tiny OLMo-core model's config (`--model-builder`); on rank 0, the first time, the shard reader's
    first read truncates the shard it reads (as DCP's writer opening it "wb" does), and the shard is written
    back whole once the reader is done with it: a shard rewritten in place while the reader has it open.
    Later reads are left alone."""
    if dist.get_rank() == 0 and not REWRITE:
        REWRITE.append(True)
        read_in_place, read_data = ShardReader.read_in_place, ShardReader.read_data
        kept: dict[Path, bytes] = {}

        def truncating(self: ShardReader, item: Any, *args: Any) -> bool:
            if REWRITE[0]:
                REWRITE[0] = False
                shard = Path(self.path) / self.storage_data[item.storage_index].relative_path
                kept[shard] = shard.read_bytes()
                shard.write_bytes(b"")
            return read_in_place(self, item, *args)

        def restoring(self: ShardReader, *args: Any) -> Any:
            try:
                return read_data(self, *args)
            finally:
                for shard, data in kept.items():
                    shard.write_bytes(data)
                kept.clear()

        ShardReader.read_in_place, ShardReader.read_data = truncating, restoring
    return model_config(TokenizerConfig.gpt_neox_olmo_dolma_v1_5())


def watch(layout: str, args: argparse.Namespace, **fields: Any) -> dict[str, Any]:
    config = WatchConfig(
        checkpoint_dir=str(args.save),
        run_dir=str(args.run_root / layout),
        once=True,
        settle_s=0,
        redo_in_loop=True,
        **LAYOUTS[layout],
        **fields,
    )
    return watch_once(config, args.config)


def watch_a_shard_rewritten_while_read(args: argparse.Namespace) -> dict[str, Any]:
    """FSDP over the 2 ranks on a copy of step 2 whose shard rank 0 rewrites while reading it."""
    save = args.run_root / "rewritten-save"
    if dist.get_rank() == 0:
        shutil.copytree(args.save / "step2", save / "step2")
    dist.barrier()
    builder = "workers.watch_layouts:olmo_core_config_rewriting_a_shard"
    config = WatchConfig(
        checkpoint_dir=str(save),
        run_dir=str(args.run_root / "rewritten"),
        once=True,
        settle_s=0,
        redo_in_loop=True,
        fsdp=True,
        model_builder=builder,
    )
    return watch_once(config, args.config)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--save", "--config", "--run-root", "--out"):
        parser.add_argument(name, type=Path, required=True)
    parser.add_argument("--kill-at", type=int)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        if args.kill_at is not None:
            markers = args.out / "markers"
            markers.mkdir(parents=True, exist_ok=True)
            # The builder's calls count the checkpoints read: step N of 0, 2, 4 is call N // 2 + 1.
            os.environ[KILL_AT_ENV] = f"{args.kill_at // 2 + 1}:{markers}"
            watch("fsdp", args, model_builder="workers.watch_layouts:olmo_core_config_killed_at_a_step")
            return
        result = {layout: watch(layout, args) for layout in LAYOUTS}
        result["rewritten"] = watch_a_shard_rewritten_while_read(args)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
