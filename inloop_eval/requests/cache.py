"""On-disk cache of tokenized request tables: tokenize once, on rank 0, and read it everywhere else.

A table lives in `<INLOOP_EVAL_HOME or ~/.cache/inloop_eval>/requests/<key>.npz`, always directly in that
folder: the key is the task id made safe for a file name (`file_label`: no '/', '..' or ':', so an id such as
`harness:../x/task.yaml` cannot name a file elsewhere) and a hash of everything the table depends on: the task
id, the documents as the task renders them (so a change of data or of a task's prompt gives a new key), the
tokenizer's fingerprint, `max_length`, `limit`, whether unconditional requests are built, the source of
`tokenize.py`, `table.py` and `tokenizer.py`, and this module's format version. Tokenizers without a `fingerprint` are never
cached.

Each file is an archive entry of the checksummed cache (`inloop_eval.data.cache`): written atomically, its
record (format, key, the SHA-256 of every array, the table's schema) checked whenever it is read, and a file
that does not match is reported (`RequestCacheError`) and rebuilt, never trusted. Files hold NumPy arrays only
(`allow_pickle=False`): strings are stored as UTF-8 bytes with offsets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inloop_eval.data import tokenizer as tokenizer_module
from inloop_eval.data.cache import CacheMismatch, read_archive, write_archive
from inloop_eval.data.root import home
from inloop_eval.errors import InLoopEvalError
from inloop_eval.requests import table as table_module
from inloop_eval.requests import tokenize as tokenize_module
from inloop_eval.requests.table import PairSet, RequestTable
from inloop_eval.tasks.base import Doc, MultipleChoiceTask

FORMAT_VERSION = 3  # 2: a checksummed cache entry (`inloop_eval.data.cache`); 3: its fields under `schema`
_NOT_IN_FILE_NAMES = re.compile(r"[^A-Za-z0-9_-]+")


# What happens to a file that does not read back: the evaluator never trusts it and replaces it.
_REBUILT = "not used: the evaluator tokenizes the task again and rewrites the file, nothing to do"


log = logging.getLogger(__name__)


class RequestCacheError(InLoopEvalError):
    """A request cache file is unreadable, truncated or of another format (it is rebuilt, not trusted)."""


def cache_dir() -> Path:
    """`<INLOOP_EVAL_HOME or ~/.cache/inloop_eval>/requests`."""
    return home() / "requests"


def docs_digest(task: MultipleChoiceTask, docs: Sequence[Doc]) -> str:
    """Hash of the documents exactly as the task renders them, with the strings it adds around them."""
    h = hashlib.sha256()
    h.update(json.dumps([task.target_delimiter, task.uncond_context, task.pair_encoding]).encode())
    for doc in docs:
        h.update(
            json.dumps([doc.index, doc.contexts, doc.continuations, doc.gold, doc.uncond_contexts]).encode()
        )
    return h.hexdigest()


def file_label(task_id: str) -> str:
    """The readable part of a cache file's name: the task id with every run of characters other than
    letters, digits, '_' and '-' replaced by '_', at most 48 characters (the hash beside it keeps ids that
    read the same apart)."""
    return _NOT_IN_FILE_NAMES.sub("_", task_id).strip("_-")[:48] or "task"


def _code_digest() -> str:
    """Hash of the tokenization code (pair tokenizing, request tables and the tokenizer wrapper): a change to how requests are
    tokenized must never read tables made by the old code."""
    h = hashlib.sha256()
    for module in (tokenize_module, table_module, tokenizer_module):
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()


def cache_key(
    *,
    task_id: str,
    tokenizer_fingerprint: str,
    max_length: int,
    limit: int | None,
    with_uncond: bool,
    docs_sha256: str,
) -> str:
    """The file name (without `.npz`) of one task's table: `<file_label(task_id)>-<hash>`; see the module
    docstring."""
    fields = {
        "format": FORMAT_VERSION,
        "code": _code_digest(),
        "task": task_id,
        "tokenizer": tokenizer_fingerprint,
        "max_length": max_length,
        "limit": limit,
        "with_uncond": with_uncond,
        "docs": docs_sha256,
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]
    return f"{file_label(task_id)}-{digest}"


def cache_path(
    task: MultipleChoiceTask,
    docs: Sequence[Doc],
    tokenizer: Any,
    *,
    max_length: int,
    limit: int | None,
    with_uncond: bool,
) -> Path | None:
    """Where this task's table is cached, or None when the tokenizer has no fingerprint."""
    fingerprint = getattr(tokenizer, "fingerprint", None)
    if not isinstance(fingerprint, str) or not fingerprint:
        return None
    key = cache_key(
        task_id=task.name,
        tokenizer_fingerprint=fingerprint,
        max_length=max_length,
        limit=limit,
        with_uncond=with_uncond,
        docs_sha256=docs_digest(task, docs),
    )
    return cache_dir() / f"{key}.npz"


