"""torchtitan's checkpoint purge (`checkpoint.keep_latest_k`) kept off the checkpoints an
`inloop-eval watch --lease` holds, until they are evaluated.

    config.checkpoint = KeepLeasedCheckpointManager.Config(**fields)   # in place of CheckpointManager.Config

How torchtitan 0.3.0 purges: after each save, `CheckpointManager._purge_stale_checkpoints` (rank 0 only,
when `_should_purge()`) lists the checkpoint folder, picks every `step-<N>` but the newest `keep_latest_k`,
and puts each on `purge_queue`, which a thread empties with `rmtree`. torchtitan 0.3.0 offers no per-
checkpoint exemption hook (`_should_purge` is its documented subclass guard, and vetoes a whole purge); the
least this manager changes is the queue those picks are put on: during its purge a checkpoint a live lease
holds (`inloop_eval.checkpoints.leases.held`) is not put on the queue, and is picked again at the next save,
once its lease is gone (released once evaluated, or expired when the watcher died); a lease file or folder
this user cannot read holds it too, with a warning naming it, never raising out of the purge. Which
checkpoints are picked, when, and how they are deleted stay torchtitan's. A checkpoint still held when
training ends stays on disk.
"""

from __future__ import annotations

import logging
import queue
from dataclasses import dataclass

from torchtitan.components.checkpointer import CheckpointManager

from inloop_eval.checkpoints import leases

log = logging.getLogger(__name__)


class HoldLeased:
    """Stands in for torchtitan's purge queue during one purge: passes on each path put on it unless a lease
    holds that checkpoint; `kept`: the paths held back."""

    def __init__(self, purge_queue: queue.Queue[str | None]) -> None:
        self.purge_queue = purge_queue
        self.kept: list[str] = []

    def put(self, path: str | None) -> None:
        if path is not None and leases.held(path):
            self.kept.append(path)
            return
        if path is not None:
            leases.forget(path)  # its expired or released leases go with it
        self.purge_queue.put(path)


class KeepLeasedCheckpointManager(CheckpointManager):
    """torchtitan's `CheckpointManager` whose purge keeps checkpoints a watcher's lease holds (see the module
    docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    def _purge_stale_checkpoints(self) -> None:
        if not self._should_purge():
            return
        real = self.purge_queue
        holding = HoldLeased(real)
        self.purge_queue = holding  # type: ignore[assignment]
        try:
            super()._purge_stale_checkpoints()
        finally:
            self.purge_queue = real
        for path in holding.kept:
            log.info("Keeping checkpoint '%s' from the purge: a watcher holds it until it is evaluated", path)
