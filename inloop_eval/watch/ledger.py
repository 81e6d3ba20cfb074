"""The run directory's record of what the watcher did, so that a restarted watcher evaluates no step twice
and skips none.

What counts as evaluated is what the run directory holds: a step has been evaluated when `metrics.jsonl`
has a line of `eval/...` figures at it. That line is one whole-line append (`JSONLLogger`), written after
the step's per-document outcomes and W&B figures, so it is the commit of an evaluation: a watcher killed
before it re-evaluates the step, one killed after it does not.

Beside it, `<run_dir>/watch/ledger.jsonl` holds one JSON line per event, appended whole in one write:
- `started`: about to read a checkpoint. A step with `started` and a metrics line was evaluated by a
  watcher; a metrics line without one was evaluated by someone else: the training loop (in-loop);
- `evaluated`: its figures are logged;
- `skipped`: never evaluated by choice (policy `latest` moved past it; `reason` says);
- `in_loop`: not evaluated because the training loop already had (unless asked to redo it);
- `vanished`: deleted or rewritten while being read: nothing logged; a new checkpoint at that step is
  evaluated when it lands;
- `failed`: could not be read for another reason (`reason`); tried again by a restarted watcher.

`<run_dir>/watch/lock` is held (`flock`) while a watcher runs: a second watcher on one run directory would
evaluate the same steps, and is refused.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inloop_eval.keys import PREFIX
from inloop_eval.loggers import METRICS_FILE
from inloop_eval.watch.discovery import Checkpoint, WatchError

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

WATCH_DIR = "watch"
LEDGER_FILE = "ledger.jsonl"
LOCK_FILE = "lock"
STARTED, EVALUATED, SKIPPED, IN_LOOP, VANISHED, FAILED = (
    "started",
    "evaluated",
    "skipped",
    "in_loop",
    "vanished",
    "failed",
)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a line cut off by a killed writer is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    rows = []
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def metrics_steps(run_dir: Path) -> dict[int, int]:
    """Step -> how many lines of `eval/...` figures `metrics.jsonl` holds at it."""
    counts: dict[int, int] = {}
    for row in read_jsonl(run_dir / METRICS_FILE):
        step = row.get("step")
        if isinstance(step, int) and any(str(k).startswith(f"{PREFIX}/") for k in row):
            counts[step] = counts.get(step, 0) + 1
    return counts


@dataclass
class History:
    """What the run directory says about each step.

    by_watcher: evaluated by a watcher (its `started` entry and a metrics line, or `evaluated`).
    in_loop: evaluated by someone else (a metrics line and no `started`), or recorded `in_loop`.
    skipped: recorded `skipped` (policy `latest`)."""

    by_watcher: set[int] = field(default_factory=set)
    in_loop: set[int] = field(default_factory=set)
    skipped: set[int] = field(default_factory=set)

    def done(self, step: int, *, redo_in_loop: bool) -> bool:
        """Whether `step` needs no evaluation."""
        return step in self.by_watcher or step in self.skipped or (step in self.in_loop and not redo_in_loop)


class Ledger:
    """`<run_dir>/watch/ledger.jsonl`, appended to, and the run directory's lock, held until `close`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.folder = run_dir / WATCH_DIR
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
        if fcntl is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_fd)
                raise WatchError(
                    f"watch: another watcher holds {self.folder / LOCK_FILE}: two watchers on one run "
                    "directory would evaluate the same steps; stop it or pass another --run-dir"
                ) from None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    @property
    def path(self) -> Path:
        return self.folder / LEDGER_FILE

    def record(self, status: str, checkpoint: Checkpoint | int, **extra: Any) -> None:
        """Append one entry: `status` for a checkpoint (or a bare step), with `extra` fields."""
        if isinstance(checkpoint, Checkpoint):
            entry: dict[str, Any] = {
                "step": checkpoint.step,
                "status": status,
                "checkpoint": str(checkpoint.path),
            }
        else:
            entry = {"step": int(checkpoint), "status": status}
        entry |= {**extra, "time": time.time()}
        data = (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8")
        os.write(self._fd, data)
        os.fsync(self._fd)

    def entries(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path)

    def history(self) -> History:
        """What is done, from the ledger and `metrics.jsonl` together (see the module docstring)."""
        history = History()
        started: set[int] = set()
        for entry in self.entries():
            step, status = entry.get("step"), entry.get("status")
            if not isinstance(step, int):
                continue
            if status == STARTED:
                started.add(step)
            elif status == EVALUATED:
                history.by_watcher.add(step)
            elif status == SKIPPED:
                history.skipped.add(step)
            elif status == IN_LOOP:
                history.in_loop.add(step)
        for step in metrics_steps(self.run_dir):
            (history.by_watcher if step in started else history.in_loop).add(step)
        history.in_loop -= history.by_watcher
        return history

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            try:
                os.close(fd)
            except OSError:
                pass
