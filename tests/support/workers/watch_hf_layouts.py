"""The watcher on Hugging Face checkpoints under 2 gloo ranks, in one process group; run by the launcher:

    python tests/support/workers/watch_hf_layouts.py --save DIR --config EVAL.yaml --run-root DIR --out DIR

Three watchers in turn: every rank the whole model (`<run-root>/two`), FSDP over the 2 ranks
(`<run-root>/fsdp`, each rank reading only its rows of the safetensors), then tensor parallel over 2
(`<run-root>/tp2`: refused for Hugging Face checkpoints, each step recorded failed). Every rank writes
`<out>/rank<r>.json`: per watcher, the steps it evaluated, its failures and what it read (`ShardRead`s).
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from inloop_eval.watch import WatchConfig
from workers.watch_once import watch_once


def watch(name: str, args: argparse.Namespace, **fields: Any) -> dict[str, Any]:
    config = WatchConfig(
        checkpoint_dir=str(args.save), run_dir=str(args.run_root / name), once=True, settle_s=0, **fields
    )
    return watch_once(config, args.config)


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
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{dist.get_rank()}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
