"""Two evaluations' per-document outcomes paired per task and figure, on the documents both evaluated.

A side is a run directory (its `outcomes/`), an `inloop-eval evaluate --outcomes` directory, or either with
`@<step>` (default: its latest step). Documents one side evaluated and the other did not (a changed `limit`,
a subset) are counted and reported, never paired; tasks and figures of one side only are listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inloop_eval.compare.suites import agreed_suite_values, is_suite_figure
from inloop_eval.errors import ConfigError
from inloop_eval.loggers.outcomes import (
    OutcomesError,
    StepOutcomes,
    list_steps,
    outcomes_directory,
    read_step,
    repeated_document,
)
from inloop_eval.metrics.icl import DocumentOutcomes
from inloop_eval.metrics.paired import PairedResult, paired_difference
from inloop_eval.metrics.registry import lower_is_better

# A step as `RUN@STEP` writes it.
STEP_NUMBER = re.compile(r"[0-9]+")


@dataclass
class TaskComparison:
    """One task of both sides: each figure's `PairedResult` on the `n_both` documents both evaluated.

    n_only_a, n_only_b: documents only that side evaluated (left out of every figure).
    n_nonfinite: paired documents left out of a figure because a value was not finite (figure -> count).
    figures_only_in: figure -> "A" or "B" for figures one side lacks (not compared).
    """

    label: str
    n_both: int
    n_only_a: int
    n_only_b: int
    figures: dict[str, PairedResult] = field(default_factory=dict)
    n_nonfinite: dict[str, int] = field(default_factory=dict)
    figures_only_in: dict[str, str] = field(default_factory=dict)

    def note(self) -> str:
        """What the comparison left out, in words ('' when the two sides evaluated the same documents)."""
        parts = []
        if self.n_only_a or self.n_only_b:
            parts.append(
                f"compared on the {self.n_both} documents both evaluated (A alone: {self.n_only_a}, "
                f"B alone: {self.n_only_b})"
            )
        parts += [f"{name}: {k} documents with a value not finite left out" for name, k in self.n_nonfinite.items()]
        parts += [f"{name} only in {side}, not compared" for name, side in self.figures_only_in.items()]
        return "; ".join(parts)


@dataclass
class Comparison:
    """Two sides compared: their sources and steps, the tasks both hold, and those only one holds."""

    a: StepOutcomes
    b: StepOutcomes
    tasks: dict[str, TaskComparison]
    tasks_only_in_a: list[str]
    tasks_only_in_b: list[str]


def parse_side(spec: str) -> tuple[Path, int | None]:
    """(directory, step or None) of `run` or `run@step`; OutcomesError when what follows the last `@` is not
    a step (a whole number >= 0), unless `spec` as a whole names an existing path (a directory named with
    an `@`)."""
    head, at, tail = spec.rpartition("@")
    if not at or (Path(spec).exists() and not Path(head).is_dir()):
        return Path(spec), None
    if not STEP_NUMBER.fullmatch(tail):
        raise OutcomesError(
            f"{spec}: {tail!r} after '@' is not a step (a whole number >= 0); write RUN@STEP, e.g. {head}@1000, "
            f"or RUN for its latest step"
        )
    return Path(head), int(tail)


def load_side(spec: str) -> StepOutcomes:
    """The outcomes `spec` names: `run@step`, or `run` (its latest step); OutcomesError naming what exists."""
    path, step = parse_side(spec)
    steps = list_steps(outcomes_directory(path))
    if step is None:
        step = max(steps)
    if step not in steps:
        shown = ", ".join(str(s) for s in list(steps)[-10:])
        raise OutcomesError(f"{spec}: no outcomes of step {step} in {path}; steps held: {shown}")
    return read_step(steps[step])


def document_keys(outcomes: DocumentOutcomes, pooled: bool) -> np.ndarray:
    """[D] what identifies each document: its id, or `<task>\\x00<id>` when `pooled` (outcomes of several
    tasks, such as a suite average, keyed by (task, doc_id))."""
    if not pooled:
        return outcomes.doc_id
    task_D = outcomes.doc_task if outcomes.doc_task is not None else np.full(len(outcomes.doc_id), "")
    return np.char.add(np.char.add(task_D.astype(str), "\x00"), outcomes.doc_id.astype(str))


def paired_indices(label: str, a: StepOutcomes, b: StepOutcomes) -> tuple[np.ndarray, np.ndarray]:
    """([N] A's, [N] B's) positions of the documents both sides of task `label` hold, by key (`document_keys`);
    OutcomesError naming the side when it holds a document twice (pairing would be ambiguous)."""
    task_a, task_b = a.tasks[label], b.tasks[label]
    pooled = task_a.doc_task is not None or task_b.doc_task is not None
    keys = []
    for side, task in ((a, task_a), (b, task_b)):
        key_D = document_keys(task, pooled)
        if len(np.unique(key_D)) != len(key_D):
            raise OutcomesError(
                f"{side.source or 'outcomes'}: task {label!r}: document "
                f"{repeated_document(task.doc_id, task.doc_task if pooled else None)} is held more than once; "
                "its documents cannot be paired"
            )
        keys.append(key_D)
    _, index_a, index_b = np.intersect1d(keys[0], keys[1], assume_unique=True, return_indices=True)
    return index_a, index_b


def compare_tasks(label: str, a_side: StepOutcomes, b_side: StepOutcomes) -> TaskComparison:
    """Pair one task's documents by id ((task, id) for pooled outcomes) and compare every figure both sides
    hold; a suite average with weights both sides agree on (`compare.suites`)."""
    a, b = a_side.tasks[label], b_side.tasks[label]
    index_a, index_b = paired_indices(label, a_side, b_side)
    n_both = len(index_a)
    task = TaskComparison(label, n_both, len(a.doc_id) - n_both, len(b.doc_id) - n_both)
    for name in a.values:
        if name not in b.values:
            task.figures_only_in[name] = "A"
            continue
        if is_suite_figure(label, name, a) and is_suite_figure(label, name, b):
            where = (f"{a_side.source}: {label}", f"{b_side.source}: {label}")
            a_N, b_N = agreed_suite_values(a, index_a, b, index_b, where)
        else:
            a_N, b_N = a.values[name][index_a], b.values[name][index_b]
        finite_N = np.isfinite(a_N) & np.isfinite(b_N)
        if not finite_N.all():
            task.n_nonfinite[name] = int((~finite_N).sum())
        binary = name in a.binary and name in b.binary
        task.figures[name] = paired_difference(
            a_N[finite_N], b_N[finite_N], binary=binary, lower_is_better=lower_is_better(name)
        )
    task.figures_only_in.update({name: "B" for name in b.values if name not in a.values})
    return task


def compare_steps(a: StepOutcomes, b: StepOutcomes, figures: list[str] | None = None) -> Comparison:
    """Every task both sides hold, paired (`compare_tasks`), in A's order; `figures` keeps only those
    (ConfigError naming any that no task both sides hold has)."""
    tasks = {}
    held: set[str] = set()
    for label in a.tasks:
        if label in b.tasks:
            task = compare_tasks(label, a, b)
            held.update(task.figures)
            if figures is not None:
                task.figures = {name: r for name, r in task.figures.items() if name in figures}
            tasks[label] = task
    unknown = [name for name in figures or () if name not in held]
    if unknown:
        raise ConfigError(
            f"--figures: {unknown} compared in no task (the tasks both sides hold compare: "
            f"{', '.join(sorted(held)) or 'none'}); name figures from that list"
        )
    return Comparison(
        a,
        b,
        tasks,
        [label for label in a.tasks if label not in b.tasks],
        [label for label in b.tasks if label not in a.tasks],
    )
