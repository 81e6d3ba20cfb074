"""Local data files of harness tasks (`dataset_path: json|csv|parquet|arrow` with `data_files`): checked before
the datasets library reads them, and held in memory for `process_docs`.

A folder, an empty file or bytes that are not UTF-8 are errors naming the file and line, which the datasets
library would give only as a bare exception (or, for invalid UTF-8, only when the row is read).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets
from datasets.table import InMemoryTable

from inloop_eval.errors import TaskDataError

# `dataset_path`s that name a datasets builder reading `data_files`, not a dataset of the data root.
LOCAL_BUILDERS: frozenset[str] = frozenset({"json", "csv", "parquet", "arrow"})


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
        blank = path.stat().st_size == 0 or (builder in ("json", "csv") and not check_utf8(task, path))
        if blank:
            raise TaskDataError(
                f"task {task!r}: data file {path} is empty; expected {builder} rows (write them, or "
                "leave the file out of data_files)"
            )


def check_utf8(task: str, path: Path) -> bool:
    """Whether a text data file has a line with more than whitespace; raises naming the file, line and
    byte when it does not decode as UTF-8."""
    nonblank = False
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            try:
                nonblank = bool(line.decode("utf-8").strip()) or nonblank
            except UnicodeDecodeError as exc:
                raise TaskDataError(
                    f"task {task!r}: data file {path} line {line_no}: not UTF-8 (byte {line[exc.start]:#04x} "
                    f"at column {exc.start + 1}); re-encode the file as UTF-8"
                ) from None
    return nonblank


def in_memory(dataset: Any) -> Any:
    """The same rows without backing files, so that `process_docs`'s `map` writes no cache files beside the
    data root's splits (or anywhere else)."""
    if not isinstance(dataset, datasets.Dataset) or not dataset.cache_files:
        return dataset
    if getattr(dataset, "_indices", None) is not None:  # a selection of rows: materialise it in memory
        return dataset.flatten_indices(keep_in_memory=True)
    return datasets.Dataset(InMemoryTable(dataset.data.table), info=dataset.info.copy(), split=dataset.split)
