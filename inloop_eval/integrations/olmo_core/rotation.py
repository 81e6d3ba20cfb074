"""OLMo-core's checkpoint rotation (`CheckpointerCallback.max_checkpoints`, and its removal of ephemeral
checkpoints) kept off the checkpoints an `inloop-eval watch --lease` holds, until they are evaluated.

    trainer_config = trainer_config.with_callback("keep_leased", KeepLeasedCheckpointsCallback())

How OLMo-core 3.0.0 deletes: `CheckpointerCallback` queues each checkpoint past `max_checkpoints` (and each
older ephemeral one) in its `_checkpoints_to_remove` list, and removes the whole list at the start of its
next `post_train_batch` when no asynchronous save is pending. It offers no hook to veto a removal; this
callback runs just before it in each `post_train_batch` (a higher `priority`) and edits that list in place:
a checkpoint a live lease holds (`inloop_eval.checkpoints.leases.held`) moves out of it into `held`, and goes back
to it at the first step its lease is gone (released once evaluated, or expired when the watcher died), to
be removed by the checkpointer as before. Nothing else of the checkpointer changes: what is saved, when,
and which checkpoint rotation picks. Rank 0 reads the leases and broadcasts what it found, so every rank
keeps the same list. A lease file or folder rank 0 cannot read (another user's, written private) holds its
checkpoint too, with a warning naming it: never a PermissionError out of the callback, never a removal on
a guess. A checkpoint on a URL (object storage) cannot carry a lease and rotates as before.
A checkpoint still held when training ends stays on disk (as OLMo-core leaves the last one it queued).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

from olmo_core.distributed.utils import broadcast_object, get_rank, is_distributed
from olmo_core.io import is_url
from olmo_core.train.callbacks import Callback, CheckpointerCallback

from inloop_eval.checkpoints import leases
from inloop_eval.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class KeepLeasedCheckpointsCallback(Callback):
    """Keeps checkpoints a watcher's lease holds out of OLMo-core's rotation until the lease is gone (see
    the module docstring). held: the checkpoints rotation picked that are kept for now, oldest first."""

    priority: ClassVar[int] = CheckpointerCallback.priority + 1
    enabled: bool = True
    held: list[str] = field(default_factory=list)

    def checkpointer(self) -> CheckpointerCallback | None:
        found = [cb for cb in self.trainer.callbacks.values() if isinstance(cb, CheckpointerCallback)]
        return found[0] if found else None

    def pre_train(self) -> None:
        checkpointer = self.checkpointer()
        if not self.enabled or checkpointer is None:
            return
        order = list(self.trainer.callbacks.values())
        if order.index(self) > order.index(checkpointer):
            raise ConfigError(
                "KeepLeasedCheckpointsCallback: it must run before the CheckpointerCallback to keep its "
                f"removals, found priority {self.priority} against the checkpointer's {checkpointer.priority}; "
                "leave both priorities as they are"
            )

    def post_train_batch(self) -> None:
        checkpointer = self.checkpointer()
        if not self.enabled or checkpointer is None:
            return
        queued = checkpointer._checkpoints_to_remove  # noqa: SLF001 - the one list OLMo-core removes from
        candidates = self.held + [p for p in queued if p not in self.held]
        if not candidates:
            return
        leased = leased_among(candidates)
        self.tell_changes(candidates, leased)
        self.held = [p for p in candidates if p in leased]
        queued[:] = [p for p in candidates if p not in leased]
        if get_rank() == 0:
            for path in queued:
                if not is_url(path):
                    leases.forget(path)  # its expired or released leases go with it

    def tell_changes(self, candidates: list[str], leased: list[str]) -> None:
        """Log each checkpoint newly kept from rotation, and each handed back to it."""
        for path in candidates:
            if path in leased and path not in self.held:
                log.info("Keeping checkpoint '%s' from rotation: a watcher holds it until it is evaluated", path)
            elif path not in leased and path in self.held:
                log.info("Checkpoint '%s' is no longer held: removed as rotation picked", path)


def leased_among(paths: list[str]) -> list[str]:
    """The `paths` a live lease holds, read by rank 0 and broadcast, so that every rank keeps the same list (a
    URL cannot carry a lease)."""
    leased = [p for p in paths if not is_url(p) and leases.held(p)] if get_rank() == 0 else []
    return broadcast_object(leased) if is_distributed() else leased
