"""Evaluating checkpoints as they land: a sidecar beside training that evaluates every checkpoint once it is
complete, with the in-loop evaluator's config, and logs its figures at the checkpoint's training step.

Modules (each a role, in the order a checkpoint meets them):
- `discovery`: which folders are checkpoints, of which format, at which step (`discover`, `Checkpoint`,
  `WatchError`);
- `completion`: each format's completion evidence and the settle time (`missing_evidence`, `Settling`);
- `loading`: one checkpoint's model per format, the vocabulary it records, whether the loop evaluated it;
- `ledger`: the run directory's record of what was done, for exactly once across restarts (`Ledger`);
- `config`: the watcher's settings (`WatchConfig`);
- `loop`: the watch loop (`Watcher`);
- `command`: `inloop-eval watch` (`add_arguments`, `run`).
"""

from inloop_eval.watch.config import WatchConfig
from inloop_eval.watch.discovery import Checkpoint, WatchError, discover
from inloop_eval.watch.loop import Watcher

__all__ = ["Checkpoint", "WatchConfig", "WatchError", "Watcher", "discover"]
