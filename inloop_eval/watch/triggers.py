"""What starts a watch pass and what holds checkpoints meanwhile, on rank 0: the trainer's ready events
(`events`), the folder scan they slow to every `poll_s`, and the leases on checkpoints not yet evaluated
(`leases`).

What it promises: with `events_dir`, each pass takes the events that arrived since the last (a checkpoint
outside the watched folder is left, logged), and those that announced a folder not there yet (a trainer that
writes its event before renaming the folder into place), looked at again at every pass until it appears;
without, every pass scans. With `lease_s`, a thread keeps a
lease on every checkpoint found or announced, still there, not done and not past `until_step`, and `hold`
brings the leases up to date at once (a step just evaluated frees its checkpoint); `stop` releases them all.
A checkpoint that failed for good is done, so released at once; one that failed and waits for its files to
change is held `hold_failed_s` (default `lease_s`) past its failure and then released, so that a watcher
whose every evaluation fails (out of memory) never holds training's disk for as long as it runs; held again
once its files change and it is tried again.
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from pathlib import Path

from inloop_eval.checkpoints.formats import Checkpoint
from inloop_eval.checkpoints.leases import LeaseKeeper, Leases, holder_id
from inloop_eval.errors import InLoopEvalError
from inloop_eval.watch.config import WatchConfig
from inloop_eval.watch.discovery import discover
from inloop_eval.watch.events import Inbox, ReadyEvent, announced_checkpoint
from inloop_eval.watch.ledger import History
from inloop_eval.watch.planning import Planner

log = logging.getLogger(__name__)


class Triggers:
    """Rank 0's events, scan schedule and lease keeper (see the module docstring); on other ranks, none.

    config: the watcher's settings. planner: the pass planner (its folder, what it found). history: what the
    run directory says is done. run_dir: names this watcher's leases. rank0: whether this rank is rank 0.
    """

    def __init__(self, config: WatchConfig, planner: Planner, history: History, run_dir: Path, rank0: bool) -> None:
        self.config = config
        self.planner = planner
        self.history = history
        self.inbox = Inbox(Path(config.events_dir)) if config.events_dir and rank0 else None
        self.next_scan = 0.0
        self.let_go: set[Path] = set()  # failed checkpoints whose lease was released (told once)
        self.early: list[tuple[Checkpoint, ReadyEvent]] = []  # announced, their folder not there yet
        self.keeper = None
        if config.lease_s and rank0:
            look_s = config.events_poll_s if config.events_dir else config.poll_s
            self.keeper = LeaseKeeper(Leases(holder_id(run_dir), config.lease_s), self.to_hold, look_s)

    def start(self) -> None:
        if self.keeper is not None:
            self.keeper.start()

    def stop(self) -> None:
        """Release every lease."""
        if self.keeper is not None:
            self.keeper.stop()

    def pause_s(self) -> float:
        """Seconds to wait after a pass with nothing to evaluate: till the next look at the events, else at
        the folder."""
        if self.config.once:
            return min(self.config.poll_s, 0.5)
        return self.config.events_poll_s if self.config.events_dir else self.config.poll_s

    def scan_due(self) -> bool:
        """Whether this pass lists the checkpoint folder: always without events, else every `poll_s`."""
        now = time.monotonic()
        if self.inbox is None or self.config.once or now >= self.next_scan:
            self.next_scan = now + self.config.poll_s
            return True
        return False

    def announced(self) -> list[tuple[Checkpoint, ReadyEvent]]:
        """The checkpoints of the watched folder that events announced since the last pass, and those
        announced earlier whose folder has appeared since (`early`)."""
        pending, self.early = self.early, []
        for event in self.inbox.take() if self.inbox is not None else []:
            checkpoint = announced_checkpoint(event, self.planner.folder)
            if checkpoint is None:
                log.debug(
                    "watch: %s announces %s, not in the watched folder: left", event.file, event.checkpoint_path
                )
                continue
            log.info("watch: step %d announced by %s", event.step, event.file)
            pending.append((checkpoint, event))
        out = []
        for checkpoint, event in pending:
            if checkpoint.path.is_dir():
                out.append((checkpoint, event))
            elif not self.history.done(checkpoint.step, redo_in_loop=self.config.redo_in_loop):
                self.early.append((checkpoint, event))  # looked at again at the next pass
        return out

    def to_hold(self) -> list[Path]:
        """The checkpoints to hold with a lease: found or announced, still there, not done, not past
        `until_step`. Runs in the lease keeper's thread: it only reads the watcher's state (and lists the
        folder when there are no events, so that a checkpoint landing during a long evaluation is held)."""
        found = list(self.planner.found)
        if self.inbox is not None:
            self.inbox.poll()
            announced = (announced_checkpoint(e, self.planner.folder) for e in list(self.inbox.events))
            found += [c for c in announced if c is not None]
        else:
            with suppress(InLoopEvalError):
                found += discover(self.planner.folder, (self.config.format,) if self.config.format else None)
        until, redo = self.config.until_step, self.config.redo_in_loop
        keep = {
            c.path
            for c in found
            if not self.history.done(c.step, redo_in_loop=redo) and (until is None or c.step <= until)
        }
        return sorted(p for p in keep - self.failed_long_ago() if p.is_dir())

    def failed_long_ago(self) -> set[Path]:
        """The checkpoints that failed (and wait for their files to change) more than `hold_failed_s` ago:
        held no longer. Runs in the lease keeper's thread (the dict is copied whole, under the GIL)."""
        config = self.config
        hold_s = config.hold_failed_s if config.hold_failed_s is not None else config.lease_s or 0.0
        now = time.monotonic()
        gone = {path for path, when in dict(self.planner.failed_at).items() if now - when >= hold_s}
        for path in sorted(gone - self.let_go):
            log.info(
                "watch: %s failed %.0f s ago and is tried again only once its files change: its lease is "
                "released (--hold-failed, default --lease), so training may rotate it away",
                path,
                now - self.planner.failed_at.get(path, now),
            )
        self.let_go = gone
        return gone

    def hold(self) -> None:
        """Bring the leases up to date now: a step just evaluated frees its checkpoint at once."""
        if self.keeper is not None:
            self.keeper.update()
