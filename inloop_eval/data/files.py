"""Writing files and directories so that a reader never sees half of one, and the checksum that tells a
file was not changed since.

A file is written to a temporary file in its own directory, flushed to disk and renamed over the target
(`os.replace`, atomic on POSIX file systems); a directory is built in a staging directory beside it and
renamed into place whole. A failed write leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call `write(f)` on a temporary binary file beside `path`, then rename it to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the result is shared like any file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(path: Path, text: str) -> None:
    """`path.write_text(text)` (UTF-8), atomically."""
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))


def build_directory_atomically(target: Path, build: Callable[[Path], None]) -> None:
    """Make the directory `target` by `build(staging)` on an empty staging directory beside it, renamed
    into place whole. Losing a race to another process that made `target` first is not an error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    try:
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the result is shared like any directory
        build(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file's contents, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
