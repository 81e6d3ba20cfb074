"""Where task data lives: a local root arranged as OLMo's `save_to_disk` writes it, else the Hugging Face hub.

Folders: `<root>/<dataset path>/<dataset name or "none">/<split>`, each a directory written by
`datasets.Dataset.save_to_disk`.

A root made by `inloop-eval data fetch` holds a manifest, `<root>/.manifest.json`, of every file the fetch
wrote: its path relative to the root, its size and its SHA-256. Loading a split checks the split's files
against it once per process (again only if a file's size or modification time changes), so a corrupted
file is an error naming the file rather than silently wrong documents; `verify_root` checks every file. A
root without a manifest (fetched by an older version, or made by hand) loads without these checks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from stat import S_ISREG
from typing import TYPE_CHECKING, Any

from inloop_eval.data.files import sha256_of, write_text_atomically
from inloop_eval.data.saved_split import read_saved_split
from inloop_eval.errors import TaskDataError

if TYPE_CHECKING:
    import datasets

OE_EVAL_DIR = "oe_eval_tasks"
TOKENIZER_DIR = "tokenizers"
# Written last by `fetch`: a root with it is complete and never fetched into again.
COMPLETE_MARKER = ".complete"
MANIFEST_FILE = ".manifest.json"
MANIFEST_FORMAT = 1


def home() -> Path:
    """`$INLOOP_EVAL_HOME`, else `~/.cache/inloop_eval`: data, caches and downloads live under it."""
    return Path(os.environ.get("INLOOP_EVAL_HOME", "~/.cache/inloop_eval")).expanduser()


def default_data_root() -> Path:
    """`$INLOOP_EVAL_DATA`, else `<home>/data`."""
    env = os.environ.get("INLOOP_EVAL_DATA")
    return Path(env).expanduser() if env else home() / "data"


def oe_eval_dir(root: str | Path) -> Path:
    """OLMo's oe-eval request files inside a fetched data root: `<task>/<variant>/requests.jsonl.gz`."""
    return Path(root) / OE_EVAL_DIR


def neox_tokenizer_path(root: str | Path) -> Path:
    """The GPT-NeoX-20B tokenizer (with OLMo's PII special tokens) inside a fetched data root."""
    return Path(root) / TOKENIZER_DIR / "gpt-neox-20b.json"


def split_dir(root: str | Path, path: str, name: str | None, split: str) -> Path:
    return Path(root) / path / (name or "none") / split


def refetch_hint(root: Path) -> str:
    """How to replace a data root's damaged files (a root with the `.complete` marker is never refetched)."""
    return (
        f"to fetch it again, delete {root / COMPLETE_MARKER} and run `inloop-eval data fetch --root {root}`"
    )


def _damaged_hint(root: Path) -> str:
    return f"`inloop-eval data verify --root {root}` lists every damaged file; {refetch_hint(root)}"


# ---- the manifest of a fetched root


@dataclass(frozen=True)
class FileRecord:
    """What a fetched file must be: its size in bytes and the hex SHA-256 of its contents."""

    size: int
    sha256: str


def record_files(directory: Path) -> dict[str, FileRecord]:
    """A record of every regular file under `directory`, keyed by its POSIX path relative to it."""
    records: dict[str, FileRecord] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            records[path.relative_to(directory).as_posix()] = FileRecord(path.stat().st_size, sha256_of(path))
    return records


def write_manifest(root: Path, records: Mapping[str, FileRecord]) -> None:
    """Write `<root>/.manifest.json` (atomically) from `records`."""
    files = {rel: {"size": r.size, "sha256": r.sha256} for rel, r in sorted(records.items())}
    text = json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1)
    write_text_atomically(root / MANIFEST_FILE, text + "\n")


# Manifests read in this process: manifest path -> ((mtime_ns, size) when read, its records).
_MANIFESTS: dict[Path, tuple[tuple[int, int], dict[str, FileRecord]]] = {}


