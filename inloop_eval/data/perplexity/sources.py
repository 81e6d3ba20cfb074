"""The files a perplexity domain reads: the paths and globs of its config resolved to files, memmap token files
opened as flat arrays, and JSONL or text files read as documents.

Every error names the label and the file, and how to fix it (`LMDataError`).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

from inloop_eval.data.perplexity.domain_config import LMDomainConfig
from inloop_eval.errors import LMDataError

_NPY_MAGIC = b"\x93NUMPY"


def resolve_paths(label: str, patterns: Iterable[str]) -> list[Path]:
    """The files that `patterns` name, in order (each glob's matches sorted), without repeats."""
    files: dict[Path, None] = {}
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if glob.has_magic(expanded):
            matches = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
            if not matches:
                raise LMDataError(
                    f"label {label!r}: the pattern {pattern!r} matches no file; make the domain set first "
                    "(`inloop-eval data make-lm`) or fix `paths`"
                )
        else:
            path = Path(expanded)
            if path.is_dir():
                raise LMDataError(
                    f"label {label!r}: {path} is a folder; expected a file, or a pattern for the folder's "
                    f"files in `paths`, e.g. {str(path / '*.npy')!r}"
                )
            if path.exists() and not path.is_file():  # a named pipe would block its reader forever
                raise LMDataError(
                    f"label {label!r}: {path} is not a regular file (a named pipe, socket or device); expected "
                    "a token or text file"
                )
            if not path.is_file():
                raise LMDataError(
                    f"label {label!r}: file {path} does not exist; make the domain set first "
                    "(`inloop-eval data make-lm`) or fix `paths`"
                )
            matches = [path]
        files.update(dict.fromkeys(m.absolute() for m in matches))
    return list(files)


def unreadable(label: str, path: Path | str, exc: BaseException) -> LMDataError:
    """The error for a file that the operating system would not read (gone, no permission, an I/O error)."""
    reason = getattr(exc, "strerror", None) or exc
    return LMDataError(
        f"label {label!r} file {path}: cannot be read ({type(exc).__name__}: {reason}); check that it exists "
        "and is readable on every node"
    )


# --- memmap token files --------------------------------------------------------------------------------


def open_token_file(label: str, path: Path, dtype: str) -> np.ndarray:
    """A memmap token file as a flat read-only array: raw `dtype` ids, or an `np.save` file's own dtype."""
    try:
        return _token_array(label, path, dtype)
    except OSError as exc:
        raise unreadable(label, path, exc) from exc


def _token_array(label: str, path: Path, dtype: str) -> np.ndarray:
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(len(_NPY_MAGIC))
    if magic == _NPY_MAGIC:
        try:
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as exc:  # NumPy's own words for a cut or garbled header
            raise LMDataError(
                f"label {label!r} file {path}: not a readable .npy file ({exc}); remake it (`np.save`) or "
                "drop it from `paths`"
            ) from None
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise LMDataError(
                f"label {label!r} file {path}: expected a 1-D array of integer token ids, found "
                f"shape {tokens.shape} of {tokens.dtype}"
            )
        return tokens
    itemsize = np.dtype(dtype).itemsize
    if size % itemsize:
        raise LMDataError(
            f"label {label!r} file {path}: {size} bytes is not a whole number of {dtype} tokens "
            f"({itemsize} bytes each); set the domain's `dtype` to the one the file was written with, or "
            "remake a file that was cut short"
        )
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


# --- JSONL and text files ------------------------------------------------------------------------------


def read_documents(domain: LMDomainConfig, files: list[Path]) -> Iterator[tuple[int, int, str]]:
    """(file index, document number, text) of every non-empty document: JSONL lines or whole files."""
    for f, path in enumerate(files):
        try:
            with _open_text(path) as handle:
                if domain.format == "text":
                    text = handle.read()
                    if text:
                        yield f, 0, text
                    continue
                for n, line in enumerate(handle):
                    if not line.strip():
                        continue
                    yield f, n, _jsonl_text(domain, path, n, line)
        except UnicodeDecodeError as exc:
            raise LMDataError(
                f"label {domain.label!r} file {path}: not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                "convert it to UTF-8 or drop it from `paths`"
            ) from None
        except (OSError, EOFError) as exc:  # gone, unreadable, an I/O error, a damaged .gz
            raise unreadable(domain.label, path, exc) from exc


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _jsonl_text(domain: LMDomainConfig, path: Path, n: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LMDataError(
            f"label {domain.label!r} file {path} line {n + 1}: not valid JSON ({exc})"
        ) from None
    text = record.get(domain.text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise LMDataError(
            f"label {domain.label!r} file {path} line {n + 1}: expected a string field "
            f"{domain.text_field!r} (set `text_field`), found {type(text).__name__}"
        )
    return text
