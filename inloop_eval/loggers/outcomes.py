"""Per-document outcomes on disk: `<run_dir>/outcomes/step_<N>.npz`, one file per evaluation, what
`inloop-eval compare` pairs.

The format (version 2), a NumPy `.npz` archive (`np.savez_compressed`, read with `allow_pickle=False`):
- `meta`: a 0-d string array holding JSON: `{"format": "inloop_eval.outcomes", "version": 2, "step": N,
  "tasks": [{"label": ..., "figures": [...], "binary": [...], "left_out": {figure: reason}}, ...]}`;
- for the i-th task of `tasks`: `t<i>.doc_id` (int64, ascending), `t<i>.n_choices` (int64), and
  `t<i>.<figure>` for each of its `figures`: uint8 (0/1) for the `binary` ones, else float64. The figure
  logged as `eval/downstream/<label>/<figure>` at step N is the mean of that array;
- `t<i>.doc_task` (a string array, version 2) for outcomes pooling several tasks: a suite average, its task
  labelled `suite/<label>` (`keys.suite_outcomes_label`), its documents keyed by (task, doc_id) and its
  figure `centered_acc` the mean of that array (`metrics.suite`). Version 1 files have none and read alike.
A reader (`read_step`) reads only the members the format names, each one's header checked against the
archive's size before its data (`loggers.outcomes_archive`), and refuses, naming the file and what is wrong,
anything that is not a regular file, not this format or of a newer version, a meta or member out of shape,
a document or task held twice, a 0/1 figure holding another value, and a file whose step is not its name's. Figures without per-document values
(`whole` figures such as f1, ece, ppl_gold; OLMo's figures) are named in `left_out` with the reason.

Writing follows the loggers' rules: rank 0 only, each file written whole or not at all (a temporary file
renamed into place), a failure warned about once per kind and never raised into training. A resumed run that
evaluates a step again rewrites that step's file: a step is never held twice; when that rewrite fails, the
earlier file is removed, so that it is never read as the new evaluation's outcomes.
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from inloop_eval.data.files import write_atomically
from inloop_eval.errors import InLoopEvalError
from inloop_eval.loggers.base import WarnOnce, error_kind, is_rank_zero
from inloop_eval.loggers.outcomes_archive import (
    ArchiveError,
    Member,
    has_member,
    member_header,
    one_line,
    open_archive,
    read_member,
)
from inloop_eval.metrics.icl import DocumentOutcomes

log = logging.getLogger(__name__)

OUTCOMES_DIR = "outcomes"
FORMAT = "inloop_eval.outcomes"
VERSION = 2
# A step file's name as `step_path` writes it (no leading zeros: one name per step).
STEP_FILE = re.compile(r"step_(0|[1-9][0-9]*)\.npz")
# The largest `meta` a reader takes: far above a suite's (about 100 bytes a task), far below a memory risk.
META_MAX_BYTES = 64 << 20


class OutcomesError(InLoopEvalError):
    """An outcomes directory or file that cannot be read (missing, another format, a newer version)."""


@dataclass
class StepOutcomes:
    """One evaluation's per-document outcomes: label -> `DocumentOutcomes`, and where they were read."""

    step: int
    tasks: dict[str, DocumentOutcomes]
    source: str = ""


def step_path(directory: Path, step: int) -> Path:
    """The file of `step` in an outcomes directory."""
    return directory / f"step_{int(step)}.npz"


def outcome_arrays(outcomes: Mapping[str, DocumentOutcomes], step: int) -> dict[str, np.ndarray]:
    """The arrays of one step's file (see the module docstring)."""
    tasks, arrays = [], {}
    for i, (label, task) in enumerate(outcomes.items()):
        figures = list(task.values)
        tasks.append(
            {
                "label": label,
                "figures": figures,
                "binary": sorted(task.binary),
                "left_out": dict(task.left_out),
            }
        )
        arrays[f"t{i}.doc_id"] = np.asarray(task.doc_id, dtype=np.int64)
        arrays[f"t{i}.n_choices"] = np.asarray(task.n_choices, dtype=np.int64)
        if task.doc_task is not None:
            arrays[f"t{i}.doc_task"] = np.asarray(task.doc_task, dtype=str)
        for name in figures:
            dtype = np.uint8 if name in task.binary else np.float64
            arrays[f"t{i}.{name}"] = np.asarray(task.values[name]).astype(dtype)
    meta = {"format": FORMAT, "version": VERSION, "step": int(step), "tasks": tasks}
    arrays["meta"] = np.array(json.dumps(meta))
    return arrays