def read_manifest(root: Path) -> dict[str, FileRecord] | None:
    """The records of `<root>/.manifest.json`, or None when the root has none; parsed once per process."""
    path = root / MANIFEST_FILE
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _MANIFESTS.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    records = _parse_manifest(path)
    _MANIFESTS[path] = (stamp, records)
    return records


def _parse_manifest(path: Path) -> dict[str, FileRecord]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {MANIFEST_FORMAT}")
        records = {
            str(rel): FileRecord(int(entry["size"]), str(entry["sha256"]))
            for rel, entry in data["files"].items()
        }
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TaskDataError(
            f"data root {path.parent}: its manifest {path} is unreadable ({type(exc).__name__}: {exc}); "
            f"expected the JSON that `inloop-eval data fetch` writes. Delete {path.parent / COMPLETE_MARKER} "
            f"and run `inloop-eval data fetch --root {path.parent}` to rebuild the root and its manifest"
        ) from None
    outside = [rel for rel in records if not is_inside(rel)]
    if outside:
        raise TaskDataError(
            f"data root {path.parent}: its manifest {path} names {len(outside)} files outside the root, e.g. "
            f"{outside[0]!r}; expected paths relative to the root without '..'. The manifest was not written by "
            f"`inloop-eval data fetch`: delete {path.parent / COMPLETE_MARKER} and run `inloop-eval data fetch "
            f"--root {path.parent}` to rebuild it"
        )
    return records


def is_inside(rel: str) -> bool:
    """Whether a manifest path stays inside the root: relative, no '..' and no empty or '.' part (so a
    manifest can never make `data verify` or a load read `/dev/zero` or another tree)."""
    parts = PurePosixPath(rel).parts
    return bool(parts) and not rel.startswith("/") and "\\" not in rel and all(p not in ("..", ".", "") for p in parts)


def check_files(root: Path, records: Mapping[str, FileRecord]) -> list[str]:
    """One line per file of `records` that is missing under `root` or differs in size or SHA-256.

    Sizes are compared first, so a truncated file costs no hashing."""
    problems: list[str] = []
    for rel, record in sorted(records.items()):
        path = root / rel
        try:
            info = path.lstat()
        except FileNotFoundError:
            problems.append(f"{path}: missing (expected {record.size} bytes)")
            continue
        if not S_ISREG(info.st_mode):  # a FIFO, device or link is never hashed: it may never end
            problems.append(f"{path}: not a regular file (expected {record.size} bytes of data)")
            continue
        size = info.st_size
        if size != record.size:
            problems.append(f"{path}: {size} bytes, expected {record.size}")
            continue
        digest = sha256_of(path)
        if digest != record.sha256:
            problems.append(f"{path}: sha256 {digest}, expected {record.sha256}")
    return problems


def verify_root(root: str | Path) -> tuple[int, list[str]]:
    """Check every file of a fetched root against its manifest: (files checked, one line per bad file).

    Raises TaskDataError when the root has no manifest."""
    root = Path(root).expanduser().absolute()
    records = read_manifest(root)
    if records is None:
        raise TaskDataError(
            f"data root {root}: no manifest {root / MANIFEST_FILE}, so there is nothing to verify against "
            "(the root was made by hand or fetched by an older inloop_eval). To get a verifiable root, run "
            f"`inloop-eval data fetch --root NEW_DIR` and point INLOOP_EVAL_DATA at NEW_DIR"
        )
    return len(records), check_files(root, records)


# Split directories verified in this process: directory -> (relative path, size, mtime_ns) of each of its
# recorded files when they matched. Later loads re-hash only when one of these changes.
_VERIFIED: dict[Path, tuple[tuple[str, int, int], ...]] = {}


def _stamp(root: Path, records: Mapping[str, FileRecord]) -> tuple[tuple[str, int, int], ...] | None:
    stamps = []
    for rel in sorted(records):
        try:
            stat = (root / rel).stat()
        except FileNotFoundError:
            return None
        stamps.append((rel, stat.st_size, stat.st_mtime_ns))
    return tuple(stamps)


