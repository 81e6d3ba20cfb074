"""One pass's decisions, made on rank 0: which checkpoints to evaluate now, which to record as not evaluated
(and why), and whether the watch is over.

What a pass promises:
- one checkpoint per step: two folders naming one step (`checkpoint-10`, `checkpoint-00010`) are warned
  about, naming both, and only the one named as its framework names it is evaluated (`one_per_step`);
- a checkpoint is evaluated only once its completion evidence is there and it has settled (`completion`);
  one that cannot even be looked at (unreadable, a damaged header) is recorded failed with the reason, and
  the others go on;
- a checkpoint that failed in this process is tried again once its files change (a missing shard landing
  late), else by a restarted watcher; when it failed is kept (`failed_at`), so that its lease can end;
- with `until_step`, no checkpoint past it is evaluated;
- a checkpoint its trainer announced (`events`) is looked at without scanning the folder and without its
  settle time (its completion evidence is still required); a pass that does not scan plans over the last
  scan's checkpoints and the announced ones still there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inloop_eval.checkpoints.formats import Checkpoint
from inloop_eval.errors import InLoopEvalError
from inloop_eval.watch.completion import Fingerprint, Settling, fingerprint
from inloop_eval.watch.config import WatchConfig
from inloop_eval.watch.discovery import discover, no_checkpoint_error, one_per_step
from inloop_eval.watch.events import ReadyEvent
from inloop_eval.watch.ledger import FAILED, IN_LOOP, SKIPPED, History
from inloop_eval.watch.loading import evaluated_in_loop, require_builder

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """One pass's decisions (rank 0's, broadcast): what to evaluate, what to record as not evaluated, whether
    the watcher is done, and the error that stops it (every rank raises it)."""

    evaluate: list[Checkpoint] = field(default_factory=list)
    skip: list[tuple[Checkpoint, str, str]] = field(default_factory=list)  # (checkpoint, status, reason)
    finished: bool = False
    error: str | None = None


def describe(error: BaseException) -> str:
    """`Type: message` of an error (our own errors: their message, which says what); for
    torch.distributed.checkpoint's `CheckpointException` (which wraps each rank's failure), the first
    rank's."""
    if isinstance(error, InLoopEvalError):
        return str(error).removeprefix("watch: ")
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        inner = first[0] if isinstance(first, tuple) and first else first
        if isinstance(inner, BaseException):
            return describe(inner)
    return f"{type(error).__name__}: {error}"


