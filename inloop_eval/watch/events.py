"""Ready events: files a trainer writes once a checkpoint is finished, so that the watcher looks at it at
once instead of at its next scan of the checkpoint folder.

The format is OLMo-core's (`CheckpointReadyNotifierCallback`, schema version 1), so one reader takes both
OLMo-core's events and those any other trainer writes with `write_ready_event`:
`<inbox>/<run_id>/step-<N, 12 digits>.ready.json`, a JSON object with
- `event`: `"checkpoint_ready"`; `step`: the training step; `checkpoint_path`: the finished checkpoint's
  folder (absolute);
- `run_id`, `lineage_id`: the training run and the trajectory it continues (recorded in the ledger);
- `schema_version` (1), `checkpoint_format`, `created_at` and OLMo-core's own fields (its metadata's hash,
  Beaker ids), kept as they are.
Written whole (a temporary file linked into place), and only once the checkpoint is complete.

What the reader promises (`Inbox`): each event file is read once per watcher (a duplicate, a second file
for one step, or one for a step already evaluated, changes nothing: the ledger decides what is done); a
file that is not such an event is named in a warning once and left: one that is not a regular file (a
FIFO is never waited on), one larger than `MAX_EVENT_BYTES`, one that is not JSON or is JSON nested too
deeply to parse; a folder of the inbox this user cannot list (another run's, in a shared inbox) is named in
a warning once and left; an event for a checkpoint outside the watched folder (another run's) is left.
Events are a hint: the watched folder is still scanned, every `poll_s` seconds, so a lost or unwritten
event delays a checkpoint, never loses it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from inloop_eval.checkpoints.formats import Checkpoint
from inloop_eval.errors import InLoopEvalError
from inloop_eval.watch.discovery import parse_name

log = logging.getLogger(__name__)

READY_EVENT = "checkpoint_ready"
READY_SUFFIX = ".ready.json"
SCHEMA_VERSION = 1
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # OLMo-core's rule for run and lineage ids
# The largest event file read: an event is a few hundred bytes; far below a memory risk.
MAX_EVENT_BYTES = 1 << 20


class EventError(InLoopEvalError):
    """A ready event that cannot be written (a bad id), or a file in the inbox that is not one."""


@dataclass(frozen=True)
class ReadyEvent:
    """One ready event: the step, the finished checkpoint's folder, the run and lineage, its file."""

    step: int
    checkpoint_path: Path
    run_id: str | None
    lineage_id: str | None
    file: Path


def event_file(inbox: str | os.PathLike[str], run_id: str, step: int) -> Path:
    """Where the event for `step` of run `run_id` goes (OLMo-core's name for it)."""
    return Path(inbox) / run_id / f"step-{step:012d}{READY_SUFFIX}"


