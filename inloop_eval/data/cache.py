"""Checksummed caches: an entry is written whole or not at all, checked each time it is opened, and never
trusted when it is not exactly what was written.

An entry is a folder of files (its record in `meta.json` beside them) or one `.npz` archive of arrays (its
record in the member `__record__`). The record holds the cache's format version, the entry's `key` (a
hash of everything the contents depend on), the size and SHA-256 of each file (each array: its byte count
and the SHA-256 of its dtype, shape and data), and what the cache needs to read the entry back (`info`).

What every cache built on this module may rely on:
- Writing (`write_folder`, `write_archive`): a reader finds no entry or a whole one, however many processes
  write the same key at once (`inloop_eval.data.files`); a failed write leaves nothing behind.
- Opening (`read_folder`, `read_archive`): None when there is no entry; the contents only when the record is
  of this format and key and every file matches its size and SHA-256; otherwise `CacheMismatch`, saying what
  differs. Nothing in an entry is used before it is checked.
- Damage: the cache reports a `CacheMismatch` (a warning: the entry is rebuilt, nothing for the user to do),
  builds the contents again and writes them over the entry (`discard` first removes a folder).
Where entries live, how keys are made and how warnings read belong to each cache (`requests.cache`,
`data.perplexity.token_cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inloop_eval.data.files import build_directory_atomically, sha256_of, write_atomically
from inloop_eval.errors import InLoopEvalError

RECORD_FILE = "meta.json"
RECORD_MEMBER = "__record__"


class CacheMismatch(InLoopEvalError):
    """A cache entry that is not what was written for this format and key (it is rebuilt, never trusted).

    damaged: True when the entry cannot be read or a file differs from its record (cut short, overwritten,
        garbled); False when it is whole but another entry (another format or key, or no record at all).
    """

    def __init__(self, message: str, *, damaged: bool) -> None:
        super().__init__(message)
        self.damaged = damaged


def write_folder(
    target: Path,
    build: Callable[[Path], None],
    *,
    version: int,
    key: str,
    files: Sequence[str],
    info: Mapping[str, Any],
) -> None:
    """Make the folder entry `target`: `build(staging)` writes `files` into an empty staging folder, then the
    record is written beside them and the folder renamed into place whole."""

    def build_with_record(staging: Path) -> None:
        build(staging)
        checks = {
            name: {"bytes": (staging / name).stat().st_size, "sha256": sha256_of(staging / name)}
            for name in files
        }
        record = _record(version, key, checks, info)
        (staging / RECORD_FILE).write_text(json.dumps(record, indent=1))

    build_directory_atomically(target, build_with_record)


def read_folder(target: Path, *, version: int, key: str, files: Sequence[str]) -> dict[str, Any] | None:
    """The `info` of the folder entry `target` once each of `files` is checked against the record; None when
    there is no folder. Raises CacheMismatch for a folder that is not what was written."""
    if not target.exists():
        return None
    try:
        record = json.loads((target / RECORD_FILE).read_text())
    except (OSError, ValueError) as exc:  # missing, cut short or garbled
        raise CacheMismatch(f"{RECORD_FILE} unreadable ({type(exc).__name__}: {exc})", damaged=True) from None
    checks = _checked_record(record, version, key)
    if sorted(checks) != sorted(files):
        raise CacheMismatch(f"{RECORD_FILE} records {sorted(checks)}, expected {sorted(files)}", damaged=True)
    for name in files:
        try:
            found = {"bytes": (target / name).stat().st_size, "sha256": sha256_of(target / name)}
        except OSError as exc:
            raise CacheMismatch(f"{name} unreadable ({type(exc).__name__}: {exc})", damaged=True) from None
        _compare(name, found, checks[name])
    return record["info"]


def write_archive(
    path: Path, arrays: Mapping[str, np.ndarray], *, version: int, key: str, info: Mapping[str, Any]
) -> None:
    """Write `arrays` to the archive entry `path` (`np.savez`) with their record, atomically."""
    checks = {name: _array_check(a) for name, a in arrays.items()}
    record = np.frombuffer(json.dumps(_record(version, key, checks, info)).encode(), dtype=np.uint8)
    write_atomically(path, lambda f: np.savez(f, **arrays, **{RECORD_MEMBER: record}))


def read_archive(
    path: Path, *, version: int, key: str
) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays of the archive entry `path` and its record's `info`, once every array is checked against
    the record; None when there is no file. Raises CacheMismatch for a file that is not what was written."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        return None
    except Exception as exc:  # zipfile, NumPy and OS errors all mean "not a readable archive"
        raise CacheMismatch(f"{type(exc).__name__}: {exc}", damaged=True) from None
    if RECORD_MEMBER not in arrays:
        raise CacheMismatch(f"no {RECORD_MEMBER} member: not an entry of a checksummed cache", damaged=False)
    try:
        record = json.loads(arrays.pop(RECORD_MEMBER).tobytes().decode())
    except ValueError as exc:
        raise CacheMismatch(f"{RECORD_MEMBER} unreadable ({exc})", damaged=True) from None
    checks = _checked_record(record, version, key)
    if sorted(checks) != sorted(arrays):
        raise CacheMismatch(
            f"the record lists {sorted(checks)}, the file holds {sorted(arrays)}", damaged=True
        )
    for name, array in arrays.items():
        _compare(name, _array_check(array), checks[name])
    return arrays, record["info"]


def discard(path: Path) -> None:
    """Delete an entry that did not match: first moved aside whole, so that no reader finds half of it."""
    trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.damaged-", dir=path.parent))
    try:
        os.rename(path, trash / "old")
    except FileNotFoundError:  # another process moved it first
        pass
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def _record(
    version: int, key: str, checks: dict[str, dict[str, Any]], info: Mapping[str, Any]
) -> dict[str, Any]:
    return {"format": version, "key": key, "checks": checks, "info": dict(info)}


def _checked_record(record: Any, version: int, key: str) -> dict[str, Any]:
    """The `checks` of a record of this format version and key; CacheMismatch for any other record."""
    if not isinstance(record, dict) or not isinstance(record.get("checks"), dict) or "info" not in record:
        raise CacheMismatch("the record lacks its checks or info", damaged=True)
    if (record.get("format"), record.get("key")) != (version, key):
        raise CacheMismatch(
            f"expected format {version} and key {key!r}, found format {record.get('format')!r} and key "
            f"{record.get('key')!r}",
            damaged=False,
        )
    return record["checks"]


def _compare(name: str, found: dict[str, Any], recorded: Any) -> None:
    """CacheMismatch unless `found` (bytes and SHA-256 of a file) is what the record says."""
    recorded = recorded if isinstance(recorded, dict) else {}
    if found["bytes"] != recorded.get("bytes"):
        raise CacheMismatch(
            f"{name} holds {found['bytes']} bytes, the record says {recorded.get('bytes')}", damaged=True
        )
    if found["sha256"] != recorded.get("sha256"):
        raise CacheMismatch(f"{name} is not what was written (its SHA-256 differs)", damaged=True)


def _array_check(array: np.ndarray) -> dict[str, Any]:
    """The byte count of an array and the SHA-256 of its dtype, shape and data."""
    digest = hashlib.sha256(json.dumps([array.dtype.str, list(array.shape)]).encode())
    digest.update(np.ascontiguousarray(array).tobytes())
    return {"bytes": int(array.nbytes), "sha256": digest.hexdigest()}
