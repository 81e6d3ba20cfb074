"""The watcher on Hugging Face checkpoints under 2 gloo ranks, in one process group; run by the launcher:

    python tests/support/workers/watch_hf_layouts.py --save DIR --config EVAL.yaml --run-root DIR --out DIR

Watchers in turn: every rank the whole model (`<run-root>/two`), FSDP over the 2 ranks (`<run-root>/fsdp`,
each rank reading only its rows of the safetensors), tensor parallel over 2 (`<run-root>/tp2`: refused for
Hugging Face checkpoints, each step recorded failed); every rank the whole model with rank 1 reading another
copy of the folder (`<run-root>/copies`: the same files for step 10, another copy of step 20's); FSDP on a
copy of step 10 missing a tensor (`<run-root>/damaged`), then again once it is repaired (`repaired`, the
same run directory). Every rank writes `<out>/rank<r>.json`: per watcher, the steps it evaluated, its
failures and what it read (`ShardRead`s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from watch_support import drop_tensor

from inloop_eval.watch import WatchConfig, Watcher
from inloop_eval.watch.planning import Plan
from workers.watch_once import watch_once


class RankOneSeesAMirror(Watcher):
    """A watcher whose rank 1 reads each checkpoint from `mirror` (another mount of the folder)."""

    mirror = Path()

    def broadcast(self, plan: Plan | None) -> Plan:
        plan = super().broadcast(plan)
        if dist.get_rank() == 1:
            plan.evaluate = [dataclasses.replace(c, path=self.mirror / c.path.name) for c in plan.evaluate]
        return plan


def watch(name: str, args: argparse.Namespace, **fields: Any) -> dict[str, Any]:
    config = WatchConfig(
        checkpoint_dir=str(args.save), run_dir=str(args.run_root / name), once=True, settle_s=0, **fields
    )
    return watch_once(config, args.config)


def watch_another_copy(args: argparse.Namespace) -> dict[str, Any]:
    """Every rank the whole model, rank 1 reading a copy of the folder made keeping modification times, in
    which step 20's first safetensors file is step 10's (another copy: other bytes, another time)."""
    RankOneSeesAMirror.mirror = mirror = args.run_root / "mirror"
    if dist.get_rank() == 0:
        shutil.copytree(args.save, mirror)
        first = sorted((mirror / "checkpoint-20").glob("*.safetensors"))[0]
        first.unlink()
        shutil.copyfile(args.save / "checkpoint-10" / first.name, first)
    dist.barrier()
    config = WatchConfig(
        checkpoint_dir=str(args.save), run_dir=str(args.run_root / "copies"), once=True, settle_s=0
    )
    return watch_once(config, args.config, RankOneSeesAMirror)


def watch_a_damaged_copy(args: argparse.Namespace) -> dict[str, Any]:
    """FSDP on a copy of step 10 missing a tensor, then on it repaired, into one run directory."""
    save, saved = args.run_root / "damaged-save", args.save / "checkpoint-10"
    if dist.get_rank() == 0:
        shutil.copytree(saved, save / "checkpoint-10")
        for file in sorted((save / "checkpoint-10").glob("model-*.safetensors")):
            try:
                drop_tensor(file)
                break
            except StopIteration:  # a file of embeddings only
                continue
    dist.barrier()
    config = WatchConfig(
        checkpoint_dir=str(save), run_dir=str(args.run_root / "damaged"), once=True, settle_s=0, fsdp=True
    )
    damaged = watch_once(config, args.config)
    if dist.get_rank() == 0:
        shutil.rmtree(save / "checkpoint-10")
        shutil.copytree(saved, save / "checkpoint-10")
    dist.barrier()
    return {"damaged": damaged, "repaired": watch_once(config, args.config)}


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--save", "--config", "--run-root", "--out"):
        parser.add_argument(name, type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        out = {
            "two": watch("two", args),
            "fsdp": watch("fsdp", args, fsdp=True),
            "tp2": watch("tp2", args, tp=2),
            "copies": watch_another_copy(args),
            **watch_a_damaged_copy(args),
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