def verify_split_dir(root: Path, local: Path, task: str) -> None:
    """Check the files of the split directory `local` against the root's manifest, if it has one.

    Raises TaskDataError naming each bad file. A directory the manifest does not cover is not checked."""
    records = read_manifest(root)
    if records is None:
        return
    prefix = local.relative_to(root).as_posix() + "/"
    mine = {rel: r for rel, r in records.items() if rel.startswith(prefix)}
    if not mine:
        return
    stamp = _stamp(root, mine)
    if stamp is not None and _VERIFIED.get(local) == stamp:
        return
    problems = check_files(root, mine)
    if problems:
        raise TaskDataError(
            f"task {task!r}: the split {PurePosixPath(prefix[:-1])} does not match the data root's manifest "
            f"{root / MANIFEST_FILE}: " + "; ".join(problems) + ". A file is damaged or was changed after "
            f"fetching. {_damaged_hint(root)}"
        )
    if stamp is not None:  # taken before hashing, so a file changed meanwhile is hashed again next time
        _VERIFIED[local] = stamp


def load_split(
    path: str,
    name: str | None,
    split: str,
    *,
    data_root: str | Path | None = None,
    task: str = "",
    allow_hub: bool = False,
) -> datasets.Dataset:
    """Load one split from the local root; from the hub only when `allow_hub` (never during training)."""
    import datasets  # deferred: importing datasets (with pandas and pyarrow) costs most of a second
    root = (Path(data_root) if data_root is not None else default_data_root()).expanduser().absolute()
    local = split_dir(root, path, name, split)
    if local.is_dir():
        verify_split_dir(root, local, task)
        return _load_from_disk(root, local, task)
    if allow_hub:
        try:
            return datasets.load_dataset(path, name, split=split)
        except Exception as exc:  # the hub raises many types; all mean "not available"
            raise TaskDataError(
                f"task {task!r}: data not found at {local} and the hub gave {type(exc).__name__}: {exc}; "
                "run `inloop-eval data fetch --root DIR` on a machine with network access"
            ) from None
    raise TaskDataError(
        f"task {task!r}: expected the split {path}/{name or 'none'}/{split} under the data root {root}, "
        f"found no directory {local}; run `inloop-eval data fetch --root {root}` first "
        "(or set INLOOP_EVAL_DATA / `data_root` to where the data is)"
    )


def split_rows(
    path: str, name: str | None, split: str, *, data_root: str | Path | None = None, task: str = ""
) -> Sequence[Mapping[str, Any]]:
    """The rows of one split from the local root, as dicts: read with pyarrow alone when the split is plain
    (`inloop_eval.data.saved_split`), so evaluating never imports `datasets`; through `load_split` otherwise."""
    root = (Path(data_root) if data_root is not None else default_data_root()).expanduser().absolute()
    local = split_dir(root, path, name, split)
    if not local.is_dir():
        return load_split(path, name, split, data_root=root, task=task)
    verify_split_dir(root, local, task)
    try:
        rows = read_saved_split(local)
    except Exception as exc:  # pyarrow and json each raise their own types for a damaged file
        raise _damaged_split(root, local, task, exc) from None
    return rows if rows is not None else _load_from_disk(root, local, task)


def _load_from_disk(root: Path, local: Path, task: str) -> datasets.Dataset:
    """`datasets.load_from_disk`, with any failure (damaged Arrow or JSON files) a TaskDataError naming them."""
    import datasets  # deferred: importing datasets (with pandas and pyarrow) costs most of a second
    try:
        return datasets.load_from_disk(str(local))
    except Exception as exc:  # pyarrow, json and datasets each raise their own types for a damaged file
        raise _damaged_split(root, local, task, exc) from None


def _damaged_split(root: Path, local: Path, task: str, exc: Exception) -> TaskDataError:
    files = ", ".join(sorted(p.name for p in local.iterdir() if p.is_file())) or "none"
    return TaskDataError(
        f"task {task!r}: could not load the split directory {local} (its files: {files}): "
        f"{type(exc).__name__}: {exc}. A file there is damaged or incomplete. {_damaged_hint(root)}"
    )
