"""The run directory stays the one the watcher opened.

A run directory deleted (or moved, or put back as a new folder) under a running watcher would take every
later figure into files that no one can read any more: an open descriptor writes on into an unlinked file
without an error. `RunDirectory` notes what the directory and the files the watcher keeps open are (device
and inode) when it opens them, and `check`, called before each write, stops the watcher with a `WatchError`
naming what changed. A restarted watcher reads the run directory back and evaluates what is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

from inloop_eval.watch.discovery import WatchError

# (device, inode) of a path; None when it is gone.
Identity = tuple[int, int] | None


def identity(path: Path) -> Identity:
    """What `path` is: its device and inode; None when nothing is there."""
    try:
        stat = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return stat.st_dev, stat.st_ino


class RunDirectory:
    """The run directory `path` and the files in it the watcher holds open (`files`), as they were when
    opened."""

    def __init__(self, path: Path, files: list[Path]) -> None:
        self.path = path
        self.opened = {p: identity(p) for p in (path, *files)}

    def check(self) -> None:
        """WatchError when the run directory or one of its open files was deleted or replaced since."""
        for path, opened in self.opened.items():
            now = identity(path)
            if now != opened:
                what = "deleted" if now is None else "replaced by another"
                raise WatchError(
                    f"watch: {path} was {what} while the watcher ran, so what it writes now would be lost: "
                    f"stopped. Restart the watcher: it reads the run directory {self.path} back (creating it "
                    "again if needed) and evaluates every step whose metrics line is not there"
                )
