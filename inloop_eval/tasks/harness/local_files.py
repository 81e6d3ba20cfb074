"""Local data files of harness tasks (`dataset_path: json|csv|parquet|arrow` with `data_files`): checked before
the datasets library reads them, and held in memory for `process_docs`.

A folder, an empty file, bytes that are not UTF-8 or a JSON escape of half a surrogate pair are errors naming
the file and line, which the datasets library would give only as a bare exception (or, for invalid UTF-8,
only when the row is read).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inloop_eval.errors import TaskDataError

# `dataset_path`s that name a datasets builder reading `data_files`, not a dataset of the data root.
LOCAL_BUILDERS: frozenset[str] = frozenset({"json", "csv", "parquet", "arrow"})

# A backslash escape of JSON text: `\\uXXXX` (its code in group 1) or any other (`\\\\`, `\\"`, ...).
_JSON_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)")


def check_local_files(task: str, builder: str, files: Any) -> None:
    """Each named local data file exists as a file, is not empty, and (JSON, CSV) is UTF-8 text: an
    error naming the file and line, which the datasets library would give only as a bare exception
    (or, for invalid UTF-8, only when the row is read). Patterns (`*`) are left to the library."""
    if isinstance(files, Mapping):
        named = [f for v in files.values() for f in ([v] if isinstance(v, str) else v)]
    else:
        named = [files] if isinstance(files, str) else list(files)
    for name in named:
        path = Path(name)
        if any(c in name for c in "*?[") or "://" in name or not path.exists():
            continue  # globs, URLs and missing files: the library's own error names them
        if path.is_dir():
            raise TaskDataError(
                f"task {task!r}: data file {path} is a folder; expected a {builder} file, "
                f"or a pattern such as {path / '*'}"
            )
        blank = path.stat().st_size == 0 or (builder in ("json", "csv") and not check_text(task, path, builder))
        if blank:
            raise TaskDataError(
                f"task {task!r}: data file {path} is empty; expected {builder} rows (write them, or "
                "leave the file out of data_files)"
            )


def check_text(task: str, path: Path, builder: str) -> bool:
    """Whether a text data file has a line with more than whitespace; raises naming the file, line and column
    when it does not decode as UTF-8 or (JSON) escapes half of a surrogate pair, which the datasets library
    reports only as "An error occurred while generating the dataset"."""
    nonblank = False
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TaskDataError(
                    f"task {task!r}: data file {path} line {line_no}: not UTF-8 (byte {line[exc.start]:#04x} "
                    f"at column {exc.start + 1}); re-encode the file as UTF-8"
                ) from None
            nonblank = nonblank or bool(text.strip())
            if builder == "json" and "\\u" in text:
                _check_surrogates(task, path, line_no, text)
    return nonblank


def _check_surrogates(task: str, path: Path, line_no: int, text: str) -> None:
    """A JSON line's `\\uXXXX` escapes: a high half of a surrogate pair (D800-DBFF) must be followed at once by
    a low half (DC00-DFFF), and a low half must follow a high half."""
    high: re.Match[str] | None = None  # a high half waiting for its low half
    for escape in _JSON_ESCAPE.finditer(text):
        code = int(escape.group(1), 16) if escape.group(1) else None
        low = code is not None and 0xDC00 <= code <= 0xDFFF
        if high is not None and (not low or high.end() != escape.start()):
            _lone_surrogate(task, path, line_no, high)
        if low and high is None:
            _lone_surrogate(task, path, line_no, escape)
        high = escape if code is not None and 0xD800 <= code <= 0xDBFF else None
    if high is not None:
        _lone_surrogate(task, path, line_no, high)


def _lone_surrogate(task: str, path: Path, line_no: int, escape: re.Match[str]) -> None:
    raise TaskDataError(
        f"task {task!r}: data file {path} line {line_no}: {escape.group()} at column {escape.start() + 1} is "
        "half of a surrogate pair; JSON text must write such a character as a pair (e.g. \\ud83d\\ude00) "
        "or as UTF-8; fix or drop the row"
    )


def in_memory(dataset: Any) -> Any:
    """The same rows without backing files, so that `process_docs`'s `map` writes no cache files beside the
    data root's splits (or anywhere else)."""
    import datasets  # deferred: importing datasets (with pandas and pyarrow) costs most of a second
    from datasets.table import InMemoryTable

    if not isinstance(dataset, datasets.Dataset) or not dataset.cache_files:
        return dataset
    if getattr(dataset, "_indices", None) is not None:  # a selection of rows: materialise it in memory
        return dataset.flatten_indices(keep_in_memory=True)
    return datasets.Dataset(InMemoryTable(dataset.data.table), info=dataset.info.copy(), split=dataset.split)
