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
A reader refuses a file of another format or of a newer version. Figures without per-document values
(`whole` figures such as f1, ece, ppl_gold; OLMo's figures) are named in `left_out` with the reason.

Writing follows the loggers' rules: rank 0 only, each file written whole or not at all (a temporary file
renamed into place), a failure warned about once per kind and never raised into training. A resumed run that
evaluates a step again rewrites that step's file: a step is never held twice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from inloop_eval.data.files import write_atomically
from inloop_eval.errors import InLoopEvalError
from inloop_eval.loggers.base import WarnOnce, error_kind, is_rank_zero
from inloop_eval.metrics.icl import DocumentOutcomes

OUTCOMES_DIR = "outcomes"
FORMAT = "inloop_eval.outcomes"
VERSION = 2
STEP_FILE = re.compile(r"step_(\d+)\.npz")


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
    """Write one step's file atomically (replacing an earlier one of the same step); returns its path."""
    arrays = outcome_arrays(outcomes, step)
    path = step_path(directory, step)

    def write(f: IO[bytes]) -> None:
        np.savez_compressed(f, **arrays)

    write_atomically(path, write)
    return path


def read_step(path: Path) -> StepOutcomes:
    """One step's file read back; OutcomesError naming the file when it is not one this version reads."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(str(archive["meta"]))
            arrays = {name: archive[name] for name in archive.files if name != "meta"}
    except (OSError, ValueError, KeyError) as exc:
        raise OutcomesError(f"outcomes file {path}: cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise OutcomesError(f"outcomes file {path}: not an {FORMAT} file (its meta: {str(meta)[:80]})")
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        raise OutcomesError(
            f"outcomes file {path}: format version {meta.get('version')!r}, this inloop_eval reads up to "
            f"{VERSION}; upgrade inloop_eval"
        )
    tasks = {}
    for i, task in enumerate(meta["tasks"]):
        tasks[task["label"]] = DocumentOutcomes(
            doc_id=arrays[f"t{i}.doc_id"],
            n_choices=arrays[f"t{i}.n_choices"],
            values={name: arrays[f"t{i}.{name}"].astype(np.float64) for name in task["figures"]},
            binary=frozenset(task["binary"]),
            left_out=dict(task["left_out"]),
            doc_task=arrays.get(f"t{i}.doc_task"),
        )
    return StepOutcomes(int(meta["step"]), tasks, str(path))


def outcomes_directory(path: Path) -> Path:
    """The outcomes directory of a run directory (`<path>/outcomes`), or `path` itself when it holds step
    files; OutcomesError when it holds neither."""
    for candidate in (path / OUTCOMES_DIR, path):
        if candidate.is_dir() and any(STEP_FILE.fullmatch(p.name) for p in candidate.iterdir()):
            return candidate
    raise OutcomesError(
        f"{path}: no per-document outcomes (expected {path / OUTCOMES_DIR}/step_<N>.npz); they are written by "
        "a run logging to a JSONLLogger with `outcomes: true` (the default), or by `inloop-eval evaluate "
        "--outcomes DIR`"
    )


def list_steps(directory: Path) -> dict[int, Path]:
    """step -> file of every step file in an outcomes directory, by step."""
    found = {}
    for p in directory.iterdir():
        match = STEP_FILE.fullmatch(p.name)
        if match:
            found[int(match.group(1))] = p
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