def write_step(directory: Path, outcomes: Mapping[str, DocumentOutcomes], step: int) -> Path:
    """Write one step's file atomically (replacing an earlier one of the same step); returns its path.

    When the write fails, the step's earlier file (an earlier evaluation of the same step, by a run resumed
    from before it) is removed before the error goes on, so that no reader takes it for this evaluation's
    outcomes; a note on the error (`add_note`) says so, or that it could not be removed."""
    path = step_path(directory, step)

    def write(f: IO[bytes]) -> None:
        np.savez_compressed(f, **arrays)

    try:
        arrays = outcome_arrays(outcomes, step)
        write_atomically(path, write)
    except BaseException as exc:
        note = discard_earlier(path, step)
        if note:
            exc.add_note(note)
        raise
    return path


def discard_earlier(path: Path, step: int) -> str:
    """Remove the file (or link) `path` of an earlier evaluation of `step`; what happened, in words ('' when
    there was none)."""
    if not (path.is_symlink() or path.is_file()):
        return ""
    try:
        path.unlink()
    except OSError as exc:
        return (
            f"the earlier {path} (an earlier evaluation of step {step}) could not be removed "
            f"({exc.strerror or exc}): remove it, or readers will take it for this evaluation's outcomes"
        )
    return (
        f"the earlier {path} (an earlier evaluation of step {step}) was removed, so that no reader takes it "
        "for this evaluation's outcomes"
    )


def read_step(path: Path) -> StepOutcomes:
    """One step's file read back, every part checked against the format (module docstring) before it is
    used; OutcomesError naming the file and what is wrong when it is not a file this version reads."""
    try:
        with open_archive(path) as archive:
            meta = read_meta(archive)
            members = [task_members(archive, i, task, meta["version"]) for i, task in enumerate(meta["tasks"])]
            tasks = {
                task["label"]: task_outcomes(archive, task, found)
                for task, found in zip(meta["tasks"], members, strict=True)
            }
    except (ArchiveError, OutcomesError) as exc:
        raise OutcomesError(f"outcomes file {path}: {exc}") from exc
    named = STEP_FILE.fullmatch(path.name)
    if named and int(named.group(1)) != meta["step"]:
        raise OutcomesError(
            f"outcomes file {path}: holds step {meta['step']} but is named for step {int(named.group(1))}; "
            f"a step file is read as the step it holds: rename it step_{meta['step']}.npz or move it away"
        )
    return StepOutcomes(meta["step"], tasks, str(path))


