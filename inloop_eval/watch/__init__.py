"""Evaluating checkpoints as they land: a sidecar beside training that evaluates every checkpoint once it is
complete, with the in-loop evaluator's config, and logs its figures at the checkpoint's training step.

Modules (each a role, in the order a checkpoint meets them):
- `discovery`: which folders are checkpoints, of which format, at which step, one per step (`discover`,
  `Checkpoint`, `WatchError`);
- `completion`: each format's completion evidence and the settle time (`missing_evidence`, `Settling`);
- `loading`: one checkpoint's model per format, the vocabulary it records, whether the loop evaluated it;
- `saved_shapes`: a DCP tensor saved with another shape than the model's, named with its checkpoint
  (`shape_mismatch`);
- `layout`: the parallel layout (`--tp`, `--fsdp`) a model is built in under torchrun, and its mesh;
- `shard_reads`: reading a DCP checkpoint so that each rank reads only the slices it holds (`ShardReader`);
- `events`: ready events a trainer writes once a checkpoint is finished (`Inbox`, `write_ready_event`);
- `leases`: the watcher's hold on checkpoints not yet evaluated, and what trainers ask of it (`held`);
- `ledger`: the run directory's record of what was done, for exactly once across restarts (`Ledger`);
- `run_directory`: the check that the run directory is still the one opened (`RunDirectory`);
- `config`: the watcher's settings (`WatchConfig`);
- `planning`: one pass's decisions: what to evaluate, record, wait for (`Planner`, `Plan`);
- `triggers`: what starts a pass (events, the scan every `poll_s`) and the lease keeper (`Triggers`);
- `loop`: the watch loop, evaluating one checkpoint at a time (`Watcher`);
- `allocator`: the C allocator handing a dropped model's memory back (`map_large_blocks`, `trim`);
- `summary`: the lines it prints: a step's headline figures, what a run did;
- `command`: `inloop-eval watch` (`add_arguments`, `run`).

The rule: a step is done when its metrics line is in `metrics.jsonl`; anything else is tried again or
recorded failed with the reason, and one bad checkpoint never stops the others.

Each name below is imported from its module on first use, so that a trainer importing `events` or `leases`
(standard library only) does not import the watcher and the evaluator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inloop_eval.watch.config import WatchConfig
    from inloop_eval.watch.discovery import Checkpoint, WatchError, discover
    from inloop_eval.watch.loop import Watcher

_EXPORTS = {
    "Checkpoint": "inloop_eval.watch.discovery",
    "WatchConfig": "inloop_eval.watch.config",
    "WatchError": "inloop_eval.watch.discovery",
    "Watcher": "inloop_eval.watch.loop",
    "discover": "inloop_eval.watch.discovery",
}

__all__ = ["Checkpoint", "WatchConfig", "WatchError", "Watcher", "discover"]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'inloop_eval.watch' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
