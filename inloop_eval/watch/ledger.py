"""The run directory's record of what the watcher did, so that a restarted watcher evaluates no step twice
and skips none.

The rule: a step is done when `metrics.jsonl` holds its line of `eval/...` figures; anything else is tried
again, or recorded failed with the reason. That line is one whole-line append (`JSONLLogger`), written after
the step's per-document outcomes and W&B figures, so it is the commit of an evaluation: a watcher killed
before it re-evaluates the step, one killed after it does not, and a line that could not be written (a full
disk) or that was cleaned away since leaves the step to be evaluated again, whatever the ledger says.

Beside it, `<run_dir>/watch/ledger.jsonl` holds one JSON line per event, appended whole in one write (after
a newline when the last line was cut off, so a cut-off line never swallows the next):
- `started`: about to read a checkpoint. A step with `started` and a metrics line was evaluated by a
  watcher; a metrics line without one was evaluated by someone else: the training loop (in-loop);
- `evaluated`: its figures are logged and its metrics line is in `metrics.jsonl` (a record for the reader:
  the metrics line alone decides);
- `skipped`: never evaluated by choice (policy `latest` moved past it; `reason` says);
- `in_loop`: not evaluated because the training loop already had (unless asked to redo it);
- `vanished`: deleted or rewritten while being read: nothing logged; a new checkpoint at that step is
  evaluated when it lands;
- `failed`: not evaluated, `reason` says why. With `retry: false` the config cannot take the checkpoint
  (`config` is the evaluator config's fingerprint): a restarted watcher with that config does not try it
  again, one with another config does; otherwise (unreadable, damaged, a metrics line not written) it is
  tried again by a restarted watcher.

`<run_dir>/watch/lock` is held (`flock`) while a watcher runs: a second watcher on one run directory would
evaluate the same steps, and is refused.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inloop_eval.checkpoints.formats import Checkpoint
from inloop_eval.keys import PREFIX
from inloop_eval.loggers import METRICS_FILE
from inloop_eval.loggers.jsonl import ends_a_line
from inloop_eval.watch.discovery import WatchError

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

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

    by_watcher: evaluated by a watcher (its `started` entry and a metrics line).
    in_loop: evaluated by someone else (a metrics line and no `started`), or recorded `in_loop`.
    skipped: recorded `skipped` (policy `latest`).
    refused: recorded `failed` with `retry: false` under the current config (it cannot take them)."""

    by_watcher: set[int] = field(default_factory=set)
    in_loop: set[int] = field(default_factory=set)
    skipped: set[int] = field(default_factory=set)
    refused: set[int] = field(default_factory=set)

    def done(self, step: int, *, redo_in_loop: bool) -> bool:
        """Whether `step` needs no evaluation."""
        return self.why_done(step, redo_in_loop=redo_in_loop) is not None

    def why_done(self, step: int, *, redo_in_loop: bool) -> str | None:
        """Why `step` needs no evaluation, in a few words; None when it needs one."""
        if step in self.by_watcher:
            return f"in {METRICS_FILE}"
        if step in self.in_loop and not redo_in_loop:
            return "evaluated in the training loop"
        if step in self.skipped:
            return "skipped (policy latest)"
        if step in self.refused:
            return "failed: the config cannot take it"
        return None


class Ledger:
    """`<run_dir>/watch/ledger.jsonl`, appended to, and the run directory's lock, held until `close`."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.folder = run_dir / WATCH_DIR
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise unwritable(run_dir, exc) from exc
        if fcntl is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_fd)
                raise WatchError(
                    f"watch: another watcher holds {self.folder / LOCK_FILE}: two watchers on one run "
                    "directory would evaluate the same steps; stop it or pass another --run-dir"
                ) from None
        try:
            # Read as well as written: whether the last line was cut off, only its last byte says.
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            os.close(self._lock_fd)
            raise unwritable(run_dir, exc) from exc

    @property
    def path(self) -> Path:
        return self.folder / LEDGER_FILE

    def record(self, status: str, checkpoint: Checkpoint | int, **extra: Any) -> None:
        """Append one entry: `status` for a checkpoint (or a bare step), with `extra` fields. A write that
        fails (a full disk) is warned about and left: `metrics.jsonl` alone says what is done."""
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
        try:
            if not ends_a_line(self._fd, os.fstat(self._fd).st_size):  # a line cut off before
                data = b"\n" + data
            os.write(self._fd, data)
            os.fsync(self._fd)
        except OSError as exc:
            log.warning(
                "watch: %s entry for step %d not written to %s (%s)", status, entry["step"], self.path, exc
            )

    def entries(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path)

    def history(self, config_id: str | None = None) -> History:
        """What is done, from the ledger and `metrics.jsonl` together (see the module docstring); `config_id`:
        the current evaluator config's fingerprint, under which checkpoints it could not take stay failed."""
        history = History()
        started: set[int] = set()
        for entry in self.entries():
            step, status = entry.get("step"), entry.get("status")
            if not isinstance(step, int):
                continue
            if status == STARTED:
                started.add(step)
            elif status == FAILED and entry.get("retry") is False and entry.get("config") == config_id:
                history.refused.add(step)
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


def unwritable(run_dir: Path, exc: OSError) -> WatchError:
    """The error for a run directory the watcher cannot create or write."""
    return WatchError(
        f"watch: cannot write the run directory {run_dir} ({type(exc).__name__}: {exc}); pass a --run-dir "
        "this "
        "user can create and write"
    )
