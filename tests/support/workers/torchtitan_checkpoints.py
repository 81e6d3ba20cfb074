"""torchtitan's real `Trainer` on CPU (one gloo process) saving a DCP checkpoint at every step into
`<work>/dump/checkpoint/step-<N>/`, with the in-loop validator at torchtitan's validation steps (1 and 2):
the checkpoints the watcher's tests read, and the in-loop figures to compare with. Run by torchrun:

    torchrun --nproc_per_node 1 tests/support/workers/torchtitan_checkpoints.py --data-root DIR --work DIR
        --out DIR --config EVAL.yaml

Writes `<out>/in_loop.json`: the validator's figures per step. The checkpoint manager is
`KeepLeasedCheckpointManager` keeping the latest 2, beside three planted folders of step 0: its purge after
step 1's save (torchtitan purges after every save but the last) picks `step-0`, held by a lease, and
`step-00`, not held (and keeps `step-000` and `step-1`, the latest 2); `<out>/purge.json` says which of the
two training left, and the planted folders are removed after it (the watcher's tests see torchtitan's own
checkpoints only). `model_config()` is the watcher's
`--model-builder` for these checkpoints (tests/support on the path).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torchtitan_cpu

from inloop_eval.checkpoints.leases import Leases
from inloop_eval.integrations.torchtitan.rotation import KeepLeasedCheckpointManager
from workers.torchtitan_train import N_LAYERS, VOCAB, MetricsRecorder, trainer_config

STEPS = 2


def model_config() -> Any:
    """torchtitan's llama3 debug config as the trainer above trains it (N_LAYERS layers, the NeoX vocabulary,
    SDPA, float32 parameters, DTensor tensor parallelism): what the watcher builds the model from
    (`model_spec.model.build()`, or in a sharded layout its `parallelize_fn` too), torchtitan set up for the
    CPU first (`torchtitan_cpu.use_cpu`)."""
    torchtitan_cpu.use_cpu()
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    model = config.model_spec.model
    model.layers = model.layers[:N_LAYERS]
    model.vocab_size = model.tok_embeddings.num_embeddings = model.lm_head.out_features = VOCAB
    torchtitan_cpu.cpu_model_config(model)
    config.training.mixed_precision_param = "float32"
    config.parallelism.spmd_backend = "partial_dtensor"
    return config


class Recording:
    """Keeps the validator's figures after each validation."""

    def __init__(self, validator: Any) -> None:
        self.validator, self.by_step = validator, {}
        validate = validator.validate

        def validate_and_keep(model_parts: Any, step: int) -> Any:
            out = validate(model_parts, step)
            self.by_step[str(step)] = dict(validator.last_metrics)
            return out

        validator.validate = validate_and_keep


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--data-root", "--work", "--out", "--config"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    args.tp, args.dp_shard, args.dp_replicate = 1, 1, 1
    torch.set_num_threads(1)
    torchtitan_cpu.use_cpu()
    config = trainer_config(args)
    config.training.steps = STEPS
    config.checkpoint = KeepLeasedCheckpointManager.Config(
        enable=True, interval=1, folder="checkpoint", keep_latest_k=2
    )
    folder = Path(config.dump_folder) / "checkpoint"
    held, free, latest = folder / "step-0", folder / "step-00", folder / "step-000"
    for planted in (held, free, latest):
        planted.mkdir(parents=True)
    leases = Leases("torchtitan-worker", 600)
    leases.hold([held])
    trainer = config.build()
    try:
        trainer.metrics_processor.logger = MetricsRecorder()
        recording = Recording(trainer.validator)
        trainer.train()
        (Path(args.out) / "in_loop.json").write_text(json.dumps(recording.by_step, indent=1, sort_keys=True))
    finally:
        trainer.close()  # joins torchtitan's purge thread
        left = {"held": held.is_dir(), "free": free.is_dir()}
        (Path(args.out) / "purge.json").write_text(json.dumps(left))
        leases.release_all()
        for planted in (held, free, latest):
            shutil.rmtree(planted, ignore_errors=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