class Planner:
    """Rank 0's decisions, pass after pass (see the module docstring).

    history: what the run directory says is done, updated by the watcher as it goes.
    failed: checkpoint path -> its files when it failed in this process; tried again once they change.
    failed_at: checkpoint path -> when (`time.monotonic`) it failed, for those in `failed`.
    announced: checkpoint path -> the event that announced it (read settled: its trainer says it is done).
    before: why -> the steps found at the first pass that were done before it (`History.why_done`)."""

    def __init__(self, config: WatchConfig, history: History) -> None:
        self.config = config
        self.folder = Path(config.checkpoint_dir)
        self.history = history
        self.settling = Settling(config.settle_s)
        self.failed: dict[Path, Fingerprint | None] = {}
        self.failed_at: dict[Path, float] = {}
        self.found: list[Checkpoint] = []
        self.announced: dict[Path, ReadyEvent] = {}
        self.told: set[tuple[str, Path]] = set()  # what was logged at INFO once, by checkpoint
        self.before: dict[str, list[int]] | None = None

    def plan(self, announced: Sequence[tuple[Checkpoint, ReadyEvent]] = (), *, scan: bool = True) -> Plan:
        """What this pass evaluates and records, from the folder (listed when `scan`, else the last listing's
        checkpoints), the checkpoints `announced` since the last pass, and the run directory."""
        for checkpoint, event in announced:
            self.announced.setdefault(checkpoint.path, event)
        self.found = found = self.discovered() if scan else self.known([c for c, _ in announced])
        if self.before is None:
            self.before = {}
            for checkpoint in found:
                why = self.history.why_done(checkpoint.step, redo_in_loop=self.config.redo_in_loop)
                if why is not None:
                    self.before.setdefault(why, []).append(checkpoint.step)
        plan = Plan()
        pending = [c for c in found if not self.history.done(c.step, redo_in_loop=self.config.redo_in_loop)]
        until = self.config.until_step
        for checkpoint in [c for c in pending if until is not None and c.step > until]:
            self.tell(
                "past",
                checkpoint,
                f"watch: step {checkpoint.step} is past --until-step {until}: not evaluated",
            )
        pending = [c for c in pending if until is None or c.step <= until]
        ready, waiting, why = self.ready_among(pending, plan)
        plan.evaluate = self.by_policy(ready, pending, plan)
        self.finish(plan, found, pending, waiting, why)
        return plan

    def discovered(self) -> list[Checkpoint]:
        """One checkpoint per step in the folder; an error for a folder that cannot hold any (or none with
        `once`), or for checkpoints the watcher was given no way to build."""
        config = self.config
        found = discover(self.folder, (config.format,) if config.format else None)
        if not found:
            error = no_checkpoint_error(self.folder)
            # Watching, an empty folder is training that has not saved yet; one whose sub-folder holds the
            # checkpoints is the wrong folder, which waiting would never mend.
            if config.once or "watch that folder" in str(error):
                raise error
            self.tell(
                "empty",
                self.folder,
                f"watch: no checkpoint in {self.folder} yet; looking every {config.poll_s:g} s",
            )
            return []
        require_builder(found[0], config.model_builder)
        kept, groups = one_per_step(found)
        for group in groups:
            others = ", ".join(str(c.path) for c in group[1:])
            self.tell(
                "duplicate",
                group[0].path,
                f"watch: {group[0].path} and {others} all name step {group[0].step}; only "
                f"{group[0].path.name} is evaluated (the name its framework gives, else the first by name): "
                "remove or rename the other",
                level=logging.WARNING,
            )
        return kept

    def known(self, announced: list[Checkpoint]) -> list[Checkpoint]:
        """Without a scan: the last scan's checkpoints and the announced ones, those still there, one per
        step."""
        config = self.config
        fresh = [c for c in announced if config.format is None or c.format == config.format]
        if fresh:
            require_builder(fresh[0], config.model_builder)
        by_path = {c.path: c for c in [*self.found, *fresh] if c.path.is_dir()}
        return one_per_step(sorted(by_path.values()))[0]

    def ready_among(
        self, pending: list[Checkpoint], plan: Plan
    ) -> tuple[list[Checkpoint], bool, dict[Path, str]]:
        """The pending checkpoints complete and settled, whether one is still being written, and what each
        of the others lacks; those the training loop evaluated itself, and those that cannot be looked at,
        go to `plan.skip`."""
        config, now = self.config, time.monotonic()
        ready: list[Checkpoint] = []
        waiting = False
        why: dict[Path, str] = {}
        for checkpoint in pending:
            if self.failed_as_is(checkpoint):
                continue
            try:
                if not config.redo_in_loop and evaluated_in_loop(checkpoint):
                    self.history.in_loop.add(checkpoint.step)
                    reason = "the training loop evaluated this step (its checkpoint says so)"
                    plan.skip.append((checkpoint, IN_LOOP, reason))
                    continue
                is_ready, why[checkpoint.path] = self.settling.ready(
                    checkpoint,
                    now,
                    needs_config=not config.model_builder,
                    settled=checkpoint.path in self.announced,
                )
            except Exception as exc:  # noqa: BLE001 - one unreadable or damaged checkpoint stops no other
                self.fail(checkpoint, fingerprint(checkpoint.path))
                plan.skip.append((checkpoint, FAILED, f"cannot be looked at: {describe(exc)}"))
                continue
            if is_ready:
                ready.append(checkpoint)
                continue
            settling = why[checkpoint.path].startswith(("changed", "unchanged"))
            waiting |= settling
            if not settling:
                self.tell(
                    "incomplete",
                    checkpoint.path,
                    f"watch: step {checkpoint.step} at {checkpoint.path} is not complete yet: "
                    + why[checkpoint.path],
                )
            log.debug("watch: step %d not ready: %s", checkpoint.step, why[checkpoint.path])
        return ready, waiting, why

    def fail(self, checkpoint: Checkpoint, files: Fingerprint | None) -> None:
        """Remember that `checkpoint` failed now, its files `files` when it was read: not tried again in this
        process until they change."""
        self.failed.setdefault(checkpoint.path, files)
        self.failed_at.setdefault(checkpoint.path, time.monotonic())

    def failed_as_is(self, checkpoint: Checkpoint) -> bool:
        """Whether `checkpoint` failed in this process and its files have not changed since."""
        if checkpoint.path not in self.failed:
            return False
        if fingerprint(checkpoint.path) == self.failed[checkpoint.path]:
            return True
        del self.failed[checkpoint.path]
        self.failed_at.pop(checkpoint.path, None)
        log.info(
            "watch: step %d at %s changed since it failed: tried again", checkpoint.step, checkpoint.path
        )
        return False

    def by_policy(self, ready: list[Checkpoint], pending: list[Checkpoint], plan: Plan) -> list[Checkpoint]:
        """What to evaluate of `ready`: all of it (policy `all`), or the newest, the older ones recorded as
        skipped (policy `latest`)."""
        if self.config.policy != "latest" or not ready:
            return ready
        newest = ready[-1]
        for checkpoint in pending:
            if checkpoint.step < newest.step and checkpoint not in [s[0] for s in plan.skip]:
                reason = f"policy latest: step {newest.step} was ready, evaluated instead"
                plan.skip.append((checkpoint, SKIPPED, reason))
                self.history.skipped.add(checkpoint.step)
        return [newest]

    def finish(
        self,
        plan: Plan,
        found: list[Checkpoint],
        pending: list[Checkpoint],
        waiting: bool,
        why: dict[Path, str],
    ) -> None:
        """Whether the watch ends after this pass: a checkpoint at or past `until_step` there and every one
        up to it handled, or `once` with nothing still being written (the incomplete ones named, with what
        they lack)."""
        config = self.config
        handled = {c.step for c in found if self.history.done(c.step, redo_in_loop=config.redo_in_loop)}
        handled |= {c.step for c in plan.evaluate} | {c.step for c, _, _ in plan.skip}
        handled |= {c.step for c in found if c.path in self.failed}
        if config.until_step is not None and any(c.step >= config.until_step for c in found):
            # Policy `all` may evaluate a later checkpoint while an earlier one is still settling.
            plan.finished = all(c.step in handled for c in found if c.step <= config.until_step)
        if config.once and not waiting:
            left = [c for c in pending if c.step not in handled]
            for checkpoint in left if not plan.evaluate else []:
                log.warning(
                    "watch --once: step %d at %s is incomplete, not evaluated: %s",
                    checkpoint.step,
                    checkpoint.path,
                    why.get(checkpoint.path, "not ready"),
                )
            plan.finished = True

    def tell(self, what: str, about: Path | Checkpoint, message: str, level: int = logging.INFO) -> None:
        """Log `message` the first time `what` happens to `about` in this process."""
        key = (what, about.path if isinstance(about, Checkpoint) else about)
        if key not in self.told:
            self.told.add(key)
            log.log(level, "%s", message)
