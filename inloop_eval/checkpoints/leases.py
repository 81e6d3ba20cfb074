"""Leases: a watcher's claim on the checkpoints it has found and not yet evaluated, so that a trainer's
rotation keeps them on disk until they are scored.

What a lease promises (the protocol trainer-side helpers rely on; this module imports nothing but the
standard library, so a trainer reads leases without importing the watcher):
- where: `<checkpoint folder>/.inloop-eval-leases/<checkpoint name>/<holder>.json`, beside the checkpoint,
  never inside it (a file inside would change the checkpoint's files, and be deleted with them); one file
  per holder (a watcher's run directory), so two watchers on one folder hold a checkpoint independently;
- what: a JSON object with `holder`, `checkpoint` (the folder's name), `expires_at` (Unix time, seconds)
  and `written_at`; written whole (a temporary file renamed into place), so a reader never sees half of it;
  readable by every user (files 0644, folders 0755, whatever the umask), since a trainer may run as
  another user than the watcher;
- while: the watcher rewrites each lease every third of its expiry while it lives (`LeaseKeeper`, a
  thread, so a long evaluation does not let leases lapse), and removes it once the checkpoint is evaluated,
  skipped, or failed for good, `hold_failed_s` after a failure it may retry, and when it exits. A watcher killed with SIGKILL leaves its leases to expire:
  `expires_at` passes and `held` says no, so training's disk is held at most one expiry longer;
- a checkpoint is held while any unexpired lease names it (`held`), or while a lease file or folder on it
  cannot be read (another user's, written private): kept, with a warning naming it, never deleted on a
  guess. Expiry compares `expires_at` with the reader's clock: give an expiry well above the clock skew
  between the watcher's host and the trainer's.

Where the promise ends: a checkpoint is held from when the watcher first sees it (its event read, or its
folder listed); one a trainer deletes before that is not held (watch with `--events` so that the watcher
sees each checkpoint within seconds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LEASE_DIR = ".inloop-eval-leases"
LEASE_SUFFIX = ".json"
MAX_LEASE_BYTES = 64 << 10  # a lease is about 150 bytes
SHARED_FILE, SHARED_FOLDER = 0o644, 0o755  # a trainer may run as another user than the watcher
# The unreadable lease files and folders already warned about, so that a trainer asking at every step warns
# once per file.
_told: set[str] = set()


@dataclass(frozen=True)
class Lease:
    """One holder's lease on one checkpoint, as read from its file."""

    holder: str
    checkpoint: str
    expires_at: float
    written_at: float

    def live(self, now: float) -> bool:
        return now < self.expires_at


def lease_folder(checkpoint: str | os.PathLike[str]) -> Path:
    """Where the leases on `checkpoint` (a checkpoint folder) are: beside it, never inside it."""
    path = Path(checkpoint)
    return path.parent / LEASE_DIR / path.name


def holder_id(run_dir: str | os.PathLike[str]) -> str:
    """A watcher's holder id: one per run directory (one watcher at a time holds a run directory), so a
    restarted watcher takes over the leases of the one before it."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode("utf-8")).hexdigest()[:12]
    return f"watch-{digest}"


def leases_on(checkpoint: str | os.PathLike[str]) -> list[Lease]:
    """Every lease file on `checkpoint` that can be read, live or expired; one damaged (or not a regular
    file) is left out, and so is one this user cannot read (`held` counts those as holding)."""
    return read_leases(checkpoint)[0]


def read_leases(checkpoint: str | os.PathLike[str]) -> tuple[list[Lease], list[tuple[Path, OSError]]]:
    """The leases on `checkpoint` (as `leases_on`), and each lease file, or the lease folder, that could not
    be read, with why (a watcher running as another user wrote it private)."""
    folder = lease_folder(checkpoint)
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    except OSError as exc:
        return [], [(folder, exc)]
    found, unreadable = [], []
    for name in names:
        if name.startswith(".") or not name.endswith(LEASE_SUFFIX):
            continue
        try:
            text = read_lease_text(folder / name)
        except FileNotFoundError:
            continue  # released since the listing
        except OSError as exc:
            unreadable.append((folder / name, exc))
            continue
        try:
            data = json.loads(text)
            found.append(
                Lease(
                    holder=str(data["holder"]),
                    checkpoint=str(data["checkpoint"]),
                    expires_at=float(data["expires_at"]),
                    written_at=float(data["written_at"]),
                )
            )
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    return found, unreadable


def read_lease_text(path: Path) -> str:
    """A lease file's text; '' (not a lease) for what is not a regular file, opened without blocking so that a
    FIFO never stops a trainer; at most MAX_LEASE_BYTES."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, MAX_LEASE_BYTES).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def held(checkpoint: str | os.PathLike[str], *, now: float | None = None) -> bool:
    """Whether a live lease holds `checkpoint`: a trainer's rotation must not delete it yet. A lease file or
    folder this user cannot read holds it too, with a warning naming it (once per process): what cannot be
    read may be a live lease, and a checkpoint kept too long costs disk, one deleted unscored costs its
    evaluation."""
    now = time.time() if now is None else now
    found, unreadable = read_leases(checkpoint)
    for path, exc in unreadable:
        if str(path) not in _told:
            _told.add(str(path))
            log.warning(
                "cannot read the lease %s (%s: %s): %s is kept as held until it can be read; let this user "
                "read it (watchers write lease files 0644 in folders 0755)",
                path,
                type(exc).__name__,
                exc.strerror or exc,
                checkpoint,
            )
    return bool(unreadable) or any(lease.live(now) for lease in found)