def read_meta(archive: zipfile.ZipFile) -> dict[str, Any]:
    """The file's `meta` member, parsed and checked (`check_meta`)."""
    if not has_member(archive, "meta"):
        shown = ", ".join(archive.namelist()[:5])
        raise OutcomesError(f"not an {FORMAT} file: it has no 'meta' member (it holds: {shown})")
    member = member_header(archive, "meta")
    if member.shape != () or member.dtype.kind != "U":
        raise OutcomesError(f"member 'meta': expected a 0-d string array of JSON, found {member.describe()}")
    if member.nbytes > META_MAX_BYTES:
        raise OutcomesError(f"member 'meta': {member.nbytes} bytes, more than this format's {META_MAX_BYTES}")
    try:
        meta = json.loads(str(read_member(archive, member)[()]))
    except RecursionError:
        raise OutcomesError("its meta is JSON nested too deeply to be this format's") from None
    except ValueError as exc:
        raise OutcomesError(f"its meta is not JSON ({one_line(exc)})") from None
    check_meta(meta)
    return meta


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def check_meta(meta: object) -> None:
    """OutcomesError saying what is wrong when `meta` is not this format's: its format, a version from 1
    to VERSION, a step >= 0 and a list of tasks (`check_task_entry`) with distinct labels."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise OutcomesError(f"not an {FORMAT} file (its meta: {one_line(str(meta)[:200])[:80]})")
    version = meta.get("version")
    if type(version) is not int or version < 1:  # `true` is an int to Python, never a version
        raise OutcomesError(
            f"format version {version!r} is none this format has (a whole number from 1); the file was not "
            "written by inloop_eval"
        )
    if version > VERSION:
        raise OutcomesError(
            f"format version {version}, this inloop_eval reads up to {VERSION}; upgrade inloop_eval"
        )
    step = meta.get("step")
    if type(step) is not int or step < 0:
        raise OutcomesError(f"its step {step!r} is not a training step (a whole number >= 0)")
    tasks = meta.get("tasks")
    if not isinstance(tasks, list):
        raise OutcomesError(f"its `tasks`: expected a list of tasks, found {type_name(tasks)}")
    for i, task in enumerate(tasks):
        check_task_entry(i, task)
    labels = [task["label"] for task in tasks]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise OutcomesError(f"task labels held twice: {twice}; a file holds each task once")


def is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def check_task_entry(i: int, task: object) -> None:
    """OutcomesError when the i-th entry of `tasks` is not {label, figures, binary, left_out} as written."""
    if not isinstance(task, dict):
        raise OutcomesError(
            f"tasks[{i}]: expected a mapping of label, figures, binary and left_out, found {type_name(task)}"
        )
    label = task.get("label")
    if not isinstance(label, str) or not label:
        raise OutcomesError(f"tasks[{i}]: its label {label!r} is not a task label (a non-empty string)")
    where = f"task {label!r}"
    figures = task.get("figures")
    if not is_str_list(figures):
        raise OutcomesError(f"{where}: `figures`: expected a list of figure names, found {one_line(figures)[:80]}")
    twice = sorted({name for name in figures if figures.count(name) > 1})
    if twice:
        raise OutcomesError(f"{where}: figures named twice: {twice}")
    binary = task.get("binary")
    if not is_str_list(binary) or not set(binary) <= set(figures):
        raise OutcomesError(
            f"{where}: `binary`: expected a list of its figures, found {one_line(binary)[:80]}"
        )
    left_out = task.get("left_out")
    if not isinstance(left_out, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in left_out.items()
    ):
        raise OutcomesError(f"{where}: `left_out`: expected figure -> reason, found {one_line(left_out)[:80]}")


# The member kinds per document: integer ids and choice counts, task labels, figures as numbers.
ID_KINDS, LABEL_KINDS, FIGURE_KINDS = "iu", "U", "biuf"


def task_members(archive: zipfile.ZipFile, i: int, task: dict[str, Any], version: int) -> dict[str, Member]:
    """The headers of task i's members, checked before any data is read: a 1-D integer `doc_id` of D
    documents, and D integer `n_choices`, D numbers per figure and (version 2) D task labels."""
    where = f"task {task['label']!r}"
    doc_id = member_header(archive, f"t{i}.doc_id")
    if len(doc_id.shape) != 1 or doc_id.dtype.kind not in ID_KINDS:
        raise OutcomesError(
            f"{where}: member {doc_id.name!r}: expected a 1-D array of document ids, found {doc_id.describe()}"
        )
    n_docs = doc_id.shape[0]
    wanted = {"n_choices": ID_KINDS, **dict.fromkeys(task["figures"], FIGURE_KINDS)}
    if version >= 2 and has_member(archive, f"t{i}.doc_task"):
        wanted["doc_task"] = LABEL_KINDS
    members = {"doc_id": doc_id}
    for key, kinds in wanted.items():
        member = member_header(archive, f"t{i}.{key}")
        if member.shape != (n_docs,) or member.dtype.kind not in kinds:
            what = {ID_KINDS: "integers", LABEL_KINDS: "task labels", FIGURE_KINDS: "numbers"}[kinds]
            raise OutcomesError(
                f"{where}: member {member.name!r}: expected {n_docs} {what} (one per document), found "
                f"{member.describe()}"
            )
        members[key] = member
    return members


def task_outcomes(archive: zipfile.ZipFile, task: dict[str, Any], members: dict[str, Member]) -> DocumentOutcomes:
    """One task's outcomes from its checked members; OutcomesError for a document held twice or a 0/1
    figure holding another value."""
    where = f"task {task['label']!r}"
    doc_id = read_member(archive, members["doc_id"]).astype(np.int64)
    doc_task = read_member(archive, members["doc_task"]).astype(str) if "doc_task" in members else None
    twice = repeated_document(doc_id, doc_task)
    if twice is not None:
        raise OutcomesError(
            f"{where}: document {twice} is held more than once; a file holds each document once (it was "
            "edited, or not written by inloop_eval), so its documents cannot be paired"
        )
    values = {}
    for name in task["figures"]:
        values[name] = read_member(archive, members[name]).astype(np.float64)
        if name in task["binary"]:
            bad = np.flatnonzero((values[name] != 0) & (values[name] != 1))
            if len(bad):
                raise OutcomesError(
                    f"{where}: figure {name!r} is a 0/1 figure but holds {float(values[name][bad[0]])!r} (document "
                    f"{doc_id[bad[0]]}, one of {len(bad)} such)"
                )
    return DocumentOutcomes(
        doc_id=doc_id,
        n_choices=read_member(archive, members["n_choices"]).astype(np.int64),
        values=values,
        binary=frozenset(task["binary"]),
        left_out=dict(task["left_out"]),
        doc_task=doc_task,
    )


def repeated_document(doc_id_D: np.ndarray, doc_task_D: np.ndarray | None = None) -> str | None:
    """A document held more than once, in words (`id 7`, or `'piqa' id 7` for pooled outcomes keyed by
    (task, id)); None when each is held once."""
    keys = (doc_id_D,) if doc_task_D is None else (doc_id_D, doc_task_D)
    order = np.lexsort(keys)
    same = np.ones(max(len(doc_id_D) - 1, 0), dtype=bool)
    for key in keys:
        sorted_key = key[order]
        same &= sorted_key[1:] == sorted_key[:-1]
    if not same.any():
        return None
    first = order[int(np.argmax(same))]
    return f"id {doc_id_D[first]}" if doc_task_D is None else f"{str(doc_task_D[first])!r} id {doc_id_D[first]}"


def outcomes_directory(path: Path) -> Path:
    """The outcomes directory of a run directory (`<path>/outcomes`), or `path` itself when it holds step
    files; OutcomesError when it holds neither."""
    for candidate in (path / OUTCOMES_DIR, path):
        if candidate.is_dir() and list_steps(candidate):
            return candidate
    raise OutcomesError(
        f"{path}: no per-document outcomes (expected {path / OUTCOMES_DIR}/step_<N>.npz); they are written by "
        "a run logging to a JSONLLogger with `outcomes: true` (the default), or by `inloop-eval evaluate "
        "--outcomes DIR`"
    )


def list_steps(directory: Path) -> dict[int, Path]:
    """step -> file of every step file in an outcomes directory, by step; OutcomesError when the directory
    cannot be listed."""
    try:
        names = [p.name for p in directory.iterdir()]
    except OSError as exc:
        raise OutcomesError(f"{directory}: cannot be listed ({exc.strerror or exc})") from exc
    found = {int(m.group(1)): directory / m.group(0) for m in map(STEP_FILE.fullmatch, names) if m}
    return dict(sorted(found.items()))


class OutcomesWriter:
    """Writes each evaluation's per-document outcomes into `directory` (rank 0 only), never raising: a
    failure (a full disk) is warned about once per kind, and the next step is tried again."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._warn = WarnOnce()

    def write(self, outcomes: Mapping[str, DocumentOutcomes], step: int) -> None:
        if not outcomes or not is_rank_zero():
            return
        try:
            write_step(self.directory, outcomes, step)
        except (OSError, ValueError, TypeError) as exc:
            self._warn(
                f"outcomes:{error_kind(exc)}",
                f"per-document outcomes of step {step} not written to {self.directory} "
                f"({type(exc).__name__}: {exc}); training goes on and later steps are tried again",
            )
            for note in getattr(exc, "__notes__", []):  # each time: a removed file is this step's news
                log.warning("per-document outcomes of step %d: %s", step, note)