def write_ready_event(
    inbox: str | os.PathLike[str],
    *,
    step: int,
    checkpoint_path: str | os.PathLike[str],
    run_id: str,
    lineage_id: str | None = None,
    checkpoint_format: str | None = None,
) -> Path:
    """Announce a finished checkpoint to watchers of `inbox`; call it once the checkpoint is complete, on
    one rank. Written whole (a temporary file hard-linked into place): a reader never sees half of it. An
    event already there is left as it is (a duplicate is a no-op for the watcher). Returns its file."""
    for name, value in (("run_id", run_id), ("lineage_id", lineage_id or run_id)):
        if not ID_PATTERN.fullmatch(value):
            raise EventError(
                f"write_ready_event: {name} must match {ID_PATTERN.pattern!r} (it names a folder), found "
                f"{value!r}"
            )
    path = event_file(inbox, run_id, step)
    event = {
        "schema_version": SCHEMA_VERSION,
        "event": READY_EVENT,
        "run_id": run_id,
        "lineage_id": lineage_id or run_id,
        "step": step,
        "checkpoint_path": str(Path(checkpoint_path).resolve()),
        "checkpoint_format": checkpoint_format,
        "created_at": datetime.now(timezone.utc).isoformat(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(event, indent=2, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    return path


def read_event(path: Path) -> ReadyEvent:
    """The ready event in `path`; EventError naming what is wrong with a file that is not one."""
    try:
        data = json.loads(read_small_file(path).decode("utf-8"))
    except RecursionError:
        raise EventError(f"watch: {path} is not a ready event: JSON nested too deeply to parse") from None
    except (OSError, ValueError) as exc:
        raise EventError(f"watch: cannot read the event {path} ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict) or data.get("event") != READY_EVENT:
        found = data.get("event") if isinstance(data, dict) else type(data).__name__
        raise EventError(
            f"watch: {path} is not a ready event: expected event {READY_EVENT!r}, found {found!r}"
        )
    step, checkpoint = data.get("step"), data.get("checkpoint_path")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(checkpoint, str):
        raise EventError(
            f"watch: the event {path} needs `step` (an integer >= 0) and `checkpoint_path` (a folder), found "
            f"step={step!r}, checkpoint_path={checkpoint!r}; write it with inloop_eval.watch.events."
            "write_ready_event"
        )
    run_id, lineage_id = data.get("run_id"), data.get("lineage_id")
    return ReadyEvent(
        step=step,
        checkpoint_path=Path(checkpoint),
        run_id=run_id if isinstance(run_id, str) else None,
        lineage_id=lineage_id if isinstance(lineage_id, str) else None,
        file=path,
    )


def read_small_file(path: Path) -> bytes:
    """The bytes of the regular file `path`; EventError for anything else (a FIFO, a device, a folder: never
    opened, or opened without blocking and closed unread) and for a file over MAX_EVENT_BYTES."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise EventError(f"watch: {path} is not a ready event: not a regular file ({file_kind(path)})")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the look above
            raise EventError(f"watch: {path} is not a ready event: not a regular file ({file_kind(path)})")
        chunks, size = [], 0
        while chunk := os.read(fd, MAX_EVENT_BYTES + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_EVENT_BYTES:
                raise EventError(
                    f"watch: {path} is not a ready event: larger than {MAX_EVENT_BYTES} bytes (an event is a "
                    "few hundred)"
                )
        return b"".join(chunks)
    finally:
        os.close(fd)


def file_kind(path: Path) -> str:
    """What `path` is, in a few words (`a FIFO`, `a folder`, ...), for a message."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return type(exc).__name__
    kinds = [(stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket")]
    kinds += [(stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def announced_checkpoint(event: ReadyEvent, folder: Path) -> Checkpoint | None:
    """The checkpoint of the watched `folder` that `event` announces; None for one elsewhere (another
    run's), or whose folder name does not carry the event's step."""
    path = event.checkpoint_path
    if path.parent.resolve() != folder.resolve():
        return None
    parsed = parse_name(path.name)
    if parsed is None or parsed[0] != event.step:
        return None
    return Checkpoint(step=event.step, path=folder / path.name, format=parsed[1])


class Inbox:
    """The event files under `folder` (`<folder>/<run_id>/*.ready.json`, or `<folder>/*.ready.json`), each
    read once: `poll` reads the new ones, `take` hands out those read since it was last called. Both may be
    called from two threads (the watch loop and the lease keeper)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.seen: set[Path] = set()
        self.unlisted: set[Path] = set()  # folders that could not be listed (warned about once)
        self.events: list[ReadyEvent] = []
        self.taken = 0
        self.lock = threading.Lock()

    def poll(self) -> None:
        with self.lock:
            for path in self.new_files():
                self.seen.add(path)
                try:
                    event = read_event(path)
                except EventError as exc:
                    log.warning("%s; left (the folder scan still finds its checkpoint)", exc)
                    continue
                log.debug("watch: read %s (step %d)", path, event.step)
                self.events.append(event)

    def take(self) -> list[ReadyEvent]:
        """The events read since the last `take`, after reading any new ones."""
        self.poll()
        with self.lock:
            new, self.taken = self.events[self.taken :], len(self.events)
        return new

    def new_files(self) -> list[Path]:
        """The event files not read yet, oldest name first (a temporary file, named with a leading dot, is
        not one); a folder this user cannot list is warned about once and left."""
        files = []
        for entry in self.listed(self.folder):
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                files += [Path(e.path) for e in self.listed(Path(entry.path)) if is_event_name(e.name)]
            elif is_event_name(entry.name):
                files.append(Path(entry.path))
        return sorted(f for f in files if f not in self.seen)

    def listed(self, folder: Path) -> list[os.DirEntry[str]]:
        """The entries of `folder`; none for one gone, or one this user cannot list (warned about once)."""
        try:
            with os.scandir(folder) as entries:
                return list(entries)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            if folder not in self.unlisted:
                self.unlisted.add(folder)
                log.warning(
                    "watch: cannot list %s in the inbox (%s: %s); its events are left (another run's? let "
                    "this user read it to have them)",
                    folder,
                    type(exc).__name__,
                    exc.strerror or exc,
                )
            return []


def is_event_name(name: str) -> bool:
    return name.endswith(READY_SUFFIX) and not name.startswith(".")