def forget(checkpoint: str | os.PathLike[str]) -> None:
    """Remove the lease folder of a checkpoint that is gone (its trainer deleted it once nothing held it)."""
    shutil.rmtree(lease_folder(checkpoint), ignore_errors=True)


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` whole (a temporary file beside it, renamed over it), readable by every user (0644,
    whatever the umask): a trainer running as another user reads it."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, SHARED_FILE)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def make_shared_folder(folder: Path) -> None:
    """`folder` (its parent there), readable and listable by every user (0755, whatever the umask); one
    another user made keeps its mode."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir()
    with contextlib.suppress(OSError):
        os.chmod(folder, SHARED_FOLDER)


class Leases:
    """One holder's leases: `hold(paths)` makes the leases exactly those on `paths`, writing new ones,
    rewriting those a third of `expiry_s` old, removing the rest. Not thread-safe: `LeaseKeeper` calls it
    under its lock."""

    def __init__(self, holder: str, expiry_s: float) -> None:
        self.holder = holder
        self.expiry_s = expiry_s
        self.written: dict[Path, float] = {}  # checkpoint path -> when its lease was last written
        self.failed: set[Path] = set()  # checkpoints whose lease could not be written (told once)

    def file(self, checkpoint: Path) -> Path:
        return lease_folder(checkpoint) / f"{self.holder}{LEASE_SUFFIX}"

    def hold(self, checkpoints: Iterable[Path], now: float | None = None) -> None:
        now = time.time() if now is None else now
        wanted = set(checkpoints)
        for checkpoint in sorted(set(self.written) - wanted):
            self.release(checkpoint)
        for checkpoint in sorted(wanted):
            if now - self.written.get(checkpoint, -float("inf")) >= self.expiry_s / 3:
                self.write(checkpoint, now)

    def write(self, checkpoint: Path, now: float) -> None:
        lease = {
            "holder": self.holder,
            "checkpoint": checkpoint.name,
            "expires_at": now + self.expiry_s,
            "written_at": now,
        }
        try:
            make_shared_folder(lease_folder(checkpoint).parent)
            make_shared_folder(lease_folder(checkpoint))
            write_atomically(self.file(checkpoint), json.dumps(lease, sort_keys=True) + "\n")
        except OSError as exc:
            if checkpoint not in self.failed:
                self.failed.add(checkpoint)
                log.warning(
                    "watch: cannot write a lease on %s (%s: %s): training may delete it before it is "
                    "evaluated; let this user write %s",
                    checkpoint,
                    type(exc).__name__,
                    exc,
                    checkpoint.parent,
                )
            return
        self.written[checkpoint] = now

    def release(self, checkpoint: Path) -> None:
        self.written.pop(checkpoint, None)
        with contextlib.suppress(FileNotFoundError):
            self.file(checkpoint).unlink()
        with contextlib.suppress(OSError):  # not empty: another holder's lease is there
            lease_folder(checkpoint).rmdir()

    def release_all(self) -> None:
        for checkpoint in sorted(self.written):
            self.release(checkpoint)


class LeaseKeeper:
    """Keeps `leases` on what `to_hold()` names, in a thread, every `look_s` seconds (and whenever `update`
    is called), until `stop`. `to_hold` runs in that thread: it must only read what the watcher changes."""

    def __init__(self, leases: Leases, to_hold: Callable[[], Iterable[Path]], look_s: float) -> None:
        self.leases = leases
        self.to_hold = to_hold
        self.look_s = min(look_s, leases.expiry_s / 3)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.keep, name="inloop-eval-leases", daemon=True)

    def start(self) -> None:
        self.update()
        self.thread.start()

    def update(self) -> None:
        with self.lock:
            if not self.stopped.is_set():
                self.leases.hold(self.to_hold())

    def keep(self) -> None:
        while not self.stopped.wait(self.look_s):
            try:
                self.update()
            except Exception:  # noqa: BLE001 - a lapse here must not kill the thread; the next look retries
                log.warning("watch: keeping leases failed; trying again", exc_info=True)

    def stop(self) -> None:
        """Stop refreshing and remove every lease: a watcher that exits holds nothing."""
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join()
        with self.lock:
            self.leases.release_all()