def _pack_strings(values: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(UTF-8 bytes of the distinct strings [total] uint8, their offsets [U+1], index of each value [n])."""
    distinct: dict[str, int] = {}
    index = np.fromiter((distinct.setdefault(v, len(distinct)) for v in values), np.int64, len(values))
    encoded = [s.encode("utf-8") for s in distinct]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in encoded], dtype=np.int64)]).astype(np.int64)
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return data, offsets, index


def _unpack_strings(data: np.ndarray, offsets: np.ndarray, index: np.ndarray) -> list[str]:
    raw = data.tobytes()
    distinct = [raw[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(len(offsets) - 1)]
    return [distinct[i] for i in index.tolist()]


def _table_arrays(table: RequestTable) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every field of the table as named arrays, and a schema saying how to rebuild it."""
    arrays: dict[str, np.ndarray] = {}
    schema: dict[str, Any] = {}
    for f in dataclasses.fields(table):
        value = getattr(table, f.name)
        if isinstance(value, PairSet):
            schema[f.name] = "pairs"
            for g in dataclasses.fields(value):
                arrays[f"{f.name}.{g.name}"] = np.asarray(getattr(value, g.name))
        elif isinstance(value, np.ndarray):
            schema[f.name] = "array"
            arrays[f.name] = value
        elif isinstance(value, str):
            schema[f.name] = ["str", value]
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            schema[f.name] = "strings"
            data, offsets, index = _pack_strings(value)
            arrays[f"{f.name}.data"], arrays[f"{f.name}.offsets"], arrays[f"{f.name}.index"] = (
                data,
                offsets,
                index,
            )
        else:
            raise TypeError(f"request cache: field {f.name!r} of type {type(value).__name__} is not storable")
    return arrays, schema


def save_table(table: RequestTable, path: Path) -> None:
    """Write `table` to `path` atomically, with its record (`inloop_eval.data.cache`)."""
    arrays, schema = _table_arrays(table)
    write_archive(path, arrays, version=FORMAT_VERSION, key=path.stem, info={"schema": schema})


def load_table(path: Path) -> RequestTable | None:
    """The table cached at `path`; None when there is no file. Raises RequestCacheError for a file that is
    not the table written under this key by this version."""
    try:
        entry = read_archive(path, version=FORMAT_VERSION, key=path.stem)
    except CacheMismatch as exc:
        what = "unreadable" if exc.damaged else "not a request table of this version"
        raise RequestCacheError(f"request cache {path}: {what} ({exc}); {_REBUILT}") from None
    if entry is None:
        return None
    arrays, info = entry
    try:
        return _rebuild(arrays, info["schema"])
    except (KeyError, ValueError, TypeError) as exc:
        raise RequestCacheError(
            f"request cache {path}: not a request table of this version ({type(exc).__name__}: {exc}); "
            f"{_REBUILT}"
        ) from None


def _rebuild(arrays: dict[str, np.ndarray], schema: dict[str, Any]) -> RequestTable:
    expected = [f.name for f in dataclasses.fields(RequestTable)]
    if sorted(schema) != sorted(expected):
        raise ValueError(f"expected fields {sorted(expected)}, found {sorted(schema)}")
    values: dict[str, Any] = {}
    for name, kind in schema.items():
        if kind == "pairs":
            values[name] = PairSet(
                **{g.name: arrays[f"{name}.{g.name}"] for g in dataclasses.fields(PairSet)}
            )
        elif kind == "array":
            values[name] = arrays[name]
        elif kind == "strings":
            values[name] = _unpack_strings(
                arrays[f"{name}.data"], arrays[f"{name}.offsets"], arrays[f"{name}.index"]
            )
        elif isinstance(kind, list) and kind[0] == "str":
            values[name] = kind[1]
        else:
            raise ValueError(f"field {name!r}: unknown kind {kind!r}")
    return RequestTable(**values)


def table_fingerprint(table: RequestTable) -> int:
    """62 bits of a digest of every request's tokens and document, choice and gold flags: equal on every rank
    that builds the same requests."""
    digest = hashlib.blake2b(digest_size=8)
    pairs = table.pairs.concat(table.uncond)
    for array in (pairs.ctx_tokens, pairs.ctx_offsets, pairs.ctx_id, pairs.ctx_start, pairs.ctx_end,
                  pairs.cont_tokens, pairs.cont_offsets, table.doc_id, table.cont_id, table.is_gold):  # fmt: skip
        digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
    return int.from_bytes(digest.digest(), "little") >> 2


def read_request_cache(path: Path | None) -> RequestTable | None:
    """The cached table at `path`, or None (no path, no file, or a file that does not read back)."""
    if path is None:
        return None
    try:
        return load_table(path)
    except RequestCacheError as exc:
        log.warning("%s", exc)
        return None


def write_request_cache(table: RequestTable, path: Path | None) -> None:
    """Cache `table` at `path`; a cache that cannot be written is logged, never fatal."""
    if path is None:
        return
    try:
        save_table(table, path)
    except OSError as exc:
        log.warning("request cache %s not written (%s); every rank tokenizes for itself", path, exc)
